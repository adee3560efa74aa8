// Random cases against the float64 reference, over every option of the API.
//
// Sizes stay small (few heads, small B) except a few 128/256 cases, so the
// whole suite stays fast on the host backend and under the sanitizers.
#include <random>

#include "backend_suites.hpp"
#include "random_case.hpp"

namespace gdn_test {
namespace {

using gdn::DType;
using gdn::Gate;
using gdn::HeadMap;
using gdn::IndexType;
using gdn::L2Norm;
using gdn::Layout;

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr Layout kLayouts[] = {Layout::kKV, Layout::kVK};

void run_all(const std::vector<CaseSpec>& cases, gdn::Backend backend) {
  for (const CaseSpec& c : cases) {
    run_and_check(c, backend);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST_P(DecodeTest, DtypeCombinations) {
  // every q/k/v dtype x state dtype x output dtype; a/b dtype and layout rotate
  std::vector<CaseSpec> cases;
  int n = 0;
  for (DType qkv : kDtypes)
    for (DType st : kDtypes)
      for (DType out : kDtypes) {
        CaseSpec c;
        c.name = "dtypes";
        c.seed = 100 + uint64_t(n);
        c.batch = 3;
        c.hk = 1;
        c.hv = 2;
        c.dk = 64;
        c.dv = 128;
        c.qkv = qkv;
        c.state = st;
        c.out = out;
        c.ab = kDtypes[n % 3];
        c.layout = kLayouts[n % 2];
        cases.push_back(c);
        ++n;
      }
  run_all(cases, backend());
}

TEST_P(DecodeTest, HeadDims) {
  // (Dk, Dv) in {64, 128, 256}^2, Dk != Dv included, both layouts
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int dk : {64, 128, 256})
    for (int dv : {64, 128, 256})
      for (Layout layout : kLayouts) {
        CaseSpec c;
        c.name = "head dims";
        c.seed = 200 + uint64_t(n);
        c.batch = 2;
        c.hk = 1;
        c.hv = 2;
        c.dk = dk;
        c.dv = dv;
        c.layout = layout;
        c.state = n % 2 ? DType::kBF16 : DType::kF32;
        c.out = DType::kF32;
        cases.push_back(c);
        ++n;
      }
  run_all(cases, backend());
}

TEST_P(DecodeTest, GroupSizesAndHeadMaps) {
  // G = Hv / Hk in {1, 2, 3}, Hk in {1, 2, 3}, interleaved and tiled head maps
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int hk : {1, 2, 3})
    for (int g : {1, 2, 3})
      for (HeadMap map : {HeadMap::kInterleaved, HeadMap::kTiled}) {
        CaseSpec c;
        c.name = "group size";
        c.seed = 300 + uint64_t(n);
        c.batch = 2;
        c.hk = hk;
        c.hv = hk * g;
        c.dk = 64;
        c.dv = 128;
        c.head_map = map;
        c.layout = kLayouts[n % 2];
        c.out = DType::kF32;
        cases.push_back(c);
        ++n;
      }
  run_all(cases, backend());
}

TEST_P(DecodeTest, SlotIndices) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 400;
  for (IndexType it : {IndexType::kI32, IndexType::kI64}) {
    CaseSpec base;
    base.index = it;
    base.dk = 64;
    base.dv = 64;
    base.hv = 2;
    base.out = DType::kF32;

    CaseSpec c = base;  // out-of-order slots in a larger pool, padding rows
    c.name = "shuffled slots, padding rows, pool > B";
    c.seed = seed++;
    c.batch = 7;
    c.shuffle_slots = true;
    c.extra_slots = 5;
    c.padding_rows = 2;
    cases.push_back(c);

    c = base;  // separate write slots, some rows write nothing
    c.name = "write indices, negative write index";
    c.seed = seed++;
    c.batch = 8;
    c.shuffle_slots = true;
    c.extra_slots = 3;
    c.out_indices = true;
    c.no_write_rows = 2;
    c.layout = Layout::kKV;
    cases.push_back(c);

    c = base;  // out-of-range indices in both arrays: padding + counted
    c.name = "out-of-range indices";
    c.seed = seed++;
    c.batch = 9;
    c.shuffle_slots = true;
    c.out_indices = true;
    c.bad_in = 2;
    c.bad_out = 2;
    c.padding_rows = 1;
    c.no_write_rows = 1;
    cases.push_back(c);

    c = base;  // out-of-range read index without a counter: still padding
    c.name = "out-of-range without counter";
    c.seed = seed++;
    c.batch = 4;
    c.bad_in = 2;
    c.counter = false;
    cases.push_back(c);

    c = base;  // two rows read one slot and write two others (beam fork)
    c.name = "fork";
    c.seed = seed++;
    c.batch = 5;
    c.out_indices = true;
    c.fork = true;
    c.shuffle_slots = true;
    c.state = DType::kBF16;
    cases.push_back(c);

    c = base;  // every row padding
    c.name = "all rows padding";
    c.seed = seed++;
    c.batch = 3;
    c.padding_rows = 3;
    cases.push_back(c);

    c = base;  // one row, index array
    c.name = "B=1 with index";
    c.seed = seed++;
    c.batch = 1;
    c.shuffle_slots = true;
    c.extra_slots = 6;
    cases.push_back(c);
  }
  CaseSpec c;  // no index array, pool larger than B: the extra slots are untouched
  c.name = "no index, pool > B";
  c.seed = seed++;
  c.batch = 3;
  c.extra_slots = 4;
  c.out = DType::kF32;
  cases.push_back(c);
  run_all(cases, backend());
}

TEST_P(DecodeTest, L2NormModes) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 500;
  for (L2Norm mode : {L2Norm::kRsqrt, L2Norm::kMaxNorm, L2Norm::kNone})
    for (DType qkv : kDtypes) {
      CaseSpec c;
      c.name = "l2norm";
      c.seed = seed++;
      c.batch = 2;
      c.hk = 2;
      c.hv = 4;
      c.dk = 64;
      c.dv = 64;
      c.l2norm = mode;
      c.qkv = qkv;
      c.out = DType::kF32;
      cases.push_back(c);
    }
  for (L2Norm mode : {L2Norm::kRsqrt, L2Norm::kMaxNorm}) {
    CaseSpec c;  // a k below eps (max_norm divides by eps), a zero q, a large eps
    c.name = "l2norm eps branch";
    c.seed = seed++;
    c.batch = 3;
    c.dk = 64;
    c.dv = 64;
    c.l2norm = mode;
    c.eps = 1e-2f;
    c.tiny_k = true;
    c.zero_q = true;
    c.qkv = DType::kF32;
    c.out = DType::kF32;
    cases.push_back(c);
  }
  run_all(cases, backend());
}

