// Tests of the golden-file library's runner: compare must catch wrong results
// and touched slots, and run_case on the host backend must pass analytic cases
// (with and without the conv prologue and the gated RMSNorm) and fail wrong
// expectations, unwritten outputs and a conv state off by one ulp. The reader's
// tests are test_golden_reader.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gdnkit/golden.hpp"
#include "golden_test_util.hpp"

namespace {

using gdn::golden::Case;
using golden_test_util::ramp;
using golden_test_util::to_double;

// ---- compare ----------------------------------------------------------------------

TEST(GoldenCompare, RelativeErrorAndWorstElement) {
  const std::vector<double> ref = {3, 4, 0};
  const auto c = gdn::golden::compare({3, 4.5, 0}, ref, 0.2);
  EXPECT_NEAR(c.rel_l2, 0.1, 1e-12);
  EXPECT_TRUE(c.pass);
  EXPECT_EQ(c.worst_index, 1);
  EXPECT_DOUBLE_EQ(c.worst_got, 4.5);
  EXPECT_DOUBLE_EQ(c.worst_expected, 4);
  EXPECT_FALSE(gdn::golden::compare({3, 4.5, 0}, ref, 0.05).pass);
  // NaN never passes; a size mismatch never passes.
  EXPECT_FALSE(gdn::golden::compare({3, std::nan(""), 0}, ref, 1.0).pass);
  EXPECT_FALSE(gdn::golden::compare({3, 4}, ref, 1.0).pass);
}

TEST(GoldenCompare, UnchangedElementsMustMatchBitwise) {
  const std::vector<double> before = {1.0, 2.0, 3.0};
  const std::vector<double> expected = {1.0, 2.5, 3.0};  // element 1 is updated
  // One ulp off in an untouched element: tiny L2 error, still a failure.
  const auto c = gdn::golden::compare({1.0, 2.5, std::nextafter(3.0, 4.0)}, expected, 1e-3, &before);
  EXPECT_EQ(c.exact_mismatches, 1);
  EXPECT_EQ(c.worst_index, 2);
  EXPECT_FALSE(c.pass);
  // -0.0 where +0.0 was is a write too.
  const std::vector<double> z = {0.0};
  EXPECT_FALSE(gdn::golden::compare({-0.0}, z, 1.0, &z).pass);
  EXPECT_TRUE(gdn::golden::compare({1.0, 2.5 + 1e-9, 3.0}, expected, 1e-6, &before).pass);
}

// ---- run_case: an analytic case on the host backend ---------------------------------
//
// Precomputed gate g = 0, beta = 1, no l2norm, k = e_0: the step replaces row 0
// of S (index i over Dk) by v and leaves the rest, so o = scale * S'^T q is
// easy to form here without a second reference implementation.
Case analytic_case(bool packed) {
  const int64_t B = 3, Hk = 1, Hv = 2, Dk = 16, Dv = 32, S = 3;
  Case c;
  c.path = "analytic";
  gdn::DecodeParams& p = c.params;
  p.batch = B;
  p.num_k_heads = int32_t(Hk);
  p.num_v_heads = int32_t(Hv);
  p.head_dim_k = int32_t(Dk);
  p.head_dim_v = int32_t(Dv);
  p.qkv_dtype = p.ab_dtype = p.o_dtype = p.state_dtype = gdn::DType::kF32;
  p.layout = gdn::Layout::kKV;
  p.gate = gdn::Gate::kPrecomputed;
  p.l2norm = gdn::L2Norm::kNone;
  p.scale = 0.5f;
  p.num_slots = S;
  p.index_dtype = gdn::IndexType::kI32;
  gdn::set_dense_strides(p);
  c.packed_qkv = packed;

  auto bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> r(v.size() * 4);
    std::memcpy(r.data(), v.data(), r.size());
    return r;
  };
  const std::vector<float> q = ramp(B * Hk * Dk, 0.05f, 0.2f);
  std::vector<float> k(size_t(B * Hk * Dk), 0.0f);
  for (int64_t b = 0; b < B; ++b) k[size_t(b * Dk)] = 1.0f;  // k = e_0
  const std::vector<float> v = ramp(B * Hv * Dv, 0.125f, -0.5f);
  const std::vector<float> state = ramp(S * Hv * Dk * Dv, 0.03125f, 0.25f);
  if (packed) {
    const int64_t w = 2 * Hk * Dk + Hv * Dv;
    std::vector<float> m(size_t(B * w));
    for (int64_t b = 0; b < B; ++b) {
      std::copy(q.begin() + b * Dk, q.begin() + (b + 1) * Dk, m.begin() + b * w);
      std::copy(k.begin() + b * Dk, k.begin() + (b + 1) * Dk, m.begin() + b * w + Dk);
      std::copy(v.begin() + b * Hv * Dv, v.begin() + (b + 1) * Hv * Dv, m.begin() + b * w + 2 * Dk);
    }
    c.mixed_qkv = bytes(m);
  } else {
    c.q = bytes(q);
    c.k = bytes(k);
    c.v = bytes(v);
  }
  c.a = bytes(std::vector<float>(size_t(B * Hv), 0.0f));  // g = 0
  c.b = bytes(std::vector<float>(size_t(B * Hv), 1.0f));  // beta = 1
  c.state = bytes(state);
  // row 0 -> slot 2, row 1 padding (-1), row 2 out of range (7): one invalid index
  const std::vector<int32_t> idx = {2, -1, 7};
  c.state_indices.resize(12);
  std::memcpy(c.state_indices.data(), idx.data(), 12);
  c.expected_invalid_indices = 1;

