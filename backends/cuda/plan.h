// The launch planner: which kernel runs a call, and with what geometry.
//
//   Plan plan_launch(const DecodeParams&, const DeviceInfo&, const PlanOverrides& = {});
//
// A pure function (no driver calls, no globals): everything it needs of the
// device is in DeviceInfo, which device.cu fills once per device, so the
// whole policy is unit-tested on a CPU (tests/test_plan.cpp). The launcher
// (launch.cuh) only executes a Plan: one switch over its kernel, no
// re-deciding. The measured reason of each rule is in docs/decisions.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdnkit/params.hpp"
#include "traits.h"

namespace gdn {
namespace gpu {

// The dtype the small tensors (q/k/v, a/b, o) are compiled for: their one
// shared dtype, or kMixed (runtime dtypes, and q/k rows that are not 16-byte
// aligned).                                              docs/decisions.md#io-instantiation
enum class Io : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kMixed = 3 };
constexpr int kNumIo = 4;

// The kernel families (kernels/*.cuh).
enum class Kernel : uint8_t {
  kVkStep,   // decode_vk_step_kernel: the vk ring kernel
  kVkWave,   // decode_vk_wave_kernel: the engines' call in one wave    #vk-wave-kernel
  kVkFused,  // decode_vk_fused_kernel: the fused middle, vk           #fused-groups
  kKvStep,   // decode_kv_step_kernel: the kv tile kernel               #kv-tile
  kKvFused,  // decode_kv_fused_kernel: the fused middle, kv
  kTokens,   // decode_tokens_kernel: multi-token decode, both layouts   #token-kernel
};
constexpr int kNumKernels = 6;

// What planning needs of one device: read once per device (device.cu).
struct DeviceInfo {
  int sms{0};
  int64_t l2_bytes{0};
  // Peak DRAM bandwidth (2 x memory clock x bus width); 0 when unknown.
  double dram_bytes_per_s{0.0};
  // Programmatic launch and clusters: an sm_90+ GPU running kernels built
  // from sm_90 code (not the compute_80 PTX JIT, not HIP).
  bool sm90{false};
  BuildConfig config{};
  // Warps of a step kernel (its plain instantiation) one SM holds:
  // [state dtype][layout][Dk capacity 64/128/256][tile: shipped, kv 4-warp][io].
  int16_t step_warps[3][2][3][2][kNumIo]{};
  // Warps of the one-wave kernel one SM holds: [state dtype][io][indexed].
  int16_t wave_warps[3][kNumIo][2]{};
};

// Tuning and diagnostics (bench/tune_cuda, bench_fused's trace mode): the one
// seam through which the library's choices can be changed. The default
// changes nothing.
struct PlanOverrides {
  int max_items_per_warp{0};    // > 0: cap items a vk warp (tiles a kv block) streams
  bool allow_wave{true};        // false: never the one-wave kernel
  int max_cluster{0};           // > 0: cap the fused groups' cluster size
  bool spread_pdl_smem{true};   // false: a programmatic launch keeps its own shared memory
  size_t min_step_smem{0};      // pad a step launch's dynamic shared memory (fewer blocks an SM)
  int kernel_load_order{-1};    // 0 / 1: the kernels' load order as a plain / programmatic launch
  int token_ring_stages{-1};    // >= 0: (tokens) the state ring's stages, 0 none (max_items_per_warp: rounds a block)
  int token_chain{-1};          // (tokens) 0: never chained one-token launches; 1: wherever the call allows them
};

struct Plan {
  Kernel kernel{Kernel::kVkStep};
  Io io{Io::kMixed};
  DType state_dtype{DType::kF32};
  Layout layout{Layout::kVK};
  int dk_cap{128};     // the Dk capacity instantiated: 64, 128 or 256 (rows past Dk masked)
  int tile{0};         // vk: state values a lane holds; kv: warps of a tile
  // Which instantiation of the family:
  bool l2_hints{false};   // (step) the one with L2 policies on the state     #l2-hints
  bool norm{false};       // (step) the gated RMSNorm as its epilogue         #norm-epilogue
  bool norm_only{false};  // (fused) the norm-alone twin, in clusters
  bool pdl_twin{false};   // (fused, wave) the programmatic launch's twin     #pdl
  bool indexed{false};    // (wave) through slot indices
  // The launch:
  bool programmatic{false};  // with programmatic stream serialization
  bool spread_smem{true};    // (programmatic) spread the blocks over the SMs   #pdl
  bool raise_smem_limit{false};  // (overrides) smem exceeds the kernel's limit set at init
  int cluster{1};            // blocks a launch cluster holds (1: none)
  unsigned grid{0}, block{0};
  size_t smem{0};            // dynamic shared memory
  // The kernel's geometry arguments:
  int items_per_head{0};   // vk items (kv tiles) of a head
  int items_per_warp{0};   // consecutive items a warp (kv: a block) streams
  int blocks_per_head{0};  // (step) blocks a head's items split over
  int group_heads{1};      // (fused) Hv / Hk
  int warps_per_head{0};   // (vk fused) warps on each head
  bool small_loads_first{false};  // q/k/v and gates before the state        #small-loads-first
  bool vector_runs{false};        // (fused) the prologue's runs move as vector words
  int kernel_load_order{-1};      // (overrides) see PlanOverrides
  traits::TokenSmem token_smem{};  // (tokens) its shared memory's layout
  // (tokens) > 0: the call runs as this many one-token launches chained in
  // place, token t's each planned as a one-token call (token_chain_view), not
  // as the token kernel: the same bits, faster for a few tokens of few rows.
  //                                                      docs/decisions.md#token-chain
  int chain{0};
};

// The Dk capacity that holds Dk.
constexpr int dk_capacity(int dk) { return dk <= 64 ? 64 : dk <= 128 ? 128 : 256; }
// Index of a capacity / dtype / layout in DeviceInfo's tables.
constexpr int dk_index(int dk_cap) { return dk_cap == 64 ? 0 : dk_cap == 128 ? 1 : 2; }
constexpr int dtype_index(DType t) { return t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2; }
constexpr int layout_index(Layout l) { return l == Layout::kVK ? 0 : 1; }

// The instantiation's small-tensor dtype for p.
Io select_io(const DecodeParams& p);

// Whether a multi-token call may run as one-token launches chained in place:
// the same T for every row (no cu_seqlens), only the final state written, to
// the slot it was read from (no per-token slots, intermediate buffers,
// update_state = false or separate write slots), no conv or norm.
bool token_chain_allowed(const DecodeParams& p);
// Token t of such a call as a one-token call: the inputs' and the output's
// token t, the same state and slots. Only the first token's launch counts
// bad indices and may be programmatic (a later one reads the state the one
// before it writes).
DecodeParams token_chain_view(const DecodeParams& p, int t);

// The multi-token kernel's dynamic shared memory for p (warp: the build's
// lanes), which the backend checks against traits::token_smem_limit.
size_t token_smem_bytes(const DecodeParams& p, int warp);

// The plan for a validated p on the device described by dev.
Plan plan_launch(const DecodeParams& p, const DeviceInfo& dev, const PlanOverrides& o = {});

// One line naming the plan's kernel instantiation and geometry, e.g.
// "kv_step<f32,dk128,w4,io=bf16,l2> grid 128 x 128 smem 49152 ipw 1 bph 4".
void describe_plan(const Plan& plan, char* buf, size_t size);

}  // namespace gpu
}  // namespace gdn
