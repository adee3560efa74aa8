// kv: the step (decode_kv_step_kernel).
#pragma once

#include "kv_tile.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {


// kv step: a block of kW warps owns a tile of kW 16-byte chunks of every row
// (KvTile), computed where it was copied (KvRegTile; docs/decisions.md#kv-tile),
// streaming tiles [t, t_end) of its head, kv_step_stages - 1 in flight
// (docs/decisions.md#kv-tiles-per-block); exactly two tiles, both in flight
// from the start, reduce together (the pair path). kHints: L2 policies
// (docs/decisions.md#l2-hints). kNorm (sm_90, Plan::norm): the gated RMSNorm
// as the epilogue, a head's blocks a cluster, each output pushed raw to all of
// them, then each block's own columns normalized with the head's sum of
// squares in the fused kernels' order (docs/decisions.md#norm-epilogue).
template <typename T, int kDk, int kW, typename IO, int kHints, bool kNorm = false>
__global__ void __launch_bounds__(kW * kWarp, (kv_step_min_blocks<kDk, kW>()))
    decode_kv_step_kernel(int tiles_per_head, int tiles_per_block, FastDiv by_blocks_per_head, FastDiv by_hv,
                          FastDiv by_head_map, bool small_loads_first, const __grid_constant__ KernelParams p,
                          float scale) {
  // kNorm: launched only from sm_90 code, so left empty elsewhere
  if constexpr (kNorm && !kClusterCode) {
    GDN_NOT_LAUNCHED_HERE();
  }
  using R = KvRegTile<T, kDk, kW>;
  using V = Vec<T>;
  constexpr int kVec = R::kVec, kRows = R::kRows, kCols = R::kCols, kThreads = R::kThreads;
  constexpr int kStagesHere = kv_step_stages<T, kDk>();
  // dynamic: the ring, kStagesHere stages of [kRows][kThreads] chunks
  extern __shared__ uint4 smem_raw[];
  V* const ring = reinterpret_cast<V*>(smem_raw);
  // partial sums and deltas: one tile's, or two (a pair, below)
  constexpr int kTilesAtOnce = kStagesHere >= 3 ? 2 : 1;
  __shared__ float part[kTilesAtOnce * R::kPartFloats];
  __shared__ float dl[kTilesAtOnce * kCols];
  // kNorm: the head's raw outputs and the mbarrier that counts their bytes
  __shared__ float head_out[kNorm ? kMaxHeadDim : 1];
  __shared__ unsigned long long out_bar;

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int tid = int(threadIdx.x), lane = tid % kWarp;
  // blockIdx = (b * Hv + h) * blocks_per_head + blk, as in decode_vk;
  // this block's tiles [t, t_end): never empty.
  const unsigned row_head = by_blocks_per_head.div(blockIdx.x);
  const int blk = int(blockIdx.x - row_head * by_blocks_per_head.d);
  const unsigned b32 = by_hv.div(row_head);
  const int h = int(row_head - b32 * unsigned(Hv));
  const int64_t b = b32;
  // (the output's offset is formed where each path stores: held through the
  // tiles, the 64-bit value made the HIP path's 16-bit tiles spill)
  int t = blk * tiles_per_block;
  const int t_end = min(tiles_per_head, t + tiles_per_block);

  const RowSlots slots = row_slots(p, b);
  // kNorm: the head's blocks, and this block's columns [j_own, j_own + n_own), at most one a thread
  const int csize = kNorm ? int(by_blocks_per_head.d) : 1;
  const int j_own = t * kCols, n_own = min(Dv, t_end * kCols) - j_own;
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    count_bad_indices(p, slots, h, blk);
    // Padding row (uniform over the block): zero this block's outputs, touch no state.
    const int64_t o_base = b * p.o_batch_stride + int64_t(h) * p.o_head_stride;
    const int j_end = min(Dv, t_end * kCols);
    for (int j = t * kCols + tid; j < j_end; j += kThreads) store_any(p.o, p.o_dtype, o_base + j, 0.0f);
    return;
  }

  // This thread's chunk and row group (its rows: rg + kWarp n); 64-bit offsets
  // once per slot and head, 32-bit inside a head.
  const int chunk = tid % kW, rg = tid / kW;
  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  // Copy the thread's chunks of tile tt into ring stage `stage` (zeros past Dk
  // or Dv: kVec divides Dv, so a chunk is all in or all out; nothing past the
  // last tile) and close the group either way, so group k is the block's tile k.
  auto issue_tile = [&](int tt, int stage) {
    if (tt < t_end) {
      const int j = tt * kCols + chunk * kVec;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const int i = rg + n * kWarp;
        const bool in = i < Dk && j < Dv;
        copy16_async<(kHints & 2) != 0>(ring + R::slot(stage, n, tid), in ? s_in + i * Dv + j : s_in, in);
      }
    }
    async_commit();
  };
  // A block of exactly two tiles with both in flight from the start
  // (kStagesHere = 3) reduces them together (below).
  const bool pair = kTilesAtOnce == 2 && t_end - t == 2;
  // The finishing thread of column tid (tid < kCols; in a pair also of the
  // second tile's column tid - kCols) loads its v (two steps, RawRun).
  const bool finisher = tid < (pair ? 2 : 1) * kCols;
  auto load_v = [&](int tt, IoRun<IO, 1>& run) {
    const int j = tt * kCols + tid;
    if (finisher) run.load(p.qkv_dtype, p.v, b * p.v_batch_stride + int64_t(h) * p.v_head_stride + (j < Dv ? j : 0));
  };

  // ---- 1. the first kStagesHere - 1 tiles' state, and v, q, k and the gates
  // (in start_step_loads' order)
  auto issue_state = [&] {
#pragma unroll
    for (int st = 0; st < kStagesHere - 1; ++st) issue_tile(t + st, st);
  };
  IoRun<IO, 1> v_run, q_raw[kRows], k_raw[kRows];
  GateInputs<IO> gate_in;
  IoRun<IO, 1> z_pre, w_pre;  // kNorm: z and norm_weight of the thread's own column
  auto issue_small = [&] {
    load_v(t, v_run);
    const unsigned hq = by_head_map.div(unsigned(h));
    const int hk = p.head_map == HeadMap::kInterleaved ? int(hq) : h - int(hq) * p.num_k_heads;
    load_qk_rows<IO>(p, b, hk, lane, Dk, q_raw, k_raw);
    gate_in = load_gate_inputs<IO>(p, b, h);
    if constexpr (kNorm) {
      const int col = j_own + (tid < n_own ? tid : 0);
      z_pre.load(p.qkv_dtype, p.z, b * p.z_batch_stride + int64_t(h) * p.z_head_stride + col);
      w_pre.load(p.qkv_dtype, p.norm_weight, col);
    }
  };
  GDN_MARK(0);
  if constexpr (kNorm) {
    // The mbarrier expects the head's Dv outputs (peers' pushes may land before
    // this arrival) and is ready for them once the cluster barrier below completes.
    if (csize > 1) {
      if (tid == 0) {
        outputs_barrier_init(&out_bar);
        outputs_expect(&out_bar, unsigned(sizeof(float)) * unsigned(Dv));
      }
      cluster_arrive_relaxed();
    }
  }
  start_step_loads(p, small_loads_first, issue_state, issue_small);
  count_bad_indices(p, slots, h, blk);  // (the loads are out)
  float vj = v_run.value(finisher);
  float qh[kRows], kh[kRows];
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const int i = lane + n * kWarp;
    qh[n] = q_raw[n].value(i < Dk);
    kh[n] = k_raw[n].value(i < Dk);
  }
  const Gates gates = finish_gates(p, gate_in);

  // ---- 2. l2norm, q_hat and k_hat of the thread's rows (KvRegTile::normalize)
  float qr[kRows], kr[kRows];
  const float kq = R::normalize(p, qh, kh, qr, kr);
  GDN_MARK(3);
  if constexpr (kNorm) {
    if (csize > 1) cluster_wait();  // every block's mbarrier is ready for the pushes
  }

  // o[jt + col] of the block's head (nothing past Dv); kNorm: raw, into
  // every block of the head
  auto emit_at = [&](int jt) {
    return [&, jt](int col, float o_val) {
      if (jt + col >= Dv) return;
      if constexpr (kNorm) {
        if (csize > 1)
          push_to_cluster(&head_out[jt + col], &out_bar, csize, o_val);
        else
          head_out[jt + col] = o_val;
        return;
      }
      const int64_t o_base = b * p.o_batch_stride + int64_t(h) * p.o_head_stride;
      with_dtype<IO>(p.o_dtype, [&](auto tag) {
        using E = decltype(tag);
        static_cast<E*>(p.o)[o_base + jt + col] = Elem<E>::from_float(o_val);
      });
    };
  };
  // kNorm, after the block's tiles: normalize its own columns (step_norm_finish).
  auto norm_epilogue = [&] {
    if constexpr (kNorm)
      step_norm_finish(p, head_out, Dv, j_own, n_own, b * p.o_batch_stride + int64_t(h) * p.o_head_stride, csize,
                       &out_bar, w_pre, z_pre);
  };
  if constexpr (kTilesAtOnce == 2) {
    if (pair) {
      // ---- 3'. two tiles, both copied by issue_state: each posts its partials
      // to its half of `part`; one barrier; threads k kCols + c finish column c of
      // tile t + k; a second barrier; S' of both stored (tile t read back from its
      // stage, freeing its registers meanwhile). Two barriers instead of four; the
      // sums are the loop's below, bit for bit.
      static_assert(2 * kCols <= kThreads, "a finishing thread a column of both tiles");
      V s[kRows];
      R::template fetch<1>(ring, 0, s);
      R::post(s, qr, kr, part);
      R::template fetch<0>(ring, 1, s);
      GDN_MARK(5);
      R::post(s, qr, kr, part + R::kPartFloats);
      __syncthreads();  // both tiles' partial sums are posted
      if (finisher) {
        const int k = tid / kCols;
        R::finish(tid % kCols, part + k * R::kPartFloats, vj, gates.decay, gates.beta, kq, scale, dl + k * kCols,
                  emit_at((t + k) * kCols));
      }
      __syncthreads();  // both tiles' deltas are posted
      if (slots.write) {
        V s0[kRows];
#pragma unroll
        for (int n = 0; n < kRows; ++n) s0[n] = ring[R::slot(0, n, tid)];
        R::template store<(kHints & 1) != 0>(s0, kr, gates.decay, dl, s_out, t * kCols + chunk * kVec, Dk, Dv);
        R::template store<(kHints & 1) != 0>(s, kr, gates.decay, dl + kCols, s_out, (t + 1) * kCols + chunk * kVec, Dk,
                                             Dv);
      }
      GDN_MARK(6);
      norm_epilogue();
      GDN_MARK(8);
      return;
    }
  }
  // ---- 3. the block's tiles, kStagesHere - 1 of them in flight while one is reduced
  for (int stage = 0;; stage = stage + 1 == kStagesHere ? 0 : stage + 1) {
    const bool has_next = t + 1 < t_end;
    // Stage stage - 1 held the previous tile, which this thread has read.
    issue_tile(t + kStagesHere - 1, stage == 0 ? kStagesHere - 1 : stage - 1);
    IoRun<IO, 1> v_next;
    if (has_next) load_v(t + 1, v_next);
    V s[kRows];
    R::template fetch<kStagesHere - 1>(ring, stage, s);  // this thread's chunks of tile t
    GDN_MARK(5);
    const int jt = t * kCols;
    R::reduce(s, qr, kr, vj, gates.decay, gates.beta, kq, scale, part, dl, emit_at(jt));
    if (slots.write) R::template store<(kHints & 1) != 0>(s, kr, gates.decay, dl, s_out, jt + chunk * kVec, Dk, Dv);
    if (!has_next) break;
    ++t;
    vj = v_next.value(finisher);
  }
  GDN_MARK(6);
  norm_epilogue();
  GDN_MARK(8);
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
