"""Drop-ins for FlashInfer's GatedDeltaNet decode API.

FlashInfer (flashinfer/gdn_decode.py, flashinfer/gdn_kernels/gdn_decode_bf16_state.py):

    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose
    o, pool = gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b,
        use_qk_l2norm=True, initial_state=pool, initial_state_indices=slots)

here:

    from gdnkit.torch.flashinfer import (gated_delta_rule_decode_pretranspose,
                                         gated_delta_rule_mtp, gated_delta_rule_decode,
                                         gated_delta_rule)

Same signatures, argument order, defaults and results:

    gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=None,
        output=None, use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
        output_state_indices=None, *, intermediate_states_buffer=None,
        disable_state_update=False) -> (output, state or initial_state)
  V-major state [B, HV, V, K] (gdnkit's "vk" layout), or a pool initial_state
  [pool_size, HV, V, K] (any slot stride, K contiguous) addressed by
  initial_state_indices [B] (int32/int64); output_state_indices [B] names a different
  write slot per row. Returns the state tensor it updated in place. With T > 1 tokens per
  sequence it runs the multi-token path below, as FlashInfer does (with a per-batch
  `state`, row n is slot n); intermediate_states_buffer and disable_state_update need
  T > 1 (ValueError with T = 1, as in FlashInfer).

    gated_delta_rule_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias,
        b, scale=None, output=None, intermediate_states_buffer=None,
        ssm_state_indices=None, disable_state_update=None, use_qk_l2norm=True,
        output_state_indices=None) -> (output, initial_state)
  Several tokens per sequence (speculative decoding verification: T = 1 + k draft
  tokens) over the pool initial_state [pool_size, HV, V, K]. disable_state_update=None
  means True, as in FlashInfer (which warns that its default will become False): a
  FutureWarning says so; pass it explicitly.

    gated_delta_rule_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None,
        output=None, use_qk_l2norm=True) -> (output, state)
  K-major state [B, HV, K, V] (gdnkit's "kv" layout), updated in place; T = 1.

    gated_delta_rule(A_log, a, dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=None, k=None, v=None, b=None, initial_state_source=None,
        initial_state_indices=None, output_state_indices=None, output=None,
        use_qk_l2norm_in_kernel=True, scale=None) -> output
  FlashInfer's BF16-state kernel entry (gdn_decode_bf16_state.gated_delta_rule, also
  exported as gated_delta_rule_bf16state_cooprow), T = 1: the pool initial_state_source
  [pool_size, HV, V, K] is updated in place at the write slots; returns only the output.

Shapes: q, k [B, T, H, K], v [B, T, HV, V], a, b [B, T, HV], A_log, dt_bias [HV]
(head h reads q/k head h // (HV / H)). The output is [B, T, HV, V] in q's dtype, or,
when `output` is given, written into `output` (in its dtype) and returned as that same
tensor. Gate as FlashInfer's: g = -exp(A_log) * softplus(a + dt_bias) (softplus(x) = x
above x = 20; gated_delta_rule: softplus(beta * x) / beta, switching at beta * x >
threshold), beta = sigmoid(b); use_qk_l2norm: x * rsqrt(sum x^2 + 1e-6); scale None =
K**-0.5, applied to q after the norm.

Several tokens per sequence (T > 1), as FlashInfer's MTP kernels: token t of row n runs
on the state token t - 1 left (token 0 on slot initial_state_indices[n]); its output is
output[n, t]. Where the states go:
  - by default, the state after the row's last token goes to its write slot
    (output_state_indices[n], else initial_state_indices[n]); a negative write slot
    writes nothing;
  - intermediate_states_buffer [>= B, >= T, HV, V, K] (contiguous, in the pool's dtype):
    the state after token t of row n also goes to the buffer's state block n * T + t,
    counted over the buffer as [B * T, HV, V, K] blocks from its start, as FlashInfer's
    kernels address it: buffer[n, t] when the buffer has T steps (FlashInfer's
    documented shape); with more steps, FlashInfer packs the blocks the same way;
  - disable_state_update=True: the pool is not written at all (bitwise unchanged),
    typically with intermediate_states_buffer keeping every token's state for rollback;
  - ssm_state_indices [B, T] (gated_delta_rule_mtp only; with neither of the two above):
    the state after token t goes to pool slot ssm_state_indices[n, t]; the state after
    the last token also goes to output_state_indices[n] when that is given (FlashInfer's
    split pool), else nowhere else (slot initial_state_indices[n] keeps its state).
It is one gdnkit call, whose multi-token modes are these: initial_state_indices and
output_state_indices are its read and write slots, intermediate_states_buffer its
intermediate_states (a [B, T] view of the buffer's first B * T blocks),
disable_state_update its update_state=False, ssm_state_indices its token_state_indices
(with output_state_indices still the final write slot).
The state is read once and kept across the row's tokens, rounded to its dtype after
every token (a store and a reload) and each token's output computed from the unrounded
state, so the result is bitwise that of T one-token calls chained through the pool on
the same backend. Nothing synchronizes with the device. On a GPU, a call whose tokens do not fit one
block's shared memory is refused (ValueError, nothing written; docs/operation.md,
"Multi-token decode").

Deliberate differences from FlashInfer:
  - Padding rows (a negative initial_state_indices entry) read and write no slot and
    get an all-zero output row, whatever the state dtype and T: FlashInfer's float32
    kernels do the same for T = 1 (the MTP kernel leaves the row of a caller's `output`
    as it was, zero only in the output it allocates; here the row is zeroed either way),
    but its BF16-state kernels (bf16 state, K = V = 128) send padding rows to slot 0,
    read and write slot 0 there (a "null buffer" the caller reserves), write that row's
    blocks of intermediate_states_buffer, and leave the output row undefined. Here slot 0
    is an ordinary slot: a pool laid out with a sacrificial slot 0 keeps working, and
    that slot is simply never touched; a padding row's intermediate_states_buffer
    blocks are left as they were.
  - A negative output_state_indices entry (valid read slot) computes the output and
    writes no state, as FlashInfer's MTP kernel does; its float32 T = 1 kernel
    redirects that write to slot 0.
  - An index >= the pool size is treated as padding (FlashInfer reads and writes out
    of bounds). A negative or out-of-range ssm_state_indices entry (FlashInfer does not
    check them) stores nothing for that token; the row's other tokens run and store as
    usual. Two rows may not write the same slot, nor one row write a slot another reads
    (gdnkit's one-writer rule, counting every per-token slot): the host backend refuses
    such a call, and on a GPU its result is unspecified, as with FlashInfer's kernels.
  - bfloat16 (and float16) states are rounded to their dtype after every token.
    FlashInfer's BF16 MTP kernels keep the state in float32 registers across the T
    tokens and round only what they store, so from the second token on their outputs
    and states differ from gdnkit's (and from T one-token calls) by bfloat16 rounding,
    within the bfloat16 tolerance. Float32 states round to themselves: no difference.
  - With intermediate_states_buffer and disable_state_update=False the final state is
    also written to the pool, as FlashInfer's float32 MTP kernel and its BF16 ILP kernel
    do; FlashInfer's BF16 wide-vector kernel (which it picks when B * HV >= 128) skips
    that pool write whenever the buffer is given.
  - float16 q, k, v, a, b are read as float16. FlashInfer's kernels load them as
    bfloat16 (and compute the output in bfloat16 before casting it to q's dtype), so
    there float16 inputs give results bit-identical to the same values passed as
    bfloat16. gdnkit does not convert: that would throw away 3 mantissa bits of the
    caller's data. The float16 result is at least as accurate as the bfloat16 one and
    within the bfloat16 tolerance of it, but not bitwise equal; a caller who wants the
    bfloat16 result bit for bit passes bfloat16 tensors. Likewise the output is rounded
    once, to its own dtype (q's, or `output`'s), not through bfloat16 first.
  - Without `output`, every call returns a new tensor. FlashInfer's gated_delta_rule
    (and its BF16 MTP kernel) return a buffer cached per shape that the next call of
    that shape overwrites.
  - With `output`, the call computes into a temporary in `output`'s dtype and copies it
    into `output` (one extra pass over the B * T * HV * V output elements).
  - Accepted beyond FlashInfer: float32, bfloat16 and float16 states on every entry
    (FlashInfer: float32 or bfloat16 with K = V = 128 for the pretranspose entry;
    float32 only for gated_delta_rule_decode and gated_delta_rule_mtp; bfloat16 only for
    gated_delta_rule); float32 q, k, v; any head dims gdnkit supports (multiples of 16 in
    [16, 256]; FlashInfer needs K = V = 128 for bfloat16 states, K, V >= 128
    otherwise); with T > 1 on the pretranspose entry, a per-batch `state`,
    intermediate_states_buffer and disable_state_update whatever the state dtype and
    head dims (FlashInfer: bfloat16 K = V = 128 only; its float32 path needs a pool and
    refuses the other two); an intermediate_states_buffer with more than B rows there
    (FlashInfer's BF16 path wants exactly B); a pool of any slot strides in
    gated_delta_rule_mtp; gated_delta_rule without initial_state_indices (row n uses
    slot n, as FlashInfer releases before its pool-only kernels did). A pool whose
    per-slot blocks are not packed ([HV, V, K] dense) is stepped on a packed copy that
    is written back.
  - Arguments FlashInfer checks with `assert` raise ArgumentError here, naming them
    (a ValueError that is also an AssertionError, so that either except clause, the
    caller's of FlashInfer or a Python caller's, catches it): T > 1
    on gated_delta_rule_decode and gated_delta_rule (FlashInfer's entries for one token
    a sequence), an intermediate_states_buffer of the wrong shape, dtype or layout,
    ssm_state_indices together with intermediate_states_buffer or
    disable_state_update, with T < 2, or other than int32. So do, beyond FlashInfer's
    checks, a and b other than [B, T, HV] when T > 1 (FlashInfer's kernels index them
    as such).

Not supported (NotImplementedError, naming the argument): scale=0 (gdnkit reads a zero
scale as "default"), softplus thresholds below 15.
"""
import warnings

