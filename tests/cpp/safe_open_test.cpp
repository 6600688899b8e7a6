// SafeOpen and TensorView through the public header only.
#include <safetensors/memory.hpp>
#include <safetensors/prefetch.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <type_traits>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.hpp"

using safetensors::Backend;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::Index;
using safetensors::OpenOptions;
using safetensors::SafeOpen;

namespace {

using test::kind_of;

constexpr Backend kBackends[] = {Backend::Mmap, Backend::Read};

// Three F32 tensors whose JSON order, file order and name order all differ, plus metadata.
constexpr std::string_view kThree = R"({"__metadata__":{"format":"pt","b":"2"},)"
                                    R"("zeta":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("alpha":{"dtype":"F32","shape":[2,2],"data_offsets":[24,40]},)"
                                    R"("mid":{"dtype":"I16","shape":[8],"data_offsets":[8,24]}})";

std::vector<std::uint8_t> three_tensor_file() {
  std::vector<std::uint8_t> f = test::raw_file(kThree, 0);
  auto push_f32 = [&](float v) {
    std::uint8_t b[4];
    std::memcpy(b, &v, 4);
    f.insert(f.end(), b, b + 4);
  };
  push_f32(1.5f);
  push_f32(-2.0f);
  for (std::int16_t i = 0; i < 8; ++i) {
    auto v = static_cast<std::uint16_t>(i * 1000 - 3000);
    f.push_back(static_cast<std::uint8_t>(v & 0xff));
    f.push_back(static_cast<std::uint8_t>(v >> 8));
  }
  for (float v : {10.f, 20.f, 30.f, 40.f}) push_f32(v);
  return f;
}

class SafeOpenTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { test::write_bytes(path_, three_tensor_file()); }
  SafeOpen open() const { return SafeOpen(path_, OpenOptions{GetParam()}); }
  test::TempDir dir_;
  std::filesystem::path path_ = dir_ / "three.safetensors";
};

TEST_P(SafeOpenTest, KeysAreSortedAndOffsetKeysFollowTheFile) {
  auto f = open();
  EXPECT_EQ(f.keys(), (std::vector<std::string>{"alpha", "mid", "zeta"}));
  EXPECT_EQ(f.offset_keys(), (std::vector<std::string>{"zeta", "mid", "alpha"}));
  EXPECT_EQ(f.size(), 3u);
  EXPECT_TRUE(f.contains("mid"));
  EXPECT_FALSE(f.contains("Mid"));
  EXPECT_FALSE(f.contains(std::string_view("mid\0", 4)));
  EXPECT_FALSE(f.contains("\xff"));
}

TEST_P(SafeOpenTest, MetadataIsTheSortedMap) {
  auto f = open();
  EXPECT_TRUE(f.has_metadata());
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"b", "2"}, {"format", "pt"}}));
}

TEST_P(SafeOpenTest, InfoTouchesNoTensorData) {
  auto f = open();
  auto info = f.info("alpha");
  EXPECT_EQ(info.dtype, Dtype::F32);
  EXPECT_EQ(info.shape, (std::vector<std::size_t>{2, 2}));
  EXPECT_EQ(info.data_offsets, (std::pair<std::size_t, std::size_t>{24, 40}));
  EXPECT_EQ(info.numel(), 4u);
  EXPECT_EQ(info.byte_size(), 16u);
  EXPECT_EQ(f.bytes_read(), 0u);
  EXPECT_EQ(f.data_size(), 40u);
  EXPECT_EQ(f.header_size(), (kThree.size() + 7) / 8 * 8);
  EXPECT_EQ(f.data_offset(), 8 + f.header_size());
  EXPECT_EQ(f.backend(), GetParam());
  EXPECT_EQ(f.path(), path_);
}

