// Drift: 1,000 consecutive steps on one fp32 state, against the float64
// reference run alongside with its own float64 state (docs/operation.md, Numerics: within 1e-4).
#include <cmath>
#include <cstdio>

#include "backend_suites.hpp"
#include "random_case.hpp"

namespace gdn_test {
namespace {

double norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

void run_drift(gdn::Backend backend, gdn::Layout layout, gdn::DType qkv, uint64_t seed) {
  constexpr int kSteps = 1000;
  constexpr double kDriftTol = 1e-4;
  CaseSpec spec;
  spec.name = "drift";
  spec.seed = seed;
  spec.batch = 1;
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 128;
  spec.dv = 128;
  spec.qkv = qkv;
  spec.ab = qkv;
  spec.state = gdn::DType::kF32;
  spec.out = gdn::DType::kF32;
  spec.layout = layout;
  SCOPED_TRACE(describe(spec));

  HostCase hc = make_case(spec);
  DeviceCase dc(hc, backend);
  std::vector<double> ref_pool = hc.pool;  // the reference's own float64 state
  const double start_norm = norm(ref_pool);
  RefResult R;
  std::vector<uint8_t> o_bytes;
  for (int step = 0; step < kSteps; ++step) {
    if (step > 0) {
      redraw_inputs(hc, seed * 7919 + uint64_t(step));
      dc.upload_inputs(hc);
    }
    const gdn::Status st = dc.run();
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.message;
    R = reference_step(hc.ref, ref_pool);
    ref_pool = R.pool;
    if (step == kSteps - 1) o_bytes = dc.o.download();
  }
  // the gates keep the state alive: neither vanished nor exploded
  const double end_norm = norm(ref_pool);
  EXPECT_GT(end_norm, 1e-2 * start_norm);
  EXPECT_LT(end_norm, 1e2 * start_norm);

  const std::vector<double> got_pool = widen_pool(hc, dc.state.download());
  std::printf("  drift over %d steps (%s, qkv %s): state rel L2 %.3g, |S| %.3g -> %.3g\n", kSteps,
              gdn::to_string(layout), gdn::to_string(qkv), rel_l2(got_pool, ref_pool), start_norm,
              end_norm);
  EXPECT_TRUE(expect_close("state after 1000 steps", got_pool, ref_pool, kDriftTol));

  std::vector<double> got_o;
  for (int64_t h = 0; h < spec.hv; ++h)
    for (int64_t j = 0; j < spec.dv; ++j)
      got_o.push_back(gdn::load_element(o_bytes.data(), spec.out, hc.o_offset(0, h, j)));
  EXPECT_TRUE(expect_close("output of step 1000", got_o, R.o, kDriftTol));
}

TEST_P(DriftTest, ThousandStepsKV) {
  run_drift(backend(), gdn::Layout::kKV, gdn::DType::kBF16, 31);
}

TEST_P(DriftTest, ThousandStepsVK) {
  run_drift(backend(), gdn::Layout::kVK, gdn::DType::kF32, 37);
}

}  // namespace
}  // namespace gdn_test
