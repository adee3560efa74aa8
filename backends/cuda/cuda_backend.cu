// CUDA backend: the BackendOps table, device queries, and the one dispatch
// from runtime values (state dtype, layout, Dk) to a kernel instantiation.
//
// Compiled twice when the HIP backend is built: as itself (gdn::cuda_backend,
// "cuda") and as HIP (GDN_HIP: gdn::hip_backend, "hip", kernels in gdn::hip,
// runtime names mapped by ../hip/vendor_hip.hpp).
#include <cstdio>
#include <mutex>

#include "decode_kernel.cuh"
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

constexpr int kMaxDevices = 64;

// Device facts read once per process (immutable afterwards): nothing on the
// decode path queries the driver.
struct Devices {
  int count{0};
  cudaError_t error{cudaSuccess};
  int sms[kMaxDevices]{};
  int l2_bytes[kMaxDevices]{};
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
    for (int i = 0; i < r.count && i < kMaxDevices; ++i) {
      if (cudaDeviceGetAttribute(&r.sms[i], cudaDevAttrMultiProcessorCount, i) != cudaSuccess) r.sms[i] = 0;
      // (unread: 0, and the launch applies no L2 policy that depends on it)
      if (cudaDeviceGetAttribute(&r.l2_bytes[i], cudaDevAttrL2CacheSize, i) != cudaSuccess) r.l2_bytes[i] = 0;
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

// What the launch plan needs of the device.
struct Gpu {
  int sms;
  int64_t l2_bytes;
};

template <typename T, Layout kLayout, int kDk>
cudaError_t run_dk(const DecodeParams& p, Gpu gpu, cudaStream_t stream) {
  constexpr int kP = default_tile_param<T, kLayout>();
  const Launch g = plan_launch<T, kLayout, kDk, kP>(p, gpu.sms, gpu.l2_bytes, default_items_per_warp<T, kLayout>());
  return launch_decode<T, kLayout, kDk, kP>(p, g, stream);
}

// Dk capacity: the smallest of 64, 128, 256 that holds Dk (rows past Dk are masked).
template <typename T, Layout kLayout>
cudaError_t run_layout(const DecodeParams& p, Gpu gpu, cudaStream_t stream) {
  if (p.head_dim_k <= 64) return run_dk<T, kLayout, 64>(p, gpu, stream);
  if (p.head_dim_k <= 128) return run_dk<T, kLayout, 128>(p, gpu, stream);
  return run_dk<T, kLayout, 256>(p, gpu, stream);
}

template <typename T>
cudaError_t run_state(const DecodeParams& p, Gpu gpu, cudaStream_t stream) {
  return p.layout == Layout::kVK ? run_layout<T, Layout::kVK>(p, gpu, stream)
                                 : run_layout<T, Layout::kKV>(p, gpu, stream);
}

Status cuda_decode(const DecodeParams& p) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess)
    return make_status(StatusCode::kBackendError, GDN_BACKEND_NAME ": cudaGetDevice: %s", cudaGetErrorString(err));
  const bool known = dev < kMaxDevices && devices().sms[dev] > 0;
  const Gpu gpu{known ? devices().sms[dev] : 108, known ? devices().l2_bytes[dev] : 0};
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  switch (p.state_dtype) {
    case DType::kF32: err = run_state<float>(p, gpu, stream); break;
    case DType::kBF16: err = run_state<bf16>(p, gpu, stream); break;
    case DType::kF16: err = run_state<fp16>(p, gpu, stream); break;
  }
  if (err != cudaSuccess)
    return make_status(StatusCode::kBackendError, GDN_BACKEND_NAME ": kernel launch failed: %s",
                       cudaGetErrorString(err));
  return Status::success();
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
    return o;
  }();
  return &ops;
}

}  // namespace gdn
