// gdnkit — the fused GatedDeltaNet decode step (one or several tokens a row), C++ API.
//
//   gdn::DecodeParams p;              // sizes, pointers, strides, switches
//   ...                               // see params.hpp
//   gdn::Status st = gdn::decode(p, gdn::Backend::kAuto);
//   if (!st.ok()) fprintf(stderr, "%s\n", st.message);
//
// decode() validates everything checkable on the host, then routes to one
// backend. On failure nothing is written. No allocation, no global mutable
// state on the call path: concurrent calls on separate pools are safe.
#pragma once

#include "gdnkit/params.hpp"
#include "gdnkit/types.hpp"

namespace gdn {

// Check p against every rule of the contract. Does not touch the tensors.
Status validate(const DecodeParams& p);

// The slot rule that needs the index values (host memory only): a slot that
// a row writes (state_out_indices, else state_indices) is read or written by
// no other row of the call. The host backend applies it; on a GPU it is the
// caller's guarantee (docs/operation.md), since checking would need a sync.
Status check_slot_conflicts(const DecodeParams& p);

// Validate, then run the step on `backend` (kAuto: best available).
Status decode(const DecodeParams& p, Backend backend = Backend::kAuto);

// True when `backend` was compiled in.
bool backend_built(Backend backend);

// True when `backend` is built and has a device to run on. `why`, if given,
// receives a one-line reason when it is not.
bool backend_available(Backend backend, char* why = nullptr, size_t why_size = 0);

// What kAuto resolves to on this machine.
Backend resolve_backend(Backend backend);

// Library version string, e.g. "0.1.0".
const char* version();

}  // namespace gdn
