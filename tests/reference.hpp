// gdnkit tests — an independent float64 reference of one GDN decode step.
//
// Written apart from the library on purpose: it never calls a backend or the
// validation, it works on logical dense arrays (already widened from the
// stored, rounded values), and it forms the output in the ONE-PASS form
//   o = scale * (exp(g) * (S_old^T q̂) + (k̂ · q̂) * delta)
// while the host backend uses the two-pass form (o = scale * S_new^T q̂).
// Both must agree within the tolerances of docs/operation.md, Numerics.
//
// The two optional stages (params.hpp is their contract):
//  - conv1d prologue (conv_width W > 0): per row, per channel c of the packed
//    q|k|v row (conv_dim = 2*Hk*Dk + Hv*Dv channels),
//      window = (conv_pool[s_in, c, 0 .. W-2], x[b, c])     oldest first
//      y[c]   = silu(sum_j conv_weight[c, j] * window[j] + conv_bias[c])
//      conv_pool[s_out, c, 0 .. W-2] = window[1 .. W-1]
//    and y (never rounded) is the q|k|v row of the step. The conv pool is
//    the logical (num_slots, conv_dim, W-1) array; same slots and padding
//    rules as the state pool.
//  - gated RMSNorm epilogue (norm): per (row, v-head), over Dv,
//      o[j] = norm_weight[j] * o[j] / sqrt(mean(o^2) + norm_eps) * silu(z[j]).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gdnkit/types.hpp"

namespace gdn_test {

// Inputs of one step as logical, dense float64 arrays.
struct RefProblem {
  int64_t B{0}, Hk{0}, Hv{0}, Dk{0}, Dv{0};
  int64_t num_slots{0};
  gdn::Gate gate{gdn::Gate::kRaw};
  gdn::L2Norm l2norm{gdn::L2Norm::kRsqrt};
  double eps{1e-6};
  gdn::HeadMap head_map{gdn::HeadMap::kInterleaved};
  double scale{0.0};  // the scale in effect (already resolved from 0 -> Dk^-0.5)

  std::vector<double> q, k;          // (B, Hk, Dk)
  std::vector<double> v;             // (B, Hv, Dv)
  std::vector<double> a, b;          // (B, Hv)
  std::vector<double> A_log, dt_bias;  // (Hv); unused with a precomputed gate
  std::vector<int64_t> in_idx;       // (B) or empty: slot_of(b) = b
  std::vector<int64_t> out_idx;      // (B) or empty: write slot = read slot

  // ---- conv1d prologue (conv_width > 0): q, k, v above are then unused
  int64_t conv_width{0};             // W in {2, 3, 4}; 0 = off
  std::vector<double> x;             // (B, conv_dim)
  std::vector<double> conv_weight;   // (conv_dim, W)
  std::vector<double> conv_bias;     // (conv_dim) or empty: no bias

