"""gdnkit.decode on numpy arrays (the host backend), against the float64 reference of
numpy_cases.py.

Every option of docs/operation.md, random inputs from realistic ranges (fixed seeds,
random non-zero initial state, Dk != Dv, both layouts), the fused middle of a layer
(conv1d prologue and gated RMSNorm), the committed golden files (format 2 too) and
strided views. test_numpy_refused.py has the validation.
"""
import json
import struct
from pathlib import Path

import numpy as np
import pytest

import gdnkit
from numpy_cases import (TOL_OUT, TOL_STATE, check, check_middle, expected, make_case,
                         make_middle_case, rel_err, run, run_middle, silu, value)

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "golden"


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


def padding_rows(t, meta, num_slots):
    """The rows of a case that are padding: a read slot negative or out of range, or (with
    per-token slots) num_accepted_tokens outside [1, T]."""
    get = lambda name: t[name][0] if name in t else None  # noqa: E731
    idx, tsi, acc = get("state_indices"), get("token_state_indices"), get("num_accepted_tokens")
    T = int(meta.get("num_tokens", "1"))
    rows = []
    n_rows = len(idx) if idx is not None else len(tsi) if tsi is not None else 0
    for r in range(n_rows):
        if idx is not None:
            slot = int(idx[r])
        else:
            n = int(acc[r]) if acc is not None else 1
            slot = int(tsi[r, n - 1]) if 1 <= n <= T else -1
        if slot < 0 or slot >= num_slots:
            rows.append(r)
    return rows


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.stem for p in GOLDEN_FILES])
def test_golden(path):
    t, meta = read_safetensors(path)
    assert meta.get("op", "gdn_decode").lower() == "gdn_decode"
    # format 3: several tokens a row, q [B, T, ...] or, with cu_seqlens, [total_tokens, ...]
    v3 = meta.get("format_version") == "3"
    T = int(meta.get("num_tokens", "1"))
    cu = t["cu_seqlens"][0] if "cu_seqlens" in t else None
    lead = 2 if v3 and cu is None else 1  # the leading dims that index tokens
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
    if v3:
        kw.update(num_tokens=T, cu_seqlens=cu, token_state_indices=get("token_state_indices"),
                  num_accepted_tokens=get("num_accepted_tokens"),
                  update_state=meta.get("update_state", "true").lower() == "true")
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
        kw.update(x=x.reshape(*x.shape[:lead], -1), conv_state=conv_state,
                  conv_weight=weight.reshape(weight.shape[0], W),
                  conv_bias=None if bias is None else bias.reshape(-1))
        # the file names the pool's layout; the API reads it from the shape
        tap_major = meta.get("conv_state_layout", "channel_major") == "tap_major"
        assert conv_state.shape[2 if tap_major else 1] == x.shape[-1]
    if "norm_weight" in t:
        z = get("z")
        kw.update(z=z.reshape(*z.shape[:lead], -1), norm_weight=get("norm_weight").reshape(-1),
                  norm_eps=float(meta.get("norm_eps", "1e-6")))
    # format 3: buffers for every token's state (and conv window), NaN where nothing is
    # expected to be written (bf16: its bits)
    nan = lambda shape, dtype: np.full(shape, 0x7FC0 if dtype == np.uint16 else np.nan, dtype)  # noqa: E731
    inter = inter_conv = None
    if "expected_intermediate_states" in t:
        inter = nan(t["expected_intermediate_states"][0].shape, state.dtype)
        kw["intermediate_states"] = inter
    if "expected_intermediate_conv_states" in t:
        inter_conv = nan(t["expected_intermediate_conv_states"][0].shape, conv_state.dtype)
        kw["intermediate_conv_states"] = inter_conv
    if conv:
        out = gdnkit.decode(a=get("a"), b=get("b"), state=state, **kw)
    elif packed:
        out = gdnkit.decode(a=get("a"), b=get("b"), state=state, qkv=get("mixed_qkv"), **kw)
    else:
        q = get("q")
        out = gdnkit.decode(q, get("k"), get("v"), get("a"), get("b"), state,
                            num_k_heads=(q.size // int(np.prod(q.shape[:lead]))) // Dk, **kw)
    o_ref = t["expected_o"][0].astype(np.float64).reshape(out.shape)
    s_ref = t["expected_state"][0].astype(np.float64)[:num_slots]
    o = value(out, out_kind)
    s = value(state, KIND[state_dtype])
    # with several tokens, the output of every token after the first comes from a state
    # stored in the state's dtype (docs/golden-format.md, Tolerances)
    tol_out = TOL_OUT[out_kind]
    if T > 1:
        tol_out = max(tol_out, TOL_STATE[KIND[state_dtype]])
    assert rel_err(o, o_ref) <= tol_out, f"output error {rel_err(o, o_ref):.3g}"
    assert rel_err(s, s_ref) <= TOL_STATE[KIND[state_dtype]], f"state error {rel_err(s, s_ref):.3g}"
    # Padding rows exactly zero (every token of theirs); state values the step must not
    # touch bit-exact.
    for r in padding_rows(t, meta, num_slots):
        assert not np.any(o[cu[r]:cu[r + 1]] if cu is not None else o[r]), f"padding row {r}"
    if inter is not None:  # the entries the case expects (NaN: tokens a row lacks, padding)
        ref = t["expected_intermediate_states"][0].astype(np.float64)
        seen = ~np.isnan(ref)
        got = value(inter, KIND[state_dtype])
        assert rel_err(got[seen], ref[seen]) <= TOL_STATE[KIND[state_dtype]]
    if inter_conv is not None:  # only moves values: bitwise
        ref = t["expected_intermediate_conv_states"][0].astype(np.float64)
        seen = ~np.isnan(ref)
        assert np.array_equal(value(inter_conv, KIND[qkv_dtype])[seen], ref[seen])
    untouched = value(t["state"][0][:num_slots], KIND[state_dtype]) == s_ref
    assert np.array_equal(s[untouched], s_ref[untouched])
    if conv:  # the conv pool only moves values: bitwise
        ecs, ecs_dtype = t["expected_conv_state"]
        cs_ref = value(ecs[:num_slots], KIND[ecs_dtype]) if ecs_dtype in KIND else ecs[:num_slots]
        assert np.array_equal(value(conv_state, KIND[qkv_dtype]), cs_ref.reshape(conv_state.shape))
    if "invalid_indices" in meta:
        assert int(counter[0]) == int(meta["invalid_indices"])
