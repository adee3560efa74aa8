// gdnkit — shared vocabulary: dtypes, enums, status.
//
// Everything here is a plain value type so it can cross threads, streams and
// the C ABI without allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gdn {

// Element types of the tensors the step touches.
enum class DType : int32_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
};

// Element type of the optional slot-index arrays.
enum class IndexType : int32_t {
  kNone = 0,  // no index array: slot_of(b) = b
  kI32 = 1,
  kI64 = 2,
};

// State pool layout of one (slot, v-head) matrix.
enum class Layout : int32_t {
  kKV = 0,  // [slot, Hv, Dk, Dv], Dv contiguous (ExecuTorch, FLA)
  kVK = 1,  // [slot, Hv, Dv, Dk], Dk contiguous (vLLM, SGLang, FlashInfer, llama.cpp)
};

// How q and k are normalized.
enum class L2Norm : int32_t {
  kRsqrt = 0,    // x * rsqrt(sum x^2 + eps)      (HF, FLA, FlashInfer, vLLM)
  kMaxNorm = 1,  // x / max(||x||, eps)           (torch F.normalize, ExecuTorch, llama.cpp)
  kNone = 2,     // q and k arrive normalized
};

// Which k-head serves v-head h (G = Hv / Hk).
enum class HeadMap : int32_t {
  kInterleaved = 0,  // hk = h / G   (HF repeat_interleave)
  kTiled = 1,        // hk = h % Hk  (GGUF order)
};

// What a and b hold.
enum class Gate : int32_t {
  kRaw = 0,          // a, b_raw logits; g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b_raw)
  kPrecomputed = 1,  // a = g (log space), b = beta (already through the sigmoid)
};

// Where a call runs.
enum class Backend : int32_t {
  kAuto = 0,  // the best backend built in and with a device present
  kHost = 1,  // Kokkos reference, accumulates in double
  kCuda = 2,
  kHip = 3,
};

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // the caller's parameters break a rule; nothing was written
  kUnsupported = 2,      // valid, but this backend cannot run it; nothing was written
  kBackendNotBuilt = 3,  // the backend was not compiled into this library
  kNoDevice = 4,         // the backend is built but found no device
  kBackendError = 5,     // the backend's runtime reported a failure (launch, driver)
};

// A status with a fixed-size message: returning it never allocates.
struct Status {
  static constexpr size_t kMessageSize = 256;
  StatusCode code{StatusCode::kOk};
  char message[kMessageSize]{};

  bool ok() const { return code == StatusCode::kOk; }
  static Status success() { return Status{}; }
};

// printf-style constructor for a failed status (truncates to kMessageSize).
Status make_status(StatusCode code, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

const char* to_string(DType t);
const char* to_string(IndexType t);
const char* to_string(Layout l);
const char* to_string(L2Norm n);
const char* to_string(HeadMap m);
const char* to_string(Gate g);
const char* to_string(Backend b);
const char* to_string(StatusCode c);

// Bytes of one element.
constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
constexpr size_t index_size(IndexType t) {
  return t == IndexType::kI64 ? 8 : (t == IndexType::kI32 ? 4 : 0);
}

}  // namespace gdn
