// Multi-token decode (speculative decoding), on every backend. One call of T
// tokens against T one-token calls chained through the pool on the same
// backend, bitwise: a backend keeps the state across the tokens and rounds it
// to state_dtype after every token, exactly as a store and a reload do
// (docs/operation.md, "Multi-token decode"). That for every state handling:
// the final state in place, per-token slots with num_accepted_tokens (vLLM),
// a dense buffer of intermediate states and conv states with or without the
// pool update (FlashInfer), packed variable-length rows (cu_seqlens), padding
// and out-of-range rows, and the conv prologue and norm epilogue per token.
// Then the refusals, and on a GPU backend every mode against the host
// reference within the tolerances of the other shared suites.
//
// Every tensor lives on the backend under test and is reached only through
// its alloc and copy. A backend without the device skips (BackendTest); one
// that is present must run every mode: kUnsupported fails like any refusal.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend_suites.hpp"
#include "random_case.hpp"

namespace gdn_test {
namespace {

using gdn::DType;
using gdn::IndexType;
using gdn::Layout;

// ---- the problems ------------------------------------------------------------------

struct Variant {
  int32_t Hk, Hv, Dk, Dv;
  DType io;   // q, k, v, a, b; x, z, the conv pool and weights, norm_weight
  DType out;  // o
  DType sd;   // the state pool and the intermediate states
  Layout layout;
  int32_t W;  // conv width (0: q, k, v given directly)
  bool norm;  // gated RMSNorm epilogue
};

// Small heads for every state dtype, layout and fused stage; then the tuned
// head dim at G = 2 and Dk != Dv both ways (a transposed layout shows), with
// the 16-bit inputs engines pass, so a GPU backend runs its real geometry;
// then many v-heads a k-head.
constexpr Variant kVariants[] = {
    {2, 4, 32, 32, DType::kF32, DType::kF32, DType::kF32, Layout::kVK, 0, false},
    {2, 4, 32, 32, DType::kF32, DType::kF32, DType::kF32, Layout::kKV, 0, false},
    {2, 4, 32, 32, DType::kF32, DType::kF32, DType::kBF16, Layout::kVK, 0, false},
    {2, 4, 32, 32, DType::kF32, DType::kF32, DType::kF16, Layout::kKV, 0, false},
    {2, 4, 32, 32, DType::kF32, DType::kF32, DType::kBF16, Layout::kKV, 4, true},
    {2, 4, 32, 32, DType::kF32, DType::kF32, DType::kF32, Layout::kVK, 3, true},
    {2, 4, 128, 128, DType::kBF16, DType::kBF16, DType::kF32, Layout::kVK, 4, true},
    {2, 4, 128, 128, DType::kBF16, DType::kF32, DType::kBF16, Layout::kKV, 0, false},
    {2, 4, 64, 128, DType::kBF16, DType::kBF16, DType::kF16, Layout::kVK, 2, false},
    {1, 4, 128, 64, DType::kF16, DType::kF16, DType::kBF16, Layout::kKV, 0, true},
    // 64 v-heads a k-head: at T = 8 more (token, head) gates than a GPU block has threads
    {1, 64, 16, 16, DType::kBF16, DType::kBF16, DType::kF32, Layout::kVK, 0, false},
};

std::string describe(const Variant& v) {
  return "Hk=" + std::to_string(v.Hk) + " Hv=" + std::to_string(v.Hv) + " Dk=" + std::to_string(v.Dk) +
         " Dv=" + std::to_string(v.Dv) + ", io " + gdn::to_string(v.io) + " o " + gdn::to_string(v.out) +
         " state " + gdn::to_string(v.sd) + " " + gdn::to_string(v.layout) +
         (v.W ? ", conv W=" + std::to_string(v.W) : std::string()) + (v.norm ? ", norm" : "");
}

// B rows of T tokens (dense (B, T, ...) token-major tensors), every tensor as
// stored, in its dtype. Values from realistic ranges (those of random_case.cpp),
// a random state in every slot.
struct Problem {
  Variant var{};
  int64_t B{0}, T{0}, slots{0};
  std::vector<uint8_t> q, k, v, a, b, x, z, conv_weight, conv_bias, norm_weight, pool, conv;
  std::vector<float> A_log, dt_bias;

