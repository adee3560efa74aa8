// Concurrency: 8 threads call decode() at once, each on its own pool and
// inputs (stream nullptr), many chained steps each; every result is checked
// against the reference afterwards, on the main thread.
#include <exception>
#include <string>
#include <thread>

#include "backend_suites.hpp"
#include "random_case.hpp"

namespace gdn_test {
namespace {

struct ThreadRun {
  CaseSpec spec;
  std::vector<std::vector<uint8_t>> o_per_step;
  std::vector<uint8_t> final_state;
  std::vector<uint32_t> counters;
  std::string error;  // infrastructure or status failure inside the thread
};

constexpr int kThreads = 8;
constexpr int kSteps = 24;

uint64_t step_seed(const CaseSpec& s, int step) { return s.seed * 1000003 + uint64_t(step); }

TEST_P(ConcurrencyTest, EightThreadsSeparatePools) {
  std::vector<ThreadRun> runs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    CaseSpec& c = runs[size_t(t)].spec;
    c.name = "thread " + std::to_string(t);
    c.seed = 9000 + uint64_t(t);
    c.batch = 3 + t % 3;
    c.hk = 1 + t % 2;
    c.hv = 2 * c.hk;
    c.dk = 64;
    c.dv = t % 4 == 3 ? 128 : 64;
    c.qkv = t % 3 == 0 ? gdn::DType::kF32 : (t % 3 == 1 ? gdn::DType::kBF16 : gdn::DType::kF16);
    c.state = gdn::DType::kF32;  // chained steps: keep within the fp32 bound
    c.out = t % 2 ? gdn::DType::kF32 : gdn::DType::kBF16;
    c.layout = t % 2 ? gdn::Layout::kKV : gdn::Layout::kVK;
    c.gate = t % 4 == 1 ? gdn::Gate::kPrecomputed : gdn::Gate::kRaw;
    c.index = t % 3 == 2 ? gdn::IndexType::kI32 : gdn::IndexType::kNone;
    c.shuffle_slots = true;
    c.padding_rows = c.index != gdn::IndexType::kNone ? 1 : 0;
    c.extra_slots = 1;
  }

  const gdn::Backend be = backend();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&runs, t, be] {
      ThreadRun& run = runs[size_t(t)];
      try {
        HostCase hc = make_case(run.spec);
        DeviceCase dc(hc, be);
        for (int step = 0; step < kSteps; ++step) {
          if (step > 0) {
            redraw_inputs(hc, step_seed(run.spec, step));
            dc.upload_inputs(hc);
          }
          const gdn::Status st = dc.run();
          if (!st.ok()) {
            run.error = "step " + std::to_string(step) + ": " + st.message;
            return;
          }
          run.o_per_step.push_back(dc.o.download());
        }
        run.final_state = dc.state.download();
        const std::vector<uint8_t> c = dc.counter.download();
        uint32_t n = 0;
        std::memcpy(&n, c.data(), 4);
        run.counters.push_back(n);
      } catch (const std::exception& e) {
        run.error = e.what();
      }
    });
  }
  for (std::thread& th : threads) th.join();

  for (ThreadRun& run : runs) {
    SCOPED_TRACE(describe(run.spec));
    ASSERT_TRUE(run.error.empty()) << run.error;
    ASSERT_EQ(run.o_per_step.size(), size_t(kSteps));
    HostCase hc = make_case(run.spec);
    std::vector<double> pool = hc.pool;
    for (int step = 0; step < kSteps; ++step) {
      if (step > 0) redraw_inputs(hc, step_seed(run.spec, step));
      const RefResult R = reference_step(hc.ref, pool);
      pool = R.pool;
      std::vector<double> got;
      for (int64_t row = 0; row < hc.ref.B; ++row)
        for (int64_t h = 0; h < hc.ref.Hv; ++h)
          for (int64_t j = 0; j < hc.ref.Dv; ++j)
            got.push_back(gdn::load_element(run.o_per_step[size_t(step)].data(), run.spec.out,
                                            hc.o_offset(row, h, j)));
      EXPECT_TRUE(expect_close("output of step " + std::to_string(step), got, R.o,
                               output_tol(run.spec.out)));
    }
    EXPECT_TRUE(expect_close("state after " + std::to_string(kSteps) + " steps",
                             widen_pool(hc, run.final_state), pool, state_tol(run.spec.state)));
    EXPECT_EQ(run.counters.at(0), 0u);
  }
}

}  // namespace
}  // namespace gdn_test
