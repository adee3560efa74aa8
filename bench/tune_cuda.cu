// Tuning sweeps for the CUDA backend, by bench_cuda's protocol (graph
// replay over rotating cold buffers, the copy floor of the same bytes in the
// same run). Every library kernel is reached through the planner's one seam,
// gpu::PlanOverrides, so what is timed is what the library launches:
//   tune_cuda [ipw]      items a vk warp (tiles a kv block) streams: the cap forced
//   tune_cuda wave       the one-wave vk kernel against the ring kernel
//   tune_cuda occupancy  the step with fewer blocks an SM (shared memory padded)
//   tune_cuda skeleton   the kv step's memory traffic alone (no arithmetic)
//   tune_cuda plans      the plan of every benchmark shape on this GPU (no timing)
//   tune_cuda table      this GPU's occupancy table (DeviceInfo), in the form of
//                        tests/plan_h200_device.inc (ci/gpu_check.sh plan compares them)
// The choices the library ships, and the numbers behind them, are in
// docs/decisions.md.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../backends/cuda/common/memory.cuh"
#include "../backends/cuda/device.h"
#include "bench_common.cuh"

namespace {

using gdn::Layout;
using namespace gdn_bench;

// One timed row: the library's call under overrides o.
void timed_row(Bed& bed, double copy, const gdn::gpu::PlanOverrides& o, const char* variant) {
  const int n = bed.calls();
  gdn::gpu::Plan plan;
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    GDN_BENCH_CHECK(gdn::cuda::decode_with(bed.params(cur), o, &plan));
  });
  const double us = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  char desc[256];
  gdn::gpu::describe_plan(plan, desc, sizeof desc);
  std::printf("%-6s %-3s %4lld %-12s %9.2f %9.2f %7.3f  %s\n", gdn::to_string(bed.s.state), gdn::to_string(bed.s.layout),
              (long long)bed.s.B, variant, us, copy, us / copy, desc);
}

void header() {
  std::printf("%-6s %-3s %4s %-12s %9s %9s %7s  %s\n", "state", "lay", "B", "variant", "us", "copy", "ratio", "plan");
}

// "ipw": the planner with its cap on items a warp (tiles a block) forced.
void sweep_items_per_warp() {
  header();
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (Layout l : {Layout::kVK, Layout::kKV})
      for (int64_t B : {8, 32, 128, 512}) {
        Bed bed(Shape{B, 16, 32, 128, t, l, false});
        const double copy = bed.copy_floor_us();
        timed_row(bed, copy, {}, "shipped");
        for (int ipw : {1, 2, 3, 4, 8}) {
          gdn::gpu::PlanOverrides o;
          o.max_items_per_warp = ipw;
          char name[32];
          std::snprintf(name, sizeof name, "ipw<=%d", ipw);
          timed_row(bed, copy, o, name);
        }
      }
}

// "wave": the engines' call with and without the one-wave kernel.
void sweep_wave() {
  header();
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (bool pool : {false, true})
      for (int64_t B : {1, 8}) {
        Bed bed(Shape{B, 16, 32, 128, t, Layout::kVK, pool});
        const double copy = bed.copy_floor_us();
        gdn::gpu::PlanOverrides ring;
        ring.allow_wave = false;
        timed_row(bed, copy, {}, pool ? "pool" : "dense");
        timed_row(bed, copy, ring, pool ? "pool/ring" : "dense/ring");
      }
}

// "occupancy": the step's shared memory padded so that fewer blocks fit an SM.
void sweep_occupancy() {
  header();
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (Layout l : {Layout::kVK, Layout::kKV})
      for (int64_t B : {32, 128}) {
        Bed bed(Shape{B, 16, 32, 128, t, l, false});
        const double copy = bed.copy_floor_us();
        timed_row(bed, copy, {}, "shipped");
        for (int kib : {64, 96, 128}) {
          gdn::gpu::PlanOverrides o;
          o.min_step_smem = size_t(kib) << 10;
          o.allow_wave = false;
          char name[32];
          std::snprintf(name, sizeof name, "smem>=%dK", kib);
          timed_row(bed, copy, o, name);
        }
      }
}

