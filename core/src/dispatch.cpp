// The one routing point: backend enum -> the backend's table.
#include <cstdio>

#include "gdnkit/backend.hpp"
#include "gdnkit/gdnkit.hpp"

namespace gdn {

// Each backend folder defines one of these (and is compiled in only when built).
const BackendOps* host_backend();
#if GDNKIT_WITH_CUDA
const BackendOps* cuda_backend();
#endif
#if GDNKIT_WITH_HIP
const BackendOps* hip_backend();
#endif

const BackendOps* backend_ops(Backend backend) {
  switch (backend) {
    case Backend::kHost: return host_backend();
#if GDNKIT_WITH_CUDA
    case Backend::kCuda: return cuda_backend();
#endif
#if GDNKIT_WITH_HIP
    case Backend::kHip: return hip_backend();
#endif
    default: return nullptr;
  }
}

bool backend_built(Backend backend) {
  return backend_ops(resolve_backend(backend)) != nullptr;
}

bool backend_available(Backend backend, char* why, size_t why_size) {
  const BackendOps* ops = backend_ops(backend == Backend::kAuto ? resolve_backend(backend) : backend);
  if (ops == nullptr) {
    if (why && why_size) std::snprintf(why, why_size, "%s: not built into this gdnkit", to_string(backend));
    return false;
  }
  return ops->available(why, why_size);
}

Backend resolve_backend(Backend backend) {
  if (backend != Backend::kAuto) return backend;
  // Best first: a GPU when one is present, else the host reference.
  const Backend gpus[] = {Backend::kCuda, Backend::kHip};
  for (Backend b : gpus) {
    const BackendOps* ops = backend_ops(b);
    if (ops != nullptr && ops->available(nullptr, 0)) return b;
  }
  return Backend::kHost;
}

Status decode(const DecodeParams& p, Backend backend) {
  if (backend != Backend::kAuto && backend != Backend::kHost && backend != Backend::kCuda &&
      backend != Backend::kHip)
    return make_status(StatusCode::kInvalidArgument, "backend: unknown value %d", int(backend));
  Status st = validate(p);
  if (!st.ok()) return st;
  const Backend resolved = resolve_backend(backend);
  const BackendOps* ops = backend_ops(resolved);
  if (ops == nullptr)
    return make_status(StatusCode::kBackendNotBuilt,
                       "backend %s: not built into this gdnkit (reconfigure with "
                       "-DGDNKIT_ENABLE_%s=ON where its compiler is installed)",
                       to_string(resolved), resolved == Backend::kCuda ? "CUDA" : "HIP");
  char why[160] = {};
  if (!ops->available(why, sizeof why))
    return make_status(StatusCode::kNoDevice, "backend %s: %s", ops->name, why);
  if (ops->can_implement != nullptr) {
    st = ops->can_implement(p);
    if (!st.ok()) return st;
  }
  if (p.batch == 0) return Status::success();
  return ops->decode(p);
}

}  // namespace gdn
