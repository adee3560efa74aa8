// gdnkit._gdnkit: the Python extension over the C++ API (gdn::DecodeParams + gdn::decode).
//
// Arrays arrive either through DLPack (numpy, torch, CuPy, JAX: anything nanobind's
// ndarray accepts) or, on the fast path the PyTorch ops use, as raw descriptions
// (pointer, shape, strides, dtype, device). Both become an ArrayView, and one
// function (run_decode) turns the views into DecodeParams: shapes are checked
// against each other here (the library sees only pointers and strides), everything
// else is left to gdn::validate, whose message is raised unchanged as ValueError.
//
// Strides are in elements. The last dimension of every tensor must be contiguous;
// rows and heads take any stride the library accepts, so views into a packed row,
// a strided batch or a padded pool work without copies.
//
// Several tokens a row (speculative decoding) are one call too: the token layout
// (Tokens: B rows of T tokens, or tokens packed by cu_seqlens) is resolved once from
// num_tokens and the shapes (resolve_tokens), and every token-major tensor's batch and
// token strides come from its own dimensions. One token a row without cu_seqlens keeps
// the one-token shapes ([B, ...], [B, 1, ...], [1, B, ...]) exactly as they were.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "array_view.hpp"
#include "gdnkit/backend.hpp"
#include "gdnkit/gdnkit.hpp"

#if GDNKIT_PY_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;

