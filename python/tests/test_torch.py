"""torch.ops.gdnkit.* and the drop-in wrappers, against plain PyTorch references in this file.

Runs on CPU tensors wherever torch imports, and on CUDA tensors too when a GPU is
present (CUDA graph capture and replay, torch.compile with Inductor, torch.export).
Skips cleanly without torch.
"""
import math
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import gdnkit  # noqa: E402
import gdnkit.torch as gt  # noqa: E402
from gdnkit.torch import executorch, fla, sglang, vllm  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and gdnkit.backend_available("cuda")[0]
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and gdnkit built with CUDA")

# SPEC section 3 bounds on ||x - ref|| / ||ref||, by the dtype the result is stored in.
TOL_OUT = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TOL_STATE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


def rel(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    d = torch.linalg.vector_norm(ref)
    return float(torch.linalg.vector_norm(x - ref) / (d if d > 0 else 1.0))


def assert_same(x, y):
    """Two runs of the same kernel on the same data (bit-exact today; a reduction order
    that varied between launches would still pass)."""
    if torch.equal(x, y):
        return
    assert_close(x, y, 1e-5 if x.dtype == torch.float32 else 2e-3, "graph vs eager")


def assert_close(x, ref, tol, what):
    err = rel(x, ref)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


# ---- the reference: SPEC section 1 in float64, plain PyTorch ---------------------------

def reference(q, k, v, a, b, A_log, dt_bias, state_kv, idx=None, out_idx=None, *, gate="raw",
              l2="rsqrt", eps=1e-6, scale=None, head_map="interleaved", softplus_beta=1.0,
              softplus_threshold=20.0):
    """q, k [B, Hk, Dk]; v [B, Hv, Dv]; a, b [B, Hv]; pool state_kv [S, Hv, Dk, Dv].
    Returns (o [B, Hv, Dv], new pool), float64. Rows never read a slot another row writes."""
    q, k, v, a, b, pool = (t.double().cpu() for t in (q, k, v, a, b, state_kv))
    B, Hk, Dk = q.shape
    Hv = v.shape[1]
    S = pool.shape[0]
    heads = torch.arange(Hv)
    hmap = heads // (Hv // Hk) if head_map == "interleaved" else heads % Hk
    if l2 == "rsqrt":
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + eps)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + eps)
    elif l2 == "max_norm":
        q = F.normalize(q, p=2.0, dim=-1, eps=eps)
        k = F.normalize(k, p=2.0, dim=-1, eps=eps)
    qh, kh = q[:, hmap], k[:, hmap]
    if gate == "raw":
        x = a + dt_bias.double().cpu()
        g = -torch.exp(A_log.double().cpu()) * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
        beta = torch.sigmoid(b)
    else:
        g, beta = a, b
    slots = torch.arange(B) if idx is None else idx.long().cpu()
    valid = (slots >= 0) & (slots < S)
    M = pool[slots.clamp(0, S - 1)] * torch.exp(g)[..., None, None]
    delta = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", M, kh))
    M = M + torch.einsum("bhk,bhv->bhkv", kh, delta)
    o = (Dk**-0.5 if scale is None else scale) * torch.einsum("bhkv,bhk->bhv", M, qh)
    o[~valid] = 0
    new = pool.clone()
    writes = slots if out_idx is None else out_idx.long().cpu()
    for r in range(B):
        if valid[r] and 0 <= writes[r] < S:
            new[writes[r]] = M[r]
    return o, new


def to_kv(pool, layout):
    return pool if layout == "kv" else pool.transpose(-1, -2)


