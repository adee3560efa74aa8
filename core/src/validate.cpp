// The one validation of DecodeParams, run before any backend sees them.
//
// Every rule returns a status whose message names the argument and the value
// it saw. The checks only read the struct, never the tensors: they run the
// same for host and device pointers.
#include <cmath>
#include <cstdint>

#include "gdnkit/gdnkit.hpp"

namespace gdn {
namespace {

#define GDN_REFUSE(...) return make_status(StatusCode::kInvalidArgument, __VA_ARGS__)

// Largest element offset we let a tensor reach: byte offsets stay far from
// int64 overflow even after a backend adds a vector width.
constexpr int64_t kMaxElements = int64_t(1) << 60;

bool valid_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// A byte range [lo, hi) a tensor may touch.
struct Extent {
  uintptr_t lo{0};
  uintptr_t hi{0};
  const char* name{""};
};

bool overlaps(const Extent& x, const Extent& y) {
  return x.lo < x.hi && y.lo < y.hi && x.lo < y.hi && y.lo < x.hi;
}

// Extent of a (rows, heads, dim) tensor with the given element strides.
Extent extent_of(const char* name, const void* ptr, int64_t rows, int64_t heads, int64_t dim,
                 int64_t row_stride, int64_t head_stride, size_t elem) {
  Extent e;
  e.name = name;
  if (ptr == nullptr || rows <= 0) return e;
  const int64_t last = (rows - 1) * row_stride + (heads - 1) * head_stride + dim;
  e.lo = reinterpret_cast<uintptr_t>(ptr);
  e.hi = e.lo + uintptr_t(last) * elem;
  return e;
}

// (rows, heads, dim) tensor, dim contiguous: strides must keep every
// (row, head) vector apart, and one of the two dimensions must nest the other.
// Products are formed in 128 bits: strides up to INT64_MAX times 2^31 rows
// must be refused, not overflow.
Status check_strides(const char* name, int64_t rows, int64_t heads, int64_t dim,
                     int64_t row_stride, int64_t head_stride, const char* dim_name,
                     const char* row_name = "batch") {
  using Wide = __int128;
  if (heads > 1 && head_stride < dim)
    GDN_REFUSE("%s: head stride %lld is smaller than %s=%lld", name, (long long)head_stride,
               dim_name, (long long)dim);
  if (rows > 1 && row_stride < dim)
    GDN_REFUSE("%s: %s stride %lld is smaller than %s=%lld", name, row_name, (long long)row_stride,
               dim_name, (long long)dim);
  if (rows > 1 && heads > 1) {
    const bool rows_outer = Wide(row_stride) >= Wide(heads) * head_stride;
    const bool heads_outer = Wide(head_stride) >= Wide(rows) * row_stride;
    if (!rows_outer && !heads_outer)
      GDN_REFUSE(
          "%s: %s stride %lld and head stride %lld overlap rows (need %s stride >= "
          "%lld*%lld or head stride >= %lld*%lld)",
          name, row_name, (long long)row_stride, (long long)head_stride, row_name, (long long)heads,
          (long long)head_stride, (long long)rows, (long long)row_stride);
  }
  // Unused strides (one row, one head) do not count.
  const Wide last = Wide(rows - 1) * (rows > 1 ? row_stride : 0) +
                    Wide(heads - 1) * (heads > 1 ? head_stride : 0) + dim;
  if (last > Wide(INT64_MAX))
    GDN_REFUSE("%s: strides reach element 2^63 or more, beyond the 2^60 limit", name);
  if (last > Wide(kMaxElements))
    GDN_REFUSE("%s: strides reach element %lld, beyond the 2^60 limit", name, (long long)last);
  return Status::success();
}

// How a token-major tensor is laid out: (B, T, heads, dim) dense, or
// (total_tokens, heads, dim) packed by cu_seqlens; T = 1 without cu_seqlens
// is the one-token (B, heads, dim) form, the token stride unused.
struct TokenShape {
  int64_t rows, tokens;
  bool packed;
};
TokenShape token_shape(const DecodeParams& p) {
  if (p.cu_seqlens != nullptr) return TokenShape{p.total_tokens, 1, true};
  return TokenShape{p.batch, p.num_tokens, false};
}

// (rows, tokens, heads, dim), dim contiguous: the three outer dimensions must
// nest in some order (each stride at least the span of the ones inside it).
Status check_token_strides(const char* name, const TokenShape& t, int64_t heads, int64_t dim,
                           int64_t batch_stride, int64_t token_stride, int64_t head_stride,
                           const char* dim_name) {
  if (t.packed) return check_strides(name, t.rows, heads, dim, token_stride, head_stride, dim_name, "token");
  if (t.tokens == 1) return check_strides(name, t.rows, heads, dim, batch_stride, head_stride, dim_name);
  using Wide = __int128;
  if (token_stride < dim)
    GDN_REFUSE("%s: token stride %lld is smaller than %s=%lld", name, (long long)token_stride, dim_name,
               (long long)dim);
  if (t.rows > 1 && batch_stride < dim)
    GDN_REFUSE("%s: batch stride %lld is smaller than %s=%lld", name, (long long)batch_stride, dim_name,
               (long long)dim);
  if (heads > 1 && head_stride < dim)
    GDN_REFUSE("%s: head stride %lld is smaller than %s=%lld", name, (long long)head_stride, dim_name,
               (long long)dim);
  // The dimensions that vary, innermost (smallest stride) first.
  struct Dim {
    int64_t n, stride;
  } d[3] = {{t.rows, batch_stride}, {t.tokens, token_stride}, {heads, head_stride}};
  int m = 0;
  for (const Dim& x : d)
    if (x.n > 1) d[m++] = x;
  for (int i = 1; i < m; ++i)
    for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; --j) {
      const Dim tmp = d[j];
      d[j] = d[j - 1];
      d[j - 1] = tmp;
    }
  for (int i = 1; i < m; ++i)
    if (Wide(d[i].stride) < Wide(d[i - 1].n) * d[i - 1].stride)
      GDN_REFUSE("%s: batch stride %lld, token stride %lld and head stride %lld overlap (each must be at "
                 "least the span of the dimensions inside it)",
                 name, (long long)batch_stride, (long long)token_stride, (long long)head_stride);
  Wide last = dim;
  for (int i = 0; i < m; ++i) last += Wide(d[i].n - 1) * d[i].stride;
  if (last > Wide(kMaxElements))
    GDN_REFUSE("%s: strides reach beyond the 2^60 element limit", name);
  return Status::success();
}

// Extent of a token-major tensor (see TokenShape).
Extent token_extent(const char* name, const void* ptr, const TokenShape& t, int64_t heads, int64_t dim,
                    int64_t batch_stride, int64_t token_stride, int64_t head_stride, size_t elem) {
  Extent e;
  e.name = name;
  if (ptr == nullptr || t.rows <= 0 || t.tokens <= 0) return e;
  const int64_t rs = t.packed ? token_stride : batch_stride;
  int64_t last = (t.rows - 1) * (t.rows > 1 ? rs : 0) + (heads - 1) * (heads > 1 ? head_stride : 0) + dim;
  if (!t.packed && t.tokens > 1) last += (t.tokens - 1) * token_stride;
  e.lo = reinterpret_cast<uintptr_t>(ptr);
  e.hi = e.lo + uintptr_t(last) * elem;
  return e;
}

Status check_pointer(const char* name, const void* ptr, size_t align) {
  if (ptr == nullptr) GDN_REFUSE("%s: null pointer", name);
  if (reinterpret_cast<uintptr_t>(ptr) % align != 0)
    GDN_REFUSE("%s: address %p is not aligned to its %zu-byte element", name, ptr, align);
  return Status::success();
}

#define GDN_CHECK(expr)              \
  do {                               \
    Status st_ = (expr);             \
    if (!st_.ok()) return st_;       \
  } while (0)

// The steps of validate(), in its order: the first rule broken is the one
// reported.
Status check_sizes(const DecodeParams& p) {
  // ---- sizes
  if (p.batch < 0) GDN_REFUSE("batch: must be >= 0, got %lld", (long long)p.batch);
  if (p.batch > (int64_t(1) << 31))
    GDN_REFUSE("batch: %lld rows exceeds the 2^31 limit", (long long)p.batch);
  if (p.num_k_heads <= 0) GDN_REFUSE("num_k_heads: must be > 0, got %d", p.num_k_heads);
  if (p.num_v_heads <= 0) GDN_REFUSE("num_v_heads: must be > 0, got %d", p.num_v_heads);
  if (p.num_v_heads % p.num_k_heads != 0)
    GDN_REFUSE("num_v_heads: %d is not a multiple of num_k_heads=%d", p.num_v_heads,
               p.num_k_heads);
  if (p.head_dim_k <= 0 || p.head_dim_k > kMaxHeadDim || p.head_dim_k % kHeadDimAlign != 0)
    GDN_REFUSE("head_dim_k: %d is not a multiple of %d in [%d, %d]", p.head_dim_k, kHeadDimAlign,
               kHeadDimAlign, kMaxHeadDim);
  if (p.head_dim_v <= 0 || p.head_dim_v > kMaxHeadDim || p.head_dim_v % kHeadDimAlign != 0)
    GDN_REFUSE("head_dim_v: %d is not a multiple of %d in [%d, %d]", p.head_dim_v, kHeadDimAlign,
               kHeadDimAlign, kMaxHeadDim);
  if (p.num_tokens < 1 || p.num_tokens > kMaxTokens)
    GDN_REFUSE("num_tokens: must be in [1, %d], got %d", kMaxTokens, p.num_tokens);
  if (p.cu_seqlens != nullptr) {
    if (p.total_tokens < 0 || p.total_tokens > p.batch * p.num_tokens)
      GDN_REFUSE("total_tokens: must be in [0, batch*num_tokens=%lld], got %lld",
                 (long long)(p.batch * p.num_tokens), (long long)p.total_tokens);
  } else if (p.total_tokens != 0) {
    GDN_REFUSE("total_tokens: %lld given, but cu_seqlens is null (tokens are dense (B, T))",
               (long long)p.total_tokens);
  }
  return Status::success();
}

Status check_enums(const DecodeParams& p) {
  // ---- enums (the C API can hand over any integer)
  if (!valid_dtype(p.qkv_dtype)) GDN_REFUSE("qkv_dtype: unknown value %d", int(p.qkv_dtype));
  if (!valid_dtype(p.ab_dtype)) GDN_REFUSE("ab_dtype: unknown value %d", int(p.ab_dtype));
  if (!valid_dtype(p.o_dtype)) GDN_REFUSE("o_dtype: unknown value %d", int(p.o_dtype));
  if (!valid_dtype(p.state_dtype))
    GDN_REFUSE("state_dtype: unknown value %d", int(p.state_dtype));
  if (p.layout != Layout::kKV && p.layout != Layout::kVK)
    GDN_REFUSE("layout: unknown value %d", int(p.layout));
  if (p.gate != Gate::kRaw && p.gate != Gate::kPrecomputed)
    GDN_REFUSE("gate: unknown value %d", int(p.gate));
  if (p.l2norm != L2Norm::kRsqrt && p.l2norm != L2Norm::kMaxNorm && p.l2norm != L2Norm::kNone)
    GDN_REFUSE("l2norm: unknown value %d", int(p.l2norm));
  if (p.head_map != HeadMap::kInterleaved && p.head_map != HeadMap::kTiled)
    GDN_REFUSE("head_map: unknown value %d", int(p.head_map));
  if (p.index_dtype != IndexType::kNone && p.index_dtype != IndexType::kI32 &&
      p.index_dtype != IndexType::kI64)
    GDN_REFUSE("index_dtype: unknown value %d", int(p.index_dtype));
  return Status::success();
}

Status check_scalars(const DecodeParams& p) {
  // ---- scalars
  if (!std::isfinite(p.scale)) GDN_REFUSE("scale: must be finite, got %g", double(p.scale));
  if (!std::isfinite(p.l2norm_eps) || p.l2norm_eps < 0.0f)
    GDN_REFUSE("l2norm_eps: must be finite and >= 0, got %g", double(p.l2norm_eps));

  // ---- the optional prologue and epilogue
  const bool conv = p.conv_width != 0;
  if (conv && (p.conv_width < 2 || p.conv_width > 4))
    GDN_REFUSE("conv_width: must be 0 (no conv prologue), 2, 3 or 4, got %d", p.conv_width);
  if (!std::isfinite(p.norm_eps) || p.norm_eps < 0.0f)
    GDN_REFUSE("norm_eps: must be finite and >= 0, got %g", double(p.norm_eps));

  // ---- per-channel beta: b holds beta itself, one a column
  if (p.b_head_stride < 0)
    GDN_REFUSE("b_head_stride: must be >= 0 (0: one beta a head), got %lld", (long long)p.b_head_stride);
  if (p.b_head_stride > 0 && p.gate != Gate::kPrecomputed)
    GDN_REFUSE("b_head_stride: per-channel beta needs gate = precomputed (b then holds beta itself)");
  return Status::success();
}

Status check_pointers(const DecodeParams& p) {
  const bool conv = p.conv_width != 0;
  const bool norm = p.norm_weight != nullptr;

  // ---- pointers: present and aligned to their element
  const size_t qkv_elem = dtype_size(p.qkv_dtype);
  const size_t ab_elem = dtype_size(p.ab_dtype);
  const size_t o_elem = dtype_size(p.o_dtype);
  const size_t s_elem = dtype_size(p.state_dtype);
  if (conv) {
    // q, k and v are the conv output of x: a pointer given anyway is a mix-up.
    if (p.q != nullptr) GDN_REFUSE("q: must be null when conv_width is set (q, k, v come from x)");
    if (p.k != nullptr) GDN_REFUSE("k: must be null when conv_width is set (q, k, v come from x)");
    if (p.v != nullptr) GDN_REFUSE("v: must be null when conv_width is set (q, k, v come from x)");
    GDN_CHECK(check_pointer("x", p.x, qkv_elem));
    GDN_CHECK(check_pointer("conv_state", p.conv_state, qkv_elem));
    GDN_CHECK(check_pointer("conv_weight", p.conv_weight, qkv_elem));
    if (p.conv_bias != nullptr) GDN_CHECK(check_pointer("conv_bias", p.conv_bias, qkv_elem));
  } else {
    GDN_CHECK(check_pointer("q", p.q, qkv_elem));
    GDN_CHECK(check_pointer("k", p.k, qkv_elem));
    GDN_CHECK(check_pointer("v", p.v, qkv_elem));
    if (p.x != nullptr) GDN_REFUSE("x: given, but conv_width is 0 (no conv prologue)");
    if (p.conv_state != nullptr) GDN_REFUSE("conv_state: given, but conv_width is 0 (no conv prologue)");
    if (p.conv_weight != nullptr) GDN_REFUSE("conv_weight: given, but conv_width is 0 (no conv prologue)");
    if (p.conv_bias != nullptr) GDN_REFUSE("conv_bias: given, but conv_width is 0 (no conv prologue)");
  }
  if (norm) {
    GDN_CHECK(check_pointer("norm_weight", p.norm_weight, qkv_elem));
    GDN_CHECK(check_pointer("z", p.z, qkv_elem));
  } else if (p.z != nullptr) {
    GDN_REFUSE("z: given, but norm_weight is null (no gated RMSNorm)");
  }
  GDN_CHECK(check_pointer("a", p.a, ab_elem));
  GDN_CHECK(check_pointer("b", p.b, ab_elem));
  if (p.gate == Gate::kRaw) {
    GDN_CHECK(check_pointer("A_log", p.A_log, sizeof(float)));
    GDN_CHECK(check_pointer("dt_bias", p.dt_bias, sizeof(float)));
  }
  GDN_CHECK(check_pointer("state", p.state, s_elem));
  GDN_CHECK(check_pointer("o", p.o, o_elem));
  if (p.invalid_index_count != nullptr)
    GDN_CHECK(check_pointer("invalid_index_count", p.invalid_index_count, sizeof(uint32_t)));

  // ---- indices: every index-like array shares index_dtype
  struct Named {
    const char* name;
    const void* ptr;
  };
  const Named index_arrays[] = {{"state_indices", p.state_indices},
                                {"state_out_indices", p.state_out_indices},
                                {"cu_seqlens", p.cu_seqlens},
                                {"token_state_indices", p.token_state_indices},
                                {"num_accepted_tokens", p.num_accepted_tokens}};
  if (p.num_accepted_tokens != nullptr) {
    if (p.token_state_indices == nullptr)
      GDN_REFUSE("num_accepted_tokens: given without token_state_indices (it picks the initial token slot)");
    if (p.state_indices != nullptr)
      GDN_REFUSE("num_accepted_tokens: given with state_indices (both would pick the initial slot)");
  }
  if (p.index_dtype == IndexType::kNone) {
    for (const Named& a : index_arrays)
      if (a.ptr != nullptr) GDN_REFUSE("%s: given, but index_dtype is none", a.name);
  } else {
    const size_t ielem = index_size(p.index_dtype);
    // One-token calls index through state_indices; the multi-token arrays
    // may stand in for it (row b then reads slot b or its token slot).
    if (p.state_indices == nullptr && p.cu_seqlens == nullptr && p.token_state_indices == nullptr)
      GDN_REFUSE("state_indices: null pointer, but index_dtype is %s", to_string(p.index_dtype));
    for (const Named& a : index_arrays)
      if (a.ptr != nullptr) GDN_CHECK(check_pointer(a.name, a.ptr, ielem));
  }
  if (p.state_out_indices != nullptr && p.state_indices == nullptr)
    GDN_REFUSE("state_out_indices: given without state_indices (the write slot pairs a read slot)");
  if (p.token_state_indices != nullptr) {
    if (p.intermediate_states != nullptr)
      GDN_REFUSE("intermediate_states: given with token_state_indices (keep per-token states in one of them)");
    if (!p.update_state)
      GDN_REFUSE("update_state: false with token_state_indices (the per-token slots are state writes)");
  }
  if (p.intermediate_states != nullptr)
    GDN_CHECK(check_pointer("intermediate_states", p.intermediate_states, s_elem));
  if (p.intermediate_conv_states != nullptr) {
    if (!conv) GDN_REFUSE("intermediate_conv_states: given, but conv_width is 0 (no conv prologue)");
    GDN_CHECK(check_pointer("intermediate_conv_states", p.intermediate_conv_states, qkv_elem));
  }
  return Status::success();
}

// Hands back the elements one conv state slot spans (0 without conv).
Status check_strides_and_pools(const DecodeParams& p, int64_t* conv_span_out) {
  const bool conv = p.conv_width != 0;
  const bool norm = p.norm_weight != nullptr;

  // ---- strides
  const int64_t B = p.batch, Hk = p.num_k_heads, Hv = p.num_v_heads;
  const int64_t Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int64_t cdim = conv_dim(p);
  const TokenShape shape = token_shape(p);
  if (conv) {
    GDN_CHECK(check_token_strides("x", shape, 1, cdim, p.x_batch_stride, p.x_token_stride, 0, "conv_dim"));
  } else {
    GDN_CHECK(check_token_strides("q", shape, Hk, Dk, p.q_batch_stride, p.q_token_stride, p.q_head_stride, "Dk"));
    GDN_CHECK(check_token_strides("k", shape, Hk, Dk, p.k_batch_stride, p.k_token_stride, p.k_head_stride, "Dk"));
    GDN_CHECK(check_token_strides("v", shape, Hv, Dv, p.v_batch_stride, p.v_token_stride, p.v_head_stride, "Dv"));
  }
  if (norm)
    GDN_CHECK(check_token_strides("z", shape, Hv, Dv, p.z_batch_stride, p.z_token_stride, p.z_head_stride, "Dv"));
  GDN_CHECK(check_token_strides("a", shape, 1, Hv, p.a_batch_stride, p.a_token_stride, 0, "Hv"));
  if (p.b_head_stride > 0)
    GDN_CHECK(check_token_strides("b", shape, Hv, Dv, p.b_batch_stride, p.b_token_stride, p.b_head_stride, "Dv"));
  else
    GDN_CHECK(check_token_strides("b", shape, 1, Hv, p.b_batch_stride, p.b_token_stride, 0, "Hv"));
  GDN_CHECK(check_token_strides("o", shape, Hv, Dv, p.o_batch_stride, p.o_token_stride, p.o_head_stride, "Dv"));
  if (p.token_state_indices != nullptr)
    GDN_CHECK(check_strides("token_state_indices", B, 1, p.num_tokens, p.token_state_indices_stride, 0, "num_tokens"));

  // ---- state pool
  const int64_t slot_elems = Hv * Dk * Dv;
  if (p.num_slots < 1) GDN_REFUSE("num_slots: must be >= 1, got %lld", (long long)p.num_slots);
  if (p.state_indices == nullptr && p.token_state_indices == nullptr && p.num_slots < B)
    GDN_REFUSE("num_slots: %lld is smaller than batch=%lld (no state_indices: row b uses slot b)",
               (long long)p.num_slots, (long long)B);
  if (p.num_slots > 1 && p.state_slot_stride < slot_elems)
    GDN_REFUSE("state_slot_stride: %lld is smaller than Hv*Dk*Dv=%lld",
               (long long)p.state_slot_stride, (long long)slot_elems);
  if (p.state_slot_stride < 0)
    GDN_REFUSE("state_slot_stride: must be >= 0, got %lld", (long long)p.state_slot_stride);
  if (p.state_slot_stride > kMaxElements / p.num_slots)
    GDN_REFUSE("state_slot_stride: %lld x num_slots=%lld reaches beyond the 2^60 element limit",
               (long long)p.state_slot_stride, (long long)p.num_slots);

  // ---- conv state pool: [slot, conv_dim, W-1] (tap stride 1) or [slot, W-1,
  // conv_dim] (channel stride 1); `conv_span` elements a slot.
  *conv_span_out = 0;
  int64_t& conv_span = *conv_span_out;
  if (conv) {
    const int64_t taps = p.conv_width - 1;
    const int64_t cs = p.conv_state_channel_stride, ts = p.conv_state_tap_stride;
    // Bounded first, so the span below cannot overflow.
    if (cs > kMaxElements / cdim || ts > kMaxElements / 4)
      GDN_REFUSE("conv_state: strides reach beyond the 2^60 element limit");
    if (ts == 1 && cs >= taps) {
      conv_span = (cdim - 1) * cs + taps;
    } else if (cs == 1 && (ts >= cdim || taps == 1)) {
      conv_span = (taps - 1) * ts + cdim;
    } else {
      GDN_REFUSE("conv_state: channel stride %lld and tap stride %lld overlap (need tap stride 1 and "
                 "channel stride >= W-1=%lld, or channel stride 1 and tap stride >= conv_dim=%lld)",
                 (long long)cs, (long long)ts, (long long)taps, (long long)cdim);
    }
    if (p.conv_state_slot_stride < 0)
      GDN_REFUSE("conv_state_slot_stride: must be >= 0, got %lld", (long long)p.conv_state_slot_stride);
    if (p.num_slots > 1 && p.conv_state_slot_stride < conv_span)
      GDN_REFUSE("conv_state_slot_stride: %lld is smaller than one slot's %lld elements",
                 (long long)p.conv_state_slot_stride, (long long)conv_span);
    if (p.conv_state_slot_stride > kMaxElements / p.num_slots)
      GDN_REFUSE("conv_state_slot_stride: %lld x num_slots=%lld reaches beyond the 2^60 element limit",
                 (long long)p.conv_state_slot_stride, (long long)p.num_slots);
  }

  // ---- intermediate buffers: (B, T) states, each laid out as a slot
  const TokenShape per_token{B, p.num_tokens, false};
  if (p.intermediate_states != nullptr)
    GDN_CHECK(check_token_strides("intermediate_states", per_token, 1, slot_elems, p.intermediate_batch_stride,
                                  p.intermediate_token_stride, 0, "Hv*Dk*Dv"));
  if (p.intermediate_conv_states != nullptr)
    GDN_CHECK(check_token_strides("intermediate_conv_states", per_token, 1, conv_span,
                                  p.intermediate_conv_batch_stride, p.intermediate_conv_token_stride, 0,
                                  "one conv slot's span"));
  return Status::success();
}

Status check_aliasing(const DecodeParams& p, int64_t conv_span) {
  const bool conv = p.conv_width != 0;
  const bool norm = p.norm_weight != nullptr;
  const size_t qkv_elem = dtype_size(p.qkv_dtype);
  const size_t ab_elem = dtype_size(p.ab_dtype);
  const size_t o_elem = dtype_size(p.o_dtype);
  const size_t s_elem = dtype_size(p.state_dtype);
  const int64_t B = p.batch, Hk = p.num_k_heads, Hv = p.num_v_heads;
  const int64_t Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int64_t cdim = conv_dim(p);
  const int64_t slot_elems = Hv * Dk * Dv;

  // ---- aliasing: what is written must not overlap anything else
  const TokenShape shape = token_shape(p);
  auto tok = [&](const char* name, const void* ptr, int64_t heads, int64_t dim, int64_t bs, int64_t tks,
                 int64_t hs, size_t elem) { return token_extent(name, ptr, shape, heads, dim, bs, tks, hs, elem); };
  const Extent qx = tok("q", p.q, Hk, Dk, p.q_batch_stride, p.q_token_stride, p.q_head_stride, qkv_elem);
  const Extent kx = tok("k", p.k, Hk, Dk, p.k_batch_stride, p.k_token_stride, p.k_head_stride, qkv_elem);
  const Extent vx = tok("v", p.v, Hv, Dv, p.v_batch_stride, p.v_token_stride, p.v_head_stride, qkv_elem);
  const Extent ax = tok("a", p.a, 1, Hv, p.a_batch_stride, p.a_token_stride, 0, ab_elem);
  const Extent bx = p.b_head_stride > 0
                        ? tok("b", p.b, Hv, Dv, p.b_batch_stride, p.b_token_stride, p.b_head_stride, ab_elem)
                        : tok("b", p.b, 1, Hv, p.b_batch_stride, p.b_token_stride, 0, ab_elem);
  const Extent Ax = extent_of("A_log", p.gate == Gate::kRaw ? p.A_log : nullptr, 1, 1, Hv, 0, 0, 4);
  const Extent dx =
      extent_of("dt_bias", p.gate == Gate::kRaw ? p.dt_bias : nullptr, 1, 1, Hv, 0, 0, 4);
  const size_t ielem = index_size(p.index_dtype);
  const Extent ix = extent_of("state_indices", p.state_indices, 1, 1, B, 0, 0, ielem);
  const Extent jx = extent_of("state_out_indices", p.state_out_indices, 1, 1, B, 0, 0, ielem);
  const Extent sx = extent_of("state", p.state, p.num_slots, 1, slot_elems, p.state_slot_stride,
                              0, s_elem);
  const Extent ox = tok("o", p.o, Hv, Dv, p.o_batch_stride, p.o_token_stride, p.o_head_stride, o_elem);
  const Extent cux = extent_of("cu_seqlens", p.cu_seqlens, 1, 1, B + 1, 0, 0, ielem);
  const Extent tsx = extent_of("token_state_indices", p.token_state_indices, B, 1, p.num_tokens,
                               p.token_state_indices_stride, 0, ielem);
  const Extent nax = extent_of("num_accepted_tokens", p.num_accepted_tokens, 1, 1, B, 0, 0, ielem);
  const TokenShape per_token{B, p.num_tokens, false};
  const Extent isx = token_extent("intermediate_states", p.intermediate_states, per_token, 1, slot_elems,
                                  p.intermediate_batch_stride, p.intermediate_token_stride, 0, s_elem);
  const Extent icx = token_extent("intermediate_conv_states", p.intermediate_conv_states, per_token, 1,
                                  conv_span, p.intermediate_conv_batch_stride,
                                  p.intermediate_conv_token_stride, 0, qkv_elem);
  const Extent cx = extent_of("invalid_index_count", p.invalid_index_count, 1, 1, 1, 0, 0, 4);

  const Extent xx = tok("x", conv ? p.x : nullptr, 1, cdim, p.x_batch_stride, p.x_token_stride, 0, qkv_elem);
  const Extent wx = extent_of("conv_weight", conv ? p.conv_weight : nullptr, 1, 1, cdim * p.conv_width, 0, 0,
                              qkv_elem);
  const Extent bbx = extent_of("conv_bias", conv ? p.conv_bias : nullptr, 1, 1, cdim, 0, 0, qkv_elem);
  const Extent zx =
      tok("z", norm ? p.z : nullptr, Hv, Dv, p.z_batch_stride, p.z_token_stride, p.z_head_stride, qkv_elem);
  const Extent nx = extent_of("norm_weight", p.norm_weight, 1, 1, Dv, 0, 0, qkv_elem);
  const Extent csx = extent_of("conv_state", conv ? p.conv_state : nullptr, p.num_slots, 1, conv_span,
                               p.conv_state_slot_stride, 0, qkv_elem);

  const Extent inputs[] = {qx, kx, vx, ax, bx, Ax, dx, ix, jx, xx, wx, bbx, zx, nx, cux, tsx, nax};
  const Extent written[] = {sx, ox, cx, csx, isx, icx};
  constexpr size_t kWritten = sizeof(written) / sizeof(written[0]);
  for (size_t w = 0; w < kWritten; ++w) {
    for (const Extent& in : inputs)
      if (overlaps(written[w], in))
        GDN_REFUSE("%s: memory overlaps input %s (outputs must not alias inputs)", written[w].name,
                   in.name);
    for (size_t w2 = w + 1; w2 < kWritten; ++w2)
      if (overlaps(written[w], written[w2]))
        GDN_REFUSE("%s: memory overlaps %s", written[w].name, written[w2].name);
  }
  return Status::success();
}

}  // namespace

Status validate(const DecodeParams& p) {
  GDN_CHECK(check_sizes(p));
  GDN_CHECK(check_enums(p));
  GDN_CHECK(check_scalars(p));
  GDN_CHECK(check_pointers(p));
  int64_t conv_span = 0;
  GDN_CHECK(check_strides_and_pools(p, &conv_span));
  return check_aliasing(p, conv_span);
}

}  // namespace gdn
