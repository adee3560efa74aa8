// Host reference of the multi-token step (speculative decoding, T > 1).
//
// Per (b, h): the state is read once into a double scratch matrix, the row's
// tokens run in order on it, and after every token it is rounded to
// state_dtype, exactly as a store and a reload would round it, so one call
// equals T one-token calls. Token t's output uses the unrounded S' (as a
// one-token call does); its intermediate state and token slot get round(S').
// The conv prologue runs per token on the row's window (reads of every row
// before any write), the gated RMSNorm per token before o is rounded.
#include <Kokkos_Core.hpp>

#include <vector>

#include "gdnkit/gdnkit.hpp"
#include "host_common.hpp"

namespace gdn {
namespace host {
namespace {

using HostExec = Kokkos::DefaultHostExecutionSpace;

// What one row does, from its index arrays (docs/operation.md, "Multi-token decode").
struct RowPlan {
  bool touched{false};  // false: nothing read or written (bad cu_seqlens range)
  int64_t first{0};     // offset of token 0: b * batch stride, or cu_seqlens[b] * token stride
  bool packed{false};
  int64_t tokens{0};    // tokens the row carries
  int64_t s_in{-1};     // read slot; < 0: padding (zero outputs, nothing else)
  int64_t s_out{-1};    // final write slot; < 0: no final write
  uint32_t bad{0};      // out-of-range entries the row consulted
};

RowPlan plan_row(const DecodeParams& p, int64_t b) {
  RowPlan r;
  const IndexType it = p.index_dtype;
  const int64_t N = p.num_slots, T = p.num_tokens;
  if (p.cu_seqlens != nullptr) {
    const int64_t lo = read_index(p.cu_seqlens, it, b), hi = read_index(p.cu_seqlens, it, b + 1);
    if (lo < 0 || hi < lo || hi > p.total_tokens || hi - lo > T) {
      r.bad = 1;
      return r;
    }
    r.first = lo;
    r.packed = true;
    r.tokens = hi - lo;
  } else {
    r.tokens = T;
  }
  r.touched = true;
  auto slot = [&](int64_t s) {
    if (s >= N) ++r.bad;
    return s >= N ? -1 : s;
  };
  const void* tsi = p.token_state_indices;
  auto tsi_at = [&](int64_t t) { return read_index(tsi, it, b * p.token_state_indices_stride + t); };
  if (tsi != nullptr)
    for (int64_t t = 0; t < r.tokens; ++t) slot(tsi_at(t));  // counted here, read again per token
  if (p.state_indices != nullptr) {
    r.s_in = slot(read_index(p.state_indices, it, b));
  } else if (tsi != nullptr) {
    const int64_t n = p.num_accepted_tokens ? read_index(p.num_accepted_tokens, it, b) : 1;
    if (n < 1 || n > T) {
      ++r.bad;
      r.s_in = -1;
    } else {
      // an entry inside the row's tokens was counted above
      const int64_t s = tsi_at(n - 1);
      r.s_in = s >= N ? -1 : s;
      if (s >= N && n - 1 >= r.tokens) ++r.bad;
    }
  } else {
    r.s_in = b;
  }
  // the final write: state_out_indices, else the read slot unless the token slots are the writes
  if (p.update_state && p.state_out_indices != nullptr)
    r.s_out = slot(read_index(p.state_out_indices, it, b));
  else if (p.update_state && tsi == nullptr)
    r.s_out = r.s_in;
  if (r.s_in < 0) r.s_out = -1;
  return r;
}

// Offset of token t of a row for one token-major tensor.
int64_t token_offset(const RowPlan& r, int64_t b, int64_t t, int64_t batch_stride, int64_t token_stride) {
  return r.packed ? (r.first + t) * token_stride : b * batch_stride + t * token_stride;
}

// Slot the state after token t goes to (besides the intermediate buffer), or -1.
int64_t token_slot(const DecodeParams& p, int64_t b, int64_t t) {
  if (p.token_state_indices == nullptr) return -1;
  const int64_t s = read_index(p.token_state_indices, p.index_dtype, b * p.token_state_indices_stride + t);
  return s >= p.num_slots ? -1 : s;
}

// Conv prologue of every row: y[b, t] (the packed q|k|v row of token t) and
// the window after each token; phase 2 stores the windows.
struct MultiConv {
  DecodeParams p;
  const RowPlan* plans;
  int64_t cdim;
  double* y;       // (B, T, cdim)
  double* window;  // (B, T, cdim, W - 1): the conv state after token t

