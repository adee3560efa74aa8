"""bench/peers.py's correctness guard: its self-test runs the floors' copy kernels, gdnkit
(checked against float64) and the Triton peer kernel written there (vLLM's and SGLang's
fused_sigmoid_gating_delta_rule_update semantics; and FLA's fused_recurrent when `fla` imports)
at one and four tokens, both layouts and state dtypes, and exits 1 on any disagreement. Without a
GPU it runs at small heads through Triton's interpreter; with one, compiled on the GPU at the
benchmark's shape (the interpreter is for CPU tensors). A peer kernel or floor that computes the
wrong thing cannot post a time on the GPU, and this keeps that guard honest where no GPU is."""
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

PEERS = pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers.py"


def test_peers_self_test():
    import torch

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    # the package under test, as this interpreter imports it
    import gdnkit

    pkg_root = str(pathlib.Path(gdnkit.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, str(PEERS), "--self-test"], env=env, capture_output=True,
                       text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "self-test: all checks ok" in out, out[-4000:]
    assert "CHECK FAILED" not in out
    # every implementation the self-test knows was checked, in both state dtypes
    for name in ("gdnkit kv final", "gdnkit vk inter", "peer triton kv inter", "peer triton vk inter"):
        assert out.count(f"check ok: {name}") >= 2, (name, out[-4000:])
