// The kernels of state dtype f32, layout vk (one unit per pair: they compile in parallel).
#include "../launch.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {
GDN_INSTANTIATE(float, Layout::kVK)
}  // namespace GDN_KERNEL_NS
}  // namespace gdn
