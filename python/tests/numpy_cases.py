"""Shared by the numpy tests: numpy storage of f32 / f16 / bf16, the float64 reference
of the step (docs/operation.md, 'The math') and of the fused middle of a layer, random
cases from realistic ranges, and the calls of gdnkit.decode on them."""
import math

import numpy as np

import gdnkit

# ---- dtypes: numpy storage of f32 / f16 / bf16 (bf16 as uint16 bit patterns) ----------

STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
# Bounds on ||x - ref|| / ||ref|| by the dtype a result is stored in (docs/operation.md,
# 'Numerics').
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


# ---- the reference: docs/operation.md, 'The math', in float64 --------------------

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
    """Errors within the bounds, padding rows exactly zero, untouched state bit-exact."""
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


# ---- several tokens a row (docs/operation.md, "Multi-token decode") --------------------------

def make_multi_case(seed, *, B=3, T=3, lengths=None, mode="final", index="i32", form="separate",
                    conv=False, norm=False, **kw):
    """B rows of T tokens (lengths: rows of that many tokens packed by cu_seqlens, T at
    least the longest). The per-token inputs are drawn as a one-token case of one row per
    token would draw them, then shaped (B, T, ...) or left packed (total_tokens, ...).
    Where the states go (`mode`):
      final         state_indices (row 1 padding) and state_out_indices into spare slots
                    (row 2 writes nothing)
      token_slots   token_state_indices (B, T) of distinct slots (row 1 padding, row 0's
                    first token stored nowhere) with num_accepted_tokens
      intermediate  state_indices (row 1 padding), a random intermediate_states buffer
                    (and intermediate_conv_states with the conv prologue), update_state
                    False
    form: q, k, v "separate", one "packed" qkv row, or "flat" ([B*T, H*D] rows)."""
    rows = B * T if lengths is None else sum(lengths)
    c = make_middle_case(seed, B=rows, conv=conv, norm=norm, pool_extra=2 * B * T + 3, **kw)
    rng = np.random.default_rng(seed + 104729)
    S = c["pool"].shape[0]
    itype = np.int32 if index == "i32" else np.int64
    c.update(rows=rows, B=B, T=T, lengths=lengths, mode=mode, form=form, itype=itype)
    c["cu"] = None if lengths is None else np.concatenate([[0], np.cumsum(lengths)]).astype(itype)
    perm = rng.permutation(S)
    c["read"] = c["write"] = c["tsi"] = c["acc"] = c["inter"] = c["inter_conv"] = None
    if mode == "token_slots":
        tsi = perm[:B * T].reshape(B, T).copy()
        tsi[1] = -1
        acc = rng.integers(1, T + 1, B)
        acc[0] = T
        tsi[0, 0] = -1
        c["tsi"], c["acc"] = tsi.astype(itype), acc.astype(itype)
    else:
        read = perm[:B].copy()
        read[1] = -1
        c["read"] = read.astype(itype)
    if mode == "final":
        write = perm[B:2 * B].copy()
        if B > 2:
            write[2] = -1
        c["write"] = write.astype(itype)
    if mode == "intermediate":
        c["inter"] = store(rng.standard_normal((B, T) + c["pool"].shape[1:]), c["state"])
        if conv:
            c["inter_conv"] = store(rng.standard_normal((B, T) + c["conv_state"].shape[1:]),
                                    c["qkv"])
    return c


def multi_inputs(c):
    """The per-token inputs of a multi-token case in the shapes of its form."""
    B, T, rows = c["B"], c["T"], c["rows"]
    lead = (rows,) if c["cu"] is not None else (B, T)
    shaped = lambda x: x.reshape(*lead, *x.shape[1:])  # noqa: E731
    kw = dict(a=shaped(c["a"]), b=shaped(c["b"]))
    if c["conv"]:
        kw["x"] = shaped(c["x"])
    elif c["form"] == "packed":
        kw["qkv"] = shaped(np.concatenate([c[n].reshape(rows, -1) for n in ("q", "k", "v")], 1))
    elif c["form"] == "flat":
        kw.update({n: c[n].reshape(rows, -1) for n in ("q", "k", "v")})
    else:
        kw.update({n: shaped(c[n]) for n in ("q", "k", "v")})
    if c["norm"]:
        kw["z"] = shaped(c["z"])
    return kw


def _options(c, counter):
    kw = case_kwargs(c, counter)
    del kw["state_indices"], kw["state_out_indices"]
    if c["norm"]:
        kw.update(norm_weight=c["norm_weight"], norm_eps=c["norm_eps"])
    if c["conv"]:
        kw.update(conv_weight=c["conv_weight"], conv_bias=c["conv_bias"])
    return kw


