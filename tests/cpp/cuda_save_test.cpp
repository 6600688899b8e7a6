// Saving tensors that live in device memory: `cuda::save` and `cuda::write_tensors` (device ->
// pinned ring -> file). The file must be byte-identical to `save_file` of the same bytes from the
// host, the pinned memory bounded by the ring whatever the tensors' size, a failure mid-way
// (an injected driver error) or a bad address must leave no file and the target as it was, and
// a sharded checkpoint must be writable from the device too. Runs against the emulated driver
// (label gpu) and a real one when there is a GPU.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "support.hpp"

using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::TensorView;
namespace cuda = safetensors::cuda;
namespace nc = safetensors::nothrow::cuda;

namespace {

using test::Driver;

std::vector<std::string> listing(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Tensors in host memory and their copies in device memory (freed on destruction).
struct OnDevice {
  const Driver& driver;
  std::vector<std::vector<std::byte>> host;
  std::vector<cuda::DeviceTensorView> views;

  explicit OnDevice(const Driver& d) : driver(d) {
    add("embed", Dtype::F32, {1000, 30});  // 120,000 bytes: several slots of the small rings
    add("norm", Dtype::BF16, {77});
    add("ids", Dtype::I64, {5});
    add("empty", Dtype::F16, {0, 3});
    add("q", Dtype::F4, {10});
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  ~OnDevice() {
    for (const auto& v : views) {
      if (v.data != nullptr) driver.free(reinterpret_cast<std::uintptr_t>(v.data));
    }
  }

  void add(std::string name, Dtype dtype, std::vector<std::size_t> shape) {
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    auto& bytes = host.emplace_back(n * safetensors::bit_size(dtype) / 8);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<std::byte>((i * 7 + host.size() * 31) & 0xff);
    const void* data = nullptr;
    if (!bytes.empty()) {
      auto ptr = driver.alloc(bytes.size());
      using HtoD = int (*)(std::uint64_t, const void*, std::size_t);
      EXPECT_EQ(driver.get<HtoD>("cuMemcpyHtoD_v2")(ptr, bytes.data(), bytes.size()), 0);
      data = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(ptr));
    }
    views.push_back({std::move(name), dtype, std::move(shape), data});
  }

  /// The same tensors saved from host memory.
  void save_from_host(const std::filesystem::path& path, const safetensors::Metadata& metadata,
                      safetensors::SaveOptions options = {}) const {
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (std::size_t i = 0; i < views.size(); ++i) {
      tensors.emplace_back(views[i].name, TensorView{views[i].dtype, views[i].shape, host[i], {}});
    }
    safetensors::save_file(path, tensors, metadata, options);
  }
};

const safetensors::Metadata kMeta{{"format", "pt"}};

TEST(CudaGpuSave, DeviceTensorsSaveAsTheSameBytesFromTheHostWouldWithBoundedPinnedMemory) {
  if (!test::gpu_or_skip()) return;
  Driver driver;
  driver.enter_primary(0);
  test::TempDir dir;
  {
    OnDevice t(driver);
    t.save_from_host(dir / "host.safetensors", kMeta);
    const auto want = test::read_bytes(dir / "host.safetensors");
    using Peak = std::size_t (*)(int);
    auto peak = driver.emulated() ? driver.get<Peak>("fakecuda_peak_pinned_bytes") : nullptr;
    // Pinned memory no save holds waits idle for the next one (not a leak): counted with none.
    const auto idle_released = [&] {
      (void)cuda::release_staging(0);
      return driver.counter("fakecuda_live_pinned_allocations");
    };
    const int live = driver.emulated() ? idle_released() : 0;
    for (auto staging : {cuda::SaveStaging{.staging_slots = 2, .slot_bytes = 4096}, cuda::SaveStaging{},
                         cuda::SaveStaging{.staging_slots = 1, .slot_bytes = 1000}}) {
      const auto path = dir / ("device-" + std::to_string(staging.slot_bytes) + ".safetensors");
      if (peak) (void)idle_released();
      const std::size_t before = peak ? peak(1) : 0;
      cuda::save(path, t.views, kMeta, {}, 0, staging);
      EXPECT_EQ(test::read_bytes(path), want) << staging.staging_slots << " x " << staging.slot_bytes;
      if (peak) {
        // The ring, no more: slots of at most the slot size (or the largest tensor, if smaller).
        const std::size_t slots = staging.staging_slots ? staging.staging_slots : 4;
        const std::size_t slot =
            std::min<std::size_t>(staging.slot_bytes ? staging.slot_bytes : 16u << 20, 120000);
        EXPECT_LE(peak(0) - before, slots * slot);
        EXPECT_GT(peak(0), before);
        EXPECT_EQ(idle_released(), live);
      }
    }
    // The nothrow face, and an aligned layout.
    ASSERT_TRUE(nc::save(dir / "aligned.safetensors", t.views, kMeta, {.alignment = 4096}).ok());
    t.save_from_host(dir / "aligned-host.safetensors", kMeta, {.alignment = 4096});
    EXPECT_EQ(test::read_bytes(dir / "aligned.safetensors"),
              test::read_bytes(dir / "aligned-host.safetensors"));
  }
  driver.leave_primary(0);
}

TEST(CudaGpuSave, UploadedTensorsSaveBackToTheFileTheyCameFrom) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  Driver driver;
  driver.enter_primary(0);
  {
    OnDevice t(driver);
    t.save_from_host(dir / "model.safetensors", kMeta);
    safetensors::SafeOpen f(dir / "model.safetensors");
    auto uploaded = cuda::load(f);
    cuda::save(dir / "again.safetensors", uploaded, kMeta);
    EXPECT_EQ(test::read_bytes(dir / "again.safetensors"), test::read_bytes(dir / "model.safetensors"));
  }
  driver.leave_primary(0);
}

TEST(CudaGpuSave, AShardedCheckpointIsWrittenFromTheDevice) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  Driver driver;
  driver.enter_primary(0);
  {
    OnDevice t(driver);
    std::vector<safetensors::TensorSpec> specs;
    std::vector<const void*> data;
    for (const auto& v : t.views) {
      specs.push_back({v.name, v.dtype, v.shape});
      data.push_back(v.data);
    }
    safetensors::ShardedWriter out(dir.path(), specs, kMeta, {.max_shard_size = 1000});
    cuda::write_tensors(out, data, 0, {.staging_slots = 3, .slot_bytes = 10000});
    out.finish();
    safetensors::Checkpoint ckpt(dir / "model.safetensors.index.json");
    EXPECT_GT(ckpt.shard_count(), 1u);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      auto got = ckpt.get_tensor(specs[i].name);
      EXPECT_TRUE(std::equal(got.data.begin(), got.data.end(), t.host[i].begin(), t.host[i].end()))
          << specs[i].name;
    }
  }
  driver.leave_primary(0);
}

