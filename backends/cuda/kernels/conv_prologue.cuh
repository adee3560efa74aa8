// The fused conv1d prologue: the causal conv update of the group's q, k and v
// channels into shared memory, the conv state advanced in place.
#pragma once

#include "fused_common.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// What a block's group prologue covers, in the order of its list: own = its
// output columns, qk = the q and k conv channels (2 Dk with the conv on),
// conv = those and the own v channels, z = silu(z) of the own columns, w =
// norm_weight (Dv); all = the longest of the three lists.
struct PrologueSizes {
  int own, qk, conv, z, w, all;
  template <typename Params>
  __device__ __forceinline__ PrologueSizes(const Params& p, const Group& grp) {
    own = grp.hi - grp.lo;
    qk = p.conv_width > 0 ? 2 * p.head_dim_k : 0;
    conv = p.conv_width > 0 ? qk + own : 0;
    z = p.norm_weight != nullptr ? own : 0;
    w = p.norm_weight != nullptr ? p.head_dim_v : 0;
    all = max(conv, max(z, w));
  }
};

// N (2 or 4) consecutive elements of E stored at ptr as one vector word: the
// shifted windows of the runs form, at offsets that are multiples of the run
// in a pool the planner checked (prologue_pointers_aligned, plan.cpp).
template <typename E, int N>
__device__ __forceinline__ void store_run(E* ptr, const E (&v)[N]) {
  using W = typename RawWord<N * int(sizeof(E))>::type;
  W w;
#pragma unroll
  for (int i = 0; i < N; ++i) reinterpret_cast<E*>(&w)[i] = v[i];
  *reinterpret_cast<W*>(ptr) = w;
}

