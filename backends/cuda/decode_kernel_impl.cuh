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

// 1 / norm of a Dk vector in shared memory, per the l2norm convention. Each
// warp computes it itself in the same fixed order (no cross-warp dependency).
__device__ __forceinline__ float inv_norm(const float* x, int Dk, L2Norm mode, float eps) {
  if (mode == L2Norm::kNone) return 1.0f;
  const int lane = threadIdx.x % kWarp;
  float ss = 0.0f;
  for (int i = lane; i < Dk; i += kWarp) ss += x[i] * x[i];
  ss = reduce_lanes<1, kWarp>(ss);
  // rsqrt mode: 1 / sqrt(sum x^2 + eps); max-norm mode: 1 / max(||x||, eps)
  return mode == L2Norm::kRsqrt ? rsqrtf(ss + eps) : 1.0f / fmaxf(sqrtf(ss), eps);
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

template <typename T, Layout kLayout, int kDk>
__global__ void __launch_bounds__(256)
    decode_kernel(const __grid_constant__ DecodeParams p, int items_per_head, int blocks_per_head,
                  float scale) {
  constexpr int kColsPerItem = cols_per_item<T, kLayout, kDk>();
  using VkT = VkTile<T, kDk>;
  using KvT = KvTile<T, kDk>;
  using V = Vec<T>;
  constexpr int kVec = V::kN;
  // State values a lane holds: (unroll or rows) x chunks, each a 16-byte vector.
  constexpr int kOuter = kLayout == Layout::kVK ? VkT::kUnroll : KvT::kRowsPerLane;
  constexpr int kInner = kLayout == Layout::kVK ? VkT::kChunksPerLane : 1;

  __shared__ float q_s[kDk];
  __shared__ float k_s[kDk];

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int64_t row_head = blockIdx.x / blocks_per_head;
  const int blk = int(blockIdx.x % blocks_per_head);
  const int64_t b = row_head / Hv;
  const int h = int(row_head % Hv);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int item = blk * int(blockDim.x / kWarp) + warp;
  const int c0 = item * kColsPerItem;  // first column of this warp's item
  const int64_t o_base = b * p.o_batch_stride + int64_t(h) * p.o_head_stride;

  const RowSlots slots = row_slots(p, b, h, blk);
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    // Padding row: zero this block's outputs, touch no state.
    const int j_end = min(Dv, (blk + 1) * int(blockDim.x / kWarp) * kColsPerItem);
    for (int j = blk * int(blockDim.x / kWarp) * kColsPerItem + threadIdx.x; j < j_end; j += blockDim.x)
      store_any(p.o, p.o_dtype, o_base + j, 0.0f);
    return;
  }

  // ---- 1. state loads first: the long-latency traffic goes out before anything else
  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  const bool active = item < items_per_head;

  // Position of this lane's vectors. vk: element (i, j) at j*Dk + i; kv: at i*Dv + j.
  int col[kOuter];     // vk: column of unroll step u; kv: first column of the lane's group
  int row0[kInner];    // vk: first row of chunk c
  int row_kv[kOuter];  // kv: row t
  V s[kOuter][kInner];
  if constexpr (kLayout == Layout::kVK) {
    const int col_lane = lane % VkT::kLanesPerCol, step_col = lane / VkT::kLanesPerCol;
#pragma unroll
    for (int u = 0; u < kOuter; ++u) col[u] = c0 + u * VkT::kColsPerStep + step_col;
#pragma unroll
    for (int c = 0; c < kInner; ++c) row0[c] = (c * VkT::kLanesPerCol + col_lane) * kVec;
#pragma unroll
    for (int u = 0; u < kOuter; ++u)
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        if (active && col[u] < Dv && row0[c] < Dk)
          s[u][c] = *reinterpret_cast<const V*>(s_in + int64_t(col[u]) * Dk + row0[c]);
        else
#pragma unroll
          for (int e = 0; e < kVec; ++e) s[u][c].x[e] = Elem<T>::from_float(0.0f);
      }
  } else {
    const int r = lane / KvT::kGroups, grp = lane % KvT::kGroups;
#pragma unroll
    for (int t = 0; t < kOuter; ++t) {
      col[t] = c0 + grp * kVec;
      row_kv[t] = r + t * KvT::kRowLanes;
      if (active && col[t] < Dv && row_kv[t] < Dk)
        s[t][0] = *reinterpret_cast<const V*>(s_in + int64_t(row_kv[t]) * Dv + col[t]);
      else
#pragma unroll
        for (int e = 0; e < kVec; ++e) s[t][0].x[e] = Elem<T>::from_float(0.0f);
    }
  }

  // ---- 2. q, k of the mapped k-head into shared memory; gates
  const int G = Hv / p.num_k_heads;
  const int hk = p.head_map == HeadMap::kInterleaved ? h / G : h % p.num_k_heads;
  const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
  const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
  for (int i = threadIdx.x; i < kDk; i += blockDim.x) {
    q_s[i] = i < Dk ? load_any(p.q, p.qkv_dtype, q_base + i) : 0.0f;
    k_s[i] = i < Dk ? load_any(p.k, p.qkv_dtype, k_base + i) : 0.0f;
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
  __syncthreads();
  if (!active) return;

  const float inv_q = inv_norm(q_s, Dk, p.l2norm, p.l2norm_eps);
  const float inv_k = inv_norm(k_s, Dk, p.l2norm, p.l2norm_eps);
  const int64_t v_base = b * p.v_batch_stride + int64_t(h) * p.v_head_stride;

  if constexpr (kLayout == Layout::kVK) {
    constexpr int kL = VkT::kLanesPerCol;
    float kh[kInner][kVec], qh[kInner][kVec];
#pragma unroll
    for (int c = 0; c < kInner; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        kh[c][e] = k_s[row0[c] + e] * inv_k;
        qh[c][e] = q_s[row0[c] + e] * inv_q;
      }
#pragma unroll
    for (int u = 0; u < kOuter; ++u) {
      // u = exp(g) * S^T k_hat (this column)
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < kInner; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc += Elem<T>::to_float(s[u][c].x[e]) * kh[c][e];
      acc = reduce_lanes<1, kL>(acc);
      const bool col_ok = col[u] < Dv;
      const float vj = col_ok ? load_any(p.v, p.qkv_dtype, v_base + col[u]) : 0.0f;
      // delta = beta * (v - u)
      const float delta = beta * (vj - decay * acc);
      // S' = exp(g) S + k_hat delta;  o = scale * S'^T q_hat
      float out = 0.0f;
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        V n;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float sn = decay * Elem<T>::to_float(s[u][c].x[e]) + kh[c][e] * delta;
          out += sn * qh[c][e];
          n.x[e] = Elem<T>::from_float(sn);
        }
        if (slots.write && col_ok && row0[c] < Dk)
          *reinterpret_cast<V*>(s_out + int64_t(col[u]) * Dk + row0[c]) = n;
      }
      out = reduce_lanes<1, kL>(out);
      if (col_ok && lane % kL == 0) store_any(p.o, p.o_dtype, o_base + col[u], scale * out);
    }
  } else {
    constexpr int kGroups = KvT::kGroups, kR = KvT::kRowLanes;
    float kh[kOuter], qh[kOuter];
#pragma unroll
    for (int t = 0; t < kOuter; ++t) {
      kh[t] = k_s[row_kv[t]] * inv_k;
      qh[t] = q_s[row_kv[t]] * inv_q;
    }
    const bool col_ok = col[0] < Dv;
    float delta[kVec], out[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      // u = exp(g) * S^T k_hat, for the lane's kVec columns
      float acc = 0.0f;
#pragma unroll
      for (int t = 0; t < kOuter; ++t) acc += Elem<T>::to_float(s[t][0].x[e]) * kh[t];
      acc = reduce_lanes<kGroups, kR>(acc);
      const float vj = col_ok ? load_any(p.v, p.qkv_dtype, v_base + col[0] + e) : 0.0f;
      // delta = beta * (v - u)
      delta[e] = beta * (vj - decay * acc);
      out[e] = 0.0f;
    }
    // S' = exp(g) S + k_hat delta;  o = scale * S'^T q_hat
#pragma unroll
    for (int t = 0; t < kOuter; ++t) {
      V n;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float sn = decay * Elem<T>::to_float(s[t][0].x[e]) + kh[t] * delta[e];
        out[e] += sn * qh[t];
        n.x[e] = Elem<T>::from_float(sn);
      }
      if (slots.write && col_ok && row_kv[t] < Dk)
        *reinterpret_cast<V*>(s_out + int64_t(row_kv[t]) * Dv + col[t]) = n;
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = reduce_lanes<kGroups, kR>(out[e]);
    if (col_ok && lane / kGroups == 0)
#pragma unroll
      for (int e = 0; e < kVec; ++e) store_any(p.o, p.o_dtype, o_base + col[0] + e, scale * out[e]);
  }
}

