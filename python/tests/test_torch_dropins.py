"""The drop-in wrappers (ExecuTorch, vLLM, SGLang, FLA) of gdnkit.torch, against plain
PyTorch references (torch_cases.py and the callers' own formulas here).

Runs on CPU tensors wherever torch imports, and on CUDA tensors too when a GPU is
present (CUDA graph capture and replay, torch.export). Skips cleanly without torch.
"""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import gdnkit.torch as gt  # noqa: E402
from gdnkit.torch import executorch, fla, sglang, vllm  # noqa: E402
from torch_cases import (DEVICES, TOL_OUT, TOL_STATE, assert_close, assert_same,  # noqa: E402
                         cuda_only, reference)


# ---- ExecuTorch -------------------------------------------------------------------------

def executorch_reference(qkv, alpha, beta_raw, A_log, dt_bias, state, Hk, Hv, K, V):
    """ExecuTorch's model T=1 path: split, F.normalize, repeat_interleave, gates, recurrence."""
    B = qkv.shape[0]
    kd = Hk * K
    q = F.normalize(qkv[:, :kd].reshape(B, Hk, K).double(), p=2, dim=-1, eps=1e-6)
    k = F.normalize(qkv[:, kd:2 * kd].reshape(B, Hk, K).double(), p=2, dim=-1, eps=1e-6)
    v = qkv[:, 2 * kd:].reshape(B, Hv, V).double()
    q, k = q.repeat_interleave(Hv // Hk, 1), k.repeat_interleave(Hv // Hk, 1)
    g = -torch.exp(A_log.double()) * F.softplus(alpha.double() + dt_bias.double())
    beta = torch.sigmoid(beta_raw.double())
    S = state.double() * torch.exp(g)[..., None, None]
    delta = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))
    S = S + torch.einsum("bhk,bhv->bhkv", k, delta)
    return torch.einsum("bhkv,bhk->bhv", S, q) * K**-0.5, S


