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
                     int64_t row_stride, int64_t head_stride, const char* dim_name) {
  using Wide = __int128;
  if (heads > 1 && head_stride < dim)
    GDN_REFUSE("%s: head stride %lld is smaller than %s=%lld", name, (long long)head_stride,
               dim_name, (long long)dim);
  if (rows > 1 && row_stride < dim)
    GDN_REFUSE("%s: batch stride %lld is smaller than %s=%lld", name, (long long)row_stride,
               dim_name, (long long)dim);
  if (rows > 1 && heads > 1) {
    const bool rows_outer = Wide(row_stride) >= Wide(heads) * head_stride;
    const bool heads_outer = Wide(head_stride) >= Wide(rows) * row_stride;
    if (!rows_outer && !heads_outer)
      GDN_REFUSE(
          "%s: batch stride %lld and head stride %lld overlap rows (need batch stride >= "
          "%lld*%lld or head stride >= %lld*%lld)",
          name, (long long)row_stride, (long long)head_stride, (long long)heads,
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

  // ---- indices
  if (p.index_dtype == IndexType::kNone) {
    if (p.state_indices != nullptr)
      GDN_REFUSE("state_indices: given, but index_dtype is none");
    if (p.state_out_indices != nullptr)
      GDN_REFUSE("state_out_indices: given, but index_dtype is none");
  } else {
    const size_t ielem = index_size(p.index_dtype);
    if (p.state_indices == nullptr)
      GDN_REFUSE("state_indices: null pointer, but index_dtype is %s", to_string(p.index_dtype));
    GDN_CHECK(check_pointer("state_indices", p.state_indices, ielem));
    if (p.state_out_indices != nullptr)
      GDN_CHECK(check_pointer("state_out_indices", p.state_out_indices, ielem));
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
  if (conv) {
    GDN_CHECK(check_strides("x", B, 1, cdim, p.x_batch_stride, 0, "conv_dim"));
  } else {
    GDN_CHECK(check_strides("q", B, Hk, Dk, p.q_batch_stride, p.q_head_stride, "Dk"));
    GDN_CHECK(check_strides("k", B, Hk, Dk, p.k_batch_stride, p.k_head_stride, "Dk"));
    GDN_CHECK(check_strides("v", B, Hv, Dv, p.v_batch_stride, p.v_head_stride, "Dv"));
  }
  if (norm) GDN_CHECK(check_strides("z", B, Hv, Dv, p.z_batch_stride, p.z_head_stride, "Dv"));
  GDN_CHECK(check_strides("a", B, 1, Hv, p.a_batch_stride, 0, "Hv"));
  GDN_CHECK(check_strides("b", B, 1, Hv, p.b_batch_stride, 0, "Hv"));
  GDN_CHECK(check_strides("o", B, Hv, Dv, p.o_batch_stride, p.o_head_stride, "Dv"));

  // ---- state pool
  const int64_t slot_elems = Hv * Dk * Dv;
  if (p.num_slots < 1) GDN_REFUSE("num_slots: must be >= 1, got %lld", (long long)p.num_slots);
  if (p.index_dtype == IndexType::kNone && p.num_slots < B)
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
  const Extent qx = extent_of("q", p.q, B, Hk, Dk, p.q_batch_stride, p.q_head_stride, qkv_elem);
  const Extent kx = extent_of("k", p.k, B, Hk, Dk, p.k_batch_stride, p.k_head_stride, qkv_elem);
  const Extent vx = extent_of("v", p.v, B, Hv, Dv, p.v_batch_stride, p.v_head_stride, qkv_elem);
  const Extent ax = extent_of("a", p.a, B, 1, Hv, p.a_batch_stride, 0, ab_elem);
  const Extent bx = extent_of("b", p.b, B, 1, Hv, p.b_batch_stride, 0, ab_elem);
  const Extent Ax = extent_of("A_log", p.gate == Gate::kRaw ? p.A_log : nullptr, 1, 1, Hv, 0, 0, 4);
  const Extent dx =
      extent_of("dt_bias", p.gate == Gate::kRaw ? p.dt_bias : nullptr, 1, 1, Hv, 0, 0, 4);
  const size_t ielem = index_size(p.index_dtype);
  const Extent ix = extent_of("state_indices", p.state_indices, 1, 1, B, 0, 0, ielem);
  const Extent jx = extent_of("state_out_indices", p.state_out_indices, 1, 1, B, 0, 0, ielem);
  const Extent sx = extent_of("state", p.state, p.num_slots, 1, slot_elems, p.state_slot_stride,
                              0, s_elem);
  const Extent ox = extent_of("o", p.o, B, Hv, Dv, p.o_batch_stride, p.o_head_stride, o_elem);
  const Extent cx = extent_of("invalid_index_count", p.invalid_index_count, 1, 1, 1, 0, 0, 4);

  const Extent xx = extent_of("x", conv ? p.x : nullptr, B, 1, cdim, p.x_batch_stride, 0, qkv_elem);
  const Extent wx = extent_of("conv_weight", conv ? p.conv_weight : nullptr, 1, 1, cdim * p.conv_width, 0, 0,
                              qkv_elem);
  const Extent bbx = extent_of("conv_bias", conv ? p.conv_bias : nullptr, 1, 1, cdim, 0, 0, qkv_elem);
  const Extent zx = extent_of("z", norm ? p.z : nullptr, B, Hv, Dv, p.z_batch_stride, p.z_head_stride, qkv_elem);
  const Extent nx = extent_of("norm_weight", p.norm_weight, 1, 1, Dv, 0, 0, qkv_elem);
  const Extent csx = extent_of("conv_state", conv ? p.conv_state : nullptr, p.num_slots, 1, conv_span,
                               p.conv_state_slot_stride, 0, qkv_elem);

  const Extent inputs[] = {qx, kx, vx, ax, bx, Ax, dx, ix, jx, xx, wx, bbx, zx, nx};
  const Extent written[] = {sx, ox, cx, csx};
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
