// Tuning sweep for the CUDA kernel's two knobs, by the same protocol as
// bench_cuda: the tile parameter kP (vk: state values a lane holds per item;
// kv: warps a block = 16-byte chunks of each row in a shared-memory tile) and
// how many items a warp streams through (kv: tiles a block streams through).
// Prints one line per (shape, variant) with the ratio to the copy floor; the
// choices the library ships and the measured reason are in bench/RESULTS.md.
// Also diagnostics of the memory traffic alone (the "skeleton" modes, below
// and RESULTS round 8).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define GDN_TUNE_HOOKS 1  // launch_decode's shared-memory pad (the "occupancy" mode)
#include "../backends/cuda/decode_kernel_impl.cuh"
#include "bench_common.cuh"

namespace {

using gdn::Layout;
using namespace gdn_bench;

int64_t g_l2_bytes = 0;  // the GPU's L2 (plan_launch's L2 policies)

struct Variant {
  const char* name;
  Layout layout;
  cudaError_t (*run)(const gdn::DecodeParams&, int sms, int max_ipw, cudaStream_t);
};

template <typename T, Layout L, int kP>
cudaError_t run_variant(const gdn::DecodeParams& p, int sms, int max_ipw, cudaStream_t s) {
  const gdn::cuda::Launch g = gdn::cuda::plan_launch<T, L, 128, kP>(p, sms, g_l2_bytes, max_ipw);
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

// "skeleton2": one unit a block (kThreads x 64 bytes: 16 KiB at 256
// threads, 8 KiB at 128), as a tile of kThreads / 32 16-byte chunks of each
// of 128 rows or as a contiguous run; loaded with cp.async through shared
// memory (kLdg false) or straight into registers (kLdg true), two block
// barriers, stored in place.
template <int kThreads, bool kLdg>
__global__ void __launch_bounds__(kThreads) skeleton2_kernel(char* state, int row_bytes, bool contiguous) {
  __shared__ uint4 ring[4 * kThreads];
  constexpr int kW = kThreads / 32;
  const int tid = int(threadIdx.x), chunk = tid % kW, rg = tid / kW;
  const int tph = row_bytes / (kW * 16);
  const int gt = int(blockIdx.x);
  auto addr = [&](int n) {
    if (contiguous) return state + int64_t(gt) * (kThreads * 64) + (n * kThreads + tid) * 16;
    const int64_t head = gt / tph, tile = gt - head * tph;
    return state + head * 128 * row_bytes + tile * (kW * 16) + int64_t(rg + 32 * n) * row_bytes + chunk * 16;
  };
  uint4 x[4];
  if (kLdg) {
#pragma unroll
    for (int n = 0; n < 4; ++n) x[n] = *reinterpret_cast<const uint4*>(addr(n));
  } else {
#pragma unroll
    for (int n = 0; n < 4; ++n) gdn::cuda::copy16_async(&ring[n * kThreads + tid], addr(n), true);
    gdn::cuda::async_commit();
    gdn::cuda::async_wait<0>();
#pragma unroll
    for (int n = 0; n < 4; ++n) x[n] = ring[n * kThreads + tid];
  }
  __syncthreads();
  __syncthreads();
#pragma unroll
  for (int n = 0; n < 4; ++n) *reinterpret_cast<uint4*>(addr(n)) = x[n];
}

template <int kThreads, bool kLdg>
void skeleton2_run(Bed& bed, bool contiguous, double copy) {
  const int row_bytes = bed.s.d * int(gdn::dtype_size(bed.s.state));
  const int blocks = int(bed.state_bytes / (kThreads * 64));
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    skeleton2_kernel<kThreads, kLdg><<<blocks, kThreads, 0, bed.stream>>>(static_cast<char*>(cur.state), row_bytes,
                                                                          contiguous);
  });
  const double us = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  std::printf("%-6s %4lld %-5s %-5s threads %3d blocks %6d %9.2f %9.2f %7.3f\n", gdn::to_string(bed.s.state),
              (long long)bed.s.B, contiguous ? "runs" : "tiles", kLdg ? "ldg" : "async", kThreads, blocks, us, copy,
              us / copy);
}

void sweep_skeleton2() {
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (int64_t B : {8, 32, 128, 512}) {
      Bed bed(Shape{B, 16, 32, 128, t, Layout::kKV, false});
      const double copy = bed.copy_floor_us();
      for (bool runs : {false, true}) {
        skeleton2_run<256, false>(bed, runs, copy);
        skeleton2_run<256, true>(bed, runs, copy);
        skeleton2_run<128, false>(bed, runs, copy);
        skeleton2_run<128, true>(bed, runs, copy);
      }
    }
}

// "copies": how far the in-place traffic alone is from the copy floor (a
// copy into a second buffer, bench_common.cuh), by its form and the blocks
// an SM (round 8's one 16 KiB run a block with plain loads, 64 warps an SM
// as the copy's, was 1.05-1.08x it at B = 32-128; RESULTS round 22). Every
// form copies the bed's state onto itself with plain 16-byte loads and
// stores, nothing in shared memory, no barrier:
// - "stride": the floor's kernel (copy_kernel: grid stride, 4 or 8 loads
//   in flight a thread), its grid k blocks of 256 threads an SM;
// - "units": 16 KiB units (a run, or a kv tile of 128-byte segments of 128
//   rows) taken by k persistent blocks an SM in grid-stride order of units;
// - "blocks": one unit a block (the step's grid), at most k blocks an SM
//   (shared memory padded so no more fit).
// Each thread loads its 4 vectors of a unit, then stores them.
__global__ void __launch_bounds__(256) copies_units_kernel(const char* src, char* dst, int units, int row_bytes,
                                                           bool tiles, bool persistent) {
  const int tid = int(threadIdx.x), chunk = tid % 8, rg = tid / 8;
  const int tph = row_bytes / 128;
  auto off = [&](int u, int n) -> int64_t {
    if (!tiles) return int64_t(u) * 16384 + (n * 256 + tid) * 16;
    const int64_t head = u / tph, tile = u - head * tph;
    return head * 128 * row_bytes + tile * 128 + int64_t(rg + 32 * n) * row_bytes + chunk * 16;
  };
  for (int u = int(blockIdx.x); u < units; u += persistent ? int(gridDim.x) : units) {
    uint4 x[4];
#pragma unroll
    for (int n = 0; n < 4; ++n) x[n] = *reinterpret_cast<const uint4*>(src + off(u, n));
#pragma unroll
    for (int n = 0; n < 4; ++n) *reinterpret_cast<uint4*>(dst + off(u, n)) = x[n];
  }
}

template <typename Launch>
void copies_time(Bed& bed, const char* form, int k, int unroll, double copy, Launch&& launch) {
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) { launch(cur); });
  const double us = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  std::printf("%-6s %4lld %-12s k %d unroll %d %9.2f %9.2f %7.3f\n", gdn::to_string(bed.s.state),
              (long long)bed.s.B, form, k, unroll, us, copy, us / copy);
}