TEST_P(DecodeTest, Gates) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 600;
  for (Gate gate : {Gate::kRaw, Gate::kPrecomputed})
    for (DType ab : kDtypes) {
      CaseSpec c;
      c.name = "gate";
      c.seed = seed++;
      c.batch = 3;
      c.dk = 64;
      c.dv = 64;
      c.gate = gate;
      c.ab = ab;
      c.out = DType::kF32;
      cases.push_back(c);
    }
  for (DType ab : kDtypes) {
    CaseSpec c;  // softplus above 20, decay to zero, beta saturated
    c.name = "wide raw gates";
    c.seed = seed++;
    c.batch = 6;
    c.hv = 4;
    c.hk = 2;
    c.dk = 64;
    c.dv = 64;
    c.ab = ab;
    c.wide_gates = true;
    c.out = DType::kF32;
    c.layout = kLayouts[seed % 2];
    cases.push_back(c);
  }
  CaseSpec c;  // precomputed gate needs no A_log / dt_bias
  c.name = "precomputed gate, null A_log and dt_bias";
  c.seed = seed++;
  c.gate = Gate::kPrecomputed;
  c.null_gate_params = true;
  c.layout = Layout::kKV;
  cases.push_back(c);
  run_all(cases, backend());
}

TEST_P(DecodeTest, PackedQkv) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 700;
  for (DType qkv : kDtypes)
    for (int64_t pad : {0, 24}) {
      CaseSpec c;
      c.name = "packed mixed_qkv";
      c.seed = seed++;
      c.batch = 3;
      c.hk = 2;
      c.hv = 4;
      c.dk = 128;
      c.dv = 64;
      c.qkv = qkv;
      c.packed_qkv = true;
      c.pad_batch = pad;
      c.layout = kLayouts[seed % 2];
      c.out = DType::kF32;
      cases.push_back(c);
    }
  run_all(cases, backend());
}

