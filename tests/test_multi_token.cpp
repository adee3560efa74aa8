// Multi-token decode (speculative decoding) on the host backend: one call of
// T tokens against T one-token calls chained through the pool, bitwise (the
// host reference rounds the state to state_dtype after every token, exactly
// as a store and a reload do), for every state handling: the final state in
// place, per-token slots with num_accepted_tokens (vLLM), a dense buffer of
// intermediate states with the pool left alone (FlashInfer), packed
// variable-length rows (cu_seqlens), padding and out-of-range rows, and the
// conv prologue and norm epilogue per token. Then the refusals.
#include <cstring>
#include <random>
#include <vector>

#include "test_util.hpp"

namespace gdn_test {
namespace {

using gdn::DType;
using gdn::IndexType;

// B rows of up to T tokens, fp32 inputs and outputs, the state in `sd`.
struct Mt {
  int64_t B, T, slots;
  int32_t Hk = 2, Hv = 4, Dk = 32, Dv = 32;
  DType sd;
  gdn::Layout layout;
  int32_t W = 0;      // conv width (0: q, k, v given directly)
  bool norm = false;  // gated RMSNorm epilogue
  std::vector<float> q, k, v, a, b, x, z, A_log, dt_bias, conv_weight, conv_bias, norm_weight, o;
  std::vector<uint8_t> pool;
  std::vector<float> conv;  // conv state pool [slot, conv_dim, W-1] (fp32 inputs: qkv dtype)

  Mt(int64_t B_, int64_t T_, int64_t slots_, DType sd_, gdn::Layout l, uint64_t seed, int32_t W_ = 0,
     bool norm_ = false)
      : B(B_), T(T_), slots(slots_), sd(sd_), layout(l), W(W_), norm(norm_) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.f, 1.f);
    std::uniform_real_distribution<float> u(1.f, 16.f);
    auto fill = [&](std::vector<float>& t, size_t count, float s) {
      t.resize(count);
      for (float& e : t) e = s * n01(rng);
    };
    const size_t rows = size_t(B * T);
    fill(q, rows * Hk * Dk, 1.f);
    fill(k, rows * Hk * Dk, 1.f);
    fill(v, rows * Hv * Dv, 1.f);
    fill(a, rows * Hv, 1.f);
    fill(b, rows * Hv, 1.f);
    fill(dt_bias, size_t(Hv), 0.1f);
    A_log.resize(size_t(Hv));
    for (float& e : A_log) e = std::log(u(rng));
    const int64_t cdim = 2 * Hk * Dk + Hv * Dv;
    if (W > 0) {
      fill(x, rows * size_t(cdim), 1.f);
      fill(conv_weight, size_t(cdim * W), 0.5f);
      fill(conv_bias, size_t(cdim), 0.1f);
      fill(conv, size_t(slots * cdim * (W - 1)), 1.f);
    }
    if (norm) {
      fill(z, rows * Hv * Dv, 1.f);
      fill(norm_weight, size_t(Dv), 1.f);
    }
    const size_t elems = size_t(slots) * Hv * Dk * Dv;
    pool.resize(elems * gdn::dtype_size(sd));
    for (size_t i = 0; i < elems; ++i) gdn::store_element(pool.data(), sd, int64_t(i), 0.5 * n01(rng));
    o.assign(rows * Hv * Dv, std::nanf(""));
  }

  // The multi-token call over every tensor (dense (B, T, ...)).
  gdn::DecodeParams params() {
    gdn::DecodeParams p;
    p.batch = B;
    p.num_tokens = int32_t(T);
    p.num_k_heads = Hk;
    p.num_v_heads = Hv;
    p.head_dim_k = Dk;
    p.head_dim_v = Dv;
    p.qkv_dtype = p.ab_dtype = p.o_dtype = DType::kF32;
    p.state_dtype = sd;
    p.layout = layout;
    p.a = a.data();
    p.b = b.data();
    p.A_log = A_log.data();
    p.dt_bias = dt_bias.data();
    p.state = pool.data();
    p.num_slots = slots;
    p.o = o.data();
    if (W > 0) {
      p.conv_width = W;
      p.x = x.data();
      p.conv_state = conv.data();
      p.conv_weight = conv_weight.data();
      p.conv_bias = conv_bias.data();
    } else {
      p.q = q.data();
      p.k = k.data();
      p.v = v.data();
    }
    if (norm) {
      p.z = z.data();
      p.norm_weight = norm_weight.data();
    }
    gdn::set_dense_strides(p);
    return p;
  }

