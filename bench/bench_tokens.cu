// GPU benchmark of multi-token decode (speculative decoding: T tokens a row in
// one call, the state read once and kept on chip), by the protocol of
// docs/benchmarks.md: every timed call inside a replayed CUDA graph, calls
// rotating over sets of buffers that total more than 2x the L2 (every byte
// cold), the median of kReplays replays after a warm-up one.
//
// Shape: Qwen3.5-35B-A3B (Hk 16, Hv 32, Dk = Dv = 128), raw gates, q/k/v/a/b
// and the output in bf16 (packed q|k|v rows), l2norm on (the default); the
// state in fp32 or bf16, both layouts, no index array (row b is slot b).
// Sweep: T = 2, 4, 8; B = 1, 8, 32, 128; two state handlings:
//   final  (a): the final state only, written in place;
//   inter  (b): every token's state written to a dense buffer
//               intermediate_states [B, T, Hv, Dk, Dv] (its own per set, cold
//               like the rest), the final state also in place.
//
// For each row, in the same process and on the same buffers:
//   gdnkit  the one multi-token call, gdn::decode(p, gdn::Backend::kCuda);
//   chained what an engine without multi-token support does: T one-token
//           gdnkit calls chained in place on the row's state (token t's
//           q/k/v/a/b/o are strided views of the same (B, T, ...) buffers),
//           and in (b) each followed by the copy of the state into slot t of
//           the intermediate buffer (cudaMemcpy2DAsync D2D: row b's slot t is
//           T slots apart from row b+1's; a plain cudaMemcpyAsync at B = 1);
//   floor   our own streaming kernel over the same state (16-byte loads and
//           stores, 4 loads in flight a thread, grid-stride; 256-thread
//           blocks, one full wave of them: SMs x the blocks an SM holds, or
//           fewer when the state has fewer vectors than threads): (a) reads
//           every state byte once and writes it once in place; (b) reads it
//           once and writes it T + 1 times (the T intermediate slots and the
//           final state in place). What one multi-token call must move at
//           least;
//   copy    bench_common's copy floor of the same state bytes (Bed::copy_floor:
//           the fastest cold copy, as bench_cuda reports it), for reference;
//           measured once per (B, state dtype) in this process.
//
// The target (what "one call saves the traffic of T - 1 calls" means here).
// Let S be the state's bytes, a pass one read or one write of S. The chained
// steps move 2T passes (each call reads and writes the state), the one call
// 2 (a read and the final write): it saves (T - 1)/T of the chained steps'
// state passes, the "exp" column. In (b) both also write the T
// intermediates (not counted there), and the chained copies read S T more
// times (from L2 where it fits), which the one call saves as well. In time,
// the saving is measured rather than modelled:
//   chain_floor_us: T floor passes back to back on one set, (a) each the
//       in-place floor kernel, (b) each the in-place floor kernel followed by
//       the same cudaMemcpy2DAsync into slot t as the chained calls: the
//       chained alternative's state traffic alone, with whatever L2 reuse the
//       chained calls get (at small B the state stays in L2 between them, so
//       the chained traffic costs less than T cold passes);
//   saved_us = chain_floor_us - floor_us: the state-traffic time one call
//       avoids; "meas" = saved_us / chain_floor_us, which is (T - 1)/T in (a)
//       when every pass is cold and less when the chained passes hit L2 (in
//       (b), with cold passes: (3T - 2)/(4T), or (2T - 2)/(3T) when the
//       copies read from L2);
//   target_us = chained_us - saved_us, i.e. chained_us * (1 - s) with
//       s = saved_us / chained_us; in (a) with cold passes, s = (T - 1)/T
//       times the share of the chained time that is state traffic;
//   met: gdnkit_us <= target_us. The one call must cut at least the state
//       traffic it avoids from the chained time, and spend no more than the T
//       calls on everything else (launches, the T tokens' arithmetic,
//       latency): with gdnkit_us = floor_us + X and chained_us =
//       chain_floor_us + X, the same non-traffic time X, it meets the target
//       exactly.
//
// The run: 96 rows, under a minute on an H100 (the floors, copy floors and
// set-up of all rows took 17 s there; most of the time is the replays of
// the large inter rows); --benchmark_filter=REGEX picks rows (names as in
// the table, e.g. 'tokens/T=8 B=128 fp32 vk inter').
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../backends/cuda/device.h"
#include "bench_common.cuh"
#include "gdnkit/gdnkit.hpp"

