// GPU benchmark of the fused middle of a GDN layer: conv1d update
// + decode step + gated RMSNorm in one launch, against
//   - the step alone (the same call without the prologue and epilogue), and
//   - the same three stages as separate kernels: our conv kernel, our step,
//     our norm kernel (separate_stages.cuh);
// and programmatic dependent launch (PDL): a CUDA graph of an upstream
// stand-in kernel (the B = 1 input projection's weight bytes) followed by the
// fused middle, with and without `programmatic_launch`.
//
// Protocol as bench_cuda (docs/benchmarks.md): graph replay over rotating
// sets past 2x the L2, median of replays. Qwen3.5-35B-A3B shape, W = 4,
// bf16 inputs, in place.
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "gdnkit/gdnkit.hpp"
#include "gdnkit/half.hpp"
#include "separate_stages.cuh"
#if defined(GDN_TRACE)
#include "../backends/cuda/device.h"
#endif

namespace {

using namespace gdn_bench;

constexpr int kConvWidth = 4;

// The bed plus what the fused middle touches per set: the conv state pool,
// z (x is the set's packed row) and the layer's weights (conv weight and
// bias, norm weight): each set's own, cold at every call as a layer's are
// in a model's step (one copy for every set, as before 2026-12-02, sat in
// L2 after the first call).
struct FusedBed {
  Bed bed;
  std::vector<void*> conv_state, z, conv_weight, conv_bias, norm_weight;
  void* y{nullptr};      // separate stages: the conv output
  void* o_raw{nullptr};  // separate stages: the step's output before the norm
  // the upstream stand-in: the in_proj weight bytes at B = 1 (hidden 2048 x
  // (conv_dim + Hv*Dv z + 2*Hv a, b) in bf16: 48 MiB), cold at every call
  // as a model's are (each layer has its own): rotating buffers, as many
  // as keep more than twice the L2 between two uses of one, their count a
  // divisor of the sets' so that the rotation holds across a graph's wrap
  // (with few sets, large B, one a set).
  // (One buffer for every call, as before 2026-12-02, stayed partly in the
  // H200's 60 MiB L2, and by how much depended on what ran before: the
  // stand-in alone took 13.9 or 15.2-15.7 us a call in the same process.)
  std::vector<void*> proj_weights;
  size_t proj_bytes{0};
  const uint4* proj_weight(const Set& st) const {
    return static_cast<const uint4*>(proj_weights[index_of(st) % proj_weights.size()]);
  }

  explicit FusedBed(const Shape& s) : bed(s) {
    const int64_t cdim = bed.conv_dim, B = s.B;
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> u(-0.6f, 0.6f);
    auto upload = [&](void** dst, int64_t n, float lo, float hi) {
      std::uniform_real_distribution<float> d(lo, hi);
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (auto& x : h) x = gdn::float_to_bf16(d(rng));
      GDN_BENCH_CHECK(cudaMalloc(dst, size_t(n) * 2));
      GDN_BENCH_CHECK(cudaMemcpy(*dst, h.data(), size_t(n) * 2, cudaMemcpyHostToDevice));
    };
    for (size_t i = 0; i < bed.sets.size(); ++i) {
      void* cs = nullptr;
      void* zz = nullptr;
      void *cw = nullptr, *cb = nullptr, *nw = nullptr;
      upload(&cs, B * cdim * (kConvWidth - 1), -1.f, 1.f);
      upload(&zz, B * s.hv * s.d, -2.f, 2.f);
      upload(&cw, cdim * kConvWidth, -0.6f, 0.6f);
      upload(&cb, cdim, -0.2f, 0.2f);
      upload(&nw, s.d, 0.5f, 1.5f);
      conv_state.push_back(cs);
      z.push_back(zz);
      conv_weight.push_back(cw);
      conv_bias.push_back(cb);
      norm_weight.push_back(nw);
    }
    GDN_BENCH_CHECK(cudaMalloc(&y, size_t(B * cdim) * 2));
    GDN_BENCH_CHECK(cudaMalloc(&o_raw, size_t(B * s.hv * s.d) * 2));
    proj_bytes = size_t(2048) * size_t(cdim + int64_t(s.hv) * s.d + 2 * s.hv) * 2;
    int l2 = 0;
    GDN_BENCH_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    size_t n_proj = 2 + 2 * size_t(l2) / proj_bytes;
    if (bed.sets.size() <= n_proj)
      n_proj = bed.sets.size();  // one a set (large B, whose sets are few and large; no stand-in row uses one)
    else
      while (bed.sets.size() % n_proj != 0) ++n_proj;  // ends at the sets' count at the latest
    for (size_t i = 0; i < n_proj; ++i) {
      void* w = nullptr;
      GDN_BENCH_CHECK(cudaMalloc(&w, proj_bytes));
      GDN_BENCH_CHECK(cudaMemset(w, 0, proj_bytes));
      proj_weights.push_back(w);
    }
  }
  ~FusedBed() {
    for (void* p : conv_state) cudaFree(p);
    for (void* p : z) cudaFree(p);
    for (void* p : conv_weight) cudaFree(p);
    for (void* p : conv_bias) cudaFree(p);
    for (void* p : norm_weight) cudaFree(p);
    cudaFree(y);
    cudaFree(o_raw);
    for (void* w : proj_weights) cudaFree(w);
  }
  size_t index_of(const Set& st) const { return size_t(&st - bed.sets.data()); }
  // The upstream stand-in before set st's call: blocks of 512 threads
  // stream its weights and write the row's x (q|k|v) and z; with `trace`,
  // each block's start and end (`trace pdl`).
  void upstream(const Set& st, int blocks, unsigned long long* trace = nullptr) const {
    launch_projection_standin(proj_weight(st), int64_t(proj_bytes / 16), static_cast<bf16*>(st.qkv),
                              bed.s.B * bed.conv_dim, static_cast<bf16*>(z[index_of(st)]), bed.s.B * bed.s.hv * bed.s.d,
                              blocks, bed.stream, trace);
  }

