"""The decode step's parameters, written once, and the tables of its switches.

PARAMS is the one list of the step's parameters, in one order. Everything that takes
them is derived from it:

  - the public keyword signatures, gdnkit.decode (every parameter) and
    gdnkit.torch.decode (the parameters the torch ops take), built by
    make_function: the first six (q, k, v, a, b, state) positional, the rest
    keyword-only;
  - the schemas of torch.ops.gdnkit.decode / decode_packed / decode_conv
    (schema(op)), each op taking the parameters whose `ops` name it, in this order;
  - the keyword arguments of the extension's decode and decode_raw (ext_kwargs),
    whose values are the switches as the C++ enums number them.

This module imports nothing of gdnkit. Above it sit gdnkit._raw (the pointer path into
the extension), then gdnkit._api and gdnkit.torch, which import both and never each
other.
"""
from typing import Callable, NamedTuple, Tuple

# The switches, as the C++ enums number them (core/include/gdnkit/types.hpp).
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


def choice(name, value, table):
    """The number of a switch given by name (any case, or an alias) or by number."""
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


def dtype_name(dtype):
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


# ---- the parameters ----------------------------------------------------------------

DECODE, DECODE_PACKED, DECODE_CONV = "decode", "decode_packed", "decode_conv"
OPS = (DECODE, DECODE_PACKED, DECODE_CONV)


def _same(value):
    return value


def _switch(name, table):
    def normalize(value):
        return choice(name, value, table)

    return normalize


def _zero_if_none(cast):
    """None means 0 (the library's 'from the shapes': scale Dk**-0.5, Hk from the width)."""
    def normalize(value):
        return cast(0) if value is None else cast(value)

    return normalize


def _none_or(cast):
    def normalize(value):
        return None if value is None else cast(value)

    return normalize


class Param(NamedTuple):
    name: str
    default: object  # in the public signatures
    schema: str  # its type in the torch op schemas ("" when no op takes it)
    ops: Tuple[str, ...]  # the torch ops that take it
    required: bool  # an op argument without a default
    positional: bool  # positional (q, k, v, a, b, state) in the public signatures
    ext: bool  # an argument of the extension's decode / decode_raw
    array: bool  # an array (a tensor for the ops)
    normalize: Callable  # public value -> the value the ops and the extension take


def _p(name, default=None, schema="Tensor?", ops=OPS, *, required=False, positional=False,
       ext=True, array=None, normalize=_same):
    if array is None:
        array = schema.startswith("Tensor")
    return Param(name, default, schema, tuple(ops), required, positional, ext, array, normalize)


