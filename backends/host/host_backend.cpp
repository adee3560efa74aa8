// Host backend: the Kokkos reference of the GDN decode step.
//
// It is what every GPU backend is compared with, so it favours being
// obviously right over being fast: one work item per (row, v-head), every
// quantity in double, loads and stores through the dtype helpers. It uses
// only Kokkos API shared by 3.4 and 4.x (RangePolicy, parallel_for, atomics)
// and runs on the default host execution space (Serial, OpenMP or Threads,
// whichever the installed Kokkos has).
//
// Per (b, h), with s = slot_of(b) valid, from the state as stored:
//   u[j]     = exp(g) * sum_i S[i, j] k[i]
//   delta[j] = beta * (v[j] - u[j])
//   S'[i, j] = exp(g) * S[i, j] + k[i] * delta[j]
//   o[j]     = scale * sum_i S'[i, j] q[i]
// The second pass reads S[i, j] and writes S'[i, j] at the same element, so
// in-place updates need no scratch state.
// The optional conv prologue runs first over whole rows (y = the packed
// q|k|v row, kept in double, never rounded), the optional gated RMSNorm last
// over each (b, h)'s Dv outputs before they are rounded to o_dtype.
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "gdnkit/backend.hpp"
#include "gdnkit/gdnkit.hpp"
#include "gdnkit/half.hpp"
#include "host_common.hpp"

namespace gdn {
namespace host {

// An application that already initialized Kokkos keeps its own settings.
void ensure_kokkos() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!Kokkos::is_initialized()) {
      Kokkos::initialize();
      std::atexit([] {
        if (Kokkos::is_initialized()) Kokkos::finalize();
      });
    }
  });
}

}  // namespace host

namespace {

using HostExec = Kokkos::DefaultHostExecutionSpace;
using host::read_index;
using host::silu;

// The conv prologue's reads (phase 1, every row) happen before any of its
// writes (phase 2), so rows that share a read slot see the same old window
// whatever order the rows run in.
struct HostConv {
  DecodeParams p;
  int64_t cdim;
  double* y;       // (B, cdim): the packed q|k|v rows
  double* window;  // (B, cdim, W - 1): the new conv state, window[1 .. W-1]

  int64_t conv_off(int64_t slot, int64_t c, int64_t t) const {
    return slot * p.conv_state_slot_stride + c * p.conv_state_channel_stride + t * p.conv_state_tap_stride;
  }
  // phase 1: y and the shifted window of row b
  void operator()(const int64_t b) const {
    const int64_t s_in = read_slot(b);
    if (s_in < 0 || s_in >= p.num_slots) return;  // padding row: neither pool
    const int64_t W = p.conv_width;
    for (int64_t c = 0; c < cdim; ++c) {
      double win[4];
      for (int64_t t = 0; t + 1 < W; ++t) win[t] = load_element(p.conv_state, p.qkv_dtype, conv_off(s_in, c, t));
      win[W - 1] = load_element(p.x, p.qkv_dtype, b * p.x_batch_stride + c);
      // y[c] = silu(sum_j w[c, j] window[j] + bias[c])
      double acc = p.conv_bias ? load_element(p.conv_bias, p.qkv_dtype, c) : 0.0;
      for (int64_t t = 0; t < W; ++t) acc += load_element(p.conv_weight, p.qkv_dtype, c * W + t) * win[t];
      y[b * cdim + c] = silu(acc);
      for (int64_t t = 0; t + 1 < W; ++t) window[(b * cdim + c) * (W - 1) + t] = win[t + 1];
    }
  }
  int64_t read_slot(int64_t b) const {
    return p.index_dtype == IndexType::kNone ? b : read_index(p.state_indices, p.index_dtype, b);
  }
  // phase 2: the new window of row b into its write slot (values from the
  // conv state or x, so stored exactly)
  void write(int64_t b) const {
    const int64_t s_in = read_slot(b);
    if (s_in < 0 || s_in >= p.num_slots) return;
    const int64_t s_out = p.state_out_indices ? read_index(p.state_out_indices, p.index_dtype, b) : s_in;
    if (s_out < 0 || s_out >= p.num_slots) return;
    const int64_t W = p.conv_width;
    for (int64_t c = 0; c < cdim; ++c)
      for (int64_t t = 0; t + 1 < W; ++t)
        store_element(p.conv_state, p.qkv_dtype, conv_off(s_out, c, t), window[(b * cdim + c) * (W - 1) + t]);
  }
};

struct HostStep {
  DecodeParams p;
  double scale;
  const double* y;  // (B, conv_dim) when the conv prologue is on, else null

