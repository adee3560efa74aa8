"""Drop-ins for vLLM's GatedDeltaNet decode kernels (Qwen3-Next / Qwen3.5).

vLLM (vllm/model_executor/layers/fla/ops/):

    from vllm.model_executor.layers.fla.ops import fused_sigmoid_gating_delta_rule_update
    o, state = fused_sigmoid_gating_delta_rule_update(A_log=..., a=a, b=b, dt_bias=..., q=q, k=k, v=v,
        initial_state=ssm_state, inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=True)

here:

    from gdnkit.torch.vllm import fused_sigmoid_gating_delta_rule_update
    # and vLLM's flavour of FLA's kernel (precomputed g and beta):
    from gdnkit.torch.vllm import fused_recurrent_gated_delta_rule

Same arguments and results, for one token per sequence (decode): q, k [B, T, H, K] and
v [B, T, HV, V] with B*T = N sequences ([N, 1, ...]; with cu_seqlens [0, 1, ..., N]
[1, N, ...] or [N, 1, ...]); a, b (or g, beta) [N, HV]; the state pool [slots, HV, V, K] (gdnkit's
"vk" layout, vLLM's current one; pass state_layout="kv" for releases whose pool is
[slots, HV, K, V]); ssm_state_indices [N] (or [N, T_max]) with -1 for padding rows
(null_block_id=0 for releases that mark padding with slot 0); returns
(o [B, T, HV, V] in q's dtype, final_state). fused_sigmoid_gating: g = -exp(A_log) *
softplus_beta(a + dt_bias), beta = sigmoid(b); l2norm x * rsqrt(sum x^2 + 1e-6) when
use_qk_l2norm_in_kernel.

Several tokens per sequence (speculative decoding): ssm_state_indices [N, T] gives every
token a slot. With cu_seqlens (q [1, total, H, K], rows of 0 to T tokens) or dense
q [N, T, H, K], sequence n starts from slot ssm_state_indices[n, num_accepted_tokens[n] - 1]
(column 0 without num_accepted_tokens), its tokens run in order, and token t's state goes
to slot ssm_state_indices[n, t] (inplace_final_state=True). It runs as one gdnkit step per
token position with the slots doing the routing, so the result is bitwise that of T
one-token calls and nothing synchronizes with the device; it reads and writes the state
once per token (the fused multi-token kernel, which reads it once, is not in gdnkit yet).

Differences: padding rows get a zero output row (vLLM leaves them unwritten); a sequence
whose first slot is padding has every token's output zero; without ssm_state_indices
row n uses slot n. Not supported (NotImplementedError): several tokens per sequence
without 2-D ssm_state_indices or with inplace_final_state=False, is_kda=True,
per-channel beta, retrieve_parent_token (EAGLE trees), softplus thresholds below 15.
With one token per sequence (1-D ssm_state_indices) cu_seqlens must be [0, 1, ..., N]:
anything else fails torch's asynchronous assert (at once on the CPU, at the stream's
next synchronization on a GPU, before the step writes anything), so the call never
synchronizes with the device and never returns a silently wrong result.
"""
import torch

from . import _ops
from ._gates import check_unit_cu_seqlens, flat_indices, raw_gate_inputs

_WHO = "fused_sigmoid_gating_delta_rule_update"
_WHO_RECURRENT = "fused_recurrent_gated_delta_rule (vLLM)"


def _one_token_per_sequence(q, k, cu_seqlens, who):
    """N, the number of sequences. Without cu_seqlens [N, 1, ...]; with it [1, N, ...] or
    [N, 1, ...] (SGLang's decode) and cu_seqlens = [0, 1, ..., N], checked without a host sync."""
    B, T = k.shape[0], k.shape[1]
    if cu_seqlens is None:
        N = B
    else:
        N = cu_seqlens.shape[0] - 1
        if B != 1 and T != 1:
            raise ValueError(
                f"{who}: with cu_seqlens, q/k/v must be [1, N, H, K] or [N, 1, H, K]; got "
                f"{tuple(k.shape)}")
    if B * T != N:
        raise NotImplementedError(
            f"{who}: gdnkit runs one token per sequence (decode); got {B * T} tokens for "
            f"{N} sequences"
        )
    if cu_seqlens is not None:
        check_unit_cu_seqlens(cu_seqlens, N, who)
    return N


def _layout_id(state_layout):
    if isinstance(state_layout, str):
        return _ops.LAYOUTS[state_layout.lower()]
    return int(state_layout)


def _slots(ssm_state_indices, num_accepted_tokens, null_block_id, who):
    """(read, write) slot vectors. vLLM reads ssm_state_indices[n, num_accepted_tokens[n] - 1]
    and, with T = 1, writes ssm_state_indices[n, 0]. None = row n uses slot n."""
    if ssm_state_indices is None:
        return None, None
    if ssm_state_indices.ndim == 1:
        if num_accepted_tokens is not None:
            raise NotImplementedError(f"{who}: num_accepted_tokens needs 2-D ssm_state_indices")
        read, write = flat_indices(ssm_state_indices), None
    else:
        write = flat_indices(ssm_state_indices[:, 0])
        if num_accepted_tokens is None:
            read, write = write, None
        else:
            col = (num_accepted_tokens.to(torch.int64) - 1).reshape(-1, 1)
            read = flat_indices(torch.gather(ssm_state_indices, 1, col))
    if null_block_id is not None:  # releases that mark padding with a null slot (<= id)
        read = torch.where(read <= null_block_id, -1, read)
        if write is not None:
            write = torch.where(write <= null_block_id, -1, write)
    if write is not None and write.dtype != read.dtype:
        write = write.to(read.dtype)
    return read, write