namespace {

using namespace gdn_bench;

constexpr int kHk = 16, kHv = 32, kD = 128;  // Qwen3.5-35B-A3B

enum class Mode { kFinal, kInter };

struct TShape {
  int64_t B;
  int T;
  gdn::DType state;
  gdn::Layout layout;
  Mode mode;
};

std::string label(const TShape& s) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "T=%d B=%lld %s %s %s", s.T, (long long)s.B, gdn::to_string(s.state),
                gdn::to_string(s.layout), s.mode == Mode::kFinal ? "final" : "inter");
  return buf;
}

// The floor: every 16-byte vector of the state (n of them, rows of slot_vecs)
// read once from src and written once to dst (the same pointer: in place);
// kInter: also written to each of the T token slots of its row in inter
// [B, T, slot_vecs]. kUnroll loads in flight per thread, grid-stride. src and
// dst are separate parameters without __restrict__, as in bench_common's
// copy_kernel: through one pointer the compiler may drop a store of the value
// just loaded from the same address, and the in-place floor with it (it did:
// the fp32 B = 128 "floor" ran at 70 TB/s). kInter is a template parameter
// so that the in-place kernel keeps 32 registers (8 blocks an SM on sm_80 and
// sm_90, full occupancy, as the copy kernel); the kInter one is held to 64
// (4 blocks an SM) with no spill.
template <int kUnroll, bool kInter>
__global__ void __launch_bounds__(256, kInter ? 4 : 8)
    state_floor_kernel(const uint4* src, uint4* dst, uint4* inter, int64_t n, uint32_t slot_vecs, int T) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  auto put = [=](int64_t j, const uint4& x) {
    dst[j] = x;
    if constexpr (kInter) {
      const int64_t row = int64_t(uint64_t(j) / slot_vecs);
      uint4* to = inter + row * T * int64_t(slot_vecs) + (j - row * int64_t(slot_vecs));
      for (int t = 0; t < T; ++t) to[int64_t(t) * slot_vecs] = x;
    }
  };
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) put(i + u * stride, x[u]);
  }
  for (; i < n; i += stride) put(i, src[i]);
}

// One set of everything a call touches (every tensor (B, T, ...), token-major
// inside a row).
struct TSet {
  void* qkv{nullptr};    // (B, T, 2*Hk*Dk + Hv*Dv) bf16
  void* a{nullptr};      // (B, T, Hv) bf16
  void* b{nullptr};      // (B, T, Hv) bf16
  void* o{nullptr};      // (B, T, Hv, Dv) bf16
  void* state{nullptr};  // (B, Hv, Dk, Dv) or (B, Hv, Dv, Dk): slot b = row b
  void* inter{nullptr};  // (B, T, one slot), mode (b) only
};

void check(const gdn::Status& st, const TShape& s, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "bench_tokens: gdn::decode failed (%s, %s): %s: %s\n", what, label(s).c_str(),
               gdn::to_string(st.code), st.message);
  std::exit(1);
}

