// gdnkit tests — random decode cases: generate, store, run on a backend, check.
//
// A CaseSpec names every option of the API. make_case() draws the inputs from
// realistic ranges with the CaseSpec's seed, stores them in their dtypes and
// strided layouts (gaps filled with NaN so a stray read shows), and widens
// the stored values back into the logical arrays the reference sees.
// DeviceCase copies a case to a backend and fills DecodeParams;
// check_step() compares what came back with the reference.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "reference.hpp"
#include "test_util.hpp"

namespace gdn_test {

struct CaseSpec {
  std::string name;
  uint64_t seed{1};
  int64_t batch{2};
  int32_t hk{1}, hv{2}, dk{64}, dv{64};
  gdn::DType qkv{gdn::DType::kBF16};
  gdn::DType ab{gdn::DType::kBF16};
  gdn::DType state{gdn::DType::kF32};
  gdn::DType out{gdn::DType::kBF16};
  gdn::Layout layout{gdn::Layout::kVK};
  gdn::L2Norm l2norm{gdn::L2Norm::kRsqrt};
  float eps{1e-6f};
  gdn::HeadMap head_map{gdn::HeadMap::kInterleaved};
  gdn::Gate gate{gdn::Gate::kRaw};
  bool null_gate_params{false};  // precomputed gate with A_log = dt_bias = nullptr
  float scale{0.0f};             // 0: default Dk^-0.5

  // ---- slots
  gdn::IndexType index{gdn::IndexType::kNone};
  int64_t extra_slots{0};   // pool slots nobody reads or writes
  bool shuffle_slots{false};  // read slots out of order
  int padding_rows{0};      // rows with a negative read index
  bool out_indices{false};  // a separate write index array
  int no_write_rows{0};     // rows with a negative write index (needs out_indices)
  int bad_in{0};            // read indices >= num_slots
  int bad_out{0};           // write indices >= num_slots (needs out_indices)
  bool fork{false};         // rows 0 and 1 read one slot and write two others (needs out_indices)
  bool counter{true};       // pass invalid_index_count

  // ---- storage
  bool packed_qkv{false};    // one mixed_qkv buffer through gdn::set_packed_qkv
  bool k_heads_outer{false};  // k stored (Hk, B, Dk): head stride >= B * batch stride
  int64_t pad_head{0};       // extra elements between heads (q, k, v, o)
  int64_t pad_batch{0};      // extra elements between rows (all per-row tensors)
  int64_t pad_slot{0};       // extra elements between pool slots

  // ---- input values
  bool tiny_k{false};  // row 0's k has norm 0.1*eps (max_norm's eps branch)
  bool zero_q{false};  // row 0's q is all zero
  bool wide_gates{false};  // raw a ~ U(-30, 30), b ~ U(-20, 20), A = U(0.05, 1):
                           // both softplus branches, exp(g) down to 0, beta near 0 and 1

  // ---- conv1d prologue (q, k, v come from x through the conv; not with packed_qkv
  // or k_heads_outer). x rows use pad_batch, conv pool slots pad_slot.
  int32_t conv_width{0};        // W in {2, 3, 4}; 0 = no prologue
  bool conv_tap_major{false};   // conv pool [slot, W-1, conv_dim] (else [slot, conv_dim, W-1])
  bool conv_bias{false};        // pass a conv bias
  int64_t conv_pad{0};          // extra elements on the conv pool's outer stride inside a
                                // slot (channel stride, or tap stride when tap-major)

  // ---- gated RMSNorm epilogue (z rows use pad_batch + 3 when pad_batch, heads pad_head)
  bool norm{false};
  float norm_eps{1e-6f};
};

// Short description of the options, for failure messages.
std::string describe(const CaseSpec& s);

struct HostCase {
  CaseSpec spec;
  RefProblem ref;            // logical inputs, widened from storage
  std::vector<double> pool;  // logical pool before the step (num_slots, Hv, Dk, Dv)
  int64_t num_slots{0};

  // storage, exactly what goes to the backend
  std::vector<uint8_t> q, k, v, mixed, a, b, state, in_idx, out_idx;
  std::vector<float> A_log, dt_bias;
  size_t o_bytes{0};
  // conv prologue and norm epilogue (qkv dtype), empty when off
  std::vector<uint8_t> x, conv_state, conv_weight, conv_bias, z, norm_weight;
  std::vector<double> conv_pool;  // logical conv pool before the step (num_slots, conv_dim, W-1)