void sweep_copies(int sms) {
  int per_sm = 0, optin = 0;
  GDN_BENCH_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  GDN_BENCH_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  GDN_BENCH_CHECK(cudaFuncSetAttribute(&copies_units_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  for (int rep = 0; rep < 2; ++rep)
    for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
      for (int64_t B : {32, 128}) {
        Bed bed(Shape{B, 16, 32, 128, t, Layout::kKV, false});
        const double copy = bed.copy_floor_us();
        const int64_t vecs = int64_t(bed.state_bytes / 16);
        const int units = int(bed.state_bytes / 16384);
        const int row_bytes = bed.s.d * int(gdn::dtype_size(t));
        auto st = [](const Set& c) { return static_cast<uint4*>(c.state); };
        for (int k : {8, 4, 2, 1}) {
          const unsigned grid = unsigned(k * sms);
          copies_time(bed, "stride", k, 4, copy, [&](const Set& c) {
            copy_kernel<4><<<grid, 256, 0, bed.stream>>>(st(c), st(c), vecs);
          });
          copies_time(bed, "stride", k, 8, copy, [&](const Set& c) {
            copy_kernel<8><<<grid, 256, 0, bed.stream>>>(st(c), st(c), vecs);
          });
        }
        for (bool tiles : {false, true})
          for (int k : {8, 4, 3, 2}) {
            const unsigned grid = unsigned(k * sms);
            copies_time(bed, tiles ? "units-tiles" : "units-runs", k, 4, copy, [&](const Set& c) {
              copies_units_kernel<<<grid, 256, 0, bed.stream>>>(static_cast<char*>(c.state),
                                                                static_cast<char*>(c.state), units, row_bytes, tiles,
                                                                true);
            });
            // k blocks an SM at most: k + 1 blocks of this much shared memory do not fit
            const size_t pad = k >= 8 ? 0 : size_t(per_sm) / size_t(k + 1) + 1;
            copies_time(bed, tiles ? "blocks-tiles" : "blocks-runs", k, 4, copy, [&](const Set& c) {
              copies_units_kernel<<<unsigned(units), 256, pad, bed.stream>>>(
                  static_cast<char*>(c.state), static_cast<char*>(c.state), units, row_bytes, tiles, false);
            });
          }
      }
}

// "skeleton3" (sm_90): the same units loaded by the bulk-copy unit (TMA,
// cp.async.bulk) into shared memory, counted on an mbarrier, instead of by
// the threads: a 16 KiB run in one copy, or a tile as 128 copies of one
// 128-byte row segment (thread r < 128 copies row r). Then every thread
// reads its 4 chunks, two block barriers, and stores them in place.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) skeleton3_kernel(char* state, int row_bytes, bool contiguous) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ alignas(128) uint4 buf[4 * kThreads];
  __shared__ alignas(8) unsigned long long bar;
  constexpr int kW = kThreads / 32;
  const int tid = int(threadIdx.x), chunk = tid % kW, rg = tid / kW;
  const int tph = row_bytes / (kW * 16);
  const int gt = int(blockIdx.x);
  const unsigned bar_s = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  const unsigned buf_s = static_cast<unsigned>(__cvta_generic_to_shared(buf));
  constexpr unsigned kBytes = kThreads * 64;
  // the mbarrier of the fused kernels' outputs (one arrival expecting kBytes)
  if (tid == 0) {
    gdn::cuda::outputs_barrier_init(&bar);
    gdn::cuda::outputs_expect(&bar, kBytes);
  }
  __syncthreads();
  const int64_t head = gt / tph, tile = gt - head * tph;
  const char* tile_base = state + head * 128 * row_bytes + tile * (kW * 16);
  if (contiguous) {
    if (tid == 0)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       buf_s),
                   "l"(state + int64_t(gt) * kBytes), "r"(kBytes), "r"(bar_s)
                   : "memory");
  } else if (tid < 128) {
    // row tid of the tile: kW * 16 bytes into buf at [row][kW chunks]
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     buf_s + unsigned(tid * kW * 16)),
                 "l"(tile_base + int64_t(tid) * row_bytes), "r"(unsigned(kW * 16)), "r"(bar_s)
                 : "memory");
  }
  gdn::cuda::outputs_wait(&bar);
  uint4 x[4];
  char* dst[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    if (contiguous) {
      x[n] = buf[n * kThreads + tid];
      dst[n] = state + int64_t(gt) * kBytes + (n * kThreads + tid) * 16;
    } else {
      const int row = rg + 32 * n;
      x[n] = buf[row * kW + chunk];
      dst[n] = const_cast<char*>(tile_base) + int64_t(row) * row_bytes + chunk * 16;
    }
  }
  __syncthreads();
  __syncthreads();
#pragma unroll
  for (int n = 0; n < 4; ++n) *reinterpret_cast<uint4*>(dst[n]) = x[n];
#endif
}

template <int kThreads>
void skeleton3_run(Bed& bed, bool contiguous, double copy) {
  const int row_bytes = bed.s.d * int(gdn::dtype_size(bed.s.state));
  const int blocks = int(bed.state_bytes / (kThreads * 64));
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    skeleton3_kernel<kThreads><<<blocks, kThreads, 0, bed.stream>>>(static_cast<char*>(cur.state), row_bytes,
                                                                     contiguous);
  });
  const double us = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  std::printf("%-6s %4lld %-5s %-5s threads %3d blocks %6d %9.2f %9.2f %7.3f\n", gdn::to_string(bed.s.state),
              (long long)bed.s.B, contiguous ? "runs" : "tiles", "bulk", kThreads, blocks, us, copy, us / copy);
}

void sweep_skeleton3() {
  int major = 0;
  GDN_BENCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) {
    std::printf("tune_cuda skeleton3: the bulk-copy unit needs sm_90\n");
    return;
  }
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (int64_t B : {1, 8, 32, 128, 512}) {
      Bed bed(Shape{B, 16, 32, 128, t, Layout::kKV, false});
      const double copy = bed.copy_floor_us();
      for (bool runs : {false, true}) {
        skeleton3_run<256>(bed, runs, copy);
        skeleton2_run<256, false>(bed, runs, copy);
      }
      skeleton3_run<128>(bed, true, copy);
    }
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
        gdn::cuda::Launch l = gdn::cuda::plan_launch<T, Layout::kVK, 128, kP>(p, sms, g_l2_bytes, 4);
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
        gdn::cuda::Launch l = gdn::cuda::plan_launch<T, Layout::kVK, 128, kP>(p, sms, g_l2_bytes, 2);
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

// "hints": the step with the L2 policies on the state's traffic off, on
// (the tile's set, step_l2_hints) and as the planner picks them, the
// planner's geometry otherwise; three alternations (bench/RESULTS.md round 20).
template <typename T, Layout L>
void hints_row(int sms, const Shape& sh, int rep) {
  constexpr int kP = gdn::cuda::default_tile_param<T, L>();
  Bed bed(sh);
  const double copy = bed.copy_floor_us();
  for (const char* mode : {"off", "on", "planner"}) {
    const int n = bed.calls();
    cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
      const gdn::DecodeParams p = bed.params(cur);
      gdn::cuda::Launch l =
          gdn::cuda::plan_launch<T, L, 128, kP>(p, sms, g_l2_bytes, gdn::cuda::default_items_per_warp<T, L>());
      const std::string m = mode;
      if (m != "planner") l.l2_hints = m == "on" ? 1 : 0;
      GDN_BENCH_CHECK((gdn::cuda::launch_decode<T, L, 128, kP>(p, l, bed.stream)));
    });
    const double us = bed.time_graph(g, n);
    cudaGraphExecDestroy(g);
    std::printf("HINTS %d %-4s %s B=%-4lld pool=%d %-8s %9.3f %9.3f %7.3f\n", rep, sizeof(T) == 4 ? "fp32" : "bf16",
                gdn::to_string(L), (long long)sh.B, int(sh.indexed), mode, us, copy, us / copy);
  }
}
void sweep_hints(int sms) {
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t B : {1, 8, 16, 32, 64, 128, 512})
      for (bool pool : {false, true}) {
        if (pool && !(B == 1 || B == 8 || B == 32 || B == 128)) continue;
        hints_row<float, Layout::kKV>(sms, Shape{B, 16, 32, 128, gdn::DType::kF32, Layout::kKV, pool}, rep);
        hints_row<float, Layout::kVK>(sms, Shape{B, 16, 32, 128, gdn::DType::kF32, Layout::kVK, pool}, rep);
        hints_row<__nv_bfloat16, Layout::kKV>(sms, Shape{B, 16, 32, 128, gdn::DType::kBF16, Layout::kKV, pool}, rep);
        hints_row<__nv_bfloat16, Layout::kVK>(sms, Shape{B, 16, 32, 128, gdn::DType::kBF16, Layout::kVK, pool}, rep);
      }
}

