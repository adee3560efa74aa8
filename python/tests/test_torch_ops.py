"""torch.ops.gdnkit.decode / decode_packed / decode_conv and gdnkit.torch.decode, against
the plain PyTorch reference of torch_cases.py.

Runs on CPU tensors wherever torch imports, and on CUDA tensors too when a GPU is
present (CUDA graph capture and replay, torch.compile with Inductor, torch.export,
AOTInductor). Skips cleanly without torch. test_torch_dropins.py has the drop-in
wrappers.
"""
import os
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import gdnkit  # noqa: E402
import gdnkit.torch as gt  # noqa: E402
from torch_cases import (DEVICES, HAS_CUDA, TOL_OUT, TOL_STATE, assert_close,  # noqa: E402
                         assert_same, cuda_only, inputs, packed, reference, to_kv)


# ---- torch.ops.gdnkit.decode / decode_packed ---------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_op(device, layout, state_dtype, dtype):
    t = inputs(device, dtype=dtype, state_dtype=state_dtype, layout=layout, Dk=64, Dv=128,
               seed=sum(map(ord, f"{dtype}{state_dtype}{layout}")))
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                             to_kv(t["state"], layout))
    state = t["state"].clone()
    o = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"], layout=layout)
    assert o.dtype == dtype and o.device.type == device and o.shape == (2, 4, 128)
    assert_close(o, o_ref, TOL_OUT[dtype], "output")
    assert_close(to_kv(state, layout), s_ref, TOL_STATE[state_dtype], "state")


@pytest.mark.parametrize("device", DEVICES)
def test_decode_packed_op_options(device):
    """Packed row, tiled heads, max_norm, custom scale, fp32 output from bf16 inputs."""
    t = inputs(device, dtype=torch.bfloat16, state_dtype=torch.bfloat16, layout="kv", B=3, seed=5)
    qkv = torch.cat([t["q"].flatten(1), t["k"].flatten(1), t["v"].flatten(1)], 1)
    state = t["state"].clone()
    o = gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=state, A_log=t["A_log"], dt_bias=t["dt_bias"],
                  layout="kv", head_map="tiled", l2norm="max_norm", scale=0.25,
                  out_dtype=torch.float32)
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                             t["state"], head_map="tiled", l2="max_norm", scale=0.25)
    assert o.dtype == torch.float32
    assert_close(o, o_ref, TOL_OUT[torch.float32] * 100, "output (bf16 inputs, fp32 output)")
    assert_close(state, s_ref, TOL_STATE[torch.bfloat16], "state")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_decode_indices_padding_counter(device, index_dtype):
    t = inputs(device, B=4, slots=7, layout="vk", seed=6, gate="precomputed")
    idx = torch.tensor([5, -1, 0, 7], dtype=index_dtype, device=device)  # 7 == num_slots: counted
    out_idx = torch.tensor([2, 3, -1, 1], dtype=index_dtype, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    state = t["state"].clone()
    o = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], state, gate="precomputed",
                  state_indices=idx, state_out_indices=out_idx, invalid_index_count=counter,
                  layout="vk")
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], None, None,
                             to_kv(t["state"], "vk"), idx, out_idx, gate="precomputed")
    assert_close(o, o_ref, 1e-5, "output")
    assert torch.equal(o[1].cpu(), torch.zeros_like(o[1].cpu())) and not o[3].any()
    assert_close(to_kv(state, "vk"), s_ref, 1e-5, "state")
    for slot in (0, 1, 3, 4, 5, 6):  # not written by any row
        assert torch.equal(state[slot], t["state"][slot])
    assert int(counter.item()) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_validation_error_writes_nothing(device):
    t = inputs(device, layout="vk")
    state = t["state"].clone()
    v = torch.zeros(2, 4, 100, device=device)[:, :, :64]  # fine
    bad_v = torch.as_strided(torch.zeros(2 * 4 * 64, device=device), (2, 4, 64), (256, 48, 1))
    with pytest.raises(ValueError, match=r"^v: head stride 48 is smaller than Dv=64$"):
        gt.decode(t["q"], t["k"], bad_v, t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"])
    with pytest.raises(ValueError, match=r"^dt_bias: dtype must be float32, got float64$"):
        gt.decode(t["q"], t["k"], v, t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"].double())
    assert torch.equal(state, t["state"])


@cuda_only
def test_mixed_devices_refused():
    t = inputs("cuda", layout="vk")
    with pytest.raises(ValueError, match=r"^q: on cpu, but state is on cuda:0"):
        gt.decode(t["q"].cpu(), t["k"], t["v"], t["a"], t["b"], t["state"], A_log=t["A_log"],
                  dt_bias=t["dt_bias"])


def test_generic_decode_accepts_torch():
    """gdnkit.decode (the DLPack path) on CPU tensors gives the same as the op."""
    t = inputs("cpu", layout="kv", seed=9)
    s1, s2 = t["state"].clone(), t["state"].clone()
    o1 = gdnkit.decode(t["q"], t["k"], t["v"], t["a"], t["b"], s1, A_log=t["A_log"],
                       dt_bias=t["dt_bias"], layout="kv")
    o2 = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], s2, A_log=t["A_log"],
                   dt_bias=t["dt_bias"], layout="kv")
    assert isinstance(o1, torch.Tensor)
    assert_same(o1, o2)
    assert_same(s1, s2)
    # The extension's DLPack entry point itself, on the same tensors.
    s3, o3 = t["state"].clone(), torch.empty_like(o1)
    gdnkit._gdnkit.decode(t["q"], t["k"], t["v"], None, t["a"], t["b"], t["A_log"], t["dt_bias"],
                          s3, o3, None, None, None, gdnkit.LAYOUTS["kv"], 0, 0, 1e-6, 0.0, 0, 0, 0)
    assert_same(o3, o1)
    assert_same(s3, s1)


