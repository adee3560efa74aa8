"""Drop-in for SGLang's fused_sigmoid_gating_delta_rule_update (decode and target verify).

SGLang (python/sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py):

    o = fused_sigmoid_gating_delta_rule_update(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
        initial_state_source=ssm_states, initial_state_indices=cache_indices, cu_seqlens=query_start_loc,
        use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)

here:

    from gdnkit.torch.sglang import fused_sigmoid_gating_delta_rule_update

Same arguments and result (the output o, shaped like v, in q's dtype; the pool is
updated in place unless disable_state_update=True). The pool initial_state_source is
[slots, HV, V, K] (gdnkit's "vk" layout, as SGLang's kernels since they switched to
V-major pools; pass state_layout="kv" for [slots, HV, K, V] pools), read and written at
initial_state_indices [N] (negative entries: padding rows); a, b [tokens, HV].

Decode, one token a sequence: q, k [1, N, H, K] or [N, 1, H, K] (with or without
cu_seqlens, which must then be [0, 1, ..., N]: anything else fails torch's asynchronous
assert, with no host sync and before anything is written).

Target verify, several tokens a sequence (as many tokens as sequences is decode): q, k
[1, total_tokens, H, K] with cu_seqlens (rows of at most 16 tokens, at most cache_steps
with intermediate_states_buffer; checked by the same asynchronous assert), or dense
[N, T, H, K]; sequence n's tokens run in order on its state, in one gdnkit call. The
state is rounded to its dtype after every token (a store and a reload), each token's
output computed from the unrounded state, so the result is bitwise that of T one-token
calls chained through the pool on the same backend. disable_state_update=True keeps the pool unchanged;
otherwise the state after the last token is written back to its slot. With
intermediate_states_buffer (SGLang's intermediate_ssm, contiguous, addressed as
[blocks, HV, V, K] from its start) the state after token t of sequence n also goes to
block intermediate_state_indices[n] * cache_steps + t. gdnkit writes a (N, cache_steps)
view of the buffer directly when row n's blocks start at n * cache_steps and the buffer
has the pool's dtype; with intermediate_state_indices given (SGLang passes them) the
states go to a scratch buffer and are scattered to their blocks by torch index ops (one
more pass over them), since gdnkit's buffer is addressed by row. On a GPU, a call whose
tokens do not fit one block's shared memory is refused (ValueError, nothing written;
docs/operation.md, "Multi-token decode").

Differences: a padding row's output is zero (SGLang computes it from a zero state;
engines discard it), and with several tokens its cache blocks are left as they were
(SGLang fills them from that zero state). intermediate_state_indices=None (SGLang's
kernel needs them) means row n caches into blocks n * cache_steps + t, and
cache_steps=None means the buffer's second dimension ([slots, steps, HV, V, K]), or the
tokens a sequence carries for a buffer of another rank. A negative
intermediate_state_indices entry, or one whose blocks lie past the buffer, caches
nothing. intermediate_states_buffer in another dtype than the pool takes the states cast
to its dtype from the pool's (SGLang casts from float32). Not supported
(NotImplementedError): is_kda, lower_bound, retrieve_parent_token (EAGLE trees),
cache_ring, softplus thresholds below 15; the replayssm_* arguments and num_warps are
ignored.
"""
import torch

from . import _ops
from ._gates import check_packed_rows, flat_indices, raw_gate_inputs, store_rows
from .vllm import _one_token_per_sequence

_WHO = "fused_sigmoid_gating_delta_rule_update (SGLang)"


def _several_tokens(k, cu_seqlens, intermediate_states_buffer):
    """Target verify: several tokens a sequence, or the intermediate state cache."""
    if intermediate_states_buffer is not None:
        return True
    if cu_seqlens is None:
        return k.shape[1] > 1
    return k.shape[0] * k.shape[1] != cu_seqlens.shape[0] - 1


def _cache_blocks(buffer, slot_shape, who):
    """SGLang's intermediate_states_buffer as [blocks, <slot>]: its kernel addresses block
    intermediate_state_indices[n] * cache_steps + step of the flat buffer."""
    if not buffer.is_contiguous():
        # a copy would take the writes the caller expects to find in the buffer
        raise ValueError(f"{who}: intermediate_states_buffer must be contiguous, got stride "
                         f"{buffer.stride()}")
    return buffer.view(-1, *slot_shape)


