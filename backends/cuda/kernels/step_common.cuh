// What every kernel of the step shares: a row's slots, the gates, the l2
// normalization of q and k, and the one-pass column update.
#pragma once

#include "../common/fastdiv.cuh"
#include "../common/memory.cuh"
#include "../common/sm90.cuh"
#include "../common/warp.cuh"
#include "../params.cuh"
#include "../traits.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// Per-block prologue shared by both layouts: slots, padding, counting.
struct RowSlots {
  int64_t s_in, s_out;
  bool write;
  unsigned bad;  // the row's out-of-range indices (0 without indices)
};

template <typename Params>
__device__ __forceinline__ RowSlots row_slots(const Params& p, int64_t b) {
  RowSlots r{b, b, true, 0u};
  if (p.index_dtype != IndexType::kNone) {
    r.s_in = load_index(p.state_indices, p.index_dtype, b);
    r.s_out = p.state_out_indices ? load_index(p.state_out_indices, p.index_dtype, b) : r.s_in;
    r.bad = unsigned(r.s_in >= p.num_slots) + unsigned(p.state_out_indices != nullptr && r.s_out >= p.num_slots);
  }
  r.write = r.s_out >= 0 && r.s_out < p.num_slots;
  return r;
}
// Each out-of-range index of a row counted once: by thread 0 of the row's first
// block (fused: of its group's first k-head). The step kernels call it once
// their loads are out, so the counter's address (past KernelParams' first
// part) is not fetched ahead of them; the fused kernels at once.
template <typename Params>
__device__ __forceinline__ void count_bad_indices(const Params& p, const RowSlots& r, int h, int blk) {
  if (r.bad == 0 || h != 0 || blk != 0 || threadIdx.x != 0 || p.invalid_index_count == nullptr) return;
  atomicAdd(p.invalid_index_count, r.bad);
}

// Phase timestamps for bench_fused's `trace` mode (GDN_TRACE builds only):
// thread 0 of each block stores clock64 at mark k in trace[block * 32 + k], the
// global timer at marks 0 and 8 in slots 14, 15 and its SM id + 1 in slot 22,
// in invalid_index_count's buffer (a dense call uses none).
#if defined(GDN_TRACE)
template <typename Params>
__device__ __forceinline__ void trace_mark(const Params& p, int k) {
  if (threadIdx.x != 0 || p.invalid_index_count == nullptr || p.index_dtype != IndexType::kNone) return;
  unsigned long long* t = reinterpret_cast<unsigned long long*>(p.invalid_index_count) + size_t(blockIdx.x) * 32;
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  t[k] = c;
  if (k == 0 || k == 8) {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g)::"memory");
    t[k == 0 ? 14 : 15] = g;
  }
  if (k == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    t[22] = sm + 1;
  }
}
#define GDN_MARK(k) trace_mark(p, k)
#else
#define GDN_MARK(k) ((void)0)
#endif

// 1 / norm from a sum of squares, per the l2norm convention.
__device__ __forceinline__ float inv_norm(float ss, L2Norm mode, float eps) {
  if (mode == L2Norm::kNone) return 1.0f;
  // rsqrt mode: 1 / sqrt(sum x^2 + eps); max-norm mode: 1 / max(||x||, eps)
  return mode == L2Norm::kRsqrt ? rsqrtf(ss + eps) : 1.0f / fmaxf(sqrtf(ss), eps);
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The gates of row b, v-head h, both kernels: decay = exp(g) and beta.
struct Gates {
  float decay, beta;
};
// The loads behind the gates (a, b and the head's parameters), apart from the
// arithmetic so a caller can issue them with its other loads (raw: RawRun).
template <typename IO>
struct GateInputs {
  IoRun<IO, 1> a, b;
  float A_log{0.0f}, dt_bias{0.0f};
};
template <typename IO, typename Params>
__device__ __forceinline__ GateInputs<IO> load_gate_inputs(const Params& p, int64_t b, int h) {
  GateInputs<IO> in;
  in.a.load(p.ab_dtype, p.a, b * p.a_batch_stride + h);
  in.b.load(p.ab_dtype, p.b, b * p.b_batch_stride + h);
  if (p.gate == Gate::kRaw) {
    in.A_log = p.A_log[h];
    in.dt_bias = p.dt_bias[h];
  }
  return in;
}
// The gates from a, b (and, raw, the head's A_log and dt_bias) as floats.
template <typename Params>
__device__ __forceinline__ Gates gates_of(const Params& p, float a, float braw, float A_log, float dt_bias) {
  float g, beta;
  if (p.gate == Gate::kRaw) {
    // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
    g = -expf(A_log) * softplus(a + dt_bias);
    beta = 1.0f / (1.0f + expf(-braw));
  } else {
    g = a;
    beta = braw;
  }
  return Gates{expf(g), beta};
}
template <typename IO, typename Params>
__device__ __forceinline__ Gates finish_gates(const Params& p, const GateInputs<IO>& in) {
  return gates_of(p, in.a.value(), in.b.value(), in.A_log, in.dt_bias);
}

// l2norm of q and k, whose Dk rows the kSpan lanes (stride kLow) hold between
// them, kN rows a lane: the sums of squares and q.k through one butterfly.
// Returns k_hat . q_hat, which the one-pass output needs.
template <int kLow, int kSpan, int kN, typename Params>
__device__ __forceinline__ float l2_normalize(const Params& p, int lane, float (&qh)[kN], float (&kh)[kN]) {
  static_assert(kSpan >= 4, "the three sums need a span of 4 lanes");
  float qq = 0.0f, kk = 0.0f, qk = 0.0f;
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    qq += qh[r] * qh[r];
    kk += kh[r] * kh[r];
    qk += qh[r] * kh[r];
  }
  float ss[4] = {qq, kk, qk, 0.0f};
  all_gather<kLow, kSpan, 4>(reduce_scatter<kLow, kSpan, 4>(ss, lane), lane, ss);
  const float inv_q = inv_norm(ss[0], p.l2norm, p.l2norm_eps);
  const float inv_k = inv_norm(ss[1], p.l2norm, p.l2norm_eps);
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    qh[r] *= inv_q;
    kh[r] *= inv_k;
  }
  // k_hat . q_hat = (k . q) / (|k| |q|)
  return ss[2] * inv_q * inv_k;
}