  int64_t cdim() const { return 2 * int64_t(var.Hk) * var.Dk + int64_t(var.Hv) * var.Dv; }
  int64_t slot_elems() const { return int64_t(var.Hv) * var.Dk * var.Dv; }
  int64_t conv_span() const { return cdim() * (var.W - 1); }  // one conv slot, [conv_dim, W-1]
  int64_t o_row() const { return int64_t(var.Hv) * var.Dv; }  // one token's output
};

Problem make_problem(const Variant& var, int64_t B, int64_t T, int64_t slots, uint64_t seed) {
  Problem pr;
  pr.var = var;
  pr.B = B;
  pr.T = T;
  pr.slots = slots;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  auto fill = [](std::vector<uint8_t>& buf, int64_t n, DType t, const std::function<double()>& draw) {
    buf.assign(size_t(n) * gdn::dtype_size(t), 0);
    for (int64_t i = 0; i < n; ++i) gdn::store_element(buf.data(), t, i, draw());
  };
  auto normal = [&](double sd) { return [&, sd] { return sd * n01(rng); }; };
  auto uniform = [&](double lo, double hi) { return [&, lo, hi] { return lo + (hi - lo) * u01(rng); }; };
  const int64_t rows = B * T;
  if (var.W > 0) {
    fill(pr.x, rows * pr.cdim(), var.io, normal(1.0));
  } else {
    fill(pr.q, rows * var.Hk * var.Dk, var.io, normal(1.0));
    fill(pr.k, rows * var.Hk * var.Dk, var.io, normal(1.0));
    fill(pr.v, rows * var.Hv * var.Dv, var.io, normal(1.0));
  }
  fill(pr.a, rows * var.Hv, var.io, normal(1.0));
  fill(pr.b, rows * var.Hv, var.io, normal(1.0));
  for (int32_t h = 0; h < var.Hv; ++h) {
    // A = U(1, 16); dt log-uniform in [1e-3, 0.1]; dt_bias = softplus^-1(dt)
    pr.A_log.push_back(float(std::log(1.0 + 15.0 * u01(rng))));
    const double dt = std::exp(std::log(1e-3) + (std::log(0.1) - std::log(1e-3)) * u01(rng));
    pr.dt_bias.push_back(float(std::log(std::expm1(dt))));
  }
  if (var.W > 0) {
    fill(pr.conv_weight, pr.cdim() * var.W, var.io, uniform(-0.6, 0.6));
    fill(pr.conv_bias, pr.cdim(), var.io, uniform(-0.2, 0.2));
    fill(pr.conv, slots * pr.conv_span(), var.io, normal(1.0));
  }
  if (var.norm) {
    fill(pr.z, rows * var.Hv * var.Dv, var.io, normal(1.0));
    fill(pr.norm_weight, var.Dv, var.io, uniform(0.5, 1.5));
  }
  fill(pr.pool, slots * pr.slot_elems(), var.sd, normal(0.5));
  return pr;
}

template <typename E>
std::vector<uint8_t> bytes_of(const std::vector<E>& e) {
  std::vector<uint8_t> out(e.size() * sizeof(E));
  if (!e.empty()) std::memcpy(out.data(), e.data(), out.size());
  return out;
}

// An int32 index array on the backend.
DeviceBuffer indices(gdn::Backend be, const std::vector<int32_t>& idx) { return DeviceBuffer(be, bytes_of(idx)); }

// What a call left in the buffers it may write.
struct Outcome {
  std::vector<uint8_t> o, pool, conv, inter, inter_conv;
  uint32_t counter{0};
};

// A problem on one backend: every tensor copied there, o the canary (NaN in
// every dtype, so a token nobody wrote shows), the counter zero.
struct OnBackend {
  OnBackend(const Problem& problem, gdn::Backend be) : pr(&problem), backend(be) {
    auto copy = [be](DeviceBuffer& d, const std::vector<uint8_t>& host) {
      if (!host.empty()) d = DeviceBuffer(be, host);
    };
    copy(q, problem.q);
    copy(k, problem.k);
    copy(v, problem.v);
    copy(a, problem.a);
    copy(b, problem.b);
    copy(x, problem.x);
    copy(z, problem.z);
    copy(conv_weight, problem.conv_weight);
    copy(conv_bias, problem.conv_bias);
    copy(norm_weight, problem.norm_weight);
    copy(pool, problem.pool);
    copy(conv, problem.conv);
    A_log = DeviceBuffer(be, bytes_of(problem.A_log));
    dt_bias = DeviceBuffer(be, bytes_of(problem.dt_bias));
    const size_t o_bytes = size_t(problem.B * problem.T * problem.o_row()) * gdn::dtype_size(problem.var.out);
    o = DeviceBuffer(be, std::vector<uint8_t>(o_bytes, kCanary));
    counter = DeviceBuffer(be, std::vector<uint8_t>(4, 0));
  }

  // The multi-token call over every tensor, dense (B, T, ...), slot b for row b.
  gdn::DecodeParams params() const {
    const Variant& var = pr->var;
    gdn::DecodeParams p;
    p.batch = pr->B;
    p.num_tokens = int32_t(pr->T);
    p.num_k_heads = var.Hk;
    p.num_v_heads = var.Hv;
    p.head_dim_k = var.Dk;
    p.head_dim_v = var.Dv;
    p.qkv_dtype = p.ab_dtype = var.io;
    p.o_dtype = var.out;
    p.state_dtype = var.sd;
    p.layout = var.layout;
    p.a = a.get();
    p.b = b.get();
    p.A_log = A_log.as<float>();
    p.dt_bias = dt_bias.as<float>();
    p.state = pool.get();
    p.num_slots = pr->slots;
    p.o = o.get();
    p.invalid_index_count = counter.as<uint32_t>();
    if (var.W > 0) {
      p.conv_width = var.W;
      p.x = x.get();
      p.conv_state = conv.get();
      p.conv_weight = conv_weight.get();
      p.conv_bias = conv_bias.get();
    } else {
      p.q = q.get();
      p.k = k.get();
      p.v = v.get();
    }
    if (var.norm) {
      p.z = z.get();
      p.norm_weight = norm_weight.get();
    }
    gdn::set_dense_strides(p);
    return p;
  }

  // Token t of every row as a one-token call: the (B, T, ...) tensors' batch
  // strides kept, the pointers moved to token t (token t of a packed
  // problem's tensors with batch = 1).
  gdn::DecodeParams token_call(int64_t t) const {
    gdn::DecodeParams p = params();
    const Variant& var = pr->var;
    auto at = [t](const DeviceBuffer& d, int64_t token_stride, DType dt) {
      return d.as<uint8_t>(size_t(t * token_stride) * gdn::dtype_size(dt));
    };
    p.num_tokens = 1;
    p.a = at(a, p.a_token_stride, var.io);
    p.b = at(b, p.b_token_stride, var.io);
    p.o = at(o, p.o_token_stride, var.out);
    if (var.W > 0) {
      p.x = at(x, p.x_token_stride, var.io);
    } else {
      p.q = at(q, p.q_token_stride, var.io);
      p.k = at(k, p.k_token_stride, var.io);
      p.v = at(v, p.v_token_stride, var.io);
    }
    if (var.norm) p.z = at(z, p.z_token_stride, var.io);
    return p;
  }

