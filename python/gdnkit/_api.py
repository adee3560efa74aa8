"""gdnkit.decode: the framework-neutral front end of the extension.

Its signature comes from gdnkit._options.PARAMS (the one list of the step's
parameters). Arrays go to the extension through DLPack, except torch tensors, which
go by pointer through gdnkit._raw (the path the torch ops take too). This module
never imports gdnkit.torch, and gdnkit.torch never imports it: both sit on
gdnkit._options and gdnkit._raw.
"""
import sys

from . import _gdnkit, _raw
from ._options import (EXT_ARRAYS, LAYOUTS, PARAMS, choice, dtype_name, ext_kwargs,
                       make_function, out_shape, signature)


def _numpy_bfloat16():
    try:
        import ml_dtypes  # noqa: F401

        return ml_dtypes.bfloat16
    except ImportError:
        return None


def _framework(x):
    return type(x).__module__.split(".")[0]


def _numpy_view(x):
    """numpy arrays of ml_dtypes' bfloat16 travel as uint16 views (raw bfloat16 bits)."""
    if x is not None and _framework(x) == "numpy" and getattr(x, "dtype", None) is not None:
        # dtype.type.__name__: as dtype.name, without its cost (a Python property in numpy)
        if getattr(x.dtype.type, "__name__", "") == "bfloat16":
            import numpy as np

            return x.view(np.uint16)
    return x


def _allocate(ref, shape, dtype):
    """An empty array like `ref` (same framework and device) of `shape` and `dtype`."""
    fw = _framework(ref)
    if fw == "torch":
        import torch

        dt = ref.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=ref.device)
    if fw == "numpy":
        import numpy as np

        if dtype is None:
            dt = ref.dtype
        elif dtype == "bfloat16":
            dt = _numpy_bfloat16() or np.uint16  # uint16: raw bfloat16 bits
        else:
            dt = np.dtype(dtype)
        return np.empty(shape, dtype=dt)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(ref.device.id):
            return cupy.empty(shape, dtype=ref.dtype if dtype is None else dtype)
    namespace = getattr(ref, "__array_namespace__", None)
    if namespace is not None:
        xp = namespace()
        dt = ref.dtype if dtype is None else getattr(xp, dtype)
        return xp.empty(shape, dtype=dt, device=ref.device)
    raise ValueError(f"out: cannot allocate an output like a {type(ref).__name__}; pass out=")


def _default_stream(ref):
    """The stream the caller's framework would use now (0 for host arrays)."""
    fw = _framework(ref)
    if fw == "torch" and ref.is_cuda:
        import torch

        return torch.cuda.current_stream(ref.device).cuda_stream
    if fw == "cupy":
        cupy = sys.modules["cupy"]
        return cupy.cuda.get_current_stream().ptr
    return 0


