// Validation: one test per rule of validate() (core/src/validate.cpp) and the
// backend check of decode(). Each asserts the status code, that the message
// names the argument and the value it saw, and that not one byte changed.
//
// Every tensor lives in one backend allocation (the arena), filled with a
// canary pattern; a refused call must leave the whole arena as it was.
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>

#include "backend_suites.hpp"

namespace gdn_test {
namespace {

using gdn::DType;
using gdn::StatusCode;

// B=3 rows, Hk=2, Hv=4, Dk=64, Dv=128: bf16 q/k/v/a/b/o, fp32 state, 4 slots.
// The regions of the conv prologue (x, conv state pool with W-1 = 3 taps,
// weight, bias) and of the norm epilogue (z, norm_weight) are filled too;
// with_conv_norm() turns the base call into a valid call with both.
struct Arena {
  static constexpr int64_t B = 3, Hk = 2, Hv = 4, Dk = 64, Dv = 128, kSlots = 4;
  static constexpr int64_t kConvDim = 2 * Hk * Dk + Hv * Dv;  // 768
  static constexpr int32_t kW = 4;

  explicit Arena(gdn::Backend be) : backend(be) {
    auto region = [this](const char* name, size_t bytes) {
      const size_t off = total;
      total += (bytes + 255) / 256 * 256 + 256;  // slack for shifted pointers
      names.push_back({name, off});
      return off;
    };
    // sized for fp32 elements so dtype changes stay inside the region
    q_off = region("q", B * Hk * Dk * 4);
    k_off = region("k", B * Hk * Dk * 4);
    v_off = region("v", B * Hv * Dv * 4);
    a_off = region("a", B * Hv * 4);
    b_off = region("b", B * Hv * 4);
    A_off = region("A_log", Hv * 4);
    dt_off = region("dt_bias", Hv * 4);
    state_off = region("state", kSlots * Hv * Dk * Dv * 4);
    o_off = region("o", B * Hv * Dv * 4);
    idx_off = region("state_indices", B * 8);
    oidx_off = region("state_out_indices", B * 8);
    counter_off = region("invalid_index_count", 8);
    x_off = region("x", B * kConvDim * 4);
    conv_state_off = region("conv_state", kSlots * kConvDim * (kW - 1) * 4);
    conv_weight_off = region("conv_weight", kConvDim * kW * 4);
    conv_bias_off = region("conv_bias", kConvDim * 4);
    z_off = region("z", B * Hv * Dv * 4);
    norm_weight_off = region("norm_weight", Dv * 4);

    // canary everywhere, sane values where a run would read them
    init.resize(total);
    std::mt19937_64 rng(77);
    for (uint8_t& x : init) x = uint8_t(rng());
    auto put_bf16 = [&](size_t off, int64_t n) {
      std::normal_distribution<float> n01(0.f, 1.f);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = gdn::float_to_bf16(n01(rng));
        std::memcpy(&init[off + size_t(i) * 2], &h, 2);
      }
    };
    put_bf16(q_off, B * Hk * Dk);
    put_bf16(k_off, B * Hk * Dk);
    put_bf16(v_off, B * Hv * Dv);
    put_bf16(a_off, B * Hv);
    put_bf16(b_off, B * Hv);
    for (int64_t h = 0; h < Hv; ++h) {
      const float A = 0.5f, dt = -4.0f;
      std::memcpy(&init[A_off + size_t(h) * 4], &A, 4);
      std::memcpy(&init[dt_off + size_t(h) * 4], &dt, 4);
    }
    for (int64_t i = 0; i < kSlots * Hv * Dk * Dv; ++i) {
      const float x = float(int64_t(rng() % 2001) - 1000) * 1e-3f;
      std::memcpy(&init[state_off + size_t(i) * 4], &x, 4);
    }
    put_bf16(x_off, B * kConvDim);
    put_bf16(conv_state_off, kSlots * kConvDim * (kW - 1));
    put_bf16(conv_weight_off, kConvDim * kW);
    put_bf16(conv_bias_off, kConvDim);
    put_bf16(z_off, B * Hv * Dv);
    put_bf16(norm_weight_off, Dv);
    for (int64_t r = 0; r < B; ++r) {
      const int32_t s = int32_t(r + 1), so = int32_t(B - r);
      std::memcpy(&init[idx_off + size_t(r) * 4], &s, 4);
      std::memcpy(&init[oidx_off + size_t(r) * 4], &so, 4);
    }
    buf = DeviceBuffer(be, init);

    // a valid call
    p.batch = B;
    p.num_k_heads = int32_t(Hk);
    p.num_v_heads = int32_t(Hv);
    p.head_dim_k = int32_t(Dk);
    p.head_dim_v = int32_t(Dv);
    p.qkv_dtype = DType::kBF16;
    p.ab_dtype = DType::kBF16;
    p.o_dtype = DType::kBF16;
    p.state_dtype = DType::kF32;
    p.q = at(q_off);
    p.k = at(k_off);
    p.v = at(v_off);
    p.a = at(a_off);
    p.b = at(b_off);
    p.A_log = static_cast<const float*>(at(A_off));
    p.dt_bias = static_cast<const float*>(at(dt_off));
    p.state = at(state_off);
    p.o = at(o_off);
    p.invalid_index_count = static_cast<uint32_t*>(at(counter_off));
    p.num_slots = kSlots;
    gdn::set_dense_strides(p);
  }

