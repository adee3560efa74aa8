#!/usr/bin/env python3
"""Write gdnkit's golden cases: one GatedDeltaNet decode step per safetensors file.

This is an independent float64 reference. It uses Python 3 and numpy only and
never imports or calls gdnkit. The format is described in docs/golden-format.md:
version 1 is the decode step alone; version 2 adds the optional conv1d prologue
(x, conv_state, conv_weight, conv_bias -> expected_conv_state) and the gated
RMSNorm epilogue (z, norm_weight). Only cases that use them say version 2.
Version 3 gives each row several tokens (speculative decoding): the mt_ cases.

    gen_golden.py --out DIR                        the standard set (tests/golden)
    gen_golden.py --out DIR --random N --seed S    N random cases with random options
    gen_golden.py --out DIR --random N --seed S --multi-token
                                                   N random version 3 cases
    gen_golden.py --list                           the names of the standard cases

Every case draws its inputs from numpy.random.default_rng(seed) with a fixed
seed, rounds them to the dtype they are stored in, and computes the expected
results in float64 from those rounded values.

The case table (DEFAULTS, the standard set, random cases) is golden_cases.py and
the float64 reference golden_reference.py, both next to this file; this script
builds each case from them and writes it.
"""

import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # pragma: no cover
    sys.exit("gen_golden.py needs numpy (Debian: apt install python3-numpy; run it with /usr/bin/python3)")

# The case table (golden_cases.py) and the float64 reference (golden_reference.py)
# live next to this file. Run as a script, as before: no bytecode written into tools/.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_cases import CASES, DEFAULTS, describe, random_case, random_case_multi  # noqa: E402
from golden_reference import (DTYPE_SIZE, check_slot_rule, conv_reference, count_invalid_multi,  # noqa: E402
                              decode, encode, gated_rmsnorm, multi_token_plan, reference,
                              reference_multi, reference_multi_chained)

FORMAT_VERSION = "1"    # cases with neither of the optional stages (the original format)
FORMAT_VERSION_2 = "2"  # cases that use the conv1d prologue or the gated RMSNorm epilogue
FORMAT_VERSION_3 = "3"  # several tokens per row (speculative decoding)

# the per-token tensors: (B, T, ...) dense, (total_tokens, ...) packed by cu_seqlens
PER_TOKEN = ("q", "k", "v", "z", "mixed_qkv", "x", "a", "b", "expected_o")

# ---------------------------------------------------------------------------
# safetensors, written by hand
# ---------------------------------------------------------------------------