# The ops' schemas as they were first published: programs exported with torch.export and
# AOTInductor packages call the ops by these, so they must not change. Arguments added
# since come after them, each with a default (MULTI_TOKEN_ARGS), so such a program's call
# still binds.
_OPTIONS = ("int layout=1, int gate=0, int l2norm=0, float l2norm_eps=1e-06, float scale=0., "
            "int head_map=0")
_FUSED = ("Tensor? z=None, Tensor? norm_weight=None, float norm_eps=1e-06, "
          "bool programmatic_launch=False")
_INDICES = ("Tensor? state_indices=None, Tensor? state_out_indices=None, "
            "Tensor(b!)? invalid_index_count=None, ")
PUBLISHED_SCHEMAS = {
    "decode": "decode(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor? A_log, "
              "Tensor? dt_bias, Tensor(a!) state, " + _INDICES + _OPTIONS
              + ", ScalarType? out_dtype=None, " + _FUSED + ") -> Tensor",
    "decode_packed": "decode_packed(Tensor qkv, Tensor a, Tensor b, Tensor? A_log, Tensor? dt_bias, "
                     "Tensor(a!) state, " + _INDICES + _OPTIONS + ", int num_k_heads=0, "
                     "ScalarType? out_dtype=None, " + _FUSED + ") -> Tensor",
    "decode_conv": "decode_conv(Tensor x, Tensor a, Tensor b, Tensor? A_log, Tensor? dt_bias, "
                   "Tensor(a!) state, Tensor(c!) conv_state, Tensor conv_weight, "
                   "Tensor? conv_bias=None, " + _INDICES + _OPTIONS + ", int num_k_heads=0, "
                   "ScalarType? out_dtype=None, " + _FUSED + ") -> Tensor",
    "fused_deltanet_decode": "fused_deltanet_decode(Tensor qkv, Tensor alpha, Tensor beta_raw, "
                             "Tensor A_log, Tensor dt_bias, Tensor state) -> (Tensor, Tensor)",
    "fused_deltanet_decode_": "fused_deltanet_decode_(Tensor qkv, Tensor alpha, Tensor beta_raw, "
                              "Tensor A_log, Tensor dt_bias, Tensor(a!) state) -> Tensor",
}
_TOKENS = ("int num_tokens=0, Tensor? cu_seqlens=None, Tensor? token_state_indices=None, "
           "Tensor? num_accepted_tokens=None, Tensor(d!)? intermediate_states=None")
MULTI_TOKEN_ARGS = {
    "decode": _TOKENS + ", bool update_state=True",
    "decode_packed": _TOKENS + ", bool update_state=True",
    "decode_conv": _TOKENS + ", Tensor(e!)? intermediate_conv_states=None, bool update_state=True",
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_SCHEMAS))
def test_op_schemas_unchanged(name):
    """The schemas generated from gdnkit._options.PARAMS are the published ones, followed
    by the multi-token arguments, each with a default."""
    text = PUBLISHED_SCHEMAS[name]
    if name in MULTI_TOKEN_ARGS:
        text = text.replace(") -> Tensor", ", " + MULTI_TOKEN_ARGS[name] + ") -> Tensor")
    expected = torch._C.parse_schema("gdnkit::" + text)
    assert str(getattr(torch.ops.gdnkit, name).default._schema) == str(expected)
    # torch's own rule: a call written against the published schema binds to ours
    published = torch._C.parse_schema("gdnkit::" + PUBLISHED_SCHEMAS[name])
    assert getattr(torch.ops.gdnkit, name).default._schema.is_backward_compatible_with(published)


def test_torch_decode_signature():
    """gdnkit.torch.decode takes gdnkit.decode's parameters, less out and stream."""
    import inspect

    ours = inspect.signature(gt.decode).parameters
    generic = dict(inspect.signature(gdnkit.decode).parameters)
    del generic["out"], generic["stream"]
    assert ours == generic
    with pytest.raises(TypeError, match="unexpected keyword argument 'out'"):
        gt.decode(out=None)


# ---- the middle of a layer: conv1d prologue and gated RMSNorm ----------------------------

def middle_inputs(device, *, W=4, tap_major=False, **kw):
    """inputs() plus the raw row x, a conv pool (channel-major, or a tap-major buffer seen
    through its transposed view, as vLLM keeps it), conv weight/bias, z and norm_weight."""
    t = inputs(device, **kw)
    gen = torch.Generator().manual_seed(kw.get("seed", 0) + 7919)
    B, Hk, Dk = t["q"].shape
    Hv, Dv = t["v"].shape[1], t["v"].shape[2]
    S, dt = t["state"].shape[0], t["q"].dtype
    cdim = 2 * Hk * Dk + Hv * Dv
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t["x"] = r(B, cdim).to(dt)
    if tap_major:
        t["conv_state"] = r(S, W - 1, cdim).to(dt).transpose(1, 2)
    else:
        t["conv_state"] = r(S, cdim, W - 1).to(dt)
    t["conv_weight"] = (0.5 * r(cdim, 1, W)).to(dt)  # nn.Conv1d's depthwise weight shape
    t["conv_bias"] = (0.1 * r(cdim)).to(dt)
    t["z"] = r(B, Hv, Dv).to(dt)
    t["norm_weight"] = torch.empty(Dv).uniform_(0.5, 1.5, generator=gen).to(dt)
    return {n: x.to(device) for n, x in t.items()}