  c.expected_state = to_double(state);
  c.expected_o.assign(size_t(B * Hv * Dv), 0.0);
  const int64_t slot = 2, b = 0;
  for (int64_t h = 0; h < Hv; ++h) {
    double* s = c.expected_state.data() + (slot * Hv + h) * Dk * Dv;  // (Dk, Dv)
    for (int64_t j = 0; j < Dv; ++j) s[j] = v[size_t((b * Hv + h) * Dv + j)];
    for (int64_t j = 0; j < Dv; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < Dk; ++i) acc += s[i * Dv + j] * q[size_t(b * Dk + i)];
      c.expected_o[size_t((b * Hv + h) * Dv + j)] = 0.5 * acc;
    }
  }
  return c;
}

TEST(GoldenRun, AnalyticCasePassesOnHost) {
  for (bool packed : {false, true}) {
    const Case c = analytic_case(packed);
    const auto r = gdn::golden::run_case(c, gdn::Backend::kHost);
    EXPECT_TRUE(r.pass) << r.error << " o " << r.o.rel_l2 << " state " << r.state.rel_l2;
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.invalid_reported, 1u);
    EXPECT_LT(r.o.rel_l2, 1e-6);
    EXPECT_EQ(r.state.exact_mismatches, 0);
    EXPECT_EQ(r.o.tolerance, gdn::golden::output_tolerance(gdn::DType::kF32));
    EXPECT_NE(r.notes.find("Dk=16"), std::string::npos) << r.notes;
    EXPECT_NE(r.notes.find(packed ? "packed" : "gate=precomputed"), std::string::npos) << r.notes;
  }
}

TEST(GoldenRun, WrongExpectationsFail) {
  Case c = analytic_case(false);
  c.expected_o[5] += 1.0;
  auto r = gdn::golden::run_case(c, gdn::Backend::kHost);
  EXPECT_FALSE(r.pass);
  EXPECT_FALSE(r.o.pass);
  EXPECT_EQ(r.o.worst_index, 5);

  c = analytic_case(false);
  c.expected_state[0] += 1.0;  // slot 0 is never written: now the backend "should" have
  r = gdn::golden::run_case(c, gdn::Backend::kHost);
  EXPECT_FALSE(r.state.pass);
  EXPECT_EQ(r.state.worst_index, 0);

  c = analytic_case(false);
  c.expected_invalid_indices = 2;
  r = gdn::golden::run_case(c, gdn::Backend::kHost);
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.error.find("invalid_index_count"), std::string::npos) << r.error;
}