  int64_t conv_off(int64_t c, int64_t tap) const {
    return c * p.conv_state_channel_stride + tap * p.conv_state_tap_stride;
  }
  double* win_at(int64_t b, int64_t t, int64_t c) const {
    return window + ((b * p.num_tokens + t) * cdim + c) * (p.conv_width - 1);
  }
  void operator()(const int64_t b) const {
    const RowPlan& r = plans[b];
    if (!r.touched || r.s_in < 0) return;
    const int64_t W = p.conv_width;
    for (int64_t c = 0; c < cdim; ++c) {
      double win[4];
      for (int64_t tap = 0; tap + 1 < W; ++tap)
        win[tap] = load_element(p.conv_state, p.qkv_dtype, r.s_in * p.conv_state_slot_stride + conv_off(c, tap));
      for (int64_t t = 0; t < r.tokens; ++t) {
        win[W - 1] = load_element(p.x, p.qkv_dtype, token_offset(r, b, t, p.x_batch_stride, p.x_token_stride) + c);
        // y[c] = silu(sum_j w[c, j] window[j] + bias[c])
        double acc = p.conv_bias ? load_element(p.conv_bias, p.qkv_dtype, c) : 0.0;
        for (int64_t j = 0; j < W; ++j) acc += load_element(p.conv_weight, p.qkv_dtype, c * W + j) * win[j];
        y[(b * p.num_tokens + t) * cdim + c] = silu(acc);
        // shift x in: the window after token t is its last W-1 values
        for (int64_t j = 0; j + 1 < W; ++j) win[j] = win[j + 1];
        for (int64_t j = 0; j + 1 < W; ++j) win_at(b, t, c)[j] = win[j];
      }
    }
  }
  void store(int64_t t_base, int64_t t, int64_t b, void* base) const {
    for (int64_t c = 0; c < cdim; ++c)
      for (int64_t j = 0; j + 1 < p.conv_width; ++j)
        store_element(base, p.qkv_dtype, t_base + conv_off(c, j), win_at(b, t, c)[j]);
  }
  // phase 2: values come from the conv state or x, so they are stored exactly
  void write(const int64_t b) const {
    const RowPlan& r = plans[b];
    if (!r.touched || r.s_in < 0) return;
    for (int64_t t = 0; t < r.tokens; ++t) {
      const int64_t s = token_slot(p, b, t);
      if (s >= 0) store(s * p.conv_state_slot_stride, t, b, p.conv_state);
      if (p.intermediate_conv_states != nullptr)
        store(b * p.intermediate_conv_batch_stride + t * p.intermediate_conv_token_stride, t, b,
              p.intermediate_conv_states);
    }
    if (r.s_out >= 0 && r.tokens > 0) store(r.s_out * p.conv_state_slot_stride, r.tokens - 1, b, p.conv_state);
  }
};

struct MultiStep {
  DecodeParams p;
  const RowPlan* plans;
  double scale;
  const double* y;  // (B, T, conv_dim) with the conv prologue, else null