def middle_reference(t, layout, *, eps=1e-6):
    """conv1d (float64, y never rounded) -> the step reference -> gated RMSNorm.
    Returns (o, new pool as kv, new conv pool)."""
    x, cs = t["x"].double().cpu(), t["conv_state"].double().cpu()
    w, bias = t["conv_weight"].double().cpu().flatten(1), t["conv_bias"].double().cpu()
    B, Hk, Dk = t["q"].shape
    Hv, Dv = t["v"].shape[1], t["v"].shape[2]
    window = torch.cat([cs[:B], x[:, :, None]], dim=2)  # rows b read slot b
    y = F.silu((window * w).sum(-1) + bias)
    q = y[:, : Hk * Dk].reshape(B, Hk, Dk)
    k = y[:, Hk * Dk: 2 * Hk * Dk].reshape(B, Hk, Dk)
    v = y[:, 2 * Hk * Dk:].reshape(B, Hv, Dv)
    o, pool = reference(q, k, v, t["a"], t["b"], t["A_log"], t["dt_bias"], to_kv(t["state"], layout))
    z, nw = t["z"].double().cpu(), t["norm_weight"].double().cpu()
    o = nw * o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * F.silu(z)
    new_cs = cs.clone()
    new_cs[:B] = window[:, :, 1:]
    return o, pool, new_cs


def middle_kwargs(t, state, conv_state, layout):
    return dict(x=t["x"], a=t["a"], b=t["b"], state=state, A_log=t["A_log"], dt_bias=t["dt_bias"],
                conv_state=conv_state, conv_weight=t["conv_weight"], conv_bias=t["conv_bias"],
                z=t["z"], norm_weight=t["norm_weight"], layout=layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_middle_op(device, layout, dtype):
    """gdnkit::decode_conv with the norm: conv1d + step + gated RMSNorm in one call."""
    t = middle_inputs(device, dtype=dtype, state_dtype=torch.float32, layout=layout, Hk=2, Hv=4,
                      Dk=64, Dv=128, W=4, tap_major=layout == "vk",
                      seed=sum(map(ord, f"{dtype}{layout}")))
    o_ref, s_ref, cs_ref = middle_reference(t, layout)
    state, conv_state = t["state"].clone(), t["conv_state"].clone()  # clone keeps the strides
    assert (conv_state.stride(1) == 1) == (layout == "vk")
    o = gt.decode(**middle_kwargs(t, state, conv_state, layout))
    assert o.dtype == dtype and o.device.type == device and o.shape == (2, 4, 128)
    assert_close(o, o_ref, TOL_OUT[dtype], "output")
    assert_close(to_kv(state, layout), s_ref, TOL_STATE[torch.float32], "state")
    assert torch.equal(conv_state.double().cpu(), cs_ref), "the conv pool only moves values"


@pytest.mark.parametrize("device", DEVICES)
def test_norm_epilogue_ops(device):
    """z / norm_weight on decode and decode_packed (no conv): the same bits either way."""
    t = middle_inputs(device, dtype=torch.bfloat16, state_dtype=torch.bfloat16, layout="kv", seed=9)
    s1, s2 = t["state"].clone(), t["state"].clone()
    kw = dict(a=t["a"], b=t["b"], A_log=t["A_log"], dt_bias=t["dt_bias"], layout="kv",
              z=t["z"], norm_weight=t["norm_weight"], norm_eps=1e-5)
    o1 = gt.decode(t["q"], t["k"], t["v"], state=s1, **kw)
    o2 = gt.decode(qkv=packed(t), state=s2, **kw)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    o_ref, s_ref = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                             t["state"])
    z, nw = t["z"].double().cpu(), t["norm_weight"].double().cpu()
    o_ref = nw * o_ref * torch.rsqrt((o_ref * o_ref).mean(-1, keepdim=True) + 1e-5) * F.silu(z)
    assert_close(o1, o_ref, TOL_OUT[torch.bfloat16], "output")
    assert_close(s1, s_ref, TOL_STATE[torch.bfloat16], "state")


@pytest.mark.parametrize("device", DEVICES)
def test_middle_refused(device):
    t = middle_inputs(device, layout="vk", seed=3)
    state, conv_state = t["state"].clone(), t["conv_state"].clone()
    kw = middle_kwargs(t, state, conv_state, "vk")
    with pytest.raises(ValueError, match=r"^conv_weight: dtype"):
        gt.decode(**{**kw, "conv_weight": t["conv_weight"].half()})
    with pytest.raises(ValueError, match=r"^x: give either x"):
        gt.decode(**kw, qkv=packed(t))
    with pytest.raises(ValueError, match=r"^conv_bias: given without x"):
        gt.decode(**{**kw, "x": None, "conv_state": None, "conv_weight": None}, qkv=packed(t))
    assert torch.equal(state, t["state"]) and torch.equal(conv_state, t["conv_state"])


class Middle(torch.nn.Module):
    """The layer's middle with both pools as buffers."""

    def __init__(self, t):
        super().__init__()
        for name in ("state", "conv_state"):
            self.register_buffer(name, t[name].clone())
        for name in ("A_log", "dt_bias", "conv_weight", "conv_bias", "norm_weight"):
            self.register_buffer(name, t[name])

    def forward(self, x, a, b, z):
        o = gt.decode(x=x, a=a, b=b, z=z, state=self.state, conv_state=self.conv_state,
                      A_log=self.A_log, dt_bias=self.dt_bias, conv_weight=self.conv_weight,
                      conv_bias=self.conv_bias, norm_weight=self.norm_weight, layout="vk")
        return o * 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_middle_compile(device):
    t = middle_inputs(device, layout="vk", seed=33)
    for backend in compile_backends(device):
        torch._dynamo.reset()
        eager, compiled_mod = Middle(t), Middle(t)
        compiled = torch.compile(compiled_mod, backend=backend, fullgraph=True)
        for _ in range(3):
            o_e = eager(t["x"], t["a"], t["b"], t["z"])
            o_c = compiled(t["x"], t["a"], t["b"], t["z"])
            assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6), backend
        assert torch.equal(eager.conv_state, compiled_mod.conv_state), backend
        assert torch.allclose(eager.state, compiled_mod.state, rtol=1e-6, atol=1e-6), backend


