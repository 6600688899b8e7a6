// Remote files through the public API (`SafeOpen::open_remote`, its nothrow twin, `is_url`),
// against nginx on loopback, started here. The transport's own checks (faults, version pin,
// hostile files over HTTP) are rust/remote/tests/http.rs. Without nginx the server tests skip,
// unless SAFETENSORS_REQUIRE_SERVERS=1, which makes that a failure.
#include <safetensors.h>
#include <safetensors/distributed.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <gtest/gtest.h>

#include "multi_rank.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "program.hpp"
#include "servers.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using test::Nginx;
using test::servers_required;

std::vector<std::uint8_t> sample() {
  std::vector<float> w(50'000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  std::vector<std::uint8_t> b{1, 2, 3, 4, 5, 6};
  safetensors::TensorView wv{safetensors::Dtype::F32, {250, 200}, std::as_bytes(std::span(w))};
  safetensors::TensorView bv{safetensors::Dtype::U8, {2, 3}, std::as_bytes(std::span(b))};
  auto bytes = safetensors::serialize({{"w", wv}, {"b", bv}}, {{"format", "pt"}});
  return {reinterpret_cast<const std::uint8_t*>(bytes.data()),
          reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size()};
}

/// A checkpoint of two shards and its index (`m.safetensors.index.json`) in `dir`.
void write_checkpoint(const fs::path& dir) {
  std::vector<float> a(30'000);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.25f;
  std::vector<std::uint8_t> b{9, 8, 7, 6};
  auto one = safetensors::serialize(
      {{"a", safetensors::TensorView{safetensors::Dtype::F32, {300, 100}, std::as_bytes(std::span(a))}}});
  auto two = safetensors::serialize(
      {{"b", safetensors::TensorView{safetensors::Dtype::U8, {4}, std::as_bytes(std::span(b))}}});
  auto as_u8 = [](const auto& bytes) {
    return std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                     reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size());
  };
  test::write_bytes(dir / "m-1.safetensors", as_u8(one));
  test::write_bytes(dir / "m-2.safetensors", as_u8(two));
  const std::string index =
      R"({"metadata": {"total_size": "120004"}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}})";
  test::write_bytes(dir / "m.safetensors.index.json", std::vector<std::uint8_t>(index.begin(), index.end()));
}

/// A directory served by nginx holding `model.safetensors`, or a skip.
struct Served {
  test::TempDir root, work;
  std::optional<Nginx> server;
};

#define SERVE_OR_SKIP(s)                                                                                \
  Served s;                                                                                             \
  test::write_bytes(s.root / "model.safetensors", sample());                                            \
  if (auto started = Nginx::start(s.root.path(), s.work.path())) s.server.emplace(std::move(*started)); \
  if (!s.server) {                                                                                      \
    if (servers_required()) FAIL() << "SAFETENSORS_REQUIRE_SERVERS=1 but nginx cannot run";             \
    GTEST_SKIP() << "nginx is not installed (apt-get install nginx)";                                   \
  }                                                                                                     \
  if (!safetensors::remote_built()) GTEST_SKIP() << "built with SAFETENSORS_REMOTE=OFF"

TEST(RemoteUrl, IsToldByItsSchemeOnly) {
  EXPECT_TRUE(safetensors::is_url("s3://bucket/model.safetensors"));
  EXPECT_TRUE(safetensors::is_url("https://example.com/model.safetensors"));
  EXPECT_TRUE(safetensors::is_url("HTTP://example.com/m"));
  EXPECT_FALSE(safetensors::is_url("model.safetensors"));
  EXPECT_FALSE(safetensors::is_url("dir/http://x"));
  EXPECT_FALSE(safetensors::is_url("file:///tmp/m.safetensors"));
}

TEST(RemoteUrl, CredentialsInAUrlAreRefusedAndNeverShown) {
  auto opened = safetensors::nothrow::open_remote("https://alice:hunter2@127.0.0.1:9/m.safetensors");
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.status().kind(), safetensors::ErrorKind::Io);
  EXPECT_EQ(opened.status().message().find("hunter2"), std::string::npos) << opened.status().message();
  EXPECT_NE(opened.status().message().find("https://127.0.0.1:9/m.safetensors"), std::string::npos)
      << opened.status().message();
}