  // The fused middle on set st (conv and norm as asked).
  gdn::DecodeParams fused(const Set& st, bool conv, bool norm) const {
    gdn::DecodeParams p = bed.params(st);
    const size_t i = index_of(st);
    if (conv) {
      p.conv_width = kConvWidth;
      gdn::set_dense_strides(p);  // x and the conv state strides
      p.q = p.k = p.v = nullptr;
      p.x = st.qkv;
      p.conv_state = conv_state[i];
      p.conv_weight = conv_weight[i];
      p.conv_bias = conv_bias[i];
    }
    if (norm) {
      p.z = z[i];
      p.norm_weight = norm_weight[i];
    }
    return p;
  }
};

std::string label(const Shape& s) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "B=%lld %s %s", (long long)s.B, gdn::to_string(s.state), gdn::to_string(s.layout));
  return buf;
}

// µs per call of a graph of `mult` times the protocol's calls (the sets
// rotating as in every graph: each set's bytes still cold when it recurs).
template <typename Enqueue>
double time_calls(FusedBed& fb, Enqueue&& enqueue, int mult = 1) {
  const int n = fb.bed.calls() * mult;
  cudaGraphExec_t g = fb.bed.capture(n, [&](const Set& cur, const Set& next) { enqueue(cur, next); });
  const double us = fb.bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  return us;
}

void check(const gdn::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_fused: %s\n", s.message);
    std::exit(1);
  }
}

struct Row {
  std::string name;
  double step, fused, separate, conv_only, norm_only;
};
std::vector<Row> g_rows;
struct PdlRow {
  std::string name, what, upstream_carveout;
  double upstream, without, with;
  // a call's cost in a long graph: the slope of graph time over calls
  // (graphs of n and 2 n calls), free of the graph's own launch and drain
  double without_steady, with_steady;
};
std::vector<PdlRow> g_pdl;

// fused middle vs step alone vs the three separate kernels
void BM_Middle(benchmark::State& st, Shape shape) {
  FusedBed fb(shape);
  double step = 0, fused = 0, sep = 0, conv_only = 0, norm_only = 0;
  for (auto _ : st) {
    step = time_calls(fb, [&](const Set& cur, const Set&) { check(gdn::decode(fb.bed.params(cur), gdn::Backend::kCuda)); });
    fused = time_calls(fb, [&](const Set& cur, const Set&) { check(gdn::decode(fb.fused(cur, true, true), gdn::Backend::kCuda)); });
    conv_only = time_calls(fb, [&](const Set& cur, const Set&) { check(gdn::decode(fb.fused(cur, true, false), gdn::Backend::kCuda)); });
    norm_only = time_calls(fb, [&](const Set& cur, const Set&) { check(gdn::decode(fb.fused(cur, false, true), gdn::Backend::kCuda)); });
    sep = time_calls(fb, [&](const Set& cur, const Set&) {
      const size_t i = fb.index_of(cur);
      const Shape& s = fb.bed.s;
      launch_conv_update(static_cast<const bf16*>(cur.qkv), static_cast<bf16*>(fb.conv_state[i]),
                         static_cast<const bf16*>(fb.conv_weight[i]), static_cast<const bf16*>(fb.conv_bias[i]),
                         static_cast<bf16*>(fb.y), s.B, fb.bed.conv_dim, kConvWidth, fb.bed.stream);
      gdn::DecodeParams p = fb.bed.params(cur);
      gdn::set_packed_qkv(p, fb.y, fb.bed.conv_dim);
      p.o = fb.o_raw;
      check(gdn::decode(p, gdn::Backend::kCuda));
      launch_gated_rmsnorm(static_cast<const bf16*>(fb.o_raw), static_cast<const bf16*>(fb.z[i]),
                           static_cast<const bf16*>(fb.norm_weight[i]), static_cast<bf16*>(cur.o), s.B * s.hv, s.d,
                           1e-6f, fb.bed.stream);
      GDN_BENCH_CHECK(cudaGetLastError());
    });
    st.SetIterationTime(fused * 1e-6);
  }
  st.counters["step_us"] = step;
  st.counters["separate_us"] = sep;
  st.counters["fused_over_step"] = fused / step;
  g_rows.push_back({label(shape), step, fused, sep, conv_only, norm_only});
}