namespace {

using namespace gdnkit_py;  // ArrayView, format, refuse, the shape checks

struct Options {
  int layout{int(gdn::Layout::kVK)};
  int gate{int(gdn::Gate::kRaw)};
  int l2norm{int(gdn::L2Norm::kRsqrt)};
  double l2norm_eps{1e-6};
  double scale{0.0};  // 0: Dk^-0.5
  int head_map{int(gdn::HeadMap::kInterleaved)};
  int64_t num_k_heads{0};  // 0: from the shapes
  uint64_t stream{0};
  double norm_eps{1e-6};
  bool programmatic_launch{false};
  int64_t num_tokens{0};  // 0: from the shapes (resolve_tokens)
  bool update_state{true};
};

struct Arrays {
  ArrayView q, k, v, qkv, a, b, A_log, dt_bias, state, o, idx, out_idx, counter;
  // the conv1d prologue (x instead of q, k, v) and the gated RMSNorm epilogue
  ArrayView x, conv_state, conv_weight, conv_bias, z, norm_weight;
  // several tokens a row: packed rows, per-token slots, every token's state kept
  ArrayView cu, tsi, nacc, inter, inter_conv;
  Arrays() {
    q.name = "q"; k.name = "k"; v.name = "v"; qkv.name = "qkv";
    a.name = "a"; b.name = "b"; A_log.name = "A_log"; dt_bias.name = "dt_bias";
    state.name = "state"; o.name = "out"; idx.name = "state_indices";
    out_idx.name = "state_out_indices"; counter.name = "invalid_index_count";
    x.name = "x"; conv_state.name = "conv_state"; conv_weight.name = "conv_weight";
    conv_bias.name = "conv_bias"; z.name = "z"; norm_weight.name = "norm_weight";
    cu.name = "cu_seqlens"; tsi.name = "token_state_indices"; nacc.name = "num_accepted_tokens";
    inter.name = "intermediate_states"; inter_conv.name = "intermediate_conv_states";
  }
};

#if GDNKIT_PY_WITH_CUDA
// The library launches on the current device: make it the arrays' device.
struct CudaDeviceGuard {
  int previous{-1};
  explicit CudaDeviceGuard(int device) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (cur != device && cudaSetDevice(device) == cudaSuccess) previous = cur;
  }
  ~CudaDeviceGuard() {
    if (previous >= 0) cudaSetDevice(previous);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
};
#endif

void raise_status(const gdn::Status& st) {
  switch (st.code) {
    case gdn::StatusCode::kOk: return;
    case gdn::StatusCode::kInvalidArgument:
    case gdn::StatusCode::kUnsupported: throw nb::value_error(st.message);
    default: throw std::runtime_error(st.message);
  }
}

// A tensor of the prologue or epilogue, which the library reads in x's (qkv_dtype) dtype.
void need_qkv_dtype(const ArrayView& a, const ArrayView& ref) {
  if (need_dtype(a) != need_dtype(ref))
    refuse(format("%s: dtype %s differs from %s's %s (the conv prologue's and the norm's tensors "
                  "share the inputs' dtype)",
                  a.name, dtype_name(a.code, a.bits), ref.name, dtype_name(ref.code, ref.bits)));
}

// The conv1d prologue: W from conv_weight, the conv state pool's layout from its shape, and
// the buffer of every token's conv window. Sizes, qkv_dtype and the pool's num_slots must
// be set.
void set_conv(Arrays& x, const Tokens& g, gdn::DecodeParams& p) {
  const int64_t cdim = gdn::conv_dim(p);
  // conv_weight: (conv_dim, W), or torch Conv1d's (conv_dim, 1, W); dense.
  const ArrayView& w = x.conv_weight;
  const bool conv1d_shape = w.ndim == 3 && w.shape[1] == 1;
  if (!(w.ndim == 2 || conv1d_shape) || w.shape[0] != cdim)
    refuse(format("conv_weight: expected (conv_dim=%lld, W) or (conv_dim, 1, W), got shape %s",
                  (long long)cdim, w.shape_str().c_str()));
  const int64_t W = w.shape[w.ndim - 1];
  if (W < 2 || W > 4)
    refuse(format("conv_weight: width W=%lld (its last dimension) is not 2, 3 or 4", (long long)W));
  if (w.strides[w.ndim - 1] != 1 || (cdim > 1 && w.strides[0] != W))
    refuse(format("conv_weight: must be contiguous, got strides %s for shape %s",
                  w.strides_str().c_str(), w.shape_str().c_str()));
  need_qkv_dtype(w, x.x);
  p.conv_width = int32_t(W);
  p.conv_weight = w.data;
  if (x.conv_bias.present) {
    need_vector(x.conv_bias, cdim, "conv_dim, one per channel");
    need_qkv_dtype(x.conv_bias, x.x);
    p.conv_bias = x.conv_bias.data;
  }
  // conv_state: (slots, conv_dim, W-1) or (slots, W-1, conv_dim) with any strides the
  // library accepts (conv_dim >= 3 * 16 never equals W-1, so the shape says which).
  const ArrayView& c = x.conv_state;
  const int64_t taps = W - 1;
  int cd = -1;
  if (c.ndim == 3 && c.shape[1] == cdim && c.shape[2] == taps) cd = 1;
  if (c.ndim == 3 && c.shape[1] == taps && c.shape[2] == cdim) cd = 2;
  if (cd < 0)
    refuse(format("conv_state: expected (num_slots, conv_dim=%lld, W-1=%lld) or (num_slots, W-1, "
                  "conv_dim), got shape %s",
                  (long long)cdim, (long long)taps, c.shape_str().c_str()));
  if (c.shape[0] < p.num_slots)
    refuse(format("conv_state: %lld slots, fewer than the state pool's %lld", (long long)c.shape[0],
                  (long long)p.num_slots));
  need_qkv_dtype(c, x.x);
  int64_t ch = c.strides[cd], tap = c.strides[3 - cd];
  // The stride of a size-1 dimension means nothing (frameworks report anything).
  if (taps == 1) tap = ch == 1 ? cdim : 1;
  p.conv_state = c.data;
  p.conv_state_channel_stride = ch;
  p.conv_state_tap_stride = tap;
  const int64_t span = ch == 1 ? (taps - 1) * tap + cdim : (cdim - 1) * ch + taps;
  p.conv_state_slot_stride = c.shape[0] > 1 ? c.strides[0] : span;

  // intermediate_conv_states: (B, >= T, <one slot of the pool>); the library lays every
  // token's window out with the pool's channel and tap strides, so the buffer must share them.
  if (!x.inter_conv.present) return;
  const ArrayView& ic = x.inter_conv;
  if (!(ic.ndim == 4 && ic.shape[0] == g.B && ic.shape[1] >= g.T && ic.shape[2] == c.shape[1] &&
        ic.shape[3] == c.shape[2]))
    refuse(format("intermediate_conv_states: expected shape (B=%lld, T=%lld or more, %lld, %lld) "
                  "(a slot of conv_state for every token), got %s",
                  (long long)g.B, (long long)g.T, (long long)c.shape[1], (long long)c.shape[2],
                  ic.shape_str().c_str()));
  need_qkv_dtype(ic, x.x);
  int64_t ich = ic.strides[cd + 1], itap = ic.strides[4 - cd];
  if (taps == 1) itap = ich == 1 ? cdim : 1;
  if (ich != ch || itap != tap)
    refuse(format("intermediate_conv_states: channel and tap strides (%lld, %lld) differ from "
                  "conv_state's (%lld, %lld) (every token's window is laid out as a slot of the "
                  "pool)",
                  (long long)ich, (long long)itap, (long long)ch, (long long)tap));
  p.intermediate_conv_states = ic.data;
  p.intermediate_conv_token_stride = ic.shape[1] > 1 ? ic.strides[1] : span;
  p.intermediate_conv_batch_stride =
      ic.shape[0] > 1 ? ic.strides[0] : ic.shape[1] * p.intermediate_conv_token_stride;
}

// A token-major (tokens, Hv, Dv) tensor (z, out) in the call's token layout.
TokenRHD token_hv_dv(const ArrayView& a, const Tokens& g, const gdn::DecodeParams& p) {
  const int64_t Hv = p.num_v_heads, Dv = p.head_dim_v;
  const TokenRHD r = as_token_rhd(a, Dv, g);
  if (r.heads != Hv)
    refuse(format("%s: shape %s, expected %s", a.name, a.shape_str().c_str(),
                  g.expected(format("Hv=%lld, Dv=%lld", (long long)Hv, (long long)Dv).c_str())
                      .c_str()));
  return r;
}

// The gated RMSNorm: z (B, Hv, Dv), or (B, T, Hv, Dv) / (total_tokens, Hv, Dv), and
// norm_weight (Dv).
void set_norm(Arrays& x, const Options& opt, const Tokens& g, gdn::DecodeParams& p) {
  const int64_t B = g.B, Hv = p.num_v_heads, Dv = p.head_dim_v;
  if (g.token_major()) {
    const TokenRHD z = token_hv_dv(x.z, g, p);
    p.z_batch_stride = z.batch_stride;
    p.z_token_stride = z.token_stride;
    p.z_head_stride = z.head_stride;
  } else {
    const RHD z = as_rhd(x.z, Dv);
    if (z.rows != B || z.heads != Hv || z.dim != Dv)
      refuse(format("z: shape %s, expected [B=%lld, Hv=%lld, Dv=%lld]", x.z.shape_str().c_str(),
                    (long long)B, (long long)Hv, (long long)Dv));
    p.z_batch_stride = z.row_stride;
    p.z_head_stride = z.head_stride;
  }
  const ArrayView& ref = x.x.present ? x.x : x.qkv.present ? x.qkv : x.q;
  need_qkv_dtype(x.z, ref);
  need_vector(x.norm_weight, Dv, "Dv, one per output column");
  need_qkv_dtype(x.norm_weight, ref);
  p.z = x.z.data;
  p.norm_weight = x.norm_weight.data;
  p.norm_eps = float(opt.norm_eps);
}

// Which arrays go together: x (the conv prologue) or qkv or q, k, v; z with norm_weight.
void check_present(const Arrays& x, bool raw_gate) {
  const bool conv = x.x.present;
  const bool norm = x.norm_weight.present;
  // x (the conv prologue's input) is a packed row too.
  const bool packed = x.qkv.present || conv;
  if (conv && (x.qkv.present || x.q.present || x.k.present || x.v.present))
    refuse("x: give either x (the conv prologue's input) or q, k, v / qkv, not both");
  if (x.qkv.present && (x.q.present || x.k.present || x.v.present))
    refuse("qkv: give either one packed qkv row or q, k and v, not both");
  if (!packed && !(x.q.present && x.k.present && x.v.present))
    refuse("q, k, v: all three are required (or one packed qkv row, or x with the conv prologue)");
  if (conv && !x.conv_state.present) refuse("conv_state: required with x (the conv prologue)");
  if (conv && !x.conv_weight.present) refuse("conv_weight: required with x (the conv prologue)");
  if (!conv)
    for (const ArrayView* c : {&x.conv_state, &x.conv_weight, &x.conv_bias, &x.inter_conv})
      if (c->present) refuse(format("%s: given without x (the conv prologue's input)", c->name));
  if (norm && !x.z.present) refuse("z: required with norm_weight (the gated RMSNorm)");
  if (!norm && x.z.present) refuse("norm_weight: required with z (the gated RMSNorm)");
  if (!x.a.present) refuse("a: required");
  if (!x.b.present) refuse("b: required");
  if (!x.state.present) refuse("state: required");
  if (!x.o.present) refuse("out: required");
  if (raw_gate && !x.A_log.present) refuse("A_log: required with the raw gate");
  if (raw_gate && !x.dt_bias.present) refuse("dt_bias: required with the raw gate");
  if (x.out_idx.present && !x.idx.present)
    refuse("state_out_indices: given without state_indices");
}

// One device for every array (the state's); the backend that runs there.
gdn::Backend one_device(const Arrays& x, bool raw_gate) {
  const ArrayView* all[] = {&x.state, &x.q, &x.k, &x.v, &x.qkv, &x.a, &x.b, &x.A_log, &x.dt_bias,
                            &x.o, &x.idx, &x.out_idx, &x.counter, &x.x, &x.conv_state,
                            &x.conv_weight, &x.conv_bias, &x.z, &x.norm_weight, &x.cu, &x.tsi,
                            &x.nacc, &x.inter, &x.inter_conv};
  const ArrayView& ref = x.state;
  const Space space = space_of(ref.dev_type);
  if (space == Space::kOther)
    refuse(format("state: arrays on %s are not supported (cpu, cuda or rocm memory)",
                  device_str(ref).c_str()));
  for (const ArrayView* p : all) {
    if (!p->present) continue;
    if (!raw_gate && (p == &x.A_log || p == &x.dt_bias)) continue;  // unused
    if (space_of(p->dev_type) != space || (space != Space::kHost && p->dev_id != ref.dev_id))
      refuse(format("%s: on %s, but state is on %s (all arrays must be on one device)", p->name,
                    device_str(*p).c_str(), device_str(ref).c_str()));
  }
  return space == Space::kHost   ? gdn::Backend::kHost
         : space == Space::kCuda ? gdn::Backend::kCuda
                                 : gdn::Backend::kHip;
}

// The switches, and the pool, which fixes Hv, Dk and Dv.
void set_pool(const Arrays& x, const Options& opt, gdn::DecodeParams& p) {
  p.layout = gdn::Layout(opt.layout);
  p.gate = gdn::Gate(opt.gate);
  p.l2norm = gdn::L2Norm(opt.l2norm);
  p.l2norm_eps = float(opt.l2norm_eps);
  p.scale = float(opt.scale);
  p.head_map = gdn::HeadMap(opt.head_map);
  p.stream = reinterpret_cast<void*>(uintptr_t(opt.stream));
  p.programmatic_launch = opt.programmatic_launch;

  const ArrayView& s = x.state;
  if (s.ndim != 4)
    refuse(format("state: expected [num_slots, Hv, %s], got shape %s",
                  opt.layout == int(gdn::Layout::kKV) ? "Dk, Dv" : "Dv, Dk",
                  s.shape_str().c_str()));
  const int64_t Hv = s.shape[1];
  const bool kv = opt.layout == int(gdn::Layout::kKV);
  const int64_t Dk = kv ? s.shape[2] : s.shape[3];
  const int64_t Dv = kv ? s.shape[3] : s.shape[2];
  if ((s.shape[3] > 1 && s.strides[3] != 1) || (s.shape[2] > 1 && s.strides[2] != s.shape[3]) ||
      (s.shape[1] > 1 && s.strides[1] != s.shape[2] * s.shape[3]))
    refuse(format("state: every slot's [Hv, %s] block must be dense and row-major (the slot "
                  "stride is free), got strides %s for shape %s",
                  kv ? "Dk, Dv" : "Dv, Dk", s.strides_str().c_str(), s.shape_str().c_str()));
  p.state_dtype = need_dtype(s);
  p.state = s.data;
  p.num_slots = s.shape[0];
  p.state_slot_stride = s.shape[0] > 1 ? s.strides[0] : Hv * Dk * Dv;
  p.num_v_heads = int32_t(Hv);
  p.head_dim_k = int32_t(Dk);
  p.head_dim_v = int32_t(Dv);
  if (Hv < 1 || Hv > INT32_MAX || Dk < 1 || Dk > INT32_MAX || Dv < 1 || Dv > INT32_MAX)
    refuse(format("state: shape %s is out of range", s.shape_str().c_str()));
}

// The call's token layout. T is num_tokens, else what the shapes say: a [B, T, Hv] whose
// B and T both differ from 1, else the second dimension of token_state_indices (B, T) or of
// intermediate_states (B, T, ...), else, with cu_seqlens, the packed tokens up to
// kMaxTokens (no row holds more), else 1. A [1, N, Hv] without any of these stays N rows
// of one token, as before multi-token calls existed. With cu_seqlens, B is its length
// less one and the tokens are a's rows; otherwise B is a's rows over T.
Tokens resolve_tokens(const Arrays& x, const Options& opt) {
  const ArrayView& a = x.a;
  if (a.ndim < 2)
    refuse(format("a: expected [B, Hv] or [B, 1, Hv], got shape %s", a.shape_str().c_str()));
  int64_t rows = 1, lead[kMaxDims];
  int m = 0;
  for (int i = 0; i + 1 < a.ndim; ++i) {
    rows *= a.shape[i];
    if (a.shape[i] != 1) lead[m++] = a.shape[i];
  }
  Tokens g;
  g.packed = x.cu.present;
  int64_t T = opt.num_tokens;
  if (T == 0) {
    if (!g.packed && m == 2)
      T = lead[1];
    else if (x.tsi.present && x.tsi.ndim == 2)
      T = x.tsi.shape[1];
    else if (x.inter.present && x.inter.ndim >= 3)
      T = x.inter.shape[1];
    else
      T = g.packed ? std::max<int64_t>(1, std::min<int64_t>(rows, gdn::kMaxTokens)) : 1;
  }
  if (T < 1 || T > gdn::kMaxTokens)
    refuse(format("num_tokens: must be in [1, %d], got %lld", gdn::kMaxTokens, (long long)T));
  g.T = T;
  if (g.packed) {
    if (x.cu.ndim != 1 || x.cu.shape[0] < 1)
      refuse(format("cu_seqlens: expected shape (B + 1,), got %s", x.cu.shape_str().c_str()));
    g.B = x.cu.shape[0] - 1;
    g.total = rows;
  } else {
    if (rows % T != 0)
      refuse(format("a: %lld tokens are not B rows of num_tokens=%lld", (long long)rows,
                    (long long)T));
    g.B = rows / T;
  }
  return g;
}

// The gates a and b. In the one-token form they fix B (returned); token-major, they must
// hold the tokens resolve_tokens found.
int64_t set_gates(const Arrays& x, const Tokens& g, gdn::DecodeParams& p) {
  const int64_t Hv = p.num_v_heads;
  int64_t B = g.B, heads = 0, bstride = 0, tstride = 0;
  if (g.token_major()) {
    heads = x.a.shape[x.a.ndim - 1];
    if (heads == Hv) as_token_rows(x.a, g, "Hv", &bstride, &tstride);
  } else {
    as_rows_heads(x.a, &B, &heads, &bstride);
  }
  if (heads != Hv)
    refuse(format("a: %lld heads, but state has Hv=%lld", (long long)heads, (long long)Hv));
  p.batch = B;
  p.ab_dtype = need_dtype(x.a);
  p.a = x.a.data;
  p.a_batch_stride = bstride;
  p.a_token_stride = tstride;
  int64_t rows = 0, h = 0, st = 0, ts = 0, hs = 0;
  const int64_t Dv = p.head_dim_v;
  // per-channel beta: b [..., Hv, Dv], one dimension more than a
  if (x.b.ndim == x.a.ndim + 1 && x.b.ndim >= 3 && x.b.shape[x.b.ndim - 2] == Hv &&
      x.b.shape[x.b.ndim - 1] == Dv) {
    if (p.gate != gdn::Gate::kPrecomputed)
      refuse(format("b: shape %s is a beta per channel, which needs gate='precomputed' (b then "
                    "holds beta itself)",
                    x.b.shape_str().c_str()));
    if (g.token_major()) {
      const TokenRHD r = as_token_rhd(x.b, Dv, g);
      rows = B;
      h = r.heads;
      st = r.batch_stride;
      ts = r.token_stride;
      hs = r.head_stride;
    } else {
      const RHD r = as_rhd(x.b, 0);
      rows = r.rows;
      h = r.heads;
      st = r.row_stride;
      hs = r.head_stride;
    }
  } else if (g.token_major()) {
    rows = B;
    h = x.b.ndim >= 1 ? x.b.shape[x.b.ndim - 1] : 0;
    if (h == Hv) as_token_rows(x.b, g, "Hv", &st, &ts);
  } else {
    as_rows_heads(x.b, &rows, &h, &st);
  }
  if (rows != B || h != Hv)
    refuse(format("b: shape %s does not match a %s", x.b.shape_str().c_str(),
                  x.a.shape_str().c_str()));
  if (need_dtype(x.b) != p.ab_dtype)
    refuse(format("b: dtype %s differs from a's %s (a and b share one dtype)",
                  dtype_name(x.b.code, x.b.bits), dtype_name(x.a.code, x.a.bits)));
  p.b = x.b.data;
  p.b_batch_stride = st;
  p.b_token_stride = ts;
  p.b_head_stride = hs;
  return B;
}

// One packed row per token: qkv, or the conv prologue's x (conv).
void set_packed(const Arrays& x, const Options& opt, const Tokens& g, bool conv,
                gdn::DecodeParams& p) {
  const int64_t B = g.B, Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const ArrayView& w = conv ? x.x : x.qkv;
  need_contiguous_last(w);
  if (w.ndim < 2)
    refuse(format("%s: expected [B, 2*Hk*Dk + Hv*Dv] or [B, 1, ...], got shape %s", w.name,
                  w.shape_str().c_str()));
  const int64_t width = w.shape[w.ndim - 1];
  const int64_t key_width = width - Hv * Dv;
  if (key_width <= 0 || key_width % (2 * Dk) != 0)
    refuse(format("%s: width %lld is not 2*Hk*Dk + Hv*Dv for Hv=%lld, Dk=%lld, Dv=%lld", w.name,
                  (long long)width, (long long)Hv, (long long)Dk, (long long)Dv));
  const int64_t Hk = key_width / (2 * Dk);
  if (opt.num_k_heads > 0 && opt.num_k_heads != Hk)
    refuse(format("%s: width %lld gives Hk=%lld, but num_k_heads=%lld", w.name, (long long)width,
                  (long long)Hk, (long long)opt.num_k_heads));
  if (Hk > INT32_MAX) refuse(format("%s: too many k-heads", w.name));
  p.num_k_heads = int32_t(Hk);
  p.qkv_dtype = need_dtype(w);
  if (g.token_major()) {
    int64_t bs = 0, ts = 0;
    as_token_rows(w, g, "2*Hk*Dk + Hv*Dv", &bs, &ts);
    if (conv) {
      p.x = w.data;
      p.x_batch_stride = bs;
      p.x_token_stride = ts;
      return;
    }
    // [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)] in every token's row
    const int64_t elem = int64_t(gdn::dtype_size(p.qkv_dtype));
    const char* base = static_cast<const char*>(w.data);
    p.q = base;
    p.k = base + Hk * Dk * elem;
    p.v = base + 2 * Hk * Dk * elem;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = bs;
    p.q_token_stride = p.k_token_stride = p.v_token_stride = ts;
    p.q_head_stride = p.k_head_stride = Dk;
    p.v_head_stride = Dv;
    return;
  }
  int64_t rows = 0, rstride = 0;
  collapse_rows(w, w.ndim - 1, &rows, &rstride);
  if (rows != B)
    refuse(format("%s: %lld rows, but a has %lld", w.name, (long long)rows, (long long)B));
  if (rows <= 1) rstride = width;
  if (conv) {
    p.x = w.data;
    p.x_batch_stride = rstride;
  } else {
    gdn::set_packed_qkv(p, w.data, rstride);
  }
}

// Separate q, k and v.
void set_qkv(const Arrays& x, const Options& opt, const Tokens& g, gdn::DecodeParams& p) {
  const int64_t B = g.B, Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  TokenRHD q, k, v;
  if (g.token_major()) {
    q = as_token_rhd(x.q, Dk, g);
    k = as_token_rhd(x.k, Dk, g);
    v = as_token_rhd(x.v, Dv, g);
  } else {
    // one token a row: (R, H, D), (R, 1, H, D), (1, R, H, D) or (R, H*D)
    const RHD q1 = as_rhd(x.q, Dk), k1 = as_rhd(x.k, Dk), v1 = as_rhd(x.v, Dv);
    if (q1.dim != Dk)
      refuse(format("q: head dim %lld, but state has Dk=%lld", (long long)q1.dim, (long long)Dk));
    if (k1.rows != q1.rows || k1.heads != q1.heads || k1.dim != q1.dim)
      refuse(format("k: shape %s does not match q %s", x.k.shape_str().c_str(),
                    x.q.shape_str().c_str()));
    if (v1.heads != Hv || v1.dim != Dv)
      refuse(format("v: shape %s does not match Hv=%lld, Dv=%lld of the state",
                    x.v.shape_str().c_str(), (long long)Hv, (long long)Dv));
    if (q1.rows != B || v1.rows != B)
      refuse(format("q, k, v: %lld and %lld rows, but a has %lld", (long long)q1.rows,
                    (long long)v1.rows, (long long)B));
    auto one = [](const RHD& r) {
      TokenRHD t;
      t.heads = r.heads;
      t.dim = r.dim;
      t.batch_stride = r.row_stride;
      t.head_stride = r.head_stride;
      return t;
    };
    q = one(q1);
    k = one(k1);
    v = one(v1);
  }
  if (k.heads != q.heads)
    refuse(format("k: shape %s does not match q %s", x.k.shape_str().c_str(),
                  x.q.shape_str().c_str()));
  if (v.heads != Hv)
    refuse(format("v: shape %s does not match Hv=%lld, Dv=%lld of the state",
                  x.v.shape_str().c_str(), (long long)Hv, (long long)Dv));
  if (opt.num_k_heads > 0 && opt.num_k_heads != q.heads)
    refuse(format("q: %lld heads, but num_k_heads=%lld", (long long)q.heads,
                  (long long)opt.num_k_heads));
  if (q.heads > INT32_MAX) refuse("q: too many k-heads");
  const gdn::DType t = need_dtype(x.q);
  if (need_dtype(x.k) != t || need_dtype(x.v) != t)
    refuse(format("q, k, v: dtypes %s, %s, %s differ (they share one dtype)",
                  dtype_name(x.q.code, x.q.bits), dtype_name(x.k.code, x.k.bits),
                  dtype_name(x.v.code, x.v.bits)));
  p.num_k_heads = int32_t(q.heads);
  p.qkv_dtype = t;
  p.q = x.q.data;
  p.q_batch_stride = q.batch_stride;
  p.q_token_stride = q.token_stride;
  p.q_head_stride = q.head_stride;
  p.k = x.k.data;
  p.k_batch_stride = k.batch_stride;
  p.k_token_stride = k.token_stride;
  p.k_head_stride = k.head_stride;
  p.v = x.v.data;
  p.v_batch_stride = v.batch_stride;
  p.v_token_stride = v.token_stride;
  p.v_head_stride = v.head_stride;
}

// The raw gate's parameters A_log and dt_bias: float32, one per v-head.
void set_raw_gate(const Arrays& x, gdn::DecodeParams& p) {
  for (const ArrayView* g : {&x.A_log, &x.dt_bias}) {
    if (!(g->code == kCodeFloat && g->bits == 32))
      refuse(format("%s: dtype must be float32, got %s", g->name, dtype_name(g->code, g->bits)));
    need_vector(*g, p.num_v_heads, "one per v-head");
  }
  p.A_log = static_cast<const float*>(x.A_log.data);
  p.dt_bias = static_cast<const float*>(x.dt_bias.data);
}

void set_out(const Arrays& x, const Tokens& g, gdn::DecodeParams& p) {
  const int64_t B = g.B, Hv = p.num_v_heads, Dv = p.head_dim_v;
  p.o_dtype = need_dtype(x.o);
  p.o = x.o.data;
  if (g.token_major()) {
    const TokenRHD o = token_hv_dv(x.o, g, p);
    p.o_batch_stride = o.batch_stride;
    p.o_token_stride = o.token_stride;
    p.o_head_stride = o.head_stride;
    return;
  }
  const RHD o = as_rhd(x.o, Dv);
  if (o.rows != B || o.heads != Hv || o.dim != Dv)
    refuse(format("out: shape %s, expected [B=%lld, Hv=%lld, Dv=%lld]", x.o.shape_str().c_str(),
                  (long long)B, (long long)Hv, (long long)Dv));
  p.o_batch_stride = o.row_stride;
  p.o_head_stride = o.head_stride;
}

// The slot indices, the multi-token index arrays and the counter of out-of-range indices.
void set_indices(const Arrays& x, const Tokens& g, gdn::DecodeParams& p) {
  const int64_t B = g.B;
  // The library reads every index array in one dtype: the first one given fixes it.
  const ArrayView* first = nullptr;
  for (const ArrayView* i : {&x.idx, &x.out_idx, &x.cu, &x.tsi, &x.nacc}) {
    if (!i->present) continue;
    if (first == nullptr) {
      if (!(i->code == kCodeInt && (i->bits == 32 || i->bits == 64)))
        refuse(format("%s: dtype must be int32 or int64, got %s", i->name,
                      dtype_name(i->code, i->bits)));
      first = i;
    } else if (i->code != first->code || i->bits != first->bits) {
      refuse(format("%s: dtype %s differs from %s' %s (the index arrays share one dtype)",
                    i->name, dtype_name(i->code, i->bits), first->name,
                    dtype_name(first->code, first->bits)));
    }
  }
  if (first != nullptr)
    p.index_dtype = first->bits == 32 ? gdn::IndexType::kI32 : gdn::IndexType::kI64;
  if (x.idx.present) {
    need_vector(x.idx, B, "one per row");
    p.state_indices = x.idx.data;
  }
  if (x.out_idx.present) {
    need_vector(x.out_idx, B, "one per row");
    p.state_out_indices = x.out_idx.data;
  }
  if (x.cu.present) {
    need_vector(x.cu, B + 1, "B + 1: row b owns the tokens [cu_seqlens[b], cu_seqlens[b+1])");
    p.cu_seqlens = x.cu.data;
    p.total_tokens = g.total;
  }
  if (x.tsi.present) {
    // (B, T), or wider (vLLM's tables): the columns past T are never read.
    const ArrayView& t = x.tsi;
    if (t.ndim != 2 || t.shape[0] != B || t.shape[1] < g.T)
      refuse(format("token_state_indices: expected shape (B=%lld, T=%lld) (or more columns), "
                    "got %s",
                    (long long)B, (long long)g.T, t.shape_str().c_str()));
    need_contiguous_last(t);
    p.token_state_indices = t.data;
    p.token_state_indices_stride = B > 1 ? t.strides[0] : t.shape[1];
  }
  if (x.nacc.present) {
    need_vector(x.nacc, B, "one per row");
    p.num_accepted_tokens = x.nacc.data;
  }
  if (x.counter.present) {
    const ArrayView& c = x.counter;
    if (!((c.code == kCodeUInt || c.code == kCodeInt) && c.bits == 32) || c.numel() != 1)
      refuse(format("invalid_index_count: expected one uint32 or int32 element, got %s of "
                    "shape %s",
                    dtype_name(c.code, c.bits), c.shape_str().c_str()));
    p.invalid_index_count = static_cast<uint32_t*>(c.data);
  }
}

// intermediate_states: every token's state, (B, T or more, <a slot of the pool>) or
// (B, T or more, Hv*Dk*Dv), in the pool's dtype and layout; each token's block dense.
void set_intermediate(const Arrays& x, const Tokens& g, gdn::DecodeParams& p) {
  const ArrayView& s = x.inter;
  const ArrayView& pool = x.state;
  const int64_t slot = int64_t(p.num_v_heads) * p.head_dim_k * p.head_dim_v;
  const bool blocks = s.ndim == 5 && s.shape[2] == pool.shape[1] && s.shape[3] == pool.shape[2] &&
                      s.shape[4] == pool.shape[3];
  const bool flat = s.ndim == 3 && s.shape[2] == slot;
  if (!(blocks || flat) || s.shape[0] != g.B || s.shape[1] < g.T)
    refuse(format("intermediate_states: expected shape (B=%lld, T=%lld or more, %lld, %lld, %lld) "
                  "(a slot of state for every token) or (B, T, %lld), got %s",
                  (long long)g.B, (long long)g.T, (long long)pool.shape[1],
                  (long long)pool.shape[2], (long long)pool.shape[3], (long long)slot,
                  s.shape_str().c_str()));
  const bool dense = blocks ? (s.shape[4] <= 1 || s.strides[4] == 1) &&
                                  (s.shape[3] <= 1 || s.strides[3] == s.shape[4]) &&
                                  (s.shape[2] <= 1 || s.strides[2] == s.shape[3] * s.shape[4])
                            : (slot <= 1 || s.strides[2] == 1);
  if (!dense)
    refuse(format("intermediate_states: every token's block must be dense and row-major (the "
                  "batch and token strides are free), got strides %s for shape %s",
                  s.strides_str().c_str(), s.shape_str().c_str()));
  if (need_dtype(s) != p.state_dtype)
    refuse(format("intermediate_states: dtype %s differs from state's %s (the buffer holds states)",
                  dtype_name(s.code, s.bits), dtype_name(pool.code, pool.bits)));
  p.intermediate_states = s.data;
  p.intermediate_token_stride = s.shape[1] > 1 ? s.strides[1] : slot;
  p.intermediate_batch_stride =
      s.shape[0] > 1 ? s.strides[0] : s.shape[1] * p.intermediate_token_stride;
}

// Check the arrays against each other, fill DecodeParams, run.
void run_decode(Arrays& x, const Options& opt) {
  for (ArrayView* p : {&x.q, &x.k, &x.v, &x.qkv, &x.a, &x.b, &x.o, &x.idx, &x.out_idx, &x.x, &x.z,
                       &x.cu, &x.tsi, &x.nacc, &x.inter, &x.inter_conv})
    if (p->present) p->canonicalize_if_empty();
  const bool conv = x.x.present;
  const bool raw_gate = opt.gate == int(gdn::Gate::kRaw);
  check_present(x, raw_gate);
  const gdn::Backend backend = one_device(x, raw_gate);

  gdn::DecodeParams p;
  set_pool(x, opt, p);
  Tokens g = resolve_tokens(x, opt);
  g.B = set_gates(x, g, p);
  p.num_tokens = int32_t(g.T);
  p.update_state = opt.update_state;
  if (conv || x.qkv.present)
    set_packed(x, opt, g, conv, p);
  else
    set_qkv(x, opt, g, p);
  if (conv) set_conv(x, g, p);
  if (x.norm_weight.present) set_norm(x, opt, g, p);
  if (raw_gate) set_raw_gate(x, p);
  set_out(x, g, p);
  set_indices(x, g, p);
  if (x.inter.present) set_intermediate(x, g, p);

  gdn::Status st;
  {
    nb::gil_scoped_release release;
#if GDNKIT_PY_WITH_CUDA
    if (backend == gdn::Backend::kCuda) {
      CudaDeviceGuard guard(x.state.dev_id);
      st = gdn::decode(p, backend);
    } else {
      st = gdn::decode(p, backend);
    }
#else
    st = gdn::decode(p, backend);
#endif
  }
  raise_status(st);
}

// ---- DLPack path -----------------------------------------------------------------

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

template <typename Arr>
void fill_view(const Arr& arr, ArrayView* v) {
  if (arr.ndim() > size_t(kMaxDims)) refuse(format("%s: more than %d dimensions", v->name, kMaxDims));
  v->present = true;
  v->data = const_cast<void*>(static_cast<const void*>(arr.data()));
  v->ndim = int(arr.ndim());
  int64_t contiguous = 1;
  for (int i = v->ndim - 1; i >= 0; --i) {
    v->shape[i] = int64_t(arr.shape(size_t(i)));
    v->strides[i] = arr.stride_ptr() ? arr.stride(size_t(i)) : contiguous;
    contiguous *= v->shape[i];
  }
  v->code = arr.dtype().code;
  v->bits = arr.dtype().bits;
  if (arr.dtype().lanes != 1) refuse(format("%s: vector dtypes (lanes > 1) are not supported", v->name));
  v->dev_type = arr.device_type();
  v->dev_id = arr.device_id();
}

std::string py_type_name(nb::handle h) {
  return nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr())))));
}

