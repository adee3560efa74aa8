"""gdnkit: the fused GatedDeltaNet decode step (one token per sequence, or several for
speculative decoding, in one call).

    import gdnkit
    out = gdnkit.decode(q, k, v, a, b, state, A_log=A_log, dt_bias=dt_bias)

`gdnkit.decode` takes numpy, PyTorch, CuPy or any other DLPack-capable arrays:
CPU arrays run on the host backend, CUDA arrays on the CUDA backend. The state
pool is updated in place. Bad arguments raise ValueError with the library's
message, before anything is written.

PyTorch: `import gdnkit.torch` registers the custom ops `torch.ops.gdnkit.*`
(eager, torch.compile, torch.export, CUDA graphs) and the drop-in wrappers for
ExecuTorch, vLLM, SGLang and FLA call sites (see gdnkit.torch).
"""
import ctypes as _ctypes
import glob as _glob
import os as _os


def _preload_bundled_libraries():
    # Shared libraries shipped inside the package (GDNKIT_PYTHON_BUNDLE, e.g. Kokkos
    # on a machine without it): loading them first satisfies libgdnkit's needs.
    here = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_libs")
    for path in sorted(_glob.glob(_os.path.join(here, "*.so*"))):
        _ctypes.CDLL(path, mode=_ctypes.RTLD_GLOBAL)


_preload_bundled_libraries()

from . import _gdnkit  # noqa: E402
from ._api import backend_available, backend_built, decode, info  # noqa: E402
from ._options import GATES, HEAD_MAPS, L2NORMS, LAYOUTS  # noqa: E402

__version__ = _gdnkit.version()

__all__ = [
    "decode",
    "info",
    "backend_built",
    "backend_available",
    "LAYOUTS",
    "GATES",
    "L2NORMS",
    "HEAD_MAPS",
    "__version__",
]
