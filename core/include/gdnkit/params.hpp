// gdnkit — the one parameter struct of the fused GDN decode step.
//
// A plain struct of pointers, sizes, 64-bit element strides and switches,
// every member with a default. Fill it, call gdn::decode(params, backend).
// validate() checks it once at the boundary; kernels never validate.
//
// Strides are in elements of the tensor's own dtype. The innermost dimension
// of every tensor is contiguous (stride 1). Pointers are host memory for the
// host backend and device memory for GPU backends.
#pragma once

#include "gdnkit/types.hpp"

namespace gdn {

struct DecodeParams {
  // ---- sizes ---------------------------------------------------------------
  int64_t batch{0};        // B: rows (sequences) in this call
  int32_t num_k_heads{0};  // Hk
  int32_t num_v_heads{0};  // Hv, a multiple of Hk (G = Hv / Hk)
  int32_t head_dim_k{0};   // Dk
  int32_t head_dim_v{0};   // Dv

  // ---- q, k, v -------------------------------------------------------------
  // A packed mixed_qkv row [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)] is three
  // pointers into one buffer with batch stride 2*Hk*Dk + Hv*Dv.
  DType qkv_dtype{DType::kBF16};
  void const* q{nullptr};  // (B, Hk, Dk)
  int64_t q_batch_stride{0};
  int64_t q_head_stride{0};
  void const* k{nullptr};  // (B, Hk, Dk)
  int64_t k_batch_stride{0};
  int64_t k_head_stride{0};
  void const* v{nullptr};  // (B, Hv, Dv)
  int64_t v_batch_stride{0};
  int64_t v_head_stride{0};

  // ---- gates ---------------------------------------------------------------
  Gate gate{Gate::kRaw};
  DType ab_dtype{DType::kBF16};
  void const* a{nullptr};  // (B, Hv): raw a, or g in log space when gate == kPrecomputed
  int64_t a_batch_stride{0};
  void const* b{nullptr};  // (B, Hv): raw b, or beta in [0, 1] when gate == kPrecomputed
  int64_t b_batch_stride{0};
  float const* A_log{nullptr};    // (Hv) fp32; unused when gate == kPrecomputed
  float const* dt_bias{nullptr};  // (Hv) fp32; unused when gate == kPrecomputed

  // ---- state pool ----------------------------------------------------------
  // Read from slot_of(b) and written to the write slot (the same slot unless
  // state_out_indices is given). In and out are the same pool: not __restrict__.
  Layout layout{Layout::kVK};
  DType state_dtype{DType::kF32};
  void* state{nullptr};          // (num_slots, Hv, Dk, Dv) for kKV, (num_slots, Hv, Dv, Dk) for kVK
  int64_t state_slot_stride{0};  // >= Hv*Dk*Dv; heads are packed inside a slot
  int64_t num_slots{0};          // slots in the pool; >= B when there is no index array

  // ---- slot indices (optional) ---------------------------------------------
  // state_indices[b] < 0: padding row (state untouched, output row zeroed).
  // state_indices[b] >= num_slots: a caller bug; treated as padding and counted
  // in *invalid_index_count. state_out_indices[b] < 0: output computed, no
  // state written (>= num_slots likewise, and counted).
  IndexType index_dtype{IndexType::kNone};
  void const* state_indices{nullptr};      // (B)
  void const* state_out_indices{nullptr};  // (B), optional; needs state_indices
  // Optional: incremented (atomically on GPUs) once per out-of-range index
  // seen. Same memory space as the tensors; read it after the stream syncs.
  uint32_t* invalid_index_count{nullptr};

  // ---- output --------------------------------------------------------------
  DType o_dtype{DType::kBF16};
  void* o{nullptr};  // (B, Hv, Dv)
  int64_t o_batch_stride{0};
  int64_t o_head_stride{0};

  // ---- conventions ---------------------------------------------------------
  float scale{0.0f};  // o = scale * S^T q_hat; 0 selects the default Dk^-0.5
  L2Norm l2norm{L2Norm::kRsqrt};
  float l2norm_eps{1e-6f};
  HeadMap head_map{HeadMap::kInterleaved};

  // ---- execution -----------------------------------------------------------
  void* stream{nullptr};  // cudaStream_t / hipStream_t; ignored by the host backend
};

// Largest head dim any backend accepts; head dims are multiples of kHeadDimAlign.
constexpr int32_t kMaxHeadDim = 256;
constexpr int32_t kHeadDimAlign = 16;

// The scale actually used: params.scale, or Dk^-0.5 when it is 0.
float effective_scale(const DecodeParams& p);

// Fill q/k/v pointers and strides from one packed mixed_qkv buffer
// (B, 2*Hk*Dk + Hv*Dv) whose rows are row_stride elements apart.
// Sizes and qkv_dtype must be set first.
void set_packed_qkv(DecodeParams& p, void const* mixed_qkv, int64_t row_stride);

// Fill every stride for dense, contiguous tensors from the sizes
// (q, k: (B, Hk, Dk); v, o: (B, Hv, Dv); a, b: (B, Hv); pool: Hv*Dk*Dv per slot).
void set_dense_strides(DecodeParams& p);

}  // namespace gdn
