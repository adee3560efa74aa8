// Internal to the golden-file library: text for messages about a file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace gdn {
namespace golden {

// Bytes quoted from a file may be control characters or broken UTF-8 when the
// file is corrupt: escape everything outside printable ASCII as \xNN so an
// error message cannot garble the terminal.
inline std::string printable(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      r.push_back(char(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    }
  }
  return r;
}

// "[2, 4, 64]"
inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ']';
  return s.str();
}

}  // namespace golden
}  // namespace gdn
