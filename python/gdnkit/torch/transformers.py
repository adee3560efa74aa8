"""Hugging Face transformers: the GatedDeltaNet decode step of Qwen3-Next and Qwen3.5 through gdnkit.

    import gdnkit.torch
    patch = gdnkit.torch.patch_transformers(model)   # any nn.Module holding the layers
    model.generate(...)                               # every decode step: one gdnkit call a layer
    patch.unpatch()                                   # or: with gdnkit.torch.patch_transformers(model): ...

What is patched. Every GatedDeltaNet module of the model (classes Qwen3NextGatedDeltaNet,
Qwen3_5GatedDeltaNet, Qwen3_5MoeGatedDeltaNet, or subclasses) gets an instance-level
`forward` that wraps the one it had (the class's, or an instance-level one such as
accelerate's hook). Nothing of transformers is copied or modified: no class, module-level
function or cache is touched, other models in the process are unaffected, and
`unpatch()` restores the modules exactly.

On a single-token decode step (one token per sequence, the layer's conv and recurrent
states cached: exactly when the model's own forward takes its cached single-token branch),
the wrapper runs the module's own input projections (`in_proj_qkvz`/`in_proj_ba` with
`fix_query_key_value_ordering` for Qwen3-Next; `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
`in_proj_a` for Qwen3.5), then ONE gdnkit call (torch.ops.gdnkit.decode_conv) in place of

  - the causal conv1d update with SiLU (transformers' `causal_conv1d_update`: the
    causal-conv1d package's kernel or its torch fallback), on the cache's conv state,
  - the gates g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), the q/k l2norm
    and the grouped-head expansion,
  - the recurrent step (`torch_recurrent_gated_delta_rule`, or FLA's
    `fused_recurrent_gated_delta_rule` where transformers picks it), on the cache's
    recurrent state, in place,
  - the gated RMSNorm (`self.norm`: transformers' RMSNormGated, or FLA's FusedRMSNormGated),

then the module's own `out_proj`. Everything else (prefill and any multi-token forward,
no cache, packed sequences, past-state recording for assisted decoding, autograd,
mixed dtypes, devices gdnkit does not run on, more than 8 v-heads per k-head on a GPU)
runs the original forward unchanged. The counts on `patch.stats` say which path ran
(eager calls; inside torch.compile'd code nothing is counted, the profiler's kernel
names show it there).

Which transformers code the decode step replaces, by release (the conv/recurrent
functions are the ones the release's decode branch calls; read in the sources of 4.57.6,
5.0.0, 5.3.0, 5.6.2, 5.10.4, 5.14.1, 5.18.0, 5.22.2 and 5.25.0, and
python/tests/test_transformers_patch.py passes on each):

  4.57 - 5.3   `self.causal_conv1d_update`, `self.recurrent_gated_delta_rule`, `self.norm`
               (instance attributes set in __init__); cache `Qwen3NextDynamicCache` /
               `Qwen3_5DynamicCache` (`conv_states[i]`, `recurrent_states[i]`); decode when
               `cache_params.has_previous_state` and `cache_position` is given
  5.6 - 5.14   the same functions; cache `DynamicCache` with linear-attention layers
               (`layers[i].conv_states` / `recurrent_states`; `[0]` from 5.14);
               decode when `cache_params.has_previous_state(i)`
  5.18         module-level `causal_conv1d_update`, `torch_recurrent_gated_delta_rule`;
               not while the layer records past states (`record_past`)
  5.22         the same; cache read through `get_conv_state` / `get_recurrent_state`,
               `is_recording_past`
  5.25         `causal_conv1d_forward` (its single-token branch: `cache.increase_count`, done
               here too, and `causal_conv1d_update`), `torch_recurrent_gated_delta_rule`

Releases outside 4.57 - 5.25 get a warning at patch time: the fused path reads the cache
through the interfaces above and falls back where it finds none of them, but a release
that changed what its decode branch does to the cache would need checking again.

Numerics: the same math as transformers' torch path (l2norm x * rsqrt(sum x^2 + 1e-6),
scale Dk**-0.5, torch's softplus, interleaved heads, RMSNorm before the SiLU gate). gdnkit
keeps the conv output, beta and the step's output in float32 up to the norm (transformers
rounds each to the model's dtype), so with bf16 weights the results differ at bf16
rounding level; in float32 only by summation order. The conv cache is pure data movement
and comes back bitwise equal to the original's; the recurrent state stays in the cache's
dtype (float32, or the model's dtype in 5.6 - 5.10), updated in place.

torch.compile and CUDA graphs: the gdnkit op has a fake implementation and declares both
pools mutated, so a model patched before it is compiled (generate with a static cache,
or torch.compile(model)) traces the fused path; patch before compiling, since compiled
code does not see a later patch. Call patch_transformers after `kernelize` (hub kernels),
which replaces forwards too.
"""
import sys
import types
import warnings

