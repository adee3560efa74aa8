// Golden cases: run a loaded case on a backend and compare its results
// (run_case, compare, the tolerances); list the cases of a directory.
// Loading a case is golden_load.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

#include "gdnkit/backend.hpp"
#include "gdnkit/golden.hpp"
#include "golden_internal.hpp"
#include "printable.hpp"
#include "gdnkit/half.hpp"

namespace gdn {
namespace golden {
namespace {

int64_t read_index(const uint8_t* base, IndexType t, int64_t i) {
  if (t == IndexType::kI64) {
    int64_t v;
    std::memcpy(&v, base + 8 * i, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, base + 4 * i, 4);
  return v;
}

}  // namespace

namespace internal {

// Out-of-range indices (>= num_slots) in both arrays: what a backend reports.
int64_t count_invalid(const Case& c) {
  const DecodeParams& p = c.params;
  const IndexType t = p.index_dtype;
  if (t == IndexType::kNone) return 0;
  const int64_t S = p.num_slots, T = p.num_tokens;
  int64_t bad = 0;
  if (c.cu_seqlens.empty() && c.token_state_indices.empty() && T == 1 && p.update_state) {
    // One token a row: every entry of both arrays.
    for (int64_t b = 0; b < p.batch; ++b) {
      if (!c.state_indices.empty() && read_index(c.state_indices.data(), t, b) >= S) ++bad;
      if (!c.state_out_indices.empty() && read_index(c.state_out_indices.data(), t, b) >= S) ++bad;
    }
    return bad;
  }
  // Several tokens: every entry the step consults (docs/golden-format.md, version 3).
  const uint8_t* tsi = c.token_state_indices.empty() ? nullptr : c.token_state_indices.data();
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t tokens = T;
    if (!c.cu_seqlens.empty()) {
      const int64_t lo = read_index(c.cu_seqlens.data(), t, b), hi = read_index(c.cu_seqlens.data(), t, b + 1);
      if (lo < 0 || hi < lo || hi > p.total_tokens || hi - lo > T) {
        ++bad;
        continue;
      }
      tokens = hi - lo;
    }
    if (tsi)
      for (int64_t j = 0; j < tokens; ++j) bad += read_index(tsi, t, b * T + j) >= S;
    if (!c.state_indices.empty()) {
      bad += read_index(c.state_indices.data(), t, b) >= S;
    } else if (tsi) {
      const int64_t n = c.num_accepted_tokens.empty() ? 1 : read_index(c.num_accepted_tokens.data(), t, b);
      if (n < 1 || n > T) ++bad;
      else if (read_index(tsi, t, b * T + n - 1) >= S && n - 1 >= tokens) ++bad;
    }
    if (p.update_state && !c.state_out_indices.empty())
      bad += read_index(c.state_out_indices.data(), t, b) >= S;
  }
  return bad;
}

std::vector<double> widen(const std::vector<uint8_t>& bytes, DType t) {
  std::vector<double> r(bytes.size() / dtype_size(t));
  for (size_t i = 0; i < r.size(); ++i) r[i] = load_element(bytes.data(), t, int64_t(i));
  return r;
}

}  // namespace internal

namespace {

using internal::count_invalid;
using internal::widen;

// ---- device memory, released on every path -----------------------------------

class DeviceBuffers {
 public:
  explicit DeviceBuffers(const BackendOps* ops) : ops_(ops) {}
  ~DeviceBuffers() {
    for (void* p : ptrs_) ops_->release(p);
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  // Allocate and copy `bytes` in; nullptr (and `error` set) on failure.
  void* upload(const char* name, const void* bytes, size_t size, std::string* error) {
    void* p = ops_->alloc(size);
    if (p == nullptr) {
      *error = std::string(ops_->name) + ": cannot allocate " + std::to_string(size) +
               " bytes for " + name;
      return nullptr;
    }
    ptrs_.push_back(p);
    const Status st = ops_->copy(p, bytes, size, CopyKind::kHostToDevice);
    if (!st.ok()) {
      *error = std::string(ops_->name) + ": copy of " + name + " to the device: " + st.message;
      return nullptr;
    }
    return p;
  }

  bool download(const char* name, void* dst, const void* src, size_t size, std::string* error) {
    const Status st = ops_->copy(dst, src, size, CopyKind::kDeviceToHost);
    if (!st.ok()) {
      *error = std::string(ops_->name) + ": copy of " + name + " from the device: " + st.message;
      return false;
    }
    return true;
  }

 private:
  const BackendOps* ops_;
  std::vector<void*> ptrs_;
};

std::string describe(const Case& c) {
  const DecodeParams& p = c.params;
  std::ostringstream s;
  s << "B=" << p.batch << " Hk=" << p.num_k_heads << " Hv=" << p.num_v_heads
    << " Dk=" << p.head_dim_k << " Dv=" << p.head_dim_v << " qkv=" << to_string(p.qkv_dtype)
    << (c.packed_qkv ? "(packed)" : p.conv_width > 0 ? "(x)" : "") << " ab=" << to_string(p.ab_dtype)
    << " o=" << to_string(p.o_dtype) << " state=" << to_string(p.state_dtype) << "/"
    << to_string(p.layout) << " slots=" << p.num_slots;
  if (p.index_dtype != IndexType::kNone)
    s << " idx=" << to_string(p.index_dtype) << (c.state_out_indices.empty() ? "" : "+out");
  s << " gate=" << to_string(p.gate) << " l2norm=" << to_string(p.l2norm);
  if (p.l2norm != L2Norm::kNone && p.l2norm_eps != 1e-6f) s << "(eps=" << p.l2norm_eps << ")";
  s << " head_map=" << to_string(p.head_map);
  if (p.scale != 0.0f) s << " scale=" << p.scale;
  if (p.conv_width > 0)
    s << " conv=W" << p.conv_width << "/" << (c.conv_tap_major ? "tap_major" : "channel_major")
      << (c.conv_bias.empty() ? "" : "+bias");
  if (!c.norm_weight.empty()) {
    s << " norm";
    if (p.norm_eps != 1e-6f) s << "(eps=" << p.norm_eps << ")";
  }
  if (c.multi_token()) {
    s << " T=" << p.num_tokens << (c.cu_seqlens.empty() ? "" : "(packed)");
    if (!c.token_state_indices.empty())
      s << " token_slots" << (c.num_accepted_tokens.empty() ? "" : "+accepted");
    if (!c.expected_intermediate_states.empty()) s << " intermediate";
    if (!p.update_state) s << " no_update";
  }
  return s.str();
}

CaseReport run_impl(const Case& c, Backend backend) {
  CaseReport r;
  r.path = c.path;
  r.notes = describe(c);
  const DecodeParams& cp = c.params;
  const int64_t o_count = c.token_rows() * cp.num_v_heads * cp.head_dim_v;

  const Backend resolved = resolve_backend(backend);
  const BackendOps* ops = backend_ops(resolved);
  if (ops == nullptr) {
    r.error = std::string("backend ") + to_string(resolved) + ": not built into this gdnkit";
    return r;
  }
  char why[160] = {};
  if (!ops->available(why, sizeof why)) {
    r.error = std::string("backend ") + ops->name + ": " + why;
    return r;
  }
  if (int64_t(c.expected_o.size()) != o_count ||
      c.expected_state.size() * dtype_size(cp.state_dtype) != c.state.size() ||
      c.expected_conv_state.size() * dtype_size(cp.qkv_dtype) != c.conv_state.size()) {
    r.error = "case: expected_o / expected_state / expected_conv_state sizes do not match the parameters";
    return r;
  }

  DeviceBuffers dev(ops);
  DecodeParams p = cp;
  std::string& err = r.error;
  auto up = [&](const char* name, const auto& vec) -> void* {
    if (vec.empty()) return nullptr;
    return dev.upload(name, vec.data(), vec.size() * sizeof(vec[0]), &err);
  };
  // first: set_packed_qkv reads whether the tokens are packed
  p.cu_seqlens = up("cu_seqlens", c.cu_seqlens);
  if (!err.empty()) return r;
  if (p.conv_width > 0) {
    // q, k, v come out of the conv prologue: the pointers stay null.
    if (c.x.empty() || c.conv_weight.empty() || c.conv_state.empty()) {
      err = "case: conv_width is set but x, conv_weight or conv_state is empty";
      return r;
    }
    if (!(p.x = up("x", c.x)) || !(p.conv_weight = up("conv_weight", c.conv_weight)) ||
        !(p.conv_state = up("conv_state", c.conv_state)))
      return r;
    p.conv_bias = up("conv_bias", c.conv_bias);
    if (!err.empty()) return r;
  } else if (c.packed_qkv) {
    void* m = up("mixed_qkv", c.mixed_qkv);
    if (!m) return r;
    const int64_t row = 2 * int64_t(p.num_k_heads) * p.head_dim_k +
                        int64_t(p.num_v_heads) * p.head_dim_v;
    set_packed_qkv(p, m, row);
    if (p.cu_seqlens) p.total_tokens = cp.total_tokens;
  } else {
    if (!(p.q = up("q", c.q)) || !(p.k = up("k", c.k)) || !(p.v = up("v", c.v))) return r;
  }
  if (!(p.a = up("a", c.a)) || !(p.b = up("b", c.b))) return r;
  if (!c.norm_weight.empty()) {
    if (c.z.empty()) {
      err = "case: norm_weight is set but z is empty";
      return r;
    }
    if (!(p.z = up("z", c.z)) || !(p.norm_weight = up("norm_weight", c.norm_weight))) return r;
  }
  p.A_log = static_cast<const float*>(up("A_log", c.A_log));
  p.dt_bias = static_cast<const float*>(up("dt_bias", c.dt_bias));
  if (!err.empty()) return r;
  p.state = up("state", c.state);
  if (!p.state) return r;
  p.state_indices = up("state_indices", c.state_indices);
  p.state_out_indices = up("state_out_indices", c.state_out_indices);
  p.token_state_indices = up("token_state_indices", c.token_state_indices);
  p.num_accepted_tokens = up("num_accepted_tokens", c.num_accepted_tokens);
  if (!err.empty()) return r;
  // The per-token buffers start as all-ones bytes (NaN), as o does.
  const size_t inter_bytes = c.expected_intermediate_states.size() * dtype_size(p.state_dtype);
  const size_t inter_conv_bytes = c.expected_intermediate_conv_states.size() * dtype_size(p.qkv_dtype);
  std::vector<uint8_t> inter_host(inter_bytes, 0xff), inter_conv_host(inter_conv_bytes, 0xff);
  p.intermediate_states = up("intermediate_states", inter_host);
  p.intermediate_conv_states = up("intermediate_conv_states", inter_conv_host);
  if (!err.empty()) return r;

  // o starts as all-ones bytes: NaN in fp32, fp16 and bf16 alike, so an
  // output element the backend never writes fails the comparison.
  const size_t o_bytes = size_t(o_count) * dtype_size(p.o_dtype);
  std::vector<uint8_t> o_host(o_bytes, 0xff);
  if (!(p.o = up("o", o_host))) return r;
  const uint32_t zero = 0;
  p.invalid_index_count = static_cast<uint32_t*>(dev.upload("invalid_index_count", &zero, 4, &err));
  if (!p.invalid_index_count) return r;

  const Status st = decode(p, resolved);
  if (!st.ok()) {
    r.unsupported = st.code == StatusCode::kUnsupported;
    err = std::string("decode: ") + to_string(st.code) + ": " + st.message;
    return r;
  }
  if (ops->synchronize) {
    const Status sy = ops->synchronize(p.stream);
    if (!sy.ok()) {
      err = std::string("synchronize: ") + sy.message;
      return r;
    }
  }
  std::vector<uint8_t> state_host(c.state.size());
  if (!dev.download("o", o_host.data(), p.o, o_bytes, &err) ||
      !dev.download("state", state_host.data(), p.state, state_host.size(), &err) ||
      !dev.download("invalid_index_count", &r.invalid_reported, p.invalid_index_count, 4, &err))
    return r;
  std::vector<uint8_t> conv_host(c.conv_state.size());
  if (p.conv_width > 0 &&
      !dev.download("conv_state", conv_host.data(), p.conv_state, conv_host.size(), &err))
    return r;
  if ((inter_bytes && !dev.download("intermediate_states", inter_host.data(), p.intermediate_states,
                                    inter_bytes, &err)) ||
      (inter_conv_bytes && !dev.download("intermediate_conv_states", inter_conv_host.data(),
                                         p.intermediate_conv_states, inter_conv_bytes, &err)))
    return r;

  // ---- compare
  const std::vector<double> o_got = widen(o_host, p.o_dtype);
  // Several tokens: later tokens read a state stored in its dtype (docs/golden-format.md, Tolerances).
  const double o_tol = p.num_tokens > 1 ? std::max(output_tolerance(p.o_dtype), state_tolerance(p.state_dtype))
                                        : output_tolerance(p.o_dtype);
  r.o = compare(o_got, c.expected_o, o_tol);
  // Padding rows (expected all exactly 0) must be written as exact zeros.
  const int64_t row_len = int64_t(p.num_v_heads) * p.head_dim_v;
  for (int64_t b = 0; b < c.token_rows(); ++b) {
    const double* e = c.expected_o.data() + b * row_len;
    if (!std::all_of(e, e + row_len, [](double x) { return x == 0.0; })) continue;
    for (int64_t j = 0; j < row_len; ++j)
      if (!(o_got[size_t(b * row_len + j)] == 0.0)) ++r.o.exact_mismatches;
  }
  if (r.o.exact_mismatches) r.o.pass = false;

  const std::vector<double> state_in = widen(c.state, p.state_dtype);
  const std::vector<double> state_got = widen(state_host, p.state_dtype);
  r.state = compare(state_got, c.expected_state, state_tolerance(p.state_dtype), &state_in);

  // The conv state is pure data movement: every element bitwise as expected
  // (tolerance 0, and each element held to the exact rule).
  if (p.conv_width > 0) {
    r.has_conv_state = true;
    r.conv_state = compare(widen(conv_host, p.qkv_dtype), c.expected_conv_state, 0.0,
                           &c.expected_conv_state);
  }

  // Per-token buffers: compared where the case expects a value (not NaN).
  auto compare_known = [](const std::vector<double>& got, const std::vector<double>& expected, double tol) {
    std::vector<double> g, e;
    for (size_t i = 0; i < expected.size(); ++i)
      if (!std::isnan(expected[i])) {
        g.push_back(got[i]);
        e.push_back(expected[i]);
      }
    return compare(g, e, tol, tol == 0.0 ? &e : nullptr);
  };
  if (inter_bytes) {
    r.has_intermediate = true;
    r.intermediate = compare_known(widen(inter_host, p.state_dtype), c.expected_intermediate_states,
                                   state_tolerance(p.state_dtype));
  }
  if (inter_conv_bytes) {
    r.has_intermediate_conv = true;
    r.intermediate_conv = compare_known(widen(inter_conv_host, p.qkv_dtype), c.expected_intermediate_conv_states, 0.0);
  }

  const int64_t want_invalid =
      c.expected_invalid_indices >= 0 ? c.expected_invalid_indices : count_invalid(c);
  bool invalid_ok = int64_t(r.invalid_reported) == want_invalid;
  if (!invalid_ok)
    err = "invalid_index_count: backend reported " + std::to_string(r.invalid_reported) +
          ", the case has " + std::to_string(want_invalid) + " out-of-range indices";
  r.pass = r.o.pass && r.state.pass && (!r.has_conv_state || r.conv_state.pass) &&
           (!r.has_intermediate || r.intermediate.pass) &&
           (!r.has_intermediate_conv || r.intermediate_conv.pass) && invalid_ok && err.empty();
  return r;
}

}  // namespace

// ---- public API ------------------------------------------------------------------

double output_tolerance(DType t) {
  switch (t) {
    case DType::kF32: return 1e-5;
    case DType::kF16: return 2e-3;
    case DType::kBF16: return 1e-2;
  }
  return 0.0;
}

double state_tolerance(DType t) {
  switch (t) {
    case DType::kF32: return 1e-5;
    case DType::kF16: return 2e-3;
    case DType::kBF16: return 8e-3;
  }
  return 0.0;
}

Comparison compare(const std::vector<double>& got, const std::vector<double>& expected,
                   double tolerance, const std::vector<double>* unchanged) {
  Comparison c;
  c.tolerance = tolerance;
  if (got.size() != expected.size() || (unchanged && unchanged->size() != expected.size())) {
    c.rel_l2 = std::numeric_limits<double>::infinity();
    return c;
  }
  const double inf = std::numeric_limits<double>::infinity();
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], g = got[i];
    // Non-finite expectations (non-finite inputs propagate) match themselves.
    double d;
    if (e == g || (std::isnan(e) && std::isnan(g))) d = 0.0;
    else d = std::isnan(g - e) ? inf : std::fabs(g - e);
    // The L2 error runs over the whole tensor, as docs/golden-format.md defines
    // it; elements that must not change are held to the bitwise rule on top.
    if (std::isfinite(e)) ref2 += e * e;
    diff2 += d * d;
    const bool must_keep = unchanged != nullptr && e == (*unchanged)[i];
    const bool kept = !must_keep || std::memcmp(&g, &(*unchanged)[i], sizeof(double)) == 0;
    if (!kept) ++c.exact_mismatches;
    // A broken exact rule is reported as the worst element when the L2 part
    // has nothing larger to show (e.g. -0.0 written over +0.0).
    if (d > c.worst_abs || (!kept && c.worst_index < 0)) {
      c.worst_abs = d;
      c.worst_index = int64_t(i);
      c.worst_expected = e;
      c.worst_got = g;
    }
  }
  const double diff = std::sqrt(diff2);
  c.rel_l2 = ref2 > 0.0 ? diff / std::sqrt(ref2) : diff;
  c.pass = c.rel_l2 <= tolerance && c.exact_mismatches == 0;
  return c;
}

CaseReport run_case(const Case& c, Backend backend) {
  try {
    return run_impl(c, backend);
  } catch (const std::exception& e) {
    CaseReport r;
    r.path = c.path;
    r.error = std::string("run: ") + e.what();
    return r;
  } catch (...) {
    CaseReport r;
    r.path = c.path;
    r.error = "run: unknown error";
    return r;
  }
}

std::vector<std::string> list_cases(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec2))
      out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace golden
}  // namespace gdn