def _several_tokens(k, cu_seqlens, ssm_state_indices):
    """Whether the call verifies several tokens per sequence (speculative decoding)."""
    if cu_seqlens is None:
        return k.shape[1] > 1
    return ssm_state_indices is not None and ssm_state_indices.ndim == 2 and ssm_state_indices.shape[1] > 1


def _decode_tokens(who, *, q, k, v, a, b, A_log, dt_bias, gate, scale, initial_state,
                   inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                   l2norm, layout, null_block_id):
    """Several tokens per sequence, as vLLM's spec decode: token t of sequence n runs on the
    state token t - 1 left, reading slot ssm_state_indices[n, num_accepted_tokens[n] - 1]
    first (column 0 without num_accepted_tokens) and writing token t's state to
    ssm_state_indices[n, t]. Run as one gdnkit step per token position, the slots doing the
    routing: bitwise the result of T one-token calls, with no host synchronization (a token
    a sequence does not have becomes a padding row of that step). Costs a state read and
    write per token, where a fused multi-token kernel would read the state once."""
    if not inplace_final_state:
        raise NotImplementedError(f"{who}: several tokens per sequence need inplace_final_state=True")
    if initial_state is None:
        raise ValueError(f"{who}: several tokens per sequence need initial_state (the state pool)")
    if ssm_state_indices is None or ssm_state_indices.ndim != 2:
        raise NotImplementedError(
            f"{who}: several tokens per sequence need ssm_state_indices [N, T] (one slot per token)")
    N, T = ssm_state_indices.shape
    H, K = k.shape[-2:]
    HV, V = v.shape[-2:]
    dev = q.device
    if cu_seqlens is None:
        B, Tq = k.shape[0], k.shape[1]
        if B != N or Tq > T:
            raise ValueError(f"{who}: q [B, T] = [{B}, {Tq}] does not fit ssm_state_indices "
                             f"{tuple(ssm_state_indices.shape)}")
        total = B * Tq
        starts = torch.arange(N, device=dev) * Tq
        lengths = torch.full((N,), Tq, device=dev)
    else:
        if k.shape[0] != 1:
            raise ValueError(
                f"The batch size is expected to be 1 rather than {k.shape[0]} when using "
                f"`cu_seqlens`. Please flatten variable-length inputs before processing.")
        if cu_seqlens.shape[0] - 1 != N:
            raise ValueError(f"{who}: cu_seqlens has {cu_seqlens.shape[0] - 1} sequences, "
                             f"ssm_state_indices {N}")
        total = k.shape[1]
        starts = cu_seqlens[:-1].to(torch.int64)
        lengths = cu_seqlens[1:].to(torch.int64) - starts
        # a token past a row's T slots, or outside q, would be dropped: refused (no host sync)
        torch._assert_async(((lengths >= 0) & (lengths <= T)).all() & (cu_seqlens[0] == 0)
                            & (cu_seqlens[-1] == total),
                            f"{who}: cu_seqlens must rise from 0 to {total} by at most {T} "
                            f"tokens a sequence (the columns of ssm_state_indices)")
    if scale is None:
        scale = K**-0.5
    idx = ssm_state_indices if ssm_state_indices.dtype in (torch.int32, torch.int64) \
        else ssm_state_indices.to(torch.int32)
    if null_block_id is not None:
        idx = torch.where(idx <= null_block_id, -1, idx)
    if num_accepted_tokens is None:
        first = idx[:, 0]
    else:
        first = torch.gather(idx, 1, (num_accepted_tokens.to(torch.int64) - 1).reshape(-1, 1))[:, 0]
    live = first >= 0  # a sequence whose first slot is padding is skipped whole
    qf, kf = q.reshape(total, H, K), k.reshape(total, H, K)
    vf = v.reshape(total, HV, V)
    af, bf = a.reshape(total, -1), b.reshape(total, -1)
    out = torch.zeros(total + 1, HV, V, dtype=q.dtype, device=dev)  # row `total`: absent tokens
    sink = torch.full_like(starts, total)
    none = torch.full_like(first, -1)
    for t in range(T):
        present = (lengths > t) & live
        src = torch.clamp(starts + t, max=max(total - 1, 0))
        read = torch.where(present, first if t == 0 else idx[:, t - 1], none)
        write = idx[:, t].contiguous()
        o_t = _ops.decode_kw(
            q=qf.index_select(0, src), k=kf.index_select(0, src), v=vf.index_select(0, src),
            a=af.index_select(0, src), b=bf.index_select(0, src), A_log=A_log, dt_bias=dt_bias,
            state=initial_state, state_indices=read.contiguous(), state_out_indices=write,
            layout=layout, gate=gate, l2norm=l2norm, scale=float(scale), out_dtype=q.dtype)
        out.index_copy_(0, torch.where(present, starts + t, sink), o_t.reshape(N, HV, V))
    return out[:total].reshape(v.shape), initial_state


