// Private: the definitions behind safetensors/safe_open.hpp (which includes this at its end, after
// the classes these need): the doors of `SafeOpen` (opening from a path, bytes or a remote source;
// the cursor its loops walk) and its nothrow face.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/iteration.hpp"
#include "safetensors/detail/open_file.hpp"
#include "safetensors/detail/remote_open.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/options.hpp"
#include "safetensors/path.hpp"
#include "safetensors/safe_open.hpp"
#include "safetensors/slice.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

namespace detail {
template <>
struct Access<SafeOpen> {
  /// The file's source, or `Internal` for a moved-from SafeOpen.
  static Expected<const OpenFile*> open_file(const SafeOpen& f) {
    if (!f.state_) return moved_from("SafeOpen");
    return &f.open_file_;
  }

  /// The walk over the file's tensors in file order.
  static Expected<FileCursor> cursor(const SafeOpen& f) {
    auto src = open_file(f);
    if (!src) return src.status();
    return FileCursor{**src};
  }

  static Expected<SafeOpen> open(PathRef path, OpenOptions options) {
    const std::string_view native = path.native();
    auto file = adopt(attempt([&](ffi::Status& st) {
      return ffi::open_file(bytes(native), static_cast<ffi::Backend>(options.backend),
                            options.allow_trailing_bytes, static_cast<ffi::Populate>(options.populate),
                            options.huge_pages, st);
    }));
    if (!file) return file.status();
    return SafeOpen(std::make_shared<const FileHandle>(FileHandle{std::move(*file), std::string(native)}));
  }

  template <class Remote>
  static Expected<SafeOpen> open_remote(std::string_view url, const Remote& remote, OpenOptions options) {
    const ffi::RemoteOptions crossing = remote_options(remote);
    auto file = adopt(attempt([&](ffi::Status& st) {
      return ffi::open_remote(bytes(url), crossing, options.allow_trailing_bytes, st);
    }));
    if (!file) return file.status();
    return SafeOpen(std::make_shared<const FileHandle>(FileHandle{std::move(*file), std::string(url)}));
  }

  // The core owns the keep-alive owner (a heap copy of the shared_ptr, released through
  // `release_keep_alive`), not this object: streams, prefetches and uploads hold the core's
  // file, and with it the bytes, after the SafeOpen that made them is gone.
  static Expected<SafeOpen> open_memory(std::span<const std::byte> bytes,
                                        std::shared_ptr<const void> keep_alive, OpenOptions options,
                                        std::string name) {
    std::uintptr_t release = 0;
    std::uintptr_t owner = 0;
    if (keep_alive) {
      auto* held = new (std::nothrow) std::shared_ptr<const void>(std::move(keep_alive));
      if (held == nullptr) return Status(ErrorKind::Io, "cannot allocate the owner of " + name);
      release = reinterpret_cast<std::uintptr_t>(&safetensors_detail_release_keep_alive);
      owner = reinterpret_cast<std::uintptr_t>(held);
    }
    auto file = adopt(attempt([&](ffi::Status& st) {
      return ffi::open_memory(detail::data_bytes(bytes), detail::bytes(name), options.allow_trailing_bytes,
                              release, owner, st);
    }));
    if (!file) return file.status();
    return SafeOpen(std::make_shared<const FileHandle>(FileHandle{std::move(*file), std::move(name)}));
  }
};
}  // namespace detail

inline Expected<SafeOpen> nothrow::open(PathRef path, OpenOptions options) {
  return detail::Access<SafeOpen>::open(path, options);
}

inline Expected<SafeOpen> nothrow::from_bytes(std::span<const std::byte> bytes,
                                              std::shared_ptr<const void> keep_alive, OpenOptions options,
                                              std::string name) {
  return detail::Access<SafeOpen>::open_memory(bytes, std::move(keep_alive), options, std::move(name));
}

template <class Remote>
Expected<SafeOpen> nothrow::open_remote(std::string_view url, const Remote& remote, OpenOptions options) {
  static_assert(std::is_same_v<Remote, RemoteOptions>, "open_remote takes a safetensors::RemoteOptions");
  return detail::Access<SafeOpen>::open_remote(url, remote, options);
}

inline Expected<SafeOpen> nothrow::from_bytes_copy(std::span<const std::byte> bytes, OpenOptions options,
                                                   std::string name) {
  auto copy = detail::allocate_bytes(bytes.size(), "a copy of " + name);
  if (!copy) return copy.status();
  if (!bytes.empty()) std::memcpy(copy->get(), bytes.data(), bytes.size());
  std::span<const std::byte> mine{copy->get(), bytes.size()};
  return from_bytes(mine, std::move(*copy), options, std::move(name));
}

inline Expected<std::vector<std::string>> nothrow::keys(const SafeOpen& file) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  const ffi::File& f = *(*src)->file;
  const std::size_t n = f.tensor_count();
  std::vector<std::string> out;
  out.reserve(n);
  // 256 names per call into the bridge (a call per name cost a sixth of listing 160), into room
  // on the stack: one temporary as large as the list would cross glibc's mmap threshold and,
  // freed, raise it, after which a loop of opens returned and refaulted its heap every time.
  ffi::Bytes names[256]{};
  constexpr std::size_t room = sizeof names / sizeof names[0];
  for (std::size_t first = 0; first < n; first += room) {
    const std::size_t count = n - first < room ? n - first : room;
    f.sorted_names(first, ffi::NamesMut{names, count});
    for (std::size_t k = 0; k < count; ++k)
      out.emplace_back(reinterpret_cast<const char*>(names[k].data), names[k].len);
  }
  return out;
}

inline Expected<std::map<std::string, std::string>> nothrow::metadata(const SafeOpen& file) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  return detail::metadata_of((*src)->file->metadata());
}

inline Expected<TensorInfo> nothrow::info(const SafeOpen& file, std::string_view name) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  return (*src)->info(name);
}

inline Expected<TensorView> nothrow::get_tensor(const SafeOpen& file, std::string_view name) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  return (*src)->get_tensor(name);
}

inline Expected<Slice> nothrow::get_slice(const SafeOpen& file, std::string_view name) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  return detail::Access<Slice>::make(**src, name);
}

inline Status nothrow::read_data(const SafeOpen& file, std::size_t offset, std::span<std::byte> dst) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  return (*src)->read_data(offset, dst);
}

inline Status nothrow::get_tensor_into(const SafeOpen& file, std::string_view name,
                                       std::span<std::byte> dst) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  return (*src)->get_tensor_into(name, dst);
}

inline Status nothrow::get_tensor_as(const SafeOpen& file, std::string_view name, Dtype to,
                                     std::span<std::byte> dst) {
  auto src = detail::Access<SafeOpen>::open_file(file);
  if (!src) return src.status();
  return detail::get_tensor_as(**src, name, to, dst);
}

inline Expected<TensorView> nothrow::get_tensor_as(const SafeOpen& file, std::string_view name, Dtype to) {
  auto view = nothrow::get_tensor(file, name);
  if (!view) return view.status();
  return nothrow::convert(*view, to);
}

inline detail::TensorRange<detail::FileCursor, true> nothrow::tensors(const SafeOpen& file) {
  return detail::TensorRange<detail::FileCursor, true>(detail::Access<SafeOpen>::cursor(file));
}

inline detail::TensorIterator<detail::FileCursor, false> SafeOpen::begin() const {
  return detail::TensorIterator<detail::FileCursor, false>(detail::Access<SafeOpen>::cursor(*this));
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
