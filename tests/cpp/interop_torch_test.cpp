// libtorch and safetensors, both ways (docs/interop.md): a view handed to libtorch with
// `from_blob` (the deleter holds the view's owner) and through DLPack (versioned and unversioned),
// torch reading the file's bytes with no copy; and a torch tensor written with `save_file` and read
// back. Built where a libtorch is found (tests/CMakeLists.txt), skipped with a message elsewhere.
#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <safetensors/dlpack.hpp>
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "support.hpp"

using safetensors::Dtype;
using safetensors::SafeOpen;
using safetensors::TensorView;

namespace {

/// The torch type of a dtype torch has (the rest are not handed over here).
torch::Dtype torch_type(Dtype d) {
  switch (d) {
    case Dtype::F32:
      return torch::kFloat32;
    case Dtype::F16:
      return torch::kFloat16;
    case Dtype::BF16:
      return torch::kBFloat16;
    case Dtype::I64:
      return torch::kInt64;
    default:
      throw std::invalid_argument("no torch type here for " + std::string(safetensors::to_string(d)));
  }
}

/// The view as a torch tensor over the same bytes; the tensor's deleter holds the view's owner.
/// torch tensors are writable and a mapped file is not: treat it as read-only, or clone it.
torch::Tensor from_view(const TensorView& v) {
  std::vector<std::int64_t> sizes(v.shape.begin(), v.shape.end());
  auto owner = v.owner;
  return torch::from_blob(
      const_cast<std::byte*>(v.data.data()), sizes, [owner](void*) mutable { owner.reset(); },
      torch::TensorOptions().dtype(torch_type(v.dtype)));
}

std::filesystem::path write_model(const test::TempDir& dir, std::vector<float>& w) {
  w.resize(6);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) - 2.5f;
  auto path = dir / "m.safetensors";
  safetensors::save_file(path, {{"w", TensorView{Dtype::F32, {2, 3}, std::as_bytes(std::span(w))}}});
  return path;
}

TEST(InteropTorch, FromBlobSharesTheMappedBytesAndHoldsThemAlive) {
  test::TempDir dir;
  std::vector<float> w;
  auto path = write_model(dir, w);
  torch::Tensor t;
  std::weak_ptr<const void> mapping;
  {
    SafeOpen f(path);
    TensorView v = f.get_tensor("w");
    mapping = v.owner;
    t = from_view(v);
    EXPECT_EQ(t.data_ptr(), static_cast<const void*>(v.data.data())) << "no copy";
  }
  EXPECT_FALSE(mapping.expired()) << "the torch tensor holds the file";
  EXPECT_EQ(t.sizes(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_FLOAT_EQ(t.sum().item<float>(), 0.0f);  // -2.5 .. 2.5
  EXPECT_FLOAT_EQ(t.index({1, 2}).item<float>(), 2.5f);
  t = torch::Tensor();
  EXPECT_TRUE(mapping.expired()) << "the deleter let the file go";
}

TEST(InteropTorch, DLPackVersionedAndUnversionedReachTorchWithTheirDeleter) {
  test::TempDir dir;
  std::vector<float> w;
  auto path = write_model(dir, w);
  SafeOpen f(path);
  std::weak_ptr<const void> mapping = f.get_tensor("w").owner;
  const long held_by_the_file = mapping.use_count();
  for (bool versioned : {true, false}) {
    {
      TensorView v = f.get_tensor("w");
      torch::Tensor t = versioned ? at::fromDLPackVersioned(safetensors::to_dlpack(v).release())
                                  : at::fromDLPack(safetensors::to_dlpack_unversioned(v).release());
      EXPECT_EQ(t.data_ptr(), static_cast<const void*>(v.data.data())) << versioned;
      EXPECT_EQ(t.scalar_type(), torch::kFloat32);
      EXPECT_EQ(t.strides(), (std::vector<std::int64_t>{3, 1}));
      EXPECT_TRUE(torch::equal(t, torch::from_blob(w.data(), {2, 3})));
      v = {};
      EXPECT_GT(mapping.use_count(), held_by_the_file) << "the export holds the view's owner";
    }
    // Only the SafeOpen holds the mapping again: the deleter ran, once.
    EXPECT_EQ(mapping.use_count(), held_by_the_file) << versioned;
  }
}

TEST(InteropTorch, ATorchTensorIsWrittenAndReadBackUnchanged) {
  test::TempDir dir;
  torch::Tensor t = torch::arange(12, torch::kFloat32).reshape({3, 4}).mul(0.5).contiguous();
  auto path = dir / "from_torch.safetensors";
  safetensors::save_file(path, {{"t", TensorView{Dtype::F32,
                                                 {3, 4},
                                                 {static_cast<const std::byte*>(t.data_ptr()),
                                                  static_cast<std::size_t>(t.nbytes())}}}});
  SafeOpen f(path);
  TensorView back = f.get_tensor("t");
  EXPECT_TRUE(torch::equal(from_view(back), t));
  EXPECT_TRUE(torch::equal(from_view(back).matmul(torch::ones({4})), t.matmul(torch::ones({4}))));
}

}  // namespace
