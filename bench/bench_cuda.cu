// GPU benchmark of the fused decode step, by the protocol of docs/benchmarks.md:
//
// - every timed call runs inside a replayed CUDA graph;
// - calls rotate over enough distinct state/input sets that they total at
//   least 2x the L2 (>= 128 MiB here), so every call starts cold, as in a real
//   decode where 30+ layers and the weights pass in between;
// - the copy floor (the same state bytes copied device to device, every byte
//   cold: see CopyFloor) is timed the same way in the same run, and the ratio
//   kernel / copy reported, with the warm-destination copy (the floor used
//   until 2026-11-30) beside it;
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
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gdnkit/gdnkit.hpp"
#include "gdnkit/half.hpp"
#include "bench_common.cuh"
#include "unfused_baseline.cuh"

namespace {

using namespace gdn_bench;

std::string label(const Shape& s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "B=%lld Hk=%d Hv=%d D=%d %s %s%s", (long long)s.B, s.hk, s.hv, s.d,
                gdn::to_string(s.state), gdn::to_string(s.layout),
                s.indexed ? (s.shared_index ? " indexed, one index array" : " indexed") : "");
  return buf;
}

struct Row {
  std::string what;
  double us, copy_us, warm_copy_us, in_place_us;
  double gbps;
};
std::vector<Row> g_rows;

void report(benchmark::State& st, Bed& bed, const std::string& what, double us, const CopyFloor& copy) {
  const double gbps = 2.0 * double(bed.state_bytes) / (us * 1e-6) / 1e9;
  st.counters["copy_us"] = copy.us;
  st.counters["ratio"] = us / copy.us;
  st.counters["warm_dst_copy_us"] = copy.warm_dst_us;
  st.counters["in_place_us"] = copy.in_place_us;
  st.counters["in_place_ratio"] = us / copy.in_place_us;
  st.counters["GB/s"] = gbps;
  g_rows.push_back({what + "  " + label(bed.s), us, copy.us, copy.warm_dst_us, copy.in_place_us, gbps});
}

// Time one way of doing the step (fused or unfused) against the copy floor of the same bed.
template <typename Enqueue>
void time_against_copy(benchmark::State& st, Bed& bed, const char* what, Enqueue&& enqueue) {
  const CopyFloor copy = bed.copy_floor();
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) { enqueue(cur); });
  double us = 0;
  for (auto _ : st) {
    us = bed.time_graph(g, n);
    st.SetIterationTime(us * 1e-6);
  }
  cudaGraphExecDestroy(g);
  report(st, bed, what, us, copy);
}

void BM_Fused(benchmark::State& st, Shape shape) {
  Bed bed(shape);
  time_against_copy(st, bed, "fused", [&](const Set& cur) {
    const gdn::Status s = gdn::decode(bed.params(cur), gdn::Backend::kCuda);
    if (!s.ok()) {
      std::fprintf(stderr, "decode: %s\n", s.message);
      std::exit(1);
    }
  });
}

void BM_Unfused(benchmark::State& st, Shape shape) {
  Bed bed(shape);
  // Scratch (the normalized and repeated q/k, the gates, the out-of-place
  // state) per rotating set, so the baseline's intermediates start cold
  // too, as the protocol asks of every byte a call touches.
  std::vector<std::unique_ptr<gdn_bench::UnfusedScratch>> scratch;
  for (const Set& set : bed.sets) scratch.push_back(std::make_unique<gdn_bench::UnfusedScratch>(bed.params(set)));
  time_against_copy(st, bed, "unfused", [&](const Set& cur) {
    gdn_bench::unfused_decode(bed.params(cur), *scratch[size_t(&cur - bed.sets.data())], bed.stream);
  });
}

void register_all() {
  const gdn::DType states[] = {gdn::DType::kF32, gdn::DType::kBF16};
  const gdn::Layout layouts[] = {gdn::Layout::kKV, gdn::Layout::kVK};
  // The headline sweep at the Qwen3.5-35B-A3B shape (bench/RESULTS.md).
  for (gdn::DType t : states)
    for (gdn::Layout l : layouts)
      for (int64_t B : {1, 8, 32, 128, 512}) {
        const Shape s{B, 16, 32, 128, t, l, false};
        benchmark::RegisterBenchmark(("fused/" + label(s)).c_str(), BM_Fused, s)
            ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      }
  // Spot checks: other head counts, tensor parallel, pools with indices and
  // padding (B = 8 too: fp32 kv blocks there reduce two tiles together).
  for (gdn::DType t : states)
    for (int64_t B : {1, 8, 32, 512}) {
      for (int hv : {48, 64}) {
        const Shape s{B, 16, hv, 128, t, gdn::Layout::kVK, false};
        benchmark::RegisterBenchmark(("fused/" + label(s)).c_str(), BM_Fused, s)
            ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      }
      const Shape tp{B, 4, 8, 128, t, gdn::Layout::kVK, false};
      benchmark::RegisterBenchmark(("fused/" + label(tp)).c_str(), BM_Fused, tp)
          ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      for (gdn::Layout l : layouts)
        for (bool shared : {false, true}) {
          const Shape ix{B, 16, 32, 128, t, l, true, shared};
          benchmark::RegisterBenchmark(("fused/" + label(ix)).c_str(), BM_Fused, ix)
              ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
        }
    }
  // Head dims 64 and 256 (docs/operation.md, Sizes and tensors: they must
  // work; 128 is the tuned case), so a model with other heads sees what it
  // gets, not an untuned surprise.
  for (gdn::DType t : states)
    for (gdn::Layout l : layouts)
      for (int d : {64, 256})
        for (int64_t B : {1, 32, 512}) {
          const Shape s{B, 16, 32, d, t, l, false};
          benchmark::RegisterBenchmark(("fused/" + label(s)).c_str(), BM_Fused, s)
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
  // "copy us": the cold copy floor the ratio uses; "in-place": the in-place
  // floor alone (the state read and written back in place) and the ratio to
  // it; "warm-dst": the copy into one reused destination (the floor before
  // 2026-12-01) and the ratio to it.
  std::printf("\n%-62s %10s %10s %7s %10s %7s %9s %10s %7s\n", "case", "us", "copy us", "ratio", "in-place",
              "ratio", "GB/s", "warm-dst", "ratio");
  for (const Row& r : g_rows)
    std::printf("%-62s %10.2f %10.2f %7.3f %10.2f %7.3f %9.0f %10.2f %7.3f\n", r.what.c_str(), r.us, r.copy_us,
                r.us / r.copy_us, r.in_place_us, r.us / r.in_place_us, r.gbps, r.warm_copy_us,
                r.us / r.warm_copy_us);
  return 0;
}
