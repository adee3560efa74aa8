// Kernel bodies of decode_kernel.cuh; included by one .cu per state dtype so
// the instantiations compile in parallel.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "decode_kernel.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// Sums over the `kSpan` lanes that differ only in bits [kLow, kLow * kSpan)
// run as fixed butterflies (warp_shfl_xor, decode_kernel.cuh), so the order
// never depends on the launch.
// The same butterfly for kC values at once, with fewer shuffles: at each of
// the first log2(kC) steps a lane keeps half of its values and sends the other
// half, so the values sum in kC - 1 + log2(kSpan / kC) shuffles instead of
// kC * log2(kSpan). Each value still sums, at every step, its own partial plus
// the partner's over the same lanes in the same order as a one-value
// butterfly would, so the sums are bitwise that butterfly's. Lane l ends up
// with the sum of value
//   col(l) = (l / kStride) % kC,   kStride = kLow * kSpan / kC
// (the bits of the first log2(kC) offsets, highest first, name the value).
// One halving step of reduce_scatter (offset kOff, kN values left), then the
// next: a template recursion, so every index is a constant (a loop over
// both the count and the offset was not unrolled at kC = 16 and put the
// values in local memory).
// The halving step itself: the lane with the offset bit set keeps the upper
// half x[k + n/2], adds the partner's copy of it, and sends the lower half.
template <int kN, int kOff, int kC>
__device__ __forceinline__ void halve(float (&x)[kC], int lane) {
  const bool upper = (lane & kOff) != 0;
#pragma unroll
  for (int k = 0; k < kN / 2; ++k) {
    const float keep = upper ? x[k + kN / 2] : x[k];
    const float send = upper ? x[k] : x[k + kN / 2];
    x[k] = keep + warp_shfl_xor(send, kOff);
  }
}
template <int kN, int kOff, int kC>
__device__ __forceinline__ void reduce_halves(float (&x)[kC], int lane) {
  if constexpr (kN > 1) {
    halve<kN, kOff>(x, lane);
    reduce_halves<kN / 2, kOff / 2>(x, lane);
  }
}
template <int kLow, int kSpan, int kC>
__device__ __forceinline__ float reduce_scatter(const float (&v)[kC], int lane) {
  static_assert(kC >= 1 && (kC & (kC - 1)) == 0 && kC <= kSpan, "kC: a power of two up to kSpan");
  float x[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) x[c] = v[c];
  reduce_halves<kC, kLow * kSpan / 2>(x, lane);
#pragma unroll
  for (int off = kLow * kSpan / (2 * kC); off >= kLow; off /= 2) x[0] += warp_shfl_xor(x[0], off);
  return x[0];
}

// After reduce_scatter: every lane of the span gets all kC sums, v[c] from
// the lane of its span that holds value c (all lanes holding c have the same
// bits, the sum being commutative at each step).
template <int kLow, int kSpan, int kC>
__device__ __forceinline__ void all_gather(float x, int lane, float (&v)[kC]) {
  constexpr int kStride = kLow * kSpan / kC;
  const int base = lane & ~((kC - 1) * kStride);
#pragma unroll
  for (int c = 0; c < kC; ++c) v[c] = warp_shfl(x, base | (c * kStride));
}

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
// Each out-of-range index of a row counted once: by thread 0 of the row's
// first block (fused: of its group's first k-head). The step kernels call
// it once the block's loads are out (or on the padding path), so that the
// counter's address, past the fields they read before their loads
// (KernelParams), is not fetched ahead of them; the fused kernels at once.
template <typename Params>
__device__ __forceinline__ void count_bad_indices(const Params& p, const RowSlots& r, int h, int blk) {
  if (r.bad == 0 || h != 0 || blk != 0 || threadIdx.x != 0 || p.invalid_index_count == nullptr) return;
  atomicAdd(p.invalid_index_count, r.bad);
}

// Phase timestamps for bench_fused's `trace` mode, in builds with GDN_TRACE
// only (a diagnostic: compiled out otherwise). Thread 0 of each block stores
// clock64 at mark k in trace[block * 32 + k] and the global timer at marks 0
// and 8 in slots 14 and 15 (so marks 14 and 15 do not exist); the buffer
// travels in invalid_index_count, which a dense call (no indices) never uses.
// Mark 0 also stores the block's SM id + 1 in slot 22 (`trace pdl`).
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
// The loads behind the gates (a, b and the head's parameters), apart from
// the arithmetic so a caller can issue them with its other loads (raw: see
// RawRun).
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
template <typename IO, typename Params>
__device__ __forceinline__ Gates finish_gates(const Params& p, const GateInputs<IO>& in) {
  const float a = in.a.value(), braw = in.b.value();
  float g, beta;
  if (p.gate == Gate::kRaw) {
    // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
    g = -expf(in.A_log) * softplus(a + in.dt_bias);
    beta = 1.0f / (1.0f + expf(-braw));
  } else {
    g = a;
    beta = braw;
  }
  return Gates{expf(g), beta};
}

// l2norm of q and k, whose Dk rows the kSpan lanes (stride kLow) hold
// between them, kN rows a lane: the sums of squares and q.k through one
// butterfly, then every lane scales its rows. Returns k_hat . q_hat, which
// the one-pass output needs (below).
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

// The update and output of kC columns from the *old* state in one pass (SPEC
// §1 allows it): with sk = S^T k_hat and sq = S^T q_hat of a column,
//   delta = beta (v - exp(g) sk)
//   o     = scale (exp(g) sq + (k_hat . q_hat) delta)
// which is scale S'^T q_hat for S' = exp(g) S + k_hat delta^T. Both sums of
// every column go through one butterfly, so a column's output waits for one
// reduction after the state lands instead of two in a row (the second over
// S', after the update), and the state's stores no longer sit in front of it.
// After the butterfly (value 2c = sk, 2c + 1 = sq of column c) lane l holds
// column col(l) = (l / (2 kStride)) % kC, with its partner (lane ^ kStride)
// holding the other sum of that column: both compute the column's delta,
// and every lane gathers the delta of each held column. Returns the output of
// column col(l); lanes whose span bits below 2 kStride are zero write it (one
// writer a column), which are the writers of reduce_scatter over kC values.
template <int kLow, int kSpan, int kC>
struct OnePass {
  static_assert(2 * kC <= kSpan, "one-pass: two sums per column over the span");
  static constexpr int kStride = kLow * kSpan / (2 * kC);
  static __device__ __forceinline__ int col(int lane) { return (lane / (2 * kStride)) % kC; }
  static __device__ __forceinline__ bool writer(int lane) { return (lane / kLow) % (kSpan / kC) == 0; }
  // partial(v): this lane's partial sum of value v (2c: S^T k_hat of held
  // column c, 2c + 1: S^T q_hat), v a constant after unrolling; v_col: v of
  // column col(lane). The first halving step of the butterfly is taken as
  // the sums are formed, a pair at a time, so at most kC + 2 of the 2 kC
  // partial sums are live at once (all of them live at once, the fused bf16
  // kv kernel, 16 sums a lane, spilled).
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

// ---- the fused prologue and epilogue (conv1d update, gated RMSNorm) --------
// With either on (kFused), a group is row b and k-head hk with its G v-heads
// (h = hk * G + g interleaved, g * Hk + hk tiled): one block, or on sm_90 a
// cluster of `size` blocks. The group's outputs, numbered g * Dv + j ("group
// columns"), split into one contiguous range [lo, hi) per block. (The
// geometry, and why, is in decode_kernel.cuh's header.)

// v-head of group member g.
template <typename Params>
__device__ __forceinline__ int group_head(const Params& p, int hk, int g, int G) {
  return p.head_map == HeadMap::kInterleaved ? hk * G + g : g * p.num_k_heads + hk;
}

// A fused block's group, its rank in the cluster of `size` blocks that splits
// the group at small B (size 1 everywhere else), and the group columns
// [lo, hi) whose outputs it computes: from column j_lo of member g_lo on
// (lo = g_lo Dv + j_lo). by_size divides by size.
struct Group {
  int64_t b;
  int hk, G, rank, size, lo, hi, g_lo, j_lo;
  FastDiv by_size;
  bool vector_runs;  // FusedArgs::vector_runs
  // m mod size (the q/k conv channels' share of block rank: m mod size == rank)
  __device__ __forceinline__ int share(int m) const { return m - int(by_size.div(unsigned(m))) * size; }
  // the block's columns all in member g_lo (every cluster geometry of Qwen3.5)
  __device__ __forceinline__ bool one_head(int Dv) const { return j_lo + (hi - lo) <= Dv; }
};

// What the launch prepares for the fused kernels: divisors, so that a
// block's coordinates take no integer division (each one, on the chain
// before the first load, was ~25 instructions): the cluster size and the
// warps (vk) or tiles (kv) of a head; and vector_runs: the pointers and
// strides the prologue's runs load from are multiples of a run's vector
// word (prologue_pointers_aligned; the block's own offset is the kernel's
// part, prologue_runs_aligned).
struct FusedArgs {
  FastDiv cluster, per_head;
  bool vector_runs{false};
};
// Channels a thread's prologue run takes at most (fused_prologue_runs'
// kRun): 4 in the vk kernel, 2 in the kv kernel (64 registers).
template <Layout kLayout>
constexpr int prologue_run() {
  return kLayout == Layout::kKV ? 2 : 4;
}

// Shared memory of the fused stages, after the ring (floats, 16-byte aligned):
//   bar           (cluster, norm) the mbarrier the group's outputs land on
//   qk[2 * Dk]    conv'd q (0 .. Dk) and k (Dk .. 2 Dk) of the group's k-head
//   vo[G * Dv]    conv'd v of the block's own columns [lo, hi)
//   out[G * Dv]   (norm) the raw outputs of the whole group
//   z[G * Dv]     silu(z) of the block's own columns; w[Dv] norm_weight
//   decay[G], beta[G], rstd[G]
//   next[3 * 2 Dk] (cluster) the block's share of the shifted q/k windows,
//                 written back once every block has read the old ones
struct FusedSmem {
  unsigned long long* bar;
  float *qk, *vo, *out, *z, *w, *decay, *beta, *rstd, *next;
  __device__ FusedSmem(float* base, int G, int Dk, int Dv)
      : bar(reinterpret_cast<unsigned long long*>(base)), qk(base + 4), vo(qk + 2 * Dk), out(vo + G * Dv),
        z(out + G * Dv), w(z + G * Dv), decay(w + Dv), beta(decay + G), rstd(beta + G), next(rstd + G) {}
};
__host__ __device__ constexpr size_t fused_smem_bytes(int G, int Dk, int Dv, bool cluster) {
  return sizeof(float) * size_t(4 + 2 * Dk + 3 * G * Dv + Dv + 3 * G + (cluster ? 3 * 2 * Dk : 0));
}

// silu(x) = x * sigmoid(x) = x / (1 + exp(-x)), the division by the fast
// reciprocal (__fdividef, within 2 ulp; x = -inf gives NaN, as x / inf
// does). The IEEE division has a slow-path branch, which made each silu a
// region the compiler could not overlap with the next: a prologue thread's
// eight (four conv channels, four z) ran one after the other (bench_fused
// trace, fp32 vk B = 1: 1.17 us from the prologue's loads to the end of its
// arithmetic, 0.87 with every input in L2; 0.87 cold with this form). H200,
// 2026-12-01, fused middle at B = 1: bf16 vk 5.17 -> 4.98 us, bf16 kv 5.12
// -> 4.90, fp32 kv 5.35 -> 5.16, fp32 vk unchanged.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + expf(-x)); }

// Keeps the loads issued before it ahead of the ones after: the compiler
// otherwise freely reorders independent loads, and put the state's copies
// in front of the small loads that small_loads_first issues first (B = 1
// fp32 vk 3.46 -> 3.88 us when it did). __syncwarp orders the warp's memory
// accesses, so no load moves across it; every lane of the warp reaches it.
// (AMD: no asynchronous copies to queue behind, and no __syncwarp in the
// HIP headers Debian ships: nothing.)
__device__ __forceinline__ void issue_order_fence() {
#if !defined(GDN_AMD)
  __syncwarp();
#endif
}

// Programmatic dependent launch: wait here until the previous kernel on the
// stream has finished (its writes visible). A no-op when the launch was not
// programmatic, so it needs no flag.
__device__ __forceinline__ void wait_upstream() {
#if !defined(GDN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---- cluster synchronization (sm_90; reached only when size > 1, which the
// launch allows only with sm_90 code). No barrier of the fused path releases
// memory: a releasing arrive is a full fence that waits for every store the
// thread has in flight (the state's, to global memory: 7% of the fused
// kernel's samples at B = 1 when the norm's barrier released). Ordering of
// shared data between blocks goes through an mbarrier's transaction count.
#if !defined(GDN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GDN_CLUSTERS 1
#endif
// "My earlier reads are done" (their values are already in use, so no later
// write can reach them), and (with fence_barrier_init) "my mbarrier is ready".
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if GDN_CLUSTERS
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if GDN_CLUSTERS
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The outputs' mbarrier (one thread): one arrival expected; the fence makes
// the initialization visible to the cluster before the next cluster barrier
// completes.
__device__ __forceinline__ void outputs_barrier_init(unsigned long long* bar) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(a) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  (void)bar;
#endif
}
// Its one arrival (one thread), expecting `bytes` of st.async transactions.
// Peers' transactions may land before it: the count may go below zero
// meanwhile, and the phase cannot complete before this arrival.
__device__ __forceinline__ void outputs_expect(unsigned long long* bar, unsigned bytes) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(a), "r"(bytes)
      : "memory");
#else
  (void)bar;
  (void)bytes;
#endif
}
// value -> *slot in the shared memory of every block of the cluster
// (distributed shared memory), each store counted on that block's mbarrier.
__device__ __forceinline__ void push_to_cluster(float* slot, unsigned long long* bar, int size, float value) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(slot));
  const unsigned m = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  for (int r = 0; r < size; ++r) {
    unsigned ra, rm;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(r));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rm) : "r"(m), "r"(r));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(ra),
                 "r"(__float_as_uint(value)), "r"(rm)
                 : "memory");
  }
#else
  (void)bar;
  (void)size;
  *slot = value;
#endif
}
// Until every byte the mbarrier expects has landed (phase 0 complete).
__device__ __forceinline__ void outputs_wait(unsigned long long* bar) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a)
        : "memory");
  } while (!done);
#else
  (void)bar;
#endif
}

// Channel of the packed row behind group position i: q of hk (i < Dk), k of
// hk (i < 2 Dk), then v of each of the G heads (Dv each).
template <typename Params>
__device__ __forceinline__ int64_t group_channel(const Params& p, int hk, int G, int i) {
  const int Hk = p.num_k_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  if (i < 2 * Dk) return int64_t(i < Dk ? 0 : Hk - 1) * Dk + int64_t(hk) * Dk + i;
  const int g = (i - 2 * Dk) / Dv, j = i - 2 * Dk - g * Dv;
  return 2 * int64_t(Hk) * Dk + int64_t(group_head(p, hk, g, G)) * Dv + j;
}

// Before the prologue (thread 0 of a cluster block, norm on): the outputs'
// mbarrier is initialized. Its caller puts a warp-level sync between this
// and fused_arrive (the prologue's block barrier, or issue_order_fence in
// the norm-alone order), without which racecheck reports a race: see the
// kv kernel's kDirect.
template <typename Params>
__device__ __forceinline__ void fused_begin(const Params& p, const Group& grp, const FusedSmem& sm) {
  if (grp.size > 1 && p.norm_weight != nullptr && threadIdx.x == 0) outputs_barrier_init(sm.bar);
}
// After the prologue and the barrier that follows it (every thread): in a
// cluster, the mbarrier expects the whole group's G * Dv outputs (every block
// pushes its own to every block), and the block arrives at the cluster
// barrier that fused_mid waits on.
template <typename Params>
__device__ __forceinline__ void fused_arrive(const Params& p, const Group& grp, const FusedSmem& sm) {
  if (grp.size == 1) return;
  if (p.norm_weight != nullptr && threadIdx.x == 0)
    outputs_expect(sm.bar, unsigned(sizeof(float)) * unsigned(grp.G * p.head_dim_v));
  cluster_arrive_relaxed();  // old conv windows read, outputs' mbarrier ready
}

// What a block's group prologue covers, in the order of its list: own = its
// output columns, qk = the q and k conv channels (2 Dk with the conv on),
// conv = those and the own v channels, z = silu(z) of the own columns, w =
// norm_weight (Dv); all = the longest of the three lists.
struct PrologueSizes {
  int own, qk, conv, z, w, all;
  template <typename Params>
  __device__ __forceinline__ PrologueSizes(const Params& p, const Group& grp) {
    own = grp.hi - grp.lo;
    qk = p.conv_width > 0 ? 2 * p.head_dim_k : 0;
    conv = p.conv_width > 0 ? qk + own : 0;
    z = p.norm_weight != nullptr ? own : 0;
    w = p.norm_weight != nullptr ? p.head_dim_v : 0;
    all = max(conv, max(z, w));
  }
};

// N (2 or 4) consecutive elements of E stored at ptr as one vector word.
// ptr is aligned to it: the runs form stores the conv state's shifted
// windows, whose pool pointer and slot stride the launch checked
// (prologue_pointers_aligned), at offsets that are multiples of the run.
template <typename E, int N>
__device__ __forceinline__ void store_run(E* ptr, const E (&v)[N]) {
  using W = typename RawWord<N * int(sizeof(E))>::type;
  W w;
#pragma unroll
  for (int i = 0; i < N; ++i) reinterpret_cast<E*>(&w)[i] = v[i];
  *reinterpret_cast<W*>(ptr) = w;
}

