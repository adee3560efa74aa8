// The gated RMSNorm epilogue (fused groups and the step's own epilogue), and
// the order the step and fused kernels issue their first loads in.
#pragma once

#include "conv_prologue.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// Between the prologue and the step (every thread of every cluster block):
// wait until every block has read the old q/k windows and initialized its
// outputs' mbarrier, then write back this block's share of the shifted q/k
// windows. (Waiting later, before the first output, only moves the wait.)
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

// The norm alone as the step's epilogue (kStepNorm, kNorm;
// docs/decisions.md#norm-epilogue), once the block's raw outputs are in
// `head_out` of every block of its head:
//   out[j] = w[j] * o[j] * rsqrt(mean_j(o[j]^2) + eps) * silu(z[j])
// for its own columns [j_own, j_own + n_own), one a thread at most (fused_finish's
// one-head form, same bits); w_pre, z_pre loaded at entry.
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
// A head's squares summed by one warp in one fixed order (head_sum_squares):
// deterministic, batch-invariant. A block writes its own columns [lo, hi) and
// reads only its own shared memory. zw (norm-alone twins): silu(z), norm_weight.
template <typename IO, typename Params>
__device__ __forceinline__ void fused_finish(const Params& p, const Group& grp, const FusedSmem& sm,
                                             const float* zw = nullptr) {
  if (p.norm_weight == nullptr) return;
  const int Dv = p.head_dim_v, G = grp.G;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  // 1 / Dv before the wait: the mean is then a product, not a division (whose
  // slow-path branch sat between the sum and the rsqrt)
  const float inv_dv = 1.0f / float(Dv);
  if (grp.size > 1)
    outputs_wait(sm.bar);  // every block's pushes have landed
  else
    __syncthreads();
  GDN_MARK(7);
  // The sum of squares of head g's outputs, in the one fixed order.
  auto head_ss = [&](int g) { return head_sum_squares(sm.out + g * Dv, Dv, lane); };
  if (grp.one_head(Dv)) {
    // The block's columns lie in member g_lo: each warp holding some of them forms
    // that head's rstd itself (same sum, same bits), with no barrier before its
    // stores; warps holding none are done (the test is uniform over a warp).
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

// The step kernels' first loads: the state's, then q, k, v and the gates, or
// the other way round in a one-round grid (Plan::small_loads_first;
// docs/decisions.md#small-loads-first) unless PDL, whose inputs may still be
// being written. Each order written out whole, no address live across the other.
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

// The fused kernels' first loads: the prologue's, the state's, then q, k, v and
// the gates once the prologue's outputs are in shared memory
// (docs/decisions.md#fused-prologue). The state's copies go: under PDL first,
// before the wait; in a cluster once the prologue's loads have landed (not
// queued behind the grid's state reads); one block a group, kv (kKvOrder)
// first, vk right behind the prologue's loads.
// kPdl (the PDL twin, sm_90; Plan::pdl_twin): the state's copies, the loads
// the previous kernel does not feed (conv state, weights), the wait, then x,
// z, a and b. Its own instantiation (a run-time flag slowed the plain launch),
// 16-bit inputs only (kPdlInputs; docs/decisions.md#pdl).
template <typename IO>
constexpr bool kPdlInputs = std::is_same<IO, bf16>::value || std::is_same<IO, fp16>::value;
template <typename IO, int kRun, bool kKvOrder, bool kPdl, typename IssueState, typename IssueSmall,
          typename Params>
__device__ __forceinline__ void start_fused_loads(const Params& p, const Group& grp, const RowSlots& slots,
                                                  const FusedSmem& sm, IssueState&& issue_state,
                                                  IssueSmall&& issue_small) {
  fused_begin(p, grp, sm);
  // cluster: the state's copies once the prologue's loads have landed (late)
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

// The body of an instantiation that only sm_90 code launches (clusters, PDL)
// in any other compilation: left empty, and a launch by mistake traps (HIP,
// without a trap the kernels may use, returns).
#if defined(GDN_HIP)
#define GDN_NOT_LAUNCHED_HERE() return
#else
#define GDN_NOT_LAUNCHED_HERE() \
  do {                          \
    __trap();                   \
    return;                     \
  } while (0)
#endif

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
