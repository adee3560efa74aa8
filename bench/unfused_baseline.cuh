// The pre-fusion sequence, as simple separate CUDA kernels, so the fusion
// gain is measured rather than quoted. One launch per stage, intermediates
// through device memory, as an engine ran it before fusing:
//   1. split the packed q|k|v row and L2-normalize q and k   (bf16 out)
//   2. repeat k-heads to v-heads (repeat_interleave)          (bf16 out)
//   3. gating: g and beta per (row, v-head)                   (fp32 out)
//   4. the recurrence, out of place: new state to a second pool, and o
//   5. copy the new state back into the pool
// Dense rows, raw gate, rsqrt l2norm, kv layout (the one simple kernels
// read coalesced); fp32 or bf16 state.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "gdnkit/params.hpp"

namespace gdn_bench {

using bf16 = __nv_bfloat16;

__global__ void split_l2norm(const bf16* qkv, int64_t row_stride, int Hk, int Dk, bf16* qn, bf16* kn) {
  // one block per (row, k-head, q|k); x * rsqrt(sum x^2 + 1e-6)
  const int64_t b = blockIdx.x;
  const int hk = blockIdx.y, which = blockIdx.z;
  const bf16* x = qkv + b * row_stride + int64_t(which) * Hk * Dk + int64_t(hk) * Dk;
  __shared__ float ss;
  if (threadIdx.x == 0) ss = 0.f;
  __syncthreads();
  const float xi = threadIdx.x < Dk ? __bfloat162float(x[threadIdx.x]) : 0.f;
  atomicAdd(&ss, xi * xi);
  __syncthreads();
  bf16* out = (which == 0 ? qn : kn) + (b * Hk + hk) * Dk;
  if (threadIdx.x < Dk) out[threadIdx.x] = __float2bfloat16(xi * rsqrtf(ss + 1e-6f));
}

__global__ void repeat_heads(const bf16* x, int Hk, int Hv, int Dk, bf16* out) {
  const int64_t b = blockIdx.x;
  const int h = blockIdx.y, G = Hv / Hk;
  if (threadIdx.x < Dk) out[(b * Hv + h) * Dk + threadIdx.x] = x[(b * Hk + h / G) * Dk + threadIdx.x];
}

__global__ void gating(const bf16* a, const bf16* braw, const float* A_log, const float* dt_bias,
                       int64_t n, int Hv, float* g, float* beta) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int h = int(i % Hv);
  const float x = __bfloat162float(a[i]) + dt_bias[h];
  g[i] = -expf(A_log[h]) * (x > 20.f ? x : log1pf(expf(x)));
  beta[i] = 1.f / (1.f + expf(-__bfloat162float(braw[i])));
}