  void* at(size_t off, size_t shift = 0) const {
    return static_cast<char*>(buf.get()) + off + shift;
  }

  // The base call with the conv prologue (W=4, bias, [slot, conv_dim, W-1]
  // pool) and the gated RMSNorm epilogue: valid.
  void with_conv_norm(gdn::DecodeParams& c) const {
    c.q = c.k = c.v = nullptr;
    c.conv_width = kW;
    c.x = at(x_off);
    c.conv_state = at(conv_state_off);
    c.conv_weight = at(conv_weight_off);
    c.conv_bias = at(conv_bias_off);
    c.z = at(z_off);
    c.norm_weight = at(norm_weight_off);
    gdn::set_dense_strides(c);
  }

  // Name of the region holding byte `off`.
  std::string region_of(size_t off) const {
    std::string name = "?";
    for (const auto& n : names)
      if (off >= n.second) name = n.first;
    return name;
  }

  // Every byte as it was: report the first difference.
  ::testing::AssertionResult unchanged() const {
    const std::vector<uint8_t> now = buf.download();
    for (size_t i = 0; i < now.size(); ++i)
      if (now[i] != init[i])
        return ::testing::AssertionFailure()
               << "byte " << i << " (in " << region_of(i) << ") changed from " << int(init[i])
               << " to " << int(now[i]);
    return ::testing::AssertionSuccess();
  }

