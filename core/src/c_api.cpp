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
  return p;
}

int finish(const gdn::Status& st, char* message, size_t message_size) {
  if (message != nullptr && message_size > 0) std::snprintf(message, message_size, "%s", st.message);
  return int(st.code);
}

}  // namespace

extern "C" {

void gdn_decode_params_init(gdn_decode_params* c) {
  if (c == nullptr) return;
  const gdn::DecodeParams d;  // the C++ defaults are the single source of truth
  *c = gdn_decode_params{};
  c->qkv_dtype = int32_t(d.qkv_dtype);
  c->gate = int32_t(d.gate);
  c->ab_dtype = int32_t(d.ab_dtype);
  c->layout = int32_t(d.layout);
  c->state_dtype = int32_t(d.state_dtype);
  c->index_dtype = int32_t(d.index_dtype);
  c->o_dtype = int32_t(d.o_dtype);
  c->scale = d.scale;
  c->l2norm = int32_t(d.l2norm);
  c->l2norm_eps = d.l2norm_eps;
  c->head_map = int32_t(d.head_map);
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