  // Token t of the rows as a one-token call (the (B, T, ...) tensors' batch
  // strides kept, the pointers moved to token t).
  gdn::DecodeParams token_call(int64_t t) {
    gdn::DecodeParams m = params();
    gdn::DecodeParams p = m;
    p.num_tokens = 1;
    auto at = [t](auto* base, int64_t token_stride) { return base + t * token_stride; };
    p.a = at(a.data(), m.a_token_stride);
    p.b = at(b.data(), m.b_token_stride);
    p.o = at(o.data(), m.o_token_stride);
    if (W > 0) {
      p.x = at(x.data(), m.x_token_stride);
    } else {
      p.q = at(q.data(), m.q_token_stride);
      p.k = at(k.data(), m.k_token_stride);
      p.v = at(v.data(), m.v_token_stride);
    }
    if (norm) p.z = at(z.data(), m.z_token_stride);
    return p;
  }
};

void run_ok(const gdn::DecodeParams& p) {
  const gdn::Status st = gdn::decode(p, gdn::Backend::kHost);
  ASSERT_TRUE(st.ok()) << st.message;
}

template <typename V>
::testing::AssertionResult bitwise(const V& x, const V& y, const char* what) {
  if (x.size() != y.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  if (x.empty()) return ::testing::AssertionSuccess();  // (memcmp may not see a null pointer)
  if (std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) != 0) {
    for (size_t i = 0; i < x.size(); ++i)
      if (std::memcmp(&x[i], &y[i], sizeof(x[0])) != 0)
        return ::testing::AssertionFailure() << what << ": element " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

struct Variant {
  DType sd;
  gdn::Layout layout;
  int32_t W;
  bool norm;
};

class MultiToken : public ::testing::TestWithParam<Variant> {};

// Final state in place: one call of T tokens == T one-token calls, bitwise.
TEST_P(MultiToken, OneCallEqualsTOneTokenCalls) {
  const Variant var = GetParam();
  for (int64_t T : {2, 4, 8}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    Mt one(3, T, 3, var.sd, var.layout, 100 + uint64_t(T), var.W, var.norm);
    Mt seq = one;
    run_ok(one.params());
    for (int64_t t = 0; t < T; ++t) run_ok(seq.token_call(t));
    EXPECT_TRUE(bitwise(one.o, seq.o, "o"));
    EXPECT_TRUE(bitwise(one.pool, seq.pool, "pool"));
    EXPECT_TRUE(bitwise(one.conv, seq.conv, "conv state"));
  }
}

// vLLM: per-token slots [B, T], the initial state from slot [b, n-1] of the
// accepted tokens n; token t's state to slot [b, t]. Equals one-token calls
// reading the previous token's slot and writing the next.
TEST_P(MultiToken, PerTokenSlotsFromAcceptedTokens) {
  const Variant var = GetParam();
  const int64_t B = 3, T = 4;
  const std::vector<int32_t> tsi = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::vector<int32_t> accepted = {1, 3, 4};
  Mt one(B, T, 12, var.sd, var.layout, 7, var.W, var.norm);
  Mt seq = one;
  gdn::DecodeParams p = one.params();
  p.index_dtype = IndexType::kI32;
  p.token_state_indices = tsi.data();
  p.num_accepted_tokens = accepted.data();
  gdn::set_dense_strides(p);
  run_ok(p);
  std::vector<int32_t> in(B), out(B);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      in[size_t(b)] = t == 0 ? tsi[size_t(b * T + accepted[size_t(b)] - 1)] : tsi[size_t(b * T + t - 1)];
      out[size_t(b)] = tsi[size_t(b * T + t)];
    }
    gdn::DecodeParams s = seq.token_call(t);
    s.index_dtype = IndexType::kI32;
    s.state_indices = in.data();
    s.state_out_indices = out.data();
    run_ok(s);
  }
  EXPECT_TRUE(bitwise(one.o, seq.o, "o"));
  EXPECT_TRUE(bitwise(one.pool, seq.pool, "pool"));
  EXPECT_TRUE(bitwise(one.conv, seq.conv, "conv state"));
}

