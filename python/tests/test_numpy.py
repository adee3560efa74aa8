"""gdnkit.decode on numpy arrays (the host backend), against a float64 reference in this file.

Every SPEC section 1 option, random inputs from realistic ranges (fixed seeds, random
non-zero initial state, Dk != Dv, both layouts), the fused middle of a layer (conv1d
prologue and gated RMSNorm), the committed golden files (format 2 too), strided views,
and validation: bad arguments raise ValueError with the library's message and write
nothing.
"""
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

import gdnkit

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "golden"

# ---- dtypes: numpy storage of f32 / f16 / bf16 (bf16 as uint16 bit patterns) ----------

STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
# Bounds on ||x - ref|| / ||ref|| by the dtype a result is stored in (SPEC section 3).
TOL_OUT = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
TOL_STATE = {"f32": 1e-5, "f16": 2e-3, "bf16": 8e-3}


def bf16_bits(x):
    """Round float values to bfloat16 (nearest even) and return the uint16 bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def store(x, kind):
    """float64 values -> the numpy array gdnkit reads for dtype `kind`."""
    if kind == "bf16":
        return bf16_bits(x)
    return np.asarray(x, dtype=np.float64).astype(STORAGE[kind])


def value(x, kind):
    """The exact float64 values a stored array holds."""
    if kind == "bf16":
        if x.dtype.name == "bfloat16":  # an ml_dtypes array
            x = x.view(np.uint16)
        return bf16_value(x)
    return np.asarray(x).astype(np.float64)


def kind_of(arr):
    return {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.uint16): "bf16"}[arr.dtype]


# ---- the reference: SPEC section 1 in float64 ----------------------------------------

def softplus(x):
    return x if x > 20.0 else math.log1p(math.exp(x))


def l2norm(x, mode, eps):
    n2 = float(np.dot(x, x))
    if mode == "rsqrt":
        return x / math.sqrt(n2 + eps)
    if mode == "max_norm":
        return x / max(math.sqrt(n2), eps)
    return x


def reference(q, k, v, a, b, A_log, dt_bias, state_kv, idx, out_idx, *, gate, l2, eps, scale,
              head_map):
    """q, k [B, Hk, Dk]; v [B, Hv, Dv]; a, b [B, Hv]; state_kv [S, Hv, Dk, Dv] (float64).
    Returns (o [B, Hv, Dv], new pool, out-of-range index count). Rows never read a slot
    another row writes, so the row order does not matter."""
    B, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    G = Hv // Hk
    S = state_kv.shape[0]
    o = np.zeros((B, Hv, Dv))
    new = state_kv.copy()
    invalid = 0
    for r in range(B):
        s = int(idx[r]) if idx is not None else r
        so = int(out_idx[r]) if out_idx is not None else s
        if s < 0 or s >= S:
            invalid += s >= S
            continue
        invalid += so >= S
        for h in range(Hv):
            hk = h // G if head_map == "interleaved" else h % Hk
            qh = l2norm(q[r, hk], l2, eps)
            kh = l2norm(k[r, hk], l2, eps)
            if gate == "raw":
                g = -math.exp(A_log[h]) * softplus(a[r, h] + dt_bias[h])
                beta = 1.0 / (1.0 + math.exp(-b[r, h]))
            else:
                g, beta = a[r, h], b[r, h]
            M = math.exp(g) * state_kv[s, h]
            delta = beta * (v[r, h] - M.T @ kh)
            M = M + np.outer(kh, delta)
            o[r, h] = scale * (M.T @ qh)
            if 0 <= so < S:
                new[so, h] = M
    return o, new, invalid


def rel_err(x, ref):
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / (denom if denom > 0 else 1.0))


# ---- random cases --------------------------------------------------------------------

def make_case(seed, *, B=2, Hk=1, G=2, Dk=64, Dv=64, qkv="f32", ab=None, state="f32", out=None,
              layout="kv", gate="raw", l2="rsqrt", eps=1e-6, scale=None, head_map="interleaved",
              indices=None, pool_extra=0, padding=0, out_indices=False, invalid=False):
    """Inputs in their stored dtypes plus what the reference needs (float64)."""
    rng = np.random.default_rng(seed)
    ab = ab or qkv
    Hv = Hk * G
    c = dict(B=B, Hk=Hk, Hv=Hv, Dk=Dk, Dv=Dv, qkv=qkv, ab=ab, state=state, out=out or qkv,
             layout=layout, gate=gate, l2=l2, eps=eps, scale=scale, head_map=head_map)
    qv = rng.standard_normal((B, Hk, Dk))
    kv = rng.standard_normal((B, Hk, Dk))
    if l2 == "none":  # the caller hands over unit vectors
        qv /= np.linalg.norm(qv, axis=-1, keepdims=True)
        kv /= np.linalg.norm(kv, axis=-1, keepdims=True)
    c["q"], c["k"] = store(qv, qkv), store(kv, qkv)
    c["v"] = store(rng.standard_normal((B, Hv, Dv)), qkv)
    if gate == "raw":
        c["a"] = store(rng.standard_normal((B, Hv)), ab)
        c["b"] = store(rng.standard_normal((B, Hv)), ab)
        c["A_log"] = np.log(rng.uniform(1.0, 16.0, Hv)).astype(np.float32)
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), Hv))
        c["dt_bias"] = np.log(np.expm1(dt)).astype(np.float32)
    else:
        c["a"] = store(rng.uniform(-3.0, -1e-4, (B, Hv)), ab)
        c["b"] = store(rng.uniform(0.0, 1.0, (B, Hv)), ab)
        c["A_log"] = c["dt_bias"] = None
    S = B + pool_extra
    shape = (S, Hv, Dk, Dv) if layout == "kv" else (S, Hv, Dv, Dk)
    c["pool"] = store(rng.normal(0.0, 0.5, shape), state)
    c["idx"] = c["out_idx"] = None
    if indices:
        itype = np.int32 if indices == "i32" else np.int64
        slots = rng.permutation(S)
        idx = slots[:B].copy()
        pad_rows = rng.choice(B, size=padding, replace=False) if padding else []
        for r in pad_rows:
            idx[r] = -1 - (r % 2)  # -1 and -2
        if out_indices:
            spare = list(slots[B:])
            out_idx = idx.copy()
            for r in range(B):
                choice = r % 3
                if choice == 1 and spare:
                    out_idx[r] = spare.pop()  # write elsewhere
                elif choice == 2:
                    out_idx[r] = -1  # output only
            c["out_idx"] = out_idx.astype(itype)
        if invalid:  # out of range: == num_slots, INT32_MAX, and a write index past the pool
            live = [r for r in range(B) if idx[r] >= 0]
            idx[live[0]] = S
            if len(live) > 2:
                idx[live[-1]] = np.iinfo(np.int32).max
            if c["out_idx"] is not None and len(live) > 1:
                c["out_idx"][live[1]] = S + 7 if indices == "i32" else 2**40
        c["idx"] = idx.astype(itype)
    return c


def expected(c, qkv=None):
    """The reference on the case's q, k, v (or on qkv = (q, k, v) in float64)."""
    if qkv is None:
        qkv = value(c["q"], c["qkv"]), value(c["k"], c["qkv"]), value(c["v"], c["qkv"])
    q, k, v = qkv
    a, b = value(c["a"], c["ab"]), value(c["b"], c["ab"])
    pool = value(c["pool"], c["state"])
    kv = pool if c["layout"] == "kv" else pool.transpose(0, 1, 3, 2)
    scale = c["scale"] if c["scale"] else c["Dk"] ** -0.5
    o, new, invalid = reference(
        q, k, v, a, b,
        None if c["A_log"] is None else c["A_log"].astype(np.float64),
        None if c["dt_bias"] is None else c["dt_bias"].astype(np.float64),
        kv, c["idx"], c["out_idx"], gate=c["gate"], l2=c["l2"], eps=c["eps"], scale=scale,
        head_map=c["head_map"])
    if c["layout"] == "vk":
        new = new.transpose(0, 1, 3, 2)
    return o, new, invalid


