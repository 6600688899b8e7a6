// The CUDA upload path. Without a GPU (CI) this checks the planner and the errors; with one, that
// device bytes equal file bytes after copying them back, through every entry point.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "gpu_support.hpp"
#include "servers.hpp"
#include "support.hpp"

using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::Index;
using safetensors::SafeOpen;
using safetensors::TensorView;
namespace cuda = safetensors::cuda;

namespace {

using test::kind_of;

/// A file of assorted tensors: odd sizes (so alignment padding shows), several dtypes, and one
/// larger than a staging slot so uploads span several chunks.
std::filesystem::path make_file(const test::TempDir& dir) {
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<std::pair<std::string, TensorView>> tensors;
  const std::vector<std::pair<Dtype, std::vector<std::size_t>>> specs = {{Dtype::F32, {3, 5}},
                                                                         {Dtype::BF16, {7}},
                                                                         {Dtype::U8, {5, 3}},
                                                                         {Dtype::F64, {2, 2}},
                                                                         {Dtype::F32, {1024, 3072}}};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto& [d, shape] = specs[i];
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    auto& b = storage.emplace_back(n * safetensors::bit_size(d) / 8);
    for (std::size_t j = 0; j < b.size(); ++j) b[j] = static_cast<std::uint8_t>(j * 13 + i * 7);
    tensors.emplace_back("t" + std::to_string(i), TensorView{d, shape, std::as_bytes(std::span(b)), {}});
  }
  auto path = dir / "cuda.safetensors";
  safetensors::save_file(path, tensors);
  return path;
}

TEST(CudaPlan, PlacesEveryTensorAlignedWithoutAGpu) {
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  auto [total, placements] = cuda::plan(f);
  ASSERT_EQ(placements.size(), f.size());
  std::size_t end = 0;
  for (const auto& p : placements) {
    EXPECT_EQ(p.offset % 256, 0u) << p.name;
    EXPECT_GE(p.offset, end) << p.name;
    EXPECT_EQ(p.byte_size, f.info(p.name).byte_size());
    EXPECT_EQ(p.shape, f.info(p.name).shape);
    end = p.offset + p.byte_size;
  }
  EXPECT_EQ(total, end);
  std::vector<safetensors::Request> some{{"t4", {Index::all(), Index::range(0, 1536)}}, {"t0", {}}};
  auto [sub_total, sub] = cuda::plan(f, some, {.alignment = 512});
  ASSERT_EQ(sub.size(), 2u);
  EXPECT_EQ(sub[0].shape, (std::vector<std::size_t>{1024, 1536}));
  EXPECT_EQ(sub[0].byte_size, 1024u * 1536 * 4);
  EXPECT_EQ(sub[1].offset % 512, 0u);
  EXPECT_EQ(sub_total, sub[1].offset + sub[1].byte_size);
  EXPECT_EQ(kind_of([&] {
              (void)cuda::plan(f, std::vector<safetensors::Request>{{"nope", {}}});
            }),
            ErrorKind::TensorNotFound);
}

// Uploads read what prefetch and streams read from the same requests: `{}` is every tensor, an
// explicit empty list nothing, and a checkpoint request pinned to a shard must be in that shard.
TEST(CudaPlan, UploadsTakeTheSameRequestsAsStreamsShardPinsIncluded) {
  auto dir = test::fixture("shards", "manifest.tsv");
  if (!dir) return;
  safetensors::Checkpoint ckpt(*dir / "model.safetensors.index.json");
  EXPECT_EQ(cuda::plan(ckpt).second.size(), ckpt.size());
  EXPECT_EQ(cuda::plan(ckpt, std::vector<safetensors::Request>{}).second.size(), 0u);
  const std::string name = ckpt.keys().back();
  const auto paths = ckpt.shard_paths();
  const auto at = std::find(paths.begin(), paths.end(), ckpt.shard_of(name));
  ASSERT_NE(at, paths.end());
  const auto shard = static_cast<std::size_t>(at - paths.begin());
  const std::size_t other = (shard + 1) % paths.size();
  auto pinned = cuda::plan(ckpt, {{name, {}, shard}});
  ASSERT_EQ(pinned.second.size(), 1u);
  EXPECT_EQ(pinned.second[0].byte_size, ckpt.info(name).byte_size());
  if (other != shard) {
    const std::vector<safetensors::Request> wrong{{name, {}, other}};
    EXPECT_EQ(kind_of([&] { (void)cuda::plan(ckpt, wrong); }), ErrorKind::TensorNotFound);
    EXPECT_EQ(kind_of([&] { safetensors::TensorStream s(ckpt, wrong); }), ErrorKind::TensorNotFound);
  }
}

