// gdnkit tests — what only the CUDA backend has to prove: CUDA graph capture,
// programmatic launch, the fused middle at large B, every GPU of a process, a
// pool beyond 2^32 elements, and alignment handling at the API. Skips cleanly
// without a GPU (CI), like the shared suites.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../backends/cuda/device.h"
#include "late_writer.hpp"
#include "random_case.hpp"

namespace gdn_test {
namespace {

class CudaOnly : public ::testing::Test {
 protected:
  void SetUp() override {
    char why[256] = {};
    if (!gdn::backend_available(gdn::Backend::kCuda, why, sizeof why))
      GTEST_SKIP() << "backend cuda not available: " << why;
  }
};

// decode() enqueues work and nothing else: it must record into a graph, and
// the replayed graph must compute the step.
TEST_F(CudaOnly, GraphCaptureAndReplay) {
  for (gdn::Layout layout : {gdn::Layout::kKV, gdn::Layout::kVK}) {
    CaseSpec spec;
    spec.name = "graph";
    spec.seed = 11;
    spec.batch = 5;
    spec.hk = 2;
    spec.hv = 4;
    spec.dk = spec.dv = 128;
    spec.layout = layout;
    spec.index = gdn::IndexType::kI32;
    spec.padding_rows = 1;
    spec.extra_slots = 3;
    spec.shuffle_slots = true;
    const HostCase hc = make_case(spec);
    DeviceCase dc(hc, gdn::Backend::kCuda);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    dc.p.stream = stream;

    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const gdn::Status st = gdn::decode(dc.p, gdn::Backend::kCuda);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(st.ok()) << st.message;
    // Nothing ran during capture: the pool is still the initial one.
    EXPECT_TRUE(dc.state.download() == hc.state) << "decode() ran work during stream capture";

    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    uint32_t counter = 0;
    std::memcpy(&counter, dc.counter.download().data(), 4);
    const RefResult R = reference_step(hc.ref, hc.pool);
    check_step(hc, R, dc.o.download(), hc.state, dc.state.download(), counter);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// The programmatic-launch tests' case: Hk 2, Hv 4, 128 x 128, the fused
// middle (conv W = 4 with bias + gated RMSNorm) or the step alone.
CaseSpec pdl_case(const char* name, uint64_t seed, bool fused, int64_t batch, gdn::Layout layout) {
  CaseSpec spec;
  spec.name = name;
  spec.seed = seed;
  spec.batch = batch;
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = spec.dv = 128;
  spec.layout = layout;
  spec.conv_width = fused ? 4 : 0;
  spec.conv_bias = fused;
  spec.norm = fused;
  return spec;
}

// The fused middle (conv prologue + gated RMSNorm) and the step alone,
// launched programmatically (PDL) behind another kernel in a captured graph,
// at B = 1 (the fused group split over a cluster of blocks on sm_90) and
// B = 40 (one block a group): against the reference, and bitwise against the
// same call launched eagerly (PDL only changes when the kernel may start).
// Their grids fit the GPU at once, so they run with the padded shared memory
// of spread_smem.
TEST_F(CudaOnly, ProgrammaticLaunchInAGraph) {
  for (bool fused : {true, false})
    for (int64_t batch : {1, 40})
      for (gdn::Layout layout : {gdn::Layout::kKV, gdn::Layout::kVK}) {
        SCOPED_TRACE(std::string(fused ? "fused middle" : "step") + ", B = " + std::to_string(batch) +
                     (layout == gdn::Layout::kKV ? ", kv" : ", vk"));
        const HostCase hc = make_case(pdl_case("pdl", 23 + uint64_t(batch) + (fused ? 0 : 100), fused, batch, layout));
        DeviceCase eager(hc, gdn::Backend::kCuda), pdl(hc, gdn::Backend::kCuda);
        ASSERT_TRUE(eager.run().ok());

        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        pdl.p.stream = stream;
        pdl.p.programmatic_launch = true;
        // An upstream kernel for the programmatic edge to follow: a step on
        // pools of its own.
        CaseSpec up_spec;
        up_spec.name = "upstream";
        up_spec.seed = 99;
        up_spec.batch = 64;
        up_spec.hk = 4;
        up_spec.hv = 8;
        up_spec.dk = up_spec.dv = 128;
        DeviceCase up(make_case(up_spec), gdn::Backend::kCuda);
        up.p.stream = stream;
        cudaGraph_t graph;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        ASSERT_TRUE(gdn::decode(up.p, gdn::Backend::kCuda).ok());
        const gdn::Status st = gdn::decode(pdl.p, gdn::Backend::kCuda);
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        ASSERT_TRUE(st.ok()) << st.message;
        cudaGraphExec_t exec;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

        check_device_case(hc, pdl);
        EXPECT_TRUE(pdl.o.download() == eager.o.download()) << "B=" << batch << ": output differs from the eager call";
        EXPECT_TRUE(pdl.state.download() == eager.state.download()) << "B=" << batch << ": state differs";
        if (fused) {
          EXPECT_TRUE(pdl.conv_state.download() == eager.conv_state.download())
              << "B=" << batch << ": conv state differs";
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(stream);
      }
}

// A programmatic launch reads what the previous kernel writes (x, z, a, b
// with the conv and the norm; q, k, v, a, b without the conv) only after its
// wait: behind a kernel that lets it start at once and writes those inputs
// 100 us later, over the NaN poison left in them, the call must still match
// the reference. The other inputs are in place from the start (the pools and
// the index arrays the caller promises the previous kernel leaves alone:
// DecodeParams; the fused kernels' programmatic twin loads the conv pool and
// weights before its wait). B = 1 (a cluster a group on sm_90) and B = 40
// (one block a group), both layouts, through a pool (with a padding row at
// B = 40):
// - the fused middle (conv W = 4 + norm) and the step alone, fp32 and bf16
//   state, bf16 inputs; the step dense too (vk: the one-wave kernel's
//   programmatic twin at B = 1 for both states, at B = 40 for bf16, which
//   it also takes through the pool);
// - bf16 state: the conv alone (W = 2) with fp16 inputs; the norm alone;
//   the fused middle with rows 3 elements apart (not 16-byte aligned: the
//   prologue's channel-by-channel form) and a tap-major conv pool.
TEST_F(CudaOnly, ProgrammaticLaunchReadsTheUpstreamsOutputsAfterItsWait) {
  auto late_inputs_case = [](const CaseSpec& spec) {
    const HostCase hc = make_case(spec);
    DeviceCase dc(hc, gdn::Backend::kCuda);

    // The previous kernel's outputs: their values staged apart, the
    // buffers the call reads poisoned until the writer fills them.
    std::vector<std::pair<const std::vector<uint8_t>*, DeviceBuffer*>> late;
    if (spec.conv_width > 0) {
      late = {{&hc.x, &dc.x}};
    } else {
      late = {{&hc.q, &dc.q}, {&hc.k, &dc.k}, {&hc.v, &dc.v}};
    }
    if (spec.norm) late.push_back({&hc.z, &dc.z});
    late.push_back({&hc.a, &dc.a});
    late.push_back({&hc.b, &dc.b});
    ASSERT_LE(late.size(), size_t(kMaxLateCopies));
    std::vector<DeviceBuffer> staged;
    staged.reserve(late.size());
    LateCopies copies;
    for (const auto& [bytes, buffer] : late) {
      staged.emplace_back(gdn::Backend::kCuda, *bytes);
      buffer->upload(std::vector<uint8_t>(bytes->size(), kCanary));
      copies.copy[copies.count++] = LateCopy{staged.back().get(), buffer->get(), bytes->size()};
    }

    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    dc.p.stream = stream;
    dc.p.programmatic_launch = true;
    ASSERT_EQ(launch_late_writer(copies, 100, stream), cudaSuccess);
    const gdn::Status st = gdn::decode(dc.p, gdn::Backend::kCuda);
    ASSERT_TRUE(st.ok()) << st.message;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);

    check_device_case(hc, dc);
  };
  auto in_a_pool = [](CaseSpec spec) {
    spec.index = gdn::IndexType::kI32;
    spec.padding_rows = spec.batch > 1 ? 1 : 0;
    spec.extra_slots = 2;
    return spec;
  };
  for (int64_t batch : {1, 40})
    for (gdn::Layout layout : {gdn::Layout::kKV, gdn::Layout::kVK}) {
      const std::string where =
          ", B = " + std::to_string(batch) + (layout == gdn::Layout::kKV ? ", kv, " : ", vk, ");
      for (bool fused : {true, false})
        for (gdn::DType state : {gdn::DType::kF32, gdn::DType::kBF16}) {
          SCOPED_TRACE(std::string(fused ? "fused middle" : "step") + where + gdn::to_string(state));
          CaseSpec spec = pdl_case("pdl late inputs", 31 + uint64_t(batch) + (fused ? 0 : 100), fused, batch, layout);
          spec.state = state;
          late_inputs_case(in_a_pool(spec));
          if (!fused) {
            SCOPED_TRACE("dense");
            late_inputs_case(spec);
          }
        }
      const uint64_t seed = 61 + uint64_t(batch);
      CaseSpec base = pdl_case("pdl late inputs", seed, true, batch, layout);
      base.state = gdn::DType::kBF16;
      {
        SCOPED_TRACE("conv alone, W = 2, fp16 inputs" + where + "bf16");
        CaseSpec spec = base;
        spec.norm = false;
        spec.conv_width = 2;
        spec.qkv = spec.ab = spec.out = gdn::DType::kF16;
        late_inputs_case(in_a_pool(spec));
      }
      {
        SCOPED_TRACE("norm alone" + where + "bf16");
        CaseSpec spec = base;
        spec.conv_width = 0;
        spec.conv_bias = false;
        late_inputs_case(in_a_pool(spec));
      }
      {
        SCOPED_TRACE("fused middle, unaligned rows, tap-major conv pool" + where + "bf16");
        CaseSpec spec = base;
        spec.pad_batch = 3;
        spec.conv_tap_major = true;
        late_inputs_case(in_a_pool(spec));
      }
    }
}

// The fused middle with more groups (row, k-head) than SMs, where a group is
// one block streaming all its G heads' tiles (kv) or 8 warps streaming 8 or
// 4 items each (vk), the geometry the shared suites' small batches never
// reach (they split groups over clusters on sm_90). Checked against the
// reference.
TEST_F(CudaOnly, FusedMiddleWithMoreGroupsThanSms) {
  for (gdn::DType state : {gdn::DType::kF32, gdn::DType::kBF16})
    for (gdn::Layout layout : {gdn::Layout::kKV, gdn::Layout::kVK}) {
      CaseSpec spec;
      spec.name = std::string("fused, 320 groups, ") + gdn::to_string(state) + " " + gdn::to_string(layout);
      spec.seed = 51;
      spec.batch = 160;
      spec.hk = 2;
      spec.hv = 4;
      spec.dk = spec.dv = 128;
      spec.state = state;
      spec.layout = layout;
      spec.conv_width = 4;
      spec.conv_bias = true;
      spec.norm = true;
      SCOPED_TRACE(spec.name);
      run_and_check(spec, gdn::Backend::kCuda);
    }
}

// The inputs of a multi-token call of B rows of T tokens (Hk k-heads, Hv
// v-heads of D x D; q/k/v/a/b in bf16, realistic gates) on the GPU, drawn from
// seed; params() is the dense call over a pool of num_slots slots.
struct TokenCall {
  static constexpr gdn::DType kIo = gdn::DType::kBF16;
  int64_t B, T, Hk, Hv, D;
  std::mt19937_64 rng;
  DeviceBuffer q, k, v, a, b, A_log, dt_bias;

  TokenCall(int64_t B_, int64_t T_, int64_t Hk_, int64_t Hv_, int64_t D_, uint64_t seed)
      : B(B_), T(T_), Hk(Hk_), Hv(Hv_), D(D_), rng(seed) {
    const gdn::Backend be = gdn::Backend::kCuda;
    q = DeviceBuffer(be, draw(B * T * Hk * D, kIo, 1.0));
    k = DeviceBuffer(be, draw(B * T * Hk * D, kIo, 1.0));
    v = DeviceBuffer(be, draw(B * T * Hv * D, kIo, 1.0));
    a = DeviceBuffer(be, draw(B * T * Hv, kIo, 1.0));
    b = DeviceBuffer(be, draw(B * T * Hv, kIo, 1.0));
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    std::vector<float> A, dt;
    for (int64_t h = 0; h < Hv; ++h) {
      // A = U(1, 16); dt log-uniform in [1e-3, 0.1]; dt_bias = softplus^-1(dt)
      A.push_back(float(std::log(1.0 + 15.0 * u01(rng))));
      dt.push_back(float(std::log(std::expm1(std::exp(std::log(1e-3) + std::log(100.0) * u01(rng))))));
    }
    A_log = DeviceBuffer(be, bytes(A));
    dt_bias = DeviceBuffer(be, bytes(dt));
  }
  // n values of N(0, sd^2) in dtype t
  std::vector<uint8_t> draw(int64_t n, gdn::DType t, double sd) {
    std::normal_distribution<double> n01(0.0, 1.0);
    std::vector<uint8_t> out(size_t(n) * gdn::dtype_size(t));
    for (int64_t i = 0; i < n; ++i) gdn::store_element(out.data(), t, i, sd * n01(rng));
    return out;
  }
  template <typename E>
  static std::vector<uint8_t> bytes(const std::vector<E>& x) {
    std::vector<uint8_t> out(x.size() * sizeof(E));
    std::memcpy(out.data(), x.data(), out.size());
    return out;
  }
  int64_t slot() const { return Hv * D * D; }
  // an output buffer of every token, filled with the canary
  DeviceBuffer output() const {
    return DeviceBuffer(gdn::Backend::kCuda, std::vector<uint8_t>(size_t(B * T * Hv * D) * gdn::dtype_size(kIo), kCanary));
  }
  gdn::DecodeParams params(DeviceBuffer& pool, int64_t num_slots, DeviceBuffer& o, gdn::DType state,
                           gdn::Layout layout) const {
    gdn::DecodeParams p;
    p.batch = B;
    p.num_tokens = int32_t(T);
    p.num_k_heads = int32_t(Hk);
    p.num_v_heads = int32_t(Hv);
    p.head_dim_k = p.head_dim_v = int32_t(D);
    p.qkv_dtype = p.ab_dtype = p.o_dtype = kIo;
    p.state_dtype = state;
    p.layout = layout;
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.a = a.get();
    p.b = b.get();
    p.A_log = A_log.as<float>();
    p.dt_bias = dt_bias.as<float>();
    p.state = pool.get();
    p.num_slots = num_slots;
    p.o = o.get();
    gdn::set_dense_strides(p);
    return p;
  }
};

// Multi-token blocks of several rounds (docs/decisions.md#token-kernel): 160
// groups, more than the SMs, so the planner gives a block the whole group;
// forced through every geometry the planner may pick (rounds a block, the
// state's ring on or off, 2 or 3 stages) the one call of T tokens equals T
// one-token calls chained in place bitwise (outputs, final state, and every
// intermediate state), for both layouts and fp32 and bf16 states.
TEST_F(CudaOnly, TokenBlocksOfSeveralRoundsEqualChainedCalls) {
  constexpr int64_t B = 80, T = 3, Hv = 4, D = 128;
  TokenCall in(B, T, 2, Hv, D, 71);
  const gdn::DType io = TokenCall::kIo;
  const gdn::Backend be = gdn::Backend::kCuda;
  for (gdn::DType sd : {gdn::DType::kF32, gdn::DType::kBF16})
    for (gdn::Layout layout : {gdn::Layout::kVK, gdn::Layout::kKV}) {
      const int64_t slot = in.slot();
      const std::vector<uint8_t> pool0 = in.draw(B * slot, sd, 0.5);
      auto params = [&](DeviceBuffer& pool, DeviceBuffer& o) { return in.params(pool, B, o, sd, layout); };
      // the chain: token t of every row, one call each; the pool after each
      DeviceBuffer pool(be, pool0), o = in.output();
      std::vector<std::vector<uint8_t>> after;
      for (int64_t t = 0; t < T; ++t) {
        gdn::DecodeParams p = params(pool, o);
        const size_t e = gdn::dtype_size(io);
        p.num_tokens = 1;
        p.q = in.q.as<uint8_t>(size_t(t * p.q_token_stride) * e);
        p.k = in.k.as<uint8_t>(size_t(t * p.k_token_stride) * e);
        p.v = in.v.as<uint8_t>(size_t(t * p.v_token_stride) * e);
        p.a = in.a.as<uint8_t>(size_t(t * p.a_token_stride) * e);
        p.b = in.b.as<uint8_t>(size_t(t * p.b_token_stride) * e);
        p.o = o.as<uint8_t>(size_t(t * p.o_token_stride) * e);
        ASSERT_TRUE(gdn::decode(p, be).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        after.push_back(pool.download());
      }
      const std::vector<uint8_t> o_chain = o.download();
      struct Geometry {
        int rounds, stages;
      };
      for (const Geometry g : {Geometry{0, -1}, Geometry{4, 0}, Geometry{4, 2}, Geometry{2, 2}, Geometry{4, 3}}) {
        const std::string what = std::string(gdn::to_string(sd)) + " " + gdn::to_string(layout) +
                                 ", rounds " + std::to_string(g.rounds) + ", ring stages " + std::to_string(g.stages);
        SCOPED_TRACE(what);
        DeviceBuffer pool1(be, pool0), o1 = in.output();
        DeviceBuffer inter(be, std::vector<uint8_t>(size_t(B * T * slot) * gdn::dtype_size(sd), kCanary));
        gdn::DecodeParams p = params(pool1, o1);
        p.intermediate_states = inter.get();
        gdn::set_dense_strides(p);
        ASSERT_TRUE(gdn::decode(p, be).ok());  // validated as a caller's call
        gdn::gpu::PlanOverrides ov;
        ov.max_items_per_warp = g.rounds;
        ov.token_ring_stages = g.stages;
        pool1 = DeviceBuffer(be, pool0);
        p.state = pool1.get();
        gdn::gpu::Plan plan;
        ASSERT_EQ(gdn::cuda::decode_with(p, ov, &plan), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        if (g.rounds > 0) {
          EXPECT_EQ(plan.blocks_per_head, 4 / g.rounds);
        }
        if (g.stages >= 0) {
          EXPECT_EQ(plan.token_smem.ring_stages, g.stages);
        }
        EXPECT_TRUE(o1.download() == o_chain) << "o";
        EXPECT_TRUE(pool1.download() == after.back()) << "final state";
        const std::vector<uint8_t> got = inter.download();
        const size_t sb = size_t(slot) * gdn::dtype_size(sd);
        for (int64_t row = 0; row < B; ++row)
          for (int64_t t = 0; t < T; ++t)
            ASSERT_EQ(0, std::memcmp(got.data() + size_t(row * T + t) * sb, after[size_t(t)].data() + size_t(row) * sb, sb))
                << "intermediate state of row " << row << ", token " << t;
      }
    }
}

// Chained one-token launches (docs/decisions.md#token-chain): the planner
// runs two tokens of few rows as two one-token launches; forced either way
// (and for three tokens), the outputs, the pool and the count of bad
// indices are the token kernel's bitwise: dense in place, and a pool read
// and written through state_indices with padding rows, an out-of-range row
// and slots past the rows (state_out_indices none or the same array), with
// and without a programmatic launch, both layouts, fp32 and bf16 states.
TEST_F(CudaOnly, ChainedOneTokenLaunchesEqualTheTokenKernel) {
  constexpr int64_t B = 8, D = 128, kSlots = B + 3;
  // (inputs for three tokens: the two-token calls read the first two of each row)
  TokenCall in3(B, 3, 2, 4, D, 73);
  // rows 2 and 5 padding, row 6 out of range; the others shuffled over the slots
  const std::vector<int32_t> slots = {7, 0, -1, 10, 3, -1, int32_t(kSlots) + 4, 1};
  const gdn::Backend be = gdn::Backend::kCuda;
  const DeviceBuffer didx(be, TokenCall::bytes(slots));
  for (gdn::DType sd : {gdn::DType::kF32, gdn::DType::kBF16})
    for (gdn::Layout layout : {gdn::Layout::kVK, gdn::Layout::kKV})
      for (int pool_mode : {0, 1, 2})  // dense; state_indices; state_out_indices the same array
        for (bool pdl : {false, true})
          for (int32_t T : {2, 3}) {
            const std::string what = std::string(gdn::to_string(sd)) + " " + gdn::to_string(layout) +
                                     (pool_mode == 0 ? ", dense" : pool_mode == 1 ? ", pool" : ", pool in = out") +
                                     (pdl ? ", programmatic" : "") + ", T = " + std::to_string(T);
            SCOPED_TRACE(what);
            const std::vector<uint8_t> pool0 = in3.draw(kSlots * in3.slot(), sd, 0.5);
            struct Run {
              std::vector<uint8_t> o, pool;
              uint32_t bad;
              gdn::gpu::Plan plan;
            };
            auto run = [&](int chain) {
              DeviceBuffer pool(be, pool0), o = in3.output();
              DeviceBuffer count(be, std::vector<uint8_t>(4, 0));
              gdn::DecodeParams p = in3.params(pool, kSlots, o, sd, layout);
              p.num_tokens = T;  // tokens t < T of each row's three
              p.programmatic_launch = pdl;
              if (pool_mode > 0) {
                p.index_dtype = gdn::IndexType::kI32;
                p.state_indices = didx.get();
                if (pool_mode == 2) p.state_out_indices = didx.get();
                p.invalid_index_count = count.as<uint32_t>();
              }
              EXPECT_TRUE(gdn::validate(p).ok());
              gdn::gpu::PlanOverrides ov;
              ov.token_chain = chain;
              Run r;
              EXPECT_EQ(gdn::cuda::decode_with(p, ov, &r.plan), cudaSuccess);
              EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              r.o = o.download();
              r.pool = pool.download();
              std::memcpy(&r.bad, count.download().data(), 4);
              return r;
            };
            const Run kernel = run(0), chained = run(1), planned = run(-1);
            EXPECT_EQ(kernel.plan.chain, 0);
            EXPECT_EQ(chained.plan.chain, T);
            EXPECT_EQ(planned.plan.chain, T == 2 ? 2 : 0);  // 16 groups: fewer than any GPU's SMs
            EXPECT_TRUE(chained.o == kernel.o) << "o";
            EXPECT_TRUE(chained.pool == kernel.pool) << "pool";
            EXPECT_EQ(chained.bad, kernel.bad);
            EXPECT_EQ(kernel.bad > 0, pool_mode > 0);  // (the out-of-range row, counted)
            EXPECT_FALSE(kernel.pool == pool0) << "the state moved";
          }
}

// A pool with every feature at once: `extra` slots past the rows, shuffled;
// `padding` padding rows, `no_write` rows that do not write, `bad_in` rows
// whose read index is out of range and one whose write index is, and a
// separate write slot per row.
void every_pool_feature(CaseSpec& spec, gdn::IndexType index, int extra, int padding, int no_write, int bad_in) {
  spec.index = index;
  spec.extra_slots = extra;
  spec.shuffle_slots = true;
  spec.padding_rows = padding;
  spec.out_indices = true;
  spec.no_write_rows = no_write;
  spec.bad_in = bad_in;
  spec.bad_out = 1;
}

// fp32 kv blocks of exactly two tiles (B * Hv between one and two waves of
// the 8-warp tiles: 192 heads on an H200 or an A100) reduce both tiles
// together (decode_kv_step_kernel's pair path). Checked against the
// reference with a pool: shuffled slots, padding rows, rows that do not
// write, out-of-range indices, and a separate write slot per row.
TEST_F(CudaOnly, KvTilePairsWithAPool) {
  CaseSpec spec;
  spec.name = "kv tile pairs, fp32, pool";
  spec.seed = 61;
  spec.batch = 48;
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = spec.dv = 128;
  spec.state = gdn::DType::kF32;
  spec.layout = gdn::Layout::kKV;
  every_pool_feature(spec, gdn::IndexType::kI64, 5, 3, 2, 1);
  run_and_check(spec, gdn::Backend::kCuda);
  spec.name = "kv tile pairs, fp32, in place";
  spec.seed = 62;
  spec.index = gdn::IndexType::kNone;
  spec.extra_slots = 0;
  spec.shuffle_slots = false;
  spec.padding_rows = spec.no_write_rows = spec.bad_in = spec.bad_out = 0;
  spec.out_indices = false;
  run_and_check(spec, gdn::Backend::kCuda);
}

// Small heads (Dk <= 64) past one wave of tiles: every kv block takes two
// tiles at once (the pair path), in 4-warp tiles where one 8-warp tile
// would cover the head. Dk = 64 with Dv = 64, 128 and 32 (for bf16 one
// 4-warp tile a head: no pair) and Dk = 48, fp32 and bf16, B = 200 at Hv = 4
// (800 heads: more than one wave on an H200 or an A100), against the
// reference with a pool: shuffled slots, padding rows, rows that do not
// write, out-of-range indices, a separate write slot per row.
TEST_F(CudaOnly, KvSmallHeadsPairTiles) {
  const int dims[][2] = {{64, 64}, {64, 128}, {64, 32}, {48, 64}};
  uint64_t seed = 71;
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (const auto& d : dims) {
      CaseSpec spec;
      spec.name = std::string("kv small heads, ") + gdn::to_string(t) + ", Dk " + std::to_string(d[0]) + ", Dv " +
                  std::to_string(d[1]);
      spec.seed = seed++;
      spec.batch = 200;
      spec.hk = 2;
      spec.hv = 4;
      spec.dk = d[0];
      spec.dv = d[1];
      spec.state = t;
      spec.layout = gdn::Layout::kKV;
      every_pool_feature(spec, gdn::IndexType::kI32, 7, 5, 3, 2);
      run_and_check(spec, gdn::Backend::kCuda);
    }
}

// kv small tiles (4 warps, one a block, the whole grid resident: B * Hv
// small) on either side of the line where the launch applies L2 policies
// to the state's traffic (Launch::l2_hints, step_l2_hints: a second
// instantiation of the kernel, up to 4 blocks an SM), each against the
// reference with a pool (shuffled slots, padding rows, rows that do not
// write, out-of-range indices, a separate write slot per row). Hv = 4 at
// Dk = Dv = 128: 32 blocks a row for fp32, 16 for bf16, so the grid is 4
// blocks an SM (with the policies) or 8 (without: still one round on an
// H200).
TEST_F(CudaOnly, KvSmallTilesEitherL2Policy) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  uint64_t seed = 81;
  for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16})
    for (int blocks_per_sm : {4, 8}) {
      const int blocks_per_row = t == gdn::DType::kF32 ? 32 : 16;
      CaseSpec spec;
      spec.name = std::string("kv small tiles, ") + gdn::to_string(t) + ", " + std::to_string(blocks_per_sm) +
                  " blocks an SM";
      spec.seed = seed++;
      spec.batch = std::max(1, blocks_per_sm * sms / blocks_per_row);
      spec.hk = 2;
      spec.hv = 4;
      spec.dk = spec.dv = 128;
      spec.state = t;
      spec.layout = gdn::Layout::kKV;
      every_pool_feature(spec, gdn::IndexType::kI32, 3, 2, 1, 1);
      run_and_check(spec, gdn::Backend::kCuda);
    }
}

// vk, and fp32 kv in 8-warp tiles, on either side of the other line: the
// L2 policies apply while the state a call reads (B * Hv heads, padding
// rows too) is at most twice the L2 (plan_launch). B at the line and 8 rows
// past it (Hv = 8, Dk = Dv = 128: 240 and 248 rows for fp32 on an H200's 60
// MiB, 480 and 488 for bf16), each against the reference with a pool.
TEST_F(CudaOnly, StepEitherSideOfTheL2Line) {
  int l2 = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  ASSERT_GT(l2, 0);
  uint64_t seed = 91;
  struct Tile {
    gdn::Layout layout;
    gdn::DType state;
  };
  for (const Tile tile : {Tile{gdn::Layout::kVK, gdn::DType::kF32}, Tile{gdn::Layout::kVK, gdn::DType::kBF16},
                          Tile{gdn::Layout::kKV, gdn::DType::kF32}}) {
    const int64_t row_bytes = int64_t(8) * 128 * 128 * int64_t(gdn::dtype_size(tile.state));
    const int64_t at_line = 2 * int64_t(l2) / row_bytes;
    for (const int64_t batch : {at_line, at_line + 8}) {
      CaseSpec spec;
      spec.name = std::string("either side of the L2 line, ") + gdn::to_string(tile.layout) + ", " +
                  gdn::to_string(tile.state) + ", B " + std::to_string(batch);
      spec.seed = seed++;
      spec.batch = batch;
      spec.hk = 2;
      spec.hv = 8;
      spec.dk = spec.dv = 128;
      spec.state = tile.state;
      spec.layout = tile.layout;
      every_pool_feature(spec, gdn::IndexType::kI32, 3, 2, 1, 1);
      run_and_check(spec, gdn::Backend::kCuda);
    }
  }
}

// The engines' vk call in one wave (one input dtype, raw gates, Dk = Dv =
// 128, dense or through a pool), which the CUDA backend runs in a kernel of
// its own (decode_vk_wave_kernel), at Qwen3.5's shape (Hk 16, Hv 32) at B =
// 1 and 8 and a tensor-parallel one (Hk 4, Hv 8) at B = 32: every state
// dtype and input dtype, against the reference, with what that kernel
// takes from the caller (packed rows, padded rows and slots, either l2norm
// mode, a custom scale, extreme gates; pools with int32 or int64 indices,
// padding rows, a separate write slot, rows not written, out-of-range
// indices counted). Each case also as a programmatic launch (on sm_90 the
// kernel's twin that loads the state before its wait; nothing upstream
// here, so the wait returns at once; the order of its reads behind a late
// writer: ProgrammaticLaunchReadsTheUpstreamsOutputsAfterItsWait). Batch
// invariance against the ring kernel: test_invariance.cpp.
TEST_F(CudaOnly, VkCallsInOneWave) {
  uint64_t seed = 301;
  int variant = 0;
  struct Shape {
    int64_t batch;
    int hk, hv;
  };
  for (const Shape sh : {Shape{1, 16, 32}, Shape{8, 16, 32}, Shape{32, 4, 8}})
    for (gdn::DType t : {gdn::DType::kF32, gdn::DType::kBF16, gdn::DType::kF16})
      for (gdn::DType io : {gdn::DType::kBF16, gdn::DType::kF16, gdn::DType::kF32}) {
        CaseSpec spec;
        spec.seed = seed++;
        spec.batch = sh.batch;
        spec.hk = sh.hk;
        spec.hv = sh.hv;
        spec.dk = spec.dv = 128;
        spec.qkv = spec.ab = spec.out = io;
        spec.state = t;
        spec.layout = gdn::Layout::kVK;
        // one of six forms in turn
        switch (variant++ % 6) {
          case 0: spec.packed_qkv = true; break;
          case 1: spec.pad_batch = 8; spec.pad_slot = 64; break;
          case 2: spec.l2norm = gdn::L2Norm::kMaxNorm; spec.scale = 0.3f; spec.tiny_k = true; break;
          case 3: spec.wide_gates = true; spec.zero_q = true; break;
          case 4:
            spec.packed_qkv = true;
            every_pool_feature(spec, gdn::IndexType::kI32, 3, sh.batch > 1 ? 1 : 0, 0, 0);
            break;
          default:
            if (sh.batch > 1) {
              every_pool_feature(spec, gdn::IndexType::kI64, 3, 1, 1, 1);
            } else {
              spec.index = gdn::IndexType::kI64;
              spec.extra_slots = 2;
            }
            break;
        }
        spec.name = std::string("vk in one wave, B ") + std::to_string(sh.batch) + ", Hv " + std::to_string(sh.hv) +
                    ", state " + gdn::to_string(t) + ", inputs " + gdn::to_string(io) + ", form " +
                    std::to_string((variant - 1) % 6);
        run_and_check(spec, gdn::Backend::kCuda);

        SCOPED_TRACE(spec.name + ", programmatic launch");
        const HostCase hc = make_case(spec);
        DeviceCase dc(hc, gdn::Backend::kCuda);
        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        dc.p.stream = stream;
        dc.p.programmatic_launch = true;
        const gdn::Status st = gdn::decode(dc.p, gdn::Backend::kCuda);
        ASSERT_TRUE(st.ok()) << st.message;
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        cudaStreamDestroy(stream);
        check_device_case(hc, dc);
      }
}

// One process driving every GPU it sees: kernel attributes (the shared-memory
// opt-in that kv at Dk = 256 needs past 48 KiB, the fused stages') are per
// device, so each GPU must get them at its first launch, not only the GPU of
// the process's first call. Per GPU: a kv step at Dk = 256 in the 8-warp
// tile (B = 256) and the fused middle at Dk = 256, checked against the
// reference; and the same bits on every GPU. Skips with fewer than two GPUs.
TEST_F(CudaOnly, EveryGpuOfTheProcess) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << n << " GPU(s): nothing to compare across devices";
  int first = 0;
  ASSERT_EQ(cudaGetDevice(&first), cudaSuccess);
  for (bool fused : {false, true}) {
    CaseSpec spec;
    spec.name = fused ? "every gpu, fused" : "every gpu, step";
    spec.seed = fused ? 41 : 43;
    spec.batch = fused ? 3 : 256;
    spec.hk = 2;
    spec.hv = 4;
    spec.dk = 256;
    spec.dv = 128;
    spec.layout = gdn::Layout::kKV;
    spec.state = gdn::DType::kBF16;
    if (fused) {
      spec.conv_width = 3;
      spec.norm = true;
    }
    const HostCase hc = make_case(spec);
    const RefResult R = fused ? reference_step(hc.ref, hc.pool, hc.conv_pool) : reference_step(hc.ref, hc.pool);
    std::vector<uint8_t> o0, state0;
    for (int dev = 0; dev < n; ++dev) {
      SCOPED_TRACE(spec.name + ", device " + std::to_string(dev));
      ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
      DeviceCase dc(hc, gdn::Backend::kCuda);
      const gdn::Status st = dc.run();
      ASSERT_TRUE(st.ok()) << st.message;
      uint32_t counter = 0;
      std::memcpy(&counter, dc.counter.download().data(), 4);
      const std::vector<uint8_t> o = dc.o.download(), state = dc.state.download();
      if (fused)
        check_step(hc, R, o, hc.state, state, hc.conv_state, dc.conv_state.download(), counter);
      else
        check_step(hc, R, o, hc.state, state, counter);
      if (dev == 0) {
        o0 = o;
        state0 = state;
      } else {
        EXPECT_TRUE(o == o0) << "output differs from device 0's";
        EXPECT_TRUE(state == state0) << "state differs from device 0's";
      }
    }
  }
  ASSERT_EQ(cudaSetDevice(first), cudaSuccess);
}

// A pool of more than 2^32 elements with the row's slot beyond that offset:
// 64-bit offsets all the way, checked against the host backend.
TEST_F(CudaOnly, PoolBeyond32BitOffsets) {
  const int hk = 1, hv = 2, d = 64;
  const int64_t slot_stride = (int64_t(1) << 32) + 64;  // bf16 elements, a multiple of 16 bytes
  const int64_t head_elems = int64_t(hv) * d * d;
  void* pool = nullptr;
  if (cudaMalloc(&pool, size_t(2 * slot_stride) * 2) != cudaSuccess) {
    cudaGetLastError();
    GTEST_SKIP() << "not enough GPU memory for a 16 GiB pool";
  }
  std::mt19937_64 rng(5);
  std::normal_distribution<double> n01(0.0, 1.0);
  auto rnd = [&](int64_t n, double sd) {
    std::vector<uint8_t> x(size_t(n) * 2);
    for (int64_t i = 0; i < n; ++i) gdn::store_element(x.data(), gdn::DType::kBF16, i, sd * n01(rng));
    return x;
  };
  const std::vector<uint8_t> q = rnd(hk * d, 1), k = rnd(hk * d, 1), v = rnd(hv * d, 1);
  const std::vector<uint8_t> a = rnd(hv, 1), b = rnd(hv, 1), s0 = rnd(head_elems, 0.5);
  const std::vector<float> A_log{0.5f, 1.5f}, dt_bias{-3.0f, -4.0f};
  const int64_t slot = 1;

  // the slot beyond 2^32 elements on the GPU
  ASSERT_EQ(cudaMemcpy(static_cast<uint16_t*>(pool) + slot * slot_stride, s0.data(), s0.size(),
                       cudaMemcpyHostToDevice), cudaSuccess);
  DeviceBuffer dq(gdn::Backend::kCuda, q), dk(gdn::Backend::kCuda, k), dv(gdn::Backend::kCuda, v);
  DeviceBuffer da(gdn::Backend::kCuda, a), db(gdn::Backend::kCuda, b);
  DeviceBuffer dA(gdn::Backend::kCuda, 8), ddt(gdn::Backend::kCuda, 8), dix(gdn::Backend::kCuda, 8);
  DeviceBuffer dout(gdn::Backend::kCuda, size_t(hv) * d * 4);
  dA.upload(A_log.data(), 8);
  ddt.upload(dt_bias.data(), 8);
  dix.upload(&slot, 8);

  gdn::DecodeParams p;
  p.batch = 1;
  p.num_k_heads = hk;
  p.num_v_heads = hv;
  p.head_dim_k = p.head_dim_v = d;
  p.qkv_dtype = p.ab_dtype = p.state_dtype = gdn::DType::kBF16;
  p.o_dtype = gdn::DType::kF32;
  gdn::set_dense_strides(p);
  p.state_slot_stride = slot_stride;
  p.num_slots = 2;
  p.index_dtype = gdn::IndexType::kI64;
  p.q = dq.get(); p.k = dk.get(); p.v = dv.get(); p.a = da.get(); p.b = db.get();
  p.A_log = dA.as<float>(); p.dt_bias = ddt.as<float>();
  p.state = pool;
  p.state_indices = dix.get();
  p.o = dout.get();
  const gdn::Status st = gdn::decode(p, gdn::Backend::kCuda);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> s_gpu(s0.size());
  ASSERT_EQ(cudaMemcpy(s_gpu.data(), static_cast<uint16_t*>(pool) + slot * slot_stride, s0.size(),
                       cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(pool);

  // The same step on the host, on a one-slot pool.
  std::vector<uint8_t> s_host = s0;
  std::vector<float> o_host(size_t(hv) * d);
  gdn::DecodeParams h = p;
  gdn::set_dense_strides(h);
  h.num_slots = 1;
  h.index_dtype = gdn::IndexType::kNone;
  h.state_indices = nullptr;
  h.q = q.data(); h.k = k.data(); h.v = v.data(); h.a = a.data(); h.b = b.data();
  h.A_log = A_log.data(); h.dt_bias = dt_bias.data();
  h.state = s_host.data();
  h.o = o_host.data();
  h.stream = nullptr;
  ASSERT_TRUE(gdn::decode(h, gdn::Backend::kHost).ok());

  std::vector<double> og, oh, sg, sh;
  const std::vector<uint8_t> o_gpu = dout.download();
  for (int64_t i = 0; i < hv * d; ++i) {
    og.push_back(gdn::load_element(o_gpu.data(), gdn::DType::kF32, i));
    oh.push_back(o_host[size_t(i)]);
  }
  for (int64_t i = 0; i < head_elems; ++i) {
    sg.push_back(gdn::load_element(s_gpu.data(), gdn::DType::kBF16, i));
    sh.push_back(gdn::load_element(s_host.data(), gdn::DType::kBF16, i));
  }
  EXPECT_TRUE(expect_close("o", og, oh, output_tol(gdn::DType::kF32)));
  EXPECT_TRUE(expect_close("state", sg, sh, state_tol(gdn::DType::kBF16)));
}

// Inputs that are element-aligned but not 16-byte aligned are handled (q, k,
// v, o, x and z move as scalars); a state that is not 16-byte aligned is
// refused with a message, and nothing is written.
TEST_F(CudaOnly, UnalignedInputsHandledUnalignedStateRefused) {
  CaseSpec spec;
  spec.name = "unaligned";
  spec.seed = 3;
  spec.batch = 3;
  spec.hk = 1;
  spec.hv = 2;
  spec.qkv = spec.ab = spec.out = gdn::DType::kBF16;
  spec.pad_head = 1;  // every head starts at an odd element: 2-byte aligned only
  spec.pad_batch = 3;
  // Both layouts (vk's q/k rows then take the MixedIO kernels, whose loads
  // test each address), the norm alone (q/k rows so too, z rows odd), and
  // the fused middle (x and z rows odd: the prologue's channel-by-channel
  // form instead of its vector runs).
  for (gdn::Layout layout : {gdn::Layout::kVK, gdn::Layout::kKV}) {
    spec.layout = layout;
    run_and_check(spec, gdn::Backend::kCuda);
    CaseSpec norm = spec;
    norm.norm = true;
    run_and_check(norm, gdn::Backend::kCuda);
    CaseSpec fused = norm;
    fused.conv_width = 4;
    fused.conv_bias = true;
    run_and_check(fused, gdn::Backend::kCuda);
  }
  spec.layout = gdn::Layout::kVK;

  spec.pad_head = 0;
  spec.pad_batch = 0;
  spec.state = gdn::DType::kBF16;
  spec.pad_slot = 1;  // slots 2 bytes apart from 16-byte alignment
  const HostCase hc = make_case(spec);
  DeviceCase dc(hc, gdn::Backend::kCuda);
  const gdn::Status st = gdn::decode(dc.p, gdn::Backend::kCuda);
  EXPECT_EQ(st.code, gdn::StatusCode::kUnsupported) << st.message;
  EXPECT_TRUE(contains(st.message, "state_slot_stride")) << st.message;
  EXPECT_TRUE(dc.state.download() == hc.state) << "a refused call wrote the state";
  EXPECT_TRUE(dc.o.download() == std::vector<uint8_t>(hc.o_bytes, kCanary)) << "a refused call wrote o";
}

}  // namespace
}  // namespace gdn_test
