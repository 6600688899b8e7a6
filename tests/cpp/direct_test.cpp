// Backend::Direct through the public API: it reports itself, reads the same bytes as the mapping
// for tensors at unaligned offsets, and says why when the filesystem refuses O_DIRECT (at open
// or at the first read, made to by the backend's test hook).
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support.hpp"

using safetensors::Backend;
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

}  // namespace