  gdn::Backend backend;
  size_t total{0};
  size_t q_off, k_off, v_off, a_off, b_off, A_off, dt_off, state_off, o_off, idx_off, oidx_off,
      counter_off, x_off, conv_state_off, conv_weight_off, conv_bias_off, z_off, norm_weight_off;
  std::vector<std::pair<std::string, size_t>> names;
  std::vector<uint8_t> init;
  DeviceBuffer buf;
  gdn::DecodeParams p;
};

using Mutation = std::function<void(gdn::DecodeParams&, const Arena&)>;

// The mutated call is refused with `code` (validate() agrees), the message
// holds every needle, and the arena is untouched.
void expect_refused(gdn::Backend be, const char* what, const Mutation& mutate,
                    std::initializer_list<std::string> needles,
                    std::optional<gdn::Backend> call_backend = std::nullopt,
                    StatusCode code = StatusCode::kInvalidArgument) {
  SCOPED_TRACE(what);
  Arena arena(be);
  gdn::DecodeParams p = arena.p;
  mutate(p, arena);
  const gdn::Status st = gdn::decode(p, call_backend.value_or(be));
  EXPECT_EQ(st.code, code) << "message: " << st.message;
  for (const std::string& n : needles)
    EXPECT_TRUE(contains(st.message, n)) << "message \"" << st.message << "\" lacks \"" << n << "\"";
  if (code == StatusCode::kInvalidArgument && !call_backend) {
    const gdn::Status vs = gdn::validate(p);
    EXPECT_EQ(vs.code, st.code);
    EXPECT_STREQ(vs.message, st.message);
  }
  EXPECT_TRUE(arena.unchanged());
}

// The mutated call is accepted and runs.
void expect_accepted(gdn::Backend be, const char* what, const Mutation& mutate,
                     bool writes_output) {
  SCOPED_TRACE(what);
  Arena arena(be);
  gdn::DecodeParams p = arena.p;
  mutate(p, arena);
  const gdn::Status st = gdn::decode(p, be);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_TRUE(gdn::backend_ops(be)->synchronize(nullptr).ok());
  if (writes_output) {
    EXPECT_FALSE(arena.unchanged()) << "a valid call wrote nothing";
  } else {
    EXPECT_TRUE(arena.unchanged());
  }
}

#define GDN_REFUSED(what, body, ...) \
  expect_refused(backend(), what, [&](gdn::DecodeParams & p, const Arena& A) { \
    (void)A;                                                                    \
    body;                                                                       \
  }, {__VA_ARGS__})

// ---- the base call and the empty call ------------------------------------------

TEST_P(ValidationTest, BaseCallIsValidAndWrites) {
  expect_accepted(backend(), "base", [](gdn::DecodeParams&, const Arena&) {}, true);
}

TEST_P(ValidationTest, EmptyBatchSucceedsAndWritesNothing) {
  expect_accepted(backend(), "batch 0", [](gdn::DecodeParams& p, const Arena&) { p.batch = 0; },
                  false);
}

// ---- sizes ---------------------------------------------------------------------

TEST_P(ValidationTest, BatchNegative) {
  GDN_REFUSED("batch -1", p.batch = -1, "batch", "-1");
  GDN_REFUSED("batch -7", p.batch = -7, "batch", "-7");
}

TEST_P(ValidationTest, BatchOverLimit) {
  GDN_REFUSED("batch 2^31+1", p.batch = (int64_t(1) << 31) + 1, "batch", "2147483649", "2^31");
}

TEST_P(ValidationTest, NumKHeadsNotPositive) {
  GDN_REFUSED("Hk 0", p.num_k_heads = 0, "num_k_heads", "0");
  GDN_REFUSED("Hk -2", p.num_k_heads = -2, "num_k_heads", "-2");
}

TEST_P(ValidationTest, NumVHeadsNotPositive) {
  GDN_REFUSED("Hv 0", p.num_v_heads = 0, "num_v_heads", "0");
  GDN_REFUSED("Hv -4", p.num_v_heads = -4, "num_v_heads", "-4");
}

TEST_P(ValidationTest, NumVHeadsNotMultipleOfNumKHeads) {
  GDN_REFUSED("Hv 3, Hk 2", p.num_v_heads = 3, "num_v_heads", "3", "num_k_heads=2");
}

TEST_P(ValidationTest, HeadDimKOutOfRange) {
  for (int d : {0, -16, 8, 100, 272, 512})
    GDN_REFUSED(("Dk " + std::to_string(d)).c_str(), p.head_dim_k = d, "head_dim_k",
                std::to_string(d));
}

TEST_P(ValidationTest, HeadDimVOutOfRange) {
  for (int d : {0, -16, 8, 100, 272, 512})
    GDN_REFUSED(("Dv " + std::to_string(d)).c_str(), p.head_dim_v = d, "head_dim_v",
                std::to_string(d));
}

// ---- enums (the C API can hand over any integer) -------------------------------------

TEST_P(ValidationTest, UnknownQkvDtype) {
  GDN_REFUSED("qkv_dtype 3", p.qkv_dtype = DType(3), "qkv_dtype", "3");
  GDN_REFUSED("qkv_dtype -1", p.qkv_dtype = DType(-1), "qkv_dtype", "-1");
}
TEST_P(ValidationTest, UnknownAbDtype) {
  GDN_REFUSED("ab_dtype 7", p.ab_dtype = DType(7), "ab_dtype", "7");
}
TEST_P(ValidationTest, UnknownOutputDtype) {
  GDN_REFUSED("o_dtype 9", p.o_dtype = DType(9), "o_dtype", "9");
}
TEST_P(ValidationTest, UnknownStateDtype) {
  GDN_REFUSED("state_dtype 4", p.state_dtype = DType(4), "state_dtype", "4");
}
TEST_P(ValidationTest, UnknownLayout) {
  GDN_REFUSED("layout 2", p.layout = gdn::Layout(2), "layout", "2");
}
TEST_P(ValidationTest, UnknownGate) {
  GDN_REFUSED("gate 5", p.gate = gdn::Gate(5), "gate", "5");
}
TEST_P(ValidationTest, UnknownL2Norm) {
  GDN_REFUSED("l2norm 3", p.l2norm = gdn::L2Norm(3), "l2norm", "3");
}
TEST_P(ValidationTest, UnknownHeadMap) {
  GDN_REFUSED("head_map 2", p.head_map = gdn::HeadMap(2), "head_map", "2");
}
TEST_P(ValidationTest, UnknownIndexDtype) {
  GDN_REFUSED("index_dtype 3", p.index_dtype = gdn::IndexType(3), "index_dtype", "3");
}

// ---- scalars -------------------------------------------------------------------

TEST_P(ValidationTest, ScaleNotFinite) {
  GDN_REFUSED("scale nan", p.scale = std::numeric_limits<float>::quiet_NaN(), "scale", "nan");
  GDN_REFUSED("scale inf", p.scale = std::numeric_limits<float>::infinity(), "scale", "inf");
  GDN_REFUSED("scale -inf", p.scale = -std::numeric_limits<float>::infinity(), "scale", "-inf");
}

TEST_P(ValidationTest, EpsNegativeOrNotFinite) {
  GDN_REFUSED("eps -1e-3", p.l2norm_eps = -1e-3f, "l2norm_eps", "-0.001");
  GDN_REFUSED("eps nan", p.l2norm_eps = std::numeric_limits<float>::quiet_NaN(), "l2norm_eps",
              "nan");
  GDN_REFUSED("eps inf", p.l2norm_eps = std::numeric_limits<float>::infinity(), "l2norm_eps",
              "inf");
}

// ---- null pointers -------------------------------------------------------------

TEST_P(ValidationTest, NullQ) { GDN_REFUSED("q null", p.q = nullptr, "q: null pointer"); }
TEST_P(ValidationTest, NullK) { GDN_REFUSED("k null", p.k = nullptr, "k: null pointer"); }
TEST_P(ValidationTest, NullV) { GDN_REFUSED("v null", p.v = nullptr, "v: null pointer"); }
TEST_P(ValidationTest, NullA) { GDN_REFUSED("a null", p.a = nullptr, "a: null pointer"); }
TEST_P(ValidationTest, NullB) { GDN_REFUSED("b null", p.b = nullptr, "b: null pointer"); }
TEST_P(ValidationTest, NullALogWithRawGate) {
  GDN_REFUSED("A_log null", p.A_log = nullptr, "A_log: null pointer");
}
TEST_P(ValidationTest, NullDtBiasWithRawGate) {
  GDN_REFUSED("dt_bias null", p.dt_bias = nullptr, "dt_bias: null pointer");
}
TEST_P(ValidationTest, NullState) {
  GDN_REFUSED("state null", p.state = nullptr, "state: null pointer");
}
TEST_P(ValidationTest, NullOutput) { GDN_REFUSED("o null", p.o = nullptr, "o: null pointer"); }

TEST_P(ValidationTest, NullGateParamsAcceptedWithPrecomputedGate) {
  expect_accepted(backend(), "precomputed gate, A_log = dt_bias = null",
                  [](gdn::DecodeParams& p, const Arena&) {
                    p.gate = gdn::Gate::kPrecomputed;
                    p.A_log = nullptr;
                    p.dt_bias = nullptr;
                  },
                  true);
}

// ---- alignment: every pointer to its element -----------------------------------------

TEST_P(ValidationTest, MisalignedQ) {
  GDN_REFUSED("q fp32 at +2", (p.qkv_dtype = DType::kF32, p.q = A.at(A.q_off, 2)), "q: address",
              "not aligned", "4-byte");
  GDN_REFUSED("q bf16 at +1", p.q = A.at(A.q_off, 1), "q: address", "2-byte");
}
TEST_P(ValidationTest, MisalignedK) {
  GDN_REFUSED("k bf16 at +1", p.k = A.at(A.k_off, 1), "k: address", "not aligned", "2-byte");
}
TEST_P(ValidationTest, MisalignedV) {
  GDN_REFUSED("v fp16 at +3", (p.qkv_dtype = DType::kF16, p.v = A.at(A.v_off, 3)), "v: address",
              "not aligned", "2-byte");
}
TEST_P(ValidationTest, MisalignedA) {
  GDN_REFUSED("a fp32 at +2", (p.ab_dtype = DType::kF32, p.a = A.at(A.a_off, 2)), "a: address",
              "4-byte");
}
TEST_P(ValidationTest, MisalignedB) {
  GDN_REFUSED("b bf16 at +1", p.b = A.at(A.b_off, 1), "b: address", "2-byte");
}
TEST_P(ValidationTest, MisalignedALog) {
  GDN_REFUSED("A_log at +2", p.A_log = static_cast<const float*>(A.at(A.A_off, 2)),
              "A_log: address", "4-byte");
}
TEST_P(ValidationTest, MisalignedDtBias) {
  GDN_REFUSED("dt_bias at +1", p.dt_bias = static_cast<const float*>(A.at(A.dt_off, 1)),
              "dt_bias: address", "4-byte");
}
TEST_P(ValidationTest, MisalignedState) {
  GDN_REFUSED("state fp32 at +2", p.state = A.at(A.state_off, 2), "state: address", "4-byte");
  GDN_REFUSED("state bf16 at +1", (p.state_dtype = DType::kBF16, p.state = A.at(A.state_off, 1)),
              "state: address", "2-byte");
}
TEST_P(ValidationTest, MisalignedOutput) {
  GDN_REFUSED("o bf16 at +1", p.o = A.at(A.o_off, 1), "o: address", "2-byte");
  GDN_REFUSED("o fp32 at +2", (p.o_dtype = DType::kF32, p.o = A.at(A.o_off, 2)), "o: address",
              "4-byte");
}
TEST_P(ValidationTest, MisalignedCounter) {
  GDN_REFUSED("counter at +2",
              p.invalid_index_count = static_cast<uint32_t*>(A.at(A.counter_off, 2)),
              "invalid_index_count: address", "4-byte");
}
TEST_P(ValidationTest, MisalignedStateIndices) {
  GDN_REFUSED("int32 indices at +2",
              (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.idx_off, 2)),
              "state_indices: address", "4-byte");
  GDN_REFUSED("int64 indices at +4",
              (p.index_dtype = gdn::IndexType::kI64, p.state_indices = A.at(A.idx_off, 4)),
              "state_indices: address", "8-byte");
}
TEST_P(ValidationTest, MisalignedStateOutIndices) {
  GDN_REFUSED("int32 out indices at +1",
              (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.idx_off),
               p.state_out_indices = A.at(A.oidx_off, 1)),
              "state_out_indices: address", "4-byte");
}