template <typename T, Layout kLayout, int kDk>
cudaError_t launch_decode(const DecodeParams& p, const Launch& g, cudaStream_t stream) {
  const float scale = effective_scale(p);
  const int64_t blocks = p.batch * p.num_v_heads * g.blocks_per_head;
  decode_kernel<T, kLayout, kDk><<<dim3(unsigned(blocks)), dim3(g.warps_per_block * kWarp), 0, stream>>>(
      p, g.items_per_head, g.blocks_per_head, scale);
  return cudaGetLastError();
}

#define GDN_INSTANTIATE_DECODE(T)                                                                \
  template cudaError_t launch_decode<T, Layout::kVK, 64>(const DecodeParams&, const Launch&,      \
                                                          cudaStream_t);                          \
  template cudaError_t launch_decode<T, Layout::kVK, 128>(const DecodeParams&, const Launch&,     \
                                                           cudaStream_t);                         \
  template cudaError_t launch_decode<T, Layout::kVK, 256>(const DecodeParams&, const Launch&,     \
                                                           cudaStream_t);                         \
  template cudaError_t launch_decode<T, Layout::kKV, 64>(const DecodeParams&, const Launch&,      \
                                                          cudaStream_t);                          \
  template cudaError_t launch_decode<T, Layout::kKV, 128>(const DecodeParams&, const Launch&,     \
                                                           cudaStream_t);                         \
  template cudaError_t launch_decode<T, Layout::kKV, 256>(const DecodeParams&, const Launch&,     \
                                                           cudaStream_t);

}  // namespace cuda
}  // namespace gdn
