// Multi-token decode (speculative decoding): T tokens of a row on one state,
// read once and kept in registers between tokens (decode_tokens_kernel;
// docs/decisions.md#token-kernel).
//
// Bits: each token runs the one-token kernels' arithmetic of its layout on
// the same lanes (vk: OnePass over VkTile's lanes; kv: KvRegTile), the state
// rounded to its dtype after every token as a store and a reload round it, so
// one call equals T one-token calls bit for bit, conv prologue and norm
// epilogue included (their sums in the fused kernels' order).
#pragma once

#include "kv_tile.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// Everything the kernel's code depends on at compile time: the state type,
// the layout and the Dk capacity; the tile is the layout's shipped one (the
// one-token kernels' bits). The small tensors' dtypes are run-time values: a
// block moves them once, into shared memory, before the token loop.
template <typename T, Layout kLayout, int kDk>
struct TokenTraits {
  using State = T;
  static constexpr Layout kLayoutOf = kLayout;
  static constexpr int kDkCap = kDk;
  static constexpr int kTile = default_tile_param<T, kLayout>();  // vk: values a lane; kv: warps a tile
  static constexpr int kWarps = gpu::traits::kTokenWarps;
  static constexpr int kThreads = kWarps * kWarp;
  static constexpr int kCols = cols_per_item<T, kLayout, kDk, kTile>();  // columns of a unit
  // Blocks an SM must hold: 2 (128 registers a thread; 3 spilled hundreds of bytes)
  static constexpr int kMinBlocks = 2;
  static_assert(kLayout == Layout::kVK || kTile == kWarps, "kv: a tile is the block");
};

// One element of a small tensor of run-time dtype t, as float.
__device__ __forceinline__ float load_small(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return __half2float(static_cast<const fp16*>(base)[i]);
    default: return bf16_to_float(static_cast<const bf16*>(base)[i]);
  }
}

// What row b does, from its index arrays: the host reference's rules
// (docs/operation.md, "Multi-token decode"), counting the same entries.
struct TokenRow {
  bool touched;   // false: a bad cu_seqlens range (nothing read or written)
  bool packed;    // tokens at cu_seqlens[b] + t
  int tokens;     // tokens the row carries
  int64_t first;  // (packed) cu_seqlens[b]
  int64_t s_in;   // read slot; < 0: padding (zero outputs, nothing else)
  int64_t s_out;  // final write slot; < 0: none
  unsigned bad;   // out-of-range entries the row consulted
};

__device__ __forceinline__ TokenRow token_row(const DecodeParams& p, int64_t b) {
  TokenRow r{false, false, 0, 0, -1, -1, 0u};
  const IndexType it = p.index_dtype;
  const int64_t N = p.num_slots, T = p.num_tokens;
  if (p.cu_seqlens != nullptr) {
    const int64_t lo = load_index(p.cu_seqlens, it, b), hi = load_index(p.cu_seqlens, it, b + 1);
    if (lo < 0 || hi < lo || hi > p.total_tokens || hi - lo > T) {
      r.bad = 1;
      return r;
    }
    r.packed = true;
    r.first = lo;
    r.tokens = int(hi - lo);
  } else {
    r.tokens = int(T);
  }
  r.touched = true;
  const void* tsi = p.token_state_indices;
  auto tsi_at = [&](int64_t t) { return load_index(tsi, it, b * p.token_state_indices_stride + t); };
  if (tsi != nullptr)
    for (int t = 0; t < r.tokens; ++t) r.bad += unsigned(tsi_at(t) >= N);
  if (p.state_indices != nullptr) {
    const int64_t s = load_index(p.state_indices, it, b);
    r.bad += unsigned(s >= N);
    r.s_in = s >= N ? -1 : s;
  } else if (tsi != nullptr) {
    // vLLM's rule: the state after the last accepted token, n = num_accepted_tokens[b]
    const int64_t n = p.num_accepted_tokens ? load_index(p.num_accepted_tokens, it, b) : 1;
    if (n < 1 || n > T) {
      ++r.bad;
    } else {
      const int64_t s = tsi_at(n - 1);
      r.s_in = s >= N ? -1 : s;
      r.bad += unsigned(s >= N && n - 1 >= r.tokens);  // (inside the row's tokens: counted above)
    }
  } else {
    r.s_in = b;
  }
  // the final write: state_out_indices, else the read slot unless the token slots are the writes
  if (p.update_state && p.state_out_indices != nullptr) {
    const int64_t s = load_index(p.state_out_indices, it, b);
    r.bad += unsigned(s >= N);
    r.s_out = s >= N ? -1 : s;
  } else if (p.update_state && tsi == nullptr) {
    r.s_out = r.s_in;
  }
  if (r.s_in < 0) r.s_out = -1;
  return r;
}