// The update and output of kC columns from the *old* state, the one-pass form
// of docs/operation.md ("The math"; docs/decisions.md#one-pass): with
// sk = S^T k_hat and sq = S^T q_hat of a column,
//   delta = beta (v - exp(g) sk)
//   o     = scale (exp(g) sq + (k_hat . q_hat) delta)
// which is scale S'^T q_hat for S' = exp(g) S + k_hat delta^T; both sums go
// through one butterfly. After it (value 2c = sk, 2c + 1 = sq of column c) lane
// l holds column col(l) = (l / (2 kStride)) % kC, its partner (lane ^ kStride)
// the other sum: both form delta, which every lane gathers. run() returns
// column col(l)'s output; writer(): one lane a column.
template <int kLow, int kSpan, int kC>
struct OnePass {
  static_assert(2 * kC <= kSpan, "one-pass: two sums per column over the span");
  static constexpr int kStride = kLow * kSpan / (2 * kC);
  static __device__ __forceinline__ int col(int lane) { return (lane / (2 * kStride)) % kC; }
  static __device__ __forceinline__ bool writer(int lane) { return (lane / kLow) % (kSpan / kC) == 0; }
  // partial(v): this lane's partial sum of value v (2c: S^T k_hat of held column
  // c, 2c + 1: S^T q_hat; v a constant once unrolled); v_col: v of column
  // col(lane). The butterfly's first step is taken as the sums are formed, a pair
  // at a time: at most kC + 2 of the 2 kC sums live (all of them spilled).
  template <typename Partial>
  static __device__ __forceinline__ float run(Partial&& partial, float v_col, float decay, float beta, float kq,
                                              float scale, int lane, float (&delta)[kC]) {
    // reduce_scatter<kLow, kSpan, 2 kC>, its first step fused with the sums
    constexpr int kOff = kLow * kSpan / 2;
    const bool upper = (lane & kOff) != 0;
    float x[kC];
#pragma unroll
    for (int k = 0; k < kC; ++k) {
      const float lo = partial(k), hi = partial(k + kC);
      x[k] = (upper ? hi : lo) + warp_shfl_xor(upper ? lo : hi, kOff);
    }
    reduce_halves<kC, kOff / 2>(x, lane);
#pragma unroll
    for (int off = kLow * kSpan / (4 * kC); off >= kLow; off /= 2) x[0] += warp_shfl_xor(x[0], off);
    const float mine = x[0];
    const float other = warp_shfl_xor(mine, kStride);
    const bool holds_q = (lane & kStride) != 0;
    const float sk = holds_q ? other : mine, sq = holds_q ? mine : other;
    // delta = beta (v - exp(g) sk)
    const float d = beta * (v_col - decay * sk);
    const int base = lane & ~((2 * kC - 1) * kStride);
#pragma unroll
    for (int c = 0; c < kC; ++c) delta[c] = warp_shfl(d, base | (2 * c * kStride));
    // o = scale (exp(g) sq + (k_hat . q_hat) delta)
    return scale * (decay * sq + kq * d);
  }
};

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
