"""gdnkit for PyTorch: custom ops and drop-in wrappers.

Importing this module registers

    torch.ops.gdnkit.decode(q, k, v, a, b, A_log, dt_bias, state, ...)        -> o
    torch.ops.gdnkit.decode_packed(qkv, a, b, A_log, dt_bias, state, ...)     -> o
    torch.ops.gdnkit.decode_conv(x, a, b, A_log, dt_bias, state, conv_state, conv_weight, ...)
                                                                   -> o  (conv1d + step)
    torch.ops.gdnkit.fused_deltanet_decode(qkv, alpha, beta_raw, A_log, dt_bias, state)
                                                                   -> (o, new_state)
    torch.ops.gdnkit.fused_deltanet_decode_(qkv, alpha, beta_raw, A_log, dt_bias, state) -> o

(state updated in place except by fused_deltanet_decode; decode_conv updates conv_state
too; decode, decode_packed and decode_conv take z= and norm_weight= for the gated
RMSNorm epilogue), usable in eager mode,
torch.compile, torch.export and CUDA graphs, on the current CUDA stream.

Drop-in wrappers with the signatures of the kernels they replace:

    gdnkit.torch.executorch.fused_deltanet_decode / fused_deltanet_decode_
    gdnkit.torch.vllm.fused_sigmoid_gating_delta_rule_update
    gdnkit.torch.sglang.fused_sigmoid_gating_delta_rule_update
    gdnkit.torch.fla.fused_recurrent_gated_delta_rule
"""
import torch

from .._api import GATES, HEAD_MAPS, L2NORMS, LAYOUTS, _choice
from . import _ops  # noqa: F401  (registers torch.ops.gdnkit.*)
from ._ops import fused_deltanet_decode, fused_deltanet_decode_  # noqa: F401
from . import executorch, fla, sglang, vllm  # noqa: E402,F401
from .fla import fused_recurrent_gated_delta_rule  # noqa: E402,F401
from .vllm import fused_sigmoid_gating_delta_rule_update  # noqa: E402,F401


def decode(
    q=None,
    k=None,
    v=None,
    a=None,
    b=None,
    state=None,
    *,
    qkv=None,
    A_log=None,
    dt_bias=None,
    state_indices=None,
    state_out_indices=None,
    invalid_index_count=None,
    layout="vk",
    gate="raw",
    l2norm="rsqrt",
    l2norm_eps=1e-6,
    scale=None,
    head_map="interleaved",
    num_k_heads=None,
    out_dtype=None,
    x=None,
    conv_state=None,
    conv_weight=None,
    conv_bias=None,
    z=None,
    norm_weight=None,
    norm_eps=1e-6,
    programmatic_launch=False,
):
    """gdnkit.decode for tensors, through torch.ops.gdnkit.decode / decode_packed /
    decode_conv (with x: the conv1d prologue).

    Same arguments and conventions as gdnkit.decode (string switches); returns the
    output [B, Hv, Dv] and updates `state` (and `conv_state`) in place. Traceable by
    torch.compile and torch.export, capturable in CUDA graphs."""
    ids = dict(
        layout=_choice("layout", layout, LAYOUTS),
        gate=_choice("gate", gate, GATES),
        l2norm=_choice("l2norm", l2norm, L2NORMS),
        l2norm_eps=float(l2norm_eps),
        scale=0.0 if scale is None else float(scale),
        head_map=_choice("head_map", head_map, HEAD_MAPS),
        out_dtype=out_dtype,
        z=z,
        norm_weight=norm_weight,
        norm_eps=float(norm_eps),
        programmatic_launch=bool(programmatic_launch),
    )
    if x is not None:
        if qkv is not None or q is not None or k is not None or v is not None:
            raise ValueError("x: give either x (the conv prologue's input) or q, k, v / qkv, not both")
        if conv_state is None or conv_weight is None:
            raise ValueError("conv_state, conv_weight: required with x (the conv prologue)")
        return torch.ops.gdnkit.decode_conv(
            x, a, b, A_log, dt_bias, state, conv_state, conv_weight, conv_bias, state_indices,
            state_out_indices, invalid_index_count,
            num_k_heads=0 if num_k_heads is None else int(num_k_heads), **ids)
    for name, t in (("conv_state", conv_state), ("conv_weight", conv_weight),
                    ("conv_bias", conv_bias)):
        if t is not None:
            raise ValueError(f"{name}: given without x (the conv prologue's input)")
    if qkv is not None:
        if q is not None or k is not None or v is not None:
            raise ValueError("qkv: give either one packed qkv row or q, k and v, not both")
        return torch.ops.gdnkit.decode_packed(
            qkv, a, b, A_log, dt_bias, state, state_indices, state_out_indices,
            invalid_index_count, num_k_heads=0 if num_k_heads is None else int(num_k_heads), **ids)
    if q is None or k is None or v is None:
        raise ValueError("q, k, v: all three are required (or one packed qkv row)")
    return torch.ops.gdnkit.decode(
        q, k, v, a, b, A_log, dt_bias, state, state_indices, state_out_indices,
        invalid_index_count, **ids)


def register_triton_alias():
    """Also register ExecuTorch's own name, torch.ops.triton.fused_deltanet_decode, backed
    by gdnkit (for code and tests that call the op by that name). Does nothing when an
    op of that name already exists (ExecuTorch's own kernel was imported)."""
    return executorch.register_triton_alias()


__all__ = [
    "decode",
    "fused_deltanet_decode",
    "fused_deltanet_decode_",
    "fused_sigmoid_gating_delta_rule_update",
    "fused_recurrent_gated_delta_rule",
    "register_triton_alias",
    "executorch",
    "vllm",
    "sglang",
    "fla",
]
