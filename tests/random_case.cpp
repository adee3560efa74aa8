#include "random_case.hpp"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <numeric>
#include <sstream>

namespace gdn_test {

std::string describe(const CaseSpec& s) {
  std::ostringstream os;
  os << s.name << " [seed " << s.seed << ", B=" << s.batch << " Hk=" << s.hk << " Hv=" << s.hv
     << " Dk=" << s.dk << " Dv=" << s.dv << ", qkv " << gdn::to_string(s.qkv) << " ab "
     << gdn::to_string(s.ab) << " state " << gdn::to_string(s.state) << " o "
     << gdn::to_string(s.out) << ", layout " << gdn::to_string(s.layout) << ", l2norm "
     << gdn::to_string(s.l2norm) << " eps " << s.eps << ", head_map " << gdn::to_string(s.head_map)
     << ", gate " << gdn::to_string(s.gate) << (s.null_gate_params ? " (no A_log/dt_bias)" : "")
     << (s.wide_gates ? " (wide)" : "")
     << ", scale " << s.scale << ", index " << gdn::to_string(s.index);
  if (s.index != gdn::IndexType::kNone)
    os << " (shuffle " << s.shuffle_slots << ", padding " << s.padding_rows << ", out "
       << s.out_indices << ", no-write " << s.no_write_rows << ", bad in/out " << s.bad_in << "/"
       << s.bad_out << ", fork " << s.fork << ")";
  os << ", extra slots " << s.extra_slots << ", packed " << s.packed_qkv << ", k heads-outer "
     << s.k_heads_outer << ", pad head/batch/slot " << s.pad_head << "/" << s.pad_batch << "/"
     << s.pad_slot;
  if (s.conv_width > 0)
    os << ", conv W=" << s.conv_width << (s.conv_tap_major ? " tap-major" : " channel-major")
       << (s.conv_bias ? " +bias" : " no bias") << " pad " << s.conv_pad;
  if (s.norm) os << ", gated RMSNorm eps " << s.norm_eps;
  os << "]";
  return os.str();
}

int64_t HostCase::state_offset(int64_t s, int64_t h, int64_t i, int64_t j) const {
  const int64_t Dk = spec.dk, Dv = spec.dv;
  const int64_t in_matrix = spec.layout == gdn::Layout::kKV ? i * Dv + j : j * Dk + i;
  return s * slot_stride + h * Dk * Dv + in_matrix;
}

namespace {

std::vector<uint8_t> canary_bytes(int64_t elements, size_t elem) {
  return std::vector<uint8_t>(size_t(std::max<int64_t>(elements, 1)) * elem, kCanary);
}

// Store x rounded to t at element `off`; return the stored value widened.
double put(std::vector<uint8_t>& buf, gdn::DType t, int64_t off, double x) {
  gdn::store_element(buf.data(), t, off, x);
  return gdn::load_element(buf.data(), t, off);
}

void draw_qkv_ab(HostCase& hc, std::mt19937_64& rng) {
  const CaseSpec& s = hc.spec;
  RefProblem& P = hc.ref;
  const int64_t B = s.batch, Hk = s.hk, Hv = s.hv, Dk = s.dk, Dv = s.dv;
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  const bool conv = s.conv_width > 0;
  const int64_t cdim = 2 * Hk * Dk + Hv * Dv;

  // with the conv prologue, q, k and v are the conv's output: x is drawn instead
  P.q.assign(conv ? 0 : size_t(B * Hk * Dk), 0.0);
  P.k.assign(conv ? 0 : size_t(B * Hk * Dk), 0.0);
  P.v.assign(conv ? 0 : size_t(B * Hv * Dv), 0.0);
  if (conv) P.x.assign(size_t(B * cdim), 0.0);
  if (s.norm) P.z.assign(size_t(B * Hv * Dv), 0.0);
  P.a.assign(size_t(B * Hv), 0.0);
  P.b.assign(size_t(B * Hv), 0.0);

  std::vector<uint8_t>& qbuf = s.packed_qkv ? hc.mixed : hc.q;
  std::vector<uint8_t>& kbuf = s.packed_qkv ? hc.mixed : hc.k;
  std::vector<uint8_t>& vbuf = s.packed_qkv ? hc.mixed : hc.v;
  const int64_t k_base = s.packed_qkv ? Hk * Dk : 0;
  const int64_t v_base = s.packed_qkv ? 2 * Hk * Dk : 0;

  std::vector<double> x(static_cast<size_t>(Dk)), y(static_cast<size_t>(Dk));
  for (int64_t row = 0; row < B; ++row) {
    // x ~ N(0, 1): the raw projected row before the conv
    for (int64_t c = 0; conv && c < cdim; ++c)
      P.x[size_t(row * cdim + c)] = put(hc.x, s.qkv, row * hc.x_bs + c, n01(rng));
    for (int64_t hk = 0; !conv && hk < Hk; ++hk) {
      for (int64_t i = 0; i < Dk; ++i) {
        x[size_t(i)] = n01(rng);
        y[size_t(i)] = n01(rng);
      }
      if (s.l2norm == gdn::L2Norm::kNone) {  // q and k arrive normalized
        double xn = 0, yn = 0;
        for (int64_t i = 0; i < Dk; ++i) {
          xn += x[size_t(i)] * x[size_t(i)];
          yn += y[size_t(i)] * y[size_t(i)];
        }
        for (int64_t i = 0; i < Dk; ++i) {
          x[size_t(i)] /= std::sqrt(xn);
          y[size_t(i)] /= std::sqrt(yn);
        }
      }
      if (row == 0 && s.zero_q) std::fill(x.begin(), x.end(), 0.0);
      if (row == 0 && s.tiny_k) {
        double yn = 0;
        for (int64_t i = 0; i < Dk; ++i) yn += y[size_t(i)] * y[size_t(i)];
        for (int64_t i = 0; i < Dk; ++i) y[size_t(i)] *= 0.1 * double(s.eps) / std::sqrt(yn);
      }
      for (int64_t i = 0; i < Dk; ++i) {
        P.q[size_t((row * Hk + hk) * Dk + i)] =
            put(qbuf, s.qkv, row * hc.q_bs + hk * hc.q_hs + i, x[size_t(i)]);
        P.k[size_t((row * Hk + hk) * Dk + i)] =
            put(kbuf, s.qkv, k_base + row * hc.k_bs + hk * hc.k_hs + i, y[size_t(i)]);
      }
    }
    for (int64_t h = 0; !conv && h < Hv; ++h)
      for (int64_t j = 0; j < Dv; ++j)
        P.v[size_t((row * Hv + h) * Dv + j)] =
            put(vbuf, s.qkv, v_base + row * hc.v_bs + h * hc.v_hs + j, n01(rng));
    for (int64_t h = 0; h < Hv; ++h) {
      double av, bv;
      if (s.gate == gdn::Gate::kRaw && s.wide_gates) {
        av = -30.0 + 60.0 * u01(rng);
        bv = -20.0 + 40.0 * u01(rng);
      } else if (s.gate == gdn::Gate::kRaw) {
        av = n01(rng);
        bv = n01(rng);
      } else {
        av = -1e-4 - (5.0 - 1e-4) * u01(rng);  // g ~ U(-5, -1e-4)
        bv = u01(rng);                         // beta ~ U(0, 1)
      }
      P.a[size_t(row * Hv + h)] = put(hc.a, s.ab, row * hc.a_bs + h, av);
      P.b[size_t(row * Hv + h)] = put(hc.b, s.ab, row * hc.b_bs + h, bv);
    }
    // z ~ N(0, 1): the gate of the RMSNorm epilogue
    for (int64_t h = 0; s.norm && h < Hv; ++h)
      for (int64_t j = 0; j < Dv; ++j)
        P.z[size_t((row * Hv + h) * Dv + j)] =
            put(hc.z, s.qkv, row * hc.z_bs + h * hc.z_hs + j, n01(rng));
  }
}

// The steps of make_case, in its order (the draws from rng stay in the same order).

// Strides and storage of every tensor but the pools' contents.
void set_strides_and_storage(HostCase& hc) {
  const CaseSpec& s = hc.spec;
  const int64_t B = s.batch, Hk = s.hk, Hv = s.hv, Dk = s.dk, Dv = s.dv;
  const size_t qe = gdn::dtype_size(s.qkv), abe = gdn::dtype_size(s.ab);

  // ---- strides and storage (gaps hold the canary: NaN)
  const bool conv = s.conv_width > 0;
  const int64_t cdim = 2 * Hk * Dk + Hv * Dv;
  if (conv && (s.conv_width < 2 || s.conv_width > 4))
    throw std::runtime_error("conv_width must be 0, 2, 3 or 4");
  if (conv && (s.packed_qkv || s.k_heads_outer))
    throw std::runtime_error("the conv prologue takes x, not q/k/v storage options");
  if (conv) {
    hc.x_bs = cdim + s.pad_batch;
    hc.x = canary_bytes(B * hc.x_bs, qe);
  } else if (s.packed_qkv) {
    hc.mixed_row = 2 * Hk * Dk + Hv * Dv + s.pad_batch;
    hc.q_bs = hc.k_bs = hc.v_bs = hc.mixed_row;
    hc.q_hs = hc.k_hs = Dk;
    hc.v_hs = Dv;
    hc.mixed = canary_bytes(B * hc.mixed_row, qe);
  } else {
    hc.q_hs = Dk + s.pad_head;
    hc.q_bs = Hk * hc.q_hs + s.pad_batch;
    if (s.k_heads_outer) {
      hc.k_bs = Dk + s.pad_head;
      hc.k_hs = B * hc.k_bs + s.pad_batch;
    } else {
      hc.k_hs = hc.q_hs;
      hc.k_bs = hc.q_bs;
    }
    hc.v_hs = Dv + s.pad_head;
    hc.v_bs = Hv * hc.v_hs + s.pad_batch;
    hc.q = canary_bytes(B * hc.q_bs, qe);
    hc.k = canary_bytes(std::max(B * hc.k_bs, Hk * hc.k_hs), qe);
    hc.v = canary_bytes(B * hc.v_bs, qe);
  }
  hc.a_bs = Hv + s.pad_batch;
  hc.b_bs = Hv + (s.pad_batch ? s.pad_batch + 5 : 0);
  hc.a = canary_bytes(B * hc.a_bs, abe);
  hc.b = canary_bytes(B * hc.b_bs, abe);
  hc.o_hs = Dv + s.pad_head;
  hc.o_bs = Hv * hc.o_hs + s.pad_batch;
  hc.o_bytes = size_t(std::max<int64_t>(B * hc.o_bs, 1)) * gdn::dtype_size(s.out);
  hc.slot_stride = Hv * Dk * Dv + s.pad_slot;
  if (s.norm) {
    hc.z_hs = Dv + s.pad_head;
    hc.z_bs = Hv * hc.z_hs + (s.pad_batch ? s.pad_batch + 3 : 0);
    hc.z = canary_bytes(B * hc.z_bs, qe);
  }
}

// The pool size and the slot indices (the reference's and the stored ones).
void draw_slots(HostCase& hc, std::mt19937_64& rng, std::vector<int64_t>* in_idx_out,
                std::vector<int64_t>* out_idx_out) {
  // ---- slots
  const CaseSpec& s = hc.spec;
  const int64_t B = s.batch;
  std::vector<int64_t>& in_idx = *in_idx_out;
  std::vector<int64_t>& out_idx = *out_idx_out;
  const bool indexed = s.index != gdn::IndexType::kNone;
  hc.num_slots = (indexed && s.out_indices ? 2 * B : B) + s.extra_slots;
  if (hc.num_slots < 1) hc.num_slots = 1;
  const int64_t S = hc.num_slots;
  if (indexed) {
    std::vector<int64_t> perm(static_cast<size_t>(S));
    std::iota(perm.begin(), perm.end(), 0);
    if (s.shuffle_slots) std::shuffle(perm.begin(), perm.end(), rng);
    in_idx.assign(perm.begin(), perm.begin() + B);
    if (s.out_indices) {
      // fresh slots nobody reads; every third row writes in place
      for (int64_t row = 0; row < B; ++row)
        out_idx.push_back(row % 3 == 2 ? in_idx[size_t(row)] : perm[size_t(B + row)]);
    }
    // rows 0, 1 are reserved for the fork; the others get the special roles
    std::vector<int64_t> rows;
    for (int64_t row = (s.fork ? 2 : 0); row < B; ++row) rows.push_back(row);
    std::shuffle(rows.begin(), rows.end(), rng);
    size_t next = 0;
    auto take = [&](int n, const char* what) {
      std::vector<int64_t> got;
      for (int i = 0; i < n; ++i) {
        if (next >= rows.size())
          throw std::runtime_error(std::string("case has too few rows for ") + what);
        got.push_back(rows[next++]);
      }
      return got;
    };
    if (s.fork) {
      if (!s.out_indices || B < 2) throw std::runtime_error("fork needs out_indices and B >= 2");
      in_idx[1] = in_idx[0];
      out_idx[0] = perm[size_t(B)];
      out_idx[1] = perm[size_t(B + 1)];
    }
    const int64_t big = s.index == gdn::IndexType::kI64 ? (int64_t(1) << 40) : int64_t(INT32_MAX);
    for (int64_t row : take(s.padding_rows, "padding rows")) {
      in_idx[size_t(row)] = -1 - int64_t(rng() % 5);
      // a valid write slot on a padding row must still not be written
      if (s.out_indices) out_idx[size_t(row)] = perm[size_t(B + row)];
    }
    for (int64_t row : take(s.bad_in, "bad read indices")) {
      in_idx[size_t(row)] = row % 2 ? S + int64_t(rng() % 100) : big;
      if (s.out_indices) out_idx[size_t(row)] = perm[size_t(B + row)];
    }
    if (s.out_indices) {
      for (int64_t row : take(s.no_write_rows, "no-write rows"))
        out_idx[size_t(row)] = -1 - int64_t(rng() % 3);
      for (int64_t row : take(s.bad_out, "bad write indices"))
        out_idx[size_t(row)] = row % 2 ? S : big;
    }
    const size_t ie = gdn::index_size(s.index);
    auto store = [&](const std::vector<int64_t>& idx, std::vector<uint8_t>& buf) {
      buf.assign(size_t(B) * ie + 1, 0);
      for (int64_t row = 0; row < B; ++row) {
        if (s.index == gdn::IndexType::kI64) {
          std::memcpy(buf.data() + size_t(row) * 8, &idx[size_t(row)], 8);
        } else {
          const int32_t x = int32_t(idx[size_t(row)]);
          std::memcpy(buf.data() + size_t(row) * 4, &x, 4);
        }
      }
    };
    store(in_idx, hc.in_idx);
    if (s.out_indices) store(out_idx, hc.out_idx);
  }
}

// conv prologue: weights, bias and the whole conv pool (random, non-zero)
void draw_conv(HostCase& hc, std::mt19937_64& rng, std::normal_distribution<double>& n01) {
  const CaseSpec& s = hc.spec;
  RefProblem& P = hc.ref;
  const int64_t Hk = s.hk, Hv = s.hv, Dk = s.dk, Dv = s.dv;
  const int64_t cdim = 2 * Hk * Dk + Hv * Dv;
  const size_t qe = gdn::dtype_size(s.qkv);
  const int64_t S = hc.num_slots;
  const int64_t W = s.conv_width, taps = W - 1;
  int64_t span;
  if (s.conv_tap_major) {  // [slot, W-1, conv_dim]
    hc.conv_channel_stride = 1;
    hc.conv_tap_stride = cdim + s.conv_pad;
    span = (taps - 1) * hc.conv_tap_stride + cdim;
  } else {  // [slot, conv_dim, W-1]
    hc.conv_channel_stride = taps + s.conv_pad;
    hc.conv_tap_stride = 1;
    span = (cdim - 1) * hc.conv_channel_stride + taps;
  }
  hc.conv_slot_stride = span + s.pad_slot;
  std::uniform_real_distribution<double> uw(-0.6, 0.6), ub(-0.2, 0.2);
  hc.conv_weight.assign(size_t(cdim * W) * qe, 0);
  P.conv_weight.resize(size_t(cdim * W));
  for (int64_t i = 0; i < cdim * W; ++i)
    P.conv_weight[size_t(i)] = put(hc.conv_weight, s.qkv, i, uw(rng));
  if (s.conv_bias) {
    hc.conv_bias.assign(size_t(cdim) * qe, 0);
    P.conv_bias.resize(size_t(cdim));
    for (int64_t c = 0; c < cdim; ++c) P.conv_bias[size_t(c)] = put(hc.conv_bias, s.qkv, c, ub(rng));
  }
  hc.conv_state = canary_bytes((S - 1) * hc.conv_slot_stride + span, qe);
  hc.conv_pool.assign(size_t(S * cdim * taps), 0.0);
  for (int64_t sl = 0; sl < S; ++sl)
    for (int64_t c = 0; c < cdim; ++c)
      for (int64_t t = 0; t < taps; ++t) {
        double v = n01(rng);
        if (std::fabs(v) < 1e-3) v = v < 0 ? -1e-3 : 1e-3;  // non-zero in every dtype
        hc.conv_pool[size_t(conv_pool_index(P, sl, c, t))] =
            put(hc.conv_state, s.qkv, hc.conv_offset(sl, c, t), v);
      }
}

}  // namespace

HostCase make_case(const CaseSpec& spec) {
  HostCase hc;
  hc.spec = spec;
  const CaseSpec& s = hc.spec;
  const int64_t B = s.batch, Hk = s.hk, Hv = s.hv, Dk = s.dk, Dv = s.dv;
  std::mt19937_64 rng(s.seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::normal_distribution<double> n01(0.0, 1.0);
  const size_t qe = gdn::dtype_size(s.qkv);

  set_strides_and_storage(hc);
  const bool conv = s.conv_width > 0;

  std::vector<int64_t> in_idx, out_idx;
  draw_slots(hc, rng, &in_idx, &out_idx);
  const int64_t S = hc.num_slots;

  // ---- reference problem: sizes and conventions
  RefProblem& P = hc.ref;
  P.B = B;
  P.Hk = Hk;
  P.Hv = Hv;
  P.Dk = Dk;
  P.Dv = Dv;
  P.num_slots = S;
  P.gate = s.gate;
  P.l2norm = s.l2norm;
  P.eps = double(s.eps);
  P.head_map = s.head_map;
  P.scale = s.scale != 0.0f ? double(s.scale) : 1.0 / std::sqrt(double(Dk));
  P.in_idx = in_idx;
  P.out_idx = out_idx;
  P.conv_width = s.conv_width;
  P.norm = s.norm;
  P.norm_eps = double(s.norm_eps);

  // ---- values
  draw_qkv_ab(hc, rng);
  hc.A_log.resize(size_t(Hv));
  hc.dt_bias.resize(size_t(Hv));
  P.A_log.resize(size_t(Hv));
  P.dt_bias.resize(size_t(Hv));
  for (int64_t h = 0; h < Hv; ++h) {
    // A = U(1, 16); dt log-uniform in [1e-3, 0.1]; dt_bias = softplus^-1(dt)
    // wide gates: slow decay rates too, so softplus's two branches both matter
    hc.A_log[size_t(h)] = float(s.wide_gates ? std::log(0.05 + 0.95 * u01(rng))
                                             : std::log(1.0 + 15.0 * u01(rng)));
    const double dt = std::exp(std::log(1e-3) + (std::log(0.1) - std::log(1e-3)) * u01(rng));
    hc.dt_bias[size_t(h)] = float(std::log(std::expm1(dt)));
    P.A_log[size_t(h)] = double(hc.A_log[size_t(h)]);
    P.dt_bias[size_t(h)] = double(hc.dt_bias[size_t(h)]);
  }

  // the whole pool random (unused slots too), gaps between slots canary
  const size_t se = gdn::dtype_size(s.state);
  hc.state = canary_bytes((S - 1) * hc.slot_stride + Hv * Dk * Dv, se);
  hc.pool.assign(size_t(S * Hv * Dk * Dv), 0.0);
  std::normal_distribution<double> n05(0.0, 0.5);
  for (int64_t sl = 0; sl < S; ++sl)
    for (int64_t h = 0; h < Hv; ++h)
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j)
          hc.pool[size_t(pool_index(P, sl, h, i, j))] =
              put(hc.state, s.state, hc.state_offset(sl, h, i, j), n05(rng));

  if (conv) draw_conv(hc, rng, n01);
  // ---- norm epilogue: the per-channel weight
  if (s.norm) {
    std::uniform_real_distribution<double> un(0.5, 1.5);
    hc.norm_weight.assign(size_t(Dv) * qe, 0);
    P.norm_weight.resize(size_t(Dv));
    for (int64_t j = 0; j < Dv; ++j) P.norm_weight[size_t(j)] = put(hc.norm_weight, s.qkv, j, un(rng));
  }
  return hc;
}

void redraw_inputs(HostCase& hc, uint64_t seed) {
  std::mt19937_64 rng(seed);
  draw_qkv_ab(hc, rng);
}

std::vector<double> widen_pool(const HostCase& hc, const std::vector<uint8_t>& state_bytes) {
  const RefProblem& P = hc.ref;
  std::vector<double> pool(static_cast<size_t>(hc.num_slots * P.Hv * P.Dk * P.Dv));
  for (int64_t sl = 0; sl < hc.num_slots; ++sl)
    for (int64_t h = 0; h < P.Hv; ++h)
      for (int64_t i = 0; i < P.Dk; ++i)
        for (int64_t j = 0; j < P.Dv; ++j)
          pool[size_t(pool_index(P, sl, h, i, j))] =
              gdn::load_element(state_bytes.data(), hc.spec.state, hc.state_offset(sl, h, i, j));
  return pool;
}

std::vector<double> widen_conv_pool(const HostCase& hc, const std::vector<uint8_t>& conv_bytes) {
  const RefProblem& P = hc.ref;
  if (P.conv_width <= 0) return {};
  const int64_t cdim = ref_conv_dim(P), taps = P.conv_width - 1;
  std::vector<double> pool(static_cast<size_t>(hc.num_slots * cdim * taps));
  for (int64_t sl = 0; sl < hc.num_slots; ++sl)
    for (int64_t c = 0; c < cdim; ++c)
      for (int64_t t = 0; t < taps; ++t)
        pool[size_t(conv_pool_index(P, sl, c, t))] =
            gdn::load_element(conv_bytes.data(), hc.spec.qkv, hc.conv_offset(sl, c, t));
  return pool;
}

// ---- DeviceCase ----------------------------------------------------------------

DeviceCase::DeviceCase(const HostCase& hc, gdn::Backend be) : backend(be) {
  const CaseSpec& s = hc.spec;
  auto bytes_of = [](const std::vector<float>& f) {
    std::vector<uint8_t> out(f.size() * 4);
    if (!f.empty()) std::memcpy(out.data(), f.data(), out.size());
    return out;
  };
  if (s.conv_width > 0) {
    x = DeviceBuffer(be, hc.x);
    conv_state = DeviceBuffer(be, hc.conv_state);
    conv_weight = DeviceBuffer(be, hc.conv_weight);
    if (s.conv_bias) conv_bias = DeviceBuffer(be, hc.conv_bias);
  } else if (s.packed_qkv) {
    mixed = DeviceBuffer(be, hc.mixed);
  } else {
    q = DeviceBuffer(be, hc.q);
    k = DeviceBuffer(be, hc.k);
    v = DeviceBuffer(be, hc.v);
  }
  a = DeviceBuffer(be, hc.a);
  b = DeviceBuffer(be, hc.b);
  A_log = DeviceBuffer(be, bytes_of(hc.A_log));
  dt_bias = DeviceBuffer(be, bytes_of(hc.dt_bias));
  state = DeviceBuffer(be, hc.state);
  o = DeviceBuffer(be, std::vector<uint8_t>(hc.o_bytes, kCanary));
  counter = DeviceBuffer(be, std::vector<uint8_t>(4, 0));
  if (!hc.in_idx.empty()) in_idx = DeviceBuffer(be, hc.in_idx);
  if (!hc.out_idx.empty()) out_idx = DeviceBuffer(be, hc.out_idx);
  if (s.norm) {
    z = DeviceBuffer(be, hc.z);
    norm_weight = DeviceBuffer(be, hc.norm_weight);
  }

  p.batch = s.batch;
  p.num_k_heads = s.hk;
  p.num_v_heads = s.hv;
  p.head_dim_k = s.dk;
  p.head_dim_v = s.dv;
  p.qkv_dtype = s.qkv;
  if (s.conv_width > 0) {
    // q, k, v stay null: they are the conv's output
    p.conv_width = s.conv_width;
    p.x = x.get();
    p.x_batch_stride = hc.x_bs;
    p.conv_state = conv_state.get();
    p.conv_state_slot_stride = hc.conv_slot_stride;
    p.conv_state_channel_stride = hc.conv_channel_stride;
    p.conv_state_tap_stride = hc.conv_tap_stride;
    p.conv_weight = conv_weight.get();
    p.conv_bias = conv_bias.get();
  } else if (s.packed_qkv) {
    gdn::set_packed_qkv(p, mixed.get(), hc.mixed_row);
  } else {
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.q_batch_stride = hc.q_bs;
    p.q_head_stride = hc.q_hs;
    p.k_batch_stride = hc.k_bs;
    p.k_head_stride = hc.k_hs;
    p.v_batch_stride = hc.v_bs;
    p.v_head_stride = hc.v_hs;
  }
  p.gate = s.gate;
  p.ab_dtype = s.ab;
  p.a = a.get();
  p.b = b.get();
  p.a_batch_stride = hc.a_bs;
  p.b_batch_stride = hc.b_bs;
  if (!s.null_gate_params) {
    p.A_log = A_log.as<float>();
    p.dt_bias = dt_bias.as<float>();
  }
  p.layout = s.layout;
  p.state_dtype = s.state;
  p.state = state.get();
  p.state_slot_stride = hc.slot_stride;
  p.num_slots = hc.num_slots;
  p.index_dtype = s.index;
  p.state_indices = in_idx.get();
  p.state_out_indices = out_idx.get();
  p.invalid_index_count = s.counter ? counter.as<uint32_t>() : nullptr;
  p.o_dtype = s.out;
  p.o = o.get();
  p.o_batch_stride = hc.o_bs;
  p.o_head_stride = hc.o_hs;
  p.scale = s.scale;
  p.l2norm = s.l2norm;
  p.l2norm_eps = s.eps;
  p.head_map = s.head_map;
  if (s.norm) {
    p.z = z.get();
    p.z_batch_stride = hc.z_bs;
    p.z_head_stride = hc.z_hs;
    p.norm_weight = norm_weight.get();
    p.norm_eps = s.norm_eps;
  }
  p.stream = nullptr;
}

void DeviceCase::upload_inputs(const HostCase& hc) {
  if (hc.spec.norm) z.upload(hc.z);
  if (hc.spec.conv_width > 0) {
    x.upload(hc.x);
  } else if (hc.spec.packed_qkv) {
    mixed.upload(hc.mixed);
  } else {
    q.upload(hc.q);
    k.upload(hc.k);
    v.upload(hc.v);
  }
  a.upload(hc.a);
  b.upload(hc.b);
}

gdn::Status DeviceCase::run() {
  gdn::Status st = gdn::decode(p, backend);
  if (!st.ok()) return st;
  return gdn::backend_ops(backend)->synchronize(p.stream);
}

// ---- checking -------------------------------------------------------------------

void check_step(const HostCase& hc, const RefResult& R, const std::vector<uint8_t>& o_bytes,
                const std::vector<uint8_t>& state_before, const std::vector<uint8_t>& state_after,
                uint32_t counter, double out_tol, double st_tol) {
  if (hc.spec.conv_width > 0)
    ADD_FAILURE() << "a conv case must be checked with its conv pool (the check_step overload "
                     "taking conv_before / conv_after)";
  check_step(hc, R, o_bytes, state_before, state_after, {}, {}, counter, out_tol, st_tol);
}

namespace {

// The whole conv pool, bitwise: `want` is conv_before with the reference's
// windows stored into the written slots; any other difference is a stray write.
void check_conv_pool(const HostCase& hc, const RefResult& R, const std::vector<uint8_t>& conv_before,
                     const std::vector<uint8_t>& conv_after) {
  const CaseSpec& s = hc.spec;
  const RefProblem& P = hc.ref;
  const int64_t cdim = ref_conv_dim(P), taps = P.conv_width - 1;
  const size_t qe = gdn::dtype_size(s.qkv);
  if (conv_after.size() != conv_before.size()) {
    ADD_FAILURE() << "conv pool: " << conv_after.size() << " bytes after the step, "
                  << conv_before.size() << " before";
    return;
  }
  std::vector<uint8_t> want = conv_before;
  for (int64_t sl = 0; sl < hc.num_slots; ++sl) {
    if (!R.slot_written[size_t(sl)]) continue;
    for (int64_t c = 0; c < cdim; ++c)
      for (int64_t t = 0; t < taps; ++t)
        gdn::store_element(want.data(), s.qkv, hc.conv_offset(sl, c, t),
                           R.conv_pool[size_t(conv_pool_index(P, sl, c, t))]);
  }
  int64_t diff = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != conv_after[i] && diff++ == 0) first = int64_t(i);
  if (diff == 0) return;
  // name the first differing element: (slot, channel, tap), or a gap
  const int64_t e = first / int64_t(qe);
  const int64_t sl = e / hc.conv_slot_stride, rem = e % hc.conv_slot_stride;
  int64_t c, t;
  if (s.conv_tap_major) {
    t = rem / hc.conv_tap_stride;
    c = rem % hc.conv_tap_stride;
  } else {
    c = rem / hc.conv_channel_stride;
    t = rem % hc.conv_channel_stride;
  }
  const bool gap = sl >= hc.num_slots || c >= cdim || t >= taps;
  std::ostringstream os;
  os << diff << " bytes of the conv pool differ from the expected pool; first at element " << e;
  if (gap) {
    os << " (a stride gap of slot " << sl << ", which nobody writes)";
  } else {
    os << " = conv_state[slot=" << sl << ",c=" << c << ",t=" << t << "] (slot "
       << (R.slot_written[size_t(sl)] ? "written by the step" : "nobody writes") << ")";
  }
  os << ": got " << gdn::load_element(conv_after.data(), s.qkv, e) << ", expected "
     << gdn::load_element(want.data(), s.qkv, e) << ", before the step "
     << gdn::load_element(conv_before.data(), s.qkv, e);
  ADD_FAILURE() << os.str();
}

}  // namespace

