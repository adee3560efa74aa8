#!/usr/bin/env python3
"""gdnkit against the peer kernels people run for the GatedDeltaNet decode step, on one GPU.

    python bench/peers.py                     # the sweep (a few minutes on an H100)
    python bench/peers.py --quick             # B = 1, 8 (T = 2 at B = 8), meant for < 1 minute
    python bench/peers.py --out peers.md --csv peers.csv
    python bench/peers.py --fla-wheels DIR    # FLA (and einops) from wheel files, no registry
    python bench/peers.py --self-test         # the checks only (CPU: Triton's interpreter)

Shape: Qwen3.5-35B-A3B's GatedDeltaNet layer (Hk 16, Hv 32, Dk = Dv = 128), bf16 q/k/v/a/b,
fp32 A_log/dt_bias, raw gates, q and k l2-normalized in the kernel; state fp32 and bf16.
Timed in one process, µs a call:

- floors, the state traffic alone (16-byte accesses, no arithmetic):
    copy      fastest of torch's dst.copy_(src) (cudaMemcpyAsync) and a Triton streaming copy
              (three block sizes), each set's B states into that set's own destination;
    in-place  fastest of a Triton kernel loading every state element and storing it back in
              place (three block sizes) and torch's state.neg_() (checked to write; copy_ onto
              itself would be a no-op): the limit of a step updating its state in place;
    inter     (several tokens) a Triton kernel reading each row's state once and writing it to
              the row's T slots: the traffic of a call storing every token's state.
- gdnkit (gdnkit.torch.decode -> torch.ops.gdnkit.decode), layouts kv [slot, Hv, Dk, Dv] and
  vk [slot, Hv, Dv, Dk]: in place (state_indices = arange(B), as engines pass them; --dense:
  no index array) and "2-slot" (read slot s, write slot s + B of a 2B-slot pool through
  state_indices / state_out_indices). Several tokens: "final" (num_tokens = T, the last
  state in place) and "inter" (token t's state to slot token_state_indices[b, t]).
- FLA's fused_recurrent_gated_delta_rule as Hugging Face calls it: g = -exp(A_log) *
  softplus(a + dt_bias) (fp32) and beta = sigmoid(b) computed beforehand (not timed),
  initial_state [B, Hv, K, V], output_final_state=True, use_qk_l2norm_in_kernel=True. Its
  final state (always fp32) goes to a new tensor: timed out of place. Skipped if no `fla`.
- peer_triton_sigmoid_gating, written here with the semantics of vLLM's / SGLang's
  fused_sigmoid_gating_delta_rule_update (gates in the kernel, softplus beta 1 threshold 20,
  l2norm, scale K**-0.5, pool updated in place at ssm_state_indices [B], or [B, T] with token
  t's state to slot indices[b, t]); their grid: one program per (32-wide v block, row x
  v-head), the whole K in it, 4 warps. Both layouts (vLLM's pool is vk). One token a row
  also out of place ("out of place": the new state to slot s + B), the traffic of
  ExecuTorch's out-of-place kernel, which returns a new state tensor.
- peer_triton_executorch, written here in the form of ExecuTorch's fused_deltanet_decode
  (T = 1): a program per (row x v-head, BLOCK_V columns) of a dense kv state [B, Hv, K, V],
  the whole K in registers, one pass; q and k over max(|x|, 1e-6); the output (in the
  state's dtype) and the new state to new tensors ("ExecuTorch-style kv (new)"). Its tile
  configurations are tuned at every batch size (ExecuTorch tunes once per head shape).

Protocol (as bench/bench_common.cuh): every call sits in a CUDA graph of max(sets, 20) calls
rotating over sets (inputs and state pool) whose states total >= 128 MiB (> 2x an H100/H200
L2), so every call starts cold; one warm-up replay, then 15 timed by CUDA events; µs a call =
replay time / calls, median and min-max reported. Tensors a call allocates (FLA's state, the
outputs) stay alive over as many calls as there are sets, so they rotate over 128 MiB too.

Checks before any timing: each implementation runs once at B = 3 (T = 4 for several tokens)
on the inputs of gdnkit's kv fp32-state call, itself checked against a float64 reference;
outputs and states must agree within bf16 tolerance (relative L2 <= 2e-2, worst element <=
5e-2 of the largest), else "CHECK FAILED", it is not timed and the exit status is 1.
Without a CUDA GPU the benchmark exits with status 2.
"""
import argparse
import atexit
import collections
import datetime
import glob
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile

import torch

# Triton's interpreter must be chosen before triton is imported: the CPU self-test uses it.
if "--self-test" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SHAPE = dict(Hk=16, Hv=32, K=128, V=128)  # Qwen3.5-35B-A3B
CPU_SHAPE = dict(Hk=2, Hv=4, K=32, V=64)  # the interpreter's self-test (K != V: catches a transpose)
ROTATE_BYTES = 128 << 20
MIN_CALLS = 20
REPLAYS = 15
COPY_BLOCKS = ((1024, 4), (4096, 4), (16384, 8))  # (int32 elements a program, warps)
TOL_O, TOL_S, TOL_WORST = 2e-2, 2e-2, 5e-2


# ---- Triton kernels: the floors' copies and the vLLM-style peer ----------------------------

