// The calls the planner test walks (tests/test_plan.cpp): every state dtype
// and layout, Hv 8-64, head dims 64-256, B = 1-512, and the options that
// pick other kernels (pools, the norm alone, conv + norm, conv alone, PDL).
// tests/plan_h200.txt holds, for each in this order, the geometry the
// library chose on an H200 (132 SMs, 60 MiB L2) before its planner moved
// to backends/cuda/plan.cpp.
#pragma once

#include <cstdio>
#include <functional>

#include "gdnkit/gdnkit.hpp"

namespace gdn_test {

inline void for_plan_shapes(const std::function<void(const char* name, const gdn::DecodeParams& p)>& f) {
  // Stand-in addresses, 256-byte aligned: the planner reads alignment, never memory.
  alignas(256) static char arena[4096];
  static float weights[1024];
  static int32_t slots[4096];
  const char* const options[] = {"dense", "pool", "norm", "convnorm", "conv", "pdl", "poolpdl", "normpdl"};
  for (gdn::DType s : {gdn::DType::kF32, gdn::DType::kBF16, gdn::DType::kF16})
    for (gdn::Layout l : {gdn::Layout::kVK, gdn::Layout::kKV})
      for (int hv : {8, 16, 32, 64})
        for (int d : {64, 128, 256})
          for (int64_t B : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512})
            for (int o = 0; o < 8; ++o) {
              if (d != 128 && hv != 32) continue;
              const int hk = hv == 8 ? 4 : 16;
              const bool pool = o == 1 || o == 6, norm = o == 2 || o == 3 || o == 7, conv = o == 3 || o == 4;
              gdn::DecodeParams p;
              p.batch = B;
              p.num_k_heads = hk;
              p.num_v_heads = hv;
              p.head_dim_k = d;
              p.head_dim_v = d;
              p.qkv_dtype = p.ab_dtype = p.o_dtype = gdn::DType::kBF16;
              p.state_dtype = s;
              p.layout = l;
              p.num_slots = B + 1;
              if (conv) p.conv_width = 4;
              gdn::set_dense_strides(p);
              gdn::set_packed_qkv(p, arena, 2 * hk * d + hv * d);
              p.a = p.b = p.o = p.state = arena;
              p.A_log = p.dt_bias = weights;
              if (pool) {
                p.index_dtype = gdn::IndexType::kI32;
                p.state_indices = slots;
              }
              if (norm) {
                p.norm_weight = weights;
                p.z = arena;
                p.z_batch_stride = hv * d;
                p.z_head_stride = d;
              }
              if (conv) {
                p.q = p.k = p.v = nullptr;
                p.x = arena;
                p.conv_state = arena;
                p.conv_weight = arena;
                p.conv_bias = nullptr;
                gdn::set_dense_strides(p);
              }
              p.programmatic_launch = o >= 5;
              char name[128];
              std::snprintf(name, sizeof name, "%s %s hv%d d%d B%lld %s", gdn::to_string(s), gdn::to_string(l), hv, d,
                            (long long)B, options[o]);
              f(name, p);
            }
}

}  // namespace gdn_test
