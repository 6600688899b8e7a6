// Backend::Direct through the public API: it reports itself, reads the same bytes as the mapping
// for tensors at unaligned offsets, says why when the filesystem refuses O_DIRECT (at open or at
// the first read, made to by the backend's test hook), and its views of at least one block own
// the aligned span they were read into.
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <optional>

#include "support.hpp"

using safetensors::Backend;
using safetensors::Index;
using safetensors::SafeOpen;

namespace {

void write_sample(const std::filesystem::path& path, std::vector<std::vector<std::uint8_t>>& datas) {
  const std::size_t lens[] = {3, 4097, 70001, 1 << 20};
  std::map<std::string, safetensors::TensorView> tensors;
  for (std::size_t t = 0; t < 4; ++t) {
    datas.emplace_back(lens[t]);
    for (std::size_t i = 0; i < lens[t]; ++i) datas[t][i] = static_cast<std::uint8_t>(i * 7 + t);
  }
  for (std::size_t t = 0; t < 4; ++t)
    tensors.emplace(
        "t" + std::to_string(t),
        safetensors::TensorView{safetensors::Dtype::U8, {lens[t]}, std::as_bytes(std::span(datas[t]))});
  safetensors::save_file(path, tensors);
}

TEST(Direct, ReadsTheMappedBytesAndReportsItsBackend) {
  test::TempDir dir;
  std::vector<std::vector<std::uint8_t>> datas;
  write_sample(dir / "d.safetensors", datas);
  SafeOpen f(dir / "d.safetensors", {Backend::Direct});
  EXPECT_EQ(f.backend(), Backend::Direct);
  SafeOpen m(dir / "d.safetensors");
  EXPECT_EQ(m.direct_fallback(), "");
  for (const auto& name : f.keys()) {
    auto a = f.get_tensor(name);
    auto b = m.get_tensor(name);
    ASSERT_EQ(a.data.size(), b.data.size());
    EXPECT_TRUE(std::equal(a.data.begin(), a.data.end(), b.data.begin())) << name;
  }
}

// This kernel accepts O_DIRECT even on tmpfs, so the refusal is made by the backend's test hook
// (SAFETENSORS_TEST_REFUSE_O_DIRECT, read at each open; see rust/core/src/direct.rs): `open`
// refuses the O_DIRECT open, `read` the first read through it, as a filesystem would.
TEST(Direct, SaysWhyWhenTheFilesystemRefusesODirect) {
  test::TempDir dir;
  std::vector<std::vector<std::uint8_t>> datas;
  write_sample(dir / "f.safetensors", datas);
  for (const std::string mode : {"open", "read"}) {
    ASSERT_EQ(::setenv("SAFETENSORS_TEST_REFUSE_O_DIRECT", mode.c_str(), 1), 0);
    SafeOpen f(dir / "f.safetensors", {Backend::Direct});
    ::unsetenv("SAFETENSORS_TEST_REFUSE_O_DIRECT");
    for (std::size_t t = 0; t < datas.size(); ++t) {
      auto got = f.get_tensor("t" + std::to_string(t));
      auto want = std::as_bytes(std::span(datas[t]));
      ASSERT_EQ(got.data.size(), want.size()) << mode;
      EXPECT_TRUE(std::equal(got.data.begin(), got.data.end(), want.begin())) << mode << " t" << t;
    }
    std::string why = f.direct_fallback();
    EXPECT_NE(why.find("O_DIRECT"), std::string::npos) << why;
    EXPECT_NE(why.find("pread"), std::string::npos) << why;
    EXPECT_NE(why.find(mode == "open" ? "at open" : "read"), std::string::npos) << mode << ": " << why;
  }
  // Without the hook, a file opened later reads through O_DIRECT again wherever the
  // filesystem accepts it.
  SafeOpen f(dir / "f.safetensors", {Backend::Direct});
  auto t = f.get_tensor("t3");
  EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), std::as_bytes(std::span(datas[3])).begin()));
  if (int fd = ::open((dir / "f.safetensors").c_str(), O_RDONLY | O_DIRECT); fd >= 0) {
    ::close(fd);
    EXPECT_EQ(f.direct_fallback(), "");
  }
}

/// Whether `v`'s data sits in its buffer where its bytes sit in the file's 4096-byte blocks:
/// what a view reading the aligned span around its bytes straight from the disk looks like.
bool aligned_like_the_file(const safetensors::TensorView& v, std::size_t file_offset) {
  return reinterpret_cast<std::uintptr_t>(v.data.data()) % 4096 == file_offset % 4096;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Views of at least one block own the aligned span around their bytes (no bounce copy): their
// data points into it at the tensor's offset within its first block. Smaller ones get a buffer
// of their own size. Either way the bytes equal the mapped view's, with O_DIRECT working and
// with the filesystem refusing it at open or at the first read, and they outlive the file.
TEST(Direct, ViewsOwnAlignedBuffersAndEqualTheMappedViews) {
  test::TempDir dir;
  std::vector<std::vector<std::uint8_t>> datas;
  write_sample(dir / "a.safetensors", datas);
  SafeOpen m(dir / "a.safetensors");
  for (const std::string mode : {"", "open", "read"}) {
    if (!mode.empty()) {
      ASSERT_EQ(::setenv("SAFETENSORS_TEST_REFUSE_O_DIRECT", mode.c_str(), 1), 0);
    }
    std::optional<SafeOpen> f(std::in_place, dir / "a.safetensors",
                              safetensors::OpenOptions{Backend::Direct});
    ::unsetenv("SAFETENSORS_TEST_REFUSE_O_DIRECT");
    std::vector<safetensors::TensorView> kept;
    for (const auto& name : m.keys()) {
      auto v = f->get_tensor(name);
      auto info = m.info(name);
      EXPECT_TRUE(same(v.data, m.get_tensor(name).data)) << mode << " " << name;
      if (info.byte_size() >= 4096) {
        EXPECT_TRUE(aligned_like_the_file(v, m.data_offset() + info.data_offsets.first))
            << mode << " " << name;
      }
      kept.push_back(std::move(v));
    }
    // Rows of the 1 MiB tensor, as a single run: read the same way.
    auto rows = f->get_slice("t3").select({Index::range(5000, 600'000)}).read();
    EXPECT_TRUE(same(rows.data, m.get_slice("t3").select({Index::range(5000, 600'000)}).read().data));
    EXPECT_TRUE(aligned_like_the_file(rows, m.data_offset() + m.info("t3").data_offsets.first + 5000))
        << mode;
    f.reset();
    for (std::size_t t = 0; t < datas.size(); ++t)
      EXPECT_TRUE(same(kept[t].data, std::as_bytes(std::span(datas[t])))) << "views outlive the file";
  }
}

}  // namespace