// The group prologue by runs of kRun channels (fused_prologue's common
// case: conv state [slot, conv_dim, W-1], every segment of the block's
// channels a multiple of kRun long, one input dtype). Same results and
// writes as the channel-by-channel form below. A thread takes channels
// kRun s .. kRun s + kRun - 1 of the block's list (q, k, then the own v
// columns), whose windows, weights, x and bias are each one contiguous run:
// (W - 1) + W + 2 vector loads for kRun channels, plus one each for z and
// norm_weight, instead of 2 W + 1 scalar loads a channel, and the shifted
// windows go back as W - 1 vector stores. The G gates go to the block's
// last G threads, whose runs (if any) come last, so their arithmetic is off
// the conv's path. kW = 0: no conv (norm only).
// kRun: 2 in the kv kernel (64 registers); in the vk kernel (128
// registers) 2 where the block has a thread for every run, else 4 (a 16-bit
// vk block of 128 threads covers Qwen3.5's 272 channels in one round, where
// two channels a thread took a second round issued only after the first had
// landed; see fused_prologue). Measured on the H200 (bench_fused, 2026-11-30,
// against the channel-by-channel form in the same call), the fused middle
// at B = 1: bf16 vk 7.35 -> 5.78 us, fp32 vk 7.40 -> 6.70, fp32 kv 7.70 ->
// 6.78 and bf16 kv 7.18 -> 6.32 (kv with its state issued first, see
// start_fused_loads); B = 8 1-7% faster, B = 64 within 1.2%.
template <typename IO, int kW, int kRun, bool kPdl, typename Issue, typename Params>
__device__ __forceinline__ void fused_prologue_runs(const Params& p, const Group& grp, const RowSlots& slots,
                                                    const FusedSmem& sm, Issue&& issue_state) {
  constexpr int kTaps = kW > 0 ? kW - 1 : 1;  // old inputs a channel keeps
  GDN_MARK(20);
  const int Dk = p.head_dim_k, Dv = p.head_dim_v, G = grp.G;
  const int nthreads = int(blockDim.x), tid = int(threadIdx.x);
  const PrologueSizes ps(p, grp);
  // the conv's counts again from kW (= the conv width), known at compile time
  const int n_qk = kW > 0 ? ps.qk : 0, n_conv = kW > 0 ? ps.conv : 0, n_z = ps.z, n_w = ps.w;
  const int n_runs = max(n_conv, max(n_z, n_w)) / kRun;
  // The gates of the G heads: the block's last G threads, whose runs (if
  // any) come last, so their gate arithmetic is off the conv's path.
  const int gate_g = tid - (nthreads - G);
  bool issued = false;
  with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
    using E = decltype(tag);
    using Run = RawRun<E, kRun>;
    const E* x = static_cast<const E*>(p.x) + grp.b * p.x_batch_stride;
    // (unused where kW = 0: the norm-only prologue)
    [[maybe_unused]] const E* wt = static_cast<const E*>(p.conv_weight);
    [[maybe_unused]] const E* bias = static_cast<const E*>(p.conv_bias);
    E* cs = static_cast<E*>(p.conv_state);
    const E* cs_in = cs + slots.s_in * p.conv_state_slot_stride;
    E* cs_out = cs + slots.s_out * p.conv_state_slot_stride;
    const E* nwp = static_cast<const E*>(p.norm_weight);
    // the own columns lie in one head (the caller checked): v channel and z
    // element m of them are one base plus m
    const int g_lo = grp.g_lo, j_lo = grp.j_lo;
    const int h_lo = group_head(p, grp.hk, g_lo, G);
    const int64_t v_first = 2 * int64_t(p.num_k_heads) * Dk + int64_t(h_lo) * Dv + j_lo;
    const int64_t q_first = int64_t(grp.hk) * Dk, k_first = int64_t(p.num_k_heads + grp.hk) * Dk;
    auto channel = [&](int m) -> int64_t {
      if (m < n_qk) return m < Dk ? q_first + m : k_first + (m - Dk);
      return v_first + (m - n_qk);
    };
    const E* z = static_cast<const E*>(p.z) +
                 (n_z > 0 ? grp.b * p.z_batch_stride + int64_t(h_lo) * p.z_head_stride + j_lo : 0);
    // The gates' inputs: a plain launch's first (its wait, in
    // start_fused_loads, is passed); kPdl: after the wait below.
    GateInputs<IO> gin;
    if constexpr (!kPdl) {
      if (gate_g >= 0) gin = load_gate_inputs<IO>(p, grp.b, group_head(p, grp.hk, gate_g, G));
    }
    [[maybe_unused]] bool waited = false;
    [[maybe_unused]] auto wait_then_gates = [&] {
      wait_upstream();
      GDN_MARK(1);
      waited = true;
      if (gate_g >= 0) gin = load_gate_inputs<IO>(p, grp.b, group_head(p, grp.hk, gate_g, G));
    };
    for (int s = tid; s < n_runs; s += nthreads) {
      // ---- loads, raw: a run past its range reads run 0 instead (a valid
      // address), so no load waits in a branch of its own.
      GDN_MARK(21);
      const int m = kRun * s;
      Run nw, zv, xc, bv, old[kTaps], wv[kW > 0 ? kW : 1];
      if (n_w > 0) nw.load(nwp + (m < n_w ? m : 0));
      if constexpr (!kPdl) {
        if (n_z > 0) zv.load(z + (m < n_z ? m : 0));
      }
      const int64_t c = kW > 0 ? channel(m < n_conv ? m : 0) : 0;
      if constexpr (kW > 0) {
#pragma unroll
        for (int t = 0; t < kTaps; ++t) old[t].load(cs_in + c * kTaps + kRun * t);
#pragma unroll
        for (int t = 0; t < kW; ++t) wv[t].load(wt + c * kW + kRun * t);
        if constexpr (!kPdl) xc.load(x + c);
        if (bias) bv.load(bias + c);
      }
      if constexpr (kPdl) {
        // A programmatic launch (start_fused_loads): the loads above, which
        // the previous kernel does not feed, went out before its wait; z and
        // x, which it writes, only after.
        if (!waited) wait_then_gates();
        if (n_z > 0) zv.load(z + (m < n_z ? m : 0));
        if constexpr (kW > 0) xc.load(x + c);
      }
      GDN_MARK(9);
      if (!issued) {
        issue_state();
        issued = true;
      }
      GDN_MARK(10);
      // ---- then the arithmetic and the stores. Element e of a run of
      // runs (old, wv) is element e % kRun of run e / kRun: channel e / taps.
      auto el = [](const Run* r, int e) { return reinterpret_cast<const E*>(&r[e / kRun].w[0])[e % kRun]; };
      if (m < n_w) {
        float f[kRun];
        nw.to_float(f);
#pragma unroll
        for (int k = 0; k < kRun; ++k) sm.w[m + k] = f[k];
      }
      if (m < n_z) {
        float f[kRun];
        zv.to_float(f);
#pragma unroll
        for (int k = 0; k < kRun; ++k) sm.z[grp.lo + m + k] = silu(f[k]);  // the gate, off the tail
      }
      if constexpr (kW > 0) {
        if (m < n_conv) {
          float xf[kRun], bf[kRun] = {};
          xc.to_float(xf);
          if (bias) bv.to_float(bf);
          // the run's first group position: q/k in place, v after 2 Dk
          float* y = m < n_qk ? sm.qk + m : sm.vo + (grp.lo + m - n_qk);
          E nv[kTaps][kRun];  // the shifted windows, laid out as the old ones
#pragma unroll
          for (int k = 0; k < kRun; ++k) {
            // y = silu(w . window + bias), window = (old[0 .. W-2], x)
            float acc = bf[k];
#pragma unroll
            for (int t = 0; t < kW - 1; ++t)
              acc += Elem<E>::to_float(el(wv, k * kW + t)) * Elem<E>::to_float(el(old, k * kTaps + t));
            acc += Elem<E>::to_float(el(wv, k * kW + kW - 1)) * xf[k];
            y[k] = silu(acc);
            // conv_state[s_out, c] = (old[1 .. W-2], x): the input values themselves
#pragma unroll
            for (int t = 0; t < kTaps; ++t) {
              const int e = k * kTaps + t;
              nv[e / kRun][e % kRun] = t + 1 < kTaps ? el(old, e + 1) : reinterpret_cast<const E*>(&xc.w[0])[k];
            }
          }
          if (slots.write) {
            if (grp.size == 1 || m >= n_qk) {
              // one reader (the v channels, or no cluster): written now
#pragma unroll
              for (int t = 0; t < kTaps; ++t) store_run(cs_out + c * kTaps + kRun * t, nv[t]);
            } else {
              // q/k in a cluster: this block's share (m % size == rank),
              // kept for fused_mid
#pragma unroll
              for (int k = 0; k < kRun; ++k)
                if (grp.share(m + k) == grp.rank)
#pragma unroll
                  for (int t = 0; t < kTaps; ++t) {
                    const int e = k * kTaps + t;
                    sm.next[3 * (m + k) + t] = Elem<E>::to_float(nv[e / kRun][e % kRun]);
                  }
            }
          }
        }
      }
    }
    GDN_MARK(11);
    if constexpr (kPdl) {
      if (!waited) wait_then_gates();  // a thread with no run
    }
    if (gate_g >= 0) {
      const Gates gt = finish_gates(p, gin);
      sm.decay[gate_g] = gt.decay;
      sm.beta[gate_g] = gt.beta;
    }
  });
  if (!issued) issue_state();
  GDN_MARK(12);
}

// Whether every run fused_prologue_runs<IO, W, kRun> loads starts on a
// multiple of its vector word (RawRun: min(16, kRun elements) bytes): the
// launch checked the pointers and strides (Group::vector_runs); the offset
// of the block's first column is the block's own (q/k channels and the runs
// inside start on multiples of kRun elements, Dk and Dv multiples of 16).
// (Testing the slot's and rows' addresses here instead cost the fused kv
// middle 0.15 us at B = 1: its 64-bit products sat before the first load.)
template <typename IO, int kRun>
__device__ __forceinline__ bool prologue_runs_aligned(const Group& grp) {
  return grp.vector_runs && (grp.j_lo * int(sizeof(IO))) % RawRun<IO, kRun>::kBytes == 0;
}

// The block's share of the group prologue (every thread calls it; a barrier
// must follow before the shared values are read). Channels: q and k of hk
// (every block needs them) and v of the block's own columns [lo, hi) only.
// - conv: y[c] = silu(sum_j w[c, j] window[c, j] + bias[c]) into qk / vo,
//   window = (conv_state[s_in, c, 0 .. W-2], x[b, c]), and the shifted window
//   conv_state[s_out, c] = (old[1 .. W-2], x[b, c]): one thread reads and
//   then writes each channel, and no other block touches the group's
//   channels, so in place is safe. A v channel has one reader in its group
//   (the block owning its column), which writes it back at once; the q/k
//   channels are read by every block of a cluster, so block r keeps the
//   shifted windows of q/k channels m = r mod size for fused_mid, after the
//   cluster barrier (no block writes the tail alone). Stored values are input
//   values (exact through float);
// - norm: silu(z) of the own columns and norm_weight into shared memory;
// - the gates of the G heads.
// Latency is what counts here: a thread issues the loads of up to kPer
// channels, its z values and its gate inputs, then (issue_state, unless the
// caller issued them first) the first state copies, then uses any of them.
// The prologue's loads go first so that they do not queue behind the
// state's; its arithmetic then overlaps the state's arrival.
// The common layout goes by runs of kRun channels (fused_prologue_runs);
// this channel-by-channel form serves the rest (tap-major or padded conv
// state, odd segment lengths, MixedIO).
// kPer = 2: a block's 256 threads cover Qwen3.5's 2 Dk + G Dv = 512
// channels in one round. A thread's instructions are what the prologue
// waits on (bench_fused trace), so more slots cost more than a second round
// saves: with 4, B = 1 fp32 vk (two of them unused) went 7.25 -> 7.98 us and
// bf16 vk (4-warp blocks, 272 channels: two rounds with 2) 7.47 -> 7.94.
template <typename IO, int kRun, bool kPdl, typename Issue, typename Params>
__device__ __forceinline__ void fused_prologue(const Params& p, const Group& grp, const RowSlots& slots,
                                               const FusedSmem& sm, Issue&& issue_state) {
  constexpr int kPer = 2;
  const int Dk = p.head_dim_k, Dv = p.head_dim_v, G = grp.G, W = p.conv_width;
  const int nthreads = int(blockDim.x), tid = int(threadIdx.x);
  const PrologueSizes ps(p, grp);
  GDN_MARK(19);
  const int n_own = ps.own, n_qk = ps.qk, n_conv = ps.conv, n_z = ps.z, n_w = ps.w, n = ps.all;
  // The common layout by runs of kRun channels (fused_prologue_runs): conv
  // state [slot, conv_dim, W-1], q/k and the own columns (one head) whole
  // runs, the input dtypes uniform (MixedIO, the rare case, keeps the
  // channel-by-channel form: the runs of its three dtypes spilled 300-400
  // bytes in the kv kernel). (G <= kMaxFusedGroup, far below a block's
  // threads.)
  if constexpr (!std::is_same<IO, MixedIO>::value) {
    if ((W == 0 || (p.conv_state_tap_stride == 1 && p.conv_state_channel_stride == W - 1 && Dk % kRun == 0)) &&
        n_own % kRun == 0 && Dv % kRun == 0 && grp.one_head(Dv) && prologue_runs_aligned<IO, kRun>(grp)) {
      // Runs of 2 where the block has a thread for each, else of kRun: the
      // thread's arithmetic (two channels instead of four) is on the chain
      // the whole group waits on. H200, bench_fused, 2026-12-01, fused
      // middle: fp32 vk B = 1 5.78 -> 5.67 us, B = 8 13.0 -> 12.8, bf16 vk
      // B = 8 8.75 -> 8.38 (256-thread blocks); bf16 vk at B = 1 (128
      // threads, 144 runs of 2) keeps runs of 4: two runs of 2 a thread,
      // their loads issued together, were 12% slower there.
      auto by_runs = [&](auto run_tag) {  // run_tag: the run size, a std::integral_constant
        constexpr int kR = decltype(run_tag)::value;
        switch (W) {
          case 0: fused_prologue_runs<IO, 0, kR, kPdl>(p, grp, slots, sm, issue_state); return;
          case 2: fused_prologue_runs<IO, 2, kR, kPdl>(p, grp, slots, sm, issue_state); return;
          case 3: fused_prologue_runs<IO, 3, kR, kPdl>(p, grp, slots, sm, issue_state); return;
          default: fused_prologue_runs<IO, 4, kR, kPdl>(p, grp, slots, sm, issue_state); return;
        }
      };
      if constexpr (kRun > 2) {
        if (n <= 2 * nthreads) return by_runs(std::integral_constant<int, 2>{});
      }
      return by_runs(std::integral_constant<int, kRun>{});
    }
  }
  if constexpr (kPdl) {
    // (this form reads everything after the wait)
    wait_upstream();
    GDN_MARK(1);
  }
  bool issued = false;
  with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
    using E = decltype(tag);
    const E* x = static_cast<const E*>(p.x) + grp.b * p.x_batch_stride;
    const E* wt = static_cast<const E*>(p.conv_weight);
    const E* bias = static_cast<const E*>(p.conv_bias);
    E* cs = static_cast<E*>(p.conv_state);
    const int64_t in_slot = slots.s_in * p.conv_state_slot_stride;
    const int64_t out_slot = slots.s_out * p.conv_state_slot_stride;
    const int64_t chs = p.conv_state_channel_stride, tps = p.conv_state_tap_stride;
    const E* z = static_cast<const E*>(p.z);
    // group position of conv channel m: q/k first, then the own v columns
    auto position = [&](int m) { return m < n_qk ? m : 2 * Dk + grp.lo + (m - n_qk); };
    // The loads' addresses are on the critical path too (a thread issues its
    // loads one instruction at a time, each address a chain of integer
    // steps: bench_fused trace put the prologue's issue at ~1 us), so the
    // common case takes no division: the block's own columns within one
    // head (every cluster geometry of Qwen3.5) make v channel m and z
    // element m one base plus m.
    const int g_lo = grp.g_lo, j_lo = grp.j_lo;
    const bool one_head = grp.one_head(Dv);
    const int64_t v_first = 2 * int64_t(p.num_k_heads) * Dk + int64_t(group_head(p, grp.hk, g_lo, G)) * Dv + j_lo;
    const int64_t q_first = int64_t(grp.hk) * Dk, k_first = int64_t(p.num_k_heads + grp.hk) * Dk;
    auto channel = [&](int m) -> int64_t {
      if (m < n_qk) return m < Dk ? q_first + m : k_first + (m - Dk);
      if (one_head) return v_first + (m - n_qk);
      return group_channel(p, grp.hk, G, position(m));
    };
    const E* z_first = z + (n_z > 0 ? grp.b * p.z_batch_stride + int64_t(group_head(p, grp.hk, g_lo, G)) * p.z_head_stride + j_lo : 0);
    auto z_at = [&](int m) -> const E* {
      if (one_head) return z_first + m;
      const int i = grp.lo + m, g = i / Dv, j = i - g * Dv;
      return z + grp.b * p.z_batch_stride + int64_t(group_head(p, grp.hk, g, G)) * p.z_head_stride + j;
    };
    const E* cs_in = cs + in_slot;
    // gate inputs of head tid (tid < G; the others read head 0's, unused)
    const bool gate_thread = tid < G;
    const GateInputs<IO> gin = load_gate_inputs<IO>(p, grp.b, group_head(p, grp.hk, gate_thread ? tid : 0, G));
    for (int base = tid; base < n; base += kPer * nthreads) {
      // ---- loads, raw (RawRun): norm_weight and z, then every tap of up to
      // kPer channels. A slot past its range, or a tap past W, reads an
      // in-range stand-in (index 0) instead, so no load sits in a branch of
      // its own; the arithmetic below ignores it. One branch per kind of
      // load, around all kPer slots, so their addresses interleave.
      E nw[kPer], zv[kPer], old[kPer][3], xc[kPer], wv[kPer][4], bv[kPer];
      if (n_w > 0) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int m = base + k * nthreads;
          nw[k] = static_cast<const E*>(p.norm_weight)[m < n_w ? m : 0];
        }
      }
      if (n_z > 0) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int m = base + k * nthreads;
          zv[k] = *z_at(m < n_z ? m : 0);
        }
      }
      if (n_conv > 0) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int m = base + k * nthreads;
          const int64_t c = channel(m < n_conv ? m : 0);
          // window = (old[0 .. W-2], xc); indices fixed at compile time (W <= 4)
          // so the window stays in registers.
          const E* win = cs_in + c * chs;
#pragma unroll
          for (int t = 0; t < 3; ++t) old[k][t] = win[(t < W - 1 ? t : 0) * tps];
#pragma unroll
          for (int t = 0; t < 4; ++t) wv[k][t] = wt[c * W + (t < W ? t : 0)];
          xc[k] = x[c];
          if (bias) bv[k] = bias[c];
        }
      }
      GDN_MARK(9);
      if (!issued) {
        issue_state();
        issued = true;
      }
      GDN_MARK(10);
      // ---- then the arithmetic and the stores
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int m = base + k * nthreads;
        if (m < n_w) sm.w[m] = Elem<E>::to_float(nw[k]);
        if (m < n_z) sm.z[grp.lo + m] = silu(Elem<E>::to_float(zv[k]));  // the gate, off the tail
        if (m < n_conv) {
          const int i = position(m);
          // y = silu(w . window + bias)
          float acc = bias ? Elem<E>::to_float(bv[k]) : 0.0f;
#pragma unroll
          for (int t = 0; t < 3; ++t)
            if (t < W - 1) acc += Elem<E>::to_float(wv[k][t]) * Elem<E>::to_float(old[k][t]);
          acc += Elem<E>::to_float(W == 2 ? wv[k][1] : W == 3 ? wv[k][2] : wv[k][3]) * Elem<E>::to_float(xc[k]);
          (i < 2 * Dk ? sm.qk[i] : sm.vo[i - 2 * Dk]) = silu(acc);
          // conv_state[s_out, c] = (old[1 .. W-2], xc), the input values
          // themselves: now (one reader), or this block's share of the q/k
          // channels, kept for fused_mid
          const bool now = grp.size == 1 || m >= n_qk;
          if (slots.write && (now || grp.share(m) == grp.rank)) {
            const int64_t c = channel(m);
#pragma unroll
            for (int t = 0; t < 3; ++t)
              if (t < W - 1) {
                const E nv = t + 1 < W - 1 ? old[k][t < 2 ? t + 1 : 2] : xc[k];
                if (now)
                  cs[out_slot + c * chs + t * tps] = nv;
                else
                  sm.next[3 * m + t] = Elem<E>::to_float(nv);
              }
          }
        }
      }
    }
    GDN_MARK(11);
    if (gate_thread) {
      const Gates gt = finish_gates(p, gin);
      sm.decay[tid] = gt.decay;
      sm.beta[tid] = gt.beta;
    }
  });
  if (!issued) issue_state();
  GDN_MARK(12);
}

// Between the prologue and the step (every thread of every block of the
// group): in a cluster, wait until every block has read the old q/k windows
// and initialized its outputs' mbarrier, then write back this block's share
// of the shifted q/k windows. (Waiting instead just before a block's first
// output, to hide the blocks' spread in finishing their prologues behind the
// step, measured no faster on the H200: the wait moves, the spread stays.)
template <typename IO, typename Params>
__device__ __forceinline__ void fused_mid(const Params& p, const Group& grp, const RowSlots& slots,
                                          const FusedSmem& sm) {
  if (grp.size == 1) return;
  cluster_wait();
  if (p.conv_width == 0 || !slots.write) return;
  const int Dk = p.head_dim_k, W = p.conv_width;
  with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
    using E = decltype(tag);
    E* cs = static_cast<E*>(p.conv_state);
    const int64_t out_slot = slots.s_out * p.conv_state_slot_stride;
    const int64_t chs = p.conv_state_channel_stride, tps = p.conv_state_tap_stride;
    for (int m = grp.rank + int(threadIdx.x) * grp.size; m < 2 * Dk; m += int(blockDim.x) * grp.size) {
      const int64_t c = group_channel(p, grp.hk, grp.G, m);
#pragma unroll
      for (int t = 0; t < 3; ++t)
        if (t < W - 1) cs[out_slot + c * chs + t * tps] = Elem<E>::from_float(sm.next[3 * m + t]);
    }
  });
}

// Output `col` (group column) of the block, raw: into every cluster block's
// sm.out (the norm reads the whole group's there), or this block's.
__device__ __forceinline__ void fused_emit(const FusedSmem& sm, const Group& grp, int col, float o) {
  if (grp.size > 1)
    push_to_cluster(&sm.out[col], sm.bar, grp.size, o);
  else
    sm.out[col] = o;
}

// The sum of squares of a head's Dv raw outputs `out`, which a warp forms in
// one fixed order (lane l: j = l, l + kWarp, ..., then a fixed butterfly),
// the same bits in every kernel and geometry; every lane gets it.
__device__ __forceinline__ float head_sum_squares(const float* out, int Dv, int lane) {
  float ss = 0.0f;
  for (int j = lane; j < Dv; j += kWarp) {
    const float o = out[j];
    ss += o * o;
  }
#pragma unroll
  for (int off = kWarp / 2; off >= 1; off /= 2) ss += warp_shfl_xor(ss, off);
  return ss;
}

// The norm alone as the step's epilogue (decode_vk's kStepNorm,
// decode_kv_step_kernel's kNorm), once the block has pushed its raw outputs
// into `head_out` of every block of its head:
//   out[j] = w[j] * o[j] * rsqrt(mean_j(o[j]^2) + eps) * silu(z[j])
// for the block's own columns [j_own, j_own + n_own), at most one a thread
// (fused_finish's one-head form, same bits). A head's blocks in a cluster
// (csize > 1) wait on the outputs' mbarrier `bar`, one block a head on a
// block barrier. w_pre, z_pre: the thread's norm_weight and z, loaded at
// entry; o_base: the output's offset of the block's (row, head).
template <typename IO, typename Params>
__device__ __forceinline__ void step_norm_finish(const Params& p, const float* head_out, int Dv, int j_own,
                                                 int n_own, int64_t o_base, int csize, unsigned long long* bar,
                                                 const IoRun<IO, 1>& w_pre, const IoRun<IO, 1>& z_pre) {
  const float inv_dv = 1.0f / float(Dv);  // before the wait: the mean is then a product
  if (csize > 1)
    outputs_wait(bar);  // every block's pushes have landed
  else
    __syncthreads();
  const int t = int(threadIdx.x);
  if (t / kWarp * kWarp >= n_own) return;  // a warp with none of the columns (uniform over it)
  const float rstd = rsqrtf(head_sum_squares(head_out, Dv, t % kWarp) * inv_dv + p.norm_eps);
  if (t < n_own) {
    const float w = w_pre.value(), zg = silu(z_pre.value());
    with_dtype<IO>(p.o_dtype, [&](auto tag) {
      using E = decltype(tag);
      static_cast<E*>(p.o)[o_base + j_own + t] = Elem<E>::from_float(w * head_out[j_own + t] * rstd * zg);
    });
  }
}