def write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype, shape, numpy array of the stored representation).

    Layout: u64 little-endian header length N, N bytes of JSON header (padded with
    spaces to a multiple of 8), then the data buffer. Tensors are laid out in order of
    decreasing element size, then name, so every tensor starts aligned to its element.
    """
    order = sorted(tensors, key=lambda n: (-DTYPE_SIZE[tensors[n][0]], n))
    header = {"__metadata__": {str(key): str(val) for key, val in metadata.items()}}
    blobs, offset = [], 0
    for name in order:
        dtype, shape, arr = tensors[name]
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        assert len(raw) == DTYPE_SIZE[dtype] * int(np.prod(shape, dtype=np.int64)), name
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape],
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# building one case
# ---------------------------------------------------------------------------

def _gate_params(rng, Hv):
    # A_log = log(U(1, 16)); dt_bias = log(expm1(dt)), dt log-uniform in [1e-3, 1e-1]
    A_log = np.log(rng.uniform(1.0, 16.0, Hv))
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), Hv))
    dt_bias = np.log(np.expm1(dt))
    return A_log, dt_bias


def _set_norms(x, norms, rng):
    """Rescale the heads of x (B, Hk, D) to the given norms (B*Hk of them, in order); 0 gives a zero head."""
    B, Hk, _ = x.shape
    for idx, n in enumerate(norms):
        row, hk = divmod(idx, Hk)
        d = rng.standard_normal(x.shape[2])
        x[row, hk] = d / np.linalg.norm(d) * n
    return x


def _tweak_tiny_norm(c, rng, x):
    # q/k norms far below 1 and around eps (but not within a factor 3 of eps = 1e-6,
    # where an fp32 max() may legitimately pick the other side), and one k head exactly 0.
    x["q"] = _set_norms(x["q"], [1e-4, 1e-7, 1e-5, 3e-7], rng)
    x["k"] = _set_norms(x["k"], [1e-5, 0.0, 1e-7, 1e-4], rng)


def _tweak_extreme_gate(c, rng, x):
    # Targets for a + dt_bias per (row, v-head), and fixed A_log / b_raw, to hit the edges:
    #   x = 25, 60, 21: softplus's linear branch (x > 20)
    #   A_log = log 16 with x = 60: g = -960, exp(g) = 0 even in float64 (state fully forgotten)
    #   A_log = log 16 with x = 25: g = -400, exp(g) ~ 2e-174 (0 in fp32)
    #   x = -30: softplus ~ 1e-13, g ~ -1e-13: no decay at all
    #   b = +30 / -30: sigmoid saturated, beta = 1 - 9e-14 / 9e-14
    # (B=2, Hv=3 expected: v-head 0 has A_log = 0, v-head 1 A_log = log 16, v-head 2 random.)
    x["A_log"][0] = 0.0
    x["A_log"][1] = math.log(16.0)
    # (1, 2) has no decay and beta ~ 0: its state passes through almost unchanged.
    target = {(0, 0): 25.0, (0, 1): 60.0, (0, 2): 21.0,
              (1, 0): 60.0, (1, 1): 25.0, (1, 2): -30.0}
    for (row, h), t in target.items():
        x["a"][row, h] = t - x["dt_bias"][h]
    x["b"][0, 2] = 30.0
    x["b"][1, 1] = 30.0
    x["b"][1, 2] = -30.0


TWEAKS = {"tiny_norm": _tweak_tiny_norm, "extreme_gate": _tweak_extreme_gate}


def _draw_inputs(c, rng, num_slots):
    """The raw inputs in float64 (x: name -> array), drawn from rng in a fixed order; and the state's shape."""
    B, Hk, Hv, Dk, Dv = c["B"], c["Hk"], c["Hv"], c["Dk"], c["Dv"]
    # ---- raw inputs in float64, realistic ranges ----
    x = {}
    x["q"] = rng.standard_normal((B, Hk, Dk))
    x["k"] = rng.standard_normal((B, Hk, Dk))
    x["v"] = rng.standard_normal((B, Hv, Dv))
    if c["gate"] == "raw":
        x["a"] = rng.standard_normal((B, Hv))
        x["b"] = rng.standard_normal((B, Hv))
        x["A_log"], x["dt_bias"] = _gate_params(rng, Hv)
    else:
        # g mostly U(-3, -1e-4), a few strongly negative (U(-20, -8)); beta U(0, 1)
        g = rng.uniform(-3.0, -1e-4, (B, Hv))
        extreme = rng.random((B, Hv)) < 0.2
        extreme.flat[0] = True
        g[extreme] = rng.uniform(-20.0, -8.0, int(extreme.sum()))
        x["a"] = g
        # beta per column when asked (b (B, Hv, Dv)), else per head
        x["b"] = rng.uniform(0.0, 1.0, (B, Hv, Dv) if c["beta_per_channel"] else (B, Hv))
    shape_state = (num_slots, Hv, Dk, Dv) if c["layout"] == "kv" else (num_slots, Hv, Dv, Dk)
    x["state"] = rng.normal(0.0, 0.5, shape_state)  # random and non-zero everywhere, unused slots too
    if c["tweak"]:
        TWEAKS[c["tweak"]](c, rng, x)
    if c["l2norm"] == "none":  # hand over q, k already normalized (then rounded)
        for n in ("q", "k"):
            x[n] = x[n] / np.linalg.norm(x[n], axis=-1, keepdims=True)
    # Format version 2 inputs, drawn after everything above so that cases without them keep
    # their values. With conv, q, k, v above are drawn but unused: the conv output replaces them.
    W = c["conv_width"]
    conv, norm = W > 0, c["norm"]
    cdim = 2 * Hk * Dk + Hv * Dv
    if conv:
        assert W in (2, 3, 4) and not c["packed"] and c["tweak"] is None and c["l2norm"] != "none"
        x["x"] = rng.standard_normal((B, cdim))                      # x ~ N(0, 1)
        x["conv_weight"] = rng.uniform(-0.6, 0.6, (cdim, W))          # ~ U(-0.6, 0.6)
        x["conv_bias"] = rng.uniform(-0.2, 0.2, cdim)                 # ~ U(-0.2, 0.2)
        x["conv_state"] = rng.standard_normal((num_slots, cdim, W - 1))  # N(0, 1), every slot
    if norm:
        x["z"] = rng.standard_normal((B, Hv, Dv))                     # z ~ N(0, 1)
        x["norm_weight"] = rng.uniform(0.5, 1.5, Dv)                  # ~ U(0.5, 1.5)
    return x, shape_state


