// The CUDA side of the one kernel source: runtime headers, the namespace the
// kernels compile into (gdn::cuda) and what this vendor's build carries.
// vendors/hip.h is its HIP twin; vendors/vendor.h picks one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define GDN_KERNEL_NS cuda
#define GDN_WARP_SIZE 32
#define GDN_PHYSICAL_WARP 32
// Shared memory a block may opt in to (sm_90: 227 KiB; the ring needs at
// most 110 KiB, at kv Dk = 256 with two stages).
#define GDN_MAX_BLOCK_SMEM (227 * 1024)
// L2 cache policies on the state's traffic (docs/decisions.md#l2-hints)
#define GDN_L2_HINTS 1
// The vk step's kernel for the engines' call in one wave (docs/decisions.md#vk-wave-kernel)
#define GDN_VK_WAVE 1

namespace gdn {
namespace cuda {
using bf16 = __nv_bfloat16;
using fp16 = __half;
__device__ __forceinline__ float bf16_to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 float_to_bf16(float f) { return __float2bfloat16_rn(f); }
}  // namespace cuda
}  // namespace gdn