import torch

from . import _ops
from ._gates import raw_gate_inputs



class ArgumentError(ValueError, AssertionError):
    """A bad argument: FlashInfer checks its arguments with `assert` (AssertionError), Python
    callers expect ValueError; this is both."""


_WHO_PRETRANSPOSE = "gated_delta_rule_decode_pretranspose"
_WHO_MTP = "gated_delta_rule_mtp"
_WHO_DECODE = "gated_delta_rule_decode"
_WHO_BF16 = "gated_delta_rule"


def _shape_bthd(q, v, who):
    if q.ndim != 4 or v.ndim != 4:
        raise ArgumentError(f"{who}: q, k [B, T, H, K] and v [B, T, HV, V] must be 4-D, got q "
                         f"{tuple(q.shape)}, v {tuple(v.shape)}")
    B, T, H, K = q.shape
    return B, T, H, K, v.shape[2], v.shape[3]


def _one_token(T, who):
    # FlashInfer asserts T == 1 on these entries; its multi-token path is another entry.
    if T != 1:
        raise ArgumentError(
            f"{who}: takes one token per sequence (q [B, 1, H, K]), got T = {T}; several "
            f"tokens per sequence go through {_WHO_MTP} or {_WHO_PRETRANSPOSE}")


def _scale_value(scale, K, who):
    if scale is None:
        return K**-0.5
    if float(scale) == 0.0:
        raise NotImplementedError(f"{who}: scale=0 is not supported by gdnkit (a zero scale "
                                  f"means K**-0.5 there)")
    return float(scale)


