// Private: reading tensors from one open file, shared by SafeOpen and checkpoint shards (the file
// bridge).
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/overlap.hpp"
#include "safetensors/ffi/src/file.rs.h"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

/// The private door of a public type `T` (`SafeOpen`, `Checkpoint`, `Slice`, `Selection`,
/// `Index`, ...): specialised right after `T`, and used by the `nothrow::` functions and by
/// other parts of the API (the CUDA uploader, multi-rank loading) that need `T`'s internals.
template <class T>
struct Access;

/// A bridge metadata map (of a file or a checkpoint) as a `std::map`.
inline std::map<std::string, std::string> metadata_of(const ffi::Metadata& m) {
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i < m.len(); ++i) out.emplace(view(m.key(i)), view(m.value(i)));
  return out;
}

/// An open file, shared by every copy of a `SafeOpen` and every view taken from it.
struct FileHandle {
  ::rust::Box<ffi::File> file;
  std::string path;
};

/// Bytes of a view and what keeps them alive. A struct rather than a `std::pair`, whose
/// constrained constructors `Expected<OwnedBytes>` would check in every translation unit.
struct OwnedBytes {
  std::span<const std::byte> data;
  std::shared_ptr<const void> owner;
};

/// Views of the direct backend of at least this many bytes own the aligned span around their
/// bytes, read straight from the disk; smaller ones (less than one block) are copied into a
/// buffer of their own size, so that a file of many tiny tensors does not cost a block each.
inline constexpr std::size_t direct_view_min_bytes = 4096;

/// One open file: the bridge object, every tensor's dimensions, whether it is mapped or reads
/// with the direct backend, and the shared owner that keeps them alive (a SafeOpen's handle, or
/// a checkpoint's). Built once per file, so that a lookup costs one call into the bridge. A
/// mapped file's bytes are asked of the bridge when a read needs them (`data`, `memory`): its
/// mapping is made at the first access of tensor bytes, not at open, so that an open that reads
/// only the header maps nothing.
struct OpenFile {
  const ffi::File* file = nullptr;
  const std::size_t* dims = nullptr;
  std::shared_ptr<const void> owner;
  bool direct = false;
  /// Views borrow the file's bytes (mapped, or bytes a caller lent) rather than copy them.
  bool mapped = false;

  static OpenFile of(const ffi::File& f, std::shared_ptr<const void> owner) {
    return {&f, f.dims().data, std::move(owner), f.backend() == ffi::Backend::Direct, f.is_mapped()};
  }

  /// The whole file when it is in memory (the mapping, made now if it is not yet, with whatever
  /// followed the data when it was made; or bytes a caller lent): what the core reads from, so
  /// no output buffer may overlap it (see `refuse_overlap`). Empty for the read and direct
  /// backends.
  [[nodiscard]] Expected<std::span<const std::byte>> memory() const {
    if (!mapped) return std::span<const std::byte>{};
    auto bytes = attempt([&](ffi::Status& st) { return file->mapped_file(st); });
    if (!bytes) return bytes.status();
    return span_of(*bytes);
  }

  /// The data buffer's bytes when mapped (mapping the file now if it is not yet); empty for the
  /// read and direct backends. It starts `8 + N` bytes into the file; the core made the mapping
  /// at least as long as the header says the data runs (else the call failed), which `subspan`
  /// would otherwise assume.
  [[nodiscard]] Expected<std::span<const std::byte>> data() const {
    auto all = memory();
    if (!all || all->empty()) return all;
    const std::size_t head = 8 + file->header_len();
    const std::size_t len = file->data_len();
    if (all->size() < head || all->size() - head < len) {
      return Status(ErrorKind::Internal,
                    "the file's bytes in memory are shorter than its validated header says");
    }
    return all->subspan(head, len);
  }

  /// `dst` refused when it overlaps the file's memory (see `refuse_overlap`).
  [[nodiscard]] Status refuse_overlap_with(const char* what, std::span<const std::byte> dst) const {
    auto mem = memory();
    if (!mem) return mem.status();
    return refuse_overlap(what, *mem, dst);
  }

  /// The tensor named `name`. A name the file has costs two plain calls (its position, then
  /// its entry); only a missing one builds a status, whose error names the file. (A status per
  /// lookup was a tenth of opening a 20,000-tensor file and reading every tensor's shape.)
  [[nodiscard]] Expected<ffi::TensorMeta> find(std::string_view name) const {
    if (const std::ptrdiff_t at = file->position(bytes(name)); at >= 0) {
      return file->meta_at(static_cast<std::size_t>(at));
    }
    return attempt([&](ffi::Status& st) { return file->find(bytes(name), st); });
  }

  [[nodiscard]] std::vector<std::size_t> shape_of(const ffi::TensorMeta& m) const {
    return {dims + m.shape_start, dims + m.shape_start + m.shape_len};
  }

  [[nodiscard]] Expected<TensorInfo> info(std::string_view name) const {
    auto m = find(name);
    if (!m) return m.status();
    return TensorInfo{static_cast<Dtype>(m->dtype), shape_of(*m), {m->begin, m->end}};
  }

