// Shared by the random decode suites against the float64 reference:
// test_decode_random.cpp (every option of the decode step) and
// test_decode_conv_norm.cpp (the conv1d prologue and the gated RMSNorm epilogue).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend_suites.hpp"
#include "random_case.hpp"

namespace gdn_test {

inline constexpr gdn::DType kDtypes[] = {gdn::DType::kF32, gdn::DType::kF16, gdn::DType::kBF16};
inline constexpr gdn::Layout kLayouts[] = {gdn::Layout::kKV, gdn::Layout::kVK};


inline void run_all(const std::vector<CaseSpec>& cases, gdn::Backend backend) {
  for (const CaseSpec& c : cases) {
    run_and_check(c, backend);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Of `rows` rows, how many are padding rows, rows with an out-of-range read
// index and (with a write index array) rows that write nothing or an
// out-of-range slot: at most 2, 1, 2 and 1, drawn in that order.
template <typename Pick>
void draw_special_rows(CaseSpec& c, int64_t rows, Pick& pick) {
  int64_t left = rows;
  auto some = [&](int most) {
    const int k = int(std::min<int64_t>(left, pick(most + 1)));
    left -= k;
    return k;
  };
  c.padding_rows = some(2);
  c.bad_in = some(1);
  if (c.out_indices) {
    c.no_write_rows = some(2);
    c.bad_out = some(1);
  }
}

}  // namespace gdn_test