// ---- index arrays and their dtype -------------------------------------------------

TEST_P(ValidationTest, IndicesWithoutIndexDtype) {
  GDN_REFUSED("state_indices, index_dtype none", p.state_indices = A.at(A.idx_off),
              "state_indices: given, but index_dtype is none");
}
TEST_P(ValidationTest, OutIndicesWithoutIndexDtype) {
  GDN_REFUSED("state_out_indices, index_dtype none", p.state_out_indices = A.at(A.oidx_off),
              "state_out_indices: given, but index_dtype is none");
}
TEST_P(ValidationTest, IndexDtypeWithoutIndices) {
  GDN_REFUSED("index_dtype int64, no array", p.index_dtype = gdn::IndexType::kI64,
              "state_indices: null pointer", "int64");
}
TEST_P(ValidationTest, OutIndicesWithoutIndices) {
  GDN_REFUSED("out indices only",
              (p.index_dtype = gdn::IndexType::kI32, p.state_out_indices = A.at(A.oidx_off)),
              "state_indices: null pointer", "int32");
}

// ---- strides -------------------------------------------------------------------

struct StridedTensor {
  const char* name;
  int64_t gdn::DecodeParams::*batch_stride;
  int64_t gdn::DecodeParams::*head_stride;  // nullptr for a and b
  const char* dim_name;
  int64_t dim;
};

