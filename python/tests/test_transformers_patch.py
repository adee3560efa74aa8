"""gdnkit.torch.patch_transformers against Hugging Face transformers' own decode path, on
the CPU, with tiny random-weight models built from the config classes: Qwen3-Next, and
Qwen3.5 / Qwen3.5-MoE where the installed transformers has them. Four layers with the real
3:1 pattern (three GatedDeltaNet, one full attention), Hk < Hv as in the real models,
Dk != Dv (a state layout mix-up cannot pass), float32, fixed seed.

Tolerances. In float32 the two paths compute the same math in a different order: gdnkit's
host backend runs the layer's middle (conv1d, gates, l2norm, the step, gated RMSNorm) in
float64 and rounds once to float32; transformers runs each op in float32 (sums over Dk, Dv
and the conv taps). Each is within a few float32 ulps of the exact value, so a layer's
output and new state agree to the project's float32 bound, relative L2 error 1e-5
(docs/operation.md, "Numerics"; measured: about 1e-7). The rest of the model is the same
float32 code in both runs, so the logits differ only by what those layer differences
become downstream: a 4-layer network with decaying states does not amplify them by orders
of magnitude, so the same 1e-5 bound holds for every step's logits (relative L2, and the
worst element against the largest logit; measured about 2e-7). The new conv state is pure
data movement: bitwise equal. A layer that got any stage wrong (conv, gates, norm, heads,
layout) would be off by O(1): the GatedDeltaNet layers move these logits by 18-20 %
(test_gdn_layers_matter).

Also: the fallbacks run transformers' own forward bit for bit, the patched step compiles
whole under torch.compile(fullgraph=True) with the gdnkit op in the graph, and the bf16
real-shape check of test_bf16_real_gdn_shape. Skips when torch or transformers (or its
Qwen3-Next model) is missing.
"""
import copy
import inspect
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gdnkit.torch as gt  # noqa: E402
from gdnkit.torch import transformers as gtt  # noqa: E402

TOL = 1e-5  # float32: docs/operation.md, "Numerics"
NEW_TOKENS = 16
GDN_LAYERS = 3

# family: (config class, model class, family-specific config)
FAMILIES = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(intermediate_size=128, moe_intermediate_size=64,
                        shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2)),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(intermediate_size=128)),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                    dict(moe_intermediate_size=64, shared_expert_intermediate_size=64,
                         num_experts=4, num_experts_per_tok=2)),
}


def model_classes(family):
    config_name, model_name, extra = FAMILIES[family]
    try:
        return getattr(transformers, config_name), getattr(transformers, model_name), extra
    except (AttributeError, ImportError, RuntimeError) as e:  # older transformers, or broken import
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}: {e}")


# transformers runs FLA's kernels (and the causal-conv1d package's) in place of its own torch
# code wherever those packages are installed, chosen when the modeling module is imported
# (module-level functions, as in 5.17) or the module is built (instance attributes, as in
# 4.57 - 5.3), whatever device the model later runs on (5.25 picks by the inputs' device).
# Triton cannot take CPU tensors where a CUDA GPU is present (without one FLA falls back to
# torch), so there a CPU model fails in transformers itself. The CPU tests run transformers' own
# torch code, as it does where those packages are absent (CI); the CUDA test keeps what users run.
FOREIGN = ("fla", "causal_conv1d")
PATH_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                  "causal_conv1d_update")


@pytest.fixture(autouse=True)
def torch_code_on_cpu(request, monkeypatch):
    """Module-level functions: their torch code (what the fallback wrapper wraps) for a CPU test."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("device", "cpu") != "cpu":
        return
    for _, model_name, _ in FAMILIES.values():
        try:
            modeling = sys.modules.get(getattr(getattr(transformers, model_name), "__module__", ""))
        except (AttributeError, ImportError, RuntimeError):  # (the tests of that family skip)
            continue
        for name in PATH_FUNCTIONS:
            f = getattr(modeling, name, None)
            if f is not None and hasattr(f, "__wrapped__"):
                monkeypatch.setattr(modeling, name, inspect.unwrap(f))


def own_torch_modules(model):
    """Instance attributes (4.57 - 5.3): the module's torch functions and RMSNormGated back."""
    for m in gdn_modules(model):
        modeling = sys.modules[type(m).__module__]
        for attr in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule", "causal_conv1d_fn",
                     "causal_conv1d_update"):
            f = m.__dict__.get(attr)
            if f is not None and getattr(f, "__module__", "").startswith(FOREIGN):
                setattr(m, attr, getattr(modeling, "torch_" + attr, None))
        norm = getattr(m, "norm", None)
        if norm is not None and type(norm).__module__.startswith(FOREIGN):
            cls = next(getattr(modeling, n) for n in dir(modeling)
                       if n.endswith("RMSNormGated") and not n.startswith("Fused"))
            plain = cls(norm.weight.shape[0], eps=norm.eps).to(norm.weight.dtype)
            plain.weight.data.copy_(norm.weight.data)
            m.norm = plain
    return model


