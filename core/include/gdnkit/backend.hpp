// gdnkit — the backend table: what each backend folder provides to the core.
//
// decode() routes through backend_ops(); tools, tests and benchmarks use the
// same table to allocate and copy memory on whichever backend they exercise,
// so they are written once for every backend. Adding a backend is one folder
// that defines a BackendOps, plus one line in core/src/dispatch.cpp.
#pragma once

#include <cstddef>

#include "gdnkit/params.hpp"
#include "gdnkit/types.hpp"

namespace gdn {

enum class CopyKind : int32_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct BackendOps {
  Backend id{Backend::kHost};
  const char* name{""};
  // Built and a device present; on false, `why` gets a one-line reason.
  bool (*available)(char* why, size_t why_size){nullptr};
  // Backend-specific limits beyond the core rules (kUnsupported with a message).
  Status (*can_implement)(const DecodeParams& p){nullptr};
  // The step itself; p is validated. Launch errors come back as kBackendError.
  Status (*decode)(const DecodeParams& p){nullptr};

  // Memory helpers for tools, tests and benchmarks; never on decode's path.
  void* (*alloc)(size_t bytes){nullptr};  // nullptr on failure
  void (*release)(void* ptr){nullptr};
  Status (*copy)(void* dst, const void* src, size_t bytes, CopyKind kind){nullptr};
  Status (*synchronize)(void* stream){nullptr};
  // One paragraph on the devices found (name, architecture, memory).
  void (*describe)(char* buf, size_t size){nullptr};
  // Every kernel instantiation the backend holds, one line each, in a fixed
  // order (`gdn info --kernels`); returns their count. Needs no device;
  // nullptr for a backend without kernel variants.
  int (*list_kernels)(void (*line)(const char* name, void* ctx), void* ctx){nullptr};
};

// The table of a built backend, or nullptr (kAuto resolves first).
const BackendOps* backend_ops(Backend backend);

}  // namespace gdn
