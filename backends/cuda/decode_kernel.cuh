// The fused GDN decode step on NVIDIA GPUs (sm_80, sm_90).
//
// What a block owns
// -----------------
// The step is memory-bound: per (row b, v-head h) it must read and write one
// Dk x Dv state matrix, and everything else is under 2% of the bytes. Columns
// j of that matrix (one per output element o[j]) are independent: column j
// needs only S[:, j], q_hat, k_hat, v[j] and the two gates. So the unit of
// work is a *warp item*: one warp owns a fixed group of columns of one (b, h)
// and the whole Dk extent of those columns, and reduces over Dk inside the
// warp with a fixed butterfly of shuffles. Each warp normalizes q and k itself
// (the lanes of a column group hold all of Dk), so warps never wait on each
// other: no barrier. A warp streams items_per_warp consecutive items of its
// head, the next item's state copied (cp.async) into the warp's own ring of
// shared memory while it computes the current one, each lane copying and
// reading back only its own vectors; a block is W such warps on consecutive
// items of the same (b, h); the grid is B * Hv * blocks_per_head blocks.
// That is the vk layout (decode_vk), where a column is a contiguous run.
//
// kv ([Dk, Dv], Dv contiguous; decode_kv_step_kernel): a column is strided,
// so a warp owning a few columns would read 16-64 bytes of each row per
// instruction (tried: 2-3x slower from B = 8 up). Instead a block of kW = 8
// warps owns a *tile*: all Dk rows of kW * kVec consecutive columns of one
// (b, h) (kW 16-byte chunks of each row: 128-byte row segments, 32 fp32 or
// 64 16-bit columns). Thread t copies chunk t % kW of rows t / kW + 32 n
// (cp.async into its own slots of a shared ring, a warp instruction covering
// four whole row segments), reads those chunks back once they land (its own
// copies: no barrier), and forms the partial sums S^T k_hat and S^T q_hat of
// its chunk's columns over its rows; the sums over a warp's row groups go
// through shuffles, the warps' partials through shared memory (barrier);
// one thread a column adds them and forms delta and the output; after a
// second barrier every thread updates the state it holds and stores S'
// straight from its registers. A block streams up to 4 consecutive tiles of
// its head, the next tiles' copies in flight while one is reduced; a block
// of exactly two tiles with both in flight from the start (fp32 at B = 8)
// reduces them together instead: both tiles' partials, one barrier, warp k
// finishing tile k, a second barrier, both stores (two barriers, not four,
// and the second tile's sums formed while the first waits to be finished:
// fp32 B = 8 11.05 -> 10.47 us, H200 2026-11-30, bench/RESULTS.md round 10). The block
// count is B * Hv * ceil(tiles / tiles per block). When every tile of a
// 4-warp tile (64-byte row segments) can have its own block, all resident
// at once, the launch takes that tile instead (kKvSmallW; B = 1 at Hv = 32).
// Either tile, and vk, has a second instantiation that applies L2 policies
// to the state's traffic (S' stored evict-first; for fp32 kv also copies
// asking L2 for 256-byte blocks), launched where they were measured to win
// (step_l2_hints, plan_launch: the 4-warp tile at up to 4 blocks an SM,
// the others while the call's state is at most twice the L2; B = 1 kv
// fp32 3.07 -> 2.93 us, bf16 2.90 -> 2.64, bf16 vk 3.09 -> 2.89).
// Small heads (Dk <= 64) in longer grids: every block takes two tiles at
// once, 4-warp ones where an 8-warp tile would cover the head (one 8 KiB
// tile a block ran at 1.5x the copy floor; plan_launch).
// The sum over a column's rows is one fixed balanced tree over the 32 row
// groups, whatever kW and the tiles a block streams, so kv is
// batch-invariant and deterministic like vk. The fused middle's kv kernel
// (decode_kv_fused_kernel) computes its tiles the same way (KvRegTile).
// (Until 2026-11-30 the tile went through shared memory transposed, a warp a
// chunk, S' written back and the block storing rows: the state crossed
// shared memory four times. The new tile is 3-8% faster: fp32 B = 8 11.8 ->
// 10.9 us, B = 128 139.6 -> 134.8, bf16 B = 8 7.2 -> 6.4; the fused kv
// middle at B = 64 4-6% faster; bench/RESULTS.md, round 6.)
//
// How V is split by batch size (vk; kv splits it by tiles, as above)
// -----------------------------------------------------------------
// Large B*Hv: 2 items a warp and up to 8 warps a block, so a head's Dv
// outputs are one block (bf16 at Dv = 128: 16 items of 8 columns, 4 warps)
// or two consecutive ones (fp32: 32 items of 4 columns, 16 warps; from
// about B = 128 at Hv = 32, 3 items a warp: 11 warps, the second block's
// last 5 idle, 1.5-2% faster all the same, and faster than 4-warp blocks
// with 1 idle; see default_items_per_warp).
// Streaming items with the next one in flight took B = 512 from 1.91x to
// 1.06x the copy floor; 2 items rather than more keeps the last wave short
// (bf16 B = 32: 1.34x vs 1.49x at 8; bench/RESULTS.md has both sweeps).
// Small B*Hv: W shrinks until the grid puts work on every SM, evenly: at
// B = 1 with Hv = 32 there are only
// 32 heads for 132 SMs, and a block per head would leave three quarters of the
// memory system idle. In a one-wave grid W stays as large as keeps every SM
// as loaded as one-warp blocks would (fp32 B = 1: 256 blocks of 4 warps),
// because each block the launch dispatches costs time (plan_launch). A
// warp's item and its reduction order never depend on
// W or items per warp, so results are bitwise identical whatever split the
// batch size picks (batch-invariant and deterministic; tested B = 1 vs 600).
// The engines' call (one input dtype, packed heads, raw gates, Dk = Dv =
// 128; dense, or through a pool for 16-bit states; plain or programmatic) in a
// one-wave grid runs the same items in a kernel of its own instead
// (decode_vk_wave_kernel): one item a warp, the state straight into
// registers, no ring, a 3-line parameter block, blocks by the same rule
// over the whole grid, the same sums and so the same bits. H200: B = 1 3-8%
// faster, bf16 B = 8 1.16x -> 1.06x the copy (bench/RESULTS.md, round 35).
// The later gated-RMSNorm epilogue needs all Dv outputs of a head: the
// blocks of one head (one or two at large B, 4 to 32 blocks at
// B = 1) are always consecutive in the grid, so they can form a thread-block
// cluster on sm_90 (distributed shared memory for the head's sum of squares).
//
// The fused middle: conv prologue and gated-RMSNorm epilogue
// ----------------------------------------------------------
// With either on, a block owns a *group*: row b, k-head hk and its G = Hv/Hk
// v-heads (vk: 8 / G warps a head, each streaming the fewest items that cover
// it; kv: the block streams all G heads' tiles), grid B * Hk. Why: the conv's
// q and k channels of hk are read by all G heads and updated in place, so
// one block must read them all before it writes them (no other block touches
// them: no grid-wide ordering is needed), and the norm needs a head's Dv
// outputs in one place (shared memory, summed in one fixed order: still
// deterministic and batch-invariant). The group prologue computes the conv
// of q and k and of the block's own v channels into shared memory (one
// thread reads and rewrites each channel's window), loads z, norm_weight and
// the G heads' gates; warps then read q, k, v from shared memory; raw
// outputs go to shared memory and the epilogue normalizes and writes them.
// One block a group leaves SMs idle at small B (B * Hk blocks: 16 at B = 1
// for Qwen3.5), so on sm_90 a group is a thread-block cluster of up to 8
// blocks while B * Hk is below the SM count, each block owning a contiguous
// range of the group's outputs (its warps' items or tiles):
// - every block computes the conv of q and k (all its warps need them) and
//   of its own v channels only; it writes the v channels' conv state back at
//   once (their one reader) and its 1/size share of the q/k channels after
//   one cluster barrier whose arrival is relaxed (it orders reads: no fence);
// - each output is pushed into every block's shared memory with st.async,
//   counted on that block's mbarrier, and every block normalizes from its
//   own shared memory in the same fixed order and writes its own range. No
//   barrier releases memory: a releasing cluster barrier is a full fence,
//   which waits for the thread's state stores in flight (bench/RESULTS.md:
//   with such a barrier before the norm, and the norm reading the other
//   blocks' outputs through distributed shared memory, the barriers and
//   their fences were a fifth of the fused kernel's samples at B = 1).
//
// The norm alone (conv off) runs, where it can, as the step's own epilogue
// (decode_kv_step_kernel's kNorm, decode_vk's kStepNorm; Launch::step_norm):
// the step's blocks, each output pushed raw to every block of its head
// only; a head's blocks (up to 8) a cluster where the step's grid is one
// wave of at most 4 blocks an SM (B = 1), one block a head in grids of more
// than one wave. A block no longer waits for the other heads of its group,
// and at B = 1 kv runs the step's 4-warp tiles: the step + norm at B = 1
// kv fp32 4.41 -> 3.92 us, bf16 3.89 -> 3.48, vk fp32 4.17 -> 3.92; B = 64
// bf16 vk 42.4 -> 38.0 (H200, bench/RESULTS.md round 25). One block a head
// in one wave (B = 8 bf16) keeps the groups below, which were faster there.
// The norm alone in groups' clusters (conv off, each block's columns in one
// head, at most one a thread) runs its own instantiation (kNormOnly) with no
// prologue: each warp loads q, k, v and its head's gates as the step does,
// each thread the z and norm_weight of its output column, then the state;
// the cluster barrier (the outputs' mbarrier ready) is arrived at once. The
// prologue made the q/k/v loads wait for its z loads and its barrier. Step
// + norm at B = 1 (H200, 2026-12-01, bench/RESULTS.md rounds 12 and 13):
// vk fp32 5.28 -> 4.74 us, bf16 4.95 -> 4.15; kv fp32 5.07 -> 4.50, bf16
// 4.80 -> 4.13; B = 8 4-9% faster. With the conv on,
// the prologue stays: a warp computing the conv of its own q/k rows
// instead (no block barrier; every warp loading every q/k window) was
// 1.2-1.8 us slower at B = 1, and the same path behind a run-time switch
// in the fused kernel cost the conv's path 3-7% (their registers shared).
//
// Programmatic launch (sm_90): with the flag, every kernel issues its first
// state loads, then waits for the previous kernel (griddepcontrol.wait)
// before it reads the token's inputs.
//
// Per warp item (kv: per warp and tile), in fp32 (S as stored, decay applied on the fly),
// in SPEC §1's one-pass form (o from the old state):
//   sk[j]    = sum_i S[i, j] k_hat[i],   sq[j] = sum_i S[i, j] q_hat[i]
//   delta[j] = beta * (v[j] - exp(g) * sk[j])
//   S'[i, j] = exp(g) * S[i, j] + k_hat[i] * delta[j]
//   o[j]     = scale * (exp(g) * sq[j] + (k_hat . q_hat) * delta[j])
// (= scale * sum_i S'[i, j] q_hat[i]): both sums of a column go through one
// butterfly, so after the state lands a column waits for one reduction, not
// two in a row; k_hat . q_hat comes with the l2norm's sums.
// q, k, v and the gates are loaded first, then the state, so one memory
// latency covers them all: the small loads go out as raw words and are
// converted only once every one of them is in flight (RawRun; a conversion
// in a branch made the warp wait for each load in turn: B = 1 4.4 -> 3.9 us).
// They go before the state's copies because they are the longer path (loaded,
// then normalized before any state is used) and, issued behind 2 KiB of
// copies a warp, they waited for the memory pipeline (bench_fused trace,
// B = 1 fp32 vk cold: issued 1.3 us into the kernel). The fused kernels
// in clusters (small B) issue the state's copies once the prologue's loads
// have landed (they then do not wait in DRAM behind the grid's state
// reads); in one-block groups vk issues them right behind the prologue's
// loads and kv before them (64 registers: the prologue then holds no tile
// addresses live; start_fused_loads). A programmatic launch issues the
// state's first.
//
// Instructions per warp
// ---------------------
// At small B each warp streams only a few KiB, so the kernel is bound by the
// instructions and dependent latency of a warp, not by bandwidth. Hence:
// - no integer division: the block's (row, head, k-head) come from
//   multiply-high by divisors the launch prepares (FastDiv);
// - 64-bit arithmetic once per (slot, head), 32-bit offsets inside a head;
// - the dtype of q/k/v/a/b/o is a kernel parameter when they share one (IO,
//   see with_dtype), else one uniform branch per group of loads, never one
//   per element; vk q/k rows and the fused prologue's runs move as vector
//   words with no test of the address: the launch checks the pointers and
//   strides once and sends the rest to code that tests each address (the
//   MixedIO kernels, the prologue's channel-by-channel form; RawRun);
// - the sums over a column's lanes run as one reduce-scatter butterfly for
//   all the sums a lane holds (2 kC - 1 + log2(span / 2 kC) shuffles for
//   the two sums of kC columns, instead of 2 kC * log2(span)), with the same
//   additions in the same order as the one-value butterfly, so the results
//   are bitwise those of it; delta is then gathered back to every lane, and
//   each output column is written by one lane that holds its sums.
#pragma once

