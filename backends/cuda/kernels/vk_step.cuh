// vk ([Dv, Dk], Dk contiguous): the ring kernel of the step and its fused
// middle (decode_vk_step_kernel, decode_vk_fused_kernel).
#pragma once

#include "norm_epilogue.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// The body of both vk kernels. A warp owns items, a fixed group of columns of
// one (row, head) over all of Dk (docs/decisions.md#warp-item), streamed
// through its own cp.async ring (docs/decisions.md#vk-ring).
// kFused (conv or norm on): a group (row b, k-head hk) is `cluster` blocks,
// blockIdx = (b * Hk + hk) * cluster + rank; warp w of block rank works on head
// g = (rank * W + w) / warps_per_head (docs/decisions.md#fused-groups).
// kNormOnly (fused): the norm alone in clusters, no prologue (see below).
// kStepNorm (the step, sm_90; Plan::norm): the gated RMSNorm as its epilogue
// (docs/decisions.md#norm-epilogue), only where every warp has an item: none
// may leave before the cluster barrier.
template <typename T, Layout kLayout, int kDk, int kP, typename IO, bool kFused, bool kNormOnly, int kHints,
          bool kStepNorm = false, bool kPdl = false, typename Params>
__device__ __forceinline__ void decode_vk(const Params& p, int items_per_head, int items_per_warp,
                                          FastDiv by_blocks_per_head, FastDiv by_hv, FastDiv by_head_map,
                                          bool small_loads_first, float scale, int group_heads, int warps_per_head,
                                          int cluster, FusedArgs fdiv) {
  static_assert(kLayout == Layout::kVK, "kv runs its own kernels");
  static_assert(kFused || !kNormOnly, "kNormOnly is a fused instantiation");
  // Launched only from sm_90 code (kPdl: and only for 16-bit inputs): left empty elsewhere.
  if constexpr (((kNormOnly || kStepNorm) && !kClusterCode) || (kPdl && (!kClusterCode || !kPdlInputs<IO>))) {
    GDN_NOT_LAUNCHED_HERE();
  }
  constexpr int kColsPerItem = cols_per_item<T, kLayout, kDk, kP>();
  using VkT = VkTile<T, kDk, kP>;
  using V = Vec<T>;
  constexpr int kVec = V::kN;
  // What a lane holds: kOuter columns x kInner chunks of kVec rows.
  constexpr int kOuter = VkT::kUnroll;
  constexpr int kInner = VkT::kChunksPerLane;
  constexpr int kRowsHeld = kInner * kVec;
  constexpr int kColsHeld = kOuter;
  constexpr int kReduceLow = 1;
  constexpr int kReduceSpan = VkT::kLanesPerCol;

  const int Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int warps = int(blockDim.x / kWarp);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // Block coordinates by host-prepared divisors (docs/decisions.md#fastdiv):
  // blockIdx = (b * Hv + h) * blocks_per_head + blk, or (fused) b * Hk + hk.
  int h, blk, hk = 0, g = 0, gw = 0;
  int64_t b;
  Group grp{};
  if constexpr (kFused) {
    const unsigned group = fdiv.cluster.div(blockIdx.x);
    const unsigned b32 = by_hv.div(group);
    b = b32;
    hk = int(group - b32 * unsigned(p.num_k_heads));
    grp = Group{b, hk, group_heads, int(blockIdx.x - group * unsigned(cluster)), cluster, 0, 0, 0, 0, fdiv.cluster,
                fdiv.vector_runs};
    gw = grp.rank * warps + warp;  // the warp's index in the group
    g = int(fdiv.per_head.div(unsigned(gw)));
    h = group_head(p, hk, g, group_heads);
    blk = grp.rank;
    // The block's columns: its first warp's first item to its last warp's last
    // (a head's consecutive warps own consecutive items).
    const int first = grp.rank * warps, last = first + warps - 1;
    const int g_first = int(fdiv.per_head.div(unsigned(first))), g_last = int(fdiv.per_head.div(unsigned(last)));
    const int it_first = (first - g_first * warps_per_head) * items_per_warp;
    const int it_end = min(items_per_head, (last - g_last * warps_per_head + 1) * items_per_warp);
    grp.g_lo = g_first;
    grp.j_lo = it_first * kColsPerItem;
    grp.lo = g_first * Dv + grp.j_lo;
    grp.hi = g_last * Dv + min(Dv, it_end * kColsPerItem);
  } else {
    const unsigned row_head = by_blocks_per_head.div(blockIdx.x);
    blk = int(blockIdx.x - row_head * by_blocks_per_head.d);
    const unsigned b32 = by_hv.div(row_head);
    h = int(row_head - b32 * unsigned(Hv));
    b = b32;
  }
  // (the output's offset is formed where used: its strides lie past KernelParams' first part)
  auto out_base = [&] { return b * p.o_batch_stride + int64_t(h) * p.o_head_stride; };

  const RowSlots slots = row_slots(p, b);
  // (fused: counted at once, by the group's first k-head)
  if (kFused) count_bad_indices(p, slots, hk, blk);
  if (slots.s_in < 0 || slots.s_in >= p.num_slots) {
    if (!kFused) count_bad_indices(p, slots, h, blk);
    // Padding row: zero this block's outputs, touch no state.
    if constexpr (kFused) {
      zero_group_outputs(p, grp);
    } else {
      const int64_t o_base = out_base();
      const int j0 = blk * warps * items_per_warp * kColsPerItem;
      const int j_end = min(Dv, j0 + warps * items_per_warp * kColsPerItem);
      for (int j = j0 + threadIdx.x; j < j_end; j += blockDim.x) store_any(p.o, p.o_dtype, o_base + j, 0.0f);
    }
    return;
  }
  int item = kFused ? (gw - g * warps_per_head) * items_per_warp : (blk * warps + warp) * items_per_warp;
  // Warps past the head's last item leave. Fused blocks have none (every warp
  // gets an item) and must not leave: the group's barriers follow.
  if (!kFused && item >= items_per_head) return;
  const int item_end = min(items_per_head, item + items_per_warp);
  // kStepNorm: the head's raw outputs, the mbarrier counting their bytes, the
  // head's blocks, and this block's columns [j_own, j_own + n_own), at most one a thread.
  __shared__ float step_out[kStepNorm ? kMaxHeadDim : 1];
  __shared__ unsigned long long step_bar;
  const int csize = kStepNorm ? int(by_blocks_per_head.d) : 1;
  const int j_own = blk * warps * items_per_warp * kColsPerItem;
  const int n_own = min(Dv, j_own + warps * items_per_warp * kColsPerItem) - j_own;

  // ---- where this lane's data lives: rows[r], the Dk index of held row r;
  // cols[c], held column c's offset from the item's first column.
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

  // 64-bit offsets once per (slot, head); inside a head (< Dk * Dv <= 65536) 32-bit.
  const int64_t head_off = int64_t(h) * Dk * Dv;
  const T* s_in = static_cast<const T*>(p.state) + slots.s_in * p.state_slot_stride + head_off;
  T* s_out = static_cast<T*>(p.state) + slots.s_out * p.state_slot_stride + head_off;
  const int64_t v_base = b * p.v_batch_stride + int64_t(h) * p.v_head_stride;

  // State vector (o, c) of the item starting at column j0: row i, column j, offset.
  auto vec_row = [&](int o, int c) { (void)o; return rows[c * kVec]; };
  auto vec_col = [&](int o, int j0) { return j0 + cols[o]; };
  // element (i, j) at j*Dk + i
  auto vec_off = [&](int i, int j) -> int { return j * Dk + i; };
  // The fused stages' shared memory, after the ring.
  extern __shared__ uint4 smem_raw[];
#if GDN_VK_RING
  constexpr int kRingVecs = kStages * kOuter * kInner * kWarp;  // a warp's ring, in 16-byte vectors
#else
  constexpr int kRingVecs = 0;
#endif
  const FusedSmem sm(reinterpret_cast<float*>(smem_raw + warps * kRingVecs), kFused ? group_heads : 0, Dk, Dv);
  // After the one-pass butterfly (OnePass) a held column's sums sit in the lanes
  // its value bits name: they form its delta, and one of them writes its output.
  using Pass = OnePass<kReduceLow, kReduceSpan, kColsHeld>;
  const int out_c = Pass::col(lane);
  const bool writer = Pass::writer(lane);
  // cols[out_c] without a run-time array index (which would go to local memory).
  const int out_col = out_c * VkT::kColsPerStep + lane / VkT::kLanesPerCol;
  // v[j0 + out_col], the lane's column, in two steps (RawRun): load_v issues the
  // load (past Dv: the head's first element), convert_v makes the value (0 past
  // Dv). Conv on: the prologue's output in shared memory.
  struct VLoad {
    IoRun<IO, 1> run;
    int j0;
  };
  auto load_v = [&](int j0, VLoad& l) {
    l.j0 = j0;
    if (kFused && p.conv_width > 0) return;
    const int j = j0 + out_col;
    l.run.load(p.qkv_dtype, p.v, v_base + (j < Dv ? j : 0));
  };
  auto convert_v = [&](const VLoad& l) -> float {
    const int j = l.j0 + out_col;
    if (kFused && p.conv_width > 0) return j < Dv ? sm.vo[g * Dv + j] : 0.0f;
    return l.run.value(j < Dv);
  };
#if GDN_VK_RING
  // The warp's ring of kStages item buffers in shared memory. A lane copies
  // in, and later reads back, only its own kHeld vectors of an item (lanes
  // side by side: conflict-free), so no barrier is ever needed.
  constexpr int kHeld = kOuter * kInner;
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
          copy16_async<(kHints & 2) != 0>(slot(stage, o, c), in ? s_in + vec_off(i, j) : s_in, in);
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
  // No cp.async (AMD): a shared-memory ring would only cost LDS (64 KiB a CU on
  // gfx9) and cap the waves a CU holds, so the next item loads into registers
  // while the current one computes (docs/decisions.md#hip-source-path).
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

  // ---- 1. every load up front, so one memory latency covers them all: the
  // first kStages - 1 items' state, q, k, v and the gates. In a one-round grid
  // (Plan::small_loads_first) the small loads go first, being the longer path
  // (docs/decisions.md#small-loads-first). Fused: the prologue's loads, then the
  // state's. Under PDL the state's go before the wait and the inputs after it:
  // the previous kernel may still be writing them (docs/decisions.md#pdl).
  auto issue_state = [&] {
#if GDN_VK_RING
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) issue_item(item + st, st);
#else
    issue_item(item, 0);
#endif
  };
  // The token's small loads, all issued before any is used (RawRun).
  VLoad v_first;
  // q and k rows, kVec consecutive rows a chunk (kVec divides Dk: a chunk is all
  // in range or none), one vector load each; a chunk past Dk reads row 0.
  IoRun<IO, kVec> q_raw[kInner], k_raw[kInner];
  GateInputs<IO> gate_in;
  // silu(z) and norm_weight of the thread's column (fused_finish; kStepNorm)
  IoRun<IO, 1> z_pre, w_pre;
  const bool qk_global = !(kFused && p.conv_width > 0);
  auto issue_small = [&] {
    load_v(item * kColsPerItem, v_first);
    // hk = h / G interleaved, h % Hk tiled (by_head_map divides by G or by Hk)
    if constexpr (!kFused) {
      const unsigned hq = by_head_map.div(unsigned(h));
      hk = p.head_map == HeadMap::kInterleaved ? int(hq) : h - int(hq) * p.num_k_heads;
    }
    if (qk_global) {
      const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
      const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
#pragma unroll
      for (int c = 0; c < kInner; ++c) {
        const int i = rows[c * kVec] < Dk ? rows[c * kVec] : 0;
        q_raw[c].load(p.qkv_dtype, p.q, q_base + i);
        k_raw[c].load(p.qkv_dtype, p.k, k_base + i);
      }
    }
    if constexpr (!kFused) gate_in = load_gate_inputs<IO>(p, b, h);
    if constexpr (kStepNorm) {
      const int col = j_own + (int(threadIdx.x) < n_own ? int(threadIdx.x) : 0);
      z_pre.load(p.qkv_dtype, p.z, b * p.z_batch_stride + int64_t(h) * p.z_head_stride + col);
      w_pre.load(p.qkv_dtype, p.norm_weight, col);
    }
  };
  GDN_MARK(0);
  float vj, qh[kRowsHeld], kh[kRowsHeld], decay, beta;
  auto qk_from_raw = [&] {
#pragma unroll
    for (int c = 0; c < kInner; ++c) {
      q_raw[c].to_float(qh + c * kVec, rows[c * kVec] < Dk);
      k_raw[c].to_float(kh + c * kVec, rows[c * kVec] < Dk);
    }
  };
  // ---- the norm alone in a cluster (kNormOnly): no prologue. Each warp loads
  // q, k, v and its head's gates as the step does, each thread its column's z
  // and norm_weight, then the state: no block barrier, and the cluster barrier
  // (outputs' mbarrier ready) arrived at once. Only with the conv off, each
  // block's columns in one head, one a thread (docs/decisions.md#norm-epilogue).
  constexpr bool kDirect = kNormOnly && kClusterCode && !std::is_same<IO, MixedIO>::value;
  if constexpr (kStepNorm) {
    // The mbarrier expects the head's Dv outputs (peers' pushes may land before
    // this arrival); ready for them once the cluster barrier after the l2norm completes.
    if (csize > 1) {
      if (threadIdx.x == 0) {
        outputs_barrier_init(&step_bar);
        outputs_expect(&step_bar, unsigned(sizeof(float)) * unsigned(Dv));
      }
      cluster_arrive_relaxed();
    }
  }
  if constexpr (kDirect) {
    fused_begin(p, grp, sm);
    if (p.programmatic_launch) {
      // (the warp syncs after thread 0's mbarrier.init: see the kv kernel's kDirect)
      issue_order_fence();
      issue_state();
    }
    wait_upstream();
    GDN_MARK(1);
    issue_small();
    gate_in = load_gate_inputs<IO>(p, b, h);
    const int t = int(threadIdx.x) < grp.hi - grp.lo ? int(threadIdx.x) : 0;
    z_pre.load(p.qkv_dtype, p.z,
               b * p.z_batch_stride + int64_t(group_head(p, hk, grp.g_lo, group_heads)) * p.z_head_stride +
                   grp.j_lo + t);
    w_pre.load(p.qkv_dtype, p.norm_weight, grp.j_lo + t);
    GDN_MARK(9);
    if (!p.programmatic_launch) {
      issue_order_fence();
      issue_state();
    }
    GDN_MARK(10);
    vj = convert_v(v_first);
    qk_from_raw();
    const Gates gates = finish_gates(p, gate_in);
    decay = gates.decay;
    beta = gates.beta;
    fused_arrive(p, grp, sm);  // (no conv windows: only the outputs' mbarrier)
    GDN_MARK(13);
  } else {
    if constexpr (kFused)
      start_fused_loads<IO, prologue_run<Layout::kVK>(), false, kPdl>(p, grp, slots, sm, issue_state, issue_small);
    else
      start_step_loads(p, small_loads_first, issue_state, issue_small);
    // ... then the values.
    vj = convert_v(v_first);
    if (qk_global) {
      qk_from_raw();
    } else {
      // the conv output of the group prologue
#pragma unroll
      for (int r = 0; r < kRowsHeld; ++r) {
        const int i = rows[r];
        qh[r] = i < Dk ? sm.qk[i] : 0.0f;
        kh[r] = i < Dk ? sm.qk[Dk + i] : 0.0f;
      }
    }
    if constexpr (kFused) {
      decay = sm.decay[g];
      beta = sm.beta[g];
    } else {
      const Gates gates = finish_gates(p, gate_in);
      decay = gates.decay;
      beta = gates.beta;
    }
  }

  // (the loads are out: the fields past KernelParams' first part now)
  if (!kFused) count_bad_indices(p, slots, h, blk);
  const int64_t o_base = out_base();

  // ---- 2. l2norm: the lanes of a column group hold all of Dk between them
  GDN_MARK(16);
  const float kq = l2_normalize<kReduceLow, kReduceSpan>(p, lane, qh, kh);
  GDN_MARK(3);
  if constexpr (kDirect)
    cluster_wait();  // every block's outputs' mbarrier is ready for the pushes
  else if constexpr (kFused)
    fused_mid<IO>(p, grp, slots, sm);
  else if constexpr (kStepNorm) {
    if (csize > 1) cluster_wait();  // as kDirect
  }
  GDN_MARK(4);
  // ---- 3. the warp's items, the next ones in flight (the ring's kStages - 1,
  // or one in registers) while one computes
  for (int stage = 0;; stage = stage + 1 == kStages ? 0 : stage + 1) {
    const bool has_next = item + 1 < item_end;
#if GDN_VK_RING
    issue_item(item + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
#endif
    VLoad v_next;
    if (has_next) load_v((item + 1) * kColsPerItem, v_next);
    V s[kOuter][kInner];
    fetch_item(item, stage, s);
    GDN_MARK(5);

    const int j0 = item * kColsPerItem;
    // The state element (held row r, held column c):
    auto elem = [&](int r, int c) -> float { return Elem<T>::to_float(s[c][r / kVec].x[r % kVec]); };
    // delta of every held column and o[j0 + cols[out_c]] (OnePass), from the
    // partial sums of S^T k_hat (value 2c) and S^T q_hat (2c + 1) of held column c
    float delta[kColsHeld];
    const float o_val = Pass::run(
        [&](int v) {
          const float* w = (v & 1) ? qh : kh;
          float a = 0.0f;
#pragma unroll
          for (int r = 0; r < kRowsHeld; ++r) a += elem(r, v / 2) * w[r];
          return a;
        },
        vj, decay, beta, kq, scale, lane, delta);
    GDN_MARK(17);
    // S' = exp(g) S + k_hat delta
#pragma unroll
    for (int o = 0; o < kOuter; ++o)
#pragma unroll
      for (int ci = 0; ci < kInner; ++ci) {
        V n;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int r = ci * kVec + e;
          n.x[e] = Elem<T>::from_float(decay * elem(r, o) + kh[r] * delta[o]);
        }
        const int i = vec_row(o, ci), j = vec_col(o, j0);
        if (slots.write && i < Dk && j < Dv)
          store_state16<(kHints & 1) != 0>(reinterpret_cast<V*>(s_out + vec_off(i, j)), n);
      }
    if (writer && j0 + out_col < Dv) {
      if (kFused && p.norm_weight != nullptr) {
        fused_emit(sm, grp, g * Dv + j0 + out_col, o_val);  // normalized in the epilogue
      } else if (kStepNorm) {
        // raw, into every block of the head (normalized at the end)
        if (csize > 1)
          push_to_cluster(&step_out[j0 + out_col], &step_bar, csize, o_val);
        else
          step_out[j0 + out_col] = o_val;
      } else {
        with_dtype<IO>(p.o_dtype, [&](auto tag) {
          using E = decltype(tag);
          static_cast<E*>(p.o)[o_base + j0 + out_col] = Elem<E>::from_float(o_val);
        });
      }
    }

    if (!has_next) break;
    ++item;
    vj = convert_v(v_next);
  }
  GDN_MARK(6);
  if constexpr (kDirect) {
    const float zw[2] = {silu(z_pre.value()), w_pre.value()};
    fused_finish<IO>(p, grp, sm, zw);
  } else if constexpr (kFused) {
    fused_finish<IO>(p, grp, sm);
  } else if constexpr (kStepNorm) {
    step_norm_finish(p, step_out, Dv, j_own, n_own, o_base, csize, &step_bar, w_pre, z_pre);
  }
  GDN_MARK(8);
}