TEST(CudaPlan, AnAbsurdAlignmentIsBlamedNotTheShape) {
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  // 2^63 puts the third tensor at 2^64: the layout overflows, and the message used to blame the
  // tensor's shape ("validation overflow ... shape").
  const std::size_t huge = std::size_t{1} << 63;
  auto st = safetensors::nothrow::cuda::plan(f, {}, {.alignment = huge}).status();
  EXPECT_EQ(st.kind(), ErrorKind::ValidationOverflow) << st.message();
  EXPECT_NE(st.message().find("the alignment, " + std::to_string(huge) + " bytes"), std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("shape"), std::string::npos) << st.message();
  // SIZE_MAX is no power of two: refused by the one alignment rule of uploads, before any layout.
  auto odd = safetensors::nothrow::cuda::plan(f, {}, {.alignment = SIZE_MAX}).status();
  EXPECT_EQ(odd.kind(), ErrorKind::InvalidSlice) << odd.message();
  EXPECT_NE(odd.message().find("power of two"), std::string::npos) << odd.message();
  EXPECT_EQ(odd.message().find("shape"), std::string::npos) << odd.message();
}

TEST(Cuda, CopyToHostRefusesADestinationOverlappingTheSource) {
  // Device memory the host can address (managed memory, the emulated driver) could be the
  // destination itself; refused before any copy, with or without a GPU.
  std::vector<std::byte> buf(64);
  EXPECT_EQ(kind_of([&] { cuda::copy_to_host(buf.data(), std::span(buf).subspan(8, 16)); }),
            ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { cuda::copy_to_host(buf.data() + 8, std::span(buf).first(16)); }),
            ErrorKind::InvalidSlice);
}

/// Under the emulated driver the GPU tests get two devices (unless the environment says
/// otherwise), so that cross-device cases run too; the driver reads this in cuInit. (One ctest
/// ENVIRONMENT entry is all gtest_discover_tests passes through, and it names the driver.)
[[maybe_unused]] const bool two_emulated_devices = [] {
  if (test::emulated_driver_expected()) ::setenv("SAFETENSORS_FAKE_CUDA_DEVICES", "2", 0);
  return true;
}();

TEST(Cuda, WithoutAGpuEveryEntryPointIsACudaError) {
  if (cuda::available()) GTEST_SKIP() << "a GPU is present; the no-GPU path is not reachable here";
  if (std::getenv("SAFETENSORS_FAKE_LIBCUDA"))
    GTEST_SKIP() << "covered by CudaNoDevice under the fake driver";
  auto why = cuda::why_unavailable();
  if (cuda::built()) {
    EXPECT_NE(why.find("libcuda"), std::string::npos) << why;
  } else {
    EXPECT_NE(why.find("no CUDA support"), std::string::npos) << why;
  }
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  EXPECT_EQ(kind_of([] { (void)cuda::device_count(); }), ErrorKind::Cuda);
  EXPECT_EQ(kind_of([] { cuda::Uploader u(0); }), ErrorKind::Cuda);
  EXPECT_EQ(kind_of([&] { (void)cuda::load(f); }), ErrorKind::Cuda);
  EXPECT_EQ(kind_of([&] { (void)cuda::to_device(f, "t0"); }), ErrorKind::Cuda);
  std::cout << "GPU tests will skip: " << why << "\n";
}