// The gated RMSNorm over each head of the group, once every output of the
// group is in sm.out (every thread calls it):
//   out[j] = w[j] * o[j] * rsqrt(mean_j(o[j]^2) + eps) * silu(z[j])
// A head's squares are summed by one warp in one fixed order (lane l: j = l,
// l + kWarp, ..., then a fixed butterfly), whatever the launch geometry:
// deterministic and batch-invariant. When the block's columns lie in one
// head, each warp writing some of them forms that head's rstd itself; else
// warp g forms head g's into shared memory for all. A block writes its own
// columns [lo, hi). No block reads another's shared memory, so none waits
// for the others to leave.
// zw (the norm alone's instantiations, one column a thread): silu(z) and norm_weight of
// the thread's column lo + tid, loaded at entry instead of into sm.z / sm.w.
template <typename IO, typename Params>
__device__ __forceinline__ void fused_finish(const Params& p, const Group& grp, const FusedSmem& sm,
                                             const float* zw = nullptr) {
  if (p.norm_weight == nullptr) return;
  const int Dv = p.head_dim_v, G = grp.G;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  // 1 / Dv before the wait: the mean below is then a product, not a
  // division (whose slow-path branch sat between the sum and the rsqrt)
  const float inv_dv = 1.0f / float(Dv);
  if (grp.size > 1)
    outputs_wait(sm.bar);  // every block's pushes have landed
  else
    __syncthreads();
  GDN_MARK(7);
  // The sum of squares of head g's outputs, in the one fixed order.
  auto head_ss = [&](int g) { return head_sum_squares(sm.out + g * Dv, Dv, lane); };
  if (grp.one_head(Dv)) {
    // The block's columns lie in member g_lo (every cluster geometry of
    // Qwen3.5): each warp holding some of them forms that head's rstd
    // itself, the same sum in the same order (so the same bits), and no
    // barrier or shared rstd stands between it and its stores; warps
    // holding none are done. (The whole test is uniform over a warp.)
    if (warp * kWarp >= grp.hi - grp.lo) return;
    const float rstd = rsqrtf(head_ss(grp.g_lo) * inv_dv + p.norm_eps);
    GDN_MARK(18);
    with_dtype<IO>(p.o_dtype, [&](auto tag) {
      using E = decltype(tag);
      const int64_t o_base = grp.b * p.o_batch_stride + int64_t(group_head(p, grp.hk, grp.g_lo, G)) * p.o_head_stride;
      for (int i = grp.lo + int(threadIdx.x); i < grp.hi; i += int(blockDim.x)) {
        const int j = grp.j_lo + (i - grp.lo);
        const bool own = zw != nullptr && i == grp.lo + int(threadIdx.x);
        const float w = own ? zw[1] : sm.w[j], zg = own ? zw[0] : sm.z[i];
        static_cast<E*>(p.o)[o_base + j] = Elem<E>::from_float(w * sm.out[i] * rstd * zg);
      }
    });
    return;
  }
  // Every warp takes part in every round (a 64-lane logical warp's
  // exchanges are barriers its warps must all reach).
  for (int g0 = 0; g0 < G; g0 += warps) {
    const int g = g0 + warp;
    const float ss = head_ss(g < G ? g : 0);
    if (g < G && lane == 0) sm.rstd[g] = rsqrtf(ss * inv_dv + p.norm_eps);
  }
  __syncthreads();
  GDN_MARK(18);
  with_dtype<IO>(p.o_dtype, [&](auto tag) {
    using E = decltype(tag);
    for (int i = grp.lo + int(threadIdx.x); i < grp.hi; i += int(blockDim.x)) {
      const int g = i / Dv, j = i - g * Dv;
      const int64_t o_off = grp.b * p.o_batch_stride + int64_t(group_head(p, grp.hk, g, G)) * p.o_head_stride + j;
      static_cast<E*>(p.o)[o_off] = Elem<E>::from_float(sm.w[j] * sm.out[i] * sm.rstd[g] * sm.z[i]);
    }
  });
}

// The step kernels' first loads (both layouts): the state's, then q, k, v
// and the gates (issue_small), or the other way round in a one-round grid
// (small_loads_first, see Launch). A programmatic launch issues the state's
// before the wait: the inputs may still be being written by the previous
// kernel. Each order is written out whole, so neither keeps the other's
// addresses live across it.
template <typename IssueState, typename IssueSmall, typename Params>
__device__ __forceinline__ void start_step_loads(const Params& p, bool small_loads_first,
                                                 IssueState&& issue_state, IssueSmall&& issue_small) {
  if (p.programmatic_launch || !small_loads_first) {
    issue_state();
    wait_upstream();
    GDN_MARK(1);
    issue_small();
    GDN_MARK(9);  // (the fused prologue has its own marks 9-12)
  } else {
    wait_upstream();
    GDN_MARK(1);
    issue_small();
    GDN_MARK(9);
    issue_order_fence();
    issue_state();
    GDN_MARK(10);
  }
}

// The fused kernels' first loads (both layouts): the prologue's, then the
// state's, then q, k, v and the gates once the prologue's outputs are in
// shared memory. The state's go first under a programmatic launch (before
// the wait: the inputs may still be being written by the previous kernel).
// Otherwise, by geometry:
// - a cluster a group (small B), both layouts: after the prologue's
//   arithmetic, once its loads have landed: they then do not queue in DRAM
//   behind the whole grid's state reads (kv: B = 1 fp32 6.33 -> 6.07 us,
//   B = 8 14.4 -> 13.8, bf16 B = 8 9.3 -> 8.9; vk, once the prologue's
//   loads no longer carried address tests (RawRun): B = 1 fp32 6.04 ->
//   5.85, bf16 5.34 -> 5.21, B = 8 2% faster; H200, 2026-11-30; before
//   that vk lost 1.3% this way at bf16 B = 1);
// - one block a group (B * Hk >= the SMs): kv (kKvOrder, 64 registers)
//   first, so its tile copies' addresses die before the prologue's runs
//   are live (the kernel spills 8 bytes instead of 48-72; issued inside the
//   prologue, fp32 kv at B = 64 ran 83.0 -> 88.1 us); vk (128 registers)
//   right behind the prologue's loads.
// kRun: channels a thread's prologue runs take (fused_prologue_runs).
// kPdl (the programmatic launch's instantiation, sm_90; fused_kernel_for):
// the state's copies, then the prologue's loads that the previous kernel
// does not feed (conv state, conv and norm weights), then the wait, then x,
// z, a and b (fused_prologue_runs), where the plain order waits first.
// H200, bench_fused, 2026-12-03 (round 28): the fused middle at B = 1
// behind the upstream stand-in 0.35-0.78 us a call faster under PDL (PDL's
// gain 0.67-1.02 -> 1.20-1.75 us), the plain launch's 12 rows unchanged
// (within 0.2%). Its own instantiation: the same order behind a run-time
// flag cost the plain launch 2-13% at B = 1 and 8 (round 27), and the
// weights ahead of x and z in every launch 1-5%. Built for the 16-bit inputs
// a served model's projection writes (kPdlInputs; the sm_90 library 26.9 ->
// 28.4 MB); fp32 and mixed inputs keep the plain order under a programmatic
// launch (every prologue load after the wait).
template <typename IO>
constexpr bool kPdlInputs = std::is_same<IO, bf16>::value || std::is_same<IO, fp16>::value;
template <typename IO, int kRun, bool kKvOrder, bool kPdl, typename IssueState, typename IssueSmall,
          typename Params>
__device__ __forceinline__ void start_fused_loads(const Params& p, const Group& grp, const RowSlots& slots,
                                                  const FusedSmem& sm, IssueState&& issue_state,
                                                  IssueSmall&& issue_small) {
  fused_begin(p, grp, sm);
  // in a cluster: the state's copies once the prologue's loads have landed
  // (late); kv in one block a group: first.
  const bool late = grp.size > 1 && !p.programmatic_launch && !kPdl;
  const bool state_first = !late && (p.programmatic_launch || kKvOrder || kPdl);
  if (state_first) issue_state();
  if constexpr (!kPdl) {
    wait_upstream();
    GDN_MARK(1);
  }
  fused_prologue<IO, kRun, kPdl>(p, grp, slots, sm, [&] {
    if (!state_first && !late) issue_state();
  });
  if (late) issue_state();
  __syncthreads();
  GDN_MARK(2);
  fused_arrive(p, grp, sm);
  GDN_MARK(13);
  issue_small();
}

// A padding row of a group: zero the outputs of its G heads (block 0 of a cluster).
template <typename Params>
__device__ __forceinline__ void zero_group_outputs(const Params& p, const Group& grp) {
  if (grp.rank != 0) return;
  const int Dv = p.head_dim_v;
  for (int i = threadIdx.x; i < grp.G * Dv; i += int(blockDim.x)) {
    const int g = i / Dv, j = i - g * Dv;
    store_any(p.o, p.o_dtype, grp.b * p.o_batch_stride + int64_t(group_head(p, grp.hk, g, grp.G)) * p.o_head_stride + j,
              0.0f);
  }
}

// Whether this compilation has the cluster instructions (sm_90 code).
#if GDN_CLUSTERS
constexpr bool kClusterCode = true;
#else
constexpr bool kClusterCode = false;
#endif

// Minimum blocks of 8 warps per SM: 32 resident warps for fp32 states (64
// registers, no spills) and 24 for 16-bit ones (80 registers, a few bytes of
// spill on some instantiations; at 32 warps ptxas spills hundreds), so many
// warps' ring copies are in flight at once. Before the ring (next items held
// in registers, as the HIP path still does) they needed 80 and 118: 24 and
// 16 warps.
// kFused (conv prologue or norm epilogue on): a group (row b, k-head hk) is
// `cluster` consecutive blocks (blockIdx = (b * Hk + hk) * cluster + rank;
// by_hv divides by Hk; cluster > 1 only on sm_90, launched as a cluster);
// warp w of block rank works on head g = (rank * W + w) / warps_per_head.
// (Fused blocks, one per group, are few: they take 128 registers rather than spill.)
// kNormOnly (with kFused, vk): the instantiation for the norm alone in
// clusters (no prologue; see "the norm alone" below), launched only there.
template <typename T, bool kFused>
constexpr int vk_min_blocks() {
  return GDN_VK_RING && !kFused ? (sizeof(T) == 4 ? 1024 : 768) / (8 * kWarp) : 2 / (1 + !GDN_VK_RING);
}
// The vk kernels' body: decode_vk_step_kernel and decode_vk_fused_kernel
// (below it) are its entry points; kv runs decode_kv_step_kernel or
// decode_kv_fused_kernel. (Params, here and in the helpers: KernelParams,
// or DecodeParams in decode_kv_fused_kernel, which says why.)
// kStepNorm (the step, not fused; sm_90, Launch::step_norm): the gated
// RMSNorm alone as the step's epilogue, as decode_kv_step_kernel's kNorm
// does it: the step's blocks, a head's blocks a cluster (one block: none),
// each output pushed raw into every block of its head, the head's sum of
// squares in the one fixed order once its Dv outputs are in. The launch
// takes it only where every warp of every block has an item.
template <typename T, Layout kLayout, int kDk, int kP, typename IO, bool kFused, bool kNormOnly, int kHints,
          bool kStepNorm = false, bool kPdl = false, typename Params>
__device__ __forceinline__ void decode_vk(const Params& p, int items_per_head, int items_per_warp,
                                          FastDiv by_blocks_per_head, FastDiv by_hv, FastDiv by_head_map,
                                          bool small_loads_first, float scale, int group_heads, int warps_per_head,
                                          int cluster, FusedArgs fdiv) {
  static_assert(kLayout == Layout::kVK, "kv runs its own kernels");
  static_assert(kFused || !kNormOnly, "kNormOnly is a fused instantiation");
  // kNormOnly runs only in clusters, i.e. from sm_90 code: compiled for
  // sm_80 it is never launched, so it is left empty there.
  // kStepNorm likewise: the launch takes it only from sm_90 code, and kPdl
  // (a programmatic launch's fused kernel) too, for 16-bit inputs.
  if constexpr (((kNormOnly || kStepNorm) && !kClusterCode) || (kPdl && (!kClusterCode || !kPdlInputs<IO>))) {
#if !defined(GDN_HIP)
    __trap();
#endif
    return;
  }
  constexpr int kColsPerItem = cols_per_item<T, kLayout, kDk, kP>();
  using VkT = VkTile<T, kDk, kP>;
  using V = Vec<T>;
  constexpr int kVec = V::kN;
  // What a lane holds: kOuter columns x kInner chunks of kVec rows.
  constexpr int kOuter = VkT::kUnroll;
  constexpr int kInner = VkT::kChunksPerLane;
  // Rows (Dk indices) a lane holds, and the lanes that together hold all of Dk.
  constexpr int kRowsHeld = kInner * kVec;
  constexpr int kColsHeld = kOuter;
  constexpr int kReduceLow = 1;
  constexpr int kReduceSpan = VkT::kLanesPerCol;

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int warps = int(blockDim.x / kWarp);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // Block coordinates in 32-bit arithmetic by host-prepared divisors (the
  // grid index is below 2^31): blockIdx = (b * Hv + h) * blocks_per_head + blk,
  // or (fused) b * Hk + hk with this warp on head g of the group.
  int h, blk, hk = 0, g = 0, gw = 0;
  int64_t b;
  Group grp{};
  if constexpr (kFused) {
    const unsigned group = fdiv.cluster.div(blockIdx.x);
    const unsigned b32 = by_hv.div(group);
    b = b32;
    hk = int(group - b32 * unsigned(p.num_k_heads));
    grp = Group{b, hk, group_heads, int(blockIdx.x - group * unsigned(cluster)), cluster, 0, 0, 0, 0, fdiv.cluster,
                fdiv.vector_runs};
    gw = grp.rank * warps + warp;  // the warp's index in the group
    g = int(fdiv.per_head.div(unsigned(gw)));
    h = group_head(p, hk, g, group_heads);
    blk = grp.rank;
    // The block's columns: from its first warp's first item to its last
    // warp's last (consecutive warps of a head own consecutive items; the
    // first item's column is below Dv).
    const int first = grp.rank * warps, last = first + warps - 1;
    const int g_first = int(fdiv.per_head.div(unsigned(first))), g_last = int(fdiv.per_head.div(unsigned(last)));
    const int it_first = (first - g_first * warps_per_head) * items_per_warp;
    const int it_end = min(items_per_head, (last - g_last * warps_per_head + 1) * items_per_warp);
    grp.g_lo = g_first;
    grp.j_lo = it_first * kColsPerItem;
    grp.lo = g_first * Dv + grp.j_lo;
    grp.hi = g_last * Dv + min(Dv, it_end * kColsPerItem);
  } else {
    const unsigned row_head = by_blocks_per_head.div(blockIdx.x);
    blk = int(blockIdx.x - row_head * by_blocks_per_head.d);
    const unsigned b32 = by_hv.div(row_head);
    h = int(row_head - b32 * unsigned(Hv));
    b = b32;
  }
  // (the output's offset is formed where it is used: its strides are not
  // among the fields read before the loads, see KernelParams)
  auto out_base = [&] { return b * p.o_batch_stride + int64_t(h) * p.o_head_stride; };

  // (fused: the group's first k-head counts the row's bad indices)
  const RowSlots slots = row_slots(p, b);
  // (the fused kernels read nearly every field of their parameters before
  // their loads: they count at once, and keep no slot live across the prologue)
  if (kFused) count_bad_indices(p, slots, hk, blk);
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    if (!kFused) count_bad_indices(p, slots, h, blk);
    // Padding row: zero this block's outputs, touch no state.
    if constexpr (kFused) {
      zero_group_outputs(p, grp);
    } else {
      const int64_t o_base = out_base();
      const int j0 = blk * warps * items_per_warp * kColsPerItem;
      const int j_end = min(Dv, j0 + warps * items_per_warp * kColsPerItem);
      for (int j = j0 + threadIdx.x; j < j_end; j += blockDim.x) store_any(p.o, p.o_dtype, o_base + j, 0.0f);
    }
    return;
  }
  int item = kFused ? (gw - g * warps_per_head) * items_per_warp : (blk * warps + warp) * items_per_warp;
  // Warps past the last item of the head (Dv not a multiple of the block's
  // columns). Fused blocks have none (the launch gives every warp an item),
  // and must not leave early: the group's barriers follow.
  if (!kFused && item >= items_per_head) return;
  const int item_end = min(items_per_head, item + items_per_warp);
  // kStepNorm: the head's raw outputs and the mbarrier that counts their
  // bytes; the blocks of the head (the cluster), and this block's output
  // columns [j_own, j_own + n_own) (at most one a thread: plan_launch)
  __shared__ float step_out[kStepNorm ? kMaxHeadDim : 1];
  __shared__ unsigned long long step_bar;
  const int csize = kStepNorm ? int(by_blocks_per_head.d) : 1;
  const int j_own = blk * warps * items_per_warp * kColsPerItem;
  const int n_own = min(Dv, j_own + warps * items_per_warp * kColsPerItem) - j_own;

  // ---- where this lane's data lives
  // rows[r]: the Dk index of held row r; cols[c]: the Dv index of held column
  // c, as an offset from the item's first column.
  int rows[kRowsHeld], cols[kColsHeld];
  {
    const int col_lane = lane % VkT::kLanesPerCol, step_col = lane / VkT::kLanesPerCol;
#pragma unroll
    for (int c = 0; c < kInner; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) rows[c * kVec + e] = (c * VkT::kLanesPerCol + col_lane) * kVec + e;
#pragma unroll
    for (int u = 0; u < kOuter; ++u) cols[u] = u * VkT::kColsPerStep + step_col;
  }

  // 64-bit arithmetic once per (slot, head); inside a head every offset is
  // below Dk * Dv <= 65536 and stays 32-bit.
  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  const int64_t v_base = b * p.v_batch_stride + int64_t(h) * p.v_head_stride;

  // State vector (o, c) of the item starting at column j0: row i, column j, offset.
  auto vec_row = [&](int o, int c) { (void)o; return rows[c * kVec]; };
  auto vec_col = [&](int o, int j0) { return j0 + cols[o]; };
  // element (i, j) at j*Dk + i
  auto vec_off = [&](int i, int j) -> int { return j * Dk + i; };
  // The fused stages' shared memory, after the ring.
  extern __shared__ uint4 smem_raw[];
#if GDN_VK_RING
  constexpr int kRingVecs = kStages * kOuter * kInner * kWarp;  // a warp's ring, in 16-byte vectors
#else
  constexpr int kRingVecs = 0;
#endif
  const FusedSmem sm(reinterpret_cast<float*>(smem_raw + warps * kRingVecs), kFused ? group_heads : 0, Dk, Dv);
  // After the one-pass butterfly (OnePass), held column out_c's sums sit in
  // the lanes of the span whose value bits name it; those lanes form its
  // delta, and one of them writes its output: every column of the item has
  // exactly one writer.
  using Pass = OnePass<kReduceLow, kReduceSpan, kColsHeld>;
  const int out_c = Pass::col(lane);
  const bool writer = Pass::writer(lane);
  // cols[out_c] without a run-time array index (which would go to local memory).
  const int out_col = out_c * VkT::kColsPerStep + lane / VkT::kLanesPerCol;
  // v[j0 + out_col], the lane's column (0 past Dv), in two steps (see
  // RawRun): load_v issues the load (a column past Dv reads the head's
  // first element instead), convert_v makes the value. (Conv on: the conv
  // output of the group prologue, in shared memory.)
  struct VLoad {
    IoRun<IO, 1> run;
    int j0;
  };
  auto load_v = [&](int j0, VLoad& l) {
    l.j0 = j0;
    if (kFused && p.conv_width > 0) return;
    const int j = j0 + out_col;
    l.run.load(p.qkv_dtype, p.v, v_base + (j < Dv ? j : 0));
  };
  auto convert_v = [&](const VLoad& l) -> float {
    const int j = l.j0 + out_col;
    if (kFused && p.conv_width > 0) return j < Dv ? sm.vo[g * Dv + j] : 0.0f;
    return l.run.value(j < Dv);
  };
#if GDN_VK_RING
  // The warp's ring of kStages item buffers in shared memory. A lane copies
  // in, and later reads back, only its own kHeld vectors of an item (lanes
  // side by side: conflict-free), so no barrier is ever needed.
  constexpr int kHeld = kOuter * kInner;
  V* ring = reinterpret_cast<V*>(smem_raw) + warp * (kStages * kHeld * kWarp) + lane;
  auto slot = [&](int stage, int o, int c) -> V* { return ring + ((stage * kOuter + o) * kInner + c) * kWarp; };
  // Issue the copies of item `it` into ring stage `stage` (nothing past the
  // warp's last item), and close the group either way so group k is item k.
  auto issue_item = [&](int it, int stage) {
    if (it < item_end) {
      const int j0 = it * kColsPerItem;
#pragma unroll
      for (int o = 0; o < kOuter; ++o)
#pragma unroll
        for (int c = 0; c < kInner; ++c) {
          const int i = vec_row(o, c), j = vec_col(o, j0);
          const bool in = i < Dk && j < Dv;
          copy16_async<(kHints & 2) != 0>(slot(stage, o, c), in ? s_in + vec_off(i, j) : s_in, in);
        }
    }
    async_commit();
  };
  // This lane's copies of `item` (group `item`) have landed; read them back.
  auto fetch_item = [&](int /*it*/, int stage, V (&s)[kOuter][kInner]) {
    async_wait<kStages - 1>();
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) s[o][c] = *slot(stage, o, c);
  };
#else
  // No cp.async (AMD): a shared-memory ring would only cost LDS, which on
  // gfx9 (64 KiB a CU) would cap the waves a CU holds. The next item loads
  // into registers instead while the current one computes.
  V pre[kOuter][kInner];
  auto issue_item = [&](int it, int) {
    if (it >= item_end) return;
    const int j0 = it * kColsPerItem;
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        const int i = vec_row(o, c), j = vec_col(o, j0);
        if (i < Dk && j < Dv)
          pre[o][c] = *reinterpret_cast<const V*>(s_in + vec_off(i, j));
        else
#pragma unroll
          for (int e = 0; e < kVec; ++e) pre[o][c].x[e] = Elem<T>::from_float(0.0f);
      }
  };
  // The item loaded last becomes current; the one after it starts loading.
  auto fetch_item = [&](int it, int, V (&s)[kOuter][kInner]) {
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) s[o][c] = pre[o][c];
    issue_item(it + 1, 0);
  };
#endif

  // ---- 1. every load up front, so one memory latency covers them all: the
  // first item's state (the ring: its first kStages - 1 items') and q, k, v
  // and the gates. In a one-round grid (small_loads_first, see Launch) the
  // small loads go first: they are the longer path (loaded, then normalized
  // before the state is used) and, behind the state's copies, they wait for
  // the memory pipeline (B = 1 fp32 vk, cold: issued 1.3 us into the
  // kernel). (Fused: the prologue's loads first, then the state's. A
  // programmatic launch issues the state's before the wait: the inputs may
  // still be being written by the previous kernel.)
  auto issue_state = [&] {
#if GDN_VK_RING
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) issue_item(item + st, st);
#else
    issue_item(item, 0);
