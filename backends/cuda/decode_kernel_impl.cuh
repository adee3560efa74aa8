// Kernel bodies of decode_kernel.cuh; included by one .cu per state dtype so
// the instantiations compile in parallel.
#pragma once

#include "decode_kernel.cuh"

namespace gdn {
namespace cuda {

// Sum over the `kSpan` lanes that differ only in bits [kLow, kLow * kSpan):
// a fixed butterfly, so the order never depends on the launch.
template <int kLow, int kSpan>
__device__ __forceinline__ float reduce_lanes(float x) {
#pragma unroll
  for (int off = kLow * kSpan / 2; off >= kLow; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Per-block prologue shared by both layouts: slots, padding, counting.
struct RowSlots {
  int64_t s_in, s_out;
  bool write;
};

__device__ __forceinline__ RowSlots row_slots(const DecodeParams& p, int64_t b, int h, int blk) {
  RowSlots r{b, b, true};
  if (p.index_dtype != IndexType::kNone) {
    r.s_in = load_index(p.state_indices, p.index_dtype, b);
    r.s_out = p.state_out_indices ? load_index(p.state_out_indices, p.index_dtype, b) : r.s_in;
    // Count each out-of-range index once per row: only the row's first block does.
    if (p.invalid_index_count != nullptr && h == 0 && blk == 0 && threadIdx.x == 0) {
      const unsigned bad = unsigned(r.s_in >= p.num_slots) +
                           unsigned(p.state_out_indices != nullptr && r.s_out >= p.num_slots);
      if (bad) atomicAdd(p.invalid_index_count, bad);
    }
  }
  r.write = r.s_out >= 0 && r.s_out < p.num_slots;
  return r;
}

// 1 / norm from a sum of squares, per the l2norm convention.
__device__ __forceinline__ float inv_norm(float ss, L2Norm mode, float eps) {
  if (mode == L2Norm::kNone) return 1.0f;
  // rsqrt mode: 1 / sqrt(sum x^2 + eps); max-norm mode: 1 / max(||x||, eps)
  return mode == L2Norm::kRsqrt ? rsqrtf(ss + eps) : 1.0f / fmaxf(sqrtf(ss), eps);
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

template <typename T, Layout kLayout, int kDk, int kP>
__global__ void __launch_bounds__(256)
    decode_kernel(const __grid_constant__ DecodeParams p, int items_per_head, int items_per_warp,
                  int blocks_per_head, float scale) {
  constexpr int kColsPerItem = cols_per_item<T, kLayout, kDk, kP>();
  using VkT = VkTile<T, kDk, kP>;
  using KvT = KvTile<T, kDk, kP>;
  using V = Vec<T>;
  constexpr int kVec = V::kN;
  // What a lane holds. vk: kOuter columns x kInner chunks of kVec rows.
  // kv: kOuter rows x one chunk of kVec columns.
  constexpr int kOuter = kLayout == Layout::kVK ? VkT::kUnroll : KvT::kRowsPerLane;
  constexpr int kInner = kLayout == Layout::kVK ? VkT::kChunksPerLane : 1;
  // Rows (Dk indices) a lane holds, and the lanes that together hold all of Dk.
  constexpr int kRowsHeld = kLayout == Layout::kVK ? kInner * kVec : kOuter;
  constexpr int kColsHeld = kLayout == Layout::kVK ? kOuter : kVec;
  constexpr int kReduceLow = kLayout == Layout::kVK ? 1 : KvT::kGroups;
  constexpr int kReduceSpan = kLayout == Layout::kVK ? VkT::kLanesPerCol : KvT::kRowLanes;

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int64_t row_head = blockIdx.x / blocks_per_head;
  const int blk = int(blockIdx.x % blocks_per_head);
  const int64_t b = row_head / Hv;
  const int h = int(row_head % Hv);
  const int warps = int(blockDim.x / kWarp);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t o_base = b * p.o_batch_stride + int64_t(h) * p.o_head_stride;

  const RowSlots slots = row_slots(p, b, h, blk);
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    // Padding row: zero this block's outputs, touch no state.
    const int j0 = blk * warps * items_per_warp * kColsPerItem;
    const int j_end = min(Dv, j0 + warps * items_per_warp * kColsPerItem);
    for (int j = j0 + threadIdx.x; j < j_end; j += blockDim.x) store_any(p.o, p.o_dtype, o_base + j, 0.0f);
    return;
  }
  int item = (blk * warps + warp) * items_per_warp;
  // Warps past the last item of the head (Dv not a multiple of the block's columns).
  if (item >= items_per_head) return;
  const int item_end = min(items_per_head, item + items_per_warp);

  // ---- where this lane's data lives
  // rows[r]: the Dk index of held row r; cols[c]: the Dv index of held column
  // c, as an offset from the item's first column.
  int rows[kRowsHeld], cols[kColsHeld];
  if constexpr (kLayout == Layout::kVK) {
    const int col_lane = lane % VkT::kLanesPerCol, step_col = lane / VkT::kLanesPerCol;
#pragma unroll
    for (int c = 0; c < kInner; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) rows[c * kVec + e] = (c * VkT::kLanesPerCol + col_lane) * kVec + e;
#pragma unroll
    for (int u = 0; u < kOuter; ++u) cols[u] = u * VkT::kColsPerStep + step_col;
  } else {
    const int r = lane / KvT::kGroups, grp = lane % KvT::kGroups;
#pragma unroll
    for (int t = 0; t < kOuter; ++t) rows[t] = r + t * KvT::kRowLanes;
#pragma unroll
    for (int e = 0; e < kVec; ++e) cols[e] = grp * kVec + e;
  }

  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  const int64_t v_base = b * p.v_batch_stride + int64_t(h) * p.v_head_stride;

  // State vector (o, c) of the item starting at column j0: row i, column j, offset.
  auto vec_row = [&](int o, int c) { return kLayout == Layout::kVK ? rows[c * kVec] : rows[o]; };
  auto vec_col = [&](int o, int j0) { return j0 + (kLayout == Layout::kVK ? cols[o] : cols[0]); };
  auto vec_off = [&](int i, int j) {
    // vk: element (i, j) at j*Dk + i; kv: at i*Dv + j
    return kLayout == Layout::kVK ? int64_t(j) * Dk + i : int64_t(i) * Dv + j;
  };
  // Loads of one item: its state vectors (each entirely in range or out) and its v values.
  auto load_item = [&](int it, V (&s)[kOuter][kInner], float (&vj)[kColsHeld]) {
    const int j0 = it * kColsPerItem;
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        const int i = vec_row(o, c), j = vec_col(o, j0);
        if (i < Dk && j < Dv)
          s[o][c] = *reinterpret_cast<const V*>(s_in + vec_off(i, j));
        else
#pragma unroll
          for (int e = 0; e < kVec; ++e) s[o][c].x[e] = Elem<T>::from_float(0.0f);
      }
#pragma unroll
    for (int c = 0; c < kColsHeld; ++c)
      vj[c] = j0 + cols[c] < Dv ? load_any(p.v, p.qkv_dtype, v_base + j0 + cols[c]) : 0.0f;
  };

  // ---- 1. every load up front: the first item's state, then q, k, v and the
  // gates, so one memory latency covers them all.
  V s[kOuter][kInner];
  float vj[kColsHeld];
  load_item(item, s, vj);

  const int G = Hv / p.num_k_heads;
  const int hk = p.head_map == HeadMap::kInterleaved ? h / G : h % p.num_k_heads;
  const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
  const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
  float qh[kRowsHeld], kh[kRowsHeld];
#pragma unroll
  for (int r = 0; r < kRowsHeld; ++r) {
    qh[r] = rows[r] < Dk ? load_any(p.q, p.qkv_dtype, q_base + rows[r]) : 0.0f;
    kh[r] = rows[r] < Dk ? load_any(p.k, p.qkv_dtype, k_base + rows[r]) : 0.0f;
  }
  const float a = load_any(p.a, p.ab_dtype, b * p.a_batch_stride + h);
  const float braw = load_any(p.b, p.ab_dtype, b * p.b_batch_stride + h);
  float g, beta;
  if (p.gate == Gate::kRaw) {
    // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
    g = -expf(p.A_log[h]) * softplus(a + p.dt_bias[h]);
    beta = 1.0f / (1.0f + expf(-braw));
  } else {
    g = a;
    beta = braw;
  }
  const float decay = expf(g);

  // ---- 2. l2norm: the lanes of a column group hold all of Dk between them
  float qq = 0.0f, kk = 0.0f;
#pragma unroll
  for (int r = 0; r < kRowsHeld; ++r) {
    qq += qh[r] * qh[r];
    kk += kh[r] * kh[r];
  }
  qq = reduce_lanes<kReduceLow, kReduceSpan>(qq);
  kk = reduce_lanes<kReduceLow, kReduceSpan>(kk);
  const float inv_q = inv_norm(qq, p.l2norm, p.l2norm_eps);
  const float inv_k = inv_norm(kk, p.l2norm, p.l2norm_eps);
#pragma unroll
  for (int r = 0; r < kRowsHeld; ++r) {
    qh[r] *= inv_q;
    kh[r] *= inv_k;
  }
  // One lane of each column group writes the group's outputs.
  const bool writer = kLayout == Layout::kVK ? lane % VkT::kLanesPerCol == 0 : lane / KvT::kGroups == 0;

  // ---- 3. the warp's items, the next one's loads in flight while this one computes
  for (;;) {
    const bool has_next = item + 1 < item_end;
    V s_next[kOuter][kInner];
    float v_next[kColsHeld];
    if (has_next) load_item(item + 1, s_next, v_next);

    const int j0 = item * kColsPerItem;
    // The state element (held row r, held column c):
    auto elem = [&](int r, int c) -> float {
      return kLayout == Layout::kVK ? Elem<T>::to_float(s[c][r / kVec].x[r % kVec])
                                    : Elem<T>::to_float(s[r][0].x[c]);
    };
    // u = exp(g) S^T k_hat;  delta = beta (v - u)
    float delta[kColsHeld], out[kColsHeld];
#pragma unroll
    for (int c = 0; c < kColsHeld; ++c) {
      float acc = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsHeld; ++r) acc += elem(r, c) * kh[r];
      acc = reduce_lanes<kReduceLow, kReduceSpan>(acc);
      delta[c] = beta * (vj[c] - decay * acc);
      out[c] = 0.0f;
    }
    // S' = exp(g) S + k_hat delta;  o = scale S'^T q_hat
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int ci = 0; ci < kInner; ++ci) {
        V n;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int r = kLayout == Layout::kVK ? ci * kVec + e : o;
          const int c = kLayout == Layout::kVK ? o : e;
          const float sn = decay * elem(r, c) + kh[r] * delta[c];
          out[c] += sn * qh[r];
          n.x[e] = Elem<T>::from_float(sn);
        }
        const int i = vec_row(o, ci), j = vec_col(o, j0);
        if (slots.write && i < Dk && j < Dv) *reinterpret_cast<V*>(s_out + vec_off(i, j)) = n;
      }
#pragma unroll
    for (int c = 0; c < kColsHeld; ++c) out[c] = reduce_lanes<kReduceLow, kReduceSpan>(out[c]);
    if (writer)
#pragma unroll
      for (int c = 0; c < kColsHeld; ++c)
        if (j0 + cols[c] < Dv) store_any(p.o, p.o_dtype, o_base + j0 + cols[c], scale * out[c]);