// The group prologue by runs of kRun channels, fused_prologue's common case
// (conv state [slot, conv_dim, W-1], segments multiples of kRun, one input
// dtype), with the channel form's results. A thread takes channels kRun s ..
// kRun s + kRun - 1 of the block's list (q, k, own v), whose windows, weights,
// x and bias are each one contiguous run: (W - 1) + W + 2 vector loads for kRun
// channels, W - 1 vector stores back. kW = 0: no conv. kRun: 2 in kv (64
// registers); in vk 2 where each run has a thread, else 4 (docs/decisions.md#fused-prologue).
template <typename IO, int kW, int kRun, bool kPdl, typename Issue, typename Params>
__device__ __forceinline__ void fused_prologue_runs(const Params& p, const Group& grp, const RowSlots& slots,
                                                    const FusedSmem& sm, Issue&& issue_state) {
  constexpr int kTaps = kW > 0 ? kW - 1 : 1;  // old inputs a channel keeps
  GDN_MARK(20);
  const int Dk = p.head_dim_k, Dv = p.head_dim_v, G = grp.G;
  const int nthreads = int(blockDim.x), tid = int(threadIdx.x);
  const PrologueSizes ps(p, grp);
  // the conv's counts again from kW (= the conv width), known at compile time
  const int n_qk = kW > 0 ? ps.qk : 0, n_conv = kW > 0 ? ps.conv : 0, n_z = ps.z, n_w = ps.w;
  const int n_runs = max(n_conv, max(n_z, n_w)) / kRun;
  // The gates of the G heads: the block's last G threads, whose runs (if
  // any) come last, so their gate arithmetic is off the conv's path.
  const int gate_g = tid - (nthreads - G);
  bool issued = false;
  with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
    using E = decltype(tag);
    using Run = RawRun<E, kRun>;
    const E* x = static_cast<const E*>(p.x) + grp.b * p.x_batch_stride;
    // (unused where kW = 0: the norm-only prologue)
    [[maybe_unused]] const E* wt = static_cast<const E*>(p.conv_weight);
    [[maybe_unused]] const E* bias = static_cast<const E*>(p.conv_bias);
    E* cs = static_cast<E*>(p.conv_state);
    const E* cs_in = cs + slots.s_in * p.conv_state_slot_stride;
    E* cs_out = cs + slots.s_out * p.conv_state_slot_stride;
    const E* nwp = static_cast<const E*>(p.norm_weight);
    // the own columns lie in one head (the caller checked): v channel and z
    // element m of them are one base plus m
    const int g_lo = grp.g_lo, j_lo = grp.j_lo;
    const int h_lo = group_head(p, grp.hk, g_lo, G);
    const int64_t v_first = 2 * int64_t(p.num_k_heads) * Dk + int64_t(h_lo) * Dv + j_lo;
    const int64_t q_first = int64_t(grp.hk) * Dk, k_first = int64_t(p.num_k_heads + grp.hk) * Dk;
    auto channel = [&](int m) -> int64_t {
      if (m < n_qk) return m < Dk ? q_first + m : k_first + (m - Dk);
      return v_first + (m - n_qk);
    };
    const E* z = static_cast<const E*>(p.z) +
                 (n_z > 0 ? grp.b * p.z_batch_stride + int64_t(h_lo) * p.z_head_stride + j_lo : 0);
    // The gates' inputs: a plain launch's first (its wait, in
    // start_fused_loads, is passed); kPdl: after the wait below.
    GateInputs<IO> gin;
    if constexpr (!kPdl) {
      if (gate_g >= 0) gin = load_gate_inputs<IO>(p, grp.b, group_head(p, grp.hk, gate_g, G));
    }
    [[maybe_unused]] bool waited = false;
    [[maybe_unused]] auto wait_then_gates = [&] {
      wait_upstream();
      GDN_MARK(1);
      waited = true;
      if (gate_g >= 0) gin = load_gate_inputs<IO>(p, grp.b, group_head(p, grp.hk, gate_g, G));
    };
    for (int s = tid; s < n_runs; s += nthreads) {
      // ---- loads, raw: a run past its range reads run 0 instead (a valid
      // address), so no load waits in a branch of its own.
      GDN_MARK(21);
      const int m = kRun * s;
      Run nw, zv, xc, bv, old[kTaps], wv[kW > 0 ? kW : 1];
      if (n_w > 0) nw.load(nwp + (m < n_w ? m : 0));
      if constexpr (!kPdl) {
        if (n_z > 0) zv.load(z + (m < n_z ? m : 0));
      }
      const int64_t c = kW > 0 ? channel(m < n_conv ? m : 0) : 0;
      if constexpr (kW > 0) {
#pragma unroll
        for (int t = 0; t < kTaps; ++t) old[t].load(cs_in + c * kTaps + kRun * t);
#pragma unroll
        for (int t = 0; t < kW; ++t) wv[t].load(wt + c * kW + kRun * t);
        if constexpr (!kPdl) xc.load(x + c);
        if (bias) bv.load(bias + c);
      }
      if constexpr (kPdl) {
        // PDL: the loads above, which the previous kernel does not feed, went out
        // before its wait; z and x, which it writes, only after.
        if (!waited) wait_then_gates();
        if (n_z > 0) zv.load(z + (m < n_z ? m : 0));
        if constexpr (kW > 0) xc.load(x + c);
      }
      GDN_MARK(9);
      if (!issued) {
        issue_state();
        issued = true;
      }
      GDN_MARK(10);
      // ---- then the arithmetic and the stores. Element e of a run of
      // runs (old, wv) is element e % kRun of run e / kRun: channel e / taps.
      auto el = [](const Run* r, int e) { return reinterpret_cast<const E*>(&r[e / kRun].w[0])[e % kRun]; };
      if (m < n_w) {
        float f[kRun];
        nw.to_float(f);
#pragma unroll
        for (int k = 0; k < kRun; ++k) sm.w[m + k] = f[k];
      }
      if (m < n_z) {
        float f[kRun];
        zv.to_float(f);
#pragma unroll
        for (int k = 0; k < kRun; ++k) sm.z[grp.lo + m + k] = silu(f[k]);  // the gate, off the tail
      }
      if constexpr (kW > 0) {
        if (m < n_conv) {
          float xf[kRun], bf[kRun] = {};
          xc.to_float(xf);
          if (bias) bv.to_float(bf);
          // the run's first group position: q/k in place, v after 2 Dk
          float* y = m < n_qk ? sm.qk + m : sm.vo + (grp.lo + m - n_qk);
          E nv[kTaps][kRun];  // the shifted windows, laid out as the old ones
#pragma unroll
          for (int k = 0; k < kRun; ++k) {
            // y = silu(w . window + bias), window = (old[0 .. W-2], x)
            float acc = bf[k];
#pragma unroll
            for (int t = 0; t < kW - 1; ++t)
              acc += Elem<E>::to_float(el(wv, k * kW + t)) * Elem<E>::to_float(el(old, k * kTaps + t));
            acc += Elem<E>::to_float(el(wv, k * kW + kW - 1)) * xf[k];
            y[k] = silu(acc);
            // conv_state[s_out, c] = (old[1 .. W-2], x): the input values themselves
#pragma unroll
            for (int t = 0; t < kTaps; ++t) {
              const int e = k * kTaps + t;
              nv[e / kRun][e % kRun] = t + 1 < kTaps ? el(old, e + 1) : reinterpret_cast<const E*>(&xc.w[0])[k];
            }
          }
          if (slots.write) {
            if (grp.size == 1 || m >= n_qk) {
              // one reader (the v channels, or no cluster): written now
#pragma unroll
              for (int t = 0; t < kTaps; ++t) store_run(cs_out + c * kTaps + kRun * t, nv[t]);
            } else {
              // q/k in a cluster: this block's share (m % size == rank),
              // kept for fused_mid
#pragma unroll
              for (int k = 0; k < kRun; ++k)
                if (grp.share(m + k) == grp.rank)
#pragma unroll
                  for (int t = 0; t < kTaps; ++t) {
                    const int e = k * kTaps + t;
                    sm.next[3 * (m + k) + t] = Elem<E>::to_float(nv[e / kRun][e % kRun]);
                  }
            }
          }
        }
      }
    }
    GDN_MARK(11);
    if constexpr (kPdl) {
      if (!waited) wait_then_gates();  // a thread with no run
    }
    if (gate_g >= 0) {
      const Gates gt = finish_gates(p, gin);
      sm.decay[gate_g] = gt.decay;
      sm.beta[gate_g] = gt.beta;
    }
  });
  if (!issued) issue_state();
  GDN_MARK(12);
}

