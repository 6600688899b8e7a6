// DLPack export of device tensors (kDLCUDA), against the emulated CUDA driver (and a real one
// where present): metadata, the 256-byte data pointer rule, the bytes behind the pointer, and
// that each deleter keeps the device allocation alive until the last one runs.
#include <safetensors/cuda.hpp>
#include <safetensors/dlpack.hpp>
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "gpu_support.hpp"
#include "support.hpp"

namespace {

using safetensors::Dtype;
using safetensors::ErrorKind;
namespace cuda = safetensors::cuda;

/// Two emulated devices, so that the second-device case runs; read by the driver at cuInit (a
/// real driver ignores it).
[[maybe_unused]] const bool two_emulated_devices = [] {
  if (test::emulated_driver_expected()) ::setenv("SAFETENSORS_FAKE_CUDA_DEVICES", "2", 0);
  return true;
}();

std::filesystem::path make_file(const test::TempDir& dir) {
  static std::vector<std::uint8_t> a(3 * 5 * 4), b(7 * 2), c(9);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint8_t>(i * 3 + 1);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(i * 5 + 2);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<std::uint8_t>(i * 7 + 3);
  auto path = dir / "d.safetensors";
  safetensors::save_file(path, {{"a", {Dtype::F32, {3, 5}, std::as_bytes(std::span(a))}},
                                {"b", {Dtype::BF16, {7}, std::as_bytes(std::span(b))}},
                                {"c", {Dtype::U8, {9}, std::as_bytes(std::span(c))}}});
  return path;
}

/// The live device allocations the emulated driver counts (-1 on a real driver).
int live_allocations() {
  test::Driver d;
  auto* f = reinterpret_cast<int (*)()>(d.find("fakecuda_live_device_allocations"));
  return f != nullptr ? f() : -1;
}

/// The bytes a DLPack device tensor describes, copied back to the host.
std::vector<std::byte> bytes_of(const DLManagedTensorVersioned& m, std::size_t len) {
  std::vector<std::byte> out(len);
  const auto* at = static_cast<const std::byte*>(m.dl_tensor.data) + m.dl_tensor.byte_offset;
  cuda::copy_to_host(at, out, m.dl_tensor.device.device_id);
  return out;
}

TEST(DLPackDevice, TensorsOfAnUploadExportWithTheirMetadataAndKeepTheAllocationAlive) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  safetensors::SafeOpen f(make_file(dir));
  const int before = live_allocations();
  auto all = std::make_shared<cuda::DeviceTensors>(cuda::Uploader(0).load(f));
  safetensors::DLPackTensor a = safetensors::to_dlpack(all, "a");
  safetensors::DLPackTensor b = safetensors::to_dlpack(all, "b");

  const DLTensor& t = a->dl_tensor;
  EXPECT_EQ(t.device.device_type, kDLCUDA);
  EXPECT_EQ(t.device.device_id, 0);
  EXPECT_EQ(t.dtype.code, kDLFloat);
  EXPECT_EQ(t.dtype.bits, 32);
  ASSERT_EQ(t.ndim, 2);
  EXPECT_EQ(t.shape[0], 3);
  EXPECT_EQ(t.shape[1], 5);
  EXPECT_EQ(t.strides[0], 5);
  EXPECT_EQ(t.strides[1], 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data) % 256, 0u);
  EXPECT_EQ(static_cast<std::byte*>(t.data) + t.byte_offset, all->data("a"));
  EXPECT_EQ(a->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0u);  // device memory we own is writable
  EXPECT_EQ(a->version.major, DLPACK_MAJOR_VERSION);
  EXPECT_EQ(b->dl_tensor.dtype.code, kDLBfloat);

  // The exports alone keep the allocation: drop every other reference, then read through them.
  const auto a_bytes = f.get_tensor("a");
  all.reset();
  if (before >= 0) {
    EXPECT_EQ(live_allocations(), before + 1);
  }
  auto got = bytes_of(*a, a_bytes.data.size());
  EXPECT_EQ(std::memcmp(got.data(), a_bytes.data.data(), got.size()), 0);
  a.reset();
  if (before >= 0) {
    EXPECT_EQ(live_allocations(), before + 1);
  }  // `b` still holds it
  auto b_bytes = f.get_tensor("b");
  auto got_b = bytes_of(*b, b_bytes.data.size());
  EXPECT_EQ(std::memcmp(got_b.data(), b_bytes.data.data(), got_b.size()), 0);
  // A consumer that takes the tensor calls the deleter once; then the allocation is freed.
  DLManagedTensorVersioned* taken = b.release();
  taken->deleter(taken);
  if (before >= 0) {
    EXPECT_EQ(live_allocations(), before);
  }
}