@triton.jit
def _stream_kernel(src, dst, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    # One contiguous block a program; the compiler turns it into 16-byte accesses. src may
    # be dst (the in-place floor): each element is loaded before it is stored.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(dst + offs, tl.load(src + offs))
    else:
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


@triton.jit
def _fanout_kernel(pool, row, T, BLOCK: tl.constexpr):
    # Row b's slots are b*T .. b*T+T-1: read the first once, write the block to all T.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    base = pool + tl.program_id(1).to(tl.int64) * T * row
    x = tl.load(base + offs)
    for t in range(T):
        tl.store(base + t * row + offs, x)


@triton.jit
def _peer_sigmoid_gating_kernel(q, k, v, a, b, A_log, dt_bias, o, pool, idx, idx_stride,
                                out_idx, slot_stride, T, scale, sp_beta, sp_threshold,
                                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                                V: tl.constexpr, BV: tl.constexpr, STATE_VK: tl.constexpr,
                                L2NORM: tl.constexpr, OUT_OF_PLACE: tl.constexpr):
    iv = tl.program_id(0)
    row_head = tl.program_id(1).to(tl.int64)
    row, hv = row_head // HV, row_head % HV
    hk = hv // (HV // H)  # interleaved head map
    # the state comes from the slot of column 0 of the row's table entry; padding: nothing
    slot = tl.load(idx + row * idx_stride).to(tl.int64)
    if slot < 0:
        return
    ks = tl.arange(0, K)
    vs = iv * BV + tl.arange(0, BV)
    if STATE_VK:
        tile = hv * K * V + vs[:, None] * K + ks[None, :]  # [BV, K], K contiguous
    else:
        tile = hv * K * V + ks[:, None] * V + vs[None, :]  # [K, BV], V contiguous
    h = tl.load(pool + slot * slot_stride + tile).to(tl.float32)
    decay_rate = tl.exp(tl.load(A_log + hv).to(tl.float32))
    bias = tl.load(dt_bias + hv).to(tl.float32)
    for t in range(T):
        tok = row * T + t
        bq = tl.load(q + (tok * H + hk) * K + ks).to(tl.float32)
        bk = tl.load(k + (tok * H + hk) * K + ks).to(tl.float32)
        bv = tl.load(v + (tok * HV + hv) * V + vs).to(tl.float32)
        x = tl.load(a + tok * HV + hv).to(tl.float32) + bias
        soft = tl.where(sp_beta * x <= sp_threshold, tl.log(1.0 + tl.exp(sp_beta * x)) / sp_beta, x)
        g = -decay_rate * soft
        beta = tl.sigmoid(tl.load(b + tok * HV + hv).to(tl.float32))
        if L2NORM:
            bq = bq * tl.rsqrt(tl.sum(bq * bq) + 1e-6)
            bk = bk * tl.rsqrt(tl.sum(bk * bk) + 1e-6)
        bq = bq * scale
        h = h * tl.exp(g)
        if STATE_VK:
            delta = beta * (bv - tl.sum(h * bk[None, :], 1))
            h = h + delta[:, None] * bk[None, :]
            out = tl.sum(h * bq[None, :], 1)
        else:
            delta = beta * (bv - tl.sum(h * bk[:, None], 0))
            h = h + bk[:, None] * delta[None, :]
            out = tl.sum(h * bq[:, None], 0)
        tl.store(o + (tok * HV + hv) * V + vs, out.to(o.dtype.element_ty))
        if OUT_OF_PLACE:  # (T = 1) the new state to another slot, as an out-of-place kernel
            dst = tl.load(out_idx + row).to(tl.int64)
        else:
            dst = tl.load(idx + row * idx_stride + t).to(tl.int64)  # token t's slot
        if dst >= 0:
            tl.store(pool + dst * slot_stride + tile, h.to(pool.dtype.element_ty))


def peer_triton_sigmoid_gating(q, k, v, a, b, A_log, dt_bias, pool, indices, o, layout,
                               softplus_beta=1.0, softplus_threshold=20.0, scale=None,
                               out_indices=None):
    """vLLM-style fused sigmoid-gating update. q, k [B, T, H, K], v [B, T, HV, V], a, b
    [B, T, HV]; pool [slots, HV, K, V] (kv) or [slots, HV, V, K] (vk), updated in place;
    indices [B] (T = 1) or [B, T] int32/int64; o [B, T, HV, V] is written and returned.
    out_indices [B] (T = 1): the new state to those slots instead (out of place, the
    traffic of ExecuTorch's out-of-place kernel, which writes a new state tensor)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BV = min(32, V)
    assert V % BV == 0 and K & (K - 1) == 0 and BV & (BV - 1) == 0
    assert indices.ndim == 2 or T == 1
    assert out_indices is None or T == 1
    idx_stride = indices.stride(0) if indices.ndim == 2 else 1
    grid = (V // BV, B * HV)
    _peer_sigmoid_gating_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, o, pool, indices, idx_stride,
        indices if out_indices is None else out_indices, pool.stride(0), T,
        K ** -0.5 if scale is None else scale, softplus_beta, softplus_threshold,
        H=H, HV=HV, K=K, V=V, BV=BV, STATE_VK=layout == "vk", L2NORM=True,
        OUT_OF_PLACE=out_indices is not None, num_warps=4, num_stages=3)
    return o


@triton.jit
def _peer_executorch_kernel(q, k, v, a, b, A_log, dt_bias, s_in, s_out, o, scale, B,
                            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BLOCK_V: tl.constexpr):
    # ExecuTorch's form: a program per (row x v-head, BLOCK_V columns) of a dense kv state,
    # the whole K in registers (one pass), the new state to another tensor. (B: the tuning key.)
    rh = tl.program_id(0).to(tl.int64)
    row, hv = rh // HV, rh % HV
    hk = hv // (HV // H)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    live = cols < V
    rows = tl.arange(0, K)
    # decay = exp(-exp(A_log) softplus(a + dt_bias)), beta = sigmoid(b); softplus linear past 20
    x = tl.load(a + rh).to(tl.float32) + tl.load(dt_bias + hv)
    decay = tl.exp(-tl.exp(tl.load(A_log + hv)) * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x))))
    beta = tl.sigmoid(tl.load(b + rh).to(tl.float32))
    # q and k over max(|x|, eps), q scaled
    kr = tl.load(k + (row * H + hk) * K + rows).to(tl.float32)
    qr = tl.load(q + (row * H + hk) * K + rows).to(tl.float32)
    kh = kr / tl.maximum(tl.sqrt(tl.sum(kr * kr)), 1e-6)
    qh = qr * (scale / tl.maximum(tl.sqrt(tl.sum(qr * qr)), 1e-6))
    tile = rh * K * V + rows[:, None] * V + cols[None, :]
    S = tl.load(s_in + tile, mask=live[None, :], other=0.0).to(tl.float32) * decay
    # delta = beta (v - S^T k_hat) from the decayed state; S' = S + k_hat delta^T; o = S'^T q_hat
    delta = beta * (tl.load(v + rh * V + cols, mask=live, other=0.0).to(tl.float32) - tl.sum(S * kh[:, None], 0))
    S = S + kh[:, None] * delta[None, :]
    tl.store(o + rh * V + cols, tl.sum(S * qh[:, None], 0).to(o.dtype.element_ty), mask=live)
    tl.store(s_out + tile, S.to(s_out.dtype.element_ty), mask=live[None, :])


# Its tile configurations (BLOCK_V 32-128, 2-8 warps, no pipelining), tuned at each batch
# size here where ExecuTorch tunes once per head shape: the peer at its best at every B.
# The interpreter (CPU self-test) runs one configuration.
_EXECUTORCH_CONFIGS = [triton.Config({"BLOCK_V": bv}, num_warps=w, num_stages=1)
                       for bv, w in ((32, 2), (32, 4), (64, 2), (64, 4), (128, 4), (128, 8))]
if os.environ.get("TRITON_INTERPRET") == "1":
    _peer_executorch = None
else:
    _peer_executorch = triton.autotune(configs=_EXECUTORCH_CONFIGS, key=["B", "K", "V"])(_peer_executorch_kernel)


def peer_triton_executorch(q, k, v, a, b, A_log, dt_bias, state, scale=None):
    """ExecuTorch-style out-of-place step (T = 1): q, k [B, 1, H, K], v [B, 1, HV, V], a, b
    [B, 1, HV]; state [B, HV, K, V] dense, read only. Returns (o [B, HV, V] in the state's
    dtype, new state [B, HV, K, V]), both new tensors, as ExecuTorch's op does."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert T == 1 and state.is_contiguous() and state.shape == (B, HV, K, V)
    new_state = torch.empty_like(state)
    o = torch.empty(B, HV, V, dtype=state.dtype, device=state.device)
    scale = K ** -0.5 if scale is None else scale
    args = (q, k, v, a, b, A_log, dt_bias, state, new_state, o, scale, B)
    if _peer_executorch is None:
        _peer_executorch_kernel[(B * HV, triton.cdiv(V, 32))](*args, H=H, HV=HV, K=K, V=V, BLOCK_V=32,
                                                               num_warps=4)
    else:
        _peer_executorch[lambda m: (B * HV, triton.cdiv(V, m["BLOCK_V"]))](*args, H=H, HV=HV, K=K, V=V)
    return o, new_state


def stream(src, dst, block, warps):
    n = src.numel()
    _stream_kernel[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, EVEN=n % block == 0,
                                             num_warps=warps)


def fanout(pool, B, T, block, warps):
    row = pool.shape[1]
    assert row % block == 0
    _fanout_kernel[(row // block, B)](pool, row, T, BLOCK=block, num_warps=warps)


# ---- inputs --------------------------------------------------------------------------

def gate_params(shape, device):
    """A_log, dt_bias [Hv] fp32, as bench_common.cuh: decay rates 1..16, dt 0.001..0.1."""
    h = torch.arange(shape["Hv"], dtype=torch.float64) / shape["Hv"]
    A_log = torch.log1p(15.0 * h)
    dt_bias = torch.log(torch.expm1(0.001 + 0.099 * h))
    return A_log.float().to(device), dt_bias.float().to(device)


def make_set(B, T, sd, slots, shape, params, gen, device):
    """Everything one call touches: q, k, v, a, b (bf16, [B, T, ...]), FLA's g and beta,
    a pool of `slots` states in dtype sd (flat rows; viewed kv or vk by each call), index
    arrays, and the peer kernel's output buffer."""
    Hk, Hv, K, V = shape["Hk"], shape["Hv"], shape["K"], shape["V"]
    bf = torch.bfloat16

    def randn(*size):
        return torch.randn(size, generator=gen, device=device, dtype=torch.float32).to(bf)

    s = dict(q=randn(B, T, Hk, K), k=randn(B, T, Hk, K), v=randn(B, T, Hv, V),
             a=randn(B, T, Hv), b=randn(B, T, Hv), A_log=params[0], dt_bias=params[1])
    # FLA as Hugging Face's Qwen3-Next / Qwen3.5 layer feeds it
    s["g"] = -params[0].exp() * torch.nn.functional.softplus(s["a"].float() + params[1])
    s["beta"] = s["b"].sigmoid()
    s["pool"] = torch.empty(slots, Hv * K * V, dtype=sd, device=device).uniform_(-1, 1, generator=gen)
    s["idx"] = torch.arange(B, dtype=torch.int32, device=device)
    s["idx_out"] = s["idx"] + B
    s["idx2d"] = torch.arange(B * T, dtype=torch.int32, device=device).view(B, T)
    s["o"] = torch.empty(B, T, Hv, V, dtype=bf, device=device)
    s["B"], s["T"], s["shape"] = B, T, shape
    return s


def pool_view(s, layout):
    sh = s["shape"]
    last = (sh["K"], sh["V"]) if layout == "kv" else (sh["V"], sh["K"])
    return s["pool"].view(-1, sh["Hv"], *last)


# ---- the implementations -------------------------------------------------------------
# Each: (column, mode, layout, run); run(set) makes one call and returns what it allocated.

def gdnkit_impls(gt, multi, dense):
    def make(layout, mode):
        def run(s):
            kw = {}
            if mode == "inplace" and not dense:
                kw["state_indices"] = s["idx"]
            elif mode == "2slot":
                kw.update(state_indices=s["idx"], state_out_indices=s["idx_out"])
            elif mode == "final":
                kw["num_tokens"] = s["T"]
            elif mode == "inter":
                kw.update(num_tokens=s["T"], token_state_indices=s["idx2d"])
            return gt.decode(s["q"], s["k"], s["v"], s["a"], s["b"], A_log=s["A_log"],
                             dt_bias=s["dt_bias"], state=pool_view(s, layout), layout=layout,
                             gate="raw", l2norm="rsqrt", **kw)
        label = {"inplace": "", "2slot": " 2-slot", "final": " final", "inter": " inter"}[mode]
        return (f"gdnkit {layout}{label}", mode, layout, run)

    modes = ("final", "inter") if multi else ("inplace", "2slot")
    return [make(layout, mode) for mode in modes for layout in ("kv", "vk")]


def fla_impl(fla_fn, multi):
    def run(s):
        h0 = pool_view(s, "kv")[:s["B"]]
        return fla_fn(s["q"], s["k"], s["v"], g=s["g"], beta=s["beta"], initial_state=h0,
                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    return ("FLA kv final (new)" if multi else "FLA kv (new)", "fla", "kv", run)


def peer_impls(multi):
    def make(layout, mode):
        def run(s):
            table = s["idx2d"] if multi else s["idx"]
            return peer_triton_sigmoid_gating(s["q"], s["k"], s["v"], s["a"], s["b"], s["A_log"],
                                              s["dt_bias"], pool_view(s, layout), table, s["o"],
                                              layout,
                                              out_indices=s["idx_out"] if mode == "2slot" else None)
        label = {"inter": " inter", "inplace": "", "2slot": " out of place"}[mode]
        return (f"peer triton {layout}{label}", mode, layout, run)
    if multi:
        return [make("kv", "inter"), make("vk", "inter")]

    def executorch(s):
        return peer_triton_executorch(s["q"], s["k"], s["v"], s["a"], s["b"], s["A_log"],
                                      s["dt_bias"], pool_view(s, "kv")[:s["B"]])
    # in place (vLLM, SGLang) and out of place (the new state elsewhere), then ExecuTorch's form
    return ([make(layout, mode) for mode in ("inplace", "2slot") for layout in ("kv", "vk")]
            + [("ExecuTorch-style kv (new)", "new", "kv", executorch)])


def all_impls(gt, fla_fn, multi, dense):
    impls = gdnkit_impls(gt, multi, dense)
    if fla_fn is not None:
        impls.insert(len(impls) // 2 if multi else len(impls), fla_impl(fla_fn, multi))
    return impls + peer_impls(multi)


def outputs_and_states(impl, s, ret):
    """(o [B, T, Hv, V], states [B, n, Hv, K, V] fp32 kv) of a call: n = T for "inter", else 1
    (the final state)."""
    _, mode, layout, _ = impl
    B, T, sh = s["B"], s["T"], s["shape"]
    if mode in ("fla", "new"):  # (o, the new state [B, Hv, K, V]) in new tensors
        o, st = ret[0], ret[1][:, None]
    else:
        o = ret
        pool = pool_view(s, layout).float()
        if layout == "vk":
            pool = pool.transpose(-1, -2)
        if mode == "inter":
            st = pool[s["idx2d"].reshape(-1).long()].reshape(B, T, *pool.shape[1:])
        elif mode == "2slot":
            st = pool[B:2 * B, None]
        else:
            st = pool[:B, None]
    return o.reshape(B, T, sh["Hv"], sh["V"]).float(), st.float()


# ---- correctness ---------------------------------------------------------------------

def reference(s, S0):
    """float64: o [B, T, Hv, V] and the state after every token [B, T, Hv, K, V] from S0
    [B, Hv, K, V] (kv) and the set's inputs, as docs/operation.md ("The math") writes the step."""
    f = torch.float64
    G = s["v"].shape[2] // s["q"].shape[2]
    q = s["q"].to(f).repeat_interleave(G, dim=2)
    k = s["k"].to(f).repeat_interleave(G, dim=2)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    x = s["a"].to(f) + s["dt_bias"].to(f)
    g = -s["A_log"].to(f).exp() * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    beta = torch.sigmoid(s["b"].to(f))
    scale = q.shape[-1] ** -0.5
    S, outs, states = S0.to(f), [], []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None]
        u = torch.einsum("bhij,bhi->bhj", S, k[:, t])
        delta = beta[:, t, :, None] * (s["v"][:, t].to(f) - u)
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(scale * torch.einsum("bhij,bhi->bhj", S, q[:, t]))
        states.append(S)
    return torch.stack(outs, 1), torch.stack(states, 1)


def errors(x, ref):
    d = (x.double() - ref.double())
    rel = (d.norm() / ref.double().norm().clamp_min(1e-30)).item()
    worst = (d.abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()
    return rel, worst


def plant(s, S0, layout):
    """Put the initial states S0 (kv) where every mode reads them: slot b (dense, in place,
    2-slot, FLA) and slot b*T (the first per-token slot of row b). Needs B <= T or T = 1."""
    B, T = s["B"], s["T"]
    states = S0 if layout == "kv" else S0.transpose(-1, -2)
    pv = pool_view(s, layout)
    pv[:B] = states.to(pv.dtype)
    if T > 1:
        pv[s["idx2d"][:, 0].long()] = states.to(pv.dtype)


def check_floors(device):
    """The floors' kernels do what their names say (a wrong copy would post a fast floor)."""
    x = torch.randn(3 * 8192 + 256, device=device).view(torch.int32)
    for block, warps in COPY_BLOCKS[:2]:
        y = torch.zeros_like(x)
        stream(x, y, block, warps)
        assert torch.equal(x, y), f"stream copy, block {block}"
    p = torch.randint(-9, 9, (6, 2048), dtype=torch.int32, device=device)
    want = p.clone()
    for b in range(2):
        want[b * 3:b * 3 + 3] = p[b * 3]
    fanout(p, 2, 3, 1024, 4)
    assert torch.equal(p, want), "fanout copy"
    z = torch.randn(64, device=device)
    z0 = z.clone()
    z.neg_()
    assert torch.equal(z, -z0), "neg_ did not write"


def run_checks(gt, fla_fn, shape, device, log, dense=False):
    """Every implementation against gdnkit's kv fp32-state call on the same inputs, which is
    checked against the float64 reference first. Returns the failed columns."""
    failed, lines = set(), []
    check_floors(device)
    lines.append("check ok: floors (stream copy, in-place, fan-out copy, neg_)")
    params = gate_params(shape, device)
    for multi in (False, True):
        B, T = (3, 4) if multi else (3, 1)
        for sd in (torch.float32, torch.bfloat16):
            gen = torch.Generator(device=device).manual_seed(7)
            base = make_set(B, T, sd, max(2 * B, B * T), shape, params, gen, device)
            S0 = base["pool"][:B].float().view(B, shape["Hv"], shape["K"], shape["V"]).clone()
            # the reference: gdnkit kv, fp32 state, fp32 output, every token's state kept
            ref = dict(base, pool=torch.zeros(B * T, base["pool"].shape[1], device=device))
            ref["pool"].view(B * T, shape["Hv"], shape["K"], shape["V"])[ref["idx2d"][:, 0].long()] = S0
            o_ref = gt.decode(ref["q"], ref["k"], ref["v"], ref["a"], ref["b"], A_log=ref["A_log"],
                              dt_bias=ref["dt_bias"], state=pool_view(ref, "kv"), layout="kv",
                              num_tokens=T, token_state_indices=ref["idx2d"], out_dtype=torch.float32)
            o_ref = o_ref.reshape(B, T, shape["Hv"], shape["V"])
            s_ref = pool_view(ref, "kv")[ref["idx2d"].reshape(-1).long()].reshape(B, T, *S0.shape[1:])
            o64, s64 = reference(base, S0)
            e_o, e_s = errors(o_ref, o64)[0], errors(s_ref, s64)[0]
            tag = f"{'T=%d' % T if multi else 'T=1'} state {str(sd)[6:]}"
            if e_o > 1e-4 or e_s > 1e-4:
                raise SystemExit(f"CHECK FAILED: gdnkit kv fp32 against float64 ({tag}): "
                                 f"o {e_o:.2e}, state {e_s:.2e}")
            lines.append(f"check ok: gdnkit kv fp32 reference vs float64 ({tag}): "
                         f"o {e_o:.1e}, state {e_s:.1e}")
            for impl in all_impls(gt, fla_fn, multi, dense):
                s = dict(base, pool=base["pool"].clone(), o=torch.zeros_like(base["o"]))
                if impl[2] == "vk":  # the same slots transposed
                    s["pool"] = pool_view(base, "kv").transpose(-1, -2).contiguous().view_as(base["pool"])
                plant(s, S0, impl[2])
                before = s["pool"][:B].clone()
                try:
                    ret = impl[3](s)
                    o, st = outputs_and_states(impl, s, ret)
                    want = s_ref if impl[1] == "inter" else s_ref[:, -1:]
                    r_o, w_o = errors(o, o_ref)
                    r_s, w_s = errors(st, want)
                    ok = r_o <= TOL_O and r_s <= TOL_S and max(w_o, w_s) <= TOL_WORST
                    if impl[1] == "2slot" and not torch.equal(s["pool"][:B], before):
                        ok, r_s = False, float("nan")  # the read slots must stay as they were
                    msg = (f"{impl[0]} ({tag}): o {r_o:.1e} (worst {w_o:.1e}), "
                           f"state {r_s:.1e} (worst {w_s:.1e})")
                except Exception as e:  # a peer that cannot run is a failed check too
                    ok, msg = False, f"{impl[0]} ({tag}): {type(e).__name__}: {e}"
                if not ok:
                    failed.add(impl[0])
                    log(f"CHECK FAILED: {msg}")
                lines.append(("check ok: " if ok else "CHECK FAILED: ") + msg)
    for line in lines:
        log(line)
    return failed, lines


# ---- the protocol --------------------------------------------------------------------

def time_calls(step, n_sets):
    """µs a call: (median, min, max) over REPLAYS replays of a CUDA graph of max(n_sets,
    MIN_CALLS) calls, call c on set c % n_sets. step(i) enqueues one call on set i and
    returns what it allocated, kept alive over n_sets calls so fresh outputs rotate too."""
    calls = max(n_sets, MIN_CALLS)
    for i in range(min(n_sets, 2)):  # compile (Triton) and warm up before the capture
        step(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    keep = collections.deque(maxlen=n_sets)
    with torch.cuda.graph(graph):
        for c in range(calls):
            keep.append(step(c % n_sets))
    keep.clear()
    graph.replay()  # warm-up replay
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for _ in range(REPLAYS):
        t0.record()
        graph.replay()
        t1.record()
        t1.synchronize()
        us.append(t0.elapsed_time(t1) * 1e3 / calls)
    del graph
    us.sort()
    return us[len(us) // 2], us[0], us[-1]


def n_sets_for(B, sd, shape):
    state = B * shape["Hv"] * shape["K"] * shape["V"] * torch.tensor([], dtype=sd).element_size()
    return max(2, math.ceil(ROTATE_BYTES / state))


def measure_row(B, T, sd, impls, failed, shape, params, log, device="cuda"):
    """One row: the floors and every implementation on the same rotating sets."""
    multi = T > 1
    n = n_sets_for(B, sd, shape)
    gen = torch.Generator(device=device).manual_seed(1000 * B + T)
    sets = [make_set(B, T, sd, B * T if multi else 2 * B, shape, params, gen, device) for _ in range(n)]
    res = {}

    def run(name, fn):
        res[name] = time_calls(lambda i: fn(sets[i]), n)

    def i32(s, lo, hi):
        return s["pool"][lo:hi].view(torch.int32)

    floors = {"copy": [], "in-place": [], "inter": []}

    def floor(kind, name, fn):
        run(name, fn)
        floors[kind].append(res[name])

    floor("copy", "copy torch", lambda s: s["pool"][B:2 * B].copy_(s["pool"][:B]))
    floor("in-place", "in-place torch neg_", lambda s: s["pool"][:B].neg_())
    for bl, w in COPY_BLOCKS:  # each lambda is timed before the next iteration rebinds bl
        floor("copy", f"copy triton {bl}", lambda s: stream(i32(s, 0, B), i32(s, B, 2 * B), bl, w))
        floor("in-place", f"in-place triton {bl}", lambda s: stream(i32(s, 0, B), i32(s, 0, B), bl, w))
        if multi and sets[0]["pool"].view(torch.int32).shape[1] % bl == 0:
            floor("inter", f"inter triton {bl}", lambda s: fanout(s["pool"].view(torch.int32), B, T, bl, w))
    res.update({kind: min(rs) for kind, rs in floors.items() if rs})  # fastest median
    for name, _, _, fn in impls:
        if name not in failed:
            try:  # a call refused here (e.g. by a shape limit) costs its cell, not the run
                run(name, fn)
            except Exception as e:
                log(f"ERROR: {name} at B={B} T={T}: {type(e).__name__}: {e}")
    del sets
    if device == "cuda":
        torch.cuda.empty_cache()
    log(f"  {str(sd)[6:]} B={B} T={T}: " + ", ".join(f"{k} {v[0]:.2f}" for k, v in res.items()))
    return res


# ---- the report ----------------------------------------------------------------------

def fmt_us(r):
    if r is None:
        return "-"
    f = (lambda x: f"{x:.2f}") if r[0] < 100 else (lambda x: f"{x:.1f}")
    return f"{f(r[0])} [{f(r[1])}-{f(r[2])}]"


def table(head, rows, n_key):
    align = ["---" if i < n_key else "---:" for i in range(len(head))]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def report(rows, cols, multi, failed):
    """Markdown: µs [min-max], then ratios of every column to the floors."""
    floors = ["copy", "in-place"] + (["inter"] if multi else [])
    key = ["state", "B"] + (["T"] if multi else [])
    lines = []

    def keys(r):
        return [r["state"], str(r["B"])] + ([str(r["T"])] if multi else [])

    def cell(r, c):
        return "check failed" if c in failed else fmt_us(r["res"].get(c))

    lines += table(key + [f + " floor" for f in floors] + cols,
                   [keys(r) + [fmt_us(r["res"][f]) for f in floors] + [cell(r, c) for c in cols]
                    for r in rows],
                   len(key))

    def ratio(r, c, f):
        x = r["res"].get(c)
        return "-" if x is None else f"{x[0] / r['res'][f][0]:.3f}"

    gd = [c for c in cols if c.startswith("gdnkit")]
    if not multi:
        for f in ("in-place", "copy"):
            lines += ["", f"Ratio to the {f} floor (medians); last column: fastest gdnkit / "
                      "fastest peer.", ""]
            peers = [c for c in cols if not c.startswith("gdnkit")]
            lines += table(key + cols + ["best gdnkit / best peer"],
                           [keys(r) + [ratio(r, c, f) for c in cols] + [best(r, gd, peers)] for r in rows],
                           len(key))
    else:
        floor_of = {c: ("inter" if "inter" in c else "in-place") for c in cols}
        lines += ["", "Ratio to each mode's floor (final: in-place floor; inter: inter floor); "
                  "FLA also to the copy floor (it writes a new tensor); last columns: fastest "
                  "gdnkit / fastest peer in each mode.", ""]
        fla = [c for c in cols if c.startswith("FLA")]
        g_fin, g_int = [c for c in gd if "final" in c], [c for c in gd if "inter" in c]
        p_int = [c for c in cols if c.startswith("peer")]
        head = key + cols + [c + " / copy" for c in fla] + ["final: gdnkit / FLA", "inter: gdnkit / peer"]
        lines += table(head, [keys(r) + [ratio(r, c, floor_of[c]) for c in cols]
                              + [ratio(r, c, "copy") for c in fla]
                              + [best(r, g_fin, fla), best(r, g_int, p_int)] for r in rows], len(key))
    return lines


def best(r, mine, theirs):
    a = [r["res"][c][0] for c in mine if c in r["res"]]
    b = [r["res"][c][0] for c in theirs if c in r["res"]]
    return f"{min(a) / min(b):.3f}" if a and b else "-"


def sm_clock():
    """The SM clock now, MHz, from nvidia-smi (None when it is not there)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm",
                              "--format=csv,noheader,nounits", "-i", str(torch.cuda.current_device())],
                             capture_output=True, text=True, timeout=10)
        now, top = out.stdout.strip().split(",")[:2]
        return int(now), int(top)
    except Exception:
        return None


# ---- FLA from wheel files --------------------------------------------------------------

def add_wheels(directory):
    """Unpack every wheel in `directory` (a wheel is a zip of importable files) into one
    temporary folder, merged as pip would install them (fla-core and flash-linear-attention
    both fill `fla/`), and put it first on sys.path: FLA runs on a machine with no registry."""
    wheels = sorted(glob.glob(os.path.join(directory, "*.whl")))
    if not wheels:
        raise SystemExit(f"--fla-wheels {directory}: no .whl files there")
    root = tempfile.mkdtemp(prefix="peers-wheels-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            z.extractall(root)
    sys.path.insert(0, root)
    return [os.path.basename(w) for w in wheels]


def import_fla(log):
    try:
        import fla
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        return fused_recurrent_gated_delta_rule, getattr(fla, "__version__", "?")
    except Exception as e:  # not installed, or a dependency missing (einops, ...)
        log(f"FLA not installed: skipped ({type(e).__name__}: {e})")
        return None, None


# ---- main ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="B = 1, 8; several tokens: B = 8, T = 2")
    ap.add_argument("--batch", type=int, nargs="+", help="one-token batch sizes (default 1 8 32 128 512)")
    ap.add_argument("--multi-batch", type=int, nargs="*",
                    help="several-token batch sizes (default 8 32 128; none: skip those rows)")
    ap.add_argument("--tokens", type=int, nargs="+", help="tokens a row (default 2 4 8)")
    ap.add_argument("--dense", action="store_true", help="gdnkit in place without state_indices")
    ap.add_argument("--out", help="also write the Markdown report to this file")
    ap.add_argument("--csv", help="also write one line per (row, column) to this CSV file")
    ap.add_argument("--fla-wheels", metavar="DIR",
                    help="import FLA from the wheels in DIR (unpacked to a temporary folder)")
    ap.add_argument("--self-test", action="store_true", help="run the correctness checks only")
    args = ap.parse_args()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    cuda = torch.cuda.is_available()
    if not cuda and not args.self_test:
        log("bench/peers.py needs a CUDA GPU (torch.cuda.is_available() is False); "
            "--self-test runs the correctness checks on the CPU")
        sys.exit(2)
    wheels = add_wheels(args.fla_wheels) if args.fla_wheels else []
    try:
        import gdnkit
        import gdnkit.torch as gt
    except ImportError as e:
        log(f"gdnkit's Python package does not import ({e}): build and install it (python/)")
        sys.exit(1)
    if cuda:
        ok, why = gdnkit.backend_available("cuda")
        if not ok:
            log(f"gdnkit has no CUDA backend here: {why}")
            sys.exit(1)
    fla_fn, fla_version = import_fla(log)
    device = "cuda" if cuda else "cpu"
    shape = SHAPE if cuda else CPU_SHAPE

    with torch.inference_mode():
        failed, check_lines = run_checks(gt, fla_fn, shape, device, log, args.dense)
        if args.self_test:
            log("self-test: " + ("FAILED: " + ", ".join(sorted(failed)) if failed else "all checks ok")
                + f" ({device}, shape {shape})")
            sys.exit(1 if failed else 0)

        batches = args.batch or ([1, 8] if args.quick else [1, 8, 32, 128, 512])
        multi_b = [8] if args.quick else [8, 32, 128]
        multi_b = multi_b if args.multi_batch is None else args.multi_batch
        tokens = args.tokens or ([2] if args.quick else [2, 4, 8])
        params = gate_params(shape, device)
        clocks, one, several = [], [], []
        impls1 = all_impls(gt, fla_fn, False, args.dense)
        implsT = all_impls(gt, fla_fn, True, args.dense)
        for sd in (torch.float32, torch.bfloat16):
            for B in batches:
                res = measure_row(B, 1, sd, impls1, failed, shape, params, log)
                one.append(dict(state=str(sd)[6:], B=B, T=1, res=res))
                clocks.append(sm_clock())
        for sd in (torch.float32, torch.bfloat16):
            for B in multi_b:
                for T in tokens:
                    res = measure_row(B, T, sd, implsT, failed, shape, params, log)
                    several.append(dict(state=str(sd)[6:], B=B, T=T, res=res))
                    clocks.append(sm_clock())

    props = torch.cuda.get_device_properties(0)
    seen = [c for c in clocks if c]
    clock = (f"SM clock after each row {min(c[0] for c in seen)}-{max(c[0] for c in seen)} MHz "
             f"(max {seen[0][1]})" if seen else "SM clock not sampled (no nvidia-smi)")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# gdnkit against peer kernels: one GatedDeltaNet decode step",
        "",
        f"- GPU: {torch.cuda.get_device_name(0)} ({props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.0f} GiB); {clock}",
        f"- torch {torch.__version__}, triton {triton.__version__}, "
        f"FLA {fla_version or 'not installed'}, gdnkit {gdnkit.__version__}"
        + (f" (wheels: {', '.join(wheels)})" if wheels else ""),
        f"- {now}; command: `python {' '.join(shlex.quote(a) for a in sys.argv)}`",
        f"- shape Hk {shape['Hk']}, Hv {shape['Hv']}, Dk {shape['K']}, Dv {shape['V']}; bf16 q/k/v/a/b, "
        "raw gates, l2norm in the kernel; gdnkit in place " + ("without" if args.dense else "with")
        + " state_indices",
        f"- protocol: CUDA graphs of >= {MIN_CALLS} calls rotating over sets of >= "
        f"{ROTATE_BYTES >> 20} MiB of state (every call cold); µs a call, median [min-max] of "
        f"{REPLAYS} replays",
        "- checks: " + ("all ok" if not failed else "FAILED: " + ", ".join(sorted(failed))),
        "",
        "## One token a row (T = 1), µs a call",
        "",
    ]
    cols1 = [c[0] for c in impls1]
    out += report(one, cols1, False, failed)
    if several:
        colsT = [c[0] for c in implsT]
        out += ["", "## Several tokens a row (speculative decoding verify), µs a call", ""]
        out += report(several, colsT, True, failed)
    out += ["", "Columns: kv = state [slot, Hv, Dk, Dv], vk = [slot, Hv, Dv, Dk]; 2-slot: reads slot s, "
            "writes slot s + B; final: the last token's state in place; inter: every token's state "
            "to its own slot (token_state_indices [B, T]); FLA writes its final state (fp32) to a "
            "new tensor; peer triton: peer_triton_sigmoid_gating (vLLM/SGLang semantics, written "
            "here), in place, or out of place (the new state to slot s + B: the traffic of "
            "ExecuTorch's out-of-place kernel); ExecuTorch-style: peer_triton_executorch (the form "
            "of ExecuTorch's fused_deltanet_decode, written here; dense kv state, output and new "
            "state to new tensors). Floors: see bench/peers.py's docstring.", "", "Checks:", ""]
    out += ["    " + line for line in check_lines]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("section,state,B,T,column,median_us,min_us,max_us\n")
            for section, rows in (("one-token", one), ("multi-token", several)):
                for r in rows:
                    for c, (m, lo, hi) in r["res"].items():
                        f.write(f"{section},{r['state']},{r['B']},{r['T']},{c},{m:.4f},{lo:.4f},{hi:.4f}\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