def check(c, out, pool_after, counter=None):
    """Errors within SPEC bounds, padding rows exactly zero, untouched state bit-exact."""
    o_ref, s_ref, invalid = expected(c)
    o = value(out, c["out"]).reshape(o_ref.shape)
    s = value(pool_after, c["state"])
    assert rel_err(o, o_ref) <= TOL_OUT[c["out"]], f"output error {rel_err(o, o_ref):.3g}"
    assert rel_err(s, s_ref) <= TOL_STATE[c["state"]], f"state error {rel_err(s, s_ref):.3g}"
    if c["idx"] is not None:
        S = c["pool"].shape[0]
        for r, s_in in enumerate(c["idx"]):
            if s_in < 0 or s_in >= S:
                assert not np.any(o[r]), f"padding row {r} is not zero"
        written = set()
        for r, s_in in enumerate(c["idx"]):
            if 0 <= s_in < S:
                so = c["out_idx"][r] if c["out_idx"] is not None else s_in
                if 0 <= so < S:
                    written.add(int(so))
        for slot in range(S):
            if slot not in written:
                assert np.array_equal(pool_after[slot], c["pool"][slot]), f"slot {slot} was touched"
    if counter is not None:
        assert int(counter[0]) == invalid


def case_kwargs(c, counter):
    """gdnkit.decode's keyword arguments for a case's options, gates, indices and counter."""
    return dict(
        A_log=c["A_log"], dt_bias=c["dt_bias"], state_indices=c["idx"],
        state_out_indices=c["out_idx"], invalid_index_count=counter, layout=c["layout"],
        gate=c["gate"], l2norm=c["l2"], l2norm_eps=c["eps"], scale=c["scale"],
        head_map=c["head_map"],
        out_dtype={"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[c["out"]],
    )


def run(c, **overrides):
    """gdnkit.decode on a copy of the pool; returns (out, pool after, counter)."""
    pool = c["pool"].copy()
    counter = np.zeros(1, np.uint32)
    kw = case_kwargs(c, counter)
    kw.update(overrides)
    args = kw.pop("args", (c["q"], c["k"], c["v"], c["a"], c["b"]))
    if "qkv" in kw:
        out = gdnkit.decode(None, None, None, *args[3:], state=pool, **kw)
    else:
        out = gdnkit.decode(*args, state=pool, **kw)
    return out, pool, counter


# ---- every dtype combination, both layouts ---------------------------------------------

@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("state", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("qkv", ["f32", "f16", "bf16"])
def test_dtypes_and_layouts(qkv, state, layout):
    c = make_case(100 + 7 * len(qkv) + 3 * len(state), qkv=qkv, state=state, layout=layout,
                  B=3, Hk=2, G=2)
    out, pool, counter = run(c)
    if qkv == "bf16":  # bf16 bits, or ml_dtypes' bfloat16 when it is installed
        assert out.dtype == np.uint16 or out.dtype.name == "bfloat16"
    check(c, out, pool, counter)


# ---- one option at a time ------------------------------------------------------------

OPTIONS = {
    "gate_precomputed": dict(gate="precomputed"),
    "gate_precomputed_bf16_vk": dict(gate="precomputed", qkv="bf16", state="bf16", layout="vk"),
    "l2norm_max_norm": dict(l2="max_norm"),
    "l2norm_none": dict(l2="none"),
    "l2norm_eps_large": dict(l2="rsqrt", eps=0.5),
    "head_map_tiled": dict(head_map="tiled", Hk=2, G=2),
    "scale_custom": dict(scale=0.3),
    "dk64_dv128_kv": dict(Dk=64, Dv=128),
    "dk128_dv64_vk": dict(Dk=128, Dv=64, layout="vk"),
    "dk256_dv256": dict(Dk=256, Dv=256, B=1, G=1),
    "dk128_dv128_bf16_vk": dict(Dk=128, Dv=128, qkv="bf16", state="f32", layout="vk"),
    "gqa_g4": dict(Hk=2, G=4, B=1),
    "ab_dtype_differs": dict(qkv="bf16", ab="f32"),
    "out_f32_from_bf16": dict(qkv="bf16", out="f32", state="bf16", layout="vk"),
    "out_f16_from_f32": dict(qkv="f32", out="f16"),
    "indices_i32_padding_pool": dict(indices="i32", B=4, pool_extra=3, padding=1),
    "indices_i64_padding_vk": dict(indices="i64", B=4, pool_extra=2, padding=2, layout="vk",
                                   state="bf16"),
    "write_slots_i32": dict(indices="i32", B=4, pool_extra=4, padding=1, out_indices=True),
    "write_slots_i64_vk": dict(indices="i64", B=5, pool_extra=5, out_indices=True, layout="vk"),
    "invalid_read_index_i32": dict(indices="i32", B=4, pool_extra=1, invalid=True),
    "invalid_indices_i64_out": dict(indices="i64", B=4, pool_extra=3, invalid=True,
                                    out_indices=True, layout="vk"),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_option(name):
    c = make_case(sum(map(ord, name)), **OPTIONS[name])
    out, pool, counter = run(c)
    check(c, out, pool, counter)


def test_packed_qkv_row():
    """One packed [B, 2*Hk*Dk + Hv*Dv] row; also with a [B, 1, W] leading T dimension."""
    c = make_case(7, B=3, Hk=2, G=2, Dk=64, Dv=128, qkv="f16", state="f32", layout="vk")
    B = c["B"]
    packed = np.concatenate([c["q"].reshape(B, -1), c["k"].reshape(B, -1), c["v"].reshape(B, -1)], 1)
    for qkv in (packed, packed[:, None, :]):
        out, pool, counter = run(c, qkv=qkv)
        check(c, out, pool, counter)
    with pytest.raises(ValueError, match="num_k_heads=3"):
        run(c, qkv=packed, num_k_heads=3)


def test_rank4_inputs():
    """q/k/v as [B, 1, H, D] and [1, B, H, D], a/b as [B, 1, Hv] (engine shapes)."""
    c = make_case(8, B=3, Hk=1, G=2)
    B = c["B"]
    for lead in ((B, 1), (1, B)):
        args = (c["q"].reshape(*lead, *c["q"].shape[1:]), c["k"].reshape(*lead, *c["k"].shape[1:]),
                c["v"].reshape(*lead, *c["v"].shape[1:]), c["a"].reshape(*lead, -1),
                c["b"].reshape(*lead, -1))
        out, pool, counter = run(c, args=args)
        check(c, out, pool, counter)


def test_strided_views():
    """Row, head and slot strides taken from the arrays: views need no copies."""
    c = make_case(9, B=3, Hk=2, G=2, Dk=64, Dv=64, state="f32", layout="kv", indices="i32",
                  pool_extra=1)
    B, Hv, Dk, Dv = c["B"], c["Hv"], c["Dk"], c["Dv"]
    rng = np.random.default_rng(1)

    def padded(x, extra):  # same values, every row/head `extra` elements further apart
        big = rng.standard_normal(x.shape[:-1] + (x.shape[-1] + extra,)).astype(x.dtype)
        big[..., : x.shape[-1]] = x
        return big[..., : x.shape[-1]]

    q = padded(c["q"], 16)
    k = np.ascontiguousarray(c["k"].transpose(1, 0, 2)).transpose(1, 0, 2)  # heads outer
    v = padded(c["v"], 32)
    a = padded(c["a"], 3)
    b = padded(c["b"], 5)
    assert not q.flags.c_contiguous and not k.flags.c_contiguous and not a.flags.c_contiguous
    # A pool whose slots are 48 elements apart beyond their size.
    S = c["pool"].shape[0]
    slot = Hv * Dk * Dv
    flat = np.full((S, slot + 48), 7.0, np.float32)
    flat[:, :slot] = c["pool"].reshape(S, slot)
    pool = flat[:, :slot].reshape(S, Hv, Dk, Dv)
    assert np.shares_memory(pool, flat)
    out_big = np.full((B, Hv, Dv + 8), 5.0, np.float32)
    out = out_big[:, :, :Dv]
    counter = np.zeros(1, np.uint32)
    gdnkit.decode(q, k, v, a, b, pool, A_log=c["A_log"], dt_bias=c["dt_bias"], out=out,
                  state_indices=c["idx"], invalid_index_count=counter, layout="kv")
    check(c, out, pool, counter)
    assert np.all(flat[:, slot:] == 7.0), "the pool's padding between slots was written"
    assert np.all(out_big[:, :, Dv:] == 5.0), "out's padding was written"


def test_empty_batch():
    c = make_case(10, B=2)
    pool = c["pool"].copy()
    out = gdnkit.decode(c["q"][:0], c["k"][:0], c["v"][:0], c["a"][:0], c["b"][:0], pool,
                        A_log=c["A_log"], dt_bias=c["dt_bias"], layout="kv")
    assert out.shape == (0, c["Hv"], c["Dv"])
    assert np.array_equal(pool, c["pool"])


def test_multistep_against_reference():
    """30 steps on one fp32 state, the float64 reference run alongside."""
    c = make_case(11, B=2, Hk=1, G=2, Dk=64, Dv=32, layout="vk")
    rng = np.random.default_rng(12)
    pool = c["pool"].copy()
    ref_pool = pool.astype(np.float64)
    for step in range(30):
        for name in ("q", "k", "v", "a", "b"):
            c[name] = rng.standard_normal(c[name].shape).astype(np.float32)
        o_ref, ref_pool, _ = expected({**c, "state": "f64", "pool": ref_pool})
        out = gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], pool, A_log=c["A_log"],
                            dt_bias=c["dt_bias"], layout="vk")
        assert rel_err(out.astype(np.float64), o_ref) < 1e-5, step
    assert rel_err(pool.astype(np.float64), ref_pool) < 1e-4


def test_ml_dtypes_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    c = make_case(13, qkv="bf16", state="bf16", layout="vk")
    as_bf16 = lambda x: x.view(ml_dtypes.bfloat16)  # noqa: E731
    pool = as_bf16(c["pool"].copy())
    out = gdnkit.decode(as_bf16(c["q"]), as_bf16(c["k"]), as_bf16(c["v"]), as_bf16(c["a"]),
                        as_bf16(c["b"]), pool, A_log=c["A_log"], dt_bias=c["dt_bias"],
                        layout="vk")
    assert out.dtype == ml_dtypes.bfloat16
    check(c, out.view(np.uint16), pool.view(np.uint16))


# ---- the middle of a layer: conv1d prologue and gated RMSNorm ------------------------------

def silu(t):
    return t / (1.0 + np.exp(-t))


def make_middle_case(seed, *, conv=True, norm=True, W=4, tap_major=False, bias=True, **kw):
    """make_case plus the conv prologue's and the norm's inputs (realistic ranges: conv
    weights of a trained depthwise conv are O(0.1-1), norm weights near 1)."""
    c = make_case(seed, **kw)
    rng = np.random.default_rng(seed + 7919)
    B, Hk, Hv, Dk, Dv, kind = c["B"], c["Hk"], c["Hv"], c["Dk"], c["Dv"], c["qkv"]
    cdim = 2 * Hk * Dk + Hv * Dv
    c.update(conv=conv, norm=norm, W=W, tap_major=tap_major, cdim=cdim, norm_eps=1e-6)
    if conv:
        c["x"] = store(rng.standard_normal((B, cdim)), kind)
        cs = store(rng.standard_normal((c["pool"].shape[0], cdim, W - 1)), kind)
        c["conv_state"] = np.ascontiguousarray(cs.transpose(0, 2, 1)) if tap_major else cs
        c["conv_weight"] = store(rng.normal(0.0, 0.5, (cdim, W)), kind)
        c["conv_bias"] = store(rng.normal(0.0, 0.1, cdim), kind) if bias else None
    if norm:
        c["z"] = store(rng.standard_normal((B, Hv, Dv)), kind)
        c["norm_weight"] = store(rng.uniform(0.5, 1.5, Dv), kind)
    return c


def channel_major(cs, c):
    return cs.transpose(0, 2, 1) if c["tap_major"] else cs


def expected_middle(c):
    """(o, new state pool, new conv pool (channel-major) or None, invalid count), float64:
    the conv output y is never rounded (the generator's convention, tools/gen_golden.py)."""
    B, Hk, Hv, Dk, Dv, kind = c["B"], c["Hk"], c["Hv"], c["Dk"], c["Dv"], c["qkv"]
    new_cs = None
    if c["conv"]:
        x = value(c["x"], kind)
        cs = channel_major(value(c["conv_state"], kind), c)
        w = value(c["conv_weight"], kind)
        bias = value(c["conv_bias"], kind) if c["conv_bias"] is not None else np.zeros(c["cdim"])
        S = cs.shape[0]
        new_cs = cs.copy()
        y = np.zeros((B, c["cdim"]))
        for r in range(B):
            s = int(c["idx"][r]) if c["idx"] is not None else r
            so = int(c["out_idx"][r]) if c["out_idx"] is not None else s
            if s < 0 or s >= S:
                continue  # padding: neither pool is read or written
            window = np.concatenate([cs[s], x[r][:, None]], axis=1)  # (conv_dim, W), oldest first
            # y[c] = silu(sum_j w[c, j] window[c, j] + bias[c])
            y[r] = silu((w * window).sum(axis=1) + bias)
            if 0 <= so < S:
                new_cs[so] = window[:, 1:]
        q = y[:, : Hk * Dk].reshape(B, Hk, Dk)
        k = y[:, Hk * Dk: 2 * Hk * Dk].reshape(B, Hk, Dk)
        v = y[:, 2 * Hk * Dk:].reshape(B, Hv, Dv)
    else:
        q, k, v = (value(c[n], kind) for n in ("q", "k", "v"))
    o, new, invalid = expected(c, (q, k, v))
    if c["norm"]:
        z, nw = value(c["z"], kind), value(c["norm_weight"], kind)
        # out = w * o / sqrt(mean(o^2) + eps) * silu(z), per v-head; padding rows stay zero
        S = c["pool"].shape[0]
        live = np.array([c["idx"] is None or 0 <= int(c["idx"][r]) < S for r in range(B)])
        rms = np.sqrt((o * o).mean(axis=-1, keepdims=True) + c["norm_eps"])
        o = np.where(live[:, None, None], nw * (o / rms) * silu(z), 0.0)
    return o, new, new_cs, invalid


def run_middle(c, **overrides):
    """gdnkit.decode with the case's prologue and epilogue, on copies of both pools."""
    pool = c["pool"].copy()
    conv_state = c["conv_state"].copy() if c["conv"] else None
    counter = np.zeros(1, np.uint32)
    kw = case_kwargs(c, counter)
    if c["conv"]:
        kw.update(x=c["x"], conv_state=conv_state, conv_weight=c["conv_weight"],
                  conv_bias=c["conv_bias"])
    else:
        kw.update(q=c["q"], k=c["k"], v=c["v"])
    if c["norm"]:
        kw.update(z=c["z"], norm_weight=c["norm_weight"], norm_eps=c["norm_eps"])
    kw.update(overrides)
    out = gdnkit.decode(a=c["a"], b=c["b"], state=kw.pop("state", pool), **kw)
    return out, pool, conv_state, counter


def check_middle(c, out, pool, conv_state, counter):
    o_ref, s_ref, cs_ref, invalid = expected_middle(c)
    o = value(out, c["out"]).reshape(o_ref.shape)
    s = value(pool, c["state"])
    assert rel_err(o, o_ref) <= TOL_OUT[c["out"]], f"output error {rel_err(o, o_ref):.3g}"
    assert rel_err(s, s_ref) <= TOL_STATE[c["state"]], f"state error {rel_err(s, s_ref):.3g}"
    if c["conv"]:
        # the conv state only moves values: bitwise, untouched slots included
        assert np.array_equal(channel_major(value(conv_state, c["qkv"]), c), cs_ref)
    if c["idx"] is not None:
        S = c["pool"].shape[0]
        for r, s_in in enumerate(c["idx"]):
            if s_in < 0 or s_in >= S:
                assert not np.any(o[r]), f"padding row {r} is not zero"
    assert int(counter[0]) == invalid


MIDDLE_CASES = {
    # name: make_middle_case arguments
    "conv_norm_w4_bf16_vk": dict(W=4, qkv="bf16", state="f32", layout="vk", Hk=2, G=2),
    "conv_norm_w3_f32_kv_dk64_dv128": dict(W=3, qkv="f32", state="f32", layout="kv", Dv=128),
    "conv_norm_w2_f16_bf16state_vk": dict(W=2, qkv="f16", state="bf16", layout="vk", B=3),
    "conv_w4_f32_vk_no_bias": dict(norm=False, W=4, qkv="f32", layout="vk", bias=False),
    "conv_w3_bf16_kv_tap_major_tiled": dict(norm=False, W=3, qkv="bf16", state="bf16", layout="kv",
                                           tap_major=True, Hk=2, G=2, head_map="tiled"),
    "norm_f32_kv": dict(conv=False, qkv="f32", layout="kv", B=3),
    "norm_bf16_vk_out_f32": dict(conv=False, qkv="bf16", state="bf16", out="f32", layout="vk"),
    "conv_norm_f16_out_f32_maxnorm": dict(W=4, qkv="f16", out="f32", layout="kv", l2="max_norm",
                                          scale=0.3),
}


@pytest.mark.parametrize("name", sorted(MIDDLE_CASES))
def test_middle(name):
    c = make_middle_case(sum(map(ord, name)), **MIDDLE_CASES[name])
    check_middle(c, *run_middle(c))


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("indices", ["i32", "i64"])
def test_middle_pool_padding_invalid(layout, indices):
    """Slots, padding rows, separate write slots and out-of-range indices: both pools."""
    c = make_middle_case(61 if layout == "kv" else 62, B=6, Hk=1, G=2, layout=layout,
                         qkv="bf16", state="f32", indices=indices, pool_extra=4, padding=2,
                         out_indices=True, invalid=True, W=4)
    out, pool, conv_state, counter = run_middle(c)
    check_middle(c, out, pool, conv_state, counter)
    assert int(counter[0]) > 0


def test_middle_conv_state_views():
    """A tap-major conv pool passed as its channel-major transposed view (vLLM's layout),
    and nn.Conv1d's (conv_dim, 1, W) weight: the same results, bit for bit."""
    c = make_middle_case(77, W=4, qkv="bf16", layout="vk", tap_major=True, Hk=2, G=2)
    out, pool, conv_state, counter = run_middle(c)
    check_middle(c, out, pool, conv_state, counter)
    pool2 = c["pool"].copy()
    cs2 = c["conv_state"].copy()
    out2, _, _, _ = run_middle(c, state=pool2, conv_state=cs2.transpose(0, 2, 1),
                               conv_weight=c["conv_weight"][:, None, :])
    assert np.array_equal(out2, out) and np.array_equal(pool2, pool)
    assert np.array_equal(cs2, conv_state)


def test_programmatic_launch_flag():
    """programmatic_launch reaches the library (the host backend ignores it): same bits."""
    c = make_middle_case(83, W=2, qkv="bf16", layout="kv")
    out, pool, conv_state, _ = run_middle(c)
    out2, pool2, conv_state2, _ = run_middle(c, programmatic_launch=True)
    assert np.array_equal(out2, out) and np.array_equal(pool2, pool)
    assert np.array_equal(conv_state2, conv_state)


def test_middle_matches_separate_steps():
    """conv + step + norm in one call equals the step on the conv output, then the norm,
    computed here: checks that the fused call is the composition (not just close to a
    reference that shares its mistakes)."""
    c = make_middle_case(91, W=3, qkv="f32", state="f32", layout="kv", Hk=2, G=2, norm=False)
    out, pool, conv_state, _ = run_middle(c)
    # the conv output by hand, in float32 like the inputs, into the plain step
    cs = value(c["conv_state"], "f32")
    window = np.concatenate([cs[: c["B"]], value(c["x"], "f32")[:, :, None]], axis=2)
    y = silu((value(c["conv_weight"], "f32")[None] * window).sum(-1) + value(c["conv_bias"], "f32"))
    pool2 = c["pool"].copy()
    out2 = gdnkit.decode(qkv=y.astype(np.float32), a=c["a"], b=c["b"], state=pool2,
                         A_log=c["A_log"], dt_bias=c["dt_bias"], layout="kv", num_k_heads=2)
    assert rel_err(out.astype(np.float64), out2.astype(np.float64)) < 1e-5
    assert rel_err(pool.astype(np.float64), pool2.astype(np.float64)) < 1e-5
    assert np.array_equal(conv_state[:, :, :-1], c["conv_state"][:, :, 1:])
    assert np.array_equal(conv_state[:, :, -1], c["x"])


# ---- the golden files -------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                      "BF16": np.uint16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """{name: (numpy array, safetensors dtype)}, metadata. BF16 comes back as uint16 bits."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8: 8 + n])
    meta = {k.lower(): str(v) for k, v in header.pop("__metadata__", {}).items()}
    data = blob[8 + n:]
    tensors = {}
    for name, t in header.items():
        lo, hi = t["data_offsets"]
        arr = np.frombuffer(data[lo:hi], dtype=SAFETENSORS_DTYPES[t["dtype"]]).reshape(t["shape"])
        tensors[name] = (arr.copy(), t["dtype"])
    return tensors, meta


GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.safetensors"))
KIND = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
OUT_KIND = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16",
            "float16": "f16", "half": "f16", "bf16": "bf16", "bfloat16": "bf16"}


