// CUDA backend: the BackendOps table (availability, the backend's own
// limits, decode through the planner and launcher of device.h, memory
// helpers, the kernel list).
//
// Compiled twice when the HIP backend is built: as itself (gdn::cuda_backend,
// "cuda") and as HIP (GDN_HIP: gdn::hip_backend, "hip", kernels in gdn::hip,
// runtime names mapped by vendors/hip.h).
#include <cstdio>
#include <mutex>

#include "device.h"
#include "traits.cuh"
#include "gdnkit/backend.hpp"
#include "gdnkit/gdnkit.hpp"

#if defined(GDN_HIP)
#define GDN_BACKEND_FN hip_backend
#define GDN_BACKEND_ID Backend::kHip
#define GDN_BACKEND_NAME "hip"
#define GDN_VENDOR "HIP"
#else
#define GDN_BACKEND_FN cuda_backend
#define GDN_BACKEND_ID Backend::kCuda
#define GDN_BACKEND_NAME "cuda"
#define GDN_VENDOR "CUDA"
#endif

namespace gdn {
namespace GDN_KERNEL_NS {
namespace {

// Whether a device exists, read once per process (the kernels' per-device
// facts are device.cu's, read on the first call on each device).
struct Devices {
  int count{0};
  cudaError_t error{cudaSuccess};
};

const Devices& devices() {
  static const Devices d = [] {
    Devices r;
    r.error = cudaGetDeviceCount(&r.count);
    if (r.error != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error: no driver is not a failure of later calls
      r.count = 0;
      return r;
    }
    return r;
  }();
  return d;
}

// What this build carries, for `gdn info` on a machine without the GPU.
#if defined(GDN_HIP_TARGETS)
constexpr const char* kBuiltFor = "; built for " GDN_HIP_TARGETS;
#else
constexpr const char* kBuiltFor = "";
#endif

bool cuda_available(char* why, size_t why_size) {
  const Devices& d = devices();
  if (d.count > 0) return true;
  if (why != nullptr && why_size > 0) {
    if (d.error != cudaSuccess)
      std::snprintf(why, why_size, "no " GDN_VENDOR " device (%s)%s", cudaGetErrorString(d.error), kBuiltFor);
    else
      std::snprintf(why, why_size, "no " GDN_VENDOR " device%s", kBuiltFor);
  }
  return false;
}

Status cuda_can_implement(const DecodeParams& p) {
  // Multi-token calls keep every token's inputs in shared memory (docs/decisions.md#token-kernel).
  if (is_multi_token(p)) {
    const size_t need = gpu::token_smem_bytes(p, kWarp), limit = gpu::traits::token_smem_limit(kConfig);
    if (need > limit)
      return make_status(StatusCode::kUnsupported,
                         "num_tokens: %d tokens of %d x %d heads (%d v-heads a k-head%s%s) need %zu bytes of "
                         "shared memory a block, more than the %zu the " GDN_BACKEND_NAME " backend has; split the "
                         "tokens over several calls",
                         p.num_tokens, p.head_dim_k, p.head_dim_v, p.num_v_heads / p.num_k_heads,
                         p.norm_weight != nullptr ? ", norm on" : "", p.b_head_stride > 0 ? ", per-channel beta" : "",
                         need, limit);
  }
  // The state moves in 16-byte vectors: every (slot, head) matrix row must start 16-byte aligned.
  const size_t elem = dtype_size(p.state_dtype);
  if (reinterpret_cast<uintptr_t>(p.state) % 16 != 0)
    return make_status(StatusCode::kUnsupported,
                       "state: address %p is not 16-byte aligned (the " GDN_BACKEND_NAME " backend moves the state "
                       "in 16-byte vectors)",
                       p.state);
  if (p.num_slots > 1 && (p.state_slot_stride * int64_t(elem)) % 16 != 0)
    return make_status(StatusCode::kUnsupported,
                       "state_slot_stride: %lld elements is not a multiple of 16 bytes (the " GDN_BACKEND_NAME " "
                       "backend moves the state in 16-byte vectors)",
                       (long long)p.state_slot_stride);
  // A fused block owns a group of Hv / Hk heads, one vk warp (at least) a head.
  if ((p.conv_width > 0 || p.norm_weight != nullptr) && p.num_v_heads / p.num_k_heads > kMaxFusedGroup)
    return make_status(StatusCode::kUnsupported,
                       "num_v_heads: %d v-heads per k-head (Hv / Hk) with the conv prologue or the norm epilogue "
                       "exceeds the %d the " GDN_BACKEND_NAME " backend supports",
                       p.num_v_heads / p.num_k_heads, kMaxFusedGroup);
  if (p.batch * p.num_v_heads * 16 > int64_t(0x7fffffff))
    return make_status(StatusCode::kUnsupported,
                       "batch: %lld rows x %d v-heads exceeds the " GDN_VENDOR " grid limit",
                       (long long)p.batch, p.num_v_heads);
  return Status::success();
}

Status cuda_decode(const DecodeParams& p) {
  const cudaError_t err = decode_with(p, gpu::PlanOverrides{});
  if (err == cudaErrorInvalidDevice)
    return make_status(StatusCode::kBackendError, GDN_BACKEND_NAME ": the current device is past the %d devices "
                       "the backend supports", kMaxDevices);
  if (err != cudaSuccess)
    return make_status(StatusCode::kBackendError, GDN_BACKEND_NAME ": kernel launch failed: %s",
                       cudaGetErrorString(err));
  return Status::success();
}

int cuda_list_kernels(void (*line)(const char* name, void* ctx), void* ctx) {
  struct Sink {
    void (*line)(const char*, void*);
    void* ctx;
  } sink{line, ctx};
  return visit_all_kernels(
      [](const KernelUse& k, void* p) {
        const Sink& s = *static_cast<const Sink*>(p);
        if (s.line == nullptr) return;
        char name[128];
        kernel_name(k, name, sizeof name);
        s.line(name, s.ctx);
      },
      &sink);
}

void* cuda_alloc(size_t bytes) {
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, bytes ? bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return ptr;
}

void cuda_release(void* ptr) { (void)cudaFree(ptr); }

Status cuda_copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  const cudaError_t err = cudaMemcpy(dst, src, bytes, k);
  if (err != cudaSuccess)
    return make_status(StatusCode::kBackendError, GDN_BACKEND_NAME ": cudaMemcpy: %s", cudaGetErrorString(err));
  return Status::success();
}

Status cuda_sync(void* stream) {
  const cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess)
    return make_status(StatusCode::kBackendError, GDN_BACKEND_NAME ": %s", cudaGetErrorString(err));
  return Status::success();
}

void cuda_describe(char* buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < devices().count && used + 1 < size; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    char arch[64];
#if defined(GDN_AMD)
    std::snprintf(arch, sizeof arch, "%s", prop.gcnArchName);
#else
    std::snprintf(arch, sizeof arch, "sm_%d%d", prop.major, prop.minor);
#endif
    used += size_t(std::snprintf(buf + used, size - used, "%sdevice %d: %s, %s, %d SMs, %.1f GiB, %d-lane warps",
                                 i ? "; " : "", i, prop.name, arch, prop.multiProcessorCount,
                                 double(prop.totalGlobalMem) / (1 << 30), kWarp));
  }
}

}  // namespace
}  // namespace GDN_KERNEL_NS

const BackendOps* GDN_BACKEND_FN() {
  static const BackendOps ops = [] {
    BackendOps o;
    o.id = GDN_BACKEND_ID;
    o.name = GDN_BACKEND_NAME;
    o.available = GDN_KERNEL_NS::cuda_available;
    o.can_implement = GDN_KERNEL_NS::cuda_can_implement;
    o.decode = GDN_KERNEL_NS::cuda_decode;
    o.alloc = GDN_KERNEL_NS::cuda_alloc;
    o.release = GDN_KERNEL_NS::cuda_release;
    o.copy = GDN_KERNEL_NS::cuda_copy;
    o.synchronize = GDN_KERNEL_NS::cuda_sync;
    o.describe = GDN_KERNEL_NS::cuda_describe;
    o.list_kernels = GDN_KERNEL_NS::cuda_list_kernels;
    return o;
  }();
  return &ops;
}

}  // namespace gdn
