#!/usr/bin/env python3
"""Per-call overhead of gdnkit's PyTorch op at B = 1 (Qwen3.5-35B-A3B shape), eager and graph-replayed.

    python python/bench_overhead.py [--device cuda] [--calls 2000] [--json out.json]

For each state dtype and layout it reports, in microseconds per call:
  graph     the op captured in a CUDA graph (50 calls per graph, replayed): the GPU time
            of one call with no host work, i.e. the kernel plus the graph's launch gap
  eager     torch.ops.gdnkit.decode_packed called back to back in Python, wall time per
            call (host-bound at B = 1: this is what the dispatcher + Python + launch cost)
  overhead  eager - graph
and, eager only, the other ways in: the raw path under the op (no dispatcher),
gdnkit.decode on torch tensors (DLPack), the drop-in wrappers (ExecuTorch in-place and
out-of-place, vLLM, FLA), plus torch's own add_ on one element as a yardstick of
framework dispatch on this machine. State and inputs stay hot in L2 (this measures the
call path, not HBM; bench/ has the cold-L2 kernel numbers).
"""
import argparse
import json
import os
import statistics
import sys
import time

# Run as `python python/bench_overhead.py`, Python puts python/ first on sys.path, where
# python/gdnkit is the source package without its built extension: use the installed one.
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import torch  # noqa: E402

import gdnkit  # noqa: E402
import gdnkit.torch as gt  # noqa: E402
from gdnkit.torch import _ops, executorch, fla, vllm  # noqa: E402

B, HK, HV, DK, DV = 1, 16, 32, 128, 128
GRAPH_CALLS = 50


def make_inputs(device, state_dtype, layout, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, 2 * HK * DK + HV * DV, generator=gen).to(torch.bfloat16)
    a = torch.randn(B, HV, generator=gen).to(torch.bfloat16)
    b = torch.randn(B, HV, generator=gen).to(torch.bfloat16)
    A_log = torch.log(torch.empty(HV).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(HV, generator=gen) * 0.1
    shape = (B, HV, DK, DV) if layout == "kv" else (B, HV, DV, DK)
    state = (torch.randn(shape, generator=gen) * 0.1).to(state_dtype)
    return [x.to(device) for x in (qkv, a, b, A_log, dt_bias, state)]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def eager_us(fn, device, calls, repeats=5):
    """Median over repeats of wall time per call for `calls` back-to-back calls."""
    for _ in range(20):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def graph_us(fn, device, replays=40):
    """GPU time per call of GRAPH_CALLS calls captured in one CUDA graph (median of replays)."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    for _ in range(5):
        g.replay()
    sync(device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / GRAPH_CALLS)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    calls = args.calls if device.type == "cuda" else max(args.calls // 20, 20)

    info = gdnkit.info()
    print(f"gdnkit {info['version']}, torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"shape: B={B} Hk={HK} Hv={HV} Dk={DK} Dv={DV}, qkv/a/b bf16; {calls} eager calls\n")

    results = {"device": str(device), "torch": torch.__version__, "shape": [B, HK, HV, DK, DV],
               "rows": []}
    one = torch.zeros(1, device=device)
    yardstick = eager_us(lambda: one.add_(1.0), device, calls)
    results["torch_add__us"] = yardstick

    header = "| state | layout | graph µs | eager op µs | overhead µs |"
    print(header)
    print("|---|---|---:|---:|---:|")
    for state_dtype in (torch.float32, torch.bfloat16):
        for layout in ("vk", "kv"):
            qkv, a, b, A_log, dt_bias, state = make_inputs(device, state_dtype, layout)
            lay = _ops.KV if layout == "kv" else _ops.VK

            def op():
                torch.ops.gdnkit.decode_packed(qkv, a, b, A_log, dt_bias, state, layout=lay)

            row = {"state": str(state_dtype).replace("torch.", ""), "layout": layout}
            row["eager_op_us"] = eager_us(op, device, calls)
            row["graph_us"] = graph_us(op, device) if device.type == "cuda" else None
            g = row["graph_us"]
            over = row["eager_op_us"] - g if g is not None else None
            row["overhead_us"] = over
            results["rows"].append(row)
            print(f"| {row['state']} | {layout} | {g if g is None else f'{g:.2f}'} | "
                  f"{row['eager_op_us']:.2f} | {over if over is None else f'{over:.2f}'} |")

    # The other ways in (fp32 state), eager.
    print("\nEager, other entry points (state fp32), µs per call:")
    qkv, a, b, A_log, dt_bias, state = make_inputs(device, torch.float32, "vk")
    out = torch.empty(B, HV, DV, dtype=torch.bfloat16, device=device)
    kv_state = make_inputs(device, torch.float32, "kv")[5]
    q = qkv[:, : HK * DK].view(B, 1, HK, DK)
    k = qkv[:, HK * DK: 2 * HK * DK].view(B, 1, HK, DK)
    v = qkv[:, 2 * HK * DK:].view(B, 1, HV, DV)
    idx = torch.zeros(B, dtype=torch.int32, device=device)
    g_fla = torch.randn(B, 1, HV, device=device).sigmoid().log()
    beta_fla = torch.rand(B, 1, HV, device=device)
    fla_state = kv_state.clone()
    alpha, beta_raw = a.float(), b.float()  # ExecuTorch's test passes fp32 gates
    entries = {
        "raw path (no dispatcher: _ops.run)": lambda: _ops.run(
            qkv=qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, out=out,
            layout=_ops.VK, gate=_ops.RAW, l2norm=_ops.RSQRT),
        "torch.ops.gdnkit.decode_packed": lambda: torch.ops.gdnkit.decode_packed(
            qkv, a, b, A_log, dt_bias, state),
        "gdnkit.torch.decode (string options)": lambda: gt.decode(
            qkv=qkv, a=a, b=b, state=state, A_log=A_log, dt_bias=dt_bias),
        "gdnkit.decode (DLPack path)": lambda: gdnkit.decode(
            qkv=qkv, a=a, b=b, state=state, A_log=A_log, dt_bias=dt_bias, out=out),
        "ExecuTorch fused_deltanet_decode_ (in place)": lambda: executorch.fused_deltanet_decode_(
            qkv, alpha, beta_raw, A_log, dt_bias, kv_state),
        "ExecuTorch fused_deltanet_decode (out of place + clone)": lambda: executorch.fused_deltanet_decode(
            qkv, alpha, beta_raw, A_log, dt_bias, kv_state),
        "vLLM fused_sigmoid_gating_delta_rule_update": lambda: vllm.fused_sigmoid_gating_delta_rule_update(
            A_log, a, b, dt_bias, q, k, v, initial_state=state, ssm_state_indices=idx,
            use_qk_l2norm_in_kernel=True),
        "FLA fused_recurrent_gated_delta_rule": lambda: fla.fused_recurrent_gated_delta_rule(
            q, k, v, g=g_fla, beta=beta_fla, initial_state=fla_state, output_final_state=True,
            use_qk_l2norm_in_kernel=True),
    }
    results["entry_points_us"] = {}
    for name, fn in entries.items():
        us = eager_us(fn, device, calls)
        results["entry_points_us"][name] = us
        print(f"  {us:8.2f}  {name}")
    print(f"  {yardstick:8.2f}  (yardstick: torch add_ on one element)")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
