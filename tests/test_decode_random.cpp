// Random cases against the float64 reference, over every option of the API
// (the conv1d prologue and the gated RMSNorm epilogue: test_decode_conv_norm.cpp).
//
// Sizes stay small (few heads, small B) except a few 128/256 cases, so the
// whole suite stays fast on the host backend and under the sanitizers.
#include <random>

#include "decode_random.hpp"

namespace gdn_test {
namespace {

using gdn::DType;
using gdn::Gate;
using gdn::HeadMap;
using gdn::IndexType;
using gdn::L2Norm;
using gdn::Layout;

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

}  // namespace
}  // namespace gdn_test
