// Random cases against the float64 reference, for the conv1d prologue and the
// gated RMSNorm epilogue, alone, together and with every other option (the
// decode step's own options: test_decode_random.cpp).
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