// "table": the occupancy half of this GPU's DeviceInfo, one assignment a line.
void print_table() {
  int dev = 0;
  const gdn::gpu::DeviceInfo* info = gdn::cuda::current_device_info(&dev);
  if (info == nullptr) return;
  for (int s = 0; s < 3; ++s)
    for (int l = 0; l < 2; ++l)
      for (int k = 0; k < 3; ++k)
        for (int t = 0; t < 2; ++t)
          for (int io = 0; io < gdn::gpu::kNumIo; ++io)
            std::printf("d.step_warps[%d][%d][%d][%d][%d] = %d;\n", s, l, k, t, io, info->step_warps[s][l][k][t][io]);
  for (int s = 0; s < 3; ++s)
    for (int io = 0; io < gdn::gpu::kNumIo; ++io)
      for (int x = 0; x < 2; ++x) std::printf("d.wave_warps[%d][%d][%d] = %d;\n", s, io, x, info->wave_warps[s][io][x]);
}

// "plans": what the planner picks on this GPU for the benchmark's shapes.
void print_plans() {
  int dev = 0;
  const gdn::gpu::DeviceInfo* info = gdn::cuda::current_device_info(&dev);
  if (info == nullptr) return;
  std::printf("device %d: %d SMs, L2 %lld bytes, DRAM %.3g B/s, sm90 %d\n", dev, info->sms, (long long)info->l2_bytes,
              info->dram_bytes_per_s, int(info->sm90));
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (Layout l : {Layout::kVK, Layout::kKV})
      for (bool pool : {false, true})
        for (int64_t B : {1, 8, 32, 128, 512}) {
          Bed bed(Shape{B, 16, 32, 128, t, l, pool});
          const gdn::gpu::Plan plan = gdn::gpu::plan_launch(bed.params(bed.sets[0]), *info);
          char desc[256];
          gdn::gpu::describe_plan(plan, desc, sizeof desc);
          std::printf("%-6s %-3s %-5s %4lld  %s\n", gdn::to_string(t), gdn::to_string(l), pool ? "pool" : "dense",
                      (long long)B, desc);
        }
}

