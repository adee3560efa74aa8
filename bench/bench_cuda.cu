// GPU benchmark of the fused decode step, by the protocol of docs/benchmarks.md:
//
// - every timed call runs inside a replayed CUDA graph;
// - calls rotate over enough distinct state/input sets that they total at
//   least 2x the L2 (>= 128 MiB here), so every call starts cold, as in a real
//   decode where 30+ layers and the weights pass in between;
// - the copy floor (cudaMemcpyAsync of the same state bytes, device to device)
//   is timed the same way in the same run, and the ratio kernel / copy reported;
// - median of >= 10 graph replays.
//
// Also the unfused baseline (the pre-fusion sequence of simple kernels, see
// unfused_baseline.cuh) at the same shapes, so the fusion gain is measured.
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gdnkit/gdnkit.hpp"
#include "gdnkit/half.hpp"
#include "unfused_baseline.cuh"

namespace {

// Fill a state pool with pseudo-random values in about [-1, 1] (a hash of the
// index): realistic non-zero data without generating gigabytes on the host.
template <typename T>
__global__ void fill_pool(T* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    x[i] = T(float(h) * (2.0f / 4294967296.0f) - 1.0f);
  }
}

#define GDN_BENCH_CHECK(call)                                                                  \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr size_t kRotateBytes = size_t(128) << 20;  // >= 2x the 50-60 MB L2 of an H100/H200
constexpr int kReplays = 15;                        // median over these

struct Shape {
  int64_t B;
  int hk, hv, d;
  gdn::DType state;
  gdn::Layout layout;
  bool indexed;  // through a pool with state_indices and padding rows
};

// One set of everything a call touches.
struct Set {
  void* qkv{nullptr};
  void* a{nullptr};
  void* b{nullptr};
  void* state{nullptr};
  void* o{nullptr};
  int32_t* idx{nullptr};
};

struct Bed {
  Shape s;
  int64_t conv_dim{0};
  size_t state_bytes{0};  // bytes of the state the call reads (and writes)
  size_t pool_bytes{0};
  float* A_log{nullptr};
  float* dt_bias{nullptr};
  std::vector<Set> sets;
  void* scratch{nullptr};  // copy-floor destination
  cudaStream_t stream{};

  explicit Bed(const Shape& shape) : s(shape) {
    conv_dim = 2 * int64_t(s.hk) * s.d + int64_t(s.hv) * s.d;
    state_bytes = size_t(s.B) * s.hv * s.d * s.d * gdn::dtype_size(s.state);
    // Indexed pools: 2x the slots, rows scattered over them, one row in 16 padding.
    const int64_t slots = s.indexed ? 2 * s.B : s.B;
    pool_bytes = size_t(slots) * s.hv * s.d * s.d * gdn::dtype_size(s.state);
    const size_t per_set = pool_bytes + size_t(s.B) * (conv_dim + 3 * s.hv + s.hv * s.d) * 2;
    const size_t n = std::max<size_t>(2, (kRotateBytes + per_set - 1) / per_set);
    GDN_BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::mt19937_64 rng(42);
    std::normal_distribution<float> n01(0.f, 1.f);
    std::vector<float> A(s.hv), dt(s.hv);
    for (int h = 0; h < s.hv; ++h) {
      A[h] = std::log(1.0f + 15.0f * float(h) / float(s.hv));
      dt[h] = std::log(std::expm1(0.001f + 0.099f * float(h) / float(s.hv)));
    }
    GDN_BENCH_CHECK(cudaMalloc(&A_log, s.hv * 4));
    GDN_BENCH_CHECK(cudaMalloc(&dt_bias, s.hv * 4));
    GDN_BENCH_CHECK(cudaMemcpy(A_log, A.data(), s.hv * 4, cudaMemcpyHostToDevice));
    GDN_BENCH_CHECK(cudaMemcpy(dt_bias, dt.data(), s.hv * 4, cudaMemcpyHostToDevice));
    auto upload_bf16 = [&](void** dst, int64_t count, float sd) {
      std::vector<uint16_t> h(count);
      for (auto& x : h) x = gdn::float_to_bf16(sd * n01(rng));
      GDN_BENCH_CHECK(cudaMalloc(dst, count * 2));
      GDN_BENCH_CHECK(cudaMemcpy(*dst, h.data(), count * 2, cudaMemcpyHostToDevice));
    };
    const int64_t pool_elems = int64_t(pool_bytes / gdn::dtype_size(s.state));
    std::vector<int32_t> idx(s.B);
    for (int64_t b = 0; b < s.B; ++b) idx[b] = (b % 16 == 15) ? -1 : int32_t((b * 7919) % slots);
    for (size_t i = 0; i < n; ++i) {
      Set st;
      upload_bf16(&st.qkv, s.B * conv_dim, 1.f);
      upload_bf16(&st.a, s.B * s.hv, 1.f);
      upload_bf16(&st.b, s.B * s.hv, 1.f);
      GDN_BENCH_CHECK(cudaMalloc(&st.o, s.B * s.hv * s.d * 2));
      GDN_BENCH_CHECK(cudaMalloc(&st.state, pool_bytes));
      if (s.state == gdn::DType::kF32)
        fill_pool<<<1024, 256>>>(static_cast<float*>(st.state), pool_elems, uint32_t(i));
      else if (s.state == gdn::DType::kBF16)
        fill_pool<<<1024, 256>>>(static_cast<__nv_bfloat16*>(st.state), pool_elems, uint32_t(i));
      else
        fill_pool<<<1024, 256>>>(static_cast<__half*>(st.state), pool_elems, uint32_t(i));
      GDN_BENCH_CHECK(cudaGetLastError());
      if (s.indexed) {
        GDN_BENCH_CHECK(cudaMalloc(&st.idx, s.B * 4));
        GDN_BENCH_CHECK(cudaMemcpy(st.idx, idx.data(), s.B * 4, cudaMemcpyHostToDevice));
      }
      sets.push_back(st);
    }
    GDN_BENCH_CHECK(cudaMalloc(&scratch, state_bytes));
  }