def run_multi(c, **overrides):
    """One gdnkit.decode call of the case on copies of its pools and buffers. Returns
    (out, pool, conv pool, intermediate states, intermediate conv states, counter)."""
    pool = c["pool"].copy()
    conv_state = c["conv_state"].copy() if c["conv"] else None
    inter = None if c["inter"] is None else c["inter"].copy()
    inter_conv = None if c["inter_conv"] is None else c["inter_conv"].copy()
    counter = np.zeros(1, np.uint32)
    kw = _options(c, counter)
    kw.update(multi_inputs(c), num_tokens=c["T"], cu_seqlens=c["cu"], state_indices=c["read"],
              state_out_indices=c["write"], token_state_indices=c["tsi"],
              num_accepted_tokens=c["acc"], intermediate_states=inter,
              intermediate_conv_states=inter_conv, update_state=c["mode"] != "intermediate")
    if c["conv"]:
        kw["conv_state"] = conv_state
    kw.update(overrides)
    out = gdnkit.decode(state=pool, **kw)
    return out, pool, conv_state, inter, inter_conv, counter


def run_chained(c):
    """The case as one-token gdnkit.decode calls chained through scratch pools: row n on
    scratch slot n, starting from its read slot, token t of every row that has one in the
    t-th call; the per-token states then stored where the case's mode says. Returns what
    run_multi returns (the counter None)."""
    B, T, S = c["B"], c["T"], c["pool"].shape[0]
    lengths = [T] * B if c["cu"] is None else list(c["lengths"])
    starts = [n * T for n in range(B)] if c["cu"] is None else [int(x) for x in c["cu"][:-1]]
    if c["tsi"] is not None:
        read = [int(c["tsi"][n, c["acc"][n] - 1]) if 1 <= c["acc"][n] <= T else -1
                for n in range(B)]
    else:
        read = [int(s) for s in c["read"]]
    valid = [0 <= s < S for s in read]
    scratch = c["pool"][[s if ok else 0 for s, ok in zip(read, valid)]].copy()
    conv_scratch = None
    if c["conv"]:
        conv_scratch = c["conv_state"][[s if ok else 0 for s, ok in zip(read, valid)]].copy()
    kw = _options(c, None)
    outs, states, windows = {}, {}, {}
    for t in range(T):
        active = [valid[n] and t < lengths[n] for n in range(B)]
        if not any(active):
            continue
        src = [starts[n] + min(t, max(lengths[n] - 1, 0)) for n in range(B)]
        src = [min(s, c["rows"] - 1) for s in src]
        one = dict(a=c["a"][src], b=c["b"][src], state=scratch,
                   state_indices=np.array([n if active[n] else -1 for n in range(B)], c["itype"]))
        if c["conv"]:
            one.update(x=c["x"][src], conv_state=conv_scratch)
        else:
            one.update(q=c["q"][src], k=c["k"][src], v=c["v"][src])
        if c["norm"]:
            one["z"] = c["z"][src]
        out = gdnkit.decode(**kw, **one)
        for n in range(B):
            if active[n]:
                outs[starts[n] + t] = out[n]
                states[n, t] = scratch[n].copy()
                if c["conv"]:
                    windows[n, t] = conv_scratch[n].copy()
    dtype = next(iter(outs.values())).dtype  # the one-token calls' output dtype
    out = np.zeros((c["rows"], c["Hv"], c["Dv"]), dtype)
    for r, o in outs.items():
        out[r] = o
    if c["cu"] is None:
        out = out.reshape(B, T, c["Hv"], c["Dv"])
    pool = c["pool"].copy()
    conv_state = c["conv_state"].copy() if c["conv"] else None
    inter = None if c["inter"] is None else c["inter"].copy()
    inter_conv = None if c["inter_conv"] is None else c["inter_conv"].copy()
    for (n, t), s in states.items():
        if c["mode"] == "final" and t == lengths[n] - 1 and 0 <= c["write"][n] < S:
            pool[c["write"][n]] = s
            if c["conv"]:
                conv_state[c["write"][n]] = windows[n, t]
        if c["mode"] == "token_slots" and 0 <= c["tsi"][n, t] < S:
            pool[c["tsi"][n, t]] = s
            if c["conv"]:
                conv_state[c["tsi"][n, t]] = windows[n, t]
        if c["mode"] == "intermediate":
            inter[n, t] = s
            if inter_conv is not None:
                inter_conv[n, t] = windows[n, t]
    return out, pool, conv_state, inter, inter_conv, None