    if (!has_next) break;
    ++item;
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) s[o][c] = s_next[o][c];
#pragma unroll
    for (int c = 0; c < kColsHeld; ++c) vj[c] = v_next[c];
  }
}

template <typename T, Layout kLayout, int kDk, int kP>
Launch plan_launch(const DecodeParams& p, int sms, int max_items_per_warp) {
  constexpr int cpi = cols_per_item<T, kLayout, kDk, kP>();
  Launch g;
  g.items_per_head = (p.head_dim_v + cpi - 1) / cpi;
  const int64_t heads = p.batch * p.num_v_heads;
  // Enough warps to keep every SM's memory pipe busy: ~32 per SM. Below that,
  // a warp streams one item (latency-bound: spread the work as wide as it
  // goes); above it, warps stream several consecutive items each.
  const int64_t want_warps = int64_t(32) * sms;
  int ipw = 1;
  while (ipw * 2 <= max_items_per_warp && ipw * 2 <= g.items_per_head &&
         heads * g.items_per_head / (ipw * 2) >= want_warps)
    ipw *= 2;
  const int warps_per_head = (g.items_per_head + ipw - 1) / ipw;
  // Largest power-of-two block up to 8 warps that the head's warps fill,
  // halved while the grid would leave SMs short of blocks (split V across
  // more blocks as B * Hv shrinks; the per-warp work never changes).
  int w = 1;
  while (w * 2 <= warps_per_head && w * 2 <= 8) w *= 2;
  while (w > 1 && heads * ((warps_per_head + w - 1) / w) < int64_t(4) * sms) w /= 2;
  g.items_per_warp = ipw;
  g.warps_per_block = w;
  g.blocks_per_head = (warps_per_head + w - 1) / w;
  return g;
}

