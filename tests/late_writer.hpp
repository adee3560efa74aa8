// gdnkit tests — an upstream kernel for programmatic launches: it lets the
// next kernel on the stream start at once and writes that kernel's inputs
// only later, so a dependent that read an input before its
// griddepcontrol.wait would read the poison left in it (late_writer.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace gdn_test {

struct LateCopy {
  const void* src{nullptr};
  void* dst{nullptr};
  size_t bytes{0};
};
constexpr int kMaxLateCopies = 6;
struct LateCopies {
  LateCopy copy[kMaxLateCopies];
  int count{0};
};

// One block on `stream`: griddepcontrol.launch_dependents (sm_90 code; a
// no-op in code for older GPUs, whose dependents wait for the whole
// kernel), then `delay_us` microseconds on the global timer, then each copy.
cudaError_t launch_late_writer(const LateCopies& copies, unsigned delay_us, cudaStream_t stream);

}  // namespace gdn_test
