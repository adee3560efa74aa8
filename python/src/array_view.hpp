// gdnkit._gdnkit's view of one array (ArrayView), however it arrived, and the checks on
// its dtype, device and shape that the decode entry points share. Strides are in
// elements. Part of the extension's one translation unit (gdnkit_ext.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>

#include "gdnkit/gdnkit.hpp"

namespace gdnkit_py {

constexpr int kMaxDims = 8;

// DLPack codes (dtype and device) as they appear in a DLTensor.
constexpr uint8_t kCodeInt = 0, kCodeUInt = 1, kCodeFloat = 2, kCodeBfloat = 4, kCodeBool = 6;
constexpr int32_t kDevCPU = 1, kDevCUDA = 2, kDevCUDAHost = 3, kDevROCM = 10, kDevROCMHost = 11,
                  kDevCUDAManaged = 13;

inline std::string format(const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
inline std::string format(const char* fmt, ...) {
  char buf[640];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

[[noreturn]] inline void refuse(const std::string& msg) {
  throw nanobind::value_error(msg.c_str());
}

// One array as run_decode sees it, whichever way it arrived.
struct ArrayView {
  const char* name{""};
  bool present{false};
  void* data{nullptr};
  int ndim{0};
  int64_t shape[kMaxDims]{};
  int64_t strides[kMaxDims]{};  // in elements
  uint8_t code{0};
  uint8_t bits{0};
  int32_t dev_type{kDevCPU};
  int32_t dev_id{0};

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  std::string list(const int64_t* v) const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + (ndim == 1 ? ",)" : ")");
  }
  // Strides of an empty array mean nothing (numpy 2 reports zeros): use row-major ones.
  void canonicalize_if_empty() {
    if (numel() != 0) return;
    int64_t step = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      strides[i] = step;
      step *= shape[i] > 0 ? shape[i] : 1;
    }
  }
  std::string shape_str() const { return list(shape); }
  std::string strides_str() const { return list(strides); }
};

inline const char* dtype_name(uint8_t code, uint8_t bits) {
  switch (code) {
    case kCodeFloat:
      return bits == 32 ? "float32" : bits == 16 ? "float16" : bits == 64 ? "float64" : "float";
    case kCodeBfloat: return bits == 16 ? "bfloat16" : "bfloat";
    case kCodeInt:
      return bits == 32 ? "int32" : bits == 64 ? "int64" : bits == 16 ? "int16"
             : bits == 8 ? "int8" : "int";
    case kCodeUInt:
      return bits == 32 ? "uint32" : bits == 16 ? "uint16" : bits == 64 ? "uint64"
             : bits == 8 ? "uint8" : "uint";
    case kCodeBool: return "bool";
    default: return "an unsupported dtype";
  }
}

// Which backend can touch memory of this DLPack device type.
enum class Space { kHost, kCuda, kRocm, kOther };
inline Space space_of(int32_t dev_type) {
  switch (dev_type) {
    case kDevCPU:
    case kDevCUDAHost:
    case kDevROCMHost: return Space::kHost;
    case kDevCUDA:
    case kDevCUDAManaged: return Space::kCuda;
    case kDevROCM: return Space::kRocm;
    default: return Space::kOther;
  }
}
inline std::string device_str(const ArrayView& a) {
  switch (space_of(a.dev_type)) {
    case Space::kHost: return "cpu";
    case Space::kCuda: return format("cuda:%d", a.dev_id);
    case Space::kRocm: return format("rocm:%d", a.dev_id);
    default: return format("DLPack device type %d", a.dev_type);
  }
}

// The element types gdnkit reads. uint16 arrays are read as raw bfloat16 bits
// (numpy has no bfloat16: the Python layer passes ml_dtypes arrays as such views).
inline bool to_dtype(const ArrayView& a, gdn::DType* out) {
  if (a.code == kCodeFloat && a.bits == 32) { *out = gdn::DType::kF32; return true; }
  if (a.code == kCodeFloat && a.bits == 16) { *out = gdn::DType::kF16; return true; }
  if (a.code == kCodeBfloat && a.bits == 16) { *out = gdn::DType::kBF16; return true; }
  if (a.code == kCodeUInt && a.bits == 16) { *out = gdn::DType::kBF16; return true; }
  return false;
}
inline gdn::DType need_dtype(const ArrayView& a) {
  gdn::DType t{};
  if (!to_dtype(a, &t))
    refuse(format("%s: dtype %s is not supported (float32, float16 or bfloat16)", a.name,
                  dtype_name(a.code, a.bits)));
  return t;
}

// ---- shapes -------------------------------------------------------------------

// A (rows, heads, dim) tensor whose last dimension is contiguous.
struct RHD {
  int64_t rows{0}, heads{0}, dim{0}, row_stride{0}, head_stride{0};
};

// Collapse the leading dimensions [0, n) into one row dimension: at most one of
// them may exceed 1 (one token per sequence: [B, 1, ...] or [1, B, ...]).
inline void collapse_rows(const ArrayView& a, int n, int64_t* rows, int64_t* row_stride) {
  *rows = 1;
  *row_stride = 0;
  int big = -1;
  for (int i = 0; i < n; ++i) {
    if (a.shape[i] == 1) continue;
    if (big >= 0)
      refuse(format("%s: shape %s has more than one leading dimension larger than 1 (one token "
                    "per sequence: use [B, ...], [B, 1, ...] or [1, B, ...])",
                    a.name, a.shape_str().c_str()));
    big = i;
  }
  if (n > 0 && a.shape[0] == 0) big = 0;  // empty batch
  if (big >= 0) {
    *rows = a.shape[big];
    *row_stride = a.strides[big];
  }
}

inline void need_contiguous_last(const ArrayView& a) {
  if (a.ndim >= 1 && a.shape[a.ndim - 1] > 1 && a.strides[a.ndim - 1] != 1)
    refuse(format("%s: the last dimension must be contiguous (stride 1), got strides %s for "
                  "shape %s",
                  a.name, a.strides_str().c_str(), a.shape_str().c_str()));
}

// (R, H, D), (R, 1, H, D), (1, R, H, D); or flat (R, H*D) when dim_hint > 0.
inline RHD as_rhd(const ArrayView& a, int64_t dim_hint) {
  RHD r;
  need_contiguous_last(a);
  if (a.ndim >= 3) {
    collapse_rows(a, a.ndim - 2, &r.rows, &r.row_stride);
    r.heads = a.shape[a.ndim - 2];
    r.head_stride = a.strides[a.ndim - 2];
    r.dim = a.shape[a.ndim - 1];
  } else if (a.ndim == 2 && dim_hint > 0) {
    r.rows = a.shape[0];
    r.row_stride = a.strides[0];
    if (a.shape[1] % dim_hint != 0)
      refuse(format("%s: width %lld is not a multiple of the head dim %lld", a.name,
                    (long long)a.shape[1], (long long)dim_hint));
    r.heads = a.shape[1] / dim_hint;
    r.head_stride = dim_hint;
    r.dim = dim_hint;
  } else {
    refuse(format("%s: expected [B, H, D], [B, 1, H, D] or [B, H*D], got shape %s", a.name,
                  a.shape_str().c_str()));
  }
  // Strides of size-1 dimensions mean nothing (frameworks report anything there).
  if (r.heads <= 1) r.head_stride = r.dim;
  if (r.rows <= 1) r.row_stride = r.heads * r.head_stride;
  return r;
}

// (R, H): a and b; also (R, 1, H) and (1, R, H).
inline void as_rows_heads(const ArrayView& a, int64_t* rows, int64_t* heads,
                          int64_t* row_stride) {
  if (a.ndim < 2)
    refuse(format("%s: expected [B, Hv] or [B, 1, Hv], got shape %s", a.name,
                  a.shape_str().c_str()));
  need_contiguous_last(a);
  collapse_rows(a, a.ndim - 1, rows, row_stride);
  *heads = a.shape[a.ndim - 1];
  if (*rows <= 1) *row_stride = *heads;
}

// ---- several tokens a row (docs/operation.md, "Multi-token decode") -------------------

// How the call's token-major tensors (q, k, v, qkv, x, a, b, z, out) hold their tokens:
// B rows of T tokens, dense ((B, T, ...) or flattened (B*T, ...)), or, with cu_seqlens,
// `total` packed tokens ((total, ...), or (1, total, ...)). One token a row and no
// cu_seqlens is the one-token form, whose shapes the one-token checks above read.
struct Tokens {
  int64_t B{0};
  int64_t T{1};
  bool packed{false};
  int64_t total{0};
  bool token_major() const { return packed || T > 1; }
  std::string expected(const char* trailing) const {
    if (packed)
      return format("[total_tokens, %s] or [1, total_tokens, %s] with total_tokens=%lld", trailing,
                    trailing, (long long)total);
    return format("[B, T, %s] or [B*T, %s] with B=%lld, T=%lld", trailing, trailing,
                  (long long)B, (long long)T);
  }
};

// The leading dimensions [0, n) of `a` as the call's rows and tokens: sets the batch and
// token strides (elements), or returns false when the dimensions do not hold them.
// Dimensions of size 1 are dropped (their strides mean nothing); `span` (one token's
// elements) stands in for the stride of a dimension that is absent or holds one token.
inline bool fit_tokens(const ArrayView& a, int n, const Tokens& g, int64_t span,
                       int64_t* batch_stride, int64_t* token_stride) {
  int64_t dims[kMaxDims], strides[kMaxDims];
  int m = 0;
  for (int i = 0; i < n; ++i)
    if (a.shape[i] != 1) {
      dims[m] = a.shape[i];
      strides[m++] = a.strides[i];
    }
  if (g.packed) {
    *batch_stride = 0;  // unused: row b's tokens start at cu_seqlens[b]
    if (m == 0) {
      *token_stride = span;
      return g.total == 1;
    }
    *token_stride = g.total > 1 ? strides[0] : span;
    return m == 1 && dims[0] == g.total;
  }
  if (m == 0) {
    *token_stride = span;
    *batch_stride = g.T * span;
    return g.B * g.T == 1;
  }
  if (m == 1) {
    if (dims[0] != g.B * g.T) return false;
    *token_stride = g.B * g.T > 1 ? strides[0] : span;  // flattened (B*T, ...): row-major
    *batch_stride = g.T * *token_stride;
    return true;
  }
  if (m == 2 && dims[0] == g.B && dims[1] == g.T) {
    *batch_stride = strides[0];
    *token_stride = strides[1];
    return true;
  }
  return false;
}

// A token-major (tokens, heads, dim) tensor: its strides in the call's token layout.
struct TokenRHD {
  int64_t heads{0}, dim{0}, batch_stride{0}, token_stride{0}, head_stride{0};
};

// [..., H, D] (D = dim) or [..., H*D] whose leading dimensions hold the call's tokens
// (Tokens::expected); the last dimension contiguous.
inline TokenRHD as_token_rhd(const ArrayView& a, int64_t dim, const Tokens& g) {
  need_contiguous_last(a);
  TokenRHD r;
  r.dim = dim;
  if (a.ndim >= 3 && a.shape[a.ndim - 1] == dim) {
    r.heads = a.shape[a.ndim - 2];
    r.head_stride = r.heads > 1 ? a.strides[a.ndim - 2] : dim;
    if (fit_tokens(a, a.ndim - 2, g, r.heads * r.head_stride, &r.batch_stride, &r.token_stride))
      return r;
  }
  if (a.ndim >= 1 && dim > 0 && a.shape[a.ndim - 1] % dim == 0) {
    r.heads = a.shape[a.ndim - 1] / dim;
    r.head_stride = dim;
    if (fit_tokens(a, a.ndim - 1, g, r.heads * dim, &r.batch_stride, &r.token_stride)) return r;
  }
  refuse(format("%s: shape %s does not hold the call's tokens: expected %s", a.name,
                a.shape_str().c_str(), g.expected("H, D (or H*D)").c_str()));
}

// A token-major (tokens, width) tensor: a, b (width Hv), the packed row qkv or x.
inline void as_token_rows(const ArrayView& a, const Tokens& g, const char* width_name,
                          int64_t* batch_stride, int64_t* token_stride) {
  need_contiguous_last(a);
  if (a.ndim < 1 ||
      !fit_tokens(a, a.ndim - 1, g, a.shape[a.ndim - 1], batch_stride, token_stride))
    refuse(format("%s: shape %s does not hold the call's tokens: expected %s", a.name,
                  a.shape_str().c_str(), g.expected(width_name).c_str()));
}

// A 1-D contiguous vector of n elements.
inline void need_vector(const ArrayView& a, int64_t n, const char* what) {
  if (a.ndim != 1 || a.shape[0] != n)
    refuse(format("%s: expected shape (%lld,) (%s), got %s", a.name, (long long)n, what,
                  a.shape_str().c_str()));
  if (n > 1 && a.strides[0] != 1)
    refuse(format("%s: must be contiguous (stride 1), got stride %lld", a.name,
                  (long long)a.strides[0]));
}

}  // namespace gdnkit_py
