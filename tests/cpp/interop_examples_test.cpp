// The hand-offs docs/interop.md shows, run and checked: an Eigen::Map over a view (where Eigen
// is found: SAFETENSORS_TEST_EIGEN), and a raw pointer with a ggml-style shape and byte strides
// for an engine of its own, with the view's owner keeping the bytes alive.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#if defined(SAFETENSORS_TEST_EIGEN)
#include <Eigen/Core>
#endif

#include "support.hpp"

using safetensors::Dtype;
using safetensors::SafeOpen;
using safetensors::TensorView;

namespace {

/// A weight matrix F32 [3, 4] (w[r][c] = r * 10 + c) and a bias F32 [3], written by our writer.
std::filesystem::path write_model(const test::TempDir& dir) {
  std::vector<float> w(12);
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 4; ++c) w[r * 4 + c] = static_cast<float>(r * 10 + c);
  std::vector<float> b{0.5f, -1.0f, 2.0f};
  auto path = dir / "model.safetensors";
  safetensors::save_file(path, {{"w", TensorView{Dtype::F32, {3, 4}, std::as_bytes(std::span(w))}},
                                {"b", TensorView{Dtype::F32, {3}, std::as_bytes(std::span(b))}}});
  return path;
}

TEST(InteropExamples, EigenMapsAViewWithoutACopy) {
#if defined(SAFETENSORS_TEST_EIGEN)
  test::TempDir dir;
  SafeOpen f(write_model(dir));
  TensorView w = f.get_tensor("w");
  TensorView b = f.get_tensor("b");
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMajor> m(w.as<float>().data(), static_cast<Eigen::Index>(w.shape[0]),
                               static_cast<Eigen::Index>(w.shape[1]));
  Eigen::Map<const Eigen::VectorXf> bias(b.as<float>().data(), static_cast<Eigen::Index>(b.shape[0]));
  EXPECT_EQ(static_cast<const void*>(m.data()), static_cast<const void*>(w.data.data())) << "no copy";
  Eigen::VectorXf x = Eigen::VectorXf::LinSpaced(4, 1.0f, 4.0f);  // 1 2 3 4
  Eigen::VectorXf y = m * x + bias;
  // Row r: sum over c of (10r + c)(c + 1) = 100r + 20, plus the bias.
  EXPECT_FLOAT_EQ(y[0], 20.0f + 0.5f);
  EXPECT_FLOAT_EQ(y[1], 120.0f - 1.0f);
  EXPECT_FLOAT_EQ(y[2], 220.0f + 2.0f);
  EXPECT_FLOAT_EQ(m(2, 3), 23.0f);
#else
  GTEST_SKIP() << "no Eigen here (Debian: apt install libeigen3-dev): the Eigen example was not built";
#endif
}

/// A C engine's tensor, in ggml's convention: ne[0] is the innermost dimension, nb[i] the byte
/// stride of dimension i, and the data pointer borrowed.
struct EngineTensor {
  std::int64_t ne[4] = {1, 1, 1, 1};
  std::size_t nb[4] = {0, 0, 0, 0};
  const void* data = nullptr;
};

/// The hand-off of docs/interop.md: shape reversed into `ne`, row-major byte strides into `nb`.
std::optional<EngineTensor> hand_off(const TensorView& v) {
  if (v.shape.size() > 4 || safetensors::bit_size(v.dtype) % 8 != 0) return std::nullopt;
  EngineTensor t;
  const std::size_t rank = v.shape.size();
  for (std::size_t i = 0; i < rank; ++i) t.ne[i] = static_cast<std::int64_t>(v.shape[rank - 1 - i]);
  t.nb[0] = safetensors::bit_size(v.dtype) / 8;
  for (std::size_t i = 1; i < 4; ++i) t.nb[i] = t.nb[i - 1] * static_cast<std::size_t>(t.ne[i - 1]);
  t.data = v.data.data();
  return t;
}

TEST(InteropExamples, AGgmlStyleHandOffAddressesEveryElementAndOutlivesTheFile) {
  test::TempDir dir;
  auto path = write_model(dir);
  std::shared_ptr<const void> keep;  // what the engine holds as long as it uses the pointer
  EngineTensor t;
  {
    SafeOpen f(path);
    TensorView w = f.get_tensor("w");
    t = *hand_off(w);
    keep = w.owner;
  }  // the file and the view are gone; `keep` holds the mapping
  EXPECT_EQ(t.ne[0], 4);
  EXPECT_EQ(t.ne[1], 3);
  EXPECT_EQ(t.ne[2], 1);
  EXPECT_EQ(t.nb[0], 4u);
  EXPECT_EQ(t.nb[1], 16u);
  EXPECT_EQ(t.nb[3], 48u);
  for (std::int64_t r = 0; r < t.ne[1]; ++r) {
    for (std::int64_t c = 0; c < t.ne[0]; ++c) {
      auto at = static_cast<const std::byte*>(t.data) + static_cast<std::size_t>(r) * t.nb[1] +
                static_cast<std::size_t>(c) * t.nb[0];
      float v = 0;
      std::memcpy(&v, at, sizeof v);
      EXPECT_EQ(v, static_cast<float>(r * 10 + c));
    }
  }
  EXPECT_FALSE(hand_off(TensorView{Dtype::F4, {2}, {}}).has_value())
      << "sub-byte types need the engine's own";
}

}  // namespace
