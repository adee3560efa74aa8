"""gdnkit.decode: the framework-neutral front end of the extension."""
import sys

from . import _gdnkit

# The API's switches, as the C++ enums number them (core/include/gdnkit/types.hpp).
LAYOUTS = {"kv": 0, "vk": 1}
GATES = {"raw": 0, "precomputed": 1}
L2NORMS = {"rsqrt": 0, "max_norm": 1, "none": 2}
HEAD_MAPS = {"interleaved": 0, "tiled": 1}

# The spellings the golden-file metadata accepts, accepted here too.
_ALIASES = {
    "layout": {},
    "gate": {"pre": "precomputed"},
    "l2norm": {
        "default": "rsqrt",
        "max": "max_norm",
        "maxnorm": "max_norm",
        "normalize": "max_norm",
        "f_normalize": "max_norm",
        "off": "none",
    },
    "head_map": {"repeat_interleave": "interleaved", "tile": "tiled"},
}


def _choice(name, value, table):
    if value is None and name == "l2norm":
        return table["none"]
    if isinstance(value, str):
        key = value.strip().lower()
        key = _ALIASES[name].get(key, key)
        if key in table:
            return table[key]
    elif isinstance(value, int) and not isinstance(value, bool) and value in table.values():
        return value
    raise ValueError(f"{name}: unknown value {value!r} (one of: {', '.join(table)})")


# ---- dtypes ----------------------------------------------------------------------

_DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def _dtype_name(dtype):
    """Canonical name of a dtype given as a string, numpy or torch dtype, or None."""
    if dtype is None:
        return None
    text = str(getattr(dtype, "name", dtype)).lower()  # numpy dtypes have .name
    for junk in ("<", ">", "'", '"', "class ", "dtype(", ")"):
        text = text.replace(junk, "")
    text = text.rsplit(".", 1)[-1]  # torch.bfloat16, numpy.float16, ml_dtypes.bfloat16
    if text in _DTYPE_NAMES:
        return _DTYPE_NAMES[text]
    raise ValueError(f"out_dtype: {dtype!r} is not supported (float32, float16 or bfloat16)")


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
        if x.dtype.name == "bfloat16":
            import numpy as np

            return x.view(np.uint16)
    return x


def _rows(x, trailing):
    """Rows of an array whose last `trailing` dims are per row (leading dims collapse)."""
    n = 1
    for d in tuple(x.shape)[: max(len(x.shape) - trailing, 0)]:
        n *= int(d)
    return n


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
    out=None,
    out_dtype=None,
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
    x=None,
    conv_state=None,
    conv_weight=None,
    conv_bias=None,
    z=None,
    norm_weight=None,
    norm_eps=1e-6,
    programmatic_launch=False,
    stream=None,
):
    """One GatedDeltaNet decode step (SPEC section 1); updates `state` in place, returns the output.

    Arrays (numpy, torch, CuPy, ... through DLPack; all on one device):
      q, k        [B, Hk, Dk] (also [B, 1, Hk, Dk], [1, B, Hk, Dk] or [B, Hk*Dk])
      v           [B, Hv, Dv] (same variants)
      qkv         instead of q, k, v: the packed row [B, 2*Hk*Dk + Hv*Dv] (or [B, 1, W]),
                  [q | k | v] per row; Hk follows from the width (or num_k_heads)
      a, b        [B, Hv] raw gate logits a and b_raw; with gate="precomputed",
                  a holds g (log space) and b holds beta (already through the sigmoid)
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
    if state is None:
        raise ValueError("state: required")
    if a is None or b is None:
        raise ValueError("a, b: required")
    ref = x if x is not None else qkv if qkv is not None else q
    if ref is None:
        raise ValueError("q, k, v: all three are required (or one packed qkv row, or x with "
                         "the conv prologue)")
    layout_id = _choice("layout", layout, LAYOUTS)
    if out is None:
        if len(state.shape) != 4:
            raise ValueError(f"state: expected a rank-4 pool, got shape {tuple(state.shape)}")
        hv = int(state.shape[1])
        dv = int(state.shape[3] if layout_id == LAYOUTS["kv"] else state.shape[2])
        out = _allocate(ref, (_rows(a, 1), hv, dv), _dtype_name(out_dtype))
    elif out_dtype is not None:
        raise ValueError("out_dtype: give out or out_dtype, not both")
    if stream is None:
        stream = _default_stream(state)
    options = (
        layout_id,
        _choice("gate", gate, GATES),
        _choice("l2norm", l2norm, L2NORMS),
        float(l2norm_eps),
        0.0 if scale is None else float(scale),
        _choice("head_map", head_map, HEAD_MAPS),
        0 if num_k_heads is None else int(num_k_heads),
    )
    if _framework(state) == "torch":
        # Tensors go by pointer (torch's __dlpack__ may synchronize streams, which a CUDA
        # graph capture cannot have, and costs a few microseconds per tensor).
        from .torch import _ops

        _ops.run(q, k, v, qkv, a, b, A_log, dt_bias, state, out, state_indices,
                 state_out_indices, invalid_index_count, *options, stream=int(stream), x=x,
                 conv_state=conv_state, conv_weight=conv_weight, conv_bias=conv_bias, z=z,
                 norm_weight=norm_weight, norm_eps=norm_eps,
                 programmatic_launch=programmatic_launch)
        return out
    _gdnkit.decode(
        _numpy_view(q),
        _numpy_view(k),
        _numpy_view(v),
        _numpy_view(qkv),
        _numpy_view(a),
        _numpy_view(b),
        A_log,
        dt_bias,
        _numpy_view(state),
        _numpy_view(out),
        state_indices,
        state_out_indices,
        invalid_index_count,
        *options,
        int(stream),
        _numpy_view(x),
        _numpy_view(conv_state),
        _numpy_view(conv_weight),
        _numpy_view(conv_bias),
        _numpy_view(z),
        _numpy_view(norm_weight),
        float(norm_eps),
        bool(programmatic_launch),
    )
    return out


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
