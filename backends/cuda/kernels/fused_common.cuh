// The fused middle's group (row, k-head and its v-heads), its shared memory,
// and the conv prologue's and norm epilogue's small helpers.
#pragma once

#include "step_common.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// ---- the fused prologue and epilogue (conv1d update, gated RMSNorm) --------
// With either on, a group is row b and k-head hk with its G v-heads: one block,
// or on sm_90 a cluster of `size` blocks. Its outputs, "group columns" g * Dv + j,
// split into one contiguous range [lo, hi) a block (docs/decisions.md#fused-groups).

// v-head of group member g.
template <typename Params>
__device__ __forceinline__ int group_head(const Params& p, int hk, int g, int G) {
  return p.head_map == HeadMap::kInterleaved ? hk * G + g : g * p.num_k_heads + hk;
}

// A fused block's group, its rank in the cluster of `size` blocks (size 1
// without one), and the group columns [lo, hi) it computes: from column j_lo of
// member g_lo on (lo = g_lo Dv + j_lo). by_size divides by size.
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

// silu(x) = x * sigmoid(x) = x / (1 + exp(-x)), by the fast reciprocal
// (__fdividef, within 2 ulp; x = -inf gives NaN, as x / inf does): the IEEE
// division's slow-path branch kept a thread's silus from overlapping.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + expf(-x)); }

// Channel of the packed row behind group position i: q of hk (i < Dk), k of
// hk (i < 2 Dk), then v of each of the G heads (Dv each).
template <typename Params>
__device__ __forceinline__ int64_t group_channel(const Params& p, int hk, int G, int i) {
  const int Hk = p.num_k_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  if (i < 2 * Dk) return int64_t(i < Dk ? 0 : Hk - 1) * Dk + int64_t(hk) * Dk + i;
  const int g = (i - 2 * Dk) / Dv, j = i - 2 * Dk - g * Dv;
  return 2 * int64_t(Hk) * Dk + int64_t(group_head(p, hk, g, G)) * Dv + j;
}

// Before the prologue (thread 0 of a cluster block, norm on): init the outputs'
// mbarrier. The caller puts a warp-level sync between this and fused_arrive,
// or racecheck reports a race (see the kv kernel's kDirect).
template <typename Params>
__device__ __forceinline__ void fused_begin(const Params& p, const Group& grp, const FusedSmem& sm) {
  if (grp.size > 1 && p.norm_weight != nullptr && threadIdx.x == 0) outputs_barrier_init(sm.bar);
}
// After the prologue and its barrier (every thread), in a cluster: the mbarrier
// expects the whole group's G * Dv outputs (every block pushes its own to every
// block), and the block arrives at the cluster barrier fused_mid waits on.
template <typename Params>
__device__ __forceinline__ void fused_arrive(const Params& p, const Group& grp, const FusedSmem& sm) {
  if (grp.size == 1) return;
  if (p.norm_weight != nullptr && threadIdx.x == 0)
    outputs_expect(sm.bar, unsigned(sizeof(float)) * unsigned(grp.G * p.head_dim_v));
  cluster_arrive_relaxed();  // old conv windows read, outputs' mbarrier ready
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
