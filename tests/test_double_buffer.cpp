// Double-buffered pools: each sequence owns two slots and every step reads
// one and writes the other (state_indices, state_out_indices), the next step
// back, as engines that afford two slots a sequence run it. Against the same
// steps in place, on the same backend: the same bits (outputs, states, and
// the conv windows with the fused prologue), and the slot a step reads keeps
// the state it held (the step before's, which an engine can roll back to).
#include <cstring>

#include "backend_suites.hpp"
#include "random_case.hpp"

namespace gdn_test {
namespace {

std::vector<uint8_t> i32_bytes(const std::vector<int32_t>& v) {
  std::vector<uint8_t> b(v.size() * 4 + 1, 0);  // the DeviceCase's index buffers' size
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// Bytes [s * slot_bytes, (s + 1) * slot_bytes) of a pool.
std::vector<uint8_t> slot_of(const std::vector<uint8_t>& pool, int64_t s, size_t slot_bytes) {
  const auto first = pool.begin() + std::ptrdiff_t(size_t(s) * slot_bytes);
  return {first, first + std::ptrdiff_t(slot_bytes)};
}

void run_double_buffer(gdn::Backend backend, gdn::Layout layout, gdn::DType state, bool conv, uint64_t seed) {
  constexpr int kSteps = 5;
  CaseSpec spec;
  spec.name = "double buffer";
  spec.seed = seed;
  spec.batch = 4;
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 128;
  spec.dv = 128;
  spec.state = state;
  spec.layout = layout;
  spec.index = gdn::IndexType::kI32;
  spec.out_indices = true;  // a pool of 2B slots, each holding a random state
  if (conv) {
    spec.conv_width = 4;
    spec.conv_bias = true;
    spec.norm = true;
  }
  SCOPED_TRACE(describe(spec));
  HostCase hc = make_case(spec);
  const int64_t B = spec.batch;
  ASSERT_EQ(hc.num_slots, 2 * B);

  // Row b's slots: home[b] (a permutation of [0, B)) and its twin home[b] + B.
  const std::vector<int32_t> home = {2, 0, 3, 1};
  std::vector<int32_t> twin;
  for (int32_t s : home) twin.push_back(s + int32_t(B));
  DeviceCase in_place(hc, backend), two(hc, backend);
  in_place.in_idx.upload(i32_bytes(home));
  in_place.p.state_out_indices = nullptr;
  const size_t slot_bytes = size_t(hc.slot_stride) * gdn::dtype_size(state);
  const size_t conv_slot_bytes = conv ? size_t(hc.conv_slot_stride) * gdn::dtype_size(spec.qkv) : 0;

  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step > 0) {
      redraw_inputs(hc, seed * 7919 + uint64_t(step));
      in_place.upload_inputs(hc);
      two.upload_inputs(hc);
    }
    // even steps: home -> twin; odd steps: twin -> home
    const std::vector<int32_t>& from = step % 2 ? twin : home;
    const std::vector<int32_t>& to = step % 2 ? home : twin;
    two.in_idx.upload(i32_bytes(from));
    two.out_idx.upload(i32_bytes(to));
    const std::vector<uint8_t> before = two.state.download();
    const std::vector<uint8_t> conv_before = conv ? two.conv_state.download() : std::vector<uint8_t>{};

    gdn::Status st = in_place.run();
    ASSERT_TRUE(st.ok()) << st.message;
    st = two.run();
    ASSERT_TRUE(st.ok()) << st.message;

    EXPECT_EQ(in_place.o.download(), two.o.download()) << "outputs differ";
    const std::vector<uint8_t> a = in_place.state.download(), b = two.state.download();
    const std::vector<uint8_t> ca = conv ? in_place.conv_state.download() : std::vector<uint8_t>{};
    const std::vector<uint8_t> cb = conv ? two.conv_state.download() : std::vector<uint8_t>{};
    for (int64_t r = 0; r < B; ++r) {
      // the new state: written to the other slot, bit for bit the in-place one
      EXPECT_EQ(slot_of(b, to[size_t(r)], slot_bytes), slot_of(a, home[size_t(r)], slot_bytes))
          << "row " << r << ": new state";
      // the slot it read: untouched
      EXPECT_EQ(slot_of(b, from[size_t(r)], slot_bytes), slot_of(before, from[size_t(r)], slot_bytes))
          << "row " << r << ": the read slot was written";
      if (conv) {
        EXPECT_EQ(slot_of(cb, to[size_t(r)], conv_slot_bytes), slot_of(ca, home[size_t(r)], conv_slot_bytes))
            << "row " << r << ": new conv window";
        EXPECT_EQ(slot_of(cb, from[size_t(r)], conv_slot_bytes), slot_of(conv_before, from[size_t(r)], conv_slot_bytes))
            << "row " << r << ": the read conv slot was written";
      }
    }
  }
}

TEST_P(DoubleBufferTest, KvFp32) { run_double_buffer(backend(), gdn::Layout::kKV, gdn::DType::kF32, false, 41); }
TEST_P(DoubleBufferTest, VkFp32) { run_double_buffer(backend(), gdn::Layout::kVK, gdn::DType::kF32, false, 43); }
TEST_P(DoubleBufferTest, KvBf16) { run_double_buffer(backend(), gdn::Layout::kKV, gdn::DType::kBF16, false, 47); }
TEST_P(DoubleBufferTest, VkBf16) { run_double_buffer(backend(), gdn::Layout::kVK, gdn::DType::kBF16, false, 53); }
TEST_P(DoubleBufferTest, VkBf16ConvNorm) {
  run_double_buffer(backend(), gdn::Layout::kVK, gdn::DType::kBF16, true, 59);
}

}  // namespace
}  // namespace gdn_test
