"""The float64 reference of gdnkit's golden cases (used by gen_golden.py).

Storage dtypes (rounding to F32/F16/BF16/I32/I64 and decoding back to float64)
and one GatedDeltaNet decode step, with the optional conv1d prologue and gated
RMSNorm epilogue, in float64; and the multi-token step (format version 3: several
tokens per row, each row's state carried from token to token), with a second
form of it built from chained one-token steps, against which the generator checks
it. Python 3 and numpy only; never imports gdnkit.
"""

import math

import numpy as np


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


def token_step(q, k, v, a, b, A_log, dt_bias, S_in, layout, l2norm_mode, eps, scale, head_map, gate):
    """One token of one row, every v-head, in float64.

    q, k: (Hk, Dk); v: (Hv, Dv); a, b: (Hv); A_log, dt_bias: (Hv) or None; S_in: the row's
    state (Hv, Dk, Dv) for layout kv, (Hv, Dv, Dk) for vk. Returns (o (Hv, Dv), the new
    state in the layout of S_in, not rounded to any dtype).
    """
    Hk = q.shape[0]
    Hv, Dv = v.shape
    G = Hv // Hk
    o = np.zeros((Hv, Dv), dtype=np.float64)
    S_out = np.empty_like(S_in)
    for h in range(Hv):
        hk = h // G if head_map == "interleaved" else h % Hk
        qh = l2norm(q[hk], l2norm_mode, eps)
        kh = l2norm(k[hk], l2norm_mode, eps)
        if gate == "raw":
            # g = -exp(A_log) * softplus(a + dt_bias) ; beta = sigmoid(b_raw)
            g = -math.exp(A_log[h]) * softplus(a[h] + dt_bias[h])
            beta = sigmoid(b[h])
        else:
            # precomputed: a holds g, b holds beta
            g, beta = a[h], b[h]
        # S[i, j], i over Dk, j over Dv; the vk layout stores S^T
        S_old = S_in[h] if layout == "kv" else S_in[h].T
        # S = exp(g) * S_old                          (decay; exp(g) may underflow to 0)
        S = math.exp(g) * S_old
        # u = S^T kh                                  (u[j] = sum_i S[i, j] kh[i])
        u = S.T @ kh
        # delta = beta * (v - u)
        delta = beta * (v[h] - u)
        # S = S + kh (x) delta                        (rank-1 update)
        S = S + np.outer(kh, delta)
        # o = scale * S^T qh
        o[h] = scale * (S.T @ qh)
        S_out[h] = S if layout == "kv" else S.T
    return o, S_out


def reference(q, k, v, a, b, A_log, dt_bias, state, layout, l2norm_mode, eps, scale,
              head_map, gate, state_indices=None, state_out_indices=None):
    """One GatedDeltaNet decode step in float64.

    q, k: (B, Hk, Dk); v: (B, Hv, Dv); a, b: (B, Hv); A_log, dt_bias: (Hv) or None;
    state: (S, Hv, Dk, Dv) for layout kv, (S, Hv, Dv, Dk) for vk; all float64 holding
    the stored values. Returns (o (B, Hv, Dv), new pool (same shape as state)).
    """
    B = q.shape[0]
    Hv, Dv = v.shape[1], v.shape[2]
    num_slots = state.shape[0]
    o = np.zeros((B, Hv, Dv), dtype=np.float64)
    new_state = state.copy()  # the whole pool; slots nobody writes keep their values exactly

    for row in range(B):
        s = int(state_indices[row]) if state_indices is not None else row
        s_out = int(state_out_indices[row]) if state_out_indices is not None else s
        if s < 0 or s >= num_slots:
            continue  # padding row (or an out-of-range index): o stays 0, no state read or written
        o[row], S_new = token_step(q[row], k[row], v[row], a[row], b[row], A_log, dt_bias, state[s],
                                   layout, l2norm_mode, eps, scale, head_map, gate)
        if 0 <= s_out < num_slots:
            new_state[s_out] = S_new
    return o, new_state