// "skeleton": the kv step's memory traffic alone (a diagnostic). Tiles of
// 128 rows x 128-byte row segments (the kv tile of 8 warps: 16 KiB), thread
// t copying chunk t % 8 of rows t / 8 + 32 n with cp.async into a ring of
// kStages stages, reading them back once landed and storing them in place;
// kBarriers block barriers a tile stand in for the reduction's. Or, with
// `contiguous`, 16 KiB runs of memory of the same count instead of tiles.
// Orders of the tiles a block streams (`order`): 0 tiles_per_block
// consecutive tiles a block, as the step kernel's grid; 1 persistent, the
// block's tiles k, k + grid, ... (the copy kernel's grid stride); 2
// persistent, whole heads k, k + grid, .... Tells how much of the step's
// distance to the copy floor is its memory pattern rather than its arithmetic.
template <int kStages, int kBarriers>
__global__ void __launch_bounds__(256, 4)
    skeleton_kernel(char* state, int tiles_total, int tph_log2, int row_bytes, int tiles_per_block, int order,
                    bool contiguous) {
  extern __shared__ uint4 ring[];
  const int tid = int(threadIdx.x), chunk = tid % 8, rg = tid / 8;
  const int tph = 1 << tph_log2, grid = int(gridDim.x), k = int(blockIdx.x);
  // the block's i-th tile, or -1 past its last
  auto tile_of = [&](int i) -> int {
    if (order == 0) return i < tiles_per_block && k * tiles_per_block + i < tiles_total ? k * tiles_per_block + i : -1;
    if (order == 1) return k + i * grid < tiles_total ? k + i * grid : -1;
    const int gt = (k + (i >> tph_log2) * grid) * tph + (i & (tph - 1));
    return gt < tiles_total ? gt : -1;
  };
  auto addr = [&](int gt, int n) {
    if (contiguous) return state + int64_t(gt) * 16384 + (n * 256 + tid) * 16;
    const int64_t head = gt >> tph_log2, tile = gt & (tph - 1);
    return state + head * 128 * row_bytes + tile * 128 + int64_t(rg + 32 * n) * row_bytes + chunk * 16;
  };
  auto issue = [&](int gt, int stage) {
    if (gt >= 0) {
#pragma unroll
      for (int n = 0; n < 4; ++n) gdn::cuda::copy16_async(&ring[(stage * 4 + n) * 256 + tid], addr(gt, n), true);
    }
    gdn::cuda::async_commit();
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue(tile_of(st), st);
  int stage = 0;
  for (int i = 0;; ++i) {
    const int gt = tile_of(i);
    if (gt < 0) break;
    issue(tile_of(i + kStages - 1), stage == 0 ? kStages - 1 : stage - 1);
    gdn::cuda::async_wait<kStages - 1>();
    uint4 x[4];
#pragma unroll
    for (int n = 0; n < 4; ++n) x[n] = ring[(stage * 4 + n) * 256 + tid];
#pragma unroll
    for (int b = 0; b < kBarriers; ++b) __syncthreads();
#pragma unroll
    for (int n = 0; n < 4; ++n) *reinterpret_cast<uint4*>(addr(gt, n)) = x[n];
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
}

template <int kStages, int kBarriers>
void skeleton_run(Bed& bed, int sms, int order, bool contiguous, int tiles_per_block, int blocks_per_sm,
                  double copy) {
  const int row_bytes = bed.s.d * int(gdn::dtype_size(bed.s.state));
  const int tph = row_bytes / 128;
  int tph_log2 = 0;
  while ((1 << tph_log2) < tph) ++tph_log2;
  const int tiles_total = int(bed.s.B * bed.s.hv) * tph;
  const size_t smem = size_t(kStages) * 4 * 256 * 16;
  GDN_BENCH_CHECK(cudaFuncSetAttribute(&skeleton_kernel<kStages, kBarriers>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int blocks = order == 0   ? (tiles_total + tiles_per_block - 1) / tiles_per_block
                     : order == 1 ? std::min(tiles_total, sms * blocks_per_sm)
                                  : std::min(tiles_total / tph, sms * blocks_per_sm);
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    skeleton_kernel<kStages, kBarriers><<<blocks, 256, smem, bed.stream>>>(
        static_cast<char*>(cur.state), tiles_total, tph_log2, row_bytes, tiles_per_block, order, contiguous);
  });
  const double us = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  static const char* names[3] = {"per-block", "stride-tile", "stride-head"};
  std::printf("%-6s %4lld %-11s %-5s stages %d barriers %d tiles/block %2d blocks %6d %9.2f %9.2f %7.3f\n",
              gdn::to_string(bed.s.state), (long long)bed.s.B, names[order], contiguous ? "runs" : "tiles", kStages,
              kBarriers, order == 0 ? tiles_per_block : 0, blocks, us, copy, us / copy);
}

void sweep_skeleton(int sms) {
  std::printf("%-6s %4s %-11s %s\n", "state", "B", "order", "... us copy ratio");
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (int64_t B : {8, 32, 128, 512}) {
      Bed bed(Shape{B, 16, 32, 128, t, Layout::kKV, false});
      const double copy = bed.copy_floor_us();
      const int tph = t == gdn::DType::kF32 ? 4 : 2;
      for (bool runs : {false, true}) {
        skeleton_run<3, 2>(bed, sms, 0, runs, 1, 4, copy);
        skeleton_run<3, 2>(bed, sms, 0, runs, 2, 4, copy);
        if (tph == 4) skeleton_run<3, 2>(bed, sms, 0, runs, 4, 4, copy);
        skeleton_run<3, 2>(bed, sms, 1, runs, 0, 4, copy);
        skeleton_run<3, 2>(bed, sms, 2, runs, 0, 4, copy);
      }
      skeleton_run<2, 2>(bed, sms, 1, false, 0, 4, copy);
      skeleton_run<4, 2>(bed, sms, 1, false, 0, 3, copy);
    }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ipw";
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    std::printf("tune_cuda: no CUDA device\n");
    return 0;
  }
  if (mode == "ipw") {
    sweep_items_per_warp();
  } else if (mode == "wave") {
    sweep_wave();
  } else if (mode == "occupancy") {
    sweep_occupancy();
  } else if (mode == "skeleton") {
    sweep_skeleton(sms);
  } else if (mode == "plans") {
    print_plans();
  } else if (mode == "table") {
    print_table();
  } else {
    std::fprintf(stderr, "usage: tune_cuda [ipw|wave|occupancy|skeleton|plans|table]\n");
    return 2;
  }
  return 0;
}