def test_golden_files_present():
    assert len(GOLDEN_FILES) >= 30, f"golden set missing from {GOLDEN_DIR}"


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.stem for p in GOLDEN_FILES])
def test_golden(path):
    t, meta = read_safetensors(path)
    assert meta.get("op", "gdn_decode").lower() == "gdn_decode"
    layout = meta["layout"].lower()
    state, state_dtype = t["state"]
    num_slots = int(meta.get("num_slots", state.shape[0]))
    state = np.ascontiguousarray(state[:num_slots])
    packed = "mixed_qkv" in t
    conv = "x" in t
    qkv_dtype = t["x" if conv else "mixed_qkv" if packed else "q"][1]
    out_kind = OUT_KIND[meta.get("output_dtype", qkv_dtype).lower()]
    scale = meta.get("scale", "default")
    counter = np.zeros(1, np.uint32)
    get = lambda name: t[name][0] if name in t else None  # noqa: E731
    kw = dict(
        A_log=get("A_log"), dt_bias=get("dt_bias"), state_indices=get("state_indices"),
        state_out_indices=get("state_out_indices"), invalid_index_count=counter, layout=layout,
        gate=meta.get("gate", "raw"), l2norm=meta.get("l2norm", "rsqrt"),
        l2norm_eps=float(meta.get("l2norm_eps", "1e-6")),
        scale=None if scale.lower() == "default" else float(scale),
        head_map=meta.get("head_map", "interleaved"),
        out_dtype={"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[out_kind],
    )
    if kw["gate"].lower() in ("precomputed", "pre"):
        kw["A_log"] = kw["dt_bias"] = None
    Dk = state.shape[2] if layout == "kv" else state.shape[3]
    # format 2: the conv prologue (x, both conv pool layouts) and the gated RMSNorm
    conv_state = None
    if conv:
        W = int(meta["conv_width"])
        x = get("x")
        conv_state = np.ascontiguousarray(t["conv_state"][0][:num_slots])
        weight = get("conv_weight")
        bias = get("conv_bias")
        kw.update(x=x.reshape(x.shape[0], -1), conv_state=conv_state,
                  conv_weight=weight.reshape(weight.shape[0], W),
                  conv_bias=None if bias is None else bias.reshape(-1))
        # the file names the pool's layout; the API reads it from the shape
        tap_major = meta.get("conv_state_layout", "channel_major") == "tap_major"
        assert conv_state.shape[2 if tap_major else 1] == x.size // x.shape[0]
    if "norm_weight" in t:
        z = get("z")
        kw.update(z=z.reshape(z.shape[0], -1), norm_weight=get("norm_weight").reshape(-1),
                  norm_eps=float(meta.get("norm_eps", "1e-6")))
    if conv:
        out = gdnkit.decode(a=get("a"), b=get("b"), state=state, **kw)
    elif packed:
        out = gdnkit.decode(a=get("a"), b=get("b"), state=state, qkv=get("mixed_qkv"), **kw)
    else:
        out = gdnkit.decode(get("q"), get("k"), get("v"), get("a"), get("b"), state,
                            num_k_heads=(get("q").size // get("q").shape[0]) // Dk, **kw)
    o_ref = t["expected_o"][0].astype(np.float64).reshape(out.shape)
    s_ref = t["expected_state"][0].astype(np.float64)[:num_slots]
    o = value(out, out_kind)
    s = value(state, KIND[state_dtype])
    assert rel_err(o, o_ref) <= TOL_OUT[out_kind], f"output error {rel_err(o, o_ref):.3g}"
    assert rel_err(s, s_ref) <= TOL_STATE[KIND[state_dtype]], f"state error {rel_err(s, s_ref):.3g}"
    # Padding rows exactly zero; state values the step must not touch bit-exact.
    idx = get("state_indices")
    if idx is not None:
        for r, s_in in enumerate(idx):
            if s_in < 0 or s_in >= num_slots:
                assert not np.any(o[r])
    untouched = value(t["state"][0][:num_slots], KIND[state_dtype]) == s_ref
    assert np.array_equal(s[untouched], s_ref[untouched])
    if conv:  # the conv pool only moves values: bitwise
        ecs, ecs_dtype = t["expected_conv_state"]
        cs_ref = value(ecs[:num_slots], KIND[ecs_dtype]) if ecs_dtype in KIND else ecs[:num_slots]
        assert np.array_equal(value(conv_state, KIND[qkv_dtype]), cs_ref.reshape(conv_state.shape))
    if "invalid_indices" in meta:
        assert int(counter[0]) == int(meta["invalid_indices"])


# ---- validation: ValueError with the library's message, nothing written ------------------

def snapshot(*arrays):
    return [x.copy() for x in arrays]


def unchanged(before, *arrays):
    return all(np.array_equal(x, y) for x, y in zip(before, arrays))


def base():
    c = make_case(20, B=2, Hk=1, G=2, Dk=64, Dv=64, layout="vk")
    pool = c["pool"].copy()
    out = np.full((2, 2, 64), 3.0, np.float32)
    kw = dict(A_log=c["A_log"], dt_bias=c["dt_bias"], out=out, layout="vk")
    return c, pool, out, kw


def test_library_message_head_stride():
    c, pool, out, kw = base()
    # v whose heads are 48 elements apart while Dv = 64: the library's own check.
    buf = np.zeros(2 * 2 * 64 + 64, np.float32)
    v = np.lib.stride_tricks.as_strided(buf, shape=(2, 2, 64), strides=(2 * 64 * 4, 48 * 4, 4))
    before = snapshot(pool, out)
    with pytest.raises(ValueError, match=r"^v: head stride 48 is smaller than Dv=64$"):
        gdnkit.decode(c["q"], c["k"], v, c["a"], c["b"], pool, **kw)
    assert unchanged(before, pool, out)


def test_library_message_aliasing():
    c, pool, out, kw = base()
    # q living inside the state pool: outputs must not alias inputs.
    q = pool.reshape(-1)[: c["q"].size].reshape(c["q"].shape)
    before = snapshot(pool, out)
    with pytest.raises(ValueError, match=r"^state: memory overlaps input q"):
        gdnkit.decode(q, c["k"], c["v"], c["a"], c["b"], pool, **kw)
    assert unchanged(before, pool, out)


def test_library_message_head_dims():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 24)).astype(np.float32)
    v = rng.standard_normal((1, 2, 32)).astype(np.float32)
    a = np.zeros((1, 2), np.float32)
    pool = np.ones((1, 2, 32, 24), np.float32)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=r"^head_dim_k: 24 is not a multiple of 16"):
        gdnkit.decode(q, q, v, a, a, pool, A_log=np.zeros(2, np.float32),
                      dt_bias=np.zeros(2, np.float32))
    assert unchanged(before, pool)