def inputs(device, *, B=2, Hk=2, Hv=4, Dk=64, Dv=64, dtype=torch.float32, ab_dtype=None,
           state_dtype=torch.float32, layout="vk", slots=None, seed=0, gate="raw"):
    """Realistic random inputs (fixed seed, non-zero state)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    S = B if slots is None else slots
    pool_shape = (S, Hv, Dk, Dv) if layout == "kv" else (S, Hv, Dv, Dk)
    ab_dtype = ab_dtype or dtype
    t = dict(
        q=r(B, Hk, Dk).to(dtype), k=r(B, Hk, Dk).to(dtype), v=r(B, Hv, Dv).to(dtype),
        a=r(B, Hv).to(ab_dtype), b=r(B, Hv).to(ab_dtype),
        A_log=torch.log(torch.empty(Hv).uniform_(1.0, 16.0, generator=gen)),
        dt_bias=torch.log(torch.expm1(torch.exp(torch.empty(Hv).uniform_(math.log(1e-3), math.log(1e-1), generator=gen)))),
        state=(0.5 * r(*pool_shape)).to(state_dtype),
    )
    if gate == "precomputed":
        t["a"] = torch.empty(B, Hv).uniform_(-3.0, -1e-4, generator=gen).to(ab_dtype)
        t["b"] = torch.rand(B, Hv, generator=gen).to(ab_dtype)
    return {n: x.to(device) for n, x in t.items()}


# ---- torch.ops.gdnkit.decode / decode_packed ---------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_op(device, layout, state_dtype, dtype):
    t = inputs(device, dtype=dtype, state_dtype=state_dtype, layout=layout, Dk=64, Dv=128,
               seed=sum(map(ord, f"{dtype}{state_dtype}{layout}")))
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                             to_kv(t["state"], layout))
    state = t["state"].clone()
    o = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"], layout=layout)
    assert o.dtype == dtype and o.device.type == device and o.shape == (2, 4, 128)
    assert_close(o, o_ref, TOL_OUT[dtype], "output")
    assert_close(to_kv(state, layout), s_ref, TOL_STATE[state_dtype], "state")


@pytest.mark.parametrize("device", DEVICES)
def test_decode_packed_op_options(device):
    """Packed row, tiled heads, max_norm, custom scale, fp32 output from bf16 inputs."""
    t = inputs(device, dtype=torch.bfloat16, state_dtype=torch.bfloat16, layout="kv", B=3, seed=5)
    qkv = torch.cat([t["q"].flatten(1), t["k"].flatten(1), t["v"].flatten(1)], 1)
    state = t["state"].clone()
    o = gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=state, A_log=t["A_log"], dt_bias=t["dt_bias"],
                  layout="kv", head_map="tiled", l2norm="max_norm", scale=0.25,
                  out_dtype=torch.float32)
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                             t["state"], head_map="tiled", l2="max_norm", scale=0.25)
    assert o.dtype == torch.float32
    assert_close(o, o_ref, TOL_OUT[torch.float32] * 100, "output (bf16 inputs, fp32 output)")
    assert_close(state, s_ref, TOL_STATE[torch.bfloat16], "state")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_decode_indices_padding_counter(device, index_dtype):
    t = inputs(device, B=4, slots=7, layout="vk", seed=6, gate="precomputed")
    idx = torch.tensor([5, -1, 0, 7], dtype=index_dtype, device=device)  # 7 == num_slots: counted
    out_idx = torch.tensor([2, 3, -1, 1], dtype=index_dtype, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    state = t["state"].clone()
    o = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], state, gate="precomputed",
                  state_indices=idx, state_out_indices=out_idx, invalid_index_count=counter,
                  layout="vk")
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], None, None,
                             to_kv(t["state"], "vk"), idx, out_idx, gate="precomputed")
    assert_close(o, o_ref, 1e-5, "output")
    assert torch.equal(o[1].cpu(), torch.zeros_like(o[1].cpu())) and not o[3].any()
    assert_close(to_kv(state, "vk"), s_ref, 1e-5, "state")
    for slot in (0, 1, 3, 4, 5, 6):  # not written by any row
        assert torch.equal(state[slot], t["state"][slot])
    assert int(counter.item()) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_validation_error_writes_nothing(device):
    t = inputs(device, layout="vk")
    state = t["state"].clone()
    v = torch.zeros(2, 4, 100, device=device)[:, :, :64]  # fine
    bad_v = torch.as_strided(torch.zeros(2 * 4 * 64, device=device), (2, 4, 64), (256, 48, 1))
    with pytest.raises(ValueError, match=r"^v: head stride 48 is smaller than Dv=64$"):
        gt.decode(t["q"], t["k"], bad_v, t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"])
    with pytest.raises(ValueError, match=r"^dt_bias: dtype must be float32, got float64$"):
        gt.decode(t["q"], t["k"], v, t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"].double())
    assert torch.equal(state, t["state"])


@cuda_only
def test_mixed_devices_refused():
    t = inputs("cuda", layout="vk")
    with pytest.raises(ValueError, match=r"^q: on cpu, but state is on cuda:0"):
        gt.decode(t["q"].cpu(), t["k"], t["v"], t["a"], t["b"], t["state"], A_log=t["A_log"],
                  dt_bias=t["dt_bias"])


def test_generic_decode_accepts_torch():
    """gdnkit.decode (the DLPack path) on CPU tensors gives the same as the op."""
    t = inputs("cpu", layout="kv", seed=9)
    s1, s2 = t["state"].clone(), t["state"].clone()
    o1 = gdnkit.decode(t["q"], t["k"], t["v"], t["a"], t["b"], s1, A_log=t["A_log"],
                       dt_bias=t["dt_bias"], layout="kv")
    o2 = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], s2, A_log=t["A_log"],
                   dt_bias=t["dt_bias"], layout="kv")
    assert isinstance(o1, torch.Tensor)
    assert_same(o1, o2)
    assert_same(s1, s2)
    # The extension's DLPack entry point itself, on the same tensors.
    s3, o3 = t["state"].clone(), torch.empty_like(o1)
    gdnkit._gdnkit.decode(t["q"], t["k"], t["v"], None, t["a"], t["b"], t["A_log"], t["dt_bias"],
                          s3, o3, None, None, None, gdnkit.LAYOUTS["kv"], 0, 0, 1e-6, 0.0, 0, 0, 0)
    assert_same(o3, o1)
    assert_same(s3, s1)


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
    q2 = t["q"].reshape(1, 2, 1, 64).expand(2, 2, 1, 64)
    with pytest.raises(NotImplementedError, match="one token per sequence"):
        vllm.fused_sigmoid_gating_delta_rule_update(t["A_log"], t["a"], t["b"], t["dt_bias"], q2, q2,
                                                   t["v"].reshape(1, 2, 2, 64).expand(2, 2, 2, 64),
                                                   initial_state=t["state"])


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


# ---- the middle of a layer: conv1d prologue and gated RMSNorm ----------------------------

def middle_inputs(device, *, W=4, tap_major=False, **kw):
    """inputs() plus the raw row x, a conv pool (channel-major, or a tap-major buffer seen
    through its transposed view, as vLLM keeps it), conv weight/bias, z and norm_weight."""
    t = inputs(device, **kw)
    gen = torch.Generator().manual_seed(kw.get("seed", 0) + 7919)
    B, Hk, Dk = t["q"].shape
    Hv, Dv = t["v"].shape[1], t["v"].shape[2]
    S, dt = t["state"].shape[0], t["q"].dtype
    cdim = 2 * Hk * Dk + Hv * Dv
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t["x"] = r(B, cdim).to(dt)
    if tap_major:
        t["conv_state"] = r(S, W - 1, cdim).to(dt).transpose(1, 2)
    else:
        t["conv_state"] = r(S, cdim, W - 1).to(dt)
    t["conv_weight"] = (0.5 * r(cdim, 1, W)).to(dt)  # nn.Conv1d's depthwise weight shape
    t["conv_bias"] = (0.1 * r(cdim)).to(dt)
    t["z"] = r(B, Hv, Dv).to(dt)
    t["norm_weight"] = torch.empty(Dv).uniform_(0.5, 1.5, generator=gen).to(dt)
    return {n: x.to(device) for n, x in t.items()}


def middle_reference(t, layout, *, eps=1e-6):
    """conv1d (float64, y never rounded) -> the step reference -> gated RMSNorm.
    Returns (o, new pool as kv, new conv pool)."""
    x, cs = t["x"].double().cpu(), t["conv_state"].double().cpu()
    w, bias = t["conv_weight"].double().cpu().flatten(1), t["conv_bias"].double().cpu()
    B, Hk, Dk = t["q"].shape
    Hv, Dv = t["v"].shape[1], t["v"].shape[2]
    window = torch.cat([cs[:B], x[:, :, None]], dim=2)  # rows b read slot b
    y = F.silu((window * w).sum(-1) + bias)
    q = y[:, : Hk * Dk].reshape(B, Hk, Dk)
    k = y[:, Hk * Dk: 2 * Hk * Dk].reshape(B, Hk, Dk)
    v = y[:, 2 * Hk * Dk:].reshape(B, Hv, Dv)
    o, pool = reference(q, k, v, t["a"], t["b"], t["A_log"], t["dt_bias"], to_kv(t["state"], layout))
    z, nw = t["z"].double().cpu(), t["norm_weight"].double().cpu()
    o = nw * o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * F.silu(z)
    new_cs = cs.clone()
    new_cs[:B] = window[:, :, 1:]
    return o, pool, new_cs


def middle_kwargs(t, state, conv_state, layout):
    return dict(x=t["x"], a=t["a"], b=t["b"], state=state, A_log=t["A_log"], dt_bias=t["dt_bias"],
                conv_state=conv_state, conv_weight=t["conv_weight"], conv_bias=t["conv_bias"],
                z=t["z"], norm_weight=t["norm_weight"], layout=layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_middle_op(device, layout, dtype):
    """gdnkit::decode_conv with the norm: conv1d + step + gated RMSNorm in one call."""
    t = middle_inputs(device, dtype=dtype, state_dtype=torch.float32, layout=layout, Hk=2, Hv=4,
                      Dk=64, Dv=128, W=4, tap_major=layout == "vk",
                      seed=sum(map(ord, f"{dtype}{layout}")))
    o_ref, s_ref, cs_ref = middle_reference(t, layout)
    state, conv_state = t["state"].clone(), t["conv_state"].clone()  # clone keeps the strides
    assert (conv_state.stride(1) == 1) == (layout == "vk")
    o = gt.decode(**middle_kwargs(t, state, conv_state, layout))
    assert o.dtype == dtype and o.device.type == device and o.shape == (2, 4, 128)
    assert_close(o, o_ref, TOL_OUT[dtype], "output")
    assert_close(to_kv(state, layout), s_ref, TOL_STATE[torch.float32], "state")
    assert torch.equal(conv_state.double().cpu(), cs_ref), "the conv pool only moves values"


@pytest.mark.parametrize("device", DEVICES)
def test_norm_epilogue_ops(device):
    """z / norm_weight on decode and decode_packed (no conv): the same bits either way."""
    t = middle_inputs(device, dtype=torch.bfloat16, state_dtype=torch.bfloat16, layout="kv", seed=9)
    s1, s2 = t["state"].clone(), t["state"].clone()
    kw = dict(a=t["a"], b=t["b"], A_log=t["A_log"], dt_bias=t["dt_bias"], layout="kv",
              z=t["z"], norm_weight=t["norm_weight"], norm_eps=1e-5)
    o1 = gt.decode(t["q"], t["k"], t["v"], state=s1, **kw)
    o2 = gt.decode(qkv=packed(t), state=s2, **kw)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                             t["state"])
    z, nw = t["z"].double().cpu(), t["norm_weight"].double().cpu()
    o_ref = nw * o_ref * torch.rsqrt((o_ref * o_ref).mean(-1, keepdim=True) + 1e-5) * F.silu(z)
    assert_close(o1, o_ref, TOL_OUT[torch.bfloat16], "output")
    assert_close(s1, s_ref, TOL_STATE[torch.bfloat16], "state")


@pytest.mark.parametrize("device", DEVICES)
def test_middle_refused(device):
    t = middle_inputs(device, layout="vk", seed=3)
    state, conv_state = t["state"].clone(), t["conv_state"].clone()
    kw = middle_kwargs(t, state, conv_state, "vk")
    with pytest.raises(ValueError, match=r"^conv_weight: dtype"):
        gt.decode(**{**kw, "conv_weight": t["conv_weight"].half()})
    with pytest.raises(ValueError, match=r"^x: give either x"):
        gt.decode(**kw, qkv=packed(t))
    with pytest.raises(ValueError, match=r"^conv_bias: given without x"):
        gt.decode(**{**kw, "x": None, "conv_state": None, "conv_weight": None}, qkv=packed(t))
    assert torch.equal(state, t["state"]) and torch.equal(conv_state, t["conv_state"])


class Middle(torch.nn.Module):
    """The layer's middle with both pools as buffers."""

    def __init__(self, t):
        super().__init__()
        for name in ("state", "conv_state"):
            self.register_buffer(name, t[name].clone())
        for name in ("A_log", "dt_bias", "conv_weight", "conv_bias", "norm_weight"):
            self.register_buffer(name, t[name])

    def forward(self, x, a, b, z):
        o = gt.decode(x=x, a=a, b=b, z=z, state=self.state, conv_state=self.conv_state,
                      A_log=self.A_log, dt_bias=self.dt_bias, conv_weight=self.conv_weight,
                      conv_bias=self.conv_bias, norm_weight=self.norm_weight, layout="vk")
        return o * 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_middle_compile(device):
    t = middle_inputs(device, layout="vk", seed=33)
    for backend in compile_backends(device):
        torch._dynamo.reset()
        eager, compiled_mod = Middle(t), Middle(t)
        compiled = torch.compile(compiled_mod, backend=backend, fullgraph=True)
        for _ in range(3):
            o_e = eager(t["x"], t["a"], t["b"], t["z"])
            o_c = compiled(t["x"], t["a"], t["b"], t["z"])
            assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6), backend
        assert torch.equal(eager.conv_state, compiled_mod.conv_state), backend
        assert torch.allclose(eager.state, compiled_mod.state, rtol=1e-6, atol=1e-6), backend