  /// The tensor at position `index` in file order (below `file->tensor_count()`).
  [[nodiscard]] TensorInfo info_at(std::size_t index) const {
    const ffi::TensorMeta m = file->meta_at(index);
    return TensorInfo{static_cast<Dtype>(m.dtype), shape_of(m), {m.begin, m.end}};
  }

  /// The tensor at position `index` in file order, named `name` in messages.
  [[nodiscard]] Expected<TensorView> get_tensor_at(std::size_t index, std::string_view name) const {
    return view_of(file->meta_at(index), name);
  }

  [[nodiscard]] Status read_data(std::size_t offset, std::span<std::byte> dst) const {
    if (auto st = refuse_overlap_with("read_data", dst); !st.ok()) return st;
    return attempt([&](ffi::Status& st) { file->read_data(offset, bytes_mut(dst), st); });
  }

  /// Bytes `[offset, offset + len)` of the data buffer as a view's data and owner: the mapping
  /// itself when mapped; with the direct backend (at least `direct_view_min_bytes`), the
  /// aligned span around them; else a new 64-byte-aligned buffer read from the file.
  [[nodiscard]] Expected<OwnedBytes> bytes_at(std::size_t offset, std::size_t len,
                                              std::string_view what) const {
    if (len == 0) return OwnedBytes{};
    if (mapped) {
      auto bytes = data();
      if (!bytes) return bytes.status();
      // A view inside the data buffer, which the header's validation put every tensor in; a
      // range outside it (no tensor's) is read below and refused there.
      if (offset <= bytes->size() && len <= bytes->size() - offset) {
        return OwnedBytes{bytes->subspan(offset, len), owner};
      }
    }
    if (direct && len >= direct_view_min_bytes) return aligned_bytes(offset, len, what);
    auto buffer = allocate_bytes(len, what);
    if (!buffer) return buffer.status();
    if (auto read = read_data(offset, {buffer->get(), len}); !read.ok()) return read;
    return OwnedBytes{{buffer->get(), len}, std::move(*buffer)};
  }

  /// The direct backend's view memory: a buffer aligned for `O_DIRECT` holding the aligned
  /// span of the file around the bytes, which the core reads straight into it (no bounce copy;
  /// after a fallback to `pread`, only the bytes themselves, at the same place). The view's
  /// data points at the bytes inside it.
  [[nodiscard]] Expected<OwnedBytes> aligned_bytes(std::size_t offset, std::size_t len,
                                                   std::string_view what) const {
    auto span = attempt([&](ffi::Status& st) { return file->aligned_len(offset, len, st); });
    if (!span) return span.status();
    auto buffer = allocate_bytes(*span, what, ffi::direct_align());
    if (!buffer) return buffer.status();
    auto head = attempt([&](ffi::Status& st) {
      return file->read_data_aligned(offset, len, bytes_mut({buffer->get(), *span}), st);
    });
    if (!head) return head.status();
    return OwnedBytes{{buffer->get() + *head, len}, std::move(*buffer)};
  }

  [[nodiscard]] Expected<TensorView> get_tensor(std::string_view name) const {
    auto m = find(name);
    if (!m) return m.status();
    return view_of(*m, name);
  }

  /// The tensor at position `index` in file order (below `file->tensor_count()`), with its name.
  [[nodiscard]] Expected<NamedTensor> tensor_at(std::size_t index) const {
    const ffi::TensorMeta m = file->meta_at(index);
    std::string name(view(file->name_at(index)));
    auto v = view_of(m, name);
    if (!v) return v.status();
    return NamedTensor{std::move(name), std::move(*v)};
  }

  /// Copies tensor `name` into `dst`, which holds exactly its bytes (else `InvalidSlice`: the
  /// core's `TensorInfo::check_destination`) and lies outside the file's memory.
  [[nodiscard]] Status get_tensor_into(std::string_view name, std::span<std::byte> dst) const {
    auto m = find(name);
    if (!m) return m.status();
    if (auto st = refuse_overlap_with("get_tensor_into", dst); !st.ok()) return st;
    return attempt([&](ffi::Status& st) { file->read_tensor_at(m->index, bytes_mut(dst), st); });
  }

 private:
  [[nodiscard]] Expected<TensorView> view_of(const ffi::TensorMeta& m, std::string_view name) const {
    auto bytes = bytes_at(m.begin, m.end - m.begin, "tensor `" + std::string(name) + "`");
    if (!bytes) return bytes.status();
    return TensorView{static_cast<Dtype>(m.dtype), shape_of(m), bytes->data, std::move(bytes->owner)};
  }
};

/// The tensors of one open file in file (offset) order, one at a time: the cursor of iterating
/// over a `SafeOpen` (see `detail/iteration.hpp`). It holds the file (`OpenFile::owner`).
struct FileCursor {
  OpenFile file;
  std::size_t next_index = 0;

  Status next(std::optional<NamedTensor>& out) {
    out.reset();
    if (next_index >= file.file->tensor_count()) return {};
    auto item = file.tensor_at(next_index++);
    if (!item) return item.status();
    out.emplace(std::move(*item));
    return {};
  }
};

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