@cuda_only
def test_middle_cuda_graph():
    """decode_conv with the norm captured in a CUDA graph at the model shape (B = 1,
    Hk 16, Hv 32, 128 x 128: the cluster geometry) and replayed against eager calls."""
    t = middle_inputs("cuda", B=1, Hk=16, Hv=32, Dk=128, Dv=128, layout="vk", seed=43,
                      dtype=torch.bfloat16, state_dtype=torch.float32)
    eager_s, eager_cs = t["state"].clone(), t["conv_state"].clone()
    graph_s, graph_cs = t["state"].clone(), t["conv_state"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gt.decode(**middle_kwargs(t, t["state"].clone(), t["conv_state"].clone(), "vk"))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_graph = gt.decode(**middle_kwargs(t, graph_s, graph_cs, "vk"))
    assert torch.equal(graph_s, t["state"]) and torch.equal(graph_cs, t["conv_state"])
    for _ in range(3):
        g.replay()
        o_eager = gt.decode(**middle_kwargs(t, eager_s, eager_cs, "vk"))
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_eager)  # deterministic: bitwise
        assert torch.equal(graph_s, eager_s) and torch.equal(graph_cs, eager_cs)


# ---- torch.compile, torch.export --------------------------------------------------------

class Step(torch.nn.Module):
    """A model-like module: state pool as a buffer, the op in forward."""

    def __init__(self, state, A_log, dt_bias):
        super().__init__()
        self.register_buffer("state", state.clone())
        self.register_buffer("A_log", A_log)
        self.register_buffer("dt_bias", dt_bias)

    def forward(self, qkv, a, b):
        o = gt.decode(qkv=qkv, a=a, b=b, state=self.state, A_log=self.A_log,
                      dt_bias=self.dt_bias, layout="vk")
        return o * 2.0  # something for the compiler to fuse around the op


def compile_backends(device):
    backends = ["aot_eager"]  # functionalization and re-inplacing, no code generation
    if device == "cuda":
        backends.append("inductor")
    return backends


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile(device):
    t = inputs(device, layout="vk", seed=31)
    qkv = packed(t)
    for backend in compile_backends(device):
        torch._dynamo.reset()
        eager = Step(t["state"], t["A_log"], t["dt_bias"])
        compiled_mod = Step(t["state"], t["A_log"], t["dt_bias"])
        compiled = torch.compile(compiled_mod, backend=backend, fullgraph=True)
        for _ in range(3):
            o_e = eager(qkv, t["a"], t["b"])
            o_c = compiled(qkv, t["a"], t["b"])
            assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6), backend
        assert torch.allclose(eager.state, compiled_mod.state, rtol=1e-6, atol=1e-6), backend


@pytest.mark.parametrize("device", DEVICES)
def test_torch_export(device):
    t = inputs(device, layout="vk", seed=32)
    qkv = packed(t)
    m = Step(t["state"], t["A_log"], t["dt_bias"])
    ep = torch.export.export(m, (qkv, t["a"], t["b"]))
    assert "gdnkit.decode_packed" in str(ep.graph)
    ref = Step(t["state"], t["A_log"], t["dt_bias"])
    o_ref = ref(qkv, t["a"], t["b"])
    exported = ep.module()
    o = exported(qkv, t["a"], t["b"])
    assert torch.allclose(o, o_ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(exported.state, ref.state, rtol=1e-6, atol=1e-6)
    # The functional form (what AOTInductor and ExecuTorch lower): auto_functionalized.
    m2 = Step(t["state"], t["A_log"], t["dt_bias"])
    ep2 = torch.export.export(m2, (qkv, t["a"], t["b"])).run_decompositions()
    assert "auto_functionalized" in str(ep2.graph)
    ref2 = Step(t["state"], t["A_log"], t["dt_bias"])
    functional = ep2.module()
    for _ in range(2):
        assert torch.allclose(functional(qkv, t["a"], t["b"]), ref2(qkv, t["a"], t["b"]),
                              rtol=1e-6, atol=1e-6)


_AOTI_PROBE = """
import os, sys, tempfile, torch, torch._inductor
class M(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1
x = torch.randn(4, 8, device=sys.argv[1])
ep = torch.export.export(M(), (x,))
with tempfile.TemporaryDirectory() as tmp:
    p = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, "m.pt2"))
    assert torch.allclose(torch._inductor.aoti_load_package(p)(x), x * 2 + 1)
"""
_aoti_works = {}


def aoti_works(device):
    """Whether AOTInductor compiles, loads and runs a model without gdnkit on `device`, in
    a fresh process (a crash there is this machine's torch, not gdnkit): (ok, detail)."""
    if device not in _aoti_works:
        r = subprocess.run([sys.executable, "-c", _AOTI_PROBE, device], capture_output=True,
                           text=True, timeout=600)
        _aoti_works[device] = (r.returncode == 0, f"rc {r.returncode}: {r.stderr[-400:]}")
    return _aoti_works[device]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens", ["one", "several"])
def test_aot_inductor(device, tokens):
    """torch.export + AOTInductor (ExecuTorch's CUDA path), the op called back from the
    compiled package; one token a row, and several (per-token slots and the intermediate
    buffer, MultiStep below). Compiles C++: about a minute on CPU."""
    if os.environ.get("GDNKIT_SKIP_AOTI"):
        pytest.skip("GDNKIT_SKIP_AOTI is set")
    import torch._inductor

    ok, detail = aoti_works(device)
    if not ok:
        pytest.skip(f"AOTInductor fails on {device} here for a model without gdnkit ({detail})")
    if tokens == "one":
        t = inputs(device, layout="vk", seed=33)
        call = (packed(t), t["a"], t["b"])
        make = lambda: Step(t["state"], t["A_log"], t["dt_bias"])  # noqa: E731
    else:
        t = multi_step_inputs(device)
        call = (t["qkv"], t["a"], t["b"], t["slots"], t["accepted"], t["read"])
        make = lambda: MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])  # noqa: E731
    ep = torch.export.export(make(), call)
    ref = make()
    with tempfile.TemporaryDirectory() as tmp:
        path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, "gdn.pt2"))
        compiled = torch._inductor.aoti_load_package(path)
        for _ in range(2):
            assert torch.allclose(compiled(*call), ref(*call), rtol=1e-6, atol=1e-6)


