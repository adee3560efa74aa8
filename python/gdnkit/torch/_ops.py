"""The PyTorch custom ops torch.ops.gdnkit.* (pure Python over gdnkit._gdnkit).

Every op's schema declares what it writes (Tensor(a!)) and each has a fake
(meta) implementation, so it runs in eager mode, under torch.compile and
torch.export, and inside CUDA graph capture. CUDA tensors run on the current
stream of their device; CPU tensors on the host backend. Several tokens a row
(speculative decoding) are the same ops with a token dimension and the multi-token
arguments, one library call; the fake implementation reads the output's shape from
the shapes alone (gdnkit._options.out_shape), as the real one does.

The schemas, implementations and fakes of decode, decode_packed and decode_conv
all come from gdnkit._options.PARAMS; decode_kw is the keyword front end over the
three (gdnkit.torch.decode, and what the drop-in wrappers call). The ops are
defined with torch.library.Library and a schema string rather than the
torch.library.custom_op decorator: same behaviour for compile/export/functionalization,
but a dispatch of about 4 us instead of 20-40 us in eager mode.
"""
import torch

from .._options import (DECODE, DECODE_CONV, DECODE_PACKED, GATES, HEAD_MAPS, L2NORMS, LAYOUTS,
                        OPS, TORCH_PARAMS, make_function, normalized, op_params, out_shape,
                        schema, signature)
from .._options import MAX_TOKENS  # noqa: F401  (the drop-ins' bound on tokens a call)
from .._raw import run, run_values  # run: the raw path, by keyword (no dispatcher)

KV, VK = LAYOUTS["kv"], LAYOUTS["vk"]
RAW, PRECOMPUTED = GATES["raw"], GATES["precomputed"]
RSQRT, MAX_NORM, NO_NORM = L2NORMS["rsqrt"], L2NORMS["max_norm"], L2NORMS["none"]
INTERLEAVED, TILED = HEAD_MAPS["interleaved"], HEAD_MAPS["tiled"]


def _rows(a):
    n = 1
    for d in a.shape[:-1]:
        n = n * d
    return n


def _out_shape(a, state, layout):
    hv = state.shape[1]
    dv = state.shape[3] if layout == KV else state.shape[2]
    return (_rows(a), hv, dv)


def _empty_out(values, ref):
    """The output of a decode op's call (values: its arguments by name), and T: [B, Hv, Dv]
    for one token a row, [B, T, Hv, Dv] or [total_tokens, Hv, Dv] for several; from the
    shapes alone, so the fake implementation allocates the same."""
    state = values["state"]
    hv = state.shape[1]
    dv = state.shape[3] if values["layout"] == KV else state.shape[2]
    shape, tokens = out_shape(values, hv, dv)
    out = torch.empty(shape, dtype=values["out_dtype"] or ref.dtype, device=ref.device)
    return out, tokens


# ---- gdnkit::decode, decode_packed and decode_conv -----------------------------------

# Each op's input row, whose dtype and device the output takes.
_REF = {DECODE: "q", DECODE_PACKED: "qkv", DECODE_CONV: "x"}

_MULTI_DOC = """
    Several tokens a row (gdnkit.decode's arguments of that name): q, k, v, qkv, x, a, b and
    z with a token dimension ([B, T, ...], or [total_tokens, ...] with cu_seqlens), the
    output [B, T, Hv, Dv] (or [total_tokens, Hv, Dv]); num_tokens 0 means from the shapes;
    token_state_indices, num_accepted_tokens, intermediate_states (updated in place) and
    update_state say where the states go."""

