/* gdnkit — plain C API over the same entry point as gdn::decode().
 *
 * For C, Rust or Python FFI. Fill a gdn_decode_params with
 * gdn_decode_params_init() (which sets every default), set sizes, pointers
 * and strides, then call gdn_decode(). Enum values equal the C++ ones.
 * Returns 0 on success, else a gdn_status code; `message` (may be NULL)
 * receives the reason. Nothing is written on failure.
 */
#ifndef GDNKIT_GDNKIT_H_
#define GDNKIT_GDNKIT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum gdn_dtype { GDN_F32 = 0, GDN_F16 = 1, GDN_BF16 = 2 };
enum gdn_index_dtype { GDN_INDEX_NONE = 0, GDN_INDEX_I32 = 1, GDN_INDEX_I64 = 2 };
enum gdn_layout { GDN_LAYOUT_KV = 0, GDN_LAYOUT_VK = 1 };
enum gdn_l2norm { GDN_L2NORM_RSQRT = 0, GDN_L2NORM_MAX_NORM = 1, GDN_L2NORM_NONE = 2 };
enum gdn_head_map { GDN_HEAD_MAP_INTERLEAVED = 0, GDN_HEAD_MAP_TILED = 1 };
enum gdn_gate { GDN_GATE_RAW = 0, GDN_GATE_PRECOMPUTED = 1 };
enum gdn_backend { GDN_BACKEND_AUTO = 0, GDN_BACKEND_HOST = 1, GDN_BACKEND_CUDA = 2, GDN_BACKEND_HIP = 3 };
enum gdn_status {
  GDN_OK = 0,
  GDN_INVALID_ARGUMENT = 1,
  GDN_UNSUPPORTED = 2,
  GDN_BACKEND_NOT_BUILT = 3,
  GDN_NO_DEVICE = 4,
  GDN_BACKEND_ERROR = 5
};

/* Same members, meaning and shapes as gdn::DecodeParams (params.hpp). */
typedef struct gdn_decode_params {
  int64_t batch;
  int32_t num_k_heads, num_v_heads, head_dim_k, head_dim_v;

  int32_t qkv_dtype; /* gdn_dtype */
  const void* q;
  int64_t q_batch_stride, q_head_stride;
  const void* k;
  int64_t k_batch_stride, k_head_stride;
  const void* v;
  int64_t v_batch_stride, v_head_stride;

  int32_t gate;     /* gdn_gate */
  int32_t ab_dtype; /* gdn_dtype */
  const void* a;
  int64_t a_batch_stride;
  const void* b;
  int64_t b_batch_stride;
  const float* A_log;
  const float* dt_bias;

  int32_t layout;      /* gdn_layout */
  int32_t state_dtype; /* gdn_dtype */
  void* state;
  int64_t state_slot_stride;
  int64_t num_slots;

  int32_t index_dtype; /* gdn_index_dtype */
  const void* state_indices;
  const void* state_out_indices;
  uint32_t* invalid_index_count;

  int32_t o_dtype; /* gdn_dtype */
  void* o;
  int64_t o_batch_stride, o_head_stride;

  float scale; /* 0: Dk^-0.5 */
  int32_t l2norm; /* gdn_l2norm */
  float l2norm_eps;
  int32_t head_map; /* gdn_head_map */

  void* stream;

  /* ---- members added after `stream`: every earlier member keeps its offset.
   * gdn_decode_params_init() sets them all; code that fills the struct
   * member by member after init needs no change. */

  /* conv1d prologue (causal_conv1d_update), on when conv_width > 0; q, k and
   * v must then be NULL: the packed q|k|v row is the conv's output.
   * conv_dim = 2*Hk*Dk + Hv*Dv. Per channel c of row b:
   *   window = (conv_state[s_in, c, 0 .. W-2], x[b, c])         oldest first
   *   y[c]   = silu(sum_j conv_weight[c, j] * window[j] + conv_bias[c])
   *   conv_state[s_out, c, 0 .. W-2] = window[1 .. W-1]
   * Same slots (and padding rules) as the state pool. x, conv_state,
   * conv_weight and conv_bias are in qkv_dtype. */
  int32_t conv_width;                /* W: 2, 3 or 4; 0 = no prologue */
  const void* x;                     /* (B, conv_dim) */
  int64_t x_batch_stride;
  void* conv_state;                  /* pool: (num_slots, conv_dim, W-1) by default */
  int64_t conv_state_slot_stride;    /* >= the span of one slot */
  int64_t conv_state_channel_stride; /* W-1 for [slot, conv_dim, W-1]; 1 for [slot, W-1, conv_dim] */
  int64_t conv_state_tap_stride;     /* 1, or >= conv_dim for [slot, W-1, conv_dim] */
  const void* conv_weight;           /* (conv_dim, W), contiguous */
  const void* conv_bias;             /* (conv_dim), or NULL */

  /* gated RMSNorm epilogue, on when norm_weight != NULL (z and norm_weight in
   * qkv_dtype), in fp32 before the output is rounded:
   *   o[b, h, j] = norm_weight[j] * o[j] * rsqrt(mean_j(o^2) + norm_eps) * silu(z[b, h, j]) */
  const void* z;                     /* (B, Hv, Dv) */
  int64_t z_batch_stride, z_head_stride;
  const void* norm_weight;           /* (Dv) */
  float norm_eps;                    /* default 1e-6 */

  /* 0 or 1: programmatic dependent launch (CUDA sm_90), a scheduling hint
   * with no effect on results; see params.hpp for the caller's promise. */
  int32_t programmatic_launch;

  /* multi-token decode (speculative decoding); see params.hpp for the rules.
   * num_tokens = T in [1, 16]; token t of row b sits at b*batch_stride +
   * t*token_stride (dense (B, T, ...)) or (cu_seqlens[b] + t)*token_stride. */
  int32_t num_tokens; /* default 1 */
  int64_t q_token_stride, k_token_stride, v_token_stride, a_token_stride;
  int64_t b_token_stride, o_token_stride, z_token_stride, x_token_stride;
  const void* cu_seqlens;          /* (B + 1), index_dtype, or NULL */
  int64_t total_tokens;            /* tokens in the packed tensors with cu_seqlens */
  const void* token_state_indices; /* (B, T), index_dtype: slot of the state after token t */
  int64_t token_state_indices_stride;
  const void* num_accepted_tokens;  /* (B), index_dtype: initial slot token_state_indices[b, n-1] */
  void* intermediate_states;        /* (B, T) states, each laid out as a slot, or NULL */
  int64_t intermediate_batch_stride, intermediate_token_stride;
  void* intermediate_conv_states;   /* (B, T) conv states (the pool's strides), or NULL */
  int64_t intermediate_conv_batch_stride, intermediate_conv_token_stride;
  int32_t update_state;             /* default 1; 0: neither pool written */

  /* > 0: per-channel beta (gate precomputed): b is (B, Hv, Dv), head h at
   * h*b_head_stride; 0 (default): one beta a head. See params.hpp. */
  int64_t b_head_stride;
} gdn_decode_params;

/* Set every member to the library default (the C++ struct's initializers). */
void gdn_decode_params_init(gdn_decode_params* p);

/* Validate only. */
int gdn_validate(const gdn_decode_params* p, char* message, size_t message_size);

/* Validate, then run on `backend` (a gdn_backend). */
int gdn_decode(const gdn_decode_params* p, int backend, char* message, size_t message_size);

/* 1 when the backend is built and has a device, else 0. */
int gdn_backend_available(int backend);

const char* gdn_version(void);

#ifdef __cplusplus
}
#endif

#endif /* GDNKIT_GDNKIT_H_ */
