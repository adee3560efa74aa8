// Kernel bodies of decode_kernel.cuh; included by one .cu per state dtype so
// the instantiations compile in parallel.
#pragma once

#include "decode_kernel.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// Sums over the `kSpan` lanes that differ only in bits [kLow, kLow * kSpan)
// run as fixed butterflies (warp_shfl_xor, decode_kernel.cuh), so the order
// never depends on the launch.
// The same butterfly for kC values at once, with fewer shuffles: at each of
// the first log2(kC) steps a lane keeps half of its values and sends the other
// half, so the values sum in kC - 1 + log2(kSpan / kC) shuffles instead of
// kC * log2(kSpan). Each value still sums, at every step, its own partial plus
// the partner's over the same lanes in the same order as a one-value
// butterfly would, so the sums are bitwise that butterfly's. Lane l ends up
// with the sum of value
//   col(l) = (l / kStride) % kC,   kStride = kLow * kSpan / kC
// (the bits of the first log2(kC) offsets, highest first, name the value).
template <int kLow, int kSpan, int kC>
__device__ __forceinline__ float reduce_scatter(const float (&v)[kC], int lane) {
  static_assert(kC >= 1 && (kC & (kC - 1)) == 0 && kC <= kSpan, "kC: a power of two up to kSpan");
  float x[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) x[c] = v[c];
#pragma unroll
  for (int n = kC, off = kLow * kSpan / 2; n > 1; n /= 2, off /= 2) {
    // The lane with the offset bit set keeps the upper half x[k + n/2].
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int k = 0; k < n / 2; ++k) {
      const float keep = upper ? x[k + n / 2] : x[k];
      const float send = upper ? x[k] : x[k + n / 2];
      x[k] = keep + warp_shfl_xor(send, off);
    }
  }
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

// The gates of row b, v-head h, both kernels: decay = exp(g) and beta.
struct Gates {
  float decay, beta;
};
template <typename IO>
__device__ __forceinline__ Gates load_gates(const DecodeParams& p, int64_t b, int h) {
  float a = 0.0f, braw = 0.0f;
  with_dtype<IO>(p.ab_dtype, [&](auto tag) {
    using E = decltype(tag);
    a = Elem<E>::to_float(static_cast<const E*>(p.a)[b * p.a_batch_stride + h]);
    braw = Elem<E>::to_float(static_cast<const E*>(p.b)[b * p.b_batch_stride + h]);
  });
  float g, beta;
  if (p.gate == Gate::kRaw) {
    // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
    g = -expf(p.A_log[h]) * softplus(a + p.dt_bias[h]);
    beta = 1.0f / (1.0f + expf(-braw));
  } else {
    g = a;
    beta = braw;
  }
  return Gates{expf(g), beta};
}

// l2norm of q and k, whose Dk rows the kSpan lanes (stride kLow) hold
// between them, kN rows a lane: both sums of squares through one two-value
// butterfly, then every lane scales its rows.
template <int kLow, int kSpan, int kN>
__device__ __forceinline__ void l2_normalize(const DecodeParams& p, int lane, float (&qh)[kN],
                                             float (&kh)[kN]) {
  float qq = 0.0f, kk = 0.0f;
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    qq += qh[r] * qh[r];
    kk += kh[r] * kh[r];
  }
  float ss[2] = {qq, kk};
  all_gather<kLow, kSpan, 2>(reduce_scatter<kLow, kSpan, 2>(ss, lane), lane, ss);
  const float inv_q = inv_norm(ss[0], p.l2norm, p.l2norm_eps);
  const float inv_k = inv_norm(ss[1], p.l2norm, p.l2norm_eps);
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    qh[r] *= inv_q;
    kh[r] *= inv_k;
  }
}