// "width": what a thread's share of the state costs at small B. The same
// state bytes (1 MiB at B = 1) as a bf16 head of 128 x 128 (32 values a
// thread in kv's 4-warp tile and vk's item) and as an fp32 head of 128 x 64
// (16 values a thread, the same number of blocks and warps), beside the
// fp32 128 x 128 rows (2 MiB), each by the planner, three alternations.
template <typename T, Layout L>
void width_row(int sms, int64_t B, int dv, int rep) {
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  Bed bed(Shape{B, 16, 32, 128, t, L, false});
  const double copy = bed.copy_floor_us();
  const int n = bed.calls();
  const int64_t cdim = 2 * int64_t(16) * 128 + int64_t(32) * dv;
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    gdn::DecodeParams p = bed.params(cur);
    p.head_dim_v = dv;
    gdn::set_dense_strides(p);
    gdn::set_packed_qkv(p, cur.qkv, cdim);
    GDN_BENCH_CHECK((run_variant<T, L, gdn::cuda::default_tile_param<T, L>()>(
        p, sms, gdn::cuda::default_items_per_warp<T, L>(), bed.stream)));
  });
  const double us = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  std::printf("WIDTH %d %-4s %s B=%-3lld Dv=%-3d %9.3f copy(Dv=128) %9.3f\n", rep, sizeof(T) == 4 ? "fp32" : "bf16",
              gdn::to_string(L), (long long)B, dv, us, copy);
}
void sweep_width(int sms) {
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t B : {1, 8}) {
      width_row<__nv_bfloat16, Layout::kKV>(sms, B, 128, rep);
      width_row<float, Layout::kKV>(sms, B, 64, rep);
      width_row<float, Layout::kKV>(sms, B, 128, rep);
      width_row<__nv_bfloat16, Layout::kVK>(sms, B, 128, rep);
      width_row<float, Layout::kVK>(sms, B, 64, rep);
      width_row<float, Layout::kVK>(sms, B, 128, rep);
    }
}

// "lean": the least a vk step can do after its state lands, as a whole
// (correct) kernel for the tuned shape (Dk = Dv = 128, bf16 inputs, raw
// gates, default l2norm, dense slots), to bound the B = 1 target from below
// (RESULTS round 33). No shared memory, no barrier, no ring: each lane
// loads its 16-byte vectors of R state rows straight into registers right
// behind q, k, v and the gates, normalizes q and k while they are in
// flight, and after they land does only what the operation needs: the two
// sums of a row (one butterfly over the row's lanes), delta, S' (stored in
// place) and o. kMath false: the same loads and stores with no arithmetic
// between them (the grid's traffic alone; only with kEF, whose asm store
// the compiler keeps: a plain store of the value just loaded from the same
// address it drops, load and all). kEF: S' stored evict-first (the
// library's vk policy at small B). Two of the library kernel's habits, to
// see which costs: kAsync, the state through shared memory by cp.async
// (the library's ring) instead of straight into registers; kTwice, each
// 16-bit value widened where it is used (for the sums, then for S') instead
// of once into registers kept for both.
// 16-byte vectors of the state a lane of the lean kernel holds: R rows, each
// Dk = 128 values over 128 / (16 / sizeof(T)) lanes.
template <typename T, int R>
constexpr int lean_vectors() {
  return R / (32 / (128 / (16 / int(sizeof(T)))));
}
// kLib: the library's sums in the library's order (l2_normalize, then
// OnePass's reduce-scatter of both sums of the held rows), its norm mode
// and eps, and the launch's scale: its results are the library's bit for
// bit (LEANCHECK), so the timing says what the library's order costs
// in the lean form.
struct LeanNorm {
  gdn::L2Norm l2norm;
  float l2norm_eps;
};
// kX (the library kernel's habits, one bit each): 1 griddepcontrol.wait
// before the small loads (wait_upstream), 2 a __syncwarp between them and
// the state's (issue_order_fence).
template <typename T, int R, bool kMath, bool kEF, bool kAsync = false, bool kTwice = false, bool kLib = false,
          int kX = 0>
