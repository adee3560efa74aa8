// gdn verify: run golden cases on a backend and print PASS/FAIL per case.
//
//   gdn verify [--backend host|cuda|hip|auto] [FILES|DIRS...]
//
// With no FILES the repository's set (GDNKIT_GOLDEN_DIR) runs. One line per
// case, then "N passed, M failed". Exit 0 when every case passes, 1 when one
// fails or cannot be loaded (or a directory holds no case), 2 on bad usage.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.hpp"
#include "gdnkit/golden.hpp"

#ifndef GDNKIT_GOLDEN_DIR
// The build passes the source tree's tests/golden; this keeps a stray build
// usable from the repository root.
#define GDNKIT_GOLDEN_DIR "tests/golden"
#endif

namespace {

namespace fs = std::filesystem;
namespace golden = gdn::golden;

void usage(FILE* out) {
  std::fprintf(out,
               "usage: gdn verify [--backend host|cuda|hip|auto] [FILES|DIRS...]\n"
               "\n"
               "Runs golden cases (safetensors, one decode step each) on a backend and\n"
               "compares with their float64 expected results. DIRS are searched\n"
               "recursively for *.safetensors. Default: %s\n"
               "Exit status: 0 all passed, 1 a case failed or could not be loaded, 2 bad usage.\n",
               GDNKIT_GOLDEN_DIR);
}

bool parse_backend(const std::string& s, gdn::Backend* out) {
  if (s == "host") *out = gdn::Backend::kHost;
  else if (s == "cuda") *out = gdn::Backend::kCuda;
  else if (s == "hip") *out = gdn::Backend::kHip;
  else if (s == "auto") *out = gdn::Backend::kAuto;
  else return false;
  return true;
}

// One case to run: its path, and the name to print for it.
struct Entry {
  std::string path;
  std::string label;
  bool empty_dir{false};  // a directory without cases: reported as a failure
};

// "o[b=1,h=3,j=17]" / "state[slot=2,h=1,k=5,v=7]" for a flat index.
std::string where_o(const gdn::DecodeParams& p, int64_t i) {
  const int64_t Hv = p.num_v_heads, Dv = p.head_dim_v;
  char buf[96];
  std::snprintf(buf, sizeof buf, "o[b=%lld,h=%lld,j=%lld]", (long long)(i / (Hv * Dv)),
                (long long)(i / Dv % Hv), (long long)(i % Dv));
  return buf;
}

std::string where_state(const gdn::DecodeParams& p, int64_t i) {
  const int64_t Hv = p.num_v_heads, Dk = p.head_dim_k, Dv = p.head_dim_v;
  const int64_t mat = Dk * Dv;
  const int64_t slot = i / (Hv * mat), h = i / mat % Hv, r = i % mat;
  // kv: (Dk, Dv), Dv contiguous; vk: (Dv, Dk), Dk contiguous
  const int64_t kk = p.layout == gdn::Layout::kKV ? r / Dv : r % Dk;
  const int64_t vv = p.layout == gdn::Layout::kKV ? r % Dv : r / Dk;
  char buf[128];
  std::snprintf(buf, sizeof buf, "state[slot=%lld,h=%lld,k=%lld,v=%lld]", (long long)slot,
                (long long)h, (long long)kk, (long long)vv);
  return buf;
}

// "conv_state[slot=1,c=300,tap=2]" for a flat index into the conv pool as stored
// (channel-major (S, conv_dim, W-1) or tap-major (S, W-1, conv_dim)).
std::string where_conv_state(const gdn::DecodeParams& p, int64_t i) {
  const int64_t slot = p.conv_state_slot_stride > 0 ? i / p.conv_state_slot_stride : 0;
  const int64_t r = i - slot * p.conv_state_slot_stride;
  const bool tap_major = p.conv_state_tap_stride != 1;
  const int64_t c = tap_major ? r % p.conv_state_tap_stride : r / p.conv_state_channel_stride;
  const int64_t t = tap_major ? r / p.conv_state_tap_stride : r % p.conv_state_channel_stride;
  char buf[128];
  std::snprintf(buf, sizeof buf, "conv_state[slot=%lld,c=%lld,tap=%lld]", (long long)slot,
                (long long)c, (long long)t);
  return buf;
}

// "conv_state exact", or how many elements differ and the first/worst of them.
std::string describe_exact(const char* name, const golden::Comparison& c, const std::string& worst_at) {
  if (c.pass) return std::string(name) + " exact";
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "%s %lld element%s not bitwise equal", name,
                        (long long)c.exact_mismatches, c.exact_mismatches == 1 ? "" : "s");
  std::string s(buf, size_t(n > 0 ? n : 0));
  if (c.worst_index >= 0) {
    std::snprintf(buf, sizeof buf, ", worst %s got %.17g expected %.17g", worst_at.c_str(),
                  c.worst_got, c.worst_expected);
    s += buf;
  }
  return s;
}