  // ---- gated RMSNorm epilogue
  bool norm{false};
  std::vector<double> z;             // (B, Hv, Dv)
  std::vector<double> norm_weight;   // (Dv)
  double norm_eps{1e-6};
};

inline int64_t ref_conv_dim(const RefProblem& P) { return 2 * P.Hk * P.Dk + P.Hv * P.Dv; }

// The conv pool as a logical array: (num_slots, conv_dim, W-1), element
// (s, c, t) with t = 0 the oldest tap, whatever the storage layout.
inline int64_t conv_pool_index(const RefProblem& P, int64_t s, int64_t c, int64_t t) {
  return (s * ref_conv_dim(P) + c) * (P.conv_width - 1) + t;
}

// The pool as a logical array: (num_slots, Hv, Dk, Dv), element (s, h, i, j)
// with i over Dk and j over Dv, whatever the storage layout.
inline int64_t pool_index(const RefProblem& P, int64_t s, int64_t h, int64_t i, int64_t j) {
  return ((s * P.Hv + h) * P.Dk + i) * P.Dv + j;
}

struct RefResult {
  std::vector<double> o;           // (B, Hv, Dv); zero rows for padding
  std::vector<double> pool;        // the whole pool after the step
  std::vector<double> conv_pool;   // the whole conv pool after the step (conv only)
  std::vector<char> slot_written;  // (num_slots): 1 where the step wrote the slot
  std::vector<char> row_padding;   // (B): 1 where the row was treated as padding
  int64_t invalid{0};              // out-of-range indices (>= num_slots), both arrays
};

inline double ref_softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
inline double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

// One step. Rows read `pool` (and `conv_pool`, the logical conv pool, when
// P.conv_width > 0) as they were before the step (callers keep read and
// write slots of different rows apart, as the API requires).
inline RefResult reference_step(const RefProblem& P, const std::vector<double>& pool,
                                const std::vector<double>& conv_pool = {}) {
  RefResult R;
  R.o.assign(size_t(P.B * P.Hv * P.Dv), 0.0);
  R.pool = pool;
  const bool conv = P.conv_width > 0;
  const int64_t cdim = ref_conv_dim(P), taps = P.conv_width - 1;
  if (conv) R.conv_pool = conv_pool;
  // this row's q, k (Hk, Dk) and v (Hv, Dv): from P, or the conv's output y
  std::vector<double> y(conv ? size_t(cdim) : 0);
  R.slot_written.assign(size_t(P.num_slots), 0);
  R.row_padding.assign(size_t(P.B), 0);
  const int64_t G = P.Hv / P.Hk;

  for (int64_t row = 0; row < P.B; ++row) {
    const int64_t s = P.in_idx.empty() ? row : P.in_idx[size_t(row)];
    const int64_t s_out = P.out_idx.empty() ? s : P.out_idx[size_t(row)];
    if (!P.in_idx.empty() && s >= P.num_slots) ++R.invalid;
    if (!P.out_idx.empty() && s_out >= P.num_slots) ++R.invalid;
    if (s < 0 || s >= P.num_slots) {
      R.row_padding[size_t(row)] = 1;
      continue;  // o row stays zero, no state touched
    }
    const bool write = s_out >= 0 && s_out < P.num_slots;
    if (write) R.slot_written[size_t(s_out)] = 1;

    if (conv) {
      for (int64_t c = 0; c < cdim; ++c) {
        // window = (conv_pool[s, c, 0 .. W-2], x[row, c]), oldest first
        std::vector<double> window(size_t(P.conv_width));
        for (int64_t t = 0; t < taps; ++t)
          window[size_t(t)] = conv_pool[size_t(conv_pool_index(P, s, c, t))];
        window[size_t(taps)] = P.x[size_t(row * cdim + c)];
        double acc = P.conv_bias.empty() ? 0.0 : P.conv_bias[size_t(c)];
        for (int64_t j = 0; j < P.conv_width; ++j)
          acc += P.conv_weight[size_t(c * P.conv_width + j)] * window[size_t(j)];
        y[size_t(c)] = ref_silu(acc);
        if (write)
          for (int64_t t = 0; t < taps; ++t)
            R.conv_pool[size_t(conv_pool_index(P, s_out, c, t))] = window[size_t(t + 1)];
      }
    }
    // element i of q / k head hk, element j of v head h, for this row
    auto q_at = [&](int64_t hk, int64_t i) {
      return conv ? y[size_t(hk * P.Dk + i)] : P.q[size_t((row * P.Hk + hk) * P.Dk + i)];
    };
    auto k_at = [&](int64_t hk, int64_t i) {
      return conv ? y[size_t(P.Hk * P.Dk + hk * P.Dk + i)]
                  : P.k[size_t((row * P.Hk + hk) * P.Dk + i)];
    };
    auto v_at = [&](int64_t h, int64_t j) {
      return conv ? y[size_t(2 * P.Hk * P.Dk + h * P.Dv + j)]
                  : P.v[size_t((row * P.Hv + h) * P.Dv + j)];
    };

    for (int64_t h = 0; h < P.Hv; ++h) {
      const int64_t hk = P.head_map == gdn::HeadMap::kInterleaved ? h / G : h % P.Hk;
      std::vector<double> qh(static_cast<size_t>(P.Dk)), kh(static_cast<size_t>(P.Dk));
      double qn = 0, kn = 0;
      for (int64_t i = 0; i < P.Dk; ++i) {
        qh[size_t(i)] = q_at(hk, i);
        kh[size_t(i)] = k_at(hk, i);
        qn += qh[size_t(i)] * qh[size_t(i)];
        kn += kh[size_t(i)] * kh[size_t(i)];
      }
      double qdiv = 1.0, kdiv = 1.0;
      if (P.l2norm == gdn::L2Norm::kRsqrt) {
        qdiv = std::sqrt(qn + P.eps);
        kdiv = std::sqrt(kn + P.eps);
      } else if (P.l2norm == gdn::L2Norm::kMaxNorm) {
        qdiv = std::max(std::sqrt(qn), P.eps);
        kdiv = std::max(std::sqrt(kn), P.eps);
      }
      for (int64_t i = 0; i < P.Dk; ++i) {
        qh[size_t(i)] /= qdiv;
        kh[size_t(i)] /= kdiv;
      }

      const double av = P.a[size_t(row * P.Hv + h)], bv = P.b[size_t(row * P.Hv + h)];
      double g, beta;
      if (P.gate == gdn::Gate::kRaw) {
        // g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b)
        g = -std::exp(P.A_log[size_t(h)]) * ref_softplus(av + P.dt_bias[size_t(h)]);
        beta = 1.0 / (1.0 + std::exp(-bv));
      } else {
        g = av;
        beta = bv;
      }
      const double decay = std::exp(g);

      // Sq[j] = sum_i S_old[i, j] q̂[i],  Sk[j] = sum_i S_old[i, j] k̂[i]
      std::vector<double> Sq(size_t(P.Dv), 0.0), Sk(size_t(P.Dv), 0.0);
      for (int64_t i = 0; i < P.Dk; ++i)
        for (int64_t j = 0; j < P.Dv; ++j) {
          const double S = pool[size_t(pool_index(P, s, h, i, j))];
          Sq[size_t(j)] += S * qh[size_t(i)];
          Sk[size_t(j)] += S * kh[size_t(i)];
        }
      double kq = 0;
      for (int64_t i = 0; i < P.Dk; ++i) kq += kh[size_t(i)] * qh[size_t(i)];

      std::vector<double> delta(static_cast<size_t>(P.Dv));
      for (int64_t j = 0; j < P.Dv; ++j) {
        // delta = beta (v - exp(g) S_old^T k̂)
        delta[size_t(j)] = beta * (v_at(h, j) - decay * Sk[size_t(j)]);
        // o = scale (exp(g) S_old^T q̂ + (k̂·q̂) delta)
        R.o[size_t((row * P.Hv + h) * P.Dv + j)] =
            P.scale * (decay * Sq[size_t(j)] + kq * delta[size_t(j)]);
      }
      if (P.norm) {
        // o = norm_weight * o / sqrt(mean(o^2) + eps) * silu(z)
        double* oh = &R.o[size_t((row * P.Hv + h) * P.Dv)];
        double ss = 0;
        for (int64_t j = 0; j < P.Dv; ++j) ss += oh[j] * oh[j];
        const double inv_rms = 1.0 / std::sqrt(ss / double(P.Dv) + P.norm_eps);
        for (int64_t j = 0; j < P.Dv; ++j)
          oh[j] = P.norm_weight[size_t(j)] * oh[j] * inv_rms *
                  ref_silu(P.z[size_t((row * P.Hv + h) * P.Dv + j)]);
      }
      if (write) {
        // S_new = exp(g) S_old + k̂ ⊗ delta
        for (int64_t i = 0; i < P.Dk; ++i)
          for (int64_t j = 0; j < P.Dv; ++j)
            R.pool[size_t(pool_index(P, s_out, h, i, j))] =
                decay * pool[size_t(pool_index(P, s, h, i, j))] + kh[size_t(i)] * delta[size_t(j)];
      }
    }
  }
  return R;
}

}  // namespace gdn_test