def silu(t):
    """silu(t) = t / (1 + exp(-t)) = t * sigmoid(t), elementwise, exp never overflows."""
    t = np.asarray(t, dtype=np.float64)
    e = np.exp(-np.abs(t))
    sig = np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return t * sig


def conv_token(taps, x, conv_weight, conv_bias):
    """One token of the conv1d prologue for one row: taps (C, W-1) oldest first, x (C).
    Returns (y (C), the taps after x shifted in (C, W-1)); neither is rounded (the taps are
    input values, y goes straight into the step)."""
    window = np.concatenate([taps, x[:, None]], axis=1)  # (C, W), oldest first
    pre = np.sum(conv_weight * window, axis=1)
    if conv_bias is not None:
        pre = pre + conv_bias
    return silu(pre), window[:, 1:]


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
        y[row], taps = conv_token(conv_state[s], x[row], conv_weight, conv_bias)
        if 0 <= s_out < num_slots:
            new_pool[s_out] = taps
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
# the multi-token step (format version 3): several tokens per row
# ---------------------------------------------------------------------------

def multi_token_plan(num_slots, T, row_tokens, state_indices=None, state_out_indices=None,
                     token_state_indices=None, num_accepted_tokens=None, update_state=True):
    """What each row of a multi-token step reads and writes.

    row_tokens[b]: the token rows (indices into the per-token tensors) that row b owns, in
    order. Returns one dict per row: tokens; read (the slot the state comes from, None for a
    padding row); token_slots (per token, the slot its state goes to, or None); final (the
    slot the state after the last token goes to, or None). Out-of-range entries are dropped
    here (nothing is read or written through them); count_invalid_multi counts them.
    """
    def in_pool(s):
        return s if 0 <= s < num_slots else None

    plans = []
    for b, toks in enumerate(row_tokens):
        if state_indices is not None:
            s = int(state_indices[b])
        elif token_state_indices is not None:
            # vLLM: the state of the last accepted token of the previous step
            n = int(num_accepted_tokens[b]) if num_accepted_tokens is not None else 1
            s = int(token_state_indices[b][n - 1]) if 1 <= n <= T else -1
        else:
            s = b
        plan = dict(tokens=list(toks), read=in_pool(s), token_slots=[None] * len(toks), final=None)
        if plan["read"] is not None:  # a padding row writes nothing
            if token_state_indices is not None:
                plan["token_slots"] = [in_pool(int(token_state_indices[b][t])) for t in range(len(toks))]
            # the final write: state_out_indices, else the read slot unless the token slots are
            # the writes; a row without tokens has no state after its last token
            if update_state and toks and state_out_indices is not None:
                plan["final"] = in_pool(int(state_out_indices[b]))
            elif update_state and toks and token_state_indices is None:
                plan["final"] = in_pool(s)
        plans.append(plan)
    return plans


def count_invalid_multi(num_slots, T, row_tokens, state_indices=None, state_out_indices=None,
                        token_state_indices=None, num_accepted_tokens=None, update_state=True):
    """The out-of-range index entries a multi-token step consults (its invalid_indices):
    per row, the per-token slots of its tokens, its read slot (state_indices, else the
    accepted token's slot when that one is not among the row's tokens, else nothing), a
    num_accepted_tokens entry outside [1, T], and its final write slot when there is one."""
    bad = 0
    for b, toks in enumerate(row_tokens):
        tokens = len(toks)
        if token_state_indices is not None:
            bad += sum(int(token_state_indices[b][t]) >= num_slots for t in range(tokens))
        if state_indices is not None:
            bad += int(state_indices[b]) >= num_slots
        elif token_state_indices is not None:
            n = int(num_accepted_tokens[b]) if num_accepted_tokens is not None else 1
            if n < 1 or n > T:
                bad += 1
            elif int(token_state_indices[b][n - 1]) >= num_slots and n - 1 >= tokens:
                bad += 1  # an entry among the row's tokens was counted above
        if update_state and state_out_indices is not None:
            bad += int(state_out_indices[b]) >= num_slots
    return bad


