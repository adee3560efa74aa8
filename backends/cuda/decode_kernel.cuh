// The fused GDN decode step on NVIDIA GPUs (sm_80, sm_90).
//
// What a block owns
// -----------------
// The step is memory-bound: per (row b, v-head h) it must read and write one
// Dk x Dv state matrix, and everything else is under 2% of the bytes. Columns
// j of that matrix (one per output element o[j]) are independent: column j
// needs only S[:, j], q_hat, k_hat, v[j] and the two gates. So the unit of
// work is a *warp item*: one warp owns a fixed group of columns of one (b, h)
// and the whole Dk extent of those columns, and reduces over Dk inside the
// warp with a fixed butterfly of shuffles. A block is W such warps on
// consecutive column groups of the same (b, h); the grid is
// B * Hv * (items_per_head / W) blocks.
//
// How V is split by batch size
// ----------------------------
// W is the only thing the batch size changes. Large B*Hv: W covers the whole
// head (up to 8 warps), so a block owns all Dv outputs of its head and q/k are
// normalized once per head. Small B*Hv: W shrinks (down to one warp per
// block) until the grid has enough blocks to put work on every SM: at B = 1
// with Hv = 32 there are only 32 heads for 132 SMs, and a block per head would
// leave three quarters of the memory system idle. Because a warp's item and
// its reduction order never depend on W, results are bitwise identical
// whatever split the batch size picks (batch-invariant and deterministic).
// The later gated-RMSNorm epilogue needs all Dv outputs of a head: at large B
// a block already has them; at small B the blocks of one head are
// consecutive in the grid and can form a thread-block cluster on sm_90.
//
// Per warp item, in fp32 (S as stored, decay applied on the fly):
//   u[j]     = exp(g) * sum_i S[i, j] k_hat[i]
//   delta[j] = beta * (v[j] - u[j])
//   S'[i, j] = exp(g) * S[i, j] + k_hat[i] * delta[j]
//   o[j]     = scale * sum_i S'[i, j] q_hat[i]
// State loads are issued first, before q, k and the gates, so their latency
// overlaps the small loads and the normalization.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gdnkit/params.hpp"

namespace gdn {
namespace cuda {

constexpr int kWarp = 32;

// ---- element conversions ----------------------------------------------------
template <typename T> struct Elem;
template <> struct Elem<float> {
  static __device__ __forceinline__ float to_float(float x) { return x; }
  static __device__ __forceinline__ float from_float(float x) { return x; }
};
template <> struct Elem<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};
template <> struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

// Loads and stores of the small tensors (q, k, v, a, b, o): their dtype is a
// runtime value, uniform across the grid, so the branch never diverges.
__device__ __forceinline__ float load_any(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
}
__device__ __forceinline__ void store_any(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = x; return;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(x); return;
    default: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); return;
  }
}

__device__ __forceinline__ int64_t load_index(const void* base, IndexType t, int64_t b) {
  return t == IndexType::kI64 ? static_cast<const int64_t*>(base)[b]
                              : int64_t(static_cast<const int32_t*>(base)[b]);
}

// A 16-byte vector of state elements.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kN = 16 / int(sizeof(T));
  T x[kN];
};

// ---- tile geometry, fixed per (state dtype, layout, Dk capacity, kP) -------
// vk ([Dv, Dk], Dk contiguous): a column is one contiguous row of Dk elements.
// kLanesPerCol lanes share a column, each holding kChunksPerLane 16-byte
// chunks; a warp-step covers kWarp / kLanesPerCol columns, kUnroll steps make
// an item of about kP state values per lane.
template <typename T, int kDk, int kP>
struct VkTile {
  static constexpr int kVec = Vec<T>::kN;
  static constexpr int kChunks = kDk / kVec;
  static constexpr int kLanesPerCol = kChunks < kWarp ? kChunks : kWarp;
  static constexpr int kChunksPerLane = kChunks / kLanesPerCol;
  static constexpr int kColsPerStep = kWarp / kLanesPerCol;
  static constexpr int kUnroll = kP / (kChunksPerLane * kVec) > 0 ? kP / (kChunksPerLane * kVec) : 1;
  static constexpr int kColsPerItem = kColsPerStep * kUnroll;
};

// kv ([Dk, Dv], Dv contiguous): a lane holds kVec consecutive columns of
// kRowsPerLane rows (rows r, r + kRowLanes, ...); kRowLanes lanes share a
// column group and reduce over rows; a warp holds kGroups column groups.
// kRowLanes <= kP (16 or 8) for Dk <= 128, so a warp reads at least 32
// (64) contiguous bytes of each row: whole DRAM sectors, never half of one.
template <typename T, int kDk, int kP>
struct KvTile {
  static constexpr int kVec = Vec<T>::kN;
  static constexpr int kRowLanesWanted = kDk * kVec / 32;
  // Dk = 256 would hold 128 values a lane at 16 row lanes: allow 32 there.
  static constexpr int kRowLanesCap = kDk > 128 ? 32 : kP;
  static constexpr int kRowLanes = kRowLanesWanted < kRowLanesCap ? kRowLanesWanted : kRowLanesCap;
  static constexpr int kRowsPerLane = kDk / kRowLanes;
  static constexpr int kGroups = kWarp / kRowLanes;
  static constexpr int kColsPerItem = kGroups * kVec;
};

template <typename T, Layout kLayout, int kDk, int kP>
constexpr int cols_per_item() {
  return kLayout == Layout::kVK ? VkTile<T, kDk, kP>::kColsPerItem : KvTile<T, kDk, kP>::kColsPerItem;
}

// The tile parameter the library ships (bench/tune_cuda.cu measured it, see
// bench/RESULTS.md): vk 16 values a lane; kv 8 row lanes for fp32 (64-byte
// row segments beat 32-byte ones), 16 for 16-bit states (8 spills registers).
template <typename T, Layout kLayout>
constexpr int default_tile_param() {
  return kLayout == Layout::kVK ? 16 : (sizeof(T) == 4 ? 8 : 16);
}

// Launch geometry chosen on the host (see the header comment).
struct Launch {
  int items_per_head;   // ceil(Dv / cols_per_item)
  int warps_per_block;  // W
  int items_per_warp;   // consecutive items a warp streams through (prefetching the next)
  int blocks_per_head;  // ceil(items_per_head / (W * items_per_warp))
};

// The geometry the library picks for p on a GPU with `sms` multiprocessors.
template <typename T, Layout kLayout, int kDk, int kP>
Launch plan_launch(const DecodeParams& p, int sms, int max_items_per_warp = 4);

template <typename T, Layout kLayout, int kDk, int kP>
cudaError_t launch_decode(const DecodeParams& p, const Launch& g, cudaStream_t stream);

}  // namespace cuda
}  // namespace gdn
