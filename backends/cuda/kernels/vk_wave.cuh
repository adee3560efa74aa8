// vk: the engines' call in one wave (decode_vk_wave_kernel), registers only.
#pragma once

#include "vk_step.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

#if GDN_VK_WAVE
// ---- the plan's kVkWave kernel (plan.h) ----------------------------------------
// The engines' call (one dtype for q/k/v/a/b/o, packed heads, raw gates, the
// interleaved head map, Dk = Dv = 128, dense or pooled) where every item has a
// resident warp from the start: one round of memory latency, which the ring
// kernel's machinery only lengthens. A warp computes one item, the state
// straight in registers: no shared memory, no barrier, at most 64 registers (4
// blocks of 8 warps an SM). Items, lanes and sums are decode_vk's, so are the
// bits: batch invariance holds across the switch (docs/decisions.md#vk-wave-kernel).

// Warp gw = blockIdx.x * W + warp is item gw % kItems of head gw / kItems = b * Hv + h.
// kIndexed: through the pool's slot indices, as decode_vk; else row b in slot b.
// kPdl (sm_90): the state's loads, the wait, and only then inputs read or anything written.
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
  // (before the loads, where decode_vk counts after them: measured the better
  // order here)
  if constexpr (!kPdl) count_bad();
  // Held row r = col_lane * kVec + e, held column o = j0 + o * kStep +
  // step_col; the lane's output column out_col (decode_vk's numbering).
  const int col_lane = lane % kSpan, step_col = lane / kSpan;
  const int out_col = Pass::col(lane) * kStep + step_col;
  // Element (i, j) of a head lies at j * Dk + i: one address a lane, the
  // held columns at constant offsets from it.
  const int lane_off = h * kD * kD + (j0 + step_col) * kD + col_lane * kVec;
  // (dense: below 2^31, which the planner checks; a pool may be larger)
  const T* const s = static_cast<const T*>(p.state) +
                     (kIndexed ? s_in * p.state_slot_stride + lane_off
                               : int(b) * int(p.state_slot_stride) + lane_off);
  // (the write slot's address formed at the stores, from a 32-bit slot: a
  // 64-bit pointer fewer held through the sums)
  const unsigned w_slot = unsigned(s_out);
  // The small loads first (the longer path), as raw words, then the state's,
  // kept behind them by the fence. Under PDL the state's go before the wait: the
  // previous kernel may still be writing the inputs.
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
  // A 16-bit state's words are made opaque to the compiler (the empty asm), so S'
  // widens them again (one instruction an element) instead of keeping the floats
  // the sums widened live: through a pool those spilled the 64 registers. Same
  // values, same bits.
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

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
