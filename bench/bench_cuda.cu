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
// unfused_baseline.cuh) at the same shapes, so the fusion gain is measured;
// and double-buffered pools (state_out_indices: read one slot, write
// another), beside the in-place step through the same indices, with the floor
// of that traffic ("2-slot"). `--benchmark_filter=double` runs those rows
// alone.
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
  double two_slot_us;  // the 2-slot floor (double-buffer pools only), else 0
};
std::vector<Row> g_rows;

// `case_label`: the row's case, label(bed.s) when empty. `two_slot_us`: the
// 2-slot floor of a double-buffer pool (see DoubleBed), 0 for other beds.
void report(benchmark::State& st, Bed& bed, const std::string& what, double us, const CopyFloor& copy,
            const std::string& case_label = {}, double two_slot_us = 0) {
  const double gbps = 2.0 * double(bed.state_bytes) / (us * 1e-6) / 1e9;
  st.counters["copy_us"] = copy.us;
  st.counters["ratio"] = us / copy.us;
  st.counters["warm_dst_copy_us"] = copy.warm_dst_us;
  st.counters["in_place_us"] = copy.in_place_us;
  st.counters["in_place_ratio"] = us / copy.in_place_us;
  st.counters["GB/s"] = gbps;
  if (two_slot_us > 0) {
    st.counters["two_slot_us"] = two_slot_us;
    st.counters["two_slot_ratio"] = us / two_slot_us;
  }
  g_rows.push_back({what + "  " + (case_label.empty() ? label(bed.s) : case_label), us, copy.us, copy.warm_dst_us,
                    copy.in_place_us, gbps, two_slot_us});
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

// ---- Double-buffered pools -------------------------------------------------
// An engine that affords two slots per sequence steps from one to the other
// (read slot s, write slot s' != s; the next step back). A pair of rows per
// shape, on one bed and against one set of floors:
// - every rotating set's pool has 2B slots; row b reads slot
//   in[b] = (b * 7919) % B, a permutation of [0, B) (B a power of two; the
//   indexed rows' stride, kept in the first half), and the double-buffered
//   row writes slot in[b] + B, in the other half; the in-place row reads and
//   writes in[b]. No padding rows: every row moves the bytes the floors move.
//   The index arrays (in, then out) are per set, cold like the indexed rows'.
// - the sets total kRotateBytes or more counting the read half alone (Bed's
//   count: the bytes an in-place call touches); the double-buffered step
//   touches twice that.
// - besides the bed's floors, the 2-slot floor: the fastest of cudaMemcpyAsync
//   and the floor's copy kernel copying each set's read half into its write
//   half, the double-buffered step's traffic exactly (read once, written once
//   elsewhere, every byte cold), timed the same way.
// Registered in pairs, the in-place row first; the double-buffered row reuses
// the bed the in-place row built and then frees it.
bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

std::string double_label(const Shape& s, bool in_place) {
  Shape plain = s;
  plain.indexed = false;
  return label(plain) + (in_place ? " double-buffer pool, in place" : " double-buffered");
}

struct DoubleBed {
  Shape shape;
  std::unique_ptr<Bed> bed;
  std::vector<int32_t*> idx;  // per set: in (B), then out (B)
  CopyFloor floor{};
  double two_slot_us{0};

  DoubleBed() = default;
  DoubleBed(const DoubleBed&) = delete;
  DoubleBed& operator=(const DoubleBed&) = delete;
  ~DoubleBed() {
    for (int32_t* p : idx) cudaFree(p);
  }
};
std::unique_ptr<DoubleBed> g_double;  // the bed of the pair being run

bool same_shape(const Shape& a, const Shape& b) {
  return a.B == b.B && a.hk == b.hk && a.hv == b.hv && a.d == b.d && a.state == b.state && a.layout == b.layout;
}

// Each set's read half [0, state_bytes) of the pool copied into its write half.
double two_slot_floor(Bed& bed) {
  const int n = bed.calls();
  const size_t bytes = bed.state_bytes;
  const unsigned blocks = bed.copy_blocks();
  auto write_half = [&](const Set& cur) { return static_cast<char*>(cur.state) + bytes; };
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    GDN_BENCH_CHECK(cudaMemcpyAsync(write_half(cur), cur.state, bytes, cudaMemcpyDeviceToDevice, bed.stream));
  });
  const double t_memcpy = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  g = bed.capture(n, [&](const Set& cur, const Set&) {
    copy_kernel<4><<<blocks, 256, 0, bed.stream>>>(static_cast<const uint4*>(cur.state),
                                                   reinterpret_cast<uint4*>(write_half(cur)), int64_t(bytes / 16));
  });
  const double t_kernel = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  return std::min(t_memcpy, t_kernel);
}

void fail_if(const gdn::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.message);
    std::exit(1);
  }
}

