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
# AOTInductor packages call the ops by these, so they must not change.
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


@pytest.mark.parametrize("name", sorted(PUBLISHED_SCHEMAS))
def test_op_schemas_unchanged(name):
    """The schemas generated from gdnkit._options.PARAMS are the published ones."""
    published = torch._C.parse_schema("gdnkit::" + PUBLISHED_SCHEMAS[name])
    assert str(getattr(torch.ops.gdnkit, name).default._schema) == str(published)


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
def test_aot_inductor(device):
    """torch.export + AOTInductor (ExecuTorch's CUDA path), the op called back from the
    compiled package. Compiles C++: about a minute on CPU."""
    if os.environ.get("GDNKIT_SKIP_AOTI"):
        pytest.skip("GDNKIT_SKIP_AOTI is set")
    import torch._inductor

    ok, detail = aoti_works(device)
    if not ok:
        pytest.skip(f"AOTInductor fails on {device} here for a model without gdnkit ({detail})")
    t = inputs(device, layout="vk", seed=33)
    qkv = packed(t)
    ep = torch.export.export(Step(t["state"], t["A_log"], t["dt_bias"]), (qkv, t["a"], t["b"]))
    ref = Step(t["state"], t["A_log"], t["dt_bias"])
    with tempfile.TemporaryDirectory() as tmp:
        path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, "gdn.pt2"))
        compiled = torch._inductor.aoti_load_package(path)
        for _ in range(2):
            assert torch.allclose(compiled(qkv, t["a"], t["b"]), ref(qkv, t["a"], t["b"]),
                                  rtol=1e-6, atol=1e-6)


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