TEST(CudaNoDevice, ADriverWithoutAGpuIsACudaErrorSayingSo) {
  if (!std::getenv("SAFETENSORS_FAKE_LIBCUDA"))
    GTEST_SKIP() << "runs under the fake driver (ctest cuda_no_device)";
  if (!cuda::built()) GTEST_SKIP() << "this build has no CUDA support";
  try {
    (void)cuda::device_count();
    FAIL() << "expected an error";
  } catch (const safetensors::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Cuda);
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(cuda::available());
  EXPECT_EQ(kind_of([] { cuda::Uploader u(0); }), ErrorKind::Cuda);
}

std::vector<std::byte> download(const void* ptr, std::size_t n, int device = 0) {
  std::vector<std::byte> out(n);
  cuda::copy_to_host(ptr, out, device);
  return out;
}

void expect_same(const std::vector<std::byte>& device_bytes, std::span<const std::byte> file_bytes,
                 const std::string& what) {
  ASSERT_EQ(device_bytes.size(), file_bytes.size()) << what;
  EXPECT_EQ(std::memcmp(device_bytes.data(), file_bytes.data(), file_bytes.size()), 0) << what;
}

/// Files to check on a GPU: $SAFETENSORS_GPU_TEST_FILES (colon-separated), plus a small one.
std::vector<std::filesystem::path> gpu_files(const test::TempDir& dir) {
  std::vector<std::filesystem::path> files{make_file(dir)};
  if (const char* env = std::getenv("SAFETENSORS_GPU_TEST_FILES")) {
    std::istringstream list(env);
    for (std::string p; std::getline(list, p, ':');) {
      if (!p.empty()) files.emplace_back(p);
    }
  }
  return files;
}

/// Compares every placed tensor with the file, hashing large ones piece by piece.
void check_upload(const SafeOpen& f, const cuda::DeviceTensors& up) {
  for (const auto& p : up.placements()) {
    auto view = f.get_tensor(p.name);
    ASSERT_EQ(p.byte_size, view.data.size()) << p.name;
    auto got = download(up.data(p.name), p.byte_size, up.buffer().device());
    expect_same(got, view.data, p.name);
  }
}

TEST(CudaGpu, WholeFilesLandByteForByte) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  for (const auto& path : gpu_files(dir)) {
    for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
      SafeOpen f(path, {backend});
      cuda::Uploader up(0, {.staging_slots = 4, .slot_bytes = 8u << 20});
      EXPECT_EQ(up.staging_bytes(), 4u * (8u << 20));
      auto loaded = up.load(f);
      EXPECT_EQ(loaded.placements().size(), f.size());
      check_upload(f, loaded);
      std::cout << path.filename() << ": " << loaded.buffer().size() << " bytes checked\n";
    }
  }
}

// A remote file read on demand uploads through the same ring: the ring's readers fetch their
// pieces with ranged GETs, and the device bytes equal the local file's (nginx on loopback; skips
// without it, or in a build without remote support).
#if defined(__SANITIZE_THREAD__)
#define SAFETENSORS_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SAFETENSORS_TEST_TSAN 1
#endif
#endif