TEST(RemoteUrl, IsShownWithoutItsQueryOrCredentials) {
  EXPECT_EQ(safetensors::redact_url("https://u:hunter2@h:8443/m.safetensors?sig=hunter2"),
            "https://h:8443/m.safetensors");
  EXPECT_EQ(safetensors::redact_url("s3://b/k.safetensors"), "s3://b/k.safetensors");
}

// A pre-signed URL is opened, its signature never shown: not in a message of the C++ API.
TEST(Remote, ASignedUrlOpensAndItsSignatureIsNeverShown) {
  SERVE_OR_SKIP(s);
  const auto url = s.server->url("model.safetensors") + "?X-Amz-Signature=Sig0123456789hunter2";
  auto f = safetensors::SafeOpen::open_remote(url);
  EXPECT_EQ(f.get_tensor("b").shape, (std::vector<std::size_t>{2, 3}));
  auto missing =
      safetensors::nothrow::open_remote(s.server->url("absent.safetensors") + "?sig=Sig0123456789hunter2");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().message().find("hunter2"), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("404"), std::string::npos) << missing.status().message();
}

// A URL is UTF-8 text: other bytes are refused, never read lossily as another object's URL
// (nothing listens on port 1, so an attempt would fail on the connection instead).
TEST(RemoteUrl, AUrlThatIsNotUtf8IsRefused) {
  if (!safetensors::remote_built()) GTEST_SKIP() << "built with SAFETENSORS_REMOTE=OFF";
  for (const std::string url :
       {"http://127.0.0.1:1/m\xff.safetensors", "http://127.0.0.1:1/m\xff.index.json"}) {
    auto opened = url.ends_with(".json") ? safetensors::nothrow::open_remote_checkpoint(url).status()
                                         : safetensors::nothrow::open_remote(url).status();
    EXPECT_EQ(opened.kind(), safetensors::ErrorKind::Io);
    EXPECT_NE(opened.message().find("UTF-8"), std::string::npos) << opened.message();
  }
}

// The build is what CMake configured: with SAFETENSORS_REMOTE=OFF a URL is an Io error that
// says so (and names the URL without its credentials), never an attempt to open a local path.
// The C++ defaults are written in the header (a struct's initializers); the C defaults come
// from the remote crate (`st_remote_options_default`). Held equal here, so that the header
// cannot drift from the crate's rule.
TEST(RemoteUrl, TheCxxDefaultsAreTheRemoteCratesDefaults) {
  const safetensors::RemoteOptions cxx;
  st_remote_options c;
  st_remote_options_default(&c);
  EXPECT_EQ(cxx.concurrency, c.concurrency);
  EXPECT_EQ(cxx.part_size, c.part_size);
  EXPECT_EQ(cxx.first_read, c.first_read);
  EXPECT_EQ(static_cast<std::uint64_t>(cxx.request_timeout.count()), c.request_timeout_ms);
  EXPECT_EQ(static_cast<std::uint64_t>(cxx.connect_timeout.count()), c.connect_timeout_ms);
  EXPECT_EQ(cxx.max_retries, c.max_retries);
  EXPECT_EQ(static_cast<std::uint64_t>(cxx.deadline.count()), c.deadline_ms);
  EXPECT_EQ(cxx.cache_limit, c.cache_limit);
  EXPECT_FALSE(cxx.header_only || cxx.on_demand || cxx.cache);
  EXPECT_EQ(c.flags, 0u);
}

TEST(RemoteUrl, TheBuildOpensRemoteFilesExactlyWhenConfiguredTo) {
  EXPECT_EQ(safetensors::remote_built(), static_cast<bool>(SAFETENSORS_TEST_REMOTE));
  if (safetensors::remote_built()) return;
  auto opened = safetensors::nothrow::open_remote("https://user:hunter2@example.com/m.safetensors");
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.status().kind(), safetensors::ErrorKind::Io);
  const auto& message = opened.status().message();
  EXPECT_NE(message.find("-DSAFETENSORS_REMOTE=ON"), std::string::npos) << message;
  EXPECT_NE(message.find("https://example.com/m.safetensors"), std::string::npos) << message;
  EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
}