def _output_shape(output, shape, who):
    if output is not None and tuple(output.shape) != shape:
        raise ArgumentError(f"{who}: expected output shape [{', '.join(map(str, shape))}], got "
                         f"{tuple(output.shape)}")


def _slot_indices(idx, B, name, who):
    if idx.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"{who}: {name} must be int32 or int64, got {idx.dtype}")
    if tuple(idx.shape) != (B,):
        raise ArgumentError(f"{who}: expected {name} shape [{B}], got {tuple(idx.shape)}")
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
    scale = _scale_value(scale, K, who)
    _output_shape(output, (B, 1, HV, V), who)
    A_log, a, b, dt_bias = raw_gate_inputs(A_log, a.reshape(B, HV), b.reshape(B, HV), dt_bias,
                                           softplus_beta, softplus_threshold, who)
    if write is not None and write.dtype != read.dtype:
        write = write.to(read.dtype)
    pool, write_back = _packed_slots(state)
    o = _ops.decode_kw(
        q=_inner_contiguous(q), k=_inner_contiguous(k), v=_inner_contiguous(v), a=a, b=b,
        A_log=A_log, dt_bias=dt_bias, state=pool, state_indices=read, state_out_indices=write,
        layout=layout, gate=_ops.RAW, l2norm=_ops.RSQRT if use_qk_l2norm else _ops.NO_NORM,
        scale=scale, out_dtype=q.dtype if output is None else output.dtype)
    if write_back:
        state.copy_(pool)
    o = o.reshape(B, 1, HV, V)
    if output is None:
        return o
    output.copy_(o)
    return output