// An input: read-only access is enough.
void import_in(nb::handle h, ArrayView* v, InArray* keep) {
  if (h.is_none()) return;
  if (!nb::try_cast<InArray>(h, *keep, false))
    refuse(format("%s: expected an array with DLPack or buffer-protocol support, got %s", v->name,
                  py_type_name(h).c_str()));
  fill_view(*keep, v);
}

// Written: state, out, the counter. A read-only array (a JAX array, a numpy
// array with writeable=False) is refused rather than copied.
void import_out(nb::handle h, ArrayView* v, OutArray* keep) {
  if (h.is_none()) return;
  if (!nb::try_cast<OutArray>(h, *keep, false)) {
    InArray probe;
    if (nb::try_cast<InArray>(h, probe, false))
      refuse(format("%s: the array is read-only, but gdnkit writes it in place", v->name));
    refuse(format("%s: expected an array with DLPack or buffer-protocol support, got %s", v->name,
                  py_type_name(h).c_str()));
  }
  fill_view(*keep, v);
}

// Arrays arriving through DLPack (or the buffer protocol), held for the call.
struct DlpackImport {
  InArray in[18];
  OutArray out[6];
  int n_in{0}, n_out{0};
  void read(nb::handle h, ArrayView* v) { import_in(h, v, &in[n_in++]); }
  void written(nb::handle h, ArrayView* v) { import_out(h, v, &out[n_out++]); }
};