__global__ void lean_vk_kernel(const __nv_bfloat16* qkv, int64_t cdim, const __nv_bfloat16* a_in,
                               const __nv_bfloat16* b_in, const float* A_log, const float* dt_bias, T* state,
                               __nv_bfloat16* o, int hk_n, int hv_n, LeanNorm nrm, float lib_scale) {
  static_assert(kMath || kEF, "the traffic alone needs the store the compiler keeps");
  constexpr int kD = 128;
  constexpr int kVec = 16 / int(sizeof(T));  // state values a lane holds of a row
  constexpr int kL = kD / kVec;              // lanes a row: 32 fp32, 16 bf16
  constexpr int kRw = 32 / kL;               // rows a warp instruction covers
  constexpr int kN = lean_vectors<T, R>();   // vectors a lane holds (R / kRw)
  const int lane = int(threadIdx.x) & 31;
  const int64_t gw = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t bh = gw / (kD / R);  // b * Hv + h
  const int r0 = int(gw % (kD / R)) * R + lane / kL;
  const int64_t b = bh / hv_n;
  const int h = int(bh % hv_n);
  const int hk = h / (hv_n / hk_n);
  const int kb = (lane % kL) * kVec;
  T* s = state + bh * kD * kD + int64_t(r0) * kD + kb;
  // small loads first, as raw words
  if constexpr ((kX & 1) != 0) gdn::cuda::wait_upstream();
  const __nv_bfloat16* row = qkv + b * cdim;
  struct alignas(2 * kVec) Run {
    __nv_bfloat16 x[kVec];
  };
  Run qr{}, kr{};
  __nv_bfloat16 vr[kN];
  if (kMath) {
    qr = *reinterpret_cast<const Run*>(row + hk * kD + kb);
    kr = *reinterpret_cast<const Run*>(row + int64_t(hk_n) * kD + hk * kD + kb);
    if constexpr (kLib)  // only the lane's output column (OnePass)
      vr[0] = row[2 * int64_t(hk_n) * kD + int64_t(h) * kD + (r0 - lane / kL) +
                  gdn::cuda::OnePass<1, kL, kN>::col(lane) * kRw + lane / kL];
    else
#pragma unroll
      for (int n = 0; n < kN; ++n) vr[n] = row[2 * int64_t(hk_n) * kD + int64_t(h) * kD + r0 + n * kRw];
  }
  const float ar = kMath ? __bfloat162float(a_in[bh]) : 0.f, br = kMath ? __bfloat162float(b_in[bh]) : 0.f;
  const float al = kMath ? A_log[h] : 0.f, dt = kMath ? dt_bias[h] : 0.f;
  if constexpr ((kX & 2) != 0) gdn::cuda::issue_order_fence();
  uint4 raw[kN];
  extern __shared__ uint4 lean_ring[];
  uint4* ring = lean_ring + (threadIdx.x / 32) * (kN * 32) + lane;
  if constexpr (kAsync) {
#pragma unroll
    for (int n = 0; n < kN; ++n) gdn::cuda::copy16_async(ring + n * 32, s + int64_t(n) * kRw * kD, true);
    gdn::cuda::async_commit();
  } else {
#pragma unroll
    for (int n = 0; n < kN; ++n) raw[n] = *reinterpret_cast<const uint4*>(s + int64_t(n) * kRw * kD);
  }
  if (!kMath) {
    if constexpr (kAsync) {
      gdn::cuda::async_wait<0>();
#pragma unroll
      for (int n = 0; n < kN; ++n) raw[n] = ring[n * 32];
    }
#pragma unroll
    for (int n = 0; n < kN; ++n)
      gdn::cuda::store_state16<kEF>(reinterpret_cast<uint4*>(s + int64_t(n) * kRw * kD), raw[n]);
    return;
  }
  if constexpr (kLib) {
    static_assert(!kAsync && !kTwice, "kLib: the register form");
    float q[kVec], k[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      q[i] = __bfloat162float(qr.x[i]);
      k[i] = __bfloat162float(kr.x[i]);
    }
    const float kq = gdn::cuda::l2_normalize<1, kL>(nrm, lane, q, k);
    // g = -exp(A_log) softplus(a + dt_bias); decay = exp(g); beta = sigmoid(b)
    const float g = -expf(al) * gdn::cuda::softplus(ar + dt);
    const float decay = expf(g);
    const float beta = 1.0f / (1.0f + expf(-br));
    using Pass = gdn::cuda::OnePass<1, kL, kN>;
    // the lane's output column, as the library numbers it (vector n is row r0 + n kRw)
    const int out_n = Pass::col(lane);
    const float v_col = __bfloat162float(vr[0]);
    float delta[kN];
    const float o_val = Pass::run(
        [&](int v) {
          const float* w = (v & 1) ? q : k;
          const T* e = reinterpret_cast<const T*>(&raw[v / 2]);
          float a = 0.0f;
#pragma unroll
          for (int i = 0; i < kVec; ++i) a += gdn::cuda::Elem<T>::to_float(e[i]) * w[i];
          return a;
        },
        v_col, decay, beta, kq, lib_scale, lane, delta);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      // S' = exp(g) S + k delta
      uint4 out;
      T* e = reinterpret_cast<T*>(&out);
      const T* si = reinterpret_cast<const T*>(&raw[n]);
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        e[i] = gdn::cuda::Elem<T>::from_float(decay * gdn::cuda::Elem<T>::to_float(si[i]) + k[i] * delta[n]);
      gdn::cuda::store_state16<kEF>(reinterpret_cast<uint4*>(s + int64_t(n) * kRw * kD), out);
    }
    if (Pass::writer(lane)) o[bh * kD + (r0 - lane / kL) + out_n * kRw + lane / kL] = __float2bfloat16_rn(o_val);
    return;
  }
  // l2norm of q and k over the row's lanes (while the state is in flight)
  float q[kVec], k[kVec], qq = 0.f, kk = 0.f, kq = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    q[i] = __bfloat162float(qr.x[i]);
    k[i] = __bfloat162float(kr.x[i]);
    qq += q[i] * q[i];
    kk += k[i] * k[i];
    kq += k[i] * q[i];
  }
#pragma unroll
  for (int off = 1; off < kL; off *= 2) {
    qq += __shfl_xor_sync(0xffffffffu, qq, off);
    kk += __shfl_xor_sync(0xffffffffu, kk, off);
    kq += __shfl_xor_sync(0xffffffffu, kq, off);
  }
  const float rq = rsqrtf(qq + 1e-6f), rk = rsqrtf(kk + 1e-6f);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    q[i] *= rq;
    k[i] *= rk;
  }
  kq *= rq * rk;
  // g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b)
  const float eg = expf(-expf(al) * gdn::cuda::softplus(ar + dt));
  const float beta = 1.f / (1.f + expf(-br));
  const float scale = rsqrtf(float(kD));
  float sk[kN], sq[kN], sv[kN][kVec];
  if constexpr (kAsync) {
    gdn::cuda::async_wait<0>();
#pragma unroll
    for (int n = 0; n < kN; ++n) raw[n] = ring[n * 32];
  }
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const T* e = reinterpret_cast<const T*>(&raw[n]);
    sk[n] = 0.f;
    sq[n] = 0.f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      sv[n][i] = gdn::cuda::Elem<T>::to_float(e[i]);
      sk[n] += sv[n][i] * k[i];
      sq[n] += sv[n][i] * q[i];
    }
  }
#pragma unroll
  for (int off = 1; off < kL; off *= 2)
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      sk[n] += __shfl_xor_sync(0xffffffffu, sk[n], off);
      sq[n] += __shfl_xor_sync(0xffffffffu, sq[n], off);
    }
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    // delta = beta (v - exp(g) S^T k);  S' = exp(g) S + k delta
    const float delta = beta * (__bfloat162float(vr[n]) - eg * sk[n]);
    uint4 out;
    T* e = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float si = kTwice ? gdn::cuda::Elem<T>::to_float(reinterpret_cast<const T*>(&raw[n])[i]) : sv[n][i];
      e[i] = gdn::cuda::Elem<T>::from_float(eg * si + k[i] * delta);
    }
    gdn::cuda::store_state16<kEF>(reinterpret_cast<uint4*>(s + int64_t(n) * kRw * kD), out);
    // o = scale (exp(g) S^T q + (k.q) delta)
    if (lane % kL == 0) o[bh * kD + r0 + n * kRw] = __float2bfloat16_rn(scale * (eg * sq[n] + kq * delta));
  }
}

// The norm convention and scale of the bed's calls, as the library reads them.
LeanNorm lean_norm(const Bed& bed) {
  const gdn::DecodeParams p = bed.params(bed.sets[0]);
  return LeanNorm{p.l2norm, p.l2norm_eps};
}
float lean_scale(const Bed& bed) { return gdn::effective_scale(bed.params(bed.sets[0])); }

template <typename T, int R, bool kMath, bool kEF = false, bool kAsync = false, bool kTwice = false, bool kLib = false,
          int kX = 0>
double lean_time(Bed& bed, int warps) {
  const int64_t rows = bed.s.B * bed.s.hv * 128;
  const int threads = 32 * warps;
  const unsigned blocks = unsigned(rows / R / warps);
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    // (kAsync) the ring: a lane's vectors
    const size_t smem = kAsync ? size_t(threads) * lean_vectors<T, R>() * 16 : 0;
    lean_vk_kernel<T, R, kMath, kEF, kAsync, kTwice, kLib, kX><<<blocks, threads, smem, bed.stream>>>(
        static_cast<const __nv_bfloat16*>(cur.qkv), bed.conv_dim, static_cast<const __nv_bfloat16*>(cur.a),
        static_cast<const __nv_bfloat16*>(cur.b), bed.A_log, bed.dt_bias, static_cast<T*>(cur.state),
        static_cast<__nv_bfloat16*>(cur.o), bed.s.hk, bed.s.hv, lean_norm(bed), lean_scale(bed));
  });
  const double us = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  return us;
}

