"""Drop-in for FLA's fused_recurrent_gated_delta_rule (flash-linear-attention), decode use.

FLA (fla/ops/gated_delta_rule/fused_recurrent.py), as Hugging Face's Qwen3-Next calls it:

    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    o, state = fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)

here:

    from gdnkit.torch.fla import fused_recurrent_gated_delta_rule

Same arguments and results: q, k [B, T, H, K], v [B, T, HV, V], g [B, T, HV] (log-space
decay, precomputed), beta [B, T, HV] or [B, T, HV, V] (after the sigmoid; None = 1), initial_state
[N, HV, K, V] (gdnkit's "kv" layout; not modified), returns (o like v, final_state
[N, HV, K, V] float32 or None). l2norm x / sqrt(sum x^2 + 1e-6) when
use_qk_l2norm_in_kernel; scale None = K**-0.5.

Several tokens a sequence run in one gdnkit call: dense q [B, T, ...] up to T = 16 (more
run in calls of 16 tokens chained through the state), or with cu_seqlens (B = 1) q
[1, total, ...] packing N sequences of up to 16 tokens each. The state is carried in
float32 from token to token, each token's output computed from the unrounded state, as
FLA does; the result is bitwise that of one-token calls chained through a float32
state on the same backend. With cu_seqlens and as many tokens as sequences (decode), each sequence has one
token: cu_seqlens must then be [0, 1, ..., N]. Both rules on cu_seqlens are checked by
torch's asynchronous assert (no host sync; a GPU reports it at the next
synchronization, before anything is written). On a GPU, a call whose tokens do not fit
one block's shared memory is refused (ValueError, nothing written; docs/operation.md,
"Multi-token decode").

Mixed input dtypes, as FLA accepts them (e.g. q, k float32 and v float16): the kernel
loads one dtype for q, k and v, so the narrower tensors are upcast to the widest first.
That is exact, and costs one elementwise pass over the upcast tensors (1/K of the state's
bytes each). The output takes q's dtype, as FLA's does.

Per-channel beta [B, T, HV, V] runs gdnkit's per-channel mode (its multi-token kernel).

Not supported (NotImplementedError): gk / gv (per-channel decays), and with cu_seqlens
sequences of more than 16 tokens (FLA's prefill use; gdnkit is a decode kernel): refused
at once where the shapes show it (more tokens than 16 per sequence), else by the
asynchronous assert on cu_seqlens.

Positional order: q, k, v, g, beta, scale, initial_state, output_final_state,
use_qk_l2norm_in_kernel, cu_seqlens; newer FLA releases put gk, gv between g and beta,
so pass beta and later arguments by keyword, as FLA's own callers do.
"""
import torch

from . import _ops
from ._gates import check_packed_rows, check_unit_cu_seqlens, same_qkv_dtype

_WHO = "fused_recurrent_gated_delta_rule"


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    *,
    gk=None,
    gv=None,
):
    """FLA's signature and semantics; returns (o, final_state or None)."""
    if gk is not None or gv is not None:
        raise NotImplementedError(f"{_WHO}: gk / gv (per-channel decays) are not supported by gdnkit")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    packed = False  # several tokens a sequence, packed by cu_seqlens
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise ValueError(
                f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
                f"Please flatten variable-length inputs before processing."
            )
        N = cu_seqlens.shape[0] - 1
        if initial_state is not None and initial_state.shape[0] != N:
            raise ValueError(
                f"The number of initial states is expected to be equal to the number of input "
                f"sequences, i.e., {N} rather than {initial_state.shape[0]}."
            )
        if T == N:
            # as many tokens as sequences: the one-token step ([1, N, ...] are its N rows)
            check_unit_cu_seqlens(cu_seqlens, N, _WHO)
        else:
            if T > N * _ops.MAX_TOKENS:
                raise NotImplementedError(
                    f"{_WHO}: {T} tokens in {N} sequences: gdnkit runs at most "
                    f"{_ops.MAX_TOKENS} tokens a sequence")
            packed = True
        tokens = max(1, min(T, _ops.MAX_TOKENS)) if packed else 1
        if packed:
            check_packed_rows(cu_seqlens, T, tokens, _WHO)
    else:
        N = B
        tokens = T
    out_dtype = q.dtype  # FLA's output takes q's dtype
    q, k, v = same_qkv_dtype(q, k, v)
    if scale is None:
        scale = K**-0.5
    if g is None:
        g = torch.zeros(v.shape[:-1], dtype=torch.float32, device=v.device)  # no decay
    if beta is None:
        beta = torch.ones(v.shape[:-1], dtype=torch.float32, device=v.device)
    if g.dtype != beta.dtype:
        g, beta = g.float(), beta.float()
    if g.stride(-1) != 1:
        g = g.contiguous()
    if beta.stride(-1) != 1:
        beta = beta.contiguous()
    l2norm = _ops.RSQRT if use_qk_l2norm_in_kernel else _ops.NO_NORM
    common = dict(layout=_ops.KV, gate=_ops.PRECOMPUTED, l2norm=l2norm, scale=float(scale),
                  out_dtype=out_dtype)
    if packed:
        common["cu_seqlens"] = cu_seqlens if cu_seqlens.dtype in (torch.int32, torch.int64) \
            else cu_seqlens.to(torch.int64)

    def step(state, qt, kt, vt, gt, bt, n_tokens, **kw):
        return _ops.decode_kw(q=qt, k=kt, v=vt, a=gt, b=bt, state=state, num_tokens=n_tokens,
                              **common, **kw)

    # One gdnkit call carries up to MAX_TOKENS tokens a row: longer dense rows run in
    # chunks of that many, chained through the state (bitwise the same as one call).
    one_call = packed or tokens <= _ops.MAX_TOKENS
    # Without output_final_state, read the caller's state and write nothing (FLA's initial
    # state is an input only): one token through negative write slots; several with
    # update_state=False, on a float32 state (FLA carries the state in float32 between
    # tokens, and gdnkit rounds it to the pool's dtype after each).
    if not output_final_state and initial_state is not None:
        if tokens == 1 and not packed:
            idx = torch.arange(N, dtype=torch.int32, device=q.device)
            o = step(initial_state, q, k, v, g, beta, 1, state_indices=idx,
                     state_out_indices=torch.full_like(idx, -1))
            return o.reshape(v.shape), None
        if one_call and initial_state.dtype == torch.float32 and initial_state.is_contiguous():
            o = step(initial_state, q, k, v, g, beta, tokens, update_state=False)
            return o.reshape(v.shape), None

    if initial_state is None:
        state = torch.zeros(N, HV, K, V, dtype=torch.float32, device=q.device)
    else:
        state = initial_state.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    if one_call:
        o = step(state, q, k, v, g, beta, tokens).reshape(v.shape)
    else:
        chunk = _ops.MAX_TOKENS
        o = torch.cat([step(state, q[:, s:s + chunk], k[:, s:s + chunk], v[:, s:s + chunk],
                            g[:, s:s + chunk], beta[:, s:s + chunk], min(chunk, T - s))
                       .reshape(B, -1, HV, V) for s in range(0, T, chunk)], dim=1)
    return o, (state if output_final_state else None)


__all__ = ["fused_recurrent_gated_delta_rule"]
