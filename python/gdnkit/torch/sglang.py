"""Drop-in for SGLang's fused_sigmoid_gating_delta_rule_update (decode path).

SGLang (python/sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py):

    o = fused_sigmoid_gating_delta_rule_update(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
        initial_state_source=ssm_states, initial_state_indices=cache_indices, cu_seqlens=query_start_loc,
        use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)

here:

    from gdnkit.torch.sglang import fused_sigmoid_gating_delta_rule_update

Same arguments and result (the output o, shaped like v, in q's dtype; the pool is
updated in place) for one token per sequence: q, k [1, N, H, K] or [N, 1, H, K] (with or without cu_seqlens,
which must then be [0, 1, ..., N]: anything else fails torch's asynchronous assert, with no
host sync and before anything is written),
v [.., HV, V], a, b [N, HV], the pool initial_state_source [slots, HV, V, K] (gdnkit's
"vk" layout, as SGLang's kernels since they switched to V-major pools; pass
state_layout="kv" for [slots, HV, K, V] pools), initial_state_indices [N] with
negative entries for padding rows; disable_state_update=True computes o without
writing the pool.

Differences: a padding row's output is zero (SGLang computes it from a zero state;
engines discard it). Not supported (NotImplementedError): several tokens per
sequence (target verify), is_kda, lower_bound, intermediate state caching,
retrieve_parent_token, cache_ring, softplus thresholds below 15.
"""
import torch

from . import _ops
from ._gates import flat_indices, raw_gate_inputs
from .vllm import _one_token_per_sequence

_WHO = "fused_sigmoid_gating_delta_rule_update (SGLang)"


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
    """SGLang's signature for T = 1 per sequence; returns o and updates the pool in place."""
    unsupported = {
        "is_kda": is_kda,
        "lower_bound": lower_bound is not None,
        "intermediate_states_buffer": intermediate_states_buffer is not None,
        "intermediate_state_indices": intermediate_state_indices is not None,
        "retrieve_parent_token": retrieve_parent_token is not None,
        "cache_ring": cache_ring,
    }
    for name, used in unsupported.items():
        if used:
            raise NotImplementedError(f"{_WHO}: {name} is not supported by gdnkit")
    del cache_steps, replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta, num_warps
    N = _one_token_per_sequence(q, k, cu_seqlens, _WHO)
    K = k.shape[-1]
    if scale is None:
        scale = K**-0.5
    else:
        assert scale > 0, "scale must be positive"
    layout = _ops.LAYOUTS[state_layout] if isinstance(state_layout, str) else int(state_layout)
    A_log, a, b, dt_bias = raw_gate_inputs(A_log, a, b, dt_bias, softplus_beta, softplus_threshold, _WHO)
    l2norm = _ops.RSQRT if use_qk_l2norm_in_kernel else _ops.NO_NORM

    state = initial_state_source
    if state is None:  # SGLang then runs from a zero state and keeps nothing
        hv, v_dim = v.shape[-2], v.shape[-1]
        shape = (N, hv, v_dim, K) if layout == _ops.VK else (N, hv, K, v_dim)
        state = torch.zeros(shape, dtype=torch.float32, device=q.device)
        idx, out_idx = None, None
    else:
        idx = flat_indices(initial_state_indices) if initial_state_indices is not None else None
        out_idx = None
        if disable_state_update:
            if idx is None:
                idx = torch.arange(N, dtype=torch.int32, device=q.device)
            out_idx = torch.full_like(idx, -1)
    o = _ops.decode_kw(
        q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, state_indices=idx,
        state_out_indices=out_idx, layout=layout, gate=_ops.RAW, l2norm=l2norm,
        scale=float(scale), out_dtype=q.dtype)
    return o.reshape(v.shape)


__all__ = ["fused_sigmoid_gating_delta_rule_update"]
