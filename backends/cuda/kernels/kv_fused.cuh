// kv: the fused middle (decode_kv_fused_kernel).
#pragma once

#include "kv_tile.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// kv, the fused middle (conv or norm on; the step alone: kv_step.cuh). A group
// (row b, k-head hk) is `cluster` blocks, blockIdx = (b * Hk + hk) * cluster +
// rank, streaming the tiles T = g * tiles_per_head + tile of its G heads
// (docs/decisions.md#fused-groups), each computed where copied (KvRegTile).
// Hazards: a thread reads back only its own ring slots and refills a stage only
// after reading it; partials and deltas are fenced by the tile's two barriers,
// which all threads reach (a padding row returns uniformly). 64 registers a
// thread: 128 would halve the occupancy.
// kNormOnly: the norm alone in clusters (as the vk kernel's; sm_90 only).
// DecodeParams, not KernelParams: this kernel reads conv_width, then q's
// address right before q and k, two lines missed in a row in KernelParams'
// order (docs/decisions.md#kernel-params).
template <typename T, int kDk, int kW, typename IO, bool kNormOnly, bool kPdl = false>
__global__ void __launch_bounds__(kW * kWarp, kDk <= 128 ? 1024 / (kW * kWarp) : 1)
    decode_kv_fused_kernel(const __grid_constant__ DecodeParams p, int tiles_per_head, int tiles_per_block,
                           FastDiv by_hv, float scale, int group_heads, int cluster, FusedArgs fdiv) {
  // kNormOnly and kPdl are launched only from sm_90 code (kPdl: 16-bit inputs only)
  if constexpr ((kNormOnly && !kClusterCode) || (kPdl && (!kClusterCode || !kPdlInputs<IO>))) {
    GDN_NOT_LAUNCHED_HERE();
  }
  using R = KvRegTile<T, kDk, kW>;
  using V = Vec<T>;
  constexpr int kVec = R::kVec, kRows = R::kRows, kCols = R::kCols, kThreads = R::kThreads;
  constexpr int kStagesHere = kv_stages<T>();
  // dynamic: the ring, kStagesHere stages of [kRows][kThreads] chunks (kv_stages:
  // 3 for fp32, 96 KiB at Dk = 256), then the fused stages' floats
  extern __shared__ uint4 smem_raw[];
  V* const ring = reinterpret_cast<V*>(smem_raw);
  __shared__ float part[R::kPartFloats];
  __shared__ float dl[kCols];

  const int Dk = p.head_dim_k, Dv = p.head_dim_v;
  const FusedSmem sm(reinterpret_cast<float*>(ring + kStagesHere * kRows * kThreads), group_heads, Dk, Dv);
  const int tid = int(threadIdx.x), lane = tid % kWarp;
  // blockIdx = (b * Hk + hk) * cluster + rank; this block's tiles [t, t_end)
  // of the group's (never empty).
  const unsigned group = fdiv.cluster.div(blockIdx.x);
  const unsigned b32 = by_hv.div(group);
  const int64_t b = b32;
  const int hk = int(group - b32 * unsigned(p.num_k_heads));
  Group grp{b, hk, group_heads, int(blockIdx.x - group * unsigned(cluster)), cluster, 0, 0, 0, 0, fdiv.cluster,
            fdiv.vector_runs};
  const int blk = grp.rank;
  int t = grp.rank * tiles_per_block;
  const int t_end = min(group_heads * tiles_per_head, t + tiles_per_block);
  // The block's columns: from its first tile's first to its last tile's last.
  const int g_first = int(fdiv.per_head.div(unsigned(t))), g_last = int(fdiv.per_head.div(unsigned(t_end - 1)));
  grp.g_lo = g_first;
  grp.j_lo = (t - g_first * tiles_per_head) * kCols;
  grp.lo = g_first * Dv + grp.j_lo;
  grp.hi = g_last * Dv + min(Dv, (t_end - g_last * tiles_per_head) * kCols);

  const RowSlots slots = row_slots(p, b);
  count_bad_indices(p, slots, hk, blk);  // (at once: see decode_vk)
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    // Padding row (uniform over the block: no barrier is skipped by part of
    // it): zero the group's outputs, touch no state.
    zero_group_outputs(p, grp);
    return;
  }

  // This thread's chunk and row group (its rows: rg + kWarp n); 64-bit offsets
  // once per slot and head, 32-bit inside a head.
  const int chunk = tid % kW, rg = tid / kW;
  const T* s_in_slot = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride;
  T* s_out_slot = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride;
  // Tile T of the block: group member g, its head, and the tile within the head.
  struct Pos {
    int g, h, tile;
  };
  auto pos = [&](int tt) -> Pos {
    const int g = int(fdiv.per_head.div(unsigned(tt)));
    return Pos{g, group_head(p, hk, g, group_heads), tt - g * tiles_per_head};
  };
  auto head_off = [&](int h) { return int64_t(h) * Dk * Dv; };

  // Copy the thread's chunks of tile tt into ring stage `stage` (zeros past Dk
  // or Dv: kVec divides Dv, so a chunk is all in or all out; nothing past the
  // last tile) and close the group either way, so group k is the block's tile k.
  auto issue_tile = [&](int tt, int stage) {
    if (tt < t_end) {
      const Pos q = pos(tt);
      const T* src = s_in_slot + head_off(q.h);
      const int j = q.tile * kCols + chunk * kVec;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const int i = rg + n * kWarp;
        const bool in = i < Dk && j < Dv;
        copy16_async(ring + R::slot(stage, n, tid), in ? src + i * Dv + j : src, in);
      }
    }
    async_commit();
  };
  // v of the finishing thread's column (tid < kCols) of tile tt, in two steps
  // (RawRun): load_v (past Dv: the head's first element), convert_v (0 past Dv).
  // Conv on: the prologue's output.
  const bool finisher = tid < kCols;
  struct VLoad {
    IoRun<IO, 1> run;
    int tt;
  };
  auto load_v = [&](int tt, VLoad& l) {
    l.tt = tt;
    if (p.conv_width > 0 || !finisher) return;
    const Pos q = pos(tt);
    const int j = q.tile * kCols + tid;
    l.run.load(p.qkv_dtype, p.v, b * p.v_batch_stride + int64_t(q.h) * p.v_head_stride + (j < Dv ? j : 0));
  };
  auto convert_v = [&](const VLoad& l) -> float {
    const Pos q = pos(l.tt);
    const int j = q.tile * kCols + tid;
    if (!finisher) return 0.0f;
    if (p.conv_width > 0) return j < Dv ? sm.vo[q.g * Dv + j] : 0.0f;
    return l.run.value(j < Dv);
  };

  // ---- 1. the first kStagesHere - 1 tiles' state and v, q, k, in
  // start_fused_loads' order; the gates come from the prologue.
  auto issue_state = [&] {
#pragma unroll
    for (int st = 0; st < kStagesHere - 1; ++st) issue_tile(t + st, st);
  };
  // The token's small loads, all issued before any is used (RawRun); with the
  // conv on, q, k and v come from the prologue.
  VLoad v_first;
  IoRun<IO, 1> q_raw[kRows], k_raw[kRows];
  const bool qk_global = p.conv_width == 0;
  auto issue_small = [&] {
    load_v(t, v_first);
    if (qk_global) load_qk_rows<IO>(p, b, hk, lane, Dk, q_raw, k_raw);
  };
  GDN_MARK(0);
  // The norm alone in a cluster (kNormOnly, as decode_vk's): no prologue. Every
  // thread loads q, k and the gates of the block's one head, the finishers v,
  // each thread its column's z and norm_weight, then the state; the gates stay
  // in registers (docs/decisions.md#norm-epilogue).
  constexpr bool kDirect = kNormOnly && kClusterCode && !std::is_same<IO, MixedIO>::value;
  IoRun<IO, 1> z_pre, w_pre;  // silu(z) and norm_weight of the thread's column lo + tid (fused_finish)
  float head_decay = 0.0f, head_beta = 0.0f;
  if constexpr (kDirect) {
    fused_begin(p, grp, sm);
    if (p.programmatic_launch) {
      // The warp syncs first: ptxas issues thread 0's mbarrier.init (fused_begin) as
      // one warp-wide instruction (SYNCS.EXCH.64, sm_90), which racecheck counts as a
      // write by every lane of warp 0, racing with thread 0's arrive (fused_arrive)
      // unless a warp sync stands between. The plain order has its issue_order_fence
      // there; in fused_begin the sync cost every kernel (docs/decisions.md#not-kept).
      issue_order_fence();
      issue_state();
    }
    wait_upstream();
    GDN_MARK(1);
    issue_small();
    const int h_lo = group_head(p, hk, grp.g_lo, group_heads);
    const GateInputs<IO> gin = load_gate_inputs<IO>(p, b, h_lo);
    const int col = tid < grp.hi - grp.lo ? tid : 0;
    z_pre.load(p.qkv_dtype, p.z, b * p.z_batch_stride + int64_t(h_lo) * p.z_head_stride + grp.j_lo + col);
    w_pre.load(p.qkv_dtype, p.norm_weight, grp.j_lo + col);
    GDN_MARK(9);
    if (!p.programmatic_launch) {
      issue_order_fence();
      issue_state();
    }
    GDN_MARK(10);
    const Gates gates = finish_gates(p, gin);
    head_decay = gates.decay;
    head_beta = gates.beta;
    fused_arrive(p, grp, sm);  // (no conv windows: only the outputs' mbarrier)
    GDN_MARK(13);
  } else {
    start_fused_loads<IO, prologue_run<Layout::kKV>(), true, kPdl>(p, grp, slots, sm, issue_state, issue_small);
  }
  // ... then the values.
  float vj = convert_v(v_first);
  float qh[kRows], kh[kRows];
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const int i = lane + n * kWarp;
    if (qk_global) {
      qh[n] = q_raw[n].value(i < Dk);
      kh[n] = k_raw[n].value(i < Dk);
    } else {
      // the conv output of the group prologue
      qh[n] = i < Dk ? sm.qk[i] : 0.0f;
      kh[n] = i < Dk ? sm.qk[Dk + i] : 0.0f;
    }
  }

  // ---- 2. l2norm, q_hat and k_hat of the thread's rows (KvRegTile::normalize)
  float qr[kRows], kr[kRows];
  GDN_MARK(16);
  const float kq = R::normalize(p, qh, kh, qr, kr);
  GDN_MARK(3);
  if constexpr (kDirect)
    cluster_wait();  // every block's outputs' mbarrier is ready for the pushes
  else
    fused_mid<IO>(p, grp, slots, sm);
  GDN_MARK(4);
  // ---- 3. the block's tiles, kStagesHere - 1 of them in flight while one is reduced
  for (int stage = 0;; stage = stage + 1 == kStagesHere ? 0 : stage + 1) {
    const bool has_next = t + 1 < t_end;
    const Pos cur = pos(t);
    const float decay = kDirect ? head_decay : sm.decay[cur.g], beta = kDirect ? head_beta : sm.beta[cur.g];
    // Stage stage - 1 held the previous tile, which this thread has read.
    issue_tile(t + kStagesHere - 1, stage == 0 ? kStagesHere - 1 : stage - 1);
    VLoad v_next;
    if (has_next) load_v(t + 1, v_next);
    V s[kRows];
    R::template fetch<kStagesHere - 1>(ring, stage, s);  // this thread's chunks of tile t
    GDN_MARK(5);
    const int jt = cur.tile * kCols;
    R::reduce(s, qr, kr, vj, decay, beta, kq, scale, part, dl,
              [&](int col, float o_val) {
                const int jo = jt + col;
                if (jo >= Dv) return;
                if (p.norm_weight != nullptr) {
                  fused_emit(sm, grp, cur.g * Dv + jo, o_val);  // normalized in the epilogue
                } else {
                  const int64_t o_base = b * p.o_batch_stride + int64_t(cur.h) * p.o_head_stride;
                  with_dtype<IO>(p.o_dtype, [&](auto tag) {
                    using E = decltype(tag);
                    static_cast<E*>(p.o)[o_base + jo] = Elem<E>::from_float(o_val);
                  });
                }
              });
    GDN_MARK(17);
    if (slots.write) {
      // S read back from the ring (refilled only next tile): its registers are free
      // across the reduction (held, the bf16 kernel spilled).
      V s2[kRows];
#pragma unroll
      for (int n = 0; n < kRows; ++n) s2[n] = ring[R::slot(stage, n, tid)];
      R::template store<(kFusedL2Hints & kL2EvictFirst) != 0>(s2, kr, decay, dl, s_out_slot + head_off(cur.h),
                                                              jt + chunk * kVec, Dk, Dv);
    }
    if (!has_next) break;
    ++t;
    vj = convert_v(v_next);
  }
  GDN_MARK(6);
  if constexpr (kDirect) {
    const float zw[2] = {silu(z_pre.value()), w_pre.value()};
    fused_finish<IO>(p, grp, sm, zw);
  } else {
    fused_finish<IO>(p, grp, sm);
  }
  GDN_MARK(8);
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
