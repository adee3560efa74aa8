// Golden cases: load a safetensors case (load_case) into a Case; running and
// comparing it is golden.cpp.
//
// The loader is liberal in what it accepts (ranks, metadata spellings, see
// docs/golden-format.md) but strict about meaning: every size is derived from
// one place (Hv, Dk, Dv from state and layout; B and Hk from q, mixed_qkv or x)
// and every other tensor must agree with it, so a file written with the wrong
// layout or a transposed tensor is refused with a message, not run.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "gdnkit/backend.hpp"
#include "gdnkit/golden.hpp"
#include "golden_internal.hpp"
#include "printable.hpp"
#include "gdnkit/half.hpp"

namespace gdn {
namespace golden {
namespace {

using internal::count_invalid;
using internal::widen;

// ---- small parsing helpers ---------------------------------------------------

std::string normalize(const std::string& s) {
  size_t lo = 0, hi = s.size();
  while (lo < hi && std::isspace(static_cast<unsigned char>(s[lo]))) ++lo;
  while (hi > lo && std::isspace(static_cast<unsigned char>(s[hi - 1]))) --hi;
  std::string r = s.substr(lo, hi - lo);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool parse_int64(const std::string& text, int64_t* out) {
  const std::string s = normalize(text);
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = int64_t(v);
  return true;
}

bool parse_real(const std::string& text, double* out) {
  const std::string s = normalize(text);
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool dtype_from_alias(const std::string& value, DType* out) {
  const std::string s = normalize(value);
  if (s == "f32" || s == "fp32" || s == "float32") *out = DType::kF32;
  else if (s == "f16" || s == "fp16" || s == "float16" || s == "half") *out = DType::kF16;
  else if (s == "bf16" || s == "bfloat16") *out = DType::kBF16;
  else return false;
  return true;
}

// safetensors spelling -> a compute dtype (F32/F16/BF16 only).
bool float_dtype(const std::string& st, DType* out) {
  if (st == "F32") *out = DType::kF32;
  else if (st == "F16") *out = DType::kF16;
  else if (st == "BF16") *out = DType::kBF16;
  else return false;
  return true;
}

// A metadata value echoed in a message: quoted, with control characters and
// non-ASCII bytes escaped so a corrupt file cannot garble the terminal.
std::string quoted(const std::string& s) { return "\"" + printable(s) + "\""; }

// An expected tensor (F64, or F32; F16/BF16 too for expected_conv_state) as doubles.
std::vector<double> widen_expected(const Tensor& t) {
  std::vector<double> r(size_t(t.numel()));
  DType dt{};
  if (t.dtype == "F64") {
    std::memcpy(r.data(), t.bytes.data(), r.size() * 8);
  } else if (t.dtype == "F32") {
    for (size_t i = 0; i < r.size(); ++i) {
      float f;
      std::memcpy(&f, t.bytes.data() + 4 * i, 4);
      r[i] = double(f);
    }
  } else if (float_dtype(t.dtype, &dt)) {
    r = widen(t.bytes, dt);
  }
  return r;
}

// The tensors format version 2 added; a file that says version 1 may not have them.
constexpr const char* kVersion2Tensors[] = {"x",          "conv_state", "conv_weight",
                                            "conv_bias",  "expected_conv_state", "z",
                                            "norm_weight"};

// The tensors format version 3 added (several tokens per row).
constexpr const char* kVersion3Tensors[] = {"cu_seqlens", "token_state_indices", "num_accepted_tokens",
                                            "expected_intermediate_states",
                                            "expected_intermediate_conv_states"};

// ---- the loader ----------------------------------------------------------------

// The sizes Loader::load derives, handed from one of its steps to the next.
struct Sizes {
  int64_t S = 0, Hv = 0, Dk = 0, Dv = 0;  // from state and the layout
  int64_t num_slots = 0;                  // the pool slots a case may use
  int64_t B = 0, Hk = 0;                  // from q, mixed_qkv or x (B: cu_seqlens when packed)
  // Per-token tensors hold `lead` leading rows of `tok` tokens each: (B, T, ...)
  // dense, or (total_tokens, ...) packed by cu_seqlens (tok = 1).
  int64_t T = 1, lead = 0, tok = 1;
  std::string dims_note;                  // " (Hv, Dk, Dv from state [...] with layout ..)"
};

// "(d0, d1, d2)", for messages.
std::string tuple(int64_t d0, int64_t d1, int64_t d2) {
  return "(" + std::to_string(d0) + ", " + std::to_string(d1) + ", " + std::to_string(d2) + ")";
}

class Loader {
 public:
  Loader(const std::string& path, const SafetensorsFile& f, std::string* error)
      : path_(path), f_(f), error_(error) {}

  // "<file>: <tensor or key>: <problem>"
  bool fail(const std::string& what, const std::string& problem) {
    if (error_) *error_ = path_ + ": " + what + ": " + problem;
    return false;
  }

  const std::string* meta(const char* key) const {
    auto it = f_.metadata.find(key);
    return it == f_.metadata.end() ? nullptr : &it->second;
  }

  const Tensor* tensor(const char* name) const {
    auto it = f_.tensors.find(name);
    return it == f_.tensors.end() ? nullptr : &it->second;
  }

  // The tensor, present, with a float compute dtype.
  bool need_float(const char* name, const Tensor** t, DType* dt) {
    *t = tensor(name);
    if (*t == nullptr) return fail(name, "missing tensor");
    if (!float_dtype((*t)->dtype, dt))
      return fail(name, "dtype " + (*t)->dtype + " is not supported (F32, F16 or BF16)");
    return true;
  }

  // `rows` leading rows of `per_row` elements each. Only the element count and
  // the leading dim matter (the format allows [B, H*D], [B, H, D], [B, 1, H, D]),
  // but when the tensor is split into heads its last dim must be the head dim:
  // that catches a state layout that does not match the metadata.
  bool check_rows(const char* name, const Tensor& t, int64_t rows, int64_t per_row,
                  int64_t head_dim, const std::string& expect) {
    const bool ok_count = !t.shape.empty() && t.shape[0] == rows && t.numel() == rows * per_row;
    const bool ok_last = t.shape.size() < 3 || head_dim <= 0 || t.shape.back() == head_dim;
    if (!ok_count || !ok_last)
      return fail(name, "shape " + shape_string(t.shape) + " does not hold " + expect);
    return true;
  }

  bool load(Case* c);

 private:
  bool load_metadata(DecodeParams* p, bool* layout_given);
  // The steps of load(), in order; each fills its part of the case.
  bool load_state(DecodeParams* p, bool layout_given, const Tensor** state, Sizes* z);
  bool load_qkv(Case* c, DecodeParams* p, const Tensor* x, const Tensor* mixed, Sizes* z);
  bool load_gates(Case* c, DecodeParams* p, const Sizes& z);
  bool load_indices(Case* c, DecodeParams* p, const Sizes& z);
  bool load_expected(Case* c, const Tensor& state, const Sizes& z);
  bool check_invalid_indices(Case* c, int64_t num_slots);
  // Format version 2: the conv prologue and the gated RMSNorm epilogue.
  bool load_conv(Case* c, DecodeParams* p, const Tensor* x, int64_t num_slots);
  bool load_norm(Case* c, DecodeParams* p, const Sizes& z);
  // Format version 3: per-token slots and the per-token state buffers.
  bool load_token_indices(Case* c, DecodeParams* p, const Sizes& z);
  bool load_intermediate(Case* c, const DecodeParams& p, const Tensor& state, const Sizes& z);
  // An index array in the case's one index dtype (set by the first one read).
  bool index_array(const char* name, const Tensor& t, DecodeParams* p);

  const std::string& path_;
  const SafetensorsFile& f_;
  std::string* error_;
  int64_t format_version_{0};  // 0: not given
  int64_t num_tokens_{1};      // format version 3: T
  bool update_state_{true};
  std::string qkv_name_;       // "q", "mixed_qkv" or "x": the tensor that sets qkv_dtype
  std::string qkv_dtype_;      // its dtype, as the file spells it
};

bool Loader::load_metadata(DecodeParams* p, bool* layout_given) {
  if (const std::string* v = meta("op")) {
    if (normalize(*v) != "gdn_decode") return fail("op", quoted(*v) + " is not gdn_decode");
  }
  format_version_ = 0;
  if (const std::string* v = meta("format_version")) {
    int64_t n = 0;
    if (!parse_int64(*v, &n) || n < 1 || n > 3)
      return fail("format_version", quoted(*v) + " is not supported (this reader knows 1, 2 and 3)");
    format_version_ = n;
    if (n == 1) {
      for (const char* name : kVersion2Tensors)
        if (tensor(name) != nullptr)
          return fail(name, "a format_version 2 tensor, but the file says format_version \"1\"");
    }
    if (n < 3) {
      for (const char* name : kVersion3Tensors)
        if (tensor(name) != nullptr)
          return fail(name, "a format_version 3 tensor, but the file says format_version " + quoted(*v));
    }
  }
  num_tokens_ = 1;
  if (const std::string* v = meta("num_tokens")) {
    if (!parse_int64(*v, &num_tokens_) || num_tokens_ < 1 || num_tokens_ > kMaxTokens)
      return fail("num_tokens", quoted(*v) + " is not an integer in [1, " + std::to_string(kMaxTokens) + "]");
    if (format_version_ != 0 && format_version_ < 3 && num_tokens_ != 1)
      return fail("num_tokens", quoted(*v) + " needs format_version 3");
  }
  update_state_ = true;
  if (const std::string* v = meta("update_state")) {
    const std::string s = normalize(*v);
    if (s == "true" || s == "1") update_state_ = true;
    else if (s == "false" || s == "0") update_state_ = false;
    else return fail("update_state", "unknown value " + quoted(*v) + " (true or false)");
    if (format_version_ != 0 && format_version_ < 3 && !update_state_)
      return fail("update_state", quoted(*v) + " needs format_version 3");
  }
  *layout_given = false;
  if (const std::string* v = meta("layout")) {
    const std::string s = normalize(*v);
    if (s == "kv") p->layout = Layout::kKV;
    else if (s == "vk") p->layout = Layout::kVK;
    else return fail("layout", "unknown value " + quoted(*v) + " (kv or vk)");
    *layout_given = true;
  }
  if (const std::string* v = meta("l2norm")) {
    const std::string s = normalize(*v);
    if (s == "rsqrt" || s == "default") p->l2norm = L2Norm::kRsqrt;
    else if (s == "max_norm" || s == "max" || s == "normalize" || s == "f_normalize")
      p->l2norm = L2Norm::kMaxNorm;
    else if (s == "none" || s == "off") p->l2norm = L2Norm::kNone;
    else return fail("l2norm", "unknown value " + quoted(*v) + " (rsqrt, max_norm or none)");
  }
  if (const std::string* v = meta("l2norm_eps")) {
    double eps = 0;
    if (!parse_real(*v, &eps) || eps < 0)
      return fail("l2norm_eps", quoted(*v) + " is not a finite number >= 0");
    p->l2norm_eps = float(eps);
  }
  if (const std::string* v = meta("scale")) {
    if (normalize(*v) != "default") {
      double scale = 0;
      if (!parse_real(*v, &scale)) return fail("scale", quoted(*v) + " is not a finite number");
      // DecodeParams reads 0 as "use the default", so a literal 0 cannot be run.
      if (scale == 0) return fail("scale", "0 is not supported (DecodeParams reads 0 as Dk^-0.5)");
      p->scale = float(scale);
    }
  }
  if (const std::string* v = meta("head_map")) {
    const std::string s = normalize(*v);
    if (s == "interleaved" || s == "repeat_interleave") p->head_map = HeadMap::kInterleaved;
    else if (s == "tiled" || s == "tile") p->head_map = HeadMap::kTiled;
    else return fail("head_map", "unknown value " + quoted(*v) + " (interleaved or tiled)");
  }
  if (const std::string* v = meta("gate")) {
    const std::string s = normalize(*v);
    if (s == "raw") p->gate = Gate::kRaw;
    else if (s == "precomputed" || s == "pre") p->gate = Gate::kPrecomputed;
    else return fail("gate", "unknown value " + quoted(*v) + " (raw or precomputed)");
  }
  return true;
}

bool Loader::load(Case* c) {
  DecodeParams p;
  bool layout_given = false;
  if (!load_metadata(&p, &layout_given)) return false;

  Sizes z;
  const Tensor* state = nullptr;
  if (!load_state(&p, layout_given, &state, &z)) return false;
  z.T = num_tokens_;
  z.tok = tensor("cu_seqlens") != nullptr ? 1 : z.T;
  const Tensor* x = tensor("x");
  const Tensor* mixed = tensor("mixed_qkv");
  if (!load_qkv(c, &p, x, mixed, &z)) return false;
  if (!load_gates(c, &p, z)) return false;
  if (!load_indices(c, &p, z)) return false;
  if (!load_token_indices(c, &p, z)) return false;

  // ---- output dtype (default: the q/k/v dtype)
  p.o_dtype = p.qkv_dtype;
  if (const std::string* v = meta("output_dtype")) {
    if (!dtype_from_alias(*v, &p.o_dtype))
      return fail("output_dtype", "unknown value " + quoted(*v) + " (F32, F16 or BF16)");
  }

  if (!load_expected(c, *state, z)) return false;

  // ---- the parameters, for dense host buffers
  p.batch = z.B;
  p.num_k_heads = int32_t(z.Hk);
  p.num_v_heads = int32_t(z.Hv);
  p.head_dim_k = int32_t(z.Dk);
  p.head_dim_v = int32_t(z.Dv);
  p.num_slots = z.num_slots;

  // ---- format version 2: conv prologue (sets conv_width) and gated RMSNorm
  qkv_name_ = x ? "x" : mixed ? "mixed_qkv" : "q";
  qkv_dtype_ = tensor(qkv_name_.c_str())->dtype;
  if (!load_conv(c, &p, x, z.num_slots)) return false;
  if (!load_norm(c, &p, z)) return false;

  // ---- format version 3: tokens per row
  p.num_tokens = int32_t(z.T);
  p.update_state = update_state_;
  if (!c->cu_seqlens.empty()) p.total_tokens = z.lead;

  set_dense_strides(p);  // conv state: (S, conv_dim, W-1) when conv_width is set
  if (p.conv_width > 0 && c->conv_tap_major) {
    const int64_t cdim = conv_dim(p);
    p.conv_state_channel_stride = 1;
    p.conv_state_tap_stride = cdim;
    p.conv_state_slot_stride = cdim * (p.conv_width - 1);
  }
  // The pointers stay null until run_case, so the multi-token strides are set here:
  // packed rows have no batch stride, the per-token buffers are (B, T, one slot).
  if (p.b_head_stride > 0) {  // per-channel beta: (B, T, Hv, Dv)
    p.b_token_stride = z.Hv * z.Dv;
    p.b_batch_stride = z.T * p.b_token_stride;
  }
  if (!c->cu_seqlens.empty())
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.a_batch_stride = p.b_batch_stride =
        p.o_batch_stride = p.z_batch_stride = p.x_batch_stride = 0;
  p.token_state_indices_stride = c->token_state_indices.empty() ? 0 : z.T;
  if (!load_intermediate(c, p, *state, z)) return false;
  if (!c->expected_intermediate_states.empty()) {
    p.intermediate_token_stride = p.state_slot_stride;
    p.intermediate_batch_stride = z.T * p.state_slot_stride;
  }
  if (!c->expected_intermediate_conv_states.empty()) {
    p.intermediate_conv_token_stride = p.conv_state_slot_stride;
    p.intermediate_conv_batch_stride = z.T * p.conv_state_slot_stride;
  }
  c->params = p;
  c->packed_qkv = mixed != nullptr;

  return check_invalid_indices(c, z.num_slots);
}

// ---- state: Hv, Dk, Dv and the pool size
bool Loader::load_state(DecodeParams* p, bool layout_given, const Tensor** state_out, Sizes* z) {
  const Tensor* state = nullptr;
  if (!need_float("state", &state, &p->state_dtype)) return false;
  if (state->shape.size() != 4)
    return fail("state", "shape " + shape_string(state->shape) +
                             " is not rank 4 [num_slots, Hv, Dk, Dv] (kv) or [num_slots, Hv, Dv, Dk] (vk)");
  // Without the layout a Dk x Dv state cannot be read: there is no safe guess.
  if (!layout_given) return fail("layout", "missing (kv or vk): needed to read state's shape");
  const int64_t S = state->shape[0];
  const int64_t Hv = state->shape[1];
  const int64_t Dk = p->layout == Layout::kKV ? state->shape[2] : state->shape[3];
  const int64_t Dv = p->layout == Layout::kKV ? state->shape[3] : state->shape[2];
  if (S < 1 || Hv < 1 || Dk < 1 || Dv < 1)
    return fail("state", "shape " + shape_string(state->shape) + " has an empty dimension");
  if (Hv > std::numeric_limits<int32_t>::max() || Dk > kMaxHeadDim || Dv > kMaxHeadDim)
    return fail("state", "shape " + shape_string(state->shape) + " has Dk or Dv above " +
                             std::to_string(kMaxHeadDim) + ", the largest head dim gdnkit runs" +
                             " (with layout " + to_string(p->layout) + ")");
  const std::string dims_note = " (Hv, Dk, Dv from state " + shape_string(state->shape) +
                                " with layout " + to_string(p->layout) + ")";

  int64_t num_slots = S;
  if (const std::string* v = meta("num_slots")) {
    if (!parse_int64(*v, &num_slots) || num_slots < 1 || num_slots > S)
      return fail("num_slots", quoted(*v) + " is not an integer in [1, " + std::to_string(S) +
                                   "] (the pool in state has " + std::to_string(S) + " slots)");
  }
  *state_out = state;
  z->S = S;
  z->Hv = Hv;
  z->Dk = Dk;
  z->Dv = Dv;
  z->num_slots = num_slots;
  z->dims_note = dims_note;
  return true;
}

// ---- q, k, v, mixed_qkv or x (the conv prologue's input): B and Hk
bool Loader::load_qkv(Case* c, DecodeParams* p, const Tensor* x, const Tensor* mixed, Sizes* z) {
  const int64_t Hv = z->Hv, Dk = z->Dk, Dv = z->Dv;
  const std::string& dims_note = z->dims_note;
  const Tensor* q = tensor("q");
  const int64_t tok = z->tok;
  int64_t B = 0, Hk = 0;  // B: the leading dim here, the rows once cu_seqlens is read
  if (x != nullptr && (mixed || q || tensor("k") || tensor("v")))
    return fail("x", std::string("given together with ") + (mixed ? "mixed_qkv" : "q/k/v") +
                         "; a conv case takes its q|k|v row from x");
  // A packed row, mixed_qkv or x: [B, 2*Hk*Dk + Hv*Dv] (only B and the element count matter).
  const Tensor* packed = x != nullptr ? x : mixed;
  if (packed != nullptr) {
    const char* name = x != nullptr ? "x" : "mixed_qkv";
    if (mixed && (q || tensor("k") || tensor("v")))
      return fail("mixed_qkv", "given together with q/k/v; a case has one or the other");
    if (!need_float(name, &packed, &p->qkv_dtype)) return false;
    if (packed->shape.size() < 2 || packed->shape[0] < 1)
      return fail(name, "shape " + shape_string(packed->shape) +
                            " is not [B, 2*Hk*Dk + Hv*Dv] with B >= 1");
    B = packed->shape[0];
    const int64_t width = packed->numel() / (B * tok);
    const int64_t qk = width - Hv * Dv;
    if (packed->numel() % (B * tok) != 0 || qk <= 0 || qk % (2 * Dk) != 0)
      return fail(name, "shape " + shape_string(packed->shape) +
                            " is not [B, 2*Hk*Dk + Hv*Dv]" + dims_note);
    Hk = qk / (2 * Dk);
  } else {
    if (!need_float("q", &q, &p->qkv_dtype)) return false;
    if (q->shape.size() < 2 || q->shape[0] < 1)
      return fail("q", "shape " + shape_string(q->shape) + " is not [B, Hk, Dk] with B >= 1");
    B = q->shape[0];
    if (q->numel() % (B * tok * Dk) != 0 || q->numel() == 0)
      return fail("q", "shape " + shape_string(q->shape) + " is not [B, Hk, Dk]" + dims_note);
    Hk = q->numel() / (B * tok * Dk);
  }
  if (Hv % Hk != 0)
    return fail(x ? "x" : mixed ? "mixed_qkv" : "q", "Hk=" + std::to_string(Hk) + " does not divide Hv=" +
                                              std::to_string(Hv) + dims_note);
  z->B = B;
  z->lead = B;
  z->Hk = Hk;
  if (!packed) {
    if (!check_rows("q", *q, B, tok * Hk * Dk, Dk, "(B, Hk, Dk) = " + tuple(B, Hk, Dk) + dims_note))
      return false;
    const Tensor* k = nullptr;
    const Tensor* v = nullptr;
    DType kt{}, vt{};
    if (!need_float("k", &k, &kt) || !need_float("v", &v, &vt)) return false;
    if (kt != p->qkv_dtype) return fail("k", "dtype " + k->dtype + " differs from q's " + q->dtype);
    if (vt != p->qkv_dtype) return fail("v", "dtype " + v->dtype + " differs from q's " + q->dtype);
    if (!check_rows("k", *k, B, tok * Hk * Dk, Dk, "(B, Hk, Dk) = " + tuple(B, Hk, Dk) + dims_note) ||
        !check_rows("v", *v, B, tok * Hv * Dv, Dv, "(B, Hv, Dv) = " + tuple(B, Hv, Dv) + dims_note))
      return false;
    c->q = q->bytes;
    c->k = k->bytes;
    c->v = v->bytes;
  } else if (mixed) {
    c->mixed_qkv = mixed->bytes;
  }
  // Packed tokens: the rows are cu_seqlens' (B + 1 entries).
  if (const Tensor* cu = tensor("cu_seqlens")) {
    if (cu->shape.size() != 1 || cu->shape[0] < 2)
      return fail("cu_seqlens", "shape " + shape_string(cu->shape) + " is not [B + 1] with B >= 1");
    z->B = cu->shape[0] - 1;
  }
  return true;
}

// ---- gates
bool Loader::load_gates(Case* c, DecodeParams* p, const Sizes& z) {
  const int64_t B = z.B, Hv = z.Hv;
  const Tensor* a = nullptr;
  const Tensor* b = nullptr;
  DType bt{};
  if (!need_float("a", &a, &p->ab_dtype) || !need_float("b", &b, &bt)) return false;
  if (bt != p->ab_dtype) return fail("b", "dtype " + b->dtype + " differs from a's " + a->dtype);
  const std::string bhv = "(B, Hv) = (" + std::to_string(B) + ", " + std::to_string(Hv) + ")";
  // Format version 3: with gate=precomputed, b may hold one beta a column, (B, Hv, Dv).
  const bool per_channel = format_version_ >= 3 && p->gate == Gate::kPrecomputed && !b->shape.empty() &&
                           b->shape.back() == z.Dv && b->numel() == z.lead * z.tok * Hv * z.Dv;
  const std::string bhvd = "(B, Hv, Dv) = (" + std::to_string(B) + ", " + std::to_string(Hv) + ", " +
                           std::to_string(z.Dv) + ")";
  if (!check_rows("a", *a, z.lead, z.tok * Hv, Hv, bhv) ||
      !(per_channel ? check_rows("b", *b, z.lead, z.tok * Hv * z.Dv, z.Dv, bhvd)
                    : check_rows("b", *b, z.lead, z.tok * Hv, Hv, bhv)))
    return false;
  p->b_head_stride = per_channel ? z.Dv : 0;
  c->a = a->bytes;
  c->b = b->bytes;
  for (const char* name : {"A_log", "dt_bias"}) {
    const Tensor* t = tensor(name);
    if (t == nullptr) {
      if (p->gate == Gate::kRaw) return fail(name, "missing tensor (needed by gate=raw)");
      continue;
    }
    if (t->dtype != "F32") return fail(name, "dtype " + t->dtype + " is not supported (F32)");
    if (t->numel() != Hv || t->shape.empty() || t->shape.back() != Hv)
      return fail(name, "shape " + shape_string(t->shape) + " is not [Hv] = [" +
                            std::to_string(Hv) + "]");
    std::vector<float>& dst = std::strcmp(name, "A_log") == 0 ? c->A_log : c->dt_bias;
    dst.resize(size_t(Hv));
    std::memcpy(dst.data(), t->bytes.data(), size_t(Hv) * 4);
  }
  return true;
}

// ---- slot indices
bool Loader::load_indices(Case* c, DecodeParams* p, const Sizes& z) {
  const int64_t B = z.B, num_slots = z.num_slots;
  const Tensor* si = tensor("state_indices");
  const Tensor* so = tensor("state_out_indices");
  if (so && !si) return fail("state_out_indices", "given without state_indices");
  if (si) {
    if (!index_array("state_indices", *si, p)) return false;
    const std::string bx = "(B) = (" + std::to_string(B) + ")";
    if (!check_rows("state_indices", *si, B, 1, 0, bx)) return false;
    c->state_indices = si->bytes;
    if (so) {
      if (so->dtype != si->dtype)
        return fail("state_out_indices",
                    "dtype " + so->dtype + " differs from state_indices' " + si->dtype);
      if (!check_rows("state_out_indices", *so, B, 1, 0, bx)) return false;
      c->state_out_indices = so->bytes;
    }
  } else if (num_slots < B && tensor("token_state_indices") == nullptr) {
    return fail("state", std::to_string(num_slots) + " slots for B=" + std::to_string(B) +
                             " rows and no state_indices (row b uses slot b)");
  }
  return true;
}

bool Loader::index_array(const char* name, const Tensor& t, DecodeParams* p) {
  IndexType it{};
  if (t.dtype == "I32") it = IndexType::kI32;
  else if (t.dtype == "I64") it = IndexType::kI64;
  else return fail(name, "dtype " + t.dtype + " is not supported (I32 or I64)");
  if (p->index_dtype != IndexType::kNone && p->index_dtype != it)
    return fail(name, "dtype " + t.dtype + " differs from the case's other index arrays (" +
                          to_string(p->index_dtype) + ")");
  p->index_dtype = it;
  return true;
}

// ---- format version 3: cu_seqlens, per-token slots, accepted tokens
bool Loader::load_token_indices(Case* c, DecodeParams* p, const Sizes& z) {
  const int64_t B = z.B, T = z.T;
  if (const Tensor* cu = tensor("cu_seqlens")) {
    if (!index_array("cu_seqlens", *cu, p)) return false;
    c->cu_seqlens = cu->bytes;
  }
  if (const Tensor* tsi = tensor("token_state_indices")) {
    if (!index_array("token_state_indices", *tsi, p)) return false;
    if (!check_rows("token_state_indices", *tsi, B, T, 0,
                    "(B, T) = (" + std::to_string(B) + ", " + std::to_string(T) + ")"))
      return false;
    c->token_state_indices = tsi->bytes;
  }
  if (const Tensor* na = tensor("num_accepted_tokens")) {
    if (tensor("token_state_indices") == nullptr)
      return fail("num_accepted_tokens", "given without token_state_indices (it picks the initial token slot)");
    if (!index_array("num_accepted_tokens", *na, p)) return false;
    if (!check_rows("num_accepted_tokens", *na, B, 1, 0, "(B) = (" + std::to_string(B) + ")")) return false;
    c->num_accepted_tokens = na->bytes;
  }
  return true;
}

// ---- format version 3: every token's state (and conv state), (B, T, one slot)
bool Loader::load_intermediate(Case* c, const DecodeParams& p, const Tensor& state, const Sizes& z) {
  const int64_t BT = z.B * z.T;
  if (const Tensor* t = tensor("expected_intermediate_states")) {
    if (t->dtype != "F64" && t->dtype != "F32")
      return fail("expected_intermediate_states", "dtype " + t->dtype + " is not supported (F64, or F32)");
    const int64_t slot = z.Hv * z.Dk * z.Dv;
    const bool rank5_ok = t->shape.size() != 5 ||
                          (t->shape[1] == z.T && t->shape[2] == state.shape[1] && t->shape[3] == state.shape[2] &&
                           t->shape[4] == state.shape[3]);
    if (t->numel() != BT * slot || t->shape.empty() || t->shape[0] != z.B || !rank5_ok)
      return fail("expected_intermediate_states",
                  "shape " + shape_string(t->shape) + " is not (B, T) = (" + std::to_string(z.B) + ", " +
                      std::to_string(z.T) + ") slots of state's shape " + shape_string(state.shape));
    c->expected_intermediate_states = widen_expected(*t);
  }
  if (const Tensor* t = tensor("expected_intermediate_conv_states")) {
    if (p.conv_width == 0)
      return fail("expected_intermediate_conv_states", "given without the conv prologue (x)");
    DType dt{};
    if (t->dtype != "F64" && t->dtype != "F32" && !float_dtype(t->dtype, &dt))
      return fail("expected_intermediate_conv_states", "dtype " + t->dtype + " is not supported");
    const int64_t span = conv_dim(p) * (p.conv_width - 1);
    if (t->numel() != BT * span || t->shape.empty() || t->shape[0] != z.B)
      return fail("expected_intermediate_conv_states",
                  "shape " + shape_string(t->shape) + " is not (B, T) = (" + std::to_string(z.B) + ", " +
                      std::to_string(z.T) + ") conv slots of " + std::to_string(span) + " elements");
    c->expected_intermediate_conv_states = widen_expected(*t);
  }
  return true;
}

// ---- expected results
bool Loader::load_expected(Case* c, const Tensor& state_t, const Sizes& z) {
  const Tensor* state = &state_t;
  const int64_t S = z.S, B = z.B, Hv = z.Hv, Dv = z.Dv;
  const std::string& dims_note = z.dims_note;
  for (const char* name : {"expected_o", "expected_state"}) {
    const Tensor* t = tensor(name);
    if (t == nullptr) return fail(name, "missing tensor");
    if (t->dtype != "F64" && t->dtype != "F32")
      return fail(name, "dtype " + t->dtype + " is not supported (F64, or F32)");
  }
  const Tensor* eo = tensor("expected_o");
  const Tensor* es = tensor("expected_state");
  if (!check_rows("expected_o", *eo, z.lead, z.tok * Hv * Dv, Dv, "(B, Hv, Dv) = " + tuple(B, Hv, Dv) + dims_note))
    return false;
  if (es->numel() != state->numel() || es->shape.empty() || es->shape[0] != S ||
      (es->shape.size() == 4 && es->shape != state->shape))
    return fail("expected_state", "shape " + shape_string(es->shape) +
                                      " is not state's shape " + shape_string(state->shape));
  c->expected_o = widen_expected(*eo);
  c->expected_state = widen_expected(*es);
  c->state = state->bytes;
  return true;
}

// ---- the invalid-index count the file promises must be the one its indices give;
// otherwise a backend would be blamed for the file's mistake.
bool Loader::check_invalid_indices(Case* c, int64_t num_slots) {
  const int64_t invalid = count_invalid(*c);
  c->expected_invalid_indices = -1;
  if (const std::string* v = meta("invalid_indices")) {
    int64_t n = 0;
    if (!parse_int64(*v, &n) || n < 0)
      return fail("invalid_indices", quoted(*v) + " is not an integer >= 0");
    if (n != invalid)
      return fail("invalid_indices",
                  "metadata says " + std::to_string(n) + " but the indices hold " +
                      std::to_string(invalid) + " >= num_slots=" + std::to_string(num_slots));
    c->expected_invalid_indices = n;
  }
  return true;
}

bool Loader::load_conv(Case* c, DecodeParams* p, const Tensor* x, int64_t num_slots) {
  int64_t W = 0;
  const std::string* wv = meta("conv_width");
  if (wv != nullptr && (!parse_int64(*wv, &W) || (W != 0 && (W < 2 || W > 4))))
    return fail("conv_width", quoted(*wv) + " is not 2, 3 or 4 (or 0: no conv prologue)");
  bool tap_major = false;
  if (const std::string* v = meta("conv_state_layout")) {
    const std::string s = normalize(*v);
    if (s == "channel_major") tap_major = false;
    else if (s == "tap_major") tap_major = true;
    else return fail("conv_state_layout", "unknown value " + quoted(*v) + " (channel_major or tap_major)");
  }
  if (x == nullptr) {
    if (W != 0)
      return fail("conv_width", quoted(*wv) + " but the case has no x (the conv prologue's input)");
    for (const char* name : {"conv_state", "conv_weight", "conv_bias", "expected_conv_state"})
      if (tensor(name) != nullptr)
        return fail(name, "given without x (a conv case has x instead of q/k/v or mixed_qkv)");
    return true;
  }
  if (wv == nullptr || W == 0)
    return fail("conv_width", wv ? quoted(*wv) + " but the case has x: a conv case needs 2, 3 or 4"
                                 : "missing (2, 3 or 4): needed with x");

  // conv_dim from the sizes already known (x's width was checked against them).
  const int64_t cdim = 2 * int64_t(p->num_k_heads) * p->head_dim_k +
                       int64_t(p->num_v_heads) * p->head_dim_v;
  const std::string dim_note = " (conv_dim = 2*Hk*Dk + Hv*Dv = " + std::to_string(cdim) +
                               ", W from conv_width=" + std::to_string(W) + ")";
  // conv_weight (conv_dim, W), or torch's depthwise Conv1d shape (conv_dim, 1, W)
  const Tensor* w = nullptr;
  DType dt{};
  if (!need_float("conv_weight", &w, &dt)) return false;
  if (dt != p->qkv_dtype)
    return fail("conv_weight", "dtype " + w->dtype + " differs from x's " + qkv_dtype_);
  if (w->shape.size() < 2 || w->shape[0] != cdim || w->shape.back() != W || w->numel() != cdim * W)
    return fail("conv_weight", "shape " + shape_string(w->shape) + " is not [conv_dim, W] = [" +
                                   std::to_string(cdim) + ", " + std::to_string(W) + "]" + dim_note);
  c->conv_weight = w->bytes;
  // conv_bias (conv_dim), optional
  if (const Tensor* bias = tensor("conv_bias")) {
    if (!need_float("conv_bias", &bias, &dt)) return false;
    if (dt != p->qkv_dtype)
      return fail("conv_bias", "dtype " + bias->dtype + " differs from x's " + qkv_dtype_);
    if (bias->shape.empty() || bias->shape.back() != cdim || bias->numel() != cdim)
      return fail("conv_bias", "shape " + shape_string(bias->shape) + " is not [conv_dim] = [" +
                                   std::to_string(cdim) + "]" + dim_note);
    c->conv_bias = bias->bytes;
  }
  // conv_state: the pool, (S, conv_dim, W-1) channel-major or (S, W-1, conv_dim) tap-major
  const Tensor* cs = nullptr;
  if (!need_float("conv_state", &cs, &dt)) return false;
  if (dt != p->qkv_dtype)
    return fail("conv_state", "dtype " + cs->dtype + " differs from x's " + qkv_dtype_);
  const std::string want =
      tap_major ? "[num_slots, W-1, conv_dim] = [S, " + std::to_string(W - 1) + ", " + std::to_string(cdim) + "]"
                : "[num_slots, conv_dim, W-1] = [S, " + std::to_string(cdim) + ", " + std::to_string(W - 1) + "]";
  const char* lay = tap_major ? " (conv_state_layout tap_major)" : " (conv_state_layout channel_major)";
  if (cs->shape.size() != 3 || cs->shape[1] != (tap_major ? W - 1 : cdim) ||
      cs->shape[2] != (tap_major ? cdim : W - 1))
    return fail("conv_state", "shape " + shape_string(cs->shape) + " is not " + want + lay + dim_note);
  if (cs->shape[0] < num_slots)
    return fail("conv_state", "shape " + shape_string(cs->shape) + " has fewer slots than num_slots=" +
                                  std::to_string(num_slots));
  c->conv_state = cs->bytes;
  // expected_conv_state: the whole conv pool after the step
  const Tensor* ecs = tensor("expected_conv_state");
  if (ecs == nullptr) return fail("expected_conv_state", "missing tensor (needed with x)");
  if (ecs->dtype != "F64" && ecs->dtype != "F32" && ecs->dtype != cs->dtype)
    return fail("expected_conv_state", "dtype " + ecs->dtype + " is not supported (F64, F32, or " +
                                           cs->dtype + " as conv_state)");
  if (ecs->numel() != cs->numel() || ecs->shape.empty() || ecs->shape[0] != cs->shape[0] ||
      (ecs->shape.size() == 3 && ecs->shape != cs->shape))
    return fail("expected_conv_state", "shape " + shape_string(ecs->shape) +
                                           " is not conv_state's shape " + shape_string(cs->shape));
  c->expected_conv_state = widen_expected(*ecs);
  c->x = x->bytes;
  c->conv_tap_major = tap_major;
  p->conv_width = int32_t(W);
  return true;
}

bool Loader::load_norm(Case* c, DecodeParams* p, const Sizes& sz) {
  const int64_t B = sz.B, Hv = sz.Hv, Dv = sz.Dv;
  const std::string& dims_note = sz.dims_note;
  if (const std::string* v = meta("norm_eps")) {
    double eps = 0;
    if (!parse_real(*v, &eps) || eps < 0)
      return fail("norm_eps", quoted(*v) + " is not a finite number >= 0");
    p->norm_eps = float(eps);
  }
  const Tensor* w = tensor("norm_weight");
  const Tensor* z = tensor("z");
  if (w == nullptr) {
    if (z != nullptr) return fail("z", "given without norm_weight (the gated RMSNorm needs both)");
    return true;
  }
  if (z == nullptr) return fail("z", "missing tensor (needed by norm_weight)");
  DType dt{};
  if (!need_float("norm_weight", &w, &dt)) return false;
  if (dt != p->qkv_dtype)
    return fail("norm_weight", "dtype " + w->dtype + " differs from " + qkv_name_ + "'s " + qkv_dtype_);
  if (w->shape.empty() || w->shape.back() != Dv || w->numel() != Dv)
    return fail("norm_weight", "shape " + shape_string(w->shape) + " is not [Dv] = [" +
                                   std::to_string(Dv) + "]" + dims_note);
  if (!need_float("z", &z, &dt)) return false;
  if (dt != p->qkv_dtype)
    return fail("z", "dtype " + z->dtype + " differs from " + qkv_name_ + "'s " + qkv_dtype_);
  if (!check_rows("z", *z, sz.lead, sz.tok * Hv * Dv, Dv,
                  "(B, Hv, Dv) = (" + std::to_string(B) + ", " + std::to_string(Hv) + ", " +
                      std::to_string(Dv) + ")" + dims_note))
    return false;
  c->norm_weight = w->bytes;
  c->z = z->bytes;
  return true;
}

}  // namespace

// ---- public API ------------------------------------------------------------------

bool load_case(const std::string& path, Case* out, std::string* error) {
  try {
    SafetensorsFile f;
    if (!read_safetensors(path, &f, error)) return false;
    Case c;
    c.path = path;
    Loader loader(path, f, error);
    if (!loader.load(&c)) return false;
    *out = std::move(c);
    return true;
  } catch (const std::exception& e) {
    if (error) *error = path + ": cannot load: " + e.what();
  } catch (...) {
    if (error) *error = path + ": cannot load: unknown error";
  }
  return false;
}

}  // namespace golden
}  // namespace gdn