PARAMS = (
    # the inputs: q, k, v; or one packed row qkv; or the conv prologue's raw row x
    _p("q", schema="Tensor", ops=[DECODE], required=True, positional=True),
    _p("k", schema="Tensor", ops=[DECODE], required=True, positional=True),
    _p("v", schema="Tensor", ops=[DECODE], required=True, positional=True),
    _p("qkv", schema="Tensor", ops=[DECODE_PACKED], required=True),
    _p("x", schema="Tensor", ops=[DECODE_CONV], required=True),
    _p("a", schema="Tensor", required=True, positional=True),
    _p("b", schema="Tensor", required=True, positional=True),
    _p("A_log", required=True),
    _p("dt_bias", required=True),
    _p("state", schema="Tensor(a!)", required=True, positional=True),
    _p("conv_state", schema="Tensor(c!)", ops=[DECODE_CONV], required=True),
    _p("conv_weight", schema="Tensor", ops=[DECODE_CONV], required=True),
    _p("conv_bias", ops=[DECODE_CONV]),
    _p("state_indices"),
    _p("state_out_indices"),
    _p("invalid_index_count", schema="Tensor(b!)?"),
    # the switches
    _p("layout", "vk", "int", normalize=_switch("layout", LAYOUTS)),
    _p("gate", "raw", "int", normalize=_switch("gate", GATES)),
    _p("l2norm", "rsqrt", "int", normalize=_switch("l2norm", L2NORMS)),
    _p("l2norm_eps", 1e-6, "float", normalize=float),
    _p("scale", None, "float", normalize=_zero_if_none(float)),
    _p("head_map", "interleaved", "int", normalize=_switch("head_map", HEAD_MAPS)),
    _p("num_k_heads", None, "int", ops=[DECODE_PACKED, DECODE_CONV],
       normalize=_zero_if_none(int)),
    # the output: given (gdnkit.decode only), or allocated in out_dtype
    _p("out", schema="", ops=[], array=True),
    _p("out_dtype", schema="ScalarType?", ext=False),
    # the gated RMSNorm epilogue (on when norm_weight is given)
    _p("z"),
    _p("norm_weight"),
    _p("norm_eps", 1e-6, "float", normalize=float),
    # programmatic dependent launch (CUDA sm_90)
    _p("programmatic_launch", False, "bool", normalize=bool),
    # several tokens a row (speculative decoding; docs/operation.md, "Multi-token decode").
    # The ops' schemas end with these: programs exported before they existed still call
    # the ops by the published prefix, their defaults filling the rest.
    _p("num_tokens", None, "int", normalize=_zero_if_none(int)),
    _p("cu_seqlens"),
    _p("token_state_indices"),
    _p("num_accepted_tokens"),
    _p("intermediate_states", schema="Tensor(d!)?"),
    _p("intermediate_conv_states", schema="Tensor(e!)?", ops=[DECODE_CONV]),
    _p("update_state", True, "bool", normalize=bool),
    # the CUDA stream (gdnkit.decode only; the ops run on the current stream)
    _p("stream", schema="", ops=[], normalize=_none_or(int)),
)

BY_NAME = {p.name: p for p in PARAMS}
EXT_PARAMS = tuple(p for p in PARAMS if p.ext)
# The extension's arguments when a caller leaves them out (stream None: see gdnkit._raw).
EXT_DEFAULTS = {p.name: p.normalize(p.default) for p in EXT_PARAMS}
EXT_ARRAYS = tuple(p.name for p in EXT_PARAMS if p.array)
_EXT_NAMES = tuple(p.name for p in EXT_PARAMS)
TORCH_PARAMS = tuple(p for p in PARAMS if p.ops)  # gdnkit.torch.decode's


def op_params(op):
    """The parameters of torch.ops.gdnkit.<op>, in its schema's order."""
    return tuple(p for p in PARAMS if op in p.ops)


def _schema_default(value):
    return "None" if value is None else repr(value)  # 1e-06, 0.0, False, 1


def schema(op):
    """The torch schema of torch.ops.gdnkit.<op> (without the namespace)."""
    args = []
    for p in op_params(op):
        arg = f"{p.schema} {p.name}"
        if not p.required:
            arg += "=" + _schema_default(p.normalize(p.default))
        args.append(arg)
    return f"{op}({', '.join(args)}) -> Tensor"


# The parameters whose values normalize changes (the switches and numbers), by name.
_NORMALIZE = tuple((p.name, p.normalize) for p in PARAMS if p.normalize is not _same)


def normalized(values):
    """values (a dict of public arguments) with every switch and number in the form the
    ops and the extension take."""
    out = dict(values)
    for name, normalize in _NORMALIZE:
        if name in out:
            out[name] = normalize(out[name])
    return out


def ext_kwargs(values):
    """The extension's keyword arguments from a dict of public arguments (missing ones
    take their defaults; out_dtype and other non-extension entries are left out)."""
    kw = {name: values.get(name, EXT_DEFAULTS[name]) for name in _EXT_NAMES}
    for name, normalize in _NORMALIZE:
        if name in values:
            kw[name] = normalize(values[name])
    return kw


# ---- several tokens a row: the output's shape, from the shapes alone -------------------------

MAX_TOKENS = 16  # gdn::kMaxTokens: the most tokens a row may carry in one call