TEST_P(DecodeTest, Strides) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 800;
  struct Pads {
    int64_t head, batch, slot;
    bool k_outer;
  };
  // slot padding keeps slots 16-byte aligned (pools are); OddSlotStride covers the rest
  for (Pads pads : {Pads{16, 0, 0, false}, Pads{0, 24, 0, false}, Pads{0, 0, 40, false},
                    Pads{8, 40, 104, false}, Pads{0, 0, 0, true}, Pads{16, 8, 24, true}})
    for (Layout layout : kLayouts) {
      CaseSpec c;
      c.name = "padded strides";
      c.seed = seed++;
      c.batch = 3;
      c.hk = 2;
      c.hv = 4;
      c.dk = 64;
      c.dv = 128;
      c.layout = layout;
      c.pad_head = pads.head;
      c.pad_batch = pads.batch;
      c.pad_slot = pads.slot;
      c.k_heads_outer = pads.k_outer;
      c.state = seed % 3 ? DType::kF32 : DType::kF16;
      c.out = DType::kF32;
      c.index = seed % 2 ? IndexType::kI32 : IndexType::kNone;
      c.shuffle_slots = true;
      c.extra_slots = 2;
      cases.push_back(c);
    }
  run_all(cases, backend());
}

TEST_P(DecodeTest, CustomScale) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 900;
  for (float scale : {0.0f, 1.0f, 0.5f, -0.25f, 3.0e-3f}) {
    CaseSpec c;
    c.name = "scale";
    c.seed = seed++;
    c.batch = 2;
    c.dk = 128;
    c.dv = 64;
    c.scale = scale;
    c.out = DType::kF32;
    cases.push_back(c);
  }
  run_all(cases, backend());
}

TEST_P(DecodeTest, BatchSizes) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 1000;
  for (int64_t B : {1, 2, 5, 17}) {
    CaseSpec c;
    c.name = "batch";
    c.seed = seed++;
    c.batch = B;
    c.hk = 1;
    c.hv = 2;
    c.dk = 64;
    c.dv = 64;
    c.index = B > 2 ? IndexType::kI64 : IndexType::kNone;
    c.shuffle_slots = true;
    c.padding_rows = B > 4 ? 2 : 0;
    cases.push_back(c);
  }
  run_all(cases, backend());
}

TEST_P(DecodeTest, ModelShapes) {
  // the tuned 128 x 128 head at a small tensor-parallel slice, both layouts
  // and both common state dtypes; one 256 x 256 case
  std::vector<CaseSpec> cases;
  uint64_t seed = 1100;
  for (Layout layout : kLayouts)
    for (DType st : {DType::kF32, DType::kBF16}) {
      CaseSpec c;
      c.name = "128x128, Hk=2 Hv=4";
      c.seed = seed++;
      c.batch = 4;
      c.hk = 2;
      c.hv = 4;
      c.dk = 128;
      c.dv = 128;
      c.layout = layout;
      c.state = st;
      c.index = IndexType::kI32;
      c.shuffle_slots = true;
      c.padding_rows = 1;
      c.extra_slots = 2;
      cases.push_back(c);
    }
  CaseSpec c;
  c.name = "256x256, G=2";
  c.seed = seed++;
  c.batch = 2;
  c.hk = 1;
  c.hv = 2;
  c.dk = 256;
  c.dv = 256;
  c.qkv = DType::kF16;
  c.out = DType::kF16;
  c.state = DType::kF16;
  cases.push_back(c);
  run_all(cases, backend());
}

// A slot stride that leaves slots only element-aligned is valid; a backend
// may refuse it (kUnsupported, nothing written), the host must run it.
TEST_P(DecodeTest, OddSlotStride) {
  uint64_t seed = 1300;
  for (DType st : kDtypes)
    for (int64_t pad : {1, 3, 17}) {
      CaseSpec c;
      c.name = "odd slot stride";
      c.seed = seed++;
      c.batch = 3;
      c.dk = 64;
      c.dv = 64;
      c.state = st;
      c.pad_slot = pad;
      c.index = IndexType::kI32;
      c.shuffle_slots = true;
      c.extra_slots = 1;
      run_and_check(c, backend(), /*allow_unsupported=*/backend() != gdn::Backend::kHost);
      if (HasFatalFailure()) return;
    }
}