const StridedTensor kStrided[] = {
    {"q", &gdn::DecodeParams::q_batch_stride, &gdn::DecodeParams::q_head_stride, "Dk", Arena::Dk},
    {"k", &gdn::DecodeParams::k_batch_stride, &gdn::DecodeParams::k_head_stride, "Dk", Arena::Dk},
    {"v", &gdn::DecodeParams::v_batch_stride, &gdn::DecodeParams::v_head_stride, "Dv", Arena::Dv},
    {"o", &gdn::DecodeParams::o_batch_stride, &gdn::DecodeParams::o_head_stride, "Dv", Arena::Dv},
    {"a", &gdn::DecodeParams::a_batch_stride, nullptr, "Hv", Arena::Hv},
    {"b", &gdn::DecodeParams::b_batch_stride, nullptr, "Hv", Arena::Hv},
};

TEST_P(ValidationTest, HeadStrideSmallerThanHeadDim) {
  for (const StridedTensor& t : kStrided) {
    if (t.head_stride == nullptr) continue;
    const int64_t bad = t.dim == 128 ? 100 : t.dim - 16;
    const std::string msg = std::string(t.name) + ": head stride " + std::to_string(bad) +
                            " is smaller than " + t.dim_name + "=" + std::to_string(t.dim);
    GDN_REFUSED(msg.c_str(), p.*(t.head_stride) = bad, msg);
  }
  // the example message of docs/operation.md, Validation, verbatim
  GDN_REFUSED("v head stride 100", p.v_head_stride = 100,
              "v: head stride 100 is smaller than Dv=128");
}

TEST_P(ValidationTest, BatchStrideSmallerThanRow) {
  for (const StridedTensor& t : kStrided) {
    const int64_t bad = t.dim - 1;
    const std::string msg = std::string(t.name) + ": batch stride " + std::to_string(bad) +
                            " is smaller than " + t.dim_name + "=" + std::to_string(t.dim);
    // heads outermost, so only the batch stride rule can fire
    GDN_REFUSED(msg.c_str(),
                (p.*(t.batch_stride) = bad,
                 t.head_stride ? (void)(p.*(t.head_stride) = 64 * t.dim) : (void)0),
                msg);
  }
}

TEST_P(ValidationTest, RowsOverlap) {
  for (const StridedTensor& t : kStrided) {
    if (t.head_stride == nullptr) continue;
    // batch stride = head stride = D: neither dimension nests the other
    const std::string what = std::string(t.name) + " rows overlap";
    GDN_REFUSED(what.c_str(), (p.*(t.batch_stride) = t.dim, p.*(t.head_stride) = t.dim),
                std::string(t.name) + ": batch stride " + std::to_string(t.dim) +
                    " and head stride " + std::to_string(t.dim) + " overlap rows");
  }
}

TEST_P(ValidationTest, StridesBeyondTwoToThe60) {
  const int64_t big = (int64_t(1) << 60) + 16;
  GDN_REFUSED("q batch stride 2^60+16", p.q_batch_stride = big, "q:", "2^60");
  GDN_REFUSED("o head stride 2^60+16", p.o_head_stride = big, "o: strides reach element", "2^60");
  // (B-1) * batch stride lands past 2^60 although each stride is below it
  GDN_REFUSED("k reaches past 2^60",
              p.k_batch_stride = (int64_t(1) << 59) + 64, "k: strides reach element", "2^60");
}

// Strides so large that (rows-1)*stride or heads*stride overflow int64 must be
// refused without signed overflow (UBSan runs this suite too).
TEST_P(ValidationTest, HugeStridesRefusedWithoutOverflow) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  GDN_REFUSED("q batch stride INT64_MAX", p.q_batch_stride = max, "q:");
  GDN_REFUSED("v head stride INT64_MAX", p.v_head_stride = max, "v:");
  GDN_REFUSED("o head stride 2^62", p.o_head_stride = int64_t(1) << 62, "o:");
  GDN_REFUSED("a batch stride INT64_MAX", p.a_batch_stride = max, "a:");
}

// ---- the state pool ------------------------------------------------------------

TEST_P(ValidationTest, NumSlotsNotPositive) {
  GDN_REFUSED("num_slots 0",
              (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.idx_off),
               p.num_slots = 0),
              "num_slots", "0");
  GDN_REFUSED("num_slots -3",
              (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.idx_off),
               p.num_slots = -3),
              "num_slots", "-3");
}

TEST_P(ValidationTest, NumSlotsSmallerThanBatchWithoutIndices) {
  GDN_REFUSED("num_slots 2 < batch 3", p.num_slots = 2, "num_slots", "2", "batch=3");
}

TEST_P(ValidationTest, SlotStrideSmallerThanSlot) {
  const int64_t slot = Arena::Hv * Arena::Dk * Arena::Dv;
  GDN_REFUSED("slot stride Hv*Dk*Dv-1", p.state_slot_stride = slot - 1, "state_slot_stride",
              std::to_string(slot - 1), std::to_string(slot));
  GDN_REFUSED("slot stride 0", p.state_slot_stride = 0, "state_slot_stride", "0");
}

TEST_P(ValidationTest, SlotStrideNegative) {
  // one slot: any non-negative stride is fine, a negative one is not
  GDN_REFUSED("slot stride -1 with one slot",
              (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.idx_off),
               p.num_slots = 1, p.state_slot_stride = -1),
              "state_slot_stride", "-1");
}

TEST_P(ValidationTest, PoolBeyondTwoToThe60) {
  GDN_REFUSED("slot stride 2^59 x 4 slots", p.state_slot_stride = int64_t(1) << 59,
              "state_slot_stride", "2^60");
}