// The call on one set. token < 0: the multi-token call (T tokens,
// intermediates in (b)); else the one-token call on token `token` of every
// row (strided views of the same (B, T, ...) buffers), in place.
gdn::DecodeParams token_params(const TShape& s, const TSet& st, int token, const float* A_log,
                               const float* dt_bias, void* stream) {
  const int64_t conv_dim = 2 * int64_t(kHk) * kD + int64_t(kHv) * kD;
  const bool multi = token < 0;
  const int64_t t = multi ? 0 : token;
  gdn::DecodeParams p;
  p.batch = s.B;
  p.num_k_heads = kHk;
  p.num_v_heads = kHv;
  p.head_dim_k = p.head_dim_v = kD;
  p.qkv_dtype = p.ab_dtype = p.o_dtype = gdn::DType::kBF16;
  p.state_dtype = s.state;
  p.layout = s.layout;
  p.num_slots = s.B;
  p.num_tokens = multi ? s.T : 1;
  if (multi && s.mode == Mode::kInter) p.intermediate_states = st.inter;
  gdn::set_dense_strides(p);  // multi: (B, T, ...) and the intermediate buffer's strides
  // Rows T tokens apart: with one token a call, that is the batch stride.
  gdn::set_packed_qkv(p, static_cast<const char*>(st.qkv) + t * conv_dim * 2, multi ? conv_dim : s.T * conv_dim);
  p.a = static_cast<const char*>(st.a) + t * kHv * 2;
  p.b = static_cast<const char*>(st.b) + t * kHv * 2;
  p.o = static_cast<char*>(st.o) + t * kHv * kD * 2;
  p.a_batch_stride = p.b_batch_stride = int64_t(s.T) * kHv;
  p.o_batch_stride = int64_t(s.T) * kHv * kD;
  p.A_log = A_log;
  p.dt_bias = dt_bias;
  p.state = st.state;
  p.stream = stream;
  return p;
}

struct TokenBed {
  TShape s;
  int64_t conv_dim{0};
  int64_t slot_elems{0};  // Hv*Dk*Dv
  size_t slot_bytes{0}, state_bytes{0}, inter_bytes{0};
  float* A_log{nullptr};
  float* dt_bias{nullptr};
  std::vector<TSet> sets;
  cudaStream_t stream{};
  unsigned floor_blocks{0}, floor_blocks_inter{0};  // the floor kernels' grids

