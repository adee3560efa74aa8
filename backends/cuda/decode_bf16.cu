// Instantiations for bf16 state (one file per state dtype keeps builds parallel).
#include "decode_kernel_impl.cuh"

namespace gdn {
namespace cuda {
GDN_INSTANTIATE_DECODE(__nv_bfloat16)
}  // namespace cuda
}  // namespace gdn
