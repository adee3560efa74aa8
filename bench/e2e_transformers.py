#!/usr/bin/env python3
"""End-to-end decode with Hugging Face transformers: its own GatedDeltaNet decode path
against gdnkit.torch.patch_transformers, on a GPU.

    python bench/e2e_transformers.py                       # Qwen3.5-35B-A3B shapes, 4 layers, bf16
    python bench/e2e_transformers.py --batch 1 32 --new-tokens 64 --modes eager graph --json out.json
    python bench/e2e_transformers.py --device cpu --tiny   # smoke run of this script's logic, no GPU

The model: random weights with the real per-layer shapes of Qwen3.5-35B-A3B (the
Qwen3_5MoeTextConfig defaults: hidden 2048; GatedDeltaNet Hk 16, Hv 32, Dk = Dv = 128,
conv width 4; gated attention 16/2 heads of 256; 256 experts, 8 routed + 1 shared, 512
wide; vocabulary 248320), but only --layers layers (default 4: three GatedDeltaNet, one
full attention, the real 3:1 pattern). --model qwen3_next takes Qwen3-Next-80B-A3B's
(Qwen3NextConfig defaults) instead. Random weights make the text meaningless, not the
timing: the kernels and shapes are the real model's (only the MoE routing spreads tokens
over the experts in its own way).

Modes (each for transformers' own path, "hf", and the patched one, "gdnkit"):
  eager   model.generate with the default dynamic cache: one Python-driven forward a token.
  graph   model.generate(cache_implementation="static"): on CUDA transformers then compiles
          the decode forward (torch.compile, its default CompileConfig: mode
          "reduce-overhead", i.e. CUDA graphs through inductor's cudagraph trees); prefill
          stays eager. This is the CUDA-graph path transformers offers; a release or model
          that cannot run it is reported as failed and the script goes on.
For every batch size, generate(max_new_tokens=1) (prefill alone) and generate(max_new_tokens=N)
are timed in pairs, --repeats of them after --warmup: decode step = median of
(t_N - t_1) / (N - 1), decode tokens/s = batch / step, end-to-end tokens/s = batch * N / t_N
(medians).

GPU share, from torch.profiler:
  eager   each GatedDeltaNet module's decode call inside a record_function range: the GPU
          time of its kernels over the GPU time of the whole decode step (every kernel the
          model's decode forward launched); for the patched model also the gdnkit op alone.
  graph   CUDA-graph kernels carry no host ranges, so kernels are sorted by name: gdnkit's
          ("gdn::"), FLA's Triton kernels, causal-conv1d's; decode = profile(N tokens) minus
          profile(prefill). transformers' own torch path compiles into inductor kernels
          that cannot be told apart by name: shown as n/a.

FLA: transformers runs its GatedDeltaNet kernels from flash-linear-attention (`fla`) and
causal-conv1d when they are installed and the tensors are on CUDA, else its PyTorch
reference code. The script prints which packages import and which path the unpatched
model's decode step actually took (the kernels the profiler saw).

Without CUDA (or with --device cuda on a machine without a GPU) it prints why and exits 0;
with a GPU but a gdnkit built without CUDA it exits 1.
"""
import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import time
import warnings

MODELS = {  # family: (config class, model class)
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
}
# --tiny: CPU-sized, same structure (Hk < Hv, head dims multiples of 16)
TINY = dict(vocab_size=256, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
            linear_value_head_dim=32, linear_conv_kernel_dim=4, max_position_embeddings=512)
TINY_FAMILY = {
    "qwen3_5_moe": dict(moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4,
                        num_experts_per_tok=2),
    "qwen3_5": dict(intermediate_size=128),
    "qwen3_next": dict(intermediate_size=128, moe_intermediate_size=64,
                       shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2),
}
KERNEL_CLASSES = (  # (label, substrings of kernel names), first match wins
    ("gdnkit", ("gdn::",)),
    ("fla", ("gated_delta_rule", "fused_recurrent", "chunk_gated", "l2norm_fwd", "layer_norm_gated",
             "rms_norm_gated", "chunk_local_cumsum", "solve_tril", "recompute_w_u")),
    ("causal_conv1d", ("causal_conv1d",)),
)


def log(*a):
    print(*a, flush=True)


def package_report():
    """Which optional kernel packages import (transformers picks FLA / causal-conv1d up when
    they do), and versions."""
    out = {}
    for name in ("fla", "causal_conv1d", "kernels"):
        if importlib.util.find_spec(name) is None:
            out[name] = None
            continue
        try:
            mod = importlib.import_module(name)
            out[name] = getattr(mod, "__version__", "installed")
        except Exception as e:  # noqa: BLE001 (an installed package that fails to import)
            out[name] = f"fails to import: {type(e).__name__}: {e}"
    return out


