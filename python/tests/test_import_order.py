"""numpy and torch imported before gdnkit, then the host backend's first use (its Kokkos
start-up) and a step on CPU arrays, each in a fresh interpreter (inside pytest numpy is
already loaded, so only a new process tests the order). libgdnkit exports only its API:
the test also reads its dynamic symbol table, because an exported instantiation of a
Kokkos or C++-library template is what bound Kokkos' own code to this library's copies and
crashed it when the two were built by different compilers."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gdnkit

PACKAGE = Path(gdnkit.__file__).resolve().parent

STEP = """
import numpy as np, gdnkit
rng = np.random.default_rng(7)
B, Hk, Hv, K, V = 3, 2, 4, 64, 64
q = rng.standard_normal((B, Hk, K)).astype(np.float32)
k = rng.standard_normal((B, Hk, K)).astype(np.float32)
v = rng.standard_normal((B, Hv, V)).astype(np.float32)
a = rng.standard_normal((B, Hv)).astype(np.float32)
b = rng.standard_normal((B, Hv)).astype(np.float32)
state = (rng.standard_normal((B, Hv, V, K)) * 0.1).astype(np.float32)
before = state.copy()
o = gdnkit.decode(q, k, v, a, b, state, A_log=np.full(Hv, -0.5, np.float32),
                  dt_bias=np.zeros(Hv, np.float32))
assert np.isfinite(o).all() and np.abs(o).max() > 0, "no output"
assert not np.array_equal(state, before), "state not updated"
print("host:", gdnkit.info()["backends"]["host"]["devices"])
"""


def run_fresh(prelude):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent)] + sys.path)
    return subprocess.run([sys.executable, "-c", prelude + STEP], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("prelude", ["", "import numpy\n", "import numpy, torch\n",
                                     "import torch, numpy\n"],
                         ids=["gdnkit-first", "numpy-first", "numpy-torch-first",
                              "torch-numpy-first"])
def test_host_backend_after_other_imports(prelude):
    if "torch" in prelude:
        pytest.importorskip("torch")
    r = run_fresh(prelude)
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr[-3000:]}"
    assert "host: Kokkos" in r.stdout


def test_library_exports_only_its_api():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm on this machine")
    libs = sorted(PACKAGE.glob("libgdnkit.so*"))
    if not libs:
        pytest.skip("libgdnkit is not inside the package (a build-tree install)")
    out = subprocess.run([nm, "-D", "--defined-only", "-C", str(libs[0])], capture_output=True,
                         text=True, check=True).stdout
    foreign = [line for line in out.splitlines()
               if line.split(" ", 2)[-1].split("(")[0].strip()
               and not line.split(" ", 2)[-1].startswith(("gdn::", "gdn_"))]
    assert not foreign, "libgdnkit exports more than its API:\n" + "\n".join(foreign[:20])
