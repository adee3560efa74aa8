// The kernels of state dtype f32, layout kv (one unit per pair: they compile in parallel).
#include "../launch.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {
GDN_INSTANTIATE(float, Layout::kKV)
}  // namespace GDN_KERNEL_NS
}  // namespace gdn