import torch

from . import _ops

TESTED_RANGE = ((4, 57), (5, 25))  # the transformers releases checked (inclusive, major.minor)

# The GatedDeltaNet classes patched (by name, so that no modeling module is imported here).
CLASSES = ("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")

# Norm classes whose forward is weight * rmsnorm(x) * silu(gate): transformers' own and FLA's.
_HF_NORMS = ("Qwen3NextRMSNormGated", "Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated")
_FLA_NORMS = ("FusedRMSNormGated", "FusedRMSNormSwishGate")

# Keyword arguments of packed (varlen) sequences: those forwards are not single-token decode.
_PACKED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "seq_idx", "cu_seqlens")

_MAX_GROUP_GPU = 8  # v-heads per k-head the GPU backends run with the fused conv and norm


def _version_tuple(text):
    parts = []
    for piece in str(text).split(".")[:2]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (2 - len(parts)))


def _class_names(module):
    return {cls.__name__ for cls in type(module).__mro__}


def _modeling_module(module):
    """The modeling module of the module's transformers class (for apply_mask_to_padding_states
    and causal_conv1d_forward), or None."""
    for cls in type(module).__mro__:
        if cls.__name__ in CLASSES:
            return sys.modules.get(cls.__module__)
    return None


# ---- the per-family input projections (the module's own layers) ----------------------------

def _project_qwen3_next(m, h):
    B = h.shape[0]
    q, k, v, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(h), m.in_proj_ba(h))
    x = torch.cat((q.reshape(B, -1), k.reshape(B, -1), v.reshape(B, -1)), dim=-1)
    return x, z.reshape(B, m.num_v_heads, m.head_v_dim), a.reshape(B, -1), b.reshape(B, -1)


def _project_qwen3_5(m, h):
    B = h.shape[0]
    x = m.in_proj_qkv(h).reshape(B, -1)
    z = m.in_proj_z(h).reshape(B, m.num_v_heads, m.head_v_dim)
    return x, z, m.in_proj_a(h).reshape(B, -1), m.in_proj_b(h).reshape(B, -1)


def _projection(m):
    if all(hasattr(m, n) for n in ("in_proj_qkvz", "in_proj_ba", "fix_query_key_value_ordering")):
        return _project_qwen3_next
    if all(hasattr(m, n) for n in ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b")):
        return _project_qwen3_5
    return None


_LAYER_ATTRS = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel_size",
                "layer_idx", "activation", "conv1d", "A_log", "dt_bias", "norm", "out_proj")


def _norm_eps(norm):
    """eps of a gated RMSNorm computing weight * rmsnorm(x) * silu(gate), else None."""
    names = _class_names(norm)
    if names & set(_HF_NORMS):
        eps = getattr(norm, "variance_epsilon", None)
    elif names & set(_FLA_NORMS):
        if getattr(norm, "bias", None) is not None:
            return None
        eps = getattr(norm, "eps", None)
    else:
        return None
    if eps is None or getattr(norm, "weight", None) is None \
            or getattr(norm, "activation", "silu") not in ("silu", "swish"):
        return None
    return float(eps)


# ---- the cache: the states the original decode branch would use -----------------------------

def _decode_states(cache, idx, kwargs):
    """(conv_state, recurrent_state) when the module's original forward would take its
    cached single-token branch for layer `idx`, else a reason string. One interface per
    range of releases (see the module docstring), tried newest first."""
    if hasattr(cache, "get_conv_state") and hasattr(cache, "get_recurrent_state"):  # 5.22 -
        if cache.is_recording_past(idx):
            return "cache records past states"
        conv = cache.get_conv_state(idx, state_idx=0)
        rec = cache.get_recurrent_state(idx, state_idx=0)
    elif hasattr(cache, "layers") and callable(getattr(cache, "has_previous_state", None)):  # 5.6 - 5.18
        layer = cache.layers[idx]
        if getattr(layer, "record_past", False):
            return "cache records past states"
        if not cache.has_previous_state(idx):
            return "no cached state"
        conv, rec = layer.conv_states, layer.recurrent_states
        if isinstance(conv, dict):  # 5.14 -: several states a layer
            conv, rec = conv[0], rec[0]
    elif hasattr(cache, "conv_states") and hasattr(cache, "recurrent_states"):  # 4.57 - 5.3
        if not cache.has_previous_state or kwargs.get("cache_position") is None:
            return "no cached state"
        conv, rec = cache.conv_states[idx], cache.recurrent_states[idx]
    else:
        return "unknown cache"
    if conv is None or rec is None:
        return "no cached state"
    return conv, rec