// Head dims the contract allows (multiples of 16 up to 256) beyond the three
// that every backend must run: a backend may answer kUnsupported, and then
// must write nothing; when it runs them, the results must be right.
TEST_P(DecodeTest, OtherHeadDims) {
  uint64_t seed = 1200;
  for (int dk : {16, 48, 96, 240})
    for (int dv : {32, 80, 256}) {
      CaseSpec c;
      c.name = "uncommon head dims";
      c.seed = seed++;
      c.batch = 2;
      c.hk = 1;
      c.hv = 2;
      c.dk = dk;
      c.dv = dv;
      c.layout = kLayouts[seed % 2];
      c.out = DType::kF32;
      run_and_check(c, backend(), /*allow_unsupported=*/backend() != gdn::Backend::kHost);
      if (HasFatalFailure()) return;
    }
}

// Of `rows` rows, how many are padding rows, rows with an out-of-range read
// index and (with a write index array) rows that write nothing or an
// out-of-range slot: at most 2, 1, 2 and 1, drawn in that order.
template <typename Pick>
void draw_special_rows(CaseSpec& c, int64_t rows, Pick& pick) {
  int64_t left = rows;
  auto some = [&](int most) {
    const int k = int(std::min<int64_t>(left, pick(most + 1)));
    left -= k;
    return k;
  };
  c.padding_rows = some(2);
  c.bad_in = some(1);
  if (c.out_indices) {
    c.no_write_rows = some(2);
    c.bad_out = some(1);
  }
}

// Random combinations of every option at once.
TEST_P(DecodeTest, RandomSweep) {
  std::mt19937_64 rng(20240601);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  std::vector<CaseSpec> cases;
  for (int n = 0; n < 160; ++n) {
    CaseSpec c;
    c.name = "random sweep #" + std::to_string(n);
    c.seed = 5000 + uint64_t(n);
    const int dims[] = {64, 64, 64, 128, 256};
    c.dk = dims[pick(5)];
    c.dv = dims[pick(5)];
    // keep the work per case small when the heads are large
    const bool big = c.dk * c.dv > 64 * 128;
    c.hk = 1 + pick(big ? 1 : 3);
    c.hv = c.hk * (1 + pick(3));
    c.batch = 1 + pick(big ? 3 : 17);
    c.qkv = kDtypes[pick(3)];
    c.ab = kDtypes[pick(3)];
    c.state = kDtypes[pick(3)];
    c.out = kDtypes[pick(3)];
    c.layout = kLayouts[pick(2)];
    c.l2norm = L2Norm(pick(3));
    c.head_map = HeadMap(pick(2));
    c.gate = Gate(pick(2));
    c.wide_gates = c.gate == Gate::kRaw && pick(4) == 0;
    c.null_gate_params = c.gate == Gate::kPrecomputed && pick(2);
    c.scale = pick(3) ? 0.0f : float(0.05 + 0.5 * (rng() % 1000) / 1000.0);
    c.index = IndexType(pick(3));
    c.extra_slots = pick(4);
    if (c.index != IndexType::kNone) {
      c.shuffle_slots = pick(2);
      c.out_indices = pick(2);
      const int64_t rows = c.batch - (c.out_indices && c.batch >= 2 && pick(2) ? 2 : 0);
      c.fork = c.out_indices && rows != c.batch;
      draw_special_rows(c, rows, pick);
    }
    c.counter = pick(4) != 0;
    c.packed_qkv = pick(4) == 0;
    c.k_heads_outer = !c.packed_qkv && pick(4) == 0;
    c.pad_head = pick(3) == 0 ? 16 * (1 + pick(2)) : 0;
    c.pad_batch = pick(3) == 0 ? 1 + pick(40) : 0;
    c.pad_slot = pick(3) == 0 ? 8 * (1 + pick(12)) : 0;  // slots stay 16-byte aligned
    cases.push_back(c);
  }
  run_all(cases, backend());
}

// ---- the conv1d prologue and the gated RMSNorm epilogue ------------------------
// (params.hpp: conv_width / x / conv_state / conv_weight / conv_bias, and
// z / norm_weight / norm_eps). Each CaseSpec its own fixed seed, 1400 and up.

// A small conv case: B=3, Hk=1, Hv=2, Dk=64 != Dv=128.
CaseSpec conv_base(const char* name, uint64_t seed, int w) {
  CaseSpec c;
  c.name = name;
  c.seed = seed;
  c.batch = 3;
  c.hk = 1;
  c.hv = 2;
  c.dk = 64;
  c.dv = 128;
  c.conv_width = w;
  c.out = DType::kF32;
  return c;
}

