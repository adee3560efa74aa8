// Per-device state of the backend and the seam between its host code and its
// instantiation units: each device's DeviceInfo (plan.h), initialized once
// on the first call there; the kernel table each unit provides; the entry
// point that plans on the current device and launches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdnkit/params.hpp"
#include "plan.h"
#include "vendors/vendor.h"

namespace gdn {
namespace GDN_KERNEL_NS {

// Occupancy a kernel's entry records in DeviceInfo.
enum class Occupancy : uint8_t { kNone, kStep, kStepSmallTile, kWave, kWaveIndexed };

// One kernel instantiation, as the unit that holds it describes it: what it
// is, and what initializing a device does with it.
struct KernelUse {
  const void* fn{nullptr};
  DType state_dtype{DType::kF32};
  Layout layout{Layout::kVK};
  gpu::Kernel family{gpu::Kernel::kVkStep};
  int dk_cap{0}, tile{0};
  gpu::Io io{gpu::Io::kMixed};
  bool l2_hints{false}, norm{false}, norm_only{false}, pdl_twin{false}, indexed{false};
  size_t smem_limit{0};  // dynamic shared memory to opt in to (0: the default)
  bool carveout{false};  // all of the L1/shared array as shared memory
  Occupancy occupancy{Occupancy::kNone};
  int occupancy_warps{0};  // block of this many warps, with smem_limit bytes
};
using KernelVisitor = void (*)(const KernelUse& k, void* ctx);

// Provided by each instantiation unit (kernel_table.cuh, launch.cuh).
template <typename T, Layout kLayout>
void visit_kernels(KernelVisitor visit, void* ctx);
template <typename T, Layout kLayout>
cudaError_t launch_plan(const gpu::Plan& plan, const DecodeParams& p, cudaStream_t stream);

constexpr int kMaxDevices = 64;

// The current device's DeviceInfo, initialized on the first call there
// (thread-safe; afterwards read-only). nullptr when there is no current
// device or it is past kMaxDevices (*dev says which).
const gpu::DeviceInfo* current_device_info(int* dev);

// The dynamic shared memory a programmatic launch of `kernel` asks for so
// that its blocks spread over the SMs (docs/decisions.md#pdl); cached per
// (device, kernel, launch shape).
size_t spread_smem(const void* kernel, unsigned grid, unsigned block, size_t smem, int cluster);

// Plan p on the current device (with the overrides) and launch the plan.
// plan_out, when given, receives the plan.
cudaError_t decode_with(const DecodeParams& p, const gpu::PlanOverrides& o, gpu::Plan* plan_out = nullptr);

// Every kernel instantiation the backend holds, in a fixed order; returns
// their count. Needs no device.
int visit_all_kernels(KernelVisitor visit, void* ctx);
// "vk_step<bf16,dk128,p32,io=bf16,l2,norm>" and the like.
void kernel_name(const KernelUse& k, char* buf, size_t size);

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
