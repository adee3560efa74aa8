// Internal to the golden-file library: what the loader (golden_load.cpp) and
// the runner (golden.cpp) both use. Defined in golden.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "gdnkit/golden.hpp"

namespace gdn {
namespace golden {
namespace internal {

// Out-of-range indices (>= num_slots) in both arrays: what a backend reports.
int64_t count_invalid(const Case& c);

// Stored elements of dtype `t` as doubles.
std::vector<double> widen(const std::vector<uint8_t>& bytes, DType t);

}  // namespace internal
}  // namespace golden
}  // namespace gdn