_DOCS = {
    DECODE: """One decode step on q [B, Hk, Dk], k, v [B, Hv, Dv] (or [B, 1, H, D]); returns o
    [B, Hv, Dv] and updates `state` in place. Integer switches: gdnkit.LAYOUTS, GATES,
    L2NORMS, HEAD_MAPS; scale 0 means Dk**-0.5. With norm_weight [Dv] and z [B, Hv, Dv]:
    the gated RMSNorm of each v-head's output.""" + _MULTI_DOC,
    DECODE_PACKED: """As gdnkit::decode, with the packed row qkv [B, 2*Hk*Dk + Hv*Dv] (or [B, 1, W]).
    """ + _MULTI_DOC,
    DECODE_CONV: """The middle of a Qwen3-Next / Qwen3.5 layer in one call: x [B, conv_dim] is the raw
    projected row; q|k|v = silu(conv1d(conv_state window, x) + conv_bias); conv_state
    [S, conv_dim, W-1] (or [S, W-1, conv_dim], any strides gdnkit accepts) shifts in x;
    conv_weight [conv_dim, W] or [conv_dim, 1, W]. Then the step, then the gated RMSNorm
    when norm_weight is given. Both pools (state, conv_state) are updated in place.""" + _MULTI_DOC
    + """ intermediate_conv_states keeps every token's conv window.""",
}


def _impl_body(op):
    ref = _REF[op]

    def body(values):
        out, tokens = _empty_out(values, values[ref])
        del values["out_dtype"]
        values["out"] = out
        values["num_tokens"] = tokens
        run_values(values)
        return out

    return body


def _fake_body(op):
    ref = _REF[op]

    def body(values):
        return _empty_out(values, values[ref])[0]

    return body


_lib = torch.library.Library("gdnkit", "DEF")
_IMPLS = {}
for _op in OPS:
    _args = signature(op_params(_op), op=True)
    _lib.define(schema(_op))
    _IMPLS[_op] = (make_function(f"_{_op}_impl", _args, _impl_body(_op), doc=_DOCS[_op],
                                 module=__name__),
                   make_function(f"_{_op}_fake", _args, _fake_body(_op), module=__name__))


# ---- ExecuTorch: fused_deltanet_decode and its in-place variant --------------------

_EXECUTORCH_ARGS = ("qkv", "alpha", "beta_raw", "A_log", "dt_bias", "state")


def executorch_schema(name, in_place):
    """The schema of ExecuTorch's fused_deltanet_decode (in_place: the variant that writes
    `state` and returns only the output)."""
    args = ", ".join(f"Tensor(a!) {a}" if in_place and a == "state" else f"Tensor {a}"
                     for a in _EXECUTORCH_ARGS)
    return f"{name}({args}) -> {'Tensor' if in_place else '(Tensor, Tensor)'}"


def _executorch_inputs(qkv, alpha, beta_raw, A_log, dt_bias):
    # ExecuTorch's kernel loads every input .to(float32); the library reads a and b in
    # one shared dtype and A_log/dt_bias in float32: convert only where they differ.
    if alpha.dtype != beta_raw.dtype:
        alpha, beta_raw = alpha.float(), beta_raw.float()
    if alpha.stride(-1) != 1:
        alpha = alpha.contiguous()
    if beta_raw.stride(-1) != 1:
        beta_raw = beta_raw.contiguous()
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    A_log = A_log.float().contiguous()
    dt_bias = dt_bias.float().contiguous()
    return qkv, alpha, beta_raw, A_log, dt_bias


def _executorch_step(qkv, alpha, beta_raw, A_log, dt_bias, state):
    qkv, alpha, beta_raw, A_log, dt_bias = _executorch_inputs(qkv, alpha, beta_raw, A_log, dt_bias)
    out = torch.empty(_out_shape(alpha, state, KV), dtype=state.dtype, device=qkv.device)
    run(qkv=qkv, a=alpha, b=beta_raw, A_log=A_log, dt_bias=dt_bias, state=state, out=out,
        layout=KV, gate=RAW, l2norm=MAX_NORM, l2norm_eps=1e-6, head_map=INTERLEAVED)
    return out


def _fused_deltanet_decode_impl(qkv, alpha, beta_raw, A_log, dt_bias, state):
    """ExecuTorch's torch.ops.triton.fused_deltanet_decode: out of place.

    qkv [B, 2*Hk*K + H*V], alpha/beta_raw [B, H], A_log/dt_bias [H], state [B, H, K, V]
    (not mutated). Returns (output [B, H, V], new_state [B, H, K, V]), both in state's
    dtype; l2norm x / max(||x||, 1e-6), scale K**-0.5."""
    new_state = state.clone(memory_format=torch.contiguous_format)
    out = _executorch_step(qkv, alpha, beta_raw, A_log, dt_bias, new_state)
    return out, new_state


