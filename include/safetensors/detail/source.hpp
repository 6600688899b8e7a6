// Private: reading tensors from one open file, shared by SafeOpen and checkpoint shards.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors::detail {

/// Lets other parts of the API (the CUDA uploader) reach the private state of `SafeOpen`,
/// `Checkpoint` and `Index`; defined where it is used.
struct Access;

/// One open file: the bridge object, its mapped data (null with the read backend), every
/// tensor's dimensions, and the shared owner that keeps them alive (a SafeOpen's handle, or a
/// checkpoint's). Built once per file, so that a lookup costs one call into the bridge.
struct Source {
  const ffi::File* file = nullptr;
  const std::byte* data = nullptr;
  const std::size_t* dims = nullptr;
  std::shared_ptr<const void> owner;

  static Source of(const ffi::File& f, std::shared_ptr<const void> owner) {
    auto mapped = f.mapped_data();
    const std::byte* data =
        f.is_mapped() && mapped.size() > 0 ? reinterpret_cast<const std::byte*>(mapped.data()) : nullptr;
    return {&f, data, f.dims().data(), std::move(owner)};
  }

  [[nodiscard]] ffi::TensorMeta find(std::string_view name) const {
    return call([&] { return file->find(bytes(name)); });
  }

  [[nodiscard]] std::vector<std::size_t> shape_of(const ffi::TensorMeta& m) const {
    return {dims + m.shape_start, dims + m.shape_start + m.shape_len};
  }

  [[nodiscard]] TensorInfo info(std::string_view name) const {
    auto m = find(name);
    return {static_cast<Dtype>(m.dtype), shape_of(m), {m.begin, m.end}};
  }

  void read_data(std::size_t offset, std::span<std::byte> dst) const {
    ::rust::Slice<std::uint8_t> out{reinterpret_cast<std::uint8_t*>(dst.data()), dst.size()};
    call([&] { file->read_data(offset, out); });
  }

  /// Bytes `[offset, offset + len)` of the data buffer as a view's data and owner: the mapping
  /// itself when mapped, else a new 64-byte-aligned buffer read from the file.
  [[nodiscard]] std::pair<std::span<const std::byte>, std::shared_ptr<const void>> bytes_at(
      std::size_t offset, std::size_t len, std::string_view what) const {
    if (len == 0) return {};
    if (data != nullptr) return {{data + offset, len}, owner};
    auto buffer = allocate_bytes(len, what);
    read_data(offset, {buffer.get(), len});
    return {{buffer.get(), len}, std::move(buffer)};
  }

  [[nodiscard]] TensorView get_tensor(std::string_view name) const {
    auto m = find(name);
    auto [bytes_span, keep] = bytes_at(m.begin, m.end - m.begin, "tensor `" + std::string(name) + "`");
    return {static_cast<Dtype>(m.dtype), shape_of(m), bytes_span, std::move(keep)};
  }
};

}  // namespace safetensors::detail
