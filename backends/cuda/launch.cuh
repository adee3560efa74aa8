// The launcher: executes a Plan (plan.h) for one (state dtype, layout), and
// lists the kernel instantiations that executing needs. Included only by
// the explicit instantiation units (instantiate/*.cu), one per (state
// dtype, layout), which compile in parallel.
#pragma once

#include <array>
#include <type_traits>

#include "device.h"
#include "kernels/kv_fused.cuh"
#include "kernels/kv_step.cuh"
#include "kernels/token_step.cuh"
#include "kernels/vk_wave.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

using gpu::Io;
using gpu::Kernel;
using gpu::Plan;

// The small tensors' C++ type of each Io.
template <Io kIo>
using IoType = std::conditional_t<kIo == Io::kF32, float,
                                  std::conditional_t<kIo == Io::kF16, fp16,
                                                     std::conditional_t<kIo == Io::kBF16, bf16, MixedIO>>>;

// kernel<<<plan's grid>>>(args...), through cudaLaunchKernelEx where the plan
// asks for programmatic serialization or clusters.
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), const Plan& plan, cudaStream_t stream, Args... args) {
  if (plan.raise_smem_limit)
    (void)cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(plan.smem));
#if !defined(GDN_HIP)
  if (plan.programmatic || plan.cluster > 1) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(plan.grid);
    cfg.blockDim = dim3(plan.block);
    cfg.dynamicSmemBytes = plan.smem;
    if (plan.programmatic && plan.spread_smem)
      cfg.dynamicSmemBytes =
          spread_smem(reinterpret_cast<const void*>(kernel), plan.grid, plan.block, plan.smem, plan.cluster);
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (plan.programmatic) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (plan.cluster > 1) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim.x = unsigned(plan.cluster);
      attr[n].val.clusterDim.y = 1;
      attr[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
  }
#endif
  kernel<<<dim3(plan.grid), dim3(plan.block), plan.smem, stream>>>(args...);
  return cudaGetLastError();
}

// The step's divisors and scale, shared by every launch but the wave kernel's.
struct StepArgs {
  FastDiv by_bph, by_hv, by_head_map;
  float scale;
  StepArgs(const Plan& plan, const DecodeParams& p, bool fused)
      : by_bph(unsigned(plan.blocks_per_head)),
        by_hv(unsigned(fused ? p.num_k_heads : p.num_v_heads)),
        by_head_map(unsigned(p.head_map == HeadMap::kInterleaved ? p.num_v_heads / p.num_k_heads : p.num_k_heads)),
        scale(effective_scale(p)) {}
};

inline FusedArgs fused_args(const Plan& plan, int per_head) {
  FusedArgs f;
  f.cluster = FastDiv(unsigned(plan.cluster));
  f.per_head = FastDiv(unsigned(per_head));
  f.vector_runs = plan.vector_runs;
  return f;
}

// ---- the kernels of (T, Dk capacity, IO): one name per instantiation -----
template <typename T, int kDk, typename IO>
struct VkKernels {
  static constexpr int kP = default_tile_param<T, Layout::kVK>();
  static constexpr int kHints = step_l2_hints<T, Layout::kVK, kDk, kP>();
  static constexpr bool kUniform = !std::is_same<IO, MixedIO>::value;
  template <int kH, bool kNorm>
  static constexpr auto step() {
    return &decode_vk_step_kernel<T, Layout::kVK, kDk, kP, IO, kH, kNorm>;
  }
  template <bool kNormOnly, bool kPdl>
  static constexpr auto fused() {
    return &decode_vk_fused_kernel<T, Layout::kVK, kDk, kP, IO, kNormOnly, kPdl>;
  }
#if GDN_VK_WAVE
  template <bool kIndexed, bool kPdl>
  static constexpr auto wave() {
    return &decode_vk_wave_kernel<T, IO, kHints, kIndexed, kPdl>;
  }
  // Dk = Dv = 128, one dtype; through a pool for 16-bit states only.
  static constexpr bool kWave = kDk == 128 && kUniform;
  static constexpr bool kWavePool = kWave && sizeof(T) != 4;
#endif
};

template <typename T, int kDk, int kW, typename IO>
struct KvKernels {
  static constexpr int kHints = step_l2_hints<T, Layout::kKV, kDk, kW>();
  static constexpr bool kUniform = !std::is_same<IO, MixedIO>::value;
  template <int kH, bool kNorm>
  static constexpr auto step() {
    return &decode_kv_step_kernel<T, kDk, kW, IO, kH, kNorm>;
  }
  template <bool kNormOnly, bool kPdl>
  static constexpr auto fused() {
    return &decode_kv_fused_kernel<T, kDk, kW, IO, kNormOnly, kPdl>;
  }
};