// Whether every run fused_prologue_runs<IO, W, kRun> loads is vector-aligned:
// the planner checked pointers and strides (Group::vector_runs), which leaves
// the block's first column (Dk, Dv multiples of 16).
template <typename IO, int kRun>
__device__ __forceinline__ bool prologue_runs_aligned(const Group& grp) {
  return grp.vector_runs && (grp.j_lo * int(sizeof(IO))) % RawRun<IO, kRun>::kBytes == 0;
}

// The block's share of the group prologue (every thread calls it; a barrier
// must follow before the shared values are read): q and k of hk (every block
// needs them), v of the block's own columns [lo, hi), then
// - conv: y[c] = silu(sum_j w[c, j] window[c, j] + bias[c]) into qk / vo,
//   window = (conv_state[s_in, c, 0 .. W-2], x[b, c]), and the shifted window
//   conv_state[s_out, c] = (old[1 .. W-2], x[b, c]), in place: one thread
//   reads then writes each channel, and no other group touches it. A v
//   channel's one reader writes it back at once; q/k channels are read by
//   every block of a cluster, so block r keeps channels m = r mod size for
//   fused_mid, after the cluster barrier (exact: input values through float);
// - norm: silu(z) of the own columns and norm_weight into shared memory;
// - the gates of the G heads.
// All of a thread's loads go out, then the state's (issue_state), then any is
// used: the prologue's loads do not queue behind the state's. This channel form
// serves the rest (tap-major or padded conv state, odd segments, MixedIO).
// kPer = 2: 256 threads cover Qwen3.5's 2 Dk + G Dv = 512 channels in one round.
template <typename IO, int kRun, bool kPdl, typename Issue, typename Params>
__device__ __forceinline__ void fused_prologue(const Params& p, const Group& grp, const RowSlots& slots,
                                               const FusedSmem& sm, Issue&& issue_state) {
  constexpr int kPer = 2;
  const int Dk = p.head_dim_k, Dv = p.head_dim_v, G = grp.G, W = p.conv_width;
  const int nthreads = int(blockDim.x), tid = int(threadIdx.x);
  const PrologueSizes ps(p, grp);
  GDN_MARK(19);
  const int n_own = ps.own, n_qk = ps.qk, n_conv = ps.conv, n_z = ps.z, n_w = ps.w, n = ps.all;
  // The common layout by runs (fused_prologue_runs). MixedIO keeps the channel
  // form: runs of its three dtypes spilled. (G <= kMaxFusedGroup, far below a
  // block's threads.)
  if constexpr (!std::is_same<IO, MixedIO>::value) {
    if ((W == 0 || (p.conv_state_tap_stride == 1 && p.conv_state_channel_stride == W - 1 && Dk % kRun == 0)) &&
        n_own % kRun == 0 && Dv % kRun == 0 && grp.one_head(Dv) && prologue_runs_aligned<IO, kRun>(grp)) {
      // Runs of 2 where the block has a thread for each (a thread's arithmetic is on
      // the chain the group waits on), else of kRun (docs/decisions.md#fused-prologue).
      auto by_runs = [&](auto run_tag) {  // run_tag: the run size, a std::integral_constant
        constexpr int kR = decltype(run_tag)::value;
        switch (W) {
          case 0: fused_prologue_runs<IO, 0, kR, kPdl>(p, grp, slots, sm, issue_state); return;
          case 2: fused_prologue_runs<IO, 2, kR, kPdl>(p, grp, slots, sm, issue_state); return;
          case 3: fused_prologue_runs<IO, 3, kR, kPdl>(p, grp, slots, sm, issue_state); return;
          default: fused_prologue_runs<IO, 4, kR, kPdl>(p, grp, slots, sm, issue_state); return;
        }
      };
      if constexpr (kRun > 2) {
        if (n <= 2 * nthreads) return by_runs(std::integral_constant<int, 2>{});
      }
      return by_runs(std::integral_constant<int, kRun>{});
    }
  }
  if constexpr (kPdl) {
    // (this form reads everything after the wait)
    wait_upstream();
    GDN_MARK(1);
  }
  bool issued = false;
  with_dtype<IO>(p.qkv_dtype, [&](auto tag) {
    using E = decltype(tag);
    const E* x = static_cast<const E*>(p.x) + grp.b * p.x_batch_stride;
    const E* wt = static_cast<const E*>(p.conv_weight);
    const E* bias = static_cast<const E*>(p.conv_bias);
    E* cs = static_cast<E*>(p.conv_state);
    const int64_t in_slot = slots.s_in * p.conv_state_slot_stride;
    const int64_t out_slot = slots.s_out * p.conv_state_slot_stride;
    const int64_t chs = p.conv_state_channel_stride, tps = p.conv_state_tap_stride;
    const E* z = static_cast<const E*>(p.z);
    // group position of conv channel m: q/k first, then the own v columns
    auto position = [&](int m) { return m < n_qk ? m : 2 * Dk + grp.lo + (m - n_qk); };
    // No division in the common case (a load's address chain is on the critical
    // path too): with the own columns in one head (every cluster geometry of
    // Qwen3.5) v channel m and z element m are one base plus m.
    const int g_lo = grp.g_lo, j_lo = grp.j_lo;
    const bool one_head = grp.one_head(Dv);
    const int64_t v_first = 2 * int64_t(p.num_k_heads) * Dk + int64_t(group_head(p, grp.hk, g_lo, G)) * Dv + j_lo;
    const int64_t q_first = int64_t(grp.hk) * Dk, k_first = int64_t(p.num_k_heads + grp.hk) * Dk;
    auto channel = [&](int m) -> int64_t {
      if (m < n_qk) return m < Dk ? q_first + m : k_first + (m - Dk);
      if (one_head) return v_first + (m - n_qk);
      return group_channel(p, grp.hk, G, position(m));
    };
    const E* z_first = z + (n_z > 0 ? grp.b * p.z_batch_stride + int64_t(group_head(p, grp.hk, g_lo, G)) * p.z_head_stride + j_lo : 0);
    auto z_at = [&](int m) -> const E* {
      if (one_head) return z_first + m;
      const int i = grp.lo + m, g = i / Dv, j = i - g * Dv;
      return z + grp.b * p.z_batch_stride + int64_t(group_head(p, grp.hk, g, G)) * p.z_head_stride + j;
    };
    const E* cs_in = cs + in_slot;
    // gate inputs of head tid (tid < G; the others read head 0's, unused)
    const bool gate_thread = tid < G;
    const GateInputs<IO> gin = load_gate_inputs<IO>(p, grp.b, group_head(p, grp.hk, gate_thread ? tid : 0, G));
    for (int base = tid; base < n; base += kPer * nthreads) {
      // ---- loads, raw (RawRun): norm_weight, z, then every tap of up to kPer
      // channels. Past its range a slot (or a tap past W) reads the in-range index 0,
      // ignored below, so no load sits in a branch of its own; one branch per kind
      // of load, around all kPer slots, so their addresses interleave.
      E nw[kPer], zv[kPer], old[kPer][3], xc[kPer], wv[kPer][4], bv[kPer];
      if (n_w > 0) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int m = base + k * nthreads;
          nw[k] = static_cast<const E*>(p.norm_weight)[m < n_w ? m : 0];
        }
      }
      if (n_z > 0) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int m = base + k * nthreads;
          zv[k] = *z_at(m < n_z ? m : 0);
        }
      }
      if (n_conv > 0) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int m = base + k * nthreads;
          const int64_t c = channel(m < n_conv ? m : 0);
          // window = (old[0 .. W-2], xc); indices fixed at compile time (W <= 4)
          // so the window stays in registers.
          const E* win = cs_in + c * chs;