def executorch_inputs(device, B, Hk, Hv, K, V, state_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(B, 2 * Hk * K + Hv * V, generator=gen) * 0.1).to(torch.bfloat16)
    alpha = torch.randn(B, Hv, generator=gen)
    beta_raw = torch.randn(B, Hv, generator=gen)
    A_log = torch.log(torch.empty(Hv).uniform_(0.5, 8, generator=gen))
    dt_bias = torch.ones(Hv)
    state = (torch.randn(B, Hv, K, V, generator=gen) * 0.1).to(state_dtype)
    return [x.to(device) for x in (qkv, alpha, beta_raw, A_log, dt_bias, state)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_executorch_fused_deltanet_decode(device, state_dtype):
    Hk, Hv, K, V = 4, 8, 128, 128
    qkv, alpha, beta_raw, A_log, dt_bias, state = executorch_inputs(device, 3, Hk, Hv, K, V, state_dtype, 1)
    o_ref, s_ref = executorch_reference(qkv, alpha, beta_raw, A_log, dt_bias, state, Hk, Hv, K, V)
    before = state.clone()
    out, new_state = executorch.fused_deltanet_decode(qkv, alpha, beta_raw, A_log, dt_bias, state)
    assert torch.equal(state, before), "input state was mutated"
    assert out.shape == (3, Hv, V) and out.dtype == state_dtype and new_state.dtype == state_dtype
    assert_close(out, o_ref, TOL_OUT[state_dtype], "output")
    assert_close(new_state, s_ref, TOL_STATE[state_dtype], "new_state")
    # The in-place variant: the same numbers, written into `state`.
    out2 = executorch.fused_deltanet_decode_(qkv, alpha, beta_raw, A_log, dt_bias, state)
    assert_same(out2, out)
    assert_same(state, new_state)


@pytest.mark.parametrize("device", DEVICES)
def test_executorch_triton_alias(device):
    gt.register_triton_alias()
    args = executorch_inputs(device, 1, 2, 4, 128, 128, torch.bfloat16, 2)
    out, new_state = torch.ops.triton.fused_deltanet_decode(*args)
    ref_out, ref_state = executorch.fused_deltanet_decode(*args)
    assert_same(out, ref_out)
    assert_same(new_state, ref_state)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_export_executorch_op(device):
    class M(torch.nn.Module):
        def forward(self, qkv, alpha, beta_raw, A_log, dt_bias, state):
            return executorch.fused_deltanet_decode(qkv, alpha, beta_raw, A_log, dt_bias, state)

    args = executorch_inputs(device, 2, 2, 4, 64, 64, torch.float32, 3)
    ep = torch.export.export(M(), tuple(args))
    out, new_state = ep.module()(*args)
    ref_out, ref_state = executorch.fused_deltanet_decode(*args)
    assert_same(out, ref_out)
    assert_same(new_state, ref_state)


# ---- vLLM ---------------------------------------------------------------------------------

def vllm_inputs(device, N, H, HV, K, V, slots, seed, dtype=torch.bfloat16, state_dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t = dict(
        A_log=torch.log(torch.empty(HV).uniform_(1, 16, generator=gen)),
        a=r(N, HV).to(dtype), b=r(N, HV).to(dtype), dt_bias=r(HV) * 0.1,
        q=r(N, 1, H, K).to(dtype), k=r(N, 1, H, K).to(dtype), v=r(N, 1, HV, V).to(dtype),
        state=(0.5 * r(slots, HV, V, K)).to(state_dtype),
    )
    return {n: x.to(device) for n, x in t.items()}


def vllm_reference(t, idx, *, l2, beta=1.0, threshold=20.0, read_idx=None):
    N = t["q"].shape[0] * t["q"].shape[1]
    H, K = t["q"].shape[-2:]
    HV, V = t["v"].shape[-2:]
    read = idx if read_idx is None else read_idx
    return reference(t["q"].reshape(N, H, K), t["k"].reshape(N, H, K), t["v"].reshape(N, HV, V),
                     t["a"].reshape(N, HV), t["b"].reshape(N, HV), t["A_log"], t["dt_bias"],
                     t["state"].transpose(-1, -2), read, idx if read_idx is not None else None,
                     l2="rsqrt" if l2 else "none", softplus_beta=beta, softplus_threshold=threshold)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("l2", [True, False])
def test_vllm_inplace_pool(device, l2):
    t = vllm_inputs(device, N=4, H=2, HV=4, K=128, V=128, slots=9, seed=3)
    idx = torch.tensor([6, -1, 2, 8], dtype=torch.int32, device=device)
    o_ref, s_ref = vllm_reference(t, idx, l2=l2)
    state = t["state"].clone()
    o, final = vllm.fused_sigmoid_gating_delta_rule_update(
        A_log=t["A_log"], a=t["a"], b=t["b"], dt_bias=t["dt_bias"], q=t["q"], k=t["k"], v=t["v"],
        initial_state=state, inplace_final_state=True, ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=l2)
    assert final is state and o.shape == t["v"].shape and o.dtype == t["q"].dtype
    valid = idx.cpu() >= 0
    assert_close(o.reshape(4, 4, 128)[valid], o_ref[valid], TOL_OUT[torch.bfloat16], "output")
    assert_close(state.transpose(-1, -2), s_ref, TOL_STATE[torch.float32], "pool")
    for slot in (0, 1, 3, 4, 5, 7):
        assert torch.equal(state[slot], t["state"][slot])


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_varlen_softplus_beta_out_of_place(device):
    """[1, N, ...] with cu_seqlens, softplus beta 2, inplace_final_state=False."""
    N = 3
    t = vllm_inputs(device, N=N, H=1, HV=2, K=64, V=64, slots=5, seed=4)
    t1 = dict(t, q=t["q"].transpose(0, 1), k=t["k"].transpose(0, 1), v=t["v"].transpose(0, 1))
    idx = torch.tensor([4, 0, -1], dtype=torch.int64, device=device)
    cu = torch.arange(N + 1, dtype=torch.int32, device=device)
    o_ref, s_ref = vllm_reference(t, idx, l2=True, beta=2.0, threshold=20.0)
    state = t["state"].clone()
    o, final = vllm.fused_sigmoid_gating_delta_rule_update(
        t["A_log"], t["a"], t["b"], t["dt_bias"], t1["q"], t1["k"], t1["v"], beta=2.0,
        threshold=20.0, initial_state=state, inplace_final_state=False, cu_seqlens=cu,
        ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    assert torch.equal(state, t["state"]), "out of place must not touch the pool"
    assert o.shape == (1, N, 2, 64) and final.shape == (N, 2, 64, 64)
    valid = idx.cpu() >= 0
    assert_close(o.reshape(N, 2, 64)[valid], o_ref[valid], TOL_OUT[torch.bfloat16], "output")
    for r in range(N):
        if valid[r]:
            assert_close(final[r].transpose(-1, -2), s_ref[idx[r]], 1e-5, f"final_state[{r}]")


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_spec_decode_indices(device):
    """2-D ssm_state_indices with num_accepted_tokens: read column acc-1, write column 0."""
    t = vllm_inputs(device, N=2, H=1, HV=2, K=64, V=64, slots=8, seed=8)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=device)
    acc = torch.tensor([2, 3], dtype=torch.int32, device=device)
    read = torch.tensor([1, 5], dtype=torch.int32, device=device)
    write = table[:, 0].contiguous()
    o_ref, s_ref = vllm_reference(t, write, l2=True, read_idx=read)
    state = t["state"].clone()
    o, _ = vllm.fused_sigmoid_gating_delta_rule_update(
        t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"], initial_state=state,
        ssm_state_indices=table, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    assert_close(o.reshape(2, 2, 64), o_ref, TOL_OUT[torch.bfloat16], "output")
    assert_close(state.transpose(-1, -2), s_ref, 1e-5, "pool")


def round_state(x, dtype):
    """The state as storing it in `dtype` and reading it back gives (float64)."""
    return x.to(dtype).double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("wrapper", ["sigmoid_gating", "recurrent"])
def test_vllm_spec_decode_several_tokens(device, state_dtype, wrapper):
    """vLLM's spec decode: cu_seqlens rows of 3, 1, 4 and 2 tokens (T = 4), ssm_state_indices
    [N, T], num_accepted_tokens picking each row's initial slot, a padding row; every token's
    state to its own slot. Against a float64 token loop that rounds the state between tokens."""
    N, T, H, HV, K, V = 5, 4, 2, 4, 64, 64
    lens = [3, 1, 4, 2, 2]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    total = int(cu[-1])
    gen = torch.Generator().manual_seed(31)
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q, k = r(1, total, H, K).bfloat16(), r(1, total, H, K).bfloat16()
    v = r(1, total, HV, V).bfloat16()
    a, b = r(total, HV).bfloat16(), r(total, HV).bfloat16()
    A_log = torch.log(torch.empty(HV).uniform_(1, 16, generator=gen))
    dt_bias = r(HV) * 0.1
    slots = 24
    pool = (0.5 * r(slots, HV, V, K)).to(state_dtype)
    table = torch.randperm(slots, generator=gen)[:N * T].reshape(N, T).to(torch.int32)
    table[3, :] = -1  # a padding row
    acc = torch.tensor([2, 1, 4, 1, 2], dtype=torch.int32)

    # reference: token by token, float64, the state rounded to its dtype after every token
    o_ref = torch.zeros(total, HV, V, dtype=torch.float64)
    ref_pool = pool.double().transpose(-1, -2).clone()  # [S, HV, K, V]
    for n in range(N):
        slot = int(table[n, acc[n] - 1])
        if slot < 0:
            continue
        S = ref_pool[slot].clone()
        for j in range(lens[n]):
            tok = int(cu[n]) + j
            o, new = reference(q[0, tok:tok + 1], k[0, tok:tok + 1], v[0, tok:tok + 1],
                               a[tok:tok + 1], b[tok:tok + 1], A_log, dt_bias, S[None], l2="rsqrt")
            o_ref[tok] = o[0]
            S = round_state(new[0].transpose(-1, -2), state_dtype).transpose(-1, -2)
            ref_pool[int(table[n, j])] = S

    to = lambda x: x.to(device)  # noqa: E731
    state = to(pool.clone())
    if wrapper == "sigmoid_gating":
        o, final = vllm.fused_sigmoid_gating_delta_rule_update(
            to(A_log), to(a), to(b), to(dt_bias), to(q), to(k), to(v), initial_state=state,
            inplace_final_state=True, cu_seqlens=to(cu), ssm_state_indices=to(table),
            num_accepted_tokens=to(acc), use_qk_l2norm_in_kernel=True)
    else:
        g = -torch.exp(A_log) * F.softplus(a.float() + dt_bias)
        beta = torch.sigmoid(b.float())
        o, final = vllm.fused_recurrent_gated_delta_rule(
            to(q), to(k), to(v), to(g[None]), to(beta[None]), initial_state=state,
            inplace_final_state=True, cu_seqlens=to(cu), ssm_state_indices=to(table),
            num_accepted_tokens=to(acc), use_qk_l2norm_in_kernel=True)
    assert final is state and o.shape == v.shape
    got = o[0].double().cpu()
    pad_rows = slice(int(cu[3]), int(cu[4]))
    assert torch.equal(got[pad_rows], torch.zeros_like(got[pad_rows])), "padding row output"
    tol_state = TOL_STATE[state_dtype] if wrapper == "sigmoid_gating" else max(TOL_STATE[state_dtype], 1e-4)
    tol_out = TOL_OUT[torch.bfloat16]
    assert_close(got, o_ref, tol_out, "output")
    written = table[table >= 0].long()
    assert_close(state.double().cpu().transpose(-1, -2)[written], ref_pool[written], tol_state, "written slots")
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(state.cpu()[untouched], pool[untouched]), "slots nobody writes changed"


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_several_tokens_equal_chained_single_tokens(device):
    """Dense [B, T] tokens with per-token slots: bitwise the same as T one-token calls, each
    reading the previous token's slot and writing its own."""
    B, T, H, HV, K, V = 3, 3, 1, 2, 64, 64
    t = vllm_inputs(device, N=B * T, H=H, HV=HV, K=K, V=V, slots=12, seed=44,
                    state_dtype=torch.bfloat16)
    q, k, v = (t[n].reshape(B, T, *t[n].shape[2:]) for n in ("q", "k", "v"))
    a, b = t["a"].reshape(B, T, HV), t["b"].reshape(B, T, HV)
    table = torch.arange(B * T, dtype=torch.int32, device=device).reshape(B, T) + 3
    state = t["state"].clone()
    o, _ = vllm.fused_sigmoid_gating_delta_rule_update(
        t["A_log"], a, b, t["dt_bias"], q, k, v, initial_state=state, ssm_state_indices=table,
        use_qk_l2norm_in_kernel=True)
    chained = t["state"].clone()
    for j in range(T):
        read = table[:, 0] if j == 0 else table[:, j - 1]
        o_j, _ = vllm.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], a[:, j], b[:, j], t["dt_bias"], q[:, j:j + 1], k[:, j:j + 1], v[:, j:j + 1],
            # one token: vLLM reads column num_accepted - 1 and writes column 0
            initial_state=chained, ssm_state_indices=torch.stack([table[:, j], read], 1).contiguous(),
            num_accepted_tokens=torch.full((B,), 2, dtype=torch.int32, device=device),
            use_qk_l2norm_in_kernel=True)
        assert torch.equal(o[:, j], o_j[:, 0]), f"token {j}"
    assert torch.equal(state, chained)


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_fused_recurrent(device):
    """vLLM's fused_recurrent_gated_delta_rule: precomputed g and beta over the pool."""
    t = vllm_inputs(device, N=3, H=2, HV=4, K=64, V=128, slots=5, seed=12)
    gen = torch.Generator().manual_seed(13)
    g = F.logsigmoid(torch.randn(3, 4, generator=gen)).to(device)
    beta = torch.rand(3, 4, generator=gen).to(device)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    N, H, K, HV, V = 3, 2, 64, 4, 128
    o_ref, s_ref = reference(t["q"].reshape(N, H, K), t["k"].reshape(N, H, K),
                             t["v"].reshape(N, HV, V), g, beta, None, None,
                             t["state"].transpose(-1, -2), idx, gate="precomputed", l2="rsqrt")
    state = t["state"].clone()
    o, final = vllm.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], g, beta, initial_state=state, inplace_final_state=True,
        ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    assert final is state and o.shape == t["v"].shape
    valid = idx.cpu() >= 0
    assert_close(o.reshape(N, HV, V)[valid], o_ref[valid], TOL_OUT[torch.bfloat16], "output")
    assert_close(state.transpose(-1, -2), s_ref, 1e-5, "pool")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 2])