// The step's entry point: KernelParams after the launch's scalars
// (docs/decisions.md#kernel-params); kNorm: the norm as its epilogue
// (kStepNorm). group_heads, warps_per_head, cluster and fdiv are the fused kernels'.
template <typename T, Layout kLayout, int kDk, int kP, typename IO, int kHints, bool kNorm = false>
__global__ void __launch_bounds__(8 * kWarp, (vk_min_blocks<T, false>()))
    decode_vk_step_kernel(int items_per_head, int items_per_warp, FastDiv by_blocks_per_head, FastDiv by_hv,
                          FastDiv by_head_map, bool small_loads_first, const __grid_constant__ KernelParams p,
                          float scale) {
  decode_vk<T, kLayout, kDk, kP, IO, false, false, kHints, kNorm>(p, items_per_head, items_per_warp,
                                                                  by_blocks_per_head, by_hv, by_head_map,
                                                                  small_loads_first, scale, 1, 1, 1, FusedArgs{});
}
// The fused kernels' entry point (same parameter order as the step's).
// kPdl: a programmatic launch's twin (start_fused_loads; docs/decisions.md#pdl).
template <typename T, Layout kLayout, int kDk, int kP, typename IO, bool kNormOnly, bool kPdl = false>
__global__ void __launch_bounds__(8 * kWarp, (vk_min_blocks<T, true>()))
    decode_vk_fused_kernel(int items_per_head, int items_per_warp, FastDiv by_blocks_per_head, FastDiv by_hv,
                           FastDiv by_head_map, bool small_loads_first, const __grid_constant__ KernelParams p,
                           float scale, int group_heads, int warps_per_head, int cluster, FusedArgs fdiv) {
  decode_vk<T, kLayout, kDk, kP, IO, true, kNormOnly, kFusedL2Hints, false, kPdl>(
      p, items_per_head, items_per_warp, by_blocks_per_head, by_hv, by_head_map, small_loads_first, scale, group_heads,
      warps_per_head, cluster, fdiv);
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