// upstream stand-in -> fused middle (or the step alone), with and without
// PDL. up_carveout: the stand-in's preferred shared-memory carveout. A GEMM
// keeps its SMs' carveout at (or near) all shared memory (100); a kernel
// that uses none, as the stand-in does, gets the driver's default (-1), a
// small one that cannot hold our blocks until its SMs drain (the PDL rows
// of bench/RESULTS.md; docs/decisions.md#pdl).
void BM_Pdl(benchmark::State& st, Shape shape, bool middle, int up_carveout) {
  FusedBed fb(shape);
  int sms = 0;
  GDN_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GDN_BENCH_CHECK(
      cudaFuncSetAttribute(projection_standin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, up_carveout));
  auto upstream = [&](const Set& cur) { fb.upstream(cur, 2 * sms); };
  double up = 0, without = 0, with = 0, without_steady = 0, with_steady = 0;
  auto plain = [&](const Set& cur, const Set&) {
    upstream(cur);
    check(gdn::decode(fb.fused(cur, middle, middle), gdn::Backend::kCuda));
  };
  auto programmatic = [&](const Set& cur, const Set&) {
    upstream(cur);
    gdn::DecodeParams p = fb.fused(cur, middle, middle);
    p.programmatic_launch = true;
    check(gdn::decode(p, gdn::Backend::kCuda));
  };
  for (auto _ : st) {
    up = time_calls(fb, [&](const Set& cur, const Set&) { upstream(cur); });
    without = time_calls(fb, plain);
    with = time_calls(fb, programmatic);
    // slope: (2 n us_2n - n us_n) / n
    without_steady = 2 * time_calls(fb, plain, 2) - without;
    with_steady = 2 * time_calls(fb, programmatic, 2) - with;
    st.SetIterationTime(with * 1e-6);
  }
  st.counters["without_us"] = without;
  st.counters["gain_us"] = without - with;
  g_pdl.push_back({label(shape), middle ? "middle" : "step", up_carveout < 0 ? "default" : "all shared", up,
                   without, with, without_steady, with_steady});
}

// `bench_fused graphlen`: whether a call's time depends on how many calls
// the graph holds. Per call of graphs of n, 2 n and 4 n calls (n the
// protocol's, the sets rotating as always), and the slopes between them
// (the cost of one more call in a longer graph): the copy floor's kernel
// into the set's own destination, the step alone, and the upstream
// stand-in (default carveout) followed by the step without and with PDL,
// those again after each other and after the stand-in alone (a row that
// moved with what ran before it would show; bench/RESULTS.md).
void graph_length(const Shape& shape) {
  FusedBed fb(shape);
  int sms = 0;
  GDN_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GDN_BENCH_CHECK(cudaFuncSetAttribute(projection_standin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, -1));
  const int64_t vecs = int64_t(fb.bed.state_bytes / 16);
  const unsigned blocks = fb.bed.copy_blocks();
  auto copy = [&](const Set& cur, const Set&) {
    copy_kernel<4><<<blocks, 256, 0, fb.bed.stream>>>(static_cast<const uint4*>(cur.state),
                                                      static_cast<uint4*>(cur.copy_dst), vecs);
  };
  auto step = [&](const Set& cur, const Set&) { check(gdn::decode(fb.bed.params(cur), gdn::Backend::kCuda)); };
  auto behind = [&](bool pdl) {
    return [&, pdl](const Set& cur, const Set&) {
      fb.upstream(cur, 2 * sms);
      gdn::DecodeParams p = fb.bed.params(cur);
      p.programmatic_launch = pdl;
      check(gdn::decode(p, gdn::Backend::kCuda));
    };
  };
  auto row = [&](const char* what, auto&& enqueue) {
    const double u1 = time_calls(fb, enqueue, 1), u2 = time_calls(fb, enqueue, 2), u4 = time_calls(fb, enqueue, 4);
    std::printf("%-16s %-18s n %3d: %8.2f %8.2f %8.2f us/call at n, 2n, 4n calls; slope n->2n %8.2f, 2n->4n %8.2f\n",
                label(shape).c_str(), what, fb.bed.calls(), u1, u2, u4, 2 * u2 - u1, 2 * u4 - u2);
  };
  auto up_alone = [&](const Set& cur, const Set&) { fb.upstream(cur, 2 * sms); };
  row("copy floor kernel", copy);
  row("step", step);
  row("upstream + step", behind(false));
  row("upstream + step PDL", behind(true));
  row("upstream + step", behind(false));
  row("upstream alone", up_alone);
  row("upstream + step", behind(false));
  row("upstream + step PDL", behind(true));
}