TEST(Remote, OpensAsTheLocalFileWithEveryReadingOperation) {
  SERVE_OR_SKIP(s);
  safetensors::SafeOpen local(s.root / "model.safetensors");
  auto remote = safetensors::SafeOpen::open_remote(s.server->url("model.safetensors"),
                                                   {.part_size = 4096, .first_read = 16});
  EXPECT_EQ(remote.path(), fs::path(s.server->url("model.safetensors")));
  EXPECT_EQ(remote.keys(), local.keys());
  EXPECT_EQ(remote.metadata(), local.metadata());
  for (const auto& name : local.keys()) {
    auto a = remote.get_tensor(name);
    auto b = local.get_tensor(name);
    ASSERT_EQ(a.data.size(), b.data.size());
    EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size()), 0) << name;
  }
  // A slice reads only its runs, from the bytes in memory.
  auto rows = remote.get_slice("w").select({safetensors::Index::range(10, 12)}).read();
  auto want = local.get_slice("w").select({safetensors::Index::range(10, 12)}).read();
  ASSERT_EQ(rows.data.size(), want.data.size());
  EXPECT_EQ(std::memcmp(rows.data.data(), want.data.data(), rows.data.size()), 0);
}

// A remote file is a file in memory that the core owns: a stream made from it keeps its bytes
// alive after the SafeOpen is gone (the asan preset runs this).
TEST(Remote, AStreamOutlivesTheSafeOpenItCameFrom) {
  SERVE_OR_SKIP(s);
  safetensors::SafeOpen local(s.root / "model.safetensors");
  std::optional<safetensors::TensorStream> stream;
  {
    auto remote = safetensors::SafeOpen::open_remote(s.server->url("model.safetensors"), {.part_size = 1000});
    stream.emplace(remote);
  }
  std::size_t seen = 0;
  for (auto& item : *stream) {
    auto want = local.get_tensor(item.name);
    ASSERT_EQ(item.view.data.size(), want.data.size()) << item.name;
    EXPECT_EQ(std::memcmp(item.view.data.data(), want.data.data(), want.data.size()), 0) << item.name;
    ++seen;
  }
  EXPECT_EQ(seen, local.size());
}

// On demand: nothing but the header at open, then each read's bytes; every reading operation
// gives the local file's bytes, and a stream keeps the source alive after the SafeOpen is gone.
TEST(Remote, OnDemandReadsAsTheLocalFileWithEveryReadingOperation) {
  SERVE_OR_SKIP(s);
  safetensors::SafeOpen local(s.root / "model.safetensors");
  const safetensors::RemoteOptions lazy{.part_size = 4096, .first_read = 16, .on_demand = true};
  std::optional<safetensors::TensorStream> stream;
  {
    auto remote = safetensors::SafeOpen::open_remote(s.server->url("model.safetensors"), lazy);
    EXPECT_EQ(remote.backend(), safetensors::Backend::Read);
    EXPECT_EQ(remote.keys(), local.keys());
    for (const auto& name : local.keys()) {
      auto a = remote.get_tensor(name);
      auto b = local.get_tensor(name);
      ASSERT_EQ(a.data.size(), b.data.size());
      EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size()), 0) << name;
    }
    auto cols = remote.get_slice("w")
                    .select({safetensors::Index::range(3, 200, 7), safetensors::Index::range(5, 9)})
                    .read();
    auto want = local.get_slice("w")
                    .select({safetensors::Index::range(3, 200, 7), safetensors::Index::range(5, 9)})
                    .read();
    ASSERT_EQ(cols.data.size(), want.data.size());
    EXPECT_EQ(std::memcmp(cols.data.data(), want.data.data(), cols.data.size()), 0);
    stream.emplace(remote, safetensors::Requests{},
                   safetensors::StreamOptions{.max_inflight_bytes = 64 << 10});
  }
  std::size_t seen = 0;
  for (auto& item : *stream) {
    auto want = local.get_tensor(item.name);
    ASSERT_EQ(item.view.data.size(), want.data.size()) << item.name;
    EXPECT_EQ(std::memcmp(item.view.data.data(), want.data.data(), want.data.size()), 0) << item.name;
    ++seen;
  }
  EXPECT_EQ(seen, local.size());
}