def _round_inputs(c, x):
    """Round the inputs (all but the index arrays) to their storage dtypes.

    Returns (stored: name -> stored representation, val: name -> the float64 values it holds)."""
    dt, st = c["dtype"], c["state_dtype"]
    stored, val = {}, {}
    for n in ("q", "k", "v", "a", "b"):
        stored[n] = encode(x[n], dt)
        val[n] = decode(stored[n], dt)
    if c["gate"] == "raw":
        for n in ("A_log", "dt_bias"):
            stored[n] = encode(x[n], "F32")
            val[n] = decode(stored[n], "F32")
    stored["state"] = encode(x["state"], st)
    val["state"] = decode(stored["state"], st)
    v2_names = [n for n in ("x", "conv_weight", "conv_bias", "conv_state", "z", "norm_weight")
                if n in x and (n != "conv_bias" or c["conv_bias"])]
    for n in v2_names:  # all in the q/k/v dtype
        stored[n] = encode(x[n], dt)
        val[n] = decode(stored[n], dt)
    return stored, val


def _round_and_run(c, x, num_slots, scale):
    """Round the inputs to their storage dtypes and run the reference on the rounded values.

    Returns (stored, o, new_state, new_conv_state (None without conv), invalid index count)."""
    B, Hk, Hv, Dk, Dv = c["B"], c["Hk"], c["Hv"], c["Dk"], c["Dv"]
    conv, norm = c["conv_width"] > 0, c["norm"]
    new_conv_state = None

    # ---- round to the storage dtypes; the reference sees only the rounded values ----
    stored, val = _round_inputs(c, x)
    for n in ("state_indices", "state_out_indices"):
        if c[n] is not None:
            stored[n] = encode(np.array(c[n], dtype=np.int64), c["index_dtype"])
            assert stored[n].astype(np.int64).tolist() == list(c[n]), f"{n} does not fit {c['index_dtype']}"
            val[n] = stored[n].astype(np.int64)

    if conv:
        # the conv output y (float64, never rounded) is the packed q|k|v row of the step
        y, new_conv_state = conv_reference(val["x"], val["conv_state"], val["conv_weight"],
                                           val.get("conv_bias"), val.get("state_indices"),
                                           val.get("state_out_indices"))
        val["q"] = y[:, :Hk * Dk].reshape(B, Hk, Dk)
        val["k"] = y[:, Hk * Dk:2 * Hk * Dk].reshape(B, Hk, Dk)
        val["v"] = y[:, 2 * Hk * Dk:].reshape(B, Hv, Dv)

    o, new_state = reference(
        val["q"], val["k"], val["v"], val["a"], val["b"], val.get("A_log"), val.get("dt_bias"),
        val["state"], c["layout"], c["l2norm"], c["eps"], scale, c["head_map"], c["gate"],
        val.get("state_indices"), val.get("state_out_indices"))
    if norm:
        rows = [r for r in range(B)
                if 0 <= (int(val["state_indices"][r]) if "state_indices" in val else r) < num_slots]
        o = gated_rmsnorm(o, val["z"], val["norm_weight"], c["norm_eps"], rows)

    invalid = sum(int(i) >= num_slots for n in ("state_indices", "state_out_indices")
                  if n in val for i in val[n])
    return stored, o, new_state, new_conv_state, invalid


