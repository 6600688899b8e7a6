// Writing safetensors files from C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {

/// Metadata written as `__metadata__`: string keys to string values. Empty means none.
using Metadata = std::map<std::string, std::string>;

struct SaveOptions {
  /// Wait for the disk (fsync the file before the rename, and the directory after), so the file
  /// survives a power loss once `save_file` returns. Without it the write is still atomic for
  /// readers and against a crash of the process; Python's `save_file` does not sync.
  bool sync = true;
};

/// Anything with a `dtype`, a `shape` (integers) and contiguous `data` (bytes, or elements of
/// any trivially copyable type): a `TensorView`, or your own struct.
template <class T>
concept TensorLike = requires(const T& t) {
  { t.dtype } -> std::convertible_to<Dtype>;
  requires std::ranges::input_range<decltype(t.shape)>;
  requires std::integral<std::ranges::range_value_t<decltype(t.shape)>>;
  { std::as_bytes(std::span(t.data)) } -> std::convertible_to<std::span<const std::byte>>;
};

/// A range of (name, tensor) pairs: `std::map<std::string, TensorView>`,
/// `std::vector<std::pair<std::string, MyTensor>>`, ...
template <class R>
concept NamedTensorRange = std::ranges::input_range<R> && requires(std::ranges::range_reference_t<R> e) {
  { std::string_view(std::get<0>(e)) };
  requires TensorLike<std::remove_cvref_t<decltype(std::get<1>(e))>>;
};

namespace detail {

/// Feeds a writer; every span it is given must outlive the writer's use, which the callers
/// below guarantee by keeping everything inside one function call.
template <NamedTensorRange R>
::rust::Box<ffi::Writer> make_writer(const R& tensors, const Metadata& metadata) {
  auto writer = ffi::new_writer();
  std::vector<std::size_t> shape;
  for (auto&& entry : tensors) {
    std::string_view name(std::get<0>(entry));
    const auto& tensor = std::get<1>(entry);
    shape.clear();
    for (auto d : tensor.shape) {
      if constexpr (std::is_signed_v<decltype(d)>) {
        if (d < 0) {
          throw Error(ErrorKind::TensorInvalidInfo,
                      "tensor `" + std::string(name) + "` has a negative dimension " + std::to_string(d));
        }
      }
      shape.push_back(static_cast<std::size_t>(d));
    }
    auto data = std::as_bytes(std::span(tensor.data));
    ::rust::Slice<const std::uint8_t> raw{reinterpret_cast<const std::uint8_t*>(data.data()), data.size()};
    ::rust::Slice<const std::size_t> dims{shape.data(), shape.size()};
    call([&] { writer->add_tensor(bytes(name), static_cast<std::uint8_t>(Dtype{tensor.dtype}), dims, raw); });
  }
  // Not a structured binding: clang before 16 cannot capture one in a lambda.
  for (const auto& entry : metadata) call([&] { writer->add_metadata(bytes(entry.first), bytes(entry.second)); });
  return writer;
}

using TensorList = std::initializer_list<std::pair<std::string_view, TensorView>>;

}  // namespace detail

/// The bytes of a safetensors file holding `tensors` and `metadata`, laid out exactly as the
/// reference writes them (dtype-descending then name order, compact JSON, padded to 8).
///
///   auto bytes = safetensors::serialize({{"w", view}}, {{"format", "pt"}});
template <NamedTensorRange R>
[[nodiscard]] std::vector<std::byte> serialize(const R& tensors, const Metadata& metadata = {}) {
  auto writer = detail::make_writer(tensors, metadata);
  std::size_t len = detail::call([&] { return writer->file_len(); });
  std::vector<std::byte> out(len);
  ::rust::Slice<std::uint8_t> dst{reinterpret_cast<std::uint8_t*>(out.data()), out.size()};
  detail::call([&] { writer->write_into(dst); });
  return out;
}
[[nodiscard]] inline std::vector<std::byte> serialize(detail::TensorList tensors, const Metadata& metadata = {}) {
  return serialize<detail::TensorList>(tensors, metadata);
}

/// Writes `tensors` and `metadata` to `path` atomically: a temporary file beside it is written,
/// synced and renamed over `path`. On any error `path` is left as it was. Errors:
/// `TensorInvalidInfo` (data length disagrees with dtype × shape), `InvalidTensorName`
/// (`__metadata__`), `DuplicateKey`, `HeaderTooLarge`, `Io` (for example an unwritable
/// directory).
///
///   safetensors::save_file("out.safetensors", std::map<std::string, TensorView>{{"w", view}});
template <NamedTensorRange R>
void save_file(const std::filesystem::path& path, const R& tensors, const Metadata& metadata = {},
               SaveOptions options = {}) {
  auto writer = detail::make_writer(tensors, metadata);
  detail::call([&] { writer->write_file(detail::bytes(path.native()), options.sync); });
}
inline void save_file(const std::filesystem::path& path, detail::TensorList tensors, const Metadata& metadata = {},
                      SaveOptions options = {}) {
  save_file<detail::TensorList>(path, tensors, metadata, options);
}

}  // namespace safetensors