// ---- aliasing: what is written overlaps something else ----------------------------------

TEST_P(ValidationTest, OutputOverlapsState) {
  GDN_REFUSED("o inside state", p.o = A.at(A.state_off, 4096), "state: memory overlaps o");
}
TEST_P(ValidationTest, OutputOverlapsV) {
  GDN_REFUSED("o = v", p.o = const_cast<void*>(p.v), "o: memory overlaps input v");
}
TEST_P(ValidationTest, OutputOverlapsB) {
  GDN_REFUSED("b inside o", p.b = A.at(A.o_off, 8), "o: memory overlaps input b");
}
TEST_P(ValidationTest, OutputOverlapsIndices) {
  GDN_REFUSED("state_indices inside o",
              (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.o_off, 1024)),
              "o: memory overlaps input state_indices");
}
TEST_P(ValidationTest, StateOverlapsQ) {
  GDN_REFUSED("state over q", p.state = const_cast<void*>(p.q), "state: memory overlaps input q");
}
TEST_P(ValidationTest, StateOverlapsALog) {
  GDN_REFUSED("A_log inside state",
              p.A_log = static_cast<const float*>(A.at(A.state_off, 1024)),
              "state: memory overlaps input A_log");
}
TEST_P(ValidationTest, StateOverlapsOutIndices) {
  GDN_REFUSED("state_out_indices inside state",
              (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.idx_off),
               p.state_out_indices = A.at(A.state_off, 64)),
              "state: memory overlaps input state_out_indices");
}
TEST_P(ValidationTest, CounterInsideOutput) {
  GDN_REFUSED("counter inside o", p.invalid_index_count = static_cast<uint32_t*>(A.at(A.o_off, 8)),
              "o: memory overlaps invalid_index_count");
}
TEST_P(ValidationTest, CounterInsideState) {
  GDN_REFUSED("counter inside state",
              p.invalid_index_count = static_cast<uint32_t*>(A.at(A.state_off, 8)),
              "state: memory overlaps invalid_index_count");
}
TEST_P(ValidationTest, CounterOverlapsInput) {
  GDN_REFUSED("counter on a", p.invalid_index_count = static_cast<uint32_t*>(A.at(A.a_off)),
              "invalid_index_count: memory overlaps input a");
}

// Inputs may alias each other, and an unused A_log may point anywhere.
TEST_P(ValidationTest, InputAliasingAccepted) {
  expect_accepted(backend(), "q = k",
                  [](gdn::DecodeParams& p, const Arena&) { p.k = p.q; }, true);
  expect_accepted(backend(), "out indices = indices",
                  [](gdn::DecodeParams& p, const Arena& A) {
                    p.index_dtype = gdn::IndexType::kI32;
                    p.state_indices = A.at(A.idx_off);
                    p.state_out_indices = A.at(A.idx_off);
                  },
                  true);
}

// ---- the conv1d prologue and the gated RMSNorm epilogue ----------------------------

// GDN_REFUSED on the base call turned into a valid conv + norm call first.
#define GDN_REFUSED_CN(what, body, ...)                                        \
  expect_refused(backend(), what, [&](gdn::DecodeParams & p, const Arena& A) { \
    A.with_conv_norm(p);                                                       \
    body;                                                                      \
  }, {__VA_ARGS__})

TEST_P(ValidationTest, ConvAndNormCallIsValidAndWrites) {
  expect_accepted(backend(), "conv + norm",
                  [](gdn::DecodeParams& p, const Arena& A) { A.with_conv_norm(p); }, true);
  expect_accepted(backend(), "conv, no bias, tap-major pool",
                  [](gdn::DecodeParams& p, const Arena& A) {
                    A.with_conv_norm(p);
                    p.conv_bias = nullptr;
                    p.conv_state_channel_stride = 1;
                    p.conv_state_tap_stride = Arena::kConvDim;
                  },
                  true);
  expect_accepted(backend(), "norm only",
                  [](gdn::DecodeParams& p, const Arena& A) {
                    p.z = A.at(A.z_off);
                    p.norm_weight = A.at(A.norm_weight_off);
                  },
                  true);
  expect_accepted(backend(), "programmatic_launch (a hint)",
                  [](gdn::DecodeParams& p, const Arena& A) {
                    A.with_conv_norm(p);
                    p.programmatic_launch = true;
                  },
                  true);
}

TEST_P(ValidationTest, ConvWidthOutOfRange) {
  for (int w : {1, 5, -1, 64}) {
    const std::string what = "conv_width " + std::to_string(w);
    GDN_REFUSED_CN(what.c_str(), p.conv_width = w, "conv_width", std::to_string(w));
  }
}

TEST_P(ValidationTest, QkvGivenWithConv) {
  GDN_REFUSED_CN("q with conv", p.q = A.at(A.q_off), "q: must be null when conv_width is set");
  GDN_REFUSED_CN("k with conv", p.k = A.at(A.k_off), "k: must be null when conv_width is set");
  GDN_REFUSED_CN("v with conv", p.v = A.at(A.v_off), "v: must be null when conv_width is set");
}