TEST(GoldenRun, DecodeErrorsAreReportedNotThrown) {
  Case c = analytic_case(false);
  c.params.head_dim_k = 15;  // validation refuses it; sizes no longer match either
  const auto r = gdn::golden::run_case(c, gdn::Backend::kHost);
  EXPECT_FALSE(r.pass);
  EXPECT_FALSE(r.error.empty());
}

// ---- run_case: an analytic conv + norm case on the host backend --------------------
//
// Precomputed gate g = 0, beta = 0 and no l2norm: the state passes through
// unchanged and o = scale * S^T q, with q the first Dk channels of the conv
// output y = silu(sum_j w[c, j] window[c, j] + bias[c]). Small enough to form
// here; the golden files hold the real (numpy) reference.
float silu_f(double t) { return float(t / (1.0 + std::exp(-t))); }

Case analytic_conv_case(bool tap_major, bool norm) {
  const int64_t B = 2, Hk = 1, Hv = 1, Dk = 16, Dv = 16, S = 3, W = 3, T = W - 1;
  const int64_t C = 2 * Hk * Dk + Hv * Dv;  // 48
  Case c;
  c.path = "analytic_conv";
  gdn::DecodeParams& p = c.params;
  p.batch = B;
  p.num_k_heads = int32_t(Hk);
  p.num_v_heads = int32_t(Hv);
  p.head_dim_k = int32_t(Dk);
  p.head_dim_v = int32_t(Dv);
  p.qkv_dtype = p.ab_dtype = p.o_dtype = p.state_dtype = gdn::DType::kF32;
  p.layout = gdn::Layout::kKV;
  p.gate = gdn::Gate::kPrecomputed;
  p.l2norm = gdn::L2Norm::kNone;
  p.scale = 0.5f;
  p.num_slots = S;
  p.index_dtype = gdn::IndexType::kI32;
  p.conv_width = int32_t(W);
  p.norm_eps = 1e-5f;
  gdn::set_dense_strides(p);
  if (tap_major) {
    p.conv_state_channel_stride = 1;
    p.conv_state_tap_stride = C;
  }
  c.conv_tap_major = tap_major;

  auto bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> r(v.size() * 4);
    std::memcpy(r.data(), v.data(), r.size());
    return r;
  };
  const std::vector<float> x = ramp(B * C, 0.05f, 0.1f);
  const std::vector<float> w = ramp(C * W, 0.04f, 0.05f);
  const std::vector<float> bias = ramp(C, 0.01f, -0.02f);
  const std::vector<float> conv = ramp(S * C * T, 0.03f, 0.2f);  // as stored
  const std::vector<float> state = ramp(S * Hv * Dk * Dv, 0.03125f, 0.25f);
  const std::vector<float> z = ramp(B * Hv * Dv, 0.1f, 0.3f);
  const std::vector<float> nw = ramp(Dv, 0.02f, 1.0f);
  auto at = [&](int64_t slot, int64_t ch, int64_t t) {
    return slot * C * T + (tap_major ? t * C + ch : ch * T + t);
  };
  c.x = bytes(x);
  c.conv_weight = bytes(w);
  c.conv_bias = bytes(bias);
  c.conv_state = bytes(conv);
  c.state = bytes(state);
  c.a = bytes(std::vector<float>(size_t(B * Hv), 0.0f));  // g = 0
  c.b = bytes(std::vector<float>(size_t(B * Hv), 0.0f));  // beta = 0
  if (norm) {
    c.z = bytes(z);
    c.norm_weight = bytes(nw);
  }
  // row 0: slot 1 in place; row 1: padding
  const std::vector<int32_t> idx = {1, -1};
  c.state_indices.resize(8);
  std::memcpy(c.state_indices.data(), idx.data(), 8);
  c.expected_invalid_indices = 0;

  c.expected_state = to_double(state);
  c.expected_conv_state = to_double(conv);
  c.expected_o.assign(size_t(B * Hv * Dv), 0.0);
  const int64_t slot = 1, row = 0;
  std::vector<double> y(static_cast<size_t>(C));
  for (int64_t ch = 0; ch < C; ++ch) {
    double acc = bias[size_t(ch)];
    for (int64_t j = 0; j < W; ++j) {
      const double win = j < T ? conv[size_t(at(slot, ch, j))] : x[size_t(row * C + ch)];
      acc += w[size_t(ch * W + j)] * win;
    }
    y[size_t(ch)] = acc / (1.0 + std::exp(-acc));
    for (int64_t t = 0; t < T; ++t)  // shift in x
      c.expected_conv_state[size_t(at(slot, ch, t))] =
          t + 1 < T ? conv[size_t(at(slot, ch, t + 1))] : x[size_t(row * C + ch)];
  }
  const float* s = state.data() + slot * Hv * Dk * Dv;  // (Dk, Dv), unchanged by beta = 0
  double ss = 0;
  for (int64_t j = 0; j < Dv; ++j) {
    double acc = 0;
    for (int64_t i = 0; i < Dk; ++i) acc += double(s[i * Dv + j]) * y[size_t(i)];  // q = y[0 .. Dk)
    c.expected_o[size_t(j)] = 0.5 * acc;
    ss += 0.25 * acc * acc;
  }
  if (norm) {
    const double inv = 1.0 / std::sqrt(ss / double(Dv) + 1e-5);
    for (int64_t j = 0; j < Dv; ++j)
      c.expected_o[size_t(j)] *= nw[size_t(j)] * inv * double(silu_f(z[size_t(j)]));
  }
  return c;
}