// Minimum blocks of 8 warps per SM: 32 resident warps for fp32 states (64
// registers, no spills) and 24 for 16-bit ones (80 registers, a few bytes of
// spill on some instantiations; at 32 warps ptxas spills hundreds), so many
// warps' ring copies are in flight at once. Before the ring (next items held
// in registers, as the HIP path still does) they needed 80 and 118: 24 and
// 16 warps.
template <typename T, Layout kLayout, int kDk, int kP, typename IO>
__global__ void __launch_bounds__(8 * kWarp, GDN_VK_RING ? (sizeof(T) == 4 ? 1024 : 768) / (8 * kWarp) : 1)
    decode_kernel(const __grid_constant__ DecodeParams p, int items_per_head, int items_per_warp,
                  FastDiv by_blocks_per_head, FastDiv by_hv, FastDiv by_head_map, float scale) {
  // The vk kernel (kv runs decode_kv_kernel below).
  static_assert(kLayout == Layout::kVK, "kv runs decode_kv_kernel");
  constexpr int kColsPerItem = cols_per_item<T, kLayout, kDk, kP>();
  using VkT = VkTile<T, kDk, kP>;
  using V = Vec<T>;
  constexpr int kVec = V::kN;
  // What a lane holds: kOuter columns x kInner chunks of kVec rows.
  constexpr int kOuter = VkT::kUnroll;
  constexpr int kInner = VkT::kChunksPerLane;
  // Rows (Dk indices) a lane holds, and the lanes that together hold all of Dk.
  constexpr int kRowsHeld = kInner * kVec;
  constexpr int kColsHeld = kOuter;
  constexpr int kReduceLow = 1;
  constexpr int kReduceSpan = VkT::kLanesPerCol;

  // Columns a lane holds form one run j0 + cols[0] + c (c < kColsHeld), so v
  // moves as one vector, when a warp-step is one column. A run starts at a multiple of its length, which
  // divides 16 and so Dv: the run is entirely inside Dv or entirely past it.
  constexpr bool kColsRun = VkT::kColsPerStep == 1;
  static_assert(!kColsRun || 16 % kColsHeld == 0, "a column run must divide 16 (and so Dv)");

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  // Block coordinates in 32-bit arithmetic by host-prepared divisors (the
  // grid index is below 2^31): blockIdx = (b * Hv + h) * blocks_per_head + blk.
  const unsigned row_head = by_blocks_per_head.div(blockIdx.x);
  const int blk = int(blockIdx.x - row_head * by_blocks_per_head.d);
  const unsigned b32 = by_hv.div(row_head);
  const int h = int(row_head - b32 * unsigned(Hv));
  const int64_t b = b32;
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
  {
    const int col_lane = lane % VkT::kLanesPerCol, step_col = lane / VkT::kLanesPerCol;
#pragma unroll
    for (int c = 0; c < kInner; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) rows[c * kVec + e] = (c * VkT::kLanesPerCol + col_lane) * kVec + e;
#pragma unroll
    for (int u = 0; u < kOuter; ++u) cols[u] = u * VkT::kColsPerStep + step_col;
  }

  // 64-bit arithmetic once per (slot, head); inside a head every offset is
  // below Dk * Dv <= 65536 and stays 32-bit.
  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  const int64_t v_base = b * p.v_batch_stride + int64_t(h) * p.v_head_stride;

  // State vector (o, c) of the item starting at column j0: row i, column j, offset.
  auto vec_row = [&](int o, int c) { (void)o; return rows[c * kVec]; };
  auto vec_col = [&](int o, int j0) { return j0 + cols[o]; };
  // element (i, j) at j*Dk + i
  auto vec_off = [&](int i, int j) -> int { return j * Dk + i; };
  // v[j0 + cols[c]] for the held columns (0 past Dv): one dtype branch for the group.
  auto load_v = [&](int j0, float (&vj)[kColsHeld]) {
    with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
      using E = decltype(tag);
      const E* vp = static_cast<const E*>(p.v) + v_base + j0;
      if constexpr (kColsRun) {
        if (j0 + cols[0] < Dv) {
          load_run<E, kColsHeld>(vp + cols[0], vj);
        } else {
#pragma unroll
          for (int c = 0; c < kColsHeld; ++c) vj[c] = 0.0f;
        }
      } else {
#pragma unroll
        for (int c = 0; c < kColsHeld; ++c) vj[c] = j0 + cols[c] < Dv ? Elem<E>::to_float(vp[cols[c]]) : 0.0f;
      }
    });
  };