TEST(CudaGpuSave, AFailureMidWayOrABadAddressLeavesNoFileAndTheTargetAsItWas) {
  if (!test::gpu_or_skip()) return;
  Driver driver;
  test::TempDir dir;
  const auto target = dir / "out.safetensors";
  std::vector<std::uint8_t> old(10, 1);
  safetensors::save_file(target,
                         {{"old", TensorView{Dtype::U8, {old.size()}, std::as_bytes(std::span(old)), {}}}});
  const auto before = test::read_bytes(target);
  driver.enter_primary(0);
  {
    OnDevice t(driver);
    auto unchanged = [&](const char* after) {
      EXPECT_EQ(test::read_bytes(target), before) << after;
      EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"out.safetensors"}) << after;
    };
    // A host address, and a device allocation too small for its tensor: refused before any copy.
    auto views = t.views;
    std::vector<std::byte> host(views[1].name.size() + 200);
    views[1].data = host.data();
    auto st = nc::save(target, views, kMeta);
    EXPECT_EQ(st.kind(), ErrorKind::Cuda) << st.message();
    EXPECT_NE(st.message().find("norm"), std::string::npos) << st.message();
    unchanged("a host address");
    views = t.views;
    views[2].shape = {50};
    st = nc::save(target, views, kMeta);
    EXPECT_EQ(st.kind(), ErrorKind::Cuda) << st.message();
    EXPECT_NE(st.message().find("ids"), std::string::npos) << st.message();
    unchanged("a short allocation");
    // The wrong number of addresses for the declared tensors.
    safetensors::StreamingWriter w(target, {{"a", Dtype::U8, {1}}});
    EXPECT_EQ(nc::write_tensors(w, {}).kind(), ErrorKind::Internal);
    if (driver.emulated()) {
      (void)cuda::release_staging(0);
      const int live = driver.counter("fakecuda_live_pinned_allocations");
      // The third copy fails: the save stops with the driver's error once the copies in flight
      // are done, and publishes nothing.
      driver.fail("cuMemcpyDtoHAsync:3");
      st = nc::save(target, t.views, kMeta, {}, 0, {.staging_slots = 2, .slot_bytes = 4096});
      driver.fail("");
      EXPECT_EQ(st.kind(), ErrorKind::Cuda) << st.message();
      EXPECT_NE(st.message().find("cuMemcpyDtoHAsync"), std::string::npos) << st.message();
      unchanged("a failed copy");
      (void)cuda::release_staging(0);
      EXPECT_EQ(driver.counter("fakecuda_live_pinned_allocations"), live);
    }
  }
  driver.leave_primary(0);
  // A device that does not exist.
  EXPECT_EQ(nc::save(target, {}, {}, {}, 7).kind(), ErrorKind::Cuda);
  EXPECT_EQ(nc::save(target, {}, {}, {}, -1).kind(), ErrorKind::Cuda);
}

}  // namespace
