// Every compile-time choice of the GPU kernels, as plain constexpr functions
// of (build, state dtype size, layout, Dk capacity, tile), so that the kernels
// (traits.cuh turns them into template constants) and the host planner
// (plan.cpp, unit-tested on a CPU) read the same numbers. The measured reason
// behind each choice is in docs/decisions.md under the anchor named beside it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdnkit/types.hpp"

namespace gdn {
namespace gpu {

// What a backend build carries: set from the vendor header (vendors/*.h) by
// traits.cuh, and read by the planner from DeviceInfo.
struct BuildConfig {
  int warp{32};               // lanes of a (logical) warp: 32 NVIDIA, 64 AMD gfx9
  int vk_stages{2};           // vk ring stages (1: no cp.async)          #vk-ring
  bool vk_ring{true};         // vk state through a shared ring (cp.async)  #vk-ring
  bool l2_hints{true};        // the step's L2-policy instantiations        #l2-hints
  bool vk_wave{true};         // decode_vk_wave_kernel built                #vk-wave-kernel
  bool sm90_kernels{true};    // cluster and PDL twins built (CUDA, not HIP) #norm-epilogue
  size_t max_block_smem{227 * 1024};  // shared memory a block may opt in to
};

namespace traits {

// A 16-byte vector of state elements.
constexpr int vec_elems(int state_bytes) { return 16 / state_bytes; }

// vk: state values a lane holds per item: 16 for fp32, 32 for 16-bit states.  #vk-tile
// kv: warps of a tile = 16-byte chunks of each row (128-byte segments).        #kv-tile
constexpr int default_tile(int state_bytes, Layout layout) {
  return layout == Layout::kVK ? (state_bytes == 4 ? 16 : 32) : 8;
}
// kv in one-round grids: 4-warp tiles, one a block (B = 1).                   #kv-small-tile
constexpr int kKvSmallW = 4;
// Items a vk warp streams at most (3 fp32, 2 16-bit); tiles a kv block, 4.    #vk-items-per-warp
constexpr int default_items_per_warp(int state_bytes, Layout layout) {
  return layout == Layout::kVK ? (state_bytes == 4 ? 3 : 2) : 4;
}
// Largest group a fused block owns (Hv / Hk heads): a vk warp a head, 8 a block.
constexpr int kMaxFusedGroup = 8;

// kv ring stages: 3 for fp32 states, 2 for 16-bit; 1 without cp.async.       #kv-tile
constexpr int kv_stages(const BuildConfig& c, int state_bytes) {
  return c.vk_stages < 2 ? c.vk_stages : state_bytes == 4 ? 3 : 2;
}
// The kv step's ring: 3 for 16-bit states at Dk <= 64 too (two tiles a block). #kv-small-heads
constexpr int kv_step_stages(const BuildConfig& c, int state_bytes, int dk) {
  return dk <= 64 && kv_stages(c, state_bytes) == 2 ? 3 : kv_stages(c, state_bytes);
}

// vk ([Dv, Dk], Dk contiguous): a column is one contiguous row of Dk
// elements. lanes_per_col lanes share a column, each holding chunks_per_lane
// 16-byte chunks; a warp-step covers warp / lanes_per_col columns, unroll
// steps make an item of about `tile` state values a lane.
struct VkGeom {
  int vec, chunks, lanes_per_col, chunks_per_lane, cols_per_step, unroll, cols_per_item;
};
constexpr VkGeom vk_geom(int warp, int state_bytes, int dk, int tile) {
  const int vec = vec_elems(state_bytes);
  const int chunks = dk / vec;
  const int lanes = chunks < warp ? chunks : warp;
  const int per_lane = chunks / lanes;
  const int unroll = tile / (per_lane * vec) > 0 ? tile / (per_lane * vec) : 1;
  return VkGeom{vec, chunks, lanes, per_lane, warp / lanes, unroll, (warp / lanes) * unroll};
}

// kv ([Dk, Dv], Dv contiguous): a block of w warps owns a tile of w 16-byte
// chunks of every row, cols = w * vec consecutive columns; thread t copies
// chunk t % w of rows t / w + warp * n (n < rows).
struct KvGeom {
  int vec, cols, rows, threads;
};
constexpr KvGeom kv_geom(int warp, int state_bytes, int dk, int w) {
  return KvGeom{vec_elems(state_bytes), w * vec_elems(state_bytes), dk / warp, w * warp};
}

constexpr int cols_per_item(int warp, int state_bytes, Layout layout, int dk, int tile) {
  return layout == Layout::kVK ? vk_geom(warp, state_bytes, dk, tile).cols_per_item
                               : kv_geom(warp, state_bytes, dk, tile).cols;
}

// L2 policies on the state's traffic (bits): S' stored evict-first; copies
// asking L2 for the whole 256-byte block. Which pay differs by tile.         #l2-hints
constexpr int kL2EvictFirst = 1;
constexpr int kL2Fetch256 = 2;
constexpr int step_l2_hints(int state_bytes, Layout layout, int dk, int w) {
  if (layout == Layout::kVK) return kL2EvictFirst;
  if (state_bytes == 4 || (w == kKvSmallW && dk > 128)) return kL2EvictFirst | kL2Fetch256;
  return w == kKvSmallW ? kL2EvictFirst : 0;
}
// The fused middle's kernels store S' evict-first always.                     #l2-hints
constexpr int kFusedL2Hints = kL2EvictFirst;

// Channels a thread's conv prologue run takes at most: 4 (vk), 2 (kv, 64 registers).
constexpr int prologue_run(Layout layout) { return layout == Layout::kKV ? 2 : 4; }
// The bytes of one run's vector word (RawRun: up to 16).
constexpr int prologue_run_bytes(Layout layout, int io_bytes) {
  return prologue_run(layout) * io_bytes < 16 ? prologue_run(layout) * io_bytes : 16;
}

// Dynamic shared memory of the kv step kernel: its ring.
constexpr size_t kv_step_smem_bytes(const BuildConfig& c, int state_bytes, int dk, int w) {
  const KvGeom g = kv_geom(c.warp, state_bytes, dk, w);
  return size_t(kv_step_stages(c, state_bytes, dk)) * size_t(g.rows) * size_t(g.threads) * 16;
}
// A block's ring: vk kStages items a warp (none without cp.async); kv (the
// fused kernel's) kv_stages tiles.
constexpr size_t ring_smem_bytes(const BuildConfig& c, int state_bytes, Layout layout, int dk, int tile,
                                 int warps_per_block) {
  if (layout == Layout::kKV) {
    const KvGeom g = kv_geom(c.warp, state_bytes, dk, tile);
    return size_t(kv_stages(c, state_bytes)) * size_t(g.rows) * size_t(g.threads) * 16;
  }
  if (!c.vk_ring) return 0;
  const VkGeom g = vk_geom(c.warp, state_bytes, dk, tile);
  return size_t(warps_per_block) * size_t(c.vk_stages) * size_t(c.warp) * 16 * size_t(g.unroll * g.chunks_per_lane);
}
// Shared memory of the fused stages after the ring (floats): the mbarrier,
// conv'd q and k, the block's v, the group's raw outputs, silu(z), the norm
// weight, the gates and rstd, and (cluster) the shifted q/k windows.          #fused-groups
constexpr size_t fused_smem_bytes(int G, int Dk, int Dv, bool cluster) {
  return sizeof(float) * size_t(4 + 2 * Dk + 3 * G * Dv + Dv + 3 * G + (cluster ? 3 * 2 * Dk : 0));
}

// The multi-token kernel's shared memory (docs/decisions.md#token-kernel), as
// offsets in floats from its start: (ring on) the state's ring, `ring_stages`
// rounds of every thread's vectors; every token's l2-normalized q and k of the
// group's k-head, k_hat . q_hat, the gates of the G heads, v of the block's
// `vcols` group columns, (per-channel beta) their betas in v's shape, (norm
// on) every raw output of the group, and the tokens' write slots (int64,
// 8-byte aligned). One function for the planner and the kernel, so both lay
// it out alike.
struct TokenSmem {
  int ring, ring_stages, qn, kn, kq, decay, beta, v, beta_cols, out, slots;
  int bytes;
};
constexpr TokenSmem token_smem(int T, int dk, int dv, int G, int vcols, bool norm, bool beta_per_channel,
                               int ring_stages = 0, int ring_vecs_per_stage = 0) {
  TokenSmem s{};
  int f = 0;
  s.ring = f;
  s.ring_stages = ring_stages;
  f += ring_stages * ring_vecs_per_stage * 4;  // (16-byte vectors; the start is 16-byte aligned)
  s.qn = f;
  f += T * dk;
  s.kn = f;
  f += T * dk;
  s.kq = f;
  f += T;
  s.decay = f;
  f += T * G;
  s.beta = f;
  f += T * G;
  s.v = f;
  f += T * vcols;
  s.beta_cols = f;
  f += beta_per_channel ? T * vcols : 0;
  s.out = f;
  f += norm ? T * G * dv : 0;
  f = (f + 1) / 2 * 2;
  s.slots = f;
  f += 2 * T;
  s.bytes = f * 4;
  return s;
}
// Its block: 8 warps. A vk warp, or a kv block, runs token_units items
// (tiles) at once, so that their reductions' latencies overlap: 2 for fp32
// states, 1 for 16-bit ones, whose second unit spilled at 128 registers.  #token-kernel
constexpr int kTokenWarps = 8;
constexpr int token_units(int state_bytes) { return state_bytes == 4 ? 2 : 1; }
// 16-byte state vectors a thread holds for one round of units: token_units
// times a vk lane's item (unroll x chunks) or a kv thread's rows of a tile.
constexpr int token_round_vecs(int warp, int state_bytes, Layout layout, int dk_cap) {
  const VkGeom vk = vk_geom(warp, state_bytes, dk_cap, default_tile(state_bytes, layout));
  const int item =
      layout == Layout::kVK ? vk.unroll * vk.chunks_per_lane : kv_geom(warp, state_bytes, dk_cap, kTokenWarps).rows;
  return token_units(state_bytes) * item;
}
// The dynamic shared memory it may use: a block's, less 8 KiB for the kv
// tile's static partial sums.
constexpr size_t token_smem_limit(const BuildConfig& c) { return c.max_block_smem - 8 * 1024; }

}  // namespace traits
}  // namespace gpu
}  // namespace gdn
