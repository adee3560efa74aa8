// The kernel table of one (state dtype, layout): every instantiation that
// launch.cuh can launch, with what initializing a device sets on it (its
// shared-memory limit, the carveout) and which occupancy it records for the
// planner. launch.cuh and this list name the same instantiations; the list
// is what `gdn info --kernels` prints.
#pragma once

namespace gdn {
namespace GDN_KERNEL_NS {

template <typename K>
KernelUse kernel_use(K fn, DType state, Layout layout, gpu::Kernel family, int dk, int tile, gpu::Io io) {
  KernelUse u;
  u.fn = reinterpret_cast<const void*>(fn);
  u.state_dtype = state;
  u.layout = layout;
  u.family = family;
  u.dk_cap = dk;
  u.tile = tile;
  u.io = io;
  return u;
}

template <typename T>
constexpr DType state_dtype_of() {
  return sizeof(T) == 4 ? DType::kF32 : std::is_same<T, fp16>::value ? DType::kF16 : DType::kBF16;
}

// The fused kernel of K and its twins (the norm alone in clusters, one
// input dtype; a programmatic launch's, 16-bit inputs), all with one limit.
template <typename K, typename IO>
void visit_fused(KernelVisitor visit, void* ctx, KernelUse base, size_t smem_limit) {
  auto one = [&](auto fn, bool norm_only, bool pdl) {
    KernelUse u = base;
    u.fn = reinterpret_cast<const void*>(fn);
    u.norm_only = norm_only;
    u.pdl_twin = pdl;
    u.smem_limit = smem_limit;
    visit(u, ctx);
  };
  one(K::template fused<false, false>(), false, false);
  if constexpr (kTwins && K::kUniform) one(K::template fused<true, false>(), true, false);
  if constexpr (kTwins && kPdlInputs<IO>) one(K::template fused<false, true>(), false, true);
}

template <typename T, int kDk, Io kIo>
void visit_vk(KernelVisitor visit, void* ctx) {
  using IO = IoType<kIo>;
  using K = VkKernels<T, kDk, IO>;
  constexpr DType kState = state_dtype_of<T>();
  // The ring of an 8-warp block: every launch's fits (docs/decisions.md#vk-ring).
  constexpr size_t kRing = gpu::traits::ring_smem_bytes(kConfig, int(sizeof(T)), Layout::kVK, kDk, K::kP, 8);
  static_assert(kRing <= GDN_MAX_BLOCK_SMEM, "the vk ring exceeds a block's shared memory");
  auto step = [&](auto fn, bool hints, bool norm, bool occupancy) {
    KernelUse u = kernel_use(fn, kState, Layout::kVK, Kernel::kVkStep, kDk, K::kP, kIo);
    u.l2_hints = hints;
    u.norm = norm;
    u.smem_limit = kRing;
    u.carveout = true;
    if (occupancy) {
      u.occupancy = Occupancy::kStep;
      u.occupancy_warps = 8;
    }
    visit(u, ctx);
  };
  step(K::template step<0, false>(), false, false, true);
#if GDN_L2_HINTS
  step(K::template step<K::kHints, false>(), true, false, false);
#endif
  if constexpr (kTwins && K::kUniform) {
    step(K::template step<0, true>(), false, true, false);
    step(K::template step<K::kHints, true>(), true, true, false);
  }
  // The fused kernels' limit: the ring and the largest group's stages.
  constexpr size_t kFused = kRing + fused_smem_bytes(kMaxFusedGroup, kDk, kMaxHeadDim, kTwins);
  static_assert(kFused <= GDN_MAX_BLOCK_SMEM, "the ring and the fused stages exceed a block's shared memory");
  visit_fused<K, IO>(visit, ctx, kernel_use(K::template fused<false, false>(), kState, Layout::kVK, Kernel::kVkFused,
                                            kDk, K::kP, kIo),
                     kFused);
#if GDN_VK_WAVE
  if constexpr (K::kWave) {
    auto wave = [&](auto fn, bool indexed, bool pdl) {
      KernelUse u = kernel_use(fn, kState, Layout::kVK, Kernel::kVkWave, kDk, K::kP, kIo);
      u.l2_hints = true;
      u.indexed = indexed;
      u.pdl_twin = pdl;
      if (!pdl) {  // (both launches' bounds are the same)
        u.occupancy = indexed ? Occupancy::kWaveIndexed : Occupancy::kWave;
        u.occupancy_warps = 8;
      }
      visit(u, ctx);
    };
    wave(K::template wave<false, false>(), false, false);
    wave(K::template wave<false, true>(), false, true);
    if constexpr (K::kWavePool) {
      wave(K::template wave<true, false>(), true, false);
      wave(K::template wave<true, true>(), true, true);
    }
  }
#endif
}

template <typename T, int kDk, int kW, Io kIo>
void visit_kv_tile(KernelVisitor visit, void* ctx) {
  using IO = IoType<kIo>;
  using K = KvKernels<T, kDk, kW, IO>;
  constexpr DType kState = state_dtype_of<T>();
  constexpr size_t kRing = gpu::traits::kv_step_smem_bytes(kConfig, int(sizeof(T)), kDk, kW);
  static_assert(kRing <= GDN_MAX_BLOCK_SMEM, "the kv step's ring exceeds a block's shared memory");
  auto step = [&](auto fn, bool hints, bool norm, bool occupancy) {
    KernelUse u = kernel_use(fn, kState, Layout::kKV, Kernel::kKvStep, kDk, kW, kIo);
    u.l2_hints = hints;
    u.norm = norm;
    u.smem_limit = kRing;
    u.carveout = true;
    if (occupancy) {
      u.occupancy = kW == kKvSmallW ? Occupancy::kStepSmallTile : Occupancy::kStep;
      u.occupancy_warps = kW;
    }
    visit(u, ctx);
  };
  step(K::template step<0, false>(), false, false, true);
#if GDN_L2_HINTS
  if constexpr (K::kHints != 0) step(K::template step<K::kHints, false>(), true, false, false);
#endif
  if constexpr (kTwins && K::kUniform) {
    step(K::template step<0, true>(), false, true, false);
    if constexpr (K::kHints != 0) step(K::template step<K::kHints, true>(), true, true, false);
  }
  if constexpr (kW == default_tile_param<T, Layout::kKV>()) {
    constexpr size_t kFused = gpu::traits::ring_smem_bytes(kConfig, int(sizeof(T)), Layout::kKV, kDk, kW, kW) +
                              fused_smem_bytes(kMaxFusedGroup, kDk, kMaxHeadDim, kTwins);
    static_assert(kFused <= GDN_MAX_BLOCK_SMEM, "the ring and the fused stages exceed a block's shared memory");
    visit_fused<K, IO>(visit, ctx,
                       kernel_use(K::template fused<false, false>(), kState, Layout::kKV, Kernel::kKvFused, kDk, kW,
                                  kIo),
                       kFused);
  }
}

template <typename T, Layout kLayout, int kDk, Io kIo>
void visit_io(KernelVisitor visit, void* ctx) {
  if constexpr (kLayout == Layout::kVK) {
    visit_vk<T, kDk, kIo>(visit, ctx);
  } else {
    visit_kv_tile<T, kDk, default_tile_param<T, Layout::kKV>(), kIo>(visit, ctx);
    visit_kv_tile<T, kDk, kKvSmallW, kIo>(visit, ctx);
  }
}

// The multi-token kernel of (T, layout, Dk capacity): one for every small-tensor
// dtype, launched by key (launch_tokens). Its shared memory is the call's, up
// to token_smem_limit.
template <typename T, Layout kLayout, int kDk>
void visit_tokens(KernelVisitor visit, void* ctx) {
  using Tr = TokenTraits<T, kLayout, kDk>;
  KernelUse u = kernel_use(&decode_tokens_kernel<Tr>, state_dtype_of<T>(), kLayout, Kernel::kTokens, kDk, Tr::kTile,
                           Io::kMixed);
  u.smem_limit = gpu::traits::token_smem_limit(kConfig);
  visit(u, ctx);
}

template <typename T, Layout kLayout, int kDk>
void visit_dk(KernelVisitor visit, void* ctx) {
  visit_tokens<T, kLayout, kDk>(visit, ctx);
  visit_io<T, kLayout, kDk, Io::kF32>(visit, ctx);
  visit_io<T, kLayout, kDk, Io::kF16>(visit, ctx);
  visit_io<T, kLayout, kDk, Io::kBF16>(visit, ctx);
  visit_io<T, kLayout, kDk, Io::kMixed>(visit, ctx);
}

template <typename T, Layout kLayout>
void visit_kernels(KernelVisitor visit, void* ctx) {
  visit_dk<T, kLayout, 64>(visit, ctx);
  visit_dk<T, kLayout, 128>(visit, ctx);
  visit_dk<T, kLayout, 256>(visit, ctx);
}

// The two templates an instantiation unit compiles for (T, layout).
#define GDN_INSTANTIATE(T, L)                                                  \
  template void visit_kernels<T, L>(KernelVisitor, void*);                     \
  template cudaError_t launch_plan<T, L>(const gpu::Plan&, const DecodeParams&, cudaStream_t);

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