  explicit TokenBed(const TShape& shape) : s(shape) {
    conv_dim = 2 * int64_t(kHk) * kD + int64_t(kHv) * kD;
    slot_elems = int64_t(kHv) * kD * kD;
    slot_bytes = size_t(slot_elems) * gdn::dtype_size(s.state);
    state_bytes = size_t(s.B) * slot_bytes;
    inter_bytes = s.mode == Mode::kInter ? state_bytes * size_t(s.T) : 0;
    const int64_t tokens = s.B * s.T;
    const size_t input_bytes = size_t(tokens) * size_t(conv_dim + 2 * kHv + int64_t(kHv) * kD) * 2;
    const size_t per_set = state_bytes + inter_bytes + input_bytes;
    const size_t n = std::max<size_t>(2, (kRotateBytes + per_set - 1) / per_set);
    GDN_BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<float> A(kHv), dt(kHv);
    for (int h = 0; h < kHv; ++h) {  // as bench_common's Bed
      A[h] = std::log(1.0f + 15.0f * float(h) / float(kHv));
      dt[h] = std::log(std::expm1(0.001f + 0.099f * float(h) / float(kHv)));
    }
    GDN_BENCH_CHECK(cudaMalloc(&A_log, kHv * 4));
    GDN_BENCH_CHECK(cudaMalloc(&dt_bias, kHv * 4));
    GDN_BENCH_CHECK(cudaMemcpy(A_log, A.data(), kHv * 4, cudaMemcpyHostToDevice));
    GDN_BENCH_CHECK(cudaMemcpy(dt_bias, dt.data(), kHv * 4, cudaMemcpyHostToDevice));
    // Inputs uniform in [-1, 1) from a hash, filled on the device (fast for
    // the large rows): q/k are normalized, a and b are gate logits.
    uint32_t seed = 1;
    auto bf16 = [&](void** dst, int64_t count) {
      GDN_BENCH_CHECK(cudaMalloc(dst, size_t(count) * 2));
      fill_pool<<<1024, 256>>>(static_cast<__nv_bfloat16*>(*dst), count, seed++ * 0x9e3779b9u);
      GDN_BENCH_CHECK(cudaGetLastError());
    };
    const int64_t state_elems = s.B * slot_elems;
    for (size_t i = 0; i < n; ++i) {
      TSet st;
      bf16(&st.qkv, tokens * conv_dim);
      bf16(&st.a, tokens * kHv);
      bf16(&st.b, tokens * kHv);
      GDN_BENCH_CHECK(cudaMalloc(&st.o, size_t(tokens) * kHv * kD * 2));
      GDN_BENCH_CHECK(cudaMalloc(&st.state, state_bytes));
      if (s.state == gdn::DType::kF32)
        fill_pool<<<1024, 256>>>(static_cast<float*>(st.state), state_elems, uint32_t(i));
      else
        fill_pool<<<1024, 256>>>(static_cast<__nv_bfloat16*>(st.state), state_elems, uint32_t(i));
      GDN_BENCH_CHECK(cudaGetLastError());
      if (inter_bytes > 0) {
        GDN_BENCH_CHECK(cudaMalloc(&st.inter, inter_bytes));
        GDN_BENCH_CHECK(cudaMemset(st.inter, 0, inter_bytes));
      }
      sets.push_back(st);
    }
    GDN_BENCH_CHECK(cudaDeviceSynchronize());
    // The floor's grid: one full wave of 256-thread blocks (as many as fit
    // on every SM at once), fewer when the state needs fewer (one vector a
    // thread), then grid-stride.
    int sms = 0, per_sm = 0, per_sm_inter = 0;
    GDN_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    GDN_BENCH_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, state_floor_kernel<4, false>, 256, 0));
    GDN_BENCH_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_inter, state_floor_kernel<4, true>, 256, 0));
    const int64_t vecs = int64_t(state_bytes / 16);
    floor_blocks = unsigned(std::min<int64_t>((vecs + 255) / 256, int64_t(sms) * std::max(per_sm, 1)));
    floor_blocks_inter =
        unsigned(std::min<int64_t>((vecs + 255) / 256, int64_t(sms) * std::max(per_sm_inter, 1)));
  }

  ~TokenBed() {
    for (TSet& st : sets) {
      cudaFree(st.qkv);
      cudaFree(st.a);
      cudaFree(st.b);
      cudaFree(st.o);
      cudaFree(st.state);
      cudaFree(st.inter);
    }
    cudaFree(A_log);
    cudaFree(dt_bias);
    cudaStreamDestroy(stream);
  }

  gdn::DecodeParams params(const TSet& st, int token) const {
    return token_params(s, st, token, A_log, dt_bias, stream);
  }

  // (b) the chained alternative's copy of the state after token t into slot t.
  void copy_to_slot(const TSet& st, int t) const {
    char* dst = static_cast<char*>(st.inter) + size_t(t) * slot_bytes;
    if (s.B == 1)
      GDN_BENCH_CHECK(cudaMemcpyAsync(dst, st.state, slot_bytes, cudaMemcpyDeviceToDevice, stream));
    else
      GDN_BENCH_CHECK(cudaMemcpy2DAsync(dst, size_t(s.T) * slot_bytes, st.state, slot_bytes, slot_bytes,
                                        size_t(s.B), cudaMemcpyDeviceToDevice, stream));
  }

  // The floor kernel on one set: in place, and with_inter to all T slots too.
  void floor(const TSet& st, bool with_inter) const {
    const auto* src = static_cast<const uint4*>(st.state);
    auto* dst = static_cast<uint4*>(st.state);
    const int64_t n = int64_t(state_bytes / 16);
    const auto slot_vecs = uint32_t(slot_bytes / 16);
    if (with_inter)
      state_floor_kernel<4, true><<<floor_blocks_inter, 256, 0, stream>>>(src, dst, static_cast<uint4*>(st.inter), n,
                                                                         slot_vecs, s.T);
    else
      state_floor_kernel<4, false><<<floor_blocks, 256, 0, stream>>>(src, dst, nullptr, n, slot_vecs, s.T);
  }

  // Capture `calls` enqueues (one per set, rotating) into a graph.
  template <typename Enqueue>
  cudaGraphExec_t capture(int calls, Enqueue&& enqueue) {
    cudaGraph_t graph;
    GDN_BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < calls; ++c) enqueue(sets[size_t(c) % sets.size()]);
    GDN_BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    GDN_BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    GDN_BENCH_CHECK(cudaGraphDestroy(graph));
    return exec;
  }

  int calls() const { return int(std::max<size_t>(sets.size(), 20)); }

  template <typename Enqueue>
  double time(Enqueue&& enqueue) {
    const int n = calls();
    cudaGraphExec_t g = capture(n, enqueue);
    const double us = graph_us(stream, g, n);
    GDN_BENCH_CHECK(cudaGraphExecDestroy(g));
    return us;
  }
};