// The lean kernel's results against the library's on the bed's first set
// (both from the same initial state): the largest differences of o and S'.
template <typename T, int R, bool kLib = false>
void lean_check(Bed& bed, int sms) {
  const Set& st = bed.sets[0];
  const size_t sb = bed.state_bytes, ob = size_t(bed.s.B) * bed.s.hv * 128 * 2;
  void *s_lib, *s_lean, *o_lib, *o_lean;
  GDN_BENCH_CHECK(cudaMalloc(&s_lib, sb));
  GDN_BENCH_CHECK(cudaMalloc(&s_lean, sb));
  GDN_BENCH_CHECK(cudaMalloc(&o_lib, ob));
  GDN_BENCH_CHECK(cudaMalloc(&o_lean, ob));
  GDN_BENCH_CHECK(cudaMemcpy(s_lib, st.state, sb, cudaMemcpyDeviceToDevice));
  GDN_BENCH_CHECK(cudaMemcpy(s_lean, st.state, sb, cudaMemcpyDeviceToDevice));
  Set mine = st;
  mine.state = s_lib;
  mine.o = o_lib;
  GDN_BENCH_CHECK((run_variant<T, Layout::kVK, gdn::cuda::default_tile_param<T, Layout::kVK>()>(
      bed.params(mine), sms, gdn::cuda::default_items_per_warp<T, Layout::kVK>(), bed.stream)));
  lean_vk_kernel<T, R, true, false, false, false, kLib>
      <<<unsigned(bed.s.B * bed.s.hv * 128 / R / 4), 128, 0, bed.stream>>>(
          static_cast<const __nv_bfloat16*>(st.qkv), bed.conv_dim, static_cast<const __nv_bfloat16*>(st.a),
          static_cast<const __nv_bfloat16*>(st.b), bed.A_log, bed.dt_bias, static_cast<T*>(s_lean),
          static_cast<__nv_bfloat16*>(o_lean), bed.s.hk, bed.s.hv, lean_norm(bed), lean_scale(bed));
  GDN_BENCH_CHECK(cudaGetLastError());
  GDN_BENCH_CHECK(cudaStreamSynchronize(bed.stream));
  std::vector<T> h1(sb / sizeof(T)), h2(sb / sizeof(T));
  std::vector<uint16_t> o1(ob / 2), o2(ob / 2);
  GDN_BENCH_CHECK(cudaMemcpy(h1.data(), s_lib, sb, cudaMemcpyDeviceToHost));
  GDN_BENCH_CHECK(cudaMemcpy(h2.data(), s_lean, sb, cudaMemcpyDeviceToHost));
  GDN_BENCH_CHECK(cudaMemcpy(o1.data(), o_lib, ob, cudaMemcpyDeviceToHost));
  GDN_BENCH_CHECK(cudaMemcpy(o2.data(), o_lean, ob, cudaMemcpyDeviceToHost));
  auto f = [](const T& x) {
    if constexpr (sizeof(T) == 4) return float(x);
    else return gdn::bf16_to_float(reinterpret_cast<const uint16_t&>(x));
  };
  double ds = 0, dO = 0, mo = 0;
  for (size_t i = 0; i < h1.size(); ++i) ds = std::max(ds, double(std::fabs(f(h1[i]) - f(h2[i]))));
  for (size_t i = 0; i < o1.size(); ++i) {
    dO = std::max(dO, double(std::fabs(gdn::bf16_to_float(o1[i]) - gdn::bf16_to_float(o2[i]))));
    mo = std::max(mo, double(std::fabs(gdn::bf16_to_float(o1[i]))));
  }
  // (kLib: the bits themselves, which must all match)
  size_t bits = 0;
  bits += size_t(std::memcmp(h1.data(), h2.data(), sb) != 0) + size_t(std::memcmp(o1.data(), o2.data(), ob) != 0);
  std::printf("LEANCHECK %-4s B=%-3lld R=%-2d %s max|dS'| %.3g max|do| %.3g (max|o| %.3g) bitwise %s\n",
              sizeof(T) == 4 ? "fp32" : "bf16", (long long)bed.s.B, R, kLib ? "lib " : "lean", ds, dO, mo,
              bits == 0 ? "equal" : "DIFFERENT");
  cudaFree(s_lib);
  cudaFree(s_lean);
  cudaFree(o_lib);
  cudaFree(o_lean);
}

template <typename T>
void lean_rows(int sms, int64_t B, int rep, bool r33) {
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  Bed bed(Shape{B, 16, 32, 128, t, Layout::kVK, false});
  // the library's item: 4 columns of fp32, 8 of 16-bit states
  constexpr int kR = sizeof(T) == 4 ? 4 : 8;
  if (rep == 0) {
    lean_check<T, kR>(bed, sms);
    lean_check<T, kR, true>(bed, sms);
  }
  const double copy = bed.copy_floor_us();
  const int n = bed.calls();
  cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
    GDN_BENCH_CHECK((run_variant<T, Layout::kVK, gdn::cuda::default_tile_param<T, Layout::kVK>()>(
        bed.params(cur), sms, gdn::cuda::default_items_per_warp<T, Layout::kVK>(), bed.stream)));
  });
  const double lib = bed.time_graph(g, n);
  cudaGraphExecDestroy(g);
  const char* tn = sizeof(T) == 4 ? "fp32" : "bf16";
  std::printf("LEAN %d %-4s B=%-3lld library vk      %9.3f copy %9.3f ratio %6.3f\n", rep, tn, (long long)B, lib, copy,
              lib / copy);
  auto row = [&](const char* form, int r, int w, double us) {
    std::printf("LEAN %d %-4s B=%-3lld %-6s R=%-2d W=%d %9.3f copy %9.3f ratio %6.3f\n", rep, tn, (long long)B, form, r,
                w, us, copy, us / copy);
  };
  // `lean r33`: round 33's forms (R 2-16, the state through shared memory,
  // 16-bit values widened twice, the traffic alone); else round 34's: the
  // library's order at the library's item, with the library's habits (kX)
  for (int w : {2, 4, 8}) {
    if (r33) {
      row("math", 2, w, lean_time<T, 2, true>(bed, w));
      row("math", 4, w, lean_time<T, 4, true>(bed, w));
      row("math", 8, w, lean_time<T, 8, true>(bed, w));
      row("math", 16, w, lean_time<T, 16, true>(bed, w));
      row("mathEF", 4, w, lean_time<T, 4, true, true>(bed, w));
      row("mathEF", 8, w, lean_time<T, 8, true, true>(bed, w));
      row("copyEF", 4, w, lean_time<T, 4, false, true>(bed, w));
      row("asyncEF", 4, w, lean_time<T, 4, true, true, true>(bed, w));
      row("asyncEF", 8, w, lean_time<T, 8, true, true, true>(bed, w));
      row("twiceEF", 4, w, lean_time<T, 4, true, true, false, true>(bed, w));
      row("twiceEF", 8, w, lean_time<T, 8, true, true, false, true>(bed, w));
      continue;
    }
    row("libEF", kR, w, lean_time<T, kR, true, true, false, false, true>(bed, w));
    row("libEFw", kR, w, lean_time<T, kR, true, true, false, false, true, 1>(bed, w));
    row("libEFf", kR, w, lean_time<T, kR, true, true, false, false, true, 2>(bed, w));
    row("libEFwf", kR, w, lean_time<T, kR, true, true, false, false, true, 3>(bed, w));
  }
}

void sweep_lean(int sms, bool r33) {
  for (int rep = 0; rep < 2; ++rep)
    for (int64_t B : {1, 8}) {
      lean_rows<float>(sms, B, rep, r33);
      lean_rows<__nv_bfloat16>(sms, B, rep, r33);
    }
}