  // element strides of the storage
  int64_t q_bs{0}, q_hs{0}, k_bs{0}, k_hs{0}, v_bs{0}, v_hs{0};
  int64_t mixed_row{0};
  int64_t a_bs{0}, b_bs{0}, o_bs{0}, o_hs{0}, slot_stride{0};
  int64_t x_bs{0}, z_bs{0}, z_hs{0};
  int64_t conv_slot_stride{0}, conv_channel_stride{0}, conv_tap_stride{0};

  int64_t o_offset(int64_t row, int64_t h, int64_t j) const { return row * o_bs + h * o_hs + j; }
  int64_t state_offset(int64_t s, int64_t h, int64_t i, int64_t j) const;
  // element (slot, channel, tap) of the stored conv pool; tap 0 is the oldest
  int64_t conv_offset(int64_t s, int64_t c, int64_t t) const {
    return s * conv_slot_stride + c * conv_channel_stride + t * conv_tap_stride;
  }
};

HostCase make_case(const CaseSpec& spec);

// Draw fresh q, k, v, a, b (x instead of q, k, v with the conv; z with the
// norm) and nothing else, for step `step` of a chained run.
void redraw_inputs(HostCase& hc, uint64_t seed);

// The pool as the backend stores it -> logical float64 (num_slots, Hv, Dk, Dv).
std::vector<double> widen_pool(const HostCase& hc, const std::vector<uint8_t>& state_bytes);

// The conv pool as the backend stores it -> logical float64 (num_slots, conv_dim, W-1).
std::vector<double> widen_conv_pool(const HostCase& hc, const std::vector<uint8_t>& conv_bytes);

// A case on a backend.
struct DeviceCase {
  DeviceCase(const HostCase& hc, gdn::Backend backend);
  // Copy new inputs (q, k, v, a, b; x, z) after redraw_inputs; the pools stay.
  void upload_inputs(const HostCase& hc);
  // decode() then synchronize; returns decode's status.
  gdn::Status run();

  gdn::Backend backend;
  DeviceBuffer q, k, v, mixed, a, b, A_log, dt_bias, state, o, in_idx, out_idx, counter;
  DeviceBuffer x, conv_state, conv_weight, conv_bias, z, norm_weight;  // when the CaseSpec has them
  gdn::DecodeParams p;
};

// Fill with 0xFF: NaN in fp32, fp16 and bf16 alike.
constexpr uint8_t kCanary = 0xFF;

// Check one step's results against the reference R:
//  - rows the reference treats as padding: output exactly zero;
//  - other rows: relative L2 of o within docs/operation.md, Numerics (by o dtype);
//  - written slots: relative L2 of the state within docs/operation.md, Numerics (by state dtype);
//  - every other byte of o (stride gaps) still the canary, every other byte of
//    the pool bitwise equal to `state_before`;
//  - the invalid-index counter equals the out-of-range indices;
//  - with the conv prologue: the whole conv pool bitwise (it is pure data
//    movement): written slots hold the shifted windows exactly, every other
//    byte (slots nobody writes, stride gaps) equals `conv_before`.
// out_tol / st_tol < 0 select the bound of docs/operation.md, Numerics.
void check_step(const HostCase& hc, const RefResult& R, const std::vector<uint8_t>& o_bytes,
                const std::vector<uint8_t>& state_before, const std::vector<uint8_t>& state_after,
                const std::vector<uint8_t>& conv_before, const std::vector<uint8_t>& conv_after,
                uint32_t counter, double out_tol = -1, double st_tol = -1);
// The same for a case without the conv prologue (a conv case fails here: its
// conv pool must be checked).
void check_step(const HostCase& hc, const RefResult& R, const std::vector<uint8_t>& o_bytes,
                const std::vector<uint8_t>& state_before, const std::vector<uint8_t>& state_after,
                uint32_t counter, double out_tol = -1, double st_tol = -1);

// What dc holds after its call (o, the pools, the invalid-index counter)
// against the reference of hc, through check_step (the conv pool too when
// the case has the conv).
void check_device_case(const HostCase& hc, const DeviceCase& dc);

// make_case -> DeviceCase -> run -> reference -> check_step, all in one.
// With allow_unsupported, a kUnsupported answer passes when nothing was written.
void run_and_check(const CaseSpec& spec, gdn::Backend backend, bool allow_unsupported = false);

}  // namespace gdn_test