// FlashInfer: every token's state into a dense (B, T) buffer, the pool left
// alone (update_state = false).
TEST_P(MultiToken, IntermediateStatesWithoutPoolUpdate) {
  const Variant var = GetParam();
  const int64_t B = 2, T = 3;
  Mt one(B, T, 2, var.sd, var.layout, 9, var.W, var.norm);
  Mt seq = one;
  const size_t slot_bytes = size_t(one.Hv) * one.Dk * one.Dv * gdn::dtype_size(var.sd);
  std::vector<uint8_t> inter(size_t(B * T) * slot_bytes, 0xFF);
  const std::vector<uint8_t> pool_before = one.pool;
  gdn::DecodeParams p = one.params();
  p.intermediate_states = inter.data();
  p.update_state = false;
  gdn::set_dense_strides(p);
  run_ok(p);
  EXPECT_TRUE(bitwise(one.pool, pool_before, "pool (update_state = false)"));
  for (int64_t t = 0; t < T; ++t) {
    run_ok(seq.token_call(t));
    for (int64_t b = 0; b < B; ++b)
      EXPECT_EQ(0, std::memcmp(inter.data() + size_t(b * T + t) * slot_bytes, seq.pool.data() + size_t(b) * slot_bytes,
                               slot_bytes))
          << "intermediate state of row " << b << " after token " << t;
  }
  EXPECT_TRUE(bitwise(one.o, seq.o, "o"));
}

INSTANTIATE_TEST_SUITE_P(
    Host, MultiToken,
    ::testing::Values(Variant{DType::kF32, gdn::Layout::kVK, 0, false}, Variant{DType::kF32, gdn::Layout::kKV, 0, false},
                      Variant{DType::kBF16, gdn::Layout::kVK, 0, false}, Variant{DType::kF16, gdn::Layout::kKV, 0, false},
                      Variant{DType::kBF16, gdn::Layout::kKV, 4, true}, Variant{DType::kF32, gdn::Layout::kVK, 3, true}),
    [](const ::testing::TestParamInfo<Variant>& i) {
      return std::string(gdn::to_string(i.param.sd)) + "_" + gdn::to_string(i.param.layout) +
             (i.param.W ? "_conv" : "") + (i.param.norm ? "_norm" : "");
    });