#if defined(GDN_TRACE)
// The trace mode's A/B switches, read here and handed to the library's one
// seam for them (gpu::PlanOverrides): GDN_NO_SPREAD=1, GDN_MAX_CLUSTER=n,
// GDN_PDL_LATE=1, GDN_STATE_FIRST=1 (docs/benchmarks.md).
gdn::gpu::PlanOverrides trace_overrides() {
  gdn::gpu::PlanOverrides o;
  o.spread_pdl_smem = std::getenv("GDN_NO_SPREAD") == nullptr;
  if (const char* mc = std::getenv("GDN_MAX_CLUSTER")) o.max_cluster = std::max(1, std::atoi(mc));
  if (std::getenv("GDN_PDL_LATE") != nullptr) o.kernel_load_order = 0;
  if (std::getenv("GDN_STATE_FIRST") != nullptr) o.kernel_load_order = 1;
  return o;
}
void check_traced(const gdn::DecodeParams& p) {
  static const gdn::gpu::PlanOverrides o = trace_overrides();
  const cudaError_t err = gdn::cuda::decode_with(p, o);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "decode: %s\n", cudaGetErrorString(err));
    std::exit(1);
  }
}
// `bench_fused trace` (a build with -DGDN_TRACE only): where the time of one
// cold B = 1 call goes. The kernels store clock64 at their phase marks
// (decode_kernel_impl.cuh, GDN_MARK) for thread 0 of every block; printed
// per mark: the median and the largest time since the block's first mark,
// in ns at the SM clock; plus the spread of the blocks' start times and the
// span from the first block's start to the last block's end (global timer).
// Marks: 0 entry, 1 entry work done (the state issued under PDL), 2
// prologue done, 3 q/k normalized, 4 after the cluster wait, 5 state in
// (last item), 6 step done, 7 all outputs in (norm), 8 end; inside the
// fused prologue: 9 its loads issued, 10 the state's issued, 11 its
// arithmetic done, 12 the gates done; in the step kernels (no prologue): 9
// the small loads issued, 10 the state's; 13 the fused kernels past their
// cluster arrival (after mark 2), 16 their q/k read back before the l2norm,
// 17 their first item's or tile's reduction done, 18 the norm's rstd formed
// (after its barrier), 19 the fused prologue entered, 20 its runs form
// entered, 21 a thread's first run about to load (9 once it has). Slots 14
// and 15 hold the global timer.
// How long a kernel waits for its parameters when they are cold: thread 0
// reads one word from each 64-byte line of a 448-byte parameter block in
// turn (each read a dependency of the next clock read), after 256 MiB of
// writes evicted everything from L2; launched from a graph (parameters in
// device memory, as for our benchmark) and from the stream.
// Words a block's trace takes (decode_kernel_impl.cuh, trace_mark), and the
// marks printed (0 .. kTraceMarks - 1, slots 14 and 15 being timers).
constexpr size_t kTraceWords = 32;
constexpr int kTraceMarks = 22;
struct ParamBlock {
  unsigned long long w[56];
};
// prefetch: first one indexed load (LDC, issued without waiting) from every
// line at once, so the timed chain shows whether that warms the constant
// cache the direct operands read.
__global__ void param_probe(const __grid_constant__ ParamBlock b, unsigned long long* out, bool prefetch) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  unsigned long long t, acc = 0;
  if (prefetch) {
    const unsigned z = blockIdx.y;  // 0, unknown to the compiler
    unsigned long long pre = 0;
#pragma unroll
    for (int l = 0; l < 7; ++l) pre ^= b.w[z + 8 * l];
    out[9] = pre;  // waits for all of them
  }
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  out[0] = t;
#pragma unroll
  for (int l = 0; l < 7; ++l) {
    acc += b.w[8 * l];
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) : "l"(acc) : "memory");
    out[1 + l] = t;
  }
  out[8] = acc;
}
void param_probe_run(double ghz) {
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  unsigned long long* out = nullptr;
  GDN_BENCH_CHECK(cudaMalloc(&flush, flush_bytes));
  GDN_BENCH_CHECK(cudaMalloc(&out, 64 * 8));
  ParamBlock pb{};
  for (int i = 0; i < 56; ++i) pb.w[i] = i;
  cudaStream_t s;
  GDN_BENCH_CHECK(cudaStreamCreate(&s));
  for (int mode = 0; mode < 3; ++mode) {
    for (int rep = 0; rep < 3; ++rep) {
      if (mode != 1) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        GDN_BENCH_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        GDN_BENCH_CHECK(cudaMemsetAsync(flush, rep, flush_bytes, s));
        param_probe<<<1, 32, 0, s>>>(pb, out, mode == 2);
        GDN_BENCH_CHECK(cudaStreamEndCapture(s, &graph));
        GDN_BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        GDN_BENCH_CHECK(cudaGraphLaunch(exec, s));
        GDN_BENCH_CHECK(cudaGraphLaunch(exec, s));
        GDN_BENCH_CHECK(cudaStreamSynchronize(s));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      } else {
        GDN_BENCH_CHECK(cudaMemsetAsync(flush, rep, flush_bytes, s));
        param_probe<<<1, 32, 0, s>>>(pb, out, false);
        GDN_BENCH_CHECK(cudaStreamSynchronize(s));
      }
      unsigned long long h[9];
      GDN_BENCH_CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
      std::printf("param probe (%s launch), ns to each next 64-byte line of parameters:",
                  mode == 0 ? "graph" : mode == 1 ? "stream" : "graph, prefetched");
      for (int l = 1; l < 8; ++l) std::printf(" %6.0f", double(h[l] - h[l - 1]) / ghz);
      std::printf("\n");
    }
  }
  cudaStreamDestroy(s);
  cudaFree(flush);
  cudaFree(out);
}