// One source, two vendors: compiled as HIP (GDN_HIP) the vendor header maps
// the CUDA names and sets the HIP code paths (../hip/vendor_hip.hpp).
#if defined(GDN_HIP)
#include "../hip/vendor_hip.hpp"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define GDN_KERNEL_NS cuda
#define GDN_WARP_SIZE 32
#define GDN_PHYSICAL_WARP 32
// Shared memory a block may opt in to (sm_90: 227 KiB; the ring needs at
// most 110 KiB, at kv Dk = 256 with two stages).
#define GDN_MAX_BLOCK_SMEM (227 * 1024)
// L2 cache policies on the state's traffic (Launch::l2_hints)
#define GDN_L2_HINTS 1
// The vk step's kernel for the engines' call in one wave (Launch::wave)
#define GDN_VK_WAVE 1
namespace gdn {
namespace cuda {
using bf16 = __nv_bfloat16;
using fp16 = __half;
__device__ __forceinline__ float bf16_to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 float_to_bf16(float f) { return __float2bfloat16_rn(f); }
}  // namespace cuda
}  // namespace gdn
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gdnkit/params.hpp"

namespace gdn {
namespace GDN_KERNEL_NS {

// The warp size every lane and tile constant derives from: 32 on NVIDIA, 64
// on AMD gfx9. A build for NVIDIA may ask for a 64-lane *logical* warp
// (GDN_WARP_SIZE=64 with the HIP source path): two physical warps that
// exchange through shared memory wherever a shuffle crosses them, so the
// wave64 index arithmetic runs, and is tested, on an NVIDIA GPU.
constexpr int kWarp = GDN_WARP_SIZE;
static_assert(kWarp == 32 || kWarp == 64, "warp size: 32 or 64 lanes");
static_assert(kWarp % GDN_PHYSICAL_WARP == 0, "a logical warp is whole physical warps");

// ---- shuffles over a (logical) warp of kWarp lanes ---------------------------
// Every call is made by all kWarp lanes of the warp (no divergence), as the
// reductions below require.
#if GDN_WARP_SIZE > GDN_PHYSICAL_WARP
// Largest block the kernels launch (8 warps), in threads.
constexpr int kMaxBlockThreads = 8 * kWarp;
// x of logical lane `src` of this thread's logical warp, through shared
// memory: each thread posts x, the warp's two halves meet at a named barrier
// (id 1 + logical warp; 0 is __syncthreads'), read, and meet again before
// the slots can be reused.
__device__ __forceinline__ float exchange_lanes(float x, int src) {
  __shared__ float post[kMaxBlockThreads];
  const unsigned first = threadIdx.x & ~unsigned(kWarp - 1);
  const unsigned id = 1 + threadIdx.x / kWarp;
  post[threadIdx.x] = x;
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(kWarp) : "memory");
  const float y = post[first + unsigned(src)];
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(kWarp) : "memory");
  return y;
}
__device__ __forceinline__ float warp_shfl_xor(float x, int off) {
  // Offsets inside a physical warp stay shuffles; wider ones cross halves.
  if (off < GDN_PHYSICAL_WARP) return __shfl_xor_sync(0xffffffffu, x, off);
  return exchange_lanes(x, int(threadIdx.x % kWarp) ^ off);
}
__device__ __forceinline__ float warp_shfl(float x, int src) { return exchange_lanes(x, src); }
#elif defined(GDN_AMD)
// A wave64 shuffle (ds_bpermute / DPP): HIP's width-64 forms.
__device__ __forceinline__ float warp_shfl_xor(float x, int off) { return __shfl_xor(x, off, kWarp); }
__device__ __forceinline__ float warp_shfl(float x, int src) { return __shfl(x, src, kWarp); }
#else
__device__ __forceinline__ float warp_shfl_xor(float x, int off) { return __shfl_xor_sync(0xffffffffu, x, off); }
__device__ __forceinline__ float warp_shfl(float x, int src) { return __shfl_sync(0xffffffffu, x, src); }
#endif