// "occupancy": the step (the planner's launch) with its dynamic shared
// memory padded so that at most k blocks fit an SM (k = 0: as shipped),
// against the same call's copy floor; B = 32 and 128 (RESULTS round 22: an
// in-place copy ran faster with fewer bytes in flight an SM). Two
// alternations. With OCC_KV set: kv with m tiles a block; with OCC_VK: vk
// with ipw items a warp, B = 8-512.
template <typename T, Layout L>
void occupancy_row(int sms, int per_sm, int64_t B, int rep) {
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  Bed bed(Shape{B, 16, 32, 128, t, L, false});
  const double copy = bed.copy_floor_us();
  for (int k : {0, 3, 2, 1}) {
    gdn::cuda::g_tune_min_smem = k == 0 ? 0 : size_t(per_sm) / size_t(k + 1) + 1;
    const int n = bed.calls();
    cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
      GDN_BENCH_CHECK((run_variant<T, L, gdn::cuda::default_tile_param<T, L>()>(
          bed.params(cur), sms, gdn::cuda::default_items_per_warp<T, L>(), bed.stream)));
    });
    const double us = bed.time_graph(g, n);
    cudaGraphExecDestroy(g);
    std::printf("OCC %d %-6s %-3s %4lld cap %d %9.2f copy %9.2f %7.3f\n", rep, gdn::to_string(t), gdn::to_string(L),
                (long long)B, k, us, copy, us / copy);
  }
  gdn::cuda::g_tune_min_smem = 0;
}

// One call of the step with launch g, timed by the protocol (µs).
template <typename T, Layout L>
double time_launch(Bed& bed, const gdn::cuda::Launch& g) {
  const int n = bed.calls();
  cudaGraphExec_t ge = bed.capture(n, [&](const Set& cur, const Set&) {
    GDN_BENCH_CHECK((gdn::cuda::launch_decode<T, L, 128, gdn::cuda::default_tile_param<T, L>()>(bed.params(cur), g,
                                                                                                bed.stream)));
  });
  const double us = bed.time_graph(ge, n);
  cudaGraphExecDestroy(ge);
  return us;
}

// The kv step with m tiles a block (the planner's launch otherwise) at
// most k blocks an SM.
template <typename T>
void occupancy_kv_row(int sms, int per_sm, int64_t B, int rep) {
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  Bed bed(Shape{B, 16, 32, 128, t, Layout::kKV, false});
  const double copy = bed.copy_floor_us();
  constexpr int kP = gdn::cuda::default_tile_param<T, Layout::kKV>();
  for (int k : {0, 3, 2})
    for (int m : {1, 2, 4}) {
      const gdn::DecodeParams p0 = bed.params(bed.sets[0]);
      gdn::cuda::Launch g = gdn::cuda::plan_launch<T, Layout::kKV, 128, kP>(p0, sms, g_l2_bytes, 4);
      if (m > g.items_per_head) continue;
      g.items_per_warp = m;
      g.blocks_per_head = (g.items_per_head + m - 1) / m;
      g.small_loads_first = false;
      gdn::cuda::g_tune_min_smem = k == 0 ? 0 : size_t(per_sm) / size_t(k + 1) + 1;
      const double us = time_launch<T, Layout::kKV>(bed, g);
      std::printf("OKV %d %-6s kv  %4lld cap %d tiles %d %9.2f copy %9.2f %7.3f\n", rep, gdn::to_string(t),
                  (long long)B, k, m, us, copy, us / copy);
    }
  gdn::cuda::g_tune_min_smem = 0;
}

// The vk step with ipw items a warp (8-warp blocks, the planner's launch
// otherwise) at most k blocks an SM. (Round 22 also ran each with a warp's
// items interleaved over the block's warps: 5f9b4f3, reverted.)
template <typename T>
void occupancy_vk_row(int sms, int per_sm, int64_t B, int rep) {
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  Bed bed(Shape{B, 16, 32, 128, t, Layout::kVK, false});
  const double copy = bed.copy_floor_us();
  constexpr int kP = gdn::cuda::default_tile_param<T, Layout::kVK>();
  for (int k : {0, 3})
    for (int m : {0, 2, 3, 4}) {
      const gdn::DecodeParams p0 = bed.params(bed.sets[0]);
      gdn::cuda::Launch g = gdn::cuda::plan_launch<T, Layout::kVK, 128, kP>(
          p0, sms, g_l2_bytes, gdn::cuda::default_items_per_warp<T, Layout::kVK>());
      if (m > 0) {
        if (m == g.items_per_warp) continue;  // the planner's (m = 0)
        const int wph = (g.items_per_head + m - 1) / m;
        int w = 1;
        while (w * 2 <= wph && w * 2 <= 8) w *= 2;
        g.items_per_warp = m;
        g.warps_per_block = w;
        g.blocks_per_head = (wph + w - 1) / w;
        g.small_loads_first = false;
      }
      gdn::cuda::g_tune_min_smem = k == 0 ? 0 : size_t(per_sm) / size_t(k + 1) + 1;
      const double us = time_launch<T, Layout::kVK>(bed, g);
      std::printf("OVK %d %-6s vk  %4lld cap %d ipw %d %9.2f copy %9.2f %7.3f\n", rep, gdn::to_string(t),
                  (long long)B, k, g.items_per_warp, us, copy, us / copy);
    }
  gdn::cuda::g_tune_min_smem = 0;
}

void sweep_occupancy(int sms) {
  int per_sm = 0;
  GDN_BENCH_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  if (std::getenv("OCC_VK") != nullptr) {
    for (int rep = 0; rep < 2; ++rep)
      for (int64_t B : {8, 32, 128, 512}) {
        occupancy_vk_row<float>(sms, per_sm, B, rep);
        occupancy_vk_row<__nv_bfloat16>(sms, per_sm, B, rep);
      }
    return;
  }
  if (std::getenv("OCC_KV") != nullptr) {
    for (int rep = 0; rep < 2; ++rep)
      for (int64_t B : {32, 128}) {
        occupancy_kv_row<float>(sms, per_sm, B, rep);
        occupancy_kv_row<__nv_bfloat16>(sms, per_sm, B, rep);
      }
    return;
  }
  for (int rep = 0; rep < 2; ++rep)
    for (int64_t B : {32, 128}) {
      occupancy_row<float, Layout::kKV>(sms, per_sm, B, rep);
      occupancy_row<float, Layout::kVK>(sms, per_sm, B, rep);
      occupancy_row<__nv_bfloat16, Layout::kKV>(sms, per_sm, B, rep);
      occupancy_row<__nv_bfloat16, Layout::kVK>(sms, per_sm, B, rep);
    }
}

