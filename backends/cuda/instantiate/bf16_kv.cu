// The kernels of state dtype bf16, layout kv (one unit per pair: they compile in parallel).
#include "../launch.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {
GDN_INSTANTIATE(bf16, Layout::kKV)
}  // namespace GDN_KERNEL_NS
}  // namespace gdn