# ---- several tokens per sequence ----------------------------------------------------------

def _intermediate_blocks(buffer, B, T, HV, V, K, dtype, who):
    """The buffer as [blocks, HV, V, K], block n * T + t holding row n's state after token
    t: FlashInfer's kernels address the buffer that way whatever its step count."""
    if buffer.ndim != 5 or buffer.shape[0] < B or buffer.shape[1] < T or \
            tuple(buffer.shape[2:]) != (HV, V, K):
        raise ArgumentError(f"{who}: expected intermediate_states_buffer shape [>= {B}, >= {T}, "
                         f"{HV}, {V}, {K}] ([B, T, HV, V, K]), got {tuple(buffer.shape)}")
    if buffer.dtype != dtype:
        raise ArgumentError(f"{who}: intermediate_states_buffer must be in the state's dtype "
                         f"{dtype}, got {buffer.dtype}")
    if not buffer.is_contiguous():
        # A copy would take the writes the caller expects to find in the buffer.
        raise ArgumentError(f"{who}: intermediate_states_buffer must be contiguous, got stride "
                         f"{buffer.stride()}")
    return buffer.view(-1, HV, V, K)


def _tokens(who, *, q, k, v, a, b, A_log, dt_bias, pool, read, write, buffer, ssm, update,
            scale, use_qk_l2norm, output):
    """T tokens per row over the V-major pool [pool_size, HV, V, K] in one gdnkit call (see
    the module docstring); read None: row n on slot n. Returns the output [B, T, HV, V]."""
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    scale = _scale_value(scale, K, who)
    _output_shape(output, (B, T, HV, V), who)
    for name, x in (("a", a), ("b", b)):
        if tuple(x.shape) != (B, T, HV):
            raise ArgumentError(f"{who}: expected {name} shape [{B}, {T}, {HV}], got "
                             f"{tuple(x.shape)}")
    intermediate = None
    if buffer is not None:
        # FlashInfer's block n * T + t of the flat buffer is gdnkit's [n, t] of a (B, T) view
        blocks = _intermediate_blocks(buffer, B, T, HV, V, K, pool.dtype, who)
        intermediate = blocks[:B * T].view(B, T, HV, V, K)
    A_log, a, b, dt_bias = raw_gate_inputs(A_log, a, b, dt_bias, 1.0, 20.0, who)
    out_dtype = q.dtype if output is None else output.dtype
    if B == 0:
        return torch.empty((B, T, HV, V), dtype=out_dtype, device=q.device) if output is None \
            else output
    # the library reads every index array of a call in one dtype: read's
    if write is not None and read is not None and write.dtype != read.dtype:
        write = write.to(read.dtype)
    if ssm is not None:  # the per-token slots, and the final state to `write` when given
        ssm = ssm.to(device=read.device, dtype=read.dtype).contiguous()
    state, write_back = _packed_slots(pool)
    o = _ops.decode_kw(
        q=_inner_contiguous(q), k=_inner_contiguous(k), v=_inner_contiguous(v), a=a, b=b,
        A_log=A_log, dt_bias=dt_bias, state=state, state_indices=read, state_out_indices=write,
        token_state_indices=ssm, intermediate_states=intermediate, update_state=update,
        num_tokens=T, layout=_ops.VK, gate=_ops.RAW,
        l2norm=_ops.RSQRT if use_qk_l2norm else _ops.NO_NORM, scale=scale, out_dtype=out_dtype)
    if write_back and update:
        pool.copy_(state)
    if output is None:
        return o
    output.copy_(o)
    return output


