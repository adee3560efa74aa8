// The launch planner (backends/cuda/plan.h) on the CPU: calls -> the kernel
// and geometry it picks, on a DeviceInfo holding an H200's numbers (132 SMs,
// 60 MiB of L2, and each step kernel's occupancy there: plan_h200_device.inc,
// from tools/plan_device_table.py). The expected geometry of every call of
// plan_shapes.hpp is what the library chose on an H200 before its planner
// became this pure function (plan_h200.txt), so the move is checked
// decision by decision; the kernel names are checked on a few rows.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "gdnkit/gdnkit.hpp"
#include "plan.h"
#include "plan_shapes.hpp"

namespace {

using gdn::DType;
using gdn::Layout;
using gdn::gpu::DeviceInfo;
using gdn::gpu::Io;
using gdn::gpu::Kernel;
using gdn::gpu::Plan;

// An H200 as the CUDA backend sees it (sm_90 code, cp.async, L2 policies).
DeviceInfo h200() {
  DeviceInfo d;
  d.sms = 132;
  d.l2_bytes = 60 << 20;
  d.sm90 = true;
  d.dram_bytes_per_s = 4.8e12;
  d.config = gdn::gpu::BuildConfig{};
#include "plan_h200_device.inc"
  return d;
}

// An H100 SXM: the H200's SMs and occupancy, 50 MiB of L2, 3.35 TB/s of DRAM.
DeviceInfo h100() {
  DeviceInfo d = h200();
  d.l2_bytes = 50 << 20;
  d.dram_bytes_per_s = 3.35e12;
  return d;
}

// The geometry of a plan, in plan_h200.txt's words: items a head, warps a
// block, items a warp, blocks a head, fused, group heads, warps a head,
// cluster, small loads first, L2 policies, the norm as the step's epilogue,
// the one-wave kernel.
std::string geometry(const Plan& p) {
  const bool fused = p.kernel == Kernel::kVkFused || p.kernel == Kernel::kKvFused;
  const bool wave = p.kernel == Kernel::kVkWave;
  char buf[160];
  std::snprintf(buf, sizeof buf, "iph %d W %d ipw %d bph %d fused %d G %d wph %d cl %d slf %d l2 %d sn %d wave %d",
                p.items_per_head, int(p.block / 32), p.items_per_warp, fused ? 1 : p.blocks_per_head, int(fused),
                p.group_heads, fused ? p.warps_per_head : 0, fused || p.norm ? p.cluster : 1, int(p.small_loads_first),
                fused || wave ? 0 : int(p.l2_hints), int(p.norm), int(wave));
  return buf;
}

TEST(Plan, MatchesTheH200Plans) {
  const DeviceInfo dev = h200();
  std::ifstream in(GDNKIT_TESTS_DIR "/plan_h200.txt");
  ASSERT_TRUE(in.good()) << GDNKIT_TESTS_DIR "/plan_h200.txt";
  std::vector<std::string> expected;
  for (std::string line; std::getline(in, line);) expected.push_back(line);
  size_t n = 0;
  gdn_test::for_plan_shapes([&](const char* name, const gdn::DecodeParams& p) {
    const std::string got = std::string(name) + " | " + geometry(gdn::gpu::plan_launch(p, dev));
    ASSERT_LT(n, expected.size());
    EXPECT_EQ(got, expected[n]);
    ++n;
  });
  EXPECT_EQ(n, expected.size());
}

// A dense call at Hk / Hv heads of Dk x Dv, one dtype for the small tensors.
gdn::DecodeParams call(int64_t B, DType state, Layout layout, int hk = 16, int hv = 32, int dk = 128, int dv = 128) {
  gdn::DecodeParams p;
  p.batch = B;
  p.num_k_heads = hk;
  p.num_v_heads = hv;
  p.head_dim_k = dk;
  p.head_dim_v = dv;
  p.qkv_dtype = p.ab_dtype = p.o_dtype = DType::kBF16;
  p.state_dtype = state;
  p.layout = layout;
  p.num_slots = B;
  gdn::set_dense_strides(p);
  // Aligned stand-in addresses: the planner reads alignment, never memory.
  alignas(256) static char arena[256];
  gdn::set_packed_qkv(p, arena, 2 * hk * dk + hv * dv);
  p.a = p.b = p.o = p.state = arena;
  p.A_log = p.dt_bias = reinterpret_cast<const float*>(arena);
  return p;
}

std::string describe(const Plan& plan) {
  char buf[256];
  gdn::gpu::describe_plan(plan, buf, sizeof buf);
  return buf;
}

struct Row {
  const char* name;
  gdn::DecodeParams p;
  const char* expected;  // describe_plan's line
};

// Where DRAM feeds each SM less (the H100), fp32 vk warps stream one item and
// kv blocks one tile once the grid is several waves long (from B = 32 at the
// Qwen3.5 shape); 16-bit vk, smaller grids, and the H200 keep their counts.
TEST(Plan, LeanDramStreamsOneItemAWarpPastAFewWaves) {
  struct Case {
    int64_t B;
    DType state;
    Layout layout;
    int h200_ipw, h100_ipw;
  };
  const Case cases[] = {
      {8, DType::kF32, Layout::kVK, 2, 2},    {16, DType::kF32, Layout::kVK, 2, 2},
      {32, DType::kF32, Layout::kVK, 2, 1},   {128, DType::kF32, Layout::kVK, 3, 1},
      {512, DType::kF32, Layout::kVK, 3, 1},  {8, DType::kF32, Layout::kKV, 2, 2},
      {512, DType::kF32, Layout::kKV, 1, 1},  {16, DType::kBF16, Layout::kVK, 2, 2},
      {32, DType::kBF16, Layout::kVK, 2, 2},  {512, DType::kBF16, Layout::kVK, 2, 2},
      {16, DType::kBF16, Layout::kKV, 2, 2},  {32, DType::kBF16, Layout::kKV, 2, 1},
      {512, DType::kBF16, Layout::kKV, 2, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(gdn::to_string(c.state)) + " " + gdn::to_string(c.layout) + " B=" + std::to_string(c.B));
    const Plan on_h200 = gdn::gpu::plan_launch(call(c.B, c.state, c.layout), h200());
    const Plan on_h100 = gdn::gpu::plan_launch(call(c.B, c.state, c.layout), h100());
    EXPECT_EQ(on_h200.items_per_warp, c.h200_ipw) << describe(on_h200);
    EXPECT_EQ(on_h100.items_per_warp, c.h100_ipw) << describe(on_h100);
    EXPECT_EQ(on_h100.kernel, on_h200.kernel);
  }
  // bandwidth unknown (0): the H200's counts
  DeviceInfo unknown = h100();
  unknown.dram_bytes_per_s = 0;
  EXPECT_EQ(gdn::gpu::plan_launch(call(512, DType::kF32, Layout::kVK), unknown).items_per_warp, 3);
}

TEST(Plan, NamesTheKernelInstantiation) {
  const DeviceInfo dev = h200();
  auto pool = [](gdn::DecodeParams p) {
    p.index_dtype = gdn::IndexType::kI32;
    static int32_t slots[1];
    p.state_indices = slots;
    p.num_slots = p.batch + 1;
    return p;
  };
  auto norm = [](gdn::DecodeParams p) {
    alignas(16) static float w[4];  // (aligned: the prologue's vector runs depend on it)
    p.norm_weight = w;
    p.z = p.q;
    p.z_batch_stride = p.num_v_heads * p.head_dim_v;
    p.z_head_stride = p.head_dim_v;
    return p;
  };
  auto pdl = [](gdn::DecodeParams p) {
    p.programmatic_launch = true;
    return p;
  };
  auto conv = [](gdn::DecodeParams p) {
    p.conv_width = 4;
    p.x = p.q;
    p.q = p.k = p.v = nullptr;
    p.conv_state = p.state;
    p.conv_weight = p.x;
    gdn::set_dense_strides(p);
    return p;
  };
  auto mixed = [](gdn::DecodeParams p) {  // (one dtype no longer: the MixedIO kernels)
    p.o_dtype = DType::kF32;
    return p;
  };
  const Row rows[] = {
#include "test_plan_rows.inc"
  };
  for (const Row& r : rows) EXPECT_EQ(describe(gdn::gpu::plan_launch(r.p, dev)), r.expected) << r.name;
}

// The planner's own invariants, on every benchmark shape: the grid covers
// every item of every head exactly as its kernel expects, and a block never
// asks for more shared memory than the build allows.
TEST(Plan, GridCoversEveryItem) {
  const DeviceInfo dev = h200();
  for (DType s : {DType::kF32, DType::kBF16, DType::kF16})
    for (Layout l : {Layout::kVK, Layout::kKV})
      for (int64_t B : {1, 2, 8, 31, 32, 128, 512, 1000})
        for (int d : {64, 128, 256}) {
          const gdn::DecodeParams p = call(B, s, l, 16, 32, d, d);
          const Plan plan = gdn::gpu::plan_launch(p, dev);
          const std::string what = describe(plan);
          EXPECT_LE(plan.smem, dev.config.max_block_smem) << what;
          EXPECT_GT(plan.block, 0u) << what;
          if (plan.kernel == Kernel::kVkWave) {
            EXPECT_EQ(int64_t(plan.grid) * (plan.block / 32), B * 32 * plan.items_per_head) << what;
          } else {
            EXPECT_EQ(int64_t(plan.grid), B * 32 * plan.blocks_per_head) << what;
            const int per_block = l == Layout::kVK ? int(plan.block / 32) * plan.items_per_warp : plan.items_per_warp;
            EXPECT_GE(int64_t(plan.blocks_per_head) * per_block, plan.items_per_head) << what;
          }
        }
}

// Multi-token calls take the token kernel (docs/decisions.md#token-kernel): its
// grid covers every unit of every group, a block owns a whole group when the
// conv or the norm is on, and its shared memory is what the backend checks.
TEST(Plan, MultiTokenCallsTakeTheTokenKernel) {
  const DeviceInfo dev = h200();
  for (DType s : {DType::kF32, DType::kBF16})
    for (Layout l : {Layout::kVK, Layout::kKV})
      for (int64_t B : {1, 8, 128})
        for (int d : {64, 128, 256})
          for (bool norm : {false, true}) {
            gdn::DecodeParams p = call(B, s, l, 16, 32, d, d);
            p.num_tokens = 4;
            alignas(16) static char w[16];
            if (norm) p.norm_weight = p.z = w;
            const Plan plan = gdn::gpu::plan_launch(p, dev);
            const std::string what = describe(plan);
            EXPECT_EQ(plan.kernel, Kernel::kTokens) << what;
            const int G = 2, units = G * plan.items_per_head;
            EXPECT_EQ(int64_t(plan.grid), B * 16 * plan.blocks_per_head) << what;
            EXPECT_GE(plan.blocks_per_head * plan.items_per_warp, units) << what;
            EXPECT_LT((plan.blocks_per_head - 1) * plan.items_per_warp, units) << what;
            if (norm) {
              EXPECT_EQ(plan.blocks_per_head, 1) << what;
            }
            // what the backend checked, and more only for more rounds or the ring
            EXPECT_GE(plan.smem, gdn::gpu::token_smem_bytes(p, 32)) << what;
            EXPECT_LE(plan.smem, gdn::gpu::traits::token_smem_limit(dev.config)) << what;
            EXPECT_EQ(size_t(plan.token_smem.bytes), plan.smem) << what;
            const int round = (s == DType::kF32 ? 2 : 1) * (l == Layout::kVK ? 8 : 1);
            if (plan.items_per_warp <= round) {
              EXPECT_EQ(plan.token_smem.ring_stages, 0) << what;
              EXPECT_EQ(plan.smem, gdn::gpu::token_smem_bytes(p, 32)) << what;
            }
          }
  // 16 tokens of 256 x 256 heads, 8 v-heads a k-head, norm on: more than a block holds.
  gdn::DecodeParams big = call(1, DType::kF32, Layout::kVK, 2, 16, 256, 256);
  big.num_tokens = 16;
  alignas(16) static char w[16];
  big.norm_weight = big.z = w;
  EXPECT_GT(gdn::gpu::token_smem_bytes(big, 32), gdn::gpu::traits::token_smem_limit(dev.config));
}

// Rounds a token block takes: the most that still give every SM a block
// (2 at B = 8, the whole group of 4 at B = 128 at this shape), with the
// state's ring for 16-bit states only; never the ring without cp.async (HIP)
// or when forced off.
TEST(Plan, TokenBlocksTakeRoundsThroughTheRing) {
  const DeviceInfo dev = h200();
  for (DType s : {DType::kF32, DType::kBF16})
    for (Layout l : {Layout::kVK, Layout::kKV}) {
      gdn::DecodeParams p = call(1, s, l, 16, 32, 128, 128);
      p.num_tokens = 3;  // (two tokens of few rows are chained one-token launches: below)
      const Plan one_row = gdn::gpu::plan_launch(p, dev);
      EXPECT_EQ(one_row.blocks_per_head, 4) << describe(one_row);  // 64 blocks: one round each
      EXPECT_EQ(one_row.token_smem.ring_stages, 0) << describe(one_row);
      p.batch = 8;
      const Plan small = gdn::gpu::plan_launch(p, dev);
      EXPECT_EQ(small.blocks_per_head, 2) << describe(small);  // 256 blocks; 4 rounds: 128 < 132 SMs
      EXPECT_EQ(small.token_smem.ring_stages, s == DType::kBF16 ? 2 : 0) << describe(small);
      p.batch = 128;
      const Plan big = gdn::gpu::plan_launch(p, dev);
      EXPECT_EQ(big.blocks_per_head, 1) << describe(big);
      const int stages = s == DType::kBF16 ? 2 : 0;
      EXPECT_EQ(big.token_smem.ring_stages, stages) << describe(big);
      EXPECT_GE(big.smem, size_t(stages) * big.block * 4 * 16) << describe(big);
      gdn::gpu::PlanOverrides off;
      off.token_ring_stages = 0;
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev, off).token_smem.ring_stages, 0);
      gdn::gpu::PlanOverrides on;
      on.token_ring_stages = 2;
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev, on).token_smem.ring_stages, 2);
      DeviceInfo hip = dev;
      hip.config.vk_ring = false;
      EXPECT_EQ(gdn::gpu::plan_launch(p, hip).token_smem.ring_stages, 0);
      gdn::gpu::PlanOverrides one;
      one.max_items_per_warp = 1;
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev, one).blocks_per_head, 4);
    }
}