TEST_P(ValidationTest, ConvInputsWithoutConv) {
  GDN_REFUSED("x without conv", p.x = A.at(A.x_off), "x: given, but conv_width is 0");
  GDN_REFUSED("conv_state without conv", p.conv_state = A.at(A.conv_state_off),
              "conv_state: given, but conv_width is 0");
  GDN_REFUSED("conv_weight without conv", p.conv_weight = A.at(A.conv_weight_off),
              "conv_weight: given, but conv_width is 0");
  GDN_REFUSED("conv_bias without conv", p.conv_bias = A.at(A.conv_bias_off),
              "conv_bias: given, but conv_width is 0");
}

TEST_P(ValidationTest, NullConvInputs) {
  GDN_REFUSED_CN("x null", p.x = nullptr, "x: null pointer");
  GDN_REFUSED_CN("conv_state null", p.conv_state = nullptr, "conv_state: null pointer");
  GDN_REFUSED_CN("conv_weight null", p.conv_weight = nullptr, "conv_weight: null pointer");
}

TEST_P(ValidationTest, ZWithoutNormWeight) {
  GDN_REFUSED("z without norm_weight", p.z = A.at(A.z_off),
              "z: given, but norm_weight is null");
  GDN_REFUSED_CN("z without norm_weight, conv on", p.norm_weight = nullptr,
                 "z: given, but norm_weight is null");
}

TEST_P(ValidationTest, MissingZ) {
  GDN_REFUSED("norm_weight without z", p.norm_weight = A.at(A.norm_weight_off), "z: null pointer");
  GDN_REFUSED_CN("z null, conv on", p.z = nullptr, "z: null pointer");
}

TEST_P(ValidationTest, NormEpsNegativeOrNotFinite) {
  GDN_REFUSED_CN("norm_eps -1e-3", p.norm_eps = -1e-3f, "norm_eps", "-0.001");
  GDN_REFUSED_CN("norm_eps nan", p.norm_eps = std::numeric_limits<float>::quiet_NaN(), "norm_eps",
                 "nan");
  GDN_REFUSED_CN("norm_eps inf", p.norm_eps = std::numeric_limits<float>::infinity(), "norm_eps",
                 "inf");
  // checked even when the epilogue is off
  GDN_REFUSED("norm_eps -1, no norm", p.norm_eps = -1.0f, "norm_eps", "-1");
}

TEST_P(ValidationTest, MisalignedConvAndNormPointers) {
  GDN_REFUSED_CN("x bf16 at +1", p.x = A.at(A.x_off, 1), "x: address", "not aligned", "2-byte");
  GDN_REFUSED_CN("x fp32 at +2", (p.qkv_dtype = DType::kF32, p.x = A.at(A.x_off, 2)), "x: address",
                 "4-byte");
  GDN_REFUSED_CN("conv_state at +1", p.conv_state = A.at(A.conv_state_off, 1),
                 "conv_state: address", "2-byte");
  GDN_REFUSED_CN("conv_weight at +1", p.conv_weight = A.at(A.conv_weight_off, 1),
                 "conv_weight: address", "2-byte");
  GDN_REFUSED_CN("conv_bias at +1", p.conv_bias = A.at(A.conv_bias_off, 1), "conv_bias: address",
                 "2-byte");
  GDN_REFUSED_CN("norm_weight at +1", p.norm_weight = A.at(A.norm_weight_off, 1),
                 "norm_weight: address", "2-byte");
  GDN_REFUSED_CN("z at +1", p.z = A.at(A.z_off, 1), "z: address", "2-byte");
}

TEST_P(ValidationTest, ConvAndNormStrides) {
  GDN_REFUSED_CN("x batch stride conv_dim-1", p.x_batch_stride = Arena::kConvDim - 1,
                 "x: batch stride 767 is smaller than conv_dim=768");
  GDN_REFUSED_CN("z head stride 100", p.z_head_stride = 100,
                 "z: head stride 100 is smaller than Dv=128");
  GDN_REFUSED_CN("z batch stride Dv-1", (p.z_batch_stride = 127, p.z_head_stride = 64 * 128),
                 "z: batch stride 127 is smaller than Dv=128");
  GDN_REFUSED_CN("z rows overlap", (p.z_batch_stride = 128, p.z_head_stride = 128),
                 "z: batch stride 128 and head stride 128 overlap rows");
  GDN_REFUSED_CN("x reaches past 2^60", p.x_batch_stride = (int64_t(1) << 59) + 64,
                 "x: strides reach element", "2^60");
}

TEST_P(ValidationTest, ConvStateStridesOverlap) {
  // channel-major with a channel stride below W-1 = 3
  GDN_REFUSED_CN("channel stride 2, tap stride 1", p.conv_state_channel_stride = 2,
                 "conv_state: channel stride 2 and tap stride 1 overlap", "W-1=3");
  // tap-major with a tap stride below conv_dim
  GDN_REFUSED_CN("channel stride 1, tap stride 700",
                 (p.conv_state_channel_stride = 1, p.conv_state_tap_stride = 700),
                 "conv_state: channel stride 1 and tap stride 700 overlap", "conv_dim=768");
  // both strides unset (0), and both 1
  GDN_REFUSED_CN("strides 0 and 0",
                 (p.conv_state_channel_stride = 0, p.conv_state_tap_stride = 0),
                 "conv_state: channel stride 0 and tap stride 0 overlap");
  GDN_REFUSED_CN("strides 1 and 1",
                 (p.conv_state_channel_stride = 1, p.conv_state_tap_stride = 1),
                 "conv_state: channel stride 1 and tap stride 1 overlap");
  GDN_REFUSED_CN("strides past 2^60", p.conv_state_channel_stride = int64_t(1) << 58,
                 "conv_state: strides reach beyond", "2^60");
}

