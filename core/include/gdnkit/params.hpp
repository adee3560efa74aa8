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
  // > 0: per-channel beta (FLA's and vLLM's beta [B, T, Hv, Dv]; gate ==
  // kPrecomputed only): b is (B, Hv, Dv), the beta of column j of head h at
  // h * b_head_stride + j (>= Dv apart), and delta_j = beta_j (v_j - ...).
  // 0: one beta a head. Calls with it run the multi-token paths.
  int64_t b_head_stride{0};
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

  // ---- conv1d prologue (optional; on when conv_width > 0) ------------------
  // causal_conv1d_update on the raw projected row x[b] (conv_dim = 2*Hk*Dk +
  // Hv*Dv channels, the q|k|v order of the packed row), per channel c:
  //   window[c] = (conv_state[s_in, c, 0 .. W-2], x[b, c])        oldest first
  //   y[c]      = silu(sum_{j<W} conv_weight[c, j] * window[c, j] + conv_bias[c])
  //   conv_state[s_out, c, 0 .. W-2] = window[c, 1 .. W-1]         (shift in x)
  // and y is the packed q|k|v row of the step (q, k, v must then be null; y
  // is never stored). Same slots as the state pool: a padding row touches
  // neither pool, a negative write index writes neither. x, the conv state,
  // weight and bias are in qkv_dtype (the model's dtype, as engines keep them).
  int32_t conv_width{0};                  // W: 2, 3 or 4; 0 = no prologue
  void const* x{nullptr};                 // (B, conv_dim)
  int64_t x_batch_stride{0};
  void* conv_state{nullptr};              // pool: (num_slots, conv_dim, W-1) by default
  int64_t conv_state_slot_stride{0};      // >= the span of one slot
  int64_t conv_state_channel_stride{0};   // W-1 for [slot, conv_dim, W-1]; 1 for [slot, W-1, conv_dim]
  int64_t conv_state_tap_stride{0};       // 1, or >= conv_dim for [slot, W-1, conv_dim]
  void const* conv_weight{nullptr};       // (conv_dim, W), contiguous
  void const* conv_bias{nullptr};         // (conv_dim), optional

  // ---- gated RMSNorm epilogue (optional; on when norm_weight != nullptr) ----
  // Qwen3-Next's RMSNormGated over each v-head's Dv outputs, in fp32, before
  // the output is rounded to o_dtype:
  //   o[b, h, j] = norm_weight[j] * o[j] * rsqrt(mean_j(o^2) + norm_eps) * silu(z[b, h, j])
  // z and norm_weight are in qkv_dtype. A padding row's output stays zero.
  void const* z{nullptr};                 // (B, Hv, Dv)
  int64_t z_batch_stride{0};
  int64_t z_head_stride{0};
  void const* norm_weight{nullptr};       // (Dv)
  float norm_eps{1e-6f};

  // ---- execution -----------------------------------------------------------
  void* stream{nullptr};  // cudaStream_t / hipStream_t; ignored by the host backend
  // Programmatic dependent launch (CUDA sm_90): the kernel may start while the
  // previous kernel on the stream is still running; it reads the index arrays,
  // issues its first state loads and (with 16-bit inputs) loads the conv
  // state, conv_weight, conv_bias and norm_weight, then waits for that kernel
  // (griddepcontrol.wait) before reading x/q/k/v, a/b and z. The caller
  // promises that the previous kernel writes none of those read before the
  // wait: neither pool, the index arrays, nor the conv and norm weights.
  // Ignored where the GPU lacks it (sm_80, AMD) and by the host backend. A
  // one-wave grid then pads its shared memory so its blocks spread over the
  // SMs (docs/operation.md).
  bool programmatic_launch{false};

  // ---- multi-token decode (speculative decoding; optional) ------------------
  // num_tokens = T > 1: each row carries up to T tokens that run in order on
  // the row's state (read once, kept, rounded to state_dtype after every
  // token exactly as a write and a read back would round it, so one call
  // equals T calls of one token). Every token has its own q, k, v, a, b, z, x
  // and output. Token t of row b sits at
  //   b * <t>_batch_stride + t * <t>_token_stride             (dense (B, T, ...))
  //   (cu_seqlens[b] + t) * <t>_token_stride                  (with cu_seqlens)
  // plus the head offset, for every token-major tensor <t> of q, k, v, a, b,
  // o, z, x. The token strides are unused when T = 1 and cu_seqlens is null.
  int32_t num_tokens{1};  // T: 1 .. kMaxTokens
  int64_t q_token_stride{0};
  int64_t k_token_stride{0};
  int64_t v_token_stride{0};
  int64_t a_token_stride{0};
  int64_t b_token_stride{0};
  int64_t o_token_stride{0};
  int64_t z_token_stride{0};
  int64_t x_token_stride{0};
  // Optional (B + 1), index_dtype (vLLM's query_start_loc): row b owns the
  // packed tokens [cu_seqlens[b], cu_seqlens[b+1]), at most T of them, in
  // token-major tensors of total_tokens tokens (the batch strides unused). A
  // row whose range is not 0 <= cu[b] <= cu[b+1] <= total_tokens with at
  // most T tokens is a caller bug: nothing read or written, counted once.
  void const* cu_seqlens{nullptr};
  int64_t total_tokens{0};  // with cu_seqlens: tokens in q, k, v, a, b, o, z, x
  // Optional (B, T) per-token slots, index_dtype, rows token_state_indices_stride
  // apart (vLLM's ssm_state_indices, FlashInfer's ssm_state_indices): the
  // state (and conv state) after token t of row b is written to slot
  // token_state_indices[b, t] (negative: not written; >= num_slots: not
  // written, counted); besides, the state after the row's last token goes to
  // slot state_out_indices[b] when that is given (FlashInfer's split pool;
  // state_indices then required), else no final write. The initial state is read from
  // state_indices[b] when given, else from token_state_indices[b, n - 1] with
  // n = num_accepted_tokens[b] (1 when that is null; vLLM's rule); n outside
  // [1, T] is a caller bug (padding, counted).
  void const* token_state_indices{nullptr};
  int64_t token_state_indices_stride{0};  // >= T
  void const* num_accepted_tokens{nullptr};  // (B), index_dtype; needs token_state_indices
  // Optional dense buffer of every token's state (FlashInfer's
  // intermediate_states_buffer): the state after token t of row b to
  // intermediate_states + b * batch stride + t * token stride, heads packed
  // as in a slot, in state_dtype and layout. intermediate_conv_states, the
  // same for the conv state (the pool's channel and tap strides; optional,
  // with the conv prologue only).
  void* intermediate_states{nullptr};
  int64_t intermediate_batch_stride{0};
  int64_t intermediate_token_stride{0};  // >= Hv*Dk*Dv
  void* intermediate_conv_states{nullptr};
  int64_t intermediate_conv_batch_stride{0};
  int64_t intermediate_conv_token_stride{0};  // >= one conv slot's span
  // false: neither pool is written (FlashInfer's disable_state_update); the
  // outputs and the intermediate buffers still are. Not with token_state_indices.
  bool update_state{true};
};