// ---- raw path (the PyTorch ops) --------------------------------------------------
//
// Each array is None or a tuple (data_ptr, shape, strides, dtype_code, bits,
// device_type, device_id) with DLPack's codes and strides in elements. The caller
// keeps the memory alive for the call (a torch op holds its tensors).

void import_raw(nb::handle h, ArrayView* v) {
  if (h.is_none()) return;
  nb::tuple t;
  if (!nb::try_cast<nb::tuple>(h, t, false) || t.size() != 7)
    refuse(format("%s: expected (ptr, shape, strides, code, bits, device_type, device_id)", v->name));
  nb::tuple shape = nb::cast<nb::tuple>(t[1]);
  nb::tuple strides = nb::cast<nb::tuple>(t[2]);
  const size_t n = shape.size();
  if (n > size_t(kMaxDims) || strides.size() != n)
    refuse(format("%s: bad shape/strides description", v->name));
  v->present = true;
  v->data = reinterpret_cast<void*>(uintptr_t(nb::cast<uint64_t>(t[0])));
  v->ndim = int(n);
  for (size_t i = 0; i < n; ++i) {
    v->shape[i] = nb::cast<int64_t>(shape[i]);
    v->strides[i] = nb::cast<int64_t>(strides[i]);
  }
  v->code = uint8_t(nb::cast<int>(t[3]));
  v->bits = uint8_t(nb::cast<int>(t[4]));
  v->dev_type = nb::cast<int32_t>(t[5]);
  v->dev_id = nb::cast<int32_t>(t[6]);
}