// Conv strides so large that the span of a slot overflows int64 must be
// refused without signed overflow (UBSan runs this suite too).
TEST_P(ValidationTest, HugeConvStridesRefusedWithoutOverflow) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  GDN_REFUSED_CN("conv channel stride INT64_MAX", p.conv_state_channel_stride = max,
                 "conv_state:");
  GDN_REFUSED_CN("conv tap stride INT64_MAX, tap-major",
                 (p.conv_state_channel_stride = 1, p.conv_state_tap_stride = max), "conv_state:");
  GDN_REFUSED_CN("conv slot stride INT64_MAX", p.conv_state_slot_stride = max,
                 "conv_state_slot_stride:");
  GDN_REFUSED_CN("x batch stride INT64_MAX", p.x_batch_stride = max, "x:");
  GDN_REFUSED_CN("z head stride INT64_MAX", p.z_head_stride = max, "z:");
}

TEST_P(ValidationTest, ConvStateSlotStride) {
  const int64_t span = Arena::kConvDim * (Arena::kW - 1);  // 2304
  GDN_REFUSED_CN("conv slot stride span-1", p.conv_state_slot_stride = span - 1,
                 "conv_state_slot_stride: 2303 is smaller than one slot's 2304 elements");
  GDN_REFUSED_CN("conv slot stride 0", p.conv_state_slot_stride = 0,
                 "conv_state_slot_stride: 0 is smaller than one slot's 2304 elements");
  // tap-major: a slot spans (W-2) * tap stride + conv_dim
  GDN_REFUSED_CN("tap-major conv slot stride too small",
                 (p.conv_state_channel_stride = 1, p.conv_state_tap_stride = 800,
                  p.conv_state_slot_stride = 2 * 800 + 767),
                 "conv_state_slot_stride: 2367 is smaller than one slot's 2368 elements");
  GDN_REFUSED_CN("conv slot stride -1, one slot",
                 (p.index_dtype = gdn::IndexType::kI32, p.state_indices = A.at(A.idx_off),
                  p.num_slots = 1, p.conv_state_slot_stride = -1),
                 "conv_state_slot_stride", "-1");
  GDN_REFUSED_CN("conv pool past 2^60", p.conv_state_slot_stride = int64_t(1) << 59,
                 "conv_state_slot_stride", "2^60");
}

TEST_P(ValidationTest, ConvStateOverlaps) {
  GDN_REFUSED_CN("conv_state on the state pool", p.conv_state = A.at(A.state_off),
                 "state: memory overlaps conv_state");
  GDN_REFUSED_CN("conv_state inside the state pool", p.conv_state = A.at(A.state_off, 4096),
                 "state: memory overlaps conv_state");
  GDN_REFUSED_CN("conv_state on o", p.conv_state = A.at(A.o_off, 64),
                 "o: memory overlaps conv_state");
  GDN_REFUSED_CN("conv_state on x", p.conv_state = const_cast<void*>(p.x),
                 "conv_state: memory overlaps input x");
  GDN_REFUSED_CN("conv_weight inside conv_state",
                 p.conv_weight = A.at(A.conv_state_off, 1024),
                 "conv_state: memory overlaps input conv_weight");
  GDN_REFUSED_CN("conv_bias inside conv_state", p.conv_bias = A.at(A.conv_state_off, 512),
                 "conv_state: memory overlaps input conv_bias");
  GDN_REFUSED_CN("a inside conv_state", p.a = A.at(A.conv_state_off, 256),
                 "conv_state: memory overlaps input a");
  GDN_REFUSED_CN("counter inside conv_state",
                 p.invalid_index_count = static_cast<uint32_t*>(A.at(A.conv_state_off, 8)),
                 "invalid_index_count: memory overlaps conv_state");
}

TEST_P(ValidationTest, NormInputsOverlapOutputs) {
  GDN_REFUSED_CN("o on z", p.o = const_cast<void*>(p.z), "o: memory overlaps input z");
  GDN_REFUSED_CN("norm_weight inside state", p.norm_weight = A.at(A.state_off, 64),
                 "state: memory overlaps input norm_weight");
  GDN_REFUSED_CN("z inside conv_state", p.z = A.at(A.conv_state_off, 128),
                 "conv_state: memory overlaps input z");
}

// Inputs of the new stages may alias each other (x and z read-only).
TEST_P(ValidationTest, ConvNormInputAliasingAccepted) {
  expect_accepted(backend(), "z = x",
                  [](gdn::DecodeParams& p, const Arena& A) {
                    A.with_conv_norm(p);
                    p.z = p.x;
                  },
                  true);
}

// ---- the backend argument -------------------------------------------------------

TEST_P(ValidationTest, UnknownBackendValue) {
  for (int be : {-1, 4, 9}) {
    const std::string what = "backend " + std::to_string(be);
    expect_refused(backend(), what.c_str(), [](gdn::DecodeParams&, const Arena&) {},
                   {"backend", std::to_string(be)}, gdn::Backend(be));
  }
}

}  // namespace
}  // namespace gdn_test