// Most tokens a row may carry in one call (MTP verifies 1 + k drafts, k <= 8 in practice).
constexpr int32_t kMaxTokens = 16;

// True when a call uses any multi-token member (T > 1, cu_seqlens, per-token
// slots, intermediate buffers, update_state = false) or per-channel beta:
// such calls run the backends' multi-token paths (the host reference's, the
// GPUs' token kernel).
bool is_multi_token(const DecodeParams& p);
// The first multi-token member a call uses (its name), or nullptr.
const char* multi_token_member(const DecodeParams& p);

// Largest head dim any backend accepts; head dims are multiples of kHeadDimAlign.
constexpr int32_t kMaxHeadDim = 256;
constexpr int32_t kHeadDimAlign = 16;

// The scale actually used: params.scale, or Dk^-0.5 when it is 0.
float effective_scale(const DecodeParams& p);

// Fill q/k/v pointers and strides from one packed mixed_qkv buffer
// (B, T, 2*Hk*Dk + Hv*Dv), one row a token, rows row_stride elements apart
// (batch stride T * row_stride; 0 with cu_seqlens, the tokens packed).
// Sizes, num_tokens, cu_seqlens and qkv_dtype must be set first.
void set_packed_qkv(DecodeParams& p, void const* mixed_qkv, int64_t row_stride);

// Channels of the conv prologue's packed row: 2*Hk*Dk + Hv*Dv.
int64_t conv_dim(const DecodeParams& p);

// Fill every stride for dense, contiguous tensors from the sizes
// (q, k: (B, T, Hk, Dk); v, o, z: (B, T, Hv, Dv); a, b: (B, T, Hv); pool:
// Hv*Dk*Dv per slot; x: (B, T, conv_dim); conv state (num_slots, conv_dim,
// W-1) when conv_width is set; with cu_seqlens the tensors are (total_tokens,
// ...) and the batch strides 0; token_state_indices (B, T); the intermediate
// buffers (B, T, ...) when given).
void set_dense_strides(DecodeParams& p);

}  // namespace gdn
