// gdnkit tests — determinism and batch invariance, on every backend.
//
// A row's output and new state must be bitwise identical run to run, and
// whether the row runs alone or inside a large batch, at any row position and
// in any slot. On GPUs the batch size changes how V is split across blocks;
// the reduction order over Dk must not change with it. The same holds for
// the fused middle (conv1d prologue, gated RMSNorm epilogue), whose block
// geometry (clusters at small B, a block a group at large B) and, for the
// norm alone in clusters, whose whole load phase change with the batch size.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend_suites.hpp"

namespace gdn_test {
namespace {

struct Problem {
  int64_t B, slots;
  int hk{2}, hv{4}, d{128};
  gdn::DType state;
  gdn::Layout layout;
  // q, k, v, a, b in `io`, the output in `out` (one dtype for all of them
  // takes the GPU kernels' uniform-input instantiations; bf16 in and fp32
  // out their mixed one)
  gdn::DType io{gdn::DType::kBF16}, out{gdn::DType::kF32};
  std::vector<uint8_t> qkv, a, b, pool;
  std::vector<float> A_log, dt_bias;
  std::vector<int32_t> idx;
  // the fused middle (bf16, as the inputs): conv W = 4 when `conv`, the
  // gated RMSNorm when `norm`; qkv is then the raw row x
  bool conv{false}, norm{false};
  std::vector<uint8_t> conv_pool, conv_weight, conv_bias, z, norm_weight;
  int64_t conv_dim() const { return 2 * int64_t(hk) * d + int64_t(hv) * d; }
  size_t slot_bytes() const { return size_t(hv) * d * d * gdn::dtype_size(state); }
  size_t conv_slot_bytes() const { return size_t(conv_dim()) * 3 * 2; }
};

Problem make_problem(int64_t B, gdn::DType state, gdn::Layout layout, uint64_t seed, bool conv = false,
                     bool norm = false, int d = 128, gdn::DType io = gdn::DType::kBF16,
                     gdn::DType out = gdn::DType::kF32) {
  Problem P{B, B + 8, 2, 4, d, state, layout, io, out, {}, {}, {}, {}, {}, {}, {}, conv, norm, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  auto fill = [&](std::vector<uint8_t>& x, int64_t n, gdn::DType t, double sd) {
    x.resize(size_t(n) * gdn::dtype_size(t));
    for (int64_t i = 0; i < n; ++i) gdn::store_element(x.data(), t, i, sd * n01(rng));
  };
  fill(P.qkv, B * P.conv_dim(), io, 1.0);
  fill(P.a, B * P.hv, io, 1.0);
  fill(P.b, B * P.hv, io, 1.0);
  fill(P.pool, P.slots * int64_t(P.slot_bytes() / gdn::dtype_size(state)), state, 0.5);
  std::uniform_real_distribution<double> A(1.0, 16.0), dt(std::log(1e-3), std::log(0.1));
  for (int h = 0; h < P.hv; ++h) {
    P.A_log.push_back(float(std::log(A(rng))));
    P.dt_bias.push_back(float(std::log(std::expm1(std::exp(dt(rng))))));
  }
  // rows scattered over the pool in a shuffled order
  std::vector<int32_t> perm(size_t(P.slots));
  for (int64_t s = 0; s < P.slots; ++s) perm[size_t(s)] = int32_t(s);
  std::shuffle(perm.begin(), perm.end(), rng);
  P.idx.assign(perm.begin(), perm.begin() + B);
  if (conv) {
    // earlier inputs in every slot's window, weights and bias of a trained
    // depthwise conv's scale
    fill(P.conv_pool, P.slots * P.conv_dim() * 3, gdn::DType::kBF16, 1.0);
    fill(P.conv_weight, P.conv_dim() * 4, gdn::DType::kBF16, 0.3);
    fill(P.conv_bias, P.conv_dim(), gdn::DType::kBF16, 0.1);
  }
  if (norm) {
    fill(P.z, B * P.hv * P.d, gdn::DType::kBF16, 1.0);
    std::uniform_real_distribution<double> w(0.5, 1.5);
    P.norm_weight.resize(size_t(P.d) * 2);
    for (int j = 0; j < P.d; ++j) gdn::store_element(P.norm_weight.data(), gdn::DType::kBF16, j, w(rng));
  }
  return P;
}

struct RowsResult {
  std::vector<uint8_t> o, pool, conv_pool;
};

// Rows [row0, row0 + n) of P, reading and writing the given slots of `pool`
// (and of `conv_pool`, conv on); with no slots (`idx` empty) a dense call:
// row b in slot b of `pool`.
RowsResult run_rows(gdn::Backend backend, const Problem& P, int64_t row0, int64_t n,
             const std::vector<int32_t>& idx, const std::vector<uint8_t>& pool,
             const std::vector<uint8_t>& conv_pool = {}) {
  const int64_t conv = P.conv_dim();
  const int64_t e = int64_t(gdn::dtype_size(P.io));
  DeviceBuffer qkv(backend, std::vector<uint8_t>(P.qkv.begin() + row0 * conv * e,
                                                 P.qkv.begin() + (row0 + n) * conv * e));
  DeviceBuffer a(backend, std::vector<uint8_t>(P.a.begin() + row0 * P.hv * e, P.a.begin() + (row0 + n) * P.hv * e));
  DeviceBuffer b(backend, std::vector<uint8_t>(P.b.begin() + row0 * P.hv * e, P.b.begin() + (row0 + n) * P.hv * e));
  DeviceBuffer A(backend, P.hv * 4), dt(backend, P.hv * 4), ix(backend, size_t(n) * 4);
  A.upload(P.A_log.data(), P.hv * 4);
  dt.upload(P.dt_bias.data(), P.hv * 4);
  if (!idx.empty()) ix.upload(idx.data(), size_t(n) * 4);
  DeviceBuffer state(backend, pool);
  DeviceBuffer o(backend, size_t(n) * P.hv * P.d * gdn::dtype_size(P.out));
  DeviceBuffer cstate, cweight, cbias, z, nw;
  if (P.conv) {
    cstate = DeviceBuffer(backend, conv_pool);
    cweight = DeviceBuffer(backend, P.conv_weight);
    cbias = DeviceBuffer(backend, P.conv_bias);
  }
  if (P.norm) {
    const size_t zb = size_t(P.hv) * P.d * 2;
    z = DeviceBuffer(backend, std::vector<uint8_t>(P.z.begin() + row0 * zb, P.z.begin() + (row0 + n) * zb));
    nw = DeviceBuffer(backend, P.norm_weight);
  }

  gdn::DecodeParams p;
  p.batch = n;
  p.num_k_heads = P.hk;
  p.num_v_heads = P.hv;
  p.head_dim_k = p.head_dim_v = P.d;
  p.qkv_dtype = p.ab_dtype = P.io;
  p.o_dtype = P.out;
  p.state_dtype = P.state;
  p.layout = P.layout;
  p.num_slots = idx.empty() ? int64_t(pool.size() / P.slot_bytes()) : P.slots;
  p.conv_width = P.conv ? 4 : 0;
  gdn::set_dense_strides(p);
  if (P.conv) {
    p.x = qkv.get();
    p.conv_state = cstate.get();
    p.conv_weight = cweight.get();
    p.conv_bias = cbias.get();
  } else {
    gdn::set_packed_qkv(p, qkv.get(), conv);
  }
  if (P.norm) {
    p.z = z.get();
    p.norm_weight = nw.get();
  }
  p.a = a.get();
  p.b = b.get();
  p.A_log = A.as<float>();
  p.dt_bias = dt.as<float>();
  p.state = state.get();
  p.o = o.get();
  if (!idx.empty()) {
    p.index_dtype = gdn::IndexType::kI32;
    p.state_indices = ix.get();
  }
  const gdn::Status st = gdn::decode(p, backend);
  EXPECT_TRUE(st.ok()) << st.message;
  const gdn::Status sy = gdn::backend_ops(backend)->synchronize(nullptr);
  EXPECT_TRUE(sy.ok()) << sy.message;
  return RowsResult{o.download(), state.download(), P.conv ? cstate.download() : std::vector<uint8_t>{}};
}

// P's B rows twice (bitwise the same), then rows 0, 1, B / 2 and B - 1 each
// alone with its state (and conv state) moved to a spare slot at the end of
// the pools: bitwise the row inside the batch.
void expect_invariant(gdn::Backend backend, const Problem& P) {
  const int64_t B = P.B;
  const RowsResult big = run_rows(backend, P, 0, B, P.idx, P.pool, P.conv_pool);
  const RowsResult again = run_rows(backend, P, 0, B, P.idx, P.pool, P.conv_pool);
  EXPECT_TRUE(big.o == again.o) << "output differs between two identical runs";
  EXPECT_TRUE(big.pool == again.pool) << "state differs between two identical runs";
  EXPECT_TRUE(big.conv_pool == again.conv_pool) << "conv state differs between two identical runs";

  const size_t sb = P.slot_bytes(), cb = P.conv_slot_bytes();
  const size_t ob = size_t(P.hv) * P.d * gdn::dtype_size(P.out);
  for (int64_t r : {int64_t(0), int64_t(1), B / 2, B - 1}) {
    const int32_t spare = int32_t(P.slots - 1 - (r % 4));
    const size_t from = size_t(P.idx[size_t(r)]);
    std::vector<uint8_t> pool = P.pool, cpool = P.conv_pool;
    std::memcpy(pool.data() + spare * sb, P.pool.data() + from * sb, sb);
    if (P.conv) std::memcpy(cpool.data() + spare * cb, P.conv_pool.data() + from * cb, cb);
    const RowsResult one = run_rows(backend, P, r, 1, {spare}, pool, cpool);
    EXPECT_EQ(0, std::memcmp(one.o.data(), big.o.data() + size_t(r) * ob, ob))
        << "row " << r << ": output alone differs bitwise from inside the batch of " << B;
    EXPECT_EQ(0, std::memcmp(one.pool.data() + spare * sb, big.pool.data() + from * sb, sb))
        << "row " << r << ": new state alone differs bitwise from inside the batch of " << B;
    if (P.conv) {
      EXPECT_EQ(0, std::memcmp(one.conv_pool.data() + spare * cb, big.conv_pool.data() + from * cb, cb))
          << "row " << r << ": new conv state alone differs bitwise from inside the batch of " << B;
    }
  }
}

// The same for dense calls (no slot indices: row b in slot b), the engines'
// usual form: P's first B slots as the batch's pool, twice, then rows 0, 1,
// B / 2 and B - 1 each alone in a pool of its one slot.
void expect_dense_invariant(gdn::Backend backend, const Problem& P) {
  const int64_t B = P.B;
  const size_t sb = P.slot_bytes();
  const size_t ob = size_t(P.hv) * P.d * gdn::dtype_size(P.out);
  const std::vector<uint8_t> pool(P.pool.begin(), P.pool.begin() + B * sb);
  const RowsResult big = run_rows(backend, P, 0, B, {}, pool);
  const RowsResult again = run_rows(backend, P, 0, B, {}, pool);
  EXPECT_TRUE(big.o == again.o) << "output differs between two identical runs";
  EXPECT_TRUE(big.pool == again.pool) << "state differs between two identical runs";
  for (int64_t r : {int64_t(0), int64_t(1), B / 2, B - 1}) {
    const std::vector<uint8_t> one_pool(pool.begin() + r * sb, pool.begin() + (r + 1) * sb);
    const RowsResult one = run_rows(backend, P, r, 1, {}, one_pool);
    EXPECT_EQ(0, std::memcmp(one.o.data(), big.o.data() + size_t(r) * ob, ob))
        << "row " << r << ": output alone differs bitwise from inside the dense batch of " << B;
    EXPECT_EQ(0, std::memcmp(one.pool.data(), big.pool.data() + size_t(r) * sb, sb))
        << "row " << r << ": new state alone differs bitwise from inside the dense batch of " << B;
  }
}

TEST_P(DecodeTest, DeterministicAndBatchInvariant) {
  // Large batches on GPUs (the split of V changes between B = 1 and B = 600:
  // on an H200 kv goes from 4-warp to 8-warp tiles, and fp32 vk from 1 item
  // a warp to 3, the count that leaves a head's last warp 2; at B = 48, 192
  // heads, fp32 kv blocks take two tiles each and reduce them together, on
  // an A100 too); smaller on the host, whose reference arithmetic is slow.
  // Head dim 64 too: kv blocks there take two tiles at once from B = 600
  // (4-warp tiles for 16-bit states), one 4-warp tile a block alone.
  const bool host = backend() == gdn::Backend::kHost;
  for (const int d : {128, 64})
    for (const int64_t B : host ? std::vector<int64_t>{24} : std::vector<int64_t>{48, 600})
      for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
        for (gdn::Layout l : {gdn::Layout::kKV, gdn::Layout::kVK}) {
          SCOPED_TRACE(std::string("B ") + std::to_string(B) + ", state " + gdn::to_string(t) + ", layout " +
                       gdn::to_string(l) + ", head dim " + std::to_string(d));
          expect_invariant(backend(), make_problem(B, t, l, 77, false, false, d));
        }
}

TEST_P(DecodeTest, OneInputDtypeDeterministicAndBatchInvariant) {
  // As above with q, k, v, a, b and the output in one dtype, which the GPU
  // kernels take through their uniform-input instantiations (the test above
  // runs their mixed one: bf16 in, fp32 out), for each state dtype and each
  // input dtype: on NVIDIA a vk row alone at Dk = 128 (and 16-bit states at
  // B = 48) runs in the one-wave kernel through the pool, B = 600 in the
  // ring kernel, whose bits it must reproduce (decode_vk_wave_kernel).
  // The host runs one arithmetic for every dtype (the test above covers it).
  if (backend() == gdn::Backend::kHost) GTEST_SKIP() << "the host reference has no per-dtype kernels";
  for (const int d : {128, 64})
    for (const int64_t B : {48, 600})
      for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16, gdn::DType::kF16})
        for (gdn::DType io : {gdn::DType::kBF16, gdn::DType::kF16, gdn::DType::kF32})
          for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV}) {
            SCOPED_TRACE(std::string("B ") + std::to_string(B) + ", state " + gdn::to_string(t) + ", inputs " +
                         gdn::to_string(io) + ", layout " + gdn::to_string(l) + ", head dim " + std::to_string(d));
            expect_invariant(backend(), make_problem(B, t, l, 79, false, false, d, io, io));
          }
}