# ---- CUDA graphs ------------------------------------------------------------------------

@cuda_only
def test_cuda_graph_capture_and_replay():
    t = inputs("cuda", B=2, Hk=2, Hv=4, Dk=128, Dv=128, layout="vk", seed=41,
               state_dtype=torch.bfloat16, dtype=torch.bfloat16)
    qkv = packed(t)
    eager_state = t["state"].clone()
    graph_state = t["state"].clone()
    # Warm up on a side stream (as torch.cuda.graph requires), then capture one step.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        warm = t["state"].clone()
        gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=warm, A_log=t["A_log"], dt_bias=t["dt_bias"])
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_graph = gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=graph_state, A_log=t["A_log"],
                            dt_bias=t["dt_bias"])
    assert torch.equal(graph_state, t["state"]), "capture must not run the kernel"
    for _ in range(3):
        g.replay()
        o_eager = gt.decode(qkv=qkv, a=t["a"], b=t["b"], state=eager_state, A_log=t["A_log"],
                            dt_bias=t["dt_bias"])
        torch.cuda.synchronize()
        assert_same(o_graph, o_eager)
        assert_same(graph_state, eager_state)


@cuda_only
def test_compile_reduce_overhead():
    """Inductor with CUDA graphs (mode="reduce-overhead"), the pool a module buffer."""
    t = inputs("cuda", layout="vk", seed=51)
    qkv = packed(t)
    torch._dynamo.reset()
    eager = Step(t["state"], t["A_log"], t["dt_bias"])
    cm = Step(t["state"], t["A_log"], t["dt_bias"])
    compiled = torch.compile(cm, mode="reduce-overhead", fullgraph=True)
    for _ in range(5):
        o_e = eager(qkv, t["a"], t["b"])
        o_c = compiled(qkv, t["a"], t["b"]).clone()
        torch.cuda.synchronize()
        assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6)
    assert torch.allclose(eager.state, cm.state, rtol=1e-6, atol=1e-6)


