// DLPack export of CPU tensors: types, shapes, strides, flags, and the deleter's ownership.
#include <safetensors/dlpack.hpp>
#include <safetensors/safetensors.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "support.hpp"

namespace {

using safetensors::Dtype;
using safetensors::ErrorKind;

TEST(DLPack, EveryDtypeMapsToItsDLPackType) {
  struct Want {
    Dtype dtype;
    std::uint8_t code, bits;
  };
  const Want want[] = {
      {Dtype::BOOL, kDLBool, 8},
      {Dtype::U8, kDLUInt, 8},
      {Dtype::U16, kDLUInt, 16},
      {Dtype::U32, kDLUInt, 32},
      {Dtype::U64, kDLUInt, 64},
      {Dtype::I8, kDLInt, 8},
      {Dtype::I16, kDLInt, 16},
      {Dtype::I32, kDLInt, 32},
      {Dtype::I64, kDLInt, 64},
      {Dtype::F16, kDLFloat, 16},
      {Dtype::F32, kDLFloat, 32},
      {Dtype::F64, kDLFloat, 64},
      {Dtype::BF16, kDLBfloat, 16},
      {Dtype::C64, kDLComplex, 64},
      {Dtype::F8_E4M3, kDLFloat8_e4m3fn, 8},
      {Dtype::F8_E5M2, kDLFloat8_e5m2, 8},
      {Dtype::F8_E4M3FNUZ, kDLFloat8_e4m3fnuz, 8},
      {Dtype::F8_E5M2FNUZ, kDLFloat8_e5m2fnuz, 8},
      {Dtype::F8_E8M0, kDLFloat8_e8m0fnu, 8},
      {Dtype::F6_E2M3, kDLFloat6_e2m3fn, 6},
      {Dtype::F6_E3M2, kDLFloat6_e3m2fn, 6},
      {Dtype::F4, kDLFloat4_e2m1fn, 4},
  };
  ASSERT_EQ(std::size(want), safetensors::dtype_count);  // every dtype, once
  for (const auto& w : want) {
    DLDataType t = safetensors::dlpack_dtype(w.dtype);
    EXPECT_EQ(t.code, w.code) << safetensors::to_string(w.dtype);
    EXPECT_EQ(t.bits, w.bits) << safetensors::to_string(w.dtype);
    EXPECT_EQ(t.lanes, 1) << safetensors::to_string(w.dtype);
  }
  EXPECT_EQ(test::kind_of([] { (void)safetensors::dlpack_dtype(static_cast<Dtype>(99)); }),
            ErrorKind::TypeMismatch);
}

TEST(DLPack, AViewFromAFileKeepsTheFileAliveUntilTheDeleterRuns) {
  test::TempDir dir;
  std::vector<float> values(2 * 3 * 4);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  safetensors::TensorView w{Dtype::F32, {2, 3, 4}, std::as_bytes(std::span(values))};
  safetensors::save_file(dir / "m.safetensors", {{"w", w}});

  for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
    safetensors::DLPackTensor t;
    {
      safetensors::SafeOpen f(dir / "m.safetensors", {.backend = backend});
      t = safetensors::to_dlpack(f.get_tensor("w"));
    }  // the file and the view are gone; the export still owns the bytes
    const DLTensor& d = t->dl_tensor;
    EXPECT_EQ(t->version.major, DLPACK_MAJOR_VERSION);
    EXPECT_EQ(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_READ_ONLY);
    EXPECT_EQ(d.device.device_type, kDLCPU);
    ASSERT_EQ(d.ndim, 3);
    EXPECT_EQ(std::vector<std::int64_t>(d.shape, d.shape + 3), (std::vector<std::int64_t>{2, 3, 4}));
    EXPECT_EQ(std::vector<std::int64_t>(d.strides, d.strides + 3), (std::vector<std::int64_t>{12, 4, 1}));
    EXPECT_EQ(d.byte_offset, 0u);
    ASSERT_NE(d.data, nullptr);
    // Read after the SafeOpen is gone: AddressSanitizer would report it if the bytes were freed.
    EXPECT_EQ(std::memcmp(d.data, values.data(), values.size() * sizeof(float)), 0);
  }
}

