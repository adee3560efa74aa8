"""Drop-ins for FlashInfer's GatedDeltaNet decode API (one token per sequence).

FlashInfer (flashinfer/gdn_decode.py, flashinfer/gdn_kernels/gdn_decode_bf16_state.py):

    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose
    o, pool = gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b,
        use_qk_l2norm=True, initial_state=pool, initial_state_indices=slots)

here:

    from gdnkit.torch.flashinfer import (gated_delta_rule_decode_pretranspose,
                                         gated_delta_rule_decode, gated_delta_rule)

Same signatures, argument order, defaults and results, for T = 1:

    gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=None,
        output=None, use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
        output_state_indices=None, *, intermediate_states_buffer=None,
        disable_state_update=False) -> (output, state or initial_state)
  V-major state [B, HV, V, K] (gdnkit's "vk" layout), or a pool initial_state
  [pool_size, HV, V, K] (any slot stride, K contiguous) addressed by
  initial_state_indices [B] (int32/int64); output_state_indices [B] names a different
  write slot per row. Returns the state tensor it updated in place.

    gated_delta_rule_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None,
        output=None, use_qk_l2norm=True) -> (output, state)
  K-major state [B, HV, K, V] (gdnkit's "kv" layout), updated in place.

    gated_delta_rule(A_log, a, dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=None, k=None, v=None, b=None, initial_state_source=None,
        initial_state_indices=None, output_state_indices=None, output=None,
        use_qk_l2norm_in_kernel=True, scale=None) -> output
  FlashInfer's BF16-state kernel entry (gdn_decode_bf16_state.gated_delta_rule, also
  exported as gated_delta_rule_bf16state_cooprow): the pool initial_state_source
  [pool_size, HV, V, K] is updated in place at the write slots; returns only the output.

Shapes: q, k [B, 1, H, K], v [B, 1, HV, V], a, b [B, 1, HV], A_log, dt_bias [HV]
(head h reads q/k head h // (HV / H)). The output is [B, 1, HV, V] in q's dtype, or,
when `output` is given, written into `output` (in its dtype) and returned as that same
tensor. Gate as FlashInfer's: g = -exp(A_log) * softplus(a + dt_bias) (softplus(x) = x
above x = 20; gated_delta_rule: softplus(beta * x) / beta, switching at beta * x >
threshold), beta = sigmoid(b); use_qk_l2norm: x * rsqrt(sum x^2 + 1e-6); scale None =
K**-0.5, applied to q after the norm.

Deliberate differences from FlashInfer:
  - Padding rows (a negative initial_state_indices entry) read and write no slot and
    get an all-zero output row, whatever the state dtype: FlashInfer's float32 kernel
    does the same, but its BF16-state kernels (bf16 state, K = V = 128) send padding
    rows to slot 0, read and write slot 0 there (a "null buffer" the caller reserves)
    and leave the output row undefined. Here slot 0 is an ordinary slot: a pool laid
    out with a sacrificial slot 0 keeps working, and that slot is simply never touched.
  - A negative output_state_indices entry (valid read slot) computes the output and
    writes no state; FlashInfer's float32 kernel redirects that write to slot 0.
  - An index >= the pool size is treated as padding (FlashInfer reads and writes out
    of bounds).
  - float16 q, k, v, a, b are read as float16. FlashInfer's kernels load them as
    bfloat16 (and compute the output in bfloat16 before casting it to q's dtype), so
    there float16 inputs give results bit-identical to the same values passed as
    bfloat16. gdnkit does not convert: that would throw away 3 mantissa bits of the
    caller's data. The float16 result is at least as accurate as the bfloat16 one and
    within the bfloat16 tolerance of it, but not bitwise equal; a caller who wants the
    bfloat16 result bit for bit passes bfloat16 tensors. Likewise the output is rounded
    once, to its own dtype (q's, or `output`'s), not through bfloat16 first.
  - Without `output`, every call returns a new tensor. FlashInfer's gated_delta_rule
    returns a buffer cached per shape that its next call of that shape overwrites.
  - With `output`, the step computes into a temporary in `output`'s dtype and copies
    it into `output` (one extra pass over B * HV * V elements).
  - Accepted beyond FlashInfer: float32, bfloat16 and float16 states on all three
    entries (FlashInfer: float32 or bfloat16 with K = V = 128; float32 only for
    gated_delta_rule_decode; bfloat16 only for gated_delta_rule); float32 q, k, v;
    any head dims gdnkit supports (multiples of 16 in [16, 256]; FlashInfer needs
    K = V = 128 for bfloat16 states, K, V >= 128 otherwise); gated_delta_rule without
    initial_state_indices (row n uses slot n, as FlashInfer releases before its
    pool-only kernels did). A pool whose per-slot blocks are not packed ([HV, V, K]
    dense) is stepped on a packed copy that is written back.
  - Arguments FlashInfer checks with `assert` raise ValueError here, naming them.

Not supported (NotImplementedError, naming the argument): more than one token per
sequence (q [B, T, H, K] with T > 1: FlashInfer's multi-token (MTP) path, with
intermediate_states_buffer and disable_state_update), scale=0 (gdnkit reads a zero
scale as "default"), softplus thresholds below 15. As in FlashInfer,
intermediate_states_buffer or disable_state_update with T = 1 raise ValueError.
"""
import torch