#pragma unroll
          for (int t = 0; t < 3; ++t) old[k][t] = win[(t < W - 1 ? t : 0) * tps];
#pragma unroll
          for (int t = 0; t < 4; ++t) wv[k][t] = wt[c * W + (t < W ? t : 0)];
          xc[k] = x[c];
          if (bias) bv[k] = bias[c];
        }
      }
      GDN_MARK(9);
      if (!issued) {
        issue_state();
        issued = true;
      }
      GDN_MARK(10);
      // ---- then the arithmetic and the stores
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int m = base + k * nthreads;
        if (m < n_w) sm.w[m] = Elem<E>::to_float(nw[k]);
        if (m < n_z) sm.z[grp.lo + m] = silu(Elem<E>::to_float(zv[k]));  // the gate, off the tail
        if (m < n_conv) {
          const int i = position(m);
          // y = silu(w . window + bias)
          float acc = bias ? Elem<E>::to_float(bv[k]) : 0.0f;
#pragma unroll
          for (int t = 0; t < 3; ++t)
            if (t < W - 1) acc += Elem<E>::to_float(wv[k][t]) * Elem<E>::to_float(old[k][t]);
          acc += Elem<E>::to_float(W == 2 ? wv[k][1] : W == 3 ? wv[k][2] : wv[k][3]) * Elem<E>::to_float(xc[k]);
          (i < 2 * Dk ? sm.qk[i] : sm.vo[i - 2 * Dk]) = silu(acc);
          // conv_state[s_out, c] = (old[1 .. W-2], xc), the input values
          // themselves: now (one reader), or this block's share of the q/k
          // channels, kept for fused_mid
          const bool now = grp.size == 1 || m >= n_qk;
          if (slots.write && (now || grp.share(m) == grp.rank)) {
            const int64_t c = channel(m);
#pragma unroll
            for (int t = 0; t < 3; ++t)
              if (t < W - 1) {
                const E nv = t + 1 < W - 1 ? old[k][t < 2 ? t + 1 : 2] : xc[k];
                if (now)
                  cs[out_slot + c * chs + t * tps] = nv;
                else
                  sm.next[3 * m + t] = Elem<E>::to_float(nv);
              }
          }
        }
      }
    }
    GDN_MARK(11);
    if (gate_thread) {
      const Gates gt = finish_gates(p, gin);
      sm.decay[tid] = gt.decay;
      sm.beta[tid] = gt.beta;
    }
  });
  if (!issued) issue_state();
  GDN_MARK(12);
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
