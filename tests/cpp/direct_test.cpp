// Backend::Direct through the public API: it reports itself, reads the same bytes as the mapping
// for tensors at unaligned offsets, and says why when the filesystem refuses O_DIRECT.
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
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

TEST(Direct, SaysWhyWhenTheFilesystemRefusesODirect) {
  const std::filesystem::path shm = "/dev/shm";
  std::error_code ec;
  auto path = shm / ("safetensors-direct-test-" + std::to_string(::getpid()) + ".safetensors");
  if (!std::filesystem::is_directory(shm, ec)) GTEST_SKIP() << "no /dev/shm (tmpfs) here";
  std::vector<std::vector<std::uint8_t>> datas;
  write_sample(path, datas);
  // Kernels from 6.6 on accept O_DIRECT on tmpfs: then there is nothing to fall back from.
  if (int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT); fd >= 0) {
    ::close(fd);
    std::filesystem::remove(path, ec);
    GTEST_SKIP() << "/dev/shm accepts O_DIRECT on this kernel; nothing to fall back from";
  }
  std::string why;
  {
    SafeOpen f(path, {Backend::Direct});
    auto t = f.get_tensor("t2");
    EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), std::as_bytes(std::span(datas[2])).begin()));
    why = f.direct_fallback();
  }
  std::filesystem::remove(path, ec);
  EXPECT_NE(why.find("O_DIRECT"), std::string::npos) << why;
}

}  // namespace