TEST_P(SafeOpenTest, GetTensorReturnsTheBytesAndTypedElements) {
  auto f = open();
  auto alpha = f.get_tensor("alpha");
  EXPECT_EQ(alpha.dtype, Dtype::F32);
  EXPECT_EQ(alpha.numel(), 4u);
  auto values = alpha.as<float>();
  EXPECT_EQ(std::vector<float>(values.begin(), values.end()), (std::vector<float>{10, 20, 30, 40}));
  auto mid_view = f.get_tensor("mid");
  auto mid = mid_view.as<std::int16_t>();
  EXPECT_EQ(mid[0], -3000);
  EXPECT_EQ(mid[7], 4000);
  EXPECT_EQ(f.get_tensor("zeta").data.size(), 8u);
  if (GetParam() == Backend::Read) {
    EXPECT_EQ(f.bytes_read(), 40u);
  }
}

TEST_P(SafeOpenTest, AsRefusesTypesThatDoNotFit) {
  auto f = open();
  auto alpha = f.get_tensor("alpha");
  EXPECT_EQ(kind_of([&] { (void)alpha.as<double>(); }), ErrorKind::TypeMismatch);
  EXPECT_EQ(kind_of([&] { (void)alpha.as<std::int32_t>(); }), ErrorKind::TypeMismatch);
  auto mid = f.get_tensor("mid");
  EXPECT_EQ(kind_of([&] { (void)mid.as<std::uint16_t>(); }), ErrorKind::TypeMismatch);
  // A type of the right width that C++ does not know (here a struct) is allowed.
  struct Raw32 {
    std::uint32_t bits;
  };
  EXPECT_EQ(alpha.as<Raw32>().size(), 4u);
  // A view whose bytes disagree with its shape.
  auto short_view = alpha;
  short_view.data = short_view.data.first(12);
  EXPECT_EQ(kind_of([&] { (void)short_view.as<float>(); }), ErrorKind::TypeMismatch);
}