TEST_P(DecodeTest, ConvWidthsAndLayouts) {
  // W in {2, 3, 4} x conv pool layout x state layout; bias on and off,
  // the qkv dtype and the state dtype rotate
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int w : {2, 3, 4})
    for (bool tap_major : {false, true})
      for (Layout layout : kLayouts) {
        CaseSpec c = conv_base("conv width x layouts", 1400 + uint64_t(n), w);
        c.conv_tap_major = tap_major;
        c.layout = layout;
        c.conv_bias = n % 2 == 0;
        c.qkv = kDtypes[n % 3];
        c.state = n % 4 < 2 ? DType::kF32 : DType::kBF16;
        cases.push_back(c);
        ++n;
      }
  run_all(cases, backend());
}

TEST_P(DecodeTest, ConvDtypes) {
  // qkv (x, conv state, weight, bias) in bf16 / fp16 / fp32 x state fp32 / bf16;
  // the output in the qkv dtype, and once more in fp32
  std::vector<CaseSpec> cases;
  uint64_t seed = 1420;
  for (DType qkv : kDtypes)
    for (DType st : {DType::kF32, DType::kBF16})
      for (bool out_f32 : {false, true}) {
        CaseSpec c = conv_base("conv dtypes", seed++, 4);
        c.qkv = qkv;
        c.ab = qkv;
        c.state = st;
        c.out = out_f32 ? DType::kF32 : qkv;
        c.conv_bias = true;
        c.conv_tap_major = seed % 2 == 0;
        c.layout = kLayouts[seed % 2];
        cases.push_back(c);
      }
  run_all(cases, backend());
}

TEST_P(DecodeTest, ConvHeadDimsGroupsAndBatch) {
  std::vector<CaseSpec> cases;
  uint64_t seed = 1440;
  // head dims: Dk != Dv both ways, 128 x 128, 256 x 256, 64 x 256
  struct Dims {
    int dk, dv;
  };
  for (Dims d : {Dims{64, 128}, Dims{128, 64}, Dims{64, 64}, Dims{128, 128}, Dims{256, 256},
                 Dims{64, 256}})
    for (Layout layout : kLayouts) {
      CaseSpec c = conv_base("conv head dims", seed++, d.dk == d.dv ? 4 : 3);
      c.batch = 2;
      c.dk = d.dk;
      c.dv = d.dv;
      c.layout = layout;
      c.conv_bias = true;
      c.conv_tap_major = layout == Layout::kKV;
      c.state = d.dk == 256 ? DType::kBF16 : DType::kF32;
      cases.push_back(c);
    }
  // G = 1, 2, 4 with Hk = 2, interleaved and tiled head maps
  for (int g : {1, 2, 4})
    for (HeadMap map : {HeadMap::kInterleaved, HeadMap::kTiled}) {
      CaseSpec c = conv_base("conv group size / head map", seed++, 4);
      c.hk = 2;
      c.hv = 2 * g;
      c.head_map = map;
      c.conv_bias = g != 2;
      c.conv_tap_major = map == HeadMap::kTiled;
      c.layout = kLayouts[seed % 2];
      cases.push_back(c);
    }
  // batch sizes 1, 3, 33
  for (int64_t B : {1, 3, 33}) {
    CaseSpec c = conv_base("conv batch", seed++, 4);
    c.batch = B;
    c.hk = 2;
    c.hv = 4;
    c.dk = 128;
    c.dv = 128;
    c.qkv = DType::kBF16;
    c.state = B == 3 ? DType::kBF16 : DType::kF32;
    c.out = DType::kBF16;
    c.conv_bias = true;
    c.conv_tap_major = B == 33;
    c.layout = kLayouts[B % 2];
    cases.push_back(c);
  }
  // l2norm max_norm on the conv's q and k
  CaseSpec c = conv_base("conv, max_norm l2norm", seed++, 2);
  c.l2norm = L2Norm::kMaxNorm;
  c.conv_bias = true;
  cases.push_back(c);
  // precomputed gate with the conv
  c = conv_base("conv, precomputed gate", seed++, 3);
  c.gate = Gate::kPrecomputed;
  c.null_gate_params = true;
  c.conv_tap_major = true;
  cases.push_back(c);
  run_all(cases, backend());
}