def build(family, seed=0, device="cpu"):
    config_cls, model_cls, extra = model_classes(family)
    config = config_cls(
        vocab_size=256, hidden_size=128, num_hidden_layers=4,
        layer_types=["linear_attention"] * GDN_LAYERS + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,  # Hk < Hv, 2 v-heads a k-head
        linear_key_head_dim=32, linear_value_head_dim=48, linear_conv_kernel_dim=4,
        max_position_embeddings=256, **extra)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    if device == "cpu":
        own_torch_modules(model)
    ids = torch.randint(0, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(seed + 1))
    return model, ids


def gdn_modules(model):
    return [m for m in model.modules() if {c.__name__ for c in type(m).__mro__} & set(gtt.CLASSES)]


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return float(torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref))


def generate(model, ids):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on its torch fallbacks
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    return out.sequences, torch.stack(out.logits)


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generate_matches(family, device):
    """On CUDA transformers' own path is its torch code or FLA's kernels, whichever is installed;
    float32 matmuls there run without TF32 (torch's default), so the float32 bound holds."""
    model, ids = build(family, device=device)
    model, ids = model.to(device), ids.to(device)
    tokens_ref, logits_ref = generate(model, ids)
    with gt.patch_transformers(model) as patch:
        tokens, logits = generate(model, ids)
    # every decode step of every GatedDeltaNet layer took the gdnkit path; the prefill did not
    assert patch.stats == {"prefill": GDN_LAYERS, "gdnkit": GDN_LAYERS * (NEW_TOKENS - 1)}, patch.stats
    assert torch.equal(tokens, tokens_ref), f"greedy tokens differ:\n{tokens}\n{tokens_ref}"
    for step in range(NEW_TOKENS):
        err = rel(logits[step], logits_ref[step])
        worst = float((logits[step] - logits_ref[step]).abs().max() / logits_ref[step].abs().max())
        assert err <= TOL and worst <= TOL, f"step {step}: logits rel {err:.3g}, worst {worst:.3g}"
    # unpatched again: transformers' own path, bit for bit
    assert all("forward" not in m.__dict__ for m in gdn_modules(model))
    tokens_again, logits_again = generate(model, ids)
    assert torch.equal(tokens_again, tokens_ref) and torch.equal(logits_again, logits_ref)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gdn_layers_matter(family):
    """The tolerance above is no blind spot: without the GatedDeltaNet layers' output the
    logits move by four orders of magnitude more than it."""
    model, ids = build(family)
    ablated = copy.deepcopy(model)
    for m in gdn_modules(ablated):
        m.out_proj.weight.data.zero_()
    with torch.no_grad():
        assert rel(ablated(ids).logits, model(ids).logits) > 1e4 * TOL


def capture_decode_step(model, ids, layers=GDN_LAYERS):
    """Prefill, then one decode step with every GatedDeltaNet layer's call recorded: returns
    (cache as it was before the decode step, {module: (args, kwargs, cache key)})."""
    with torch.no_grad():
        out = model(ids, use_cache=True)
    cache = out.get("cache")  # 5.25 -
    if cache is None:
        cache = out.past_key_values
    before = copy.deepcopy(cache)
    calls = {}

    def record(module, args, kwargs):
        key = next(k for k, v in kwargs.items() if v is cache)
        calls[module] = (args, dict(kwargs), key)

    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in gdn_modules(model)]
    try:
        nxt = out.logits[:, -1:].argmax(-1)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        with torch.no_grad():
            model(nxt, use_cache=True, cache_position=torch.tensor([ids.shape[1]]), **{name: cache})
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == layers
    return before, calls