def layer_types(n):
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def build_model(args, torch, transformers, device, dtype):
    config_name, model_name = MODELS[args.model]
    config_cls, model_cls = getattr(transformers, config_name), getattr(transformers, model_name)
    extra = dict(TINY, **TINY_FAMILY[args.model]) if args.tiny else {}
    config = config_cls(num_hidden_layers=args.layers, layer_types=layer_types(args.layers), **extra)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters created in the benchmark's dtype, on the device
    try:
        with torch.device(device):
            model = model_cls(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval(), config


def gdn_modules(model):
    from gdnkit.torch.transformers import CLASSES

    return [m for m in model.modules() if {c.__name__ for c in type(m).__mro__} & set(CLASSES)]


def sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def generate(model, ids, new_tokens, mode):
    kw = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    if mode == "graph":
        kw["cache_implementation"] = "static"
        if ids.device.type != "cuda":  # transformers compiles on CUDA only unless told otherwise
            from transformers import CompileConfig

            cc = CompileConfig()
            cc._compile_all_devices = True
            kw["compile_config"] = cc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, **kw)


def timed(torch, device, fn):
    sync(torch, device)
    t = time.perf_counter()
    out = fn()
    sync(torch, device)
    return time.perf_counter() - t, out


# ---- profiling ---------------------------------------------------------------------------------

class Ranges:
    """record_function ranges around the model's forward ("decode_step" / "prefill") and each
    GatedDeltaNet module's forward ("gdn_decode" / "gdn_prefill"), by the tokens it gets."""

    def __init__(self, torch, model):
        self.torch = torch
        self.handles = []
        self.stack = []
        self._add(model, "decode_step", "prefill")
        for m in gdn_modules(model):
            self._add(m, "gdn_decode", "gdn_prefill")

    def _add(self, module, decode_name, prefill_name):
        def pre(mod, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states", kwargs.get("input_ids"))
            if x is None:
                x = kwargs.get("inputs_embeds")
            name = decode_name if x is not None and x.dim() >= 2 and x.shape[1] == 1 else prefill_name
            ctx = self.torch.profiler.record_function(name)
            ctx.__enter__()
            self.stack.append(ctx)

        def post(mod, args, kwargs, out):
            self.stack.pop().__exit__(None, None, None)

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post, with_kwargs=True))

    def remove(self):
        for h in self.handles:
            h.remove()


def profile_events(torch, device, fn):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        sync(torch, device)
    return prof.events()


def _is_host(torch, e):
    return getattr(e, "device_type", None) == torch.autograd.DeviceType.CPU


def _time(e, device):
    """A host event's time: the GPU time of the kernels it (and what it calls) launched, or
    its CPU time without a GPU."""
    return e.device_time_total if device == "cuda" else e.cpu_time_total


def eager_shares(torch, device, model, ids, steps):
    """GPU time of the decode steps' GatedDeltaNet layers (and of the gdnkit op) over the
    decode steps' GPU time, with ranges (eager mode)."""
    ranges = Ranges(torch, model)
    try:
        events = profile_events(torch, device, lambda: generate(model, ids, steps + 1, "eager"))
    finally:
        ranges.remove()
    total = {"decode_step": 0.0, "gdn_decode": 0.0, "gdnkit::decode_conv": 0.0}
    count = 0
    kernels = set()
    for e in events:
        if _is_host(torch, e):
            if e.name in total:
                total[e.name] += _time(e, device)
            count += e.name == "decode_step"
        elif device == "cuda":
            kernels.add(e.name)
    step = total["decode_step"]
    return {
        "decode_steps_profiled": count,
        "step_time_us": step / max(count, 1),
        "gdn_share": total["gdn_decode"] / step if step else None,
        "gdnkit_op_share": total["gdnkit::decode_conv"] / step if step else None,
        "kernel_names": sorted(kernels),
    }


def kernel_classes(torch, events):
    """GPU time by kernel-name class ("total": every kernel), and the host calls of the
    gdnkit op (none under CUDA-graph replay, where no host code runs)."""
    out = {"total": 0.0, "gdnkit_op_calls": 0}
    for e in events:
        if _is_host(torch, e):
            out["gdnkit_op_calls"] += e.name == "gdnkit::decode_conv"
            continue
        t = e.device_time_total
        out["total"] += t
        for label, keys in KERNEL_CLASSES:
            if any(k in e.name for k in keys):
                out[label] = out.get(label, 0.0) + t
                break
    return out