  void operator()(const int64_t item) const {
    const int64_t Hk = p.num_k_heads, Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
    const int64_t b = item / Hv, h = item % Hv, hk = k_head_of(p, h);
    const RowPlan& r = plans[b];
    if (!r.touched) return;
    auto o_at = [&](int64_t t) {
      return token_offset(r, b, t, p.o_batch_stride, p.o_token_stride) + h * p.o_head_stride;
    };
    if (r.s_in < 0) {  // padding: the row's outputs zero, nothing else
      for (int64_t t = 0; t < r.tokens; ++t)
        for (int64_t j = 0; j < Dv; ++j) store_element(p.o, p.o_dtype, o_at(t) + j, 0.0);
      return;
    }
    // element (i, j) of the Dk x Dv matrix: kv is Dv-contiguous, vk Dk-contiguous
    const int64_t si = p.layout == Layout::kKV ? Dv : 1;
    const int64_t sj = p.layout == Layout::kKV ? 1 : Dk;
    const int64_t head = h * Dk * Dv;
    std::vector<double> S(size_t(Dk * Dv));
    for (int64_t e = 0; e < Dk * Dv; ++e)
      S[size_t(e)] = load_element(p.state, p.state_dtype, r.s_in * p.state_slot_stride + head + e);
    auto at = [&](int64_t i, int64_t j) -> double& { return S[size_t(i * si + j * sj)]; };
    auto store_state = [&](void* base, int64_t offset) {
      for (int64_t e = 0; e < Dk * Dv; ++e) store_element(base, p.state_dtype, offset + head + e, S[size_t(e)]);
    };

    double q[kMaxHeadDim], k[kMaxHeadDim], u[kMaxHeadDim], o[kMaxHeadDim];
    for (int64_t t = 0; t < r.tokens; ++t) {
      const double* yrow = y ? y + (b * p.num_tokens + t) * conv_dim(p) : nullptr;
      const int64_t q_base = token_offset(r, b, t, p.q_batch_stride, p.q_token_stride) + hk * p.q_head_stride;
      const int64_t k_base = token_offset(r, b, t, p.k_batch_stride, p.k_token_stride) + hk * p.k_head_stride;
      const int64_t v_base = token_offset(r, b, t, p.v_batch_stride, p.v_token_stride) + h * p.v_head_stride;
      double qq = 0.0, kk = 0.0;
      for (int64_t i = 0; i < Dk; ++i) {
        q[i] = yrow ? yrow[hk * Dk + i] : load_element(p.q, p.qkv_dtype, q_base + i);
        k[i] = yrow ? yrow[(Hk + hk) * Dk + i] : load_element(p.k, p.qkv_dtype, k_base + i);
        qq += q[i] * q[i];
        kk += k[i] * k[i];
      }
      l2_normalize(p, q, k, qq, kk);
      // per-channel beta (b_head_stride > 0, precomputed): column j's own, read below
      const bool beta_per_channel = p.b_head_stride > 0;
      const int64_t b_base = token_offset(r, b, t, p.b_batch_stride, p.b_token_stride);
      const Gates gt =
          gates_of(p, h, load_element(p.a, p.ab_dtype, token_offset(r, b, t, p.a_batch_stride, p.a_token_stride) + h),
                   beta_per_channel ? 0.0 : load_element(p.b, p.ab_dtype, b_base + h));
      // u = (exp(g) S)^T k;  delta = beta (v - u)
      for (int64_t j = 0; j < Dv; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < Dk; ++i) acc += at(i, j) * k[i];
        const double vj = yrow ? yrow[2 * Hk * Dk + h * Dv + j] : load_element(p.v, p.qkv_dtype, v_base + j);
        const double beta =
            beta_per_channel ? load_element(p.b, p.ab_dtype, b_base + h * p.b_head_stride + j) : gt.beta;
        u[j] = beta * (vj - gt.decay * acc);
      }
      // S' = exp(g) S + k ⊗ delta;  o = scale S'^T q;  S = round(S') for the next token
      for (int64_t j = 0; j < Dv; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < Dk; ++i) {
          const double s_new = gt.decay * at(i, j) + k[i] * u[j];
          acc += s_new * q[i];
          at(i, j) = round_to(p.state_dtype, s_new);
        }
        o[j] = scale * acc;
      }
      if (p.norm_weight != nullptr)
        gated_rmsnorm(p, o, token_offset(r, b, t, p.z_batch_stride, p.z_token_stride) + h * p.z_head_stride);
      for (int64_t j = 0; j < Dv; ++j) store_element(p.o, p.o_dtype, o_at(t) + j, o[j]);

      const int64_t s = token_slot(p, b, t);
      if (s >= 0) store_state(p.state, s * p.state_slot_stride);
      if (p.intermediate_states != nullptr)
        store_state(p.intermediate_states, b * p.intermediate_batch_stride + t * p.intermediate_token_stride);
    }
    if (r.s_out >= 0 && r.tokens > 0) store_state(p.state, r.s_out * p.state_slot_stride);
  }
};

}  // namespace

Status decode_multi_token(const DecodeParams& p) {
  std::vector<RowPlan> plans(size_t(p.batch));
  uint32_t bad = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    plans[size_t(b)] = plan_row(p, b);
    bad += plans[size_t(b)].bad;
  }
  if (bad && p.invalid_index_count != nullptr) Kokkos::atomic_add(p.invalid_index_count, bad);

  HostExec exec;
  std::vector<double> y, window;
  if (p.conv_width > 0) {
    const int64_t cdim = conv_dim(p), rows = p.batch * p.num_tokens;
    y.assign(size_t(rows * cdim), 0.0);
    window.assign(size_t(rows * cdim * (p.conv_width - 1)), 0.0);
    const MultiConv conv{p, plans.data(), cdim, y.data(), window.data()};
    Kokkos::parallel_for("gdnkit::host_multi_conv", Kokkos::RangePolicy<HostExec>(exec, 0, p.batch), conv);
    exec.fence();
    Kokkos::parallel_for("gdnkit::host_multi_conv_write", Kokkos::RangePolicy<HostExec>(exec, 0, p.batch),
                         [conv](const int64_t b) { conv.write(b); });
    exec.fence();
  }
  const MultiStep step{p, plans.data(), double(effective_scale(p)), y.empty() ? nullptr : y.data()};
  Kokkos::parallel_for("gdnkit::host_multi_step",
                       Kokkos::RangePolicy<HostExec>(exec, 0, p.batch * p.num_v_heads), step);
  exec.fence();
  return Status::success();
}

}  // namespace host
}  // namespace gdn