from . import _ops
from ._gates import raw_gate_inputs

_WHO_PRETRANSPOSE = "gated_delta_rule_decode_pretranspose"
_WHO_DECODE = "gated_delta_rule_decode"
_WHO_BF16 = "gated_delta_rule"


def _shape_bthd(q, v, who):
    if q.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{who}: q, k [B, T, H, K] and v [B, T, HV, V] must be 4-D, got q "
                         f"{tuple(q.shape)}, v {tuple(v.shape)}")
    B, T, H, K = q.shape
    return B, T, H, K, v.shape[2], v.shape[3]


def _one_token(T, who):
    if T != 1:
        raise NotImplementedError(
            f"{who}: q, k, v with T = {T} tokens per sequence (q [B, T, H, K]) are not "
            f"supported by gdnkit here: one token per sequence (T = 1); the multi-token "
            f"(MTP) path is not implemented")


def _slot_indices(idx, B, name, who):
    if idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{who}: {name} must be int32 or int64, got {idx.dtype}")
    if tuple(idx.shape) != (B,):
        raise ValueError(f"{who}: expected {name} shape [{B}], got {tuple(idx.shape)}")
    return idx if idx.stride(0) == 1 else idx.contiguous()


def _packed_slots(pool):
    """(pool, False) when gdnkit can address the pool in place (every slot's block
    packed; the slot stride is free), else (a packed copy, True): the copy is stepped
    and written back, so the caller's tensor is still the one updated."""
    n, d1, d2, d3 = pool.shape
    s0, s1, s2, s3 = pool.stride()
    packed = (s3 == 1 and (d2 == 1 or s2 == d3) and (d1 == 1 or s1 == d2 * d3)
              and (n == 1 or s0 >= d1 * d2 * d3))
    if packed:
        return pool, False
    return pool.contiguous(), True


def _inner_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _step(who, *, q, k, v, a, b, A_log, dt_bias, state, layout, read, write, scale,
          use_qk_l2norm, output, softplus_beta=1.0, softplus_threshold=20.0):
    """One gdnkit step with FlashInfer's tensors; returns the output [B, 1, HV, V]."""
    B, _, _, K, HV, V = _shape_bthd(q, v, who)
    if scale is None:
        scale = K**-0.5
    elif float(scale) == 0.0:
        raise NotImplementedError(f"{who}: scale=0 is not supported by gdnkit (a zero scale "
                                  f"means K**-0.5 there)")
    if output is not None and tuple(output.shape) != (B, 1, HV, V):
        raise ValueError(f"{who}: expected output shape [{B}, 1, {HV}, {V}], got "
                         f"{tuple(output.shape)}")
    A_log, a, b, dt_bias = raw_gate_inputs(A_log, a.reshape(B, HV), b.reshape(B, HV), dt_bias,
                                           softplus_beta, softplus_threshold, who)
    if write is not None and write.dtype != read.dtype:
        write = write.to(read.dtype)
    pool, write_back = _packed_slots(state)
    o = _ops.decode_kw(
        q=_inner_contiguous(q), k=_inner_contiguous(k), v=_inner_contiguous(v), a=a, b=b,
        A_log=A_log, dt_bias=dt_bias, state=pool, state_indices=read, state_out_indices=write,
        layout=layout, gate=_ops.RAW, l2norm=_ops.RSQRT if use_qk_l2norm else _ops.NO_NORM,
        scale=float(scale), out_dtype=q.dtype if output is None else output.dtype)
    if write_back:
        state.copy_(pool)
    o = o.reshape(B, 1, HV, V)
    if output is None:
        return o
    output.copy_(o)
    return output


