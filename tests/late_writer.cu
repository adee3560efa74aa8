// gdnkit tests — the late writer of late_writer.hpp.
#include "late_writer.hpp"

namespace gdn_test {
namespace {

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

__global__ void late_writer_kernel(LateCopies copies, unsigned delay_us) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // the dependent grid may launch now: long before the writes below
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const unsigned long long start = global_ns();
  while (global_ns() - start < 1000ull * delay_us) {
  }
  for (int c = 0; c < copies.count; ++c) {
    const unsigned char* src = static_cast<const unsigned char*>(copies.copy[c].src);
    unsigned char* dst = static_cast<unsigned char*>(copies.copy[c].dst);
    for (size_t i = threadIdx.x; i < copies.copy[c].bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

cudaError_t launch_late_writer(const LateCopies& copies, unsigned delay_us, cudaStream_t stream) {
  late_writer_kernel<<<1, 256, 0, stream>>>(copies, delay_us);
  return cudaGetLastError();
}

}  // namespace gdn_test