// A remote index: its shards are the objects next to it, opened on first use; every reading
// operation gives what the same checkpoint gives from disk, whole or on demand.
TEST(Remote, ACheckpointWhoseIndexIsRemoteReadsAsTheLocalOne) {
  SERVE_OR_SKIP(s);
  write_checkpoint(s.root.path());
  safetensors::Checkpoint local(s.root / "m.safetensors.index.json");
  for (bool lazy : {false, true}) {
    auto remote = safetensors::Checkpoint::open_remote(s.server->url("m.safetensors.index.json"),
                                                       {.part_size = 8192, .on_demand = lazy});
    EXPECT_EQ(remote.keys(), local.keys());
    EXPECT_EQ(remote.metadata(), local.metadata());
    EXPECT_EQ(remote.shard_paths().at(1), fs::path(s.server->url("m-2.safetensors")));
    for (const auto& name : local.keys()) {
      auto x = remote.get_tensor(name);
      auto y = local.get_tensor(name);
      ASSERT_EQ(x.data.size(), y.data.size());
      EXPECT_EQ(std::memcmp(x.data.data(), y.data.data(), x.data.size()), 0) << name;
    }
    auto rows = remote.get_slice("a").select({safetensors::Index::range(7, 290, 9)}).read();
    auto want = local.get_slice("a").select({safetensors::Index::range(7, 290, 9)}).read();
    ASSERT_EQ(rows.data.size(), want.data.size());
    EXPECT_EQ(std::memcmp(rows.data.data(), want.data.data(), rows.data.size()), 0);
    std::size_t seen = 0;
    for (auto& item : safetensors::TensorStream(remote)) {
      auto expect = local.get_tensor(item.name);
      ASSERT_EQ(item.view.data.size(), expect.data.size());
      EXPECT_EQ(std::memcmp(item.view.data.data(), expect.data.data(), expect.data.size()), 0) << item.name;
      ++seen;
    }
    EXPECT_EQ(seen, 2u);
  }
  auto missing = safetensors::nothrow::open_remote_checkpoint(s.server->url("absent.index.json"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().kind(), safetensors::ErrorKind::Io);
  EXPECT_NE(missing.status().message().find("404"), std::string::npos) << missing.status().message();
}

// The C API opens the same remote files and checkpoints (safetensors.h).
TEST(RemoteC, OpensFilesAndCheckpointsOnDemandWithTypedErrors) {
  SERVE_OR_SKIP(s);
  safetensors::SafeOpen local(s.root / "model.safetensors");
  auto want = local.get_tensor("w");
  st_remote_options options;
  st_remote_options_default(&options);
  EXPECT_EQ(options.concurrency, 16u);
  EXPECT_EQ(options.part_size, std::size_t{8} << 20);
  EXPECT_EQ(options.max_retries, 3u);
  options.part_size = 4096;
  options.flags = ST_REMOTE_ON_DEMAND;
  st_error err = ST_ERROR_INIT;
  const std::string url = s.server->url("model.safetensors");
  EXPECT_TRUE(st_is_url(url.c_str()));
  EXPECT_FALSE(st_is_url("model.safetensors"));
  EXPECT_TRUE(st_remote_built());
  st_file* file = nullptr;
  ASSERT_EQ(st_file_open_remote(url.c_str(), &options, 0, &file, &err), ST_OK)
      << (err.message ? err.message : "");
  std::vector<std::byte> got(want.data.size());
  ASSERT_EQ(st_file_read(file, "w", 1, got.data(), got.size(), &err), ST_OK)
      << (err.message ? err.message : "");
  EXPECT_EQ(std::memcmp(got.data(), want.data.data(), got.size()), 0);
  st_file_free(file);
  // NULL options: the defaults (the whole object at open).
  file = nullptr;
  ASSERT_EQ(st_file_open_remote(url.c_str(), nullptr, 0, &file, &err), ST_OK)
      << (err.message ? err.message : "");
  st_file_free(file);
  // A checkpoint of one remote file.
  st_checkpoint* ckpt = nullptr;
  ASSERT_EQ(st_checkpoint_open_remote(url.c_str(), &options, ST_OPEN_LENIENT, &ckpt, &err), ST_OK)
      << (err.message ? err.message : "");
  std::fill(got.begin(), got.end(), std::byte{0});
  ASSERT_EQ(st_checkpoint_read(ckpt, "w", 1, got.data(), got.size(), &err), ST_OK)
      << (err.message ? err.message : "");
  EXPECT_EQ(std::memcmp(got.data(), want.data.data(), got.size()), 0);
  st_checkpoint_free(ckpt);
  // Unknown option flags are a careless call; a missing object is Io naming the URL.
  options.flags = 0x80;
  EXPECT_EQ(st_file_open_remote(url.c_str(), &options, 0, &file, &err), ST_FAILED);
  EXPECT_EQ(err.kind, ST_ERR_INTERNAL) << (err.message ? err.message : "");
  options.flags = 0;
  const std::string gone = s.server->url("absent.safetensors");
  EXPECT_EQ(st_file_open_remote(gone.c_str(), &options, 0, &file, &err), ST_FAILED);
  EXPECT_EQ(err.kind, ST_ERR_IO);
  EXPECT_NE(std::string(err.message ? err.message : "").find(gone), std::string::npos)
      << (err.message ? err.message : "");
  st_error_clear(&err);
}

/// The data files a cache directory holds (`<key>.safetensors`), by path, with their inodes.
std::vector<std::pair<fs::path, std::uintmax_t>> cached_files(const fs::path& dir) {
  std::vector<std::pair<fs::path, std::uintmax_t>> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) == 0) out.emplace_back(e.path(), st.st_ino);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A file opened whole with a cache is written into it once, and a later open of the same