  ~Bed() {
    for (Set& st : sets) {
      cudaFree(st.qkv);
      cudaFree(st.a);
      cudaFree(st.b);
      cudaFree(st.o);
      cudaFree(st.state);
      cudaFree(st.idx);
    }
    cudaFree(A_log);
    cudaFree(dt_bias);
    cudaFree(scratch);
    cudaStreamDestroy(stream);
  }

  gdn::DecodeParams params(const Set& st) const {
    gdn::DecodeParams p;
    p.batch = s.B;
    p.num_k_heads = s.hk;
    p.num_v_heads = s.hv;
    p.head_dim_k = p.head_dim_v = s.d;
    p.qkv_dtype = p.ab_dtype = p.o_dtype = gdn::DType::kBF16;
    p.state_dtype = s.state;
    p.layout = s.layout;
    p.num_slots = s.indexed ? 2 * s.B : s.B;
    gdn::set_dense_strides(p);
    gdn::set_packed_qkv(p, st.qkv, conv_dim);
    p.a = st.a;
    p.b = st.b;
    p.A_log = A_log;
    p.dt_bias = dt_bias;
    p.state = st.state;
    p.o = st.o;
    if (s.indexed) {
      p.index_dtype = gdn::IndexType::kI32;
      p.state_indices = st.idx;
    }
    p.stream = stream;
    return p;
  }

  // Capture `calls` enqueues (one per set, rotating) into a graph.
  template <typename Enqueue>
  cudaGraphExec_t capture(int calls, Enqueue&& enqueue) {
    cudaGraph_t graph;
    GDN_BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < calls; ++c) enqueue(sets[c % sets.size()], sets[(c + 1) % sets.size()]);
    GDN_BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    GDN_BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    GDN_BENCH_CHECK(cudaGraphDestroy(graph));
    return exec;
  }

  // Median time per call over kReplays replays of a graph of `calls` calls, in µs.
  double time_graph(cudaGraphExec_t exec, int calls) {
    cudaEvent_t t0, t1;
    GDN_BENCH_CHECK(cudaEventCreate(&t0));
    GDN_BENCH_CHECK(cudaEventCreate(&t1));
    GDN_BENCH_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
    GDN_BENCH_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> us;
    for (int r = 0; r < kReplays; ++r) {
      GDN_BENCH_CHECK(cudaEventRecord(t0, stream));
      GDN_BENCH_CHECK(cudaGraphLaunch(exec, stream));
      GDN_BENCH_CHECK(cudaEventRecord(t1, stream));
      GDN_BENCH_CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      GDN_BENCH_CHECK(cudaEventElapsedTime(&ms, t0, t1));
      us.push_back(1e3 * double(ms) / calls);
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

  int calls() const { return int(std::max<size_t>(sets.size(), 20)); }

  double copy_floor_us() {
    const int n = calls();
    cudaGraphExec_t g = capture(n, [&](const Set& cur, const Set&) {
      GDN_BENCH_CHECK(cudaMemcpyAsync(scratch, cur.state, state_bytes, cudaMemcpyDeviceToDevice, stream));
    });
    const double t = time_graph(g, n);
    cudaGraphExecDestroy(g);
    return t;
  }
};

std::string label(const Shape& s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "B=%lld Hk=%d Hv=%d D=%d %s %s%s", (long long)s.B, s.hk, s.hv, s.d,
                gdn::to_string(s.state), gdn::to_string(s.layout), s.indexed ? " indexed" : "");
  return buf;
}