def _file_tensors(c, stored, o, new_state, new_conv_state, shape_state, num_slots):
    """The tensors as they go into the file: name -> (dtype, shape, stored array)."""
    B, Hk, Hv, Dk, Dv = c["B"], c["Hk"], c["Hv"], c["Dk"], c["Dv"]
    dt, st = c["dtype"], c["state_dtype"]
    W = c["conv_width"]
    conv, norm = W > 0, c["norm"]
    cdim = 2 * Hk * Dk + Hv * Dv
    # ---- tensors as they go into the file ----
    ms = c["meta_style"]
    t = {}
    v2d = c["v2_defaults"]
    if conv:
        x_shape = (B, 1, cdim) if v2d else (B, cdim)
        t["x"] = (dt, x_shape, stored["x"].reshape(x_shape))
        w_shape = (cdim, 1, W) if v2d else (cdim, W)
        t["conv_weight"] = (dt, w_shape, stored["conv_weight"].reshape(w_shape))
        if c["conv_bias"]:
            t["conv_bias"] = (dt, (cdim,), stored["conv_bias"])
        # the pool is computed channel-major (S, conv_dim, W-1); tap-major stores (S, W-1, conv_dim)
        tap = c["conv_state_layout"] == "tap_major"
        as_stored = (lambda a: a.transpose(0, 2, 1)) if tap else (lambda a: a)
        cs_shape = (num_slots, W - 1, cdim) if tap else (num_slots, cdim, W - 1)
        t["conv_state"] = (dt, cs_shape, as_stored(stored["conv_state"]))
        # The conv state is pure data movement (every value an input value), compared bitwise:
        # F64 for F32 inputs, F32 (which holds every F16/BF16 value exactly) otherwise.
        ecs = "F64" if dt == "F32" else "F32"
        t["expected_conv_state"] = (ecs, cs_shape, as_stored(encode(new_conv_state, ecs)))
    if norm:
        z_shape = (B, Hv * Dv) if v2d else (B, Hv, Dv)
        t["z"] = (dt, z_shape, stored["z"].reshape(z_shape))
        t["norm_weight"] = (dt, (Dv,), stored["norm_weight"])
    if conv:
        pass  # q, k, v come from x
    elif c["packed"]:
        mixed = np.concatenate([stored["q"].reshape(B, -1), stored["k"].reshape(B, -1),
                                stored["v"].reshape(B, -1)], axis=1)
        t["mixed_qkv"] = (dt, mixed.shape, mixed)
    else:
        qk_shape, v_shape = (B, Hk, Dk), (B, Hv, Dv)
        if ms == "aliases_unsqueezed":
            qk_shape, v_shape = (B, 1, Hk, Dk), (B, 1, Hv, Dv)
        elif ms == "aliases_flat":
            qk_shape, v_shape = (B, Hk * Dk), (B, Hv * Dv)
        t["q"] = (dt, qk_shape, stored["q"].reshape(qk_shape))
        t["k"] = (dt, qk_shape, stored["k"].reshape(qk_shape))
        t["v"] = (dt, v_shape, stored["v"].reshape(v_shape))
    ab_shape = (B, 1, Hv) if ms == "aliases_unsqueezed" else (B, Hv)
    t["a"] = (dt, ab_shape, stored["a"].reshape(ab_shape))
    b_shape = ab_shape + ((Dv,) if c["beta_per_channel"] else ())
    t["b"] = (dt, b_shape, stored["b"].reshape(b_shape))
    if c["gate"] == "raw":
        t["A_log"] = ("F32", (Hv,), stored["A_log"])
        t["dt_bias"] = ("F32", (Hv,), stored["dt_bias"])
    t["state"] = (st, shape_state, stored["state"])
    for n in ("state_indices", "state_out_indices"):
        if c[n] is not None:
            t[n] = (c["index_dtype"], (B,), stored[n])
    o_shape = {"aliases_unsqueezed": (B, 1, Hv, Dv), "aliases_flat": (B, Hv * Dv)}.get(ms, (B, Hv, Dv))
    t["expected_o"] = ("F64", o_shape, o.reshape(o_shape))
    # expected_state is F64 when the state is F32. For an F16/BF16 state it is F32: that holds
    # every untouched F16/BF16 value exactly, and its rounding (~6e-8 relative) is far below the
    # F16/BF16 state tolerances (2e-3, 8e-3); it halves the size of those files.
    es = c["expected_state_dtype"] or ("F64" if st == "F32" else "F32")
    t["expected_state"] = (es, shape_state, encode(new_state, es))
    return t


