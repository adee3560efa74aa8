"""Shared by the torch tests: devices, tolerances, the float64 reference of the step
(docs/operation.md, 'The math') in plain PyTorch, and random inputs. Import it after
pytest.importorskip("torch")."""
import math

import pytest
import torch
import torch.nn.functional as F

import gdnkit

HAS_CUDA = torch.cuda.is_available() and gdnkit.backend_available("cuda")[0]
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and gdnkit built with CUDA")

# Bounds on ||x - ref|| / ||ref|| by the dtype the result is stored in (docs/operation.md,
# 'Numerics').
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


# ---- the reference: docs/operation.md, 'The math', in float64, plain PyTorch ------------

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
    # beta [B, Hv], or per channel [B, Hv, Dv] (precomputed), as v
    delta = (beta if beta.dim() == v.dim() else beta[..., None]) * (v - torch.einsum("bhkv,bhk->bhv", M, kh))
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


def packed(t):
    return torch.cat([t["q"].flatten(1), t["k"].flatten(1), t["v"].flatten(1)], 1)