TEST(CudaGpu, RemoteFilesOnDemandLandByteForByte) {
#if defined(SAFETENSORS_TEST_TSAN)
  // The remote transport's threads are Rust's tokio workers, which ThreadSanitizer does not
  // instrument: it sees their writes into the staging buffers but not the channel that orders
  // them before the copy. remote_test (dev and asan) and this test in every other preset cover
  // the path.
  GTEST_SKIP()
      << "remote reads run on uninstrumented Rust threads (ThreadSanitizer cannot see their ordering)";
#endif
  if (!test::gpu_or_skip()) return;
  if (!safetensors::remote_built()) GTEST_SKIP() << "built with SAFETENSORS_REMOTE=OFF";
  test::TempDir root, work;
  const auto path = make_file(root);
  auto server = test::Nginx::start(root.path(), work.path());
  if (!server) {
    if (test::servers_required()) FAIL() << "SAFETENSORS_REQUIRE_SERVERS=1 but nginx cannot run";
    GTEST_SKIP() << "nginx is not installed (apt-get install nginx)";
  }
  SafeOpen local(path);
  auto remote = SafeOpen::open_remote(server->url(path.filename().string()),
                                      {.concurrency = 4, .part_size = 64 << 10, .on_demand = true});
  cuda::Uploader up(0, {.staging_slots = 4, .slot_bytes = 1u << 20});
  auto loaded = up.load(remote);
  EXPECT_EQ(loaded.placements().size(), local.size());
  check_upload(local, loaded);
  // A column slice: 1024 runs of 4 KiB, 8 KiB apart. Each staging slot's runs go to the source
  // together (coalesced into spans, cut into 64 KiB parts), not one GET per run.
  const auto before = test::access_log(work.path()).size();
  std::vector<safetensors::Request> req{{"t4", {Index::all(), Index::range(1024, 2048)}}, {"t0", {1}}};
  auto part = up.load(remote, req);
  auto cols = local.get_slice("t4").select({Index::all(), Index::range(1024, 2048)}).read();
  expect_same(download(part.data("t4"), cols.data.size()), cols.data, "remote column slice");
  std::size_t gets = test::access_log(work.path()).size() - before;
  for (int tries = 0; tries < 100 && gets < 100; ++tries) {  // nginx logs after answering
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gets = test::access_log(work.path()).size() - before;
  }
  EXPECT_GT(gets, 0u);
  EXPECT_LT(gets, 400u) << "the slice's runs were fetched one by one";
}

TEST(CudaGpu, SubsetsSlicesAndSingleTensors) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  std::vector<safetensors::Request> req{
      {"t4", {Index::all(), Index::range(1024, 2048)}}, {"t2", {}}, {"t0", {1}}};
  auto loaded = cuda::Uploader(0).load(f, req);
  auto cols = f.get_slice("t4").select({Index::all(), Index::range(1024, 2048)}).read();
  expect_same(download(loaded.data("t4"), cols.data.size()), cols.data, "column slice");
  auto row = f.get_slice("t0").select({1}).read();
  expect_same(download(loaded.data("t0"), row.data.size()), row.data, "row");
  auto one = cuda::to_device(f, "t3");
  EXPECT_EQ(one.shape, (std::vector<std::size_t>{2, 2}));
  expect_same(download(one.data(), one.byte_size()), f.get_tensor("t3").data, "to_device");
}