TEST_P(SafeOpenTest, MissingTensorsAreTypedErrorsNamingTheFile) {
  auto f = open();
  try {
    (void)f.get_tensor("nope");
    FAIL() << "expected TensorNotFound";
  } catch (const safetensors::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::TensorNotFound);
    EXPECT_NE(std::string(e.what()).find("three.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("`nope`"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kind_of([&] { (void)f.info("nope"); }), ErrorKind::TensorNotFound);
}

TEST_P(SafeOpenTest, ViewsOutliveTheSafeOpenThatMadeThem) {
  safetensors::TensorView view;
  {
    auto f = open();
    view = f.get_tensor("alpha");
  }
  // The file object is gone; the view keeps the mapping (or its own buffer) alive.
  EXPECT_EQ(view.as<float>()[3], 40.0f);
}

TEST_P(SafeOpenTest, CopiesShareOneOpenFile) {
  std::optional<SafeOpen> original(open());
  SafeOpen copy = *original;
  auto a = original->get_tensor("zeta");
  original.reset();
  auto b = copy.get_tensor("zeta");
  EXPECT_EQ(a.as<float>()[1], -2.0f);
  EXPECT_EQ(b.as<float>()[1], -2.0f);
  if (GetParam() == Backend::Mmap) {
    EXPECT_EQ(a.data.data(), b.data.data()) << "copies must share the mapping";
  }
  SafeOpen moved = std::move(copy);
  EXPECT_EQ(moved.keys().size(), 3u);
}

TEST_P(SafeOpenTest, ReadsConcurrentlyFromManyThreads) {
  auto f = open();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto alpha = f.get_tensor("alpha");
        if (alpha.as<float>()[2] != 30.0f) ++bad;
        if (f.keys().size() != 3) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, SafeOpenTest, ::testing::ValuesIn(kBackends),
                         [](const auto& p) { return p.param == Backend::Mmap ? "Mmap" : "Read"; });

// The mapped backend maps a file at its first access of tensor bytes, not at open (see
// `LazyMap` in rust/core/src/file.rs): what happens to the file in between must never reach a
// view as bytes past the mapping, nor as another file's bytes. Every way in (views, slices,
// copies, conversions, iteration, loads, residency, hints, streams) is the file's first access
// of tensor bytes, so each finds the truncation, as an `Io` error naming the file.
// What PathRef takes: every form a path comes in, by reference to its characters; never a type
// whose native() hands back a temporary string (the view would dangle), nor a non-path.
struct PathByValue {
  std::string native() const { return "model.safetensors"; }
};
struct PathByReference {
  std::string text;
  const std::string& native() const { return text; }
};
static_assert(std::is_convertible_v<std::filesystem::path, safetensors::PathRef>);
static_assert(std::is_convertible_v<PathByReference, safetensors::PathRef>);
static_assert(!std::is_convertible_v<PathByValue, safetensors::PathRef>);
static_assert(std::is_convertible_v<const char*, safetensors::PathRef>);
static_assert(std::is_convertible_v<std::string, safetensors::PathRef>);
static_assert(std::is_convertible_v<std::string_view, safetensors::PathRef>);
static_assert(!std::is_convertible_v<int, safetensors::PathRef>);

// Every form a caller holds a path in opens the same file (PathRef), and the path comes back as
// the characters given; a checkpoint takes the same forms and gives its shards back as strings.
TEST(SafeOpen, EveryFormOfAPathOpensTheFileAndThePathComesBackAsGiven) {
  test::TempDir dir;
  const std::filesystem::path as_path = dir / "three.safetensors";
  test::write_bytes(as_path, three_tensor_file());
  const std::string as_string = as_path.string();
  const std::string_view as_view = as_string;
  const char* as_c = as_string.c_str();
  for (const SafeOpen& f : {SafeOpen(as_path), SafeOpen(as_string), SafeOpen(as_view), SafeOpen(as_c),
                            SafeOpen(dir / "three.safetensors"), SafeOpen(std::string(as_string))}) {
    EXPECT_EQ(f.path(), as_string);
    EXPECT_EQ(f.keys(), (std::vector<std::string>{"alpha", "mid", "zeta"}));
  }
  auto opened = safetensors::nothrow::open(as_path, OpenOptions{Backend::Read});
  ASSERT_TRUE(opened.has_value());
  EXPECT_EQ(opened->path(), as_string);
  const safetensors::TensorView zeta = opened->get_tensor("zeta");
  EXPECT_EQ(zeta.as<float>()[1], -2.0f);

  // A path that names no file is an Io error naming it, whichever form it came in.
  const std::filesystem::path absent = dir / "absent.safetensors";
  for (auto status :
       {safetensors::nothrow::open(absent).status(), safetensors::nothrow::open(absent.string()).status(),
        safetensors::nothrow::open(absent.c_str()).status()}) {
    EXPECT_EQ(status.kind(), ErrorKind::Io);
    EXPECT_NE(status.message().find(absent.string()), std::string::npos) << status.message();
  }
  const char* null_path = nullptr;
  EXPECT_EQ(safetensors::nothrow::open(null_path).status().kind(), ErrorKind::Io);

  safetensors::Checkpoint ckpt(as_path);
  EXPECT_EQ(ckpt.shard_paths(), (std::vector<std::string>{as_string}));
  EXPECT_EQ(ckpt.shard_of("mid"), as_string);
  EXPECT_EQ(safetensors::Checkpoint(as_view).shard_of("alpha"), as_string);
}

TEST(SafeOpen, AMappedFileTruncatedBeforeItsFirstReadIsAnIoErrorOnEveryWayIn) {
  test::TempDir dir;
  const auto path = dir / "three.safetensors";
  const auto bytes = three_tensor_file();
  const std::vector<std::function<void(const SafeOpen&)>> reads = {
      [](const SafeOpen& f) { (void)f.get_tensor("alpha"); },
      [](const SafeOpen& f) {
        (void)f.get_slice("alpha").select({Index::all(), Index::range(0, 1)}).read();
      },
      [](const SafeOpen& f) {
        std::vector<std::byte> out(16);
        f.get_tensor_into("alpha", out);
      },
      [](const SafeOpen& f) {
        std::vector<std::byte> out(8);
        f.read_data(0, out);
      },
      [](const SafeOpen& f) {
        for (const auto& t : f) (void)t;
      },
      [](const SafeOpen& f) {
        std::vector<double> out(4);
        f.get_tensor_as("alpha", Dtype::F64, std::as_writable_bytes(std::span(out)));
      },
      [](const SafeOpen& f) { (void)f.get_tensor_as("alpha", Dtype::F64); },
      [](const SafeOpen& f) {
        std::vector<double> out(2);
        f.get_slice("alpha")
            .select({0, Index::all()})
            .read_as(Dtype::F64, std::as_writable_bytes(std::span(out)));
      },
      [](const SafeOpen& f) {
        std::vector<std::byte> out(8);
        f.get_slice("alpha").select({1, Index::all()}).read_into(out);
      },
      [](const SafeOpen& f) { (void)safetensors::load(f); },
      [](const SafeOpen& f) { safetensors::lock_pages(f); },
      [](const SafeOpen& f) { safetensors::advise(f, safetensors::Advice::WillNeed); },
      [](const SafeOpen& f) {
        for (const auto& item : safetensors::TensorStream(f)) (void)item;
      },
  };
  for (std::size_t i = 0; i < reads.size(); ++i) {
    test::write_bytes(path, bytes);
    SafeOpen f(path);
    EXPECT_EQ(f.info("alpha").shape, (std::vector<std::size_t>{2, 2}));
    std::filesystem::resize_file(path, 20);
    try {
      reads[i](f);
      ADD_FAILURE() << "read " << i << " of a file truncated since its open succeeded";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io) << i << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("three.safetensors"), std::string::npos) << i << ": " << e.what();
    }
    // Nothing of it was mapped: unlocking and releasing touch no page and do not map it.
    safetensors::unlock_pages(f);
    auto released = safetensors::nothrow::release_pages(f);
    EXPECT_TRUE(released.ok() || released.kind() == ErrorKind::Io) << i << ": " << released.message();
    // Without exceptions, the same error, saying what happened.
    auto view = safetensors::nothrow::get_tensor(f, "zeta");
    ASSERT_FALSE(view.has_value()) << i;
    EXPECT_EQ(view.status().kind(), ErrorKind::Io) << i;
    EXPECT_NE(view.status().message().find("became shorter"), std::string::npos)
        << i << ": " << view.status().message();
  }
}