# ---- the patched forward --------------------------------------------------------------------

class _Layer:
    """What the patched forward of one module needs (kept on the module, so a deep copy of
    the model copies it along with the module it is bound to)."""

    def __init__(self, forward, had_forward, project, mask_fn, counts_step, norm_eps, stats,
                 gpu_ok):
        self.forward = forward  # the forward wrapped: a bound method (the class's or the instance's)
        self.had_forward = had_forward  # the instance-level forward replaced, or None
        self.project = project
        self.mask_fn = mask_fn
        self.counts_step = counts_step  # 5.25 -: the decode branch calls cache.increase_count
        self.norm_eps = norm_eps
        self.stats = stats
        self.gpu_ok = gpu_ok


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _count(stats, key):
    # Eager calls only: a counter that torch.compile traced would be a guard on its value
    # (a recompilation every call).
    if stats is not None and not _is_compiling():
        stats[key] = stats.get(key, 0) + 1


def _fused_decode(m, layer, args, kwargs):
    """The layer's output through gdnkit, or a reason string to run the original forward."""
    if args:
        h, rest = args[0], args[1:]
        if rest:
            return "positional arguments"
    else:
        h = kwargs.get("hidden_states")
    if h is None or h.dim() != 3:
        return "no hidden_states"
    if h.shape[1] != 1:
        return "prefill"
    cache = kwargs.get("cache", kwargs.get("cache_params"))
    if cache is None:
        return "no cache"
    for name in _PACKED_KWARGS:
        if kwargs.get(name) is not None:
            return "packed sequences"
    if torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in m.parameters())):
        return "autograd"  # the gdnkit op has no backward
    device = h.device.type
    if device == "cuda":
        if not layer.gpu_ok:
            return "gdnkit built without CUDA"
        if m.num_v_heads // m.num_k_heads > _MAX_GROUP_GPU:
            return "more than 8 v-heads per k-head on a GPU"
    elif device != "cpu":
        return f"device {device}"
    states = _decode_states(cache, m.layer_idx, kwargs)
    if isinstance(states, str):
        return states
    conv, rec = states
    B = h.shape[0]
    W = m.conv_kernel_size
    weight = m.conv1d.weight
    norm_weight = m.norm.weight
    dtype = weight.dtype
    if (conv.dtype != dtype or norm_weight.dtype != dtype
            or (m.conv1d.bias is not None and m.conv1d.bias.dtype != dtype)):
        return "mixed dtypes"
    if rec.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return "state dtype"
    C = weight.shape[0]
    # The conv cache is [B, C, W], channel-major (a channel's taps contiguous) or, before
    # 5.14, tap-major (the transposed view of a [B, W, C] buffer); gdnkit reads either.
    channel_major = conv.stride(2) == 1 and conv.stride(1) >= W
    tap_major = conv.stride(1) == 1 and conv.stride(2) >= C
    if (tuple(conv.shape) != (B, C, W) or not (channel_major or tap_major)
            or conv.stride(0) < C * W
            or tuple(rec.shape) != (B, m.num_v_heads, m.head_k_dim, m.head_v_dim)
            or not rec.is_contiguous()):
        return "cache layout"
    if conv.device != h.device or rec.device != h.device or weight.device != h.device:
        return "devices"

    if layer.mask_fn is not None:
        h = layer.mask_fn(h, kwargs.get("attention_mask"))
    x, z, a, b = layer.project(m, h)
    if x.dtype != dtype or z.dtype != dtype:
        return "mixed dtypes"  # e.g. autocast (rare: the projections were spent)
    # The cache keeps W taps, the step reads the last W - 1: shift tap 1 into tap 0 as the
    # original update does (bitwise the same cache), and let gdnkit shift the rest and x in.
    conv[:, :, 0].copy_(conv[:, :, 1])
    o = _ops.decode_conv(
        x, a, b, m.A_log.float(), m.dt_bias.float(), rec, conv[:, :, 1:], weight, m.conv1d.bias,
        layout=_ops.KV, gate=_ops.RAW, l2norm=_ops.RSQRT, head_map=_ops.INTERLEAVED,
        num_k_heads=m.num_k_heads, z=z, norm_weight=norm_weight, norm_eps=layer.norm_eps)
    if layer.counts_step:
        cache.increase_count(m.layer_idx, 0)
    return m.out_proj(o.reshape(B, 1, -1))