def check_slot_rule(plans):
    """No two rows write one slot, no row writes a slot another row reads (every per-token slot
    counts), and no row writes one slot twice: the result does not depend on the row order."""
    writer = {}
    for b, p in enumerate(plans):
        writes = [s for s in p["token_slots"] + [p["final"]] if s is not None]
        assert len(set(writes)) == len(writes), f"row {b} writes a slot twice: {writes}"
        for s in writes:
            assert writer.setdefault(s, b) == b, f"rows {writer[s]} and {b} both write slot {s}"
    for b, p in enumerate(plans):
        if p["read"] is not None:
            assert writer.get(p["read"], b) == b, f"row {b} reads slot {p['read']}, which row {writer[p['read']]} writes"


def _split_qkv(y, Hk, Dk, Hv, Dv):
    """A packed q|k|v row (the conv output) -> q (Hk, Dk), k (Hk, Dk), v (Hv, Dv)."""
    return (y[:Hk * Dk].reshape(Hk, Dk), y[Hk * Dk:2 * Hk * Dk].reshape(Hk, Dk),
            y[2 * Hk * Dk:].reshape(Hv, Dv))


def reference_multi(q, k, v, a, b, A_log, dt_bias, state, state_dtype, layout, l2norm_mode, eps, scale,
                    head_map, gate, plans, T, conv=None, norm=None):
    """The multi-token step in float64.

    Per-token tensors hold one row per token (N of them, dense b*T+t or packed): q, k
    (N, Hk, Dk); v (N, Hv, Dv); a, b (N, Hv). state: the pool in its stored layout; plans:
    multi_token_plan's. conv: None or (x (N, C), conv pool (S, C, W-1) channel-major,
    conv_weight (C, W), conv_bias (C) or None); norm: None or (z (N, Hv, Dv), norm_weight,
    norm_eps). Per row, from the read slot, every token runs the one-token step on the
    state left by the token before; token t's output uses the new state as computed, then
    the state is rounded to state_dtype (a store and a reload) and carried on. The conv
    window is not rounded (its values are input values).

    Returns (o (N, Hv, Dv), new pool, new conv pool or None, intermediate (B, T, Hv, ..)
    in the stored layout, intermediate conv windows (B, T, C, W-1) or None). Intermediate
    entries of tokens a row does not have, and of padding rows, are NaN.
    """
    B = len(plans)
    Hk, Dk = q.shape[1], q.shape[2]
    Hv, Dv = v.shape[1], v.shape[2]
    o = np.zeros((q.shape[0], Hv, Dv), dtype=np.float64)
    new_state = state.copy()  # reads come from `state` (the pool before the step)
    inter = np.full((B, T) + state.shape[1:], np.nan)
    new_conv = inter_conv = None
    if conv is not None:
        x, conv_pool, conv_weight, conv_bias = conv
        new_conv = conv_pool.copy()
        inter_conv = np.full((B, T) + conv_pool.shape[1:], np.nan)
    live = []  # token rows that are not padding (the norm runs on them)
    for row, p in enumerate(plans):
        if p["read"] is None:
            continue  # padding: its tokens' outputs stay 0, nothing read or written
        S = state[p["read"]]
        taps = conv_pool[p["read"]] if conv is not None else None
        for t, tok in enumerate(p["tokens"]):
            if conv is not None:
                y, taps = conv_token(taps, x[tok], conv_weight, conv_bias)
                qt, kt, vt = _split_qkv(y, Hk, Dk, Hv, Dv)
            else:
                qt, kt, vt = q[tok], k[tok], v[tok]
            o[tok], S_new = token_step(qt, kt, vt, a[tok], b[tok], A_log, dt_bias, S, layout,
                                       l2norm_mode, eps, scale, head_map, gate)
            S = rounded(S_new, state_dtype)  # what the pool would hold: the next token starts here
            live.append(tok)
            inter[row, t] = S
            if conv is not None:
                inter_conv[row, t] = taps
            if p["token_slots"][t] is not None:
                new_state[p["token_slots"][t]] = S
                if conv is not None:
                    new_conv[p["token_slots"][t]] = taps
        if p["final"] is not None:
            new_state[p["final"]] = S
            if conv is not None:
                new_conv[p["final"]] = taps
    if norm is not None:
        z, norm_weight, norm_eps = norm
        o = gated_rmsnorm(o, z, norm_weight, norm_eps, live)
    return o, new_state, new_conv, inter, inter_conv


