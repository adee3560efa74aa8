// Tuning sweep for the CUDA kernel's two knobs, by the same protocol as
// bench_cuda: the tile parameter kP (vk: state values a lane holds per item;
// kv: warps a block = 16-byte chunks of each row in a shared-memory tile) and
// how many items a warp streams through (kv: tiles a block streams through).
// Prints one line per (shape, variant) with the ratio to the copy floor; the
// choices the library ships and the measured reason are in bench/RESULTS.md.
#include <cstdio>
#include <string>
#include <vector>

#include "../backends/cuda/decode_kernel_impl.cuh"
#include "bench_common.cuh"

namespace {

using gdn::Layout;
using namespace gdn_bench;

struct Variant {
  const char* name;
  Layout layout;
  cudaError_t (*run)(const gdn::DecodeParams&, int sms, int max_ipw, cudaStream_t);
};

template <typename T, Layout L, int kP>
cudaError_t run_variant(const gdn::DecodeParams& p, int sms, int max_ipw, cudaStream_t s) {
  const gdn::cuda::Launch g = gdn::cuda::plan_launch<T, L, 128, kP>(p, sms, max_ipw);
  return gdn::cuda::launch_decode<T, L, 128, kP>(p, g, s);
}

template <typename T>
std::vector<Variant> variants() {
  return {
      {"vk P=8", Layout::kVK, run_variant<T, Layout::kVK, 8>},
      {"vk P=16", Layout::kVK, run_variant<T, Layout::kVK, 16>},
      {"vk P=32", Layout::kVK, run_variant<T, Layout::kVK, 32>},
      {"kv W=2", Layout::kKV, run_variant<T, Layout::kKV, 2>},
      {"kv W=4", Layout::kKV, run_variant<T, Layout::kKV, 4>},
      {"kv W=8", Layout::kKV, run_variant<T, Layout::kKV, 8>},
  };
}

}  // namespace

// Items a warp may stream (upper bound handed to the planner).
const int kItemsPerWarp[] = {1, 2, 4, 8, 16};

// "blocks": vk at small B with the planner's items per warp but a forced
// block size W (warps a block), to tell block-launch cost from per-warp latency.
template <typename T>
void sweep_block_size(int sms) {
  constexpr int kP = gdn::cuda::default_tile_param<T, Layout::kVK>();
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  for (int64_t B : {1, 8, 32}) {
    Bed bed(Shape{B, 16, 32, 128, t, Layout::kVK, false});
    const double copy = bed.copy_floor_us();
    for (int w : {1, 2, 4, 8}) {
      const int n = bed.calls();
      cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
        const gdn::DecodeParams p = bed.params(cur);
        gdn::cuda::Launch l = gdn::cuda::plan_launch<T, Layout::kVK, 128, kP>(p, sms, 4);
        const int warps_per_head = (l.items_per_head + l.items_per_warp - 1) / l.items_per_warp;
        l.warps_per_block = w;
        l.blocks_per_head = (warps_per_head + w - 1) / w;
        GDN_BENCH_CHECK((gdn::cuda::launch_decode<T, Layout::kVK, 128, kP>(p, l, bed.stream)));
      });
      const double us = bed.time_graph(g, n);
      cudaGraphExecDestroy(g);
      std::printf("%-6s %-5s %4lld W=%-6d %4s %9.2f %9.2f %7.3f\n", gdn::to_string(t), "vk", (long long)B, w, "-",
                  us, copy, us / copy);
    }
  }
}

// "ipw": vk with the planner's block size but a forced number of items a
// warp streams (any count, not only the planner's powers of two), to see how
// the grid's waves and each warp's stream trade off at mid and large B.
template <typename T>
void sweep_items_per_warp(int sms) {
  constexpr int kP = gdn::cuda::default_tile_param<T, Layout::kVK>();
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  for (int64_t B : {8, 32, 128, 512}) {
    Bed bed(Shape{B, 16, 32, 128, t, Layout::kVK, false});
    const double copy = bed.copy_floor_us();
    for (int ipw : {1, 2, 3, 4, 5, 6, 8}) {
      const int n = bed.calls();
      cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
        const gdn::DecodeParams p = bed.params(cur);
        gdn::cuda::Launch l = gdn::cuda::plan_launch<T, Layout::kVK, 128, kP>(p, sms, 2);
        l.items_per_warp = ipw;
        const int warps_per_head = (l.items_per_head + ipw - 1) / ipw;
        l.blocks_per_head = (warps_per_head + l.warps_per_block - 1) / l.warps_per_block;
        l.small_loads_first = false;
        GDN_BENCH_CHECK((gdn::cuda::launch_decode<T, Layout::kVK, 128, kP>(p, l, bed.stream)));
      });
      const double us = bed.time_graph(g, n);
      cudaGraphExecDestroy(g);
      std::printf("%-6s %-5s %4lld %-8s %4d %9.2f %9.2f %7.3f\n", gdn::to_string(t), "vk", (long long)B, "forced", ipw,
                  us, copy, us / copy);
    }
  }
}

// Optional arguments: "vk" or "kv" sweeps that layout only ("blocks": the vk
// block size at small B; "ipw": vk items a warp, forced); a second one keeps
// the variants whose name has it. (A kv variant runs the planner's choice,
// which takes 4-warp tiles in one-round grids: "kv W=8" at B = 1 is 4 warps.)
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const std::string variant = argc > 2 ? argv[2] : "";  // e.g. "W=8": variants whose name contains it
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    std::printf("tune_cuda: no CUDA device\n");
    return 0;
  }
  if (only == "blocks") {
    std::printf("%-6s %-5s %4s %-8s %4s %9s %9s %7s\n", "state", "lay", "B", "variant", "ipw", "us", "copy", "ratio");
    sweep_block_size<float>(sms);
    sweep_block_size<__nv_bfloat16>(sms);
    return 0;
  }
  if (only == "ipw") {
    std::printf("%-6s %-5s %4s %-8s %4s %9s %9s %7s\n", "state", "lay", "B", "variant", "ipw", "us", "copy", "ratio");
    sweep_items_per_warp<float>(sms);
    sweep_items_per_warp<__nv_bfloat16>(sms);
    return 0;
  }
  std::printf("%-6s %-5s %4s %-8s %4s %9s %9s %7s\n", "state", "lay", "B", "variant", "ipw", "us", "copy", "ratio");
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16}) {
    const auto vs = t == gdn::DType::kF32 ? variants<float>() : variants<__nv_bfloat16>();
    for (Layout l : {Layout::kVK, Layout::kKV}) {
      if (!only.empty() && only != gdn::to_string(l)) continue;
      for (int64_t B : {1, 8, 32, 128, 512}) {
        Bed bed(Shape{B, 16, 32, 128, t, l, false});
        const double copy = bed.copy_floor_us();
        for (const Variant& v : vs) {
          if (v.layout != l || std::string(v.name).find(variant) == std::string::npos) continue;
          for (int ipw : kItemsPerWarp) {
            const int n = bed.calls();
            cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
              GDN_BENCH_CHECK(v.run(bed.params(cur), sms, ipw, bed.stream));
            });
            const double us = bed.time_graph(g, n);
            cudaGraphExecDestroy(g);
            std::printf("%-6s %-5s %4lld %-8s %4d %9.2f %9.2f %7.3f\n", gdn::to_string(t),
                        gdn::to_string(l), (long long)B, v.name, ipw, us, copy, us / copy);
          }
        }
      }
    }
  }
  return 0;
}