// The copy floor of bench_common (µs), once per (B, state dtype) in this
// process: it does not depend on T, the layout or the mode. Its bed is freed
// before the row's own is built.
std::map<std::pair<int64_t, int>, CopyFloor> g_copy;
CopyFloor copy_floor(int64_t B, gdn::DType t) {
  const auto key = std::make_pair(B, int(t));
  auto it = g_copy.find(key);
  if (it != g_copy.end()) return it->second;
  Bed bed(Shape{B, kHk, kHv, kD, t, gdn::Layout::kVK, false});
  const CopyFloor c = bed.copy_floor();
  g_copy[key] = c;
  return c;
}

struct Row {
  std::string what;
  int T;
  double gdnkit, chained, floor, chain_floor, copy;
};
std::vector<Row> g_rows;

// The multi-token call. A/B runs of the token kernel's geometry
// (docs/benchmarks.md): GDN_TOKEN_ROUNDS=n, rounds of units a block takes;
// GDN_TOKEN_RING=s, the state ring's stages (0: none); GDN_TOKEN_CHAIN=0 / 1,
// never / wherever allowed one-token launches chained in place; through the
// planner's one seam, gpu::PlanOverrides, on parameters gdn::decode accepted.
void multi_call(const gdn::DecodeParams& p, const TShape& s) {
  static const char* rounds = std::getenv("GDN_TOKEN_ROUNDS");
  static const char* ring = std::getenv("GDN_TOKEN_RING");
  static const char* chain = std::getenv("GDN_TOKEN_CHAIN");
  if (rounds == nullptr && ring == nullptr && chain == nullptr) {
    check(gdn::decode(p, gdn::Backend::kCuda), s, "the multi-token call");
    return;
  }
  gdn::gpu::PlanOverrides o;
  if (rounds != nullptr) o.max_items_per_warp = std::max(1, std::atoi(rounds));
  if (ring != nullptr) o.token_ring_stages = std::max(0, std::atoi(ring));
  if (chain != nullptr) o.token_chain = std::atoi(chain) != 0 ? 1 : 0;
  gdn::gpu::Plan plan;
  GDN_BENCH_CHECK(gdn::cuda::decode_with(p, o, &plan));
  static std::string told;
  if (told != label(s)) {
    told = label(s);
    char desc[256];
    gdn::gpu::describe_plan(plan, desc, sizeof desc);
    std::fprintf(stderr, "bench_tokens: %s: %s\n", told.c_str(), desc);
  }
}