def gated_delta_rule_decode_pretranspose(
    q,
    k,
    v,
    state,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    use_qk_l2norm=True,
    initial_state=None,
    initial_state_indices=None,
    output_state_indices=None,
    *,
    intermediate_states_buffer=None,
    disable_state_update=False,
):
    """FlashInfer's V-major decode for T = 1: state [B, HV, V, K], or the pool
    initial_state [pool_size, HV, V, K] with initial_state_indices (and optionally
    output_state_indices). Returns (output [B, 1, HV, V], the state tensor updated in
    place: initial_state with a pool, else state)."""
    who = _WHO_PRETRANSPOSE
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    if (intermediate_states_buffer is not None or disable_state_update) and T == 1:
        raise ValueError(f"{who}: intermediate_states_buffer and disable_state_update are "
                         f"supported only by BF16 pretranspose decode with T > 1")
    _one_token(T, who)
    use_pool = initial_state is not None
    if use_pool != (initial_state_indices is not None):
        raise ValueError(f"{who}: initial_state and initial_state_indices must be provided "
                         f"together")
    if output_state_indices is not None and not use_pool:
        raise ValueError(f"{who}: output_state_indices can only be used with initial_state "
                         f"(pool mode)")
    if use_pool:
        pool_size = initial_state.shape[0]
        if tuple(initial_state.shape) != (pool_size, HV, V, K):
            raise ValueError(f"{who}: expected initial_state shape [pool_size={pool_size}, "
                             f"HV={HV}, V={V}, K={K}], got {tuple(initial_state.shape)}")
        if initial_state.stride(-1) != 1:
            raise ValueError(f"{who}: initial_state must be K-contiguous (stride[-1] == 1), "
                             f"got stride={initial_state.stride()}")
        target = initial_state
        read = _slot_indices(initial_state_indices, B, "initial_state_indices", who)
        write = (None if output_state_indices is None else
                 _slot_indices(output_state_indices, B, "output_state_indices", who))
    else:
        if state is None:
            raise ValueError(f"{who}: either state or initial_state must be provided")
        if tuple(state.shape) != (B, HV, V, K):
            raise ValueError(f"{who}: expected state shape [B={B}, HV={HV}, V={V}, K={K}], "
                             f"got {tuple(state.shape)}")
        target, read, write = state, None, None
    o = _step(who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=target,
              layout=_ops.VK, read=read, write=write, scale=scale,
              use_qk_l2norm=use_qk_l2norm, output=output)
    return o, target


def gated_delta_rule_decode(
    q,
    k,
    v,
    state,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    use_qk_l2norm=True,
):
    """FlashInfer's K-major decode for T = 1: state [B, HV, K, V], updated in place.
    Returns (output [B, 1, HV, V], state)."""
    who = _WHO_DECODE
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    _one_token(T, who)
    if state is None or tuple(state.shape) != (B, HV, K, V):
        got = None if state is None else tuple(state.shape)
        raise ValueError(f"{who}: expected state shape [B={B}, HV={HV}, K={K}, V={V}], got {got}")
    o = _step(who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state,
              layout=_ops.KV, read=None, write=None, scale=scale,
              use_qk_l2norm=use_qk_l2norm, output=output)
    return o, state


def gated_delta_rule(
    A_log,
    a,
    dt_bias,
    softplus_beta=1.0,
    softplus_threshold=20.0,
    q=None,
    k=None,
    v=None,
    b=None,
    initial_state_source=None,
    initial_state_indices=None,
    output_state_indices=None,
    output=None,
    use_qk_l2norm_in_kernel=True,
    scale=None,
):
    """FlashInfer's BF16-state decode entry for T = 1 over the pool initial_state_source
    [pool_size, HV, V, K] (updated in place at the write slots: output_state_indices,
    else initial_state_indices). Returns output [B, 1, HV, V]."""
    who = _WHO_BF16
    for name, value in (("q", q), ("k", k), ("v", v), ("b", b),
                        ("initial_state_source", initial_state_source)):
        if value is None:
            raise ValueError(f"{who}: {name} is required")
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    _one_token(T, who)
    pool_size = initial_state_source.shape[0]
    if tuple(initial_state_source.shape) != (pool_size, HV, V, K):
        raise ValueError(f"{who}: expected initial_state_source shape [pool_size={pool_size}, "
                         f"HV={HV}, V={V}, K={K}], got {tuple(initial_state_source.shape)}")
    if initial_state_indices is None:
        if output_state_indices is not None:
            raise ValueError(f"{who}: output_state_indices needs initial_state_indices")
        read = write = None
    else:
        read = _slot_indices(initial_state_indices, B, "initial_state_indices", who)
        write = (None if output_state_indices is None else
                 _slot_indices(output_state_indices, B, "output_state_indices", who))
    return _step(who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                 state=initial_state_source, layout=_ops.VK, read=read, write=write,
                 scale=scale, use_qk_l2norm=use_qk_l2norm_in_kernel, output=output,
                 softplus_beta=softplus_beta, softplus_threshold=softplus_threshold)


# FlashInfer's older name for the same entry point.
gated_delta_rule_bf16state_cooprow = gated_delta_rule


__all__ = [
    "gated_delta_rule_decode_pretranspose",
    "gated_delta_rule_decode",
    "gated_delta_rule",
    "gated_delta_rule_bf16state_cooprow",
]