struct Row {
  std::string what;
  double us, copy_us;
  double gbps;
};
std::vector<Row> g_rows;

void report(benchmark::State& st, Bed& bed, const std::string& what, double us, double copy_us) {
  const double gbps = 2.0 * double(bed.state_bytes) / (us * 1e-6) / 1e9;
  st.counters["copy_us"] = copy_us;
  st.counters["ratio"] = us / copy_us;
  st.counters["GB/s"] = gbps;
  g_rows.push_back({what + "  " + label(bed.s), us, copy_us, gbps});
}

void BM_Fused(benchmark::State& st, Shape shape) {
  Bed bed(shape);
  const double copy_us = bed.copy_floor_us();
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    const gdn::Status s = gdn::decode(bed.params(cur), gdn::Backend::kCuda);
    if (!s.ok()) {
      std::fprintf(stderr, "decode: %s\n", s.message);
      std::exit(1);
    }
  });
  double us = 0;
  for (auto _ : st) {
    us = bed.time_graph(g, n);
    st.SetIterationTime(us * 1e-6);
  }
  cudaGraphExecDestroy(g);
  report(st, bed, "fused", us, copy_us);
}

void BM_Unfused(benchmark::State& st, Shape shape) {
  Bed bed(shape);
  const double copy_us = bed.copy_floor_us();
  gdn_bench::UnfusedScratch scratch(bed.params(bed.sets[0]));
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    gdn_bench::unfused_decode(bed.params(cur), scratch, bed.stream);
  });
  double us = 0;
  for (auto _ : st) {
    us = bed.time_graph(g, n);
    st.SetIterationTime(us * 1e-6);
  }
  cudaGraphExecDestroy(g);
  report(st, bed, "unfused", us, copy_us);
}

void register_all() {
  const gdn::DType states[] = {gdn::DType::kF32, gdn::DType::kBF16};
  const gdn::Layout layouts[] = {gdn::Layout::kKV, gdn::Layout::kVK};
  // The SPEC sweep at the Qwen3.5-35B-A3B shape.
  for (gdn::DType t : states)
    for (gdn::Layout l : layouts)
      for (int64_t B : {1, 8, 32, 128, 512}) {
        const Shape s{B, 16, 32, 128, t, l, false};
        benchmark::RegisterBenchmark(("fused/" + label(s)).c_str(), BM_Fused, s)
            ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      }
  // Spot checks: other head counts, tensor parallel, pools with indices and padding.
  for (gdn::DType t : states)
    for (int64_t B : {1, 32, 512}) {
      for (int hv : {48, 64}) {
        const Shape s{B, 16, hv, 128, t, gdn::Layout::kVK, false};
        benchmark::RegisterBenchmark(("fused/" + label(s)).c_str(), BM_Fused, s)
            ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      }
      const Shape tp{B, 4, 8, 128, t, gdn::Layout::kVK, false};
      benchmark::RegisterBenchmark(("fused/" + label(tp)).c_str(), BM_Fused, tp)
          ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      const Shape ix{B, 16, 32, 128, t, gdn::Layout::kVK, true};
      benchmark::RegisterBenchmark(("fused/" + label(ix)).c_str(), BM_Fused, ix)
          ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
    }
  // The unfused baseline at the main shape.
  for (gdn::DType t : states)
    for (int64_t B : {1, 32, 512}) {
      const Shape s{B, 16, 32, 128, t, gdn::Layout::kKV, false};
      benchmark::RegisterBenchmark(("unfused/" + label(s)).c_str(), BM_Unfused, s)
          ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("bench_cuda: no CUDA device, nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  GDN_BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, sm_%d%d, %d SMs, L2 %d MiB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\n%-62s %10s %10s %7s %9s\n", "case", "us", "copy us", "ratio", "GB/s");
  for (const Row& r : g_rows)
    std::printf("%-62s %10.2f %10.2f %7.3f %9.0f\n", r.what.c_str(), r.us, r.copy_us, r.us / r.copy_us,
                r.gbps);
  return 0;
}