@cuda_only
def test_middle_cuda_graph():
    """decode_conv with the norm captured in a CUDA graph at the model shape (B = 1,
    Hk 16, Hv 32, 128 x 128: the cluster geometry) and replayed against eager calls."""
    t = middle_inputs("cuda", B=1, Hk=16, Hv=32, Dk=128, Dv=128, layout="vk", seed=43,
                      dtype=torch.bfloat16, state_dtype=torch.float32)
    eager_s, eager_cs = t["state"].clone(), t["conv_state"].clone()
    graph_s, graph_cs = t["state"].clone(), t["conv_state"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gt.decode(**middle_kwargs(t, t["state"].clone(), t["conv_state"].clone(), "vk"))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_graph = gt.decode(**middle_kwargs(t, graph_s, graph_cs, "vk"))
    assert torch.equal(graph_s, t["state"]) and torch.equal(graph_cs, t["conv_state"])
    for _ in range(3):
        g.replay()
        o_eager = gt.decode(**middle_kwargs(t, eager_s, eager_cs, "vk"))
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_eager)  # deterministic: bitwise
        assert torch.equal(graph_s, eager_s) and torch.equal(graph_cs, eager_cs)


# ---- torch.compile, torch.export --------------------------------------------------------

class Step(torch.nn.Module):
    """A model-like module: state pool as a buffer, the op in forward."""

    def __init__(self, state, A_log, dt_bias):
        super().__init__()
        self.register_buffer("state", state.clone())
        self.register_buffer("A_log", A_log)
        self.register_buffer("dt_bias", dt_bias)

    def forward(self, qkv, a, b):
        o = gt.decode(qkv=qkv, a=a, b=b, state=self.state, A_log=self.A_log,
                      dt_bias=self.dt_bias, layout="vk")
        return o * 2.0  # something for the compiler to fuse around the op


