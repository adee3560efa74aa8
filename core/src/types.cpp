#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "gdnkit/gdnkit.hpp"

namespace gdn {

Status make_status(StatusCode code, const char* fmt, ...) {
  Status st;
  st.code = code;
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(st.message, Status::kMessageSize, fmt, args);
  va_end(args);
  return st;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
  }
  return "invalid-dtype";
}
const char* to_string(IndexType t) {
  switch (t) {
    case IndexType::kNone: return "none";
    case IndexType::kI32: return "int32";
    case IndexType::kI64: return "int64";
  }
  return "invalid-index-dtype";
}
const char* to_string(Layout l) {
  switch (l) {
    case Layout::kKV: return "kv";
    case Layout::kVK: return "vk";
  }
  return "invalid-layout";
}
const char* to_string(L2Norm n) {
  switch (n) {
    case L2Norm::kRsqrt: return "rsqrt";
    case L2Norm::kMaxNorm: return "max_norm";
    case L2Norm::kNone: return "none";
  }
  return "invalid-l2norm";
}
const char* to_string(HeadMap m) {
  switch (m) {
    case HeadMap::kInterleaved: return "interleaved";
    case HeadMap::kTiled: return "tiled";
  }
  return "invalid-head-map";
}
const char* to_string(Gate g) {
  switch (g) {
    case Gate::kRaw: return "raw";
    case Gate::kPrecomputed: return "precomputed";
  }
  return "invalid-gate";
}
const char* to_string(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kHost: return "host";
    case Backend::kCuda: return "cuda";
    case Backend::kHip: return "hip";
  }
  return "invalid-backend";
}
const char* to_string(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kBackendNotBuilt: return "backend not built";
    case StatusCode::kNoDevice: return "no device";
    case StatusCode::kBackendError: return "backend error";
  }
  return "invalid-status";
}

float effective_scale(const DecodeParams& p) {
  return p.scale != 0.0f ? p.scale : float(1.0 / std::sqrt(double(p.head_dim_k)));
}

void set_packed_qkv(DecodeParams& p, void const* mixed_qkv, int64_t row_stride) {
  const size_t elem = dtype_size(p.qkv_dtype);
  const int64_t qk_width = int64_t(p.num_k_heads) * p.head_dim_k;
  auto at = [&](int64_t offset) {
    return static_cast<void const*>(static_cast<const char*>(mixed_qkv) + offset * int64_t(elem));
  };
  // [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)], one such row a token
  p.q = at(0);
  p.k = at(qk_width);
  p.v = at(2 * qk_width);
  const int64_t batch_stride = p.cu_seqlens ? 0 : int64_t(p.num_tokens) * row_stride;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = batch_stride;
  p.q_token_stride = p.k_token_stride = p.v_token_stride = row_stride;
  p.q_head_stride = p.k_head_stride = p.head_dim_k;
  p.v_head_stride = p.head_dim_v;
}

void set_dense_strides(DecodeParams& p) {
  // With cu_seqlens the tokens are packed (total_tokens, ...): no batch stride.
  const int64_t T = p.cu_seqlens ? 0 : p.num_tokens;
  const int64_t qk_row = int64_t(p.num_k_heads) * p.head_dim_k;
  const int64_t v_row = int64_t(p.num_v_heads) * p.head_dim_v;
  p.q_head_stride = p.k_head_stride = p.head_dim_k;
  p.q_token_stride = p.k_token_stride = qk_row;
  p.q_batch_stride = p.k_batch_stride = T * qk_row;
  p.v_head_stride = p.o_head_stride = p.z_head_stride = p.head_dim_v;
  p.v_token_stride = p.o_token_stride = p.z_token_stride = v_row;
  p.v_batch_stride = p.o_batch_stride = p.z_batch_stride = T * v_row;
  p.a_token_stride = p.b_token_stride = p.num_v_heads;
  p.a_batch_stride = p.b_batch_stride = T * p.num_v_heads;
  p.state_slot_stride = int64_t(p.num_v_heads) * p.head_dim_k * p.head_dim_v;
  p.x_token_stride = conv_dim(p);
  p.x_batch_stride = T * conv_dim(p);
  if (p.conv_width > 1) {
    // [slot, conv_dim, W-1]: a channel's taps contiguous, oldest first
    p.conv_state_tap_stride = 1;
    p.conv_state_channel_stride = p.conv_width - 1;
    p.conv_state_slot_stride = conv_dim(p) * (p.conv_width - 1);
  }
  if (p.token_state_indices != nullptr) p.token_state_indices_stride = p.num_tokens;
  if (p.intermediate_states != nullptr) {
    p.intermediate_token_stride = p.state_slot_stride;
    p.intermediate_batch_stride = int64_t(p.num_tokens) * p.state_slot_stride;
  }
  if (p.intermediate_conv_states != nullptr && p.conv_width > 1) {
    p.intermediate_conv_token_stride = p.conv_state_slot_stride;
    p.intermediate_conv_batch_stride = int64_t(p.num_tokens) * p.conv_state_slot_stride;
  }
}

const char* multi_token_member(const DecodeParams& p) {
  if (p.num_tokens != 1) return "num_tokens";
  if (p.cu_seqlens != nullptr) return "cu_seqlens";
  if (p.token_state_indices != nullptr) return "token_state_indices";
  if (p.intermediate_states != nullptr) return "intermediate_states";
  if (p.intermediate_conv_states != nullptr) return "intermediate_conv_states";
  if (!p.update_state) return "update_state";
  if (p.b_head_stride != 0) return "b_head_stride";
  return nullptr;
}

bool is_multi_token(const DecodeParams& p) { return multi_token_member(p) != nullptr; }

int64_t conv_dim(const DecodeParams& p) {
  return 2 * int64_t(p.num_k_heads) * p.head_dim_k + int64_t(p.num_v_heads) * p.head_dim_v;
}

const char* version() { return GDNKIT_VERSION_STRING; }

}  // namespace gdn
