// The one rule about slots that validate() cannot check: it needs the index
// values, so it runs only where they are host memory (the host backend; any
// caller holding host copies of its indices may call it too).
//
// Rows run concurrently on a GPU, so a slot that one row writes must be
// touched by no other row of the call: two writers, or a writer and a reader,
// race and leave an unspecified state. Rows may share a slot they only read,
// and a row may write the slot it read itself (its state is read before it
// writes). Multi-token calls write every per-token slot of a row.
#include <unordered_map>
#include <vector>

#include "gdnkit/gdnkit.hpp"

namespace gdn {
namespace {

int64_t index_at(const void* base, IndexType t, int64_t i) {
  return t == IndexType::kI64 ? static_cast<const int64_t*>(base)[i]
                              : int64_t(static_cast<const int32_t*>(base)[i]);
}

// The slots row b reads and writes, as every backend resolves them
// (docs/operation.md); out-of-pool entries are dropped (nothing touched).
struct RowSlots {
  int64_t read{-1};
  std::vector<int64_t> writes;
  const char* write_name{"state_indices"};
};

RowSlots row_slots(const DecodeParams& p, int64_t b) {
  RowSlots r;
  const IndexType it = p.index_dtype;
  auto in_pool = [&](int64_t s) { return s >= 0 && s < p.num_slots ? s : -1; };
  int64_t tokens = p.num_tokens;
  if (p.cu_seqlens != nullptr) {
    const int64_t lo = index_at(p.cu_seqlens, it, b), hi = index_at(p.cu_seqlens, it, b + 1);
    if (lo < 0 || hi < lo || hi > p.total_tokens || hi - lo > p.num_tokens) return r;  // untouched
    tokens = hi - lo;
  }
  if (p.state_indices != nullptr) {
    r.read = in_pool(index_at(p.state_indices, it, b));
  } else if (p.token_state_indices != nullptr) {
    const int64_t n = p.num_accepted_tokens ? index_at(p.num_accepted_tokens, it, b) : 1;
    if (n >= 1 && n <= p.num_tokens)
      r.read = in_pool(index_at(p.token_state_indices, it, b * p.token_state_indices_stride + n - 1));
  } else {
    r.read = b;
  }
  if (r.read < 0 || tokens == 0) return r;  // padding: nothing written
  if (p.token_state_indices != nullptr) {
    r.write_name = "token_state_indices";
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t s = in_pool(index_at(p.token_state_indices, it, b * p.token_state_indices_stride + t));
      if (s >= 0) r.writes.push_back(s);
    }
    if (p.state_out_indices != nullptr) {  // the final state besides
      const int64_t s = in_pool(index_at(p.state_out_indices, it, b));
      if (s >= 0) r.writes.push_back(s);
    }
  } else if (p.update_state) {
    if (p.state_out_indices != nullptr) {
      r.write_name = "state_out_indices";
      const int64_t s = in_pool(index_at(p.state_out_indices, it, b));
      if (s >= 0) r.writes.push_back(s);
    } else {
      r.writes.push_back(r.read);
    }
  }
  return r;
}

}  // namespace

Status check_slot_conflicts(const DecodeParams& p) {
  if (p.batch <= 1 || (p.index_dtype == IndexType::kNone)) return Status::success();
  std::vector<RowSlots> rows(size_t(p.batch));
  // slot -> the one row that writes it
  std::unordered_map<int64_t, int64_t> writer;
  writer.reserve(size_t(p.batch) * size_t(p.num_tokens) * 2);
  for (int64_t b = 0; b < p.batch; ++b) {
    rows[size_t(b)] = row_slots(p, b);
    for (const int64_t w : rows[size_t(b)].writes) {
      const auto [it, fresh] = writer.emplace(w, b);
      if (!fresh && it->second != b)
        return make_status(StatusCode::kInvalidArgument,
                           "%s: rows %lld and %lld both write slot %lld (a slot written in a call "
                           "must belong to one row; padding rows use -1)",
                           rows[size_t(b)].write_name, (long long)it->second, (long long)b, (long long)w);
    }
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t r = rows[size_t(b)].read;
    if (r < 0) continue;
    const auto it = writer.find(r);
    if (it != writer.end() && it->second != b)
      return make_status(StatusCode::kInvalidArgument,
                         "%s: row %lld reads slot %lld, which row %lld writes (%s) in the same call",
                         p.state_indices ? "state_indices" : "token_state_indices", (long long)b,
                         (long long)r, (long long)it->second, rows[size_t(it->second)].write_name);
  }
  return Status::success();
}

}  // namespace gdn
