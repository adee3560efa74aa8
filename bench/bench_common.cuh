// What the GPU benchmarks share: the protocol's test bed (rotating sets past
// 2x the L2, graph capture and replay, median of replays) and the copy floor.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gdnkit/gdnkit.hpp"
#include "gdnkit/half.hpp"

namespace gdn_bench {

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

// The copy floor's streaming copy in 16-byte vectors, kUnroll loads in
// flight per thread (the floor's: 4), grid-stride. No __restrict__: the
// in-place floor passes src == dst (each thread loads its vectors before it
// stores them).
template <int kUnroll>
__global__ void copy_kernel(const uint4* src, uint4* dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = x[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// The in-place floor's second kernel: each block reads one contiguous run of
// kVecs * blockDim.x vectors (64 KiB at 16 a thread), every load issued before
// its first store, then writes the run back; one block a run, no grid-stride
// (the pattern of a Triton program over one block of the state). Its runs
// and the grid-stride kernel's order differ, and which is faster in place is
// a property of the GPU, so the floor takes the faster. src and dst are the
// same address but two parameters, as in copy_kernel: through one pointer the
// compiler may drop the store of a value just loaded from it.
template <int kVecs>
__global__ void in_place_runs_kernel(const uint4* src, uint4* dst, int64_t n) {
  const int64_t base = int64_t(blockIdx.x) * kVecs * blockDim.x + threadIdx.x;
  uint4 x[kVecs];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const int64_t i = base + int64_t(u) * blockDim.x;
    if (i < n) x[u] = src[i];
  }
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const int64_t i = base + int64_t(u) * blockDim.x;
    if (i < n) dst[i] = x[u];
  }
}
constexpr int kRunVecs = 16;

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
  // (indexed) one index array for every call, as an engine passes the same
  // state_indices to every layer of a step (so it stays in L2), instead of
  // one per rotating set (every call's index cold)
  bool shared_index{false};
};

// One set of everything a call touches.
struct Set {
  void* qkv{nullptr};
  void* a{nullptr};
  void* b{nullptr};
  void* state{nullptr};
  void* o{nullptr};
  int32_t* idx{nullptr};
  void* copy_dst{nullptr};  // the copy floor's destination: cold, like the state
};

// The copy floor of a bed (µs a call). `us` is the floor the ratios use: the
// fastest copy whose every byte is cold, as the state is in a call (rotating
// destination, or in place). `warm_dst_us` is the copy into one destination
// reused by every call, the floor used until 2026-11-30: that
// destination stays in L2 across calls (the whole of it up to B = 8 fp32),
// so its writes mostly never reach DRAM in the timed window, which a state
// written in place cannot avoid.
// `in_place_us` alone is the in-place floor: every state element read and
// written back in place, the faster of the copy kernel onto itself (16-byte
// accesses, the grid sized to the GPU, grid-stride) and in_place_runs_kernel
// (a block a contiguous run), the traffic of a step that updates the state in
// place.
struct CopyFloor {
  double us, warm_dst_us, in_place_us;
};

// Median time per call over `replays` replays (after one warm-up) of a graph
// of `calls` calls on `stream`, in µs.
inline double graph_us(cudaStream_t stream, cudaGraphExec_t exec, int calls, int replays = kReplays) {
  cudaEvent_t t0, t1;
  GDN_BENCH_CHECK(cudaEventCreate(&t0));
  GDN_BENCH_CHECK(cudaEventCreate(&t1));
  GDN_BENCH_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  GDN_BENCH_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int r = 0; r < replays; ++r) {
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
    // The sets total kRotateBytes counting only what a call touches: its B
    // rows' slots, not the whole (indexed: twice as large) pool.
    const size_t touched = state_bytes + size_t(s.B) * (conv_dim + 3 * s.hv + s.hv * s.d) * 2;
    const size_t n = std::max<size_t>(2, (kRotateBytes + touched - 1) / touched);
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
      GDN_BENCH_CHECK(cudaMalloc(&st.copy_dst, state_bytes));
      if (s.indexed && (!s.shared_index || sets.empty())) {
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
      cudaFree(st.copy_dst);
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
      p.state_indices = s.shared_index ? sets[0].idx : st.idx;
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
  double time_graph(cudaGraphExec_t exec, int calls) { return graph_us(stream, exec, calls); }

  int calls() const { return int(std::max<size_t>(sets.size(), 20)); }

  // The floor: the fastest of cudaMemcpyAsync and a streaming copy kernel
  // into each set's own destination, and the kernel copying the state onto
  // itself (the in-place step's traffic exactly), moving the same state
  // bytes, timed the same way; and, for comparison with earlier results, the
  // faster of the two copies into one shared destination.
  // The floor's copy kernel grid: 256-thread blocks, one vector a thread up
  // to 8 blocks an SM, then grid-stride.
  unsigned copy_blocks() const {
    int sms = 0;
    GDN_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int64_t vecs = int64_t(state_bytes / 16);
    return unsigned(std::min<int64_t>((vecs + 255) / 256, int64_t(sms) * 8));
  }
  CopyFloor copy_floor() {
    const int n = calls();
    const int64_t vecs = int64_t(state_bytes / 16);
    const unsigned blocks = copy_blocks();
    // dst(cur): where the set's copy goes
    auto time_copies = [&](auto&& dst) {
      cudaGraphExec_t g = capture(n, [&](const Set& cur, const Set&) {
        GDN_BENCH_CHECK(cudaMemcpyAsync(dst(cur), cur.state, state_bytes, cudaMemcpyDeviceToDevice, stream));
      });
      const double t_memcpy = time_graph(g, n);
      cudaGraphExecDestroy(g);
      g = capture(n, [&](const Set& cur, const Set&) {
        copy_kernel<4><<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(cur.state),
                                                   static_cast<uint4*>(dst(cur)), vecs);
      });
      const double t_kernel = time_graph(g, n);
      cudaGraphExecDestroy(g);
      return std::min(t_memcpy, t_kernel);
    };
    const double rotating = time_copies([](const Set& cur) { return cur.copy_dst; });
    const double warm = time_copies([&](const Set&) { return scratch; });
    cudaGraphExec_t g = capture(n, [&](const Set& cur, const Set&) {
      copy_kernel<4><<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(cur.state),
                                                 static_cast<uint4*>(cur.state), vecs);
    });
    const double in_place_stride = time_graph(g, n);
    cudaGraphExecDestroy(g);
    const unsigned runs = unsigned((vecs + kRunVecs * 256 - 1) / (kRunVecs * 256));
    g = capture(n, [&](const Set& cur, const Set&) {
      in_place_runs_kernel<kRunVecs><<<runs, 256, 0, stream>>>(static_cast<const uint4*>(cur.state),
                                                               static_cast<uint4*>(cur.state), vecs);
    });
    const double in_place = std::min(in_place_stride, time_graph(g, n));
    cudaGraphExecDestroy(g);
    return CopyFloor{std::min(rotating, in_place), warm, in_place};
  }
  double copy_floor_us() { return copy_floor().us; }
};


}  // namespace gdn_bench
