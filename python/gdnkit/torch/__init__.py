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
RMSNorm epilogue, and several tokens a row with the multi-token arguments), usable in
eager mode, torch.compile, torch.export and CUDA graphs, on the current CUDA stream; and
gdnkit.torch.decode, gdnkit.decode's keyword arguments over those three ops.

Drop-in wrappers with the signatures of the kernels they replace:

    gdnkit.torch.executorch.fused_deltanet_decode / fused_deltanet_decode_
    gdnkit.torch.vllm.fused_sigmoid_gating_delta_rule_update / fused_recurrent_gated_delta_rule
        (decode and spec decode)
    gdnkit.torch.sglang.fused_sigmoid_gating_delta_rule_update (decode and target verify)
    gdnkit.torch.fla.fused_recurrent_gated_delta_rule (one or several tokens, varlen too)
    gdnkit.torch.flashinfer.gated_delta_rule_decode_pretranspose / gated_delta_rule_decode /
        gated_delta_rule (the bf16-state entry) / gated_delta_rule_mtp (several tokens)

Hugging Face transformers (Qwen3-Next, Qwen3.5): patch_transformers(model) runs every
single-token decode step of the model's GatedDeltaNet layers (conv1d update, recurrent
step, gated RMSNorm) as one gdnkit call; gdnkit.torch.transformers says what it replaces.
"""
from ._ops import decode_kw as decode  # and registers torch.ops.gdnkit.*
from ._ops import fused_deltanet_decode, fused_deltanet_decode_  # noqa: F401
from . import executorch, fla, flashinfer, sglang, vllm  # noqa: E402,F401
from .fla import fused_recurrent_gated_delta_rule  # noqa: E402,F401
from .vllm import fused_sigmoid_gating_delta_rule_update  # noqa: E402,F401
from . import transformers  # noqa: E402,F401  (imports Hugging Face's package only when patching)
from .transformers import patch_transformers  # noqa: E402,F401


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
    "patch_transformers",
    "executorch",
    "vllm",
    "sglang",
    "fla",
    "flashinfer",
    "transformers",
]
