// The C API: converts the C struct to gdn::DecodeParams and calls the C++ entry point.
#include "gdnkit/gdnkit.h"

#include <cstdio>

#include "gdnkit/gdnkit.hpp"

namespace {

gdn::DecodeParams from_c(const gdn_decode_params& c) {
  gdn::DecodeParams p;
  p.batch = c.batch;
  p.num_k_heads = c.num_k_heads;
  p.num_v_heads = c.num_v_heads;
  p.head_dim_k = c.head_dim_k;
  p.head_dim_v = c.head_dim_v;
  p.qkv_dtype = gdn::DType(c.qkv_dtype);
  p.q = c.q;
  p.q_batch_stride = c.q_batch_stride;
  p.q_head_stride = c.q_head_stride;
  p.k = c.k;
  p.k_batch_stride = c.k_batch_stride;
  p.k_head_stride = c.k_head_stride;
  p.v = c.v;
  p.v_batch_stride = c.v_batch_stride;
  p.v_head_stride = c.v_head_stride;
  p.gate = gdn::Gate(c.gate);
  p.ab_dtype = gdn::DType(c.ab_dtype);
  p.a = c.a;
  p.a_batch_stride = c.a_batch_stride;
  p.b = c.b;
  p.b_batch_stride = c.b_batch_stride;
  p.A_log = c.A_log;
  p.dt_bias = c.dt_bias;
  p.layout = gdn::Layout(c.layout);
  p.state_dtype = gdn::DType(c.state_dtype);
  p.state = c.state;
  p.state_slot_stride = c.state_slot_stride;
  p.num_slots = c.num_slots;
  p.index_dtype = gdn::IndexType(c.index_dtype);
  p.state_indices = c.state_indices;
  p.state_out_indices = c.state_out_indices;
  p.invalid_index_count = c.invalid_index_count;
  p.o_dtype = gdn::DType(c.o_dtype);
  p.o = c.o;
  p.o_batch_stride = c.o_batch_stride;
  p.o_head_stride = c.o_head_stride;
  p.scale = c.scale;
  p.l2norm = gdn::L2Norm(c.l2norm);
  p.l2norm_eps = c.l2norm_eps;
  p.head_map = gdn::HeadMap(c.head_map);
  p.stream = c.stream;
  p.conv_width = c.conv_width;
  p.x = c.x;
  p.x_batch_stride = c.x_batch_stride;
  p.conv_state = c.conv_state;
  p.conv_state_slot_stride = c.conv_state_slot_stride;
  p.conv_state_channel_stride = c.conv_state_channel_stride;
  p.conv_state_tap_stride = c.conv_state_tap_stride;
  p.conv_weight = c.conv_weight;
  p.conv_bias = c.conv_bias;
  p.z = c.z;
  p.z_batch_stride = c.z_batch_stride;
  p.z_head_stride = c.z_head_stride;
  p.norm_weight = c.norm_weight;
  p.norm_eps = c.norm_eps;
  p.programmatic_launch = c.programmatic_launch != 0;
  p.num_tokens = c.num_tokens;
  p.q_token_stride = c.q_token_stride;
  p.k_token_stride = c.k_token_stride;
  p.v_token_stride = c.v_token_stride;
  p.a_token_stride = c.a_token_stride;
  p.b_token_stride = c.b_token_stride;
  p.o_token_stride = c.o_token_stride;
  p.z_token_stride = c.z_token_stride;
  p.x_token_stride = c.x_token_stride;
  p.cu_seqlens = c.cu_seqlens;
  p.total_tokens = c.total_tokens;
  p.token_state_indices = c.token_state_indices;
  p.token_state_indices_stride = c.token_state_indices_stride;
  p.num_accepted_tokens = c.num_accepted_tokens;
  p.intermediate_states = c.intermediate_states;
  p.intermediate_batch_stride = c.intermediate_batch_stride;
  p.intermediate_token_stride = c.intermediate_token_stride;
  p.intermediate_conv_states = c.intermediate_conv_states;
  p.intermediate_conv_batch_stride = c.intermediate_conv_batch_stride;
  p.intermediate_conv_token_stride = c.intermediate_conv_token_stride;
  p.update_state = c.update_state != 0;
  p.b_head_stride = c.b_head_stride;
  return p;
}

// The other way: every member of the C struct from the C++ one.
gdn_decode_params to_c(const gdn::DecodeParams& p) {
  gdn_decode_params c{};
  c.batch = p.batch;
  c.num_k_heads = p.num_k_heads;
  c.num_v_heads = p.num_v_heads;
  c.head_dim_k = p.head_dim_k;
  c.head_dim_v = p.head_dim_v;
  c.qkv_dtype = int32_t(p.qkv_dtype);
  c.q = p.q;
  c.q_batch_stride = p.q_batch_stride;
  c.q_head_stride = p.q_head_stride;
  c.k = p.k;
  c.k_batch_stride = p.k_batch_stride;
  c.k_head_stride = p.k_head_stride;
  c.v = p.v;
  c.v_batch_stride = p.v_batch_stride;
  c.v_head_stride = p.v_head_stride;
  c.gate = int32_t(p.gate);
  c.ab_dtype = int32_t(p.ab_dtype);
  c.a = p.a;
  c.a_batch_stride = p.a_batch_stride;
  c.b = p.b;
  c.b_batch_stride = p.b_batch_stride;
  c.A_log = p.A_log;
  c.dt_bias = p.dt_bias;
  c.layout = int32_t(p.layout);
  c.state_dtype = int32_t(p.state_dtype);
  c.state = p.state;
  c.state_slot_stride = p.state_slot_stride;
  c.num_slots = p.num_slots;
  c.index_dtype = int32_t(p.index_dtype);
  c.state_indices = p.state_indices;
  c.state_out_indices = p.state_out_indices;
  c.invalid_index_count = p.invalid_index_count;
  c.o_dtype = int32_t(p.o_dtype);
  c.o = p.o;
  c.o_batch_stride = p.o_batch_stride;
  c.o_head_stride = p.o_head_stride;
  c.scale = p.scale;
  c.l2norm = int32_t(p.l2norm);
  c.l2norm_eps = p.l2norm_eps;
  c.head_map = int32_t(p.head_map);
  c.stream = p.stream;
  c.conv_width = p.conv_width;
  c.x = p.x;
  c.x_batch_stride = p.x_batch_stride;
  c.conv_state = p.conv_state;
  c.conv_state_slot_stride = p.conv_state_slot_stride;
  c.conv_state_channel_stride = p.conv_state_channel_stride;
  c.conv_state_tap_stride = p.conv_state_tap_stride;
  c.conv_weight = p.conv_weight;
  c.conv_bias = p.conv_bias;
  c.z = p.z;
  c.z_batch_stride = p.z_batch_stride;
  c.z_head_stride = p.z_head_stride;
  c.norm_weight = p.norm_weight;
  c.norm_eps = p.norm_eps;
  c.programmatic_launch = p.programmatic_launch ? 1 : 0;
  c.num_tokens = p.num_tokens;
  c.q_token_stride = p.q_token_stride;
  c.k_token_stride = p.k_token_stride;
  c.v_token_stride = p.v_token_stride;
  c.a_token_stride = p.a_token_stride;
  c.b_token_stride = p.b_token_stride;
  c.o_token_stride = p.o_token_stride;
  c.z_token_stride = p.z_token_stride;
  c.x_token_stride = p.x_token_stride;
  c.cu_seqlens = p.cu_seqlens;
  c.total_tokens = p.total_tokens;
  c.token_state_indices = p.token_state_indices;
  c.token_state_indices_stride = p.token_state_indices_stride;
  c.num_accepted_tokens = p.num_accepted_tokens;
  c.intermediate_states = p.intermediate_states;
  c.intermediate_batch_stride = p.intermediate_batch_stride;
  c.intermediate_token_stride = p.intermediate_token_stride;
  c.intermediate_conv_states = p.intermediate_conv_states;
  c.intermediate_conv_batch_stride = p.intermediate_conv_batch_stride;
  c.intermediate_conv_token_stride = p.intermediate_conv_token_stride;
  c.update_state = p.update_state ? 1 : 0;
  c.b_head_stride = p.b_head_stride;
  return c;
}

int finish(const gdn::Status& st, char* message, size_t message_size) {
  if (message != nullptr && message_size > 0) std::snprintf(message, message_size, "%s", st.message);
  return int(st.code);
}

}  // namespace

