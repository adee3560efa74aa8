// What the host reference's one-token and multi-token paths share: index
// reads, the gate and normalization formulas, the gated RMSNorm. Every
// quantity in double.
#pragma once

#include <cmath>
#include <cstdint>

#include "gdnkit/half.hpp"
#include "gdnkit/params.hpp"

namespace gdn {
namespace host {

// Kokkos is initialized once per process (host_backend.cpp).
void ensure_kokkos();

inline int64_t read_index(const void* base, IndexType t, int64_t i) {
  return t == IndexType::kI64 ? static_cast<const int64_t*>(base)[i]
                              : int64_t(static_cast<const int32_t*>(base)[i]);
}

// softplus as torch computes it: linear above 20, never overflows.
inline double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

inline double silu(double t) { return t / (1.0 + std::exp(-t)); }

// The decay exp(g) and beta of v-head h from its raw (or precomputed) a, b.
struct Gates {
  double decay, beta;
};
inline Gates gates_of(const DecodeParams& p, int64_t h, double a, double b) {
  if (p.gate == Gate::kPrecomputed) return Gates{std::exp(a), b};
  // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
  const double g = -std::exp(double(p.A_log[h])) * softplus(a + double(p.dt_bias[h]));
  return Gates{std::exp(g), 1.0 / (1.0 + std::exp(-b))};
}

// q, k of one head in place; qq, kk their squared norms.
inline void l2_normalize(const DecodeParams& p, double* q, double* k, double qq, double kk) {
  if (p.l2norm == L2Norm::kNone) return;
  const double eps = double(p.l2norm_eps);
  // rsqrt mode: x / sqrt(sum x^2 + eps); max-norm mode: x / max(||x||, eps)
  const double q_div = p.l2norm == L2Norm::kRsqrt ? std::sqrt(qq + eps) : std::fmax(std::sqrt(qq), eps);
  const double k_div = p.l2norm == L2Norm::kRsqrt ? std::sqrt(kk + eps) : std::fmax(std::sqrt(kk), eps);
  for (int64_t i = 0; i < p.head_dim_k; ++i) {
    q[i] /= q_div;
    k[i] /= k_div;
  }
}

// o[j] = w[j] * o[j] * rsqrt(mean_j(o^2) + eps) * silu(z[j]), z at z_base.
inline void gated_rmsnorm(const DecodeParams& p, double* o, int64_t z_base) {
  const int64_t Dv = p.head_dim_v;
  double ss = 0.0;
  for (int64_t j = 0; j < Dv; ++j) ss += o[j] * o[j];
  const double rstd = 1.0 / std::sqrt(ss / double(Dv) + double(p.norm_eps));
  for (int64_t j = 0; j < Dv; ++j)
    o[j] = load_element(p.norm_weight, p.qkv_dtype, j) * o[j] * rstd * silu(load_element(p.z, p.qkv_dtype, z_base + j));
}

// The k-head a v-head reads: h / G (interleaved) or h % Hk (tiled).
inline int64_t k_head_of(const DecodeParams& p, int64_t h) {
  const int64_t G = p.num_v_heads / p.num_k_heads;
  return p.head_map == HeadMap::kInterleaved ? h / G : h % p.num_k_heads;
}

// The multi-token path (host_multi_token.cpp).
Status decode_multi_token(const DecodeParams& p);

}  // namespace host
}  // namespace gdn