  std::vector<uint8_t> conv_pool() const { return pr->var.W > 0 ? conv.download() : std::vector<uint8_t>(); }
  Outcome outcome() const {
    Outcome out;
    out.o = o.download();
    out.pool = pool.download();
    out.conv = conv_pool();
    const std::vector<uint8_t> c = counter.download();
    std::memcpy(&out.counter, c.data(), 4);
    return out;
  }

  const Problem* pr;
  gdn::Backend backend;
  DeviceBuffer q, k, v, a, b, x, z, A_log, dt_bias, conv_weight, conv_bias, norm_weight, pool, conv, o, counter;
};

// decode() and a wait for it. Any refusal fails, kUnsupported included: a
// backend that is present must run every multi-token mode.
::testing::AssertionResult ran(gdn::Backend be, const gdn::DecodeParams& p) {
  const gdn::Status st = gdn::decode(p, be);
  if (!st.ok())
    return ::testing::AssertionFailure() << gdn::to_string(be) << " refused the call: " << gdn::to_string(st.code)
                                         << ": " << st.message;
  const gdn::Status sync = gdn::backend_ops(be)->synchronize(p.stream);
  if (!sync.ok()) return ::testing::AssertionFailure() << "synchronize: " << sync.message;
  return ::testing::AssertionSuccess();
}

// ---- the modes, one call each (shared by the bitwise tests and the host cross-check) ----

// Final state in place, slot b for row b.
::testing::AssertionResult run_final(gdn::Backend be, const Problem& pr, Outcome* out) {
  const OnBackend d(pr, be);
  ::testing::AssertionResult r = ran(be, d.params());
  if (r) *out = d.outcome();
  return r;
}

// Per-token slots (B, T); the initial slot from num_accepted_tokens, or from
// state_indices when `in` is given; the final state besides to slot out[b]
// when `out` is given (FlashInfer's split pool).
struct TokenSlots {
  std::vector<int32_t> tsi, accepted, in, out;
};

::testing::AssertionResult run_token_slots(gdn::Backend be, const Problem& pr, const TokenSlots& ts, Outcome* out) {
  const OnBackend d(pr, be);
  const DeviceBuffer tsi = indices(be, ts.tsi);
  const DeviceBuffer accepted = indices(be, ts.accepted.empty() ? std::vector<int32_t>{0} : ts.accepted);
  const DeviceBuffer in = indices(be, ts.in.empty() ? std::vector<int32_t>{0} : ts.in);
  const DeviceBuffer fin = indices(be, ts.out.empty() ? std::vector<int32_t>{0} : ts.out);
  gdn::DecodeParams p = d.params();
  p.index_dtype = IndexType::kI32;
  p.token_state_indices = tsi.get();
  if (!ts.accepted.empty()) p.num_accepted_tokens = accepted.get();
  if (!ts.in.empty()) p.state_indices = in.get();
  if (!ts.out.empty()) p.state_out_indices = fin.get();
  gdn::set_dense_strides(p);
  ::testing::AssertionResult r = ran(be, p);
  if (r) *out = d.outcome();
  return r;
}

// Every token's state (and conv state) into dense (B, T) buffers that start
// as the canary; the pools written or left alone (update_state).
::testing::AssertionResult run_intermediates(gdn::Backend be, const Problem& pr, bool update_state, Outcome* out) {
  const OnBackend d(pr, be);
  const size_t states = size_t(pr.B * pr.T);
  const DeviceBuffer inter(
      be, std::vector<uint8_t>(states * size_t(pr.slot_elems()) * gdn::dtype_size(pr.var.sd), kCanary));
  DeviceBuffer inter_conv;
  if (pr.var.W > 0)
    inter_conv =
        DeviceBuffer(be, std::vector<uint8_t>(states * size_t(pr.conv_span()) * gdn::dtype_size(pr.var.io), kCanary));
  gdn::DecodeParams p = d.params();
  p.intermediate_states = inter.get();
  p.intermediate_conv_states = inter_conv.get();
  p.update_state = update_state;
  gdn::set_dense_strides(p);
  ::testing::AssertionResult r = ran(be, p);
  if (r) {
    *out = d.outcome();
    out->inter = inter.download();
    if (pr.var.W > 0) out->inter_conv = inter_conv.download();
  }
  return r;
}

// Packed rows (cu_seqlens) over a problem built as one row of total tokens
// (so its tensors hold the packed tokens), T tokens at most a row.
struct Packed {
  int32_t T;
  std::vector<int32_t> cu, slots;  // cu: B + 1 entries; slots: B read (and write) slots
};

::testing::AssertionResult run_packed(gdn::Backend be, const Problem& pr, const Packed& pk, Outcome* out) {
  const OnBackend d(pr, be);
  const DeviceBuffer cu = indices(be, pk.cu);
  const DeviceBuffer slots = indices(be, pk.slots);
  gdn::DecodeParams p = d.params();
  p.batch = int64_t(pk.slots.size());
  p.num_tokens = pk.T;
  p.cu_seqlens = cu.get();
  p.total_tokens = pr.T;
  p.index_dtype = IndexType::kI32;
  p.state_indices = slots.get();
  gdn::set_dense_strides(p);
  ::testing::AssertionResult r = ran(be, p);
  if (r) *out = d.outcome();
  return r;
}

// ---- comparisons ------------------------------------------------------------------

// Byte for byte; names the first element (of `elem` bytes) that differs.
::testing::AssertionResult bitwise(const std::vector<uint8_t>& x, const std::vector<uint8_t>& y, const char* what,
                                   size_t elem) {
  if (x.size() != y.size())
    return ::testing::AssertionFailure() << what << ": " << x.size() << " bytes against " << y.size();
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return ::testing::AssertionFailure() << what << ": element " << i / elem << " differs";
  return ::testing::AssertionSuccess();
}

// Every element of the dense (B, T) output written (no canary left).
::testing::AssertionResult every_token_written(const std::vector<uint8_t>& o, DType t) {
  const int64_t n = int64_t(o.size() / gdn::dtype_size(t));
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(gdn::load_element(o.data(), t, i)))
      return ::testing::AssertionFailure() << "o: element " << i << " is NaN (never written?)";
  return ::testing::AssertionSuccess();
}

// The element `i` of a (B, T) or packed token-major buffer of `unit`-element
// units (an output row, a state), for failure messages.
std::string unit_name(const char* what, int64_t i, int64_t unit) {
  return std::string(what) + " unit " + std::to_string(i / unit) + ", element " + std::to_string(i % unit);
}

// The backend's buffer against the host backend's, in units of `unit`
// elements (a token's output row, a slot, one intermediate state): a unit the
// host leaves as it was (`before`) must come back bitwise as it was, a unit
// the host writes as zeros (a padding row) exactly zero, and the rest lie
// within `tol`, the relative L2 error over all of them together (as
// check_step measures the other shared suites). Per unit, not per element: a
// 16-bit state element may round back to its old value on one backend and
// not on the other.
::testing::AssertionResult close_to_host(const char* what, const std::vector<uint8_t>& got,
                                         const std::vector<uint8_t>& host, const std::vector<uint8_t>& before, DType t,
                                         int64_t unit, double tol) {
  if (got.size() != host.size() || host.size() != before.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " bytes, the host's " << host.size();
  const size_t es = gdn::dtype_size(t), ub = size_t(unit) * es;
  std::vector<double> g, w;
  std::vector<int64_t> where;
  for (size_t u = 0; u * ub < host.size(); ++u) {
    const uint8_t* hp = host.data() + u * ub;
    const uint8_t* gp = got.data() + u * ub;
    const uint8_t* bp = before.data() + u * ub;
    if (std::memcmp(hp, bp, ub) == 0) {
      if (std::memcmp(gp, bp, ub) != 0)
        return ::testing::AssertionFailure()
               << what << ": unit " << u << " changed; the host backend leaves it as it was";
      continue;
    }
    bool zeros = true;
    for (int64_t j = 0; j < unit && zeros; ++j) zeros = gdn::load_element(hp, t, j) == 0.0;
    for (int64_t j = 0; j < unit; ++j) {
      const double gv = gdn::load_element(gp, t, j);
      if (zeros && !(gv == 0.0))
        return ::testing::AssertionFailure() << what << ": unit " << u << " element " << j << " is " << gv
                                             << "; the host backend writes the unit as zeros (padding)";
      g.push_back(gv);
      w.push_back(gdn::load_element(hp, t, j));
      where.push_back(int64_t(u) * unit + j);
    }
  }
  return expect_close(what, g, w, tol, [&](int64_t i) { return unit_name(what, where[size_t(i)], unit); });
}

// The bounds of the other shared suites (docs/operation.md, Numerics), by the
// dtype a result is stored in. From the second token on, an output comes from
// a state stored in state_dtype, where one rounding that lands the other way
// (the host rounds from double, a GPU from float) moves an fp32 output by
// more than 1e-5: its bound is the looser of the two, as for the golden
// multi-token cases (docs/golden-format.md).
double multi_token_output_tol(const Variant& v) { return std::max(output_tol(v.out), state_tol(v.sd)); }

// `got` (from backend()) against `host` (the same call on the host backend).
void expect_close_to_host(const Problem& pr, const Outcome& got, const Outcome& host) {
  const Variant& v = pr.var;
  const std::vector<uint8_t> o_canary(host.o.size(), kCanary);
  EXPECT_TRUE(close_to_host("o", got.o, host.o, o_canary, v.out, pr.o_row(), multi_token_output_tol(v)));
  EXPECT_TRUE(close_to_host("pool", got.pool, host.pool, pr.pool, v.sd, pr.slot_elems(), state_tol(v.sd)));
  if (!host.inter.empty()) {
    const std::vector<uint8_t> canary(host.inter.size(), kCanary);
    EXPECT_TRUE(close_to_host("intermediate states", got.inter, host.inter, canary, v.sd, pr.slot_elems(),
                              state_tol(v.sd)));
  }
  // the conv windows are data movement: exact (docs/operation.md, Numerics)
  EXPECT_TRUE(bitwise(got.conv, host.conv, "conv pool", gdn::dtype_size(v.io)));
  EXPECT_TRUE(bitwise(got.inter_conv, host.inter_conv, "intermediate conv states", gdn::dtype_size(v.io)));
  EXPECT_EQ(got.counter, host.counter) << "invalid_index_count";
}

// ---- the fixed index patterns ---------------------------------------------------

// B = 3 rows of T = 4 tokens in 16 slots, shuffled (12 token slots, 4 that
// no token writes); row 0's last token writes no slot. The initial state
// from slot [b, n - 1] of the accepted tokens n = 1, 3, 4 (vLLM), or, in
// the second pattern, from three of the other slots through state_indices;
// the third adds final write slots: row 0 its own read slot, row 1 none,
// row 2 the last free slot.
std::vector<TokenSlots> token_slot_patterns() {
  std::vector<int32_t> perm(16);
  for (int32_t s = 0; s < 16; ++s) perm[size_t(s)] = s;
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(5));
  TokenSlots ts;
  ts.tsi.assign(perm.begin(), perm.begin() + 12);
  ts.tsi[3] = -1;
  TokenSlots by_accepted = ts, by_index = ts;
  by_accepted.accepted = {1, 3, 4};
  by_index.in = {perm[12], perm[13], perm[14]};
  TokenSlots split = by_index;
  split.out = {perm[12], -1, perm[15]};
  return {by_accepted, by_index, split};
}

// Rows of 2, 0, 3, 1 and 1 packed tokens and one whose range runs backwards
// (cu[6] < cu[5]), T = 3: row 3 is padding, row 4 reads slot 9 of a 5-slot
// pool (counted, padding), row 5 is counted and touches nothing (slot 3).
const Packed kPacked{3, {0, 2, 2, 5, 6, 7, 6}, {4, 1, 0, -1, 9, 3}};
constexpr int64_t kPackedTokens = 7, kPackedSlots = 5;

// ---- the tests ------------------------------------------------------------------

// Final state in place: one call of T tokens == T one-token calls, bitwise.
TEST_P(MultiTokenTest, OneCallEqualsTOneTokenCalls) {
  for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
    const Variant& var = kVariants[vi];
    for (int64_t T : {2, 4, 8}) {
      SCOPED_TRACE(describe(var) + ", T=" + std::to_string(T));
      const Problem pr = make_problem(var, 3, T, 3, 100 + uint64_t(T) + 1000 * vi);
      Outcome one;
      ASSERT_TRUE(run_final(backend(), pr, &one));
      const OnBackend seq(pr, backend());
      for (int64_t t = 0; t < T; ++t) ASSERT_TRUE(ran(backend(), seq.token_call(t))) << "token " << t;
      const Outcome chained = seq.outcome();
      EXPECT_TRUE(every_token_written(one.o, var.out));
      EXPECT_TRUE(bitwise(one.o, chained.o, "o", gdn::dtype_size(var.out)));
      EXPECT_TRUE(bitwise(one.pool, chained.pool, "pool", gdn::dtype_size(var.sd)));
      EXPECT_TRUE(bitwise(one.conv, chained.conv, "conv pool", gdn::dtype_size(var.io)));
    }
  }
}