def packed(t):
    return torch.cat([t["q"].flatten(1), t["k"].flatten(1), t["v"].flatten(1)], 1)


def compile_backends(device):
    backends = ["aot_eager"]  # functionalization and re-inplacing, no code generation
    if device == "cuda":
        backends.append("inductor")
    return backends


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile(device):
    t = inputs(device, layout="vk", seed=31)
    qkv = packed(t)
    for backend in compile_backends(device):
        torch._dynamo.reset()
        eager = Step(t["state"], t["A_log"], t["dt_bias"])
        compiled_mod = Step(t["state"], t["A_log"], t["dt_bias"])
        compiled = torch.compile(compiled_mod, backend=backend, fullgraph=True)
        for _ in range(3):
            o_e = eager(qkv, t["a"], t["b"])
            o_c = compiled(qkv, t["a"], t["b"])
            assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6), backend
        assert torch.allclose(eager.state, compiled_mod.state, rtol=1e-6, atol=1e-6), backend


@pytest.mark.parametrize("device", DEVICES)
def test_torch_export(device):
    t = inputs(device, layout="vk", seed=32)
    qkv = packed(t)
    m = Step(t["state"], t["A_log"], t["dt_bias"])
    ep = torch.export.export(m, (qkv, t["a"], t["b"]))
    assert "gdnkit.decode_packed" in str(ep.graph)
    ref = Step(t["state"], t["A_log"], t["dt_bias"])
    o_ref = ref(qkv, t["a"], t["b"])
    exported = ep.module()
    o = exported(qkv, t["a"], t["b"])
    assert torch.allclose(o, o_ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(exported.state, ref.state, rtol=1e-6, atol=1e-6)
    # The functional form (what AOTInductor and ExecuTorch lower): auto_functionalized.
    m2 = Step(t["state"], t["A_log"], t["dt_bias"])
    ep2 = torch.export.export(m2, (qkv, t["a"], t["b"])).run_decompositions()
    assert "auto_functionalized" in str(ep2.graph)
    ref2 = Step(t["state"], t["A_log"], t["dt_bias"])
    functional = ep2.module()
    for _ in range(2):
        assert torch.allclose(functional(qkv, t["a"], t["b"]), ref2(qkv, t["a"], t["b"]),
                              rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_aot_inductor(device):
    """torch.export + AOTInductor (ExecuTorch's CUDA path), the op called back from the
    compiled package. Compiles C++: about a minute on CPU."""
    if os.environ.get("GDNKIT_SKIP_AOTI"):
        pytest.skip("GDNKIT_SKIP_AOTI is set")
    import torch._inductor

    t = inputs(device, layout="vk", seed=33)
    qkv = packed(t)
    ep = torch.export.export(Step(t["state"], t["A_log"], t["dt_bias"]), (qkv, t["a"], t["b"]))
    ref = Step(t["state"], t["A_log"], t["dt_bias"])
    with tempfile.TemporaryDirectory() as tmp:
        path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, "gdn.pt2"))
        compiled = torch._inductor.aoti_load_package(path)
        for _ in range(2):
            assert torch.allclose(compiled(qkv, t["a"], t["b"]), ref(qkv, t["a"], t["b"]),
                                  rtol=1e-6, atol=1e-6)


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