TEST(SafeOpen, AMappedFileReplacedOrRemovedBeforeItsFirstReadReadsTheFileThatWasOpened) {
  test::TempDir dir;
  const auto path = dir / "three.safetensors";
  test::write_bytes(path, three_tensor_file());
  SafeOpen replaced(path);
  // A writer replaces the file by renaming a new one over it.
  test::write_bytes(dir / "next.safetensors",
                    test::raw_file(R"({"alpha":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
  std::filesystem::rename(dir / "next.safetensors", path);
  const auto alpha_view = replaced.get_tensor("alpha");
  auto alpha = alpha_view.as<float>();
  EXPECT_EQ(std::vector<float>(alpha.begin(), alpha.end()), (std::vector<float>{10, 20, 30, 40}));

  test::write_bytes(path, three_tensor_file());
  SafeOpen removed(path);
  std::filesystem::remove(path);
  const auto zeta_view = removed.get_tensor("zeta");
  auto zeta = zeta_view.as<float>();
  EXPECT_EQ(std::vector<float>(zeta.begin(), zeta.end()), (std::vector<float>{1.5f, -2.0f}));
}

// Files wait for their first read to be mapped holding a descriptor, but only while the process
// has descriptors to spare: a program that holds hundreds of mapped files open never runs out
// because of the deferral (a child process with a limit of 64 holds 300).
TEST(SafeOpen, HundredsOfMappedFilesHeldOpenNeverRunOutOfDescriptors) {
  test::TempDir dir;
  const auto path = dir / "three.safetensors";
  test::write_bytes(path, three_tensor_file());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit limit{64, 64};
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(4);
    std::vector<SafeOpen> files;
    try {
      for (int i = 0; i < 300; ++i) files.emplace_back(path);
      for (const auto& f : files) {
        if (f.get_tensor("alpha").data.size() != 16) ::_exit(3);
      }
    } catch (const safetensors::Error& e) {
      std::fprintf(stderr, "after %zu files: %s\n", files.size(), e.what());
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// Bytes appended to a file between its open and its mapping are part of the mapping: a
// destination there (the read-only mapping) is refused like one inside the data, never written.
TEST(SafeOpen, ADestinationInBytesAppendedBeforeTheMappingIsRefused) {
  test::TempDir dir;
  const auto path = dir / "three.safetensors";
  test::write_bytes(path, three_tensor_file());
  SafeOpen f(path);
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << std::string(8192, '\x7f');
  }
  auto alpha = f.get_tensor("alpha");  // the last tensor: the appended bytes follow it
  const std::span<std::byte> tail(const_cast<std::byte*>(alpha.data.data() + alpha.data.size()) + 64, 8);
  EXPECT_EQ(kind_of([&] { f.read_data(0, tail); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { f.get_tensor_into("zeta", tail); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { f.get_slice("zeta").select({}).read_into(tail); }), ErrorKind::InvalidSlice);
  std::vector<std::byte> mine(8);
  f.read_data(0, mine);
  float first = 0;
  std::memcpy(&first, mine.data(), 4);
  EXPECT_EQ(first, 1.5f);
}

TEST(SafeOpen, EveryDtypeCrossesTheBridgeWithItsName) {
  test::TempDir dir;
  std::string json = "{";
  std::size_t at = 0;
  for (std::size_t i = 0; i < safetensors::dtype_count; ++i) {
    auto d = static_cast<Dtype>(i);
    std::size_t bytes = 8 * safetensors::bit_size(d) / 8;
    if (i) json += ",";
    json += "\"t" + std::to_string(i) + "\":{\"dtype\":\"" + std::string(safetensors::to_string(d)) +
            "\",\"shape\":[2,4],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + bytes) +
            "]}";
    at += bytes;
  }
  json += "}";
  test::write_bytes(dir / "all.safetensors", test::raw_file(json, at));
  SafeOpen f(dir / "all.safetensors");
  const std::size_t expected_bits[] = {8,  4,  6,  6,  8,  8,  8,  8,  8,  8,  8,
                                       16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
  for (std::size_t i = 0; i < safetensors::dtype_count; ++i) {
    auto d = static_cast<Dtype>(i);
    EXPECT_EQ(f.info("t" + std::to_string(i)).dtype, d);
    EXPECT_EQ(safetensors::dtype_from_string(safetensors::to_string(d)), d);
    EXPECT_EQ(safetensors::bit_size(d), expected_bits[i]);
    EXPECT_EQ(f.get_tensor("t" + std::to_string(i)).data.size(), expected_bits[i]);
  }
  EXPECT_EQ(safetensors::dtype_from_string("f32"), std::nullopt);
  EXPECT_EQ(safetensors::to_string(Dtype::F8_E4M3FNUZ), "F8_E4M3FNUZ");
}

TEST(SafeOpen, ScalarsAndZeroSizeTensors) {
  test::TempDir dir;
  auto json =
      R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[3,0],"data_offsets":[8,8]}})";
  test::write_bytes(dir / "s.safetensors", test::raw_file(json, 8));
  for (auto b : kBackends) {
    SafeOpen f(dir / "s.safetensors", {b});
    auto s = f.get_tensor("s");
    EXPECT_TRUE(s.shape.empty());
    EXPECT_EQ(s.numel(), 1u);
    EXPECT_EQ(s.as<double>().size(), 1u);
    auto e = f.get_tensor("e");
    EXPECT_EQ(e.numel(), 0u);
    EXPECT_TRUE(e.data.empty());
    EXPECT_TRUE(e.as<float>().empty());
    EXPECT_FALSE(f.has_metadata());
    EXPECT_TRUE(f.metadata().empty());
  }
}

TEST(SafeOpen, UnpaddedHeadersGiveUnalignedDataThatAsRefusesButBytesAllow) {
  test::TempDir dir;
  // 53-byte header: data starts at offset 61, not 4-byte aligned.
  std::string json = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + json.size()) % 4, 0u);
  test::write_bytes(dir / "u.safetensors", test::raw_file(json, 8, /*pad=*/false));
  SafeOpen f(dir / "u.safetensors");
  auto w = f.get_tensor("w");
  EXPECT_EQ(kind_of([&] { (void)w.as<float>(); }), ErrorKind::TypeMismatch);
  EXPECT_EQ(w.as<std::byte>().size(), 8u);
  // The read backend copies into an aligned buffer, so typed access works there.
  SafeOpen r(dir / "u.safetensors", {Backend::Read});
  auto copied = r.get_tensor("w");
  EXPECT_EQ(copied.as<float>().size(), 2u);
}

// as<T>() on a temporary view would dangle (read backend), so it must not compile.
template <class V>
concept AsOnRvalueCompiles = requires(V&& v) {
  std::forward<V>(v).template as<float>();
};
static_assert(!AsOnRvalueCompiles<safetensors::TensorView&&>);
static_assert(AsOnRvalueCompiles<safetensors::TensorView&>);

// A name may hold U+0000 (valid JSON, accepted by the reference); `what()` is a C string, so a
// raw NUL in the message cut it there, losing the offsets, sizes and hints after the name.
TEST(ErrorKinds, MessagesNamingANulCharacterAreWhole) {
  test::TempDir dir;
  auto path = dir / "nul.safetensors";
  test::write_bytes(path,
                    test::raw_file(R"({"a\u0000b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3));
  try {
    safetensors::SafeOpen f(path);
    FAIL() << "expected InvalidOffset";
  } catch (const safetensors::Error& e) {
    std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::InvalidOffset);
    EXPECT_NE(what.find("`a\\0b`"), std::string::npos) << what;
    EXPECT_NE(what.find("data_offsets [1, 3]"), std::string::npos) << what;
  }
}

