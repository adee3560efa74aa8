// Division by a launch constant without an integer divide.
#pragma once

#include <cstdint>
#include "../vendors/vendor.h"

namespace gdn {
namespace GDN_KERNEL_NS {

// n / d for 0 <= n < 2^31 by a multiply-high and a shift (Granlund and
// Montgomery; CUTLASS's FastDivmod): with l = ceil(log2 d), m = ceil(2^(31+l) / d),
// n / d = umulhi(n, m) >> (l - 1) for d >= 2. m and the shift are prepared
// once on the host, so the block coordinates every state load waits on take
// no integer division (docs/decisions.md#fastdiv).
struct FastDiv {
  unsigned d{1}, m{0}, shift{0};
  FastDiv() = default;
  __host__ explicit FastDiv(unsigned divisor) : d(divisor) {
    if (d < 2) return;  // d == 1: the quotient is n itself
    unsigned l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    m = unsigned(((uint64_t(1) << (31 + l)) + d - 1) / d);
    shift = l - 1;
  }
  __device__ __forceinline__ unsigned div(unsigned n) const { return d == 1 ? n : __umulhi(n, m) >> shift; }
};

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