#endif
  };
  // The token's small loads, all issued before any is used (RawRun): v of
  // the first item, q and k rows, the gates' inputs.
  VLoad v_first;
  // q and k rows, 0 past Dk. vk holds kVec consecutive rows per chunk (a
  // chunk starts at a multiple of kVec, which divides 16 and so Dk: all in
  // range or none): one vector load each; a chunk past Dk reads row 0.
  IoRun<IO, kVec> q_raw[kInner], k_raw[kInner];
  GateInputs<IO> gate_in;
  // silu(z) and norm_weight of the thread's column (fused_finish; kStepNorm)
  IoRun<IO, 1> z_pre, w_pre;
  const bool qk_global = !(kFused && p.conv_width > 0);
  auto issue_small = [&] {
    load_v(item * kColsPerItem, v_first);
    // interleaved: hk = h / G (by_head_map divides by G); tiled: hk = h % Hk
    // (by_head_map divides by Hk).
    if constexpr (!kFused) {
      const unsigned hq = by_head_map.div(unsigned(h));
      hk = p.head_map == HeadMap::kInterleaved ? int(hq) : h - int(hq) * p.num_k_heads;
    }
    if (qk_global) {
      const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
      const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        const int i = rows[c * kVec] < Dk ? rows[c * kVec] : 0;
        q_raw[c].load(p.qkv_dtype, p.q, q_base + i);
        k_raw[c].load(p.qkv_dtype, p.k, k_base + i);
      }
    }
    if constexpr (!kFused) gate_in = load_gate_inputs<IO>(p, b, h);
    if constexpr (kStepNorm) {
      const int col = j_own + (int(threadIdx.x) < n_own ? int(threadIdx.x) : 0);
      z_pre.load(p.qkv_dtype, p.z, b * p.z_batch_stride + int64_t(h) * p.z_head_stride + col);
      w_pre.load(p.qkv_dtype, p.norm_weight, col);
    }
  };
  GDN_MARK(0);
  float vj, qh[kRowsHeld], kh[kRowsHeld], decay, beta;
  auto qk_from_raw = [&] {
#pragma unroll
    for (int c = 0; c < kInner; ++c) {
      q_raw[c].to_float(qh + c * kVec, rows[c * kVec] < Dk);
      k_raw[c].to_float(kh + c * kVec, rows[c * kVec] < Dk);
    }
  };
  // ---- the norm alone in a cluster (kNormOnly; decode_kernel.cuh, "The
  // fused middle"): no prologue. Each warp loads its q, k, v rows and its
  // head's gates as the step does, each thread the z and norm_weight of its
  // own output column, and the state follows: no block barrier stands
  // between the loads and the step, and the cluster barrier (the outputs'
  // mbarrier ready) is arrived at once. Through the prologue, the q/k/v
  // loads went out only after its z loads had landed and its barrier had
  // passed. (A run-time switch in the fused kernel instead cost the conv's
  // path 3-7% at B = 1 and 8, its register allocation shared.)
  // The launch takes this instantiation only where the conv is off, the
  // group is a cluster, and each block's columns lie in one head, at most
  // one a thread.
  constexpr bool kDirect = kNormOnly && kClusterCode && !std::is_same<IO, MixedIO>::value;
  if constexpr (kStepNorm) {
    // The mbarrier expects the head's Dv outputs (peers' pushes may land
    // before this arrival), and is ready for them once the cluster barrier
    // after the l2norm completes.
    if (csize > 1) {
      if (threadIdx.x == 0) {
        outputs_barrier_init(&step_bar);
        outputs_expect(&step_bar, unsigned(sizeof(float)) * unsigned(Dv));
      }
      cluster_arrive_relaxed();
    }
  }
  if constexpr (kDirect) {
    fused_begin(p, grp, sm);
    if (p.programmatic_launch) {
      // (see the kv kernel's kDirect: the warp syncs after thread 0's
      // mbarrier.init)
      issue_order_fence();
      issue_state();
    }
    wait_upstream();
    GDN_MARK(1);
    issue_small();
    gate_in = load_gate_inputs<IO>(p, b, h);
    const int t = int(threadIdx.x) < grp.hi - grp.lo ? int(threadIdx.x) : 0;
    z_pre.load(p.qkv_dtype, p.z,
               b * p.z_batch_stride + int64_t(group_head(p, hk, grp.g_lo, group_heads)) * p.z_head_stride +
                   grp.j_lo + t);
    w_pre.load(p.qkv_dtype, p.norm_weight, grp.j_lo + t);
    GDN_MARK(9);
    if (!p.programmatic_launch) {
      issue_order_fence();
      issue_state();
    }
    GDN_MARK(10);
    vj = convert_v(v_first);
    qk_from_raw();
    const Gates gates = finish_gates(p, gate_in);
    decay = gates.decay;
    beta = gates.beta;
    fused_arrive(p, grp, sm);  // (no conv windows: only the outputs' mbarrier)
    GDN_MARK(13);
  } else {
    if constexpr (kFused)
      start_fused_loads<IO, prologue_run<Layout::kVK>(), false, kPdl>(p, grp, slots, sm, issue_state, issue_small);
    else
      start_step_loads(p, small_loads_first, issue_state, issue_small);
    // ... then the values.
    vj = convert_v(v_first);
    if (qk_global) {
      qk_from_raw();
    } else {
      // the conv output of the group prologue
#pragma unroll
      for (int r = 0; r < kRowsHeld; ++r) {
        const int i = rows[r];
        qh[r] = i < Dk ? sm.qk[i] : 0.0f;
        kh[r] = i < Dk ? sm.qk[Dk + i] : 0.0f;
      }
    }
    if constexpr (kFused) {
      decay = sm.decay[g];
      beta = sm.beta[g];
    } else {
      const Gates gates = finish_gates(p, gate_in);
      decay = gates.decay;
      beta = gates.beta;
    }
  }

  // (the loads are out: the fields past KernelParams' first part now)
  if (!kFused) count_bad_indices(p, slots, h, blk);
  const int64_t o_base = out_base();

  // ---- 2. l2norm: the lanes of a column group hold all of Dk between them
  GDN_MARK(16);
  const float kq = l2_normalize<kReduceLow, kReduceSpan>(p, lane, qh, kh);
  GDN_MARK(3);
  if constexpr (kDirect)
    cluster_wait();  // every block's outputs' mbarrier is ready for the pushes
  else if constexpr (kFused)
    fused_mid<IO>(p, grp, slots, sm);
  else if constexpr (kStepNorm) {
    if (csize > 1) cluster_wait();  // as kDirect
  }
  GDN_MARK(4);
  // ---- 3. the warp's items, the next ones in flight (the ring's kStages - 1,
  // or one in registers) while one computes
  for (int stage = 0;; stage = stage + 1 == kStages ? 0 : stage + 1) {
    const bool has_next = item + 1 < item_end;
#if GDN_VK_RING
    issue_item(item + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
#endif
    VLoad v_next;
    if (has_next) load_v((item + 1) * kColsPerItem, v_next);
    V s[kOuter][kInner];
    fetch_item(item, stage, s);
    GDN_MARK(5);

    const int j0 = item * kColsPerItem;
    // The state element (held row r, held column c):
    auto elem = [&](int r, int c) -> float { return Elem<T>::to_float(s[c][r / kVec].x[r % kVec]); };
    // delta of every held column, and o[j0 + cols[out_c]] (one pass, see
    // OnePass), from the partial sums over the lane's rows of S^T k_hat
    // (value 2c) and S^T q_hat (2c + 1) of held column c
    float delta[kColsHeld];
    const float o_val = Pass::run(
        [&](int v) {
          const float* w = (v & 1) ? qh : kh;
          float a = 0.0f;
#pragma unroll
          for (int r = 0; r < kRowsHeld; ++r) a += elem(r, v / 2) * w[r];
          return a;
        },
        vj, decay, beta, kq, scale, lane, delta);
    GDN_MARK(17);
    // S' = exp(g) S + k_hat delta
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int ci = 0; ci < kInner; ++ci) {
        V n;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int r = ci * kVec + e;
          n.x[e] = Elem<T>::from_float(decay * elem(r, o) + kh[r] * delta[o]);
        }
        const int i = vec_row(o, ci), j = vec_col(o, j0);
        if (slots.write && i < Dk && j < Dv)
          store_state16<(kHints & 1) != 0>(reinterpret_cast<V*>(s_out + vec_off(i, j)), n);
      }
    if (writer && j0 + out_col < Dv) {
      if (kFused && p.norm_weight != nullptr) {
        fused_emit(sm, grp, g * Dv + j0 + out_col, o_val);  // normalized in the epilogue
      } else if (kStepNorm) {
        // raw, into every block of the head (normalized at the end)
        if (csize > 1)
          push_to_cluster(&step_out[j0 + out_col], &step_bar, csize, o_val);
        else
          step_out[j0 + out_col] = o_val;
      } else {
        with_dtype<IO>(p.o_dtype, [&](auto tag) {
          using E = decltype(tag);
          static_cast<E*>(p.o)[o_base + j0 + out_col] = Elem<E>::from_float(o_val);
        });
      }
    }

    if (!has_next) break;
    ++item;
    vj = convert_v(v_next);
  }
  GDN_MARK(6);
  if constexpr (kDirect) {
    const float zw[2] = {silu(z_pre.value()), w_pre.value()};
    fused_finish<IO>(p, grp, sm, zw);
  } else if constexpr (kFused) {
    fused_finish<IO>(p, grp, sm);
  } else if constexpr (kStepNorm) {
    step_norm_finish(p, step_out, Dv, j_own, n_own, o_base, csize, &step_bar, w_pre, z_pre);
  }
  GDN_MARK(8);
}

// The step's entry point: KernelParams after the launch's scalars, so that
// what a block reads before its loads takes 3 constant lines (KernelParams).
// (group_heads, warps_per_head, cluster and fdiv are the fused kernels'.)
// kNorm: the norm alone as its epilogue (decode_vk's kStepNorm).
template <typename T, Layout kLayout, int kDk, int kP, typename IO, int kHints, bool kNorm = false>
__global__ void __launch_bounds__(8 * kWarp, (vk_min_blocks<T, false>()))
    decode_vk_step_kernel(int items_per_head, int items_per_warp, FastDiv by_blocks_per_head, FastDiv by_hv,
                          FastDiv by_head_map, bool small_loads_first, const __grid_constant__ KernelParams p,
                          float scale) {
  decode_vk<T, kLayout, kDk, kP, IO, false, false, kHints, kNorm>(p, items_per_head, items_per_warp,
                                                                  by_blocks_per_head, by_hv, by_head_map,
                                                                  small_loads_first, scale, 1, 1, 1, FusedArgs{});
}
// The fused kernels' entry point (same parameter order as the step's).
// kPdl: a programmatic launch's (start_fused_loads).
template <typename T, Layout kLayout, int kDk, int kP, typename IO, bool kNormOnly, bool kPdl = false>
__global__ void __launch_bounds__(8 * kWarp, (vk_min_blocks<T, true>()))
    decode_vk_fused_kernel(int items_per_head, int items_per_warp, FastDiv by_blocks_per_head, FastDiv by_hv,
                           FastDiv by_head_map, bool small_loads_first, const __grid_constant__ KernelParams p,
                           float scale, int group_heads, int warps_per_head, int cluster, FusedArgs fdiv) {
  decode_vk<T, kLayout, kDk, kP, IO, true, kNormOnly, kFusedL2Hints, false, kPdl>(
      p, items_per_head, items_per_warp, by_blocks_per_head, by_hv, by_head_map, small_loads_first, scale, group_heads,
      warps_per_head, cluster, fdiv);
}

#if GDN_VK_WAVE
// ---- vk, the engines' call in one wave (Launch::wave) ---------------------
// The serving engines' call at small B: q/k/v/a/b/o in one dtype with packed
// heads, raw gates, the interleaved head map, Dk = Dv = 128, dense or
// through a pool, plain or programmatic, and a grid whose every item has a
// resident warp from the start (Qwen3.5's shape: B = 1 at either state
// dtype, B = 8 for 16-bit states). The step is then one round of memory
// latency, and the general kernel's machinery only lengthens it: its copies
// through shared memory, a block's worth of coordinates, 64-bit strides,
// the runtime gate and head-map modes and a 5-line parameter block (80
// registers for 16-bit states: 24 warps an SM, so bf16 B = 8 ran in two
// rounds). Here each warp
// computes its one item with the state loaded straight into registers, no
// shared memory, no barrier, 64 registers at most, from the few parameters
// below. The item, the rows and columns a lane holds, and every sum
// (l2_normalize, OnePass) and expression are decode_vk's, so the results
// are its bits: batch invariance holds across the switch
// (tests/test_invariance.cpp runs rows alone here against batches of 600 in
// the ring kernel, dense and through a pool). A round earlier, one kernel
// of this form with every option of the step (strides, modes) was 7%
// slower than the ring at B = 1 (bench/RESULTS.md, round 34); this one's
// measurement: round 35.
//
// What a block reads before its loads, in the order it reads it (3 constant
// lines); a row's offsets are 32-bit, which plan_launch checks.
struct WaveParams {
  unsigned items;     // B * Hv * items a head: warps past it return
  FastDiv by_hv;      // head (b * Hv + h) -> b; by_hv.d = Hv
  FastDiv by_group;   // h -> hk = h / G (the interleaved head map)
  int32_t q_batch_stride, k_batch_stride, v_batch_stride, a_batch_stride, b_batch_stride;
  // (kIndexed) the pool's slots, as DecodeParams
  IndexType index_dtype;
  int64_t num_slots;
  void const* state_indices;
  void const* state_out_indices;
  int64_t state_slot_stride;
  void const* q;
  void const* k;
  void const* v;
  void const* a;
  void const* b;
  float const* A_log;
  float const* dt_bias;
  void* state;
  // after the loads are in flight
  L2Norm l2norm;
  float l2norm_eps;
  float scale;
  int32_t o_batch_stride;
  void* o;
  uint32_t* invalid_index_count;  // (kIndexed)
};

// Grid: warp gw = blockIdx.x * W + warp is item gw % kItems of head
// gw / kItems = b * Hv + h.
// kIndexed: through the pool's slot indices (padding rows, out-of-range
// indices counted, a separate write slot), as decode_vk; else row b in slot b.
// kPdl: a programmatic launch's (sm_90): the state's loads go out first,
// then the wait for the previous kernel, and only then the inputs are read
// and anything is written (DecodeParams::programmatic_launch).
template <typename T, typename IO, int kHints, bool kIndexed, bool kPdl>
__global__ void __launch_bounds__(8 * kWarp, 4) decode_vk_wave_kernel(const __grid_constant__ WaveParams p) {
  constexpr int kD = 128;
  using VkT = VkTile<T, kD, default_tile_param<T, Layout::kVK>()>;
  static_assert(VkT::kChunksPerLane == 1, "one-wave kernel: a lane holds one 16-byte chunk of a column");
  constexpr int kVec = VkT::kVec;
  constexpr int kOuter = VkT::kUnroll;     // columns a lane holds
  constexpr int kSpan = VkT::kLanesPerCol;  // lanes that hold a column's Dk rows
  constexpr int kStep = VkT::kColsPerStep;  // columns a warp instruction covers
  constexpr int kItems = kD / VkT::kColsPerItem;
  using Pass = OnePass<1, kSpan, kOuter>;
  const int lane = int(threadIdx.x) % kWarp;
  const unsigned gw = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (gw >= p.items) return;
  const unsigned head = gw / kItems;
  const int j0 = int(gw % kItems) * VkT::kColsPerItem;
  const unsigned b = p.by_hv.div(head);
  const int h = int(head - b * p.by_hv.d);
  const int hk = int(p.by_group.div(unsigned(h)));
  // The row's slots (decode_vk's order: the index before every other load).
  int64_t s_in = b, s_out = b;
  bool write = true;
  unsigned bad = 0;
  if constexpr (kIndexed) {
    const RowSlots r = row_slots(p, int64_t(b));
    s_in = r.s_in;
    s_out = r.s_out;
    write = r.write;
    bad = r.bad;
  }
  // Each out-of-range index of a row counted once: by lane 0 of the warp with
  // head 0's first item.
  auto count_bad = [&] {
    if (kIndexed && bad != 0 && h == 0 && j0 == 0 && lane == 0 && p.invalid_index_count != nullptr)
      atomicAdd(p.invalid_index_count, bad);
  };
  if (kIndexed && (s_in < 0 || s_in >= p.num_slots)) {
    // Padding row: zero the item's outputs, touch no state.
    if constexpr (kPdl) wait_upstream();
    count_bad();
    if (lane < VkT::kColsPerItem)
      static_cast<IO*>(p.o)[int(b) * p.o_batch_stride + h * kD + j0 + lane] = Elem<IO>::from_float(0.0f);
    return;
  }
  // (before the loads, where decode_vk counts after them: so measured, round 35)
  if constexpr (!kPdl) count_bad();
  // Held row r = col_lane * kVec + e, held column o = j0 + o * kStep +
  // step_col; the lane's output column out_col (decode_vk's numbering).
  const int col_lane = lane % kSpan, step_col = lane / kSpan;
  const int out_col = Pass::col(lane) * kStep + step_col;
  // Element (i, j) of a head lies at j * Dk + i: one address a lane, the
  // held columns at constant offsets from it.
  const int lane_off = h * kD * kD + (j0 + step_col) * kD + col_lane * kVec;
  // (dense: below 2^31, which plan_launch checks; a pool may be larger)
  const T* const s = static_cast<const T*>(p.state) +
                     (kIndexed ? s_in * p.state_slot_stride + lane_off
                               : int(b) * int(p.state_slot_stride) + lane_off);
  // (the write slot's address formed at the stores, from a 32-bit slot: a
  // 64-bit pointer fewer held through the sums)
  const unsigned w_slot = unsigned(s_out);
  // The small loads first (they are the longer path), as raw words; then
  // the state's, kept behind them by the fence. A programmatic launch
  // issues the state's before its wait instead: the inputs may still be
  // being written by the previous kernel.
  RawRun<IO, kVec> q_raw, k_raw;
  RawRun<IO, 1> v_raw, a_raw, b_raw;
  float A_log, dt_bias;
  auto load_small = [&] {
    q_raw.load(static_cast<const IO*>(p.q) + (int(b) * p.q_batch_stride + hk * kD + col_lane * kVec));
    k_raw.load(static_cast<const IO*>(p.k) + (int(b) * p.k_batch_stride + hk * kD + col_lane * kVec));
    v_raw.load(static_cast<const IO*>(p.v) + (int(b) * p.v_batch_stride + h * kD + j0 + out_col));
    a_raw.load(static_cast<const IO*>(p.a) + (int(b) * p.a_batch_stride + h));
    b_raw.load(static_cast<const IO*>(p.b) + (int(b) * p.b_batch_stride + h));
    A_log = p.A_log[h];
    dt_bias = p.dt_bias[h];
  };
  uint4 st[kOuter];
  auto load_state = [&] {
#pragma unroll
    for (int o = 0; o < kOuter; ++o) st[o] = *reinterpret_cast<const uint4*>(s + o * kStep * kD);
  };
  if constexpr (kPdl) {
    load_state();
    wait_upstream();
    count_bad();
    load_small();
  } else {
    load_small();
    issue_order_fence();
    load_state();
  }
  float qh[kVec], kh[kVec], x[1];
  q_raw.to_float(qh);
  k_raw.to_float(kh);
  // g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b) (finish_gates)
  a_raw.to_float(x);
  const float g = -expf(A_log) * softplus(x[0] + dt_bias);
  b_raw.to_float(x);
  const float beta = 1.0f / (1.0f + expf(-x[0]));
  const float decay = expf(g);
  const float kq = l2_normalize<1, kSpan>(p, lane, qh, kh);
  auto elem = [&](int r, int o) -> float { return Elem<T>::to_float(reinterpret_cast<const T*>(&st[o])[r]); };
  // delta of every held column and the lane's output, from the partial sums
  // over the lane's rows of S^T k_hat (value 2o) and S^T q_hat (2o + 1)
  float delta[kOuter];
  v_raw.to_float(x);
  const float o_val = Pass::run(
      [&](int v) {
        const float* w = (v & 1) ? qh : kh;
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < kVec; ++r) acc += elem(r, v / 2) * w[r];
        return acc;
      },
      x[0], decay, beta, kq, p.scale, lane, delta);
  // A 16-bit state's words are opaque to the compiler from here, so S' is
  // computed from them widened again (one instruction an element) rather
  // than from the floats the sums widened: those would stay live through
  // the sums, and through a pool (the write slot and the row's offset held
  // too) the 64 registers spilled 28-32 bytes. Same values, same bits;
  // bf16 through the benchmark's pool 3% faster at B = 8 and 1.7% at B = 1,
  // no change dense, where nothing spilled (H200, bench/RESULTS.md round 36).
  if constexpr (kIndexed && sizeof(T) == 2) {
#pragma unroll
    for (int o = 0; o < kOuter; ++o) asm volatile("" : "+r"(st[o].x), "+r"(st[o].y), "+r"(st[o].z), "+r"(st[o].w));
  }
  // S' = exp(g) S + k_hat delta
  if (write) {
    T* const s_w = kIndexed ? static_cast<T*>(p.state) + (int64_t(w_slot) * p.state_slot_stride + lane_off)
                            : const_cast<T*>(s);
#pragma unroll
    for (int o = 0; o < kOuter; ++o) {
      uint4 n;
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        reinterpret_cast<T*>(&n)[e] = Elem<T>::from_float(decay * elem(e, o) + kh[e] * delta[o]);
      store_state16<(kHints & 1) != 0>(reinterpret_cast<uint4*>(s_w + o * kStep * kD), n);
    }
  }
  if (Pass::writer(lane))
    static_cast<IO*>(p.o)[int(b) * p.o_batch_stride + h * kD + j0 + out_col] = Elem<IO>::from_float(o_val);
}
#endif

