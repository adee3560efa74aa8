// Instantiations for f16 state (one file per state dtype keeps builds parallel).
#include "decode_kernel_impl.cuh"

namespace gdn {
namespace cuda {
GDN_INSTANTIATE_DECODE(__half)
}  // namespace cuda
}  // namespace gdn
