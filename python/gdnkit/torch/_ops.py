"""The PyTorch custom ops torch.ops.gdnkit.* (pure Python over gdnkit._gdnkit).

Every op's schema declares what it writes (Tensor(a!)) and each has a fake
(meta) implementation, so it runs in eager mode, under torch.compile and
torch.export, and inside CUDA graph capture. CUDA tensors run on the current
stream of their device; CPU tensors on the host backend.

The ops are defined with torch.library.Library and a schema string rather than the
torch.library.custom_op decorator: same behaviour for compile/export/functionalization,
but a dispatch of about 4 us instead of 20-40 us in eager mode.
"""
import torch

from .. import _gdnkit
from .._api import GATES, HEAD_MAPS, L2NORMS, LAYOUTS

KV, VK = LAYOUTS["kv"], LAYOUTS["vk"]
RAW, PRECOMPUTED = GATES["raw"], GATES["precomputed"]
RSQRT, MAX_NORM, NO_NORM = L2NORMS["rsqrt"], L2NORMS["max_norm"], L2NORMS["none"]
INTERLEAVED, TILED = HEAD_MAPS["interleaved"], HEAD_MAPS["tiled"]

# torch dtype -> DLPack (code, bits)
_DLPACK_DTYPE = {
    torch.float32: (2, 32),
    torch.float16: (2, 16),
    torch.bfloat16: (4, 16),
    torch.float64: (2, 64),
    torch.int32: (0, 32),
    torch.int64: (0, 64),
}
for _name, _code in (("uint32", (1, 32)), ("uint16", (1, 16))):
    if hasattr(torch, _name):
        _DLPACK_DTYPE[getattr(torch, _name)] = _code

_CUDA_DEVICE_TYPE = 10 if getattr(torch.version, "hip", None) else 2  # ROCm torch says "cuda"

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_of(device):
    if device.type != "cuda":
        return 0
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _desc(t, name):
    """(ptr, shape, strides, dlpack code, bits, device type, device id) for decode_raw."""
    if t is None:
        return None
    code = _DLPACK_DTYPE.get(t.dtype)
    if code is None:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported")
    if t.is_cuda:
        return (t.data_ptr(), t.shape, t.stride(), code[0], code[1], _CUDA_DEVICE_TYPE, t.get_device())
    if t.is_cpu:
        return (t.data_ptr(), t.shape, t.stride(), code[0], code[1], 1, 0)
    raise ValueError(f"{name}: tensors on {t.device} are not supported (cpu or cuda)")


def _rows(a):
    n = 1
    for d in a.shape[:-1]:
        n = n * d
    return n


def _out_shape(a, state, layout):
    hv = state.shape[1]
    dv = state.shape[3] if layout == KV else state.shape[2]
    return (_rows(a), hv, dv)


def run(q, k, v, qkv, a, b, A_log, dt_bias, state, out, state_indices, state_out_indices,
        invalid_index_count, layout, gate, l2norm, l2norm_eps, scale, head_map, num_k_heads,
        stream=None, x=None, conv_state=None, conv_weight=None, conv_bias=None, z=None,
        norm_weight=None, norm_eps=1e-6, programmatic_launch=False):
    """Call the extension on tensors (no allocation; the checks are the extension's and the
    library's). stream None: the current stream of the state's device."""
    _gdnkit.decode_raw(
        _desc(q, "q"), _desc(k, "k"), _desc(v, "v"), _desc(qkv, "qkv"),
        _desc(a, "a"), _desc(b, "b"), _desc(A_log, "A_log"), _desc(dt_bias, "dt_bias"),
        _desc(state, "state"), _desc(out, "out"), _desc(state_indices, "state_indices"),
        _desc(state_out_indices, "state_out_indices"),
        _desc(invalid_index_count, "invalid_index_count"),
        int(layout), int(gate), int(l2norm), float(l2norm_eps), float(scale), int(head_map),
        int(num_k_heads), _stream_of(state.device) if stream is None else stream,
        _desc(x, "x"), _desc(conv_state, "conv_state"), _desc(conv_weight, "conv_weight"),
        _desc(conv_bias, "conv_bias"), _desc(z, "z"), _desc(norm_weight, "norm_weight"),
        float(norm_eps), bool(programmatic_launch),
    )


def _empty_out(ref, a, state, layout, out_dtype):
    return torch.empty(_out_shape(a, state, layout), dtype=out_dtype or ref.dtype, device=ref.device)


# ---- definitions -------------------------------------------------------------------

_lib = torch.library.Library("gdnkit", "DEF")