// version maps that copy (the same file, not written again), through C++ and C alike; a new
// version of the object is fetched again into an entry of its own.
TEST(RemoteCache, AWholeFileIsFetchedIntoTheCacheOnceAndMappedAfterOnBothFaces) {
  SERVE_OR_SKIP(s);
  test::TempDir cache;
  const auto url = s.server->url("model.safetensors");
  const auto served = test::read_bytes(s.root / "model.safetensors");
  safetensors::RemoteOptions options{.cache = true, .cache_dir = cache.path()};
  {
    auto remote = safetensors::SafeOpen::open_remote(url, options);
    EXPECT_EQ(remote.keys(), (std::vector<std::string>{"b", "w"}));
  }
  auto entries = cached_files(cache.path());
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(test::read_bytes(entries[0].first), served);
  EXPECT_EQ(entries[0].first.string().find("model"), std::string::npos) << "named by a digest, not the URL";
  {
    auto again = safetensors::SafeOpen::open_remote(url, options);
    auto w = again.get_tensor("w");
    safetensors::SafeOpen local(s.root / "model.safetensors");
    auto want = local.get_tensor("w");
    ASSERT_EQ(w.data.size(), want.data.size());
    EXPECT_EQ(std::memcmp(w.data.data(), want.data.data(), w.data.size()), 0);
  }
  EXPECT_EQ(cached_files(cache.path()), entries) << "the cached copy is mapped, not written again";
  // Through C: the same entry.
  st_remote_options c;
  st_remote_options_default(&c);
  c.flags = ST_REMOTE_CACHE;
  c.cache_dir = cache.path().c_str();
  st_error err = ST_ERROR_INIT;
  st_file* file = nullptr;
  ASSERT_EQ(st_file_open_remote(url.c_str(), &c, 0, &file, &err), ST_OK) << (err.message ? err.message : "");
  st_file_free(file);
  EXPECT_EQ(cached_files(cache.path()), entries);
  // Unknown flags beside the cache's are still a careless call.
  c.flags = ST_REMOTE_CACHE | 0x80;
  EXPECT_EQ(st_file_open_remote(url.c_str(), &c, 0, &file, &err), ST_FAILED);
  st_error_clear(&err);
  // A new version of the object (another length, so another ETag): fetched into a new entry.
  const std::array<std::uint8_t, 3> x{1, 2, 3};
  auto longer = safetensors::serialize(
      {{"x", safetensors::TensorView{safetensors::Dtype::U8, {3}, std::as_bytes(std::span(x))}}});
  test::write_bytes(
      s.root / "model.safetensors",
      std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(longer.data()),
                                reinterpret_cast<const std::uint8_t*>(longer.data()) + longer.size()));
  auto changed = safetensors::SafeOpen::open_remote(url, options);
  EXPECT_EQ(changed.keys(), (std::vector<std::string>{"x"}));
  EXPECT_EQ(cached_files(cache.path()).size(), 2u);
}