# ---- the entries ----------------------------------------------------------------------------

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
    """FlashInfer's V-major decode: state [B, HV, V, K], or the pool initial_state
    [pool_size, HV, V, K] with initial_state_indices (and optionally
    output_state_indices). T > 1 tokens per sequence run the multi-token path (with
    intermediate_states_buffer and disable_state_update). Returns (output [B, T, HV, V],
    the state tensor updated in place: initial_state with a pool, else state)."""
    who = _WHO_PRETRANSPOSE
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    if (intermediate_states_buffer is not None or disable_state_update) and T == 1:
        raise ArgumentError(f"{who}: intermediate_states_buffer and disable_state_update are "
                         f"supported only by BF16 pretranspose decode with T > 1")
    use_pool = initial_state is not None
    if use_pool != (initial_state_indices is not None):
        raise ArgumentError(f"{who}: initial_state and initial_state_indices must be provided "
                         f"together")
    if output_state_indices is not None and not use_pool:
        raise ArgumentError(f"{who}: output_state_indices can only be used with initial_state "
                         f"(pool mode)")
    if use_pool:
        pool_size = initial_state.shape[0]
        if tuple(initial_state.shape) != (pool_size, HV, V, K):
            raise ArgumentError(f"{who}: expected initial_state shape [pool_size={pool_size}, "
                             f"HV={HV}, V={V}, K={K}], got {tuple(initial_state.shape)}")
        if initial_state.stride(-1) != 1:
            raise ArgumentError(f"{who}: initial_state must be K-contiguous (stride[-1] == 1), "
                             f"got stride={initial_state.stride()}")
        target = initial_state
        read = _slot_indices(initial_state_indices, B, "initial_state_indices", who)
        write = (None if output_state_indices is None else
                 _slot_indices(output_state_indices, B, "output_state_indices", who))
    else:
        if state is None:
            raise ArgumentError(f"{who}: either state or initial_state must be provided")
        if tuple(state.shape) != (B, HV, V, K):
            raise ArgumentError(f"{who}: expected state shape [B={B}, HV={HV}, V={V}, K={K}], "
                             f"got {tuple(state.shape)}")
        target, read, write = state, None, None
    if T > 1:  # read None: the per-batch state is a pool of B slots, row n on slot n
        o = _tokens(who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, pool=target,
                    read=read, write=write, buffer=intermediate_states_buffer, ssm=None,
                    update=not disable_state_update, scale=scale,
                    use_qk_l2norm=use_qk_l2norm, output=output)
        return o, target
    o = _step(who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=target,
              layout=_ops.VK, read=read, write=write, scale=scale,
              use_qk_l2norm=use_qk_l2norm, output=output)
    return o, target