TEST(GoldenRun, AnalyticConvCasePassesOnHost) {
  for (bool tap_major : {false, true}) {
    for (bool norm : {false, true}) {
      SCOPED_TRACE(std::string(tap_major ? "tap_major" : "channel_major") + (norm ? " norm" : ""));
      const Case c = analytic_conv_case(tap_major, norm);
      const auto r = gdn::golden::run_case(c, gdn::Backend::kHost);
      EXPECT_TRUE(r.error.empty()) << r.error;
      EXPECT_TRUE(r.pass) << " o " << r.o.rel_l2 << " state " << r.state.rel_l2 << " conv "
                          << r.conv_state.exact_mismatches;
      EXPECT_TRUE(r.has_conv_state);
      EXPECT_EQ(r.conv_state.exact_mismatches, 0);
      EXPECT_EQ(r.conv_state.rel_l2, 0.0);
      EXPECT_LT(r.o.rel_l2, 1e-6);
      EXPECT_NE(r.notes.find(tap_major ? "tap_major" : "channel_major"), std::string::npos) << r.notes;
    }
  }
}

TEST(GoldenRun, ConvStateIsComparedBitwise) {
  // One float ulp off, in the written slot and in an untouched one: both fail.
  for (int64_t i : {int64_t(0), int64_t(48 * 2 + 5)}) {  // slot 0 untouched; slot 1 written
    Case c = analytic_conv_case(false, false);
    c.expected_conv_state[size_t(i)] =
        double(std::nextafter(float(c.expected_conv_state[size_t(i)]), 10.0f));
    const auto r = gdn::golden::run_case(c, gdn::Backend::kHost);
    EXPECT_FALSE(r.pass);
    EXPECT_TRUE(r.o.pass);
    EXPECT_FALSE(r.conv_state.pass);
    EXPECT_EQ(r.conv_state.exact_mismatches, 1);
    EXPECT_EQ(r.conv_state.worst_index, i);
  }
  // A v1 case has no conv comparison.
  const auto r = gdn::golden::run_case(analytic_case(false), gdn::Backend::kHost);
  EXPECT_FALSE(r.has_conv_state);
  EXPECT_TRUE(r.pass);
}
}  // namespace