_DECODE_DOC = """One GatedDeltaNet decode step (docs/operation.md): one token a row, or several;
updates `state` in place, returns the output.

Arrays (numpy, torch, CuPy, ... through DLPack; all on one device):
  q, k        [B, Hk, Dk] (also [B, 1, Hk, Dk], [1, B, Hk, Dk] or [B, Hk*Dk])
  v           [B, Hv, Dv] (same variants)
  qkv         instead of q, k, v: the packed row [B, 2*Hk*Dk + Hv*Dv] (or [B, 1, W]),
              [q | k | v] per row; Hk follows from the width (or num_k_heads)
  a, b        [B, Hv] raw gate logits a and b_raw; with gate="precomputed",
              a holds g (log space) and b holds beta (already through the sigmoid),
              or b [B, Hv, Dv] holds one beta a column (per-channel beta)
  A_log, dt_bias  [Hv] float32 (raw gate only)
  state       the pool [num_slots, Hv, Dk, Dv] (layout "kv") or [num_slots, Hv, Dv, Dk]
              ("vk"); every slot's block dense, the slot stride free; written in place
  out         [B, Hv, Dv], allocated when omitted (dtype out_dtype, default q's dtype)
  state_indices      [B] int32/int64: row b reads slot state_indices[b]; negative =
                     padding row (no state read or written, output row zero); >= num_slots
                     is treated as padding and counted
  state_out_indices  [B], same dtype: row b writes slot state_out_indices[b] instead
                     (negative: output only, no state write)
  invalid_index_count  one uint32/int32 element, incremented per out-of-range index
The middle of a Qwen3-Next / Qwen3.5 layer, optional and fused into the same call:
  x           instead of q, k, v / qkv: the raw projected row [B, 2*Hk*Dk + Hv*Dv]
              before the causal conv1d (causal_conv1d_update); q, k, v are
              silu(conv1d(window) + conv_bias) of it, never stored
  conv_state  the conv pool [num_slots, conv_dim, W-1] (oldest tap first), or
              [num_slots, W-1, conv_dim]; any strides with one of the two innermost
              contiguous (a transposed view works); same slots as `state`; shifted
              by one and x appended, in place
  conv_weight [conv_dim, W] or [conv_dim, 1, W] (nn.Conv1d's), W = 2, 3 or 4
  conv_bias   [conv_dim], optional
  z, norm_weight  the gated RMSNorm of each v-head's output (Qwen3-Next RMSNormGated):
              out = norm_weight * o * rsqrt(mean(o^2) + norm_eps) * silu(z), in float32
              before the output's rounding; z [B, Hv, Dv] (or [B, Hv*Dv]), norm_weight [Dv]
  x, conv_state, conv_weight, conv_bias, z and norm_weight share the inputs' dtype.
Several tokens a row (speculative decoding: T = 1 + drafts), in one call:
  q, k, v, qkv, x, a, b, z and out take a token dimension: [B, T, ...] (or [B*T, ...]),
              or with cu_seqlens [total_tokens, ...] (or [1, total_tokens, ...])
  cu_seqlens  [B + 1] int: row b owns the packed tokens [cu_seqlens[b], cu_seqlens[b+1]),
              at most T of them (vLLM's query_start_loc)
  num_tokens  T, 1 to 16; None: from the shapes (a [B, T, Hv] with B and T both other
              than 1, else the second dimension of token_state_indices or
              intermediate_states, else with cu_seqlens min(total_tokens, 16), else 1). A
              [1, T, ...] input with none of these is T rows of one token, as it always
              was: pass num_tokens=T for one row of T tokens
  The tokens of a row run in order on its state, which is rounded to the state's dtype
  after every token: one call gives the outputs and states of T one-token calls chained
  through the pool. out is [B, T, Hv, Dv], or [total_tokens, Hv, Dv] with cu_seqlens.
  Where the states go (by default, as for one token: the state after a row's last token
  to its write slot):
  token_state_indices  [B, T] int (more columns allowed, unused): the state (and conv
              state) after token t of row b to slot token_state_indices[b, t] (negative:
              not stored), and the state after its last token to state_out_indices[b]
              when given (FlashInfer's split pool), else nowhere else; row b starts from
              state_indices[b] when given,
              else from slot token_state_indices[b, n - 1], n = num_accepted_tokens[b]
              (1 without it): vLLM's ssm_state_indices and num_accepted_tokens
  num_accepted_tokens  [B] int, with token_state_indices only
  intermediate_states  [B, T (or more), <a slot of state>] or [B, T, Hv*Dk*Dv] in the
              pool's dtype, each block dense: the state after token t of row b to
              intermediate_states[b, t], in place (FlashInfer's intermediate_states_buffer)
  intermediate_conv_states  [B, T (or more), <a slot of conv_state>] with the conv pool's
              channel and tap strides: every token's conv window
  update_state  False: neither pool is written; the outputs and the intermediate buffers
              still are (FlashInfer's disable_state_update)
  Padding and bad indices as for one token; a row whose cu_seqlens range is not within
  [0, total_tokens] with at most T tokens, or whose num_accepted_tokens is outside [1, T],
  is counted in invalid_index_count and writes nothing. Every index array
  (state_indices, state_out_indices, cu_seqlens, token_state_indices,
  num_accepted_tokens) takes the same dtype.
Conventions: layout "kv"/"vk"; gate "raw"/"precomputed"; l2norm "rsqrt"
(x*rsqrt(sum x^2 + eps)), "max_norm" (x / max(||x||, eps), torch F.normalize) or "none";
head_map "interleaved" (h // G) or "tiled" (h % Hk); scale None = Dk**-0.5.
Strides come from the arrays (the last dimension must be contiguous). bfloat16:
torch/CuPy/JAX bfloat16 arrays, numpy arrays of ml_dtypes.bfloat16, or numpy uint16
arrays holding raw bfloat16 bits. `stream`: a CUDA stream handle (int); None uses the
framework's current stream for torch and CuPy arrays, 0 (the default stream) otherwise.
CPU arrays run on the host backend (synchronously), CUDA arrays on the CUDA backend
(asynchronously on `stream`). programmatic_launch=True (CUDA sm_90; ignored
elsewhere): the kernel may start while the previous kernel on the stream runs,
issuing its state loads (and, with 16-bit inputs, the conv state and the conv and
norm weights) before it waits for that kernel; the caller promises the previous
kernel writes neither pool, the index arrays, nor the conv and norm weights.
"""


