// The launch planner (plan.h): plain C++, no driver calls. Each rule names
// the decision in docs/decisions.md that measured it.
#include "plan.h"

#include <algorithm>
#include <cstdio>

namespace gdn {
namespace gpu {
namespace {

using traits::kKvSmallW;

// The geometry a rule picks (the Plan's shape before its kernel is named).
struct Geom {
  int items_per_head{0};   // ceil(Dv / cols_per_item)
  int warps_per_block{0};  // W (kv: the tile's warps)
  int items_per_warp{0};   // items a warp streams (kv: tiles a block streams)
  int blocks_per_head{0};  // ceil(items_per_head / (W * items_per_warp)); 0 for the wave kernel
  bool fused{false};
  int group_heads{1};
  int warps_per_head{0};
  int cluster{1};
  bool small_loads_first{false};
  int l2_hints{0};
  bool step_norm{false};
  bool wave{false};
};

// What every rule reads: the call, the device and the instantiation's constants.
struct Ctx {
  const DecodeParams& p;
  const DeviceInfo& dev;
  int bytes;     // state element size
  Layout layout;
  int dk;        // Dk capacity
  int tile;      // vk kP, kv kW
  int max_ipw;   // items a warp (kv tiles a block) streams at most
  Io io;
  int warp;
  // Warps of the plain step kernel (kv: of the 4-warp tile when small) an SM holds.
  int resident(bool small) const {
    return dev.step_warps[dtype_index(p.state_dtype)][layout_index(layout)][dk_index(dk)][small ? 1 : 0][int(io)];
  }
  int cols_per_item() const { return traits::cols_per_item(warp, bytes, layout, dk, tile); }
  int kv_cols(int w) const { return traits::kv_geom(warp, bytes, dk, w).cols; }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// DRAM bandwidth an SM under which fp32 vk warps stream one item (kv blocks
// one tile) once the grid is a few waves long: on the H100 (25 GB/s an SM)
// 1.4-2.7% faster from B = 32 (16-bit vk: 1-3% slower); on the H200 (37) 2-3
// items were faster.                                 docs/decisions.md#vk-items-per-warp
constexpr double kLeanDramPerSm = 30e9;
bool lean_dram(const DeviceInfo& d) { return d.dram_bytes_per_s > 0 && d.dram_bytes_per_s < kLeanDramPerSm * d.sms; }

// Whether the vk kernel's q and k rows can move as vector words (RawRun):
// pointers and strides in 16-byte steps.                  docs/decisions.md#raw-loads
bool qk_rows_aligned(const DecodeParams& p) {
  if (p.layout != Layout::kVK || p.conv_width > 0) return true;
  const int64_t es = int64_t(dtype_size(p.qkv_dtype));
  auto ok = [&](const void* ptr, int64_t batch_stride, int64_t head_stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (batch_stride * es) % 16 == 0 && (head_stride * es) % 16 == 0;
  };
  return ok(p.q, p.q_batch_stride, p.q_head_stride) && ok(p.k, p.k_batch_stride, p.k_head_stride);
}

// Whether the pointers and strides the fused prologue's runs load from are
// multiples of `bytes`, a run's vector word.
bool prologue_pointers_aligned(const DecodeParams& p, int64_t bytes) {
  const int64_t es = int64_t(dtype_size(p.qkv_dtype));
  auto ptr = [&](const void* q) { return int64_t(reinterpret_cast<uintptr_t>(q) % uintptr_t(bytes)) == 0; };
  auto stride = [&](int64_t s) { return (s * es) % bytes == 0; };
  if (p.conv_width > 0 && !(ptr(p.x) && stride(p.x_batch_stride) && ptr(p.conv_state) &&
                            stride(p.conv_state_slot_stride) && ptr(p.conv_weight) && ptr(p.conv_bias)))
    return false;
  return p.norm_weight == nullptr ||
         (ptr(p.z) && stride(p.z_batch_stride) && stride(p.z_head_stride) && ptr(p.norm_weight));
}

// The call the one-wave kernel takes, but for its grid: no conv or norm, raw
// gates, the interleaved head map, Dk = Dv = 128, heads packed in q, k, v
// and o, every offset of a row's tensors below 2^31 elements (and of the
// state's without slot indices).                      docs/decisions.md#vk-wave-kernel
bool wave_call(const DecodeParams& p) {
  constexpr int64_t kD = 128, kMax = int64_t(1) << 31;
  // the largest offset of row B - 1 in a tensor of rows `stride` apart, `span` long
  auto fits = [&](int64_t stride, int64_t span) { return (p.batch - 1) * stride + span < kMax; };
  const bool pool = p.index_dtype != IndexType::kNone;
  return p.conv_width == 0 && p.norm_weight == nullptr && p.gate == Gate::kRaw &&
         p.head_map == HeadMap::kInterleaved && p.head_dim_k == kD && p.head_dim_v == kD &&
         p.q_head_stride == kD && p.k_head_stride == kD && p.v_head_stride == kD && p.o_head_stride == kD &&
         fits(p.q_batch_stride, p.num_k_heads * kD) && fits(p.k_batch_stride, p.num_k_heads * kD) &&
         fits(p.v_batch_stride, p.num_v_heads * kD) && fits(p.o_batch_stride, p.num_v_heads * kD) &&
         fits(p.a_batch_stride, p.num_v_heads) && fits(p.b_batch_stride, p.num_v_heads) &&
         (pool || fits(p.state_slot_stride, p.num_v_heads * kD * kD));
}

Geom plan_geometry(const Ctx& c, bool allow_wave);

// The norm alone (conv off) as the step's epilogue, sm_90 code, one input
// dtype: a head's blocks a cluster where the step gives a head several
// blocks (at most 8) in one wave of at most 4 blocks an SM; one block a head
// in grids of more than one wave. false: the fused groups instead.
//                                                      docs/decisions.md#norm-epilogue
bool plan_step_norm(const Ctx& c, const Geom& g, Geom& s) {
  const DecodeParams& p = c.p;
  DecodeParams step = p;
  step.norm_weight = nullptr;
  const Ctx cs{step, c.dev, c.bytes, c.layout, c.dk, c.tile, c.max_ipw, c.io, c.warp};
  s = plan_geometry(cs, false);  // (the ring kernel's geometry: the norm's instantiations are its)
  const int64_t heads = p.batch * p.num_v_heads;
  const int sms = c.dev.sms;
  const int resident = c.resident(false);
  auto wave = [&](int w) { return int64_t(resident / w) * sms; };
  bool ok = s.blocks_per_head > 1 && heads * s.blocks_per_head <= int64_t(4) * sms;
  int cols;  // the columns a block owns: at most one a thread
  if (c.layout == Layout::kKV) {
    if (!ok && heads > wave(c.tile)) {
      const bool within_2l2 = heads * int64_t(p.head_dim_k) * p.head_dim_v * c.bytes <= 2 * c.dev.l2_bytes;
      s.items_per_head = g.items_per_head;
      s.warps_per_block = c.tile;
      s.items_per_warp = g.items_per_head;
      s.blocks_per_head = 1;
      s.small_loads_first = false;
      s.l2_hints = within_2l2 ? traits::step_l2_hints(c.bytes, c.layout, c.dk, c.tile) : 0;
      ok = true;
    }
    cols = s.items_per_warp * c.kv_cols(s.warps_per_block == kKvSmallW ? kKvSmallW : c.tile);
    ok = ok && s.items_per_warp <= c.max_ipw;
  } else {
    cols = s.warps_per_block * s.items_per_warp * c.cols_per_item();
    ok = ok || (s.blocks_per_head == 1 && heads > wave(s.warps_per_block));
    // every warp of every block has an item (none leaves early)
    ok = ok && int64_t(s.blocks_per_head * s.warps_per_block - 1) * s.items_per_warp < s.items_per_head;
  }
  const bool capable = c.io != Io::kMixed && c.dev.sm90;
  if (!(ok && capable && s.blocks_per_head <= 8 && cols <= s.warps_per_block * c.warp)) return false;
  s.step_norm = true;
  s.cluster = s.blocks_per_head;
  return true;
}

// The fused middle: a group (row, k-head) is one block, or on sm_90 a cluster
// of up to 8 while the groups leave SMs idle. kv: the group's tiles split
// evenly over the cluster; vk: 8 * cluster / G warps a head, each streaming
// the fewest items that cover it.                       docs/decisions.md#fused-groups
void plan_fused(const Ctx& c, const PlanOverrides& o, Geom& g) {
  const DecodeParams& p = c.p;
  const int G = g.group_heads;
  const int64_t groups = p.batch * p.num_k_heads;
  int want = 1;
  while (c.dev.sm90 && want < 8 && groups * want < c.dev.sms) want *= 2;
  if (o.max_cluster > 0) want = std::max(1, std::min(want, o.max_cluster));
  g.blocks_per_head = 1;
  g.warps_per_head = 0;
  for (int n = want; n >= 1; --n) {
    if (c.layout == Layout::kKV) {
      const int tiles = G * g.items_per_head;
      const int tpb = int(ceil_div(tiles, n));
      if (ceil_div(tiles, tpb) != n) continue;
      g.warps_per_block = c.tile;
      g.items_per_warp = tpb;
    } else {
      const int wph0 = std::min(g.items_per_head, std::max(1, 8 * n / G));
      const int ipw = int(ceil_div(g.items_per_head, wph0));
      const int wph = int(ceil_div(g.items_per_head, ipw));
      if ((G * wph) % n != 0 || G * wph / n > 8) continue;
      g.items_per_warp = ipw;
      g.warps_per_head = wph;
      g.warps_per_block = G * wph / n;
    }
    g.cluster = n;
    break;
  }
}

// kv step: 4-warp tiles, one a block, where all fit at once (B = 1); pairs of
// small heads' tiles in longer grids; else as few tiles a block as fill the
// resident block slots in one wave, up to the cap (fp32 past two: one).
void plan_kv_step(const Ctx& c, bool within_2l2, Geom& g) {
  const DecodeParams& p = c.p;
  const int64_t heads = p.batch * p.num_v_heads;
  const int64_t items = heads * g.items_per_head;
  const int sms = c.dev.sms;
  const int cap = std::min(c.max_ipw, g.items_per_head);
  if (c.tile > kKvSmallW) {  // docs/decisions.md#kv-small-tile
    const int tiles_small = int(ceil_div(p.head_dim_v, c.kv_cols(kKvSmallW)));
    if (heads * tiles_small <= int64_t(c.resident(true) / kKvSmallW) * sms) {
      g.items_per_head = tiles_small;
      g.warps_per_block = kKvSmallW;
      g.items_per_warp = 1;
      g.blocks_per_head = tiles_small;
      g.small_loads_first = true;
      // L2 policies up to 4 blocks an SM (docs/decisions.md#l2-hints)
      g.l2_hints = heads * tiles_small <= int64_t(4) * sms ? traits::step_l2_hints(c.bytes, c.layout, c.dk, kKvSmallW)
                                                           : 0;
      return;
    }
  }
  const int64_t slots = int64_t(c.resident(false) / c.tile) * sms;
  if (c.tile > kKvSmallW && c.dk <= 64 && items > slots && c.max_ipw >= 2) {  // docs/decisions.md#kv-small-heads
    int w = c.tile, iph = g.items_per_head;
    if (iph < 2) {
      w = kKvSmallW;
      iph = int(ceil_div(p.head_dim_v, c.kv_cols(kKvSmallW)));
    }
    g.items_per_head = iph;
    g.warps_per_block = w;
    g.items_per_warp = iph < 2 ? iph : 2;
    g.blocks_per_head = int(ceil_div(iph, g.items_per_warp));
    g.small_loads_first = false;
    return;
  }
  // docs/decisions.md#kv-tiles-per-block
  int64_t n = ceil_div(items, slots);
  if (c.bytes == 4 && n > 2) n = 1;
  if (lean_dram(c.dev) && items >= int64_t(2) * slots) n = 1;
  g.l2_hints = within_2l2 ? traits::step_l2_hints(c.bytes, c.layout, c.dk, c.tile) : 0;
  g.warps_per_block = c.tile;
  g.items_per_warp = int(n < 1 ? 1 : n > cap ? cap : n);
  g.blocks_per_head = int(ceil_div(g.items_per_head, g.items_per_warp));
  g.small_loads_first = g.items_per_warp == 1 && heads * g.blocks_per_head <= slots;
}

// vk step: the one-wave kernel for the engines' call where every item has a
// resident warp; else the ring kernel, 1 item a warp in one wave, 2 (3 for
// fp32 in long grids) otherwise, in the fewest blocks that keep the SMs
// evenly loaded.        docs/decisions.md#vk-items-per-warp, #vk-block-size
void plan_vk_step(const Ctx& c, bool within_2l2, bool allow_wave, Geom& g) {
  const DecodeParams& p = c.p;
  const int64_t heads = p.batch * p.num_v_heads;
  const int64_t items = heads * g.items_per_head;
  const int sms = c.dev.sms;
  const int cap = std::min(c.max_ipw, g.items_per_head);
  const int hints = traits::step_l2_hints(c.bytes, c.layout, c.dk, c.tile);
  if (c.dev.config.vk_wave && c.dk == 128 && c.tile == traits::default_tile(c.bytes, Layout::kVK)) {
    // fp32 pools keep the ring kernel (docs/decisions.md#vk-wave-kernel)
    const bool pool = p.index_dtype != IndexType::kNone;
    if (allow_wave && c.io != Io::kMixed && wave_call(p) && !(pool && c.bytes == 4)) {
      const int wave_warps = c.dev.wave_warps[dtype_index(p.state_dtype)][int(c.io)][pool ? 1 : 0];
      if (items <= int64_t(wave_warps) * sms) {
        auto blocks_with = [&](int ww) { return ceil_div(items, ww); };
        auto busiest = [&](int ww) { return ceil_div(blocks_with(ww), sms) * ww; };
        int w = 8;
        while (w > 1 && (blocks_with(w) < sms || busiest(w) > busiest(1))) w /= 2;
        g.wave = true;
        g.warps_per_block = w;
        g.items_per_warp = 1;
        g.blocks_per_head = 0;  // (the grid is ceil(items / W) blocks)
        g.small_loads_first = true;
        g.l2_hints = hints;
        return;
      }
    }
  }
  const int64_t slots = int64_t(c.resident(false)) * sms;
  int ipw = items <= slots || cap < 2 ? 1 : 2;
  while (ipw * 2 <= cap && items >= int64_t(4) * (ipw * 2) * slots) ipw *= 2;
  if (ipw == 2 && cap >= 3 && items >= int64_t(16) * slots) ipw = 3;
  if (lean_dram(c.dev) && c.bytes == 4 && items >= int64_t(4) * slots) ipw = 1;
  const int warps_per_head = int(ceil_div(g.items_per_head, ipw));
  // The largest power-of-two block up to 8 warps the head's warps fill, then
  // halved: in one wave while blocks are fewer than SMs or the busiest SM
  // would hold more warps than with one-warp blocks; in longer grids while
  // the grid has fewer than 4 blocks an SM.
  int w = 1;
  while (w * 2 <= warps_per_head && w * 2 <= 8) w *= 2;
  auto blocks_with = [&](int ww) { return heads * ceil_div(warps_per_head, ww); };
  if (heads * warps_per_head <= slots) {
    auto busiest = [&](int ww) { return ceil_div(blocks_with(ww), sms) * ww; };
    while (w > 1 && (blocks_with(w) < sms || busiest(w) > busiest(1))) w /= 2;
  } else {
    while (w > 1 && blocks_with(w) < int64_t(4) * sms) w /= 2;
  }
  g.items_per_warp = ipw;
  g.warps_per_block = w;
  g.blocks_per_head = int(ceil_div(warps_per_head, w));
  g.l2_hints = within_2l2 ? hints : 0;
  g.small_loads_first = ipw == 1 && heads * warps_per_head <= slots;
}

Geom plan_geometry(const Ctx& c, bool allow_wave, const PlanOverrides& o) {
  const DecodeParams& p = c.p;
  Geom g;
  g.items_per_head = int(ceil_div(p.head_dim_v, c.cols_per_item()));
  const int64_t heads = p.batch * p.num_v_heads;
  // L2 policies while the state a call reads is at most twice the L2.   docs/decisions.md#l2-hints
  const bool within_2l2 = heads * int64_t(p.head_dim_k) * p.head_dim_v * c.bytes <= 2 * c.dev.l2_bytes;
  g.group_heads = p.num_v_heads / p.num_k_heads;
  g.fused = p.conv_width > 0 || p.norm_weight != nullptr;
  if (c.dev.config.sm90_kernels && p.conv_width == 0 && p.norm_weight != nullptr) {
    Geom s;
    if (plan_step_norm(c, g, s)) return s;
  }
  if (g.fused) {
    plan_fused(c, o, g);
  } else if (c.layout == Layout::kKV) {
    plan_kv_step(c, within_2l2, g);
  } else {
    plan_vk_step(c, within_2l2, allow_wave, g);
  }
  return g;
}

Geom plan_geometry(const Ctx& c, bool allow_wave) { return plan_geometry(c, allow_wave, PlanOverrides{}); }

int io_bytes(Io io) { return io == Io::kF32 ? 4 : 2; }

// The instantiation and launch that execute geometry g (what launch.cuh runs).
Plan finish(const Ctx& c, const Geom& g, const PlanOverrides& o) {
  const DecodeParams& p = c.p;
  const BuildConfig& cfg = c.dev.config;
  Plan plan;
  plan.io = c.io;
  plan.state_dtype = p.state_dtype;
  plan.layout = c.layout;
  plan.dk_cap = c.dk;
  plan.tile = c.layout == Layout::kKV ? g.warps_per_block : c.tile;
  plan.items_per_head = g.items_per_head;
  plan.items_per_warp = g.items_per_warp;
  plan.blocks_per_head = g.blocks_per_head;
  plan.group_heads = g.group_heads;
  plan.warps_per_head = g.warps_per_head;
  plan.small_loads_first = g.small_loads_first;
  plan.programmatic = p.programmatic_launch && c.dev.sm90;
  plan.spread_smem = o.spread_pdl_smem;
  plan.kernel_load_order = o.kernel_load_order;
  const bool kernel_programmatic = o.kernel_load_order >= 0 ? o.kernel_load_order != 0 : p.programmatic_launch;
  plan.block = unsigned(g.warps_per_block * c.warp);
  if (g.fused) {
    plan.kernel = c.layout == Layout::kKV ? Kernel::kKvFused : Kernel::kVkFused;
    plan.cluster = g.cluster;
    plan.grid = unsigned(p.batch * p.num_k_heads * g.cluster);
    plan.smem = traits::ring_smem_bytes(cfg, c.bytes, c.layout, c.dk, plan.tile, g.warps_per_block) +
                traits::fused_smem_bytes(g.group_heads, p.head_dim_k, p.head_dim_v, g.cluster > 1);
    // The norm alone in clusters whose blocks each own columns of one head,
    // at most one a thread, has its own instantiation; so has a programmatic
    // launch with 16-bit inputs.                       docs/decisions.md#norm-epilogue
    bool norm_only = p.conv_width == 0 && g.cluster > 1;
    if (c.layout == Layout::kKV) {
      const traits::KvGeom t = traits::kv_geom(c.warp, c.bytes, c.dk, plan.tile);
      norm_only = norm_only && g.items_per_head % g.items_per_warp == 0 && g.items_per_warp * t.cols <= t.threads;
    } else {
      norm_only = norm_only && g.warps_per_head % g.warps_per_block == 0 &&
                  g.items_per_warp * c.cols_per_item() <= c.warp;
    }
    if (cfg.sm90_kernels) {
      if (c.io != Io::kMixed && norm_only)
        plan.norm_only = true;
      else if ((c.io == Io::kF16 || c.io == Io::kBF16) && plan.programmatic && kernel_programmatic)
        plan.pdl_twin = true;
    }
    plan.vector_runs =
        c.io != Io::kMixed && prologue_pointers_aligned(p, traits::prologue_run_bytes(c.layout, io_bytes(c.io)));
    return plan;
  }
  const int64_t heads = p.batch * p.num_v_heads;
  if (g.wave) {
    plan.kernel = Kernel::kVkWave;
    plan.indexed = p.index_dtype != IndexType::kNone;
    plan.pdl_twin = plan.programmatic;
    plan.l2_hints = true;  // (compiled in: a one-wave grid always takes them)
    plan.grid = unsigned(ceil_div(heads * g.items_per_head, g.warps_per_block));
    plan.smem = 0;
    return plan;
  }
  plan.kernel = c.layout == Layout::kKV ? Kernel::kKvStep : Kernel::kVkStep;
  plan.norm = g.step_norm;
  plan.cluster = g.step_norm ? g.cluster : 1;
  plan.grid = unsigned(heads * g.blocks_per_head);
  plan.l2_hints = cfg.l2_hints && g.l2_hints != 0 &&
                  traits::step_l2_hints(c.bytes, c.layout, c.dk, plan.tile) != 0;
  plan.smem = c.layout == Layout::kKV ? traits::kv_step_smem_bytes(cfg, c.bytes, c.dk, plan.tile)
                                      : traits::ring_smem_bytes(cfg, c.bytes, c.layout, c.dk, c.tile,
                                                                g.warps_per_block);
  if (o.min_step_smem > plan.smem) {
    plan.smem = o.min_step_smem;
    plan.raise_smem_limit = true;
  }
  return plan;
}

const char* io_name(Io io) {
  switch (io) {
    case Io::kF32: return "f32";
    case Io::kF16: return "f16";
    case Io::kBF16: return "bf16";
    default: return "mixed";
  }
}

}  // namespace

Io select_io(const DecodeParams& p) {
  if (p.qkv_dtype == p.ab_dtype && p.qkv_dtype == p.o_dtype && qk_rows_aligned(p)) {
    switch (p.qkv_dtype) {
      case DType::kF32: return Io::kF32;
      case DType::kF16: return Io::kF16;
      default: return Io::kBF16;
    }
  }
  return Io::kMixed;
}

// Multi-token decode (docs/decisions.md#token-kernel): one kernel for both
// layouts. A block takes units (vk items, kv tiles) of one group (row, k-head
// and its G v-heads) in rounds (traits::token_units a vk warp, or a kv
// block): the whole group when the conv or the norm is on (the conv windows of
// q and k and a head's norm need it), else `rounds` rounds of it, so that a
// row's heads spread over the SMs.
namespace {
struct TokenShape {
  int cols, units_per_head, units_per_block, parts, vcols, round, rounds_per_group;
};
TokenShape token_shape(const DecodeParams& p, int warp, int rounds) {
  const int bytes = int(dtype_size(p.state_dtype)), cap = dk_capacity(p.head_dim_k);
  const int tile = traits::default_tile(bytes, p.layout);
  TokenShape s;
  s.cols = traits::cols_per_item(warp, bytes, p.layout, cap, tile);
  const int G = p.num_v_heads / p.num_k_heads;
  s.units_per_head = (p.head_dim_v + s.cols - 1) / s.cols;
  const int units = G * s.units_per_head;
  const bool whole = p.conv_width > 0 || p.norm_weight != nullptr;
  s.round = traits::token_units(bytes) * (p.layout == Layout::kVK ? traits::kTokenWarps : 1);
  s.rounds_per_group = (units + s.round - 1) / s.round;
  s.units_per_block = whole ? units : std::min(units, s.round * std::max(rounds, 1));
  s.parts = (units + s.units_per_block - 1) / s.units_per_block;
  s.vcols = std::min(G * p.head_dim_v, s.units_per_block * s.cols);
  return s;
}
// Blocks of the token kernel an SM holds (its launch bounds: 128 registers).
constexpr int kTokenBlocksPerSm = 2;
// Rounds a block takes by default: the most, halving from the whole group,
// that still give every SM a block. A block's fixed work (its row's indices,
// the tokens' inputs staged and normalized, the first loads' latency) is then
// paid once for several rounds; on an H100 the whole group (4 rounds at the
// Qwen3.5 shape) was fastest from B = 32 and 2 rounds at B = 8
// (docs/decisions.md#token-kernel).
int token_rounds(const DecodeParams& p, const DeviceInfo& dev, int warp) {
  const int rpg = token_shape(p, warp, 1).rounds_per_group;
  const int64_t groups = p.batch * p.num_k_heads;
  int r = rpg;
  while (r > 1 && groups * ((rpg + r - 1) / r) < dev.sms) r /= 2;
  return r;
}
}  // namespace

size_t token_smem_bytes(const DecodeParams& p, int warp) {
  const TokenShape s = token_shape(p, warp, 1);
  return size_t(traits::token_smem(p.num_tokens, p.head_dim_k, p.head_dim_v, p.num_v_heads / p.num_k_heads, s.vcols,
                                   p.norm_weight != nullptr, p.b_head_stride > 0)
                    .bytes);
}

bool token_chain_allowed(const DecodeParams& p) {
  return p.num_tokens > 1 && p.cu_seqlens == nullptr && p.token_state_indices == nullptr &&
         p.intermediate_states == nullptr && p.intermediate_conv_states == nullptr && p.update_state &&
         p.conv_width == 0 && p.norm_weight == nullptr && p.b_head_stride == 0 &&
         (p.state_out_indices == nullptr || p.state_out_indices == p.state_indices);
}

DecodeParams token_chain_view(const DecodeParams& p, int t) {
  DecodeParams v = p;
  // element offset `off` of a tensor of dtype d
  const auto at = [](const void* base, DType d, int64_t off) {
    return static_cast<const void*>(static_cast<const char*>(base) + off * int64_t(dtype_size(d)));
  };
  v.num_tokens = 1;
  v.q = at(p.q, p.qkv_dtype, t * p.q_token_stride);
  v.k = at(p.k, p.qkv_dtype, t * p.k_token_stride);
  v.v = at(p.v, p.qkv_dtype, t * p.v_token_stride);
  v.a = at(p.a, p.ab_dtype, t * p.a_token_stride);
  v.b = at(p.b, p.ab_dtype, t * p.b_token_stride);
  v.o = const_cast<void*>(at(p.o, p.o_dtype, t * p.o_token_stride));
  if (t > 0) {
    v.invalid_index_count = nullptr;
    v.programmatic_launch = false;
  }
  return v;
}

static Plan plan_tokens(const DecodeParams& p, const DeviceInfo& dev, const PlanOverrides& o) {
  // Two tokens of fewer groups (row, k-head) than SMs: two one-token launches,
  // each one wave of the engines' kernels, beat the token kernel, whose
  // blocks pay their staging, barriers and first loads' latency once for
  // only two tokens (H100: T = 2, B = 1 by 30-35%, B = 8 by 4-18% but fp32
  // vk, 2.5% slower). The same bits: the token kernel equals the chained
  // one-token calls.                                 docs/decisions.md#token-chain
  if (token_chain_allowed(p) &&
      (o.token_chain == 1 ||
       (o.token_chain < 0 && p.num_tokens == 2 && p.batch * p.num_k_heads <= int64_t(dev.sms)))) {
    Plan plan;
    plan.kernel = Kernel::kTokens;
    plan.state_dtype = p.state_dtype;
    plan.layout = p.layout;
    plan.dk_cap = dk_capacity(p.head_dim_k);
    plan.chain = p.num_tokens;
    return plan;
  }
  const int warp = dev.config.warp;
  const int dk_cap = dk_capacity(p.head_dim_k);
  const int vecs = traits::token_round_vecs(warp, int(dtype_size(p.state_dtype)), p.layout, dk_cap);
  // shared memory of shape s with a ring of `stages` rounds
  const auto smem = [&](const TokenShape& s, int stages) {
    return traits::token_smem(p.num_tokens, p.head_dim_k, p.head_dim_v, p.num_v_heads / p.num_k_heads, s.vcols,
                              p.norm_weight != nullptr, p.b_head_stride > 0, stages, traits::kTokenWarps * warp * vecs);
  };
  TokenShape s = token_shape(p, warp, o.max_items_per_warp > 0 ? o.max_items_per_warp : token_rounds(p, dev, warp));
  // (more rounds stage more v columns: back to one round where they would not fit)
  if (size_t(smem(s, 0).bytes) > traits::token_smem_limit(dev.config)) s = token_shape(p, warp, 1);
  Plan plan;
  plan.kernel = Kernel::kTokens;
  plan.io = Io::kMixed;  // (the small tensors' dtypes are run-time values there)
  plan.state_dtype = p.state_dtype;
  plan.layout = p.layout;
  plan.dk_cap = dk_cap;
  plan.tile = traits::default_tile(int(dtype_size(p.state_dtype)), p.layout);
  plan.items_per_head = s.units_per_head;
  plan.items_per_warp = s.units_per_block;
  plan.blocks_per_head = s.parts;
  plan.group_heads = p.num_v_heads / p.num_k_heads;
  plan.grid = unsigned(p.batch * p.num_k_heads * s.parts);
  plan.block = unsigned(traits::kTokenWarps * warp);
  // The state's ring (cp.async builds, 16-bit states, a block of several
  // rounds): 2 stages, one round in flight while one runs, where 2 blocks an
  // SM still fit (with the kv tile's static 8 KiB). fp32 states load each
  // round into registers as it starts: the ring was up to 6% slower for them
  // on an H100, and up to 8% faster for bf16 (docs/decisions.md#token-kernel).
  const int block_rounds = (s.units_per_block + s.round - 1) / s.round;
  const bool ring = block_rounds > 1 && dev.config.vk_ring && dtype_size(p.state_dtype) == 2;
  int stages = o.token_ring_stages >= 0 ? o.token_ring_stages : ring ? 2 : 0;
  stages = std::min(stages, block_rounds);
  if (stages > 0 && (size_t(smem(s, stages).bytes) + 8 * 1024) * kTokenBlocksPerSm > dev.config.max_block_smem)
    stages = 0;
  plan.token_smem = smem(s, stages);
  plan.smem = size_t(plan.token_smem.bytes);
  return plan;
}

Plan plan_launch(const DecodeParams& p, const DeviceInfo& dev, const PlanOverrides& o) {
  if (is_multi_token(p)) return plan_tokens(p, dev, o);
  const int bytes = int(dtype_size(p.state_dtype));
  const int max_ipw = o.max_items_per_warp > 0 ? o.max_items_per_warp : traits::default_items_per_warp(bytes, p.layout);
  const Ctx c{p, dev, bytes, p.layout, dk_capacity(p.head_dim_k), traits::default_tile(bytes, p.layout),
              max_ipw, select_io(p), dev.config.warp};
  return finish(c, plan_geometry(c, o.allow_wave, o), o);
}

void describe_plan(const Plan& plan, char* buf, size_t size) {
  static const char* const kNames[] = {"vk_step", "vk_wave", "vk_fused", "kv_step", "kv_fused", "tokens"};
  const char* state = plan.state_dtype == DType::kF32 ? "f32" : plan.state_dtype == DType::kF16 ? "f16" : "bf16";
  std::snprintf(buf, size,
                "%s<%s,dk%d,%s%d,io=%s%s%s%s%s%s> grid %u x %u smem %zu cluster %d ipw %d iph %d bph %d%s%s%s%s%s",
                kNames[int(plan.kernel)], state, plan.dk_cap, plan.layout == Layout::kKV ? "w" : "p", plan.tile,
                io_name(plan.io), plan.l2_hints ? ",l2" : "", plan.norm ? ",norm" : "",
                plan.norm_only ? ",norm_only" : "", plan.pdl_twin ? ",pdl" : "", plan.indexed ? ",indexed" : "",
                plan.grid, plan.block, plan.smem, plan.cluster, plan.items_per_warp, plan.items_per_head,
                plan.blocks_per_head, plan.small_loads_first ? " small-first" : "",
                plan.programmatic ? " programmatic" : "", plan.vector_runs ? " vector-runs" : "",
                plan.token_smem.ring_stages > 0 ? " ring" : "", plan.chain > 0 ? " chained one-token launches" : "");
}

}  // namespace gpu
}  // namespace gdn