TEST(ErrorKinds, NamesMatchTheEnumerators) {
  EXPECT_EQ(safetensors::to_string(ErrorKind::HeaderTooSmall), "HeaderTooSmall");
  EXPECT_EQ(safetensors::to_string(ErrorKind::InvalidOffset), "InvalidOffset");
  EXPECT_EQ(safetensors::to_string(ErrorKind::Io), "Io");
  EXPECT_EQ(safetensors::to_string(ErrorKind::TypeMismatch), "TypeMismatch");
  EXPECT_EQ(safetensors::to_string(static_cast<ErrorKind>(200)), "");
}

TEST(SafeOpen, BoolBytesOtherThanZeroAndOneAreRefusedByAsBoolAndReadableAsUint8) {
  test::TempDir dir;
  // The format and Python's reader accept any byte in a BOOL tensor.
  auto json =
      R"({"ok":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]},"odd":{"dtype":"BOOL","shape":[3],"data_offsets":[3,6]}})";
  auto file = test::raw_file(json, 0);
  for (int b : {0, 1, 1, 0, 2, 255}) file.push_back(static_cast<std::uint8_t>(b));
  test::write_bytes(dir / "b.safetensors", file);
  for (auto backend : kBackends) {
    SafeOpen f(dir / "b.safetensors", {backend});
    auto ok = f.get_tensor("ok");
    auto bools = ok.as<bool>();
    EXPECT_EQ(std::vector<bool>(bools.begin(), bools.end()), (std::vector<bool>{false, true, true}));
    auto odd = f.get_tensor("odd");
    try {
      (void)odd.as<bool>();
      ADD_FAILURE() << "as<bool>() accepted the byte 2";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::TypeMismatch);
      EXPECT_NE(std::string(e.what()).find("element 1 holds the byte 2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("as<std::uint8_t>()"), std::string::npos) << e.what();
    }
    auto raw = odd.as<std::uint8_t>();
    EXPECT_EQ(std::vector<std::uint8_t>(raw.begin(), raw.end()), (std::vector<std::uint8_t>{0, 2, 255}));
  }
}

TEST(SafeOpen, MovedFromHandlesThrowInsteadOfCrashing) {
  test::TempDir dir;
  test::write_bytes(dir / "t.safetensors", three_tensor_file());
  SafeOpen f(dir / "t.safetensors");
  SafeOpen g = std::move(f);
  auto moved = [&](auto&& use) {
    try {
      use();
      ADD_FAILURE() << "no error from a moved-from SafeOpen";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Internal);
      EXPECT_NE(std::string(e.what()).find("SafeOpen was moved from"), std::string::npos) << e.what();
    }
  };
  // NOLINTBEGIN(bugprone-use-after-move): the point of the test
  moved([&] { (void)f.keys(); });
  moved([&] { (void)f.offset_keys(); });
  moved([&] { (void)f.metadata(); });
  moved([&] { (void)f.has_metadata(); });
  moved([&] { (void)f.contains("zeta"); });
  moved([&] { (void)f.size(); });
  moved([&] { (void)f.info("zeta"); });
  moved([&] { (void)f.get_tensor("zeta"); });
  moved([&] { (void)f.get_slice("zeta"); });
  std::vector<std::byte> buf(4);
  moved([&] { f.read_data(0, buf); });
  moved([&] { (void)f.path(); });
  moved([&] { (void)f.backend(); });
  moved([&] { (void)f.header_size(); });
  moved([&] { (void)f.data_offset(); });
  moved([&] { (void)f.data_size(); });
  moved([&] { (void)f.bytes_read(); });
  // NOLINTEND(bugprone-use-after-move)
  EXPECT_EQ(g.size(), 3u);
  f = g;  // assigning makes it usable again
  EXPECT_EQ(f.size(), 3u);
}