TEST_P(DecodeTest, ConvSlots) {
  // the conv pool shares the state pool's slots: read at s_in, write at
  // s_out, padding rows and no-write rows touch neither pool
  std::vector<CaseSpec> cases;
  uint64_t seed = 1480;
  for (IndexType it : {IndexType::kI32, IndexType::kI64})
    for (bool tap_major : {false, true}) {
      CaseSpec base = conv_base("", 0, it == IndexType::kI32 ? 4 : 3);
      base.index = it;
      base.conv_tap_major = tap_major;
      base.conv_bias = true;
      base.layout = tap_major ? Layout::kKV : Layout::kVK;

      CaseSpec c = base;
      c.name = "conv: shuffled slots, padding rows, pool > B";
      c.seed = seed++;
      c.batch = 7;
      c.shuffle_slots = true;
      c.extra_slots = 5;
      c.padding_rows = 2;
      cases.push_back(c);

      c = base;  // write slots apart from read slots, every third row in place
      c.name = "conv: write indices, negative write index";
      c.seed = seed++;
      c.batch = 8;
      c.shuffle_slots = true;
      c.extra_slots = 3;
      c.out_indices = true;
      c.no_write_rows = 2;
      cases.push_back(c);

      c = base;  // out-of-range indices in both arrays: padding + counted
      c.name = "conv: out-of-range indices";
      c.seed = seed++;
      c.batch = 9;
      c.shuffle_slots = true;
      c.out_indices = true;
      c.bad_in = 2;
      c.bad_out = 2;
      c.padding_rows = 1;
      c.no_write_rows = 1;
      c.state = DType::kBF16;
      cases.push_back(c);

      c = base;  // two rows read one slot and write two others
      c.name = "conv: fork";
      c.seed = seed++;
      c.batch = 5;
      c.out_indices = true;
      c.fork = true;
      c.shuffle_slots = true;
      cases.push_back(c);

      c = base;  // every row padding: nothing written anywhere
      c.name = "conv: all rows padding";
      c.seed = seed++;
      c.batch = 3;
      c.padding_rows = 3;
      cases.push_back(c);

      c = base;  // one row in a large pool
      c.name = "conv: B=1 with index";
      c.seed = seed++;
      c.batch = 1;
      c.shuffle_slots = true;
      c.extra_slots = 6;
      c.conv_width = 2;
      cases.push_back(c);

      c = base;  // a larger batch with everything at once
      c.name = "conv: B=33, write indices, padding, out of range";
      c.seed = seed++;
      c.batch = 33;
      c.hk = 2;
      c.hv = 4;
      c.shuffle_slots = true;
      c.extra_slots = 4;
      c.out_indices = true;
      c.padding_rows = 3;
      c.no_write_rows = 3;
      c.bad_in = 1;
      c.bad_out = 2;
      c.qkv = DType::kF16;
      cases.push_back(c);
    }
  CaseSpec c = conv_base("conv: no index, pool > B", seed++, 4);
  c.extra_slots = 3;
  cases.push_back(c);
  c = conv_base("conv: out-of-range read without counter", seed++, 3);
  c.index = IndexType::kI32;
  c.batch = 4;
  c.bad_in = 2;
  c.counter = false;
  cases.push_back(c);
  run_all(cases, backend());
}

TEST_P(DecodeTest, ConvStrides) {
  // padded x rows, padded conv pool (channel / tap stride and slot stride),
  // padded o heads; slot pads keep slots 16-byte aligned
  std::vector<CaseSpec> cases;
  uint64_t seed = 1520;
  struct Pads {
    int64_t batch, slot, conv, head;
  };
  for (Pads pads : {Pads{24, 0, 0, 0}, Pads{0, 40, 0, 0}, Pads{0, 0, 5, 0}, Pads{7, 24, 3, 16},
                    Pads{40, 104, 16, 8}})
    for (bool tap_major : {false, true}) {
      const int w = int(2 + seed % 3);
      CaseSpec c = conv_base("conv padded strides", seed++, w);
      c.hk = 2;
      c.hv = 4;
      c.conv_tap_major = tap_major;
      c.pad_batch = pads.batch;
      c.pad_slot = pads.slot;
      c.conv_pad = pads.conv;
      c.pad_head = pads.head;
      c.conv_bias = seed % 2 == 1;
      c.layout = kLayouts[seed % 2];
      c.qkv = kDtypes[seed % 3];
      c.index = seed % 2 ? IndexType::kI32 : IndexType::kNone;
      c.shuffle_slots = true;
      c.extra_slots = 2;
      cases.push_back(c);
    }
  run_all(cases, backend());
}