// Packed rows of 2, 0 and 3 tokens (cu_seqlens), with a padding row and an
// out-of-range slot: each valid row equals its own one-token calls; the
// padding row's outputs are zero; the bad slot is counted, nothing written.
TEST(MultiTokenHost, VariableLengthRowsPaddingAndBadSlots) {
  const int64_t T = 3;
  const std::vector<int32_t> cu = {0, 2, 2, 5, 6, 7};  // rows: 2, 0, 3, 1, 1 tokens
  const std::vector<int32_t> slots = {4, 1, 0, -1, 9};
  Mt packed(1, 7, 5, DType::kF32, gdn::Layout::kVK, 11);  // 7 packed tokens
  Mt ref = packed;
  uint32_t counter = 0;
  gdn::DecodeParams p = packed.params();
  p.batch = 5;
  p.num_tokens = int32_t(T);
  p.cu_seqlens = cu.data();
  p.total_tokens = 7;
  p.index_dtype = IndexType::kI32;
  p.state_indices = slots.data();
  p.invalid_index_count = &counter;
  gdn::set_dense_strides(p);
  run_ok(p);
  EXPECT_EQ(counter, 1u) << "slot 9 of a 5-slot pool";
  // Reference: token j of row b is packed token cu[b] + j; one-token calls, one row at a time.
  for (int64_t b : {0, 2}) {
    for (int64_t j = 0; j < cu[size_t(b + 1)] - cu[size_t(b)]; ++j) {
      gdn::DecodeParams s = ref.token_call(cu[size_t(b)] + j);
      s.batch = 1;
      s.index_dtype = IndexType::kI32;
      s.state_indices = &slots[size_t(b)];
      run_ok(s);
    }
  }
  const size_t row = size_t(packed.Hv) * packed.Dv;
  for (int64_t t = 0; t < 7; ++t) {
    const float* got = packed.o.data() + size_t(t) * row;
    if (t == 5 || t == 6) {  // the padding row's token and the bad slot's
      for (size_t j = 0; j < row; ++j) ASSERT_EQ(got[j], 0.f) << "token " << t;
    } else {
      EXPECT_EQ(0, std::memcmp(got, ref.o.data() + size_t(t) * row, row * sizeof(float))) << "token " << t;
    }
  }
  EXPECT_TRUE(bitwise(packed.pool, ref.pool, "pool"));
}

// Every caller error: refused, naming the argument, nothing written.
TEST(MultiTokenHost, Refusals) {
  Mt m(2, 2, 4, DType::kF32, gdn::Layout::kVK, 13);
  const std::vector<uint8_t> pool0 = m.pool;
  const std::vector<int32_t> tsi = {0, 1, 2, 3}, idx = {0, 1}, accepted = {1, 1};
  std::vector<uint8_t> inter(4 * size_t(m.Hv) * m.Dk * m.Dv * 4);
  struct Case {
    const char* what;
    std::function<void(gdn::DecodeParams&)> mutate;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"T = 0", [](gdn::DecodeParams& p) { p.num_tokens = 0; }, "num_tokens"},
      {"T over the limit", [](gdn::DecodeParams& p) { p.num_tokens = gdn::kMaxTokens + 1; }, "num_tokens"},
      {"token slots with write slots",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.state_indices = idx.data();
         p.state_out_indices = idx.data() + 0;
         p.token_state_indices = tsi.data();
         p.token_state_indices_stride = 2;
       },
       "state_out_indices"},
      {"accepted tokens without token slots",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.num_accepted_tokens = accepted.data();
       },
       "num_accepted_tokens"},
      {"token slot rows overlap",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.token_state_indices = tsi.data();
         p.token_state_indices_stride = 1;
       },
       "token_state_indices"},
      {"intermediate buffer rows overlap",
       [&](gdn::DecodeParams& p) {
         p.intermediate_states = inter.data();
         p.intermediate_token_stride = m.Hv * m.Dk * m.Dv;
         p.intermediate_batch_stride = 16;
       },
       "intermediate_states"},
      {"intermediate buffer on the pool",
       [&](gdn::DecodeParams& p) {
         p.intermediate_states = m.pool.data();
         p.intermediate_token_stride = m.Hv * m.Dk * m.Dv;
         p.intermediate_batch_stride = 2 * p.intermediate_token_stride;
       },
       "intermediate_states"},
      {"two rows write one token slot",
       [&](gdn::DecodeParams& p) {
         static const std::vector<int32_t> dup = {0, 1, 1, 2};
         p.index_dtype = IndexType::kI32;
         p.token_state_indices = dup.data();
         p.token_state_indices_stride = 2;
       },
       "token_state_indices"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    gdn::DecodeParams p = m.params();
    c.mutate(p);
    std::fill(m.o.begin(), m.o.end(), 7.f);
    const gdn::Status st = gdn::decode(p, gdn::Backend::kHost);
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(contains(st.message, c.needle)) << st.message;
    EXPECT_TRUE(bitwise(m.pool, pool0, "pool"));
    for (float e : m.o) ASSERT_EQ(e, 7.f) << "o written";
  }
}

}  // namespace
}  // namespace gdn_test
