// The kernels of state dtype f16, layout kv (one unit per pair: they compile in parallel).
#include "../launch.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {
GDN_INSTANTIATE(fp16, Layout::kKV)
}  // namespace GDN_KERNEL_NS
}  // namespace gdn