// ---- kv: a tile computed where it was copied (both kv kernels) -----------
// Ascending reduce-scatter over the lanes that hold a chunk's row groups (lane
// bits kOff = kW, 2 kW, ... below kWarp): at each offset the lane with the bit
// set keeps the upper half of its kN values, adds the partner's copy of
// them, and sends the other half; once one value is left the remaining
// offsets are plain butterflies. Row group bit 0 first, so a tile of any kW
// adds a column's row groups in one balanced tree (see KvRegTile).
template <int kN, int kOff, int kC>
__device__ __forceinline__ void reduce_halves_up(float (&x)[kC], int lane) {
  if constexpr (kOff < kWarp) {
    if constexpr (kN > 1) {
      halve<kN, kOff>(x, lane);
      reduce_halves_up<kN / 2, kOff * 2>(x, lane);
    } else {
      x[0] += warp_shfl_xor(x[0], kOff);
      reduce_halves_up<1, kOff * 2>(x, lane);
    }
  }
}

// Issue the loads of q and k of row b, k-head hk for both kv kernels: lane
// l of every warp rows l + kWarp n (a row past Dk reads row 0), raw (RawRun).
template <typename IO, int kRows, typename Params>
__device__ __forceinline__ void load_qk_rows(const Params& p, int64_t b, int hk, int lane, int Dk,
                                             IoRun<IO, 1> (&q_raw)[kRows], IoRun<IO, 1> (&k_raw)[kRows]) {
  const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
  const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const int i = lane + n * kWarp < Dk ? lane + n * kWarp : 0;
    q_raw[n].load(p.qkv_dtype, p.q, q_base + i);
    k_raw[n].load(p.qkv_dtype, p.k, k_base + i);
  }
}

// The kv tile of kW warps (KvTile's geometry) computed where it was
// copied: thread t holds chunk t % kW of rows rg + kWarp n (row group rg =
// t / kW), read back from its own ring slots (its own copies: no barrier).
// reduce() forms the partial sums S^T k_hat and S^T q_hat of the chunk's
// kVec columns over the thread's kRows rows, sums them over the row groups
// of its warp (shuffles) and posts them to shared memory (`part`); after a
// barrier one thread a column (tid < kCols) adds the kW warps' partials,
// forms delta and the output (emit(column, o)) and posts delta (`dl`);
// a second barrier ends reduce(). store() then reads the deltas of the
// thread's chunk and writes S' from its registers. The sum over a column's
// Dk rows is one balanced tree over the kWarp row groups (each group's
// kRows rows added in order first), row group bit 0 first: bits below
// log2(kWarp / kW) inside the warp, the rest across warps in the same
// pairwise order, so it does not depend on kW (the 4-warp tiles of
// one-round grids are bitwise the 8-warp tiles) nor on the tiles a block
// streams. Every thread of the block calls reduce() (it holds two barriers).
template <typename T, int kDk, int kW>
struct KvRegTile {
  using Tile = KvTile<T, kDk, kW>;
  using V = Vec<T>;
  static constexpr int kVec = V::kN, kRows = Tile::kRows, kCols = Tile::kCols, kThreads = Tile::kThreads;
  static constexpr int kSums = 2 * kVec;  // value c: S^T k_hat of column c; kVec + c: S^T q_hat
  // values a lane holds after the in-warp levels (kWarp / kW row groups a warp)
  static constexpr int kHeld = kSums * kW / kWarp > 0 ? kSums * kW / kWarp : 1;
  static constexpr int kPartFloats = kW * kW * kSums;  // [warp][chunk][value]
  static_assert(kCols <= kThreads, "one finishing thread a column");
  static_assert(kWarp / kW >= 2, "the first in-warp level forms the sums");

  // l2norm of q and k, which every warp's lanes hold between them (lane l
  // rows l + kWarp n, l2_normalize), then q_hat and k_hat of this thread's
  // own rows rg + kWarp n, from lane rg. Returns k_hat . q_hat.
  template <typename Params>
  static __device__ __forceinline__ float normalize(const Params& p, float (&qh)[kRows], float (&kh)[kRows],
                                                    float (&qr)[kRows], float (&kr)[kRows]) {
    const int tid = int(threadIdx.x), lane = tid % kWarp, rg = tid / kW;
    const float kq = l2_normalize<1, kWarp>(p, lane, qh, kh);
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      qr[n] = warp_shfl(qh[n], rg);
      kr[n] = warp_shfl(kh[n], rg);
    }
    return kq;
  }

  // Ring slot of the thread's chunk n in stage `stage`: [stage][n][thread],
  // consecutive threads 16 bytes apart (no bank conflicts).
  static __device__ __forceinline__ int slot(int stage, int n, int tid) { return (stage * kRows + n) * kThreads + tid; }

  // The thread's chunks of the tile in ring stage `stage`, once its copies
  // of it have landed (at most kPending later groups still in flight).
  template <int kPending>
  static __device__ __forceinline__ void fetch(const V* ring, int stage, V (&s)[kRows]) {
    async_wait<kPending>();
#pragma unroll
    for (int n = 0; n < kRows; ++n) s[n] = ring[slot(stage, n, int(threadIdx.x))];
  }

  // The thread's part of a tile's sums: partial sums over its rows, in row
  // order, then over its warp's row groups, posted to `part` (kPartFloats).
  static __device__ __forceinline__ void post(const V (&s)[kRows], const float (&qr)[kRows],
                                              const float (&kr)[kRows], float* part) {
    const int tid = int(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp, chunk = tid % kW;
    // Partial sums over the thread's rows, in row order, and at once the
    // first in-warp level (offset kW): the lane with that bit set keeps
    // S^T q_hat of each column and sends S^T k_hat, its partner the other
    // way round, so at most kVec + 2 sums are live.
    float x[kVec];
    const bool upper = (lane & kW) != 0;
#pragma unroll
    for (int c = 0; c < kVec; ++c) {
      float sk = 0.0f, sq = 0.0f;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const float sv = Elem<T>::to_float(s[n].x[c]);
        sk += sv * kr[n];
        sq += sv * qr[n];
      }
      x[c] = (upper ? sq : sk) + warp_shfl_xor(upper ? sk : sq, kW);
    }
    // The other in-warp levels; the lane then holds kHeld values from index
    // `first` (named by the halving levels' bits), and one lane of those
    // that share them (the plain levels' bits zero) posts them.
    reduce_halves_up<kVec, 2 * kW>(x, lane);
    int first = upper ? kVec : 0;
#pragma unroll
    for (int l = 1, n = kVec / 2; n >= kHeld && (kW << l) < kWarp; ++l, n /= 2)
      if (lane & (kW << l)) first += n;
    bool poster = true;
#pragma unroll
    for (int off = kW * (kSums / kHeld); off < kWarp; off *= 2) poster = poster && !(lane & off);
    if (poster) {
#pragma unroll
      for (int k = 0; k < kHeld; ++k) part[(warp * kW + chunk) * kSums + first + k] = x[k];
    }
  }

  // Column col of the tile (0 <= col < kCols; one thread a column), once
  // every thread's post() to `part` is visible: the warps' partials added
  // pairwise, warp bit 0 first (the tree goes on from the warp's levels);
  // delta posted to dl[col], the output to emit(col, o).
  template <typename Emit>
  static __device__ __forceinline__ void finish(int col, const float* part, float vj, float decay, float beta,
                                                float kq, float scale, float* dl, Emit&& emit) {
    // chunk fc, column fv of it
    const int fc = col / kVec, fv = col % kVec;
    float a[kW], e[kW];
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      a[w] = part[(w * kW + fc) * kSums + fv];
      e[w] = part[(w * kW + fc) * kSums + kVec + fv];
    }
#pragma unroll
    for (int st = 1; st < kW; st *= 2)
#pragma unroll
      for (int w = 0; w < kW; w += 2 * st) {
        a[w] += a[w + st];
        e[w] += e[w + st];
      }
    // delta = beta (v - exp(g) sk)
    const float d = beta * (vj - decay * a[0]);
    dl[col] = d;
    // o = scale (exp(g) sq + (k_hat . q_hat) delta)
    emit(col, scale * (decay * e[0] + kq * d));
  }

  // One tile: post(), a barrier, one thread a column finish()es it, a
  // second barrier (the deltas in dl are then visible to store()).
  template <typename Emit>
  static __device__ __forceinline__ void reduce(const V (&s)[kRows], const float (&qr)[kRows],
                                                const float (&kr)[kRows], float vj, float decay, float beta,
                                                float kq, float scale, float* part, float* dl, Emit&& emit) {
    post(s, qr, kr, part);
    __syncthreads();  // A: every warp's partial sums are posted
    if (int(threadIdx.x) < kCols) finish(int(threadIdx.x), part, vj, decay, beta, kq, scale, dl, emit);
    __syncthreads();  // B: the tile's deltas are posted
  }

  // S' = exp(g) S + k_hat delta of the thread's chunks (delta posted by
  // reduce() in `dl`), into a head's state at `head` (chunk column j; rows
  // past Dk and columns past Dv skipped); kEvictFirst: see store_state16.
  template <bool kEvictFirst = false>
  static __device__ __forceinline__ void store(const V (&s)[kRows], const float (&kr)[kRows], float decay,
                                               const float* dl, T* head, int j, int Dk, int Dv) {
    const int rg = int(threadIdx.x) / kW, chunk = int(threadIdx.x) % kW;
    float delta[kVec];
#pragma unroll
    for (int c = 0; c < kVec; ++c) delta[c] = dl[chunk * kVec + c];
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const int i = rg + n * kWarp;
      V nv;
#pragma unroll
      for (int c = 0; c < kVec; ++c)
        nv.x[c] = Elem<T>::from_float(decay * Elem<T>::to_float(s[n].x[c]) + kr[n] * delta[c]);
      if (i < Dk && j < Dv) store_state16<kEvictFirst>(reinterpret_cast<V*>(head + i * Dv + j), nv);
    }
  }
};

// kv layout, the fused middle (conv prologue or norm epilogue on; the step
// alone runs decode_kv_step_kernel below): a block of kW warps streams the
// [Dk x kCols] column tiles of its group (KvTile), each computed where it
// was copied (KvRegTile): the thread's own ring slots, two barriers a tile,
// S' stored from its registers. Hazards: a thread reads back only the ring
// slots it copied into, and refills a stage only after it has read it; the
// partial sums and deltas in shared memory are fenced by the tile's two
// barriers (KvRegTile::reduce). Every barrier is reached by all threads: the
// only early return (padding row) is uniform over the block.
// A group (row b, k-head hk) is `cluster` consecutive blocks
// (blockIdx = (b * Hk + hk) * cluster + rank; by_hv divides by Hk; cluster > 1
// only on sm_90) streaming the tiles T = g * tiles_per_head + tile of its G
// heads, tiles_per_block of them a block.
// (Fused blocks keep the 64-register budget: 128 registers, tried, lost
// 10-19% at B = 64 to the halved occupancy. With the prologue's loads two
// channels deep the MixedIO instantiations spill 64-124 bytes, the others at
// most 28.)
// kNormOnly: the instantiation for the norm alone in clusters (no prologue,
// as the vk kernel's; launched only there, so empty in sm_80 code).
// It reads DecodeParams itself, not KernelParams: this kernel reads a fused
// option (conv_width) and then q's address right before it issues q and k,
// and in KernelParams' order those are two lines missed one after the other
// (step + norm kv at B = 1 3-4% slower); in DecodeParams' they are not.
template <typename T, int kDk, int kW, typename IO, bool kNormOnly, bool kPdl = false>
__global__ void __launch_bounds__(kW * kWarp, kDk <= 128 ? 1024 / (kW * kWarp) : 1)
    decode_kv_fused_kernel(const __grid_constant__ DecodeParams p, int tiles_per_head, int tiles_per_block,
                           FastDiv by_hv, float scale, int group_heads, int cluster, FusedArgs fdiv) {
  // kPdl (a programmatic launch's, start_fused_loads): sm_90 code and
  // 16-bit inputs only, as the launch takes it
  if constexpr ((kNormOnly && !kClusterCode) || (kPdl && (!kClusterCode || !kPdlInputs<IO>))) {
#if !defined(GDN_HIP)
    __trap();
#endif
    return;
  }
  using R = KvRegTile<T, kDk, kW>;
  using V = Vec<T>;
  constexpr int kVec = R::kVec, kRows = R::kRows, kCols = R::kCols, kThreads = R::kThreads;
  constexpr int kStagesHere = kv_stages<T>();
  // dynamic: the ring, kStagesHere stages of [kRows][kThreads] chunks (kv_stages:
  // 3 for fp32, 96 KiB at Dk = 256), then the fused stages' floats
  extern __shared__ uint4 smem_raw[];
  V* const ring = reinterpret_cast<V*>(smem_raw);
  __shared__ float part[R::kPartFloats];
  __shared__ float dl[kCols];

  const int Dk = p.head_dim_k, Dv = p.head_dim_v;
  const FusedSmem sm(reinterpret_cast<float*>(ring + kStagesHere * kRows * kThreads), group_heads, Dk, Dv);
  const int tid = int(threadIdx.x), lane = tid % kWarp;
  // blockIdx = (b * Hk + hk) * cluster + rank; this block's tiles [t, t_end)
  // of the group's (never empty).
  const unsigned group = fdiv.cluster.div(blockIdx.x);
  const unsigned b32 = by_hv.div(group);
  const int64_t b = b32;
  const int hk = int(group - b32 * unsigned(p.num_k_heads));
  Group grp{b, hk, group_heads, int(blockIdx.x - group * unsigned(cluster)), cluster, 0, 0, 0, 0, fdiv.cluster,
            fdiv.vector_runs};
  const int blk = grp.rank;
  int t = grp.rank * tiles_per_block;
  const int t_end = min(group_heads * tiles_per_head, t + tiles_per_block);
  // The block's columns: from its first tile's first to its last tile's last.
  const int g_first = int(fdiv.per_head.div(unsigned(t))), g_last = int(fdiv.per_head.div(unsigned(t_end - 1)));
  grp.g_lo = g_first;
  grp.j_lo = (t - g_first * tiles_per_head) * kCols;
  grp.lo = g_first * Dv + grp.j_lo;
  grp.hi = g_last * Dv + min(Dv, (t_end - g_last * tiles_per_head) * kCols);

  const RowSlots slots = row_slots(p, b);
  count_bad_indices(p, slots, hk, blk);  // (at once: see decode_vk)
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    // Padding row (uniform over the block: no barrier is skipped by part of
    // it): zero the group's outputs, touch no state.
    zero_group_outputs(p, grp);
    return;
  }

  // This thread's chunk and row group (its rows: rg + kWarp n); 64-bit
  // arithmetic once per slot (and head), 32-bit offsets inside a head.
  const int chunk = tid % kW, rg = tid / kW;
  const T* s_in_slot = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride;
  T* s_out_slot = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride;
  // Tile T of the block: group member g, its head, and the tile within the head.
  struct Pos {
    int g, h, tile;
  };
  auto pos = [&](int tt) -> Pos {
    const int g = int(fdiv.per_head.div(unsigned(tt)));
    return Pos{g, group_head(p, hk, g, group_heads), tt - g * tiles_per_head};
  };
  auto head_off = [&](int h) { return int64_t(h) * Dk * Dv; };

  // Copy the thread's chunks of tile tt into ring stage `stage` (zeros past
  // Dk or Dv: a chunk starts at a multiple of kVec, which divides Dv, so it
  // is all in or all out), nothing past the block's last tile, and close the
  // group either way so group k is the block's tile k.
  auto issue_tile = [&](int tt, int stage) {
    if (tt < t_end) {
      const Pos q = pos(tt);
      const T* src = s_in_slot + head_off(q.h);
      const int j = q.tile * kCols + chunk * kVec;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const int i = rg + n * kWarp;
        const bool in = i < Dk && j < Dv;
        copy16_async(ring + R::slot(stage, n, tid), in ? src + i * Dv + j : src, in);
      }
    }
    async_commit();
  };
  // v[j] for the finishing thread's column j = tile * kCols + tid of tile tt
  // (tid < kCols; 0 past Dv), in two steps (see RawRun): load_v issues the
  // load (a column past Dv reads the head's first element instead),
  // convert_v makes the value. (Conv on: the conv output of the prologue.)
  const bool finisher = tid < kCols;
  struct VLoad {
    IoRun<IO, 1> run;
    int tt;
  };
  auto load_v = [&](int tt, VLoad& l) {
    l.tt = tt;
    if (p.conv_width > 0 || !finisher) return;
    const Pos q = pos(tt);
    const int j = q.tile * kCols + tid;
    l.run.load(p.qkv_dtype, p.v, b * p.v_batch_stride + int64_t(q.h) * p.v_head_stride + (j < Dv ? j : 0));
  };
  auto convert_v = [&](const VLoad& l) -> float {
    const Pos q = pos(l.tt);
    const int j = q.tile * kCols + tid;
    if (!finisher) return 0.0f;
    if (p.conv_width > 0) return j < Dv ? sm.vo[q.g * Dv + j] : 0.0f;
    return l.run.value(j < Dv);
  };

  // ---- 1. the first kStagesHere - 1 tiles' state and v, q, k: the prologue's
  // loads first, then the state's (start_fused_loads; a programmatic launch
  // issues the state's before the wait, and the rest once the previous
  // kernel is done). The gates come from the prologue.
  auto issue_state = [&] {
#pragma unroll
    for (int st = 0; st < kStagesHere - 1; ++st) issue_tile(t + st, st);
  };
  // The token's small loads, all issued before any is used (RawRun): v of
  // the first tile, q and k rows (a row past Dk reads row 0); with the conv
  // on, they come from the prologue.
  VLoad v_first;
  IoRun<IO, 1> q_raw[kRows], k_raw[kRows];
  const bool qk_global = p.conv_width == 0;
  auto issue_small = [&] {
    load_v(t, v_first);
    if (qk_global) load_qk_rows<IO>(p, b, hk, lane, Dk, q_raw, k_raw);
  };
  GDN_MARK(0);
  // The norm alone in a cluster (kNormOnly, as the vk kernel's): no
  // prologue. Every thread loads q, k and the gates of the block's one head,
  // the finishing threads v, each thread the z and norm_weight of its own
  // output column, then the state; the gates stay in registers. (The same
  // sequence as decode_kernel's, written out in each kernel: one shared
  // helper moved the head's index arithmetic ahead of the first loads and
  // cost the 16-bit-state rows 1-1.3% at B = 1 and 8; H200, 2026-12-01.)
  constexpr bool kDirect = kNormOnly && kClusterCode && !std::is_same<IO, MixedIO>::value;
  IoRun<IO, 1> z_pre, w_pre;  // silu(z) and norm_weight of the thread's column lo + tid (fused_finish)
  float head_decay = 0.0f, head_beta = 0.0f;
  if constexpr (kDirect) {
    fused_begin(p, grp, sm);
    if (p.programmatic_launch) {
      // The warp syncs first. ptxas issues thread 0's mbarrier.init
      // (fused_begin) as one warp-wide instruction on uniform registers
      // (SYNCS.EXCH.64, sm_90), which racecheck counts as a write by every
      // lane of warp 0, and thread 0's own arrive on that mbarrier
      // (fused_arrive) as a read racing with it unless a warp-level sync
      // stands between them. The plain order has its issue_order_fence
      // there; this one had none: 3 racecheck warnings, in both layouts,
      // results right (H200, 2026-12-03, bench/RESULTS.md round 29). The
      // same sync in fused_begin, for every fused kernel, cost the fused
      // middle 0.8-1.5% in 6 of its 8 rows at B = 1 and 8 (round 29): only
      // this order has it.
      issue_order_fence();
      issue_state();
    }
    wait_upstream();
    GDN_MARK(1);
    issue_small();
    const int h_lo = group_head(p, hk, grp.g_lo, group_heads);
    const GateInputs<IO> gin = load_gate_inputs<IO>(p, b, h_lo);
    const int col = tid < grp.hi - grp.lo ? tid : 0;
    z_pre.load(p.qkv_dtype, p.z, b * p.z_batch_stride + int64_t(h_lo) * p.z_head_stride + grp.j_lo + col);
    w_pre.load(p.qkv_dtype, p.norm_weight, grp.j_lo + col);
    GDN_MARK(9);
    if (!p.programmatic_launch) {
      issue_order_fence();
      issue_state();
    }
    GDN_MARK(10);
    const Gates gates = finish_gates(p, gin);
    head_decay = gates.decay;
    head_beta = gates.beta;
    fused_arrive(p, grp, sm);  // (no conv windows: only the outputs' mbarrier)
    GDN_MARK(13);
  } else {
    start_fused_loads<IO, prologue_run<Layout::kKV>(), true, kPdl>(p, grp, slots, sm, issue_state, issue_small);
  }
  // ... then the values.
  float vj = convert_v(v_first);
  float qh[kRows], kh[kRows];
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const int i = lane + n * kWarp;
    if (qk_global) {
      qh[n] = q_raw[n].value(i < Dk);
      kh[n] = k_raw[n].value(i < Dk);
    } else {
      // the conv output of the group prologue
      qh[n] = i < Dk ? sm.qk[i] : 0.0f;
      kh[n] = i < Dk ? sm.qk[Dk + i] : 0.0f;
    }
  }

  // ---- 2. l2norm, q_hat and k_hat of the thread's rows (KvRegTile::normalize)
  float qr[kRows], kr[kRows];
  GDN_MARK(16);
  const float kq = R::normalize(p, qh, kh, qr, kr);
  GDN_MARK(3);
  if constexpr (kDirect)
    cluster_wait();  // every block's outputs' mbarrier is ready for the pushes
  else
    fused_mid<IO>(p, grp, slots, sm);
  GDN_MARK(4);
  // ---- 3. the block's tiles, kStagesHere - 1 of them in flight while one is reduced
  for (int stage = 0;; stage = stage + 1 == kStagesHere ? 0 : stage + 1) {
    const bool has_next = t + 1 < t_end;
    const Pos cur = pos(t);
    const float decay = kDirect ? head_decay : sm.decay[cur.g], beta = kDirect ? head_beta : sm.beta[cur.g];
    // Stage stage - 1 held the previous tile, which this thread has read.
    issue_tile(t + kStagesHere - 1, stage == 0 ? kStagesHere - 1 : stage - 1);
    VLoad v_next;
    if (has_next) load_v(t + 1, v_next);
    V s[kRows];
    R::template fetch<kStagesHere - 1>(ring, stage, s);  // this thread's chunks of tile t
    GDN_MARK(5);
    const int jt = cur.tile * kCols;
    R::reduce(s, qr, kr, vj, decay, beta, kq, scale, part, dl,
              [&](int col, float o_val) {
                const int jo = jt + col;
                if (jo >= Dv) return;
                if (p.norm_weight != nullptr) {
                  fused_emit(sm, grp, cur.g * Dv + jo, o_val);  // normalized in the epilogue
                } else {
                  const int64_t o_base = b * p.o_batch_stride + int64_t(cur.h) * p.o_head_stride;
                  with_dtype<IO>(p.o_dtype, [&](auto tag) {
                    using E = decltype(tag);
                    static_cast<E*>(p.o)[o_base + jo] = Elem<E>::from_float(o_val);
                  });
                }
              });
    GDN_MARK(17);
    if (slots.write) {
      // S read back from the ring (its stage is refilled only next tile):
      // its registers are free across the reduction (kept, the bf16 kernel
      // spilled 48 bytes more).
      V s2[kRows];
#pragma unroll
      for (int n = 0; n < kRows; ++n) s2[n] = ring[R::slot(stage, n, tid)];
      R::template store<(kFusedL2Hints & kL2EvictFirst) != 0>(s2, kr, decay, dl, s_out_slot + head_off(cur.h),
                                                              jt + chunk * kVec, Dk, Dv);
    }
    if (!has_next) break;
    ++t;
    vj = convert_v(v_next);
  }
  GDN_MARK(6);
  if constexpr (kDirect) {
    const float zw[2] = {silu(z_pre.value()), w_pre.value()};
    fused_finish<IO>(p, grp, sm, zw);
  } else {
    fused_finish<IO>(p, grp, sm);
  }
  GDN_MARK(8);
}