// A traced graph of n calls: its time a call (time_graph, over the
// rotation), then one more replay into a cleared trace buffer of `words`
// 64-bit words, copied back; the graph is destroyed.
std::vector<unsigned long long> replay_traced(FusedBed& fb, cudaGraphExec_t g, int n, unsigned long long* buf,
                                              size_t words, double* us) {
  *us = fb.bed.time_graph(g, n);
  GDN_BENCH_CHECK(cudaMemset(buf, 0, words * 8));
  GDN_BENCH_CHECK(cudaGraphLaunch(g, fb.bed.stream));
  GDN_BENCH_CHECK(cudaStreamSynchronize(fb.bed.stream));
  cudaGraphExecDestroy(g);
  std::vector<unsigned long long> h(words);
  GDN_BENCH_CHECK(cudaMemcpy(h.data(), buf, words * 8, cudaMemcpyDeviceToHost));
  return h;
}

void trace_one(const Shape& s, bool conv, bool norm, double ghz, bool hot = false) {
  FusedBed fb(s);
  const size_t words = size_t(1) << 20;
  unsigned long long* buf = nullptr;
  GDN_BENCH_CHECK(cudaMalloc(&buf, words * 8));
  const int n = fb.bed.calls();
  cudaGraphExec_t g = fb.bed.capture(n, [&](const Set& cur, const Set&) {
    gdn::DecodeParams p = fb.fused(hot ? fb.bed.sets[0] : cur, conv, norm);
    p.invalid_index_count = reinterpret_cast<uint32_t*>(buf);
    check_traced(p);
  });
  double us = 0;
  const std::vector<unsigned long long> h = replay_traced(fb, g, n, buf, words, &us);
  cudaFree(buf);
  std::vector<std::vector<double>> d(kTraceMarks);
  std::vector<double> starts;
  unsigned long long g0 = ~0ull, g1 = 0;
  for (size_t blk = 0; blk < words / kTraceWords; ++blk) {
    const unsigned long long* t = &h[blk * kTraceWords];
    if (t[14] == 0) continue;
    starts.push_back(double(t[14]));
    g0 = std::min(g0, t[14]);
    g1 = std::max(g1, t[15]);
    for (int k = 1; k < kTraceMarks; ++k)
      if (k != 14 && k != 15 && t[k] != 0) d[k].push_back(double(t[k] - t[0]) / ghz);
  }
  std::sort(starts.begin(), starts.end());
  std::printf("%-16s %-14s %7.2f us/call %5zu blocks, starts spread %6.0f ns (median %6.0f), span %6.0f ns |",
              label(s).c_str(),
              (std::string(conv && norm ? "conv+norm" : conv ? "conv" : norm ? "norm" : "step") + (hot ? " hot" : "")).c_str(), us,
              starts.size(), starts.empty() ? 0.0 : starts.back() - starts.front(),
              starts.empty() ? 0.0 : starts[starts.size() / 2] - starts.front(), double(g1 - g0));
  for (int k = 1; k < kTraceMarks; ++k) {
    if (k == 14 || k == 15) continue;
    if (d[k].empty()) {
      std::printf("  %d: -", k);
      continue;
    }
    std::sort(d[k].begin(), d[k].end());
    std::printf("  %d: %5.0f/%5.0f", k, d[k][d[k].size() / 2], d[k].back());
  }
  std::printf("\n");
}