def layer_states(cache, module, kwargs):
    states = gtt._decode_states(cache, module.layer_idx, kwargs)
    assert not isinstance(states, str), states
    return states


@pytest.mark.parametrize("family", list(FAMILIES))
def test_decode_step_layer_by_layer(family):
    """Each layer's patched forward against its original on the same input and cache:
    output and recurrent state within 1e-5, conv state bitwise, the same bookkeeping."""
    model, ids = build(family, seed=3)
    before, calls = capture_decode_step(model, ids)
    patch = gt.patch_transformers(model)
    try:
        for m, (args, kwargs, key) in calls.items():
            cache_ref, cache_new = copy.deepcopy(before), copy.deepcopy(before)
            with torch.no_grad():
                out_ref = m._gdnkit_layer.forward(*args, **{**kwargs, key: cache_ref})
                n = patch.gdnkit_calls
                out = m(*args, **{**kwargs, key: cache_new})
                assert patch.gdnkit_calls == n + 1, patch.stats
            kw = {**kwargs, key: None}
            conv_ref, rec_ref = layer_states(cache_ref, m, kw)
            conv, rec = layer_states(cache_new, m, kw)
            assert out.shape == out_ref.shape and out.dtype == out_ref.dtype
            assert rel(out, out_ref) <= TOL, f"layer {m.layer_idx}: output {rel(out, out_ref):.3g}"
            assert rel(rec, rec_ref) <= TOL, f"layer {m.layer_idx}: state {rel(rec, rec_ref):.3g}"
            assert rec.dtype == rec_ref.dtype
            assert torch.equal(conv, conv_ref), f"layer {m.layer_idx}: conv state differs"
            # the token count the cache keeps for the layer (5.25 counts decode steps)
            layer_ref = getattr(cache_ref, "layers", [None] * (m.layer_idx + 1))[m.layer_idx]
            layer_new = getattr(cache_new, "layers", [None] * (m.layer_idx + 1))[m.layer_idx]
            for attr in ("cumulative_length_linear", "cumulative_length"):
                if hasattr(layer_ref, attr):
                    assert torch.equal(torch.as_tensor(getattr(layer_new, attr)),
                                       torch.as_tensor(getattr(layer_ref, attr))), attr
    finally:
        patch.unpatch()


def test_bf16_real_gdn_shape():
    """One GatedDeltaNet layer at the real shape (hidden 2048, Hk 16, Hv 32, Dk = Dv = 128,
    conv 4: Qwen3.5-35B-A3B's, or Qwen3-Next-80B-A3B's where Qwen3.5 is missing) in bf16.
    transformers rounds the conv output, beta and the step's output to bf16 on the way,
    gdnkit keeps them in float32, so the two differ at bf16 level; the float32 run of the
    same layer (same weights, input and cache) tells which is nearer. Bounds: the bf16
    ones of docs/operation.md (output 1e-2, state 8e-3), and no farther from the float32
    run than transformers' own bf16 path (measured: about half as far)."""
    family = "qwen3_5_moe" if hasattr(transformers, "Qwen3_5MoeTextConfig") else "qwen3_next"
    config_cls, model_cls, _ = model_classes(family)
    config = config_cls(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                        vocab_size=512, num_experts=4, num_experts_per_tok=2)
    assert (config.hidden_size, config.linear_num_key_heads, config.linear_num_value_heads,
            config.linear_key_head_dim, config.linear_value_head_dim) == (2048, 16, 32, 128, 128)
    torch.manual_seed(11)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = own_torch_modules(model_cls(config).eval())
    finally:
        torch.set_default_dtype(previous)
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(12))
    before, calls = capture_decode_step(model, ids, layers=1)
    (m, (args, kwargs, key)), = calls.items()
    m32 = copy.deepcopy(m).float()
    h = args[0] if args else kwargs["hidden_states"]
    rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
    caches = {name: copy.deepcopy(before) for name in ("ref", "hf", "gdnkit")}
    with torch.no_grad():
        # the float32 run: the bf16 cache as it is (its conv taps are exact in float32)
        out_ref = m32(hidden_states=h.float(), **{**rest, key: caches["ref"]})
        out_hf = m(hidden_states=h, **{**rest, key: caches["hf"]})
        with gt.patch_transformers(model) as patch:
            out = m(hidden_states=h, **{**rest, key: caches["gdnkit"]})
    assert patch.stats == {"gdnkit": 1} and out.dtype == torch.bfloat16
    kw = {**kwargs, key: None}
    state_ref = layer_states(caches["ref"], m, kw)[1]
    state_hf = layer_states(caches["hf"], m, kw)[1]
    state = layer_states(caches["gdnkit"], m, kw)[1]
    assert torch.equal(layer_states(caches["gdnkit"], m, kw)[0], layer_states(caches["hf"], m, kw)[0])
    err_out, err_out_hf = rel(out, out_ref), rel(out_hf, out_ref)
    err_state, err_state_hf = rel(state, state_ref), rel(state_hf, state_ref)
    assert err_out <= 1e-2 and err_out <= err_out_hf, (err_out, err_out_hf)
    assert err_state <= 8e-3 and err_state <= err_state_hf, (err_state, err_state_hf)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_torch_compile_fullgraph(family):
    """The patched decode step traces whole (fullgraph: no graph break, as a static-cache
    generate compiles it), the gdnkit op is in the graph, and the compiled step (aot_eager:
    functionalized, the cache mutations written back) gives the eager step's bits."""
    model, ids = build(family, seed=9)
    before, calls = capture_decode_step(model, ids)
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    with gt.patch_transformers(model):
        for m, (args, kwargs, key) in calls.items():
            cache_eager, cache_compiled = copy.deepcopy(before), copy.deepcopy(before)
            ops.clear()
            with torch.no_grad():
                out = m(*args, **{**kwargs, key: cache_eager})
                out_compiled = torch.compile(m, fullgraph=True, backend=backend)(
                    *args, **{**kwargs, key: cache_compiled})
            assert any("gdnkit.decode_conv" in op for op in ops), ops
            kw = {**kwargs, key: None}
            assert torch.equal(out_compiled, out)
            for a, b in zip(layer_states(cache_compiled, m, kw), layer_states(cache_eager, m, kw)):
                assert torch.equal(a, b)
    torch._dynamo.reset()