def graph_shares(torch, device, model, ids, new_tokens):
    """Kernel-name classes of the decode steps in graph mode: profile(N) - profile(1)."""
    def classes(n):
        return kernel_classes(torch, profile_events(torch, device,
                                                    lambda: generate(model, ids, n, "graph")))

    full, pre = classes(new_tokens), classes(1)
    decode = {k: full.get(k, 0) - pre.get(k, 0) for k in full}
    total = decode.pop("total")
    out = {"gdnkit_op_host_calls": decode.pop("gdnkit_op_calls")}
    if device == "cuda":
        out["step_gpu_time_us"] = total / max(new_tokens - 1, 1)
        out["shares"] = {k: v / total for k, v in decode.items()} if total > 0 else {}
    return out


def which_path(kernel_names):
    """What the unpatched decode step ran, from the kernels it launched."""
    rec = [n for n in kernel_names if any(k in n for k in KERNEL_CLASSES[1][1])]
    conv = [n for n in kernel_names if "causal_conv1d" in n]
    path = {"recurrent step": "FLA Triton kernels" if rec else "transformers' PyTorch reference",
            "conv1d update": "causal-conv1d kernel" if conv else "transformers' PyTorch reference"}
    if rec or conv:
        path["kernels"] = sorted(set(rec + conv))[:6]
    return path


# ---- main ----------------------------------------------------------------------------------------

def measure(torch, device, model, ids, mode, args):
    """One (variant, mode) row: timings, and the profile unless --no-profile."""
    B = ids.shape[0]

    def full():
        return generate(model, ids, args.new_tokens, mode)

    def prefill():
        return generate(model, ids, 1, mode)

    for _ in range(args.warmup):  # graph mode compiles and records its CUDA graphs here
        full()
        prefill()
    t_1s, t_ns, steps = [], [], []
    for _ in range(args.repeats):  # paired, so that drift between the two cancels
        t_1, _ = timed(torch, device, prefill)
        t_n, out = timed(torch, device, full)
        n_new = out.shape[1] - ids.shape[1]
        t_1s.append(t_1)
        t_ns.append(t_n)
        steps.append((t_n - t_1) / max(n_new - 1, 1))
    t_1, t_n, step = (statistics.median(x) for x in (t_1s, t_ns, steps))
    row = dict(new_tokens=n_new, t_prefill_ms=t_1 * 1e3, t_total_ms=t_n * 1e3,
               decode_step_ms=step * 1e3, decode_tokens_per_s=B / step,
               e2e_tokens_per_s=B * n_new / t_n)
    names = []
    if not args.no_profile:
        try:
            if mode == "eager":
                row["profile"] = eager_shares(torch, device, model, ids, args.profile_steps)
                names = row["profile"].pop("kernel_names")
            else:
                row["profile"] = graph_shares(torch, device, model, ids, args.new_tokens)
        except Exception as e:  # noqa: BLE001 (keep the timings)
            row["profile"] = {"error": f"{type(e).__name__}: {e}"}
    return row, out.cpu(), names


