// Per-device initialization (device.h): once per device, on the first call
// there, every kernel's shared-memory limits are raised and the occupancy
// the planner needs is read into that device's DeviceInfo. After that the
// only mutable state is the programmatic launches' shared-memory cache.
#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "device.h"
#include "traits.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// The kernel tables, in a fixed order (the six instantiation units).
int visit_all_kernels(KernelVisitor visit, void* ctx) {
  struct Counter {
    KernelVisitor visit;
    void* ctx;
    int n;
  } c{visit, ctx, 0};
  auto count = [](const KernelUse& k, void* p) {
    Counter& cc = *static_cast<Counter*>(p);
    ++cc.n;
    if (cc.visit != nullptr) cc.visit(k, cc.ctx);
  };
  visit_kernels<float, Layout::kVK>(count, &c);
  visit_kernels<float, Layout::kKV>(count, &c);
  visit_kernels<bf16, Layout::kVK>(count, &c);
  visit_kernels<bf16, Layout::kKV>(count, &c);
  visit_kernels<fp16, Layout::kVK>(count, &c);
  visit_kernels<fp16, Layout::kKV>(count, &c);
  return c.n;
}

void kernel_name(const KernelUse& k, char* buf, size_t size) {
  static const char* const kFamily[] = {"vk_step", "vk_wave", "vk_fused", "kv_step", "kv_fused", "tokens"};
  static const char* const kIo[] = {"f32", "f16", "bf16", "mixed"};
  const char* state = k.state_dtype == DType::kF32 ? "f32" : k.state_dtype == DType::kF16 ? "f16" : "bf16";
  std::snprintf(buf, size, "%s<%s,dk%d,%s%d,io=%s%s%s%s%s%s>", kFamily[int(k.family)], state, k.dk_cap,
                k.layout == Layout::kKV ? "w" : "p", k.tile, kIo[int(k.io)], k.l2_hints ? ",l2" : "",
                k.norm ? ",norm" : "", k.norm_only ? ",norm_only" : "", k.pdl_twin ? ",pdl" : "",
                k.indexed ? ",indexed" : "");
}

namespace {

// Raise a kernel's limits and record its occupancy in *info. Failures here
// only cost speed (a launch reports any real error).
void init_kernel(const KernelUse& k, void* ctx) {
  gpu::DeviceInfo& info = *static_cast<gpu::DeviceInfo*>(ctx);
  if (k.smem_limit > 0)
    (void)cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(k.smem_limit));
#if !defined(GDN_AMD)
  if (k.carveout)
    (void)cudaFuncSetAttribute(k.fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                               int(cudaSharedmemCarveoutMaxShared));
#endif
  if (k.occupancy == Occupancy::kNone) return;
  // (the wave kernel has no dynamic shared memory)
  const bool wave = k.occupancy == Occupancy::kWave || k.occupancy == Occupancy::kWaveIndexed;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.fn, k.occupancy_warps * kWarp,
                                                    wave ? 0 : k.smem_limit) != cudaSuccess ||
      blocks < 1) {
    (void)cudaGetLastError();
    blocks = 1;  // (only speed: the grid then fits the wave it assumes or not)
  }
  const int16_t warps = int16_t(blocks * k.occupancy_warps);
  const int s = gpu::dtype_index(k.state_dtype), d = gpu::dk_index(k.dk_cap), io = int(k.io);
  switch (k.occupancy) {
    case Occupancy::kStep: info.step_warps[s][gpu::layout_index(k.layout)][d][0][io] = warps; break;
    case Occupancy::kStepSmallTile: info.step_warps[s][gpu::layout_index(k.layout)][d][1][io] = warps; break;
    case Occupancy::kWave: info.wave_warps[s][io][0] = warps; break;
    case Occupancy::kWaveIndexed: info.wave_warps[s][io][1] = warps; break;
    case Occupancy::kNone: break;
  }
}

// Whether the kernels can use sm_90 launch features here: the GPU is sm_90
// or newer and the code it runs was built from sm_90 PTX or newer (not the
// compute_80 JIT). One kernel stands for all: every unit is built for the
// same targets.
bool sm90_capable(int dev) {
#if defined(GDN_HIP)
  (void)dev;
  return false;
#else
  struct First {
    const void* fn{nullptr};
  } first;
  visit_kernels<float, Layout::kVK>(
      [](const KernelUse& k, void* p) {
        First& f = *static_cast<First*>(p);
        if (f.fn == nullptr) f.fn = k.fn;
      },
      &first);
  cudaFuncAttributes a{};
  int major = 0;
  const bool ok = cudaFuncGetAttributes(&a, first.fn) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess;
  (void)cudaGetLastError();
  return ok && major >= 9 && a.ptxVersion >= 90;
#endif
}

gpu::DeviceInfo init_device(int dev) {
  gpu::DeviceInfo info;
  info.config = kConfig;
  int sms = 0, l2 = 0;
  // (unread: 108 SMs and no L2 policies that depend on its size)
  info.sms = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0 ? sms : 108;
  info.l2_bytes = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess ? l2 : 0;
  int mem_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
    // double data rate: two transfers of the bus a memory clock
    info.dram_bytes_per_s = 2.0 * double(mem_khz) * 1e3 * double(bus_bits) / 8.0;
  (void)cudaGetLastError();
  info.sm90 = sm90_capable(dev);
  // The tables hold 1 where a kernel is missing (never planned for).
  for (auto& a : info.step_warps)
    for (auto& b : a)
      for (auto& c : b)
        for (auto& d : c)
          for (auto& e : d) e = 1;
  for (auto& a : info.wave_warps)
    for (auto& b : a)
      for (auto& c : b) c = 8;
  visit_all_kernels(init_kernel, &info);
  (void)cudaGetLastError();
  return info;
}

