// What the host (distributed_test) and device (distributed_cuda_test) tests of multi-rank
// loading share: W threads as ranks meeting in a `LocalGroup`, requests as (tensor, how rank r
// of w selects it), and a file shaped like one transformer layer with the requests a
// tensor-parallel engine makes for it.
#pragma once

#include <gtest/gtest.h>
#include <safetensors/distributed.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/tensor_parallel.hpp>

#include <barrier>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "../../cpp/local_group.hpp"
#include "support.hpp"

namespace test {

/// W threads' meeting point (cpp/local_group.hpp). The device tests extend it with a device
/// broadcast.
using LocalGroup = local::Group;

/// One request: which tensor, and how rank `r` of `w` selects it.
struct Want {
  std::string name;
  std::function<safetensors::Selection(const safetensors::Slice&, std::size_t, std::size_t)> select;
};

inline safetensors::Selection whole(const safetensors::Slice& s, std::size_t, std::size_t) {
  return s.select({});
}

/// Every rank's selections of `wants`, from one open file or checkpoint.
template <class Source>
std::vector<std::vector<safetensors::Selection>> needs_of(const Source& src, const std::vector<Want>& wants,
                                                          std::size_t world) {
  std::vector<std::vector<safetensors::Selection>> needs(world);
  for (std::size_t r = 0; r < world; ++r) {
    for (const auto& w : wants) needs[r].push_back(w.select(src.get_slice(w.name), r, world));
  }
  return needs;
}

inline std::vector<std::byte> iota_bytes(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
  return v;
}

/// A file shaped like one transformer layer: column- and row-parallel weights, a norm that every
/// rank replicates, a fused QKV (8 heads, 2 KV heads, head_dim 2) and an odd-sized tensor.
class LayerFile : public ::testing::Test {
 protected:
  void SetUp() override {
    using safetensors::Dtype;
    using safetensors::TensorView;
    col_ = iota_bytes(8 * 6 * 4, 1);
    row_ = iota_bytes(6 * 8 * 4, 2);
    norm_ = iota_bytes(6 * 2, 3);
    qkv_ = iota_bytes(24 * 6 * 4, 4);
    odd_ = iota_bytes(10 * 3, 5);
    safetensors::save_file(path(), {{"col.weight", TensorView{Dtype::F32, {8, 6}, col_, {}}},
                                    {"row.weight", TensorView{Dtype::F32, {6, 8}, row_, {}}},
                                    {"norm.weight", TensorView{Dtype::F16, {6}, norm_, {}}},
                                    {"attn.qkv.weight", TensorView{Dtype::F32, {24, 6}, qkv_, {}}},
                                    {"odd", TensorView{Dtype::U8, {10, 3}, odd_, {}}}});
  }
  [[nodiscard]] std::filesystem::path path() const { return dir_ / "layer.safetensors"; }

  TempDir dir_;
  std::vector<std::byte> col_, row_, norm_, qkv_, odd_;
};

inline const safetensors::Gqa kLayerGqa{8, 2, 2};

/// What a tensor-parallel engine asks of the layer: column- and row-parallel weights, the norm
/// replicated, and q, k and v of the fused QKV.
inline std::vector<Want> layer_wants() {
  using safetensors::Slice;
  return {
      {"col.weight", [](const Slice& s, std::size_t r, std::size_t w) { return column_parallel(s, r, w); }},
      {"row.weight", [](const Slice& s, std::size_t r, std::size_t w) { return row_parallel(s, r, w); }},
      {"norm.weight", whole},
      {"attn.qkv.weight",
       [](const Slice& s, std::size_t r, std::size_t w) { return qkv_shard(s, kLayerGqa, r, w).q; }},
      {"attn.qkv.weight",
       [](const Slice& s, std::size_t r, std::size_t w) { return qkv_shard(s, kLayerGqa, r, w).k; }},
      {"attn.qkv.weight",
       [](const Slice& s, std::size_t r, std::size_t w) { return qkv_shard(s, kLayerGqa, r, w).v; }}};
}

/// Six weights of different widths split by rows (each rank's rows of each, 512 bytes or more:
/// a step it reads for itself alone, too long to be merged with its neighbours', each of another
/// length) and a replicated vector (a shared step), written to `path`; `rows_wants()` asks for
/// them.
inline void write_rows_file(const std::filesystem::path& path) {
  using safetensors::Dtype;
  using safetensors::TensorView;
  std::vector<std::vector<std::byte>> data;
  data.reserve(7);
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (int i = 0; i < 6; ++i) {
    const std::size_t cols = 64 + 32 * static_cast<std::size_t>(i);
    data.push_back(iota_bytes(8 * cols * 4, static_cast<unsigned>(10 + i)));
    tensors.emplace_back("w" + std::to_string(i), TensorView{Dtype::F32, {8, cols}, data.back(), {}});
  }
  data.push_back(iota_bytes(256 * 2, 99));
  tensors.emplace_back("norm", TensorView{Dtype::F16, {256}, data.back(), {}});
  safetensors::save_file(path, tensors);
}

inline std::vector<Want> rows_wants() {
  std::vector<Want> out;
  for (int i = 0; i < 6; ++i) {
    out.push_back({"w" + std::to_string(i), [](const safetensors::Slice& s, std::size_t r, std::size_t w) {
                     return column_parallel(s, r, w);
                   }});
    if (i == 2) out.push_back({"norm", whole});
  }
  return out;
}

}  // namespace test