TEST(CudaGpu, TheNothrowFacesLoadTheSameBytesAndReportTheSameErrors) {
  if (!test::gpu_or_skip()) return;
  namespace nc = safetensors::nothrow::cuda;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  auto shared = nc::load(f);
  ASSERT_TRUE(shared) << shared.status().message();
  check_upload(f, *shared);
  auto up = nc::make_uploader(0, {.staging_slots = 2, .slot_bytes = 1u << 20});
  ASSERT_TRUE(up) << up.status().message();
  std::vector<safetensors::Request> req{{"t4", {Index::all(), Index::range(0, 8)}}, {"t1", {}}};
  auto part = nc::load(*up, f, req);
  ASSERT_TRUE(part);
  auto cols = f.get_slice("t4").select({Index::all(), Index::range(0, 8)}).read();
  expect_same(download(nc::data(*part, "t4").value(), cols.data.size()), cols.data, "nothrow slice");
  EXPECT_TRUE(nc::synchronize(*up).ok());
  auto one = nc::to_device(f, "t3");
  ASSERT_TRUE(one);
  expect_same(download(one->data(), one->byte_size()), f.get_tensor("t3").data, "nothrow to_device");

  // The same errors as the throwing faces, kind for kind.
  EXPECT_EQ(nc::make_uploader(-1).status().kind(), kind_of([] { cuda::Uploader u(-1); }));
  EXPECT_EQ(nc::make_uploader(-1).status().kind(), ErrorKind::Cuda);
  EXPECT_EQ(nc::load(f, 99).status().kind(), kind_of([&] { (void)cuda::load(f, 99); }));
  std::vector<safetensors::Request> missing{{"nope", {}}};
  EXPECT_EQ(nc::load(*up, f, missing).status().kind(), ErrorKind::TensorNotFound);
  std::vector<safetensors::Request> bad_slice{{"t4", {SIZE_MAX}}};
  EXPECT_EQ(nc::load(*up, f, bad_slice).status().kind(), ErrorKind::InvalidSlice);
  EXPECT_EQ(nc::data(*part, "nope").status().kind(), ErrorKind::TensorNotFound);
  auto at = nc::at(*part, "t1");
  ASSERT_TRUE(at) << at.status().message();
  EXPECT_EQ(at->offset, part->at("t1").offset);
  EXPECT_EQ(at->byte_size, f.get_tensor("t1").data.size());
  test::expect_same(nc::at(*part, "nope").status(), test::thrown([&] { (void)part->at("nope"); }));
  auto planned = nc::plan(f, req);
  ASSERT_TRUE(planned) << planned.status().message();
  EXPECT_EQ(planned->first, cuda::plan(f, req).first);
  ASSERT_EQ(planned->second.size(), part->placements().size());
  for (std::size_t i = 0; i < planned->second.size(); ++i) {
    EXPECT_EQ(planned->second[i].offset, part->placements()[i].offset) << planned->second[i].name;
  }
  test::expect_same(nc::plan(f, missing).status(), test::thrown([&] { (void)cuda::plan(f, missing); }));
  auto seconds = nc::pinned_copy_seconds(1u << 20);
  ASSERT_TRUE(seconds) << seconds.status().message();
  EXPECT_GT(*seconds, 0.0);
  test::expect_same(nc::pinned_copy_seconds(1u << 20, -1).status(),
                    test::thrown([] { (void)cuda::pinned_copy_seconds(1u << 20, -1); }));
  auto released = std::move(*part).release_buffer();
  EXPECT_EQ(nc::data(*part, "t4").status().kind(), ErrorKind::Internal);  // NOLINT: after release
  auto moved = std::move(*up);
  EXPECT_EQ(nc::synchronize(*up).kind(), ErrorKind::Internal);  // NOLINT: use after move
}

TEST(CudaGpu, ShardedCheckpointsLoadIntoOneAllocation) {
  if (!test::gpu_or_skip()) return;
  auto dir = test::fixture("shards", "manifest.tsv");
  if (!dir) return;
  safetensors::Checkpoint ckpt(*dir / "model.safetensors.index.json");
  auto loaded = cuda::load(ckpt);
  EXPECT_EQ(loaded.placements().size(), ckpt.size());
  for (const auto& p : loaded.placements()) {
    expect_same(download(loaded.data(p.name), p.byte_size), ckpt.get_tensor(p.name).data, p.name);
  }
}

/// The driver entry points a test needs to make its own buffer and stream, as an engine would.
using test::Driver;