// Whether this build has the cluster and programmatic twins (CUDA's sm_90
// paths; HIP has neither).
#if defined(GDN_HIP)
constexpr bool kTwins = false;
#else
constexpr bool kTwins = true;
#endif

// ---- executing a plan ---------------------------------------------------
template <typename T, int kDk, typename IO>
cudaError_t launch_vk(const Plan& plan, const DecodeParams& p, cudaStream_t stream) {
  using K = VkKernels<T, kDk, IO>;
  if (plan.kernel == Kernel::kVkWave) {
#if GDN_VK_WAVE
    if constexpr (K::kWave) {
      const WaveParams d = wave_params(p, unsigned(p.batch * p.num_v_heads * plan.items_per_head),
                                       effective_scale(p));
      if (plan.indexed) {
        if constexpr (K::kWavePool)
          return launch_kernel(plan.pdl_twin ? K::template wave<true, true>() : K::template wave<true, false>(),
                               plan, stream, d);
        return cudaErrorInvalidConfiguration;  // (the plan never asks: fp32 pools keep the ring)
      }
      return launch_kernel(plan.pdl_twin ? K::template wave<false, true>() : K::template wave<false, false>(), plan,
                           stream, d);
    }
#endif
    return cudaErrorInvalidConfiguration;  // (the plan gives it only where it exists)
  }
  const bool fused = plan.kernel == Kernel::kVkFused;
  const StepArgs a(plan, p, fused);
  const KernelParams kp = kernel_params(p);
  if (!fused) {
    auto step = K::template step<0, false>();
    if (plan.norm) {
      if constexpr (kTwins && K::kUniform)
        step = plan.l2_hints ? K::template step<K::kHints, true>() : K::template step<0, true>();
      else
        return cudaErrorNotSupported;  // (the plan never asks)
    } else if (plan.l2_hints) {
#if GDN_L2_HINTS
      step = K::template step<K::kHints, false>();
#endif
    }
    return launch_kernel(step, plan, stream, plan.items_per_head, plan.items_per_warp, a.by_bph, a.by_hv,
                         a.by_head_map, plan.small_loads_first, kp, a.scale);
  }
  auto kernel = K::template fused<false, false>();
  if constexpr (kTwins && K::kUniform) {
    if (plan.norm_only) kernel = K::template fused<true, false>();
  }
  if constexpr (kTwins && kPdlInputs<IO>) {
    if (plan.pdl_twin) kernel = K::template fused<false, true>();
  }
  return launch_kernel(kernel, plan, stream, plan.items_per_head, plan.items_per_warp, a.by_bph, a.by_hv,
                       a.by_head_map, plan.small_loads_first, kp, a.scale, plan.group_heads, plan.warps_per_head,
                       plan.cluster, fused_args(plan, plan.warps_per_head));
}

template <typename T, int kDk, int kW, typename IO>
cudaError_t launch_kv_tile(const Plan& plan, const DecodeParams& p, cudaStream_t stream) {
  using K = KvKernels<T, kDk, kW, IO>;
  const bool fused = plan.kernel == Kernel::kKvFused;
  const StepArgs a(plan, p, fused);
  if (!fused) {
    auto step = K::template step<0, false>();
    if (plan.norm) {
      if constexpr (kTwins && K::kUniform) {
        if constexpr (K::kHints != 0) {
          if (plan.l2_hints) step = K::template step<K::kHints, true>();
          else step = K::template step<0, true>();
        } else {
          step = K::template step<0, true>();
        }
      } else {
        return cudaErrorNotSupported;  // (the plan never asks)
      }
    } else if (plan.l2_hints) {
#if GDN_L2_HINTS
      if constexpr (K::kHints != 0) step = K::template step<K::kHints, false>();
#endif
    }
    return launch_kernel(step, plan, stream, plan.items_per_head, plan.items_per_warp, a.by_bph, a.by_hv,
                         a.by_head_map, plan.small_loads_first, kernel_params(p), a.scale);
  }
  // (the fused kernel has the shipped tile only)
  if constexpr (kW == default_tile_param<T, Layout::kKV>()) {
    auto kernel = K::template fused<false, false>();
    if constexpr (kTwins && K::kUniform) {
      if (plan.norm_only) kernel = K::template fused<true, false>();
    }
    if constexpr (kTwins && kPdlInputs<IO>) {
      if (plan.pdl_twin) kernel = K::template fused<false, true>();
    }
    return launch_kernel(kernel, plan, stream, p, plan.items_per_head, plan.items_per_warp, a.by_hv, a.scale,
                         plan.group_heads, plan.cluster, fused_args(plan, plan.items_per_head));
  }
  return cudaErrorInvalidConfiguration;  // (the plan never asks)
}

