// kv ([Dk, Dv], Dv contiguous): a tile computed where it was copied, shared
// by both kv kernels (KvRegTile).
#pragma once

#include "norm_epilogue.cuh"

namespace gdn {
namespace GDN_KERNEL_NS {

// Ascending reduce-scatter over the lanes holding a chunk's row groups (lane
// bits kOff = kW, 2 kW, ... below kWarp), as halve's steps, then plain
// butterflies once one value is left. Row group bit 0 first, so a tile of any
// kW adds a column's row groups in one balanced tree (see KvRegTile).
template <int kN, int kOff, int kC>
__device__ __forceinline__ void reduce_halves_up(float (&x)[kC], int lane) {
  if constexpr (kOff < kWarp) {
    if constexpr (kN > 1) {
      halve<kN, kOff>(x, lane);
      reduce_halves_up<kN / 2, kOff * 2>(x, lane);
    } else {
      x[0] += warp_shfl_xor(x[0], kOff);
      reduce_halves_up<1, kOff * 2>(x, lane);
    }
  }
}

// Issue the loads of q and k of row b, k-head hk for both kv kernels: lane
// l of every warp rows l + kWarp n (a row past Dk reads row 0), raw (RawRun).
template <typename IO, int kRows, typename Params>
__device__ __forceinline__ void load_qk_rows(const Params& p, int64_t b, int hk, int lane, int Dk,
                                             IoRun<IO, 1> (&q_raw)[kRows], IoRun<IO, 1> (&k_raw)[kRows]) {
  const int64_t q_base = b * p.q_batch_stride + int64_t(hk) * p.q_head_stride;
  const int64_t k_base = b * p.k_batch_stride + int64_t(hk) * p.k_head_stride;
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const int i = lane + n * kWarp < Dk ? lane + n * kWarp : 0;
    q_raw[n].load(p.qkv_dtype, p.q, q_base + i);
    k_raw[n].load(p.qkv_dtype, p.k, k_base + i);
  }
}

// The kv tile of kW warps computed where it was copied (docs/decisions.md#kv-tile):
// thread t copies chunk t % kW of rows rg + kWarp n (rg = t / kW; at kW = 8 a
// warp instruction covers whole 128-byte row segments) into its own ring
// slots, so it reads them back without a barrier. reduce(): partial sums over
// the thread's rows, then its warp's row groups (shuffles), posted to `part`;
// barrier; one thread a column adds the warps' partials, forms delta and the
// output and posts delta to `dl`; barrier. store() writes S' from registers.
// A column's sum is one balanced tree over the kWarp row groups, row group bit
// 0 first (in the warp, then across warps in the same pairwise order): it
// depends neither on kW (docs/decisions.md#kv-small-tile) nor on the tiles a
// block streams. Every thread of the block calls reduce() (two barriers).
template <typename T, int kDk, int kW>
struct KvRegTile {
  using Tile = KvTile<T, kDk, kW>;
  using V = Vec<T>;
  static constexpr int kVec = V::kN, kRows = Tile::kRows, kCols = Tile::kCols, kThreads = Tile::kThreads;
  static constexpr int kSums = 2 * kVec;  // value c: S^T k_hat of column c; kVec + c: S^T q_hat
  // values a lane holds after the in-warp levels (kWarp / kW row groups a warp)
  static constexpr int kHeld = kSums * kW / kWarp > 0 ? kSums * kW / kWarp : 1;
  static constexpr int kPartFloats = kW * kW * kSums;  // [warp][chunk][value]
  static_assert(kCols <= kThreads, "one finishing thread a column");
  static_assert(kWarp / kW >= 2, "the first in-warp level forms the sums");

  // l2norm of q and k, held by every warp's lanes (lane l: rows l + kWarp n), then
  // q_hat and k_hat of this thread's rows rg + kWarp n from lane rg. Returns k_hat . q_hat.
  template <typename Params>
  static __device__ __forceinline__ float normalize(const Params& p, float (&qh)[kRows], float (&kh)[kRows],
                                                    float (&qr)[kRows], float (&kr)[kRows]) {
    const int tid = int(threadIdx.x), lane = tid % kWarp, rg = tid / kW;
    const float kq = l2_normalize<1, kWarp>(p, lane, qh, kh);
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      qr[n] = warp_shfl(qh[n], rg);
      kr[n] = warp_shfl(kh[n], rg);
    }
    return kq;
  }

  // Ring slot of the thread's chunk n in stage `stage`: [stage][n][thread],
  // consecutive threads 16 bytes apart (no bank conflicts).
  static __device__ __forceinline__ int slot(int stage, int n, int tid) { return (stage * kRows + n) * kThreads + tid; }

  // The thread's chunks of the tile in ring stage `stage`, once its copies
  // of it have landed (at most kPending later groups still in flight).
  template <int kPending>
  static __device__ __forceinline__ void fetch(const V* ring, int stage, V (&s)[kRows]) {
    async_wait<kPending>();
#pragma unroll
    for (int n = 0; n < kRows; ++n) s[n] = ring[slot(stage, n, int(threadIdx.x))];
  }