// The conv prologue of a group for all of a row's tokens (conv on: the block
// owns the whole group). Thread per channel m of the group's list (q and k of
// hk, then v of the G heads), its window in registers:
//   y_t = silu(w . (window, x_t) + bias)        (the fused prologue's sum order)
// into qn / kn / vs (raw; normalized later), the window shifted by x_t after
// each token and stored where the token's state goes (token slot,
// intermediate buffer), the last one to s_out. One thread reads, then writes
// each channel, so the pool's windows need no barrier.
template <typename E>
__device__ __forceinline__ void token_conv(const DecodeParams& p, const TokenRow& r, int64_t b, int hk, int G,
                                           const int64_t* slots, float* qn, float* kn, float* vs, int vcols) {
  const int Dk = p.head_dim_k, Dv = p.head_dim_v, W = p.conv_width, nt = r.tokens;
  const int n = 2 * Dk + G * Dv;
  const E* x = static_cast<const E*>(p.x);
  const E* wt = static_cast<const E*>(p.conv_weight);
  const E* bias = static_cast<const E*>(p.conv_bias);
  E* cs = static_cast<E*>(p.conv_state);
  const int64_t chs = p.conv_state_channel_stride, tps = p.conv_state_tap_stride;
  for (int m = int(threadIdx.x); m < n; m += int(blockDim.x)) {
    const int64_t c = group_channel(p, hk, G, m);
    E win[3], w[4];
#pragma unroll
    for (int t = 0; t < 3; ++t) win[t] = t < W - 1 ? cs[r.s_in * p.conv_state_slot_stride + c * chs + t * tps] : E{};
#pragma unroll
    for (int t = 0; t < 4; ++t) w[t] = wt[c * W + (t < W ? t : 0)];
    const float bf = bias ? Elem<E>::to_float(bias[c]) : 0.0f;
    auto store_window = [&](E* base) {
#pragma unroll
      for (int t = 0; t < 3; ++t)
        if (t < W - 1) base[c * chs + t * tps] = win[t];
    };
    for (int t = 0; t < nt; ++t) {
      const int64_t row = r.packed ? (r.first + t) * p.x_token_stride : b * p.x_batch_stride + t * p.x_token_stride;
      const E xt = x[row + c];
      // y = silu(w . window + bias), window = (old[0 .. W-2], x_t)
      float acc = bf;
#pragma unroll
      for (int k = 0; k < 3; ++k)
        if (k < W - 1) acc += Elem<E>::to_float(w[k]) * Elem<E>::to_float(win[k]);
      acc += Elem<E>::to_float(W == 2 ? w[1] : W == 3 ? w[2] : w[3]) * Elem<E>::to_float(xt);
      const float y = silu(acc);
      if (m < Dk)
        qn[t * Dk + m] = y;
      else if (m < 2 * Dk)
        kn[t * Dk + m - Dk] = y;
      else
        vs[t * vcols + m - 2 * Dk] = y;
      // window after token t = (old[1 .. W-2], x_t): the input values themselves
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (k + 2 < W) win[k] = win[k + 1];
#pragma unroll
      for (int k = 0; k < 3; ++k)
        if (k == W - 2) win[k] = xt;
      if (slots[t] >= 0) store_window(cs + slots[t] * p.conv_state_slot_stride);
      if (p.intermediate_conv_states != nullptr)
        store_window(static_cast<E*>(p.intermediate_conv_states) + b * p.intermediate_conv_batch_stride +
                     t * p.intermediate_conv_token_stride);
    }
    if (r.s_out >= 0 && nt > 0) store_window(cs + r.s_out * p.conv_state_slot_stride);
  }
}