@pytest.mark.parametrize("family", ["qwen3_next"])
def test_fallbacks_run_the_original(family):
    """Prefill, no cache and autograd run transformers' own forward: the same bits."""
    model, ids = build(family, seed=5)
    before, calls = capture_decode_step(model, ids)
    with torch.no_grad():
        ref_prefill = model(ids, use_cache=True).logits
        ref_nocache = model(ids[:, :1], use_cache=False).logits
    m, (args, kwargs, key) = next(iter(calls.items()))
    ref_grad = m(*args, **{**kwargs, key: copy.deepcopy(before)})  # a decode step, autograd on
    with gt.patch_transformers(model) as patch:
        with torch.no_grad():
            prefill = model(ids, use_cache=True).logits
            nocache = model(ids[:, :1], use_cache=False).logits
        grad = m(*args, **{**kwargs, key: copy.deepcopy(before)})
    assert torch.equal(prefill, ref_prefill) and torch.equal(nocache, ref_nocache)
    assert torch.equal(grad, ref_grad) and grad.requires_grad
    assert patch.stats == {"prefill": GDN_LAYERS, "no cache": GDN_LAYERS, "autograd": 1}, patch.stats


def test_patch_object():
    model, ids = build("qwen3_next", seed=7)
    modules = gdn_modules(model)
    patch = gt.patch_transformers(model)
    assert patch.modules == modules and len(modules) == GDN_LAYERS
    assert all(m.forward.__func__ is gtt._patched_forward for m in modules)
    with pytest.raises(RuntimeError, match="patched already"):
        gt.patch_transformers(model)
    # a deep copy is patched on its own: its layers' forwards are bound to the copy
    twin = copy.deepcopy(model)
    for m in gdn_modules(twin):
        assert m.forward.__self__ is m and m._gdnkit_layer.forward.__self__ is m
    gtt.unpatch_transformers(twin)
    assert all("forward" not in m.__dict__ for m in gdn_modules(twin))
    patch.unpatch()
    patch.unpatch()  # idempotent
    assert all("forward" not in m.__dict__ and "_gdnkit_layer" not in m.__dict__ for m in modules)
    with pytest.raises(ValueError, match="no Qwen3-Next / Qwen3.5 GatedDeltaNet"):
        gt.patch_transformers(torch.nn.Linear(4, 4))
