"""The Python package's structure: gdnkit.decode's published signature, the extension's
argument names, and the modules' import graph (gdnkit._api and gdnkit.torch never import
each other)."""
import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gdnkit
from gdnkit import _options

PACKAGE = Path(gdnkit.__file__).resolve().parent

# gdnkit.decode's parameters as published: (default, positional).
PUBLISHED = {
    "q": (None, True), "k": (None, True), "v": (None, True), "a": (None, True),
    "b": (None, True), "state": (None, True),
    "qkv": (None, False), "A_log": (None, False), "dt_bias": (None, False),
    "out": (None, False), "out_dtype": (None, False), "state_indices": (None, False),
    "state_out_indices": (None, False), "invalid_index_count": (None, False),
    "layout": ("vk", False), "gate": ("raw", False), "l2norm": ("rsqrt", False),
    "l2norm_eps": (1e-6, False), "scale": (None, False), "head_map": ("interleaved", False),
    "num_k_heads": (None, False), "x": (None, False), "conv_state": (None, False),
    "conv_weight": (None, False), "conv_bias": (None, False), "z": (None, False),
    "norm_weight": (None, False), "norm_eps": (1e-6, False),
    "programmatic_launch": (False, False), "stream": (None, False),
    # several tokens a row
    "num_tokens": (None, False), "cu_seqlens": (None, False),
    "token_state_indices": (None, False), "num_accepted_tokens": (None, False),
    "intermediate_states": (None, False), "intermediate_conv_states": (None, False),
    "update_state": (True, False),
}


def test_decode_signature():
    params = inspect.signature(gdnkit.decode).parameters
    assert list(params)[:6] == ["q", "k", "v", "a", "b", "state"]
    seen = {}
    for name, p in params.items():
        assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), name
        seen[name] = (p.default, p.kind == p.POSITIONAL_OR_KEYWORD)
    assert seen == PUBLISHED
    assert gdnkit.decode.__doc__.startswith("One GatedDeltaNet decode step")
    with pytest.raises(TypeError, match=r"takes from 0 to 6 positional arguments but 7"):
        gdnkit.decode(None, None, None, None, None, None, None)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'layuot'"):
        gdnkit.decode(layuot="kv")


def test_extension_takes_the_parameters_by_name():
    """Every extension argument of the table is a parameter of both entry points."""
    for fn in (gdnkit._gdnkit.decode, gdnkit._gdnkit.decode_raw):
        text = str(getattr(fn, "__nb_signature__", None) or fn.__doc__)
        for p in _options.EXT_PARAMS:
            assert re.search(rf"\b{p.name}\b", text), (fn.__name__, p.name)
    assert "out_dtype" not in {p.name for p in _options.EXT_PARAMS}


def test_api_does_not_import_gdnkit_torch():
    code = ("import sys, gdnkit._api, gdnkit._raw, gdnkit._options; "
            "assert 'gdnkit.torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def imports(path, package):
    """The absolute names of every module an import statement in `path` names (at the top
    or inside a function), `package` being the file's package."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_no_import_between_api_and_torch_package():
    """A static check: gdnkit._api imports no gdnkit.torch module and gdnkit/torch never
    imports gdnkit._api; the shared layer (_options, _raw) imports neither side."""
    api = imports(PACKAGE / "_api.py", "gdnkit")
    assert not {n for n in api if n.startswith("gdnkit.torch")}, api
    assert "import_module" not in (PACKAGE / "_api.py").read_text()
    for path in sorted((PACKAGE / "torch").glob("*.py")):
        assert "gdnkit._api" not in imports(path, "gdnkit.torch"), path.name
    gdnkit_modules = {n for n in imports(PACKAGE / "_options.py", "gdnkit") if "gdnkit" in n}
    assert not gdnkit_modules, gdnkit_modules
    raw = {n.split(".")[1] for n in imports(PACKAGE / "_raw.py", "gdnkit")
           if n.startswith("gdnkit.")}
    assert raw <= {"_gdnkit", "_options"}, raw


def test_switch_tables():
    assert gdnkit.LAYOUTS is _options.LAYOUTS and gdnkit.GATES is _options.GATES
    assert _options.choice("l2norm", "F_Normalize", gdnkit.L2NORMS) == gdnkit.L2NORMS["max_norm"]
    assert _options.choice("head_map", 1, gdnkit.HEAD_MAPS) == 1
    with pytest.raises(ValueError, match=r"^gate: unknown value 'rwa' \(one of: raw, precomputed\)$"):
        _options.choice("gate", "rwa", gdnkit.GATES)