#ifdef SAFETENSORS_CLI
// `validate --cache=DIR` fetches a URL's files whole into the cache (an index's shards too), so
// that servers started later map them; a second run maps what is there. `--cache=` with no
// directory is a wrong command line.
TEST(RemoteCli, ValidateWithACacheFillsItAndMapsItAfter) {
  SERVE_OR_SKIP(s);
  write_checkpoint(s.root.path());
  test::TempDir cache;
  const auto index = s.server->url("m.safetensors.index.json");
  const std::string flag = "--cache=" + cache.path().string();
  auto first = test::cli({"validate", flag, index});
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  EXPECT_TRUE(test::has(first.out, "OK   " + index + " (2 tensors")) << first.out;
  auto entries = cached_files(cache.path());
  ASSERT_EQ(entries.size(), 2u);
  // Each cached file is one of the shards, and each shard is cached once.
  const auto one = test::read_bytes(s.root / "m-1.safetensors");
  const auto two = test::read_bytes(s.root / "m-2.safetensors");
  std::size_t ones = 0, twos = 0;
  for (const auto& [path, inode] : entries) {
    const auto held = test::read_bytes(path);
    ones += held == one ? 1 : 0;
    twos += held == two ? 1 : 0;
  }
  EXPECT_EQ(ones, 1u);
  EXPECT_EQ(twos, 1u);
  auto second = test::cli({"validate", flag, index, "--json"});
  ASSERT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_EQ(cached_files(cache.path()), entries);
  auto usage = test::cli({"validate", "--cache=", index});
  EXPECT_EQ(usage.code, 2) << usage.out << usage.err;
}
#endif