// ---- kv, the step ------------------------------------------------------------
// Blocks of the kv step an SM must hold (its register budget): 1024 threads
// up to Dk = 128 (64 registers), 2 blocks at Dk = 256, where a 16-bit tile
// took 168 registers and ran one block an SM; at 128 it spills nothing and
// bf16 at Dk = 256 went from 1.26x to 1.16x the copy floor at B = 32, 1.10x
// to 1.04x at B = 512 (bench/RESULTS.md round 18; fp32, limited by its
// 96 KiB ring to 2 blocks anyway, unchanged).
template <int kDk, int kW>
constexpr int kv_step_min_blocks() {
  return kDk <= 128 ? 1024 / (kW * kWarp) : 2;
}

// kv step (no prologue or epilogue): a block of kW warps owns a tile of kW
// 16-byte chunks of every row (KvTile), computed where it was copied
// (KvRegTile): thread t copies chunk t % kW of rows t / kW + kWarp n (a warp
// instruction covers whole 128-byte row segments at kW = 8) into its own
// slots of a shared-memory ring (cp.async: the next tile in flight without
// registers), reads them back once they land and keeps them in registers
// through the tile's two barriers, then stores S' from them. Against the
// fused kernel's transposition (decode_kv_fused_kernel: a warp a chunk, S'
// written back, the block storing rows) the state crosses shared memory once,
// not four times, and only 2 kVec partial sums a thread are exchanged.
// A block streams tiles [t, t_end) of its head, kv_step_stages - 1 of them
// in flight while one is reduced; a block of exactly two tiles, both in
// flight from the start (3 stages: fp32, and 16-bit states at Dk <= 64),
// reduces them together (the pair path below). kHints: the L2 policies on
// the state's traffic (step_l2_hints; 0 in the first instantiation).
// kNorm (the gated RMSNorm alone, sm_90, Launch::step_norm): the same
// geometry, the blocks of a head a cluster (one block: no cluster). Each
// output goes raw into every block of the cluster (st.async, counted on
// that block's mbarrier); once all Dv of the head have landed, each warp
// that owns some of the block's columns forms the head's sum of squares in
// the one fixed order (head_sum_squares: the fused kernels' bits) and the
// block writes its own columns normalized. Only a head's blocks wait for
// each other, and the tile is the step's (B = 1: 4-warp tiles).
template <typename T, int kDk, int kW, typename IO, int kHints, bool kNorm = false>
__global__ void __launch_bounds__(kW * kWarp, (kv_step_min_blocks<kDk, kW>()))
    decode_kv_step_kernel(int tiles_per_head, int tiles_per_block, FastDiv by_blocks_per_head, FastDiv by_hv,
                          FastDiv by_head_map, bool small_loads_first, const __grid_constant__ KernelParams p,
                          float scale) {
  // kNorm: taken by the launch only from sm_90 code (Launch::step_norm), so
  // left empty elsewhere
  if constexpr (kNorm && !kClusterCode) {
#if !defined(GDN_HIP)
    __trap();
#endif
    return;
  }
  using R = KvRegTile<T, kDk, kW>;
  using V = Vec<T>;
  constexpr int kVec = R::kVec, kRows = R::kRows, kCols = R::kCols, kThreads = R::kThreads;
  constexpr int kStagesHere = kv_step_stages<T, kDk>();
  // dynamic: the ring, kStagesHere stages of [kRows][kThreads] chunks
  extern __shared__ uint4 smem_raw[];
  V* const ring = reinterpret_cast<V*>(smem_raw);
  // partial sums and deltas: one tile's, or two (a pair, below)
  constexpr int kTilesAtOnce = kStagesHere >= 3 ? 2 : 1;
  __shared__ float part[kTilesAtOnce * R::kPartFloats];
  __shared__ float dl[kTilesAtOnce * kCols];
  // kNorm: the head's raw outputs and the mbarrier that counts their bytes
  __shared__ float head_out[kNorm ? kMaxHeadDim : 1];
  __shared__ unsigned long long out_bar;

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int tid = int(threadIdx.x), lane = tid % kWarp;
  // blockIdx = (b * Hv + h) * blocks_per_head + blk, as in decode_kernel;
  // this block's tiles [t, t_end): never empty.
  const unsigned row_head = by_blocks_per_head.div(blockIdx.x);
  const int blk = int(blockIdx.x - row_head * by_blocks_per_head.d);
  const unsigned b32 = by_hv.div(row_head);
  const int h = int(row_head - b32 * unsigned(Hv));
  const int64_t b = b32;
  // (The output's offset b * o_batch_stride + h * o_head_stride is formed
  // where each path stores, not once here: held through the tiles, the
  // 64-bit value made 16-bit tiles of the HIP path spill; round 32.)
  int t = blk * tiles_per_block;
  const int t_end = min(tiles_per_head, t + tiles_per_block);

  const RowSlots slots = row_slots(p, b);
  // kNorm: the blocks of the head (the cluster), and this block's output
  // columns [j_own, j_own + n_own) (at most one a thread: plan_launch)
  const int csize = kNorm ? int(by_blocks_per_head.d) : 1;
  const int j_own = t * kCols, n_own = min(Dv, t_end * kCols) - j_own;
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    count_bad_indices(p, slots, h, blk);
    // Padding row (uniform over the block): zero this block's outputs, touch no state.
    const int64_t o_base = b * p.o_batch_stride + int64_t(h) * p.o_head_stride;
    const int j_end = min(Dv, t_end * kCols);
    for (int j = t * kCols + tid; j < j_end; j += kThreads) store_any(p.o, p.o_dtype, o_base + j, 0.0f);
    return;
  }

  // This thread's chunk and row group (its rows: rg + kWarp n); 64-bit
  // arithmetic once per slot and head, 32-bit offsets inside a head.
  const int chunk = tid % kW, rg = tid / kW;
  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  // Copy the thread's chunks of tile tt into ring stage `stage` (zeros past
  // Dk or Dv: a chunk starts at a multiple of kVec, which divides Dv, so it
  // is all in or all out), nothing past the block's last tile, and close
  // the group either way so group k is the block's tile k.
  auto issue_tile = [&](int tt, int stage) {
    if (tt < t_end) {
      const int j = tt * kCols + chunk * kVec;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const int i = rg + n * kWarp;
        const bool in = i < Dk && j < Dv;
        copy16_async<(kHints & 2) != 0>(ring + R::slot(stage, n, tid), in ? s_in + i * Dv + j : s_in, in);
      }
    }
    async_commit();
  };
  // A block of exactly two tiles with both in flight from the start (fp32
  // states at B = 8: kStagesHere = 3) reduces them together (below).
  const bool pair = kTilesAtOnce == 2 && t_end - t == 2;
  // The finishing thread of column tid (tid < kCols; with a pair, of column
  // tid - kCols of the second tile too, tid < 2 kCols: the same offset from
  // the first tile's start) loads its v (two steps, see RawRun).
  const bool finisher = tid < (pair ? 2 : 1) * kCols;
  auto load_v = [&](int tt, IoRun<IO, 1>& run) {
    const int j = tt * kCols + tid;
    if (finisher) run.load(p.qkv_dtype, p.v, b * p.v_batch_stride + int64_t(h) * p.v_head_stride + (j < Dv ? j : 0));
  };

  // ---- 1. the first kStagesHere - 1 tiles' state, and v, q, k and the gates
  // (the order as decode_kernel: start_step_loads)
  auto issue_state = [&] {
#pragma unroll
    for (int st = 0; st < kStagesHere - 1; ++st) issue_tile(t + st, st);
  };
  IoRun<IO, 1> v_run, q_raw[kRows], k_raw[kRows];
  GateInputs<IO> gate_in;
  IoRun<IO, 1> z_pre, w_pre;  // kNorm: z and norm_weight of the thread's own column
  auto issue_small = [&] {
    load_v(t, v_run);
    const unsigned hq = by_head_map.div(unsigned(h));
    const int hk = p.head_map == HeadMap::kInterleaved ? int(hq) : h - int(hq) * p.num_k_heads;
    load_qk_rows<IO>(p, b, hk, lane, Dk, q_raw, k_raw);
    gate_in = load_gate_inputs<IO>(p, b, h);
    if constexpr (kNorm) {
      const int col = j_own + (tid < n_own ? tid : 0);
      z_pre.load(p.qkv_dtype, p.z, b * p.z_batch_stride + int64_t(h) * p.z_head_stride + col);
      w_pre.load(p.qkv_dtype, p.norm_weight, col);
    }
  };
  GDN_MARK(0);
  if constexpr (kNorm) {
    // The mbarrier expects the head's Dv outputs (peers' pushes may land
    // before this arrival), and is ready for them once the cluster barrier
    // below completes.
    if (csize > 1) {
      if (tid == 0) {
        outputs_barrier_init(&out_bar);
        outputs_expect(&out_bar, unsigned(sizeof(float)) * unsigned(Dv));
      }
      cluster_arrive_relaxed();
    }
  }
  start_step_loads(p, small_loads_first, issue_state, issue_small);
  count_bad_indices(p, slots, h, blk);  // (the loads are out)
  float vj = v_run.value(finisher);
  float qh[kRows], kh[kRows];
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const int i = lane + n * kWarp;
    qh[n] = q_raw[n].value(i < Dk);
    kh[n] = k_raw[n].value(i < Dk);
  }
  const Gates gates = finish_gates(p, gate_in);

  // ---- 2. l2norm, q_hat and k_hat of the thread's rows (KvRegTile::normalize)
  float qr[kRows], kr[kRows];
  const float kq = R::normalize(p, qh, kh, qr, kr);
  GDN_MARK(3);
  if constexpr (kNorm) {
    if (csize > 1) cluster_wait();  // every block's mbarrier is ready for the pushes
  }

  // o[jt + col] of the block's head (nothing past Dv); kNorm: raw, into
  // every block of the head
  auto emit_at = [&](int jt) {
    return [&, jt](int col, float o_val) {
      if (jt + col >= Dv) return;
      if constexpr (kNorm) {
        if (csize > 1)
          push_to_cluster(&head_out[jt + col], &out_bar, csize, o_val);
        else
          head_out[jt + col] = o_val;
        return;
      }
      const int64_t o_base = b * p.o_batch_stride + int64_t(h) * p.o_head_stride;
      with_dtype<IO>(p.o_dtype, [&](auto tag) {
        using E = decltype(tag);
        static_cast<E*>(p.o)[o_base + jt + col] = Elem<E>::from_float(o_val);
      });
    };
  };
  // kNorm, after the block's tiles: the gated RMSNorm of the block's own
  // columns once the head's Dv outputs are in (step_norm_finish).
  auto norm_epilogue = [&] {
    if constexpr (kNorm)
      step_norm_finish(p, head_out, Dv, j_own, n_own, b * p.o_batch_stride + int64_t(h) * p.o_head_stride, csize,
                       &out_bar, w_pre, z_pre);
  };
  if constexpr (kTilesAtOnce == 2) {
    if (pair) {
      // ---- 3'. two tiles, both copied into stages 0 and 1 by issue_state:
      // each posts its partial sums to its own half of `part`, then one
      // barrier, threads k kCols + c finish column c of tile t + k, a second
      // barrier, and S' of both is stored (tile t read back from its stage:
      // its registers are free while tile t + 1's sums are formed). Two
      // barriers for the block instead of four, and no warp waits at a
      // barrier while one thread a column finishes the first tile (fp32
      // B = 8: 11.05 -> 10.47 us, bench/RESULTS.md round 10). The sums are
      // those of the loop below, bit for bit.
      static_assert(2 * kCols <= kThreads, "a finishing thread a column of both tiles");
      V s[kRows];
      R::template fetch<1>(ring, 0, s);
      R::post(s, qr, kr, part);
      R::template fetch<0>(ring, 1, s);
      GDN_MARK(5);
      R::post(s, qr, kr, part + R::kPartFloats);
      __syncthreads();  // both tiles' partial sums are posted
      if (finisher) {
        const int k = tid / kCols;
        R::finish(tid % kCols, part + k * R::kPartFloats, vj, gates.decay, gates.beta, kq, scale, dl + k * kCols,
                  emit_at((t + k) * kCols));
      }
      __syncthreads();  // both tiles' deltas are posted
      if (slots.write) {
        V s0[kRows];
#pragma unroll
        for (int n = 0; n < kRows; ++n) s0[n] = ring[R::slot(0, n, tid)];
        R::template store<(kHints & 1) != 0>(s0, kr, gates.decay, dl, s_out, t * kCols + chunk * kVec, Dk, Dv);
        R::template store<(kHints & 1) != 0>(s, kr, gates.decay, dl + kCols, s_out, (t + 1) * kCols + chunk * kVec, Dk,
                                             Dv);
      }
      GDN_MARK(6);
      norm_epilogue();
      GDN_MARK(8);
      return;
    }
  }
  // ---- 3. the block's tiles, kStagesHere - 1 of them in flight while one is reduced
  for (int stage = 0;; stage = stage + 1 == kStagesHere ? 0 : stage + 1) {
    const bool has_next = t + 1 < t_end;
    // Stage stage - 1 held the previous tile, which this thread has read.
    issue_tile(t + kStagesHere - 1, stage == 0 ? kStagesHere - 1 : stage - 1);
    IoRun<IO, 1> v_next;
    if (has_next) load_v(t + 1, v_next);
    V s[kRows];
    R::template fetch<kStagesHere - 1>(ring, stage, s);  // this thread's chunks of tile t
    GDN_MARK(5);
    const int jt = t * kCols;
    R::reduce(s, qr, kr, vj, gates.decay, gates.beta, kq, scale, part, dl, emit_at(jt));
    if (slots.write) R::template store<(kHints & 1) != 0>(s, kr, gates.decay, dl, s_out, jt + chunk * kVec, Dk, Dv);
    if (!has_next) break;
    ++t;
    vj = v_next.value(finisher);
  }
  GDN_MARK(6);
  norm_epilogue();
  GDN_MARK(8);
}

// Dynamic shared memory of the kv step kernel: its ring.
template <typename T, int kDk, int kW>
constexpr size_t kv_step_smem_bytes() {
  return size_t(kv_step_stages<T, kDk>()) * KvTile<T, kDk, kW>::kRows * KvTile<T, kDk, kW>::kThreads * 16;
}

// Dynamic shared memory of a block: the ring (vk: kStages items per warp; kv:
// kv_stages tiles per block).
template <typename T, Layout kLayout, int kDk, int kP>
constexpr size_t smem_bytes(int warps_per_block) {
  if constexpr (kLayout == Layout::kKV)
    return size_t(kv_stages<T>()) * KvTile<T, kDk, kP>::kRows * KvTile<T, kDk, kP>::kThreads * 16;
#if GDN_VK_RING
  else
    return size_t(warps_per_block) * kStages * kWarp * 16 *
           (VkTile<T, kDk, kP>::kUnroll * VkTile<T, kDk, kP>::kChunksPerLane);
#else
  else
    return (void)warps_per_block, size_t(0);  // vk keeps no ring without cp.async
#endif
}

// The fused kernel of (T, kLayout, kDk, kP, IO, kNormOnly, kPdl), typed.
template <typename T, Layout kLayout, int kDk, int kP, typename IO, bool kNormOnly, bool kPdl>
constexpr auto fused_kernel() {
  if constexpr (kLayout == Layout::kKV)
    return &decode_kv_fused_kernel<T, kDk, kP, IO, kNormOnly, kPdl>;
  else
    return &decode_vk_fused_kernel<T, kLayout, kDk, kP, IO, kNormOnly, kPdl>;
}

// The step kernel of (T, kLayout, kDk, kP, IO, kHints, kNorm), typed (kv:
// kP is the tile's warps).
template <typename T, Layout kLayout, int kDk, int kP, typename IO, int kHints, bool kNorm>
constexpr auto step_kernel() {
  if constexpr (kLayout == Layout::kKV)
    return &decode_kv_step_kernel<T, kDk, kP, IO, kHints, kNorm>;
  else
    return &decode_vk_step_kernel<T, kLayout, kDk, kP, IO, kHints, kNorm>;
}

// The kernel of (T, kLayout, kDk, kP, IO, kFused, kNormOnly, kPdl), untyped
// (the step's without L2 policies or norm).
template <typename T, Layout kLayout, int kDk, int kP, typename IO, bool kFused = false, bool kNormOnly = false,
          bool kPdl = false>
const void* kernel_of() {
  if constexpr (kFused)
    return reinterpret_cast<const void*>(fused_kernel<T, kLayout, kDk, kP, IO, kNormOnly, kPdl>());
  else
    return reinterpret_cast<const void*>(step_kernel<T, kLayout, kDk, kP, IO, 0, false>());
}

// The fused kernel a launch runs (kP: kv's tile of kW warps): the general
// one, or from sm_90 code a twin, the norm alone in clusters (norm_only,
// uniform IO) or a programmatic launch's (pdl, 16-bit inputs:
// start_fused_loads). Chosen here, where IO is a template parameter, not in
// launch_decode's nested generic lambdas: there g++ 12.2 folds a condition
// such as `if constexpr (kFused && !std::is_same<IO, MixedIO>::value)` once,
// for the first IO it instantiates, and keeps that for the others (a
// 25-line reproducer: g++ and nvcc on it wrong, clang right). So the kPdl
// twin was never launched (round 27, found by disassembly) and MixedIO's
// norm-alone launches took the kNormOnly twin, which then needed its
// shared-memory opt-in ("invalid resource handle", 2026-12-01).
template <typename T, Layout kLayout, int kDk, int kP, typename IO>
auto fused_kernel_for(bool norm_only, bool pdl) {
#if !defined(GDN_HIP)
  if constexpr (!std::is_same<IO, MixedIO>::value) {
    if (norm_only) return fused_kernel<T, kLayout, kDk, kP, IO, true, false>();
  }
  if constexpr (kPdlInputs<IO>) {
    if (pdl) return fused_kernel<T, kLayout, kDk, kP, IO, false, true>();
  }
#endif
  (void)norm_only;
  (void)pdl;
  return fused_kernel<T, kLayout, kDk, kP, IO, false, false>();
}

// Whether the vk kernel's q and k rows (read from global memory when the
// conv is off) can move as vector words (RawRun, up to 16 bytes at offsets
// that are multiples of the vector): pointers and strides in 16-byte steps.
inline bool qk_rows_aligned(const DecodeParams& p) {
  if (p.layout != Layout::kVK || p.conv_width > 0) return true;
  const int64_t es = int64_t(dtype_size(p.qkv_dtype));
  auto ok = [&](const void* ptr, int64_t batch_stride, int64_t head_stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (batch_stride * es) % 16 == 0 && (head_stride * es) % 16 == 0;
  };
  return ok(p.q, p.q_batch_stride, p.q_head_stride) && ok(p.k, p.k_batch_stride, p.k_head_stride);
}

// Whether the pointers and strides the fused prologue's runs load from are
// multiples of `bytes`, a run's vector word (RawRun): the rows of x, the
// slots of the conv state, the conv weight and bias (conv on); the rows and
// heads of z and norm_weight (norm on). Channel offsets inside are multiples
// of the run (the kernel checks the block's first column:
// prologue_runs_aligned).
inline bool prologue_pointers_aligned(const DecodeParams& p, int64_t bytes) {
  const int64_t es = int64_t(dtype_size(p.qkv_dtype));
  auto ptr = [&](const void* q) { return int64_t(reinterpret_cast<uintptr_t>(q) % uintptr_t(bytes)) == 0; };
  auto stride = [&](int64_t s) { return (s * es) % bytes == 0; };
  if (p.conv_width > 0 && !(ptr(p.x) && stride(p.x_batch_stride) && ptr(p.conv_state) &&
                            stride(p.conv_state_slot_stride) && ptr(p.conv_weight) && ptr(p.conv_bias)))
    return false;
  return p.norm_weight == nullptr ||
         (ptr(p.z) && stride(p.z_batch_stride) && stride(p.z_head_stride) && ptr(p.norm_weight));
}