// ---- element conversions ----------------------------------------------------
template <typename T> struct Elem;
template <> struct Elem<float> {
  static __device__ __forceinline__ float to_float(float x) { return x; }
  static __device__ __forceinline__ float from_float(float x) { return x; }
};
template <> struct Elem<fp16> {
  static __device__ __forceinline__ float to_float(fp16 x) { return __half2float(x); }
  static __device__ __forceinline__ fp16 from_float(float x) { return __float2half_rn(x); }
};
template <> struct Elem<bf16> {
  static __device__ __forceinline__ float to_float(bf16 x) { return bf16_to_float(x); }
  static __device__ __forceinline__ bf16 from_float(float x) { return float_to_bf16(x); }
};

// Loads and stores of the small tensors (q, k, v, a, b, o). Their dtypes are
// runtime values, but one kernel instantiation per dtype would multiply the
// build for what is a handful of loads; instead the kernels take an `IO`
// parameter: when q/k/v, a/b and o share one dtype (every engine's case) the
// launch picks the instantiation for it (IO = float, fp16 or bf16) and every
// access below compiles straight; otherwise IO = MixedIO and each group of
// accesses pays one branch on the runtime dtype (uniform across the grid, so
// it never diverges). The branches cost more than their instructions: on the
// H200 the straight kv kernel runs B = 1 in 4.3 µs instead of 6.0 (fp32
// state) and B = 32 8% faster (bench/RESULTS.md).
struct MixedIO {};
template <typename IO, typename F>
__device__ __forceinline__ void with_dtype(DType t, F&& f) {
  if constexpr (!std::is_same<IO, MixedIO>::value) {
    (void)t;
    f(IO{});
  } else {
    switch (t) {
      case DType::kF32: f(float{}); return;
      case DType::kF16: f(fp16{}); return;
      default: f(bf16{}); return;
    }
  }
}