// "o 2.1e-08 (tol 1e-05)" plus, on failure, the worst element and exact-rule misses.
std::string describe(const char* name, const golden::Comparison& c, const std::string& worst_at,
                     const char* exact_what) {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "%s %.2e (tol %.0e)", name, c.rel_l2, c.tolerance);
  std::string s(buf, size_t(n > 0 ? n : 0));
  if (!c.pass) {
    if (c.worst_index >= 0) {
      std::snprintf(buf, sizeof buf, " worst %s got %.9g expected %.9g (|diff| %.3g)",
                    worst_at.c_str(), c.worst_got, c.worst_expected, c.worst_abs);
      s += buf;
    }
    if (c.exact_mismatches > 0) {
      std::snprintf(buf, sizeof buf, ", %lld %s", (long long)c.exact_mismatches, exact_what);
      s += buf;
    }
  }
  return s;
}

// load_case's messages start with the path; the line already names the file.
std::string strip_path(const std::string& msg, const std::string& path) {
  const std::string prefix = path + ": ";
  return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg;
}

}  // namespace

int cmd_verify(const std::vector<std::string>& args) {
  gdn::Backend backend = gdn::Backend::kAuto;
  std::vector<std::string> inputs;
  bool options_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (options_done || a.empty() || a[0] != '-') {
      inputs.push_back(a);
    } else if (a == "--") {
      options_done = true;
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--backend" || a.rfind("--backend=", 0) == 0) {
      std::string value;
      if (a == "--backend") {
        if (i + 1 >= args.size()) {
          std::fprintf(stderr, "gdn verify: --backend needs a value (host, cuda, hip or auto)\n\n");
          usage(stderr);
          return 2;
        }
        value = args[++i];
      } else {
        value = a.substr(std::string("--backend=").size());
      }
      if (!parse_backend(value, &backend)) {
        std::fprintf(stderr, "gdn verify: unknown backend '%s' (host, cuda, hip or auto)\n\n",
                     value.c_str());
        usage(stderr);
        return 2;
      }
    } else {
      std::fprintf(stderr, "gdn verify: unknown option '%s'\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }

  // A backend that is not built or has no device fails every case the same
  // way: say it once instead.
  char why[256] = {};
  if (!gdn::backend_available(backend, why, sizeof why)) {
    std::fprintf(stderr, "gdn verify: backend %s unavailable: %s\n", gdn::to_string(backend), why);
    return 1;
  }
  const gdn::Backend resolved = gdn::resolve_backend(backend);

  if (inputs.empty()) inputs.push_back(GDNKIT_GOLDEN_DIR);
  std::vector<Entry> entries;
  size_t num_cases = 0;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      const std::vector<std::string> cases = golden::list_cases(in);
      if (cases.empty()) entries.push_back({in, in, true});
      for (const std::string& c : cases) {
        const fs::path rel = fs::path(c).lexically_relative(in);
        entries.push_back({c, rel.empty() ? c : rel.string()});
        ++num_cases;
      }
    } else {
      entries.push_back({in, in});  // a missing file fails in load_case with its reason
      ++num_cases;
    }
  }

  std::printf("gdn verify: %zu case%s on backend %s\n", num_cases, num_cases == 1 ? "" : "s",
              gdn::to_string(resolved));
  int passed = 0, failed = 0;
  for (const Entry& e : entries) {
    if (e.empty_dir) {
      std::printf("FAIL  %s  no *.safetensors cases in this directory\n", e.label.c_str());
      ++failed;
      continue;
    }
    golden::Case c;
    std::string error;
    if (!golden::load_case(e.path, &c, &error)) {
      std::printf("FAIL  %s  cannot load: %s\n", e.label.c_str(), strip_path(error, e.path).c_str());
      ++failed;
      std::fflush(stdout);
      continue;
    }
    const golden::CaseReport r = golden::run_case(c, resolved);
    std::string line = std::string(r.pass ? "PASS" : "FAIL") + "  " + e.label;
    // A comparison that ran has its tolerance set; a run that stopped early has not.
    if (r.o.tolerance > 0) {
      line += "  " + describe("o", r.o, where_o(c.params, r.o.worst_index), "padding outputs not exactly 0");
      line += "  " + describe("state", r.state, where_state(c.params, r.state.worst_index),
                              "elements changed that must stay bitwise unchanged");
      if (r.has_conv_state)
        line += "  " + describe_exact("conv_state", r.conv_state,
                                      where_conv_state(c.params, r.conv_state.worst_index));
    }
    if (r.invalid_reported != 0)
      line += "  invalid indices: " + std::to_string(r.invalid_reported) + " reported";
    if (!r.error.empty()) line += "  error: " + r.error;
    line += "  [" + r.notes + "]";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    (r.pass ? passed : failed) += 1;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