void check_step(const HostCase& hc, const RefResult& R, const std::vector<uint8_t>& o_bytes,
                const std::vector<uint8_t>& state_before, const std::vector<uint8_t>& state_after,
                const std::vector<uint8_t>& conv_before, const std::vector<uint8_t>& conv_after,
                uint32_t counter, double out_tol, double st_tol) {
  const CaseSpec& s = hc.spec;
  const RefProblem& P = hc.ref;
  const int64_t B = P.B, Hv = P.Hv, Dk = P.Dk, Dv = P.Dv;
  if (out_tol < 0) out_tol = output_tol(s.out);
  if (st_tol < 0) st_tol = state_tol(s.state);

  // ---- output: padding rows exactly zero, the rest within tolerance
  const size_t oe = gdn::dtype_size(s.out);
  std::vector<char> o_mask(o_bytes.size(), 0);
  std::vector<double> got, want;
  std::vector<int64_t> where;  // flat (b, h, j) of each compared element
  int64_t nonzero_padding = 0;
  std::string first_nonzero;
  for (int64_t row = 0; row < B; ++row)
    for (int64_t h = 0; h < Hv; ++h)
      for (int64_t j = 0; j < Dv; ++j) {
        const int64_t off = hc.o_offset(row, h, j);
        std::fill(o_mask.begin() + off * int64_t(oe), o_mask.begin() + (off + 1) * int64_t(oe), 1);
        const double x = gdn::load_element(o_bytes.data(), s.out, off);
        if (R.row_padding[size_t(row)]) {
          if (!(x == 0.0) && nonzero_padding++ == 0)
            first_nonzero = "o[b=" + std::to_string(row) + ",h=" + std::to_string(h) +
                            ",j=" + std::to_string(j) + "] = " + std::to_string(x);
        } else {
          got.push_back(x);
          want.push_back(R.o[size_t((row * Hv + h) * Dv + j)]);
          where.push_back((row * Hv + h) * Dv + j);
        }
      }
  EXPECT_EQ(nonzero_padding, 0) << "padding rows must be written as zeros; first: " << first_nonzero;
  auto o_name = [&](int64_t i) {
    const int64_t f = where[size_t(i)];
    return "o[b=" + std::to_string(f / (Hv * Dv)) + ",h=" + std::to_string(f / Dv % Hv) +
           ",j=" + std::to_string(f % Dv) + "]";
  };
  EXPECT_TRUE(expect_close("output (" + std::string(gdn::to_string(s.out)) + ")", got, want,
                           out_tol, o_name));
  int64_t o_gap_writes = 0, first_gap = -1;
  for (size_t i = 0; i < o_bytes.size(); ++i)
    if (!o_mask[i] && o_bytes[i] != kCanary && o_gap_writes++ == 0) first_gap = int64_t(i);
  EXPECT_EQ(o_gap_writes, 0) << "bytes of o outside (B, Hv, Dv) were written; first at byte "
                             << first_gap;

  // ---- state: written slots within tolerance, every other byte unchanged
  const size_t se = gdn::dtype_size(s.state);
  std::vector<char> s_mask(state_after.size(), 0);
  std::vector<double> sgot, swant;
  std::vector<int64_t> swhere;
  for (int64_t sl = 0; sl < hc.num_slots; ++sl) {
    if (!R.slot_written[size_t(sl)]) continue;
    for (int64_t h = 0; h < Hv; ++h)
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) {
          const int64_t off = hc.state_offset(sl, h, i, j);
          std::fill(s_mask.begin() + off * int64_t(se), s_mask.begin() + (off + 1) * int64_t(se),
                    1);
          sgot.push_back(gdn::load_element(state_after.data(), s.state, off));
          swant.push_back(R.pool[size_t(pool_index(P, sl, h, i, j))]);
          swhere.push_back(pool_index(P, sl, h, i, j));
        }
  }
  auto s_name = [&](int64_t idx) {
    const int64_t f = swhere[size_t(idx)];
    return "state[slot=" + std::to_string(f / (Hv * Dk * Dv)) + ",h=" +
           std::to_string(f / (Dk * Dv) % Hv) + ",i=" + std::to_string(f / Dv % Dk) +
           ",j=" + std::to_string(f % Dv) + "]";
  };
  EXPECT_TRUE(expect_close("new state (" + std::string(gdn::to_string(s.state)) + ")", sgot, swant,
                           st_tol, s_name));
  int64_t changed = 0, first_changed = -1;
  for (size_t i = 0; i < state_after.size(); ++i)
    if (!s_mask[i] && state_after[i] != state_before[i] && changed++ == 0)
      first_changed = int64_t(i);
  if (changed) {
    const int64_t elem = first_changed / int64_t(se);
    ADD_FAILURE() << changed << " bytes of the pool that no row writes changed; first at element "
                  << elem << " (slot " << elem / hc.slot_stride << ", offset in slot "
                  << elem % hc.slot_stride << ")";
  }

  // ---- the report of out-of-range indices
  if (s.counter) {
    EXPECT_EQ(int64_t(counter), R.invalid) << "invalid_index_count";
  }

  // ---- the conv pool: pure data movement, checked bitwise
  if (s.conv_width > 0 && !(conv_before.empty() && conv_after.empty()))
    check_conv_pool(hc, R, conv_before, conv_after);
}