// Two tokens of fewer groups than SMs run as two one-token launches chained
// in place (docs/decisions.md#token-chain), only where that writes exactly
// what the token kernel would: the final state alone, to the slot it was
// read from, the same T for every row, no conv or norm.
TEST(Plan, TwoTokensOfFewRowsAreChainedOneTokenLaunches) {
  const DeviceInfo dev = h200();
  for (DType s : {DType::kF32, DType::kBF16})
    for (Layout l : {Layout::kVK, Layout::kKV}) {
      gdn::DecodeParams p = call(8, s, l);
      p.num_tokens = 2;
      gdn::set_dense_strides(p);
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev).chain, 2) << describe(gdn::gpu::plan_launch(p, dev));  // 128 groups
      p.batch = 1;
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev).chain, 2);
      p.batch = 9;  // 144 groups > 132 SMs
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev).chain, 0);
      p.batch = 8;
      p.num_tokens = 3;
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev).chain, 0);
      gdn::gpu::PlanOverrides always, never;
      always.token_chain = 1;
      never.token_chain = 0;
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev, always).chain, 3);
      p.num_tokens = 2;
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev, never).chain, 0);
      EXPECT_EQ(gdn::gpu::plan_launch(p, dev, never).kernel, Kernel::kTokens);
      // Calls whose writes a chain of one-token calls would not reproduce.
      alignas(16) static char other[64];
      std::vector<std::pair<const char*, gdn::DecodeParams>> refused;
      auto with = [&](const char* what, auto change) {
        gdn::DecodeParams q = p;
        change(q);
        refused.emplace_back(what, q);
      };
      with("intermediate_states", [&](gdn::DecodeParams& q) { q.intermediate_states = other; });
      with("token_state_indices", [&](gdn::DecodeParams& q) {
        q.index_dtype = gdn::IndexType::kI32;
        q.token_state_indices = other;
        q.token_state_indices_stride = 2;
      });
      with("cu_seqlens", [&](gdn::DecodeParams& q) {
        q.index_dtype = gdn::IndexType::kI32;
        q.cu_seqlens = other;
      });
      with("update_state", [&](gdn::DecodeParams& q) { q.update_state = false; });
      with("state_out_indices", [&](gdn::DecodeParams& q) {
        q.index_dtype = gdn::IndexType::kI32;
        q.state_indices = other;
        q.state_out_indices = other + 32;
      });
      with("norm_weight", [&](gdn::DecodeParams& q) { q.norm_weight = other; });
      with("conv_width", [&](gdn::DecodeParams& q) { q.conv_width = 4; });
      for (const auto& r : refused) {
        EXPECT_FALSE(gdn::gpu::token_chain_allowed(r.second)) << r.first;
        EXPECT_EQ(gdn::gpu::plan_launch(r.second, dev, always).chain, 0) << r.first;
      }
      // In place through one index array is allowed (state_out_indices the same array or none).
      gdn::DecodeParams pool = p;
      pool.index_dtype = gdn::IndexType::kI32;
      pool.state_indices = other;
      EXPECT_TRUE(gdn::gpu::token_chain_allowed(pool));
      pool.state_out_indices = other;
      EXPECT_TRUE(gdn::gpu::token_chain_allowed(pool));
    }
}