// The unsigned word of kBytes (4, 8 or 16) bytes, for one vector load.
template <int kBytes> struct Word;
template <> struct Word<4> { using type = unsigned; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

// x[e] = ptr[e] for e < N, N consecutive elements of type E (the MixedIO
// kernels' loads). When the address is aligned to the piece size (up to 16
// bytes) the run moves in vector loads; otherwise (a caller's odd stride or
// offset) element by element. The values are the same either way.
template <typename E, int N>
__device__ __forceinline__ void load_run(const E* ptr, float* x) {
  constexpr int kPerPiece = N * int(sizeof(E)) < 16 ? N : 16 / int(sizeof(E));
  constexpr int kBytes = kPerPiece * int(sizeof(E));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    using W = typename Word<kBytes>::type;
    if (reinterpret_cast<uintptr_t>(ptr) % kBytes == 0) {
#pragma unroll
      for (int k = 0; k < N / kPerPiece; ++k) {
        const W w = *reinterpret_cast<const W*>(ptr + k * kPerPiece);
        const E* e = reinterpret_cast<const E*>(&w);
#pragma unroll
        for (int i = 0; i < kPerPiece; ++i) x[k * kPerPiece + i] = Elem<E>::to_float(e[i]);
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = Elem<E>::to_float(ptr[i]);
}

// ---- loads now, conversions later -------------------------------------------
// A load's first use waits for it, and a use inside a branch (an `if` on a
// bound, an alignment test, a dtype switch) is placed inside it: the warp
// then waits for that load before it issues the next one, and the small
// loads of a phase (q, k, v, the gates, the conv windows) pay one memory
// latency each instead of one for all. On the H200 (bench_fused `trace`,
// B = 1) the step waited 2.2 us for its q/k/v/gate loads and the fused conv
// prologue 3.6 us, against about 1.1 us for one cold load. So the kernels
// load the small tensors as raw words first, with no use in any branch, and
// convert them once every load of the phase is in flight.
//
// RawRun<E, N>: N consecutive elements of E as raw vector words, pieces of
// kBytes. The address must be aligned to a piece: the launch takes this path
// only where every run's is (vk q/k rows: with_io sends other strides to
// MixedIO, whose loads test each address; the fused prologue's runs:
// prologue_runs_aligned, else the channel-by-channel form). A test of each
// address in here, with an element-by-element fallback, put both paths'
// instructions on the load chain (two 16-bit loads and a merge beside every
// vector load): without it the fused middle at B = 1 went 6.03 -> 5.39 us
// (fp32 kv), 5.85 -> 5.15 (bf16 kv) and 6.23 -> 6.05 (fp32 vk) (H200,
// 2026-11-30; bench/RESULTS.md, round 9).
template <int kBytes> struct RawWord { using type = typename Word<kBytes>::type; };
template <> struct RawWord<2> { using type = unsigned short; };
template <typename E, int N>
struct RawRun {
  static constexpr int kPerPiece = N * int(sizeof(E)) < 16 ? N : 16 / int(sizeof(E));
  static constexpr int kBytes = kPerPiece * int(sizeof(E));
  static constexpr int kPieces = N / kPerPiece;
  using W = typename RawWord<kBytes>::type;
  W w[kPieces];
  // ptr: aligned to kBytes (see above)
  __device__ __forceinline__ void load(const E* ptr) {
#pragma unroll
    for (int k = 0; k < kPieces; ++k) w[k] = *reinterpret_cast<const W*>(ptr + k * kPerPiece);
  }
  // x[e] = element e, or 0 for all of them when !in (the load then read a
  // valid stand-in address).
  __device__ __forceinline__ void to_float(float* x, bool in = true) const {
#pragma unroll
    for (int k = 0; k < kPieces; ++k)
#pragma unroll
      for (int i = 0; i < kPerPiece; ++i)
        x[k * kPerPiece + i] = in ? Elem<E>::to_float(reinterpret_cast<const E*>(&w[k])[i]) : 0.0f;
  }
};

// The same for a small tensor of the kernel's IO: raw when IO is a dtype;
// with MixedIO (runtime dtypes, the rare case) converted at the load, in the
// dtype switch, and kept as float words.
template <typename IO>
using IoElem = typename std::conditional<std::is_same<IO, MixedIO>::value, float, IO>::type;
template <typename IO, int N>
struct IoRun {
  RawRun<IoElem<IO>, N> r;
  // elements [off, off + N) of `base`, of dtype t
  __device__ __forceinline__ void load(DType t, const void* base, int64_t off) {
    if constexpr (!std::is_same<IO, MixedIO>::value) {
      (void)t;
      r.load(static_cast<const IO*>(base) + off);
    } else {
      with_dtype<MixedIO>(t, [&](auto tag) {
        using E = decltype(tag);
        float x[N];
        load_run<E, N>(static_cast<const E*>(base) + off, x);
#pragma unroll
        for (int k = 0; k < r.kPieces; ++k)
#pragma unroll
          for (int i = 0; i < r.kPerPiece; ++i) reinterpret_cast<float*>(&r.w[k])[i] = x[k * r.kPerPiece + i];
      });
    }
  }
  __device__ __forceinline__ void to_float(float* x, bool in = true) const { r.to_float(x, in); }
  __device__ __forceinline__ float value(bool in = true) const {
    float x[N];
    r.to_float(x, in);
    return x[0];
  }
};

// One element of a runtime dtype (the padding path's zeros).
__device__ __forceinline__ void store_any(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = x; return;
    case DType::kF16: static_cast<fp16*>(base)[i] = __float2half_rn(x); return;
    default: static_cast<bf16*>(base)[i] = float_to_bf16(x); return;
  }
}

__device__ __forceinline__ int64_t load_index(const void* base, IndexType t, int64_t b) {
  return t == IndexType::kI64 ? static_cast<const int64_t*>(base)[b]
                              : int64_t(static_cast<const int32_t*>(base)[b]);
}

// ---- asynchronous 16-byte copies, global -> shared -----------------------
// The state moves through shared memory by cp.async (sm_80 and newer): the
// next items' loads are in flight without holding registers, which let the
// kernels drop from 80/118 registers (fp32/16-bit vk) to 64/80 and hold 32/24
// warps an SM instead of 24/16 (bench/RESULTS.md: bf16 vk B = 128 1.29x ->
// 1.16x the copy floor). `valid` false writes 16 zero bytes and reads nothing
// (src-size 0), which is how rows past Dk and columns past Dv become zeros.
#if !defined(GDN_NO_ASYNC_COPY) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GDN_ASYNC_COPY 1
#endif
// kFetch256: the copy asks L2 to fetch the whole 256-byte block around it
// (the step's hinted instantiations, step_l2_hints). The
// bytes that land are the same; the extra bytes L2 fetches lie in the
// aligned 256-byte block of an address the kernel may read, so in a mapped
// page.
template <bool kFetch256 = false>
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem, bool valid) {
#if GDN_ASYNC_COPY
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kFetch256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
#else
  // AMD (no cp.async) and older targets: a plain load and store (same
  // values; the copy completes before the next instruction needs it).
  *static_cast<uint4*>(smem) = valid ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
// Close the group of copies issued since the last commit (one group per item).
__device__ __forceinline__ void async_commit() {
#if GDN_ASYNC_COPY
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Wait until at most kPending groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void async_wait() {
#if GDN_ASYNC_COPY
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// One 16-byte vector of the new state to global memory; with kEvictFirst
// under an L2 evict-first policy, so that L2 gives its dirty lines up
// first (step_l2_hints; NVIDIA sm_80 and newer, elsewhere a plain
// store). The bytes written are the same.
template <bool kEvictFirst, typename V>
__device__ __forceinline__ void store_state16(V* dst, const V& v) {
#if GDN_ASYNC_COPY
  if constexpr (kEvictFirst) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    const uint4 u = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "r"(u.x), "r"(u.y),
                 "r"(u.z), "r"(u.w), "l"(policy)
                 : "memory");
    return;
  }
#endif
  *dst = v;
}

// Items (vk) or tiles (kv) of state in shared memory at once: the one being
// computed and the rest in flight. vk: two on NVIDIA, measured
// (bench/RESULTS.md): a third stage gained at most 2% at B = 512, lost 4% at
// B = 8. kv: by state dtype (kv_stages below). GDN_VK_STAGES / GDN_KV_STAGES
// override them for tune_cuda. Without cp.async (HIP) a second stage would
// only cost LDS: vk keeps no ring at all (its items load straight into
// registers) and kv one tile stage.
#ifndef GDN_VK_RING  // (tune_cuda may set it: the vk state straight into registers)
#if defined(GDN_NO_ASYNC_COPY)
#define GDN_VK_RING 0
#else
#define GDN_VK_RING 1
#endif
#endif
#ifndef GDN_VK_STAGES
#if defined(GDN_NO_ASYNC_COPY)
#define GDN_VK_STAGES 1
#else
#define GDN_VK_STAGES 2
#endif
#endif
constexpr int kStages = GDN_VK_STAGES;
// The kv kernels' ring (decode_kv_step_kernel, decode_kv_fused_kernel): 3
// stages for fp32 states, 2 for 16-bit ones (H200, 2026-11-30,
// bench/RESULTS.md). The step: both tiles of a B = 8 block in flight from
// the start (10.8 us against 10.9), while 16-bit blocks fit more an SM with
// two (bf16 B = 32 20.0 us against 21.3). The fused middle (round 10): fp32
// B = 8 12.85 -> 12.33 us, B = 64 81.7 -> 79.9 with three; bf16 lost 6% at
// B = 8 and 4% at B = 64 with three. (With the earlier kv tile, a third
// stage made kv slower everywhere from B = 8 up.) Without cp.async the ring
// is a plain staging buffer and one stage ahead suffices.
template <typename T>
constexpr int kv_stages() {
#if defined(GDN_KV_STAGES)
  return GDN_KV_STAGES;
#else
  return GDN_VK_STAGES < 2 ? GDN_VK_STAGES : sizeof(T) == 4 ? 3 : 2;
#endif
}
// The kv step's ring: kv_stages, and 3 for 16-bit states at Dk <= 64 too,
// whose blocks take two small tiles at once in multi-wave grids (the pair
// path of decode_kv_step_kernel; plan_launch says why).
template <typename T, int kDk>
constexpr int kv_step_stages() {
  return kDk <= 64 && kv_stages<T>() == 2 ? 3 : kv_stages<T>();
}

// A 16-byte vector of state elements.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kN = 16 / int(sizeof(T));
  T x[kN];
};

// n / d for 0 <= n < 2^31 by a multiply-high and a shift (Granlund and
// Montgomery; CUTLASS's FastDivmod): with l = ceil(log2 d), m = ceil(2^(31+l) / d),
// n / d = umulhi(n, m) >> (l - 1) for d >= 2. The launch computes m and the
// shift once on the host, so the block prologue that every state load waits
// on (row, head, k-head of the block) has no integer division in it.
struct FastDiv {
  unsigned d{1}, m{0}, shift{0};
  FastDiv() = default;
  __host__ explicit FastDiv(unsigned divisor) : d(divisor) {
    if (d < 2) return;  // d == 1: the quotient is n itself
    unsigned l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    m = unsigned(((uint64_t(1) << (31 + l)) + d - 1) / d);
    shift = l - 1;
  }
  __device__ __forceinline__ unsigned div(unsigned n) const { return d == 1 ? n : __umulhi(n, m) >> shift; }
};

// The kernels' copy of DecodeParams (all kernels but decode_kv_fused_kernel,
// which says why): the fields device code reads, under the same names, in
// the order a call needs them. Kernel parameters live in a constant bank
// that each call's blocks fetch cold, 64 bytes at a time, and a warp waits
// for each line in turn (on the H200 every further line a block reads costs
// 0.03-0.05 us a call, whatever the grid: bench/RESULTS.md, round 16).
// DecodeParams is laid out for readers (a tensor's pointer, dtype and
// strides together, the fused options at the end), so the step touched 8
// lines before its first loads went out. Here everything a block reads
// before it issues its loads (its row, slots, and the addresses of q, k, v,
// the gates and the state) comes first, and with the launch's scalars ahead
// of it (45 bytes, so this struct starts at the bank's 0x240) that part ends
// at 0x300: 5 lines, counting the driver's. Fields used after the loads are
// in flight (the output, the l2norm mode, the fused options, the rare
// mixed-dtype forms) follow; their lines arrive while the loads do.
struct KernelParams {
  // ---- before the first loads
  int32_t num_k_heads, num_v_heads, head_dim_k, head_dim_v;
  IndexType index_dtype;
  Gate gate;
  HeadMap head_map;
  bool programmatic_launch;
  int64_t num_slots;
  void const* state_indices;
  void const* state_out_indices;
  void* state;
  int64_t state_slot_stride;
  void const* q;
  int64_t q_batch_stride, q_head_stride;
  void const* k;
  int64_t k_batch_stride, k_head_stride;
  void const* v;
  int64_t v_batch_stride, v_head_stride;
  void const* a;
  int64_t a_batch_stride;
  void const* b;
  int64_t b_batch_stride;
  float const* A_log;
  float const* dt_bias;
  // ---- once the loads are in flight
  void* o;
  int64_t o_batch_stride, o_head_stride;
  uint32_t* invalid_index_count;
  L2Norm l2norm;
  float l2norm_eps;
  DType o_dtype, qkv_dtype, ab_dtype;
  // ---- the fused options (conv prologue, gated-RMSNorm epilogue)
  int32_t conv_width;
  float norm_eps;
  void const* x;
  int64_t x_batch_stride;
  void* conv_state;
  int64_t conv_state_slot_stride, conv_state_channel_stride, conv_state_tap_stride;
  void const* conv_weight;
  void const* conv_bias;
  void const* z;
  int64_t z_batch_stride, z_head_stride;
  void const* norm_weight;
};
// The first part: 192 bytes, from 0x240 to the 64-byte boundary at 0x300.
static_assert(offsetof(KernelParams, o) == 192, "KernelParams: what a block reads before its loads, 3 lines");

inline KernelParams kernel_params(const DecodeParams& p) {
  KernelParams k;
  k.num_k_heads = p.num_k_heads;
  k.num_v_heads = p.num_v_heads;
  k.head_dim_k = p.head_dim_k;
  k.head_dim_v = p.head_dim_v;
  k.index_dtype = p.index_dtype;
  k.gate = p.gate;
  k.head_map = p.head_map;
  k.programmatic_launch = p.programmatic_launch;
  k.num_slots = p.num_slots;
  k.state_indices = p.state_indices;
  k.state_out_indices = p.state_out_indices;
  k.state = p.state;
  k.state_slot_stride = p.state_slot_stride;
  k.q = p.q;
  k.q_batch_stride = p.q_batch_stride;
  k.q_head_stride = p.q_head_stride;
  k.k = p.k;
  k.k_batch_stride = p.k_batch_stride;
  k.k_head_stride = p.k_head_stride;
  k.v = p.v;
  k.v_batch_stride = p.v_batch_stride;
  k.v_head_stride = p.v_head_stride;
  k.a = p.a;
  k.a_batch_stride = p.a_batch_stride;
  k.b = p.b;
  k.b_batch_stride = p.b_batch_stride;
  k.A_log = p.A_log;
  k.dt_bias = p.dt_bias;
  k.o = p.o;
  k.o_batch_stride = p.o_batch_stride;
  k.o_head_stride = p.o_head_stride;
  k.invalid_index_count = p.invalid_index_count;
  k.l2norm = p.l2norm;
  k.l2norm_eps = p.l2norm_eps;
  k.o_dtype = p.o_dtype;
  k.qkv_dtype = p.qkv_dtype;
  k.ab_dtype = p.ab_dtype;
  k.conv_width = p.conv_width;
  k.norm_eps = p.norm_eps;
  k.x = p.x;
  k.x_batch_stride = p.x_batch_stride;
  k.conv_state = p.conv_state;
  k.conv_state_slot_stride = p.conv_state_slot_stride;
  k.conv_state_channel_stride = p.conv_state_channel_stride;
  k.conv_state_tap_stride = p.conv_state_tap_stride;
  k.conv_weight = p.conv_weight;
  k.conv_bias = p.conv_bias;
  k.z = p.z;
  k.z_batch_stride = p.z_batch_stride;
  k.z_head_stride = p.z_head_stride;
  k.norm_weight = p.norm_weight;
  return k;
}

// ---- tile geometry, fixed per (state dtype, layout, Dk capacity, kP) -------
// vk ([Dv, Dk], Dk contiguous): a column is one contiguous row of Dk elements.
// kLanesPerCol lanes share a column, each holding kChunksPerLane 16-byte
// chunks; a warp-step covers kWarp / kLanesPerCol columns, kUnroll steps make
// an item of about kP state values per lane.
template <typename T, int kDk, int kP>
struct VkTile {
  static constexpr int kVec = Vec<T>::kN;
  static constexpr int kChunks = kDk / kVec;
  static constexpr int kLanesPerCol = kChunks < kWarp ? kChunks : kWarp;
  static constexpr int kChunksPerLane = kChunks / kLanesPerCol;
  static constexpr int kColsPerStep = kWarp / kLanesPerCol;
  static constexpr int kUnroll = kP / (kChunksPerLane * kVec) > 0 ? kP / (kChunksPerLane * kVec) : 1;
  static constexpr int kColsPerItem = kColsPerStep * kUnroll;
};

// kv ([Dk, Dv], Dv contiguous), the tile of both kv kernels: a block of kW
// warps owns a tile of kW 16-byte chunks of every row, i.e. kCols = kW *
// kVec consecutive columns (kW = 8: 128-byte row segments, 32 fp32 or 64
// 16-bit columns). Thread t copies chunk t % kW of rows t / kW + 32 n
// (n < kRows), so a warp instruction moves 32 / kW rows of kW * 16
// contiguous bytes each (kW = 8: four 128-byte segments), computes on those
// chunks and stores them back (KvRegTile, decode_kernel_impl.cuh).
template <typename T, int kDk, int kW>
struct KvTile {
  static_assert(kW == 2 || kW == 4 || kW == 8, "kv: 2, 4 or 8 warps a block");
  static_assert(kDk % kWarp == 0, "kv: Dk capacity a multiple of 32");
  static constexpr int kVec = Vec<T>::kN;
  static constexpr int kCols = kW * kVec;   // columns of a tile
  static constexpr int kRows = kDk / kWarp;  // rows a thread holds
  static constexpr int kThreads = kW * kWarp;
};

template <typename T, Layout kLayout, int kDk, int kP>
constexpr int cols_per_item() {
  if constexpr (kLayout == Layout::kVK)
    return VkTile<T, kDk, kP>::kColsPerItem;
  else
    return KvTile<T, kDk, kP>::kCols;
}

// The tile parameter and the items a warp may stream that the library ships,
// from bench/tune_cuda on the H200 (bench/RESULTS.md has the sweep):
// - vk: 16 values a lane for fp32; 32 values for 16-bit states, whose 16-byte
//   vectors hold twice the elements (bf16 B = 512: 1.28x -> 1.14x the copy
//   floor, B = 8: 2.48x -> 2.01x, on the kernel before the ring); items a
//   warp up to 2, see plan_launch;
// - kv: the tile parameter is kW, the warps of a block = 16-byte chunks of a
//   row in a tile: 8 (128-byte row segments; beats 2 and 4 from B = 32 up,
//   e.g. fp32 B = 512 1.09x vs 1.24x and 1.76x), and up to 4 tiles a block
//   (items_per_warp counts the tiles a block streams through for kv; fp32
//   states take one once two a block would not fit one wave, see plan_launch).
template <typename T, Layout kLayout>
constexpr int default_tile_param() {
  return kLayout == Layout::kVK ? (sizeof(T) == 4 ? 16 : 32) : 8;
}
// kv in one-round grids: tiles of kKvSmallW warps (64-byte row segments)
// when every such tile can have its own block, all resident at once (B = 1
// at the Qwen3.5 shape): twice the blocks of the 8-warp tile, half the warps
// at each barrier (tune_cuda kv on the shared-memory kv kernel, 2026-11-30:
// B = 1 fp32 3.39 us against 3.80 at 8 warps, bf16 3.12 against 3.42; from
// B = 8 up 8 warps win or tie; the step kernel keeps the rule, B = 1 fp32
// 3.21 us). A column's sum over Dk is the same tree whatever kW, so the
// switch keeps results bitwise identical (batch invariance holds across it).
constexpr int kKvSmallW = 4;

template <typename T, Layout kLayout>
constexpr int default_items_per_warp() {
  // vk: the cap of plan_launch's rule, 2 for 16-bit states (tune_cuda vk on
  // the one-pass kernel, 2026-11-30: e.g. bf16 B = 128 69.7 us against 71.0
  // at 4, B = 512 266.0 against 270.2), 3 for fp32 (tune_cuda ipw, any
  // count forced: 2 best at B = 8 and 32, 3 from B = 128 up, 133.4 us
  // against 135.5 at 2, B = 512 522.8 against 534.0); kv: 4 tiles.
  return kLayout == Layout::kVK ? (sizeof(T) == 4 ? 3 : 2) : 4;
}

// Largest group a fused block owns (G = Hv / Hk v-heads): a vk warp works on
// one head, and a block has at most 8 warps.
constexpr int kMaxFusedGroup = 8;

// Launch geometry chosen on the host (see the header comment).
// kv: an item is a block's tile, warps_per_block is kW, items_per_warp the
// tiles a block streams through, blocks_per_head ceil(items_per_head / that).
struct Launch {
  int items_per_head;   // ceil(Dv / cols_per_item)
  int warps_per_block;  // W
  int items_per_warp;   // consecutive items a warp streams through (prefetching the next)
  int blocks_per_head;  // ceil(items_per_head / (W * items_per_warp))
  // Fused (conv prologue or norm epilogue): one block per group of
  // group_heads = Hv / Hk v-heads; vk warps_per_head warps on each head.
  bool fused{false};
  int group_heads{1};
  int warps_per_head{0};
  int cluster{1};  // blocks a group is split over (sm_90 thread-block clusters); 1 elsewhere
  // (step) q, k, v and the gates are loaded before the state: when every
  // warp (vk) or block (kv) has one item and the whole grid is resident at
  // once, the call is one round of memory latency and the small loads, the
  // longer path, must not queue behind the state's copies (B = 1 fp32 vk
  // 3.92 -> 3.61 us); in longer grids the state's stream comes first (fp32
  // B = 8 and bf16 kv from B = 32 up lost 1-4% the other way).
  bool small_loads_first{false};
  // (step) L2 policies on the state's traffic: 0, or the tile's set
  // (step_l2_hints), which a second instantiation of the step kernel
  // compiles in, chosen here: a run-time switch inside cost up to 3% where
  // it was off (bench/RESULTS.md round 19).
  int l2_hints{0};
  // (the norm alone) the step's own geometry with the gated RMSNorm as its
  // epilogue (decode_kv_step_kernel's kNorm, decode_vk's kStepNorm): a
  // head's blocks form a cluster of blocks_per_head (`cluster`), not the
  // fused kernel's groups.
  bool step_norm{false};
  // (vk step) the engines' call in one wave, one item a warp, by
  // decode_vk_wave_kernel: W warps a block, blocks = ceil(B Hv items_per_head / W).
  bool wave{false};
};

// The L2 policies a step tile's second instantiation applies (bits):
// kL2EvictFirst stores S' under an evict-first policy (store_state16), so
// L2 gives those dirty lines up first: the state is not read again before
// the next token, and the next call's (or kernel's) loads find room;
// kL2Fetch256 asks L2 for the whole 256-byte block of each copy
// (copy16_async<true>). Which bits pay differs by tile and state dtype
// (H200, bench/RESULTS.md round 20, each bit alone and both, B = 1-512):
// - vk: evict-first only (bf16 B = 1 -6.3%, B = 8-64 -1.6 to -2.4%; fp32
//   B = 1-32 -0.4 to -1%; pools -0.7 to -11%; the 256-byte copies gained
//   nothing alone and cost bf16 B = 1 5% with evict-first);
// - kv's 4-warp tile in one-round grids: both for fp32 (B = 1 2.93 us
//   against 2.96 with evict-first alone) and for 16-bit states at Dk =
//   256 (bf16 B = 1 4.22 against 4.38), evict-first alone for 16-bit
//   states up to Dk = 128 (bf16 B = 1 2.64 against 2.78 with both; Dk = 64
//   alike);
// - kv's 8-warp tile: both for fp32 (B = 8 -4.1%, through a pool -6.6%,
//   B = 16-32 -0.7 to -1.9%); none for 16-bit states (evict-first within
//   0.5% of none from B = 16 to 64; both +3 to +6.5%).
constexpr int kL2EvictFirst = 1;
constexpr int kL2Fetch256 = 2;
// (The fused kernels store S' evict-first always: kFusedL2Hints.)
template <typename T, Layout kLayout, int kDk, int kW>
constexpr int step_l2_hints() {
  if constexpr (kLayout == Layout::kVK) return kL2EvictFirst;
  if constexpr (sizeof(T) == 4 || (kW == kKvSmallW && kDk > 128)) return kL2EvictFirst | kL2Fetch256;
  return kW == kKvSmallW ? kL2EvictFirst : 0;
}
// The fused middle's kernels (conv prologue, norm epilogue or both): S'
// stored evict-first at every B, compiled in (no second instantiation).
// H200, bench/RESULTS.md round 20, fused middle at B = 1: fp32 vk 5.72 ->
// 5.34 us, fp32 kv 5.22 -> 4.97, bf16 vk 5.16 -> 4.82, bf16 kv 4.96 ->
// 4.63; the step + norm 1-12% faster; B = 8 0.4-5% faster.
constexpr int kFusedL2Hints = kL2EvictFirst;

// The geometry the library picks for p on a GPU with `sms` multiprocessors.
// l2_bytes: its L2's size (where the state's L2 policies apply).
// allow_wave false: never decode_vk_wave_kernel (Launch::wave; tune_cuda's A/B).
template <typename T, Layout kLayout, int kDk, int kP>
Launch plan_launch(const DecodeParams& p, int sms, int64_t l2_bytes, int max_items_per_warp = 4,
                   bool allow_wave = true);

template <typename T, Layout kLayout, int kDk, int kP>
cudaError_t launch_decode(const DecodeParams& p, const Launch& g, cudaStream_t stream);

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