def test_library_message_heads_not_multiple():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, 32)).astype(np.float32)
    v = rng.standard_normal((1, 3, 32)).astype(np.float32)
    a = np.zeros((1, 3), np.float32)
    pool = np.ones((1, 3, 32, 32), np.float32)
    with pytest.raises(ValueError, match=r"^num_v_heads: 3 is not a multiple of num_k_heads=2$"):
        gdnkit.decode(q, q, v, a, a, pool, A_log=np.zeros(3, np.float32),
                      dt_bias=np.zeros(3, np.float32))


def test_library_message_small_pool():
    c, pool, out, kw = base()
    small = pool[:1].copy()
    before = snapshot(small, out)
    with pytest.raises(ValueError, match=r"^num_slots: 1 is smaller than batch=2"):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], small, **kw)
    assert unchanged(before, small, out)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, kw: kw.update(dt_bias=c["dt_bias"].astype(np.float64)),
         r"^dt_bias: dtype must be float32, got float64$"),
        (lambda c, kw: kw.update(A_log=c["A_log"][:1]), r"^A_log: expected shape \(2,\)"),
        (lambda c, kw: kw.update(A_log=None), r"^A_log: required with the raw gate$"),
        (lambda c, kw: c.update(v=c["v"][:, :, :32]), r"^v: shape \(2, 2, 32\) does not match"),
        (lambda c, kw: c.update(k=c["k"].astype(np.float16)), r"^q, k, v: dtypes"),
        (lambda c, kw: c.update(b=c["b"].astype(np.float16)), r"^b: dtype float16 differs"),
        (lambda c, kw: c.update(a=c["a"][:1]), r"^b: shape \(2, 2\) does not match a \(1, 2\)$"),
        (lambda c, kw: c.update(a=c["a"][:1], b=c["b"][:1]),
         r"^q, k, v: 2 and 2 rows, but a has 1$"),
        (lambda c, kw: c.update(q=c["q"].astype(np.float64), k=c["k"].astype(np.float64),
                                v=c["v"].astype(np.float64)),
         r"^q: dtype float64 is not supported"),
        (lambda c, kw: c.update(q=np.asfortranarray(c["q"])),
         r"^q: the last dimension must be contiguous"),
        (lambda c, kw: kw.update(state_indices=np.array([0, 1], np.uint8)),
         r"^state_indices: dtype must be int32 or int64, got uint8$"),
        (lambda c, kw: kw.update(state_indices=np.array([0, 1], np.int32),
                                 state_out_indices=np.array([0, 1], np.int64)),
         r"^state_out_indices: dtype int64 differs"),
        (lambda c, kw: kw.update(state_out_indices=np.array([0, 1], np.int32)),
         r"^state_out_indices: given without state_indices$"),
        (lambda c, kw: kw.update(out=np.zeros((2, 2, 64), np.float32)[:, :1]),
         r"^out: shape \(2, 1, 64\), expected"),
        (lambda c, kw: kw.update(invalid_index_count=np.zeros(2, np.uint32)),
         r"^invalid_index_count: expected one uint32"),
        (lambda c, kw: kw.update(layout="dv"), r"^layout: unknown value 'dv'"),
        (lambda c, kw: kw.update(l2norm="l1"), r"^l2norm: unknown value 'l1'"),
        (lambda c, kw: kw.update(scale=float("nan")), r"^scale: must be finite, got nan$"),
        (lambda c, kw: kw.update(l2norm_eps=-1.0), r"^l2norm_eps: must be finite and >= 0"),
    ],
)
def test_refused_and_nothing_written(change, message):
    c, pool, out, kw = base()
    change(c, kw)
    before = snapshot(pool, out)
    with pytest.raises(ValueError, match=message):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], pool, **kw)
    assert unchanged(before, pool, out)