#if GDN_VK_RING
  // The warp's ring of kStages item buffers in shared memory. A lane copies
  // in, and later reads back, only its own kHeld vectors of an item (lanes
  // side by side: conflict-free), so no barrier is ever needed.
  constexpr int kHeld = kOuter * kInner;
  extern __shared__ uint4 smem_raw[];
  V* ring = reinterpret_cast<V*>(smem_raw) + warp * (kStages * kHeld * kWarp) + lane;
  auto slot = [&](int stage, int o, int c) -> V* { return ring + ((stage * kOuter + o) * kInner + c) * kWarp; };
  // Issue the copies of item `it` into ring stage `stage` (nothing past the
  // warp's last item), and close the group either way so group k is item k.
  auto issue_item = [&](int it, int stage) {
    if (it < item_end) {
      const int j0 = it * kColsPerItem;
#pragma unroll
      for (int o = 0; o < kOuter; ++o)
#pragma unroll
        for (int c = 0; c < kInner; ++c) {
          const int i = vec_row(o, c), j = vec_col(o, j0);
          const bool in = i < Dk && j < Dv;
          copy16_async(slot(stage, o, c), in ? s_in + vec_off(i, j) : s_in, in);
        }
    }
    async_commit();
  };
  // This lane's copies of `item` (group `item`) have landed; read them back.
  auto fetch_item = [&](int /*it*/, int stage, V (&s)[kOuter][kInner]) {
    async_wait<kStages - 1>();
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) s[o][c] = *slot(stage, o, c);
  };
#else
  // No cp.async (AMD): a shared-memory ring would only cost LDS, which on
  // gfx9 (64 KiB a CU) would cap the waves a CU holds. The next item loads
  // into registers instead while the current one computes.
  V pre[kOuter][kInner];
  auto issue_item = [&](int it, int) {
    if (it >= item_end) return;
    const int j0 = it * kColsPerItem;
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        const int i = vec_row(o, c), j = vec_col(o, j0);
        if (i < Dk && j < Dv)
          pre[o][c] = *reinterpret_cast<const V*>(s_in + vec_off(i, j));
        else
#pragma unroll
          for (int e = 0; e < kVec; ++e) pre[o][c].x[e] = Elem<T>::from_float(0.0f);
      }
  };
  // The item loaded last becomes current; the one after it starts loading.
  auto fetch_item = [&](int it, int, V (&s)[kOuter][kInner]) {
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) s[o][c] = pre[o][c];
    issue_item(it + 1, 0);
  };
#endif

  // ---- 1. every load up front: the first item's state (the ring: its first
  // kStages - 1 items'), then q, k, v and the gates, so one memory latency
  // covers them all.
#if GDN_VK_RING
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue_item(item + st, st);
#else
  issue_item(item, 0);
#endif
  float vj[kColsHeld];
  load_v(item * kColsPerItem, vj);

  // interleaved: hk = h / G (by_head_map divides by G); tiled: hk = h % Hk
  // (by_head_map divides by Hk).
  const unsigned hq = by_head_map.div(unsigned(h));
  const int hk = p.head_map == HeadMap::kInterleaved ? int(hq) : h - int(hq) * p.num_k_heads;
  const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
  const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
  float qh[kRowsHeld], kh[kRowsHeld];
  // q and k rows, 0 past Dk: one dtype branch for all of them. vk holds kVec
  // consecutive rows per chunk (a chunk starts at a multiple of kVec, which
  // divides 16 and so Dk: all in range or none): one vector load each.
  with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
    using E = decltype(tag);
    const E* qp = static_cast<const E*>(p.q) + q_base;
    const E* kp = static_cast<const E*>(p.k) + k_base;
