// Every malformed file gives safetensors::Error with the right kind and a message naming the
// file, with both backends; never a crash (the asan preset runs this under ASan + UBSan).
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>

#include "support.hpp"

using safetensors::Backend;
using safetensors::ErrorKind;
using safetensors::SafeOpen;

namespace {

struct Case {
  const char* name;
  std::vector<std::uint8_t> bytes;
  ErrorKind kind;
};

std::vector<std::uint8_t> prefix_only(std::uint64_t n, std::string_view rest) {
  std::vector<std::uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

std::string entry(std::string_view name, std::string_view dtype, std::string_view shape, std::size_t b, std::size_t e) {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":[" + std::string(shape) +
         "],\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

std::vector<Case> cases() {
  using test::raw_file;
  const std::string one = "{" + entry("a", "F32", "2", 0, 8) + "}";
  std::vector<Case> c;
  c.push_back({"empty_file", {}, ErrorKind::HeaderTooSmall});
  c.push_back({"seven_bytes", {1, 2, 3, 4, 5, 6, 7}, ErrorKind::HeaderTooSmall});
  c.push_back({"header_over_limit", prefix_only(100'000'001, "{}"), ErrorKind::HeaderTooLarge});
  c.push_back({"length_near_2_64", prefix_only(~0ull, "{}"), ErrorKind::HeaderTooLarge});
  std::string lfs = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 548105171\n";
  c.push_back({"git_lfs_pointer", {lfs.begin(), lfs.end()}, ErrorKind::HeaderTooLarge});
  c.push_back({"header_past_end", prefix_only(64, "{}"), ErrorKind::InvalidHeaderLength});
  c.push_back({"not_utf8", raw_file("{\"\xff\":1}", 0), ErrorKind::InvalidHeader});
  c.push_back({"root_is_array", raw_file("[]", 0), ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"unknown_dtype", raw_file("{" + entry("a", "F33", "2", 0, 8) + "}", 8), ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"lowercase_dtype", raw_file("{" + entry("a", "f32", "2", 0, 8) + "}", 8), ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"negative_dim", raw_file("{" + entry("a", "F32", "-2", 0, 8) + "}", 8), ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"nul_padding", raw_file(one + std::string(3, '\0'), 8), ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"trailing_comma", raw_file("{" + entry("a", "F32", "2", 0, 8) + ",}", 8), ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"metadata_not_string", raw_file(R"({"__metadata__":{"k":1}})", 0), ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"deep_nesting", raw_file("{\"a\":" + std::string(500, '[') + std::string(500, ']') + "}", 0),
               ErrorKind::InvalidHeaderDeserialization});
  c.push_back({"gap", raw_file("{" + entry("a", "U8", "2", 0, 2) + "," + entry("b", "U8", "2", 3, 5) + "}", 5),
               ErrorKind::InvalidOffset});
  c.push_back({"overlap", raw_file("{" + entry("a", "U8", "2", 0, 2) + "," + entry("b", "U8", "2", 1, 3) + "}", 3),
               ErrorKind::InvalidOffset});
  c.push_back({"hole_at_start", raw_file("{" + entry("a", "U8", "2", 2, 4) + "}", 4), ErrorKind::InvalidOffset});
  c.push_back({"dims_overflow", raw_file("{" + entry("a", "U8", "4294967296,4294967296,0", 0, 0) + "}", 0),
               ErrorKind::ValidationOverflow});
  c.push_back({"bits_overflow", raw_file("{" + entry("a", "F64", "2305843009213693952", 0, 0) + "}", 0),
               ErrorKind::ValidationOverflow});
  c.push_back({"f4_odd_count", raw_file("{" + entry("a", "F4", "3", 0, 2) + "}", 2), ErrorKind::MisalignedSlice});
  c.push_back({"size_mismatch", raw_file("{" + entry("a", "F32", "2", 0, 7) + "}", 7), ErrorKind::TensorInvalidInfo});
  c.push_back({"truncated_data", raw_file(one, 5), ErrorKind::MetadataIncompleteBuffer});
  c.push_back({"trailing_bytes", raw_file(one, 9), ErrorKind::MetadataIncompleteBuffer});
  c.push_back({"end_near_2_64", raw_file("{" + entry("a", "U8", "2305843009213693951", 0, 2305843009213693951) + "}", 0),
               ErrorKind::MetadataIncompleteBuffer});
  c.push_back({"duplicate_tensor", raw_file("{" + entry("a", "U8", "1", 0, 1) + "," + entry("a", "U8", "1", 1, 2) + "}", 2),
               ErrorKind::DuplicateKey});
  c.push_back({"duplicate_metadata_key", raw_file(R"({"__metadata__":{"k":"1","k":"2"}})", 0), ErrorKind::DuplicateKey});
  return c;
}

class Malformed : public ::testing::TestWithParam<Backend> {};

TEST_P(Malformed, EveryCaseIsATypedErrorNamingTheFile) {
  test::TempDir dir;
  for (const auto& c : cases()) {
    auto path = dir / (std::string(c.name) + ".safetensors");
    test::write_bytes(path, c.bytes);
    try {
      SafeOpen f(path, {GetParam()});
      ADD_FAILURE() << c.name << ": opened without error";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), c.kind) << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(path.filename().string()), std::string::npos) << c.name << ": " << e.what();
    }
  }
}

TEST_P(Malformed, HintsNameTheLikelyCause) {
  test::TempDir dir;
  for (const auto& c : cases()) {
    std::string_view name = c.name;
    if (name != "git_lfs_pointer" && name != "truncated_data") continue;
    auto path = dir / "x.safetensors";
    test::write_bytes(path, c.bytes);
    try {
      SafeOpen f(path, {GetParam()});
      ADD_FAILURE() << name;
    } catch (const safetensors::Error& e) {
      std::string want = name == "git_lfs_pointer" ? "git-lfs pointer" : "interrupted download";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST_P(Malformed, FilesystemProblemsAreIoErrors) {
  test::TempDir dir;
  auto expect_io = [&](const std::filesystem::path& p, std::string_view needle) {
    try {
      SafeOpen f(p, {GetParam()});
      ADD_FAILURE() << p;
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_io(dir / "missing.safetensors", "missing.safetensors");
  expect_io(dir.path(), "directory");
  auto fifo = dir / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_io(fifo, "not a regular file");
}

INSTANTIATE_TEST_SUITE_P(Backends, Malformed, ::testing::Values(Backend::Mmap, Backend::Read),
                         [](const auto& p) { return p.param == Backend::Mmap ? "Mmap" : "Read"; });

TEST(Lenient, AcceptsWhatTheReferenceAccepts) {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::size_t>> ok = {
      {" \t\n{" + entry("a", "F32", "2", 0, 8) + "}", 8},
      {"{" + entry("a", "F32", "2", 0, 8) + "}\t\n\r ", 8},
      {R"({"a":{"x":[1,{"y":null}],"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8},
      {R"({"__metadata__":null,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8},
      {"{" + entry("z", "F32", "0", 0, 0) + "," + entry("a", "F32", "2", 0, 8) + "}", 8},
      {"{}", 0},
      {"{" + entry("a", "U8", "0,4294967296,4294967296", 0, 0) + "}", 0},
  };
  for (const auto& [json, len] : ok) {
    auto path = dir / "ok.safetensors";
    test::write_bytes(path, test::raw_file(json, len));
    EXPECT_NO_THROW(SafeOpen f(path)) << json;
  }
}

}  // namespace