def test_vllm_fused_recurrent_per_channel_beta(device, T):
    """beta [N, T, HV, V], one a column (vLLM's non-headwise beta), through the pool: one
    token a sequence, or T tokens with the per-token slots of spec decode."""
    N, H, HV, K, V = 3, 2, 4, 64, 128
    t = vllm_inputs(device, N=N, H=H, HV=HV, K=K, V=V, slots=8, seed=15)
    gen = torch.Generator().manual_seed(16)
    q, k, v = (torch.randn(N, T, h, d, generator=gen).to(torch.bfloat16).to(device)
               for h, d in ((H, K), (H, K), (HV, V)))
    g = F.logsigmoid(torch.randn(N, T, HV, generator=gen)).to(device)
    beta = torch.rand(N, T, HV, V, generator=gen).to(device)
    idx = torch.tensor([[4, 5], [-1, -1], [1, 2]], dtype=torch.int32, device=device)[:, :T]
    S = t["state"].transpose(-1, -2).double().cpu()
    valid = idx[:, 0].cpu() >= 0
    state = t["state"].clone()
    o, final = vllm.fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=state, inplace_final_state=True,
        ssm_state_indices=idx if T > 1 else idx[:, 0], use_qk_l2norm_in_kernel=True)
    assert final is state
    for s in range(T):  # token s reads the previous token's slot (token 0: column 0), writes column s
        o_ref, S = reference(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], None, None, S,
                             idx[:, max(s - 1, 0)], idx[:, s], gate="precomputed", l2="rsqrt")
        assert_close(o[:, s][valid], o_ref[valid], TOL_OUT[torch.bfloat16], f"output, token {s}")
    assert_close(state.transpose(-1, -2), S, 1e-5, "pool")
    # a beta of one value on every column is the one-beta-a-head call, bitwise
    flat = beta[..., :1].expand(beta.shape).contiguous()
    s1, s2 = t["state"].clone(), t["state"].clone()
    o1, _ = vllm.fused_recurrent_gated_delta_rule(q, k, v, g, flat, initial_state=s1, ssm_state_indices=idx,
                                                   use_qk_l2norm_in_kernel=True)
    o2, _ = vllm.fused_recurrent_gated_delta_rule(q, k, v, g, beta[..., 0].contiguous(), initial_state=s2,
                                                   ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    if T > 1:  # (T = 1 without per-channel beta runs the one-token kernels)
        assert torch.equal(o1, o2) and torch.equal(s1, s2)
    else:
        assert_close(s1, s2, 1e-6, "pool, one beta a head")


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_null_block_and_kv_pool(device):
    """Releases that pad with slot 0 (null_block_id=0) and keep [slots, HV, K, V] pools."""
    t = vllm_inputs(device, N=3, H=1, HV=2, K=64, V=64, slots=4, seed=14)
    t["state"] = t["state"].transpose(-1, -2).contiguous()  # [slots, HV, K, V]
    idx = torch.tensor([3, 0, 2], dtype=torch.int32, device=device)
    N = 3
    o_ref, s_ref = reference(t["q"].reshape(N, 1, 64), t["k"].reshape(N, 1, 64),
                             t["v"].reshape(N, 2, 64), t["a"], t["b"], t["A_log"], t["dt_bias"],
                             t["state"], torch.tensor([3, -1, 2]), l2="rsqrt")
    state = t["state"].clone()
    o, _ = vllm.fused_sigmoid_gating_delta_rule_update(
        t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"], initial_state=state,
        ssm_state_indices=idx, use_qk_l2norm_in_kernel=True, state_layout="kv", null_block_id=0)
    assert_close(o.reshape(N, 2, 64), o_ref, TOL_OUT[torch.bfloat16], "output")
    assert not o[1].any()
    assert_close(state, s_ref, 1e-5, "pool")
    assert torch.equal(state[0], t["state"][0]) and torch.equal(state[1], t["state"][1])


def test_vllm_unsupported():
    t = vllm_inputs("cpu", N=2, H=1, HV=2, K=64, V=64, slots=2, seed=1)
    args = (t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"])
    with pytest.raises(NotImplementedError, match="is_kda"):
        vllm.fused_sigmoid_gating_delta_rule_update(*args, initial_state=t["state"], is_kda=True)
    with pytest.raises(NotImplementedError, match="threshold"):
        vllm.fused_sigmoid_gating_delta_rule_update(*args, threshold=5.0, initial_state=t["state"])


# ---- SGLang -------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("disable_state_update", [False, True])
def test_sglang(device, disable_state_update):
    N = 3
    t = vllm_inputs(device, N=N, H=2, HV=4, K=64, V=64, slots=6, seed=11)
    q, k, v = (t[n].transpose(0, 1) for n in ("q", "k", "v"))  # [1, N, H, D]
    idx = torch.tensor([5, 2, -1], dtype=torch.int32, device=device)
    o_ref, s_ref = vllm_reference(t, idx, l2=True)
    state = t["state"].clone()
    o = sglang.fused_sigmoid_gating_delta_rule_update(
        A_log=t["A_log"], a=t["a"], dt_bias=t["dt_bias"], softplus_beta=1.0, softplus_threshold=20.0,
        q=q, k=k, v=v, b=t["b"], initial_state_source=state, initial_state_indices=idx,
        use_qk_l2norm_in_kernel=True, cu_seqlens=torch.arange(N + 1, device=device),
        disable_state_update=disable_state_update)
    assert o.shape == v.shape
    valid = idx.cpu() >= 0
    assert_close(o.reshape(N, 4, 64)[valid], o_ref[valid], TOL_OUT[torch.bfloat16], "output")
    if disable_state_update:
        assert torch.equal(state, t["state"])
    else:
        assert_close(state.transpose(-1, -2), s_ref, 1e-5, "pool")
    with pytest.raises(NotImplementedError, match="lower_bound"):
        sglang.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], t["a"], t["dt_bias"], 1.0, 20.0, q, k, v, t["b"], state, idx, lower_bound=-5.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wrapper", ["sglang", "vllm"])
def test_one_token_rows_batch_major_with_cu_seqlens(device, wrapper):
    """SGLang's Qwen3.5 decode: q/k/v [N, 1, H, D] together with cu_seqlens [0, 1, ..., N]."""
    N = 4
    t = vllm_inputs(device, N=N, H=2, HV=4, K=64, V=64, slots=7, seed=12)
    idx = torch.tensor([6, 0, 3, 1], dtype=torch.int32, device=device)
    o_ref, s_ref = vllm_reference(t, idx, l2=True)
    state = t["state"].clone()
    cu = torch.arange(N + 1, dtype=torch.int32, device=device)
    if wrapper == "sglang":
        o = sglang.fused_sigmoid_gating_delta_rule_update(
            A_log=t["A_log"], a=t["a"], dt_bias=t["dt_bias"], softplus_beta=1.0,
            softplus_threshold=20.0, q=t["q"], k=t["k"], v=t["v"], b=t["b"],
            initial_state_source=state, initial_state_indices=idx, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu)
    else:
        o, _ = vllm.fused_sigmoid_gating_delta_rule_update(
            A_log=t["A_log"], a=t["a"], b=t["b"], dt_bias=t["dt_bias"], q=t["q"], k=t["k"],
            v=t["v"], initial_state=state, inplace_final_state=True, cu_seqlens=cu,
            ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    assert o.shape == t["v"].shape
    assert_close(o.reshape(N, 4, 64), o_ref, TOL_OUT[torch.bfloat16], "output")
    assert_close(state.transpose(-1, -2), s_ref, 1e-5, "pool")


_BAD_CU = [0, 2, 2, 3]  # three rows, but row 0 holds two tokens and row 1 none


def test_cu_seqlens_not_one_token_per_row_refused_on_cpu():
    t = vllm_inputs("cpu", N=3, H=2, HV=4, K=64, V=64, slots=4, seed=13)
    state = t["state"].clone()
    q, k, v = (t[n].transpose(0, 1) for n in ("q", "k", "v"))  # [1, 3, H, D]
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        sglang.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], t["a"], t["dt_bias"], 1.0, 20.0, q, k, v, t["b"], state,
            torch.tensor([0, 1, 2], dtype=torch.int32), cu_seqlens=torch.tensor(_BAD_CU))
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        fla.fused_recurrent_gated_delta_rule(q, k, v, g=t["a"].float().unsqueeze(0).sigmoid().log(),
                                             beta=t["b"].unsqueeze(0), cu_seqlens=torch.tensor(_BAD_CU))
    # several tokens: a row longer than its slots (3 tokens, T = 2)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        vllm.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], t["a"], t["b"], t["dt_bias"], q, k, v, initial_state=state,
            cu_seqlens=torch.tensor([0, 3, 3]), ssm_state_indices=table)
    assert torch.equal(state, t["state"]), "a refused call wrote the pool"


@cuda_only
def test_cu_seqlens_not_one_token_per_row_fails_on_gpu():
    """On a GPU the check is torch's asynchronous assert: no host sync on the call, the error
    at the next synchronization. A device-side assert ends the CUDA context, so it runs in a
    process of its own."""
    code = f"""
import torch
from gdnkit.torch import vllm
N, H, HV, K = 3, 2, 4, 64
d = "cuda"
q = torch.randn(1, N, H, K, device=d, dtype=torch.bfloat16)
v = torch.randn(1, N, HV, K, device=d, dtype=torch.bfloat16)
a = torch.randn(N, HV, device=d, dtype=torch.bfloat16)
state = torch.randn(4, HV, K, K, device=d)
vllm.fused_sigmoid_gating_delta_rule_update(torch.zeros(HV, device=d), a, a, torch.zeros(HV, device=d),
    q, q, v, initial_state=state, cu_seqlens=torch.tensor({_BAD_CU}, device=d),
    ssm_state_indices=torch.arange(N, device=d, dtype=torch.int32))
torch.cuda.synchronize()
print("NOT REFUSED")
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode != 0 and "NOT REFUSED" not in r.stdout, r.stdout + r.stderr[-2000:]
    assert "assert" in r.stderr.lower(), r.stderr[-2000:]


# ---- FLA --------------------------------------------------------------------------------

def fla_inputs(device, B, T, H, HV, K, V, seed, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t = dict(q=r(B, T, H, K).to(dtype), k=r(B, T, H, K).to(dtype), v=r(B, T, HV, V).to(dtype),
             g=F.logsigmoid(torch.rand(B, T, HV, generator=gen)).to(dtype),
             beta=torch.rand(B, T, HV, generator=gen).sigmoid().to(dtype),
             h0=0.5 * r(B, HV, K, V))
    return {n: x.to(device) for n, x in t.items()}


def fla_reference(t, l2):
    """Token by token (FLA's recurrence), float64."""
    B, T, H, K = t["q"].shape
    S = t["h0"].double()
    outs = []
    for s in range(T):
        o, S = reference(t["q"][:, s], t["k"][:, s], t["v"][:, s], t["g"][:, s], t["beta"][:, s],
                         None, None, S, gate="precomputed", l2="rsqrt" if l2 else "none")
        outs.append(o)
    return torch.stack(outs, 1), S


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("output_final_state", [True, False])
def test_fla(device, T, output_final_state):
    t = fla_inputs(device, B=2, T=T, H=2, HV=4, K=64, V=128, seed=T)
    o_ref, s_ref = fla_reference(t, l2=True)
    h0 = t["h0"].clone()
    o, final = fla.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], initial_state=h0,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=True)
    assert torch.equal(h0, t["h0"]), "initial_state must not be modified"
    assert o.shape == t["v"].shape and o.dtype == t["v"].dtype
    assert_close(o, o_ref, TOL_OUT[torch.bfloat16], "output")
    if output_final_state:
        assert final.dtype == torch.float32 and final.shape == t["h0"].shape
        assert_close(final, s_ref, 1e-5, "final_state")
    else:
        assert final is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 3])