#pragma unroll
    for (int c = 0; c < kInner; ++c) {
      const int i = rows[c * kVec];
      if (i < Dk) {
        load_run<E, kVec>(qp + i, qh + c * kVec);
        load_run<E, kVec>(kp + i, kh + c * kVec);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) qh[c * kVec + e] = kh[c * kVec + e] = 0.0f;
      }
    }
  });
  const Gates gates = load_gates<IO>(p, b, h);
  const float decay = gates.decay, beta = gates.beta;

  // ---- 2. l2norm: the lanes of a column group hold all of Dk between them
  l2_normalize<kReduceLow, kReduceSpan>(p, lane, qh, kh);
  // After the output reduce_scatter, held column out_c sits in the lanes of
  // the span whose value bits name it; the one of them whose lower span bits
  // are zero writes it: every column of the item has exactly one writer.
  constexpr int kOutStride = kReduceLow * kReduceSpan / kColsHeld;
  const int out_c = (lane / kOutStride) % kColsHeld;
  const bool writer = (lane / kReduceLow) % (kReduceSpan / kColsHeld) == 0;
  // cols[out_c] without a run-time array index (which would go to local memory).
  const int out_col = out_c * VkT::kColsPerStep + lane / VkT::kLanesPerCol;

  // ---- 3. the warp's items, the next ones in flight (the ring's kStages - 1,
  // or one in registers) while one computes
  for (int stage = 0;; stage = stage + 1 == kStages ? 0 : stage + 1) {
    const bool has_next = item + 1 < item_end;
#if GDN_VK_RING
    issue_item(item + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
#endif
    float v_next[kColsHeld];
    if (has_next) load_v((item + 1) * kColsPerItem, v_next);
    V s[kOuter][kInner];
    fetch_item(item, stage, s);

    const int j0 = item * kColsPerItem;
    // The state element (held row r, held column c):
    auto elem = [&](int r, int c) -> float { return Elem<T>::to_float(s[c][r / kVec].x[r % kVec]); };
    // u = exp(g) S^T k_hat;  delta = beta (v - u)
    float delta[kColsHeld], out[kColsHeld], acc[kColsHeld];
#pragma unroll
    for (int c = 0; c < kColsHeld; ++c) {
      acc[c] = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsHeld; ++r) acc[c] += elem(r, c) * kh[r];
    }
    // Sum over the span, then hand every lane all the columns' sums.
    all_gather<kReduceLow, kReduceSpan, kColsHeld>(reduce_scatter<kReduceLow, kReduceSpan, kColsHeld>(acc, lane),
                                                   lane, acc);
#pragma unroll
    for (int c = 0; c < kColsHeld; ++c) {
      delta[c] = beta * (vj[c] - decay * acc[c]);
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
          const int r = ci * kVec + e;
          const int c = o;
          const float sn = decay * elem(r, c) + kh[r] * delta[c];
          out[c] += sn * qh[r];
          n.x[e] = Elem<T>::from_float(sn);
        }
        const int i = vec_row(o, ci), j = vec_col(o, j0);
        if (slots.write && i < Dk && j < Dv) *reinterpret_cast<V*>(s_out + vec_off(i, j)) = n;
      }
    // o[j0 + cols[out_c]] = scale * (sum over the span of out[out_c]), written by its one writer lane.
    const float o_val = scale * reduce_scatter<kReduceLow, kReduceSpan, kColsHeld>(out, lane);
    if (writer && j0 + out_col < Dv)
      with_dtype<IO>(p.o_dtype, [&](auto tag) {
        using E = decltype(tag);
        static_cast<E*>(p.o)[o_base + j0 + out_col] = Elem<E>::from_float(o_val);
      });

    if (!has_next) break;
    ++item;
#pragma unroll
    for (int c = 0; c < kColsHeld; ++c) vj[c] = v_next[c];
  }
}