// The bed of `shape`'s pair: the one already built, or a new one (the last
// one freed first).
DoubleBed& double_bed(const Shape& shape) {
  if (g_double && same_shape(g_double->shape, shape)) return *g_double;
  g_double.reset();
  if (!shape.indexed || !is_pow2(shape.B)) {
    std::fprintf(stderr, "double-buffer rows: an indexed shape with B a power of two\n");
    std::exit(1);
  }
  auto d = std::make_unique<DoubleBed>();
  d->shape = shape;
  d->bed = std::make_unique<Bed>(shape);  // indexed: 2B slots a pool
  Bed& bed = *d->bed;
  const int64_t B = shape.B;
  std::vector<int32_t> h(size_t(2 * B));
  for (int64_t b = 0; b < B; ++b) {
    h[size_t(b)] = int32_t((b * 7919) % B);
    h[size_t(B + b)] = h[size_t(b)] + int32_t(B);
  }
  // The slot rule (docs/operation.md) on the host copies, both modes: the
  // in-place check fails unless in[] is a permutation.
  gdn::DecodeParams p = bed.params(bed.sets[0]);
  p.state_indices = h.data();
  p.state_out_indices = h.data() + B;
  fail_if(gdn::check_slot_conflicts(p), "double-buffered indices");
  p.state_out_indices = nullptr;
  fail_if(gdn::check_slot_conflicts(p), "in-place indices");
  for (size_t i = 0; i < bed.sets.size(); ++i) {
    int32_t* dev = nullptr;
    GDN_BENCH_CHECK(cudaMalloc(&dev, h.size() * 4));
    d->idx.push_back(dev);
    GDN_BENCH_CHECK(cudaMemcpy(dev, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  GDN_BENCH_CHECK(cudaDeviceSynchronize());  // the pools filled
  d->floor = bed.copy_floor();
  d->two_slot_us = two_slot_floor(bed);
  g_double = std::move(d);
  return *g_double;
}

void BM_DoubleBuffer(benchmark::State& st, Shape shape, bool in_place) {
  DoubleBed& d = double_bed(shape);
  Bed& bed = *d.bed;
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    gdn::DecodeParams p = bed.params(cur);
    const int32_t* idx = d.idx[size_t(&cur - bed.sets.data())];
    p.state_indices = idx;
    p.state_out_indices = in_place ? nullptr : idx + shape.B;
    fail_if(gdn::decode(p, gdn::Backend::kCuda), "decode");
  });
  double us = 0;
  for (auto _ : st) {
    us = bed.time_graph(g, n);
    st.SetIterationTime(us * 1e-6);
  }
  cudaGraphExecDestroy(g);
  report(st, bed, "fused", us, d.floor, double_label(shape, in_place), d.two_slot_us);
  if (!in_place) g_double.reset();  // the pair done
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
  // Double-buffered pools at the main shape, each beside the in-place step
  // through the same read slots (see DoubleBed).
  for (gdn::DType t : states)
    for (gdn::Layout l : layouts)
      for (int64_t B : {8, 32, 128, 512}) {
        const Shape s{B, 16, 32, 128, t, l, true};
        for (bool in_place : {true, false})
          benchmark::RegisterBenchmark(("fused/" + double_label(s, in_place)).c_str(), BM_DoubleBuffer, s, in_place)
              ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
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
  g_double.reset();  // a pair cut short by a filter
  // "copy us": the cold copy floor the ratio uses; "in-place": the in-place
  // floor alone (the state read and written back in place) and the ratio to
  // it; "warm-dst": the copy into one reused destination (the floor before
  // 2026-12-01) and the ratio to it; "2-slot", when double-buffer rows ran:
  // the copy of each pool's read half into its write half (the
  // double-buffered step's traffic) and the ratio to it, "-" on other rows.
  // Only the rows that ran (--benchmark_filter) are printed.
  int w = 62;
  bool two_slot = false;
  for (const Row& r : g_rows) {
    w = std::max(w, int(r.what.size()));
    two_slot = two_slot || r.two_slot_us > 0;
  }
  std::printf("\n%-*s %10s %10s %7s %10s %7s %9s %10s %7s", w, "case", "us", "copy us", "ratio", "in-place",
              "ratio", "GB/s", "warm-dst", "ratio");
  if (two_slot) std::printf(" %10s %7s", "2-slot", "ratio");
  std::printf("\n");
  for (const Row& r : g_rows) {
    std::printf("%-*s %10.2f %10.2f %7.3f %10.2f %7.3f %9.0f %10.2f %7.3f", w, r.what.c_str(), r.us, r.copy_us,
                r.us / r.copy_us, r.in_place_us, r.us / r.in_place_us, r.gbps, r.warm_copy_us,
                r.us / r.warm_copy_us);
    if (two_slot && r.two_slot_us > 0)
      std::printf(" %10.2f %7.3f", r.two_slot_us, r.us / r.two_slot_us);
    else if (two_slot)
      std::printf(" %10s %7s", "-", "-");
    std::printf("\n");
  }
  return 0;
}