template <typename T, Layout kLayout, int kDk, int kP>
cudaError_t launch_decode(const DecodeParams& p, const Launch& g, cudaStream_t stream) {
  const float scale = effective_scale(p);
  const int64_t blocks = p.batch * p.num_v_heads * g.blocks_per_head;
  decode_kernel<T, kLayout, kDk, kP><<<dim3(unsigned(blocks)), dim3(g.warps_per_block * kWarp), 0, stream>>>(
      p, g.items_per_head, g.items_per_warp, g.blocks_per_head, scale);
  return cudaGetLastError();
}

// The shipped tile parameter of (T, L) at Dk capacity D.
#define GDN_INSTANTIATE_DECODE_ONE(T, L, D)                                                      \
  template Launch plan_launch<T, L, D, default_tile_param<T, L>()>(const DecodeParams&, int, int); \
  template cudaError_t launch_decode<T, L, D, default_tile_param<T, L>()>(                       \
      const DecodeParams&, const Launch&, cudaStream_t);

#define GDN_INSTANTIATE_DECODE(T)                     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kVK, 64)      \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kVK, 128)     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kVK, 256)     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kKV, 64)      \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kKV, 128)     \
  GDN_INSTANTIATE_DECODE_ONE(T, Layout::kKV, 256)

}  // namespace cuda
}  // namespace gdn