// kv layout: a block of kW warps owns a [Dk x kCols] column tile of one
// (row, head) at a time (decode_kernel.cuh, KvSmemTile), staged through shared
// memory so global loads and stores move whole 16-byte chunks of row segments.
// Per tile: the copy threads' cp.async into a ring stage; wait and barrier;
// each warp computes its kVec columns with lanes over Dk (rows lane + 32 n)
// and writes S' back to its own chunk of shared; barrier; the copy threads
// store their chunks to global. A block streams tiles_per_block consecutive
// tiles of its head, kKvStages - 1 tiles' copies in flight while one computes.
// A column's arithmetic (its lane's rows, the 32-lane butterflies) depends
// only on its chunk, never on kW, the tiles a block streams or B.
// Hazards: a thread copies into shared exactly the chunks it later reads back
// for the global store, so refilling a stage after its own stores needs no
// barrier, and every other warp's use of a stage (compute) is fenced by the
// two barriers. A tile is all in shared memory before any of its state is
// written, so in-place updates (s_out == s_in) are safe. Every barrier is
// reached by all threads: the only early return (padding row) is uniform
// over the block.
template <typename T, int kDk, int kW, typename IO>
__global__ void __launch_bounds__(kW * kWarp, kDk <= 128 ? 1024 / (kW * kWarp) : 1)
    decode_kv_kernel(const __grid_constant__ DecodeParams p, int tiles_per_head, int tiles_per_block,
                     FastDiv by_blocks_per_head, FastDiv by_hv, FastDiv by_head_map, float scale) {
  using Tile = KvSmemTile<T, kDk, kW>;
  using V = Vec<T>;
  constexpr int kVec = V::kN, kRows = Tile::kRows, kCols = Tile::kCols, kPitch = Tile::kPitch;
  // kKvStages tiles of kDk rows x kPitch chunks (dynamic: two stages pass
  // 48 KiB at Dk = 256).
  extern __shared__ uint4 smem_raw[];
  V* const tiles = reinterpret_cast<V*>(smem_raw);

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  // blockIdx = (b * Hv + h) * blocks_per_head + blk, as in decode_kernel.
  const unsigned row_head = by_blocks_per_head.div(blockIdx.x);
  const int blk = int(blockIdx.x - row_head * by_blocks_per_head.d);
  const unsigned b32 = by_hv.div(row_head);
  const int h = int(row_head - b32 * unsigned(Hv));
  const int64_t b = b32;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t o_base = b * p.o_batch_stride + int64_t(h) * p.o_head_stride;
  // This block's tiles [t, t_end): never empty (blocks_per_head = ceil(tiles_per_head / tiles_per_block)).
  int t = blk * tiles_per_block;
  const int t_end = min(tiles_per_head, t + tiles_per_block);

  const RowSlots slots = row_slots(p, b, h, blk);
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    // Padding row (uniform over the block: no barrier is skipped by part of
    // it): zero this block's outputs, touch no state.
    const int j_end = min(Dv, t_end * kCols);
    for (int j = t * kCols + int(threadIdx.x); j < j_end; j += kW * kWarp) store_any(p.o, p.o_dtype, o_base + j, 0.0f);
    return;
  }

  // Copy positions: chunk cp_chunk of rows cp_row + 32 n. Compute: chunk
  // `warp`, rows lane + 32 n.
  const int cp_chunk = int(threadIdx.x) % kW, cp_row = int(threadIdx.x) / kW;
  // 64-bit arithmetic once per (slot, head); inside a head offsets are below 2^16.
  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  const int64_t v_base = b * p.v_batch_stride + int64_t(h) * p.v_head_stride;

  // Issue this thread's copy chunks of tile tt into ring stage `stage`
  // (zeros past Dk or Dv: a chunk starts at a multiple of kVec, which divides
  // 16 and so Dv: all in or all out), nothing past the block's last tile, and
  // close the group either way so group k is the block's tile k.
  auto issue_tile = [&](int tt, int stage) {
    if (tt < t_end) {
      const int j = tt * kCols + cp_chunk * kVec;
      V* dst = tiles + stage * (kDk * kPitch) + cp_chunk;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const int i = cp_row + n * kWarp;
        const bool in = i < Dk && j < Dv;
        copy16_async(dst + i * kPitch, in ? s_in + i * Dv + j : s_in, in);
      }
    }
    async_commit();
  };
  // After a reduce_scatter over the warp, lane l holds column
  // (l / kOutStride) % kVec of the warp's chunk (reduce_scatter's col(l)); it
  // loads v of that column only, forms delta there, and the lanes with
  // l % kOutStride == 0 write that column's output (one writer each).
  constexpr int kOutStride = kWarp / kVec;
  const int out_c = (lane / kOutStride) % kVec;
  const bool writer = lane % kOutStride == 0;
  // v[j] for the lane's column j of tile tt (0 past Dv; the warp's chunk is all in or all out).
  auto load_v = [&](int tt) -> float {
    const int j = tt * kCols + warp * kVec + out_c;
    float x = 0.0f;
    if (j < Dv)
      with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
        using E = decltype(tag);
        x = Elem<E>::to_float(static_cast<const E*>(p.v)[v_base + j]);
      });
    return x;
  };

  // ---- 1. the first kKvStages - 1 tiles' state and v first, then q, k and the gates.