template <typename T>
__device__ float to_f(T x) { return float(x); }
template <>
__device__ float to_f<bf16>(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ T from_f(float x) { return T(x); }
template <>
__device__ bf16 from_f<bf16>(float x) { return __float2bfloat16(x); }

// One block per (row, v-head), a thread per column j; S is [Dk, Dv] (kv).
template <typename T>
__global__ void recurrence(const T* S, T* S_new, const bf16* qr, const bf16* kr, const bf16* qkv,
                           int64_t row_stride, int Hk, int Hv, int D, const float* g,
                           const float* beta, float scale, bf16* o) {
  const int64_t bh = blockIdx.x, b = bh / Hv;
  const int h = int(bh % Hv), j = threadIdx.x;
  const T* s = S + bh * D * D;
  T* sn = S_new + bh * D * D;
  const bf16* q = qr + bh * D;
  const bf16* k = kr + bh * D;
  const float v = __bfloat162float(qkv[b * row_stride + 2 * int64_t(Hk) * D + int64_t(h) * D + j]);
  const float decay = expf(g[bh]);
  float u = 0.f;
  for (int i = 0; i < D; ++i) u += to_f(s[int64_t(i) * D + j]) * __bfloat162float(k[i]);
  const float delta = beta[bh] * (v - decay * u);
  float acc = 0.f;
  for (int i = 0; i < D; ++i) {
    const float x = decay * to_f(s[int64_t(i) * D + j]) + __bfloat162float(k[i]) * delta;
    sn[int64_t(i) * D + j] = from_f<T>(x);
    acc += x * __bfloat162float(q[i]);
  }
  o[bh * D + j] = __float2bfloat16(scale * acc);
}

struct UnfusedScratch {
  bf16 *qn{}, *kn{}, *qr{}, *kr{};
  float *g{}, *beta{};
  void* state_new{};
  size_t state_bytes{};
  explicit UnfusedScratch(const gdn::DecodeParams& p) {
    const int64_t B = p.batch, Hk = p.num_k_heads, Hv = p.num_v_heads, D = p.head_dim_k;
    state_bytes = size_t(B * Hv * D * D) * gdn::dtype_size(p.state_dtype);
    bool ok = cudaMalloc(&qn, B * Hk * D * 2) == cudaSuccess && cudaMalloc(&kn, B * Hk * D * 2) == cudaSuccess &&
              cudaMalloc(&qr, B * Hv * D * 2) == cudaSuccess && cudaMalloc(&kr, B * Hv * D * 2) == cudaSuccess &&
              cudaMalloc(&g, B * Hv * 4) == cudaSuccess && cudaMalloc(&beta, B * Hv * 4) == cudaSuccess &&
              cudaMalloc(&state_new, state_bytes) == cudaSuccess;
    if (!ok) {
      std::fprintf(stderr, "unfused baseline: out of device memory\n");
      std::exit(1);
    }
  }
  ~UnfusedScratch() {
    cudaFree(qn); cudaFree(kn); cudaFree(qr); cudaFree(kr); cudaFree(g); cudaFree(beta); cudaFree(state_new);
  }
};

inline void unfused_decode(const gdn::DecodeParams& p, UnfusedScratch& w, cudaStream_t stream) {
  const int64_t B = p.batch;
  const int Hk = p.num_k_heads, Hv = p.num_v_heads, D = p.head_dim_k;
  const bf16* qkv = static_cast<const bf16*>(p.q);
  split_l2norm<<<dim3(unsigned(B), Hk, 2), D, 0, stream>>>(qkv, p.q_batch_stride, Hk, D, w.qn, w.kn);
  repeat_heads<<<dim3(unsigned(B), Hv), D, 0, stream>>>(w.qn, Hk, Hv, D, w.qr);
  repeat_heads<<<dim3(unsigned(B), Hv), D, 0, stream>>>(w.kn, Hk, Hv, D, w.kr);
  const int64_t n = B * Hv;
  gating<<<unsigned((n + 255) / 256), 256, 0, stream>>>(static_cast<const bf16*>(p.a), static_cast<const bf16*>(p.b),
                                                      p.A_log, p.dt_bias, n, Hv, w.g, w.beta);
  const float scale = 1.0f / sqrtf(float(D));
  if (p.state_dtype == gdn::DType::kF32)
    recurrence<float><<<unsigned(B * Hv), D, 0, stream>>>(static_cast<const float*>(p.state),
        static_cast<float*>(w.state_new), w.qr, w.kr, qkv, p.q_batch_stride, Hk, Hv, D, w.g, w.beta, scale,
        static_cast<bf16*>(p.o));
  else
    recurrence<bf16><<<unsigned(B * Hv), D, 0, stream>>>(static_cast<const bf16*>(p.state),
        static_cast<bf16*>(w.state_new), w.qr, w.kr, qkv, p.q_batch_stride, Hk, Hv, D, w.g, w.beta, scale,
        static_cast<bf16*>(p.o));
  cudaMemcpyAsync(p.state, w.state_new, w.state_bytes, cudaMemcpyDeviceToDevice, stream);
}

}  // namespace gdn_bench