def _metadata(c, scale, out_dtype, num_slots, invalid):
    """The metadata, in the style c["meta_style"] asks for."""
    dt = c["dtype"]
    W = c["conv_width"]
    conv, norm = W > 0, c["norm"]
    ms, v2d = c["meta_style"], c["v2_defaults"]
    # ---- metadata ----
    meta = {"op": "gdn_decode", "format_version": FORMAT_VERSION, "layout": c["layout"]}
    if ms == "full":
        meta.update({
            "l2norm": c["l2norm"], "l2norm_eps": repr(c["eps"]), "scale": repr(float(scale)),
            "head_map": c["head_map"], "gate": c["gate"], "output_dtype": out_dtype,
            "num_slots": str(num_slots)})
    elif ms == "minimal":
        # only what has no default; every convention takes its default
        assert c["l2norm"] == "rsqrt" and c["eps"] == 1e-6 and c["scale"] is None
        assert c["head_map"] == "interleaved" and c["gate"] == "raw" and out_dtype == dt
    elif ms == "aliases_unsqueezed":
        # upper/mixed case and alias spellings, scale "default", an unknown key torch writes
        alias_l2 = {"rsqrt": "Default", "max_norm": "Normalize", "none": "OFF"}[c["l2norm"]]
        alias_hm = {"interleaved": "Repeat_Interleave", "tiled": "TILE"}[c["head_map"]]
        alias_dt = {"F32": "float32", "F16": "Half", "BF16": "bfloat16"}[out_dtype]
        assert c["scale"] is None
        meta.update({"op": "GDN_DECODE", "layout": c["layout"].upper(), "l2norm": alias_l2,
                     "l2norm_eps": "0.000001", "scale": "default", "head_map": alias_hm,
                     "gate": "RAW" if c["gate"] == "raw" else "Pre", "output_dtype": alias_dt,
                     "num_slots": str(num_slots), "format": "pt"})
    elif ms == "aliases_flat":
        alias_l2 = {"rsqrt": "rsqrt", "max_norm": "f_normalize", "none": "none"}[c["l2norm"]]
        alias_hm = {"interleaved": "interleaved", "tiled": "tile"}[c["head_map"]]
        alias_dt = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}[out_dtype]
        meta.update({"layout": c["layout"], "l2norm": alias_l2, "l2norm_eps": "1e-6",
                     "scale": repr(float(scale)), "head_map": alias_hm,
                     "gate": "raw" if c["gate"] == "raw" else "precomputed",
                     "output_dtype": alias_dt})
    else:
        raise ValueError(ms)
    if conv or norm:
        meta["format_version"] = FORMAT_VERSION_2
        if conv:
            meta["conv_width"] = str(W)
            if not v2d:
                meta["conv_state_layout"] = c["conv_state_layout"]
        if norm and not v2d:
            meta["norm_eps"] = repr(float(c["norm_eps"]))
        if v2d:
            assert c["conv_state_layout"] == "channel_major" and c["norm_eps"] == 1e-6
    meta["invalid_indices"] = str(invalid)
    return meta


def build_case(opts, seed):
    """Draw the inputs, round them to their dtypes, run the reference. Returns (tensors, metadata)."""
    c = dict(DEFAULTS)
    c.update(opts)
    if c["num_tokens"] is not None:
        return build_case_multi(c, seed)
    assert not c["beta_per_channel"], "per-channel beta is a format version 3 case (num_tokens)"
    rng = np.random.default_rng(seed)
    B, Hk, Hv, Dk = c["B"], c["Hk"], c["Hv"], c["Dk"]
    assert Hv % Hk == 0
    num_slots = c["num_slots"] if c["num_slots"] is not None else B
    dt = c["dtype"]
    out_dtype = c["output_dtype"] or dt
    scale = c["scale"] if c["scale"] is not None else Dk ** -0.5

    x, shape_state = _draw_inputs(c, rng, num_slots)
    stored, o, new_state, new_conv_state, invalid = _round_and_run(c, x, num_slots, scale)
    t = _file_tensors(c, stored, o, new_state, new_conv_state, shape_state, num_slots)
    meta = _metadata(c, scale, out_dtype, num_slots, invalid)
    return t, meta


# ---------------------------------------------------------------------------
# format version 3: several tokens per row
# ---------------------------------------------------------------------------

