// Element conversions, vector words, the small tensors' loads (raw words first,
// converted once all are in flight), the state's asynchronous copies and stores.
#pragma once

#include <cstdint>
#include <type_traits>
#include "../vendors/vendor.h"
#include "gdnkit/params.hpp"

namespace gdn {
namespace GDN_KERNEL_NS {

// ---- element conversions ----------------------------------------------------
template <typename T> struct Elem;
template <> struct Elem<float> {
  static __device__ __forceinline__ float to_float(float x) { return x; }
  static __device__ __forceinline__ float from_float(float x) { return x; }
};
template <> struct Elem<fp16> {
  static __device__ __forceinline__ float to_float(fp16 x) { return __half2float(x); }
  static __device__ __forceinline__ fp16 from_float(float x) { return __float2half_rn(x); }
};
template <> struct Elem<bf16> {
  static __device__ __forceinline__ float to_float(bf16 x) { return bf16_to_float(x); }
  static __device__ __forceinline__ bf16 from_float(float x) { return float_to_bf16(x); }
};

// Loads and stores of the small tensors (q, k, v, a, b, o), whose dtypes are
// run-time values, through the kernels' `IO` parameter: one shared dtype
// (every engine's case) gets its own instantiation and every access compiles
// straight; otherwise IO = MixedIO, one branch on the dtype (uniform over the
// grid) per group of accesses (docs/decisions.md#io-instantiation).
struct MixedIO {};
template <typename IO, typename F>
__device__ __forceinline__ void with_dtype(DType t, F&& f) {
  if constexpr (!std::is_same<IO, MixedIO>::value) {
    (void)t;
    f(IO{});
  } else {
    switch (t) {
      case DType::kF32: f(float{}); return;
      case DType::kF16: f(fp16{}); return;
      default: f(bf16{}); return;
    }
  }
}

// The unsigned word of kBytes (4, 8 or 16) bytes, for one vector load.
template <int kBytes> struct Word;
template <> struct Word<4> { using type = unsigned; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

// x[e] = ptr[e] for e < N consecutive elements of E (MixedIO's loads): vector
// loads where the address is aligned to the piece (up to 16 bytes), else
// element by element (a caller's odd stride or offset); the same values.
template <typename E, int N>
__device__ __forceinline__ void load_run(const E* ptr, float* x) {
  constexpr int kPerPiece = N * int(sizeof(E)) < 16 ? N : 16 / int(sizeof(E));
  constexpr int kBytes = kPerPiece * int(sizeof(E));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    using W = typename Word<kBytes>::type;
    if (reinterpret_cast<uintptr_t>(ptr) % kBytes == 0) {
#pragma unroll
      for (int k = 0; k < N / kPerPiece; ++k) {
        const W w = *reinterpret_cast<const W*>(ptr + k * kPerPiece);
        const E* e = reinterpret_cast<const E*>(&w);
#pragma unroll
        for (int i = 0; i < kPerPiece; ++i) x[k * kPerPiece + i] = Elem<E>::to_float(e[i]);
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = Elem<E>::to_float(ptr[i]);
}

// ---- loads now, conversions later -------------------------------------------
// A load's first use waits for it, and a use inside a branch (a bound test, an
// alignment test, a dtype switch) is placed inside it: the warp then waits for
// that load before issuing the next, and a phase's small loads (q, k, v, the
// gates, the conv windows) pay one latency each instead of one for all. So the
// kernels load them as raw words, with no use in any branch, and convert once
// every load of the phase is in flight (docs/decisions.md#raw-loads).
// RawRun<E, N>: N consecutive elements of E as raw vector words, pieces of
// kBytes. The address must be aligned to a piece; the planner takes this path
// only where every run's is (vk q/k rows: else select_io picks MixedIO, whose
// loads test each address; prologue runs: prologue_runs_aligned). No test in
// here: a fallback put both paths' instructions on the load chain.
template <int kBytes> struct RawWord { using type = typename Word<kBytes>::type; };
template <> struct RawWord<2> { using type = unsigned short; };
template <typename E, int N>
struct RawRun {
  static constexpr int kPerPiece = N * int(sizeof(E)) < 16 ? N : 16 / int(sizeof(E));
  static constexpr int kBytes = kPerPiece * int(sizeof(E));
  static constexpr int kPieces = N / kPerPiece;
  using W = typename RawWord<kBytes>::type;
  W w[kPieces];
  // ptr: aligned to kBytes (see above)
  __device__ __forceinline__ void load(const E* ptr) {
#pragma unroll
    for (int k = 0; k < kPieces; ++k) w[k] = *reinterpret_cast<const W*>(ptr + k * kPerPiece);
  }
  // x[e] = element e, or 0 for all of them when !in (the load then read a
  // valid stand-in address).
  __device__ __forceinline__ void to_float(float* x, bool in = true) const {
#pragma unroll
    for (int k = 0; k < kPieces; ++k)
#pragma unroll
      for (int i = 0; i < kPerPiece; ++i)
        x[k * kPerPiece + i] = in ? Elem<E>::to_float(reinterpret_cast<const E*>(&w[k])[i]) : 0.0f;
  }
};

// The same for a small tensor of the kernel's IO: raw words when IO is a dtype;
// with MixedIO converted at the load, in the dtype switch, and kept as floats.
template <typename IO>
using IoElem = typename std::conditional<std::is_same<IO, MixedIO>::value, float, IO>::type;
template <typename IO, int N>
struct IoRun {
  RawRun<IoElem<IO>, N> r;
  // elements [off, off + N) of `base`, of dtype t
  __device__ __forceinline__ void load(DType t, const void* base, int64_t off) {
    if constexpr (!std::is_same<IO, MixedIO>::value) {
      (void)t;
      r.load(static_cast<const IO*>(base) + off);
    } else {
      with_dtype<MixedIO>(t, [&](auto tag) {
        using E = decltype(tag);
        float x[N];
        load_run<E, N>(static_cast<const E*>(base) + off, x);
#pragma unroll
        for (int k = 0; k < r.kPieces; ++k)
#pragma unroll
          for (int i = 0; i < r.kPerPiece; ++i) reinterpret_cast<float*>(&r.w[k])[i] = x[k * r.kPerPiece + i];
      });
    }
  }
  __device__ __forceinline__ void to_float(float* x, bool in = true) const { r.to_float(x, in); }
  __device__ __forceinline__ float value(bool in = true) const {
    float x[N];
    r.to_float(x, in);
    return x[0];
  }
};

// One element of a runtime dtype (the padding path's zeros).
__device__ __forceinline__ void store_any(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = x; return;
    case DType::kF16: static_cast<fp16*>(base)[i] = __float2half_rn(x); return;
    default: static_cast<bf16*>(base)[i] = float_to_bf16(x); return;
  }
}

__device__ __forceinline__ int64_t load_index(const void* base, IndexType t, int64_t b) {
  return t == IndexType::kI64 ? static_cast<const int64_t*>(base)[b]
                              : int64_t(static_cast<const int32_t*>(base)[b]);
}

// ---- asynchronous 16-byte copies, global -> shared ---------------------------
// cp.async (sm_80 and newer): the next items' state is in flight without
// holding registers (docs/decisions.md#vk-ring). `valid` false writes 16 zero
// bytes and reads nothing (src-size 0): rows past Dk, columns past Dv.
#if !defined(GDN_NO_ASYNC_COPY) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GDN_ASYNC_COPY 1
#endif
// kFetch256 (docs/decisions.md#l2-hints): L2 fetches the whole aligned 256-byte
// block around the copy; the bytes that land are the same, and the extra ones
// lie in the block of an address the kernel may read, so in a mapped page.
template <bool kFetch256 = false>
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem, bool valid) {
#if GDN_ASYNC_COPY
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kFetch256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
#else
  // AMD (no cp.async) and older targets: a plain load and store (same
  // values; the copy completes before the next instruction needs it).
  *static_cast<uint4*>(smem) = valid ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
// Close the group of copies issued since the last commit (one group per item).
__device__ __forceinline__ void async_commit() {
#if GDN_ASYNC_COPY
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Wait until at most kPending groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void async_wait() {
#if GDN_ASYNC_COPY
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// One 16-byte vector of the new state to global memory; kEvictFirst: under an
// L2 evict-first policy, so L2 gives its dirty lines up first (sm_80 and newer,
// elsewhere a plain store; docs/decisions.md#l2-hints). The same bytes.
template <bool kEvictFirst, typename V>
__device__ __forceinline__ void store_state16(V* dst, const V& v) {
#if GDN_ASYNC_COPY
  if constexpr (kEvictFirst) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    const uint4 u = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "r"(u.x), "r"(u.y),
                 "r"(u.z), "r"(u.w), "l"(policy)
                 : "memory");
    return;
  }
#endif
  *dst = v;
}

// A 16-byte vector of state elements.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kN = 16 / int(sizeof(T));
  T x[kN];
};

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
