// Sixteen threads reading one open file and one sharded checkpoint at once: views, slices,
// copies into caller buffers and (with a GPU) device uploads, every byte checked. The tsan
// preset runs these under ThreadSanitizer.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <thread>

#include "support.hpp"

using safetensors::Dtype;
using safetensors::Index;
using safetensors::TensorView;

namespace {

constexpr int kThreads = 16;

/// Byte `j` of tensor `i`: every byte says where it came from.
std::uint8_t expected(std::size_t i, std::size_t j) {
  return static_cast<std::uint8_t>(i * 131 + j * 7 + j / 256);
}

/// Tensors t0..t{n-1} of shape [rows, 64] U8 with the expected bytes.
std::vector<std::vector<std::uint8_t>> make_data(std::size_t n) {
  std::vector<std::vector<std::uint8_t>> data(n);
  for (std::size_t i = 0; i < n; ++i) {
    data[i].resize((i % 7 + 1) * 64 * 16);
    for (std::size_t j = 0; j < data[i].size(); ++j) data[i][j] = expected(i, j);
  }
  return data;
}

std::vector<std::pair<std::string, TensorView>> views_of(const std::vector<std::vector<std::uint8_t>>& data,
                                                         std::size_t from, std::size_t to) {
  std::vector<std::pair<std::string, TensorView>> out;
  for (std::size_t i = from; i < to; ++i) {
    out.emplace_back("t" + std::to_string(i),
                     TensorView{Dtype::U8, {data[i].size() / 64, 64}, std::as_bytes(std::span(data[i])), {}});
  }
  return out;
}

/// Checks one tensor's bytes, a column slice of it, and a copy of that slice into a buffer.
/// Returns the number of wrong bytes.
template <class Source>
std::size_t check_tensor(const Source& src, std::size_t i) {
  std::size_t bad = 0;
  auto name = "t" + std::to_string(i);
  auto view = src.get_tensor(name);
  auto bytes = view.template as<std::uint8_t>();
  for (std::size_t j = 0; j < bytes.size(); ++j) bad += bytes[j] != expected(i, j);
  auto sel = src.get_slice(name).select({Index::all(), Index::range(8, 24)});
  auto cols = sel.read();
  auto c = cols.template as<std::uint8_t>();
  std::vector<std::byte> copy(sel.byte_size());
  sel.read_into(copy);
  for (std::size_t r = 0; r < sel.shape()[0]; ++r) {
    for (std::size_t k = 0; k < 16; ++k) {
      auto want = expected(i, r * 64 + 8 + k);
      bad += c[r * 16 + k] != want;
      bad += static_cast<std::uint8_t>(copy[r * 16 + k]) != want;
    }
  }
  return bad;
}

class Concurrency : public ::testing::TestWithParam<safetensors::Backend> {};

TEST_P(Concurrency, SixteenThreadsReadOneFile) {
  test::TempDir dir;
  auto data = make_data(48);
  safetensors::save_file(dir / "m.safetensors", views_of(data, 0, data.size()), {{"format", "pt"}});
  safetensors::SafeOpen f(dir / "m.safetensors", {GetParam()});
  std::atomic<std::size_t> bad{0};
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int round = 0; round < 4; ++round) {
        for (std::size_t i = 0; i < data.size(); ++i) {
          std::size_t k = (i + static_cast<std::size_t>(t) * 5) % data.size();
          bad += check_tensor(f, k);
        }
        bad += f.keys().size() != data.size();
        bad += f.metadata().at("format") != "pt";
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
}

TEST_P(Concurrency, SixteenThreadsOpenShardsOnFirstUse) {
  test::TempDir dir;
  auto data = make_data(36);
  std::string weight_map;
  for (int s = 0; s < 4; ++s) {
    auto file = "part-" + std::to_string(s) + ".safetensors";
    safetensors::save_file(
        dir / file, views_of(data, static_cast<std::size_t>(s) * 9, static_cast<std::size_t>(s + 1) * 9));
    for (int i = s * 9; i < (s + 1) * 9; ++i) {
      weight_map +=
          (weight_map.empty() ? "" : ",") + std::string("\"t") + std::to_string(i) + "\":\"" + file + "\"";
    }
  }
  std::ofstream(dir / "m.safetensors.index.json") << "{\"weight_map\":{" << weight_map << "}}";
  safetensors::Checkpoint ckpt(dir / "m.safetensors.index.json", {GetParam()});
  std::atomic<std::size_t> bad{0};
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();  // every thread's first call races to open the shards
      for (std::size_t i = 0; i < data.size(); ++i)
        bad += check_tensor(ckpt, (i + static_cast<std::size_t>(t) * 7) % data.size());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_EQ(ckpt.shards_opened(), 4u);
}

TEST_P(Concurrency, SixteenThreadsUploadToTheGpu) {
  if (!safetensors::cuda::available()) {
    std::cout << "GPU part skipped: " << safetensors::cuda::why_unavailable() << "\n";
    return;
  }
  test::TempDir dir;
  auto data = make_data(24);
  safetensors::save_file(dir / "m.safetensors", views_of(data, 0, data.size()));
  safetensors::SafeOpen f(dir / "m.safetensors", {GetParam()});
  std::atomic<std::size_t> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto loaded = safetensors::cuda::load(f, 0, {.slot_bytes = 64u << 10, .readers = 2});
      for (const auto& p : loaded.placements()) {
        std::vector<std::byte> back(p.byte_size);
        safetensors::cuda::copy_to_host(loaded.data(p.name), back);
        auto i = std::stoul(p.name.substr(1));
        for (std::size_t j = 0; j < back.size(); ++j)
          bad += static_cast<std::uint8_t>(back[j]) != expected(i, j);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, Concurrency,
                         ::testing::Values(safetensors::Backend::Mmap, safetensors::Backend::Read),
                         [](const auto& p) {
                           return p.param == safetensors::Backend::Mmap ? "Mmap" : "Read";
                         });

}  // namespace