# ---- CUDA graphs ------------------------------------------------------------------------

@cuda_only
def test_cuda_graph_capture_and_replay():
    t = inputs("cuda", B=2, Hk=2, Hv=4, Dk=128, Dv=128, layout="vk", seed=41,
               state_dtype=torch.bfloat16, dtype=torch.bfloat16)
    qkv = packed(t)
    eager_state = t["state"].clone()
    graph_state = t["state"].clone()
    # Warm up on a side stream (as torch.cuda.graph requires), then capture one step.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        warm = t["state"].clone()
        gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=warm, A_log=t["A_log"], dt_bias=t["dt_bias"])
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_graph = gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=graph_state, A_log=t["A_log"],
                            dt_bias=t["dt_bias"])
    assert torch.equal(graph_state, t["state"]), "capture must not run the kernel"
    for _ in range(3):
        g.replay()
        o_eager = gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=eager_state, A_log=t["A_log"],
                            dt_bias=t["dt_bias"])
        torch.cuda.synchronize()
        assert_same(o_graph, o_eager)
        assert_same(graph_state, eager_state)


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


@cuda_only
def test_compile_reduce_overhead():
    """Inductor with CUDA graphs (mode="reduce-overhead"), the pool a module buffer."""
    t = inputs("cuda", layout="vk", seed=51)
    qkv = packed(t)
    torch._dynamo.reset()
    eager = Step(t["state"], t["A_log"], t["dt_bias"])
    cm = Step(t["state"], t["A_log"], t["dt_bias"])
    compiled = torch.compile(cm, mode="reduce-overhead", fullgraph=True)
    for _ in range(5):
        o_e = eager(qkv, t["a"], t["b"])
        o_c = compiled(qkv, t["a"], t["b"]).clone()
        torch.cuda.synchronize()
        assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6)
    assert torch.allclose(eager.state, cm.state, rtol=1e-6, atol=1e-6)


@cuda_only
def test_current_stream_is_used():
    """The op runs on the current stream: work queued behind a long op on a side stream."""
    t = inputs("cuda", layout="vk", seed=61)
    state = t["state"].clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy
        q = t["q"] * 1.0  # produced on s
        o = gt.decode(q, t["k"], t["v"], t["a"], t["b"], state, A_log=t["A_log"],
                      dt_bias=t["dt_bias"])
    s.synchronize()
    o_ref, _ = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                         t["state"].transpose(-1, -2))
    assert_close(o, o_ref, 1e-5, "output")


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_device():
    t = inputs("cuda:1", layout="kv", seed=71)
    state = t["state"].clone()
    o = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"], layout="kv")
    o_ref, _ = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"], t["state"])
    assert o.device == torch.device("cuda:1")
    assert_close(o, o_ref, 1e-5, "output")