def resolve_num_tokens(a_shape, tokens, packed, token_state_indices_shape, intermediate_shape):
    """T, the tokens a row carries, as the extension resolves it (resolve_tokens in
    python/src/gdnkit_ext.cpp): `tokens` (num_tokens) when not 0, else a [B, T, Hv]
    whose B and T both differ from 1, else the second dimension of token_state_indices
    (B, T) or intermediate_states (B, T, ...), else, with cu_seqlens (`packed`), the
    packed tokens up to MAX_TOKENS, else 1. Shapes only, so a fake (meta) implementation
    gets the same answer."""
    if tokens:
        return int(tokens)
    lead = tuple(a_shape)[:-1]
    big = [d for d in lead if d != 1]
    if not packed and len(big) == 2:
        return big[1]
    if token_state_indices_shape is not None and len(token_state_indices_shape) == 2:
        return token_state_indices_shape[1]
    if intermediate_shape is not None and len(intermediate_shape) >= 3:
        return intermediate_shape[1]
    if packed:
        rows = 1
        for d in lead:
            rows = rows * d
        return max(1, min(rows, MAX_TOKENS))
    return 1


def out_shape(values, hv, dv):
    """(shape of the output, T) for a dict of arguments by name (a, num_tokens, cu_seqlens,
    token_state_indices, intermediate_states; arrays or anything with .shape): [B, T, Hv,
    Dv] for dense tokens (T > 1), [total_tokens, Hv, Dv] with cu_seqlens, [B, Hv, Dv]
    for one token a row."""
    a_shape = tuple(values["a"].shape)
    packed = values.get("cu_seqlens") is not None
    if (len(a_shape) == 2 and not packed and not values.get("num_tokens")
            and values.get("token_state_indices") is None
            and values.get("intermediate_states") is None):
        return (a_shape[0], hv, dv), 1  # one token a row, a [B, Hv]: most calls, kept cheap
    shape = lambda name: None if values.get(name) is None else tuple(values[name].shape)  # noqa: E731
    tokens = resolve_num_tokens(a_shape, BY_NAME["num_tokens"].normalize(values.get("num_tokens")),
                                packed, shape("token_state_indices"),
                                shape("intermediate_states"))
    rows = 1
    for d in a_shape[:-1]:
        rows = rows * d
    if packed or not 1 < tokens <= MAX_TOKENS:  # (out of range: the extension refuses it)
        return (rows, hv, dv), tokens
    if rows % tokens:
        # the extension's words for the same refusal
        raise ValueError(f"a: {rows} tokens are not B rows of num_tokens={tokens}")
    return (rows // tokens, tokens, hv, dv), tokens


# ---- functions with the parameters' signature ------------------------------------------

_REQUIRED = object()


def signature(params, *, op=False):
    """(name, default, keyword_only) for make_function: the public form (defaults as users
    see them, everything after the positional parameters keyword-only) or, with op=True,
    a torch op's (all positional, the schema's defaults, none for required arguments)."""
    if op:
        return [(p.name, _REQUIRED if p.required else p.normalize(p.default), False)
                for p in params]
    first = [p for p in params if p.positional]
    rest = [p for p in params if not p.positional]
    return [(p.name, p.default, False) for p in first] + [(p.name, p.default, True) for p in rest]


def make_function(name, args, body, *, doc=None, module=None):
    """A function `name` with the signature `args` (from signature()) that returns
    body(dict of its arguments by name).

    Generated like dataclasses' __init__: the signature is a real one (help(),
    inspect, the interpreter's own TypeError for a wrong argument), and the call costs
    one dict over a hand-written function."""
    namespace = {"_body": body}
    parts, keyword_only = [], False
    for i, (arg, default, kw_only) in enumerate(args):
        if kw_only and not keyword_only:
            parts.append("*")
            keyword_only = True
        if default is _REQUIRED:
            parts.append(arg)
        else:
            namespace[f"_default_{i}"] = default
            parts.append(f"{arg}=_default_{i}")
    values = ", ".join(f"{arg!r}: {arg}" for arg, _, _ in args)
    source = f"def {name}({', '.join(parts)}):\n    return _body({{{values}}})\n"
    exec(compile(source, f"<gdnkit: {name}>", "exec"), namespace)  # noqa: S102
    fn = namespace[name]
    fn.__doc__ = doc
    if module is not None:
        fn.__module__ = module
    return fn