struct DeviceSlot {
  std::once_flag once;
  gpu::DeviceInfo info;
};
DeviceSlot g_devices[kMaxDevices];

// The programmatic launches' shared memory, per (device, kernel, grid, block, smem, cluster).
using SpreadKey = std::tuple<int, const void*, unsigned, unsigned, size_t, int>;
std::mutex g_spread_mu;
std::map<SpreadKey, size_t> g_spread;

size_t compute_spread(int dev, const void* kernel, unsigned grid, unsigned block, size_t smem, int cluster);

}  // namespace

const gpu::DeviceInfo* current_device_info(int* dev) {
  *dev = -1;
  if (cudaGetDevice(dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (*dev < 0 || *dev >= kMaxDevices) return nullptr;
  DeviceSlot& s = g_devices[*dev];
  const int d = *dev;
  std::call_once(s.once, [&] { s.info = init_device(d); });
  return &s.info;
}

size_t spread_smem(const void* kernel, unsigned grid, unsigned block, size_t smem, int cluster) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return (void)cudaGetLastError(), smem;
  const SpreadKey key{dev, kernel, grid, block, smem, cluster};
  {
    std::lock_guard<std::mutex> lock(g_spread_mu);
    const auto it = g_spread.find(key);
    if (it != g_spread.end()) return it->second;
  }
  const size_t out = compute_spread(dev, kernel, grid, block, smem, cluster);
  std::lock_guard<std::mutex> lock(g_spread_mu);
  g_spread.emplace(key, out);
  return out;
}

namespace {

// A grid that fits the GPU at once asks for enough shared memory that an SM
// holds no more of its blocks than the fewest that still fit every block
// (every cluster) at once: behind an upstream kernel with a small carveout,
// blocks then spread over the SMs instead of filling the first to drain.
// Other grids keep `smem`.                                 docs/decisions.md#pdl
size_t compute_spread(int dev, const void* kernel, unsigned grid, unsigned block, size_t smem, int cluster) {
  size_t out = smem;
#if !defined(GDN_HIP)
  int sms = 0, per_sm = 0, optin = 0, natural = 0;
  cudaFuncAttributes a{};
  // The dynamic limit raised to all a block may have beside its static shared memory.
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
      cudaFuncGetAttributes(&a, kernel) == cudaSuccess && size_t(optin) > a.sharedSizeBytes &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&natural, kernel, int(block), smem) == cudaSuccess &&
      sms > 0 && natural > 0 && int64_t(grid) <= int64_t(natural) * sms &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(size_t(optin) - a.sharedSizeBytes)) == cudaSuccess) {
    const size_t max_dynamic = size_t(optin) - a.sharedSizeBytes;
    for (int cap = int((grid + unsigned(sms) - 1) / unsigned(sms)); cap < natural; ++cap) {
      // (cap + 1) blocks of more than per_sm / (cap + 1) bytes do not fit an SM
      const size_t pad = std::max(smem, size_t(per_sm) / size_t(cap + 1) + 1);
      int fit = 0;
      if (pad > max_dynamic ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, int(block), pad) != cudaSuccess || fit != cap)
        continue;
      if (cluster > 1) {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(block);
        cfg.dynamicSmemBytes = pad;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = unsigned(cluster);
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess ||
            int64_t(clusters) * cluster < int64_t(grid))
          continue;
      }
      out = pad;
      break;
    }
  }
  (void)cudaGetLastError();
#else
  (void)dev, (void)kernel, (void)grid, (void)block, (void)cluster;
#endif
  return out;
}

}  // namespace

cudaError_t decode_with(const DecodeParams& p, const gpu::PlanOverrides& o, gpu::Plan* plan_out) {
  int dev = -1;
  const gpu::DeviceInfo* info = current_device_info(&dev);
  if (info == nullptr) return dev < 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice;
  const gpu::Plan plan = gpu::plan_launch(p, *info, o);
  if (plan_out != nullptr) *plan_out = plan;
  const auto launch = [](const gpu::Plan& pl, const DecodeParams& q) {
    cudaStream_t stream = static_cast<cudaStream_t>(q.stream);
    const bool vk = q.layout == Layout::kVK;
    switch (q.state_dtype) {
      case DType::kF32: return vk ? launch_plan<float, Layout::kVK>(pl, q, stream) : launch_plan<float, Layout::kKV>(pl, q, stream);
      case DType::kBF16: return vk ? launch_plan<bf16, Layout::kVK>(pl, q, stream) : launch_plan<bf16, Layout::kKV>(pl, q, stream);
      case DType::kF16: return vk ? launch_plan<fp16, Layout::kVK>(pl, q, stream) : launch_plan<fp16, Layout::kKV>(pl, q, stream);
    }
    return cudaErrorInvalidValue;
  };
  // A chained plan (docs/decisions.md#token-chain): token t's one-token call, in order on the stream.
  gpu::PlanOverrides one = o;
  one.max_items_per_warp = 0;  // (for a multi-token call: the token kernel's rounds)
  for (int t = 0; t < plan.chain; ++t) {
    const DecodeParams v = gpu::token_chain_view(p, t);
    const cudaError_t err = launch(gpu::plan_launch(v, *info, one), v);
    if (err != cudaSuccess) return err;
  }
  return plan.chain > 0 ? cudaSuccess : launch(plan, p);
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