def _decode(values):
    """gdnkit.decode's body: `values` holds every argument by name."""
    state = values["state"]
    if state is None:
        raise ValueError("state: required")
    if values["a"] is None or values["b"] is None:
        raise ValueError("a, b: required")
    x, qkv = values["x"], values["qkv"]
    ref = x if x is not None else qkv if qkv is not None else values["q"]
    if ref is None:
        raise ValueError("q, k, v: all three are required (or one packed qkv row, or x with "
                         "the conv prologue)")
    layout = choice("layout", values["layout"], LAYOUTS)
    out, out_dtype = values["out"], values["out_dtype"]
    hv = dv = 0
    if len(state.shape) == 4:
        hv = int(state.shape[1])
        dv = int(state.shape[3] if layout == LAYOUTS["kv"] else state.shape[2])
    elif out is None:
        raise ValueError(f"state: expected a rank-4 pool, got shape {tuple(state.shape)}")
    # T resolved here, from the shapes, and handed on: the output allocated below and the
    # extension's checks then read the same token layout.
    shape, tokens = out_shape(values, hv, dv)
    if out is None:
        out = _allocate(ref, shape, dtype_name(out_dtype))
    elif out_dtype is not None:
        raise ValueError("out_dtype: give out or out_dtype, not both")
    stream = values["stream"]
    if stream is None:
        stream = _default_stream(state)
    kw = ext_kwargs({**values, "out": out, "stream": stream, "num_tokens": tokens})
    if _framework(state) == "torch":
        _raw.run_values(kw)
    else:
        for name in EXT_ARRAYS:
            kw[name] = _numpy_view(kw[name])
        _gdnkit.decode(**kw)
    return out


decode = make_function("decode", signature(PARAMS), _decode, doc=_DECODE_DOC, module=__name__)


def backend_built(name):
    """True when the backend ("host", "cuda", "hip") was compiled into this gdnkit."""
    return _gdnkit.backend_built(name)


def backend_available(name):
    """(available, reason): the backend is built and found a device."""
    return _gdnkit.backend_available(name)


def info():
    """Version, and per backend whether it is built, available, and the devices found."""
    backends = {}
    for name in ("host", "cuda", "hip"):
        ok, why = _gdnkit.backend_available(name)
        backends[name] = {
            "built": _gdnkit.backend_built(name),
            "available": ok,
            "reason": why,
            "devices": _gdnkit.describe(name) if ok else "",
        }
    return {"version": _gdnkit.version(), "backends": backends}