// Per-token slots: token t of row b reads the previous token's slot (token 0
// the initial slot) and writes slot [b, t], as one-token calls with a read
// and a write index; a slot no token writes stays as it was. A final write
// slot holds what a second chain, whose last call writes there, leaves in it.
TEST_P(MultiTokenTest, PerTokenSlots) {
  const int64_t B = 3, T = 4, slots = 16;
  const std::vector<TokenSlots> patterns = token_slot_patterns();
  for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
    const Variant& var = kVariants[vi];
    for (const TokenSlots& ts : patterns) {
      SCOPED_TRACE(describe(var) + (ts.in.empty() ? ", initial slot from num_accepted_tokens"
                                                   : ", initial slot from state_indices") +
                   (ts.out.empty() ? "" : ", final write slots"));
      const Problem pr = make_problem(var, B, T, slots, 7 + 1000 * vi);
      Outcome one;
      ASSERT_TRUE(run_token_slots(backend(), pr, ts, &one));
      // T one-token calls; the last one writes final[b] when given, else token slot [b, T - 1]
      auto chain = [&](const OnBackend& seq, const std::vector<int32_t>* final) -> ::testing::AssertionResult {
        std::vector<int32_t> in(B), out(B);
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t b = 0; b < B; ++b) {
            // initial slot: state_indices[b], else token slot [b, n - 1]
            const int32_t first =
                ts.in.empty() ? ts.tsi[size_t(b * T + ts.accepted[size_t(b)] - 1)] : ts.in[size_t(b)];
            in[size_t(b)] = t == 0 ? first : ts.tsi[size_t(b * T + t - 1)];
            out[size_t(b)] = final && t == T - 1 ? (*final)[size_t(b)] : ts.tsi[size_t(b * T + t)];
          }
          const DeviceBuffer din = indices(backend(), in), dout = indices(backend(), out);
          gdn::DecodeParams s = seq.token_call(t);
          s.index_dtype = IndexType::kI32;
          s.state_indices = din.get();
          s.state_out_indices = dout.get();
          ::testing::AssertionResult r = ran(backend(), s);
          if (!r) return r << " (token " << t << ")";
        }
        return ::testing::AssertionSuccess();
      };
      const OnBackend seq(pr, backend());
      ASSERT_TRUE(chain(seq, nullptr));
      Outcome chained = seq.outcome();
      if (!ts.out.empty()) {
        const OnBackend to_final(pr, backend());
        ASSERT_TRUE(chain(to_final, &ts.out));
        const Outcome fin = to_final.outcome();
        const size_t sb = size_t(pr.slot_elems()) * gdn::dtype_size(var.sd);
        const size_t cb = size_t(pr.conv_span()) * gdn::dtype_size(var.io);
        for (const int32_t s : ts.out) {
          if (s < 0) continue;
          std::memcpy(chained.pool.data() + size_t(s) * sb, fin.pool.data() + size_t(s) * sb, sb);
          if (var.W > 0) std::memcpy(chained.conv.data() + size_t(s) * cb, fin.conv.data() + size_t(s) * cb, cb);
        }
      }
      EXPECT_TRUE(every_token_written(one.o, var.out));
      EXPECT_TRUE(bitwise(one.o, chained.o, "o", gdn::dtype_size(var.out)));
      EXPECT_TRUE(bitwise(one.pool, chained.pool, "pool", gdn::dtype_size(var.sd)));
      EXPECT_TRUE(bitwise(one.conv, chained.conv, "conv pool", gdn::dtype_size(var.io)));
      EXPECT_EQ(one.counter, 0u);
    }
  }
}