// "pools": where a pool's cost comes from (B = 1 and 8; with POOLS_LARGE
// set, 32 and 128). The step through
// the benchmark's pool (2B slots, rows scattered, an index array per
// rotating set: cold), through the same pool with the identity order
// (slot b for row b: the dense call's addresses, one index load more; the
// same padding rows), and that with one index array for every call (in
// L2), beside the dense call; then the order without the spread over the
// pool (permuted or reversed in the first B slots, or the identity in the
// upper B), rows a slot apart, and runs of 8 adjacent rows permuted; three
// alternations.
template <typename T, Layout L>
void pools_row(int sms, int64_t B, int rep) {
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  auto time = [&](Bed& bed, auto&& params) {
    const int n = bed.calls();
    cudaGraphExec_t g = bed.capture(n, [&](const Set& cur, const Set&) {
      GDN_BENCH_CHECK((run_variant<T, L, gdn::cuda::default_tile_param<T, L>()>(
          params(cur), sms, gdn::cuda::default_items_per_warp<T, L>(), bed.stream)));
    });
    const double us = bed.time_graph(g, n);
    cudaGraphExecDestroy(g);
    return us;
  };
  Bed dense(Shape{B, 16, 32, 128, t, L, false});
  const double copy = dense.copy_floor_us();
  const double us_dense = time(dense, [&](const Set& cur) { return dense.params(cur); });
  Bed pool(Shape{B, 16, 32, 128, t, L, true});
  const double us_scattered = time(pool, [&](const Set& cur) { return pool.params(cur); });
  // One index array per rotating set (cold) or one for every call, slot
  // slot_of(b) for row b, the benchmark pool's padding rows kept (one in
  // 16 from B = 16).
  auto time_order = [&](auto&& slot_of, bool shared) {
    std::vector<int32_t> order;
    for (int32_t b = 0; b < int32_t(B); ++b) order.push_back(b % 16 == 15 ? -1 : int32_t(slot_of(b)));
    std::vector<int32_t*> idx(pool.sets.size());
    for (int32_t*& d : idx) {
      GDN_BENCH_CHECK(cudaMalloc(&d, order.size() * 4));
      GDN_BENCH_CHECK(cudaMemcpy(d, order.data(), order.size() * 4, cudaMemcpyHostToDevice));
    }
    const double us = time(pool, [&](const Set& cur) {
      gdn::DecodeParams p = pool.params(cur);
      p.state_indices = idx[shared ? 0 : size_t(&cur - pool.sets.data())];
      return p;
    });
    for (int32_t* d : idx) cudaFree(d);
    return us;
  };
  const double us_ident = time_order([](int32_t b) { return b; }, false);
  const double us_ident_shared = time_order([](int32_t b) { return b; }, true);
  // The order without the spread: the benchmark's permutation of the first
  // B slots (7919 b mod B: 7919 is prime), the rows reversed, and the
  // identity order in the pool's upper half.
  const double us_perm = time_order([&](int32_t b) { return int32_t((int64_t(b) * 7919) % B); }, false);
  const double us_rev = time_order([&](int32_t b) { return int32_t(B - 1 - b); }, false);
  const double us_upper = time_order([&](int32_t b) { return int32_t(B + b); }, false);
  // Rows a slot apart (slot 2b: every other slot, in order), and runs of 8
  // adjacent rows whose runs are permuted (run r of the B / 8 at run 7919 r
  // mod (B / 8)).
  const double us_stride2 = time_order([](int32_t b) { return 2 * b; }, false);
  const int64_t runs = B >= 8 ? B / 8 : 1;
  const double us_runs8 = time_order(
      [&](int32_t b) { return B >= 8 ? int32_t(((int64_t(b / 8) * 7919) % runs) * 8 + b % 8) : b; }, false);
  std::printf("POOLS %d %-4s %s B=%-3lld dense %8.3f scattered %8.3f identity %8.3f identity-one-array %8.3f copy %8.3f"
              " permuted %8.3f reversed %8.3f upper %8.3f stride2 %8.3f runs8 %8.3f\n",
              rep, sizeof(T) == 4 ? "fp32" : "bf16", gdn::to_string(L), (long long)B, us_dense, us_scattered, us_ident,
              us_ident_shared, copy, us_perm, us_rev, us_upper, us_stride2, us_runs8);
}
void sweep_pools(int sms) {
  const bool large = std::getenv("POOLS_LARGE") != nullptr;  // B = 32 and 128 instead of 1 and 8
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t B : {large ? 32 : 1, large ? 128 : 8}) {
      pools_row<float, Layout::kKV>(sms, B, rep);
      pools_row<float, Layout::kVK>(sms, B, rep);
      pools_row<__nv_bfloat16, Layout::kKV>(sms, B, rep);
      pools_row<__nv_bfloat16, Layout::kVK>(sms, B, rep);
    }
}

// "launch": what a launch costs by its grid alone (bench/RESULTS.md round
// 24): kernels that do nothing (thread 0 of block 0 reads one parameter),
// in graphs of 64 calls, median of 15 replays: by block count and size, by
// parameter bytes, and clustered (128 blocks of 256 threads, 40 KiB of
// shared memory, with and without one cluster barrier).
template <int kPad>
struct ParamPad {
  long long v[kPad];
};
template <int kPad>
__global__ void launch_empty_kernel(int* out, ParamPad<kPad> pad) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && pad.v[kPad - 1] == 12345) *out = 1;
}
template <bool kBarrier>
__global__ void launch_cluster_kernel(int* out, int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kBarrier) {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  }
#endif
  if (threadIdx.x == 0 && blockIdx.x == 0 && v == 12345) *out = v;
}
template <typename Enqueue>
double launch_us(cudaStream_t s, Enqueue&& enqueue) {
  constexpr int kCalls = 64;
  cudaGraph_t graph;
  GDN_BENCH_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int c = 0; c < kCalls; ++c) enqueue();
  GDN_BENCH_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  GDN_BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  GDN_BENCH_CHECK(cudaGraphDestroy(graph));
  const double us = graph_us(s, exec, kCalls);
  cudaGraphExecDestroy(exec);
  return us;
}
void sweep_launch() {
  cudaStream_t s;
  GDN_BENCH_CHECK(cudaStreamCreate(&s));
  int* out = nullptr;
  GDN_BENCH_CHECK(cudaMalloc(&out, sizeof(int)));
  for (int rep = 0; rep < 2; ++rep) {
    for (int threads : {32, 128})
      for (int blocks : {16, 64, 128, 256, 512, 1024, 2048}) {
        const ParamPad<1> pad{};
        const double us = launch_us(s, [&] { launch_empty_kernel<1><<<blocks, threads, 0, s>>>(out, pad); });
        std::printf("LAUNCH %d empty blocks %5d x %4d threads, params %4d B: %7.3f us\n", rep, blocks, threads,
                    int(sizeof(int*) + sizeof(pad)), us);
      }
    {
      const ParamPad<128> pad{};
      const double us = launch_us(s, [&] { launch_empty_kernel<128><<<1024, 32, 0, s>>>(out, pad); });
      std::printf("LAUNCH %d empty blocks %5d x %4d threads, params %4d B: %7.3f us\n", rep, 1024, 32,
                  int(sizeof(int*) + sizeof(pad)), us);
    }
    int major = 0;
    GDN_BENCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) continue;
    for (bool barrier : {false, true})
      for (int cluster : {0, 2, 4, 8}) {
        auto kernel = barrier ? launch_cluster_kernel<true> : launch_cluster_kernel<false>;
        if (barrier && cluster == 0) continue;
        const int smem = 40 * 1024;
        GDN_BENCH_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        const double us = launch_us(s, [&] {
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(128);
          cfg.blockDim = dim3(256);
          cfg.dynamicSmemBytes = smem;
          cfg.stream = s;
          cudaLaunchAttribute at{};
          at.id = cudaLaunchAttributeClusterDimension;
          at.val.clusterDim.x = unsigned(cluster);
          at.val.clusterDim.y = 1;
          at.val.clusterDim.z = 1;
          cfg.attrs = &at;
          cfg.numAttrs = cluster > 0 ? 1 : 0;
          GDN_BENCH_CHECK(cudaLaunchKernelEx(&cfg, kernel, out, 0));
        });
        std::printf("LAUNCH %d %-7s blocks %5d x %4d threads, cluster %d, 40 KiB shared: %7.3f us\n", rep,
                    barrier ? "barrier" : "empty", 128, 256, cluster, us);
      }
  }
  cudaFree(out);
  cudaStreamDestroy(s);
}

