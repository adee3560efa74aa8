// Randomized validator test: thousands of parameter sets, each a random valid
// call (every valid option drawn at random) plus a random subset of invalid
// mutations. validate() must never crash and must return ok exactly when no
// invalid mutation was applied; with exactly one, the message must name the
// argument that mutation broke.
//
// Pointers are fake, aligned addresses 2^40 bytes apart (validate() never
// dereferences); decode() is never called here.
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "backend_suites.hpp"

namespace gdn_test {
namespace {

using gdn::DecodeParams;
using gdn::DType;

constexpr int64_t kMaxElements = int64_t(1) << 60;

// Region r of the fake address space.
void* fake(int r, size_t offset_bytes = 0) {
  return reinterpret_cast<void*>((uintptr_t(r + 1) << 40) + offset_bytes);
}

enum Region {
  kQ, kK, kV, kA, kB, kALog, kDtBias, kState, kO, kIdx, kOutIdx, kCounter,
  kX, kConvState, kConvWeight, kConvBias, kZ, kNormWeight
};

// Elements of one conv pool slot, for valid strides (validate.cpp's rule).
int64_t conv_span(const DecodeParams& p) {
  const int64_t taps = p.conv_width - 1, cdim = gdn::conv_dim(p);
  return p.conv_state_tap_stride == 1 ? (cdim - 1) * p.conv_state_channel_stride + taps
                                      : (taps - 1) * p.conv_state_tap_stride + cdim;
}

struct Rng {
  std::mt19937_64 g;
  int pick(int n) { return int(g() % uint64_t(n)); }
  bool coin(int one_in = 2) { return pick(one_in) == 0; }
};

// A random valid call. Sizes stay small enough that no extent leaves its region.
DecodeParams random_valid(Rng& r) {
  DecodeParams p;
  const int64_t batches[] = {0, 1, 2, 3, 5, 8, 17, 64};
  p.batch = batches[r.pick(8)];
  p.num_k_heads = 1 << r.pick(3);                         // 1, 2, 4
  const int g = p.num_k_heads == 1 ? 2 + r.pick(2) : 1 + r.pick(3);
  p.num_v_heads = p.num_k_heads * g;                      // Hv >= 2 always
  p.head_dim_k = 16 * (1 + r.pick(16));
  p.head_dim_v = 16 * (1 + r.pick(16));
  p.qkv_dtype = DType(r.pick(3));
  p.ab_dtype = DType(r.pick(3));
  p.o_dtype = DType(r.pick(3));
  p.state_dtype = DType(r.pick(3));
  p.layout = gdn::Layout(r.pick(2));
  p.l2norm = gdn::L2Norm(r.pick(3));
  p.head_map = gdn::HeadMap(r.pick(2));
  p.gate = gdn::Gate(r.pick(2));
  p.scale = r.coin() ? 0.0f : float(int(r.pick(4001)) - 2000) / 1000.0f;
  p.l2norm_eps = r.coin(4) ? 0.0f : std::pow(10.0f, -float(1 + r.pick(12)));

  const int64_t B = p.batch, Hk = p.num_k_heads, Hv = p.num_v_heads;
  const int64_t Dk = p.head_dim_k, Dv = p.head_dim_v;
  auto pad = [&] { return r.coin() ? 0 : int64_t(r.pick(40)); };
  // (rows, heads, dim) strides: heads inner (usual) or heads outer
  auto strides = [&](int64_t heads, int64_t dim, int64_t& bs, int64_t& hs) {
    if (r.coin(4) && B >= 1) {
      bs = dim + pad();
      hs = B * bs + pad();
    } else {
      hs = dim + pad();
      bs = heads * hs + pad();
    }
    if (heads == 1 && r.coin(4)) hs = int64_t(r.pick(3)) - 1;  // unused: anything goes
    if (B <= 1 && r.coin(4)) bs = int64_t(r.pick(3)) - 1;      // unused: anything goes
  };
  if (r.coin(4)) {  // packed mixed_qkv in region q
    const int64_t row = 2 * Hk * Dk + Hv * Dv + pad();
    gdn::set_packed_qkv(p, fake(kQ), row);
  } else {
    p.q = fake(kQ);
    p.k = r.coin(8) ? p.q : fake(kK);  // inputs may alias each other
    p.v = fake(kV);
    strides(Hk, Dk, p.q_batch_stride, p.q_head_stride);
    strides(Hk, Dk, p.k_batch_stride, p.k_head_stride);
    strides(Hv, Dv, p.v_batch_stride, p.v_head_stride);
  }
  strides(Hv, Dv, p.o_batch_stride, p.o_head_stride);
  p.a = fake(kA);
  p.b = fake(kB);
  p.a_batch_stride = Hv + pad();
  p.b_batch_stride = Hv + pad();
  p.o = fake(kO);

  if (p.gate == gdn::Gate::kRaw || r.coin()) {
    p.A_log = static_cast<const float*>(fake(kALog));
    p.dt_bias = static_cast<const float*>(fake(kDtBias));
    // unused with a precomputed gate: may even point into the pool
    if (p.gate == gdn::Gate::kPrecomputed && r.coin(4))
      p.A_log = static_cast<const float*>(fake(kState, 64));
  }

  p.state = fake(kState);
  p.index_dtype = gdn::IndexType(r.pick(3));
  if (p.index_dtype == gdn::IndexType::kNone) {
    p.num_slots = std::max<int64_t>(B, 1) + r.pick(4);
  } else {
    p.num_slots = 1 + r.pick(int(B) + 4);
    p.state_indices = fake(kIdx);
    if (r.coin()) p.state_out_indices = r.coin(4) ? p.state_indices : fake(kOutIdx);
  }
  p.state_slot_stride = Hv * Dk * Dv + pad();
  if (p.num_slots == 1 && r.coin(4)) p.state_slot_stride = 0;  // one slot: any stride >= 0
  if (r.coin()) p.invalid_index_count = static_cast<uint32_t*>(fake(kCounter));

  // the conv prologue (q, k, v null then) and the gated RMSNorm epilogue
  if (r.coin(3)) {
    p.conv_width = 2 + r.pick(3);
    p.q = p.k = p.v = nullptr;
    const int64_t cdim = gdn::conv_dim(p), taps = p.conv_width - 1;
    p.x = fake(kX);
    p.x_batch_stride = cdim + pad();
    if (B <= 1 && r.coin(4)) p.x_batch_stride = int64_t(r.pick(3)) - 1;  // unused
    if (r.coin()) {  // [slot, conv_dim, W-1]
      p.conv_state_tap_stride = 1;
      p.conv_state_channel_stride = taps + (r.coin() ? 0 : r.pick(5));
    } else {  // [slot, W-1, conv_dim]
      p.conv_state_channel_stride = 1;
      p.conv_state_tap_stride = cdim + pad();
      if (taps == 1 && r.coin(4)) p.conv_state_tap_stride = 1 + r.pick(3);  // unused
    }
    p.conv_state_slot_stride = conv_span(p) + pad();
    if (p.num_slots == 1 && r.coin(4)) p.conv_state_slot_stride = 0;  // one slot: any >= 0
    p.conv_state = fake(kConvState);
    p.conv_weight = fake(kConvWeight);
    if (r.coin()) p.conv_bias = fake(kConvBias);
  }
  if (r.coin(3)) {
    p.norm_weight = fake(kNormWeight);
    p.z = fake(kZ);
    strides(Hv, Dv, p.z_batch_stride, p.z_head_stride);
    p.norm_eps = r.coin(4) ? 0.0f : std::pow(10.0f, -float(1 + r.pick(8)));
  }
  p.programmatic_launch = r.coin();
  return p;
}

// An invalid mutation: applicable to the current params, then breaks one rule.
// `names` are the arguments a message may name when it is the only mutation.
struct Invalid {
  std::string label;
  std::function<bool(const DecodeParams&)> applicable;
  std::function<void(DecodeParams&, Rng&)> apply;
  std::vector<std::string> names;
};

bool always(const DecodeParams&) { return true; }

// The pointer field `which` of p: q, k, v, a or b.
const void** ptr_field(DecodeParams& p, int which) {
  switch (which) {
    case 0: return &p.q;
    case 1: return &p.k;
    case 2: return &p.v;
    case 3: return &p.a;
    default: return &p.b;
  }
}

bool conv_on(const DecodeParams& p) { return p.conv_width != 0; }
bool conv_off(const DecodeParams& p) { return p.conv_width == 0; }
bool norm_on(const DecodeParams& p) { return p.norm_weight != nullptr; }

// The mutations, by the rule they break; invalid_mutations() lists them in
// this order.
void add_size_enum_scalar_mutations(std::vector<Invalid>& m) {
  // ---- sizes
  m.push_back({"batch < 0", always, [](DecodeParams& p, Rng& r) { p.batch = -1 - r.pick(1000); },
               {"batch"}});
  m.push_back({"batch > 2^31", always,
               [](DecodeParams& p, Rng& r) { p.batch = (int64_t(1) << 31) + 1 + r.pick(1000); },
               {"batch"}});
  m.push_back({"Hk <= 0", always, [](DecodeParams& p, Rng& r) { p.num_k_heads = -r.pick(3); },
               {"num_k_heads"}});
  m.push_back({"Hv <= 0", always, [](DecodeParams& p, Rng& r) { p.num_v_heads = -r.pick(3); },
               {"num_v_heads"}});
  m.push_back({"Hv % Hk", [](const DecodeParams& p) { return p.num_v_heads > 0; },
               [](DecodeParams& p, Rng&) { p.num_k_heads = p.num_v_heads + 1; },
               {"num_v_heads"}});
  const int bad_dims[] = {0, -16, 8, 17, 100, 257, 272, 512};
  m.push_back({"bad Dk", always,
               [bad_dims](DecodeParams& p, Rng& r) { p.head_dim_k = bad_dims[r.pick(8)]; },
               {"head_dim_k"}});
  m.push_back({"bad Dv", always,
               [bad_dims](DecodeParams& p, Rng& r) { p.head_dim_v = bad_dims[r.pick(8)]; },
               {"head_dim_v"}});
  // ---- enums
  const int bad_enum[] = {-1, 3, 7, 1000, std::numeric_limits<int>::min()};
  auto enum_mut = [&](const char* name, std::function<void(DecodeParams&, int)> set) {
    m.push_back({name, always,
                 [set, bad_enum](DecodeParams& p, Rng& r) { set(p, bad_enum[r.pick(5)]); },
                 {name}});
  };
  enum_mut("qkv_dtype", [](DecodeParams& p, int x) { p.qkv_dtype = DType(x); });
  enum_mut("ab_dtype", [](DecodeParams& p, int x) { p.ab_dtype = DType(x); });
  enum_mut("o_dtype", [](DecodeParams& p, int x) { p.o_dtype = DType(x); });
  enum_mut("state_dtype", [](DecodeParams& p, int x) { p.state_dtype = DType(x); });
  enum_mut("layout", [](DecodeParams& p, int x) { p.layout = gdn::Layout(x); });
  enum_mut("gate", [](DecodeParams& p, int x) { p.gate = gdn::Gate(x); });
  enum_mut("l2norm", [](DecodeParams& p, int x) { p.l2norm = gdn::L2Norm(x); });
  enum_mut("head_map", [](DecodeParams& p, int x) { p.head_map = gdn::HeadMap(x); });
  enum_mut("index_dtype", [](DecodeParams& p, int x) { p.index_dtype = gdn::IndexType(x); });
  // ---- scalars
  m.push_back({"scale not finite", always,
               [](DecodeParams& p, Rng& r) {
                 const float v[] = {std::numeric_limits<float>::quiet_NaN(),
                                    std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity()};
                 p.scale = v[r.pick(3)];
               },
               {"scale"}});
  m.push_back({"eps bad", always,
               [](DecodeParams& p, Rng& r) {
                 const float v[] = {-1e-6f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                                    std::numeric_limits<float>::infinity()};
                 p.l2norm_eps = v[r.pick(4)];
               },
               {"l2norm_eps"}});
}

void add_pointer_mutations(std::vector<Invalid>& m) {
  const char* ptr_names[] = {"q", "k", "v", "a", "b"};
  // ---- pointers
  for (int w = 0; w < 5; ++w) {
    m.push_back({std::string("null ") + ptr_names[w],
                 [w](const DecodeParams& p) { return w >= 3 || p.conv_width == 0; },
                 [w](DecodeParams& p, Rng&) { *ptr_field(p, w) = nullptr; },
                 {ptr_names[w]}});
    m.push_back({std::string("misaligned ") + ptr_names[w], [w](const DecodeParams& p) {
                   return *ptr_field(const_cast<DecodeParams&>(p), w) != nullptr;
                 },
                 [w](DecodeParams& p, Rng&) {
                   const void** f = ptr_field(p, w);
                   *f = static_cast<const char*>(*f) + 1;
                 },
                 {ptr_names[w]}});
  }
  m.push_back({"null state", always, [](DecodeParams& p, Rng&) { p.state = nullptr; }, {"state"}});
  m.push_back({"null o", always, [](DecodeParams& p, Rng&) { p.o = nullptr; }, {"o"}});
  m.push_back({"misaligned state", [](const DecodeParams& p) { return p.state != nullptr; },
               [](DecodeParams& p, Rng&) { p.state = static_cast<char*>(p.state) + 1; },
               {"state"}});
  m.push_back({"misaligned o", [](const DecodeParams& p) { return p.o != nullptr; },
               [](DecodeParams& p, Rng&) { p.o = static_cast<char*>(p.o) + 1; }, {"o"}});
  m.push_back({"null A_log, raw gate", always,
               [](DecodeParams& p, Rng&) {
                 p.gate = gdn::Gate::kRaw;
                 p.A_log = nullptr;
               },
               {"A_log"}});
  m.push_back({"null dt_bias, raw gate", always,
               [](DecodeParams& p, Rng&) {
                 p.gate = gdn::Gate::kRaw;
                 p.dt_bias = nullptr;
               },
               {"dt_bias", "A_log"}});
  m.push_back({"misaligned A_log, raw gate",
               [](const DecodeParams& p) { return p.gate == gdn::Gate::kRaw && p.A_log; },
               [](DecodeParams& p, Rng& r) {
                 p.A_log = reinterpret_cast<const float*>(
                     reinterpret_cast<const char*>(p.A_log) + 1 + r.pick(3));
               },
               {"A_log"}});
  m.push_back({"misaligned counter", [](const DecodeParams& p) { return p.invalid_index_count; },
               [](DecodeParams& p, Rng& r) {
                 p.invalid_index_count = reinterpret_cast<uint32_t*>(
                     reinterpret_cast<char*>(p.invalid_index_count) + 1 + r.pick(3));
               },
               {"invalid_index_count"}});
  m.push_back({"misaligned state_indices",
               [](const DecodeParams& p) {
                 return (p.index_dtype == gdn::IndexType::kI32 ||
                         p.index_dtype == gdn::IndexType::kI64) &&
                        p.state_indices;
               },
               [](DecodeParams& p, Rng&) {
                 p.state_indices = static_cast<const char*>(p.state_indices) + 2;
               },
               {"state_indices"}});
  // ---- index arrays vs their dtype
  m.push_back({"indices, dtype none", always,
               [](DecodeParams& p, Rng&) {
                 p.index_dtype = gdn::IndexType::kNone;
                 p.state_indices = fake(kIdx);
               },
               {"state_indices"}});
  m.push_back({"out indices, dtype none", always,
               [](DecodeParams& p, Rng&) {
                 p.index_dtype = gdn::IndexType::kNone;
                 p.state_indices = nullptr;
                 p.state_out_indices = fake(kOutIdx);
               },
               {"state_out_indices"}});
  m.push_back({"dtype, no indices", always,
               [](DecodeParams& p, Rng& r) {
                 p.index_dtype = r.coin() ? gdn::IndexType::kI32 : gdn::IndexType::kI64;
                 p.state_indices = nullptr;
               },
               {"state_indices"}});
}

void add_stride_pool_alias_mutations(std::vector<Invalid>& m) {
  // ---- strides
  struct T {
    const char* name;
    int64_t DecodeParams::*bs;
    int64_t DecodeParams::*hs;
    bool k_heads;  // heads = Hk (else Hv)
    bool dim_k;
  };
  const T tensors[] = {{"q", &DecodeParams::q_batch_stride, &DecodeParams::q_head_stride, 1, 1},
                       {"k", &DecodeParams::k_batch_stride, &DecodeParams::k_head_stride, 1, 1},
                       {"v", &DecodeParams::v_batch_stride, &DecodeParams::v_head_stride, 0, 0},
                       {"o", &DecodeParams::o_batch_stride, &DecodeParams::o_head_stride, 0, 0}};
  for (const T& t : tensors) {
    auto heads = [t](const DecodeParams& p) { return t.k_heads ? p.num_k_heads : p.num_v_heads; };
    auto dim = [t](const DecodeParams& p) { return t.dim_k ? p.head_dim_k : p.head_dim_v; };
    // q, k, v strides are unused with the conv prologue
    const bool qkv = t.name[0] != 'o';
    auto used = [qkv](const DecodeParams& p) { return !qkv || p.conv_width == 0; };
    m.push_back({std::string(t.name) + " head stride < D",
                 [heads, used](const DecodeParams& p) { return used(p) && heads(p) > 1; },
                 [t, dim](DecodeParams& p, Rng& r) { p.*t.hs = dim(p) - 1 - r.pick(64); },
                 {t.name}});
    m.push_back({std::string(t.name) + " batch stride < D",
                 [used](const DecodeParams& p) { return used(p) && p.batch > 1; },
                 [t, dim](DecodeParams& p, Rng& r) { p.*t.bs = dim(p) - 1 - r.pick(64); },
                 {t.name}});
    m.push_back({std::string(t.name) + " rows overlap",
                 [heads, used](const DecodeParams& p) {
                   return used(p) && p.batch > 1 && heads(p) > 1 && p.head_dim_k > 0 &&
                          p.head_dim_v > 0;
                 },
                 [t, dim](DecodeParams& p, Rng&) {
                   p.*t.bs = dim(p);
                   p.*t.hs = dim(p);
                 },
                 {t.name}});
  }
  m.push_back({"a batch stride < Hv", [](const DecodeParams& p) { return p.batch > 1; },
               [](DecodeParams& p, Rng& r) { p.a_batch_stride = p.num_v_heads - 1 - r.pick(8); },
               {"a"}});
  m.push_back({"b batch stride < Hv", [](const DecodeParams& p) { return p.batch > 1; },
               [](DecodeParams& p, Rng& r) { p.b_batch_stride = p.num_v_heads - 1 - r.pick(8); },
               {"b"}});
  m.push_back({"q reaches past 2^60",
               [](const DecodeParams& p) {
                 return p.conv_width == 0 && p.batch > 1 && p.batch <= (int64_t(1) << 31);
               },
               [](DecodeParams& p, Rng&) {
                 p.q_batch_stride = kMaxElements / (p.batch - 1) + 1;
               },
               {"q"}});
  // ---- the pool
  m.push_back({"num_slots < 1", always,
               [](DecodeParams& p, Rng& r) { p.num_slots = -r.pick(3); }, {"num_slots"}});
  m.push_back({"num_slots < B, no indices",
               [](const DecodeParams& p) {
                 return p.index_dtype == gdn::IndexType::kNone && p.batch >= 2 &&
                        p.state_indices == nullptr && p.state_out_indices == nullptr;
               },
               [](DecodeParams& p, Rng& r) { p.num_slots = 1 + r.pick(int(p.batch) - 1); },
               {"num_slots"}});
  m.push_back({"slot stride < Hv*Dk*Dv",
               [](const DecodeParams& p) {
                 return p.num_slots > 1 && p.num_v_heads > 0 && p.head_dim_k > 0 &&
                        p.head_dim_v > 0;
               },
               [](DecodeParams& p, Rng& r) {
                 p.state_slot_stride =
                     int64_t(p.num_v_heads) * p.head_dim_k * p.head_dim_v - 1 - r.pick(100);
               },
               {"state_slot_stride"}});
  m.push_back({"slot stride < 0", always,
               [](DecodeParams& p, Rng& r) { p.state_slot_stride = -1 - r.pick(100); },
               {"state_slot_stride"}});
  m.push_back({"pool past 2^60", [](const DecodeParams& p) { return p.num_slots >= 1; },
               [](DecodeParams& p, Rng&) {
                 p.state_slot_stride = kMaxElements / p.num_slots + 1;
               },
               {"state_slot_stride"}});
  // ---- aliasing (a written tensor overlaps another)
  auto has_rows = [](const DecodeParams& p) { return p.batch >= 1; };
  m.push_back({"o = state", has_rows, [](DecodeParams& p, Rng&) { p.o = p.state; },
               {"state", "o"}});
  auto rows_no_conv = [](const DecodeParams& p) { return p.batch >= 1 && p.conv_width == 0; };
  m.push_back({"o over v", rows_no_conv,
               [](DecodeParams& p, Rng&) { p.o = const_cast<void*>(p.v); }, {"o"}});
  m.push_back({"state over q", rows_no_conv,
               [](DecodeParams& p, Rng&) { p.state = const_cast<void*>(p.q); }, {"state"}});
  m.push_back({"counter on o", has_rows,
               [](DecodeParams& p, Rng&) { p.invalid_index_count = static_cast<uint32_t*>(p.o); },
               {"o", "state"}});
  m.push_back({"b inside state", has_rows,
               [](DecodeParams& p, Rng&) { p.b = static_cast<const char*>(p.state) + 64; },
               {"state", "b"}});
}

void add_conv_norm_pointer_mutations(std::vector<Invalid>& m) {
  // ---- the conv prologue and the gated RMSNorm epilogue
  m.push_back({"conv_width bad", always,
               [](DecodeParams& p, Rng& r) {
                 const int32_t v[] = {1, 5, -1, 64, std::numeric_limits<int32_t>::min()};
                 p.conv_width = v[r.pick(5)];
               },
               {"conv_width"}});
  const char* qkv_names[] = {"q", "k", "v"};
  const Region qkv_regions[] = {kQ, kK, kV};
  for (int w = 0; w < 3; ++w)
    m.push_back({std::string(qkv_names[w]) + " with conv", conv_on,
                 [w, qkv_regions](DecodeParams& p, Rng&) {
                   *ptr_field(p, w) = fake(qkv_regions[w]);
                 },
                 {qkv_names[w]}});
  struct ConvPtr {
    const char* name;
    Region region;
    bool required;  // null refused with the conv on
  };
  const ConvPtr conv_ptrs[] = {{"x", kX, true},
                               {"conv_state", kConvState, true},
                               {"conv_weight", kConvWeight, true},
                               {"conv_bias", kConvBias, false}};
  auto conv_ptr = [](DecodeParams& p, const std::string& name) -> const void** {
    if (name == "x") return &p.x;
    if (name == "conv_weight") return &p.conv_weight;
    if (name == "conv_bias") return &p.conv_bias;
    return const_cast<const void**>(&p.conv_state);
  };
  for (const ConvPtr& cp : conv_ptrs) {
    const std::string name = cp.name;
    m.push_back({name + " without conv", conv_off,
                 [conv_ptr, name, cp](DecodeParams& p, Rng&) { *conv_ptr(p, name) = fake(cp.region); },
                 {name}});
    if (cp.required)
      m.push_back({"null " + name + " with conv", conv_on,
                   [conv_ptr, name](DecodeParams& p, Rng&) { *conv_ptr(p, name) = nullptr; },
                   {name}});
    m.push_back({"misaligned " + name,
                 [conv_ptr, name](const DecodeParams& p) {
                   return p.conv_width != 0 &&
                          *conv_ptr(const_cast<DecodeParams&>(p), name) != nullptr;
                 },
                 [conv_ptr, name](DecodeParams& p, Rng&) {
                   const void** f = conv_ptr(p, name);
                   *f = static_cast<const char*>(*f) + 1;
                 },
                 {name}});
  }
  m.push_back({"z without norm_weight", [](const DecodeParams& p) { return !p.norm_weight; },
               [](DecodeParams& p, Rng&) { p.z = fake(kZ); }, {"z"}});
  m.push_back({"null z with norm_weight", norm_on, [](DecodeParams& p, Rng&) { p.z = nullptr; },
               {"z"}});
  m.push_back({"misaligned z", norm_on,
               [](DecodeParams& p, Rng&) { p.z = static_cast<const char*>(p.z) + 1; }, {"z"}});
  m.push_back({"misaligned norm_weight", norm_on,
               [](DecodeParams& p, Rng&) {
                 p.norm_weight = static_cast<const char*>(p.norm_weight) + 1;
               },
               {"norm_weight"}});
}

void add_conv_norm_layout_mutations(std::vector<Invalid>& m) {
  m.push_back({"norm_eps bad", always,
               [](DecodeParams& p, Rng& r) {
                 const float v[] = {-1e-6f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                                    std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity()};
                 p.norm_eps = v[r.pick(5)];
               },
               {"norm_eps"}});
  m.push_back({"x batch stride < conv_dim",
               [](const DecodeParams& p) { return p.conv_width != 0 && p.batch > 1; },
               [](DecodeParams& p, Rng& r) { p.x_batch_stride = gdn::conv_dim(p) - 1 - r.pick(64); },
               {"x"}});
  m.push_back({"z head stride < Dv", norm_on,
               [](DecodeParams& p, Rng& r) { p.z_head_stride = p.head_dim_v - 1 - r.pick(16); },
               {"z"}});
  m.push_back({"z batch stride < Dv",
               [](const DecodeParams& p) { return p.norm_weight && p.batch > 1; },
               [](DecodeParams& p, Rng& r) { p.z_batch_stride = p.head_dim_v - 1 - r.pick(16); },
               {"z"}});
  m.push_back({"conv_state strides overlap", conv_on,
               [](DecodeParams& p, Rng& r) {
                 const int64_t taps = p.conv_width - 1;
                 if (taps > 1 && r.coin()) {  // channel-major, channel stride < W-1
                   p.conv_state_tap_stride = 1;
                   p.conv_state_channel_stride = taps - 1;
                 } else if (taps > 1) {  // tap-major, tap stride < conv_dim
                   p.conv_state_channel_stride = 1;
                   p.conv_state_tap_stride = gdn::conv_dim(p) - 1 - r.pick(16);
                 } else {  // neither stride 1
                   p.conv_state_channel_stride = 0;
                   p.conv_state_tap_stride = 2 + r.pick(4);
                 }
               },
               {"conv_state"}});
  m.push_back({"conv_state strides past 2^60", conv_on,
               [](DecodeParams& p, Rng& r) {
                 if (r.coin()) {
                   p.conv_state_tap_stride = 1;
                   p.conv_state_channel_stride = kMaxElements / gdn::conv_dim(p) + 1 + r.pick(99);
                 } else {
                   p.conv_state_channel_stride = 1;
                   p.conv_state_tap_stride = kMaxElements / 4 + 1 + r.pick(99);
                 }
               },
               {"conv_state"}});
  m.push_back({"conv slot stride < span",
               [](const DecodeParams& p) { return p.conv_width != 0 && p.num_slots > 1; },
               [](DecodeParams& p, Rng& r) {
                 p.conv_state_slot_stride = conv_span(p) - 1 - r.pick(100);
               },
               {"conv_state_slot_stride"}});
  m.push_back({"conv slot stride < 0", conv_on,
               [](DecodeParams& p, Rng& r) { p.conv_state_slot_stride = -1 - r.pick(100); },
               {"conv_state_slot_stride"}});
  m.push_back({"conv pool past 2^60",
               [](const DecodeParams& p) { return p.conv_width != 0 && p.num_slots >= 1; },
               [](DecodeParams& p, Rng&) {
                 p.conv_state_slot_stride = kMaxElements / p.num_slots + 1;
               },
               {"conv_state_slot_stride"}});
  m.push_back({"conv_state over state", conv_on,
               [](DecodeParams& p, Rng&) { p.conv_state = p.state; }, {"state", "conv_state"}});
  m.push_back({"conv_state over x",
               [](const DecodeParams& p) { return p.conv_width != 0 && p.batch >= 1; },
               [](DecodeParams& p, Rng&) { p.conv_state = const_cast<void*>(p.x); },
               {"conv_state", "x"}});
  m.push_back({"conv_weight inside conv_state", conv_on,
               [](DecodeParams& p, Rng&) {
                 p.conv_weight = static_cast<const char*>(p.conv_state) + 16;
               },
               {"conv_state", "conv_weight"}});
  m.push_back({"o over z",
               [](const DecodeParams& p) { return p.norm_weight && p.batch >= 1; },
               [](DecodeParams& p, Rng&) { p.o = const_cast<void*>(p.z); }, {"o", "z"}});
  m.push_back({"norm_weight inside state", norm_on,
               [](DecodeParams& p, Rng&) {
                 p.norm_weight = static_cast<const char*>(p.state) + 64;
               },
               {"state", "norm_weight"}});
}

std::vector<Invalid> invalid_mutations() {
  std::vector<Invalid> m;
  add_size_enum_scalar_mutations(m);
  add_pointer_mutations(m);
  add_stride_pool_alias_mutations(m);
  add_conv_norm_pointer_mutations(m);
  add_conv_norm_layout_mutations(m);
  return m;
}

TEST_P(ValidateFuzzTest, RandomParameterSets) {
  constexpr int kIterations = 5000;
  Rng r{std::mt19937_64(424242)};
  const std::vector<Invalid> muts = invalid_mutations();
  std::map<std::string, int> applied_count;
  int accepted = 0, refused = 0;
  for (int it = 0; it < kIterations; ++it) {
    DecodeParams p = random_valid(r);
    // half the sets stay valid; the rest get 1-3 invalid mutations
    const int n_inv = r.coin() ? 0 : 1 + (r.coin(3) ? r.pick(3) : 0);
    std::vector<const Invalid*> applied;
    for (int k = 0; k < n_inv; ++k) {
      const Invalid& m = muts[size_t(r.pick(int(muts.size())))];
      if (!m.applicable(p)) continue;
      m.apply(p, r);
      applied.push_back(&m);
      ++applied_count[m.label];
    }
    const gdn::Status st = gdn::validate(p);
    std::string labels;
    for (const Invalid* m : applied) labels += m->label + "; ";
    if (applied.empty()) {
      ++accepted;
      ASSERT_TRUE(st.ok()) << "iteration " << it << ": a valid set was refused: " << st.message
                           << " (B=" << p.batch << " Hk=" << p.num_k_heads
                           << " Hv=" << p.num_v_heads << " Dk=" << p.head_dim_k
                           << " Dv=" << p.head_dim_v << ")";
    } else {
      ++refused;
      ASSERT_EQ(st.code, gdn::StatusCode::kInvalidArgument)
          << "iteration " << it << ": mutations " << labels << "accepted";
      ASSERT_NE(st.message[0], '\0');
      if (applied.size() == 1) {
        bool named = false;
        for (const std::string& n : applied[0]->names)
          named = named || std::string(st.message).rfind(n + ":", 0) == 0;
        EXPECT_TRUE(named) << "iteration " << it << ": mutation " << labels << "message \""
                           << st.message << "\" does not start with the argument it broke";
      }
    }
  }
  std::printf("  %d valid sets accepted, %d invalid sets refused; %zu of %zu mutations used\n",
              accepted, refused, applied_count.size(), muts.size());
  // every mutation kind was exercised at least once
  for (const Invalid& m : muts) EXPECT_GT(applied_count[m.label], 0) << m.label << " never applied";
  EXPECT_EQ(applied_count.size(), muts.size()) << "mutation labels must be distinct";
}

}  // namespace
}  // namespace gdn_test