  void operator()(const int64_t item) const {
    const int64_t Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
    const int64_t b = item / Hv;
    const int64_t h = item % Hv;
    const int64_t o_base = b * p.o_batch_stride + h * p.o_head_stride;

    int64_t s_in = b, s_out = b;
    if (p.index_dtype != IndexType::kNone) {
      s_in = read_index(p.state_indices, p.index_dtype, b);
      s_out = p.state_out_indices ? read_index(p.state_out_indices, p.index_dtype, b) : s_in;
    }
    // Padding row (negative) or caller bug (>= num_slots): state untouched, output zero.
    if (s_in < 0 || s_in >= p.num_slots) {
      for (int64_t j = 0; j < Dv; ++j) store_element(p.o, p.o_dtype, o_base + j, 0.0);
      return;
    }
    const bool write_state = s_out >= 0 && s_out < p.num_slots;

    const int64_t hk = host::k_head_of(p, h);

    double q[kMaxHeadDim], k[kMaxHeadDim], u[kMaxHeadDim], o[kMaxHeadDim];
    const int64_t q_base = b * p.q_batch_stride + hk * p.q_head_stride;
    const int64_t k_base = b * p.k_batch_stride + hk * p.k_head_stride;
    // With the conv prologue, q|k|v is the row y = [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)].
    const int64_t Hk = p.num_k_heads;
    const double* yrow = y ? y + b * (2 * Hk * Dk + Hv * Dv) : nullptr;
    double qq = 0.0, kk = 0.0;
    for (int64_t i = 0; i < Dk; ++i) {
      q[i] = yrow ? yrow[hk * Dk + i] : load_element(p.q, p.qkv_dtype, q_base + i);
      k[i] = yrow ? yrow[(Hk + hk) * Dk + i] : load_element(p.k, p.qkv_dtype, k_base + i);
      qq += q[i] * q[i];
      kk += k[i] * k[i];
    }
    host::l2_normalize(p, q, k, qq, kk);

    const host::Gates gt = host::gates_of(p, h, load_element(p.a, p.ab_dtype, b * p.a_batch_stride + h),
                                          load_element(p.b, p.ab_dtype, b * p.b_batch_stride + h));
    const double decay = gt.decay, beta = gt.beta;

    const int64_t in_base = s_in * p.state_slot_stride + h * Dk * Dv;
    const int64_t out_base = s_out * p.state_slot_stride + h * Dk * Dv;
    // element (i, j) of the Dk x Dv matrix: kv is Dv-contiguous, vk Dk-contiguous
    const int64_t si = p.layout == Layout::kKV ? Dv : 1;
    const int64_t sj = p.layout == Layout::kKV ? 1 : Dk;
    const int64_t v_base = b * p.v_batch_stride + h * p.v_head_stride;

    // u = (exp(g) S)^T k;  delta = beta (v - u)
    for (int64_t j = 0; j < Dv; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < Dk; ++i)
        acc += load_element(p.state, p.state_dtype, in_base + i * si + j * sj) * k[i];
      const double vj = yrow ? yrow[2 * Hk * Dk + h * Dv + j] : load_element(p.v, p.qkv_dtype, v_base + j);
      u[j] = beta * (vj - decay * acc);
    }
    const double* delta = u;

