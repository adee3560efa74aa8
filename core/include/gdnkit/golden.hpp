// gdnkit — golden files: the safetensors case format, read, run and compare.
//
// One case per file (docs/golden-format.md). Used by `gdn verify` and the
// tests of every backend. Lives in the gdnkit_golden library, apart from the
// kernel library; both are build-tree only: `cmake --install` installs
// neither this header nor that library (anyone checking their own kernel
// reads the format of docs/golden-format.md, or runs `gdn verify`).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gdnkit/gdnkit.hpp"

namespace gdn {
namespace golden {

// ---- safetensors -----------------------------------------------------------
// dtype names as safetensors spells them: "F64", "F32", "F16", "BF16", "I64", "I32", ...
struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, row-major
  int64_t numel() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::map<std::string, Tensor> tensors;
};

// On failure: false, and `error` names the file and the problem
// ("case.safetensors: header length 912 runs past the end of the 400-byte file").
bool read_safetensors(const std::string& path, SafetensorsFile* out, std::string* error);
bool write_safetensors(const std::string& path, const SafetensorsFile& file, std::string* error);

// ---- a decode case ---------------------------------------------------------
// Inputs exactly as stored in the file (host memory), plus the expected results
// widened to double. `params` holds sizes, dtypes, conventions and strides for
// dense host buffers; its pointers are left null: run_case() points them at
// the backend's copies.
//
// Format version 2 adds two optional stages (params.conv_width > 0: the conv1d
// prologue, x instead of q/k/v; norm_weight present: the gated RMSNorm
// epilogue). Their inputs are in params.qkv_dtype; the conv state pool is kept
// as stored (channel-major (S, conv_dim, W-1) or tap-major (S, W-1, conv_dim)),
// and params' conv_state_* strides describe that layout.
struct Case {
  std::string path;
  DecodeParams params;
  bool packed_qkv{false};             // the file had mixed_qkv rather than q, k, v
  std::vector<uint8_t> q, k, v;       // when !packed_qkv, dense (B, Hk, Dk) / (B, Hv, Dv)
  std::vector<uint8_t> mixed_qkv;     // when packed_qkv, (B, 2*Hk*Dk + Hv*Dv)
  // conv prologue (params.conv_width > 0; q, k, v and mixed_qkv are then empty)
  std::vector<uint8_t> x;             // (B, conv_dim)
  std::vector<uint8_t> conv_state;    // the whole conv pool, as stored
  std::vector<uint8_t> conv_weight;   // (conv_dim, W)
  std::vector<uint8_t> conv_bias;     // (conv_dim), may be empty
  bool conv_tap_major{false};         // conv_state is (S, W-1, conv_dim) rather than (S, conv_dim, W-1)
  // gated RMSNorm epilogue (both empty when the case has none)
  std::vector<uint8_t> z;             // (B, Hv, Dv)
  std::vector<uint8_t> norm_weight;   // (Dv)
  std::vector<uint8_t> a, b;          // (B, Hv) in params.ab_dtype
  std::vector<float> A_log, dt_bias;  // (Hv); empty when the gate is precomputed and absent
  std::vector<uint8_t> state;         // (num_slots, Hv, Dk, Dv) or (.., Dv, Dk), params.state_dtype
  std::vector<uint8_t> state_indices, state_out_indices;  // (B) in params.index_dtype, may be empty
  std::vector<double> expected_o;      // (B, Hv, Dv)
  std::vector<double> expected_state;  // same element count as state
  std::vector<double> expected_conv_state;  // same element count as conv_state (conv cases only)
  int64_t expected_invalid_indices{-1};  // from metadata "invalid_indices" when present, else -1

  // Format version 3 (params.num_tokens = T, update_state): every per-token
  // tensor above (q, k, v, mixed_qkv, x, a, b, z, expected_o) holds
  // token_rows() rows: (B, T, ...) dense, or (total_tokens, ...) packed by
  // cu_seqlens. Index arrays in params.index_dtype; empty when absent.
  std::vector<uint8_t> cu_seqlens;            // (B + 1)
  std::vector<uint8_t> token_state_indices;   // (B, T)
  std::vector<uint8_t> num_accepted_tokens;   // (B)
  // Every token's state (B, T, one slot) and conv state (B, T, one conv slot),
  // as the layouts of state and conv_state; NaN where nothing is compared
  // (tokens a row does not have, padding rows). Empty: no buffer is kept.
  std::vector<double> expected_intermediate_states;
  std::vector<double> expected_intermediate_conv_states;

  // A multi-token case (params' pointers are null until run_case sets them,
  // so the arrays this Case holds are asked too).
  bool multi_token() const {
    return is_multi_token(params) || !cu_seqlens.empty() || !token_state_indices.empty() ||
           !expected_intermediate_states.empty() || !expected_intermediate_conv_states.empty();
  }
  // Rows of the per-token tensors.
  int64_t token_rows() const {
    return cu_seqlens.empty() ? params.batch * params.num_tokens : params.total_tokens;
  }
};

// Reads and checks a case: every tensor present with the right shape and a
// supported dtype, metadata values known. On failure: false with a message
// naming the file, the tensor or key, and the problem.
bool load_case(const std::string& path, Case* out, std::string* error);

// ---- running and comparing -------------------------------------------------
// The tolerances on the relative L2 error (docs/operation.md, Numerics), by the dtype a result is stored in.
double output_tolerance(DType t);  // fp32 1e-5, fp16 2e-3, bf16 1e-2
double state_tolerance(DType t);   // fp32 1e-5, fp16 2e-3, bf16 8e-3

struct Comparison {
  double rel_l2{0};          // ||x - ref|| / ||ref||  (||x - ref|| when ref is all zero)
  double worst_abs{0};       // largest |x - ref|
  int64_t worst_index{-1};   // flat index of that element
  double worst_expected{0};
  double worst_got{0};
  double tolerance{0};
  int64_t exact_mismatches{0};  // elements that had to match bitwise and did not
  bool pass{false};
};

// Compare `got` with `expected`: relative L2 within `tolerance`, and every
// element whose expected value is exactly what it was before the call
// (`unchanged`, may be null) must come back bitwise unchanged.
Comparison compare(const std::vector<double>& got, const std::vector<double>& expected,
                   double tolerance, const std::vector<double>* unchanged = nullptr);

struct CaseReport {
  std::string path;
  bool pass{false};
  std::string error;  // load, validation or backend failure; empty otherwise
  Comparison o, state;
  // The conv state pool after the step (conv cases only): pure data movement,
  // so every element must match bitwise (tolerance 0; exact_mismatches counts
  // the elements that differ).
  bool has_conv_state{false};
  Comparison conv_state;
  // Format version 3: the per-token state buffers (compared where expected is not NaN).
  bool has_intermediate{false}, has_intermediate_conv{false};
  Comparison intermediate, intermediate_conv;
  bool unsupported{false};       // the backend refused the case as kUnsupported (error says why)
  uint32_t invalid_reported{0};  // out-of-range indices the backend counted
  std::string notes;             // what the case exercised, for the printed line
};

// Copy the case into `backend`'s memory, run decode(), copy back, compare.
CaseReport run_case(const Case& c, Backend backend);

// Every *.safetensors under `dir`, sorted, recursively.
std::vector<std::string> list_cases(const std::string& dir);

}  // namespace golden
}  // namespace gdn