TEST_P(DecodeTest, NormEpilogue) {
  // gated RMSNorm alone (q, k, v given): dtypes, layouts, Dk != Dv, G, eps
  std::vector<CaseSpec> cases;
  uint64_t seed = 1560;
  for (DType qkv : kDtypes)
    for (DType out : kDtypes) {
      CaseSpec c;
      c.name = "norm dtypes";
      c.seed = seed++;
      c.batch = 3;
      c.hk = 1;
      c.hv = 2;
      c.dk = 64;
      c.dv = 128;
      c.qkv = qkv;
      c.out = out;
      c.state = seed % 2 ? DType::kF32 : DType::kBF16;
      c.layout = kLayouts[seed % 2];
      c.norm = true;
      cases.push_back(c);
    }
  struct Dims {
    int dk, dv;
  };
  for (Dims d : {Dims{128, 64}, Dims{64, 64}, Dims{128, 128}, Dims{256, 256}})
    for (Layout layout : kLayouts) {
      CaseSpec c;
      c.name = "norm head dims";
      c.seed = seed++;
      c.batch = 2;
      c.hk = 1;
      c.hv = 2;
      c.dk = d.dk;
      c.dv = d.dv;
      c.layout = layout;
      c.out = DType::kF32;
      c.norm = true;
      cases.push_back(c);
    }
  for (int g : {1, 2, 4}) {
    CaseSpec c;
    c.name = "norm group size, tiled";
    c.seed = seed++;
    c.batch = 3;
    c.hk = 2;
    c.hv = 2 * g;
    c.dk = 64;
    c.dv = 64;
    c.head_map = g == 2 ? HeadMap::kTiled : HeadMap::kInterleaved;
    c.out = DType::kF32;
    c.norm = true;
    cases.push_back(c);
  }
  // eps comparable to mean(o^2) (~1e-3 here) and above it: eps must be honoured
  for (float eps : {1e-3f, 1e-2f}) {
    CaseSpec c;
    c.name = "norm eps";
    c.seed = seed++;
    c.batch = 3;
    c.dk = 64;
    c.dv = 64;
    c.out = DType::kF32;
    c.norm = true;
    c.norm_eps = eps;
    cases.push_back(c);
  }
  // padding rows stay zero; padded z / o strides; B = 1 and 33
  for (int64_t B : {1, 3, 33}) {
    CaseSpec c;
    c.name = "norm with slots and padded strides";
    c.seed = seed++;
    c.batch = B;
    c.hk = 2;
    c.hv = 4;
    c.dk = 64;
    c.dv = 128;
    c.index = B == 33 ? IndexType::kI64 : IndexType::kI32;
    c.shuffle_slots = true;
    c.extra_slots = 2;
    c.padding_rows = B > 1 ? 1 : 0;
    c.out_indices = B == 33;
    c.no_write_rows = B == 33 ? 2 : 0;
    c.pad_head = 16;
    c.pad_batch = 9;
    c.state = DType::kBF16;
    c.layout = kLayouts[B % 2];
    c.norm = true;
    cases.push_back(c);
  }
  CaseSpec c;  // with a packed mixed_qkv
  c.name = "norm with packed mixed_qkv";
  c.seed = seed++;
  c.batch = 3;
  c.hk = 2;
  c.hv = 4;
  c.dk = 128;
  c.dv = 64;
  c.packed_qkv = true;
  c.pad_batch = 24;
  c.norm = true;
  cases.push_back(c);
  run_all(cases, backend());
}

