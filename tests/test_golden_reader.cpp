// Tests of the golden-file library's reader: the safetensors reader/writer must
// turn every malformed file into a clear error (file name + problem), load_case
// must refuse cases whose tensors disagree with each other, and list_cases
// finds every case of a tree. run_case / compare (they must catch wrong
// results, unwritten outputs and touched slots): test_golden_run.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gdnkit/golden.hpp"
#include "gdnkit/half.hpp"
#include "golden_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using gdn::golden::Case;
using gdn::golden::SafetensorsFile;
using gdn::golden::Tensor;
using golden_test_util::ramp;

// A fresh directory per test, removed afterwards.
class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("gdnkit_golden_") + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// ---- builders -------------------------------------------------------------------

template <typename T>
Tensor make_tensor(const std::string& dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// A well-formed case: B=2, Hk=1, Hv=2, Dk=16, Dv=32, kv layout, all fp32.
// Values are arbitrary: these files test loading, not the math.
SafetensorsFile valid_case() {
  const int64_t B = 2, Hk = 1, Hv = 2, Dk = 16, Dv = 32, S = 3;
  SafetensorsFile f;
  f.metadata = {{"op", "gdn_decode"}, {"format_version", "1"}, {"layout", "kv"},
                {"gate", "raw"},      {"l2norm", "rsqrt"},    {"num_slots", "3"}};
  f.tensors["q"] = make_tensor("F32", {B, Hk, Dk}, ramp(B * Hk * Dk));
  f.tensors["k"] = make_tensor("F32", {B, Hk, Dk}, ramp(B * Hk * Dk, 0.02f));
  f.tensors["v"] = make_tensor("F32", {B, Hv, Dv}, ramp(B * Hv * Dv, 0.03f));
  f.tensors["a"] = make_tensor("F32", {B, Hv}, ramp(B * Hv));
  f.tensors["b"] = make_tensor("F32", {B, Hv}, ramp(B * Hv));
  f.tensors["A_log"] = make_tensor("F32", {Hv}, ramp(Hv));
  f.tensors["dt_bias"] = make_tensor("F32", {Hv}, ramp(Hv));
  f.tensors["state"] = make_tensor("F32", {S, Hv, Dk, Dv}, ramp(S * Hv * Dk * Dv));
  f.tensors["expected_o"] =
      make_tensor("F64", {B, Hv, Dv}, std::vector<double>(size_t(B * Hv * Dv), 0.5));
  f.tensors["expected_state"] =
      make_tensor("F64", {S, Hv, Dk, Dv}, std::vector<double>(size_t(S * Hv * Dk * Dv), 0.25));
  return f;
}

// valid_case() in format version 2, with both optional stages: x instead of
// q/k/v (conv_dim = 2*16 + 2*32 = 96), conv_width 4, a channel-major conv pool
// (3, 96, 3), a conv_bias, and the gated RMSNorm (z, norm_weight, norm_eps).
constexpr int64_t kConvDim = 96;
SafetensorsFile valid_conv_case() {
  const int64_t B = 2, Hv = 2, Dv = 32, S = 3, W = 4;
  SafetensorsFile f = valid_case();
  f.metadata["format_version"] = "2";
  f.metadata["conv_width"] = "4";
  f.metadata["conv_state_layout"] = "channel_major";
  f.metadata["norm_eps"] = "1e-5";
  f.tensors.erase("q");
  f.tensors.erase("k");
  f.tensors.erase("v");
  f.tensors["x"] = make_tensor("F32", {B, kConvDim}, ramp(B * kConvDim));
  f.tensors["conv_weight"] = make_tensor("F32", {kConvDim, W}, ramp(kConvDim * W, 0.05f));
  f.tensors["conv_bias"] = make_tensor("F32", {kConvDim}, ramp(kConvDim, 0.01f, 0.0f));
  f.tensors["conv_state"] = make_tensor("F32", {S, kConvDim, W - 1}, ramp(S * kConvDim * (W - 1)));
  f.tensors["expected_conv_state"] = make_tensor(
      "F64", {S, kConvDim, W - 1}, std::vector<double>(size_t(S * kConvDim * (W - 1)), 0.1));
  f.tensors["z"] = make_tensor("F32", {B, Hv, Dv}, ramp(B * Hv * Dv));
  f.tensors["norm_weight"] = make_tensor("F32", {Dv}, ramp(Dv, 0.01f, 1.0f));
  return f;
}

std::vector<uint8_t> file_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_bytes(const std::string& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A file with `header` as its JSON and `data_bytes` zero bytes of data.
void put_raw(const std::string& p, const std::string& header, size_t data_bytes,
             uint64_t header_len_field = UINT64_MAX) {
  std::vector<uint8_t> bytes(8);
  const uint64_t n = header_len_field == UINT64_MAX ? header.size() : header_len_field;
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = uint8_t(n >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_bytes, 0);
  put_bytes(p, bytes);
}

uint64_t header_length(const std::vector<uint8_t>& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[size_t(i)];
  return n;
}

// read_safetensors fails, and the message names the file and the problem.
void expect_read_error(const std::string& p, const std::string& word) {
  SafetensorsFile f;
  std::string error;
  EXPECT_FALSE(gdn::golden::read_safetensors(p, &f, &error)) << p;
  EXPECT_NE(error.find(fs::path(p).filename().string()), std::string::npos) << error;
  EXPECT_NE(error.find(word), std::string::npos) << "expected '" << word << "' in: " << error;
}

// load_case fails with "<file>: <what>: ...<word>...".
void expect_load_error(const std::string& p, const std::string& what, const std::string& word) {
  Case c;
  std::string error;
  EXPECT_FALSE(gdn::golden::load_case(p, &c, &error)) << p;
  EXPECT_NE(error.find(p + ": " + what + ": "), std::string::npos)
      << "expected '" << p << ": " << what << ": ' in: " << error;
  EXPECT_NE(error.find(word), std::string::npos) << "expected '" << word << "' in: " << error;
}

void write_ok(const std::string& p, const SafetensorsFile& f) {
  std::string error;
  ASSERT_TRUE(gdn::golden::write_safetensors(p, f, &error)) << error;
}

// ---- safetensors: round trip -------------------------------------------------

TEST_F(GoldenTest, RoundTripKeepsTensorsAndMetadata) {
  SafetensorsFile f;
  f.metadata = {{"op", "gdn_decode"}, {"description", "round trip, with \"quotes\" and ünïcode"}};
  f.tensors["f32"] = make_tensor("F32", {2, 3}, std::vector<float>{1, -2, 3.5f, 4, 5, 6});
  f.tensors["f64"] = make_tensor("F64", {3}, std::vector<double>{1e-300, -0.0, 7});
  f.tensors["i64"] = make_tensor("I64", {2}, std::vector<int64_t>{-1, int64_t(1) << 40});
  f.tensors["i32"] = make_tensor("I32", {1, 1, 1}, std::vector<int32_t>{-7});
  f.tensors["bf16"] = make_tensor("BF16", {2}, std::vector<uint16_t>{0x3f80, 0xc000});
  f.tensors["scalar"] = make_tensor("F32", {}, std::vector<float>{42});
  f.tensors["empty"] = make_tensor("F16", {0, 4}, std::vector<uint16_t>{});
  const std::string p = path("roundtrip.safetensors");
  write_ok(p, f);

  // The data buffer starts 8-byte aligned, as safetensors writers do.
  const std::vector<uint8_t> bytes = file_bytes(p);
  EXPECT_EQ((8 + header_length(bytes)) % 8, 0u);

  SafetensorsFile g;
  std::string error;
  ASSERT_TRUE(gdn::golden::read_safetensors(p, &g, &error)) << error;
  EXPECT_EQ(g.metadata, f.metadata);
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (const auto& kv : f.tensors) {
    const Tensor& t = g.tensors.at(kv.first);
    EXPECT_EQ(t.dtype, kv.second.dtype) << kv.first;
    EXPECT_EQ(t.shape, kv.second.shape) << kv.first;
    EXPECT_EQ(t.bytes, kv.second.bytes) << kv.first;
  }
  EXPECT_EQ(g.tensors.at("scalar").numel(), 1);
  EXPECT_EQ(g.tensors.at("empty").numel(), 0);
}

TEST_F(GoldenTest, WriterRefusesInconsistentTensor) {
  SafetensorsFile f;
  f.tensors["x"] = make_tensor("F32", {3}, std::vector<float>{1, 2});  // 8 bytes for 12
  std::string error;
  EXPECT_FALSE(gdn::golden::write_safetensors(path("bad.safetensors"), f, &error));
  EXPECT_NE(error.find("bad.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("'x'"), std::string::npos) << error;
}

// ---- safetensors: malformed files ----------------------------------------------

TEST_F(GoldenTest, TruncatedFilesAreRefused) {
  const std::string good = path("good.safetensors");
  write_ok(good, valid_case());
  const std::vector<uint8_t> bytes = file_bytes(good);
  const uint64_t hlen = header_length(bytes);
  struct Cut {
    size_t at;
    const char* word;
  } cuts[] = {
      {0, "shorter"},  // empty file
      {5, "shorter"},  // inside the length field
      {8, "runs past"},
      {8 + size_t(hlen) / 2, "runs past"},    // inside the JSON
      {8 + size_t(hlen), "out of range"},     // no data at all
      {bytes.size() - 100, "out of range"},   // inside the data
      {bytes.size() - 1, "out of range"},
  };
  for (const Cut& c : cuts) {
    const std::string p = path("cut_" + std::to_string(c.at) + ".safetensors");
    put_bytes(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(c.at)));
    expect_read_error(p, c.word);
    expect_read_error(p, "truncated");
  }
}

TEST_F(GoldenTest, HeaderLengthTooLarge) {
  const std::string hdr = R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  put_raw(path("past_end.safetensors"), hdr, 4, hdr.size() + 5);
  expect_read_error(path("past_end.safetensors"), "runs past the end");
  put_raw(path("absurd.safetensors"), hdr, 4, uint64_t(1) << 40);
  expect_read_error(path("absurd.safetensors"), "absurd");
  put_raw(path("max.safetensors"), hdr, 4, UINT64_MAX - 1);
  expect_read_error(path("max.safetensors"), "absurd");
  put_raw(path("zero.safetensors"), hdr, 4, 0);
  expect_read_error(path("zero.safetensors"), "header length is 0");
}

TEST_F(GoldenTest, BadJson) {
  put_raw(path("badjson.safetensors"), R"({"x": {"dtype": "F32", )", 0);
  expect_read_error(path("badjson.safetensors"), "not valid JSON");
  put_raw(path("garbage.safetensors"), std::string("\x01\x02\xff\xfe", 4), 16);
  expect_read_error(path("garbage.safetensors"), "not valid JSON");
  put_raw(path("deep.safetensors"), std::string(5000, '[') + std::string(5000, ']'), 0);
  expect_read_error(path("deep.safetensors"), "nested");
}

TEST_F(GoldenTest, HeaderNotAnObject) {
  put_raw(path("array.safetensors"), "[1, 2, 3]", 0);
  expect_read_error(path("array.safetensors"), "not an object");
  put_raw(path("string.safetensors"), R"("hello")", 0);
  expect_read_error(path("string.safetensors"), "not an object");
  put_raw(path("entry.safetensors"), R"({"x": 3})", 0);
  expect_read_error(path("entry.safetensors"), "not an object");
  put_raw(path("meta.safetensors"), R"({"__metadata__": [1]})", 0);
  expect_read_error(path("meta.safetensors"), "__metadata__");
  put_raw(path("metaval.safetensors"), R"({"__metadata__": {"layout": 3}})", 0);
  expect_read_error(path("metaval.safetensors"), "not a string");
}

TEST_F(GoldenTest, TensorEntryMissingKeys) {
  put_raw(path("nodtype.safetensors"), R"({"x": {"shape": [1], "data_offsets": [0, 4]}})", 4);
  expect_read_error(path("nodtype.safetensors"), "missing dtype");
  put_raw(path("noshape.safetensors"), R"({"x": {"dtype": "F32", "data_offsets": [0, 4]}})", 4);
  expect_read_error(path("noshape.safetensors"), "missing shape");
  put_raw(path("nooffsets.safetensors"), R"({"x": {"dtype": "F32", "shape": [1]}})", 4);
  expect_read_error(path("nooffsets.safetensors"), "missing data_offsets");
}

TEST_F(GoldenTest, UnknownDtype) {
  put_raw(path("f33.safetensors"), R"({"x": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})",
          4);
  expect_read_error(path("f33.safetensors"), "unknown dtype");
  put_raw(path("num.safetensors"), R"({"x": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4);
  expect_read_error(path("num.safetensors"), "dtype");
}

TEST_F(GoldenTest, BadShapes) {
  put_raw(path("neg.safetensors"), R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
          4);
  expect_read_error(path("neg.safetensors"), "non-negative");
  put_raw(path("float.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4);
  expect_read_error(path("float.safetensors"), "non-negative integer");
  put_raw(path("overflow.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4);
  expect_read_error(path("overflow.safetensors"), "overflow");
  put_raw(path("huge.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})", 4);
  expect_read_error(path("huge.safetensors"), "shape");
  put_raw(path("notarray.safetensors"),
          R"({"x": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4);
  expect_read_error(path("notarray.safetensors"), "shape is not an array");
}

TEST_F(GoldenTest, BadOffsets) {
  put_raw(path("range.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  expect_read_error(path("range.safetensors"), "out of range");
  put_raw(path("size.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}})", 16);
  expect_read_error(path("size.safetensors"), "needs 8");
  put_raw(path("order.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 16);
  expect_read_error(path("order.safetensors"), "begin is past end");
  put_raw(path("three.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 16);
  expect_read_error(path("three.safetensors"), "data_offsets");
  put_raw(path("negoff.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 16);
  expect_read_error(path("negoff.safetensors"), "data_offsets");
}

TEST_F(GoldenTest, OverlappingTensorsAreAccepted) {
  put_raw(path("overlap.safetensors"),
          R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "y": {"dtype": "I32", "shape": [2], "data_offsets": [4, 12]}})",
          12);
  SafetensorsFile f;
  std::string error;
  EXPECT_TRUE(gdn::golden::read_safetensors(path("overlap.safetensors"), &f, &error)) << error;
  EXPECT_EQ(f.tensors.size(), 2u);
}

TEST_F(GoldenTest, MissingFileAndDirectory) {
  expect_read_error(path("nope.safetensors"), "cannot open");
  fs::create_directories(path("adir.safetensors"));
  expect_read_error(path("adir.safetensors"), "directory");
}

// ---- load_case ------------------------------------------------------------------

TEST_F(GoldenTest, LoadsValidCase) {
  const std::string p = path("case.safetensors");
  write_ok(p, valid_case());
  Case c;
  std::string error;
  ASSERT_TRUE(gdn::golden::load_case(p, &c, &error)) << error;
  EXPECT_EQ(c.path, p);
  EXPECT_EQ(c.params.batch, 2);
  EXPECT_EQ(c.params.num_k_heads, 1);
  EXPECT_EQ(c.params.num_v_heads, 2);
  EXPECT_EQ(c.params.head_dim_k, 16);
  EXPECT_EQ(c.params.head_dim_v, 32);
  EXPECT_EQ(c.params.num_slots, 3);
  EXPECT_EQ(c.params.layout, gdn::Layout::kKV);
  EXPECT_EQ(c.params.qkv_dtype, gdn::DType::kF32);
  EXPECT_EQ(c.params.o_dtype, gdn::DType::kF32);  // defaults to the q/k/v dtype
  EXPECT_EQ(c.params.index_dtype, gdn::IndexType::kNone);
  EXPECT_EQ(c.params.state_slot_stride, 2 * 16 * 32);
  EXPECT_EQ(c.params.v_batch_stride, 2 * 32);
  EXPECT_FALSE(c.packed_qkv);
  EXPECT_EQ(c.A_log.size(), 2u);
  EXPECT_EQ(c.expected_o.size(), size_t(2 * 2 * 32));
  EXPECT_EQ(c.expected_state.size(), size_t(3 * 2 * 16 * 32));
  EXPECT_EQ(c.expected_invalid_indices, -1);
}

TEST_F(GoldenTest, LoadAcceptsAliasesAndOtherRanks) {
  SafetensorsFile f = valid_case();
  f.metadata = {{"op", "GDN_DECODE"}, {"layout", " VK "},       {"l2norm", "F_Normalize"},
                {"head_map", "tile"}, {"gate", "Pre"},          {"output_dtype", "bfloat16"},
                {"scale", "0.25"},    {"l2norm_eps", "1e-5"},   {"extra_key", "ignored"}};
  // vk: state [S, Hv, Dv, Dk]; flat q/k and unsqueezed v, a, expected_o.
  f.tensors["state"].shape = {3, 2, 32, 16};
  f.tensors["expected_state"].shape = {3, 2, 32, 16};
  f.tensors["q"].shape = {2, 16};
  f.tensors["k"].shape = {2, 1, 1, 16};
  f.tensors["v"].shape = {2, 1, 2, 32};
  f.tensors["a"].shape = {2, 1, 2};
  f.tensors["expected_o"].shape = {2, 64};
  f.tensors.erase("A_log");  // optional with a precomputed gate
  f.tensors.erase("dt_bias");
  const std::string p = path("aliases.safetensors");
  write_ok(p, f);
  Case c;
  std::string error;
  ASSERT_TRUE(gdn::golden::load_case(p, &c, &error)) << error;
  EXPECT_EQ(c.params.layout, gdn::Layout::kVK);
  EXPECT_EQ(c.params.head_dim_k, 16);
  EXPECT_EQ(c.params.head_dim_v, 32);
  EXPECT_EQ(c.params.l2norm, gdn::L2Norm::kMaxNorm);
  EXPECT_EQ(c.params.head_map, gdn::HeadMap::kTiled);
  EXPECT_EQ(c.params.gate, gdn::Gate::kPrecomputed);
  EXPECT_EQ(c.params.o_dtype, gdn::DType::kBF16);
  EXPECT_FLOAT_EQ(c.params.scale, 0.25f);
  EXPECT_FLOAT_EQ(c.params.l2norm_eps, 1e-5f);
  EXPECT_TRUE(c.A_log.empty());
}

TEST_F(GoldenTest, LoadsPackedQkvAndIndices) {
  SafetensorsFile f = valid_case();
  f.tensors.erase("q");
  f.tensors.erase("k");
  f.tensors.erase("v");
  const int64_t width = 2 * 1 * 16 + 2 * 32;
  f.tensors["mixed_qkv"] = make_tensor("F32", {2, width}, ramp(2 * width));
  f.tensors["state_indices"] = make_tensor("I64", {2}, std::vector<int64_t>{2, 5});
  f.tensors["state_out_indices"] = make_tensor("I64", {2}, std::vector<int64_t>{-1, 0});
  f.metadata["invalid_indices"] = "1";
  const std::string p = path("packed.safetensors");
  write_ok(p, f);
  Case c;
  std::string error;
  ASSERT_TRUE(gdn::golden::load_case(p, &c, &error)) << error;
  EXPECT_TRUE(c.packed_qkv);
  EXPECT_EQ(c.params.num_k_heads, 1);
  EXPECT_EQ(c.params.index_dtype, gdn::IndexType::kI64);
  EXPECT_EQ(c.expected_invalid_indices, 1);
  EXPECT_EQ(c.state_out_indices.size(), 16u);
}

TEST_F(GoldenTest, LoadMissingState) {
  SafetensorsFile f = valid_case();
  f.tensors.erase("state");
  write_ok(path("nostate.safetensors"), f);
  expect_load_error(path("nostate.safetensors"), "state", "missing");
}

TEST_F(GoldenTest, LoadMissingExpected) {
  SafetensorsFile f = valid_case();
  f.tensors.erase("expected_state");
  write_ok(path("noexp.safetensors"), f);
  expect_load_error(path("noexp.safetensors"), "expected_state", "missing");
}

TEST_F(GoldenTest, LoadWrongShapeOfA) {
  SafetensorsFile f = valid_case();
  f.tensors["a"] = make_tensor("F32", {2, 3}, ramp(6));
  write_ok(path("shape_a.safetensors"), f);
  expect_load_error(path("shape_a.safetensors"), "a", "shape [2, 3]");
}

TEST_F(GoldenTest, LoadLayoutMismatchIsCaught) {
  // A kv file whose v is [B, Hv, Dk]: the last dim gives away the wrong layout.
  SafetensorsFile f = valid_case();
  f.tensors["v"] = make_tensor("F32", {2, 4, 16}, ramp(2 * 4 * 16));
  write_ok(path("v.safetensors"), f);
  expect_load_error(path("v.safetensors"), "v", "does not hold (B, Hv, Dv)");
}

TEST_F(GoldenTest, LoadUnknownLayout) {
  SafetensorsFile f = valid_case();
  f.metadata["layout"] = "kvk";
  write_ok(path("layout.safetensors"), f);
  expect_load_error(path("layout.safetensors"), "layout", "unknown value");
  f.metadata.erase("layout");
  write_ok(path("nolayout.safetensors"), f);
  expect_load_error(path("nolayout.safetensors"), "layout", "missing");
}

TEST_F(GoldenTest, LoadUnknownMetadataValues) {
  const std::pair<const char*, const char*> bad[] = {
      {"op", "gdn_prefill"}, {"format_version", "4"}, {"l2norm", "l3"},
      {"head_map", "spiral"}, {"gate", "cooked"},     {"output_dtype", "F8"},
      {"scale", "abc"},      {"l2norm_eps", "-1"},    {"num_slots", "4"},
      {"invalid_indices", "x"}, {"num_tokens", "0"},  {"num_tokens", "17"},
      {"update_state", "maybe"}};
  for (const auto& kv : bad) {
    SafetensorsFile f = valid_case();
    f.metadata[kv.first] = kv.second;
    const std::string p = path(std::string("meta_") + kv.first + ".safetensors");
    write_ok(p, f);
    expect_load_error(p, kv.first, kv.second);
  }
}

TEST_F(GoldenTest, LoadRefusesVersion3KeysInOlderVersions) {
  // several tokens in a file that says version 2: refused, not half-run
  SafetensorsFile f = valid_case();
  f.metadata["format_version"] = "2";
  f.metadata["num_tokens"] = "2";
  write_ok(path("v2_tokens.safetensors"), f);
  expect_load_error(path("v2_tokens.safetensors"), "num_tokens", "format_version 3");
  f = valid_case();
  f.metadata["format_version"] = "1";
  f.metadata["update_state"] = "false";
  write_ok(path("v1_update.safetensors"), f);
  expect_load_error(path("v1_update.safetensors"), "update_state", "format_version 3");
}

// ---- load_case: format version 2 (conv prologue, gated RMSNorm) ------------------

TEST_F(GoldenTest, LoadsConvAndNormCase) {
  const std::string p = path("conv.safetensors");
  write_ok(p, valid_conv_case());
  Case c;
  std::string error;
  ASSERT_TRUE(gdn::golden::load_case(p, &c, &error)) << error;
  const gdn::DecodeParams& q = c.params;
  EXPECT_EQ(q.batch, 2);
  EXPECT_EQ(q.num_k_heads, 1);  // from x's width: 96 = 2*Hk*16 + 2*32
  EXPECT_EQ(q.qkv_dtype, gdn::DType::kF32);
  EXPECT_EQ(q.conv_width, 4);
  EXPECT_EQ(gdn::conv_dim(q), kConvDim);
  EXPECT_EQ(q.x_batch_stride, kConvDim);
  EXPECT_EQ(q.conv_state_tap_stride, 1);
  EXPECT_EQ(q.conv_state_channel_stride, 3);
  EXPECT_EQ(q.conv_state_slot_stride, kConvDim * 3);
  EXPECT_FLOAT_EQ(q.norm_eps, 1e-5f);
  EXPECT_EQ(q.z_batch_stride, 2 * 32);
  EXPECT_EQ(q.z_head_stride, 32);
  // pointers stay null: run_case points them at the backend's copies
  EXPECT_EQ(q.x, nullptr);
  EXPECT_EQ(q.conv_state, nullptr);
  EXPECT_EQ(q.norm_weight, nullptr);
  EXPECT_FALSE(c.packed_qkv);
  EXPECT_FALSE(c.conv_tap_major);
  EXPECT_TRUE(c.q.empty() && c.k.empty() && c.v.empty() && c.mixed_qkv.empty());
  EXPECT_EQ(c.x.size(), size_t(2 * kConvDim * 4));
  EXPECT_EQ(c.conv_weight.size(), size_t(kConvDim * 4 * 4));
  EXPECT_EQ(c.conv_bias.size(), size_t(kConvDim * 4));
  EXPECT_EQ(c.conv_state.size(), size_t(3 * kConvDim * 3 * 4));
  EXPECT_EQ(c.expected_conv_state.size(), size_t(3 * kConvDim * 3));
  EXPECT_EQ(c.z.size(), size_t(2 * 2 * 32 * 4));
  EXPECT_EQ(c.norm_weight.size(), size_t(32 * 4));
}

TEST_F(GoldenTest, LoadsTapMajorConvStateAndTorchShapes) {
  SafetensorsFile f = valid_conv_case();
  f.metadata["conv_state_layout"] = " Tap_Major ";
  f.metadata.erase("norm_eps");  // default 1e-6
  f.tensors["conv_state"].shape = {3, 3, kConvDim};
  f.tensors["expected_conv_state"] = make_tensor(
      "F32", {3, 3, kConvDim}, std::vector<float>(size_t(3 * 3 * kConvDim), 0.1f));
  f.tensors["conv_weight"].shape = {kConvDim, 1, 4};  // torch's depthwise Conv1d weight
  f.tensors["x"].shape = {2, 1, kConvDim};
  f.tensors["z"].shape = {2, 64};
  f.tensors.erase("conv_bias");  // optional
  const std::string p = path("tap.safetensors");
  write_ok(p, f);
  Case c;
  std::string error;
  ASSERT_TRUE(gdn::golden::load_case(p, &c, &error)) << error;
  EXPECT_TRUE(c.conv_tap_major);
  EXPECT_EQ(c.params.conv_state_channel_stride, 1);
  EXPECT_EQ(c.params.conv_state_tap_stride, kConvDim);
  EXPECT_EQ(c.params.conv_state_slot_stride, kConvDim * 3);
  EXPECT_FLOAT_EQ(c.params.norm_eps, 1e-6f);
  EXPECT_TRUE(c.conv_bias.empty());
}

TEST_F(GoldenTest, LoadConvWeightWrongShapeIsRefused) {
  SafetensorsFile f = valid_conv_case();
  f.tensors["conv_weight"] = make_tensor("F32", {kConvDim, 3}, ramp(kConvDim * 3));  // W=3, metadata 4
  write_ok(path("w3.safetensors"), f);
  expect_load_error(path("w3.safetensors"), "conv_weight", "shape [96, 3] is not [conv_dim, W] = [96, 4]");
  f.tensors["conv_weight"] = make_tensor("F32", {95, 4}, ramp(95 * 4));
  write_ok(path("c95.safetensors"), f);
  expect_load_error(path("c95.safetensors"), "conv_weight", "shape [95, 4]");
  f.tensors["conv_weight"] = make_tensor("F32", {4, kConvDim}, ramp(4 * kConvDim));  // transposed
  write_ok(path("wt.safetensors"), f);
  expect_load_error(path("wt.safetensors"), "conv_weight", "shape [4, 96]");
}

TEST_F(GoldenTest, LoadConvAndNormErrors) {
  struct Bad {
    const char* name;
    void (*edit)(SafetensorsFile&);
    const char* what;
    const char* word;
  };
  const Bad bad[] = {
      {"no_width", [](SafetensorsFile& f) { f.metadata.erase("conv_width"); }, "conv_width", "missing"},
      {"width5", [](SafetensorsFile& f) { f.metadata["conv_width"] = "5"; }, "conv_width", "\"5\""},
      {"width0", [](SafetensorsFile& f) { f.metadata["conv_width"] = "0"; }, "conv_width", "has x"},
      {"layout", [](SafetensorsFile& f) { f.metadata["conv_state_layout"] = "sideways"; },
       "conv_state_layout", "sideways"},
      {"cs_dtype",
       [](SafetensorsFile& f) {
         f.tensors["conv_state"] = make_tensor("F16", {3, kConvDim, 3}, std::vector<uint16_t>(3 * 96 * 3));
       },
       "conv_state", "differs from x's F32"},
      {"cs_shape", [](SafetensorsFile& f) { f.tensors["conv_state"].shape = {3, 3, kConvDim}; },
       "conv_state", "shape [3, 3, 96]"},
      {"cs_slots",
       [](SafetensorsFile& f) {
         f.tensors["conv_state"] = make_tensor("F32", {2, kConvDim, 3}, ramp(2 * kConvDim * 3));
       },
       "conv_state", "fewer slots than num_slots=3"},
      {"no_ecs", [](SafetensorsFile& f) { f.tensors.erase("expected_conv_state"); }, "expected_conv_state",
       "missing"},
      {"ecs_shape", [](SafetensorsFile& f) { f.tensors["expected_conv_state"].shape = {3, 3, kConvDim}; },
       "expected_conv_state", "not conv_state's shape"},
      {"ecs_dtype",
       [](SafetensorsFile& f) {
         f.tensors["expected_conv_state"] = make_tensor("I32", {3, kConvDim, 3}, std::vector<int32_t>(3 * 96 * 3));
       },
       "expected_conv_state", "not supported"},
      {"x_and_q",
       [](SafetensorsFile& f) { f.tensors["q"] = make_tensor("F32", {2, 1, 16}, ramp(32)); },
       "x", "together with q/k/v"},
      {"x_shape", [](SafetensorsFile& f) { f.tensors["x"] = make_tensor("F32", {2, 95}, ramp(190)); },
       "x", "shape [2, 95]"},
      {"w_dtype",
       [](SafetensorsFile& f) {
         f.tensors["conv_weight"] = make_tensor("BF16", {kConvDim, 4}, std::vector<uint16_t>(96 * 4));
       },
       "conv_weight", "differs from x's F32"},
      {"bias_shape",
       [](SafetensorsFile& f) { f.tensors["conv_bias"] = make_tensor("F32", {64}, ramp(64)); },
       "conv_bias", "shape [64]"},
      {"z_alone", [](SafetensorsFile& f) { f.tensors.erase("norm_weight"); }, "z", "without norm_weight"},
      {"no_z", [](SafetensorsFile& f) { f.tensors.erase("z"); }, "z", "missing"},
      {"nw_shape", [](SafetensorsFile& f) { f.tensors["norm_weight"] = make_tensor("F32", {16}, ramp(16)); },
       "norm_weight", "shape [16]"},
      {"z_shape", [](SafetensorsFile& f) { f.tensors["z"] = make_tensor("F32", {2, 2, 16}, ramp(64)); },
       "z", "does not hold (B, Hv, Dv)"},
      {"z_dtype",
       [](SafetensorsFile& f) {
         f.tensors["z"] = make_tensor("F16", {2, 2, 32}, std::vector<uint16_t>(128, 0x3c00));
       },
       "z", "differs from x's F32"},
      {"norm_eps", [](SafetensorsFile& f) { f.metadata["norm_eps"] = "-1"; }, "norm_eps", "-1"},
      {"v1_with_x", [](SafetensorsFile& f) { f.metadata["format_version"] = "1"; }, "x",
       "format_version 2 tensor"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    SafetensorsFile f = valid_conv_case();
    b.edit(f);
    const std::string p = path(std::string("conv_") + b.name + ".safetensors");
    write_ok(p, f);
    expect_load_error(p, b.what, b.word);
  }
  // v2 tensors in a case without x: refused rather than ignored.
  SafetensorsFile f = valid_case();
  f.metadata["format_version"] = "2";
  f.tensors["conv_state"] = make_tensor("F32", {3, kConvDim, 3}, ramp(3 * kConvDim * 3));
  write_ok(path("cs_no_x.safetensors"), f);
  expect_load_error(path("cs_no_x.safetensors"), "conv_state", "without x");
  f = valid_case();
  f.metadata["conv_width"] = "3";
  write_ok(path("w_no_x.safetensors"), f);
  expect_load_error(path("w_no_x.safetensors"), "conv_width", "no x");
  f = valid_case();
  f.metadata["format_version"] = "2";
  f.tensors["norm_weight"] = make_tensor("F32", {32}, ramp(32));
  f.tensors["z"] = make_tensor("F16", {2, 2, 32}, std::vector<uint16_t>(128, 0x3c00));
  write_ok(path("z_q.safetensors"), f);
  expect_load_error(path("z_q.safetensors"), "z", "differs from q's F32");
}

TEST_F(GoldenTest, LoadUnsupportedDtype) {
  SafetensorsFile f = valid_case();
  f.tensors["q"] = make_tensor("F64", {2, 1, 16}, std::vector<double>(32, 0.1));
  write_ok(path("q64.safetensors"), f);
  expect_load_error(path("q64.safetensors"), "q", "not supported");

  f = valid_case();
  f.tensors["k"] = make_tensor("F16", {2, 1, 16}, std::vector<uint16_t>(32, 0x3c00));
  write_ok(path("kmix.safetensors"), f);
  expect_load_error(path("kmix.safetensors"), "k", "differs");

  f = valid_case();
  f.tensors["state_indices"] = make_tensor("U8", {2}, std::vector<uint8_t>{0, 1});
  write_ok(path("idx8.safetensors"), f);
  expect_load_error(path("idx8.safetensors"), "state_indices", "not supported");
}

TEST_F(GoldenTest, LoadInvalidIndicesMustMatchTheIndices) {
  SafetensorsFile f = valid_case();
  f.tensors["state_indices"] = make_tensor("I32", {2}, std::vector<int32_t>{0, 3});  // 3 >= 3 slots
  f.metadata["invalid_indices"] = "0";
  write_ok(path("inv.safetensors"), f);
  expect_load_error(path("inv.safetensors"), "invalid_indices", "indices hold 1");
}

TEST_F(GoldenTest, LoadReportsReaderErrors) {
  put_raw(path("junk.safetensors"), "not json", 0);
  Case c;
  std::string error;
  EXPECT_FALSE(gdn::golden::load_case(path("junk.safetensors"), &c, &error));
  EXPECT_NE(error.find("junk.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("JSON"), std::string::npos) << error;
}

TEST_F(GoldenTest, ListCasesIsRecursiveAndSorted) {
  write_ok(path("b.safetensors"), valid_case());
  fs::create_directories(dir_ / "sub");
  write_ok((dir_ / "sub" / "a.safetensors").string(), valid_case());
  put_bytes(path("notes.txt"), {1, 2, 3});
  const auto cases = gdn::golden::list_cases(dir_.string());
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[0], path("b.safetensors"));
  EXPECT_EQ(cases[1], (dir_ / "sub" / "a.safetensors").string());
  EXPECT_TRUE(gdn::golden::list_cases(path("missing")).empty());
}

}  // namespace