// Raw descriptions: the caller holds the memory.
struct RawImport {
  void read(nb::handle h, ArrayView* v) { import_raw(h, v); }
  void written(nb::handle h, ArrayView* v) { import_raw(h, v); }
};

// ---- the entry points --------------------------------------------------------------
//
// decode (DLPack) and decode_raw (raw descriptions) take the same arguments, named in
// GDNKIT_DECODE_ARGS below; the Python package passes them by name
// (gdnkit/_options.py: PARAMS, ext_kwargs).

template <class Import>
void decode_entry(nb::handle q, nb::handle k, nb::handle v, nb::handle qkv, nb::handle a,
                  nb::handle b, nb::handle A_log, nb::handle dt_bias, nb::handle state,
                  nb::handle out, nb::handle state_indices, nb::handle state_out_indices,
                  nb::handle invalid_index_count, int layout, int gate, int l2norm,
                  double l2norm_eps, double scale, int head_map, int64_t num_k_heads,
                  uint64_t stream, nb::handle x_in, nb::handle conv_state,
                  nb::handle conv_weight, nb::handle conv_bias, nb::handle z,
                  nb::handle norm_weight, double norm_eps, bool programmatic_launch,
                  int64_t num_tokens, nb::handle cu_seqlens, nb::handle token_state_indices,
                  nb::handle num_accepted_tokens, nb::handle intermediate_states,
                  nb::handle intermediate_conv_states, bool update_state) {
  Arrays x;
  Import im;
  im.read(q, &x.q);
  im.read(k, &x.k);
  im.read(v, &x.v);
  im.read(qkv, &x.qkv);
  im.read(a, &x.a);
  im.read(b, &x.b);
  im.read(A_log, &x.A_log);
  im.read(dt_bias, &x.dt_bias);
  im.read(state_indices, &x.idx);
  im.read(state_out_indices, &x.out_idx);
  im.written(state, &x.state);
  im.written(out, &x.o);
  im.written(invalid_index_count, &x.counter);
  im.read(x_in, &x.x);
  im.written(conv_state, &x.conv_state);
  im.read(conv_weight, &x.conv_weight);
  im.read(conv_bias, &x.conv_bias);
  im.read(z, &x.z);
  im.read(norm_weight, &x.norm_weight);
  im.read(cu_seqlens, &x.cu);
  im.read(token_state_indices, &x.tsi);
  im.read(num_accepted_tokens, &x.nacc);
  im.written(intermediate_states, &x.inter);
  im.written(intermediate_conv_states, &x.inter_conv);
  run_decode(x, Options{layout, gate, l2norm, l2norm_eps, scale, head_map, num_k_heads, stream,
                        norm_eps, programmatic_launch, num_tokens, update_state});
}