def _row_tokens(c):
    """The token rows each row owns, and their number: row b has tokens b*T .. b*T+T-1
    (dense), or cu_seqlens[b] .. cu_seqlens[b+1]-1 (packed)."""
    B, T, cu = c["B"], c["num_tokens"], c["cu_seqlens"]
    if cu is None:
        return [list(range(b * T, (b + 1) * T)) for b in range(B)], B * T
    # only valid ranges, and every packed token belongs to a row
    assert len(cu) == B + 1 and cu[0] == 0, cu
    assert all(0 <= cu[b + 1] - cu[b] <= T for b in range(B)), cu
    assert cu[B] > 0, "a case needs at least one token to draw inputs for"
    return [list(range(cu[b], cu[b + 1])) for b in range(B)], cu[B]


def _check_multi_options(c):
    """The combinations the library accepts (others are refused before any work)."""
    T = c["num_tokens"]
    assert 1 <= T <= 16
    assert c["tweak"] is None and c["meta_style"] == "full" and not c["v2_defaults"]
    if c["token_state_indices"] is not None:
        assert not c["intermediate"] and c["update_state"]
        assert len(c["token_state_indices"]) == c["B"] and all(len(r) == T for r in c["token_state_indices"])
    if c["num_accepted_tokens"] is not None:
        assert c["token_state_indices"] is not None and c["state_indices"] is None
    if c["state_out_indices"] is not None:
        assert c["state_indices"] is not None
    if c["intermediate_conv"]:
        assert c["conv_width"] > 0
    if c["beta_per_channel"]:
        assert c["gate"] == "precomputed"
    names = ("state_indices", "state_out_indices", "token_state_indices", "num_accepted_tokens", "cu_seqlens")
    assert (c["index_dtype"] is not None) == any(c[n] is not None for n in names)


def build_case_multi(c, seed):
    """A format version 3 case (c: DEFAULTS updated with the case's options). Returns (tensors, metadata).

    The per-token inputs are drawn exactly as a one-token case with one row per token
    would draw them (total_tokens rows, or B*T), so a case is as easy to follow as its
    one-token counterparts; the reference runs on the rounded values and is checked,
    bit for bit, against the same tokens run as chained one-token steps."""
    _check_multi_options(c)
    rng = np.random.default_rng(seed)
    B, T, Hk, Hv, Dk, Dv = c["B"], c["num_tokens"], c["Hk"], c["Hv"], c["Dk"], c["Dv"]
    assert Hv % Hk == 0
    num_slots = c["num_slots"] if c["num_slots"] is not None else B
    scale = c["scale"] if c["scale"] is not None else Dk ** -0.5
    out_dtype = c["output_dtype"] or c["dtype"]
    st, it = c["state_dtype"], c["index_dtype"]
    conv, norm = c["conv_width"] > 0, c["norm"]
    row_tokens, ntok = _row_tokens(c)
    ct = dict(c, B=ntok, state_indices=None, state_out_indices=None)  # one "row" per token

    x, shape_state = _draw_inputs(ct, rng, num_slots)
    stored, val = _round_inputs(ct, x)
    idx = {}
    for n in ("state_indices", "state_out_indices", "token_state_indices", "num_accepted_tokens", "cu_seqlens"):
        if c[n] is not None:
            want = np.array(c[n], dtype=np.int64)
            stored[n] = encode(want, it)
            assert np.array_equal(stored[n].astype(np.int64), want), f"{n} does not fit {it}"
            idx[n] = stored[n].astype(np.int64)
    routing = dict(state_indices=idx.get("state_indices"), state_out_indices=idx.get("state_out_indices"),
                   token_state_indices=idx.get("token_state_indices"),
                   num_accepted_tokens=idx.get("num_accepted_tokens"), update_state=c["update_state"])
    plans = multi_token_plan(num_slots, T, row_tokens, **routing)
    check_slot_rule(plans)
    invalid = count_invalid_multi(num_slots, T, row_tokens, **routing)

    q, k, v = val["q"], val["k"], val["v"]
    conv_args = norm_args = None
    if conv:
        conv_args = (val["x"], val["conv_state"], val["conv_weight"], val.get("conv_bias"))
    if norm:
        norm_args = (val["z"], val["norm_weight"], c["norm_eps"])
    common = (q, k, v, val["a"], val["b"], val.get("A_log"), val.get("dt_bias"), val["state"], st,
              c["layout"], c["l2norm"], c["eps"], scale, c["head_map"], c["gate"])
    o, new_state, new_conv, inter, inter_conv = reference_multi(*common, plans, T, conv=conv_args,
                                                                norm=norm_args)
    # The same tokens as chained one-token steps must give the same results, bit for bit.
    chained = reference_multi_chained(*common, T, row_tokens, conv=conv_args, norm=norm_args, **routing)
    for name, got, want in zip(("expected_o", "expected_state", "expected_conv_state",
                                "expected_intermediate_states", "expected_intermediate_conv_states"),
                               (o, new_state, new_conv, inter, inter_conv), chained):
        assert (got is None) == (want is None) and (
            got is None or np.array_equal(got, want, equal_nan=True)), f"{name}: chained one-token steps differ"

    t = _file_tensors(ct, stored, o, new_state, new_conv, shape_state, num_slots)
    if c["cu_seqlens"] is None:  # dense: (B*T, ...) -> (B, T, ...)
        for n in PER_TOKEN:
            if n in t:
                dt_, shape, arr = t[n]
                shape = (B, T) + tuple(shape[1:])
                t[n] = (dt_, shape, arr.reshape(shape))
    for n in ("state_indices", "state_out_indices", "num_accepted_tokens", "cu_seqlens"):
        if n in idx:
            t[n] = (it, stored[n].shape, stored[n])
    if "token_state_indices" in idx:
        t["token_state_indices"] = (it, (B, T), stored["token_state_indices"])
    if c["intermediate"]:
        # as expected_state: F64 for an F32 state, F32 (exact for F16/BF16 values) otherwise;
        # NaN for tokens a row does not have and for padding rows (the reader skips those)
        es = t["expected_state"][0]
        t["expected_intermediate_states"] = (es, inter.shape, encode(inter, es))
    if c["intermediate_conv"]:
        ecs = t["expected_conv_state"][0]
        ic = inter_conv.transpose(0, 1, 3, 2) if c["conv_state_layout"] == "tap_major" else inter_conv
        t["expected_intermediate_conv_states"] = (ecs, ic.shape, encode(ic, ecs))

    meta = _metadata(ct, scale, out_dtype, num_slots, invalid)
    meta["format_version"] = FORMAT_VERSION_3
    meta = dict(list(meta.items())[:2] + [("num_tokens", str(T)),
                                          ("update_state", "true" if c["update_state"] else "false")]
                + list(meta.items())[2:])
    return t, meta


