"""Drop-in for ExecuTorch's fused GatedDeltaNet decode kernel (Qwen3.5 MoE, CUDA backend).

ExecuTorch (backends/cuda/triton/kernels/fused_deltanet_decode.py):

    out, new_state = torch.ops.triton.fused_deltanet_decode(qkv, alpha, beta_raw, A_log, dt_bias, state)

here:

    out, new_state = gdnkit.torch.executorch.fused_deltanet_decode(qkv, alpha, beta_raw, A_log, dt_bias, state)
    out = gdnkit.torch.executorch.fused_deltanet_decode_(qkv, alpha, beta_raw, A_log, dt_bias, state)  # in place

Semantics as ExecuTorch's: qkv [B, 2*Hk*K + H*V] (the conv1d+SiLU output, q|k|v),
alpha and beta_raw [B, H] raw logits, A_log and dt_bias [H], state [B, H, K, V] (our
"kv" layout); q and k normalized as torch F.normalize (x / max(||x||, 1e-6)), head map
h // (H / Hk), scale K**-0.5, gate exp(-exp(A_log) * softplus(alpha + dt_bias)), beta
sigmoid(beta_raw). The output is [B, H, V] in the state's dtype. The out-of-place op
leaves `state` untouched and returns a new contiguous state; the in-place variant
writes `state` and returns only the output, which removes the model's
`state.copy_(new_state)` pass.
"""
import torch

from . import _ops  # registers torch.ops.gdnkit.*


def fused_deltanet_decode(qkv, alpha, beta_raw, A_log, dt_bias, state):
    """(output [B, H, V], new_state [B, H, K, V]); `state` is not modified."""
    return torch.ops.gdnkit.fused_deltanet_decode(qkv, alpha, beta_raw, A_log, dt_bias, state)


def fused_deltanet_decode_(qkv, alpha, beta_raw, A_log, dt_bias, state):
    """output [B, H, V]; `state` [B, H, K, V] is updated in place."""
    return torch.ops.gdnkit.fused_deltanet_decode_(qkv, alpha, beta_raw, A_log, dt_bias, state)


def register_triton_alias():
    """Register torch.ops.triton.fused_deltanet_decode (ExecuTorch's op name) backed by
    gdnkit, unless an op of that name exists already. Returns True when it registered."""
    global _triton_lib
    try:
        torch.ops.triton.fused_deltanet_decode  # noqa: B018
        return False
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("triton", "FRAGMENT")
    lib.define(_ops.executorch_schema("fused_deltanet_decode", in_place=False))
    lib.impl("fused_deltanet_decode", _ops._fused_deltanet_decode_impl, "CompositeExplicitAutograd")
    torch.library.register_fake("triton::fused_deltanet_decode", _ops._fused_deltanet_decode_fake,
                                lib=lib)
    _triton_lib = lib  # the registration lives as long as the Library object
    return True


_triton_lib = None


__all__ = ["fused_deltanet_decode", "fused_deltanet_decode_", "register_triton_alias"]