def _target_verify(*, q, k, v, a, b, A_log, dt_bias, scale, l2norm, layout, pool, idx,
                   update, cu_seqlens, buffer, cache_indices, cache_steps):
    """Several tokens a sequence (and/or the intermediate state cache) in one gdnkit call;
    returns o shaped like v."""
    who = _WHO
    dev = q.device
    if buffer is not None and not cache_steps and buffer.ndim == 5:
        cache_steps = buffer.shape[1]  # SGLang's [slots, draft tokens, HV, V, K]
    if cu_seqlens is None:
        N, T = k.shape[0], k.shape[1]
        total = N * T
    else:
        if k.shape[0] != 1:
            raise ValueError(f"{who}: with cu_seqlens and several tokens a sequence, q, k, v "
                             f"must be [1, total_tokens, H, D], got {tuple(k.shape)}")
        N, total = cu_seqlens.shape[0] - 1, k.shape[1]
        bound = total if buffer is None or not cache_steps else int(cache_steps)
        T = max(1, min(bound, _ops.MAX_TOKENS))
        check_packed_rows(cu_seqlens, total, T, who)
    slot_shape = tuple(pool.shape[1:])
    step = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=pool,
                state_indices=idx, layout=layout, gate=_ops.RAW, l2norm=l2norm,
                scale=float(scale), out_dtype=q.dtype, num_tokens=T, update_state=update)
    if cu_seqlens is not None:
        ref = idx if idx is not None else cu_seqlens
        if ref.dtype not in (torch.int32, torch.int64):
            ref = ref.to(torch.int32)
        step["cu_seqlens"] = cu_seqlens.to(ref.dtype).contiguous()
    if buffer is None:
        return _ops.decode_kw(**step).reshape(v.shape)

    steps = int(cache_steps) if cache_steps else T
    if steps < T:
        raise ValueError(f"{who}: cache_steps={steps} is smaller than the {T} tokens a "
                         f"sequence carries (its blocks would run into the next sequence's)")
    blocks = _cache_blocks(buffer, slot_shape, who)
    if cache_indices is None and buffer.dtype == pool.dtype and blocks.shape[0] >= N * steps:
        # Row n caches into blocks n * steps + t: a (N, steps) view gdnkit writes directly.
        step["intermediate_states"] = blocks[:N * steps].view(N, steps, *slot_shape)
        return _ops.decode_kw(**step).reshape(v.shape)
    # Any cache slot per row: every token's state into a scratch buffer, then scattered to
    # block intermediate_state_indices[n] * steps + t (one more pass over those states).
    scratch = torch.empty((N, T, *slot_shape), dtype=pool.dtype, device=dev)
    o = _ops.decode_kw(**step, intermediate_states=scratch)
    rows = torch.arange(N, device=dev)
    cache = rows if cache_indices is None else cache_indices.to(dev, torch.int64).reshape(-1)
    if idx is None:
        live = torch.ones(N, dtype=torch.bool, device=dev)
    else:
        read = idx.to(torch.int64)
        live = (read >= 0) & (read < pool.shape[0])  # padding rows store nothing
    if cu_seqlens is None:
        lengths = torch.full((N,), T, device=dev)
    else:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    t = torch.arange(T, device=dev)
    dst = cache[:, None] * steps + t[None, :]
    ok = live[:, None] & (cache[:, None] >= 0) & (t[None, :] < lengths[:, None]) \
        & (dst < blocks.shape[0])
    store_rows(blocks, dst.reshape(-1), ok.reshape(-1), scratch.view(N * T, *slot_shape),
               (rows[:, None] * T + t[None, :]).reshape(-1))
    return o.reshape(v.shape)


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    dt_bias,
    softplus_beta,
    softplus_threshold,
    q,
    k,
    v,
    b,
    initial_state_source,
    initial_state_indices,
    scale=None,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    is_kda=False,
    lower_bound=None,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    cache_steps=None,
    retrieve_parent_token=None,
    cache_ring=False,
    replayssm_rawv=None,
    replayssm_rawk=None,
    replayssm_g=None,
    replayssm_beta=None,
    num_warps=1,
    *,
    state_layout="vk",
):
    """SGLang's signature: decode (one token a sequence) and target verify (several, with
    the intermediate state cache); returns o and updates the pool in place unless
    disable_state_update."""
    unsupported = {
        "is_kda": is_kda,
        "lower_bound": lower_bound is not None,
        "retrieve_parent_token": retrieve_parent_token is not None,
        "cache_ring": cache_ring,
    }
    for name, used in unsupported.items():
        if used:
            raise NotImplementedError(f"{_WHO}: {name} is not supported by gdnkit")
    del replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta, num_warps
    K = k.shape[-1]
    if scale is None:
        scale = K**-0.5
    else:
        assert scale > 0, "scale must be positive"
    layout = _ops.LAYOUTS[state_layout] if isinstance(state_layout, str) else int(state_layout)
    several = _several_tokens(k, cu_seqlens, intermediate_states_buffer)
    N = (k.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1) if several \
        else _one_token_per_sequence(q, k, cu_seqlens, _WHO)
    A_log, a, b, dt_bias = raw_gate_inputs(A_log, a, b, dt_bias, softplus_beta,
                                           softplus_threshold, _WHO)
    l2norm = _ops.RSQRT if use_qk_l2norm_in_kernel else _ops.NO_NORM

    state = initial_state_source
    update = not disable_state_update
    if state is None:  # SGLang then runs from a zero state and keeps nothing
        hv, v_dim = v.shape[-2], v.shape[-1]
        shape = (hv, v_dim, K) if layout == _ops.VK else (hv, K, v_dim)
        idx, out_idx = None, None
        if several:  # every row reads the one zero slot; nothing is written there
            state = torch.zeros((1, *shape), dtype=torch.float32, device=q.device)
            idx = torch.zeros(N, dtype=torch.int32, device=q.device)
            update = False
        else:
            state = torch.zeros((N, *shape), dtype=torch.float32, device=q.device)
    else:
        idx = flat_indices(initial_state_indices) if initial_state_indices is not None else None
        out_idx = None
        if disable_state_update and not several:
            if idx is None:
                idx = torch.arange(N, dtype=torch.int32, device=q.device)
            out_idx = torch.full_like(idx, -1)
    if several:
        return _target_verify(
            q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale, l2norm=l2norm,
            layout=layout, pool=state, idx=idx, update=update, cu_seqlens=cu_seqlens,
            buffer=intermediate_states_buffer, cache_indices=intermediate_state_indices,
            cache_steps=cache_steps)
    o = _ops.decode_kw(
        q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, state_indices=idx,
        state_out_indices=out_idx, layout=layout, gate=_ops.RAW, l2norm=l2norm,
        scale=float(scale), out_dtype=q.dtype)
    return o.reshape(v.shape)


__all__ = ["fused_sigmoid_gating_delta_rule_update"]
