// safetensors reader and writer for the golden files.
//
// File: u64 little-endian header length N | N bytes of JSON | data buffer.
// Golden files come from anywhere (other engines, hand edits, truncated
// downloads), so the reader trusts nothing: every length is checked against
// the real file size before anything is allocated, the JSON is parsed without
// letting an exception escape, and every tensor's offsets must fit the buffer
// and match dtype size x product(shape). Overlapping tensors are allowed (the
// format does not forbid them and they are harmless to a reader).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "gdnkit/golden.hpp"
#include "printable.hpp"

namespace gdn {
namespace golden {
namespace {

using nlohmann::json;

// Real headers are a few KB; anything past this is a corrupt length field,
// and refusing it keeps a bad file from asking for a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
// A golden header is {name: {key: [ints]}}: depth 3. Refuse deep nesting
// before parsing so a hostile header cannot recurse the parser deeply.
constexpr int kMaxJsonDepth = 8;

// Bytes per element of the safetensors dtypes; 0 for a name we do not know.
size_t st_dtype_size(const std::string& d) {
  static const struct {
    const char* name;
    size_t size;
  } kTable[] = {{"F64", 8}, {"F32", 4},     {"F16", 2},     {"BF16", 2}, {"I64", 8},
                {"I32", 4}, {"I16", 2},     {"I8", 1},      {"U64", 8},  {"U32", 4},
                {"U16", 2}, {"U8", 1},      {"BOOL", 1},    {"F8_E4M3", 1},
                {"F8_E5M2", 1}};
  for (const auto& e : kTable)
    if (d == e.name) return e.size;
  return 0;
}

// Largest nesting of [ and { outside strings.
int json_depth(const std::string& text) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return max_depth;
}

// A JSON value that must be a non-negative integer fitting int64.
bool as_count(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(u);
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t s = j.get<int64_t>();
    if (s < 0) return false;
    *out = s;
    return true;
  }
  return false;
}


bool read_impl(const std::string& path, SafetensorsFile* out, std::string* error) {
  // Messages name the file as the caller gave it: that is what they typed.
  const std::string& name = path;
  auto fail = [&](const std::string& msg) {
    if (error) *error = name + ": " + msg;
    return false;
  };

  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return fail("is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(std::string("cannot open: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) return fail("cannot determine the file size");
  in.seekg(0, std::ios::beg);
  const uint64_t file_size = uint64_t(end);

  if (file_size < 8)
    return fail("file is " + std::to_string(file_size) +
                " bytes, shorter than the 8-byte header length field (truncated?)");
  unsigned char len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) return fail("read error in the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian
  if (header_len > kMaxHeaderBytes)
    return fail("header length " + std::to_string(header_len) +
                " is absurd (limit 100 MB): not a safetensors file or corrupt");
  if (header_len > file_size - 8)
    return fail("header length " + std::to_string(header_len) + " runs past the end of the " +
                std::to_string(file_size) + "-byte file (truncated?)");
  if (header_len == 0) return fail("header length is 0: no JSON header");

  std::string header(size_t(header_len), '\0');
  if (!in.read(&header[0], std::streamsize(header_len))) return fail("read error in the header");
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<uint8_t> data(static_cast<size_t>(data_size));
  if (data_size && !in.read(reinterpret_cast<char*>(data.data()), std::streamsize(data_size)))
    return fail("read error in the data buffer");

  if (json_depth(header) > kMaxJsonDepth)
    return fail("header JSON is nested more than " + std::to_string(kMaxJsonDepth) +
                " levels deep: not a safetensors header");
  json root;
  try {
    root = json::parse(header);
  } catch (const json::exception& e) {
    // e.what() carries the byte position; keep it, it is the useful part.
    return fail("header is not valid JSON: " + printable(e.what()));
  }
  if (!root.is_object()) return fail("header JSON is not an object");

  SafetensorsFile result;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    const json& val = it.value();
    if (key == "__metadata__") {
      if (!val.is_object()) return fail("__metadata__: not an object of strings");
      for (auto m = val.begin(); m != val.end(); ++m) {
        if (!m.value().is_string())
          return fail("__metadata__: " + printable(m.key()) + ": value is not a string (safetensors "
                      "metadata is string to string)");
        result.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + printable(key) + "': ";
    if (!val.is_object()) return fail(where + "entry is not an object");
    const auto dt = val.find("dtype");
    const auto sh = val.find("shape");
    const auto off = val.find("data_offsets");
    if (dt == val.end()) return fail(where + "missing dtype");
    if (sh == val.end()) return fail(where + "missing shape");
    if (off == val.end()) return fail(where + "missing data_offsets");
    if (!dt->is_string()) return fail(where + "dtype is not a string");

    Tensor t;
    t.dtype = dt->get<std::string>();
    const size_t elem = st_dtype_size(t.dtype);
    if (elem == 0) return fail(where + "unknown dtype \"" + printable(t.dtype) + "\"");

    if (!sh->is_array()) return fail(where + "shape is not an array");
    int64_t numel = 1;
    bool overflow = false;
    for (const json& d : *sh) {
      int64_t n = 0;
      if (!as_count(d, &n))
        return fail(where + "shape entry " + d.dump() + " is not a non-negative integer");
      t.shape.push_back(n);
      overflow = overflow || __builtin_mul_overflow(numel, n, &numel);
    }
    int64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, int64_t(elem), &nbytes))
      return fail(where + "shape " + shape_string(t.shape) + " overflows 64-bit sizes");

    if (!off->is_array() || off->size() != 2)
      return fail(where + "data_offsets is not an array [begin, end]");
    int64_t begin = 0, stop = 0;
    if (!as_count((*off)[0], &begin) || !as_count((*off)[1], &stop))
      return fail(where + "data_offsets " + off->dump() + " are not non-negative integers");
    if (begin > stop)
      return fail(where + "data_offsets " + off->dump() + ": begin is past end");
    if (uint64_t(stop) > data_size)
      return fail(where + "data_offsets " + off->dump() + " out of range: the data buffer has " +
                  std::to_string(data_size) + " bytes (truncated?)");
    if (stop - begin != nbytes)
      return fail(where + "data_offsets " + off->dump() + " span " + std::to_string(stop - begin) +
                  " bytes, but dtype " + t.dtype + " x shape " + shape_string(t.shape) +
                  " needs " + std::to_string(nbytes));
    t.bytes.assign(data.begin() + begin, data.begin() + stop);
    result.tensors[key] = std::move(t);
  }
  *out = std::move(result);
  return true;
}