extern "C" {

void gdn_decode_params_init(gdn_decode_params* c) {
  if (c == nullptr) return;
  *c = to_c(gdn::DecodeParams{});  // the C++ defaults are the single source of truth
}

int gdn_validate(const gdn_decode_params* c, char* message, size_t message_size) {
  if (c == nullptr)
    return finish(gdn::make_status(gdn::StatusCode::kInvalidArgument, "params: null pointer"),
                  message, message_size);
  return finish(gdn::validate(from_c(*c)), message, message_size);
}

int gdn_decode(const gdn_decode_params* c, int backend, char* message, size_t message_size) {
  if (c == nullptr)
    return finish(gdn::make_status(gdn::StatusCode::kInvalidArgument, "params: null pointer"),
                  message, message_size);
  if (backend < GDN_BACKEND_AUTO || backend > GDN_BACKEND_HIP)
    return finish(gdn::make_status(gdn::StatusCode::kInvalidArgument,
                                   "backend: unknown value %d", backend),
                  message, message_size);
  return finish(gdn::decode(from_c(*c), gdn::Backend(backend)), message, message_size);
}

int gdn_backend_available(int backend) {
  if (backend < GDN_BACKEND_AUTO || backend > GDN_BACKEND_HIP) return 0;
  return gdn::backend_available(gdn::Backend(backend)) ? 1 : 0;
}

const char* gdn_version(void) { return gdn::version(); }

}  // extern "C"