@cuda_only
def test_current_stream_is_used():
    """The op runs on the current stream: work queued behind a long op on a side stream."""
    t = inputs("cuda", layout="vk", seed=61)
    state = t["state"].clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy
        q = t["q"] * 1.0  # produced on s
        o = gt.decode(q, t["k"], t["v"], t["a"], t["b"], state, A_log=t["A_log"],
                      dt_bias=t["dt_bias"])
    s.synchronize()
    o_ref, _ = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                         t["state"].transpose(-1, -2))
    assert_close(o, o_ref, 1e-5, "output")


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_device():
    t = inputs("cuda:1", layout="kv", seed=71)
    state = t["state"].clone()
    o = gt.decode(t["q"], t["k"], t["v"], t["a"], t["b"], state, A_log=t["A_log"],
                  dt_bias=t["dt_bias"], layout="kv")
    o_ref, _ = reference(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"], t["state"])
    assert o.device == torch.device("cuda:1")
    assert_close(o, o_ref, 1e-5, "output")


# ---- several tokens a row ------------------------------------------------------------------
#
# The multi-token cases of numpy_cases.py as tensors: one op call against the same tokens as
# one-token calls of the op chained through the pool (bitwise equal: gdnkit's multi-token
# contract), and on the CPU against the numpy path too.

import numpy as np  # noqa: E402

from numpy_cases import make_multi_case, multi_inputs, run_chained  # noqa: E402


def as_tensor(x, device):
    """A numpy array of the cases (bfloat16 as uint16 bits) as a tensor on `device`."""
    if x is None:
        return None
    t = torch.from_numpy(np.array(x))  # a copy: calls write pools and buffers in place
    if x.dtype == np.uint16:
        t = t.view(torch.bfloat16)
    return t.to(device)


def as_numpy(t):
    t = t.cpu()
    return (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy()


_OUT_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def multi_tensors(c, device):
    """(the op's per-token inputs, every other argument) of a multi-token case as tensors."""
    inputs = {n: as_tensor(x, device) for n, x in multi_inputs(c).items()}
    kw = dict(A_log=as_tensor(c["A_log"], device), dt_bias=as_tensor(c["dt_bias"], device),
              layout=c["layout"], gate=c["gate"], l2norm=c["l2"], l2norm_eps=c["eps"],
              scale=c["scale"], head_map=c["head_map"], out_dtype=_OUT_DTYPES[c["out"]])
    if c["norm"]:
        kw.update(norm_weight=as_tensor(c["norm_weight"], device), norm_eps=c["norm_eps"])
    if c["conv"]:
        kw.update(conv_weight=as_tensor(c["conv_weight"], device),
                  conv_bias=as_tensor(c["conv_bias"], device))
    return inputs, kw


def multi_op(c, device, **overrides):
    """One gdnkit.torch.decode call of the case: (out, pool, conv pool, intermediate
    states, intermediate conv states), the buffers fresh copies."""
    inputs, kw = multi_tensors(c, device)
    pool = as_tensor(c["pool"], device)
    conv_state = as_tensor(c["conv_state"], device) if c["conv"] else None
    inter, inter_conv = as_tensor(c["inter"], device), as_tensor(c["inter_conv"], device)
    idx = {n: as_tensor(c[k], device) for n, k in (
        ("cu_seqlens", "cu"), ("state_indices", "read"), ("state_out_indices", "write"),
        ("token_state_indices", "tsi"), ("num_accepted_tokens", "acc"))}
    kw.update(inputs)
    kw.update(idx)
    kw.update(state=pool, conv_state=conv_state, num_tokens=c["T"],
              intermediate_states=inter, intermediate_conv_states=inter_conv,
              update_state=c["mode"] != "intermediate")
    kw.update(overrides)
    out = gt.decode(**kw)
    return out, pool, conv_state, inter, inter_conv


def chained_ops(c, device):
    """The case as one-token gdnkit.torch.decode calls chained through scratch pools (as
    numpy_cases.run_chained does with gdnkit.decode), on `device`."""
    B, T, S = c["B"], c["T"], c["pool"].shape[0]
    lengths = [T] * B if c["cu"] is None else list(c["lengths"])
    starts = [n * T for n in range(B)] if c["cu"] is None else [int(x) for x in c["cu"][:-1]]
    if c["tsi"] is not None:
        read = [int(c["tsi"][n, c["acc"][n] - 1]) if 1 <= c["acc"][n] <= T else -1
                for n in range(B)]
    else:
        read = [int(s) for s in c["read"]]
    valid = [0 <= s < S for s in read]
    pick = torch.tensor([s if ok else 0 for s, ok in zip(read, valid)], device=device)
    pool = as_tensor(c["pool"], device)
    scratch = pool.index_select(0, pick)
    conv_pool = as_tensor(c["conv_state"], device) if c["conv"] else None
    conv_scratch = conv_pool.index_select(0, pick).contiguous() if c["conv"] else None
    if c["conv"] and c["tap_major"]:
        # a scratch with the pool's (tap-major) layout, as the multi-token call's buffers
        conv_scratch = conv_pool.index_select(0, pick)
    _, kw = multi_tensors(c, device)
    flat = {n: as_tensor(c[n], device) for n in ("q", "k", "v", "a", "b", "x", "z")
            if c.get(n) is not None}
    out = torch.zeros((c["rows"], c["Hv"], c["Dv"]), dtype=_OUT_DTYPES[c["out"]], device=device)
    states, windows = {}, {}
    for t in range(T):
        active = [valid[n] and t < lengths[n] for n in range(B)]
        if not any(active):
            continue
        src = [min(starts[n] + min(t, max(lengths[n] - 1, 0)), c["rows"] - 1) for n in range(B)]
        rows = torch.tensor(src, device=device)
        one = {n: x.index_select(0, rows) for n, x in flat.items()
               if n in (("x",) if c["conv"] else ("q", "k", "v")) + ("a", "b") + (("z",) if c["norm"] else ())}
        idx = torch.tensor([n if active[n] else -1 for n in range(B)], device=device,
                           dtype=torch.int32 if c["itype"] == np.int32 else torch.int64)
        o = gt.decode(**kw, **one, state=scratch, state_indices=idx,
                      conv_state=conv_scratch if c["conv"] else None)
        for n in range(B):
            if active[n]:
                out[starts[n] + t] = o[n]
                states[n, t] = scratch[n].clone()
                if c["conv"]:
                    windows[n, t] = conv_scratch[n].clone()
    if c["cu"] is None:
        out = out.reshape(B, T, c["Hv"], c["Dv"])
    inter, inter_conv = as_tensor(c["inter"], device), as_tensor(c["inter_conv"], device)
    for (n, t), s in states.items():
        slot = None
        if c["mode"] == "final" and t == lengths[n] - 1:
            slot = int(c["write"][n])
        if c["mode"] == "token_slots":
            slot = int(c["tsi"][n, t])
        if slot is not None and 0 <= slot < S:
            pool[slot] = s
            if c["conv"]:
                conv_pool[slot] = windows[n, t]
        if c["mode"] == "intermediate":
            inter[n, t] = s
            if inter_conv is not None:
                inter_conv[n, t] = windows[n, t]
    return out, pool, conv_pool, inter, inter_conv


TORCH_MULTI_CASES = {
    # name: (the op it reaches, make_multi_case arguments)
    "decode_final_bf16_vk": ("decode", dict(mode="final", qkv="bf16", state="bf16", layout="vk")),
    "decode_token_slots_cu_seqlens": ("decode", dict(mode="token_slots", lengths=[3, 1, 2],
                                                     qkv="f16", state="f32", layout="kv")),
    "decode_intermediate_flat_f32": ("decode", dict(mode="intermediate", form="flat", qkv="f32",
                                                    state="f32", layout="vk", index="i64")),
    "packed_final_cu_seqlens_bf16": ("decode_packed", dict(mode="final", form="packed",
                                                           lengths=[2, 0, 3, 1], B=4, T=3,
                                                           qkv="bf16", state="bf16",
                                                           layout="vk", Hk=2, G=2)),
    "packed_token_slots_norm_f32": ("decode_packed", dict(mode="token_slots", form="packed",
                                                          norm=True, qkv="f32", state="f32",
                                                          layout="kv")),
    "conv_norm_token_slots_bf16": ("decode_conv", dict(mode="token_slots", conv=True, norm=True,
                                                       tap_major=True, qkv="bf16",
                                                       state="bf16", layout="vk")),
    "conv_intermediate_f16_w3": ("decode_conv", dict(mode="intermediate", conv=True, W=3,
                                                     qkv="f16", state="f16", layout="kv")),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(TORCH_MULTI_CASES))
def test_multi_token_ops_equal_chained_one_token_calls(device, name):
    op, args = TORCH_MULTI_CASES[name]
    c = make_multi_case(sum(map(ord, name)), **args)
    got = multi_op(c, device)
    want = chained_ops(c, device)
    shape = (c["rows"],) if c["cu"] is not None else (c["B"], c["T"])
    assert got[0].shape == shape + (c["Hv"], c["Dv"]) and got[0].device.type == device
    for what, x, y in zip(("output", "state pool", "conv pool", "intermediate states",
                           "intermediate conv states"), got, want):
        assert (x is None) == (y is None), what
        if x is not None:
            assert torch.equal(x, y), f"{what}: not bitwise the chained one-token calls"
    if device == "cpu":  # the same extension through DLPack (gdnkit.decode on numpy)
        for what, x, y in zip(("output", "state pool"), got, run_chained(c)):
            assert np.array_equal(as_numpy(x), y.view(np.uint16) if y.dtype.name == "bfloat16"
                                  else y), what
    # the op the keyword front end picked
    inputs, kw = multi_tensors(c, device)
    assert {"decode": "q", "decode_packed": "qkv", "decode_conv": "x"}[op] in inputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_multi_token_against_reference(device, state_dtype):
    """Dense [B, T] tokens, final state written to separate slots: against the float64
    reference run token by token, the state rounded to its dtype between tokens."""
    B, T = 3, 4
    t = inputs("cpu", B=B * T, slots=2 * B + 1, layout="vk", seed=77, dtype=torch.bfloat16,
               state_dtype=state_dtype)
    read = torch.tensor([4, -1, 0], dtype=torch.int32)
    write = torch.tensor([5, 6, 1], dtype=torch.int32)
    pool_kv = t["state"].transpose(-1, -2).double()
    o_ref = torch.zeros(B, T, 4, 64, dtype=torch.float64)
    new_pool = pool_kv.clone()
    for n in range(B):
        if read[n] < 0:
            continue
        S = pool_kv[int(read[n])][None]
        for j in range(T):
            r = n * T + j
            o, S = reference(t["q"][r:r + 1], t["k"][r:r + 1], t["v"][r:r + 1], t["a"][r:r + 1],
                             t["b"][r:r + 1], t["A_log"], t["dt_bias"], S)
            o_ref[n, j] = o[0]
            S = S.transpose(-1, -2).to(state_dtype).double().transpose(-1, -2)
        new_pool[int(write[n])] = S[0]
    to = lambda x: x.to(device)  # noqa: E731
    state = to(t["state"].clone())
    o = gt.decode(to(t["q"].reshape(B, T, 2, 64)), to(t["k"].reshape(B, T, 2, 64)),
                  to(t["v"].reshape(B, T, 4, 64)), to(t["a"].reshape(B, T, 4)),
                  to(t["b"].reshape(B, T, 4)), state, A_log=to(t["A_log"]),
                  dt_bias=to(t["dt_bias"]), layout="vk", state_indices=to(read),
                  state_out_indices=to(write))
    assert o.shape == (B, T, 4, 64) and not o[1].any()
    tol = max(TOL_OUT[torch.bfloat16], TOL_STATE[state_dtype])
    assert_close(o, o_ref, tol, "output")
    assert_close(state.transpose(-1, -2), new_pool, TOL_STATE[state_dtype], "pool")


def multi_op_args(c, device, op):
    """(op, positional arguments, keyword arguments) of a torch.ops.gdnkit call of the case."""
    inputs, kw = multi_tensors(c, device)
    from gdnkit._options import normalized, op_params

    values = normalized(dict(
        kw, **inputs, state=as_tensor(c["pool"], device), num_tokens=c["T"],
        conv_state=as_tensor(c["conv_state"], device) if c["conv"] else None,
        cu_seqlens=as_tensor(c["cu"], device), state_indices=as_tensor(c["read"], device),
        state_out_indices=as_tensor(c["write"], device),
        token_state_indices=as_tensor(c["tsi"], device),
        num_accepted_tokens=as_tensor(c["acc"], device),
        intermediate_states=as_tensor(c["inter"], device),
        intermediate_conv_states=as_tensor(c["inter_conv"], device),
        update_state=c["mode"] != "intermediate"))
    names = [p.name for p in op_params(op)]
    required = [p.name for p in op_params(op) if p.required]
    args = tuple(values.get(n) for n in required)
    kwargs = {n: values[n] for n in names if n not in required and values.get(n) is not None}
    return getattr(torch.ops.gdnkit, op).default, args, kwargs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["decode_intermediate_flat_f32", "packed_final_cu_seqlens_bf16",
                                  "conv_intermediate_f16_w3", "decode_token_slots_cu_seqlens"])
def test_multi_token_opcheck(device, name):
    """torch.library.opcheck: the schema's mutations (the pools and the intermediate
    buffers), the fake implementation's output (shape, dtype, strides) and the
    functionalized (AOT dispatch) forms, for several tokens a row."""
    op, args = TORCH_MULTI_CASES[name]
    c = make_multi_case(sum(map(ord, name)), **args)
    fn, a, kw = multi_op_args(c, device, op)
    torch.library.opcheck(fn, a, kw)


@pytest.mark.parametrize("device", DEVICES)
def test_multi_token_fake_shapes(device):
    """The fake implementation gives [B, T, Hv, Dv] for dense tokens (T from num_tokens or
    the shapes) and [total_tokens, Hv, Dv] with cu_seqlens."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name, shape in (("decode_final_bf16_vk", (3, 3, 2, 64)),
                        ("packed_final_cu_seqlens_bf16", (6, 4, 64))):
        op, args = TORCH_MULTI_CASES[name]
        c = make_multi_case(sum(map(ord, name)), **args)
        fn, a, kw = multi_op_args(c, device, op)
        kw.pop("num_tokens", None)  # from the shapes
        with FakeTensorMode() as mode:
            fake = lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
            o = fn(*[fake(x) for x in a], **{k: fake(x) for k, x in kw.items()})
        assert tuple(o.shape) == shape and o.device.type == device


class MultiStep(torch.nn.Module):
    """Spec decode in a model: the pool and the buffer of every token's state as buffers,
    per-token slots with num_accepted_tokens (in place) and the intermediate buffer with
    the pool left alone, in one forward."""

    def __init__(self, state, inter, A_log, dt_bias):
        super().__init__()
        self.register_buffer("state", state.clone())
        self.register_buffer("inter", inter.clone())
        self.register_buffer("A_log", A_log)
        self.register_buffer("dt_bias", dt_bias)

    def forward(self, qkv, a, b, slots, accepted, read):
        o1 = gt.decode(qkv=qkv, a=a, b=b, state=self.state, A_log=self.A_log,
                       dt_bias=self.dt_bias, layout="vk", token_state_indices=slots,
                       num_accepted_tokens=accepted)
        o2 = gt.decode(qkv=qkv, a=a, b=b, state=self.state, A_log=self.A_log,
                       dt_bias=self.dt_bias, layout="vk", state_indices=read,
                       intermediate_states=self.inter, update_state=False)
        return o1 * 2.0 + o2


def multi_step_inputs(device):
    B, T, Hk, Hv, D = 2, 3, 2, 4, 64
    gen = torch.Generator().manual_seed(91)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t = dict(qkv=r(B, T, 2 * Hk * D + Hv * D), a=r(B, T, Hv), b=r(B, T, Hv),
             state=0.5 * r(B * T + 1, Hv, D, D), inter=r(B, T, Hv, D, D),
             A_log=torch.log(torch.empty(Hv).uniform_(1, 16, generator=gen)),
             dt_bias=0.1 * r(Hv),
             slots=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32),
             accepted=torch.tensor([2, 1], dtype=torch.int32),
             read=torch.tensor([6, -1], dtype=torch.int32))
    return {n: x.to(device) for n, x in t.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_multi_token_compile(device):
    t = multi_step_inputs(device)
    call = (t["qkv"], t["a"], t["b"], t["slots"], t["accepted"], t["read"])
    for backend in compile_backends(device):
        torch._dynamo.reset()
        eager = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
        compiled_mod = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
        compiled = torch.compile(compiled_mod, backend=backend, fullgraph=True)
        for _ in range(3):
            o_e, o_c = eager(*call), compiled(*call)
            assert o_c.shape == (2, 3, 4, 64)
            assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6), backend
        assert torch.equal(eager.state, compiled_mod.state), backend
        assert torch.equal(eager.inter, compiled_mod.inter), backend


@pytest.mark.parametrize("device", DEVICES)
def test_multi_token_export(device):
    """torch.export of several tokens a row, and its functional form (auto_functionalized
    over the pool and the intermediate buffer)."""
    t = multi_step_inputs(device)
    call = (t["qkv"], t["a"], t["b"], t["slots"], t["accepted"], t["read"])
    ep = torch.export.export(MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"]), call)
    assert "gdnkit.decode_packed" in str(ep.graph)
    ref = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
    functional = torch.export.export(MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"]),
                                     call).run_decompositions()
    assert "auto_functionalized" in str(functional.graph)
    for exported in (ep.module(), functional.module()):
        m = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
        o, o_ref = exported(*call), m(*call)
        assert torch.equal(o, o_ref)
        assert torch.equal(exported.state, m.state) and torch.equal(exported.inter, m.inter)
    del ref


@cuda_only
def test_multi_token_cuda_graph():
    """Several tokens a row (per-token slots, then the intermediate buffer) captured in a
    CUDA graph and replayed against eager calls: bitwise."""
    t = multi_step_inputs("cuda")
    call = (t["qkv"].bfloat16(), t["a"], t["b"], t["slots"], t["accepted"], t["read"])
    eager = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
    graphed = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])(*call)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_graph = graphed(*call)
    assert torch.equal(graphed.state, t["state"]) and torch.equal(graphed.inter, t["inter"])
    for _ in range(3):
        g.replay()
        o_eager = eager(*call)
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_eager)
        assert torch.equal(graphed.state, eager.state) and torch.equal(graphed.inter, eager.inter)


@cuda_only
def test_multi_token_compile_reduce_overhead():
    """Several tokens a row under Inductor with CUDA graphs (mode="reduce-overhead")."""
    t = multi_step_inputs("cuda")
    call = (t["qkv"], t["a"], t["b"], t["slots"], t["accepted"], t["read"])
    torch._dynamo.reset()
    eager = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
    cm = MultiStep(t["state"], t["inter"], t["A_log"], t["dt_bias"])
    compiled = torch.compile(cm, mode="reduce-overhead", fullgraph=True)
    for _ in range(5):
        o_e = eager(*call)
        o_c = compiled(*call).clone()
        torch.cuda.synchronize()
        assert torch.allclose(o_e, o_c, rtol=1e-6, atol=1e-6)
    assert torch.equal(eager.state, cm.state) and torch.equal(eager.inter, cm.inter)
