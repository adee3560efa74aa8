#!/usr/bin/env python3
"""Write gdnkit's golden cases: one GatedDeltaNet decode step per safetensors file.

This is an independent float64 reference. It uses Python 3 and numpy only and
never imports or calls gdnkit. The format is described in docs/golden-format.md:
version 1 is the decode step alone; version 2 adds the optional conv1d prologue
(x, conv_state, conv_weight, conv_bias -> expected_conv_state) and the gated
RMSNorm epilogue (z, norm_weight). Only cases that use them say version 2.

    gen_golden.py --out DIR                        the standard set (tests/golden)
    gen_golden.py --out DIR --random N --seed S    N random cases with random options
    gen_golden.py --list                           the names of the standard cases

Every case draws its inputs from numpy.random.default_rng(seed) with a fixed
seed, rounds them to the dtype they are stored in, and computes the expected
results in float64 from those rounded values.
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

FORMAT_VERSION = "1"    # cases with neither of the optional stages (the original format)
FORMAT_VERSION_2 = "2"  # cases that use the conv1d prologue or the gated RMSNorm epilogue

# ---------------------------------------------------------------------------
# dtypes: rounding to the storage dtype and decoding back to float64
# ---------------------------------------------------------------------------

# safetensors dtype name -> bytes per element
DTYPE_SIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2}


def f32_to_bf16_bits(x):
    """bfloat16 bit patterns (uint16) of x, rounded to nearest even from float32; NaN stays NaN."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)  # carries into the exponent; overflow gives inf
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    quiet_nan = ((bits >> 16) | 0x0040).astype(np.uint16)       # keep sign and payload top, force quiet
    return np.where(nan, quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_f64(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def encode(x, dtype):
    """float64 array -> numpy array holding the stored representation (bf16 as uint16 bits)."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "F64":
        return x.copy()
    if dtype == "F32":
        return x.astype(np.float32)
    if dtype == "F16":
        return x.astype(np.float16)
    if dtype == "BF16":
        return f32_to_bf16_bits(x.astype(np.float32))
    if dtype == "I32":
        return x.astype(np.int32)
    if dtype == "I64":
        return x.astype(np.int64)
    raise ValueError(dtype)


def decode(stored, dtype):
    """Stored representation -> the exact float64 values it holds."""
    if dtype == "BF16":
        return bf16_bits_to_f64(stored)
    return np.asarray(stored).astype(np.float64)


def rounded(x, dtype):
    """x rounded to dtype, as float64: what the backend will read."""
    return decode(encode(x, dtype), dtype)


# ---------------------------------------------------------------------------
# the reference: one decode step in float64
# ---------------------------------------------------------------------------

def l2norm(x, mode, eps):
    if mode == "rsqrt":
        # x_hat = x / sqrt(sum x^2 + eps)
        return x / math.sqrt(float(np.dot(x, x)) + eps)
    if mode == "max_norm":
        # x_hat = x / max(||x||, eps)                      (torch F.normalize)
        return x / max(math.sqrt(float(np.dot(x, x))), eps)
    # x_hat = x                                          (q, k arrive normalized)
    return x


def softplus(x):
    # softplus(x) = x if x > 20 else log1p(exp(x))       (torch's threshold)
    return x if x > 20.0 else math.log1p(math.exp(x))


def sigmoid(x):
    # sigmoid(x) = 1 / (1 + exp(-x)), written so exp never overflows
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def reference(q, k, v, a, b, A_log, dt_bias, state, layout, l2norm_mode, eps, scale,
              head_map, gate, state_indices=None, state_out_indices=None):
    """One GatedDeltaNet decode step in float64.

    q, k: (B, Hk, Dk); v: (B, Hv, Dv); a, b: (B, Hv); A_log, dt_bias: (Hv) or None;
    state: (S, Hv, Dk, Dv) for layout kv, (S, Hv, Dv, Dk) for vk; all float64 holding
    the stored values. Returns (o (B, Hv, Dv), new pool (same shape as state)).
    """
    B, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    G = Hv // Hk
    num_slots = state.shape[0]
    o = np.zeros((B, Hv, Dv), dtype=np.float64)
    new_state = state.copy()  # the whole pool; slots nobody writes keep their values exactly

    for row in range(B):
        s = int(state_indices[row]) if state_indices is not None else row
        s_out = int(state_out_indices[row]) if state_out_indices is not None else s
        if s < 0 or s >= num_slots:
            continue  # padding row (or an out-of-range index): o stays 0, no state read or written
        for h in range(Hv):
            hk = h // G if head_map == "interleaved" else h % Hk
            qh = l2norm(q[row, hk], l2norm_mode, eps)
            kh = l2norm(k[row, hk], l2norm_mode, eps)
            if gate == "raw":
                # g = -exp(A_log) * softplus(a + dt_bias) ; beta = sigmoid(b_raw)
                g = -math.exp(A_log[h]) * softplus(a[row, h] + dt_bias[h])
                beta = sigmoid(b[row, h])
            else:
                # precomputed: a holds g, b holds beta
                g, beta = a[row, h], b[row, h]
            # S[i, j], i over Dk, j over Dv; the vk layout stores S^T
            S_old = state[s, h] if layout == "kv" else state[s, h].T
            # S = exp(g) * S_old                          (decay; exp(g) may underflow to 0)
            S = math.exp(g) * S_old
            # u = S^T kh                                  (u[j] = sum_i S[i, j] kh[i])
            u = S.T @ kh
            # delta = beta * (v - u)
            delta = beta * (v[row, h] - u)
            # S = S + kh (x) delta                        (rank-1 update)
            S = S + np.outer(kh, delta)
            # o = scale * S^T qh
            o[row, h] = scale * (S.T @ qh)
            if 0 <= s_out < num_slots:
                new_state[s_out, h] = S if layout == "kv" else S.T
    return o, new_state


def silu(t):
    """silu(t) = t / (1 + exp(-t)) = t * sigmoid(t), elementwise, exp never overflows."""
    t = np.asarray(t, dtype=np.float64)
    e = np.exp(-np.abs(t))
    sig = np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return t * sig


def conv_reference(x, conv_state, conv_weight, conv_bias, state_indices=None, state_out_indices=None):
    """The conv1d prologue (causal_conv1d_update, one token) in float64.

    x: (B, C); conv_state: the pool (S, C, W-1), oldest tap first (channel-major, whatever
    the file stores); conv_weight: (C, W); conv_bias: (C) or None. Per row b with a valid
    read slot s and per channel c:
        window = (conv_state[s, c, 0 .. W-2], x[b, c])              oldest first
        y[b, c] = silu(sum_j conv_weight[c, j] * window[j] + conv_bias[c])
        conv_state[s_out, c, :] = window[1 .. W-1]                  if 0 <= s_out < S
    A padding row (s < 0 or s >= S) reads and writes nothing and its y is left 0 (unused).
    Returns (y (B, C), the new pool (same shape as conv_state)).
    """
    B, C = x.shape
    num_slots = conv_state.shape[0]
    y = np.zeros((B, C), dtype=np.float64)
    new_pool = conv_state.copy()  # slots nobody writes keep their values exactly
    for row in range(B):
        s = int(state_indices[row]) if state_indices is not None else row
        s_out = int(state_out_indices[row]) if state_out_indices is not None else s
        if s < 0 or s >= num_slots:
            continue
        window = np.concatenate([conv_state[s], x[row][:, None]], axis=1)  # (C, W)
        pre = np.sum(conv_weight * window, axis=1)
        if conv_bias is not None:
            pre = pre + conv_bias
        y[row] = silu(pre)
        if 0 <= s_out < num_slots:
            new_pool[s_out] = window[:, 1:]
    return y, new_pool


def gated_rmsnorm(o, z, norm_weight, eps, rows):
    """The gated RMSNorm epilogue in float64, on the rows listed (padding rows stay 0):
    o[b, h, j] = norm_weight[j] * o[b, h, j] / sqrt(mean_j(o[b, h]^2) + eps) * silu(z[b, h, j])."""
    out = o.copy()
    for row in rows:
        for h in range(o.shape[1]):
            oh = o[row, h]
            rms = math.sqrt(float(np.mean(oh * oh)) + eps)
            out[row, h] = norm_weight * (oh / rms) * silu(z[row, h])
    return out


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

DEFAULTS = dict(
    B=2, Hk=1, Hv=2, Dk=64, Dv=64,
    dtype="F32",            # q, k, v (or mixed_qkv), a, b
    state_dtype="F32",
    output_dtype=None,      # None: same as dtype
    layout="kv",
    l2norm="rsqrt", eps=1e-6,
    scale=None,             # None: Dk^-0.5 (still written explicitly)
    head_map="interleaved",
    gate="raw",
    packed=False,           # mixed_qkv instead of q, k, v
    num_slots=None,         # None: B
    index_dtype=None,       # "I32" / "I64" when indices are given
    state_indices=None,
    state_out_indices=None,
    expected_state_dtype=None,  # None: F64 for an F32 state, F32 for an F16/BF16 state (see below)
    tweak=None,             # name of an input override below
    meta_style="full",      # "full" | "minimal" | "aliases_unsqueezed" | "aliases_flat"
    # format version 2: the optional stages
    conv_width=0,           # W in {2, 3, 4}: x and the conv1d prologue instead of q, k, v; 0: none
    conv_bias=True,         # with conv: a conv_bias tensor
    conv_state_layout="channel_major",  # conv pool stored (S, conv_dim, W-1), or "tap_major" (S, W-1, conv_dim)
    norm=False,             # the gated RMSNorm epilogue (z, norm_weight)
    norm_eps=1e-6,
    v2_defaults=False,      # leave conv_state_layout and norm_eps out of the metadata (their defaults),
                            # store conv_weight as torch's (conv_dim, 1, W), x as (B, 1, conv_dim),
                            # z as (B, Hv*Dv)
)


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


def build_case(opts, seed):
    """Draw the inputs, round them to their dtypes, run the reference. Returns (tensors, metadata)."""
    c = dict(DEFAULTS)
    c.update(opts)
    rng = np.random.default_rng(seed)
    B, Hk, Hv, Dk, Dv = c["B"], c["Hk"], c["Hv"], c["Dk"], c["Dv"]
    assert Hv % Hk == 0
    num_slots = c["num_slots"] if c["num_slots"] is not None else B
    dt, st = c["dtype"], c["state_dtype"]
    out_dtype = c["output_dtype"] or dt
    scale = c["scale"] if c["scale"] is not None else Dk ** -0.5

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
        x["b"] = rng.uniform(0.0, 1.0, (B, Hv))
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

    # ---- round to the storage dtypes; the reference sees only the rounded values ----
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
    for n in ("state_indices", "state_out_indices"):
        if c[n] is not None:
            stored[n] = encode(np.array(c[n], dtype=np.int64), c["index_dtype"])
            assert stored[n].astype(np.int64).tolist() == list(c[n]), f"{n} does not fit {c['index_dtype']}"
            val[n] = stored[n].astype(np.int64)

    v2_names = [n for n in ("x", "conv_weight", "conv_bias", "conv_state", "z", "norm_weight")
                if n in x and (n != "conv_bias" or c["conv_bias"])]
    for n in v2_names:  # all in the q/k/v dtype
        stored[n] = encode(x[n], dt)
        val[n] = decode(stored[n], dt)
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
    t["b"] = (dt, ab_shape, stored["b"].reshape(ab_shape))
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
    return t, meta


# ---------------------------------------------------------------------------
# the standard set
# ---------------------------------------------------------------------------

def _dtype_cases():
    """The 9 input-dtype x state-dtype combinations, spread over layouts, G and B; fp32 in both layouts."""
    combos = [  # (inputs, state, layout, B, Hk, Hv)
        ("F32", "F32", "kv", 2, 1, 2), ("F32", "F16", "vk", 2, 1, 2), ("F32", "BF16", "kv", 2, 1, 3),
        ("F16", "F32", "vk", 1, 1, 2), ("F16", "F16", "kv", 1, 2, 4), ("F16", "BF16", "vk", 1, 1, 3),
        ("BF16", "F32", "kv", 2, 1, 1), ("BF16", "F16", "vk", 2, 1, 2), ("BF16", "BF16", "kv", 1, 2, 4),
        ("F32", "F32", "vk", 2, 1, 2),
    ]
    cases = []
    for i, (dt, st, lay, b, hk, hv) in enumerate(combos):
        cases.append((
            f"dtype_{dt.lower()}_state_{st.lower()}_{lay}", 1000 + i,
            f"inputs {dt}, state {st}, output {dt}, layout {lay}, B={b} Hk={hk} Hv={hv} (G={hv // hk}), Dk=Dv=64",
            dict(dtype=dt, state_dtype=st, layout=lay, B=b, Hk=hk, Hv=hv)))
    return cases


# The standard set. Each entry: name, seed, description, options (see DEFAULTS: B=2 Hk=1 Hv=2
# Dk=Dv=64, everything F32, layout kv, rsqrt, default scale, interleaved, raw gate, no indices).
CASES = _dtype_cases() + [
    ("output_f32_from_bf16_vk", 1100,
     "inputs BF16, state BF16, output written as F32 (output dtype differs from the inputs), layout vk",
     dict(dtype="BF16", state_dtype="BF16", output_dtype="F32", layout="vk", B=2, Hk=1, Hv=2)),
    ("output_f16_from_f32_kv", 1101,
     "inputs F32, state F32, output written as F16 (output dtype differs from the inputs), B=1, layout kv",
     dict(dtype="F32", state_dtype="F32", output_dtype="F16", layout="kv", B=1, Hk=1, Hv=2)),

    ("dk64_dv128_kv", 1200, "Dk=64, Dv=128 (Dk != Dv), B=1 Hk=1 Hv=2, F32, layout kv",
     dict(Dk=64, Dv=128, B=1, Hk=1, Hv=2, layout="kv")),
    ("dk128_dv64_vk", 1201, "Dk=128, Dv=64 (Dk != Dv), B=1 Hk=1 Hv=2, inputs F32, state BF16, layout vk",
     dict(Dk=128, Dv=64, B=1, Hk=1, Hv=2, layout="vk", state_dtype="BF16")),
    ("dk128_dv128_kv", 1202, "Dk=Dv=128 (the tuned size), B=1 Hk=Hv=1, inputs BF16, state F32, layout kv",
     dict(Dk=128, Dv=128, B=1, Hk=1, Hv=1, layout="kv", dtype="BF16")),
    ("dk256_dv256_vk", 1203, "Dk=Dv=256 (largest head dim), B=1 Hk=Hv=1, inputs BF16, state BF16, layout vk",
     dict(Dk=256, Dv=256, B=1, Hk=1, Hv=1, layout="vk", dtype="BF16", state_dtype="BF16")),

    ("head_map_tiled_kv", 1300, "head_map tiled (hk = h % Hk), B=1 Hk=2 Hv=4 (G=2), inputs F32, state F16, layout kv",
     dict(head_map="tiled", B=1, Hk=2, Hv=4, layout="kv", state_dtype="F16")),

    ("slots_pool_i32_kv", 1400,
     "state_indices I32 [3, -1, 0]: out of order, a padding row, pool of 4 slots for B=3 "
     "(slots 1, 2 untouched); Hv=2, inputs F32, state F16, layout kv",
     dict(B=3, Hk=1, Hv=2, num_slots=4, index_dtype="I32", state_indices=[3, -1, 0], layout="kv",
          state_dtype="F16")),
    ("slots_pool_i64_vk", 1401,
     "state_indices I64 [4, -2, 1, -1]: out of order, padding rows (-1 and -2), pool of 5 slots for B=4 "
     "(slots 0, 2, 3 untouched); Hv=1, inputs BF16, state BF16, layout vk",
     dict(B=4, Hk=1, Hv=1, num_slots=5, index_dtype="I64", state_indices=[4, -2, 1, -1],
          layout="vk", dtype="BF16", state_dtype="BF16")),
    ("write_slot_i32_kv", 1402,
     "state_indices I32 [0, 1, -1, 2] with state_out_indices [3, -1, 4, 2]: row 0 reads 0 writes 3, "
     "row 1 output only (no state write), row 2 padding (slot 4 untouched despite its write index), "
     "row 3 in place; pool of 5, Hv=1, F32, layout kv",
     dict(B=4, Hk=1, Hv=1, num_slots=5, index_dtype="I32", state_indices=[0, 1, -1, 2],
          state_out_indices=[3, -1, 4, 2], layout="kv")),
    ("invalid_read_index_i32_kv", 1404,
     "state_indices I32 [3, 1, 2147483647, 0] with num_slots=3: rows 0 (index == num_slots) and 2 "
     "(INT32_MAX) are out of range, treated as padding and reported (invalid_indices=2); Hv=1, F32, kv",
     dict(B=4, Hk=1, Hv=1, num_slots=3, index_dtype="I32", state_indices=[3, 1, 2147483647, 0],
          layout="kv")),
    ("invalid_write_index_i64_vk", 1405,
     "state_indices I64 [0, 1, 2] with state_out_indices [3, 1099511627776, -1], num_slots=4: row 0 "
     "reads 0 writes 3; row 1's write index (2^40) is out of range: output computed, no state written, "
     "reported (invalid_indices=1); row 2 output only; Hv=1, inputs BF16, state BF16, layout vk",
     dict(B=3, Hk=1, Hv=1, num_slots=4, index_dtype="I64", state_indices=[0, 1, 2],
          state_out_indices=[3, 1 << 40, -1], layout="vk", dtype="BF16", state_dtype="BF16")),

    ("tiny_norm_rsqrt_kv", 1500,
     "l2norm rsqrt with q/k norms 1e-4 .. 1e-7 and one k head exactly zero; B=2 Hk=2 Hv=2, "
     "inputs F32, state F16, layout kv",
     dict(tweak="tiny_norm", l2norm="rsqrt", B=2, Hk=2, Hv=2, layout="kv", state_dtype="F16")),
    ("tiny_norm_max_norm_vk", 1501,
     "l2norm max_norm (x / max(|x|, eps)) with q/k norms 1e-4 .. 1e-7 and one k head exactly zero; "
     "B=2 Hk=2 Hv=2, inputs F32, state BF16, layout vk",
     dict(tweak="tiny_norm", l2norm="max_norm", B=2, Hk=2, Hv=2, layout="vk", state_dtype="BF16")),
    ("l2norm_none_kv", 1503,
     "l2norm none: q and k handed over already unit-norm (then rounded); B=1 Hv=2, F32, layout kv",
     dict(l2norm="none", B=1, Hk=1, Hv=2, layout="kv")),
    ("l2norm_none_bf16_vk", 1504,
     "l2norm none: q and k already unit-norm; B=2 Hk=2 Hv=2, inputs BF16, state BF16, layout vk",
     dict(l2norm="none", B=2, Hk=2, Hv=2, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("scale_custom_vk", 1505, "scale 0.3 instead of the default Dk^-0.5 = 0.125; B=2 Hv=1, F32, layout vk",
     dict(scale=0.3, B=2, Hk=1, Hv=1, layout="vk")),

    ("gate_extreme_kv", 1600,
     "extreme raw gates: a+dt_bias = 25, 60, 21 (softplus linear branch), g = -960 (exp(g) = 0 even in "
     "float64), g = -400, a+dt_bias = -30 (no decay), b = +-30 (saturated sigmoid); B=2 Hk=1 Hv=3, F32, kv",
     dict(tweak="extreme_gate", B=2, Hk=1, Hv=3, layout="kv")),
    ("gate_extreme_bf16_vk", 1601,
     "extreme raw gates as in gate_extreme_kv; B=2 Hk=1 Hv=3, inputs BF16, state BF16, layout vk",
     dict(tweak="extreme_gate", B=2, Hk=1, Hv=3, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("gate_precomputed_kv", 1602,
     "gate precomputed: a holds g (mostly U(-3,-1e-4), some down to -20), b holds beta in [0,1]; "
     "no A_log/dt_bias; B=1 Hv=2, F32, layout kv",
     dict(gate="precomputed", B=1, Hk=1, Hv=2, layout="kv")),
    ("gate_precomputed_bf16_vk", 1603,
     "gate precomputed; B=1 Hk=2 Hv=4, inputs BF16, state BF16, layout vk",
     dict(gate="precomputed", B=1, Hk=2, Hv=4, layout="vk", dtype="BF16", state_dtype="BF16")),

    ("mixed_qkv_bf16_vk", 1700,
     "packed mixed_qkv rows [q | k | v] instead of q, k, v; B=1 Hk=2 Hv=4, inputs BF16, state BF16, layout vk",
     dict(packed=True, B=1, Hk=2, Hv=4, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("mixed_qkv_dk64_dv128_kv", 1701,
     "packed mixed_qkv rows with Dk=64 != Dv=128, B=1 Hk=1 Hv=1, state_indices I64 [1] into a pool of 2 "
     "(slot 0 untouched); inputs F32, state F16, layout kv",
     dict(packed=True, Dk=64, Dv=128, B=1, Hk=1, Hv=1, num_slots=2, index_dtype="I64",
          state_indices=[1], layout="kv", state_dtype="F16")),

    ("metadata_minimal_kv", 1800,
     "metadata has only op, format_version, layout (plus description, invalid_indices): every other key "
     "takes its default (rsqrt, eps 1e-6, scale Dk^-0.5, interleaved, raw, output = input dtype); "
     "B=2 Hv=1, inputs F16, state F32",
     dict(meta_style="minimal", layout="kv", dtype="F16", state_dtype="F32", B=2, Hk=1, Hv=1)),
    ("metadata_aliases_unsqueezed_vk", 1801,
     "metadata in alias spellings and mixed case (GDN_DECODE, VK, Default, Repeat_Interleave, RAW, bfloat16, "
     "scale 'default', an extra key 'format'); q/k/v/expected_o as [B, 1, H, D], a/b as [B, 1, Hv]; "
     "B=2 Hv=2, inputs BF16, state BF16",
     dict(meta_style="aliases_unsqueezed", layout="vk", dtype="BF16", state_dtype="BF16", B=2, Hk=1, Hv=2)),
    ("metadata_aliases_flat_kv", 1802,
     "metadata aliases (f_normalize, tile, fp16, eps '1e-6'; num_slots absent); q/k as [B, Hk*Dk], v and "
     "expected_o as [B, Hv*Dv]; max_norm, tiled, B=1 Hk=2 Hv=4, inputs F16, state F16",
     dict(meta_style="aliases_flat", layout="kv", dtype="F16", state_dtype="F16", l2norm="max_norm",
          head_map="tiled", B=1, Hk=2, Hv=4)),

    ("qwen35_35b_a3b_bf16_vk", 1900,
     "Qwen3.5-35B-A3B shape: B=1, Hk=16, Hv=32, Dk=Dv=128, inputs BF16, state BF16, layout vk; "
     "expected_state stored as F32 (not F64) to keep the file at ~3 MB",
     dict(B=1, Hk=16, Hv=32, Dk=128, Dv=128, dtype="BF16", state_dtype="BF16", layout="vk",
          expected_state_dtype="F32")),
]

# Format version 2: the conv1d prologue (x, conv_state, conv_weight, conv_bias) and the gated
# RMSNorm epilogue (z, norm_weight). x ~ N(0, 1), conv_weight ~ U(-0.6, 0.6), conv_bias ~
# U(-0.2, 0.2), conv_state ~ N(0, 1) in every slot, z ~ N(0, 1), norm_weight ~ U(0.5, 1.5).
CASES_V2 = [
    ("conv_w2_f32_kv", 2000,
     "conv prologue W=2 with conv_bias; x, conv pool (S, conv_dim, 1) channel_major; B=2 Hk=1 Hv=2, "
     "inputs F32, state F32, layout kv",
     dict(conv_width=2, B=2, Hk=1, Hv=2, layout="kv")),
    ("conv_w3_bf16_vk", 2001,
     "conv prologue W=3 without conv_bias (as Qwen3-Next); B=2 Hk=2 Hv=4, inputs BF16, state BF16, layout vk",
     dict(conv_width=3, conv_bias=False, B=2, Hk=2, Hv=4, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("conv_w4_f32_dk64_dv128_vk", 2002,
     "conv prologue W=4 with conv_bias, Dk=64 != Dv=128; B=1 Hk=1 Hv=2, inputs F32, state F16, layout vk",
     dict(conv_width=4, B=1, Hk=1, Hv=2, Dk=64, Dv=128, layout="vk", state_dtype="F16")),
    ("conv_w4_bf16_kv", 2003,
     "conv prologue W=4 with conv_bias; B=2 Hk=1 Hv=2, inputs BF16, state F32, layout kv",
     dict(conv_width=4, B=2, Hk=1, Hv=2, layout="kv", dtype="BF16", state_dtype="F32")),
    ("conv_w3_f16_tiled_kv", 2004,
     "conv prologue W=3 with conv_bias, head_map tiled; B=1 Hk=2 Hv=4, inputs F16, state F16, layout kv",
     dict(conv_width=3, B=1, Hk=2, Hv=4, head_map="tiled", layout="kv", dtype="F16", state_dtype="F16")),

    ("norm_bf16_vk", 2100,
     "gated RMSNorm epilogue (z, norm_weight, norm_eps 1e-6) on q, k, v inputs; B=2 Hk=1 Hv=2, "
     "inputs BF16, state BF16, layout vk",
     dict(norm=True, B=2, Hk=1, Hv=2, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("norm_eps_f32_dk128_dv64_kv", 2101,
     "gated RMSNorm epilogue with norm_eps 1e-5, Dk=128 != Dv=64; B=2 Hk=1 Hv=1, F32, layout kv",
     dict(norm=True, norm_eps=1e-5, B=2, Hk=1, Hv=1, Dk=128, Dv=64, layout="kv")),
    ("norm_mixed_qkv_f16_out_f32_kv", 2102,
     "gated RMSNorm epilogue on packed mixed_qkv rows, output written as F32; B=2 Hk=1 Hv=2, "
     "inputs F16, state F32, layout kv",
     dict(norm=True, packed=True, output_dtype="F32", B=2, Hk=1, Hv=2, layout="kv", dtype="F16",
          state_dtype="F32")),

    ("conv_norm_w4_bf16_vk", 2200,
     "conv prologue W=4 (no bias) and gated RMSNorm epilogue; B=2 Hk=2 Hv=4, inputs BF16, state BF16, "
     "layout vk",
     dict(conv_width=4, conv_bias=False, norm=True, B=2, Hk=2, Hv=4, layout="vk", dtype="BF16",
          state_dtype="BF16")),
    ("conv_norm_w3_f32_dk64_dv128_kv", 2201,
     "conv prologue W=3 with conv_bias and gated RMSNorm epilogue, Dk=64 != Dv=128; B=2 Hk=1 Hv=1, F32, "
     "layout kv",
     dict(conv_width=3, norm=True, B=2, Hk=1, Hv=1, Dk=64, Dv=128, layout="kv")),

    ("conv_slots_i32_kv", 2300,
     "conv prologue W=4 with a slot pool: state_indices I32 [4, -1, 1, 0] with state_out_indices "
     "[2, 3, -1, 0]: row 0 reads slot 4 writes 2 (both pools), row 1 padding (slot 3 untouched despite "
     "its write index), row 2 output only (neither pool written), row 3 in place; pool of 6 (slots 1, 3, "
     "4, 5 keep their state and conv state); Hv=1, inputs F32, state F16, layout kv",
     dict(conv_width=4, B=4, Hk=1, Hv=1, num_slots=6, index_dtype="I32", state_indices=[4, -1, 1, 0],
          state_out_indices=[2, 3, -1, 0], layout="kv", state_dtype="F16")),
    ("conv_norm_padding_i64_vk", 2301,
     "conv prologue W=3 and gated RMSNorm with padding rows: state_indices I64 [2, -1, 0, -3] in place, "
     "pool of 4 (slots 1, 3 untouched); padding rows output zeros after the norm; Hk=1 Hv=2, inputs BF16, "
     "state BF16, layout vk",
     dict(conv_width=3, norm=True, B=4, Hk=1, Hv=2, num_slots=4, index_dtype="I64",
          state_indices=[2, -1, 0, -3], layout="vk", dtype="BF16", state_dtype="BF16")),
    ("conv_norm_invalid_i64_kv", 2302,
     "conv prologue W=2 and gated RMSNorm with out-of-range indices: state_indices I64 [0, 7, 1] with "
     "state_out_indices [2, -1, 1099511627776], num_slots=3: row 0 reads 0 writes 2; row 1's read index "
     "is out of range (padding: zeros, neither pool touched, reported); row 2's write index (2^40) is "
     "out of range (output computed, neither pool written, reported); invalid_indices=2; Hv=1, F32, kv",
     dict(conv_width=2, norm=True, B=3, Hk=1, Hv=1, num_slots=3, index_dtype="I64",
          state_indices=[0, 7, 1], state_out_indices=[2, -1, 1 << 40], layout="kv")),

    ("conv_tap_major_bf16_kv", 2400,
     "conv prologue W=4 with the conv pool stored tap_major (S, W-1, conv_dim); state_indices I32 [2, 0] "
     "into a pool of 3 (slot 1 untouched); B=2 Hk=1 Hv=1, inputs BF16, state F32, layout kv",
     dict(conv_width=4, conv_state_layout="tap_major", B=2, Hk=1, Hv=1, num_slots=3, index_dtype="I32",
          state_indices=[2, 0], layout="kv", dtype="BF16", state_dtype="F32")),
    ("conv_norm_defaults_f16_kv", 2401,
     "conv prologue W=2 and gated RMSNorm with the v2 keys at their defaults (no conv_state_layout: "
     "channel_major; no norm_eps: 1e-6) and other ranks: x as [B, 1, conv_dim], conv_weight as torch's "
     "[conv_dim, 1, W], z as [B, Hv*Dv]; B=2 Hk=1 Hv=2, inputs F16, state F16, layout kv",
     dict(conv_width=2, norm=True, v2_defaults=True, B=2, Hk=1, Hv=2, layout="kv", dtype="F16",
          state_dtype="F16")),

    ("conv_norm_qwen35_tp8_bf16_vk", 2500,
     "Qwen3.5-35B-A3B under tensor parallelism 8, with its conv prologue (W=4, no bias) and gated "
     "RMSNorm: B=2, Hk=2, Hv=4, Dk=Dv=128 (conv_dim 1024), inputs BF16, state BF16, layout vk; "
     "expected_state stored as F32",
     dict(conv_width=4, conv_bias=False, norm=True, B=2, Hk=2, Hv=4, Dk=128, Dv=128, layout="vk",
          dtype="BF16", state_dtype="BF16", expected_state_dtype="F32")),
]

CASES = CASES + CASES_V2


# ---------------------------------------------------------------------------
# random cases (files "written elsewhere", for tests)
# ---------------------------------------------------------------------------

def random_case(rng):
    """Random valid options, including padding, pools, write slots and out-of-range indices."""
    pick = lambda seq: seq[int(rng.integers(len(seq)))]
    dtypes = ["F32", "F16", "BF16"]
    o = dict(dtype=pick(dtypes), state_dtype=pick(dtypes), layout=pick(["kv", "vk"]),
             Dk=pick([64, 64, 128, 256]), Dv=pick([64, 64, 128]), l2norm=pick(["rsqrt", "rsqrt", "max_norm", "none"]),
             head_map=pick(["interleaved", "tiled"]), gate=pick(["raw", "raw", "precomputed"]),
             packed=bool(rng.random() < 0.25))
    if rng.random() < 0.3:
        o["output_dtype"] = pick(dtypes)
    if rng.random() < 0.2:
        o["scale"] = float(np.round(rng.uniform(0.05, 1.0), 4))
    Hk = int(rng.integers(1, 3))
    G = int(rng.integers(1, 4))
    B = int(rng.integers(1, 5))
    o.update(B=B, Hk=Hk, Hv=Hk * G)
    if rng.random() < 0.6:
        num_slots = B + int(rng.integers(0, 3))
        reads = [int(s) for s in rng.permutation(num_slots)[:B]]
        for r in range(B):
            if rng.random() < 0.2:
                reads[r] = -1                      # padding
            elif rng.random() < 0.1:
                reads[r] = num_slots + int(rng.integers(0, 3))  # out of range: padding, reported
        if not any(0 <= s < num_slots for s in reads):
            reads[0] = int(rng.integers(num_slots))  # keep one real row, so expected_o is not all zero
        o.update(num_slots=num_slots, index_dtype=pick(["I32", "I64"]), state_indices=reads)
        if rng.random() < 0.5:
            # write slots: distinct, never a slot another row reads (no read/write race)
            taken = {s for s in reads if 0 <= s < num_slots}
            free = [s for s in range(num_slots) if s not in taken]
            writes = []
            for r, s in enumerate(reads):
                roll = rng.random()
                if not (0 <= s < num_slots):
                    writes.append(-1)              # padding row: no state traffic either way
                elif roll < 0.15:
                    writes.append(-1)              # output only
                elif roll < 0.25:
                    writes.append(num_slots + 5)   # out of range write: output only, reported
                elif roll < 0.6 and free:
                    writes.append(free.pop(0))     # a different slot
                else:
                    writes.append(s)               # in place
            o["state_out_indices"] = writes
    # format version 2 stages, drawn last so the options above keep their draws
    if rng.random() < 0.35:
        o.update(conv_width=pick([2, 3, 4]), conv_bias=bool(rng.random() < 0.6),
                 conv_state_layout=pick(["channel_major", "tap_major"]), packed=False)
        if o["l2norm"] == "none":
            o["l2norm"] = "rsqrt"  # conv outputs are not unit-norm
    if rng.random() < 0.35:
        o.update(norm=True, norm_eps=pick([1e-6, 1e-6, 1e-5]))
    return o


def describe(o):
    c = dict(DEFAULTS)
    c.update(o)
    parts = [f"B={c['B']} Hk={c['Hk']} Hv={c['Hv']} Dk={c['Dk']} Dv={c['Dv']}",
             f"inputs {c['dtype']} state {c['state_dtype']} output {c['output_dtype'] or c['dtype']}",
             f"layout {c['layout']} l2norm {c['l2norm']} head_map {c['head_map']} gate {c['gate']}"]
    if c["packed"]:
        parts.append("mixed_qkv")
    if c["scale"] is not None:
        parts.append(f"scale {c['scale']}")
    if c["state_indices"] is not None:
        parts.append(f"num_slots {c['num_slots']} state_indices {c['index_dtype']} {c['state_indices']}")
    if c["state_out_indices"] is not None:
        parts.append(f"state_out_indices {c['state_out_indices']}")
    if c["conv_width"]:
        parts.append(f"conv W={c['conv_width']} {c['conv_state_layout']}" + (" +bias" if c["conv_bias"] else ""))
    if c["norm"]:
        parts.append(f"gated RMSNorm eps {c['norm_eps']}")
    return "random case: " + ", ".join(parts)


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

    if args.random is not None:
        for i in range(args.random):
            seed = args.seed * 100003 + i
            opts = random_case(np.random.default_rng([args.seed, i, 1]))
            path = write_case(args.out, f"random_s{args.seed}_{i:03d}", seed, describe(opts), opts)
            print(path)
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