# ---------------------------------------------------------------------------

def write_case(out_dir, name, seed, description, opts):
    tensors, meta = build_case(opts, seed)
    meta["description"] = f"{description} (gen_golden.py seed {seed})"
    path = os.path.join(out_dir, name + ".safetensors")
    write_safetensors(path, tensors, meta)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory to write the .safetensors files into")
    ap.add_argument("--random", type=int, metavar="N", help="write N random cases instead of the standard set")
    ap.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    ap.add_argument("--multi-token", action="store_true",
                    help="with --random: format version 3 cases (several tokens per row), "
                         "written as random_mt_s<S>_<i>.safetensors")
    ap.add_argument("--only", action="append", metavar="NAME", help="write only this standard case (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the standard cases, one per line")
    args = ap.parse_args(argv)

    if args.list:
        width = max(len(c[0]) for c in CASES)
        for name, _, desc, _ in CASES:
            print(f"{name:<{width}}  {desc}")
        return 0
    if not args.out:
        ap.error("--out DIR is required (or --list)")
    os.makedirs(args.out, exist_ok=True)

    if args.multi_token and args.random is None:
        ap.error("--multi-token goes with --random N")
    if args.random is not None:
        for i in range(args.random):
            seed = args.seed * 100003 + i
            if args.multi_token:
                # its own option stream, so the one-token random cases keep theirs
                opts = random_case_multi(np.random.default_rng([args.seed, i, 3]))
                name = f"random_mt_s{args.seed}_{i:03d}"
            else:
                opts = random_case(np.random.default_rng([args.seed, i, 1]))
                name = f"random_s{args.seed}_{i:03d}"
            print(write_case(args.out, name, seed, describe(opts), opts))
        return 0

    names = {c[0] for c in CASES}
    assert len(names) == len(CASES), "duplicate case names"
    for want in args.only or []:
        if want not in names:
            ap.error(f"no standard case named {want!r} (see --list)")
    for name, seed, desc, opts in CASES:
        if args.only and name not in args.only:
            continue
        print(write_case(args.out, name, seed, desc, opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