// The calls of a graph back to back: each call gets its own trace region (the
// kernels' global-timer marks 0 and 8, slots 14 and 15 of every block), so
// per call the span from its first block's start to its last block's end and
// the gap to the next call's first block show what a call costs outside its
// blocks (launch, drain). The copy floor's kernel, with the same two marks,
// over the same rotating state, for comparison.
__global__ void copy_kernel_traced(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n,
                                   unsigned long long* trace) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  if (threadIdx.x == 0) trace[size_t(blockIdx.x) * kTraceWords + 14] = t;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) dst[i] = src[i];
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  if (threadIdx.x == 0) trace[size_t(blockIdx.x) * kTraceWords + 15] = t;
}
// tail: also the times (since the call's first block start) by which 50%,
// 90% and 99% of the call's blocks had ended, medians over the calls: a
// large step from the 90% time to the span is a last wave running short of
// blocks. Up to max_blocks blocks a call.
void trace_calls(const Shape& s, bool copy, bool tail = false, size_t max_blocks = 8192) {
  FusedBed fb(s);
  const int n = fb.bed.calls();
  const size_t per_call = max_blocks * kTraceWords;  // words: up to max_blocks blocks a call
  unsigned long long* buf = nullptr;
  GDN_BENCH_CHECK(cudaMalloc(&buf, n * per_call * 8));
  const int64_t vecs = int64_t(fb.bed.state_bytes / 16);
  const unsigned copy_blocks = fb.bed.copy_blocks();
  int c = 0;
  cudaGraphExec_t g = fb.bed.capture(n, [&](const Set& cur, const Set&) {
    unsigned long long* t = buf + size_t(c++) * per_call;
    if (copy) {
      copy_kernel_traced<<<copy_blocks, 256, 0, fb.bed.stream>>>(static_cast<const uint4*>(cur.state),
                                                                 static_cast<uint4*>(fb.bed.scratch), vecs, t);
    } else {
      gdn::DecodeParams p = fb.fused(cur, false, false);
      p.invalid_index_count = reinterpret_cast<uint32_t*>(t);
      check_traced(p);
    }
  });
  double us = 0;
  const std::vector<unsigned long long> h = replay_traced(fb, g, n, buf, n * per_call, &us);
  cudaFree(buf);
  std::vector<double> first(n, 1e30), last(n, 0), span, gap;
  std::vector<std::vector<double>> ends(n);
  for (int i = 0; i < n; ++i)
    for (size_t blk = 0; blk < max_blocks; ++blk) {
      const unsigned long long* t = &h[i * per_call + blk * kTraceWords];
      if (t[14] == 0) continue;
      first[i] = std::min(first[i], double(t[14]));
      last[i] = std::max(last[i], double(t[15]));
      ends[i].push_back(double(t[15]));
    }
  if (tail) {
    const double qs[3] = {0.5, 0.9, 0.99};
    std::vector<double> at[3];
    size_t blocks = 0;
    for (int i = 0; i < n; ++i) {
      if (ends[i].empty()) continue;
      std::sort(ends[i].begin(), ends[i].end());
      blocks = ends[i].size();
      for (int k = 0; k < 3; ++k) at[k].push_back(ends[i][size_t(qs[k] * double(ends[i].size() - 1))] - first[i]);
    }
    for (auto& v : at) std::sort(v.begin(), v.end());
    if (at[0].empty()) {
      std::printf("%-16s %-5s tail: no blocks traced\n", label(s).c_str(), copy ? "copy" : "step");
      return;
    }
    std::printf("%-16s %-5s tail: %zu blocks, ended by 50%% %7.0f ns, 90%% %7.0f, 99%% %7.0f; ", label(s).c_str(),
                copy ? "copy" : "step", blocks, at[0][at[0].size() / 2], at[1][at[1].size() / 2],
                at[2][at[2].size() / 2]);
  }
  for (int i = 0; i < n; ++i) {
    span.push_back(last[i] - first[i]);
    if (i + 1 < n) gap.push_back(first[i + 1] - last[i]);
  }
  std::sort(span.begin(), span.end());
  std::sort(gap.begin(), gap.end());
  std::printf("%-16s %-5s %7.2f us/call: span (first block start to last block end) median %5.0f ns, min %5.0f; "
              "gap to the next call median %5.0f ns, min %5.0f (%d calls)\n",
              label(s).c_str(), copy ? "copy" : "step", us, span[span.size() / 2], span.front(), gap[gap.size() / 2],
              gap.front(), n);
}