def compare_tokens(a, b, prompt_len):
    same = (a == b).all(dim=0)
    if bool(same.all()):
        return "identical"
    first = int((~same).nonzero()[0]) - prompt_len
    return (f"first difference at new token {first} (bf16: gdnkit keeps the conv output, beta and "
            f"the step's output in float32 where transformers rounds them; random weights have "
            f"near ties)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="CPU-sized model (smoke run)")
    ap.add_argument("--model", default="qwen3_5_moe", choices=sorted(MODELS))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["eager", "graph"], choices=["eager", "graph"])
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        log("e2e_transformers: torch is not installed; nothing to measure")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        log("e2e_transformers: no CUDA device (torch.cuda.is_available() is False); nothing to "
            "measure. `--device cpu --tiny` runs the script's logic on the CPU.")
        return 0
    try:
        import transformers
    except ImportError:
        log("e2e_transformers: transformers is not installed (pip install transformers)")
        return 0
    import gdnkit
    import gdnkit.torch as gt

    cuda_ok, why = gdnkit.backend_available("cuda")
    if args.device == "cuda" and not cuda_ok:
        log(f"e2e_transformers: gdnkit has no CUDA backend here ({why}); build it with CUDA")
        return 1
    device = args.device
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    # graph mode compiles the decode forward once per (batch, variant): more than dynamo's
    # default limit of recompilations of one frame, past which it would silently run eager
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    try:
        model, config = build_model(args, torch, transformers, device, dtype)
    except (AttributeError, ImportError) as e:
        log(f"e2e_transformers: transformers {transformers.__version__} has no {args.model}: {e}")
        return 0

    env = {
        "torch": torch.__version__, "transformers": transformers.__version__,
        "gdnkit": gdnkit.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""), "model": args.model, "tiny": args.tiny,
        "layers": config.layer_types, "packages": package_report(),
        "gdn_shape": {"Hk": config.linear_num_key_heads, "Hv": config.linear_num_value_heads,
                      "Dk": config.linear_key_head_dim, "Dv": config.linear_value_head_dim,
                      "conv": config.linear_conv_kernel_dim},
        "experts_implementation": getattr(config, "_experts_implementation", None),
        "attn_implementation": getattr(config, "_attn_implementation", None),
    }
    log(json.dumps(env, indent=1))
    results = {"env": env, "runs": [], "paths": {}, "tokens": {}}

    for B in args.batch:
        ids = torch.randint(1, config.vocab_size, (B, args.prompt_len), device=device,  # 0: padding
                            generator=torch.Generator(device=device).manual_seed(B))
        tokens = {}
        for variant in ("hf", "gdnkit"):
            patch = gt.patch_transformers(model) if variant == "gdnkit" else None
            try:
                for mode in args.modes:
                    row = {"batch": B, "variant": variant, "mode": mode}
                    try:
                        timing, tokens[(variant, mode)], names = measure(torch, device, model, ids,
                                                                         mode, args)
                    except Exception as e:  # noqa: BLE001 (report and go on: e.g. no static cache)
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                        log(f"B={B} {variant:6s} {mode:5s}: failed: {row['error']}")
                        results["runs"].append(row)
                        continue
                    row.update(timing)
                    if variant == "hf" and names and device == "cuda":
                        results["paths"][B] = which_path(names)
                    if patch is not None and patch.stats is not None:
                        row["gdnkit_eager_calls_so_far"] = patch.gdnkit_calls
                    profile = f"  profile {json.dumps(row['profile'])}" if row.get("profile") else ""
                    log(f"B={B} {variant:6s} {mode:5s}: decode step {row['decode_step_ms']:8.3f} ms "
                        f"{row['decode_tokens_per_s']:9.1f} tok/s (end-to-end "
                        f"{row['e2e_tokens_per_s']:8.1f} tok/s, prefill {row['t_prefill_ms']:.2f} ms)"
                        + profile)
                    results["runs"].append(row)
            finally:
                if patch is not None:
                    patch.unpatch()
        for mode in args.modes:
            if ("hf", mode) in tokens and ("gdnkit", mode) in tokens:
                msg = compare_tokens(tokens[("hf", mode)], tokens[("gdnkit", mode)], args.prompt_len)
                results["tokens"][f"B={B} {mode}"] = msg
                log(f"B={B} {mode}: greedy tokens hf vs gdnkit: {msg}")
    if results["paths"]:
        log("transformers' own decode path (unpatched), from the kernels it launched: "
            + json.dumps(results["paths"]))
    else:
        log("transformers' own decode path: not profiled (CPU, or --no-profile); FLA and "
            "causal-conv1d run only on CUDA tensors: on the CPU it is the PyTorch reference")
    summary(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


def share(row):
    """The GatedDeltaNet share of a row's decode GPU time, as text."""
    p = row.get("profile") or {}
    v = p.get("gdn_share")  # eager: the GatedDeltaNet layers' ranges
    if v is None and p.get("shares"):  # graph: kernels by name
        if row["variant"] == "hf":  # FLA's + causal-conv1d's (none on the torch path)
            v = sum(x for k, x in p["shares"].items() if k != "gdnkit")
            # profile(N) - profile(1) leaves +-1e-5 where the decode graph ran none of them
            v = v if v > 1e-3 else None
        else:
            v = p["shares"].get("gdnkit")
    return f"{v:6.1%}" if isinstance(v, float) else "   n/a"


def summary(results, args):
    rows = {(r["batch"], r["mode"], r["variant"]): r for r in results["runs"] if "error" not in r}
    log("\nGDN share: eager, the GatedDeltaNet layers (projections included) in the decode "
        "step's GPU time (CPU time with --device cpu);\ngraph, kernels by name (hf: FLA + "
        "causal-conv1d kernels, n/a on the torch path; gdnkit: its kernel)")
    log("batch mode  | hf step ms  gdnkit step ms  speed-up | hf tok/s  gdnkit tok/s "
        "| GDN share hf  gdnkit")
    for B in args.batch:
        for mode in args.modes:
            hf, gk = rows.get((B, mode, "hf")), rows.get((B, mode, "gdnkit"))
            if not hf or not gk:
                continue
            log(f"{B:5d} {mode:5s} | {hf['decode_step_ms']:8.3f} {gk['decode_step_ms']:14.3f} "
                f"{hf['decode_step_ms'] / gk['decode_step_ms']:9.2f}x "
                f"| {hf['decode_tokens_per_s']:8.1f} {gk['decode_tokens_per_s']:13.1f} "
                f"| {share(hf):>12s} {share(gk):>7s}")


if __name__ == "__main__":
    sys.exit(main())