_OPTIONS = ("int layout=1, int gate=0, int l2norm=0, float l2norm_eps=1e-06, float scale=0., "
            "int head_map=0")

# On every decode op: the gated RMSNorm epilogue (on when norm_weight is given) and
# programmatic dependent launch (CUDA sm_90; see gdnkit.decode).
_FUSED_OPTIONS = ("Tensor? z=None, Tensor? norm_weight=None, float norm_eps=1e-06, "
                  "bool programmatic_launch=False")

_lib.define(
    "decode(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor? A_log, Tensor? dt_bias, "
    "Tensor(a!) state, Tensor? state_indices=None, Tensor? state_out_indices=None, "
    "Tensor(b!)? invalid_index_count=None, " + _OPTIONS + ", ScalarType? out_dtype=None, "
    + _FUSED_OPTIONS + ") -> Tensor")
_lib.define(
    "decode_packed(Tensor qkv, Tensor a, Tensor b, Tensor? A_log, Tensor? dt_bias, "
    "Tensor(a!) state, Tensor? state_indices=None, Tensor? state_out_indices=None, "
    "Tensor(b!)? invalid_index_count=None, " + _OPTIONS + ", int num_k_heads=0, "
    "ScalarType? out_dtype=None, " + _FUSED_OPTIONS + ") -> Tensor")
# The middle of a layer: conv1d update on the raw projected row x, the step, and
# optionally the gated RMSNorm; both pools updated in place.
_lib.define(
    "decode_conv(Tensor x, Tensor a, Tensor b, Tensor? A_log, Tensor? dt_bias, "
    "Tensor(a!) state, Tensor(c!) conv_state, Tensor conv_weight, Tensor? conv_bias=None, "
    "Tensor? state_indices=None, Tensor? state_out_indices=None, "
    "Tensor(b!)? invalid_index_count=None, " + _OPTIONS + ", int num_k_heads=0, "
    "ScalarType? out_dtype=None, " + _FUSED_OPTIONS + ") -> Tensor")
_lib.define(
    "fused_deltanet_decode(Tensor qkv, Tensor alpha, Tensor beta_raw, Tensor A_log, "
    "Tensor dt_bias, Tensor state) -> (Tensor, Tensor)")
_lib.define(
    "fused_deltanet_decode_(Tensor qkv, Tensor alpha, Tensor beta_raw, Tensor A_log, "
    "Tensor dt_bias, Tensor(a!) state) -> Tensor")


# ---- gdnkit::decode (separate q, k, v) and gdnkit::decode_packed ---------------------

def _decode_impl(q, k, v, a, b, A_log, dt_bias, state, state_indices=None, state_out_indices=None,
                 invalid_index_count=None, layout=VK, gate=RAW, l2norm=RSQRT, l2norm_eps=1e-6,
                 scale=0.0, head_map=INTERLEAVED, out_dtype=None, z=None, norm_weight=None,
                 norm_eps=1e-6, programmatic_launch=False):
    """One decode step on q [B, Hk, Dk], k, v [B, Hv, Dv] (or [B, 1, H, D]); returns o
    [B, Hv, Dv] and updates `state` in place. Integer switches: gdnkit.LAYOUTS, GATES,
    L2NORMS, HEAD_MAPS; scale 0 means Dk**-0.5. With norm_weight [Dv] and z [B, Hv, Dv]:
    the gated RMSNorm of each v-head's output."""
    out = _empty_out(q, a, state, layout, out_dtype)
    run(q, k, v, None, a, b, A_log, dt_bias, state, out, state_indices, state_out_indices,
        invalid_index_count, layout, gate, l2norm, l2norm_eps, scale, head_map, 0, z=z,
        norm_weight=norm_weight, norm_eps=norm_eps, programmatic_launch=programmatic_launch)
    return out


def _decode_fake(q, k, v, a, b, A_log, dt_bias, state, state_indices=None, state_out_indices=None,
                 invalid_index_count=None, layout=VK, gate=RAW, l2norm=RSQRT, l2norm_eps=1e-6,
                 scale=0.0, head_map=INTERLEAVED, out_dtype=None, z=None, norm_weight=None,
                 norm_eps=1e-6, programmatic_launch=False):
    return _empty_out(q, a, state, layout, out_dtype)