// Every token's state and conv state into dense (B, T) buffers: entry [b, t]
// equals slot b after t + 1 one-token calls, bitwise. With update_state =
// false both pools stay as they were, bitwise; with true they end as the
// one-token calls leave them.
TEST_P(MultiTokenTest, IntermediateStatesWithAndWithoutPoolUpdate) {
  const int64_t B = 3, T = 3;
  for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
    const Variant& var = kVariants[vi];
    for (bool update : {false, true}) {
      SCOPED_TRACE(describe(var) + (update ? ", update_state" : ", update_state = false"));
      const Problem pr = make_problem(var, B, T, B, 9 + 1000 * vi);
      Outcome one;
      ASSERT_TRUE(run_intermediates(backend(), pr, update, &one));
      const size_t slot_bytes = size_t(pr.slot_elems()) * gdn::dtype_size(var.sd);
      const size_t conv_bytes = size_t(std::max<int64_t>(pr.conv_span(), 0)) * gdn::dtype_size(var.io);
      const OnBackend seq(pr, backend());
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_TRUE(ran(backend(), seq.token_call(t))) << "token " << t;
        const std::vector<uint8_t> pool = seq.pool.download(), conv = seq.conv_pool();
        for (int64_t b = 0; b < B; ++b) {
          const size_t entry = size_t(b * T + t);
          EXPECT_EQ(0, std::memcmp(one.inter.data() + entry * slot_bytes, pool.data() + size_t(b) * slot_bytes,
                                   slot_bytes))
              << "intermediate state of row " << b << " after token " << t;
          if (var.W > 0) {
            EXPECT_EQ(0, std::memcmp(one.inter_conv.data() + entry * conv_bytes,
                                     conv.data() + size_t(b) * conv_bytes, conv_bytes))
                << "intermediate conv state of row " << b << " after token " << t;
          }
        }
      }
      const Outcome chained = seq.outcome();
      EXPECT_TRUE(every_token_written(one.o, var.out));
      EXPECT_TRUE(bitwise(one.o, chained.o, "o", gdn::dtype_size(var.out)));
      if (update) {
        EXPECT_TRUE(bitwise(one.pool, chained.pool, "pool", gdn::dtype_size(var.sd)));
        EXPECT_TRUE(bitwise(one.conv, chained.conv, "conv pool", gdn::dtype_size(var.io)));
      } else {
        EXPECT_TRUE(bitwise(one.pool, pr.pool, "pool (update_state = false)", gdn::dtype_size(var.sd)));
        EXPECT_TRUE(bitwise(one.conv, pr.conv, "conv pool (update_state = false)", gdn::dtype_size(var.io)));
      }
    }
  }
}

