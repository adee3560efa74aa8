"""The pointer path into the extension, for torch tensors: each tensor goes to
gdnkit._gdnkit.decode_raw as (data_ptr, shape, strides, DLPack dtype code, bits, device
type, device id) rather than through DLPack (torch's __dlpack__ may synchronize
streams, which a CUDA graph capture cannot have, and costs a few microseconds per
tensor).

gdnkit.decode sends torch tensors here, and the torch ops (gdnkit.torch._ops) run
through it, so it sits below both: it imports torch (the framework) when it first
meets a tensor, and nothing of gdnkit but the extension and gdnkit._options.
"""
from . import _gdnkit
from ._options import EXT_ARRAYS, EXT_DEFAULTS

_torch = None  # (torch dtype -> DLPack (code, bits), CUDA's DLPack device type, raw stream getter)


def _torch_tables():
    global _torch
    if _torch is None:
        import torch

        codes = {
            torch.float32: (2, 32),
            torch.float16: (2, 16),
            torch.bfloat16: (4, 16),
            torch.float64: (2, 64),
            torch.int32: (0, 32),
            torch.int64: (0, 64),
        }
        for name, code in (("uint32", (1, 32)), ("uint16", (1, 16))):
            if hasattr(torch, name):
                codes[getattr(torch, name)] = code
        cuda_type = 10 if getattr(torch.version, "hip", None) else 2  # ROCm torch says "cuda"
        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw_stream is None:
            def raw_stream(index):
                return torch.cuda.current_stream(index).cuda_stream
        _torch = (codes, cuda_type, raw_stream)
    return _torch


def stream_of(device):
    """The current stream of a torch device (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    return _torch_tables()[2](device.index)


def describe(t, name):
    """(ptr, shape, strides, dlpack code, bits, device type, device id) of a tensor, or None."""
    if t is None:
        return None
    codes, cuda_type, _ = _torch_tables()
    code = codes.get(t.dtype)
    if code is None:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported")
    if t.is_cuda:
        return (t.data_ptr(), t.shape, t.stride(), code[0], code[1], cuda_type, t.get_device())
    if t.is_cpu:
        return (t.data_ptr(), t.shape, t.stride(), code[0], code[1], 1, 0)
    raise ValueError(f"{name}: tensors on {t.device} are not supported (cpu or cuda)")


def run_values(values):
    """Call the extension on tensors: `values` holds the extension's arguments by name
    (the switches as numbers; missing ones take their defaults; stream None: the current
    stream of the state's device). No allocation; the checks are the extension's and the
    library's."""
    kw = dict(EXT_DEFAULTS)
    kw.update(values)
    if kw["stream"] is None:
        kw["stream"] = stream_of(kw["state"].device)
    for name in EXT_ARRAYS:
        kw[name] = describe(kw[name], name)
    _gdnkit.decode_raw(**kw)


def run(**values):
    """run_values with keyword arguments: run(qkv=qkv, a=a, b=b, ..., state=state, out=out)."""
    run_values(values)