def test_fla_per_channel_beta(device, T):
    """beta [B, T, HV, V], one a column, as FLA takes it."""
    t = fla_inputs(device, B=2, T=T, H=2, HV=4, K=64, V=128, seed=20 + T)
    gen = torch.Generator().manual_seed(21)
    t["beta"] = torch.rand(2, T, 4, 128, generator=gen).to(torch.bfloat16).to(device)
    o_ref, s_ref = fla_reference(t, l2=True)
    o, final = fla.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], initial_state=t["h0"].clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(o, o_ref, TOL_OUT[torch.bfloat16], "output")
    assert_close(final, s_ref, 1e-5, "final_state")


def test_per_channel_beta_needs_precomputed_gates():
    """b [B, Hv, Dv] with raw gates is refused, naming b, and nothing is written."""
    t = vllm_inputs("cpu", N=2, H=1, HV=2, K=64, V=64, slots=2, seed=3)
    state = t["state"].clone()
    b = torch.rand(2, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="b: .*per channel.*precomputed"):
        gt.decode(t["q"].reshape(2, 1, 64), t["k"].reshape(2, 1, 64), t["v"].reshape(2, 2, 64), t["a"], b,
                  A_log=t["A_log"], dt_bias=t["dt_bias"], state=state)
    assert torch.equal(state, t["state"])


@pytest.mark.parametrize("device", DEVICES)
def test_fla_varlen_no_initial_state(device):
    N = 3
    t = fla_inputs(device, B=N, T=1, H=1, HV=2, K=64, V=64, seed=21)
    t["h0"] = torch.zeros_like(t["h0"])
    o_ref, s_ref = fla_reference(t, l2=False)
    flat = {n: t[n].transpose(0, 1) for n in ("q", "k", "v", "g", "beta")}  # [1, N, ...]
    o, final = fla.fused_recurrent_gated_delta_rule(
        flat["q"], flat["k"], flat["v"], g=flat["g"], beta=flat["beta"], output_final_state=True,
        cu_seqlens=torch.arange(N + 1, device=device))
    assert_close(o.transpose(0, 1), o_ref, TOL_OUT[torch.bfloat16], "output")
    assert_close(final, s_ref, 1e-5, "final_state")
    with pytest.raises(NotImplementedError, match="gk"):
        fla.fused_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], gk=t["q"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qk_dtype,v_dtype", [(torch.float32, torch.float16),
                                              (torch.float16, torch.float32),
                                              (torch.bfloat16, torch.float16)])
def test_fla_mixed_input_dtypes(device, qk_dtype, v_dtype):
    """FLA's float16 cases pass q and k in float32 and v in float16: accepted, output in q's dtype."""
    t = fla_inputs(device, B=3, T=1, H=2, HV=4, K=64, V=64, seed=23, dtype=torch.float32)
    t["q"], t["k"], t["v"] = t["q"].to(qk_dtype), t["k"].to(qk_dtype), t["v"].to(v_dtype)
    o_ref, s_ref = fla_reference(t, l2=True)
    o, final = fla.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], initial_state=t["h0"],
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert o.dtype == qk_dtype and o.shape == t["v"].shape
    # the upcast is exact: only the output's own rounding is left
    assert_close(o, o_ref, TOL_OUT[qk_dtype], "output")
    assert_close(final, s_ref, 1e-5, "final_state")


# ---- CUDA graphs ------------------------------------------------------------------------