  // The thread's part of a tile's sums: partial sums over its rows, in row
  // order, then over its warp's row groups, posted to `part` (kPartFloats).
  static __device__ __forceinline__ void post(const V (&s)[kRows], const float (&qr)[kRows],
                                              const float (&kr)[kRows], float* part) {
    const int tid = int(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp, chunk = tid % kW;
    // Partial sums over the thread's rows, in row order, and at once the first
    // in-warp level (offset kW): the lane with that bit set keeps S^T q_hat and
    // sends S^T k_hat, its partner the other way round (at most kVec + 2 live).
    float x[kVec];
    const bool upper = (lane & kW) != 0;
#pragma unroll
    for (int c = 0; c < kVec; ++c) {
      float sk = 0.0f, sq = 0.0f;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const float sv = Elem<T>::to_float(s[n].x[c]);
        sk += sv * kr[n];
        sq += sv * qr[n];
      }
      x[c] = (upper ? sq : sk) + warp_shfl_xor(upper ? sk : sq, kW);
    }
    // The other in-warp levels; the lane then holds kHeld values from `first`
    // (named by the halving levels' bits), posted by one lane of those sharing them.
    reduce_halves_up<kVec, 2 * kW>(x, lane);
    int first = upper ? kVec : 0;
#pragma unroll
    for (int l = 1, n = kVec / 2; n >= kHeld && (kW << l) < kWarp; ++l, n /= 2)
      if (lane & (kW << l)) first += n;
    bool poster = true;
#pragma unroll
    for (int off = kW * (kSums / kHeld); off < kWarp; off *= 2) poster = poster && !(lane & off);
    if (poster) {
#pragma unroll
      for (int k = 0; k < kHeld; ++k) part[(warp * kW + chunk) * kSums + first + k] = x[k];
    }
  }

  // Column col of the tile (one thread a column), once every post() is visible:
  // the warps' partials added pairwise, warp bit 0 first (the tree goes on from
  // the warp's levels); delta to dl[col], the output to emit(col, o).
  template <typename Emit>
  static __device__ __forceinline__ void finish(int col, const float* part, float vj, float decay, float beta,
                                                float kq, float scale, float* dl, Emit&& emit) {
    // chunk fc, column fv of it
    const int fc = col / kVec, fv = col % kVec;
    float a[kW], e[kW];
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      a[w] = part[(w * kW + fc) * kSums + fv];
      e[w] = part[(w * kW + fc) * kSums + kVec + fv];
    }
#pragma unroll
    for (int st = 1; st < kW; st *= 2)
#pragma unroll
      for (int w = 0; w < kW; w += 2 * st) {
        a[w] += a[w + st];
        e[w] += e[w + st];
      }
    // delta = beta (v - exp(g) sk)
    const float d = beta * (vj - decay * a[0]);
    dl[col] = d;
    // o = scale (exp(g) sq + (k_hat . q_hat) delta)
    emit(col, scale * (decay * e[0] + kq * d));
  }

  // One tile: post(), a barrier, one thread a column finish()es it, a
  // second barrier (the deltas in dl are then visible to store()).
  template <typename Emit>
  static __device__ __forceinline__ void reduce(const V (&s)[kRows], const float (&qr)[kRows],
                                                const float (&kr)[kRows], float vj, float decay, float beta,
                                                float kq, float scale, float* part, float* dl, Emit&& emit) {
    post(s, qr, kr, part);
    __syncthreads();  // A: every warp's partial sums are posted
    if (int(threadIdx.x) < kCols) finish(int(threadIdx.x), part, vj, decay, beta, kq, scale, dl, emit);
    __syncthreads();  // B: the tile's deltas are posted
  }

  // S' = exp(g) S + k_hat delta of the thread's chunks (delta from `dl`) into the
  // head's state at `head`, chunk column j; rows past Dk, columns past Dv skipped.
  template <bool kEvictFirst = false>
  static __device__ __forceinline__ void store(const V (&s)[kRows], const float (&kr)[kRows], float decay,
                                               const float* dl, T* head, int j, int Dk, int Dv) {
    const int rg = int(threadIdx.x) / kW, chunk = int(threadIdx.x) % kW;
    float delta[kVec];
#pragma unroll
    for (int c = 0; c < kVec; ++c) delta[c] = dl[chunk * kVec + c];
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const int i = rg + n * kWarp;
      V nv;
#pragma unroll
      for (int c = 0; c < kVec; ++c)
        nv.x[c] = Elem<T>::from_float(decay * Elem<T>::to_float(s[n].x[c]) + kr[n] * delta[c]);
      if (i < Dk && j < Dv) store_state16<kEvictFirst>(reinterpret_cast<V*>(head + i * Dv + j), nv);
    }
  }
};

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