TEST(SafeOpen, AMovedFromViewIsEmptyAndReadsNothing) {
  // A view that owns its bytes, moved: only the new view keeps them alive. The moved-from view
  // used to keep its span, so that once the new view was gone, `as<float>()` on it read freed
  // memory (the shape [1] had become [], which still matches 4 bytes).
  auto buffer = std::make_shared<std::vector<float>>(1, 3.0f);
  safetensors::TensorView v{Dtype::F32, {1}, std::as_bytes(std::span(*buffer)), buffer};
  buffer.reset();
  safetensors::TensorView w = std::move(v);
  EXPECT_EQ(w.as<float>()[0], 3.0f);
  // NOLINTBEGIN(bugprone-use-after-move): the point of the test
  EXPECT_TRUE(v.data.empty());
  EXPECT_TRUE(v.shape.empty());
  EXPECT_EQ(v.owner, nullptr);
  w = {};  // frees the float
  EXPECT_EQ(kind_of([&] { (void)v.as<float>(); }), ErrorKind::TypeMismatch);
  EXPECT_TRUE(v.as<std::byte>().empty());
  EXPECT_EQ(kind_of([&] { (void)safetensors::convert(v, Dtype::F64); }), ErrorKind::TensorInvalidInfo);
  // Move assignment empties the source too, and an emptied view can be assigned again.
  test::TempDir dir;
  test::write_bytes(dir / "t.safetensors", three_tensor_file());
  SafeOpen f(dir / "t.safetensors", {Backend::Read});
  auto zeta = f.get_tensor("zeta");
  safetensors::TensorView other;
  other = std::move(zeta);
  EXPECT_TRUE(zeta.data.empty());
  EXPECT_EQ(zeta.owner, nullptr);
  EXPECT_TRUE(zeta.as<std::byte>().empty());
  EXPECT_EQ(other.as<float>()[1], -2.0f);
  zeta = other;
  EXPECT_EQ(zeta.as<float>()[0], 1.5f);
  // NOLINTEND(bugprone-use-after-move)
}