// Token t of a chained call: its inputs and output, the same state; only
// token 0 counts bad indices and may launch programmatically.
TEST(Plan, TokenChainViewIsTokenTOfTheCall) {
  gdn::DecodeParams p = call(8, DType::kF32, Layout::kVK);
  p.num_tokens = 2;
  p.o_dtype = DType::kF32;
  gdn::set_dense_strides(p);
  uint32_t count = 0;
  p.invalid_index_count = &count;
  p.programmatic_launch = true;
  const gdn::DecodeParams v0 = gdn::gpu::token_chain_view(p, 0), v1 = gdn::gpu::token_chain_view(p, 1);
  for (const gdn::DecodeParams* v : {&v0, &v1}) {
    EXPECT_EQ(v->num_tokens, 1);
    EXPECT_FALSE(gdn::is_multi_token(*v));
    EXPECT_EQ(v->state, p.state);
    EXPECT_EQ(v->q_batch_stride, p.q_batch_stride);
  }
  auto off = [](const void* a, const void* b) { return static_cast<const char*>(a) - static_cast<const char*>(b); };
  EXPECT_EQ(off(v0.q, p.q), 0);
  EXPECT_EQ(off(v1.q, p.q), p.q_token_stride * 2);  // bf16
  EXPECT_EQ(off(v1.k, p.k), p.k_token_stride * 2);
  EXPECT_EQ(off(v1.v, p.v), p.v_token_stride * 2);
  EXPECT_EQ(off(v1.a, p.a), p.a_token_stride * 2);
  EXPECT_EQ(off(v1.b, p.b), p.b_token_stride * 2);
  EXPECT_EQ(off(v1.o, p.o), p.o_token_stride * 4);  // fp32 output
  EXPECT_NE(p.o_token_stride, 0);
  EXPECT_EQ(v0.invalid_index_count, &count);
  EXPECT_TRUE(v0.programmatic_launch);
  EXPECT_EQ(v1.invalid_index_count, nullptr);
  EXPECT_FALSE(v1.programmatic_launch);
}