// `trace pdl`: the upstream stand-in followed by the fused middle or the
// step alone at B = 1, with and without a programmatic launch, calls back to
// back in a graph. Per call: where the kernel's blocks ran (distinct SMs,
// most blocks on one SM), when its first block started and its last ended
// relative to the upstream's last block end, and its blocks' durations
// (entry to end; all of them, those alone on their SM, those sharing it);
// the upstream's own span (first block start to last block end), how long
// after our last block's end the next call's upstream starts, and a call's
// period inside the graph (upstream start to the next one's: the us/call
// printed is the graph's replay time over its calls, the graph's launch and
// drain included).
// up_carveout: the upstream's preferred shared-memory carveout (-1: the
// driver's default; 100: all shared).
void trace_pdl(const Shape& s, bool pdl, int up_carveout, bool middle) {
  FusedBed fb(s);
  int sms = 0;
  GDN_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GDN_BENCH_CHECK(cudaFuncSetAttribute(projection_standin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       up_carveout));
  const int n = fb.bed.calls();
  const size_t max_blocks = 1024, per_call = max_blocks * kTraceWords;
  const int up_blocks = 2 * sms;
  unsigned long long *buf = nullptr, *ubuf = nullptr;
  GDN_BENCH_CHECK(cudaMalloc(&buf, n * per_call * 8));
  GDN_BENCH_CHECK(cudaMalloc(&ubuf, size_t(n) * up_blocks * 2 * 8));
  int c = 0;
  cudaGraphExec_t g = fb.bed.capture(n, [&](const Set& cur, const Set&) {
    fb.upstream(cur, up_blocks, ubuf + size_t(c) * up_blocks * 2);
    gdn::DecodeParams p = fb.fused(cur, middle, middle);
    p.programmatic_launch = pdl;
    p.invalid_index_count = reinterpret_cast<uint32_t*>(buf + size_t(c) * per_call);
    ++c;
    check_traced(p);
  });
  double us = 0;
  const std::vector<unsigned long long> h = replay_traced(fb, g, n, buf, n * per_call, &us);
  std::vector<unsigned long long> u(size_t(n) * up_blocks * 2);  // every block writes its start and end
  GDN_BENCH_CHECK(cudaMemcpy(u.data(), ubuf, u.size() * 8, cudaMemcpyDeviceToHost));
  cudaFree(buf);
  cudaFree(ubuf);
  std::vector<double> sm_used, sm_max, first, last, dur, up_span, dur_alone, dur_shared, up_run, next_up, period;
  // the upstream of call i: first block start, first and last block end
  auto up_times = [&](int i, unsigned long long& start, unsigned long long& first_end, unsigned long long& end) {
    start = ~0ull, first_end = ~0ull, end = 0;
    for (int b = 0; b < up_blocks; ++b) {
      start = std::min(start, u[(size_t(i) * up_blocks + b) * 2]);
      first_end = std::min(first_end, u[(size_t(i) * up_blocks + b) * 2 + 1]);
      end = std::max(end, u[(size_t(i) * up_blocks + b) * 2 + 1]);
    }
  };
  // a call's mean period in the graph: first upstream start to last upstream start
  double mean_period = 0;
  if (n > 1) {
    unsigned long long s0, s1, fe, e;
    up_times(0, s0, fe, e);
    up_times(n - 1, s1, fe, e);
    mean_period = double(s1 - s0) / (n - 1);
  }
  for (int i = 0; i < n; ++i) {
    unsigned long long up_start, up_first_end, up_end;
    up_times(i, up_start, up_first_end, up_end);
    std::vector<int> per_sm(1024, 0);
    double f = 1e30, l = -1e30;
    std::vector<double> d;
    for (size_t blk = 0; blk < max_blocks; ++blk) {
      const unsigned long long* t = &h[i * per_call + blk * kTraceWords];
      if (t[14] == 0) continue;
      if (t[22] > 0 && t[22] <= 1024) ++per_sm[t[22] - 1];
      f = std::min(f, double(t[14]) - double(up_end));
      l = std::max(l, double(t[15]) - double(up_end));
      d.push_back(double(t[15]) - double(t[14]));
    }
    if (d.empty()) continue;
    // the blocks alone on their SM against those that shared it
    for (size_t blk = 0; blk < max_blocks; ++blk) {
      const unsigned long long* t = &h[i * per_call + blk * kTraceWords];
      if (t[14] == 0 || t[22] == 0 || t[22] > 1024) continue;
      (per_sm[t[22] - 1] == 1 ? dur_alone : dur_shared).push_back(double(t[15]) - double(t[14]));
    }
    std::sort(d.begin(), d.end());
    dur.push_back(d[d.size() / 2]);
    int used = 0, mx = 0;
    for (int v : per_sm) used += v > 0, mx = std::max(mx, v);
    sm_used.push_back(used);
    sm_max.push_back(mx);
    first.push_back(f);
    last.push_back(l);
    up_span.push_back(double(up_end - up_first_end));
    up_run.push_back(double(up_end - up_start));
    if (i + 1 < n) {  // the next call's upstream: its first block's start after our last block's end
      unsigned long long s2, fe2, e2;
      up_times(i + 1, s2, fe2, e2);
      next_up.push_back(double(s2) - double(up_end) - l);
      period.push_back(double(s2) - double(up_start));
    }
  }
  auto med = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%-16s %-6s pdl %d up-carveout %4d: %6.2f us/call (upstream + it); its blocks on %3.0f SMs, "
              "at most %2.0f on one; first start %6.0f ns, last end %6.0f ns after the upstream's last block end "
              "(upstream blocks end over %5.0f ns); block duration median %5.0f ns (alone on its SM %5.0f, %zu blocks; "
              "sharing it %5.0f, %zu); upstream first start to last end %5.0f ns; next upstream starts %5.0f ns "
              "after our last block end; a call in the graph %5.0f ns (median of upstream start to the next's, "
              "%zu calls; mean %5.0f)\n",
              label(s).c_str(), middle ? "middle" : "step", int(pdl), up_carveout, us, med(sm_used), med(sm_max), med(first), med(last),
              med(up_span), med(dur), med(dur_alone), dur_alone.size(), med(dur_shared), dur_shared.size(), med(up_run),
              med(next_up), med(period), period.size(), mean_period);
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if defined(GDN_TRACE)
  if (argc > 1 && std::string(argv[1]) == "trace") {
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    const double ghz = khz > 0 ? khz * 1e-6 : 1.98;
    if (argc > 2 && std::string(argv[2]) == "tail") {
      // Mid and large B: how the calls end (trace_calls' tail).
      for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
        for (int64_t B : {32, 128}) {
          trace_calls(Shape{B, 16, 32, 128, t, gdn::Layout::kVK, false}, true, true, 32768);
          trace_calls(Shape{B, 16, 32, 128, t, gdn::Layout::kVK, false}, false, true, 32768);
          trace_calls(Shape{B, 16, 32, 128, t, gdn::Layout::kKV, false}, false, true, 32768);
        }
      return 0;
    }
    if (argc > 2 && std::string(argv[2]) == "pdl") {
      for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
        for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV})
          for (int cv : {-1, 100})
            for (bool middle : {true, false})
              for (bool pdl : {false, true}) trace_pdl(Shape{1, 16, 32, 128, t, l, false}, pdl, cv, middle);
      return 0;
    }
    if (argc > 2 && std::string(argv[2]) == "mid") {
      // B = 8 and 64: the step alone against the fused middle, phase by phase.
      std::printf("trace (ns since the block's entry, median/max over blocks; SM clock %.2f GHz)\n", ghz);
      for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
        for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV})
          for (int64_t B : {8, 64}) {
            const Shape s{B, 16, 32, 128, t, l, false};
            trace_one(s, false, false, ghz);
            trace_one(s, true, true, ghz);
          }
      return 0;
    }
    param_probe_run(ghz);
    std::printf("trace (ns since the block's entry, median/max over blocks; SM clock %.2f GHz)\n", ghz);
    for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
      for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV})
        for (int64_t B : {1}) {
          const Shape s{B, 16, 32, 128, t, l, false};
          for (int m = 0; m < 4; ++m) trace_one(s, m & 1, m & 2, ghz);
        }
    // The same calls on one set (everything, the kernel's code too, stays in
    // L2): what the cold protocol costs each phase.
    for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16}) {
      const Shape s{1, 16, 32, 128, t, gdn::Layout::kVK, false};
      trace_one(s, false, false, ghz, true);
      trace_one(s, true, true, ghz, true);
    }
    for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
      for (int64_t B : {1, 8}) {
        trace_calls(Shape{B, 16, 32, 128, t, gdn::Layout::kVK, false}, true);
        trace_calls(Shape{B, 16, 32, 128, t, gdn::Layout::kVK, false}, false);
        trace_calls(Shape{B, 16, 32, 128, t, gdn::Layout::kKV, false}, false);
      }
    return 0;
  }