TEST(DLPackDevice, UnalignedPlacementsSplitIntoA256ByteBoundaryAndAnOffset) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  safetensors::SafeOpen f(make_file(dir));
  auto all = std::make_shared<cuda::DeviceTensors>(cuda::load(f, 0, {.alignment = 4}));
  bool saw_offset = false;
  for (const auto& name : f.keys()) {
    auto t = safetensors::to_dlpack(all, name);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t->dl_tensor.data) % 256, 0u) << name;
    EXPECT_LT(t->dl_tensor.byte_offset, 256u) << name;
    EXPECT_EQ(static_cast<std::byte*>(t->dl_tensor.data) + t->dl_tensor.byte_offset, all->data(name)) << name;
    saw_offset = saw_offset || t->dl_tensor.byte_offset != 0;
    auto want = f.get_tensor(name);
    auto got = bytes_of(*t, want.data.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data.data(), got.size()), 0) << name;
  }
  EXPECT_TRUE(saw_offset);  // 4-byte alignment puts some tensors inside a 256-byte block
}

TEST(DLPackDevice, ASingleUploadedTensorHandsItsAllocationToTheExport) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  safetensors::SafeOpen f(make_file(dir));
  const int before = live_allocations();
  auto one = cuda::to_device(f, "c");
  auto t = safetensors::to_dlpack(std::move(one));
  EXPECT_EQ(one.buffer.data(), nullptr);  // NOLINT: moved into the export
  EXPECT_EQ(t->dl_tensor.dtype.code, kDLUInt);
  EXPECT_EQ(t->dl_tensor.shape[0], 9);
  auto got = bytes_of(*t, 9);
  auto want = f.get_tensor("c");
  EXPECT_EQ(std::memcmp(got.data(), want.data.data(), 9), 0);
  if (before >= 0) {
    EXPECT_EQ(live_allocations(), before + 1);
  }
  t.reset();
  if (before >= 0) {
    EXPECT_EQ(live_allocations(), before);
  }
}

TEST(DLPackDevice, MissingTensorsReleasedBuffersAndNullHandlesAreTypedErrors) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  safetensors::SafeOpen f(make_file(dir));
  auto all = std::make_shared<cuda::DeviceTensors>(cuda::load(f));
  EXPECT_EQ(safetensors::nothrow::to_dlpack(all, "nope").status().kind(), ErrorKind::TensorNotFound);
  EXPECT_EQ(test::kind_of([&] { (void)safetensors::to_dlpack(all, "nope"); }), ErrorKind::TensorNotFound);
  EXPECT_EQ(
      safetensors::nothrow::to_dlpack(std::shared_ptr<const cuda::DeviceTensors>{}, "a").status().kind(),
      ErrorKind::Internal);
  auto released = std::make_shared<cuda::DeviceTensors>(cuda::load(f));
  cuda::DeviceBuffer mine = released->release_buffer();
  EXPECT_EQ(safetensors::nothrow::to_dlpack(released, "a").status().kind(), ErrorKind::Internal);
  cuda::DeviceTensor empty;
  EXPECT_EQ(safetensors::nothrow::to_dlpack(std::move(empty)).status().kind(), ErrorKind::Internal);
  // A refused export leaves the tensor's allocation with the caller.
  auto one = cuda::to_device(f, "c");
  one.shape = {100};
  void* before = one.buffer.data();
  EXPECT_EQ(safetensors::nothrow::to_dlpack(std::move(one)).status().kind(), ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(one.buffer.data(), before);  // NOLINT: not moved from, since the export was refused
}

TEST(DLPackDevice, TensorsOnASecondDeviceCarryItsOrdinal) {
  if (!test::gpu_or_skip()) return;
  if (cuda::device_count() < 2) GTEST_SKIP() << "one device";
  test::TempDir dir;
  safetensors::SafeOpen f(make_file(dir));
  auto all = std::make_shared<cuda::DeviceTensors>(cuda::load(f, 1));
  auto t = safetensors::to_dlpack(all, "a");
  EXPECT_EQ(t->dl_tensor.device.device_id, 1);
  auto want = f.get_tensor("a");
  auto got = bytes_of(*t, want.data.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data.data(), got.size()), 0);
}

}  // namespace