    // S' = exp(g) S + k ⊗ delta;  o = scale S'^T q
    for (int64_t j = 0; j < Dv; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < Dk; ++i) {
        const double s_new =
            decay * load_element(p.state, p.state_dtype, in_base + i * si + j * sj) +
            k[i] * delta[j];
        acc += s_new * q[i];
        if (write_state) store_element(p.state, p.state_dtype, out_base + i * si + j * sj, s_new);
      }
      o[j] = scale * acc;
    }
    if (p.norm_weight != nullptr) host::gated_rmsnorm(p, o, b * p.z_batch_stride + h * p.z_head_stride);
    for (int64_t j = 0; j < Dv; ++j) store_element(p.o, p.o_dtype, o_base + j, o[j]);
  }
};

bool host_available(char* why, size_t why_size) {
  (void)why;
  (void)why_size;
  return true;
}

Status host_decode(const DecodeParams& p) {
  host::ensure_kokkos();
  if (is_multi_token(p)) return host::decode_multi_token(p);
  // Count out-of-range indices once per row (not per head), before any work.
  if (p.index_dtype != IndexType::kNone && p.invalid_index_count != nullptr) {
    uint32_t bad = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      if (read_index(p.state_indices, p.index_dtype, b) >= p.num_slots) ++bad;
      if (p.state_out_indices && read_index(p.state_out_indices, p.index_dtype, b) >= p.num_slots)
        ++bad;
    }
    if (bad) Kokkos::atomic_add(p.invalid_index_count, bad);
  }
  HostExec exec;
  std::vector<double> y, window;
  if (p.conv_width > 0) {
    const int64_t cdim = conv_dim(p);
    y.assign(size_t(p.batch * cdim), 0.0);
    window.assign(size_t(p.batch * cdim * (p.conv_width - 1)), 0.0);
    const HostConv conv{p, cdim, y.data(), window.data()};
    Kokkos::parallel_for("gdnkit::host_conv", Kokkos::RangePolicy<HostExec>(exec, 0, p.batch), conv);
    exec.fence();
    Kokkos::parallel_for(
        "gdnkit::host_conv_write", Kokkos::RangePolicy<HostExec>(exec, 0, p.batch),
        [conv](const int64_t b) { conv.write(b); });
    exec.fence();
  }
  HostStep step{p, double(effective_scale(p)), y.empty() ? nullptr : y.data()};
  Kokkos::parallel_for("gdnkit::host_decode",
                       Kokkos::RangePolicy<HostExec>(exec, 0, p.batch * p.num_v_heads), step);
  exec.fence();
  return Status::success();
}

void* host_alloc(size_t bytes) { return std::malloc(bytes ? bytes : 1); }
void host_release(void* ptr) { std::free(ptr); }
Status host_copy(void* dst, const void* src, size_t bytes, CopyKind) {
  std::memmove(dst, src, bytes);
  return Status::success();
}
Status host_sync(void*) { return Status::success(); }
void host_describe(char* buf, size_t size) {
  host::ensure_kokkos();
  std::snprintf(buf, size, "host: Kokkos %d.%d.%d, execution space %s, concurrency %d",
                KOKKOS_VERSION / 10000, KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100,
                HostExec::name(), int(HostExec().concurrency()));
}

}  // namespace

const BackendOps* host_backend() {
  static const BackendOps ops = [] {
    BackendOps o;
    o.id = Backend::kHost;
    o.name = "host";
    o.available = host_available;
    // Host indices can be read before anything runs: a slot two rows would
    // touch is refused here, where a GPU backend can only document it.
    o.can_implement = check_slot_conflicts;
    o.decode = host_decode;
    o.alloc = host_alloc;
    o.release = host_release;
    o.copy = host_copy;
    o.synchronize = host_sync;
    o.describe = host_describe;
    return o;
  }();
  return &ops;
}

}  // namespace gdn