@cuda_only
def test_cuda_graph_drop_in_wrappers():
    """The ExecuTorch (both variants), vLLM and FLA wrappers inside one captured graph."""
    args = executorch_inputs("cuda", 1, 2, 4, 128, 128, torch.bfloat16, 7)
    vt = vllm_inputs("cuda", N=2, H=2, HV=4, K=128, V=128, slots=4, seed=7)
    idx = torch.tensor([3, -1], dtype=torch.int32, device="cuda")
    ft = fla_inputs("cuda", B=2, T=1, H=2, HV=4, K=128, V=128, seed=7)

    def step(et_state, pool):
        out_a, new_state = executorch.fused_deltanet_decode(*args[:5], et_state)
        out_b = executorch.fused_deltanet_decode_(*args[:5], et_state)
        o_v, _ = vllm.fused_sigmoid_gating_delta_rule_update(
            vt["A_log"], vt["a"], vt["b"], vt["dt_bias"], vt["q"], vt["k"], vt["v"],
            initial_state=pool, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
        o_f, final = fla.fused_recurrent_gated_delta_rule(
            ft["q"], ft["k"], ft["v"], g=ft["g"], beta=ft["beta"], initial_state=ft["h0"],
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        return out_a, new_state, out_b, o_v, o_f, final

    eager_et, eager_pool = args[5].clone(), vt["state"].clone()
    graph_et, graph_pool = args[5].clone(), vt["state"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(args[5].clone(), vt["state"].clone())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_out = step(graph_et, graph_pool)
    for _ in range(2):
        g.replay()
        eager_out = step(eager_et, eager_pool)
        torch.cuda.synchronize()
        for x, y in zip(graph_out, eager_out):
            assert_same(x, y)
        assert_same(graph_et, eager_et)
        assert_same(graph_pool, eager_pool)


# ---- several tokens a sequence: one gdnkit call ----------------------------------------------
#
# Each drop-in's multi-token path is one gdnkit call; these check it bitwise against the
# same tokens run as the drop-in's own one-token calls, chained through the state (gdnkit
# rounds the state to its dtype after every token, as a store and a reload would), and
# against a float64 token loop.

def token_loop(q, k, v, a, b, A_log, dt_bias, pool_kv, rows, state_dtype, *, gate="raw", l2=True):
    """float64 reference of several tokens a row: rows[n] = (read slot or None for a zero
    state, [token positions]); q [tokens, H, K] etc., pool_kv [S, HV, K, V]. Returns (o
    [tokens, HV, V] (zero where no row's token), {(n, t): state [HV, K, V] as stored})."""
    HV, V = v.shape[-2:]
    o_ref = torch.zeros(q.shape[0], HV, V, dtype=torch.float64)
    states = {}
    for n, (slot, tokens) in enumerate(rows):
        if slot is not None and slot < 0:
            continue
        S = (pool_kv[slot].double() if slot is not None
             else torch.zeros(HV, k.shape[-1], V, dtype=torch.float64))[None]
        for j, tok in enumerate(tokens):
            o, S = reference(q[tok:tok + 1], k[tok:tok + 1], v[tok:tok + 1], a[tok:tok + 1],
                             b[tok:tok + 1], A_log, dt_bias, S, gate=gate,
                             l2="rsqrt" if l2 else "none")
            o_ref[tok] = o[0]
            S = S.to(state_dtype).double()
            states[n, j] = S[0]
    return o_ref, states


def spec_inputs(device, *, N, T, lengths=None, H=2, HV=4, K=64, V=64, slots, seed,
                dtype=torch.bfloat16, state_dtype=torch.float32):
    """vLLM/SGLang spec-decode inputs: q, k, v [N, T, ...] (or [1, total, ...] with lengths),
    a, b [tokens, HV], a [slots, HV, V, K] pool."""
    total = N * T if lengths is None else sum(lengths)
    t = vllm_inputs("cpu", N=total, H=H, HV=HV, K=K, V=V, slots=slots, seed=seed, dtype=dtype,
                    state_dtype=state_dtype)
    lead = (N, T) if lengths is None else (1, total)
    for n in ("q", "k", "v"):
        t[n] = t[n].reshape(*lead, *t[n].shape[2:])
    t["cu"] = None if lengths is None else \
        torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    t["lengths"] = [T] * N if lengths is None else list(lengths)
    t["starts"] = [n * T for n in range(N)] if lengths is None else t["cu"][:-1].tolist()
    return {n: x.to(device) if torch.is_tensor(x) else x for n, x in t.items()}


def flat_tokens(t):
    """q, k, v as [tokens, H, D] (CPU)."""
    return [t[n].reshape(-1, *t[n].shape[-2:]).cpu() for n in ("q", "k", "v")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("wrapper", ["sigmoid_gating", "recurrent"])
def test_vllm_spec_decode_out_of_place(device, varlen, wrapper):
    """inplace_final_state=False with several tokens: the pool untouched, final_state
    [tokens, HV, V, K] holding the state after every token at its position, bitwise the
    states the in-place call stores in the per-token slots; outputs bitwise the in-place
    call's."""
    N, T = 3, 3
    lengths = [2, 3, 1] if varlen else None
    slots = 2 * N * T
    t = spec_inputs(device, N=N, T=T, lengths=lengths, slots=slots, seed=21)
    gen = torch.Generator().manual_seed(22)
    table = torch.randperm(slots, generator=gen)[:N * T].reshape(N, T).to(torch.int32).to(device)
    table[1, 0] = -1  # row 1's first token stored nowhere (it reads column acc - 1 = 1)
    acc = torch.tensor([1, 2, 1], dtype=torch.int32, device=device)
    if wrapper == "sigmoid_gating":
        gates = dict(A_log=t["A_log"], a=t["a"], b=t["b"], dt_bias=t["dt_bias"])
        call = vllm.fused_sigmoid_gating_delta_rule_update
    else:
        g = -torch.exp(t["A_log"]) * F.softplus(t["a"].float() + t["dt_bias"])
        gates = dict(g=g, beta=torch.sigmoid(t["b"].float()))
        call = vllm.fused_recurrent_gated_delta_rule
    kw = dict(q=t["q"], k=t["k"], v=t["v"], cu_seqlens=t["cu"], ssm_state_indices=table,
              num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True, **gates)
    pool_in = t["state"].clone()
    o_in, ret = call(initial_state=pool_in, inplace_final_state=True, **kw)
    assert ret is pool_in
    pool = t["state"].clone()
    o_out, final = call(initial_state=pool, inplace_final_state=False, **kw)
    assert torch.equal(pool, t["state"]), "out of place wrote the pool"
    total = sum(t["lengths"])
    assert final.shape == (total, 4, 64, 64) and final.dtype == pool.dtype
    assert torch.equal(o_out, o_in)
    for n in range(N):
        for j in range(t["lengths"][n]):
            if table[n, j] >= 0:
                assert torch.equal(final[t["starts"][n] + j], pool_in[int(table[n, j])]), (n, j)
    # against float64 (the in-place call's states: the same bits)
    q, k, v = flat_tokens(t)
    rows = [(int(table[n, int(acc[n]) - 1]),
             list(range(t["starts"][n], t["starts"][n] + t["lengths"][n]))) for n in range(N)]
    o_ref, states = token_loop(q, k, v, t["a"].cpu(), t["b"].cpu(), t["A_log"].cpu(),
                               t["dt_bias"].cpu(), t["state"].cpu().transpose(-1, -2), rows,
                               torch.float32)
    tol = TOL_OUT[torch.bfloat16] if wrapper == "sigmoid_gating" else 2e-2
    assert_close(o_out.reshape(-1, 4, 64), o_ref, tol, "output")
    for (n, j), s in states.items():
        assert_close(final[t["starts"][n] + j].transpose(-1, -2), s, 1e-4, f"state {n}, {j}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("table", ["none", "1-D"])
@pytest.mark.parametrize("wrapper", ["sigmoid_gating", "recurrent"])
def test_vllm_several_tokens_one_slot_a_sequence(device, table, wrapper):
    """Dense [N, T] tokens in place with one slot a sequence (no table: slot n; a 1-D table
    with a padding row): the state after the row's last token back to its slot, bitwise T
    one-token calls in place; a padding row's outputs zero, and no other slot written."""
    N, T, slots = 3, 4, 5
    t = spec_inputs(device, N=N, T=T, slots=slots, seed=27)
    idx = None if table == "none" else torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    a, b = t["a"].reshape(N, T, -1), t["b"].reshape(N, T, -1)
    A = -torch.exp(t["A_log"])
    g = A * F.softplus(a + t["dt_bias"])
    beta = torch.sigmoid(b)

    def call(pool, x, j=None):
        sl = slice(None) if j is None else slice(j, j + 1)
        q, k, v = (t[n][:, sl] for n in ("q", "k", "v"))
        if wrapper == "sigmoid_gating":
            return vllm.fused_sigmoid_gating_delta_rule_update(
                t["A_log"], a[:, sl], b[:, sl], t["dt_bias"], q, k, v, initial_state=pool,
                ssm_state_indices=x, use_qk_l2norm_in_kernel=True)[0]
        return vllm.fused_recurrent_gated_delta_rule(
            q, k, v, g[:, sl], beta[:, sl], initial_state=pool, inplace_final_state=True,
            ssm_state_indices=x, use_qk_l2norm_in_kernel=True)[0]

    pool = t["state"].clone()
    o = call(pool, idx)
    assert o.shape == (N, T, 4, 64)
    chained = t["state"].clone()
    for j in range(T):
        assert torch.equal(o[:, j:j + 1], call(chained, idx, j)), f"token {j}"
    assert torch.equal(pool, chained)
    if idx is not None:
        assert not o[1].any(), "padding row"
        kept = torch.tensor([0, 2, 3], device=device)  # slots no row reads
        assert torch.equal(pool[kept], t["state"][kept])
        assert not torch.equal(pool[4], t["state"][4]) and not torch.equal(pool[1], t["state"][1])
        if wrapper == "sigmoid_gating":  # out of place: every token's state at its position
            o_new, final = vllm.fused_sigmoid_gating_delta_rule_update(
                t["A_log"], a, b, t["dt_bias"], t["q"], t["k"], t["v"], initial_state=t["state"],
                inplace_final_state=False, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
            assert torch.equal(o_new, o) and final.shape == (N * T, 4, 64, 64)
            assert torch.equal(final[T - 1], pool[4]) and torch.equal(final[3 * T - 1], pool[1])
    else:
        assert torch.equal(pool[N:], t["state"][N:])
        assert not torch.equal(pool[:N], t["state"][:N])


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_spec_decode_out_of_place_without_table(device):
    """Out of place without ssm_state_indices: row n starts from slot n (or from zeros
    without initial_state); bitwise one-token out-of-place calls chained by hand."""
    N, T = 2, 3
    t = spec_inputs(device, N=N, T=T, slots=N, seed=23)
    for initial in (t["state"], None):
        o, final = vllm.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"],
            initial_state=None if initial is None else initial.clone(), inplace_final_state=False,
            use_qk_l2norm_in_kernel=True)
        assert final.shape == (N * T, 4, 64, 64)
        state = torch.zeros_like(t["state"]) if initial is None else initial.clone()
        a, b = t["a"].reshape(N, T, -1), t["b"].reshape(N, T, -1)
        for j in range(T):
            o_j, state = vllm.fused_sigmoid_gating_delta_rule_update(
                t["A_log"], a[:, j], b[:, j], t["dt_bias"], t["q"][:, j:j + 1],
                t["k"][:, j:j + 1], t["v"][:, j:j + 1], initial_state=state,
                inplace_final_state=False, use_qk_l2norm_in_kernel=True)
            assert torch.equal(o[:, j], o_j[:, 0]), j
            assert torch.equal(final.reshape(N, T, 4, 64, 64)[:, j], state), j


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_spec_decode_null_block_and_kv_pool(device):
    """null_block_id=0 marks padding in the per-token table (slot 0 never touched), with a
    [slots, HV, K, V] pool: bitwise the same call with -1 entries."""
    N, T = 3, 2
    t = spec_inputs(device, N=N, T=T, slots=8, seed=24)
    pool_kv = t["state"].transpose(-1, -2).contiguous()
    table = torch.tensor([[3, 4], [0, 0], [5, 0]], dtype=torch.int32, device=device)
    args = (t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"])
    p1, p2 = pool_kv.clone(), pool_kv.clone()
    o1, _ = vllm.fused_sigmoid_gating_delta_rule_update(
        *args, initial_state=p1, ssm_state_indices=table, use_qk_l2norm_in_kernel=True,
        state_layout="kv", null_block_id=0)
    o2, _ = vllm.fused_sigmoid_gating_delta_rule_update(
        *args, initial_state=p2, ssm_state_indices=torch.where(table == 0, -1, table),
        use_qk_l2norm_in_kernel=True, state_layout="kv")
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
    assert not o1[1].any() and torch.equal(p1[0], pool_kv[0])
    assert not torch.equal(p1[5], pool_kv[5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wrapper", ["sigmoid_gating", "recurrent"])
def test_vllm_uncut_inputs_as_vllm_passes_them(device, wrapper):
    """What vLLM's callers pass uncut, read as vLLM's kernels read it: index tables with rows
    past the sequences (the decodes of a mixed batch with the whole table; a padded table in
    the CUDA-graph spec path), gates for more tokens than q holds (the spec path passes every
    scheduled token's), q padded past cu_seqlens[-1]. Each gives the bits of the same call on
    the cut inputs, and touches nothing else. num_accepted_tokens = 0 (or above T) makes its
    sequence padding, as vLLM's current kernels do: zero outputs, none of its slots touched."""
    lengths = [2, 3, 1]
    t = spec_inputs(device, N=3, T=3, lengths=lengths, slots=20, seed=61)
    total, N, T, HV = sum(lengths), 3, 3, t["v"].shape[-2]
    # every gate tensor passed is a prefix of these (precomputed once: torch's vectorized
    # softplus may round a tensor's tail differently from a longer one's)
    extra = torch.randn(4, HV, generator=torch.Generator().manual_seed(62)).to(t["a"].dtype)
    a_all, b_all = torch.cat([t["a"], extra.to(device)]), torch.cat([t["b"], extra.to(device)])
    g_all = -torch.exp(t["A_log"]) * F.softplus(a_all.float() + t["dt_bias"])
    beta_all = torch.sigmoid(b_all.float())

    def call(q, k, v, n_gates, state, **kw):
        if wrapper == "sigmoid_gating":
            return vllm.fused_sigmoid_gating_delta_rule_update(
                t["A_log"], a_all[:n_gates], b_all[:n_gates], t["dt_bias"], q, k, v,
                initial_state=state, use_qk_l2norm_in_kernel=True, **kw)
        return vllm.fused_recurrent_gated_delta_rule(
            q, k, v, g_all[None, :n_gates], beta_all[None, :n_gates], initial_state=state,
            use_qk_l2norm_in_kernel=True, **kw)

    def both(cut, uncut):
        pools = [t["state"].clone(), t["state"].clone()]
        o_cut, _ = cut(pools[0])
        o_uncut, _ = uncut(pools[1])
        assert torch.equal(o_uncut[:, :o_cut.shape[1]], o_cut)
        assert torch.equal(pools[1], pools[0]) and not torch.equal(pools[0], t["state"])

    q, k, v, cu = t["q"], t["k"], t["v"], t["cu"]
    table = torch.arange(N * T, dtype=torch.int32, device=device).reshape(N, T) + 2
    padded_table = torch.cat([table, torch.full((2, T), -1, dtype=torch.int32, device=device)])
    acc = torch.tensor([2, 1, 3], dtype=torch.int32, device=device)
    padded_acc = torch.cat([acc, torch.ones(2, dtype=torch.int32, device=device)])
    # spec decode: padded table and counts, gates past q's tokens, q padded past the rows
    pad_q = lambda x: torch.cat([x, x[:, :2]], 1)  # noqa: E731
    both(lambda s: call(q, k, v, total, s, cu_seqlens=cu, ssm_state_indices=table,
                        num_accepted_tokens=acc),
         lambda s: call(pad_q(q), pad_q(k), pad_q(v), total + 4, s, cu_seqlens=cu,
                        ssm_state_indices=padded_table, num_accepted_tokens=padded_acc))
    # num_accepted_tokens 0 or above T: that sequence is padding, the others run as before
    for bad in (0, T + 1):
        pool_ref, pool = t["state"].clone(), t["state"].clone()
        o_ref, _ = call(q, k, v, total, pool_ref, cu_seqlens=cu, ssm_state_indices=table,
                        num_accepted_tokens=acc)
        o, _ = call(q, k, v, total, pool, cu_seqlens=cu, ssm_state_indices=table,
                    num_accepted_tokens=torch.tensor([2, bad, 3], dtype=torch.int32, device=device))
        first, last = int(cu[1]), int(cu[2])  # sequence 1's tokens
        assert not o[:, first:last].any()
        assert torch.equal(o[:, :first], o_ref[:, :first]) and torch.equal(o[:, last:], o_ref[:, last:])
        assert torch.equal(pool[table[1].long()], t["state"][table[1].long()])
        others = torch.cat([table[0], table[2]]).long()
        assert torch.equal(pool[others], pool_ref[others])
    # decodes of a mixed batch: one token a sequence, the whole 1-D table, q padded or not
    dec = torch.arange(N + 1, dtype=torch.int32, device=device)
    slots = torch.tensor([7, -1, 4, 11, 12], dtype=torch.int32, device=device)
    q1, k1, v1 = q[:, :N], k[:, :N], v[:, :N]
    for padded in (False, True):
        pq = pad_q if padded else (lambda x: x)  # noqa: E731
        both(lambda s: call(q1, k1, v1, N, s, cu_seqlens=dec, ssm_state_indices=slots[:N]),
             lambda s: call(pq(q1), pq(k1), pq(v1), N + 2 if padded else N, s, cu_seqlens=dec,
                            ssm_state_indices=slots))


@pytest.mark.parametrize("null_block", [None, 0])
def test_vllm_null_block_follows_the_installed_vllm(monkeypatch, null_block):
    """null_block_id's default is the installed vLLM's NULL_BLOCK_ID: where vLLM reserves slot
    0 (current releases: slots <= 0 are skipped), a row on slot 0 is padding (zero output, slot
    0 untouched); where vLLM defines none (or is absent), slot 0 is an ordinary slot. An
    explicit null_block_id wins either way."""
    import types
    names = ["vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends",
             "vllm.v1.attention.backends.utils"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    if null_block is not None:
        sys.modules[names[-1]].NULL_BLOCK_ID = null_block
    monkeypatch.setattr(vllm, "_vllm_null_block", [])
    t = spec_inputs("cpu", N=3, T=1, lengths=None, slots=6, seed=71)
    slots = torch.tensor([2, 0, 4], dtype=torch.int32)
    gen = torch.Generator().manual_seed(72)
    g = -torch.rand(3, 1, t["v"].shape[-2], generator=gen)
    beta = torch.rand(3, 1, t["v"].shape[-2], generator=gen)

    def run(**kw):
        pool = t["state"].clone()
        o, _ = vllm.fused_recurrent_gated_delta_rule(
            t["q"], t["k"], t["v"], g, beta, initial_state=pool, ssm_state_indices=slots,
            use_qk_l2norm_in_kernel=True, **kw)
        return o, pool

    # the first call traced by torch.compile (fullgraph): the default is read then, as a constant
    # of the graph (one value a process: the reset forgets the other parametrization's graph)
    torch._dynamo.reset()
    pool_compiled = t["state"].clone()
    o_compiled = torch.compile(lambda p: vllm.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], g, beta, initial_state=p, ssm_state_indices=slots,
        use_qk_l2norm_in_kernel=True)[0], backend="aot_eager", fullgraph=True)(pool_compiled)
    o, pool = run()
    assert vllm.installed_null_block_id() == null_block
    assert torch.equal(o_compiled, o) and torch.equal(pool_compiled, pool)
    o_none, pool_none = run(null_block_id=None)
    o_zero, pool_zero = run(null_block_id=0)
    assert not torch.equal(pool_none[0], t["state"][0]) and o_none[1].any()  # slot 0 stepped
    assert torch.equal(pool_zero[0], t["state"][0]) and not o_zero[1].any()  # slot 0 is padding
    expected_o, expected_pool = (o_none, pool_none) if null_block is None else (o_zero, pool_zero)
    assert torch.equal(o, expected_o) and torch.equal(pool, expected_pool)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wrapper", ["sigmoid_gating", "recurrent"])
@pytest.mark.parametrize("spec", [False, True])
def test_vllm_dual_index(device, wrapper, spec):
    """vLLM's ssm_state_indices_output: the state read through ssm_state_indices and written
    through the output table (a double-buffered pool). The read slots stay as they were,
    the write slots hold bitwise what the in-place call left in the read slots, the output
    is the in-place call's; None is in place; a column-strided table reads as its copy."""
    lengths = [3, 3] if spec else [1, 1, 1]
    N = len(lengths)
    T = lengths[0]
    t = spec_inputs(device, N=N, T=T, lengths=lengths, slots=24, seed=71)
    g_all = -torch.exp(t["A_log"]) * F.softplus(t["a"].float() + t["dt_bias"])
    beta_all = torch.sigmoid(t["b"].float())
    perm = torch.randperm(23, generator=torch.Generator().manual_seed(72)).to(torch.int32) + 1
    read = perm[:N * T].reshape(N, T).to(device) if spec else perm[:N].to(device)
    write = perm[N * T:2 * N * T].reshape(N, T).to(device) if spec else perm[N:2 * N].to(device)
    acc = torch.tensor([2, 3], dtype=torch.int32, device=device) if spec else None

    def call(state, in_idx, out_idx):
        kw = dict(initial_state=state, inplace_final_state=True, ssm_state_indices=in_idx,
                  ssm_state_indices_output=out_idx, num_accepted_tokens=acc, cu_seqlens=t["cu"],
                  use_qk_l2norm_in_kernel=True)
        if wrapper == "sigmoid_gating":
            return vllm.fused_sigmoid_gating_delta_rule_update(
                t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"], **kw)[0]
        return vllm.fused_recurrent_gated_delta_rule(
            t["q"], t["k"], t["v"], g_all[None], beta_all[None], **kw)[0]

    ref = t["state"].clone()
    o_ref = call(ref, read, None)
    dual = t["state"].clone()
    o_dual = call(dual, read, write)
    assert torch.equal(o_dual, o_ref)
    r, w = read.reshape(-1).long(), write.reshape(-1).long()
    assert torch.equal(dual[r], t["state"][r]), "read slots untouched"
    assert torch.equal(dual[w], ref[r]), "write slots hold the in-place result"
    others = torch.ones(24, dtype=torch.bool, device=device)
    others[r], others[w] = False, False
    assert torch.equal(dual[others], t["state"][others])
    same = t["state"].clone()
    assert torch.equal(call(same, read, read), o_ref) and torch.equal(same, ref), "output = input"
    if spec:
        strided = t["state"].clone()
        o_strided = call(strided, read.t().contiguous().t(), write.t().contiguous().t())
        assert torch.equal(o_strided, o_dual) and torch.equal(strided, dual)


def test_vllm_several_tokens_refused_nothing_written():
    t = spec_inputs("cpu", N=2, T=2, slots=6, seed=25)
    pool = t["state"].clone()
    args = (t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"])
    with pytest.raises(NotImplementedError, match="num_accepted_tokens"):  # with a 1-D table
        vllm.fused_sigmoid_gating_delta_rule_update(
            *args, initial_state=pool, ssm_state_indices=torch.tensor([0, 1], dtype=torch.int32),
            num_accepted_tokens=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="does not fit ssm_state_indices"):
        vllm.fused_sigmoid_gating_delta_rule_update(
            *args, initial_state=pool, ssm_state_indices=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        vllm.fused_sigmoid_gating_delta_rule_update(
            *args, initial_state=pool, cu_seqlens=torch.tensor([0, 2, 4]),
            ssm_state_indices=torch.arange(4, dtype=torch.int32).reshape(2, 2))
    # two rows writing one slot: the host backend's one-writer rule
    with pytest.raises(ValueError, match="both write slot 1"):
        vllm.fused_sigmoid_gating_delta_rule_update(
            *args, initial_state=pool, ssm_state_indices=torch.tensor([[0, 1], [2, 1]],
                                                                      dtype=torch.int32))
    assert torch.equal(pool, t["state"])


# ---- SGLang: target verify ---------------------------------------------------------------

def sglang_chained(t, idx, *, disable, buffer, cache_idx, steps):
    """Target verify as one-token SGLang calls chained through a scratch copy of the pool:
    token t of every row that has one in the t-th call (the others padding), its state
    read back from the scratch pool into the cache block. Returns (o, pool, buffer)."""
    N = len(t["lengths"])
    T = max(t["lengths"])
    scratch = t["state"].clone()
    pool = t["state"].clone()
    cache = None if buffer is None else buffer.clone()
    blocks = None if cache is None else cache.view(-1, *scratch.shape[1:])
    o = torch.zeros_like(t["v"].reshape(-1, *t["v"].shape[-2:]))
    q, k, v = (t[n].reshape(-1, *t[n].shape[-2:]) for n in ("q", "k", "v"))
    for j in range(T):
        active = [j < t["lengths"][n] and idx[n] >= 0 for n in range(N)]
        if not any(active):
            continue
        rows = torch.tensor([t["starts"][n] + min(j, t["lengths"][n] - 1) for n in range(N)],
                            device=q.device)
        one = torch.tensor([int(idx[n]) if active[n] else -1 for n in range(N)],
                           dtype=torch.int32, device=q.device)
        o_j = sglang.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], t["a"].index_select(0, rows), t["dt_bias"], 1.0, 20.0,
            q.index_select(0, rows)[:, None], k.index_select(0, rows)[:, None],
            v.index_select(0, rows)[:, None], t["b"].index_select(0, rows), scratch, one,
            use_qk_l2norm_in_kernel=True)
        for n in range(N):
            if active[n]:
                o[t["starts"][n] + j] = o_j[n, 0]
                if blocks is not None and cache_idx[n] >= 0:
                    blocks[int(cache_idx[n]) * steps + j] = scratch[int(idx[n])].to(blocks.dtype)
    if not disable:
        pool = scratch
    return o.reshape(t["v"].shape), pool, cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("cache", ["indices", "direct", None])
@pytest.mark.parametrize("disable_state_update", [True, False])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_sglang_target_verify(device, varlen, cache, disable_state_update, state_dtype):
    """Target verify (several tokens a sequence) with SGLang's intermediate state cache,
    addressed by intermediate_state_indices (scattered from scratch) or row by row
    (written in place): bitwise the chained one-token calls, against float64 too."""
    N, T, steps = 4, 3, 4
    lengths = [3, 1, 2, 3] if varlen else None
    t = spec_inputs(device, N=N, T=T, lengths=lengths, slots=7, seed=26, state_dtype=state_dtype)
    idx = torch.tensor([5, -1, 0, 3], dtype=torch.int32, device=device)
    buffer = cache_idx = None
    if cache is not None:
        gen = torch.Generator().manual_seed(27)
        buffer = torch.randn(N + 2, steps, 4, 64, 64, generator=gen).to(state_dtype).to(device)
        cache_idx = (torch.tensor([2, 0, -1, 5], dtype=torch.int32, device=device)
                     if cache == "indices" else None)
    pool = t["state"].clone()
    cached = None if buffer is None else buffer.clone()
    o = sglang.fused_sigmoid_gating_delta_rule_update(
        t["A_log"], t["a"], t["dt_bias"], 1.0, 20.0, t["q"], t["k"], t["v"], t["b"], pool, idx,
        use_qk_l2norm_in_kernel=True, cu_seqlens=t["cu"],
        disable_state_update=disable_state_update, intermediate_states_buffer=cached,
        intermediate_state_indices=cache_idx, cache_steps=steps if cache else None)
    assert o.shape == t["v"].shape
    rows_cache = (torch.arange(N, device=device) if cache == "direct" else cache_idx)
    o_c, pool_c, cache_c = sglang_chained(t, idx.tolist(), disable=disable_state_update,
                                          buffer=buffer, cache_idx=rows_cache, steps=steps)
    assert torch.equal(o, o_c), "output: not bitwise the chained one-token calls"
    assert torch.equal(pool, pool_c), "pool: not bitwise the chained one-token calls"
    if buffer is not None:
        assert torch.equal(cached, cache_c), "cache: not bitwise the chained one-token calls"
    if disable_state_update:
        assert torch.equal(pool, t["state"])
    q, k, v = flat_tokens(t)
    rows = [(int(idx[n]), list(range(t["starts"][n], t["starts"][n] + t["lengths"][n])))
            for n in range(N)]
    o_ref, _ = token_loop(q, k, v, t["a"].cpu(), t["b"].cpu(), t["A_log"].cpu(),
                          t["dt_bias"].cpu(), t["state"].cpu().transpose(-1, -2), rows,
                          state_dtype)
    assert_close(o.reshape(-1, 4, 64), o_ref, max(TOL_OUT[torch.bfloat16], TOL_STATE[state_dtype]),
                 "output")


@pytest.mark.parametrize("device", DEVICES)
def test_sglang_target_verify_without_pool(device):
    """initial_state_source=None: every sequence from a zero state, nothing kept but the
    cache; bitwise the same call on a zero pool with the pool update disabled."""
    N, T = 2, 3
    t = spec_inputs(device, N=N, T=T, slots=N, seed=28)
    buf1 = torch.zeros(N, T, 4, 64, 64, device=device)
    buf2 = torch.zeros_like(buf1)
    args = (t["A_log"], t["a"], t["dt_bias"], 1.0, 20.0, t["q"], t["k"], t["v"], t["b"])
    o1 = sglang.fused_sigmoid_gating_delta_rule_update(
        *args, None, None, use_qk_l2norm_in_kernel=True, intermediate_states_buffer=buf1,
        intermediate_state_indices=torch.arange(N, dtype=torch.int32, device=device),
        cache_steps=T)
    zero = torch.zeros_like(t["state"])
    o2 = sglang.fused_sigmoid_gating_delta_rule_update(
        *args, zero, torch.arange(N, dtype=torch.int32, device=device),
        use_qk_l2norm_in_kernel=True, disable_state_update=True,
        intermediate_states_buffer=buf2)
    assert torch.equal(o1, o2) and torch.equal(buf1, buf2) and not zero.any()
    assert buf1.any()


def test_sglang_target_verify_refused_nothing_written():
    t = spec_inputs("cpu", N=2, T=3, slots=3, seed=29)
    pool = t["state"].clone()
    buffer = torch.zeros(2, 2, 4, 64, 64)
    args = (t["A_log"], t["a"], t["dt_bias"], 1.0, 20.0, t["q"], t["k"], t["v"], t["b"], pool,
            torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_steps=2 is smaller"):
        sglang.fused_sigmoid_gating_delta_rule_update(*args, intermediate_states_buffer=buffer,
                                                      cache_steps=2)
    with pytest.raises(ValueError, match="must be contiguous"):
        sglang.fused_sigmoid_gating_delta_rule_update(
            *args, intermediate_states_buffer=torch.zeros(2, 3, 4, 64, 128)[..., ::2])
    with pytest.raises(NotImplementedError, match="retrieve_parent_token"):
        sglang.fused_sigmoid_gating_delta_rule_update(
            *args, retrieve_parent_token=torch.zeros(2, 3, dtype=torch.int64))
    assert torch.equal(pool, t["state"]) and not buffer.any()


# ---- FLA: several tokens, packed or dense --------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("output_final_state", [True, False])
@pytest.mark.parametrize("with_initial", [True, False])
def test_fla_varlen_several_tokens(device, output_final_state, with_initial):
    """cu_seqlens rows of 2, 0, 4 and 1 tokens in one call: bitwise each sequence's own
    dense call, and against FLA's recurrence in float64."""
    lengths = [2, 0, 4, 1]
    N, total = len(lengths), sum(lengths)
    t = fla_inputs(device, B=1, T=total, H=2, HV=4, K=64, V=64, seed=31)
    h0 = 0.5 * torch.randn(N, 4, 64, 64, generator=torch.Generator().manual_seed(32))
    h0 = h0.to(device)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=device)
    initial = h0.clone() if with_initial else None
    o, final = fla.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], initial_state=initial,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    assert o.shape == t["v"].shape
    if with_initial:
        assert torch.equal(initial, h0), "initial_state must not be modified"
    assert (final is not None) == output_final_state
    for n in range(N):
        lo, hi = int(cu[n]), int(cu[n + 1])
        start = h0[n:n + 1] if with_initial else torch.zeros_like(h0[:1])
        if hi == lo:
            if output_final_state:
                assert torch.equal(final[n], start[0])
            continue
        o_n, f_n = fla.fused_recurrent_gated_delta_rule(
            t["q"][:, lo:hi], t["k"][:, lo:hi], t["v"][:, lo:hi], g=t["g"][:, lo:hi],
            beta=t["beta"][:, lo:hi], initial_state=start, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        assert torch.equal(o[:, lo:hi], o_n), n
        if output_final_state:
            assert torch.equal(final[n], f_n[0]), n
        ref = {n2: t[n2][:, lo:hi] for n2 in ("q", "k", "v", "g", "beta")}
        o_ref, s_ref = fla_reference(dict(ref, h0=start), l2=True)
        assert_close(o_n, o_ref, TOL_OUT[torch.bfloat16], f"output of sequence {n}")
        assert_close(f_n, s_ref, 1e-5, f"final state of sequence {n}")


@pytest.mark.parametrize("device", DEVICES)
def test_fla_long_dense_rows_in_chunks(device):
    """T = 20 tokens a row (more than one gdnkit call carries): calls of 16 tokens chained
    through the float32 state, bitwise one-token calls chained by hand."""
    t = fla_inputs(device, B=2, T=20, H=1, HV=2, K=64, V=64, seed=33)
    o, final = fla.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], initial_state=t["h0"],
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    state = t["h0"]
    for j in range(20):
        o_j, state = fla.fused_recurrent_gated_delta_rule(
            t["q"][:, j:j + 1], t["k"][:, j:j + 1], t["v"][:, j:j + 1], g=t["g"][:, j:j + 1],
            beta=t["beta"][:, j:j + 1], initial_state=state, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        assert torch.equal(o[:, j:j + 1], o_j), j
    assert torch.equal(final, state)
    o_ref, s_ref = fla_reference(t, l2=True)
    assert_close(o, o_ref, TOL_OUT[torch.bfloat16], "output")
    assert_close(final, s_ref, 1e-5, "final_state")


def test_fla_varlen_rows_longer_than_a_call_refused():
    t = fla_inputs("cpu", B=1, T=20, H=1, HV=2, K=64, V=64, seed=34)
    kw = dict(g=t["g"], beta=t["beta"], use_qk_l2norm_in_kernel=True)
    with pytest.raises(NotImplementedError, match="at most 16 tokens"):  # 20 tokens, 1 sequence
        fla.fused_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], **kw,
                                             cu_seqlens=torch.tensor([0, 20]))
    with pytest.raises(RuntimeError, match="cu_seqlens"):  # a row of 17 in 2 sequences
        fla.fused_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], **kw,
                                             cu_seqlens=torch.tensor([0, 17, 20]))


# ---- compile and CUDA graphs with several tokens ---------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_spec_decode_dropins_compile(device):
    """vLLM's spec decode (packed rows, per-token slots) and SGLang's target verify (dense,
    intermediate cache) under torch.compile (fullgraph): the same as eager."""
    N, T = 2, 3
    t = spec_inputs(device, N=N, T=T, lengths=[3, 2], slots=8, seed=35)
    d = spec_inputs(device, N=N, T=T, slots=4, seed=36)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=device)
    acc = torch.tensor([1, 2], dtype=torch.int32, device=device)
    idx = torch.tensor([1, 3], dtype=torch.int32, device=device)

    def step(pool, pool2, cache):
        o1, _ = vllm.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"], initial_state=pool,
            cu_seqlens=t["cu"], ssm_state_indices=table, num_accepted_tokens=acc,
            use_qk_l2norm_in_kernel=True)
        o2 = sglang.fused_sigmoid_gating_delta_rule_update(
            d["A_log"], d["a"], d["dt_bias"], 1.0, 20.0, d["q"], d["k"], d["v"], d["b"], pool2,
            idx, use_qk_l2norm_in_kernel=True, disable_state_update=True,
            intermediate_states_buffer=cache, cache_steps=T)
        return o1 * 2, o2 * 2

    for backend in ("aot_eager",) + (("inductor",) if device == "cuda" else ()):
        torch._dynamo.reset()
        eager = (t["state"].clone(), d["state"].clone(), torch.zeros(N, T, 4, 64, 64, device=device))
        compiled = (t["state"].clone(), d["state"].clone(), torch.zeros(N, T, 4, 64, 64, device=device))
        fn = torch.compile(step, backend=backend, fullgraph=True)
        for x, y in zip(step(*eager), fn(*compiled)):
            assert torch.equal(x, y), backend
        for x, y in zip(eager, compiled):
            assert torch.equal(x, y), backend


@cuda_only
def test_cuda_graph_several_tokens_dropins():
    """vLLM spec decode, SGLang target verify and FLA varlen (several tokens each) captured
    in one CUDA graph and replayed against eager calls: bitwise."""
    N, T = 2, 3
    t = spec_inputs("cuda", N=N, T=T, lengths=[3, 2], K=128, V=128, slots=8, seed=37)
    d = spec_inputs("cuda", N=N, T=T, K=128, V=128, slots=4, seed=38)
    f = fla_inputs("cuda", B=1, T=5, H=2, HV=4, K=128, V=128, seed=39)
    f_h0 = fla_inputs("cuda", B=2, T=1, H=2, HV=4, K=128, V=128, seed=40)["h0"]  # one per sequence
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device="cuda")
    acc = torch.tensor([1, 2], dtype=torch.int32, device="cuda")
    idx = torch.tensor([1, 3], dtype=torch.int32, device="cuda")
    cache_idx = torch.tensor([1, 0], dtype=torch.int32, device="cuda")
    cu_f = torch.tensor([0, 3, 5], device="cuda")

    def step(pool, pool2, cache):
        o1, _ = vllm.fused_sigmoid_gating_delta_rule_update(
            t["A_log"], t["a"], t["b"], t["dt_bias"], t["q"], t["k"], t["v"], initial_state=pool,
            cu_seqlens=t["cu"], ssm_state_indices=table, num_accepted_tokens=acc,
            use_qk_l2norm_in_kernel=True)
        o2 = sglang.fused_sigmoid_gating_delta_rule_update(
            d["A_log"], d["a"], d["dt_bias"], 1.0, 20.0, d["q"], d["k"], d["v"], d["b"], pool2,
            idx, use_qk_l2norm_in_kernel=True, intermediate_states_buffer=cache,
            intermediate_state_indices=cache_idx, cache_steps=T)
        o3, final = fla.fused_recurrent_gated_delta_rule(
            f["q"], f["k"], f["v"], g=f["g"], beta=f["beta"], initial_state=f_h0,
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_f)
        return o1, o2, o3, final

    make = lambda: (t["state"].clone(), d["state"].clone(),  # noqa: E731
                    torch.zeros(N, T, 4, 128, 128, device="cuda"))
    eager, graphed = make(), make()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(*make())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_out = step(*graphed)
    for _ in range(2):
        g.replay()
        eager_out = step(*eager)
        torch.cuda.synchronize()
        for x, y in zip(graph_out, eager_out):
            assert torch.equal(x, y)
        for x, y in zip(graphed, eager):
            assert torch.equal(x, y)