def middle_base():
    c = make_middle_case(30, B=2, Hk=1, G=2, Dk=64, Dv=64, layout="vk", W=4)
    kw = dict(x=c["x"], conv_state=c["conv_state"].copy(), conv_weight=c["conv_weight"],
              conv_bias=c["conv_bias"], z=c["z"], norm_weight=c["norm_weight"],
              A_log=c["A_log"], dt_bias=c["dt_bias"], out=np.full((2, 2, 64), 3.0, np.float32),
              layout="vk")
    return c, c["pool"].copy(), kw


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, kw: kw.update(qkv=np.zeros((2, 256), np.float32)), r"^x: give either x"),
        (lambda c, kw: kw.update(q=c["q"], k=c["k"], v=c["v"]), r"^x: give either x"),
        (lambda c, kw: kw.update(conv_state=None), r"^conv_state: required with x"),
        (lambda c, kw: kw.update(conv_weight=None), r"^conv_weight: required with x"),
        (lambda c, kw: kw.update(x=None, q=c["q"], k=c["k"], v=c["v"]),
         r"^conv_state: given without x"),
        (lambda c, kw: kw.update(x=None, conv_state=None, conv_weight=None, q=c["q"], k=c["k"],
                                 v=c["v"]),
         r"^conv_bias: given without x"),
        (lambda c, kw: kw.update(x=c["x"][:, :200]),
         r"^x: width 200 is not 2\*Hk\*Dk \+ Hv\*Dv"),
        (lambda c, kw: kw.update(conv_weight=np.zeros((256, 5), np.float32)),
         r"^conv_weight: width W=5 \(its last dimension\) is not 2, 3 or 4$"),
        (lambda c, kw: kw.update(conv_weight=np.zeros((255, 4), np.float32)),
         r"^conv_weight: expected \(conv_dim=256, W\)"),
        (lambda c, kw: kw.update(conv_weight=np.zeros((4, 256), np.float32).T),
         r"^conv_weight: must be contiguous"),
        (lambda c, kw: kw.update(conv_weight=c["conv_weight"].astype(np.float16)),
         r"^conv_weight: dtype float16 differs from x's float32"),
        (lambda c, kw: kw.update(conv_bias=c["conv_bias"][:128]),
         r"^conv_bias: expected shape \(256,\)"),
        (lambda c, kw: kw.update(conv_state=np.zeros((2, 256, 4), np.float32)),
         r"^conv_state: expected \(num_slots, conv_dim=256, W-1=3\)"),
        (lambda c, kw: kw.update(conv_state=np.zeros((1, 256, 3), np.float32)),
         r"^conv_state: 1 slots, fewer than the state pool's 2$"),
        (lambda c, kw: kw.update(conv_state=np.zeros((2, 256, 3), np.float16)),
         r"^conv_state: dtype float16 differs from x's float32"),
        (lambda c, kw: kw.update(conv_state=np.zeros((2, 3, 256, 2), np.float32)[:, :, :, 0]
                                 .transpose(0, 2, 1)),
         r"^conv_state: channel stride 2 and tap stride 512 overlap"),
        (lambda c, kw: kw.update(norm_weight=None), r"^norm_weight: required with z"),
        (lambda c, kw: kw.update(z=None), r"^z: required with norm_weight"),
        (lambda c, kw: kw.update(norm_weight=c["norm_weight"][:32]),
         r"^norm_weight: expected shape \(64,\)"),
        (lambda c, kw: kw.update(z=c["z"].astype(np.float16)),
         r"^z: dtype float16 differs from x's float32"),
        (lambda c, kw: kw.update(z=c["z"][:, :1]),
         r"^z: shape \(2, 1, 64\), expected \[B=2, Hv=2, Dv=64\]"),
        (lambda c, kw: kw.update(norm_eps=float("inf")), r"^norm_eps: must be finite and >= 0"),
    ],
)
def test_middle_refused_and_nothing_written(change, message):
    c, pool, kw = middle_base()
    change(c, kw)
    written = [x for x in (pool, kw["out"], kw["conv_state"]) if x is not None]
    before = snapshot(*written)
    with pytest.raises(ValueError, match=message):
        gdnkit.decode(a=c["a"], b=c["b"], state=pool, **kw)
    assert unchanged(before, *written)


