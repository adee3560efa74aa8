// The one rule about slots that validate() cannot check: it needs the index
// values, so it runs only where they are host memory (the host backend; any
// caller holding host copies of its indices may call it too).
//
// Rows run concurrently on a GPU, so a slot that one row writes must be
// touched by no other row of the call: two writers, or a writer and a reader,
// race and leave an unspecified state. Rows may share a slot they only read.
#include <string>
#include <unordered_map>

#include "gdnkit/gdnkit.hpp"

namespace gdn {
namespace {

int64_t index_at(const void* base, IndexType t, int64_t i) {
  return t == IndexType::kI64 ? static_cast<const int64_t*>(base)[i]
                              : int64_t(static_cast<const int32_t*>(base)[i]);
}

}  // namespace

Status check_slot_conflicts(const DecodeParams& p) {
  if (p.index_dtype == IndexType::kNone || p.batch <= 1) return Status::success();
  const char* write_name = p.state_out_indices ? "state_out_indices" : "state_indices";
  const void* write_idx = p.state_out_indices ? p.state_out_indices : p.state_indices;
  auto in_pool = [&](int64_t s) { return s >= 0 && s < p.num_slots; };

  // slot -> the one row that writes it (rows whose read slot is padding or out
  // of range write nothing, as in every backend).
  std::unordered_map<int64_t, int64_t> writer;
  writer.reserve(size_t(p.batch) * 2);
  for (int64_t b = 0; b < p.batch; ++b) {
    if (!in_pool(index_at(p.state_indices, p.index_dtype, b))) continue;
    const int64_t w = index_at(write_idx, p.index_dtype, b);
    if (!in_pool(w)) continue;
    const auto [it, fresh] = writer.emplace(w, b);
    if (!fresh)
      return make_status(StatusCode::kInvalidArgument,
                         "%s: rows %lld and %lld both write slot %lld (a slot written in a call "
                         "must belong to one row; padding rows use -1)",
                         write_name, (long long)it->second, (long long)b, (long long)w);
  }
  if (p.state_out_indices == nullptr) return Status::success();  // in place: reads = writes
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t r = index_at(p.state_indices, p.index_dtype, b);
    if (!in_pool(r)) continue;
    const auto it = writer.find(r);
    if (it != writer.end() && it->second != b)
      return make_status(StatusCode::kInvalidArgument,
                         "state_indices: row %lld reads slot %lld, which row %lld writes "
                         "(state_out_indices) in the same call",
                         (long long)b, (long long)r, (long long)it->second);
  }
  return Status::success();
}

}  // namespace gdn