#pragma unroll
  for (int st = 0; st < kKvStages - 1; ++st) issue_tile(t + st, st);
  float vj = load_v(t);

  const unsigned hq = by_head_map.div(unsigned(h));
  const int hk = p.head_map == HeadMap::kInterleaved ? int(hq) : h - int(hq) * p.num_k_heads;
  const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
  const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
  float qh[kRows], kh[kRows];
  with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
    using E = decltype(tag);
    const E* qp = static_cast<const E*>(p.q) + q_base;
    const E* kp = static_cast<const E*>(p.k) + k_base;
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const int i = lane + n * kWarp;
      qh[n] = i < Dk ? Elem<E>::to_float(qp[i]) : 0.0f;
      kh[n] = i < Dk ? Elem<E>::to_float(kp[i]) : 0.0f;
    }
  });
  const Gates gates = load_gates<IO>(p, b, h);
  const float decay = gates.decay, beta = gates.beta;

  // ---- 2. l2norm: the 32 lanes of every warp hold all of Dk between them.
  l2_normalize<1, kWarp>(p, lane, qh, kh);
  // ---- 3. the block's tiles, kKvStages - 1 of them in flight while one computes
  for (int stage = 0;; stage = stage + 1 == kKvStages ? 0 : stage + 1) {
    const bool has_next = t + 1 < t_end;
    // Stage stage - 1 held the previous tile: its last readers were this
    // thread's own global stores (after barrier B), so it is free to refill.
    issue_tile(t + kKvStages - 1, stage == 0 ? kKvStages - 1 : stage - 1);
    const float v_next = has_next ? load_v(t + 1) : 0.0f;
    async_wait<kKvStages - 1>();
    __syncthreads();  // A: every thread's chunks of tile t are in shared memory
    V* const tile = tiles + stage * (kDk * kPitch);

    // u = exp(g) S^T k_hat;  delta = beta (v - u)
    V s[kRows];
#pragma unroll
    for (int n = 0; n < kRows; ++n) s[n] = tile[(lane + n * kWarp) * kPitch + warp];
    float acc[kVec], delta[kVec], out[kVec];
#pragma unroll
    for (int c = 0; c < kVec; ++c) {
      acc[c] = 0.0f;
#pragma unroll
      for (int n = 0; n < kRows; ++n) acc[c] += Elem<T>::to_float(s[n].x[c]) * kh[n];
    }
    // The lane's column's sum over the warp -> its delta -> every lane gets all kVec deltas.
    const float u_sum = reduce_scatter<1, kWarp, kVec>(acc, lane);
    all_gather<1, kWarp, kVec>(beta * (vj - decay * u_sum), lane, delta);
#pragma unroll
    for (int c = 0; c < kVec; ++c) out[c] = 0.0f;
    // S' = exp(g) S + k_hat delta (back into the warp's own chunk);  o = scale S'^T q_hat
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const V sv = tile[(lane + n * kWarp) * kPitch + warp];
      V nv;
#pragma unroll
      for (int c = 0; c < kVec; ++c) {
        const float sn = decay * Elem<T>::to_float(sv.x[c]) + kh[n] * delta[c];
        out[c] += sn * qh[n];
        nv.x[c] = Elem<T>::from_float(sn);
      }
      tile[(lane + n * kWarp) * kPitch + warp] = nv;
    }
    const float o_val = scale * reduce_scatter<1, kWarp, kVec>(out, lane);
    const int jo = t * kCols + warp * kVec + out_c;
    if (writer && jo < Dv)
      with_dtype<IO>(p.o_dtype, [&](auto tag) {
        using E = decltype(tag);
        static_cast<E*>(p.o)[o_base + jo] = Elem<E>::from_float(o_val);
      });
    __syncthreads();  // B: S' of the whole tile is in shared memory

    if (slots.write) {
      const int j = t * kCols + cp_chunk * kVec;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const int i = cp_row + n * kWarp;
        if (i < Dk && j < Dv) *reinterpret_cast<V*>(s_out + i * Dv + j) = tile[i * kPitch + cp_chunk];
      }
    }
    if (!has_next) break;
    ++t;
    vj = v_next;
  }
}

