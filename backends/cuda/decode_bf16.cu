// The kernels for one state dtype (one file each, so they compile in parallel).
#include "decode_kernel_impl.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {
GDN_INSTANTIATE_DECODE(bf16)
}  // namespace GDN_KERNEL_NS
}  // namespace gdn