gdn::Backend backend_from_name(const std::string& name) {
  if (name == "auto") return gdn::Backend::kAuto;
  if (name == "host") return gdn::Backend::kHost;
  if (name == "cuda") return gdn::Backend::kCuda;
  if (name == "hip") return gdn::Backend::kHip;
  refuse(format("backend: unknown name '%s' (auto, host, cuda or hip)", name.c_str()));
}

}  // namespace

NB_MODULE(_gdnkit, m) {
  m.doc() = "gdnkit: the fused GatedDeltaNet decode step (C++ extension; use the gdnkit package)";

#define GDNKIT_DECODE_ARGS                                                                     \
  nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(), nb::arg("qkv").none(),        \
      nb::arg("a").none(), nb::arg("b").none(), nb::arg("A_log").none(),                       \
      nb::arg("dt_bias").none(), nb::arg("state").none(), nb::arg("out").none(),               \
      nb::arg("state_indices").none(), nb::arg("state_out_indices").none(),                    \
      nb::arg("invalid_index_count").none(), nb::arg("layout"), nb::arg("gate"),               \
      nb::arg("l2norm"), nb::arg("l2norm_eps"), nb::arg("scale"), nb::arg("head_map"),         \
      nb::arg("num_k_heads"), nb::arg("stream"), nb::arg("x").none() = nb::none(),            \
      nb::arg("conv_state").none() = nb::none(), nb::arg("conv_weight").none() = nb::none(),   \
      nb::arg("conv_bias").none() = nb::none(), nb::arg("z").none() = nb::none(),              \
      nb::arg("norm_weight").none() = nb::none(), nb::arg("norm_eps") = 1e-6,                  \
      nb::arg("programmatic_launch") = false, nb::arg("num_tokens") = 0,                        \
      nb::arg("cu_seqlens").none() = nb::none(),                                               \
      nb::arg("token_state_indices").none() = nb::none(),                                      \
      nb::arg("num_accepted_tokens").none() = nb::none(),                                      \
      nb::arg("intermediate_states").none() = nb::none(),                                      \
      nb::arg("intermediate_conv_states").none() = nb::none(), nb::arg("update_state") = true

  m.def("decode", &decode_entry<DlpackImport>, GDNKIT_DECODE_ARGS,
        "One decode call on DLPack arrays (see gdnkit.decode for the friendly front end).");
  m.def("decode_raw", &decode_entry<RawImport>, GDNKIT_DECODE_ARGS,
        "One decode call on raw array descriptions (the PyTorch ops' fast path).");
#undef GDNKIT_DECODE_ARGS

  m.def("version", [] { return std::string(gdn::version()); });
  m.def("backend_built", [](const std::string& name) { return gdn::backend_built(backend_from_name(name)); });
  m.def("backend_available", [](const std::string& name) {
    char why[256] = {};
    const bool ok = gdn::backend_available(backend_from_name(name), why, sizeof why);
    return nb::make_tuple(ok, std::string(why));
  });
  m.def("describe", [](const std::string& name) {
    const gdn::BackendOps* ops = gdn::backend_ops(backend_from_name(name));
    if (ops == nullptr || ops->describe == nullptr) return std::string();
    char buf[1024] = {};
    ops->describe(buf, sizeof buf);
    return std::string(buf);
  });
  m.def("resolve_backend", [](const std::string& name) {
    return std::string(gdn::to_string(gdn::resolve_backend(backend_from_name(name))));
  });
  m.attr("built_with_cuda") = bool(GDNKIT_PY_WITH_CUDA);
}