def _decode_packed_impl(qkv, a, b, A_log, dt_bias, state, state_indices=None,
                        state_out_indices=None, invalid_index_count=None, layout=VK, gate=RAW,
                        l2norm=RSQRT, l2norm_eps=1e-6, scale=0.0, head_map=INTERLEAVED,
                        num_k_heads=0, out_dtype=None, z=None, norm_weight=None, norm_eps=1e-6,
                        programmatic_launch=False):
    """As gdnkit::decode, with the packed row qkv [B, 2*Hk*Dk + Hv*Dv] (or [B, 1, W])."""
    out = _empty_out(qkv, a, state, layout, out_dtype)
    run(None, None, None, qkv, a, b, A_log, dt_bias, state, out, state_indices, state_out_indices,
        invalid_index_count, layout, gate, l2norm, l2norm_eps, scale, head_map, num_k_heads, z=z,
        norm_weight=norm_weight, norm_eps=norm_eps, programmatic_launch=programmatic_launch)
    return out


def _decode_packed_fake(qkv, a, b, A_log, dt_bias, state, state_indices=None,
                        state_out_indices=None, invalid_index_count=None, layout=VK, gate=RAW,
                        l2norm=RSQRT, l2norm_eps=1e-6, scale=0.0, head_map=INTERLEAVED,
                        num_k_heads=0, out_dtype=None, z=None, norm_weight=None, norm_eps=1e-6,
                        programmatic_launch=False):
    return _empty_out(qkv, a, state, layout, out_dtype)


# ---- gdnkit::decode_conv: conv1d update + step (+ gated RMSNorm) -----------------------

def _decode_conv_impl(x, a, b, A_log, dt_bias, state, conv_state, conv_weight, conv_bias=None,
                      state_indices=None, state_out_indices=None, invalid_index_count=None,
                      layout=VK, gate=RAW, l2norm=RSQRT, l2norm_eps=1e-6, scale=0.0,
                      head_map=INTERLEAVED, num_k_heads=0, out_dtype=None, z=None,
                      norm_weight=None, norm_eps=1e-6, programmatic_launch=False):
    """The middle of a Qwen3-Next / Qwen3.5 layer in one call: x [B, conv_dim] is the raw
    projected row; q|k|v = silu(conv1d(conv_state window, x) + conv_bias); conv_state
    [S, conv_dim, W-1] (or [S, W-1, conv_dim], any strides gdnkit accepts) shifts in x;
    conv_weight [conv_dim, W] or [conv_dim, 1, W]. Then the step, then the gated RMSNorm
    when norm_weight is given. Both pools are updated in place."""
    out = _empty_out(x, a, state, layout, out_dtype)
    run(None, None, None, None, a, b, A_log, dt_bias, state, out, state_indices,
        state_out_indices, invalid_index_count, layout, gate, l2norm, l2norm_eps, scale, head_map,
        num_k_heads, x=x, conv_state=conv_state, conv_weight=conv_weight, conv_bias=conv_bias,
        z=z, norm_weight=norm_weight, norm_eps=norm_eps, programmatic_launch=programmatic_launch)
    return out


def _decode_conv_fake(x, a, b, A_log, dt_bias, state, conv_state, conv_weight, conv_bias=None,
                      state_indices=None, state_out_indices=None, invalid_index_count=None,
                      layout=VK, gate=RAW, l2norm=RSQRT, l2norm_eps=1e-6, scale=0.0,
                      head_map=INTERLEAVED, num_k_heads=0, out_dtype=None, z=None,
                      norm_weight=None, norm_eps=1e-6, programmatic_launch=False):
    return _empty_out(x, a, state, layout, out_dtype)


# ---- ExecuTorch: fused_deltanet_decode and its in-place variant --------------------

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
    run(None, None, None, qkv, alpha, beta_raw, A_log, dt_bias, state, out, None, None, None,
        KV, RAW, MAX_NORM, 1e-6, 0.0, INTERLEAVED, 0)
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


for _name, _impl, _fake in (
    ("decode", _decode_impl, _decode_fake),
    ("decode_packed", _decode_packed_impl, _decode_packed_fake),
    ("decode_conv", _decode_conv_impl, _decode_conv_fake),
    ("fused_deltanet_decode", _fused_deltanet_decode_impl, _fused_deltanet_decode_fake),
    ("fused_deltanet_decode_", _fused_deltanet_decode__impl, _fused_deltanet_decode__fake),
):
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake("gdnkit::" + _name, _fake, lib=_lib)

decode = torch.ops.gdnkit.decode
decode_packed = torch.ops.gdnkit.decode_packed
decode_conv = torch.ops.gdnkit.decode_conv
fused_deltanet_decode = torch.ops.gdnkit.fused_deltanet_decode
fused_deltanet_decode_ = torch.ops.gdnkit.fused_deltanet_decode_
