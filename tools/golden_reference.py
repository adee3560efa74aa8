"""The float64 reference of gdnkit's golden cases (used by gen_golden.py).

Storage dtypes (rounding to F32/F16/BF16/I32/I64 and decoding back to float64)
and one GatedDeltaNet decode step, with the optional conv1d prologue and gated
RMSNorm epilogue, in float64. Python 3 and numpy only; never imports gdnkit.
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
