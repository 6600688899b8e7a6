// Files written by Python's safetensors 0.8.0, and the real all-MiniLM-L6-v2 model, read through
// the public API and compared tensor by tensor with digests Python computed.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include "support.hpp"

using safetensors::Backend;
using safetensors::SafeOpen;

namespace {

/// Checks every file of a manifest with both backends; returns the number of tensors checked.
std::size_t check_manifest(const std::filesystem::path& dir, const std::string& manifest) {
  std::size_t checked = 0;
  for (const auto& [fname, want] : test::read_manifest(dir / manifest)) {
    for (auto backend : {Backend::Mmap, Backend::Read}) {
      SafeOpen f(dir / fname, {backend});
      EXPECT_EQ(f.has_metadata(), want.has_metadata) << fname;
      EXPECT_EQ(f.metadata(), want.metadata) << fname;
      EXPECT_EQ(f.size(), want.tensor_count) << fname;
      for (const auto& [name, t] : want.tensors) {
        auto info = f.info(name);
        EXPECT_EQ(safetensors::to_string(info.dtype), t.dtype) << fname << ":" << name;
        EXPECT_EQ(info.shape, t.shape) << fname << ":" << name;
        EXPECT_EQ(info.data_offsets, (std::pair{t.begin, t.end})) << fname << ":" << name;
        auto view = f.get_tensor(name);
        EXPECT_EQ(test::sha256_hex(view.data), t.sha256) << fname << ":" << name;
        ++checked;
      }
    }
  }
  return checked;
}

TEST(Interop, ReadsEveryFilePythonWrites) {
  auto dir = test::fixture("python", "manifest.tsv");
  if (!dir) return;
  // 39 NumPy-typed + 7 raw + 5 scalar/empty + 300 tensors, with two backends.
  EXPECT_EQ(check_manifest(*dir, "manifest.tsv"), 2u * (39 + 7 + 5 + 300));
}

TEST(Interop, RealMiniLmModelMatchesPythonDigests) {
  auto dir = test::fixture("minilm", "minilm.tsv", /*needs_network=*/true);
  if (!dir) return;
  EXPECT_EQ(std::filesystem::file_size(*dir / "model.safetensors"), 90'868'376u);
  EXPECT_EQ(check_manifest(*dir, "minilm.tsv"), 2u * 104);
  SafeOpen f(*dir / "model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Sha256, MatchesKnownVectors) {
  auto h = [](std::string_view s) { return test::sha256_hex(std::as_bytes(std::span(s.data(), s.size()))); };
  EXPECT_EQ(h(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(h("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(h(std::string(1000, 'a')), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

}  // namespace