// Ranks that each open a remote checkpoint on demand and load by a plan fetch every needed data
// byte exactly once across them: nginx's log shows the data GETs of all ranks adding up to the
// bytes the ranks need, not once per rank.
TEST(Remote, RanksLoadingByAPlanFetchEachNeededByteOnceAcrossThem) {
  SERVE_OR_SKIP(s);
  write_checkpoint(s.root.path());
  const auto index = s.server->url("m.safetensors.index.json");
  safetensors::Checkpoint local(s.root / "m.safetensors.index.json");
  constexpr std::size_t world = 4;
  // "a" [300, 100] split by rows; "b" replicated (every rank needs it; one reads it).
  const std::vector<test::Want> wants{
      {"a",
       [](const safetensors::Slice& t, std::size_t r, std::size_t w) {
         return t.select({safetensors::Index::range(static_cast<std::int64_t>(r * 300 / w),
                                                    static_cast<std::int64_t>((r + 1) * 300 / w))});
       }},
      {"b", test::whole}};
  test::LocalGroup group(world);
  std::vector<std::thread> ranks;
  std::vector<std::string> failures(world);
  for (std::size_t rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto ckpt = safetensors::Checkpoint::open_remote(
            index, {.part_size = 8192, .first_read = 64, .on_demand = true});
        auto needs = test::needs_of(ckpt, wants, world);
        safetensors::LoadPlan plan(needs);
        test::LocalGroup::Member me(group, rank);
        auto mine = plan.load(me);
        for (std::size_t i = 0; i < mine.size(); ++i) {
          auto want = test::needs_of(local, wants, world)[rank][i].read();
          if (mine[i].data.size() != want.data.size() ||
              std::memcmp(mine[i].data.data(), want.data.data(), want.data.size()) != 0) {
            failures[rank] = "rank " + std::to_string(rank) + ": " + wants[i].name + " differs";
          }
        }
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
  // Data GETs: ranged reads that start at or after a shard's data.
  std::map<std::string, std::uint64_t> data_start{{"/m-1.safetensors", local.shard_sizes(0).header},
                                                  {"/m-2.safetensors", local.shard_sizes(1).header}};
  const std::uint64_t needed = 300u * 100u * 4u + 4u;
  auto data_fetched = [&] {
    std::uint64_t n = 0;
    for (const auto& r : test::access_log(s.work.path())) {
      auto it = data_start.find(r.uri);
      if (it == data_start.end() || !r.range.starts_with("bytes=")) continue;
      if (std::stoull(r.range.substr(6)) >= it->second) n += r.bytes;
    }
    return n;
  };
  // nginx logs each request after answering it: wait (a while at most) for the last lines.
  std::uint64_t fetched = data_fetched();
  for (int tries = 0; tries < 200 && fetched < needed; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    fetched = data_fetched();
  }
  EXPECT_EQ(fetched, needed);
}

TEST(Remote, HeaderOnlyDescribesTensorsAndRefusesReads) {
  SERVE_OR_SKIP(s);
  auto f = safetensors::SafeOpen::open_remote(s.server->url("model.safetensors"), {.header_only = true});
  EXPECT_EQ(f.info("w").shape, (std::vector<std::size_t>{250, 200}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  auto read = safetensors::nothrow::get_tensor(f, "b");
  ASSERT_FALSE(read);
  EXPECT_EQ(read.status().kind(), safetensors::ErrorKind::Io);
  EXPECT_NE(read.status().message().find("header"), std::string::npos) << read.status().message();
}

TEST(Remote, AMissingObjectIsAnIoErrorNamingTheUrlOnBothFaces) {
  SERVE_OR_SKIP(s);
  const auto url = s.server->url("absent.safetensors");
  auto opened = safetensors::nothrow::open_remote(url);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.status().kind(), safetensors::ErrorKind::Io);
  EXPECT_NE(opened.status().message().find(url), std::string::npos) << opened.status().message();
  test::expect_same(opened.status(), test::thrown([&] { (void)safetensors::SafeOpen::open_remote(url); }));
  EXPECT_NE(opened.status().message().find("404"), std::string::npos) << opened.status().message();
}

TEST(Remote, AHostileHeaderIsTheKindItIsFromDisk) {
  SERVE_OR_SKIP(s);
  // A length prefix pointing past the end of the object.
  std::vector<std::uint8_t> bad{0xff, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  test::write_bytes(s.root / "bad.safetensors", bad);
  const auto local = test::thrown([&] { safetensors::SafeOpen f(s.root / "bad.safetensors"); });
  const auto remote = safetensors::nothrow::open_remote(s.server->url("bad.safetensors"));
  ASSERT_FALSE(local.ok());
  ASSERT_FALSE(remote);
  EXPECT_EQ(remote.status().kind(), local.kind()) << remote.status().message();
}

#ifdef SAFETENSORS_CLI
TEST(RemoteCli, InspectValidateAndStatsReadUrlsOfFilesAndCheckpoints) {
  SERVE_OR_SKIP(s);
  const auto url = s.server->url("model.safetensors");
  auto inspected = test::cli({"inspect", url, "--json"});
  ASSERT_EQ(inspected.code, 0) << inspected.err;
  EXPECT_TRUE(test::has(inspected.out, "\"path\":\"" + url + "\"")) << inspected.out;
  EXPECT_TRUE(test::has(inspected.out, "\"shape\":[250,200]")) << inspected.out;
  auto valid = test::cli({"validate", url});
  ASSERT_EQ(valid.code, 0) << valid.out << valid.err;
  EXPECT_TRUE(test::has(valid.out, "OK   " + url + " (2 tensors")) << valid.out;
  // A checkpoint whose index is a URL: its shards are the objects next to it.
  write_checkpoint(s.root.path());
  const auto index = s.server->url("m.safetensors.index.json");
  auto listed = test::cli({"inspect", index, "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err << listed.out;
  EXPECT_TRUE(test::has(listed.out, "\"shard\":\"m-2.safetensors\"")) << listed.out;
  EXPECT_TRUE(test::has(listed.out, "\"shape\":[300,100]")) << listed.out;
  // A shard whose name a URL spells escaped is listed by its name, as from disk.
  fs::copy_file(s.root / "m-2.safetensors", s.root / "m 2%.safetensors");
  const std::string odd = R"({"weight_map": {"b": "m 2%.safetensors"}})";
  test::write_bytes(s.root / "odd.index.json", std::vector<std::uint8_t>(odd.begin(), odd.end()));
  auto escaped = test::cli({"inspect", s.server->url("odd.index.json"), "--json"});
  ASSERT_EQ(escaped.code, 0) << escaped.err << escaped.out;
  EXPECT_TRUE(test::has(escaped.out, "\"shard\":\"m 2%.safetensors\"")) << escaped.out;
  auto checked = test::cli({"validate", index});
  ASSERT_EQ(checked.code, 0) << checked.out << checked.err;
  EXPECT_TRUE(test::has(checked.out, "OK   " + index + " (2 tensors")) << checked.out;
  auto figures = test::cli({"stats", index, "b", "--json"});
  ASSERT_EQ(figures.code, 0) << figures.err << figures.out;
  EXPECT_TRUE(test::has(figures.out, "\"min\": 6, \"max\": 9")) << figures.out;
  auto absent = test::cli({"validate", s.server->url("absent.index.json")});
  EXPECT_EQ(absent.code, 1);
  EXPECT_TRUE(test::has(absent.out + absent.err, "404")) << absent.out << absent.err;
  auto missing = test::cli({"inspect", s.server->url("absent.safetensors")});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(test::has(missing.err + missing.out, "404")) << missing.err << missing.out;
}

// A pre-signed URL (a file's, an index's) is read, and its query never reaches the output, the
// --json document or an error.
TEST(RemoteCli, ASignedUrlIsReadAndNeverShown) {
  SERVE_OR_SKIP(s);
  write_checkpoint(s.root.path());
  const std::string query = "?X-Amz-Signature=Sig0123456789hunter2&X-Amz-Expires=60";
  const auto url = s.server->url("model.safetensors");
  const auto index = s.server->url("m.safetensors.index.json");
  const std::vector<std::vector<std::string>> commands = {
      {"inspect", url + query, "--json"},
      {"inspect", index + query, "--json"},
      {"validate", url + query, "--json"},
      {"validate", index + query},
      {"stats", url + query, "b", "--json"},
      {"metadata", url + query, "--json"},
      {"validate", s.server->url("absent.safetensors") + query, "--json"},
  };
  for (const auto& args : commands) {
    auto run = test::cli(args);
    EXPECT_EQ(run.code, args[1].find("absent") == std::string::npos ? 0 : 1) << run.out << run.err;
    EXPECT_FALSE(test::has(run.out + run.err, "hunter2")) << args[0] << ": " << run.out << run.err;
    EXPECT_FALSE(test::has(run.out + run.err, "X-Amz")) << args[0] << ": " << run.out << run.err;
  }
  auto inspected = test::cli({"inspect", index + query, "--json"});
  EXPECT_TRUE(test::has(inspected.out, "\"path\":\"" + index + "\"")) << inspected.out;
  EXPECT_TRUE(test::has(inspected.out, "\"shard\":\"m-2.safetensors\"")) << inspected.out;
}
#endif

}  // namespace