TEST_P(DecodeTest, DenseCallDeterministicAndBatchInvariant) {
  // Dense calls with one input dtype, each state dtype and input dtype: on
  // NVIDIA a vk row alone (and 16-bit states at B = 48) runs in the one-wave
  // kernel without slots, B = 600 in the ring kernel, whose bits it must
  // reproduce (decode_vk_wave_kernel); kv for the same guarantee of its
  // tiles. The host runs one arithmetic for every dtype (the first test
  // covers it).
  if (backend() == gdn::Backend::kHost) GTEST_SKIP() << "the host reference has no per-dtype kernels";
  for (const int64_t B : {48, 600})
    for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16, gdn::DType::kF16})
      for (gdn::DType io : {gdn::DType::kBF16, gdn::DType::kF16, gdn::DType::kF32})
        for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV}) {
          SCOPED_TRACE(std::string("dense, B ") + std::to_string(B) + ", state " + gdn::to_string(t) + ", inputs " +
                       gdn::to_string(io) + ", layout " + gdn::to_string(l));
          expect_dense_invariant(backend(), make_problem(B, t, l, 80, false, false, 128, io, io));
        }
}

TEST_P(DecodeTest, FusedMiddleDeterministicAndBatchInvariant) {
  // The conv and the norm, together and each alone, as above: on an H200 a
  // row alone runs in a cluster of 8 blocks (the norm alone in vk without
  // the prologue), B = 48 in clusters of 2, B = 600 in one block a group;
  // the norm alone runs in the step kernels there where it can (a head's
  // blocks a cluster at B = 1, kv fp32 B = 48 clusters of 2, kv B = 600 one
  // block a head) and in the groups' kernels elsewhere.
  const bool host = backend() == gdn::Backend::kHost;
  for (const int64_t B : host ? std::vector<int64_t>{24} : std::vector<int64_t>{48, 600})
    for (const int mode : {0, 1, 2})  // conv + norm, the norm alone, the conv alone
      for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
        for (gdn::Layout l : {gdn::Layout::kKV, gdn::Layout::kVK}) {
          const bool conv = mode != 1, norm = mode != 2;
          SCOPED_TRACE(std::string("B ") + std::to_string(B) + (conv ? ", conv" : "") + (norm ? ", norm" : "") +
                       ", state " + gdn::to_string(t) + ", layout " + gdn::to_string(l));
          expect_invariant(backend(), make_problem(B, t, l, 78, conv, norm));
        }
}

}  // namespace
}  // namespace gdn_test
