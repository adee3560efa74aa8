// The kernels' view of traits.h: the build's configuration from the vendor
// header, and each choice as a template constant of (state type T, Dk
// capacity, tile). Nothing is decided here that traits.h does not say.
#pragma once

#include <type_traits>

#include "common/memory.cuh"
#include "common/warp.cuh"
#include "traits.h"

// vk ring and stages: none and one without cp.async (HIP).  #vk-ring
#if defined(GDN_NO_ASYNC_COPY)
#define GDN_VK_RING 0
#define GDN_VK_STAGES 1
#else
#define GDN_VK_RING 1
#define GDN_VK_STAGES 2
#endif
#ifndef GDN_L2_HINTS
#define GDN_L2_HINTS 0
#endif
#ifndef GDN_VK_WAVE
#define GDN_VK_WAVE 0
#endif

namespace gdn {
namespace GDN_KERNEL_NS {

using gpu::traits::kFusedL2Hints;
using gpu::traits::kKvSmallW;
using gpu::traits::kL2EvictFirst;
using gpu::traits::kL2Fetch256;
using gpu::traits::kMaxFusedGroup;

// This build's configuration, as the planner sees it (DeviceInfo::config).
constexpr gpu::BuildConfig kConfig{kWarp,
                                   GDN_VK_STAGES,
                                   GDN_VK_RING != 0,
                                   GDN_L2_HINTS != 0,
                                   GDN_VK_WAVE != 0,
#if defined(GDN_HIP)
                                   false,
#else
                                   true,
#endif
                                   size_t(GDN_MAX_BLOCK_SMEM)};

constexpr int kStages = GDN_VK_STAGES;
template <typename T>
constexpr int kv_stages() {
  return gpu::traits::kv_stages(kConfig, int(sizeof(T)));
}
template <typename T, int kDk>
constexpr int kv_step_stages() {
  return gpu::traits::kv_step_stages(kConfig, int(sizeof(T)), kDk);
}

// vk tile of (T, Dk capacity, kP values a lane): traits::vk_geom as constants.
template <typename T, int kDk, int kP>
struct VkTile {
  static constexpr gpu::traits::VkGeom kG = gpu::traits::vk_geom(kWarp, int(sizeof(T)), kDk, kP);
  static constexpr int kVec = kG.vec;
  static constexpr int kChunks = kG.chunks;
  static constexpr int kLanesPerCol = kG.lanes_per_col;
  static constexpr int kChunksPerLane = kG.chunks_per_lane;
  static constexpr int kColsPerStep = kG.cols_per_step;
  static constexpr int kUnroll = kG.unroll;
  static constexpr int kColsPerItem = kG.cols_per_item;
};

// kv tile of (T, Dk capacity, kW warps): traits::kv_geom as constants.
template <typename T, int kDk, int kW>
struct KvTile {
  static_assert(kW == 2 || kW == 4 || kW == 8, "kv: 2, 4 or 8 warps a block");
  static_assert(kDk % kWarp == 0, "kv: Dk capacity a multiple of the warp");
  static constexpr gpu::traits::KvGeom kG = gpu::traits::kv_geom(kWarp, int(sizeof(T)), kDk, kW);
  static constexpr int kVec = kG.vec;
  static constexpr int kCols = kG.cols;      // columns of a tile
  static constexpr int kRows = kG.rows;      // rows a thread holds
  static constexpr int kThreads = kG.threads;
};

template <typename T, Layout kLayout, int kDk, int kP>
constexpr int cols_per_item() {
  return gpu::traits::cols_per_item(kWarp, int(sizeof(T)), kLayout, kDk, kP);
}
template <typename T, Layout kLayout>
constexpr int default_tile_param() {
  return gpu::traits::default_tile(int(sizeof(T)), kLayout);
}
template <typename T, Layout kLayout, int kDk, int kW>
constexpr int step_l2_hints() {
  return gpu::traits::step_l2_hints(int(sizeof(T)), kLayout, kDk, kW);
}
template <Layout kLayout>
constexpr int prologue_run() {
  return gpu::traits::prologue_run(kLayout);
}
using gpu::traits::fused_smem_bytes;

// Registers: blocks of 8 warps an SM the vk step must hold (32 warps fp32,
// 24 16-bit; the fused kernels 2, at 128 registers).                     #vk-ring
template <typename T, bool kFused>
constexpr int vk_min_blocks() {
  return GDN_VK_RING && !kFused ? (sizeof(T) == 4 ? 1024 : 768) / (8 * kWarp) : 2 / (1 + !GDN_VK_RING);
}
// Blocks of the kv step an SM must hold: 1024 threads up to Dk = 128 (64
// registers), 2 at Dk = 256 (128 registers, no spills).                  #kv-tile
template <int kDk, int kW>
constexpr int kv_step_min_blocks() {
  return kDk <= 128 ? 1024 / (kW * kWarp) : 2;
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