// The kernel. Phases: (0) the block's first round of units' state into
// registers (or, through the ring, its first rounds into shared memory);
// (1) every token's q, k, v (or the conv prologue's outputs), gates and write
// slots into shared memory; (2) each token's q and k l2-normalized by the
// layout's lanes, as the one-token kernels do; (3) the units, each read once
// and run through every token, kU at a time; (4) the norm epilogue per token and head.
template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    decode_tokens_kernel(const __grid_constant__ TokenArgs args) {
  using T = typename Tr::State;
  using V = Vec<T>;
  constexpr int kDk = Tr::kDkCap, kCols = Tr::kCols, kWarps = Tr::kWarps;
  constexpr bool kVK = Tr::kLayoutOf == Layout::kVK;
  constexpr int kVec = V::kN;
  const DecodeParams& p = args.p;
  const TokenGeometry& geo = args.geo;
  const int Hk = p.num_k_heads, Dk = p.head_dim_k, Dv = p.head_dim_v, G = geo.group_heads;
  const int tid = int(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;

  const unsigned group = geo.by_parts.div(blockIdx.x);
  const int part = int(blockIdx.x - group * geo.by_parts.d);
  const unsigned b32 = geo.by_hk.div(group);
  const int hk = int(group - b32 * unsigned(Hk));
  const int64_t b = b32;
  const int uph = geo.units_per_head;
  // the block's units [u0, u1) and their group columns [lo, hi) (column g Dv + j)
  const int u0 = part * geo.units_per_block, u1 = min(G * uph, u0 + geo.units_per_block);
  const int g_first = u0 / uph, g_last = (u1 - 1) / uph;
  const int lo = g_first * Dv + (u0 - g_first * uph) * kCols;
  const int hi = g_last * Dv + min(Dv, (u1 - g_last * uph) * kCols);
  const int vcols = hi - lo;

  const TokenRow r = token_row(p, b);
  if (r.bad != 0 && hk == 0 && part == 0 && tid == 0 && p.invalid_index_count != nullptr)
    atomicAdd(p.invalid_index_count, r.bad);
  if (!r.touched || r.tokens == 0) return;
  const int nt = r.tokens;
  // offset of token t of the row in a token-major tensor
  auto tok = [&](int t, int64_t batch_stride, int64_t token_stride) {
    return r.packed ? (r.first + t) * token_stride : b * batch_stride + int64_t(t) * token_stride;
  };
  auto o_at = [&](int t, int h) { return tok(t, p.o_batch_stride, p.o_token_stride) + int64_t(h) * p.o_head_stride; };
  if (r.s_in < 0) {
    // padding row: the block's outputs of every token zero, nothing else
    for (int i = tid; i < nt * vcols; i += Tr::kThreads) {
      const int t = i / vcols, gc = lo + (i - t * vcols), g = gc / Dv;
      store_any(p.o, p.o_dtype, o_at(t, group_head(p, hk, g, G)) + (gc - g * Dv), 0.0f);
    }
    return;
  }
  extern __shared__ float4 token_smem_raw[];
  float* const smf = reinterpret_cast<float*>(token_smem_raw);
  float* const qn = smf + geo.smem.qn;    // [t][Dk] q (raw, then q_hat)
  float* const kn = smf + geo.smem.kn;    // [t][Dk] k (raw, then k_hat)
  float* const kqs = smf + geo.smem.kq;   // [t] k_hat . q_hat
  float* const dec = smf + geo.smem.decay;  // [t][g] exp(g)
  float* const bet = smf + geo.smem.beta;   // [t][g] beta
  float* const vs = smf + geo.smem.v;     // [t][group column - lo]
  float* const bcs = smf + geo.smem.beta_cols;  // (per-channel beta) [t][group column - lo]
  float* const outs = smf + geo.smem.out;   // (norm) [t][g][j] raw outputs
  int64_t* const slots = reinterpret_cast<int64_t*>(smf + geo.smem.slots);  // [t] token slot or -1
  const bool norm = p.norm_weight != nullptr;
  const float scale = geo.scale;
  T* const pool = static_cast<T*>(p.state);
  const int64_t head_elems = int64_t(Dk) * Dv;

  // ---- the layouts' lane maps: which rows (Dk) and columns (Dv) of a unit
  // this thread holds, and how a unit's state moves.
  using VkT = VkTile<T, kDk, Tr::kTile>;
  constexpr int kOuter = kVK ? VkT::kUnroll : 1;
  constexpr int kInner = kVK ? VkT::kChunksPerLane : KvTile<T, kDk, kWarps>::kRows;
  constexpr int kRowsHeld = kInner * kVec;  // (vk) q/k rows a lane holds
  int rows[kVK ? kRowsHeld : 1], cols[kOuter];
  const int col_lane = kVK ? lane % VkT::kLanesPerCol : 0, step_col = kVK ? lane / VkT::kLanesPerCol : 0;
  const int chunk = kVK ? 0 : tid % kWarps, rg = kVK ? 0 : tid / kWarps;  // (kv) KvRegTile's map
  if constexpr (kVK) {
#pragma unroll
    for (int c = 0; c < kInner; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) rows[c * kVec + e] = (c * VkT::kLanesPerCol + col_lane) * kVec + e;
#pragma unroll
    for (int u = 0; u < kOuter; ++u) cols[u] = u * VkT::kColsPerStep + step_col;
  } else {
    cols[0] = 0;
    rows[0] = 0;
  }
  // State vector (o, c) of unit u: its offset in a head, and whether it lies in (Dk, Dv).
  auto unit_member = [&](int u) { return u / uph; };
  auto unit_j0 = [&](int u) { return (u - (u / uph) * uph) * kCols; };
  auto vec_at = [&](int u, int o, int c, int& off) -> bool {
    const int j0 = unit_j0(u);
    if constexpr (kVK) {
      const int i = rows[c * kVec], j = j0 + cols[o];
      off = j * Dk + i;  // (Dv, Dk), Dk contiguous
      return i < Dk && j < Dv;
    } else {
      const int i = rg + c * kWarp, j = j0 + chunk * kVec;
      off = i * Dv + j;  // (Dk, Dv), Dv contiguous
      return i < Dk && j < Dv;
    }
  };
  // unit u's head in the read slot
  auto unit_base = [&](int u) -> const T* {
    return pool + r.s_in * p.state_slot_stride + int64_t(group_head(p, hk, unit_member(u), G)) * head_elems;
  };
  auto load_unit = [&](int u, V (&s)[kOuter][kInner]) {
    const T* base = unit_base(u);
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        int off;
        if (vec_at(u, o, c, off))
          s[o][c] = *reinterpret_cast<const V*>(base + off);
        else
#pragma unroll
          for (int e = 0; e < kVec; ++e) s[o][c].x[e] = Elem<T>::from_float(0.0f);
      }
  };
  // The unit's state to a head at `head` (a slot's or the intermediate buffer's).
  auto store_unit = [&](int u, T* head, const V (&s)[kOuter][kInner]) {
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        int off;
        if (vec_at(u, o, c, off)) store_state16<false>(reinterpret_cast<V*>(head + off), s[o][c]);
      }
  };
  // Units run kU at a time (traits::token_units; docs/decisions.md#token-kernel): a
  // vk warp takes ub + k kWarps (k < kU) of its round ub = u0 + warp + n kU
  // kWarps, a kv block ub + k of its round ub = u0 + n kU; their shuffles,
  // barriers and memory latencies overlap.
  constexpr int kU = gpu::traits::token_units(int(sizeof(T)));
  const int u_first = kVK ? u0 + warp : u0, u_round = kVK ? kWarps * kU : kU, u_stride = kVK ? kWarps : 1;
  using State = V[kU][kOuter][kInner];
  static_assert(kU * kOuter * kInner ==
                    gpu::traits::token_round_vecs(kWarp, int(sizeof(T)), Tr::kLayoutOf, kDk),
                "the planner's ring holds a round of the thread's vectors");
  auto load_round = [&](int ub, State& st) {
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int u = ub + k * u_stride;
      if (u < u1) {
        load_unit(u, st[k]);
      } else {
#pragma unroll
        for (int o = 0; o < kOuter; ++o)
#pragma unroll
          for (int c = 0; c < kInner; ++c)
#pragma unroll
            for (int e = 0; e < kVec; ++e) st[k][o][c].x[e] = Elem<T>::from_float(0.0f);
      }
    }
  };

  // The state's ring (geo.smem.ring_stages > 0, a block of several rounds;
  // docs/decisions.md#token-kernel): round n of the thread's units is copy
  // group n, landing in stage n % stages; round n + stages is issued once
  // round n's tokens have run, so stages - 1 rounds fly while one runs,
  // without registers. A thread copies in and reads back only its own
  // vectors (kThreads apart: conflict-free), so no barrier is needed.
  const int stages = geo.smem.ring_stages;
  V* const ring = reinterpret_cast<V*>(smf + geo.smem.ring) + tid;
  auto ring_at = [&](int stage, int k, int o, int c) {
    return ring + (((stage * kU + k) * kOuter + o) * kInner + c) * Tr::kThreads;
  };
  auto issue_round = [&](int n, int stage) {
    const int ub = u_first + n * u_round;
    if (ub < u1) {
#pragma unroll
      for (int k = 0; k < kU; ++k) {
        const int u = ub + k * u_stride;
        const T* base = unit_base(u < u1 ? u : ub);
#pragma unroll
        for (int o = 0; o < kOuter; ++o)
#pragma unroll
          for (int c = 0; c < kInner; ++c) {
            int off = 0;
            const bool in = u < u1 && vec_at(u, o, c, off);
            copy16_async(ring_at(stage, k, o, c), base + (in ? off : 0), in);
          }
      }
    }
    async_commit();  // (empty past the last round: group n stays round n)
  };
  auto fetch_round = [&](int stage, State& st) {
    if (stages == 1)
      async_wait<0>();
    else if (stages == 2)
      async_wait<1>();
    else
      async_wait<2>();
#pragma unroll
    for (int k = 0; k < kU; ++k)
#pragma unroll
      for (int o = 0; o < kOuter; ++o)
#pragma unroll
        for (int c = 0; c < kInner; ++c) st[k][o][c] = *ring_at(stage, k, o, c);
  };

  // ---- 0. the first round's state in flight before the small loads (the
  // ring: its first stages' rounds)
  State s;
  if (stages > 0)
    for (int n = 0; n < stages; ++n) issue_round(n, n);
  else
    load_round(u_first, s);

  // ---- 1. the tokens' inputs into shared memory: every load of a thread
  // issued before any is used (one memory latency, not one a loop trip)
  // (gates of (token, head) pair tid; pairs past the block's threads, G > 16
  // at T = 16, come after the staging)
  const bool gate_thread = tid < nt * G;
  const int gt_t = gate_thread ? tid / G : 0, gt_h = group_head(p, hk, gate_thread ? tid - gt_t * G : 0, G);
  // per-channel beta (b_head_stride > 0, precomputed): each column's own, staged beside v
  const bool beta_per_channel = p.b_head_stride > 0;
  float ga = 0.0f, gb = 0.0f;
  if (gate_thread) {
    ga = load_small(p.a, p.ab_dtype, tok(gt_t, p.a_batch_stride, p.a_token_stride) + gt_h);
    if (!beta_per_channel) gb = load_small(p.b, p.ab_dtype, tok(gt_t, p.b_batch_stride, p.b_token_stride) + gt_h);
  }
  for (int t = tid; t < nt; t += Tr::kThreads) {
    int64_t slot = -1;
    if (p.token_state_indices != nullptr) {
      slot = load_index(p.token_state_indices, p.index_dtype, b * p.token_state_indices_stride + t);
      if (slot >= p.num_slots) slot = -1;
    }
    slots[t] = slot;
  }
  if (beta_per_channel) {
    // the block's columns, one load in flight a thread (the first round's
    // state is live in registers here)
    for (int i = tid; i < nt * vcols; i += Tr::kThreads) {
      const int t = i / vcols, gc = lo + (i - t * vcols), g = gc / Dv;
      const int64_t at = tok(t, p.b_batch_stride, p.b_token_stride) +
                         int64_t(group_head(p, hk, g, G)) * p.b_head_stride + (gc - g * Dv);
      bcs[i] = load_small(p.b, p.ab_dtype, at);
    }
  }
  if (p.conv_width == 0) {
    with_dtype<MixedIO>(p.qkv_dtype, [&](auto tag) {
      using E = decltype(tag);
      const E* q = static_cast<const E*>(p.q);
      const E* k = static_cast<const E*>(p.k);
      const E* v = static_cast<const E*>(p.v);
      // A thread a channel m of the list (q and k of hk, then the block's v
      // columns), its tokens kB at a time: token t of a channel sits at
      // base + t token_stride, dense or packed alike (no division a token).
      constexpr int kB = 4;
      const int n = 2 * Dk + vcols;
      for (int m = tid; m < n; m += Tr::kThreads) {
        const E* src;
        int64_t ts;
        float* dst;
        int ds;  // dst stride a token
        if (m < 2 * Dk) {
          const bool isq = m < Dk;
          const int c = isq ? m : m - Dk;
          ts = isq ? p.q_token_stride : p.k_token_stride;
          src = (isq ? q : k) + tok(0, isq ? p.q_batch_stride : p.k_batch_stride, ts) +
                int64_t(hk) * (isq ? p.q_head_stride : p.k_head_stride) + c;
          dst = (isq ? qn : kn) + c;
          ds = Dk;
        } else {
          const int gc = lo + m - 2 * Dk, g = gc / Dv;
          ts = p.v_token_stride;
          src = v + tok(0, p.v_batch_stride, ts) + int64_t(group_head(p, hk, g, G)) * p.v_head_stride + (gc - g * Dv);
          dst = vs + (m - 2 * Dk);
          ds = vcols;
        }
        for (int t0 = 0; t0 < nt; t0 += kB) {
          float x[kB];
#pragma unroll
          for (int e = 0; e < kB; ++e) x[e] = t0 + e < nt ? Elem<E>::to_float(src[(t0 + e) * ts]) : 0.0f;
#pragma unroll
          for (int e = 0; e < kB; ++e)
            if (t0 + e < nt) dst[(t0 + e) * ds] = x[e];
        }
      }
    });
  } else {
    __syncthreads();  // the slots
    with_dtype<MixedIO>(p.qkv_dtype, [&](auto tag) {
      token_conv<decltype(tag)>(p, r, b, hk, G, slots, qn, kn, vs, vcols);
    });
  }
  const bool raw = p.gate == Gate::kRaw;
  if (gate_thread) {
    const Gates gt = gates_of(p, ga, gb, raw ? p.A_log[gt_h] : 0.0f, raw ? p.dt_bias[gt_h] : 0.0f);
    dec[tid] = gt.decay;
    bet[tid] = gt.beta;
  }
  for (int i = tid + Tr::kThreads; i < nt * G; i += Tr::kThreads) {
    const int t = i / G, h = group_head(p, hk, i - t * G, G);
    const float a = load_small(p.a, p.ab_dtype, tok(t, p.a_batch_stride, p.a_token_stride) + h);
    const float bb =
        beta_per_channel ? 0.0f : load_small(p.b, p.ab_dtype, tok(t, p.b_batch_stride, p.b_token_stride) + h);
    const Gates gt = gates_of(p, a, bb, raw ? p.A_log[h] : 0.0f, raw ? p.dt_bias[h] : 0.0f);
    dec[i] = gt.decay;
    bet[i] = gt.beta;
  }
  __syncthreads();

  // ---- 2. q_hat, k_hat and k_hat . q_hat of each token, by one warp on the
  // layout's lanes (l2_normalize), written back in place. Where a warp spans
  // physical warps, every warp takes the same rounds (the idle ones read and
  // write nothing): racecheck pairs named-barrier arrivals by count and loses
  // the block barrier below when they differ (docs/decisions.md#hip-source-path).
  const int rounds = kSpansPhysicalWarps ? (nt + kWarps - 1) / kWarps * kWarps : nt;
  for (int t = warp; t < rounds; t += kWarps) {
    const bool live = !kSpansPhysicalWarps || t < nt;
    constexpr int kN = kVK ? kRowsHeld : KvTile<T, kDk, kWarps>::kRows;
    float qh[kN], kh[kN];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int i = kVK ? rows[n] : lane + n * kWarp;  // (kv: lane l holds rows l + kWarp n)
      qh[n] = live && i < Dk ? qn[t * Dk + i] : 0.0f;
      kh[n] = live && i < Dk ? kn[t * Dk + i] : 0.0f;
    }
    constexpr int kSpan = kVK ? VkT::kLanesPerCol : kWarp;
    const float kq = l2_normalize<1, kSpan>(p, lane, qh, kh);
    warp_sync();  // (vk: the lanes of every column group read before any writes)
    if (live && (!kVK || step_col == 0)) {
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        const int i = kVK ? rows[n] : lane + n * kWarp;
        if (i < Dk) {
          qn[t * Dk + i] = qh[n];
          kn[t * Dk + i] = kh[n];
        }
      }
    }
    if (live && lane == 0) kqs[t] = kq;
  }
  __syncthreads();

  // ---- 3. the units, kU at a time, each through every token
  // o of token t, group column (g, j): raw into shared memory for the norm, else stored
  auto emit = [&](int t, int g, int j, float o_val) {
    if (norm)
      outs[(t * G + g) * Dv + j] = o_val;
    else
      store_any(p.o, p.o_dtype, o_at(t, group_head(p, hk, g, G)) + j, o_val);
  };
  // Beta of token t, member g, group column j: the member's at bet[t G + g], or the column's own at v's
  // index: one shared load either way, no dtype test or global load in the token loop
  // (docs/decisions.md#per-channel-beta).
  const float* const betas = beta_per_channel ? bcs : bet;
  // after token t, the state goes to its token slot and the intermediate buffer
  auto store_token = [&](int u, int t, int h, const V (&st)[kOuter][kInner]) {
    if (slots[t] >= 0) store_unit(u, pool + slots[t] * p.state_slot_stride + int64_t(h) * head_elems, st);
    if (p.intermediate_states != nullptr)
      store_unit(u,
                 static_cast<T*>(p.intermediate_states) + b * p.intermediate_batch_stride +
                     int64_t(t) * p.intermediate_token_stride + int64_t(h) * head_elems,
                 st);
  };
  int stage = 0;
  for (int ub = u_first, n = 0; ub < u1; ub += u_round, ++n) {
    if (stages > 0)
      fetch_round(stage, s);
    else if (ub != u_first)
      load_round(ub, s);
    int g[kU], h[kU], j0[kU];
    bool ok[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int u = ub + k * u_stride;
      ok[k] = u < u1;
      g[k] = unit_member(ok[k] ? u : ub);
      h[k] = group_head(p, hk, g[k], G);
      j0[k] = unit_j0(ok[k] ? u : ub);
    }
    for (int t = 0; t < nt; ++t) {
      if constexpr (kVK) {
        using Pass = OnePass<1, VkT::kLanesPerCol, kOuter>;
        const int out_col = Pass::col(lane) * VkT::kColsPerStep + step_col;  // this lane's output column
        // q_hat, k_hat of the lane's rows: kVec consecutive rows a chunk, 16-byte
        // reads side by side across the lanes (no bank conflicts)
        float qh[kRowsHeld], kh[kRowsHeld];
#pragma unroll
        for (int c = 0; c < kInner; ++c)
#pragma unroll
          for (int e4 = 0; e4 < kVec; e4 += 4) {
            const int i = rows[c * kVec] + e4;
            const bool in = rows[c * kVec] < Dk;
            const float4 q4 = in ? *reinterpret_cast<const float4*>(qn + t * Dk + i) : make_float4(0, 0, 0, 0);
            const float4 k4 = in ? *reinterpret_cast<const float4*>(kn + t * Dk + i) : make_float4(0, 0, 0, 0);
            float* qd = qh + c * kVec + e4;
            float* kd = kh + c * kVec + e4;
            qd[0] = q4.x, qd[1] = q4.y, qd[2] = q4.z, qd[3] = q4.w;
            kd[0] = k4.x, kd[1] = k4.y, kd[2] = k4.z, kd[3] = k4.w;
          }
        const float kq = kqs[t];
#pragma unroll
        for (int k = 0; k < kU; ++k) {
          const int jc = j0[k] + out_col;
          const int gi = t * G + g[k], vi = t * vcols + g[k] * Dv + jc - lo;
          const float decay = dec[gi], beta = jc < Dv ? betas[beta_per_channel ? vi : gi] : 0.0f;
          const float vj = jc < Dv ? vs[vi] : 0.0f;
          auto elem = [&](int rr, int c) -> float { return Elem<T>::to_float(s[k][c][rr / kVec].x[rr % kVec]); };
          // delta of every held column and this lane's output (decode_vk's sums)
          float delta[kOuter];
          const float o_val = Pass::run(
              [&](int vv) {
                const float* w = (vv & 1) ? qh : kh;
                float a = 0.0f;
#pragma unroll
                for (int rr = 0; rr < kRowsHeld; ++rr) a += elem(rr, vv / 2) * w[rr];
                return a;
              },
              vj, decay, beta, kq, scale, lane, delta);
          // S' = exp(g) S + k_hat delta, rounded to the state's dtype
#pragma unroll
          for (int o = 0; o < kOuter; ++o)
#pragma unroll
            for (int ci = 0; ci < kInner; ++ci) {
              V n;
#pragma unroll
              for (int e = 0; e < kVec; ++e) {
                const int rr = ci * kVec + e;
                n.x[e] = Elem<T>::from_float(decay * elem(rr, o) + kh[rr] * delta[o]);
              }
              s[k][o][ci] = n;
            }
          if (ok[k] && Pass::writer(lane) && jc < Dv) emit(t, g[k], jc, o_val);
        }
      } else {
        using R = KvRegTile<T, kDk, kWarps>;
        constexpr int kRows = R::kRows;
        __shared__ float part[kU * R::kPartFloats];
        __shared__ float dl[kU * kCols];
        float qr[kRows], kr[kRows];
#pragma unroll
        for (int n = 0; n < kRows; ++n) {
          const int i = rg + n * kWarp;
          qr[n] = i < Dk ? qn[t * Dk + i] : 0.0f;
          kr[n] = i < Dk ? kn[t * Dk + i] : 0.0f;
        }
        // the tiles' sums as a one-token block reduces a pair (decode_kv_step_kernel)
#pragma unroll
        for (int k = 0; k < kU; ++k) R::post(s[k][0], qr, kr, part + k * R::kPartFloats);
        __syncthreads();  // every tile's partial sums are posted
        if (tid < kU * kCols) {
          const int k = tid / kCols, col = tid - k * kCols;
          // tile k's member, first column and validity (selects: no run-time array index)
          int gk = g[0], jt = j0[0];
          bool emits = ok[0];
#pragma unroll
          for (int kk = 1; kk < kU; ++kk)
            if (k == kk) {
              gk = g[kk];
              jt = j0[kk];
              emits = ok[kk];
            }
          const bool in = jt + col < Dv;
          const int gi = t * G + gk, vi = t * vcols + gk * Dv + jt + col - lo;
          const float vj = in ? vs[vi] : 0.0f, beta = in ? betas[beta_per_channel ? vi : gi] : 0.0f;
          R::finish(col, part + k * R::kPartFloats, vj, dec[gi], beta, kqs[t], scale, dl + k * kCols,
                    [&](int c, float o_val) {
                      if (emits && jt + c < Dv) emit(t, gk, jt + c, o_val);
                    });
        }
        __syncthreads();  // the tiles' deltas are posted
        // S' = exp(g) S + k_hat delta (KvRegTile::store's arithmetic), kept
#pragma unroll
        for (int k = 0; k < kU; ++k) {
          const float decay = dec[t * G + g[k]];
          float delta[kVec];
#pragma unroll
          for (int c = 0; c < kVec; ++c) delta[c] = dl[k * kCols + chunk * kVec + c];
#pragma unroll
          for (int n = 0; n < kRows; ++n)
#pragma unroll
            for (int c = 0; c < kVec; ++c)
              s[k][0][n].x[c] = Elem<T>::from_float(decay * Elem<T>::to_float(s[k][0][n].x[c]) + kr[n] * delta[c]);
        }
      }
#pragma unroll
      for (int k = 0; k < kU; ++k)
        if (ok[k]) store_token(ub + k * u_stride, t, h[k], s[k]);
    }
#pragma unroll
    for (int k = 0; k < kU; ++k)
      if (ok[k] && r.s_out >= 0)
        store_unit(ub + k * u_stride, pool + r.s_out * p.state_slot_stride + int64_t(h[k]) * head_elems, s[k]);
    if (stages > 0) {
      // (this stage's vectors are in registers and used: the copies may reuse it)
      issue_round(n + stages, stage);
      stage = stage + 1 == stages ? 0 : stage + 1;
    }
  }

  // ---- 4. the gated RMSNorm of each (token, head), the fused kernels' order:
  //   out[j] = w[j] * o[j] * rsqrt(mean_j(o[j]^2) + eps) * silu(z[j])
  if (!norm) return;
  const float inv_dv = 1.0f / float(Dv);
  __syncthreads();
  for (int i = warp; i < nt * G; i += kWarps) {
    const int t = i / G, g = i - t * G, h = group_head(p, hk, g, G);
    const float* out = outs + i * Dv;
    const float rstd = rsqrtf(head_sum_squares(out, Dv, lane) * inv_dv + p.norm_eps);
    const int64_t z_base = tok(t, p.z_batch_stride, p.z_token_stride) + int64_t(h) * p.z_head_stride;
    for (int j = lane; j < Dv; j += kWarp) {
      const float w = load_small(p.norm_weight, p.qkv_dtype, j);
      const float zg = silu(load_small(p.z, p.qkv_dtype, z_base + j));
      store_any(p.o, p.o_dtype, o_at(t, h) + j, w * out[j] * rstd * zg);
    }
  }
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