// f(IO{}) with the kernel instantiation's IO for p (decode_kernel.cuh,
// with_dtype): the shared dtype of q/k/v, a/b and o, or MixedIO. MixedIO also
// takes q and k rows that are not 16-byte aligned (its loads test each
// address; the others assume it: RawRun).
template <typename F>
auto with_io(const DecodeParams& p, F&& f) {
  if (p.qkv_dtype == p.ab_dtype && p.qkv_dtype == p.o_dtype && qk_rows_aligned(p)) {
    switch (p.qkv_dtype) {
      case DType::kF32: return f(float{});
      case DType::kF16: return f(fp16{});
      default: return f(bf16{});
    }
  }
  return f(MixedIO{});
}

// Facts about a kernel instantiation on the current device, computed at its
// first launch there and kept: function attributes (the shared-memory opt-in,
// the carveout) are per device, so a process that drives several GPUs sets
// them on each (once per process, a second GPU got none: kv at Dk = 256,
// whose ring needs the opt-in past 48 KiB, failed to launch there).
// `compute` returns a value > 0; a device past the table computes it at every
// call. Races only repeat idempotent work.
constexpr int kMaxCachedDevices = 64;
template <typename F>
int per_device(std::atomic<int> (&cache)[kMaxCachedDevices], F&& compute) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    dev = -1;
  }
  if (dev < 0 || dev >= kMaxCachedDevices) return compute();
  int v = cache[dev].load(std::memory_order_acquire);
  if (v == 0) {
    v = compute();
    cache[dev].store(v, std::memory_order_release);
  }
  return v;
}

// Warps of the kernel one SM of the current device holds at once (registers
// and the ring's shared memory); also raises the kernel's dynamic
// shared-memory limit there, which the kv ring needs past 48 KiB (Dk = 256).
template <typename T, Layout kLayout, int kDk, int kP, typename IO>
int resident_warps_per_sm() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return per_device(cache, [] {
    const int w = kLayout == Layout::kKV ? kP : 8;
    size_t smem = 0;
    if constexpr (kLayout == Layout::kKV) {
      static_assert(kv_step_smem_bytes<T, kDk, kP>() <= GDN_MAX_BLOCK_SMEM,
                    "the kv step's ring exceeds a block's shared memory");
      smem = kv_step_smem_bytes<T, kDk, kP>();
    } else {
      smem = smem_bytes<T, kLayout, kDk, kP>(w);
    }
    const void* k = kernel_of<T, kLayout, kDk, kP, IO>();
    static_assert(smem_bytes<T, kLayout, kDk, kP>(8) <= GDN_MAX_BLOCK_SMEM, "the ring exceeds a block's shared memory");
    // Failures here only cost speed (the launch reports any real error).
    auto set_limits = [&](const void* kernel) {
      (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
#if !defined(GDN_AMD)
      // All of the unified L1/shared array as shared memory: the rings, not
      // L1, hold the state, and every resident block's ring must fit.
      (void)cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared));
#endif
    };
    set_limits(k);
#if GDN_L2_HINTS
    // The tile's second instantiation (Launch::l2_hints): the same limits.
    if constexpr (kLayout == Layout::kKV && step_l2_hints<T, kLayout, kDk, kP>() != 0)
      set_limits(
          reinterpret_cast<const void*>(&decode_kv_step_kernel<T, kDk, kP, IO, step_l2_hints<T, kLayout, kDk, kP>()>));
    else if constexpr (kLayout == Layout::kVK)
      set_limits(reinterpret_cast<const void*>(
          &decode_vk_step_kernel<T, kLayout, kDk, kP, IO, step_l2_hints<T, kLayout, kDk, kP>()>));
#endif
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, w * kWarp, smem) != cudaSuccess || blocks < 1) {
      (void)cudaGetLastError();
      blocks = 1;
    }
    return blocks * w;
  });
}

#if GDN_VK_WAVE
// The call decode_vk_wave_kernel takes, but for its grid: no conv or norm,
// raw gates, the interleaved head map, Dk = Dv = 128, heads
// packed in q, k, v and o, every offset of a row's tensors below 2^31
// elements (and of the state's without slot indices); its IO is the
// launch's (with_io: one dtype and aligned q/k rows, else MixedIO, which it
// does not take).
inline bool wave_call(const DecodeParams& p) {
  constexpr int64_t kD = 128, kMax = int64_t(1) << 31;
  // the largest offset of row B - 1 in a tensor whose rows are `stride`
  // apart and `span` elements long, below 2^31
  auto fits = [&](int64_t stride, int64_t span) { return (p.batch - 1) * stride + span < kMax; };
  const bool pool = p.index_dtype != IndexType::kNone;
  return p.conv_width == 0 && p.norm_weight == nullptr && p.gate == Gate::kRaw &&
         p.head_map == HeadMap::kInterleaved &&
         p.head_dim_k == kD && p.head_dim_v == kD && p.q_head_stride == kD && p.k_head_stride == kD &&
         p.v_head_stride == kD && p.o_head_stride == kD && fits(p.q_batch_stride, p.num_k_heads * kD) &&
         fits(p.k_batch_stride, p.num_k_heads * kD) && fits(p.v_batch_stride, p.num_v_heads * kD) &&
         fits(p.o_batch_stride, p.num_v_heads * kD) && fits(p.a_batch_stride, p.num_v_heads) &&
         fits(p.b_batch_stride, p.num_v_heads) && (pool || fits(p.state_slot_stride, p.num_v_heads * kD * kD));
}
// Its instantiations per (T, IO), with and without slot indices, plain or
// programmatic, carry the step's L2 policies, which a one-wave grid always
// takes; the warps of one an SM holds (both launches' bounds are the same),
// once per device.
template <typename T, typename IO, bool kIndexed, bool kPdl = false>
constexpr auto wave_kernel() {
  return &decode_vk_wave_kernel<T, IO, step_l2_hints<T, Layout::kVK, 128, default_tile_param<T, Layout::kVK>()>(),
                                 kIndexed, kPdl>;
}
template <typename T, typename IO, bool kIndexed>
int wave_warps_per_sm() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return per_device(cache, [] {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks,
                                                      reinterpret_cast<const void*>(wave_kernel<T, IO, kIndexed>()),
                                                      8 * kWarp, 0) != cudaSuccess ||
        blocks < 1) {
      (void)cudaGetLastError();
      return 8;  // (only speed: the grid then fits the wave it assumes or not)
    }
    return blocks * 8;
  });
}
#endif

#if !defined(GDN_HIP)
// The step's norm instantiations (Launch::step_norm; kP: kv's kW): the
// step's limits (`smem`, its ring; all of the L1/shared array as shared
// memory), once per device.
template <typename T, Layout kLayout, int kDk, int kP, typename IO>
bool step_norm_ready(size_t smem) {
  static std::atomic<int> cache[kMaxCachedDevices];
  return per_device(cache, [smem] {
    auto set_limits = [&](const void* kernel) {
      (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      (void)cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared));
    };
    constexpr int kHints = step_l2_hints<T, kLayout, kDk, kP>();
    if constexpr (kLayout == Layout::kKV) {
      set_limits(reinterpret_cast<const void*>(&decode_kv_step_kernel<T, kDk, kP, IO, 0, true>));
      if constexpr (kHints != 0)
        set_limits(reinterpret_cast<const void*>(&decode_kv_step_kernel<T, kDk, kP, IO, kHints, true>));
    } else {
      set_limits(reinterpret_cast<const void*>(&decode_vk_step_kernel<T, kLayout, kDk, kP, IO, 0, true>));
      set_limits(reinterpret_cast<const void*>(&decode_vk_step_kernel<T, kLayout, kDk, kP, IO, kHints, true>));
    }
    (void)cudaGetLastError();
    return 1;
  }) == 1;
}
#endif

// The step + norm kernel a launch runs (Launch::step_norm), with its L2
// policies (hints) or without, its limits raised; none (nullptr) for
// MixedIO, to which plan_launch never gives it, and on HIP. A function
// template, for the reason fused_kernel_for gives: in launch_decode's
// lambdas g++ compiled the MixedIO instantiations of this kernel too.
template <typename T, Layout kLayout, int kDk, int kP, typename IO, int kHints>
auto step_norm_kernel(size_t smem, bool hints) {
  using Kernel = decltype(step_kernel<T, kLayout, kDk, kP, IO, 0, false>());
#if !defined(GDN_HIP)
  if constexpr (!std::is_same<IO, MixedIO>::value) {
    step_norm_ready<T, kLayout, kDk, kP, IO>(smem);
    if constexpr (kHints != 0) {
      if (hints) return Kernel(step_kernel<T, kLayout, kDk, kP, IO, kHints, true>());
    }
    return Kernel(step_kernel<T, kLayout, kDk, kP, IO, 0, true>());
  }
#endif
  (void)smem;
  (void)hints;
  return Kernel(nullptr);
}

// The fused instantiations' dynamic shared-memory limit, raised once per
// device (as above) to the most any launch of them asks for: 8 warps' ring,
// a group of kMaxFusedGroup heads, Dv = kMaxHeadDim; for the twins too
// where fused_kernel_for runs them.
template <typename T, Layout kLayout, int kDk, int kP, typename IO>
bool fused_ready() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return per_device(cache, [] {
#if defined(GDN_HIP)
    constexpr bool kClusters = false;
#else
    constexpr bool kClusters = true;
#endif
    constexpr size_t smem =
        smem_bytes<T, kLayout, kDk, kP>(8) + fused_smem_bytes(kMaxFusedGroup, kDk, kMaxHeadDim, kClusters);
    static_assert(smem <= GDN_MAX_BLOCK_SMEM, "the ring and the fused stages exceed a block's shared memory");
    (void)cudaFuncSetAttribute(kernel_of<T, kLayout, kDk, kP, IO, true>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(smem));
    if constexpr (kClusters && !std::is_same<IO, MixedIO>::value)
      (void)cudaFuncSetAttribute(kernel_of<T, kLayout, kDk, kP, IO, true, true>(),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if constexpr (kClusters && kPdlInputs<IO>)
      (void)cudaFuncSetAttribute(kernel_of<T, kLayout, kDk, kP, IO, true, false, true>(),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    (void)cudaGetLastError();
    return 1;
  }) == 1;
}

// Whether a kernel can use sm_90 launch features on the current device,
// programmatic launch (PDL) and thread-block clusters: its code has the
// griddepcontrol and cluster instructions (built from sm_90 or newer PTX,
// not JIT-compiled from compute_80) and the GPU is sm_90 or newer. Once per
// kernel and device, like the above.
template <typename T, Layout kLayout, int kDk, int kP, typename IO, bool kFused>
bool sm90_capable() {
#if defined(GDN_HIP)
  return false;
#else
  static std::atomic<int> cache[kMaxCachedDevices];
  return per_device(cache, [] {
    cudaFuncAttributes a{};
    int dev = 0, major = 0;
    const bool ok = cudaFuncGetAttributes(&a, kernel_of<T, kLayout, kDk, kP, IO, kFused>()) == cudaSuccess &&
                    cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess;
    (void)cudaGetLastError();
    return ok && major >= 9 && a.ptxVersion >= 90 ? 2 : 1;
  }) == 2;
#endif
}

#if !defined(GDN_HIP)
// The dynamic shared memory a programmatic launch of `kernel` asks for, so
// that its blocks spread over the SMs. Such a grid is placed while the kernel
// before it still runs. An SM whose shared-memory carveout cannot hold our
// blocks (an upstream kernel that uses no shared memory keeps a small one)
// takes none until it drains, and the block scheduler fills the first SMs
// to drain up to the occupancy limit: at B = 1 the fused bf16 kv middle ran
// its 64 blocks on 20 SMs, 4 on each, and the bf16 kv step its 128 on 17,
// and with PDL a layer call was 1.5 and 2.0 us slower than without. So a
// grid that fits the GPU at once asks for enough shared memory that an SM
// holds no more of its blocks than the fewest that still fit every block
// (every cluster) at once (B = 1: one or two an SM); other grids keep
// `smem`. With it PDL gained 0.25-1.1 us a call in all 16 configurations
// measured, behind an upstream with either carveout (H200, 2026-12-02,
// bench/RESULTS.md round 17). The cost: behind an upstream whose blocks
// hold more than half an SM's shared memory, our blocks wait for them to
// leave. The answer is cached per (device, kernel, launch shape).
inline size_t spread_smem(const void* kernel, unsigned grid, unsigned block, size_t smem, int cluster) {
#if defined(GDN_TRACE)
  // (diagnostic builds: GDN_NO_SPREAD=1 turns the spread off, for A/B)
  if (std::getenv("GDN_NO_SPREAD") != nullptr) return smem;
#endif
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return (void)cudaGetLastError(), smem;
  using Key = std::tuple<int, const void*, unsigned, unsigned, size_t, int>;
  static std::mutex mu;
  static std::map<Key, size_t> cache;
  const Key key{dev, kernel, grid, block, smem, cluster};
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  size_t out = smem;
  int sms = 0, per_sm = 0, optin = 0, natural = 0;
  cudaFuncAttributes a{};
  // The dynamic limit raised to all a block may have beside its static
  // shared memory (the kv kernels' partial sums).
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
      cudaFuncGetAttributes(&a, kernel) == cudaSuccess && size_t(optin) > a.sharedSizeBytes &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&natural, kernel, int(block), smem) == cudaSuccess &&
      sms > 0 && natural > 0 && int64_t(grid) <= int64_t(natural) * sms &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(size_t(optin) - a.sharedSizeBytes)) == cudaSuccess) {
    const size_t max_dynamic = size_t(optin) - a.sharedSizeBytes;
    for (int cap = int((grid + unsigned(sms) - 1) / unsigned(sms)); cap < natural; ++cap) {
      // (cap + 1) blocks of more than per_sm / (cap + 1) bytes do not fit an SM
      const size_t pad = std::max(smem, size_t(per_sm) / size_t(cap + 1) + 1);
      int fit = 0;
      if (pad > max_dynamic ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, int(block), pad) != cudaSuccess || fit != cap)
        continue;
      if (cluster > 1) {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(block);
        cfg.dynamicSmemBytes = pad;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = unsigned(cluster);
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess ||
            int64_t(clusters) * cluster < int64_t(grid))
          continue;
      }
      out = pad;
      break;
    }
  }
  (void)cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, out);
  return out;
}
#endif

// kernel<<<grid, block, smem, stream>>>(args...), or through
// cudaLaunchKernelEx with programmatic stream serialization (`pdl`) and/or
// clusters of `cluster` blocks (a programmatic launch with the shared memory
// of spread_smem).
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), unsigned grid, unsigned block, size_t smem, cudaStream_t stream,
                          bool pdl, int cluster, Args... args) {
#if !defined(GDN_HIP)
  if (pdl || cluster > 1) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    if (pdl)
      cfg.dynamicSmemBytes = spread_smem(reinterpret_cast<const void*>(kernel), grid, block, smem, cluster);
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim.x = unsigned(cluster);
      attr[n].val.clusterDim.y = 1;
      attr[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
  }
#else
  (void)pdl;
  (void)cluster;
#endif
  kernel<<<dim3(grid), dim3(block), smem, stream>>>(args...);
  return cudaGetLastError();
}