def _decode(who, *, q, k, v, a, b, A_log, dt_bias, gate, scale, initial_state,
            inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
            use_qk_l2norm_in_kernel, state_layout, null_block_id):
    if _several_tokens(k, cu_seqlens, ssm_state_indices):
        return _decode_tokens(
            who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, gate=gate, scale=scale,
            initial_state=initial_state, inplace_final_state=inplace_final_state,
            cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
            num_accepted_tokens=num_accepted_tokens,
            l2norm=_ops.RSQRT if use_qk_l2norm_in_kernel else _ops.NO_NORM,
            layout=_layout_id(state_layout), null_block_id=null_block_id)
    N = _one_token_per_sequence(q, k, cu_seqlens, who)
    K = k.shape[-1]
    HV, V = v.shape[-2], v.shape[-1]
    if scale is None:
        scale = K**-0.5
    else:
        assert scale > 0, "scale must be positive"
    layout = _layout_id(state_layout)
    l2norm = _ops.RSQRT if use_qk_l2norm_in_kernel else _ops.NO_NORM
    read_idx, write_idx = _slots(ssm_state_indices, num_accepted_tokens, null_block_id, who)

    def step(state, idx, out_idx):
        o = _ops.decode_kw(
            q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state,
            state_indices=idx, state_out_indices=out_idx, layout=layout, gate=gate,
            l2norm=l2norm, scale=float(scale), out_dtype=q.dtype)
        return o.reshape(v.shape)

    if inplace_final_state:
        if initial_state is None:
            raise ValueError(f"{who}: inplace_final_state=True needs initial_state (the state pool)")
        return step(initial_state, read_idx, write_idx), initial_state

    # Out of place: one new state per sequence, [N, HV, ...] in the pool's layout.
    if initial_state is None:
        shape = (N, HV, V, K) if layout == _ops.VK else (N, HV, K, V)
        final_state = torch.zeros(shape, dtype=torch.float32, device=q.device)
        return step(final_state, None, None), final_state
    if read_idx is None:
        final_state = initial_state[:N].clone(memory_format=torch.contiguous_format)
        return step(final_state, None, None), final_state
    slots = initial_state.shape[0]
    valid = (read_idx >= 0) & (read_idx < slots)
    final_state = initial_state.index_select(0, torch.where(valid, read_idx, 0).to(torch.int64))
    local = torch.where(valid, torch.arange(N, device=read_idx.device, dtype=read_idx.dtype), -1)
    return step(final_state, local, None), final_state


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    b,
    dt_bias,
    q,
    k,
    v,
    beta=1.0,
    threshold=20.0,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_kda=False,
    *,
    state_layout="vk",
    null_block_id=None,
):
    """vLLM's signature and semantics for T = 1 per sequence; returns (o, final_state)."""
    if is_kda:
        raise NotImplementedError(f"{_WHO}: is_kda=True (per-channel KDA gates) is not supported by gdnkit")
    A_log, a, b, dt_bias = raw_gate_inputs(A_log, a, b, dt_bias, beta, threshold, _WHO)
    return _decode(_WHO, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, gate=_ops.RAW,
                   scale=scale, initial_state=initial_state,
                   inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
                   ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                   null_block_id=null_block_id)


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta=None,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    retrieve_parent_token=None,
    use_qk_l2norm_in_kernel=False,
    *,
    state_layout="vk",
    null_block_id=None,
):
    """vLLM's fused_recurrent_gated_delta_rule (g in log space and beta precomputed, continuous
    batching over a state pool) for T = 1 per sequence; returns (o, final_state)."""
    if retrieve_parent_token is not None:
        raise NotImplementedError(f"{_WHO_RECURRENT}: retrieve_parent_token (EAGLE trees) is not supported by gdnkit")
    if beta is None:
        beta = torch.ones(v.shape[:-1], dtype=g.dtype, device=v.device)
    elif beta.ndim == v.ndim:
        raise NotImplementedError(f"{_WHO_RECURRENT}: per-channel beta [B, T, HV, V] is not supported by gdnkit")
    if g.dtype != beta.dtype:
        g, beta = g.float(), beta.float()
    if g.stride(-1) != 1:
        g = g.contiguous()
    if beta.stride(-1) != 1:
        beta = beta.contiguous()
    return _decode(_WHO_RECURRENT, q=q, k=k, v=v, a=g, b=beta, A_log=None, dt_bias=None,
                   gate=_ops.PRECOMPUTED, scale=scale, initial_state=initial_state,
                   inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
                   ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                   null_block_id=null_block_id)


__all__ = ["fused_sigmoid_gating_delta_rule_update", "fused_recurrent_gated_delta_rule"]