void BM_Tokens(benchmark::State& state, TShape s) {
  const CopyFloor copy = copy_floor(s.B, s.state);
  TokenBed bed(s);
  const bool inter = s.mode == Mode::kInter;

  // Validate once, eagerly, before any capture: the multi-token call and a
  // one-token call of the chain must be accepted and must run.
  check(gdn::decode(bed.params(bed.sets[0], -1), gdn::Backend::kCuda), s, "the multi-token call");
  multi_call(bed.params(bed.sets[0], -1), s);
  check(gdn::decode(bed.params(bed.sets[0], 0), gdn::Backend::kCuda), s, "a one-token call of the chain");
  bed.floor(bed.sets[0], inter);
  if (inter) bed.copy_to_slot(bed.sets[0], 0);
  GDN_BENCH_CHECK(cudaGetLastError());
  GDN_BENCH_CHECK(cudaStreamSynchronize(bed.stream));

  double us = 0, chained = 0, floor = 0, chain_floor = 0;
  for (auto _ : state) {
    us = bed.time([&](const TSet& cur) { multi_call(bed.params(cur, -1), s); });
    chained = bed.time([&](const TSet& cur) {
      for (int t = 0; t < s.T; ++t) {
        check(gdn::decode(bed.params(cur, t), gdn::Backend::kCuda), s, "a one-token call of the chain");
        if (inter) bed.copy_to_slot(cur, t);
      }
    });
    floor = bed.time([&](const TSet& cur) { bed.floor(cur, inter); });
    chain_floor = bed.time([&](const TSet& cur) {
      for (int t = 0; t < s.T; ++t) {
        bed.floor(cur, false);
        if (inter) bed.copy_to_slot(cur, t);
      }
    });
    GDN_BENCH_CHECK(cudaGetLastError());
    state.SetIterationTime(us * 1e-6);
  }
  state.counters["chained_us"] = chained;
  state.counters["floor_us"] = floor;
  state.counters["chain_floor_us"] = chain_floor;
  state.counters["copy_us"] = copy.us;
  state.counters["ratio"] = us / floor;
  state.counters["speedup"] = chained / us;
  g_rows.push_back({label(s), s.T, us, chained, floor, chain_floor, copy.us});
}

void register_all() {
  for (Mode m : {Mode::kFinal, Mode::kInter})
    for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
      for (gdn::Layout l : {gdn::Layout::kKV, gdn::Layout::kVK})
        for (int T : {2, 4, 8})
          for (int64_t B : {1, 8, 32, 128}) {
            const TShape s{B, T, t, l, m};
            benchmark::RegisterBenchmark(("tokens/" + label(s)).c_str(), BM_Tokens, s)
                ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
          }
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("bench_tokens: no CUDA device, nothing to measure\n");
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
  // Columns (µs a layer step of T tokens; definitions at the top of this file):
  //   gdnkit   the one multi-token call     chained  T one-token calls (+ copies)
  //   floor    the one call's floor kernel  ch-floor T floor passes (+ copies), the chain's traffic
  //   copy     bench_common's copy floor
  //   g/floor  gdnkit / floor               ch/g     chained / gdnkit
  //   exp      (T-1)/T, the share of the chained steps' state passes one call saves
  //   meas     saved_us / chain_floor_us, the same share measured in time
  //   target   chained - saved_us           met      gdnkit <= target
  std::printf("\n%-26s %9s %9s %9s %9s %9s %7s %6s %5s %5s %9s %4s\n", "case", "gdnkit us", "chained",
              "floor us", "ch-floor", "copy us", "g/floor", "ch/g", "exp", "meas", "target", "met");
  int met = 0;
  for (const Row& r : g_rows) {
    const double saved = r.chain_floor - r.floor;
    const double target = r.chained - saved;
    const bool ok = r.gdnkit <= target;
    met += ok;
    std::printf("%-26s %9.2f %9.2f %9.2f %9.2f %9.2f %7.3f %6.2f %5.2f %5.2f %9.2f %4s\n", r.what.c_str(),
                r.gdnkit, r.chained, r.floor, r.chain_floor, r.copy, r.gdnkit / r.floor, r.chained / r.gdnkit,
                double(r.T - 1) / r.T, saved / r.chain_floor, target, ok ? "yes" : "no");
  }
  std::printf("target met: %d of %zu rows\n", met, g_rows.size());
  return 0;
}