bool write_impl(const std::string& path, const SafetensorsFile& file, std::string* error) {
  auto fail = [&](const std::string& msg) {
    if (error) *error = path + ": " + msg;
    return false;
  };
  json header = json::object();
  if (!file.metadata.empty()) {
    json meta = json::object();
    for (const auto& kv : file.metadata) meta[kv.first] = kv.second;
    header["__metadata__"] = meta;
  }
  // Tensors go in name order, back to back, as the reference writer does.
  uint64_t offset = 0;
  for (const auto& kv : file.tensors) {
    const Tensor& t = kv.second;
    const size_t elem = st_dtype_size(t.dtype);
    if (elem == 0) return fail("tensor '" + kv.first + "': unknown dtype \"" + t.dtype + "\"");
    for (int64_t d : t.shape)
      if (d < 0) return fail("tensor '" + kv.first + "': negative shape entry");
    if (uint64_t(t.numel()) * elem != t.bytes.size())
      return fail("tensor '" + kv.first + "': " + std::to_string(t.bytes.size()) +
                  " bytes do not match dtype " + t.dtype + " x shape " + shape_string(t.shape));
    json entry = json::object();
    entry["dtype"] = t.dtype;
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.bytes.size()};
    header[kv.first] = entry;
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  // Pad with spaces so the data buffer starts 8-byte aligned (safetensors does).
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return fail(std::string("cannot create: ") + std::strerror(errno));
  unsigned char len_bytes[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) len_bytes[i] = static_cast<unsigned char>(n & 0xff);
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& kv : file.tensors)
    out.write(reinterpret_cast<const char*>(kv.second.bytes.data()),
              std::streamsize(kv.second.bytes.size()));
  out.close();
  if (!out) return fail("write error");
  return true;
}

}  // namespace

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool read_safetensors(const std::string& path, SafetensorsFile* out, std::string* error) {
  try {
    return read_impl(path, out, error);
  } catch (const std::exception& e) {
    // bad_alloc or a library surprise: still an answer, never an escape.
    if (error) *error = path + ": cannot read: " + e.what();
  } catch (...) {
    if (error) *error = path + ": cannot read: unknown error";
  }
  return false;
}

bool write_safetensors(const std::string& path, const SafetensorsFile& file, std::string* error) {
  try {
    return write_impl(path, file, error);
  } catch (const std::exception& e) {
    if (error) *error = path + ": cannot write: " + e.what();
  } catch (...) {
    if (error) *error = path + ": cannot write: unknown error";
  }
  return false;
}

}  // namespace golden
}  // namespace gdn