def _fused_deltanet_decode_fake(qkv, alpha, beta_raw, A_log, dt_bias, state):
    out = qkv.new_empty(_out_shape(alpha, state, KV), dtype=state.dtype)
    return out, torch.empty_like(state, memory_format=torch.contiguous_format)


def _fused_deltanet_decode__impl(qkv, alpha, beta_raw, A_log, dt_bias, state):
    """In-place fused_deltanet_decode: updates `state` [B, H, K, V] and returns the output.
    Replaces `out, new = fused_deltanet_decode(...); state.copy_(new)` (no second pass)."""
    return _executorch_step(qkv, alpha, beta_raw, A_log, dt_bias, state)


def _fused_deltanet_decode__fake(qkv, alpha, beta_raw, A_log, dt_bias, state):
    return qkv.new_empty(_out_shape(alpha, state, KV), dtype=state.dtype)


_lib.define(executorch_schema("fused_deltanet_decode", in_place=False))
_lib.define(executorch_schema("fused_deltanet_decode_", in_place=True))
_IMPLS["fused_deltanet_decode"] = (_fused_deltanet_decode_impl, _fused_deltanet_decode_fake)
_IMPLS["fused_deltanet_decode_"] = (_fused_deltanet_decode__impl, _fused_deltanet_decode__fake)

for _name, (_impl, _fake) in _IMPLS.items():
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake("gdnkit::" + _name, _fake, lib=_lib)

decode = torch.ops.gdnkit.decode
decode_packed = torch.ops.gdnkit.decode_packed
decode_conv = torch.ops.gdnkit.decode_conv
fused_deltanet_decode = torch.ops.gdnkit.fused_deltanet_decode
fused_deltanet_decode_ = torch.ops.gdnkit.fused_deltanet_decode_


# ---- the keyword front end ------------------------------------------------------------

_OP_ARGS = {op: tuple(p.name for p in op_params(op)) for op in OPS}
_CALL = {op: getattr(torch.ops.gdnkit, op) for op in OPS}
_CONV_ONLY = ("conv_state", "conv_weight", "conv_bias", "intermediate_conv_states")


def _which_op(values):
    """The op for the inputs given: decode_conv (x), decode_packed (qkv) or decode (q, k, v)."""
    has_qkv = values["q"] is not None or values["k"] is not None or values["v"] is not None
    if values["x"] is not None:
        if values["qkv"] is not None or has_qkv:
            raise ValueError("x: give either x (the conv prologue's input) or q, k, v / qkv, not both")
        if values["conv_state"] is None or values["conv_weight"] is None:
            raise ValueError("conv_state, conv_weight: required with x (the conv prologue)")
        return DECODE_CONV
    for name in _CONV_ONLY:
        if values[name] is not None:
            raise ValueError(f"{name}: given without x (the conv prologue's input)")
    if values["qkv"] is not None:
        if has_qkv:
            raise ValueError("qkv: give either one packed qkv row or q, k and v, not both")
        return DECODE_PACKED
    if values["q"] is None or values["k"] is None or values["v"] is None:
        raise ValueError("q, k, v: all three are required (or one packed qkv row)")
    return DECODE


def _decode_kw(values):
    values = normalized(values)
    op = _which_op(values)
    return _CALL[op](*[values[name] for name in _OP_ARGS[op]])


decode_kw = make_function("decode", signature(TORCH_PARAMS), _decode_kw, module="gdnkit.torch",
                          doc="""gdnkit.decode for tensors, through torch.ops.gdnkit.decode / decode_packed /
    decode_conv (with x: the conv1d prologue).

    Same arguments and conventions as gdnkit.decode (string switches, or their numbers)
    but for out and stream: the output is allocated (dtype out_dtype, default the inputs')
    and the op runs on the current stream. Returns the output ([B, Hv, Dv]; with several
    tokens a row [B, T, Hv, Dv], or [total_tokens, Hv, Dv] with cu_seqlens) and updates
    `state` (and `conv_state`, and the intermediate buffers given) in place. Traceable by
    torch.compile and torch.export, capturable in CUDA graphs.""")
