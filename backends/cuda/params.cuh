// The kernels' parameter blocks, each with ONE builder from DecodeParams:
// KernelParams (the step and vk fused kernels), WaveParams (the one-wave
// kernel), FusedArgs (the fused kernels' divisors). decode_kv_fused_kernel
// takes DecodeParams itself (docs/decisions.md#kernel-params).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/fastdiv.cuh"
#include "gdnkit/params.hpp"
#include "traits.h"

namespace gdn {
namespace GDN_KERNEL_NS {

// The kernels' copy of DecodeParams (all but decode_kv_fused_kernel, which says
// why): the fields device code reads, same names, in the order a call needs
// them. Blocks fetch the parameter bank cold, 64 bytes at a time, a warp waiting
// for each line in turn; so what a block reads before its loads (row, slots,
// addresses of q, k, v, gates, state) comes first, 0x240 (behind the launch's
// 45 bytes of scalars) to 0x300: 5 lines counting the driver's. The rest
// arrives while the loads are in flight (docs/decisions.md#kernel-params).
struct KernelParams {
  // ---- before the first loads
  int32_t num_k_heads, num_v_heads, head_dim_k, head_dim_v;
  IndexType index_dtype;
  Gate gate;
  HeadMap head_map;
  bool programmatic_launch;
  int64_t num_slots;
  void const* state_indices;
  void const* state_out_indices;
  void* state;
  int64_t state_slot_stride;
  void const* q;
  int64_t q_batch_stride, q_head_stride;
  void const* k;
  int64_t k_batch_stride, k_head_stride;
  void const* v;
  int64_t v_batch_stride, v_head_stride;
  void const* a;
  int64_t a_batch_stride;
  void const* b;
  int64_t b_batch_stride;
  float const* A_log;
  float const* dt_bias;
  // ---- once the loads are in flight
  void* o;
  int64_t o_batch_stride, o_head_stride;
  uint32_t* invalid_index_count;
  L2Norm l2norm;
  float l2norm_eps;
  DType o_dtype, qkv_dtype, ab_dtype;
  // ---- the fused options (conv prologue, gated-RMSNorm epilogue)
  int32_t conv_width;
  float norm_eps;
  void const* x;
  int64_t x_batch_stride;
  void* conv_state;
  int64_t conv_state_slot_stride, conv_state_channel_stride, conv_state_tap_stride;
  void const* conv_weight;
  void const* conv_bias;
  void const* z;
  int64_t z_batch_stride, z_head_stride;
  void const* norm_weight;
};
// The first part: 192 bytes, from 0x240 to the 64-byte boundary at 0x300.
static_assert(offsetof(KernelParams, o) == 192, "KernelParams: what a block reads before its loads, 3 lines");

inline KernelParams kernel_params(const DecodeParams& p) {
  KernelParams k;
  k.num_k_heads = p.num_k_heads;
  k.num_v_heads = p.num_v_heads;
  k.head_dim_k = p.head_dim_k;
  k.head_dim_v = p.head_dim_v;
  k.index_dtype = p.index_dtype;
  k.gate = p.gate;
  k.head_map = p.head_map;
  k.programmatic_launch = p.programmatic_launch;
  k.num_slots = p.num_slots;
  k.state_indices = p.state_indices;
  k.state_out_indices = p.state_out_indices;
  k.state = p.state;
  k.state_slot_stride = p.state_slot_stride;
  k.q = p.q;
  k.q_batch_stride = p.q_batch_stride;
  k.q_head_stride = p.q_head_stride;
  k.k = p.k;
  k.k_batch_stride = p.k_batch_stride;
  k.k_head_stride = p.k_head_stride;
  k.v = p.v;
  k.v_batch_stride = p.v_batch_stride;
  k.v_head_stride = p.v_head_stride;
  k.a = p.a;
  k.a_batch_stride = p.a_batch_stride;
  k.b = p.b;
  k.b_batch_stride = p.b_batch_stride;
  k.A_log = p.A_log;
  k.dt_bias = p.dt_bias;
  k.o = p.o;
  k.o_batch_stride = p.o_batch_stride;
  k.o_head_stride = p.o_head_stride;
  k.invalid_index_count = p.invalid_index_count;
  k.l2norm = p.l2norm;
  k.l2norm_eps = p.l2norm_eps;
  k.o_dtype = p.o_dtype;
  k.qkv_dtype = p.qkv_dtype;
  k.ab_dtype = p.ab_dtype;
  k.conv_width = p.conv_width;
  k.norm_eps = p.norm_eps;
  k.x = p.x;
  k.x_batch_stride = p.x_batch_stride;
  k.conv_state = p.conv_state;
  k.conv_state_slot_stride = p.conv_state_slot_stride;
  k.conv_state_channel_stride = p.conv_state_channel_stride;
  k.conv_state_tap_stride = p.conv_state_tap_stride;
  k.conv_weight = p.conv_weight;
  k.conv_bias = p.conv_bias;
  k.z = p.z;
  k.z_batch_stride = p.z_batch_stride;
  k.z_head_stride = p.z_head_stride;
  k.norm_weight = p.norm_weight;
  return k;
}

// The one-wave kernel's parameters (docs/decisions.md#vk-wave-kernel): what
// a block reads before its loads, in the order it reads it (3 constant
// lines); a row's offsets are 32-bit, which the planner checks (wave_call,
// plan.cpp).
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

// The one-wave kernel's parameters for p (the planner checked that every
// row offset fits 32 bits).
inline WaveParams wave_params(const DecodeParams& p, unsigned items, float scale) {
  WaveParams d;
  d.items = items;
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
  return d;
}

// The multi-token kernel's one argument (docs/decisions.md#token-kernel): its
// geometry, prepared by the launch from the Plan, and the caller's
// DecodeParams unchanged. A block owns units (vk items, kv tiles) of one
// group, row b and k-head hk with its G v-heads: blockIdx = (b * Hk + hk) *
// parts + part, the group's units [part * units_per_block, ...) in order
// (unit u: member u / units_per_head, item or tile u % units_per_head).
struct TokenGeometry {
  FastDiv by_parts;     // blockIdx -> group b * Hk + hk
  FastDiv by_hk;        // group -> b
  int units_per_head;   // vk items / kv tiles of a head
  int units_per_block;  // the group's consecutive units a block takes
  int group_heads;      // G = Hv / Hk
  float scale;
  gpu::traits::TokenSmem smem;
};
struct TokenArgs {
  TokenGeometry geo;
  DecodeParams p;
};

// What the launch prepares for the fused kernels: divisors for the block's
// coordinates (the cluster size; the warps (vk) or tiles (kv) of a head;
// docs/decisions.md#fastdiv), and vector_runs (Plan::vector_runs): the
// prologue's runs may load as vector words, the block's own offset aside
// (prologue_runs_aligned).
struct FusedArgs {
  FastDiv cluster, per_head;
  bool vector_runs{false};
};

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
