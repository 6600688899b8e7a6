// The hostile-file corpus (tests/hostile/make_corpus.py) through the public API: every case is a
// safetensors::Error of its expected kind naming the file, with every backend, opened or
// streamed; never a crash (the asan preset runs this under ASan + UBSan). Look-alikes that must
// open do, and read back.
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "support.hpp"

using safetensors::Backend;
using safetensors::SafeOpen;

namespace {

struct Case {
  std::string file, kind, what;
};

std::optional<std::pair<std::filesystem::path, std::vector<Case>>> corpus() {
  auto dir = test::fixture("hostile", "manifest.tsv");
  if (!dir) return std::nullopt;
  std::vector<Case> cases;
  std::ifstream in(*dir / "manifest.tsv");
  for (std::string line; std::getline(in, line);) {
    std::istringstream cols(line);
    Case c;
    std::getline(cols, c.file, '\t');
    std::getline(cols, c.kind, '\t');
    std::getline(cols, c.what, '\t');
    cases.push_back(c);
  }
  return std::make_pair(*dir, cases);
}

class Hostile : public ::testing::TestWithParam<Backend> {};

TEST_P(Hostile, EveryCaseIsItsExpectedErrorKindNamingTheFile) {
  auto c = corpus();
  if (!c) return;
  auto& [dir, cases] = *c;
  ASSERT_GT(cases.size(), 100u);
  for (const auto& k : cases) {
    auto path = dir / k.file;
    std::string got = "OK";
    try {
      SafeOpen f(path, {GetParam()});
      for (const auto& name : f.keys()) {
        auto view = f.get_tensor(name);
        EXPECT_EQ(view.data.size(), f.info(name).byte_size()) << k.file;
      }
    } catch (const safetensors::Error& e) {
      got = std::string(safetensors::to_string(e.kind()));
      EXPECT_NE(std::string(e.what()).find(k.file.substr(0, k.file.size() - 12)), std::string::npos)
          << k.file << ": " << e.what();
    }
    EXPECT_EQ(got, k.kind) << k.file << " (" << k.what << ")";
  }
}

TEST_P(Hostile, HintsNameTheLikelyCause) {
  auto c = corpus();
  if (!c) return;
  auto& dir = c->first;
  auto message = [&](const char* file) -> std::string {
    try {
      SafeOpen f(dir / file, {GetParam()});
    } catch (const safetensors::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("git_lfs_pointer.safetensors").find("git-lfs pointer"), std::string::npos);
  EXPECT_NE(message("data_truncated.safetensors").find("interrupted download"), std::string::npos);
  EXPECT_NE(message("data_trailing.safetensors").find("1 extra byte"), std::string::npos);
  EXPECT_NE(message("a_directory.safetensors").find("directory"), std::string::npos);
  EXPECT_NE(message("a_fifo.safetensors").find("not a regular file"), std::string::npos);
}

// The same corpus in memory: every regular file's bytes through SafeOpen::from_bytes, with the
// same error kind as from the file, the name given standing for it in the message.
TEST(HostileInMemory, EveryCaseIsItsExpectedErrorKindNamingTheBuffer) {
  auto c = corpus();
  if (!c) return;
  auto& [dir, cases] = *c;
  std::size_t checked = 0;
  for (const auto& k : cases) {
    auto path = dir / k.file;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) continue;  // directories, FIFOs: files only
    std::ifstream in(path, std::ios::binary);
    std::vector<char> raw{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    // An owned, exactly sized copy: ASan reports any read past the buffer's end.
    auto owner = std::make_shared<std::vector<std::byte>>(raw.size());
    if (!raw.empty()) std::memcpy(owner->data(), raw.data(), raw.size());
    std::string got = "OK";
    try {
      auto f = SafeOpen::from_bytes(*owner, owner, {}, k.file);
      for (const auto& name : f.keys()) {
        auto view = f.get_tensor(name);
        EXPECT_EQ(view.data.size(), f.info(name).byte_size()) << k.file;
      }
    } catch (const safetensors::Error& e) {
      got = std::string(safetensors::to_string(e.kind()));
      EXPECT_NE(std::string(e.what()).find(k.file), std::string::npos) << k.file << ": " << e.what();
    }
    EXPECT_EQ(got, k.kind) << k.file << " (" << k.what << ") in memory";
    ++checked;
  }
  EXPECT_GT(checked, 100u);
}

/// How reading every tensor of `path` ends, as an error kind's name or "OK": through
/// `SafeOpen`/`Checkpoint::get_tensor`, or through a `TensorStream` whose bytes must equal them.
std::string outcome(const std::filesystem::path& path, Backend backend, bool as_checkpoint, bool streamed) {
  try {
    std::optional<SafeOpen> f;
    std::optional<safetensors::Checkpoint> ckpt;
    if (as_checkpoint) {
      ckpt.emplace(path, safetensors::CheckpointOptions{backend});
    } else {
      f.emplace(path, safetensors::OpenOptions{backend});
    }
    auto get = [&](const std::string& name) { return f ? f->get_tensor(name) : ckpt->get_tensor(name); };
    const std::size_t count = f ? f->size() : ckpt->size();
    if (!streamed) {
      for (const auto& name : f ? f->keys() : ckpt->keys()) (void)get(name);
      return "OK";
    }
    const safetensors::StreamOptions small{.max_inflight_bytes = 4096};
    auto stream = f ? safetensors::TensorStream(*f, {}, small) : safetensors::TensorStream(*ckpt, {}, small);
    std::size_t n = 0;
    for (auto& item : stream) {
      auto want = get(item.name);
      EXPECT_TRUE(item.view.data.size() == want.data.size() &&
                  std::equal(want.data.begin(), want.data.end(), item.view.data.begin()))
          << path << " " << item.name;
      ++n;
    }
    EXPECT_EQ(n, count) << path;
    return "OK";
  } catch (const safetensors::Error& e) {
    return std::string(safetensors::to_string(e.kind()));
  }
}

// The corpus through streams, of the file and of the file as a checkpoint: every case ends with
// the same error kind as reading it through SafeOpen (or Checkpoint), at the open, when the
// stream is made or from `next`, and every file that opens streams exactly its get_tensor bytes.
TEST_P(Hostile, EveryCaseStreamsAsSafeOpenReadsIt) {
  auto c = corpus();
  if (!c) return;
  auto& [dir, cases] = *c;
  for (const auto& k : cases) {
    auto path = dir / k.file;
    EXPECT_EQ(outcome(path, GetParam(), false, true), k.kind) << k.file << " (" << k.what << ")";
    EXPECT_EQ(outcome(path, GetParam(), true, true), outcome(path, GetParam(), true, false))
        << k.file << " (" << k.what << ") as a checkpoint";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Hostile, ::testing::Values(Backend::Mmap, Backend::Read, Backend::Direct),
                         [](const auto& p) {
                           return p.param == Backend::Mmap   ? "Mmap"
                                  : p.param == Backend::Read ? "Read"
                                                             : "Direct";
                         });

}  // namespace