def gated_delta_rule_mtp(
    q,
    k,
    v,
    initial_state,
    initial_state_indices,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    intermediate_states_buffer=None,
    ssm_state_indices=None,
    disable_state_update=None,
    use_qk_l2norm=True,
    output_state_indices=None,
):
    """FlashInfer's multi-token (MTP) decode over the V-major pool initial_state
    [pool_size, HV, V, K]: q, k [B, T, H, K], v [B, T, HV, V], a, b [B, T, HV]. Token t
    of a row runs on the state token t - 1 left; the states go where the module
    docstring says. Returns (output [B, T, HV, V], initial_state)."""
    who = _WHO_MTP
    if disable_state_update is None:
        warnings.warn(f"{who}: disable_state_update=None means True (FlashInfer's current "
                      f"default, which FlashInfer says will become False); pass True or "
                      f"False explicitly", FutureWarning, stacklevel=2)
        disable_state_update = True
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    if initial_state is None or initial_state_indices is None:
        raise ArgumentError(f"{who}: initial_state and initial_state_indices are required")
    pool_size = initial_state.shape[0]
    if tuple(initial_state.shape) != (pool_size, HV, V, K):
        raise ArgumentError(f"{who}: expected initial_state shape [pool_size={pool_size}, "
                         f"HV={HV}, V={V}, K={K}], got {tuple(initial_state.shape)}")
    read = _slot_indices(initial_state_indices, B, "initial_state_indices", who)
    write = (None if output_state_indices is None else
             _slot_indices(output_state_indices, B, "output_state_indices", who))
    if ssm_state_indices is not None:
        if intermediate_states_buffer is not None:
            raise ArgumentError(f"{who}: ssm_state_indices and intermediate_states_buffer are "
                             f"mutually exclusive")
        if disable_state_update:
            raise ArgumentError(f"{who}: ssm_state_indices requires state writes; "
                             f"disable_state_update must be False")
        if T < 2:
            raise ArgumentError(f"{who}: ssm_state_indices requires T >= 2 (got T={T})")
        if tuple(ssm_state_indices.shape) != (B, T):
            raise ArgumentError(f"{who}: ssm_state_indices must have shape [B={B}, T={T}], got "
                             f"{tuple(ssm_state_indices.shape)}")
        if ssm_state_indices.dtype != torch.int32:  # as FlashInfer asserts
            raise ArgumentError(f"{who}: ssm_state_indices must be int32, got "
                             f"{ssm_state_indices.dtype}")
        if ssm_state_indices.device != q.device:
            raise ArgumentError(f"{who}: ssm_state_indices device {ssm_state_indices.device} != "
                             f"q device {q.device}")
    o = _tokens(who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, pool=initial_state,
                read=read, write=write, buffer=intermediate_states_buffer,
                ssm=ssm_state_indices, update=not disable_state_update, scale=scale,
                use_qk_l2norm=use_qk_l2norm, output=output)
    return o, initial_state


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
    """FlashInfer's K-major decode, T = 1: state [B, HV, K, V], updated in place.
    Returns (output [B, 1, HV, V], state)."""
    who = _WHO_DECODE
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    _one_token(T, who)
    if state is None or tuple(state.shape) != (B, HV, K, V):
        got = None if state is None else tuple(state.shape)
        raise ArgumentError(f"{who}: expected state shape [B={B}, HV={HV}, K={K}, V={V}], got {got}")
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
            raise ArgumentError(f"{who}: {name} is required")
    B, T, H, K, HV, V = _shape_bthd(q, v, who)
    _one_token(T, who)
    pool_size = initial_state_source.shape[0]
    if tuple(initial_state_source.shape) != (pool_size, HV, V, K):
        raise ArgumentError(f"{who}: expected initial_state_source shape [pool_size={pool_size}, "
                         f"HV={HV}, V={V}, K={K}], got {tuple(initial_state_source.shape)}")
    if initial_state_indices is None:
        if output_state_indices is not None:
            raise ArgumentError(f"{who}: output_state_indices needs initial_state_indices")
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
    "ArgumentError",
    "gated_delta_rule_decode_pretranspose",
    "gated_delta_rule_mtp",
    "gated_delta_rule_decode",
    "gated_delta_rule",
    "gated_delta_rule_bf16state_cooprow",
]