// Packed rows (cu_seqlens) with a padding row, an out-of-range slot and a
// malformed range: each valid row equals its own one-token calls; the
// padding and out-of-range rows' outputs are zero; the bad slot and the bad
// range are counted and nothing of them written; a row of no tokens leaves
// its slot alone.
TEST_P(MultiTokenTest, VariableLengthRowsPaddingAndBadSlots) {
  for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
    const Variant& var = kVariants[vi];
    SCOPED_TRACE(describe(var));
    const Problem pr = make_problem(var, 1, kPackedTokens, kPackedSlots, 11 + 1000 * vi);
    Outcome one;
    ASSERT_TRUE(run_packed(backend(), pr, kPacked, &one));
    EXPECT_EQ(one.counter, 2u) << "slot 9 of a 5-slot pool, and row 5's range [7, 6)";
    // token j of row b is packed token cu[b] + j; one-token calls, one row at a time
    const OnBackend ref(pr, backend());
    for (size_t b : {0, 2}) {
      const DeviceBuffer slot = indices(backend(), {kPacked.slots[b]});
      for (int32_t tok = kPacked.cu[b]; tok < kPacked.cu[b + 1]; ++tok) {
        gdn::DecodeParams s = ref.token_call(tok);
        s.batch = 1;
        s.index_dtype = IndexType::kI32;
        s.state_indices = slot.get();
        ASSERT_TRUE(ran(backend(), s)) << "row " << b << ", token " << tok;
      }
    }
    const Outcome chained = ref.outcome();
    const size_t row_bytes = size_t(pr.o_row()) * gdn::dtype_size(var.out);
    for (int64_t t = 0; t < kPackedTokens; ++t) {
      const uint8_t* got = one.o.data() + size_t(t) * row_bytes;
      if (t == 5 || t == 6) {  // the padding row's token and the bad slot's
        for (int64_t j = 0; j < pr.o_row(); ++j)
          ASSERT_EQ(gdn::load_element(got, var.out, j), 0.0) << "token " << t << ", element " << j;
      } else {
        EXPECT_EQ(0, std::memcmp(got, chained.o.data() + size_t(t) * row_bytes, row_bytes)) << "token " << t;
      }
    }
    EXPECT_TRUE(bitwise(one.pool, chained.pool, "pool", gdn::dtype_size(var.sd)));
    EXPECT_TRUE(bitwise(one.conv, chained.conv, "conv pool", gdn::dtype_size(var.io)));
  }
}