template <typename T, Layout kLayout, int kDk, int kP>
Launch plan_launch(const DecodeParams& p, int sms, int64_t l2_bytes, int max_items_per_warp, bool allow_wave) {
  constexpr int cpi = cols_per_item<T, kLayout, kDk, kP>();
  Launch g;
  g.items_per_head = (p.head_dim_v + cpi - 1) / cpi;
  const int64_t heads = p.batch * p.num_v_heads;
  // The tile's L2 policies (step_l2_hints) while the state a call reads is
  // at most twice the L2 (an H200's 60 MiB at Qwen3.5's shape: bf16
  // B <= 120, fp32 B <= 60; measured in at B = 64 and 32, out at 128 and 64).
  // Past it they gained little or lost: vk evict-first -0.6% to +1.1% at
  // B = 64-512, fp32 kv's both +0.3% at B = 64, +1.4% at 128 and +11% at
  // 512 (H200; bench/RESULTS.md round 20).
  const bool state_within_2l2 = heads * int64_t(p.head_dim_k) * p.head_dim_v * int64_t(sizeof(T)) <= 2 * l2_bytes;
  const int64_t items = heads * g.items_per_head;
  const int cap = max_items_per_warp < g.items_per_head ? max_items_per_warp : g.items_per_head;
  g.group_heads = p.num_v_heads / p.num_k_heads;
  g.fused = p.conv_width > 0 || p.norm_weight != nullptr;
#if !defined(GDN_HIP)
  // The norm alone (conv off): the step's geometry with the norm as its
  // epilogue (Launch::step_norm; decode_kv_step_kernel's kNorm, decode_vk's
  // kStepNorm), on sm_90 code with one input dtype:
  // - where the step's own launch gives a head several blocks (at most 8)
  //   in one wave of at most 4 blocks an SM, those blocks a cluster (B = 1,
  //   the step's small blocks and 4-warp kv tiles; fp32 B = 8);
  // - in grids of more than one wave, one block a head: kv streams the
  //   head's tiles in one block (at most the cap), vk takes the step's
  //   launch where it already gives a head one block;
  // - else (one block a head in one wave, a block holding more than one of
  //   its columns a thread, a vk block with idle warps) the fused kernel's
  //   groups below.
  // Against those groups (H200, bench_fused, bench/RESULTS.md round 25),
  // the step + norm: B = 1 kv fp32 4.41 -> 3.92 us, bf16 3.89 -> 3.48, vk
  // fp32 4.17 -> 3.92, bf16 3.52 -> 3.43; B = 8 (clusters of 2) kv fp32
  // 11.89 -> 11.75, vk 11.84 -> 11.62; B = 64 kv fp32 77.8 -> 76.1, bf16
  // 43.5 -> 40.2, bf16 vk 42.4 -> 38.0. Not taken: clusters in longer grids
  // or at 8 blocks an SM (kv fp32 B = 64, 1 tile a block, 83.3; kv bf16
  // B = 8, 4-warp tiles, 8.39) and one block a head in one wave (B = 8 bf16:
  // kv 7.37 against the groups' 7.21, vk 7.45 against 7.02).
  if (p.conv_width == 0 && p.norm_weight != nullptr) {
    DecodeParams step = p;
    step.norm_weight = nullptr;
    // (the ring kernel's geometry: the norm's instantiations are decode_vk's)
    Launch s = plan_launch<T, kLayout, kDk, kP>(step, sms, l2_bytes, max_items_per_warp, false);
    // blocks of w warps one wave holds
    const int resident = with_io(p, [](auto io) { return resident_warps_per_sm<T, kLayout, kDk, kP, decltype(io)>(); });
    auto wave = [&](int w) { return int64_t(resident / w) * sms; };
    bool ok = s.blocks_per_head > 1 && heads * s.blocks_per_head <= int64_t(4) * sms;
    int cols;  // the columns a block owns: at most one a thread (below)
    if constexpr (kLayout == Layout::kKV) {
      if (!ok && heads > wave(kP)) {
        s.items_per_head = g.items_per_head;
        s.warps_per_block = kP;
        s.items_per_warp = g.items_per_head;
        s.blocks_per_head = 1;
        s.small_loads_first = false;
        s.l2_hints = state_within_2l2 ? step_l2_hints<T, kLayout, kDk, kP>() : 0;
        ok = true;
      }
      cols = s.items_per_warp * (s.warps_per_block == kKvSmallW ? KvTile<T, kDk, kKvSmallW>::kCols
                                                                : KvTile<T, kDk, kP>::kCols);
      ok = ok && s.items_per_warp <= max_items_per_warp;
    } else {
      cols = s.warps_per_block * s.items_per_warp * cpi;
      ok = ok || (s.blocks_per_head == 1 && heads > wave(s.warps_per_block));
      // every warp of every block has an item (none leaves early)
      ok = ok && int64_t(s.blocks_per_head * s.warps_per_block - 1) * s.items_per_warp < s.items_per_head;
    }
    const bool capable = with_io(p, [](auto io) {
      using IO = decltype(io);
      if constexpr (std::is_same<IO, MixedIO>::value)
        return false;
      else
        return sm90_capable<T, kLayout, kDk, kP, IO, false>();
    });
    if (ok && capable && s.blocks_per_head <= 8 && cols <= s.warps_per_block * kWarp) {
      s.step_norm = true;
      s.cluster = s.blocks_per_head;
      return s;
    }
  }
#endif
  if (g.fused) {
    // A group (row, k-head) is one block, or on sm_90 a cluster of up to 8
    // while the groups leave SMs idle (B = 1: 16 groups, clusters of 8).
    // kv: the group's G * tiles_per_head tiles split evenly over the
    // cluster; vk: 8 * cluster / G warps a head, each streaming the fewest
    // items that cover the head, 8 warps or fewer a block.
    const int G = g.group_heads;
    const int64_t groups = p.batch * p.num_k_heads;
    const bool clusters =
        with_io(p, [](auto io) { return sm90_capable<T, kLayout, kDk, kP, decltype(io), true>(); });
    int want = 1;
    while (clusters && want < 8 && groups * want < sms) want *= 2;
#if defined(GDN_TRACE)
    // (diagnostic builds: GDN_MAX_CLUSTER=n caps it, for A/B)
    if (const char* mc = std::getenv("GDN_MAX_CLUSTER")) want = std::max(1, std::min(want, std::atoi(mc)));
#endif
    g.blocks_per_head = 1;
    g.warps_per_head = 0;
    for (int c = want; c >= 1; --c) {
      if constexpr (kLayout == Layout::kKV) {
        const int tiles = G * g.items_per_head;
        const int tpb = (tiles + c - 1) / c;
        if ((tiles + tpb - 1) / tpb != c) continue;
        g.warps_per_block = kP;
        g.items_per_warp = tpb;
      } else {
        const int wph0 = std::min(g.items_per_head, std::max(1, 8 * c / G));
        const int ipw = (g.items_per_head + wph0 - 1) / wph0;
        const int wph = (g.items_per_head + ipw - 1) / ipw;
        if ((G * wph) % c != 0 || G * wph / c > 8) continue;
        g.items_per_warp = ipw;
        g.warps_per_head = wph;
        g.warps_per_block = G * wph / c;
      }
      g.cluster = c;
      break;
    }
    return g;
  }
  g.warps_per_head = 0;
  const int resident_warps = with_io(p, [](auto io) { return resident_warps_per_sm<T, kLayout, kDk, kP, decltype(io)>(); });
  if constexpr (kLayout == Layout::kKV) {
    // kv: an item is a block's tile of kP warps (kKvSmallW in one-round
    // grids, below). Tiles a block streams: as
    // few as fill every resident block slot in one wave (at B = 8 every
    // tile's copies are issued at once: fp32 2.02x -> 1.62x), up to the
    // cap (4: all tiles of an fp32 head; 2-4 best from B = 32 up for 16-bit
    // states, tune_cuda kv). fp32 states past two tiles a block: one tile a
    // block, many waves (tune_cuda kv on the step kernel, 2026-11-30:
    // B = 512 527.5 us against 529.0 at 4 tiles and 576.3 at 8, B = 32 and
    // 128 within 0.2%; at B = 8, one wave of two-tile blocks, 10.9 against
    // 11.2 at one tile).
    if constexpr (kP > kKvSmallW) {
      // A one-round grid of kKvSmallW-warp tiles, one a block (see kKvSmallW).
      constexpr int cpi_small = KvTile<T, kDk, kKvSmallW>::kCols;
      const int tiles_small = (p.head_dim_v + cpi_small - 1) / cpi_small;
      const int resident_small =
          with_io(p, [](auto io) { return resident_warps_per_sm<T, kLayout, kDk, kKvSmallW, decltype(io)>(); });
      if (heads * tiles_small <= int64_t(resident_small / kKvSmallW) * sms) {
        g.items_per_head = tiles_small;
        g.warps_per_block = kKvSmallW;
        g.items_per_warp = 1;
        g.blocks_per_head = tiles_small;
        g.small_loads_first = true;
        // The tile's L2 policies up to 4 blocks an SM (H200, bench/RESULTS.md
        // rounds 19-20: B = 1 fp32 3.07 -> 2.93 us, bf16 2.90 -> 2.64,
        // through a pool 3.45 -> 3.11 and 3.28 -> 2.84; head dims 64 and
        // 256 2.6-6% faster). At 8 an SM (bf16 B = 8) evict-first alone
        // cost 1.2-3.6%: off.
        g.l2_hints = heads * tiles_small <= int64_t(4) * sms ? step_l2_hints<T, kLayout, kDk, kKvSmallW>() : 0;
        return g;
      }
    }
    const int64_t slots = int64_t(resident_warps / kP) * sms;
    if constexpr (kP > kKvSmallW && kDk <= 64) {
      // Small heads (Dk <= 64) in grids of more than one wave: a block takes
      // two tiles at once (the step kernel's pair path, both in flight from
      // the start: kv_step_stages), in 4-warp tiles where one 8-warp tile
      // would cover the head (16-bit, Dv <= 64). One 8 KiB tile a block left
      // too few bytes in flight an SM: Dk = Dv = 64 ran at 1.49x (fp32) and
      // 1.56x (bf16) the copy floor at B = 512, and more blocks an SM (1280
      // or 1536 threads) only took that to 1.31x and 1.49x; paired, 1.06x
      // and 1.11x (bench/RESULTS.md round 18). Same sums, bit for bit
      // (KvRegTile: the tree depends neither on kW nor on the pairing). A
      // caller that caps a block at one tile (tune_cuda) keeps the rule below.
      if (items > slots && max_items_per_warp >= 2) {
        int w = kP, iph = g.items_per_head;
        if (iph < 2) {
          w = kKvSmallW;
          iph = (p.head_dim_v + KvTile<T, kDk, kKvSmallW>::kCols - 1) / KvTile<T, kDk, kKvSmallW>::kCols;
        }
        g.items_per_head = iph;
        g.warps_per_block = w;
        g.items_per_warp = iph < 2 ? iph : 2;
        g.blocks_per_head = (iph + g.items_per_warp - 1) / g.items_per_warp;
        g.small_loads_first = false;
        return g;
      }
    }
    int64_t n = (items + slots - 1) / slots;
    if (sizeof(T) == 4 && n > 2) n = 1;
    g.l2_hints = state_within_2l2 ? step_l2_hints<T, kLayout, kDk, kP>() : 0;
    g.warps_per_block = kP;
    g.items_per_warp = int(n < 1 ? 1 : n > cap ? cap : n);
    g.blocks_per_head = (g.items_per_head + g.items_per_warp - 1) / g.items_per_warp;
    g.small_loads_first = g.items_per_warp == 1 && heads * g.blocks_per_head <= slots;
    return g;
  }
  // vk: 1 item a warp while the grid fits one wave of the warps an SM holds
  // (B = 1: every item's loads at once; 2 a warp costs 13%), else 2 (one
  // computing, one in the ring), doubled while the grid still runs >= 4
  // waves. Measured (tune_cuda vk): 1 item a warp is 1.2-1.6x slower from
  // B = 8 up (nothing in flight behind it); more items than this rule gives
  // lengthen the last wave (bf16 B = 32: 2 items 1.34x, 8 items 1.49x).
  // (Long grids gained from 4 on the two-pass kernel, bf16 B = 128 1.15x vs
  // 1.21x at 2; on the one-pass kernel 2 is best, and 3 for fp32 states in
  // grids of >= 16 waves' items: default_items_per_warp.)
#if GDN_VK_WAVE
  // The engines' call in one wave (decode_vk_wave_kernel says which), in blocks
  // of the most warps (up to 8) that still put a block on every SM and load
  // the busiest SM no more than one-warp blocks would (the rule below for
  // one-wave grids, the warps now dealt out over the grid rather than a
  // head). Against the ring kernel (H200, tune_cuda wave, bench/RESULTS.md
  // rounds 35-36): dense, 3-8% faster at B = 1 and 9% at bf16 B = 8 (by
  // the protocol 1.16x -> 1.05-1.06x the copy); through a pool, 16-bit
  // states 1.4% faster at B = 1 and 7% at B = 8, but fp32 states 4.5-5%
  // slower at B = 1 (48 registers, no spills; cause not found): fp32 pools
  // keep the ring kernel.
  if constexpr (kDk == 128 && kP == default_tile_param<T, Layout::kVK>()) {
    const bool pool = p.index_dtype != IndexType::kNone;
    if (allow_wave && wave_call(p) && !(pool && sizeof(T) == 4)) {
      const int wave_warps = with_io(p, [&](auto io) {
        using IO = decltype(io);
        if constexpr (std::is_same<IO, MixedIO>::value)
          return 0;
        else if constexpr (sizeof(T) != 4)
          return pool ? wave_warps_per_sm<T, IO, true>() : wave_warps_per_sm<T, IO, false>();
        else
          return wave_warps_per_sm<T, IO, false>();
      });
      if (items <= int64_t(wave_warps) * sms) {
        auto blocks_with = [&](int ww) { return (items + ww - 1) / ww; };
        auto busiest = [&](int ww) { return (blocks_with(ww) + sms - 1) / sms * ww; };
        int w = 8;
        while (w > 1 && (blocks_with(w) < sms || busiest(w) > busiest(1))) w /= 2;
        g.wave = true;
        g.warps_per_block = w;
        g.items_per_warp = 1;
        g.blocks_per_head = 0;  // (the grid is ceil(items / W) blocks)
        g.small_loads_first = true;
        g.l2_hints = step_l2_hints<T, kLayout, kDk, kP>();
        return g;
      }
    }
  }
#else
  (void)allow_wave;
#endif
  const int64_t slots = int64_t(resident_warps) * sms;
  int ipw = items <= slots || cap < 2 ? 1 : 2;
  while (ipw * 2 <= cap && items >= int64_t(4) * (ipw * 2) * slots) ipw *= 2;
  if (ipw == 2 && cap >= 3 && items >= int64_t(16) * slots) ipw = 3;
  const int warps_per_head = (g.items_per_head + ipw - 1) / ipw;
  // Largest power-of-two block up to 8 warps that the head's warps fill,
  // then halved (split V across more blocks as B * Hv shrinks; the per-warp
  // work never changes, so neither do the results):
  // - in a one-wave grid, while the blocks are fewer than the SMs or the
  //   busiest SM (blocks dealt out evenly) would hold more warps than with
  //   one-warp blocks. Every block a launch dispatches costs time (an empty
  //   kernel of 1024 blocks takes 1.17 us a call in a graph, of 256 0.70),
  //   so the fewest blocks that keep the SMs evenly loaded win. Against the
  //   rule below in every grid (H200, bench_cuda, bench/RESULTS.md round
  //   24): B = 1 fp32 3.22 -> 3.17 us (256 blocks of 4 warps, not 1024 of
  //   one), bf16 2.88 -> 2.86, bf16 at Hv = 64 3.67 -> 3.35, bf16 B = 8 6.52
  //   -> 6.40; no vk row up to B = 32 more than 0.4% slower;
  // - in longer grids, while the grid has fewer than 4 blocks an SM.
  int w = 1;
  while (w * 2 <= warps_per_head && w * 2 <= 8) w *= 2;
  auto blocks_with = [&](int ww) { return heads * ((warps_per_head + ww - 1) / ww); };
  if (heads * warps_per_head <= slots) {
    auto busiest = [&](int ww) { return (blocks_with(ww) + sms - 1) / sms * ww; };
    while (w > 1 && (blocks_with(w) < sms || busiest(w) > busiest(1))) w /= 2;
  } else {
    while (w > 1 && blocks_with(w) < int64_t(4) * sms) w /= 2;
  }
  g.items_per_warp = ipw;
  g.warps_per_block = w;
  g.blocks_per_head = (warps_per_head + w - 1) / w;
  g.l2_hints = state_within_2l2 ? step_l2_hints<T, kLayout, kDk, kP>() : 0;
  g.small_loads_first = ipw == 1 && heads * warps_per_head <= slots;
  return g;
}

// A step launch's dynamic shared memory; tune_cuda (GDN_TUNE_HOOKS) can pad it
// so that fewer blocks fit an SM (a diagnostic, compiled out of the library).
#if defined(GDN_TUNE_HOOKS)
inline size_t g_tune_min_smem = 0;
template <typename K>
size_t tune_smem(K kernel, size_t smem) {
  if (g_tune_min_smem <= smem) return smem;
  (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(g_tune_min_smem));
  return g_tune_min_smem;
}
#else
template <typename K>
constexpr size_t tune_smem(K, size_t smem) {
  return smem;
}
#endif

// `caller.programmatic_launch` picks the launch (programmatic or plain); the
// kernels read the same flag to pick their load order, from `p`, which is
// the caller's parameters except in diagnostic builds: there (-DGDN_TRACE,
// for A/B) GDN_PDL_LATE=1 has a programmatic launch's kernel take the plain
// path (every load after its wait) and GDN_STATE_FIRST=1 has a plain
// launch's kernel take the programmatic one (the state's loads first, its
// wait a no-op).
template <typename T, Layout kLayout, int kDk, int kP>
cudaError_t launch_decode(const DecodeParams& caller, const Launch& g, cudaStream_t stream) {
#if defined(GDN_TRACE)
  DecodeParams traced = caller;
  if (std::getenv("GDN_PDL_LATE") != nullptr) traced.programmatic_launch = false;
  if (std::getenv("GDN_STATE_FIRST") != nullptr) traced.programmatic_launch = true;
  const DecodeParams& p = traced;
#else
  const DecodeParams& p = caller;
#endif
  const KernelParams kp = kernel_params(p);
  const float scale = effective_scale(p);
  const FastDiv by_head_map(unsigned(p.head_map == HeadMap::kInterleaved ? p.num_v_heads / p.num_k_heads
                                                                         : p.num_k_heads));
  // grid: (b * Hv + h) * blocks_per_head + blk, or one block per group b * Hk + hk
  const unsigned blocks =
      unsigned(g.fused ? p.batch * p.num_k_heads * g.cluster : p.batch * p.num_v_heads * g.blocks_per_head);
  const FastDiv by_hv(unsigned(g.fused ? p.num_k_heads : p.num_v_heads));
  const FastDiv by_bph(unsigned(g.blocks_per_head));
  // fused: the cluster size and the warps (vk) or tiles (kv) of a head
  FusedArgs fdiv;
  if (g.fused) {
    fdiv.cluster = FastDiv(unsigned(g.cluster));
    fdiv.per_head = FastDiv(unsigned(kLayout == Layout::kKV ? g.items_per_head : g.warps_per_head));
  }
  return with_io(p, [&](auto io) {
    using IO = decltype(io);
    if constexpr (!std::is_same<IO, MixedIO>::value)
      fdiv.vector_runs = g.fused && prologue_pointers_aligned(p, RawRun<IO, prologue_run<kLayout>()>::kBytes);
    auto go = [&](auto fused_tag) {
      constexpr bool kFused = decltype(fused_tag)::value;
      if constexpr (kFused)
        fused_ready<T, kLayout, kDk, kP, IO>();
      else
        resident_warps_per_sm<T, kLayout, kDk, kP, IO>();  // once: the shared-memory limit is raised
      const bool pdl = caller.programmatic_launch && sm90_capable<T, kLayout, kDk, kP, IO, kFused>();
      const size_t fused_smem = kFused ? fused_smem_bytes(g.group_heads, p.head_dim_k, p.head_dim_v, g.cluster > 1) : 0;
      if constexpr (kLayout == Layout::kKV) {
        // The tile of kW warps: kP, or (step) kKvSmallW where the plan chose it.
        auto launch_tile = [&](auto w_tag) {
          constexpr int kW = decltype(w_tag)::value;
          if constexpr (kFused) {
            auto launch_kv = [&](auto kernel) {
              return launch_kernel(kernel, blocks, unsigned(KvTile<T, kDk, kW>::kThreads),
                                   smem_bytes<T, kLayout, kDk, kW>(kW) + fused_smem, stream, pdl, g.cluster, p,
                                   g.items_per_head, g.items_per_warp, by_hv, scale, g.group_heads, g.cluster, fdiv);
            };
            // The norm alone in clusters whose blocks each own columns of
            // one head, at most one a thread, has its own instantiation, and
            // so has a programmatic launch (fused_kernel_for).
            const bool norm_only = p.conv_width == 0 && g.cluster > 1 && g.items_per_head % g.items_per_warp == 0 &&
                                   g.items_per_warp * KvTile<T, kDk, kW>::kCols <= KvTile<T, kDk, kW>::kThreads;
            return launch_kv(fused_kernel_for<T, kLayout, kDk, kW, IO>(norm_only, pdl && p.programmatic_launch));
          } else {
            auto launch_step = [&](auto kernel) {
              return launch_kernel(kernel, blocks, unsigned(KvTile<T, kDk, kW>::kThreads),
                                   tune_smem(kernel, kv_step_smem_bytes<T, kDk, kW>()), stream, pdl,
                                   g.step_norm ? g.cluster : 1, g.items_per_head, g.items_per_warp, by_bph, by_hv,
                                   by_head_map, g.small_loads_first, kp, scale);
            };
#if GDN_L2_HINTS
            constexpr int kHints = step_l2_hints<T, kLayout, kDk, kW>();
#else
            [[maybe_unused]] constexpr int kHints = 0;  // (the norm's twin below is CUDA's only)
#endif
#if !defined(GDN_HIP)
            // The norm alone as the step's epilogue (plan_launch)
            if (g.step_norm) {
              const auto kernel =
                  step_norm_kernel<T, kLayout, kDk, kW, IO, kHints>(kv_step_smem_bytes<T, kDk, kW>(), g.l2_hints != 0);
              return kernel != nullptr ? launch_step(kernel) : cudaErrorNotSupported;
            }
#endif
#if GDN_L2_HINTS
            if constexpr (kHints != 0) {
              if (g.l2_hints != 0) return launch_step(&decode_kv_step_kernel<T, kDk, kW, IO, kHints>);
            }
#endif
            return launch_step(&decode_kv_step_kernel<T, kDk, kW, IO, 0>);
          }
        };
        if constexpr (!kFused && kP > kKvSmallW) {
          if (g.warps_per_block == kKvSmallW) {
            resident_warps_per_sm<T, kLayout, kDk, kKvSmallW, IO>();  // its shared-memory limit
            return launch_tile(std::integral_constant<int, kKvSmallW>{});
          }
        }
        return launch_tile(std::integral_constant<int, kP>{});
      } else {
        const unsigned threads = unsigned(g.warps_per_block * kWarp);
        const size_t smem = smem_bytes<T, kLayout, kDk, kP>(g.warps_per_block) + fused_smem;
        if constexpr (!kFused) {
#if GDN_VK_WAVE
          if constexpr (kDk == 128 && kP == default_tile_param<T, Layout::kVK>() &&
                        !std::is_same<IO, MixedIO>::value) {
            if (g.wave) {
              WaveParams d;
              d.items = unsigned(p.batch * p.num_v_heads * g.items_per_head);
              d.by_hv = FastDiv(unsigned(p.num_v_heads));
              d.by_group = FastDiv(unsigned(p.num_v_heads / p.num_k_heads));
              d.q_batch_stride = int32_t(p.q_batch_stride);
              d.k_batch_stride = int32_t(p.k_batch_stride);
              d.v_batch_stride = int32_t(p.v_batch_stride);
              d.a_batch_stride = int32_t(p.a_batch_stride);
              d.b_batch_stride = int32_t(p.b_batch_stride);
              d.index_dtype = p.index_dtype;
              d.num_slots = p.num_slots;
              d.state_indices = p.state_indices;
              d.state_out_indices = p.state_out_indices;
              d.state_slot_stride = p.state_slot_stride;
              d.q = p.q;
              d.k = p.k;
              d.v = p.v;
              d.a = p.a;
              d.b = p.b;
              d.A_log = p.A_log;
              d.dt_bias = p.dt_bias;
              d.state = p.state;
              d.l2norm = p.l2norm;
              d.l2norm_eps = p.l2norm_eps;
              d.scale = scale;
              d.o_batch_stride = int32_t(p.o_batch_stride);
              d.o = p.o;
              d.invalid_index_count = p.invalid_index_count;
              const unsigned grid = (d.items + unsigned(g.warps_per_block) - 1) / unsigned(g.warps_per_block);
              // (through a pool for 16-bit states only: plan_launch)
              if (p.index_dtype != IndexType::kNone) {
                if constexpr (sizeof(T) != 4) {
                  if (pdl) return launch_kernel(wave_kernel<T, IO, true, true>(), grid, threads, 0, stream, true, 1, d);
                  return launch_kernel(wave_kernel<T, IO, true>(), grid, threads, 0, stream, false, 1, d);
                } else {
                  return cudaErrorInvalidConfiguration;
                }
              }
              if (pdl) return launch_kernel(wave_kernel<T, IO, false, true>(), grid, threads, 0, stream, true, 1, d);
              return launch_kernel(wave_kernel<T, IO, false>(), grid, threads, 0, stream, false, 1, d);
            }
          }
#endif
          auto launch_step = [&](auto kernel) {
            return launch_kernel(kernel, blocks, threads, tune_smem(kernel, smem), stream, pdl,
                                 g.step_norm ? g.cluster : 1, g.items_per_head, g.items_per_warp, by_bph, by_hv,
                                 by_head_map, g.small_loads_first, kp, scale);
          };
#if !defined(GDN_HIP)
          // The norm alone as the step's epilogue (plan_launch)
          if (g.step_norm) {
            const auto kernel = step_norm_kernel<T, kLayout, kDk, kP, IO, step_l2_hints<T, kLayout, kDk, kP>()>(
                smem_bytes<T, kLayout, kDk, kP>(8), g.l2_hints != 0);
            return kernel != nullptr ? launch_step(kernel) : cudaErrorNotSupported;
          }
#endif
#if GDN_L2_HINTS
          if (g.l2_hints != 0)
            return launch_step(&decode_vk_step_kernel<T, kLayout, kDk, kP, IO, step_l2_hints<T, kLayout, kDk, kP>()>);
#endif
          return launch_step(&decode_vk_step_kernel<T, kLayout, kDk, kP, IO, 0>);
        }
        auto launch_vk = [&](auto kernel) {
          return launch_kernel(kernel, blocks, threads, smem, stream, pdl, g.cluster, g.items_per_head,
                               g.items_per_warp, by_bph, by_hv, by_head_map, g.small_loads_first, kp, scale,
                               g.group_heads, g.warps_per_head, g.cluster, fdiv);
        };
        // The norm alone in clusters whose blocks each own columns of one
        // head, at most one a thread, has its own instantiation, and so has
        // a programmatic launch (fused_kernel_for).
        const bool norm_only = p.conv_width == 0 && g.cluster > 1 && g.warps_per_head % g.warps_per_block == 0 &&
                               g.items_per_warp * cols_per_item<T, kLayout, kDk, kP>() <= kWarp;
        return launch_vk(fused_kernel_for<T, kLayout, kDk, kP, IO>(norm_only, pdl && p.programmatic_launch));
      }
    };
    return g.fused ? go(std::true_type{}) : go(std::false_type{});
  });
}

// The shipped tile parameter of (T, L) at Dk capacity D.
#define GDN_INSTANTIATE_DECODE_ONE(T, L, D)                                                                 \
  template Launch plan_launch<T, L, D, default_tile_param<T, L>()>(const DecodeParams&, int, int64_t, int, bool); \
  template cudaError_t launch_decode<T, L, D, default_tile_param<T, L>()>(                                  \
      const DecodeParams&, const Launch&, cudaStream_t);

#define GDN_INSTANTIATE_DECODE(T)                     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kVK, 64)      \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kVK, 128)     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kVK, 256)     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kKV, 64)      \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kKV, 128)     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kKV, 256)

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
