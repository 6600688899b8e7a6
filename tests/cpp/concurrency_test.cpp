// Sixteen threads reading one open file and one sharded checkpoint at once: views, slices,
// copies into caller buffers and (with a GPU) device uploads, every byte checked. The tsan
// preset runs these under ThreadSanitizer.
#include <safetensors/cuda.hpp>
#include <safetensors/memory.hpp>
#include <safetensors/prefetch.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

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

TEST_P(Concurrency, SixteenThreadsSelectOneSliceWhole) {
  // The whole tensor's plan is made on a slice's first `select({})` and shared by every later
  // one, across copies of the slice too: threads racing to make it each get a correct
  // selection, and every selection made after one was kept shares that one.
  test::TempDir dir;
  auto data = make_data(8);
  safetensors::save_file(dir / "m.safetensors", views_of(data, 0, data.size()));
  safetensors::SafeOpen f(dir / "m.safetensors", {GetParam()});
  const auto slice = f.get_slice("t5");
  const auto copy = slice;
  std::atomic<std::size_t> bad{0};
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int round = 0; round < 8; ++round) {
        auto sel = (t % 2 ? copy : slice).select({});
        bad += sel.shape() != slice.shape();
        std::vector<std::byte> out(sel.byte_size());
        sel.read_into(out);
        for (std::size_t j = 0; j < out.size(); ++j)
          bad += static_cast<std::uint8_t>(out[j]) != expected(5, j);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  const auto a = slice.select({});
  const auto b = copy.select({});
  EXPECT_EQ(safetensors::detail::Access<safetensors::Selection>::shared_plan(a),
            safetensors::detail::Access<safetensors::Selection>::shared_plan(b))
      << "one plan for every whole selection of the slice and its copies";
  EXPECT_NE(safetensors::detail::Access<safetensors::Selection>::shared_plan(a),
            safetensors::detail::Access<safetensors::Selection>::shared_plan(
                slice.select({Index::all(), Index::all()})))
      << "a selection with indices has a plan of its own";
  EXPECT_EQ(a.byte_size(), data[5].size());
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

/// One way into a file's tensor bytes, made as a file's very first access by one thread while
/// the others make theirs: returns the number of wrong bytes (or wrong outcomes).
std::size_t first_access(const safetensors::SafeOpen& f, int way, std::size_t i) {
  const auto name = "t" + std::to_string(i);
  const auto size = f.info(name).byte_size();
  std::size_t bad = 0;
  auto check = [&](std::span<const std::byte> got, std::size_t from = 0) {
    for (std::size_t j = 0; j < got.size(); ++j)
      bad += static_cast<std::uint8_t>(got[j]) != expected(i, from + j);
  };
  std::vector<std::byte> out(size);
  const std::vector<safetensors::Request> want{{name}};
  switch (way) {
    case 0:
      check(f.get_tensor(name).data);
      break;
    case 1:
      f.get_tensor_into(name, out);
      check(out);
      break;
    case 2: {
      // Tensor t0 starts the data buffer (saved in name order, one file, no padding before).
      std::vector<std::byte> head(f.info("t0").byte_size());
      f.read_data(0, head);
      for (std::size_t j = 0; j < head.size(); ++j)
        bad += static_cast<std::uint8_t>(head[j]) != expected(0, j);
      break;
    }
    case 3: {
      auto rows = f.get_slice(name).select({Index::range(1, 2), Index::all()});
      check(rows.read().data, 64);
      std::vector<std::byte> copy(rows.byte_size());
      rows.read_into(copy);
      check(copy, 64);
      break;
    }
    case 4: {
      std::vector<float> wide(size);
      f.get_tensor_as(name, Dtype::F32, std::as_writable_bytes(std::span(wide)));
      for (std::size_t j = 0; j < wide.size(); ++j) bad += wide[j] != static_cast<float>(expected(i, j));
      break;
    }
    case 5: {
      std::vector<float> wide(64);
      f.get_slice(name)
          .select({0, Index::all()})
          .read_as(Dtype::F32, std::as_writable_bytes(std::span(wide)));
      for (std::size_t j = 0; j < wide.size(); ++j) bad += wide[j] != static_cast<float>(expected(i, j));
      break;
    }
    case 6:
      for (const auto& [n, view] : f) {
        if (n == name) check(view.data);
      }
      break;
    case 7:
      check(safetensors::load(f, want).get_tensor(name).data);
      break;
    case 8: {
      // Locking maps the file; a refusal can only be the memlock limit, which the message names.
      auto locked = safetensors::nothrow::lock_pages(f, want);
      if (!locked.ok()) bad += locked.message().find("RLIMIT_MEMLOCK") == std::string::npos;
      check(f.get_tensor(name).data);
      safetensors::unlock_pages(f, want);
      break;
    }
    case 9:
      safetensors::advise(f, safetensors::Advice::WillNeed, want);
      check(f.get_tensor(name).data);
      break;
    case 10: {
      // A page this tensor shares with a neighbour may be locked by another thread (way 8) at
      // this moment: releasing it is then refused, as documented (Io, "unlock them first").
      const auto released = safetensors::nothrow::release_pages(f, want);
      if (!released.ok()) bad += released.message().find("the pages are locked") == std::string::npos;
      check(f.get_tensor(name).data);
      break;
    }
    case 11:
      for (const auto& item : safetensors::TensorStream(f, want)) check(item.view.data);
      break;
    case 12:
      safetensors::prefetch(f, want).wait();
      check(f.get_tensor(name).data);
      break;
    default: {
      // A destination inside the file's own memory is refused, whichever call maps it.
      const auto view = f.get_tensor(name);
      std::span<std::byte> inside{const_cast<std::byte*>(view.data.data()), view.data.size()};
      bad += safetensors::nothrow::get_tensor_into(f, name, inside).kind() !=
             safetensors::ErrorKind::InvalidSlice;
      bad += safetensors::nothrow::read_data(f, 0, inside.first(8)).kind() !=
             safetensors::ErrorKind::InvalidSlice;
      check(view.data);
      break;
    }
  }
  return bad;
}

constexpr int kWays = 14;

// The mapped backend maps a file at its first access of tensor bytes (see `LazyMap` in
// rust/core/src/file.rs): every way in makes that first access, and sixteen threads make it at
// once, each its own way, on files freshly opened round after round.
TEST(Concurrency, SixteenThreadsMakeAMappedFilesFirstAccessEachItsOwnWay) {
  test::TempDir dir;
  auto data = make_data(16);
  safetensors::save_file(dir / "m.safetensors", views_of(data, 0, data.size()));
  std::atomic<std::size_t> bad{0};
  for (int round = 0; round < 12; ++round) {
    safetensors::SafeOpen f(dir / "m.safetensors");
    std::barrier start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        try {
          const int way = (t + round) % kWays;
          bad += first_access(f, way, static_cast<std::size_t>(t + round) % data.size());
          // And every tensor afterwards, through the mapping another thread may have made.
          for (std::size_t i = 0; i < data.size(); ++i) bad += first_access(f, 0, i);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "thread " << t << " round " << round << ": " << e.what();
          ++bad;
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  EXPECT_EQ(bad.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, Concurrency,
                         ::testing::Values(safetensors::Backend::Mmap, safetensors::Backend::Read),
                         [](const auto& p) {
                           return p.param == safetensors::Backend::Mmap ? "Mmap" : "Read";
                         });

}  // namespace
