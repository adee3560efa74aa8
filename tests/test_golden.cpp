// The golden cases (tests/golden/*.safetensors, docs/golden-format.md) through
// gdn::golden::run_case on the backend under test: every one must pass.
#include <cstdio>

#include "backend_suites.hpp"
#include "gdnkit/golden.hpp"

#ifndef GDNKIT_GOLDEN_DIR
#error "GDNKIT_GOLDEN_DIR must name the golden case folder"
#endif

namespace gdn_test {
namespace {

std::string report_line(const gdn::golden::CaseReport& r) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "o: rel L2 %.3g (tol %.0e, worst [%lld] got %.6g want %.6g)  "
                "state: rel L2 %.3g (tol %.0e, worst [%lld] got %.6g want %.6g, %lld exact "
                "mismatches)  invalid reported %u",
                r.o.rel_l2, r.o.tolerance, (long long)r.o.worst_index, r.o.worst_got,
                r.o.worst_expected, r.state.rel_l2, r.state.tolerance,
                (long long)r.state.worst_index, r.state.worst_got, r.state.worst_expected,
                (long long)r.state.exact_mismatches, r.invalid_reported);
  return buf;
}

TEST_P(GoldenTest, EveryCasePasses) {
  const std::vector<std::string> paths = gdn::golden::list_cases(GDNKIT_GOLDEN_DIR);
  ASSERT_FALSE(paths.empty()) << "no *.safetensors cases under " << GDNKIT_GOLDEN_DIR;
  int passed = 0;
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    gdn::golden::Case c;
    std::string error;
    ASSERT_TRUE(gdn::golden::load_case(path, &c, &error)) << error;
    const gdn::golden::CaseReport r = gdn::golden::run_case(c, backend());
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_TRUE(r.pass) << report_line(r) << (r.notes.empty() ? "" : "  [" + r.notes + "]");
    if (c.expected_invalid_indices >= 0) {
      EXPECT_EQ(int64_t(r.invalid_reported), c.expected_invalid_indices)
          << "out-of-range indices reported";
    }
    if (r.pass) ++passed;
    std::printf("  %s %s\n", r.pass ? "pass" : "FAIL", path.c_str());
  }
  std::printf("  %d of %zu golden cases pass on %s\n", passed, paths.size(), gdn::to_string(backend()));
}

}  // namespace
}  // namespace gdn_test