TEST(SafeOpen, BuffersSizedByAFileThatCannotBeAllocatedAreIoErrors) {
  // The read backend and slices allocate as many bytes as a header claims. A size no
  // allocator can give (and that overflowed the huge-page rounding before) is a typed error.
  std::vector<std::size_t> sizes{SIZE_MAX, SIZE_MAX - 100};
#if !defined(__SANITIZE_ADDRESS__)  // ASan aborts on an impossible allocation instead of failing it
  sizes.push_back(SIZE_MAX / 2);
#endif
  for (std::size_t n : sizes) {
    try {
      (void)safetensors::detail::allocate_bytes(n, "tensor `huge`").value();
      ADD_FAILURE() << "allocated " << n << " bytes";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io);
      EXPECT_NE(std::string(e.what()).find(std::to_string(n) + " bytes for tensor `huge`"), std::string::npos)
          << e.what();
    }
  }
}

TEST(SafeOpen, ATensorOfRankFiftyMillionIsATypedErrorWithinAGigabyte) {
  if (!test::address_space_limits_work)
    GTEST_SKIP() << "the sanitizers cannot run under an address-space limit";
  // One tensor of 49,999,000 dimensions of 1 in a 100 MB header: the reference accepts it; every
  // copy of its shape is 400 MB (a slice of it peaked near 2.8 GB, and under a 3 GB address
  // space `std::bad_alloc` escaped untyped). More than MAX_RANK dimensions: refused while parsing.
  test::TempDir dir;
  auto path = dir / "deep.safetensors";
  {
    std::string json = R"({"t":{"dtype":"U8","shape":[1)";
    json.reserve(100'000'000);
    for (int i = 1; i < 49'999'000; ++i) json += ",1";
    json += R"(],"data_offsets":[0,1]}})";
    test::write_bytes(path, test::raw_file(json, 1));
  }
  for (Backend b : {Backend::Mmap, Backend::Read}) {
    const int status = test::with_address_space(std::uint64_t{1} << 30, [&] {
      auto opened = safetensors::nothrow::open(path, {b});
      if (opened) return 1;
      if (opened.status().kind() != ErrorKind::TensorInvalidInfo) return 2;
      if (opened.status().message().find("more than 1024 dimensions") == std::string::npos) return 3;
      return test::kind_of([&] { SafeOpen f(path, {b}); }) == ErrorKind::TensorInvalidInfo ? 0 : 4;
    });
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << (b == Backend::Mmap ? "mmap: " : "read: ") << test::describe_status(status);
  }
}