def _patched_forward(self, *args, **kwargs):
    layer = self._gdnkit_layer
    out = _fused_decode(self, layer, args, kwargs)
    if isinstance(out, str):
        _count(layer.stats, out)
        return layer.forward(*args, **kwargs)
    _count(layer.stats, "gdnkit")
    return out


# ---- the public entry ------------------------------------------------------------------------

class TransformersPatch:
    """What patch_transformers did: `modules` (the patched GatedDeltaNet modules), `stats`
    (eager calls by path: "gdnkit" for decode steps run by gdnkit, else the reason the
    original forward ran, e.g. "prefill"; calls inside torch.compile'd code are not
    counted), unpatch(), and use as a context manager."""

    def __init__(self, modules, stats):
        self.modules = modules
        self.stats = stats

    @property
    def gdnkit_calls(self):
        return self.stats.get("gdnkit", 0) if self.stats is not None else 0

    def unpatch(self):
        """Restore every patched module's forward (idempotent)."""
        for m in self.modules:
            layer = m.__dict__.get("_gdnkit_layer")
            if layer is None:
                continue
            if layer.had_forward is not None:
                m.forward = layer.had_forward
            else:
                m.__dict__.pop("forward", None)
            del m.__dict__["_gdnkit_layer"]
        self.modules = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unpatch()
        return False

    def __repr__(self):
        return f"TransformersPatch({len(self.modules)} modules, stats={self.stats})"


def patch_transformers(model, *, count=True):
    """Run the single-token decode steps of every Qwen3-Next / Qwen3.5 GatedDeltaNet module
    in `model` through gdnkit (conv1d update + gates + recurrent step + gated RMSNorm in one
    call); see the module docstring for what is replaced and when the original runs.

    count: keep per-path call counts in the returned patch's `stats` (a dict).
    Returns a TransformersPatch (unpatch(), context manager). Raises ValueError when the
    model holds no such module, RuntimeError for a module patched already."""
    import gdnkit

    try:
        import transformers
        version = _version_tuple(transformers.__version__)
    except ImportError:  # modules built without transformers installed
        version = None
    if version is not None and not TESTED_RANGE[0] <= version <= TESTED_RANGE[1]:
        warnings.warn(
            f"gdnkit.torch.patch_transformers: transformers {transformers.__version__} is outside "
            f"the releases checked ({'.'.join(map(str, TESTED_RANGE[0]))} to "
            f"{'.'.join(map(str, TESTED_RANGE[1]))}); compare a patched and an unpatched run",
            stacklevel=2)
    gpu_ok = bool(gdnkit.backend_available("cuda")[0])
    stats = {} if count else None
    found, skipped = [], []
    for m in model.modules():
        if not _class_names(m) & set(CLASSES):
            continue
        if "_gdnkit_layer" in m.__dict__:
            raise RuntimeError(f"{type(m).__name__} (layer {getattr(m, 'layer_idx', '?')}) is "
                               f"patched already")
        project = _projection(m)
        norm_eps = _norm_eps(m.norm) if hasattr(m, "norm") else None
        if (project is None or norm_eps is None or not all(hasattr(m, n) for n in _LAYER_ATTRS)
                or m.activation not in ("silu", "swish") or m.conv_kernel_size not in (2, 3, 4)):
            skipped.append(f"{type(m).__name__} (layer {getattr(m, 'layer_idx', '?')})")
            continue
        found.append((m, project, norm_eps))
    if not found:
        extra = f" (unsupported structure: {', '.join(skipped)})" if skipped else ""
        raise ValueError(f"patch_transformers: no Qwen3-Next / Qwen3.5 GatedDeltaNet module "
                         f"in the model{extra}")
    if skipped:
        warnings.warn(f"gdnkit.torch.patch_transformers: left unpatched (unsupported structure): "
                      f"{', '.join(skipped)}", stacklevel=2)
    for m, project, norm_eps in found:
        modeling = _modeling_module(m)
        mask_fn = getattr(modeling, "apply_mask_to_padding_states", None)
        counts_step = hasattr(modeling, "causal_conv1d_forward")
        had = m.__dict__.get("forward")
        forward = had if had is not None else types.MethodType(type(m).forward, m)
        m._gdnkit_layer = _Layer(forward, had, project, mask_fn, counts_step, norm_eps, stats,
                                 gpu_ok)
        m.forward = types.MethodType(_patched_forward, m)
    return TransformersPatch([m for m, _, _ in found], stats)


def unpatch_transformers(model):
    """Undo patch_transformers on every module of `model` (without the patch object)."""
    TransformersPatch([m for m in model.modules() if "_gdnkit_layer" in m.__dict__], None).unpatch()


__all__ = ["patch_transformers", "unpatch_transformers", "TransformersPatch", "CLASSES",
           "TESTED_RANGE"]