template <typename T, int kDk, typename IO>
cudaError_t launch_kv(const Plan& plan, const DecodeParams& p, cudaStream_t stream) {
  constexpr int kW = default_tile_param<T, Layout::kKV>();
  if constexpr (kW > kKvSmallW) {
    if (plan.tile == kKvSmallW && plan.kernel == Kernel::kKvStep)
      return launch_kv_tile<T, kDk, kKvSmallW, IO>(plan, p, stream);
  }
  return launch_kv_tile<T, kDk, kW, IO>(plan, p, stream);
}

template <typename T, Layout kLayout, int kDk, Io kIo>
cudaError_t launch_io(const Plan& plan, const DecodeParams& p, cudaStream_t stream) {
  if constexpr (kLayout == Layout::kVK)
    return launch_vk<T, kDk, IoType<kIo>>(plan, p, stream);
  else
    return launch_kv<T, kDk, IoType<kIo>>(plan, p, stream);
}

template <typename T, Layout kLayout, int kDk>
cudaError_t launch_dk(const Plan& plan, const DecodeParams& p, cudaStream_t stream) {
  switch (plan.io) {
    case Io::kF32: return launch_io<T, kLayout, kDk, Io::kF32>(plan, p, stream);
    case Io::kF16: return launch_io<T, kLayout, kDk, Io::kF16>(plan, p, stream);
    case Io::kBF16: return launch_io<T, kLayout, kDk, Io::kBF16>(plan, p, stream);
    case Io::kMixed: return launch_io<T, kLayout, kDk, Io::kMixed>(plan, p, stream);
  }
  return cudaErrorInvalidValue;
}

// ---- launching by key: the multi-token kernels ---------------------------
// A family launched this way is named once, in kernel_table.cuh: the launch
// finds the plan's entry there (cached per unit) and passes one argument
// block, so adding a variant touches the kernel, the table and the planner.
template <typename T, Layout kLayout>
const void* listed_kernel(Kernel family, int dk_cap) {
  using Table = std::array<std::array<const void*, 3>, gpu::kNumKernels>;  // [family][Dk capacity]
  static const Table table = [] {
    Table t{};
    visit_kernels<T, kLayout>(
        [](const KernelUse& k, void* ctx) {
          auto& tab = *static_cast<Table*>(ctx);
          const void*& slot = tab[size_t(k.family)][size_t(gpu::dk_index(k.dk_cap))];
          if (slot == nullptr) slot = k.fn;  // (the family's plain instantiation comes first)
        },
        &t);
    return t;
  }();
  return table[size_t(family)][size_t(gpu::dk_index(dk_cap))];
}

template <typename T, Layout kLayout>
cudaError_t launch_tokens(const Plan& plan, const DecodeParams& p, cudaStream_t stream) {
  const void* fn = listed_kernel<T, kLayout>(Kernel::kTokens, plan.dk_cap);
  if (fn == nullptr) return cudaErrorInvalidConfiguration;
  TokenArgs a;
  a.geo.by_parts = FastDiv(unsigned(plan.blocks_per_head));
  a.geo.by_hk = FastDiv(unsigned(p.num_k_heads));
  a.geo.units_per_head = plan.items_per_head;
  a.geo.units_per_block = plan.items_per_warp;
  a.geo.group_heads = plan.group_heads;
  a.geo.scale = effective_scale(p);
  a.geo.smem = plan.token_smem;
  a.p = p;
  void* argv[] = {&a};
  if (plan.raise_smem_limit)
    (void)cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan.smem));
  const cudaError_t err = cudaLaunchKernel(fn, dim3(plan.grid), dim3(plan.block), argv, plan.smem, stream);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// The one entry point an instantiation unit provides: plan -> kernel. p is
// the caller's parameters, with the kernels' load order overridden where
// the plan says so (PlanOverrides::kernel_load_order).
template <typename T, Layout kLayout>
cudaError_t launch_plan(const Plan& plan, const DecodeParams& caller, cudaStream_t stream) {
  DecodeParams overridden;
  const DecodeParams* p = &caller;
  if (plan.kernel_load_order >= 0) {
    overridden = caller;
    overridden.programmatic_launch = plan.kernel_load_order != 0;
    p = &overridden;
  }
  if (plan.kernel == Kernel::kTokens) return launch_tokens<T, kLayout>(plan, caller, stream);
  switch (plan.dk_cap) {
    case 64: return launch_dk<T, kLayout, 64>(plan, *p, stream);
    case 128: return launch_dk<T, kLayout, 128>(plan, *p, stream);
    case 256: return launch_dk<T, kLayout, 256>(plan, *p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn

#include "kernel_table.cuh"
