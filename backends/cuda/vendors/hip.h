// The HIP side of the one kernel source (vendors/cuda.h is its CUDA twin), in
// the manner of ggml's vendors/hip.h (docs/decisions.md#hip-source-path): with
// GDN_HIP, vendors/vendor.h includes it, and the sources keep CUDA's names.
// - AMD (clang -x hip: __HIP__; GDN_AMD): the CUDA runtime names mapped to
//   HIP's, 64-lane wavefronts (gfx9: MI100, MI200, MI300);
// - NVIDIA (GDN_HIP_ON_NVIDIA, nvcc): the CUDA runtime kept, so the HIP paths
//   (no cp.async, one ring stage, 64 KiB LDS, the warp-size constant, a 64-lane
//   logical warp with GDN_WARP_SIZE=64) are tested on an NVIDIA GPU (HIP's
//   NVIDIA headers do not compile with CUDA 13).
// Either way the kernels live in gdn::hip, so one library can hold both backends.
#pragma once

#define GDN_KERNEL_NS hip
// No cp.async on AMD: the state is staged through shared memory by plain
// loads and stores, so a second ring stage would only cost LDS.
#define GDN_NO_ASYNC_COPY 1
// LDS a block may use (AMD gfx9: 64 KiB a workgroup and a CU).
#define GDN_MAX_BLOCK_SMEM (64 * 1024)

#if defined(__HIP__)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#define GDN_AMD 1

// gfx9 wavefronts are 64 lanes (the device-side __AMDGCN_WAVEFRONT_SIZE is
// not visible to host code, which needs the same constant to plan launches).
#ifndef GDN_WARP_SIZE
#define GDN_WARP_SIZE 64
#endif
#define GDN_PHYSICAL_WARP 64

// CUDA attribute HIP lacks: parameters are in constant memory anyway.
#define __grid_constant__

// Runtime names the backend uses.
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidConfiguration hipErrorInvalidConfiguration
#define cudaErrorInvalidDevice hipErrorInvalidDevice
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaStream_t hipStream_t
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDevice hipGetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrL2CacheSize hipDeviceAttributeL2CacheSize
#define cudaDevAttrMemoryClockRate hipDeviceAttributeMemoryClockRate
#define cudaDevAttrGlobalMemoryBusWidth hipDeviceAttributeMemoryBusWidth
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyKind hipMemcpyKind
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaLaunchKernel hipLaunchKernel
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor

#elif defined(GDN_HIP_ON_NVIDIA)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#ifndef GDN_WARP_SIZE
#define GDN_WARP_SIZE 32
#endif
#define GDN_PHYSICAL_WARP 32

#else
#error "vendors/hip.h: compile with a HIP compiler for AMD, or define GDN_HIP_ON_NVIDIA"
#endif

namespace gdn {
namespace hip {

// bf16 as 16 raw bits: ROCm 5.2's hip_bfloat16 is a class with host-side
// rounding helpers that differ across ROCm releases; the kernels need only
// the two conversions below (round to nearest even, as CUDA's
// __float2bfloat16_rn, NaN kept quiet).
struct bf16 {
  unsigned short bits;
};
__device__ __forceinline__ float bf16_to_float(bf16 x) { return __uint_as_float(unsigned(x.bits) << 16); }
__device__ __forceinline__ bf16 float_to_bf16(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<unsigned short>((u >> 16) | 0x40u)};
  // round to nearest, ties to even: add 0x7fff plus the lowest kept bit
  return bf16{static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
using fp16 = __half;

}  // namespace hip
}  // namespace gdn
