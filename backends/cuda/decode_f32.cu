// Instantiations for f32 state (one file per state dtype keeps builds parallel).
#include "decode_kernel_impl.cuh"

namespace gdn {
namespace cuda {
GDN_INSTANTIATE_DECODE(float)
}  // namespace cuda
}  // namespace gdn