// Dynamic shared memory of a block: the ring (vk: kStages items per warp; kv:
// kKvStages tiles per block).
template <typename T, Layout kLayout, int kDk, int kP>
constexpr size_t smem_bytes(int warps_per_block) {
  if constexpr (kLayout == Layout::kKV)
    return size_t(kKvStages) * kDk * KvSmemTile<T, kDk, kP>::kPitch * 16;
#if GDN_VK_RING
  else
    return size_t(warps_per_block) * kStages * kWarp * 16 *
           (VkTile<T, kDk, kP>::kUnroll * VkTile<T, kDk, kP>::kChunksPerLane);
#else
  else
    return (void)warps_per_block, size_t(0);  // vk keeps no ring without cp.async
#endif
}

// The kernel of (T, kLayout, kDk, kP, IO).
template <typename T, Layout kLayout, int kDk, int kP, typename IO>
const void* kernel_of() {
  if constexpr (kLayout == Layout::kKV)
    return reinterpret_cast<const void*>(&decode_kv_kernel<T, kDk, kP, IO>);
  else
    return reinterpret_cast<const void*>(&decode_kernel<T, kLayout, kDk, kP, IO>);
}

// f(IO{}) with the kernel instantiation's IO for p (decode_kernel.cuh,
// with_dtype): the shared dtype of q/k/v, a/b and o, or MixedIO.
template <typename F>
auto with_io(const DecodeParams& p, F&& f) {
  if (p.qkv_dtype == p.ab_dtype && p.qkv_dtype == p.o_dtype) {
    switch (p.qkv_dtype) {
      case DType::kF32: return f(float{});
      case DType::kF16: return f(fp16{});
      default: return f(bf16{});
    }
  }
  return f(MixedIO{});
}

// Warps of the kernel one SM holds at once (registers and the ring's shared
// memory), read once per process on the device current at the first call (all
// GPUs of one process are taken to be alike); also raises the kernel's
// dynamic shared-memory limit, which the kv ring needs past 48 KiB (Dk = 256).
// Function attributes are per device: a process that drives several GPUs
// gets the raised limit on the first one only (kv Dk = 256 elsewhere fails
// to launch, reported as a status); a per-device table is the fix, not yet
// run on a GPU.
template <typename T, Layout kLayout, int kDk, int kP, typename IO>
int resident_warps_per_sm() {
  static const int warps = [] {
    const int w = kLayout == Layout::kKV ? kP : 8;
    const size_t smem = smem_bytes<T, kLayout, kDk, kP>(w);
    const void* k = kernel_of<T, kLayout, kDk, kP, IO>();
    static_assert(smem_bytes<T, kLayout, kDk, kP>(8) <= GDN_MAX_BLOCK_SMEM, "the ring exceeds a block's shared memory");
    // Failures here only cost speed (the launch reports any real error).
    (void)cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
#if !defined(GDN_AMD)
    // All of the unified L1/shared array as shared memory: the rings, not
    // L1, hold the state, and every resident block's ring must fit.
    (void)cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared));
