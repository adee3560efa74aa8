// gdnkit tests — the shared suites, and the one macro a backend's test file uses.
//
// Every test is written once, as a TEST_P on one of these fixtures, and runs
// on each backend that instantiates them. A backend's file is two lines:
//
//   #include "backend_suites.hpp"
//   GDN_INSTANTIATE_BACKEND_SUITES(Cuda, gdn::Backend::kCuda)
#pragma once

#include <string>

#include "test_util.hpp"

namespace gdn_test {

class DecodeTest : public BackendTest {};       // random cases vs the float64 reference
class DriftTest : public BackendTest {};        // 1,000 chained steps on one state
class ValidationTest : public BackendTest {};   // one test per rule of validate()
class ValidateFuzzTest : public BackendTest {};  // random parameter sets through validate()
class ConcurrencyTest : public BackendTest {};  // concurrent calls from 8 threads
class RoutingTest : public BackendTest {};      // backend selection and unbuilt backends
class GoldenTest : public BackendTest {};       // the committed golden cases
class MultiTokenTest : public BackendTest {};   // T tokens a row against T one-token calls
class DoubleBufferTest : public BackendTest {};  // two slots a sequence against in place

inline std::string backend_param_name(const ::testing::TestParamInfo<gdn::Backend>& info) {
  return gdn::to_string(info.param);
}

}  // namespace gdn_test

#if GDNKIT_TESTS_HAVE_GOLDEN
#define GDN_INSTANTIATE_GOLDEN_SUITE_(prefix, backend)                                    \
  INSTANTIATE_TEST_SUITE_P(prefix, GoldenTest, ::testing::Values(backend), \
                           ::gdn_test::backend_param_name);
#else
#define GDN_INSTANTIATE_GOLDEN_SUITE_(prefix, backend)
#endif

#define GDN_INSTANTIATE_BACKEND_SUITES(prefix, backend)                                         \
  namespace gdn_test {                                                                          \
  INSTANTIATE_TEST_SUITE_P(prefix, DecodeTest, ::testing::Values(backend), backend_param_name);  \
  INSTANTIATE_TEST_SUITE_P(prefix, DriftTest, ::testing::Values(backend), backend_param_name);   \
  INSTANTIATE_TEST_SUITE_P(prefix, ValidationTest, ::testing::Values(backend),                  \
                           backend_param_name);                                                 \
  INSTANTIATE_TEST_SUITE_P(prefix, ValidateFuzzTest, ::testing::Values(backend),                \
                           backend_param_name);                                                 \
  INSTANTIATE_TEST_SUITE_P(prefix, ConcurrencyTest, ::testing::Values(backend),                 \
                           backend_param_name);                                                 \
  INSTANTIATE_TEST_SUITE_P(prefix, RoutingTest, ::testing::Values(backend), backend_param_name); \
  INSTANTIATE_TEST_SUITE_P(prefix, MultiTokenTest, ::testing::Values(backend),                  \
                           backend_param_name);                                                 \
  INSTANTIATE_TEST_SUITE_P(prefix, DoubleBufferTest, ::testing::Values(backend),                \
                           backend_param_name);                                                 \
  GDN_INSTANTIATE_GOLDEN_SUITE_(prefix, backend)                                                \
  }