// Every caller error: refused with kInvalidArgument, naming the argument,
// nothing written (o, the pool, the counter).
TEST_P(MultiTokenTest, Refusals) {
  const Variant var = kVariants[0];
  const Problem pr = make_problem(var, 2, 2, 4, 13);
  const OnBackend d(pr, backend());
  const std::vector<uint8_t> o0 = d.o.download();
  const DeviceBuffer tsi = indices(backend(), {0, 1, 2, 3}), idx = indices(backend(), {0, 1}),
                     accepted = indices(backend(), {1, 1}), dup = indices(backend(), {0, 1, 1, 2}),
                     cu = indices(backend(), {0, 1, 2}), own = indices(backend(), {0, 2}),
                     final = indices(backend(), {3, -1});
  const DeviceBuffer inter(backend(), size_t(4 * pr.slot_elems()) * gdn::dtype_size(var.sd));
  const int64_t slot = pr.slot_elems();
  struct Case {
    const char* what;
    std::function<void(gdn::DecodeParams&)> mutate;
    const char* needle;
    // The slot rule is checked where the indices can be read before the
    // call runs: on the host. A GPU backend takes it as the caller's
    // guarantee (docs/operation.md, "Slots, padding and bad indices").
    bool host_only;
  };
  const std::vector<Case> cases = {
      {"T = 0", [](gdn::DecodeParams& p) { p.num_tokens = 0; }, "num_tokens", false},
      {"T over the limit", [](gdn::DecodeParams& p) { p.num_tokens = gdn::kMaxTokens + 1; }, "num_tokens", false},
      {"per-channel beta with raw gates", [&](gdn::DecodeParams& p) { p.b_head_stride = var.Dv; }, "b_head_stride",
       false},
      {"negative b_head_stride",
       [](gdn::DecodeParams& p) {
         p.gate = gdn::Gate::kPrecomputed;
         p.b_head_stride = -1;
       },
       "b_head_stride", false},
      {"per-channel beta heads closer than Dv",
       [&](gdn::DecodeParams& p) {
         p.gate = gdn::Gate::kPrecomputed;
         p.b_head_stride = var.Dv - 1;
         p.b_token_stride = int64_t(var.Hv) * var.Dv;
         p.b_batch_stride = 2 * p.b_token_stride;
       },
       "b: head stride", false},
      {"total_tokens without cu_seqlens", [](gdn::DecodeParams& p) { p.total_tokens = 2; }, "total_tokens", false},
      {"total_tokens over B*T",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.cu_seqlens = cu.get();
         p.total_tokens = 5;
       },
       "total_tokens", false},
      {"token slots with update_state = false",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.token_state_indices = tsi.get();
         p.token_state_indices_stride = 2;
         p.update_state = false;
       },
       "update_state", false},
      {"accepted tokens without token slots",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.num_accepted_tokens = accepted.get();
       },
       "num_accepted_tokens", false},
      {"accepted tokens with state_indices",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.state_indices = idx.get();
         p.token_state_indices = tsi.get();
         p.token_state_indices_stride = 2;
         p.num_accepted_tokens = accepted.get();
       },
       "num_accepted_tokens", false},
      {"token slot rows overlap",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.token_state_indices = tsi.get();
         p.token_state_indices_stride = 1;
       },
       "token_state_indices", false},
      {"intermediate buffer rows overlap",
       [&](gdn::DecodeParams& p) {
         p.intermediate_states = inter.get();
         p.intermediate_token_stride = slot;
         p.intermediate_batch_stride = 16;
       },
       "intermediate_states", false},
      {"intermediate buffer on the pool",
       [&](gdn::DecodeParams& p) {
         p.intermediate_states = d.pool.get();
         p.intermediate_token_stride = slot;
         p.intermediate_batch_stride = 2 * slot;
       },
       "intermediate_states", false},
      {"intermediate conv states without the conv",
       [&](gdn::DecodeParams& p) {
         p.intermediate_conv_states = inter.get();
         p.intermediate_conv_token_stride = 64;
         p.intermediate_conv_batch_stride = 128;
       },
       "intermediate_conv_states", false},
      {"two rows write one token slot",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.token_state_indices = dup.get();
         p.token_state_indices_stride = 2;
       },
       "token_state_indices", true},
      {"a final write slot another row's token writes",
       [&](gdn::DecodeParams& p) {
         p.index_dtype = IndexType::kI32;
         p.state_indices = own.get();
         p.state_out_indices = final.get();
         p.token_state_indices = tsi.get();
         p.token_state_indices_stride = 2;
       },
       "both write slot 3", true},
  };
  for (const Case& c : cases) {
    if (c.host_only && backend() != gdn::Backend::kHost) continue;
    SCOPED_TRACE(c.what);
    gdn::DecodeParams p = d.params();
    c.mutate(p);
    const gdn::Status st = gdn::decode(p, backend());
    // kInvalidArgument, not a backend's kUnsupported naming a multi-token member
    EXPECT_EQ(st.code, gdn::StatusCode::kInvalidArgument) << gdn::to_string(st.code) << ": " << st.message;
    EXPECT_TRUE(contains(st.message, c.needle)) << st.message;
    sync();
    const Outcome after = d.outcome();
    EXPECT_TRUE(bitwise(after.pool, pr.pool, "pool", gdn::dtype_size(var.sd)));
    EXPECT_TRUE(bitwise(after.o, o0, "o", gdn::dtype_size(var.out)));
    EXPECT_EQ(after.counter, 0u);
  }
}