// Overrides reach the plan, and nothing else changes without them.
TEST(Plan, OverridesAreTheOnlySeam) {
  const DeviceInfo dev = h200();
  const gdn::DecodeParams p = call(1, DType::kBF16, Layout::kVK);
  EXPECT_EQ(gdn::gpu::plan_launch(p, dev).kernel, Kernel::kVkWave);
  gdn::gpu::PlanOverrides ring;
  ring.allow_wave = false;
  EXPECT_EQ(gdn::gpu::plan_launch(p, dev, ring).kernel, Kernel::kVkStep);
  gdn::gpu::PlanOverrides one;
  one.max_items_per_warp = 1;
  const Plan q = gdn::gpu::plan_launch(call(512, DType::kF32, Layout::kVK), dev, one);
  EXPECT_EQ(q.items_per_warp, 1);
  EXPECT_EQ(describe(gdn::gpu::plan_launch(p, dev)), describe(gdn::gpu::plan_launch(p, dev, {})));
}

// Mixed dtypes and unaligned q/k rows take the MixedIO instantiation.
TEST(Plan, SelectsTheIoInstantiation) {
  gdn::DecodeParams p = call(8, DType::kF32, Layout::kVK);
  EXPECT_EQ(gdn::gpu::select_io(p), Io::kBF16);
  p.o_dtype = DType::kF32;
  EXPECT_EQ(gdn::gpu::select_io(p), Io::kMixed);
  p = call(8, DType::kF32, Layout::kVK);
  p.q_batch_stride += 1;  // q rows no longer 16-byte aligned
  EXPECT_EQ(gdn::gpu::select_io(p), Io::kMixed);
  p.layout = Layout::kKV;  // (kv reads q and k through its own loads)
  EXPECT_EQ(gdn::gpu::select_io(p), Io::kBF16);
}

}  // namespace
