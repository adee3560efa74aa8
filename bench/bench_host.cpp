// Host reference speed, one GDN layer call at the Qwen3.5-35B-A3B shape
// (Hk 16, Hv 32, 128x128) over batch sizes. The host backend is the
// correctness reference (double accumulation, runtime dtype dispatch), so
// this measures how long checks against it take, not a serving speed.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "gdnkit/gdnkit.hpp"
#include "gdnkit/half.hpp"

namespace {

void BM_HostDecode(benchmark::State& st) {
  const int64_t B = st.range(0);
  const gdn::DType state_dtype = st.range(1) ? gdn::DType::kBF16 : gdn::DType::kF32;
  const int Hk = 16, Hv = 32, D = 128;
  const int64_t conv_dim = 2 * Hk * D + Hv * D;

  std::mt19937_64 rng(7);
  std::normal_distribution<float> n01(0.f, 1.f);
  auto fill = [&](std::vector<uint16_t>& x, float sd) {
    for (auto& e : x) e = gdn::float_to_bf16(sd * n01(rng));
  };
  std::vector<uint16_t> qkv(B * conv_dim), a(B * Hv), b(B * Hv), o(B * Hv * D);
  fill(qkv, 1.f);
  fill(a, 1.f);
  fill(b, 1.f);
  std::vector<float> A_log(Hv, 1.0f), dt_bias(Hv, -3.0f);
  std::vector<uint8_t> state(B * Hv * D * D * gdn::dtype_size(state_dtype));
  for (int64_t i = 0; i < B * Hv * D * D; ++i)
    gdn::store_element(state.data(), state_dtype, i, 0.5 * n01(rng));

  gdn::DecodeParams p;
  p.batch = B;
  p.num_k_heads = Hk;
  p.num_v_heads = Hv;
  p.head_dim_k = p.head_dim_v = D;
  p.state_dtype = state_dtype;
  p.num_slots = B;
  gdn::set_dense_strides(p);
  gdn::set_packed_qkv(p, qkv.data(), conv_dim);
  p.a = a.data();
  p.b = b.data();
  p.A_log = A_log.data();
  p.dt_bias = dt_bias.data();
  p.state = state.data();
  p.o = o.data();

  for (auto _ : st) {
    const gdn::Status s = gdn::decode(p, gdn::Backend::kHost);
    if (!s.ok()) st.SkipWithError(s.message);
    benchmark::DoNotOptimize(o.data());
  }
  // Each call reads and writes the state once.
  st.SetBytesProcessed(int64_t(st.iterations()) * 2 * int64_t(state.size()));
}

BENCHMARK(BM_HostDecode)->ArgsProduct({{1, 8}, {0, 1}})->ArgNames({"B", "bf16_state"})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