def reference_multi_chained(q, k, v, a, b, A_log, dt_bias, state, state_dtype, layout, l2norm_mode, eps,
                            scale, head_map, gate, T, row_tokens, state_indices=None,
                            state_out_indices=None, token_state_indices=None, num_accepted_tokens=None,
                            update_state=True, conv=None, norm=None):
    """reference_multi's results built another way, as a check of it: every token of a row is
    one call of the one-token reference (and conv_reference, gated_rmsnorm) on a pool of one
    slot holding the row's state, stored (rounded to state_dtype) between calls; the slots are
    resolved here from the index arrays, without multi_token_plan. Same arguments as
    reference_multi, with the index arrays instead of plans; same results, bit for bit."""
    B = len(row_tokens)
    S_pool = state.shape[0]
    Hk, Dk = q.shape[1], q.shape[2]
    Hv, Dv = v.shape[1], v.shape[2]
    o = np.zeros((q.shape[0], Hv, Dv), dtype=np.float64)
    new_state = state.copy()
    inter = np.full((B, T) + state.shape[1:], np.nan)
    new_conv = inter_conv = None
    if conv is not None:
        x, conv_pool, conv_weight, conv_bias = conv
        new_conv = conv_pool.copy()
        inter_conv = np.full((B, T) + conv_pool.shape[1:], np.nan)
    for row in range(B):
        if state_indices is not None:
            s = int(state_indices[row])
        elif token_state_indices is not None:
            n = 1 if num_accepted_tokens is None else int(num_accepted_tokens[row])
            if not 1 <= n <= T:
                continue
            s = int(token_state_indices[row][n - 1])
        else:
            s = row
        if not 0 <= s < S_pool:
            continue
        one = state[s:s + 1].copy()  # the row's own pool of one slot, run in place
        one_conv = conv_pool[s:s + 1].copy() if conv is not None else None
        for t, tok in enumerate(row_tokens[row]):
            if conv is not None:
                y, one_conv = conv_reference(x[tok:tok + 1], one_conv, conv_weight, conv_bias)
                qt = y[:, :Hk * Dk].reshape(1, Hk, Dk)
                kt = y[:, Hk * Dk:2 * Hk * Dk].reshape(1, Hk, Dk)
                vt = y[:, 2 * Hk * Dk:].reshape(1, Hv, Dv)
            else:
                qt, kt, vt = q[tok:tok + 1], k[tok:tok + 1], v[tok:tok + 1]
            ot, one = reference(qt, kt, vt, a[tok:tok + 1], b[tok:tok + 1], A_log, dt_bias, one, layout,
                                l2norm_mode, eps, scale, head_map, gate)
            if norm is not None:
                ot = gated_rmsnorm(ot, norm[0][tok:tok + 1], norm[1], norm[2], [0])
            o[tok] = ot[0]
            one = decode(encode(one, state_dtype), state_dtype)  # stored between the calls
            inter[row, t] = one[0]
            if conv is not None:
                inter_conv[row, t] = one_conv[0]
            dst = int(token_state_indices[row][t]) if token_state_indices is not None else -1
            if 0 <= dst < S_pool:
                new_state[dst] = one[0]
                if conv is not None:
                    new_conv[dst] = one_conv[0]
        if update_state and len(row_tokens[row]) > 0 and (state_out_indices is not None
                                                           or token_state_indices is None):
            dst = int(state_out_indices[row]) if state_out_indices is not None else s
            if 0 <= dst < S_pool:
                new_state[dst] = one[0]
                if conv is not None:
                    new_conv[dst] = one_conv[0]
    return o, new_state, new_conv, inter, inter_conv