TEST(DLPack, ScalarsZeroSizeAndSubByteTensors) {
  std::vector<std::byte> none;
  auto scalar_bytes = std::vector<std::byte>(8);
  auto t = safetensors::to_dlpack({Dtype::I64, {}, scalar_bytes});
  EXPECT_EQ(t->dl_tensor.ndim, 0);
  EXPECT_EQ(t->dl_tensor.shape, nullptr);
  EXPECT_NE(t->dl_tensor.data, nullptr);

  auto empty = safetensors::to_dlpack({Dtype::F16, {3, 0}, none});
  EXPECT_EQ(empty->dl_tensor.data, nullptr);  // DLPack: a zero-size tensor has no data pointer
  EXPECT_EQ(empty->dl_tensor.ndim, 2);

  auto f4_bytes = std::vector<std::byte>(3);  // 6 elements, two per byte
  auto f4 = safetensors::to_dlpack({Dtype::F4, {2, 3}, f4_bytes});
  EXPECT_EQ(f4->dl_tensor.dtype.bits, 4);
  EXPECT_EQ(f4->dl_tensor.shape[1], 3);  // in elements, not bytes
  EXPECT_EQ(f4->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 0u);
}

TEST(DLPack, StridesAreCheckedInt64ArithmeticEvenForZeroSizeTensors) {
  // U8 [0, 2^40, 2^40] is a valid tensor of no bytes, but its first stride (2^80) overflows
  // int64: that was signed overflow (undefined; UBSan) and a wrong stride. Now refused.
  const std::size_t big = std::size_t{1} << 40;
  auto refused = safetensors::nothrow::to_dlpack(safetensors::TensorView{Dtype::U8, {0, big, big}});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().kind(), ErrorKind::ValidationOverflow);
  EXPECT_NE(refused.status().message().find("strides do not fit DLPack's int64"), std::string::npos)
      << refused.status().message();
  // Where every stride fits, a zero-size tensor exports with its exact strides.
  auto zero_inside = safetensors::to_dlpack(safetensors::TensorView{Dtype::U8, {big, 0, big}});
  const auto* strides = zero_inside->dl_tensor.strides;
  EXPECT_EQ(std::vector<std::int64_t>(strides, strides + 3),
            (std::vector<std::int64_t>{0, static_cast<std::int64_t>(big), 1}));
  const std::size_t half = std::size_t{1} << 31;
  auto wide = safetensors::to_dlpack(safetensors::TensorView{Dtype::F32, {0, half, half}});
  strides = wide->dl_tensor.strides;
  EXPECT_EQ(strides[0], std::int64_t{1} << 62);
  EXPECT_EQ(wide->dl_tensor.data, nullptr);
}