void run_and_check(const CaseSpec& spec, gdn::Backend backend, bool allow_unsupported) {
  SCOPED_TRACE(describe(spec));
  HostCase hc = make_case(spec);
  DeviceCase dc(hc, backend);
  const gdn::Status st = dc.run();
  if (allow_unsupported && st.code == gdn::StatusCode::kUnsupported) {
    const std::vector<uint8_t> o_bytes = dc.o.download();
    const std::vector<uint8_t> state_after = dc.state.download();
    const std::vector<uint8_t> conv_after =
        spec.conv_width > 0 ? dc.conv_state.download() : std::vector<uint8_t>();
    std::printf("  %s: unsupported on %s (%s)\n", spec.name.c_str(), gdn::to_string(backend),
                st.message);
    EXPECT_TRUE(state_after == hc.state) << "kUnsupported, but the pool changed";
    EXPECT_TRUE(conv_after == hc.conv_state) << "kUnsupported, but the conv pool changed";
    EXPECT_TRUE(o_bytes == std::vector<uint8_t>(hc.o_bytes, kCanary))
        << "kUnsupported, but o was written";
    return;
  }
  ASSERT_TRUE(st.ok()) << gdn::to_string(st.code) << ": " << st.message;
  check_device_case(hc, dc);
}

void check_device_case(const HostCase& hc, const DeviceCase& dc) {
  uint32_t counter = 0;
  const std::vector<uint8_t> c = dc.counter.download();
  std::memcpy(&counter, c.data(), 4);
  const RefResult R = reference_step(hc.ref, hc.pool, hc.conv_pool);
  if (hc.spec.conv_width > 0)
    check_step(hc, R, dc.o.download(), hc.state, dc.state.download(), hc.conv_state, dc.conv_state.download(),
               counter);
  else
    check_step(hc, R, dc.o.download(), hc.state, dc.state.download(), counter);
}

}  // namespace gdn_test
