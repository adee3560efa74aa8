// Shuffles over a (logical) warp and the fixed butterfly reductions built on
// them: every sum over lanes has one order, whatever the launch.
#pragma once

#include "../vendors/vendor.h"

namespace gdn {
namespace GDN_KERNEL_NS {

// The warp size every lane and tile constant derives from: 32 on NVIDIA, 64
// on AMD gfx9. A build for NVIDIA may ask for a 64-lane *logical* warp
// (GDN_WARP_SIZE=64 with the HIP source path): two physical warps that
// exchange through shared memory wherever a shuffle crosses them, so the
// wave64 index arithmetic is tested on NVIDIA (docs/decisions.md#hip-source-path).
constexpr int kWarp = GDN_WARP_SIZE;
static_assert(kWarp == 32 || kWarp == 64, "warp size: 32 or 64 lanes");
static_assert(kWarp % GDN_PHYSICAL_WARP == 0, "a logical warp is whole physical warps");
// The warp spans physical warps that meet at a named barrier (that test build only).
constexpr bool kSpansPhysicalWarps = kWarp > GDN_PHYSICAL_WARP;

// ---- shuffles over a (logical) warp of kWarp lanes ---------------------------
// Every call is made by all kWarp lanes of the warp (no divergence), as the
// reductions below require.
#if GDN_WARP_SIZE > GDN_PHYSICAL_WARP
// Largest block the kernels launch (8 warps), in threads.
constexpr int kMaxBlockThreads = 8 * kWarp;
// x of logical lane `src` of this thread's logical warp, through shared
// memory: each thread posts x, the warp's two halves meet at a named barrier
// (id 1 + logical warp; 0 is __syncthreads'), read, and meet again before
// the slots can be reused.
__device__ __forceinline__ float exchange_lanes(float x, int src) {
  __shared__ float post[kMaxBlockThreads];
  const unsigned first = threadIdx.x & ~unsigned(kWarp - 1);
  const unsigned id = 1 + threadIdx.x / kWarp;
  post[threadIdx.x] = x;
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(kWarp) : "memory");
  const float y = post[first + unsigned(src)];
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(kWarp) : "memory");
  return y;
}
__device__ __forceinline__ float warp_shfl_xor(float x, int off) {
  // Offsets inside a physical warp stay shuffles; wider ones cross halves.
  if (off < GDN_PHYSICAL_WARP) return __shfl_xor_sync(0xffffffffu, x, off);
  return exchange_lanes(x, int(threadIdx.x % kWarp) ^ off);
}
__device__ __forceinline__ float warp_shfl(float x, int src) { return exchange_lanes(x, src); }
#elif defined(GDN_AMD)
// A wave64 shuffle (ds_bpermute / DPP): HIP's width-64 forms.
__device__ __forceinline__ float warp_shfl_xor(float x, int off) { return __shfl_xor(x, off, kWarp); }
__device__ __forceinline__ float warp_shfl(float x, int src) { return __shfl(x, src, kWarp); }
#else
__device__ __forceinline__ float warp_shfl_xor(float x, int off) { return __shfl_xor_sync(0xffffffffu, x, off); }
__device__ __forceinline__ float warp_shfl(float x, int src) { return __shfl_sync(0xffffffffu, x, src); }
#endif

// Every lane's shared-memory accesses before it are seen by the warp's lanes
// after it, where lanes read what others of their warp write (all lanes reach
// it). A 64-lane logical warp on NVIDIA is two physical warps: their named
// barrier, as exchange_lanes meets. AMD: a wavefront issues its LDS accesses in
// order, so nothing.
__device__ __forceinline__ void warp_sync() {
#if GDN_WARP_SIZE > GDN_PHYSICAL_WARP
  asm volatile("bar.sync %0, %1;" ::"r"(1 + threadIdx.x / kWarp), "r"(kWarp) : "memory");
#elif !defined(GDN_AMD)
  __syncwarp();
#endif
}

// ---- fixed butterflies --------------------------------------------------------
// Sums over the `kSpan` lanes that differ only in bits [kLow, kLow * kSpan) run
// as fixed butterflies: one order, whatever the launch. reduce_scatter sums kC
// values at once (docs/decisions.md#reduce-scatter): at each of the first
// log2(kC) steps a lane keeps half its values and sends the other half, kC - 1
// + log2(kSpan / kC) shuffles instead of kC * log2(kSpan), each value adding
// the same partials in the same order as the one-value butterfly (bitwise its
// sums). Lane l ends up with the sum of value
//   col(l) = (l / kStride) % kC,   kStride = kLow * kSpan / kC
// (the bits of the first log2(kC) offsets, highest first, name the value).
// halve: one step (offset kOff, kN values left): the lane with the offset bit
// set keeps the upper half x[k + kN/2], adds the partner's copy, sends the lower.
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
// The halving steps from kOff down: a template recursion, so every index is
// a constant (a run-time loop was not unrolled and put the values in local memory).
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

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