def test_middle_conv_state_read_only_refused():
    c, pool, kw = middle_base()
    kw["conv_state"].setflags(write=False)
    with pytest.raises(ValueError, match=r"^conv_state: the array is read-only"):
        gdnkit.decode(a=c["a"], b=c["b"], state=pool, **kw)


def test_middle_conv_state_aliasing_refused():
    """The conv pool overlapping the state pool: the library's own check."""
    c, pool, kw = middle_base()
    big = np.zeros(pool.size + 2 * 256 * 3, np.float32)
    big[: pool.size] = pool.reshape(-1)
    pool_view = big[: pool.size].reshape(pool.shape)
    kw["conv_state"] = big[pool.size - 256 * 3: pool.size + 256 * 3].reshape(2, 256, 3)
    before = snapshot(big)
    with pytest.raises(ValueError, match=r"overlaps"):
        gdnkit.decode(a=c["a"], b=c["b"], state=pool_view, **kw)
    assert unchanged(before, big)


def test_state_layout_must_be_dense():
    c, pool, out, kw = base()
    transposed = np.ascontiguousarray(pool.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    before = snapshot(transposed, out)
    with pytest.raises(ValueError, match=r"^state: every slot's \[Hv, Dv, Dk\] block must be dense"):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], transposed, **kw)
    assert unchanged(before, transposed, out)


def test_read_only_state_refused():
    c, pool, out, kw = base()
    pool.setflags(write=False)
    with pytest.raises(ValueError, match=r"^state: the array is read-only"):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], pool, **kw)


def test_read_only_inputs_accepted():
    c, pool, out, kw = base()
    for name in ("q", "k", "v", "a", "b"):
        c[name].setflags(write=False)
    gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], pool, **kw)


def test_not_an_array():
    c, pool, out, kw = base()
    with pytest.raises(ValueError, match=r"^q: expected an array with DLPack"):
        gdnkit.decode([[1.0]], c["k"], c["v"], c["a"], c["b"], pool, **kw)


def test_info():
    info = gdnkit.info()
    assert info["version"] == gdnkit.__version__
    assert info["backends"]["host"]["built"] and info["backends"]["host"]["available"]
    assert gdnkit.backend_built("host")
