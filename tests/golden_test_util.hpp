// Shared by the golden-file library's tests: test_golden_reader.cpp (the
// safetensors reader/writer, load_case, list_cases) and test_golden_run.cpp
// (compare, run_case).
#pragma once

#include <cstdint>
#include <vector>

namespace golden_test_util {

// n floats with a simple deterministic pattern, non-zero.
inline std::vector<float> ramp(int64_t n, float scale = 0.01f, float offset = 0.1f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = offset + scale * float((i * 37) % 23 - 11);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace golden_test_util
