// gdnkit tests — what every backend's test run shares: the backend fixture,
// device buffers through the backend table, tolerances and expect_close.
//
// Tests touch memory only through gdn::backend_ops(backend) (alloc, copy,
// release, synchronize), so the same test body runs on host, CUDA and HIP.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gdnkit/backend.hpp"
#include "gdnkit/gdnkit.hpp"
#include "gdnkit/half.hpp"

namespace gdn {
// gtest prints a suite's parameter in test listings (and so in ctest names):
// "host", not "4-byte object <01-00 00-00>".
inline void PrintTo(Backend b, std::ostream* os) { *os << to_string(b); }
}  // namespace gdn

namespace gdn_test {

// ---- device memory ---------------------------------------------------------
// One allocation on `backend`, released on destruction. Infrastructure
// failures throw: gtest reports them as a failure of the running test.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(gdn::Backend backend, size_t bytes) : ops_(gdn::backend_ops(backend)), bytes_(bytes) {
    if (ops_ == nullptr)
      throw std::runtime_error(std::string("backend ") + gdn::to_string(backend) + " not built");
    ptr_ = ops_->alloc(bytes ? bytes : 1);
    if (ptr_ == nullptr)
      throw std::runtime_error("alloc of " + std::to_string(bytes) + " bytes failed on " +
                               ops_->name);
  }
  DeviceBuffer(gdn::Backend backend, const std::vector<uint8_t>& init)
      : DeviceBuffer(backend, init.size()) {
    upload(init);
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }

  void* get() const { return ptr_; }
  template <class T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + byte_offset);
  }
  size_t size() const { return bytes_; }

  void upload(const void* src, size_t bytes, size_t offset = 0) {
    if (offset + bytes > bytes_) throw std::runtime_error("upload past the end of a buffer");
    check(ops_->copy(static_cast<char*>(ptr_) + offset, src, bytes, gdn::CopyKind::kHostToDevice));
  }
  void upload(const std::vector<uint8_t>& src) { upload(src.data(), src.size()); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(bytes_);
    check(ops_->copy(out.data(), ptr_, bytes_, gdn::CopyKind::kDeviceToHost));
    return out;
  }

 private:
  static void check(const gdn::Status& st) {
    if (!st.ok()) throw std::runtime_error(std::string("backend copy failed: ") + st.message);
  }
  void reset() {
    if (ptr_ != nullptr) ops_->release(ptr_);
    ptr_ = nullptr;
  }
  const gdn::BackendOps* ops_{nullptr};
  void* ptr_{nullptr};
  size_t bytes_{0};
};

// ---- the backend fixture -----------------------------------------------------
// Every shared test is a TEST_P on a fixture derived from this one; a backend's
// test file instantiates them (backend_suites.hpp). On a machine without the
// device the whole suite skips, with the reason.
class BackendTest : public ::testing::TestWithParam<gdn::Backend> {
 protected:
  void SetUp() override {
    char why[256] = {};
    if (!gdn::backend_available(GetParam(), why, sizeof why))
      GTEST_SKIP() << "backend " << gdn::to_string(GetParam()) << " not available: " << why;
    ops_ = gdn::backend_ops(GetParam());
    ASSERT_NE(ops_, nullptr);
  }
  gdn::Backend backend() const { return GetParam(); }
  void sync() {
    const gdn::Status st = ops_->synchronize(nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
  }
  const gdn::BackendOps* ops_{nullptr};
};

// ---- tolerances: docs/operation.md, Numerics, by the dtype a result is stored in ---
inline double output_tol(gdn::DType t) {
  return t == gdn::DType::kF32 ? 1e-5 : (t == gdn::DType::kF16 ? 2e-3 : 1e-2);
}
inline double state_tol(gdn::DType t) {
  return t == gdn::DType::kF32 ? 1e-5 : (t == gdn::DType::kF16 ? 2e-3 : 8e-3);
}

// ---- expect_close ----------------------------------------------------------------
// Relative L2 error ||got - ref|| / ||ref|| (absolute when ref is all zero)
// within `tol`; on failure names the worst element (via `describe`, e.g.
// "o[b=1,h=3,j=17]"). NaN anywhere fails.
inline ::testing::AssertionResult expect_close(
    const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
    double tol, const std::function<std::string(int64_t)>& describe = nullptr) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " elements, reference has " << ref.size();
  double num = 0, den = 0, worst = -1;
  int64_t worst_i = -1;
  bool nan = false;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - ref[i];
    if (std::isnan(d)) {
      if (!nan) worst_i = int64_t(i);
      nan = true;
      continue;
    }
    num += d * d;
    den += ref[i] * ref[i];
    if (!nan && std::fabs(d) > worst) {
      worst = std::fabs(d);
      worst_i = int64_t(i);
    }
  }
  const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!nan && err <= tol) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << what << ": relative L2 error " << (nan ? std::nan("") : err) << " > tolerance " << tol
     << " over " << got.size() << " elements";
  if (worst_i >= 0) {
    os << "; worst " << (describe ? describe(worst_i) : "[" + std::to_string(worst_i) + "]")
       << ": got " << got[size_t(worst_i)] << ", expected " << ref[size_t(worst_i)];
  }
  return ::testing::AssertionFailure() << os.str();
}

// Relative L2 error alone (for printing).
inline double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool contains(const char* message, const std::string& needle) {
  return std::string(message).find(needle) != std::string::npos;
}

}  // namespace gdn_test