// "wave": the library's vk step on calls in one wave, dense and through a
// pool, by decode_vk_wave_kernel (as planned) against the ring kernel
// (plan_launch's allow_wave off), same process, same sets, alternating (RESULTS
// round 35).
// First, on the bed's first set, both from the same initial state: whether
// the plan takes the one-wave kernel, and whether the two agree bit for bit.
template <typename T>
cudaError_t run_library(const gdn::DecodeParams& p, int sms, bool wave, cudaStream_t s) {
  constexpr int kP = gdn::cuda::default_tile_param<T, Layout::kVK>();
  const gdn::cuda::Launch g = gdn::cuda::plan_launch<T, Layout::kVK, 128, kP>(
      p, sms, g_l2_bytes, gdn::cuda::default_items_per_warp<T, Layout::kVK>(), wave);
  return gdn::cuda::launch_decode<T, Layout::kVK, 128, kP>(p, g, s);
}

template <typename T>
void wave_rows(int sms, int64_t B, int hk, int hv, bool indexed, int rep) {
  const gdn::DType t = sizeof(T) == 4 ? gdn::DType::kF32 : gdn::DType::kBF16;
  Bed bed(Shape{B, hk, hv, 128, t, Layout::kVK, indexed});
  const char* tn = sizeof(T) == 4 ? "fp32" : "bf16";
  constexpr int kP = gdn::cuda::default_tile_param<T, Layout::kVK>();
  const bool planned = gdn::cuda::plan_launch<T, Layout::kVK, 128, kP>(
                           bed.params(bed.sets[0]), sms, g_l2_bytes,
                           gdn::cuda::default_items_per_warp<T, Layout::kVK>())
                           .wave;
  if (rep == 0) {
    const Set& st = bed.sets[0];
    const size_t sb = bed.pool_bytes, ob = size_t(B) * hv * 128 * 2;
    std::vector<uint8_t> hs[2], ho[2];
    for (int d = 0; d < 2; ++d) {
      void *s_dev, *o_dev;
      GDN_BENCH_CHECK(cudaMalloc(&s_dev, sb));
      GDN_BENCH_CHECK(cudaMalloc(&o_dev, ob));
      GDN_BENCH_CHECK(cudaMemcpy(s_dev, st.state, sb, cudaMemcpyDeviceToDevice));
      Set mine = st;
      mine.state = s_dev;
      mine.o = o_dev;
      GDN_BENCH_CHECK(run_library<T>(bed.params(mine), sms, d == 1, bed.stream));
      GDN_BENCH_CHECK(cudaStreamSynchronize(bed.stream));
      hs[d].resize(sb);
      ho[d].resize(ob);
      GDN_BENCH_CHECK(cudaMemcpy(hs[d].data(), s_dev, sb, cudaMemcpyDeviceToHost));
      GDN_BENCH_CHECK(cudaMemcpy(ho[d].data(), o_dev, ob, cudaMemcpyDeviceToHost));
      cudaFree(s_dev);
      cudaFree(o_dev);
    }
    std::printf("WAVECHECK %s B=%-3lld Hk=%-2d Hv=%-2d%s plan %s: state %s, output %s\n", tn, (long long)B, hk, hv,
                indexed ? " pool" : "     ", planned ? "wave" : "ring", hs[0] == hs[1] ? "bitwise equal" : "DIFFERENT",
                ho[0] == ho[1] ? "bitwise equal" : "DIFFERENT");
  }
  const double copy = bed.copy_floor_us();
  auto time = [&](bool wave) {
    const int n = bed.calls();
    cudaGraphExec_t g = bed.capture(
        n, [&](const Set& cur, const Set&) { GDN_BENCH_CHECK(run_library<T>(bed.params(cur), sms, wave, bed.stream)); });
    const double us = bed.time_graph(g, n);
    cudaGraphExecDestroy(g);
    return us;
  };
  // alternate which goes first
  double ring, wave;
  if (rep % 2 == 0) {
    ring = time(false);
    wave = time(true);
  } else {
    wave = time(true);
    ring = time(false);
  }
  std::printf("WAVE %d %s B=%-3lld Hk=%-2d Hv=%-2d%s ring %7.3f wave %7.3f (%s) copy %7.3f | ratio ring %6.3f wave "
              "%6.3f | wave/ring %6.3f\n",
              rep, tn, (long long)B, hk, hv, indexed ? " pool" : "     ", ring, wave, planned ? "planned" : "ring  ",
              copy, ring / copy, wave / copy, wave / ring);
}

void sweep_wave(int sms) {
  struct Row {
    int64_t B;
    int hk, hv;
    bool indexed;  // through the bench's pool (2B slots, scattered, one row in 16 padding)
  };
  const Row rows[] = {{1, 16, 32, false}, {8, 16, 32, false}, {1, 16, 32, true}, {8, 16, 32, true},
                      {1, 16, 48, false}, {1, 16, 64, false}, {1, 4, 8, false},   {32, 4, 8, false}};
  for (int rep = 0; rep < 3; ++rep)
    for (const Row& r : rows) {
      wave_rows<float>(sms, r.B, r.hk, r.hv, r.indexed, rep);
      wave_rows<__nv_bfloat16>(sms, r.B, r.hk, r.hv, r.indexed, rep);
    }
}

// Optional arguments: "vk" or "kv" sweeps that layout only ("blocks": the vk
// block size at small B; "ipw": vk items a warp, forced; "hints": the L2
// policies on the state's traffic off, on and as planned; "width": the
// values a thread holds at small B, at equal state bytes; "pools": what a
// pool costs by its slots' order and its index's place; "skeleton",
// "skeleton2" and "skeleton3": the kv step's memory traffic alone;
// "copies": the in-place traffic alone against the copy floor, by form;
// "launch": what a launch costs by its grid alone; "lean": the least a vk
// step can do at B = 1 and 8, as a whole kernel, against the library's;
// "wave": the library's one-wave vk kernel against its ring kernel;
// "occupancy": the step with at most k blocks an SM); a
// second one keeps the variants whose name has it. (A kv variant runs the
// planner's choice, which takes 4-warp tiles in one-round grids: "kv W=8"
// at B = 1 is 4 warps.)
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const std::string variant = argc > 2 ? argv[2] : "";  // e.g. "W=8": variants whose name contains it
  int sms = 0, l2 = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    std::printf("tune_cuda: no CUDA device\n");
    return 0;
  }
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0) == cudaSuccess) g_l2_bytes = l2;
  if (only == "blocks") {
    std::printf("%-6s %-5s %4s %-8s %4s %9s %9s %7s\n", "state", "lay", "B", "variant", "ipw", "us", "copy", "ratio");
    sweep_block_size<float>(sms);
    sweep_block_size<__nv_bfloat16>(sms);
    return 0;
  }
  if (only == "launch") {
    sweep_launch();
    return 0;
  }
  if (only == "pools") {
    sweep_pools(sms);
    return 0;
  }
  if (only == "wave") {
    sweep_wave(sms);
    return 0;
  }
  if (only == "lean") {
    sweep_lean(sms, variant == "r33");
    return 0;
  }
  if (only == "width") {
    sweep_width(sms);
    return 0;
  }
  if (only == "hints") {
    sweep_hints(sms);
    return 0;
  }
  if (only == "occupancy") {
    sweep_occupancy(sms);
    return 0;
  }
  if (only == "copies") {
    sweep_copies(sms);
    return 0;
  }
  if (only == "skeleton3") {
    sweep_skeleton3();
    return 0;
  }
  if (only == "skeleton2") {
    sweep_skeleton2();
    return 0;
  }
  if (only == "skeleton") {
    sweep_skeleton(sms);
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