// Every mode on the backend under test against the same call on the host
// reference: outputs, pools and intermediate states within the bounds of the
// other shared suites, conv windows and the counter exact. On the host this
// would compare the host with itself.
// Per-channel beta (precomputed gates, b [B, T, Hv, Dv]): each column of the
// delta rule evolves on its own, so a call with beta1 on even columns and
// beta2 on odd ones leaves in column j, bitwise, what a call with beta1 (j
// even) or beta2 (j odd) on every column leaves there: o (the norm off; it
// mixes the columns) and every state element of the column. And every column
// at one head's beta equals the one-beta-a-head call, bitwise (T > 1: the
// same kernels). T = 1 (vLLM's and FLA's decode call) and 4; slot b for row b.
TEST_P(MultiTokenTest, PerChannelBetaIsEachColumnsOwn) {
  for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
    const Variant& var = kVariants[vi];
    for (int64_t T : {1, 4}) {
      SCOPED_TRACE(describe(var) + ", T=" + std::to_string(T));
      const int64_t B = 3, heads = B * T * var.Hv, Dv = var.Dv;
      const Problem pr = make_problem(var, B, T, B, 300 + uint64_t(T) + 1000 * vi);
      // g (log space) in [-1.5, -0.01], beta in [0.05, 0.95], in the inputs' dtype
      std::mt19937_64 rng(77 + vi);
      std::uniform_real_distribution<double> u01(0.0, 1.0);
      const size_t e = gdn::dtype_size(var.io);
      std::vector<uint8_t> g(size_t(heads) * e), beta[2], spread[2], mixed_beta(size_t(heads * Dv) * e);
      for (int c : {0, 1}) {
        beta[c].resize(size_t(heads) * e);
        spread[c].resize(size_t(heads * Dv) * e);
      }
      for (int64_t i = 0; i < heads; ++i) {
        gdn::store_element(g.data(), var.io, i, -0.01 - 1.49 * u01(rng));
        for (int c : {0, 1}) gdn::store_element(beta[c].data(), var.io, i, 0.05 + 0.9 * u01(rng));
        for (int64_t j = 0; j < Dv; ++j) {
          for (int c : {0, 1})
            gdn::store_element(spread[c].data(), var.io, i * Dv + j, gdn::load_element(beta[c].data(), var.io, i));
          gdn::store_element(mixed_beta.data(), var.io, i * Dv + j, gdn::load_element(beta[j % 2].data(), var.io, i));
        }
      }
      auto run = [&](const std::vector<uint8_t>& b, bool per_channel, Outcome* out) {
        const OnBackend d(pr, backend());
        const DeviceBuffer gd(backend(), g), bd(backend(), b);
        gdn::DecodeParams p = d.params();
        p.gate = gdn::Gate::kPrecomputed;
        p.a = gd.get();
        p.b = bd.get();
        if (per_channel) {
          p.b_head_stride = Dv;
          p.b_token_stride = int64_t(var.Hv) * Dv;
          p.b_batch_stride = T * p.b_token_stride;
        }
        ::testing::AssertionResult r = ran(backend(), p);
        if (r) *out = d.outcome();
        return r;
      };
      Outcome mixed, one[2];
      ASSERT_TRUE(run(mixed_beta, true, &mixed));
      for (int c : {0, 1}) ASSERT_TRUE(run(spread[c], true, &one[c]));
      EXPECT_NE(one[0].pool, one[1].pool) << "the two betas must move the state differently";
      // column j of o and of every state matrix against the call of its beta
      const size_t oe = gdn::dtype_size(var.out), se = gdn::dtype_size(var.sd);
      auto same = [](const std::vector<uint8_t>& x, const std::vector<uint8_t>& y, size_t at, size_t n) {
        return std::memcmp(x.data() + at * n, y.data() + at * n, n) == 0;
      };
      int64_t o_bad = 0, s_bad = 0;
      if (!var.norm)
        for (int64_t r = 0; r < heads; ++r)
          for (int64_t j = 0; j < Dv; ++j) o_bad += !same(mixed.o, one[j % 2].o, size_t(r * Dv + j), oe);
      for (int64_t m = 0; m < B * var.Hv; ++m)
        for (int64_t i = 0; i < var.Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) {
            const int64_t at = var.layout == Layout::kKV ? (m * var.Dk + i) * Dv + j : (m * Dv + j) * var.Dk + i;
            s_bad += !same(mixed.pool, one[j % 2].pool, size_t(at), se);
          }
      EXPECT_EQ(o_bad, 0) << "output elements unlike their column's one-beta call";
      EXPECT_EQ(s_bad, 0) << "state elements unlike their column's one-beta call";
      EXPECT_TRUE(bitwise(mixed.conv, one[0].conv, "conv pool", e));
      if (T > 1) {
        Outcome head;
        ASSERT_TRUE(run(beta[0], false, &head));
        EXPECT_TRUE(bitwise(one[0].o, head.o, "o, every column at the head's beta", oe));
        EXPECT_TRUE(bitwise(one[0].pool, head.pool, "pool, every column at the head's beta", se));
      }
    }
  }
}

TEST_P(MultiTokenTest, MatchesHostBackend) {
  if (backend() == gdn::Backend::kHost) GTEST_SKIP() << "the host backend is the reference";
  const gdn::Backend host = gdn::Backend::kHost;
  const TokenSlots ts = token_slot_patterns()[0];
  for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
    const Variant& var = kVariants[vi];
    SCOPED_TRACE(describe(var));
    Outcome got, want;
    {
      SCOPED_TRACE("final state in place, T=8");
      const Problem pr = make_problem(var, 3, 8, 3, 108 + 1000 * vi);
      ASSERT_TRUE(run_final(backend(), pr, &got));
      ASSERT_TRUE(run_final(host, pr, &want));
      expect_close_to_host(pr, got, want);
    }
    {
      SCOPED_TRACE("per-token slots, T=4");
      const Problem pr = make_problem(var, 3, 4, 16, 7 + 1000 * vi);
      ASSERT_TRUE(run_token_slots(backend(), pr, ts, &got));
      ASSERT_TRUE(run_token_slots(host, pr, ts, &want));
      expect_close_to_host(pr, got, want);
    }
    {
      SCOPED_TRACE("per-token slots and final write slots, T=4");
      const Problem pr = make_problem(var, 3, 4, 16, 13 + 1000 * vi);
      ASSERT_TRUE(run_token_slots(backend(), pr, token_slot_patterns()[2], &got));
      ASSERT_TRUE(run_token_slots(host, pr, token_slot_patterns()[2], &want));
      expect_close_to_host(pr, got, want);
    }
    {
      SCOPED_TRACE("intermediate states, update_state = false, T=3");
      const Problem pr = make_problem(var, 3, 3, 3, 9 + 1000 * vi);
      ASSERT_TRUE(run_intermediates(backend(), pr, false, &got));
      ASSERT_TRUE(run_intermediates(host, pr, false, &want));
      expect_close_to_host(pr, got, want);
    }
    {
      SCOPED_TRACE("packed rows, T=3");
      const Problem pr = make_problem(var, 1, kPackedTokens, kPackedSlots, 11 + 1000 * vi);
      ASSERT_TRUE(run_packed(backend(), pr, kPacked, &got));
      ASSERT_TRUE(run_packed(host, pr, kPacked, &want));
      expect_close_to_host(pr, got, want);
    }
  }
}

}  // namespace
}  // namespace gdn_test