#endif
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    std::printf("bench_fused: no CUDA device\n");
    return 0;
  }
  // (diagnostic: GDN_BENCH_PAD_MIB=m allocates m MiB before any bed, so that
  // every buffer lands elsewhere in device memory)
  void* pad = nullptr;  // (held to the process's end)
  if (const char* m = std::getenv("GDN_BENCH_PAD_MIB")) GDN_BENCH_CHECK(cudaMalloc(&pad, size_t(std::atoi(m)) << 20));
  if (argc > 1 && std::string(argv[1]) == "graphlen") {  // B = 1 and 8, or with "b1" B = 1 only
    const bool b1 = argc > 2 && std::string(argv[2]) == "b1";
    for (int64_t B : {1, 8})
      for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
        for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV})
          if (B == 1 || !b1) graph_length(Shape{B, 16, 32, 128, t, l, false});
    return 0;
  }
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV})
      for (int64_t B : {1, 8, 64}) {
        const Shape s{B, 16, 32, 128, t, l, false};
        benchmark::RegisterBenchmark(("middle/" + label(s)).c_str(), BM_Middle, s)->UseManualTime()->Iterations(1);
      }
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV}) {
      const Shape s{1, 16, 32, 128, t, l, false};
      for (bool middle : {true, false})
        for (int carveout : {100, -1})
          benchmark::RegisterBenchmark(("pdl/" + label(s) + (middle ? "/middle" : "/step") +
                                        (carveout < 0 ? "/upstream-default-carveout" : "/upstream-all-shared"))
                                           .c_str(),
                                       BM_Pdl, s, middle, carveout)
              ->UseManualTime()
              ->Iterations(1);
    }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  std::printf("\nfused middle (conv W=4 + step + gated RMSNorm), Qwen3.5-35B-A3B shape, bf16 inputs, µs per layer call\n");
  std::printf("%-16s %9s %9s %9s %9s %9s %11s %11s\n", "shape", "step", "fused", "conv+step", "step+norm",
              "separate", "fused/step", "sep/fused");
  for (const Row& r : g_rows)
    std::printf("%-16s %9.2f %9.2f %9.2f %9.2f %9.2f %11.3f %11.3f\n", r.name.c_str(), r.step, r.fused, r.conv_only,
                r.norm_only, r.separate, r.fused / r.step, r.separate / r.fused);
  std::printf("\nPDL: upstream stand-in (in_proj weight bytes at B = 1) then the fused middle or the step, µs per "
              "layer call; the upstream's shared-memory carveout all shared (as a GEMM's) or the driver's default. "
              "Per call of a graph of n calls (the protocol), and in a long graph (steady: the slope between graphs "
              "of n and 2 n calls)\n");
  std::printf("%-16s %-7s %-11s %9s %9s %9s %9s %13s %10s %12s\n", "shape", "kernel", "carveout", "upstream", "no PDL",
              "PDL", "gain", "no PDL steady", "PDL steady", "steady gain");
  for (const PdlRow& r : g_pdl)
    std::printf("%-16s %-7s %-11s %9.2f %9.2f %9.2f %9.2f %13.2f %10.2f %12.2f\n", r.name.c_str(), r.what.c_str(),
                r.upstream_carveout.c_str(), r.upstream, r.without, r.with, r.without - r.with, r.without_steady,
                r.with_steady, r.without_steady - r.with_steady);
  return 0;
}