TEST_P(DecodeTest, ConvAndNorm) {
  // both stages at once
  std::vector<CaseSpec> cases;
  uint64_t seed = 1600;
  for (int w : {2, 3, 4})
    for (Layout layout : kLayouts) {
      CaseSpec c = conv_base("conv + norm", seed++, w);
      c.layout = layout;
      c.conv_tap_major = (w + int(layout)) % 2 == 0;
      c.conv_bias = w != 3;
      c.qkv = kDtypes[seed % 3];
      c.out = kDtypes[(seed + 1) % 3];
      c.norm = true;
      cases.push_back(c);
    }
  for (DType qkv : kDtypes)
    for (DType st : {DType::kF32, DType::kBF16}) {
      CaseSpec c = conv_base("conv + norm, 128x128 Hk=2 Hv=4, slots", seed++, 4);
      c.batch = 5;
      c.hk = 2;
      c.hv = 4;
      c.dk = 128;
      c.dv = 128;
      c.qkv = qkv;
      c.ab = qkv;
      c.out = qkv;
      c.state = st;
      c.layout = kLayouts[seed % 2];
      c.conv_tap_major = seed % 3 == 0;
      c.conv_bias = true;
      c.norm = true;
      c.index = IndexType::kI32;
      c.shuffle_slots = true;
      c.padding_rows = 1;
      c.extra_slots = 2;
      cases.push_back(c);
    }
  CaseSpec c = conv_base("conv + norm, Dk=128 Dv=64, G=4 tiled", seed++, 4);
  c.hk = 1;
  c.hv = 4;
  c.dk = 128;
  c.dv = 64;
  c.head_map = HeadMap::kTiled;
  c.norm = true;
  c.norm_eps = 1e-3f;
  cases.push_back(c);
  c = conv_base("conv + norm, 256x256", seed++, 4);
  c.batch = 2;
  c.dk = 256;
  c.dv = 256;
  c.qkv = DType::kF16;
  c.out = DType::kF16;
  c.state = DType::kBF16;
  c.conv_bias = true;
  c.norm = true;
  cases.push_back(c);
  c = conv_base("conv + norm, B=33, int64 write indices, out of range", seed++, 4);
  c.batch = 33;
  c.hk = 2;
  c.hv = 4;
  c.index = IndexType::kI64;
  c.shuffle_slots = true;
  c.out_indices = true;
  c.padding_rows = 2;
  c.no_write_rows = 2;
  c.bad_in = 1;
  c.bad_out = 1;
  c.pad_batch = 11;
  c.pad_head = 16;
  c.pad_slot = 8;
  c.conv_pad = 2;
  c.conv_tap_major = true;
  c.conv_bias = true;
  c.norm = true;
  cases.push_back(c);
  run_all(cases, backend());
}

// Random combinations of the new options with the old ones (its own
// generator: RandomSweep's cases stay as they were).
TEST_P(DecodeTest, ConvNormRandomSweep) {
  std::mt19937_64 rng(20250301);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  std::vector<CaseSpec> cases;
  for (int n = 0; n < 48; ++n) {
    CaseSpec c;
    c.name = "conv/norm random sweep #" + std::to_string(n);
    c.seed = 6000 + uint64_t(n);
    const int dims[] = {64, 64, 128, 256};
    c.dk = dims[pick(4)];
    c.dv = dims[pick(4)];
    const bool big = c.dk * c.dv > 64 * 128;
    c.hk = 1 + pick(big ? 1 : 2);
    c.hv = c.hk * (1 << pick(3));
    c.batch = 1 + pick(big ? 3 : 12);
    c.qkv = kDtypes[pick(3)];
    c.ab = kDtypes[pick(3)];
    c.state = kDtypes[pick(3)];
    c.out = kDtypes[pick(3)];
    c.layout = kLayouts[pick(2)];
    c.head_map = HeadMap(pick(2));
    c.gate = Gate(pick(2));
    const int stages = pick(3);  // 0: conv, 1: norm, 2: both
    c.conv_width = stages != 1 ? 2 + pick(3) : 0;
    c.norm = stages != 0;
    c.conv_tap_major = pick(2);
    c.conv_bias = pick(2);
    c.conv_pad = pick(3) == 0 ? 1 + pick(8) : 0;
    c.norm_eps = pick(3) == 0 ? 1e-3f : 1e-6f;
    c.index = IndexType(pick(3));
    c.extra_slots = pick(3);
    if (c.index != IndexType::kNone) {
      c.shuffle_slots = pick(2);
      c.out_indices = pick(2);
      draw_special_rows(c, c.batch, pick);
    }
    c.counter = pick(4) != 0;
    c.packed_qkv = c.conv_width == 0 && pick(3) == 0;
    c.pad_head = pick(3) == 0 ? 16 : 0;
    c.pad_batch = pick(3) == 0 ? 1 + pick(40) : 0;
    c.pad_slot = pick(3) == 0 ? 8 * (1 + pick(12)) : 0;
    cases.push_back(c);
  }
  run_all(cases, backend());
}

}  // namespace
}  // namespace gdn_test