TEST(CudaGpu, CallerBufferAndStream) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  cuda::Uploader up(0, {.slot_bytes = 1u << 20});
  Driver drv;
  ASSERT_NE(drv.lib, nullptr);
  // The library restores the caller's context: an engine makes the device's primary context
  // current itself (as the CUDA runtime does) before allocating.
  int dev = 0;
  void* ctx = nullptr;
  ASSERT_EQ(drv.get<int (*)(int*, int)>("cuDeviceGet")(&dev, 0), 0);
  ASSERT_EQ(drv.get<int (*)(void**, int)>("cuDevicePrimaryCtxRetain")(&ctx, dev), 0);
  ASSERT_EQ(drv.get<int (*)(void*)>("cuCtxSetCurrent")(ctx), 0);
  auto mem_alloc = drv.get<int (*)(std::uint64_t*, std::size_t)>("cuMemAlloc_v2");
  auto mem_free = drv.get<int (*)(std::uint64_t)>("cuMemFree_v2");
  auto stream_create = drv.get<int (*)(void**, unsigned)>("cuStreamCreate");
  auto stream_sync = drv.get<int (*)(void*)>("cuStreamSynchronize");
  auto stream_destroy = drv.get<int (*)(void*)>("cuStreamDestroy_v2");
  auto planned = cuda::plan(f);  // not a structured binding: clang 14 cannot capture those
  std::size_t bytes = planned.first;
  const auto& placements = planned.second;
  std::uint64_t dst = 0;
  void* stream = nullptr;
  ASSERT_EQ(mem_alloc(&dst, bytes), 0);
  ASSERT_EQ(stream_create(&stream, 1 /* non-blocking */), 0);
  auto placed =
      up.load_into(f, {}, reinterpret_cast<void*>(dst), bytes, reinterpret_cast<std::uintptr_t>(stream));
  EXPECT_EQ(placed.size(), placements.size());
  ASSERT_EQ(stream_sync(stream), 0);  // completion is visible on the caller's stream
  for (const auto& p : placed) {
    expect_same(download(reinterpret_cast<void*>(dst + p.offset), p.byte_size), f.get_tensor(p.name).data,
                p.name);
  }
  EXPECT_EQ(kind_of([&] {
              (void)up.load_into(f, {}, reinterpret_cast<void*>(dst), bytes - 1,
                                 reinterpret_cast<std::uintptr_t>(stream));
            }),
            ErrorKind::Cuda);
  up.synchronize();
  stream_destroy(stream);
  mem_free(dst);
  drv.get<int (*)(void*)>("cuCtxSetCurrent")(nullptr);
  drv.get<int (*)(int)>("cuDevicePrimaryCtxRelease_v2")(dev);
}

TEST(CudaGpu, ManyThreadsLoadAtOnce) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  auto path = make_file(dir);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      SafeOpen f(path, {t % 2 ? safetensors::Backend::Read : safetensors::Backend::Mmap});
      auto loaded = cuda::load(f, 0, {.slot_bytes = 1u << 20, .readers = 2});
      for (const auto& p : loaded.placements()) {
        auto got = download(loaded.data(p.name), p.byte_size);
        auto want = f.get_tensor(p.name);
        if (got.size() != want.data.size() || std::memcmp(got.data(), want.data.data(), got.size()) != 0)
          ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(CudaGpu, ReleasedBuffersBelongToTheCaller) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  auto loaded = cuda::load(f);
  auto buffer = loaded.release_buffer();
  void* raw = buffer.release();
  EXPECT_EQ(buffer.data(), nullptr);
  auto want = f.get_tensor("t0");
  expect_same(download(raw, want.data.size()), want.data, "after release");
  // Freed as an engine would, with the device's primary context current (the library restored
  // the caller's: none).
  Driver drv;
  int dev = 0;
  void* ctx = nullptr;
  ASSERT_EQ(drv.get<int (*)(int*, int)>("cuDeviceGet")(&dev, 0), 0);
  ASSERT_EQ(drv.get<int (*)(void**, int)>("cuDevicePrimaryCtxRetain")(&ctx, dev), 0);
  ASSERT_EQ(drv.get<int (*)(void*)>("cuCtxSetCurrent")(ctx), 0);
  EXPECT_EQ(drv.get<int (*)(std::uint64_t)>("cuMemFree_v2")(reinterpret_cast<std::uintptr_t>(raw)), 0);
  drv.get<int (*)(void*)>("cuCtxSetCurrent")(nullptr);
  drv.get<int (*)(int)>("cuDevicePrimaryCtxRelease_v2")(dev);
}

}  // namespace