TEST(SafeOpen, AHugeTensorOnTheReadBackendIsAnIoErrorNotBadAlloc) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan aborts on an impossible allocation instead of failing it";
#endif
  // Only where the kernel refuses an 8 TiB allocation outright; with overcommit_memory=1 it
  // would be granted and then filled.
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = 1;
  if (!(overcommit >> mode) || mode == 1) GTEST_SKIP() << "overcommit_memory is " << mode;
  test::TempDir dir;
  const std::uint64_t size = std::uint64_t{1} << 43;  // a sparse 8 TiB tensor
  auto json = R"({"huge":{"dtype":"U8","shape":[)" + std::to_string(size) + R"(],"data_offsets":[0,)" +
              std::to_string(size) + "]}}";
  auto path = dir / "huge.safetensors";
  test::write_bytes(path, test::raw_file(json, 0));
  std::error_code ec;
  std::filesystem::resize_file(path, std::filesystem::file_size(path) + size, ec);
  if (ec) GTEST_SKIP() << "no sparse 8 TiB file here: " << ec.message();
  SafeOpen f(path, {Backend::Read});
  for (const auto& read :
       std::vector<std::function<void()>>{[&] { (void)f.get_tensor("huge"); },
                                          [&] { (void)f.get_slice("huge").select({Index::all()}).read(); }}) {
    try {
      read();
      ADD_FAILURE() << "allocated 8 TiB";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io);
      EXPECT_NE(std::string(e.what()).find(std::to_string(size) + " bytes"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