TEST(DLPack, AMovedFromViewExportsNothing) {
  // A moved-from view is empty: it cannot hand a consumer the bytes only the new view keeps.
  auto bytes = std::make_shared<std::vector<float>>(1, 2.0f);
  safetensors::TensorView v{Dtype::F32, {1}, std::as_bytes(std::span(*bytes)), bytes};
  bytes.reset();
  auto w = std::move(v);
  // NOLINTNEXTLINE(bugprone-use-after-move): the point of the test
  EXPECT_EQ(test::kind_of([&] { (void)safetensors::to_dlpack(v); }), ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(safetensors::to_dlpack(w)->dl_tensor.ndim, 1);
}

TEST(DLPack, AViewWhoseBytesDisagreeWithItsShapeIsRefused) {
  auto bytes = std::vector<std::byte>(10);
  EXPECT_EQ(test::kind_of([&] {
              (void)safetensors::to_dlpack({Dtype::F32, {3}, bytes});
            }),
            ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(test::kind_of([&] {
              (void)safetensors::to_dlpack({Dtype::F4, {3}, std::span(bytes).first(2)});
            }),
            ErrorKind::TensorInvalidInfo);  // 3 fp4 elements are not whole bytes
  EXPECT_EQ(test::kind_of([&] {
              (void)safetensors::to_dlpack({Dtype::U8, {std::size_t{1} << 40, std::size_t{1} << 40}, bytes});
            }),
            ErrorKind::ValidationOverflow);
}

// ---- the unversioned ABI (DLManagedTensor), for consumers before DLPack 1.0 ------------------

TEST(DLPackUnversioned, AViewExportsWithTheSameMetadataAndKeepsTheFileAlive) {
  test::TempDir dir;
  std::vector<float> values(2 * 3);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) + 0.25f;
  safetensors::save_file(
      dir / "m.safetensors",
      {{"w", safetensors::TensorView{Dtype::F32, {2, 3}, std::as_bytes(std::span(values))}}});
  for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
    safetensors::DLPackUnversionedTensor t;
    {
      safetensors::SafeOpen f(dir / "m.safetensors", {.backend = backend});
      t = safetensors::to_dlpack_unversioned(f.get_tensor("w"));
    }  // the export alone keeps the bytes alive
    const DLTensor& d = t->dl_tensor;
    EXPECT_EQ(d.device.device_type, kDLCPU);
    EXPECT_EQ(d.dtype.code, kDLFloat);
    EXPECT_EQ(d.dtype.bits, 32);
    ASSERT_EQ(d.ndim, 2);
    EXPECT_EQ(std::vector<std::int64_t>(d.shape, d.shape + 2), (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(std::vector<std::int64_t>(d.strides, d.strides + 2), (std::vector<std::int64_t>{3, 1}));
    EXPECT_EQ(std::memcmp(d.data, values.data(), values.size() * sizeof(float)), 0);
  }
}

TEST(DLPackUnversioned, TheConsumerCallsTheDeleterOnceAndOwnershipEndsThere) {
  auto bytes = std::make_shared<std::vector<std::uint8_t>>(4, 7);
  std::weak_ptr<std::vector<std::uint8_t>> watch = bytes;
  safetensors::TensorView v{Dtype::U8, {4}, std::as_bytes(std::span(*bytes)), bytes};
  DLManagedTensor* raw = safetensors::to_dlpack_unversioned(v).release();
  v = {};
  bytes.reset();
  EXPECT_FALSE(watch.expired()) << "the export holds the bytes";
  EXPECT_EQ(static_cast<const std::uint8_t*>(raw->dl_tensor.data)[3], 7);
  raw->deleter(raw);  // as a consumer does, once
  EXPECT_TRUE(watch.expired());
}

TEST(DLPackUnversioned, RefusesWhatTheVersionedExportRefuses) {
  auto bytes = std::vector<std::byte>(10);
  auto st = safetensors::nothrow::to_dlpack_unversioned({Dtype::F32, {3}, bytes}).status();
  EXPECT_EQ(st.kind(), ErrorKind::TensorInvalidInfo);
  test::expect_same(st, safetensors::nothrow::to_dlpack({Dtype::F32, {3}, bytes}).status());
  EXPECT_EQ(test::kind_of([&] {
              (void)safetensors::to_dlpack_unversioned(
                  {Dtype::U8, {0, std::size_t{1} << 40, std::size_t{1} << 40}});
            }),
            ErrorKind::ValidationOverflow);
  auto empty = safetensors::to_dlpack_unversioned({Dtype::F16, {3, 0}, {}});
  EXPECT_EQ(empty->dl_tensor.data, nullptr);
  auto scalar = std::vector<std::byte>(8);
  EXPECT_EQ(safetensors::to_dlpack_unversioned({Dtype::I64, {}, scalar})->dl_tensor.shape, nullptr);
}

}  // namespace
