// Backend routing: the backend under test resolves to itself; a backend not
// built (or without a device) refuses the call and writes nothing; kAuto
// resolves to a usable backend and produces correct results.
#include <cstdio>

#include "backend_suites.hpp"
#include "random_case.hpp"

namespace gdn_test {
namespace {

CaseSpec small_case(const char* name) {
  CaseSpec c;
  c.name = name;
  c.seed = 4242;
  c.batch = 3;
  c.hk = 1;
  c.hv = 2;
  c.dk = 64;
  c.dv = 128;
  c.out = gdn::DType::kF32;
  return c;
}

TEST_P(RoutingTest, BackendUnderTestResolvesToItself) {
  EXPECT_TRUE(gdn::backend_built(backend()));
  EXPECT_EQ(gdn::resolve_backend(backend()), backend());
  ASSERT_NE(gdn::backend_ops(backend()), nullptr);
  EXPECT_EQ(gdn::backend_ops(backend())->id, backend());
  char desc[512] = {};
  gdn::backend_ops(backend())->describe(desc, sizeof desc);
  std::printf("  %s\n", desc);
}

TEST_P(RoutingTest, UnavailableBackendsRefuseAndWriteNothing) {
  int checked = 0;
  for (gdn::Backend other : {gdn::Backend::kHost, gdn::Backend::kCuda, gdn::Backend::kHip}) {
    char why[256] = {};
    if (gdn::backend_available(other, why, sizeof why)) continue;
    SCOPED_TRACE(gdn::to_string(other));
    ++checked;
    EXPECT_TRUE(contains(why, gdn::to_string(other)) || gdn::backend_built(other))
        << "reason \"" << why << "\" does not name the backend";
    // the tensors live on the backend under test; the call names another
    HostCase hc = make_case(small_case("unavailable backend"));
    DeviceCase dc(hc, backend());
    const gdn::Status st = gdn::decode(dc.p, other);
    const gdn::StatusCode want = gdn::backend_built(other) ? gdn::StatusCode::kNoDevice
                                                           : gdn::StatusCode::kBackendNotBuilt;
    EXPECT_EQ(st.code, want) << st.message;
    EXPECT_TRUE(contains(st.message, gdn::to_string(other))) << st.message;
    if (!gdn::backend_built(other)) {
      EXPECT_TRUE(contains(st.message, "not built")) << st.message;
    }
    EXPECT_TRUE(dc.o.download() == std::vector<uint8_t>(hc.o_bytes, kCanary)) << "o was written";
    EXPECT_TRUE(dc.state.download() == hc.state) << "the pool was written";
    EXPECT_EQ(gdn::backend_ops(other) != nullptr, gdn::backend_built(other));
  }
  std::printf("  %d backends unavailable here, each refused\n", checked);
}

TEST_P(RoutingTest, AutoResolvesAndRuns) {
  const gdn::Backend resolved = gdn::resolve_backend(gdn::Backend::kAuto);
  ASSERT_NE(resolved, gdn::Backend::kAuto);
  ASSERT_TRUE(gdn::backend_built(resolved));
  ASSERT_TRUE(gdn::backend_available(resolved));
  EXPECT_TRUE(gdn::backend_available(gdn::Backend::kAuto));
  std::printf("  kAuto -> %s\n", gdn::to_string(resolved));

  const CaseSpec spec = small_case("kAuto");
  SCOPED_TRACE(describe(spec));
  HostCase hc = make_case(spec);
  DeviceCase dc(hc, resolved);  // memory where kAuto will run
  const gdn::Status st = gdn::decode(dc.p, gdn::Backend::kAuto);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_TRUE(gdn::backend_ops(resolved)->synchronize(nullptr).ok());
  uint32_t counter = 0;
  std::memcpy(&counter, dc.counter.download().data(), 4);
  check_step(hc, reference_step(hc.ref, hc.pool), dc.o.download(), hc.state, dc.state.download(),
             counter);
}

}  // namespace
}  // namespace gdn_test