#endif
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, w * kWarp, smem) != cudaSuccess || blocks < 1) {
      (void)cudaGetLastError();
      blocks = 1;
    }
    return blocks * w;
  }();
  return warps;
}

template <typename T, Layout kLayout, int kDk, int kP>
Launch plan_launch(const DecodeParams& p, int sms, int max_items_per_warp) {
  constexpr int cpi = cols_per_item<T, kLayout, kDk, kP>();
  Launch g;
  g.items_per_head = (p.head_dim_v + cpi - 1) / cpi;
  const int64_t heads = p.batch * p.num_v_heads;
  const int64_t items = heads * g.items_per_head;
  const int cap = max_items_per_warp < g.items_per_head ? max_items_per_warp : g.items_per_head;
  const int resident_warps = with_io(p, [](auto io) { return resident_warps_per_sm<T, kLayout, kDk, kP, decltype(io)>(); });
  if constexpr (kLayout == Layout::kKV) {
    // kv: an item is a block's tile of kP warps. Tiles a block streams: as
    // few as fill every resident block slot in one wave (at B = 8 every
    // tile's copies are issued at once: fp32 2.02x -> 1.62x), up to the
    // cap (4: all tiles of an fp32 head; best from B = 32 up, tune_cuda kv).
    const int64_t slots = int64_t(resident_warps / kP) * sms;
    const int64_t n = (items + slots - 1) / slots;
    g.warps_per_block = kP;
    g.items_per_warp = int(n < 1 ? 1 : n > cap ? cap : n);
    g.blocks_per_head = (g.items_per_head + g.items_per_warp - 1) / g.items_per_warp;
    return g;
  }
  // vk: 1 item a warp while the grid fits one wave of the warps an SM holds
  // (B = 1: every item's loads at once; 2 a warp costs 13%), else 2 (one
  // computing, one in the ring), doubled while the grid still runs >= 4
  // waves. Measured (tune_cuda vk): 1 item a warp is 1.2-1.6x slower from
  // B = 8 up (nothing in flight behind it); more items than this rule gives
  // lengthen the last wave (bf16 B = 32: 2 items 1.34x, 8 items 1.49x), while
  // long grids gain from 4 (bf16 B = 128: 1.15x vs 1.21x at 2).
  const int64_t slots = int64_t(resident_warps) * sms;
  int ipw = items <= slots || cap < 2 ? 1 : 2;
  while (ipw * 2 <= cap && items >= int64_t(4) * (ipw * 2) * slots) ipw *= 2;
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
  const FastDiv by_head_map(unsigned(p.head_map == HeadMap::kInterleaved ? p.num_v_heads / p.num_k_heads
                                                                         : p.num_k_heads));
  with_io(p, [&](auto io) {
    using IO = decltype(io);
    resident_warps_per_sm<T, kLayout, kDk, kP, IO>();  // once: the shared-memory limit is raised
    if constexpr (kLayout == Layout::kKV) {
      // The block shape is the tile's, whatever g.warps_per_block says.
      decode_kv_kernel<T, kDk, kP, IO><<<dim3(unsigned(blocks)), dim3(KvSmemTile<T, kDk, kP>::kThreads),
                                         smem_bytes<T, kLayout, kDk, kP>(kP), stream>>>(
          p, g.items_per_head, g.items_per_warp, FastDiv(unsigned(g.blocks_per_head)),
          FastDiv(unsigned(p.num_v_heads)), by_head_map, scale);
    } else {
      decode_kernel<T, kLayout, kDk, kP, IO><<<dim3(unsigned(blocks)), dim3(g.warps_per_block * kWarp),
                                               smem_bytes<T, kLayout, kDk, kP>(g.warps_per_block), stream>>>(
          p, g.items_per_head, g.items_per_warp, FastDiv(unsigned(g.blocks_per_head)),
          FastDiv(unsigned(p.num_v_heads)), by_head_map, scale);
    }
  });
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

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
