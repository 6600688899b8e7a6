// Writing safetensors files from C++.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <new>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/slices.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/ffi/src/writer.rs.h"
#include "safetensors/path.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// Metadata written as `__metadata__`: string keys to string values. Empty means none, unless
/// `SaveOptions::empty_metadata` asks for an empty `__metadata__` object.
using Metadata = std::map<std::string, std::string>;

struct SaveOptions {
  /// Wait for the disk (fsync the file before the rename, and the directory after), so the file
  /// survives a power loss once `save_file` returns. Without it the write is still atomic for
  /// readers and against a crash of the process; Python's `save_file` does not sync. Ignored by
  /// `serialize`.
  bool sync = true;
  /// With an empty `metadata`, still write `"__metadata__":{}`, as Python's
  /// `save_file(tensors, path, metadata={})` does (byte-identical). Without tensors the
  /// reference's own output for that case is not valid JSON, so the object is left out there.
  bool empty_metadata = false;
  /// Start the data buffer on a multiple of this many bytes of the file (a power of two up to
  /// 2^26; 4096 for direct I/O, 64 for SIMD) by padding the header with spaces, as the format
  /// allows. 0, the default, is the reference's layout (8), byte-identical to Python's
  /// `save_file`. Tensors stay back to back (the format allows no gaps), each at a multiple of
  /// its element size. Another value is refused with `InvalidSlice`.
  std::size_t alignment = 0;
};

namespace detail {
/// What `std::get<1>` yields for a range element `E` (a reference type, or a prvalue element).
template <class E>
using tensor_ref_t = decltype(std::get<1>(std::declval<E>()));

/// Whether the writer may keep the address of each element's tensor for the whole call: the
/// tensor is an lvalue that outlives the element's iteration, which only a forward range
/// promises (an input range may reuse one cached element). Otherwise the writer keeps a copy
/// (moved from a temporary element), so ranges of temporaries, such as a `views::transform`
/// yielding `{name, f.get_tensor(name)}`, are written correctly.
template <class R>
inline constexpr bool borrows_tensors =
    std::ranges::forward_range<R>&&
        std::is_lvalue_reference_v<tensor_ref_t<std::ranges::range_reference_t<R>&>> &&
    (std::is_reference_v<std::ranges::range_reference_t<R>> ||
     std::is_lvalue_reference_v<tensor_ref_t<std::ranges::range_reference_t<R>>>);
}  // namespace detail

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
/// `std::vector<std::pair<std::string, MyTensor>>`, a view yielding pairs by value, ... When
/// the elements are temporaries, their tensors are moved (or copied) and kept until the write
/// is done, so such a tensor type must be movable or copyable.
template <class R>
concept NamedTensorRange = std::ranges::input_range<R> && requires(std::ranges::range_reference_t<R> e) {
  {std::string_view(std::get<0>(e))};
  requires TensorLike<std::remove_cvref_t<decltype(std::get<1>(e))>>;
  requires detail::borrows_tensors<R> ||
      std::constructible_from<std::remove_cvref_t<detail::tensor_ref_t<std::ranges::range_reference_t<R>>>,
                              detail::tensor_ref_t<std::ranges::range_reference_t<R>>>;
};

namespace detail {

/// The tensors a writer reads from, kept alive until it is done: empty when the range's own
/// elements outlive the call (see `borrows_tensors`). A deque, so that adding one never moves
/// the others (the writer holds their addresses).
template <class R>
using KeptTensors = std::deque<std::remove_cvref_t<tensor_ref_t<std::ranges::range_reference_t<R>>>>;

/// The dimensions of `tensor` as `size_t`, converted here, where their type is known: a negative
/// dimension is `TensorInvalidInfo`, one past 64 bits `ValidationOverflow`, both naming the file
/// being written (`target`, empty for bytes in memory) and the tensor.
template <class Tensor>
Status dims_of(std::string_view target, std::string_view name, const Tensor& tensor,
               std::vector<std::size_t>& shape) {
  // Errors found here name the file being written, as the core's do.
  const std::string in = target.empty() ? std::string() : std::string(target) + ": ";
  shape.clear();
  for (auto d : tensor.shape) {
    if constexpr (std::is_signed_v<decltype(d)>) {
      if (d < 0) {
        return Status(ErrorKind::TensorInvalidInfo, in + "tensor `" + std::string(name) +
                                                        "` has a negative dimension " + std::to_string(d));
      }
    }
    if constexpr (std::numeric_limits<decltype(d)>::digits > std::numeric_limits<std::size_t>::digits) {
      if (d > static_cast<decltype(d)>(std::numeric_limits<std::size_t>::max())) {
        return Status(ErrorKind::ValidationOverflow,
                      in + "tensor `" + std::string(name) + "` has a dimension that does not fit in 64 bits");
      }
    }
    shape.push_back(static_cast<std::size_t>(d));
  }
  return {};
}

/// Hands one tensor to the writer. The dtype value, the name and the byte length are checked
/// by the core.
template <class Tensor>
Status add_tensor(ffi::Writer& writer, std::string_view target, std::string_view name, const Tensor& tensor,
                  std::vector<std::size_t>& shape) {
  Dtype dtype{tensor.dtype};
  if (auto st = dims_of(target, name, tensor, shape); !st.ok()) return st;
  auto data = std::as_bytes(std::span(tensor.data));
  ::rust::Slice<const std::uint8_t> raw{reinterpret_cast<const std::uint8_t*>(data.data()), data.size()};
  ::rust::Slice<const std::size_t> dims{shape.data(), shape.size()};
  return attempt([&](ffi::Status& st) {
    writer.add_tensor(slice_bytes(name), static_cast<std::uint8_t>(dtype), dims, raw, st);
  });
}

/// Calls `f(name, tensor)` for every element of `tensors`, in order, until one returns a status
/// that is not ok. `name` is valid during the call only; `tensor` stays valid while `kept` and
/// the range live: the range's own when it outlives the call (see `borrows_tensors`), else a
/// copy kept in `kept` (moved from a temporary element).
template <NamedTensorRange R, class F>
Status for_each_tensor(R&& tensors, KeptTensors<R>& kept, F&& f) {
  using Ref = std::ranges::range_reference_t<R>;
  for (auto it = std::ranges::begin(tensors); it != std::ranges::end(tensors); ++it) {
    // `auto&&` extends the life of a temporary element (and of a name `get` returns by value)
    // to the end of this iteration; the tensor itself must live longer (see `KeptTensors`).
    auto&& entry = *it;
    auto&& name_holder = std::get<0>(entry);
    std::string_view name(name_holder);
    Status added;
    if constexpr (borrows_tensors<R>) {
      added = f(name, std::get<1>(entry));
    } else if constexpr (std::is_reference_v<Ref>) {
      added = f(name, kept.emplace_back(std::get<1>(entry)));  // a copy: the range owns it
    } else {
      added = f(name, kept.emplace_back(std::get<1>(std::move(entry))));
    }
    if (!added.ok()) return added;
  }
  return {};
}

/// Adds `metadata` to a writer (and keeps an empty `__metadata__` when asked), after its tensors.
inline Status add_metadata(ffi::Writer& writer, const Metadata& metadata, bool empty_metadata) {
  if (empty_metadata) writer.keep_metadata();
  // Not a structured binding: clang before 16 cannot capture one in a lambda.
  for (const auto& entry : metadata) {
    auto meta = attempt([&](ffi::Status& st) {
      writer.add_metadata(slice_bytes(entry.first), slice_bytes(entry.second), st);
    });
    if (!meta.ok()) return meta;
  }
  return {};
}

/// Feeds a writer for the file at `target` (empty for bytes in memory), which its errors name.
/// It keeps the address of every tensor's data until it is dropped, so the callers below keep
/// `kept` (and the range) alive until then, inside one function call.
template <NamedTensorRange R>
Expected<::rust::Box<ffi::Writer>> make_writer(std::string_view target, R&& tensors, const Metadata& metadata,
                                               bool empty_metadata, KeptTensors<R>& kept) {
  auto writer = ffi::new_writer(slice_bytes(target));
  std::vector<std::size_t> shape;
  auto added =
      for_each_tensor(std::forward<R>(tensors), kept, [&](std::string_view name, const auto& tensor) {
        return add_tensor(*writer, target, name, tensor, shape);
      });
  if (!added.ok()) return added;
  if (auto meta = add_metadata(*writer, metadata, empty_metadata); !meta.ok()) return meta;
  return writer;
}

using TensorList = std::initializer_list<std::pair<std::string_view, TensorView>>;

// The overloads taking a braced list (`save_file(path, {{"w", view}})`) are inline functions,
// compiled in every file that includes this header whether it writes or not. They feed the
// writer with the loop below rather than through the range templates above, which would
// instantiate the range concepts, a deque and the rest for the list's type in each of those
// files. (They call the functions below by their own names: overload resolution against the
// templates would check the range concepts too.) The writer sees the same calls either way.

/// `make_writer` for a braced list: the list's tensors outlive the call, so none is kept.
inline Expected<::rust::Box<ffi::Writer>> make_list_writer(std::string_view target, TensorList tensors,
                                                           const Metadata& metadata, bool empty_metadata) {
  auto writer = ffi::new_writer(slice_bytes(target));
  std::vector<std::size_t> shape;
  for (const auto& entry : tensors) {
    if (auto st = add_tensor(*writer, target, entry.first, entry.second, shape); !st.ok()) return st;
  }
  if (auto meta = add_metadata(*writer, metadata, empty_metadata); !meta.ok()) return meta;
  return writer;
}

/// The bytes of the file a fed writer lays out.
inline Expected<std::vector<std::byte>> serialized(ffi::Writer& writer, SaveOptions options) {
  // Laid out once: `prepare` checks everything and keeps the layout that `write_into` writes.
  auto len = attempt([&](ffi::Status& st) { return writer.prepare(options.alignment, st); });
  if (!len) return len.status();
  auto out = checked_vector<std::byte>(*len, "the serialized file", "write to a file with save_file instead");
  if (!out) return out.status();
  ::rust::Slice<std::uint8_t> dst{reinterpret_cast<std::uint8_t*>(out->data()), out->size()};
  if (auto st = attempt([&](ffi::Status& s) { writer.write_into(dst, s); }); !st.ok()) return st;
  return out;
}

/// A fed writer's file written to `path`.
inline Status write_file(ffi::Writer& writer, PathRef path, SaveOptions options) {
  return attempt([&](ffi::Status& st) {
    writer.write_file(slice_bytes(path.native()), options.sync, options.alignment, st);
  });
}

/// `nothrow::serialize` of a braced list.
inline Expected<std::vector<std::byte>> serialize_list(TensorList tensors, const Metadata& metadata,
                                                       SaveOptions options) {
  auto writer = make_list_writer({}, tensors, metadata, options.empty_metadata);
  if (!writer) return writer.status();
  return serialized(**writer, options);
}

/// `nothrow::save_file` of a braced list.
inline Status save_list(PathRef path, TensorList tensors, const Metadata& metadata, SaveOptions options) {
  auto writer = make_list_writer(path.native(), tensors, metadata, options.empty_metadata);
  if (!writer) return writer.status();
  return write_file(**writer, path, options);
}

}  // namespace detail

namespace nothrow {

/// `safetensors::serialize` without exceptions.
template <NamedTensorRange R>
[[nodiscard]] Expected<std::vector<std::byte>> serialize(R&& tensors, const Metadata& metadata = {},
                                                         SaveOptions options = {}) {
  detail::KeptTensors<R> kept;
  auto writer = detail::make_writer({}, std::forward<R>(tensors), metadata, options.empty_metadata, kept);
  if (!writer) return writer.status();
  return detail::serialized(**writer, options);
}
[[nodiscard]] inline Expected<std::vector<std::byte>> serialize(detail::TensorList tensors,
                                                                const Metadata& metadata = {},
                                                                SaveOptions options = {}) {
  return detail::serialize_list(tensors, metadata, options);
}

/// `safetensors::save_file` without exceptions.
///
///   auto saved = safetensors::nothrow::save_file("out.safetensors", {{"w", view}});
///   if (!saved.ok()) std::puts(saved.message().c_str());
template <NamedTensorRange R>
Status save_file(PathRef path, R&& tensors, const Metadata& metadata = {}, SaveOptions options = {}) {
  detail::KeptTensors<R> kept;
  auto writer =
      detail::make_writer(path.native(), std::forward<R>(tensors), metadata, options.empty_metadata, kept);
  if (!writer) return writer.status();
  return detail::write_file(**writer, path, options);
}
inline Status save_file(PathRef path, detail::TensorList tensors, const Metadata& metadata = {},
                        SaveOptions options = {}) {
  return detail::save_list(path, tensors, metadata, options);
}

}  // namespace nothrow

/// The bytes of a safetensors file holding `tensors` and `metadata`, laid out exactly as the
/// reference writes them (dtype-descending then name order, compact JSON, padded to 8).
///
///   auto bytes = safetensors::serialize({{"w", view}}, {{"format", "pt"}});
template <NamedTensorRange R>
[[nodiscard]] std::vector<std::byte> serialize(R&& tensors, const Metadata& metadata = {},
                                               SaveOptions options = {}) {
  return nothrow::serialize(std::forward<R>(tensors), metadata, options).value();
}
[[nodiscard]] inline std::vector<std::byte> serialize(detail::TensorList tensors,
                                                      const Metadata& metadata = {},
                                                      SaveOptions options = {}) {
  return detail::serialize_list(tensors, metadata, options).value();
}

/// Writes `tensors` and `metadata` to `path` atomically: a temporary file beside it is written,
/// synced and renamed over `path`. On any error `path` is left as it was. Errors, each naming
/// `path`: `TensorInvalidInfo` (data length disagrees with dtype × shape), `TypeMismatch` (a
/// dtype value outside `Dtype`), `InvalidTensorName` (`__metadata__`, or a name that is not
/// UTF-8), `InvalidHeader` (metadata that is not UTF-8), `DuplicateKey`, `HeaderTooLarge`,
/// `InvalidSlice` (an alignment that is not a power of two), `Io` (for example an unwritable
/// directory). For tensors that arrive over time, or a checkpoint larger than memory, see
/// `StreamingWriter` (safetensors/streaming_writer.hpp).
///
///   safetensors::save_file("out.safetensors", std::map<std::string, TensorView>{{"w", view}});
template <NamedTensorRange R>
void save_file(PathRef path, R&& tensors, const Metadata& metadata = {}, SaveOptions options = {}) {
  nothrow::save_file(path, std::forward<R>(tensors), metadata, options).throw_if_error();
}
inline void save_file(PathRef path, detail::TensorList tensors, const Metadata& metadata = {},
                      SaveOptions options = {}) {
  detail::save_list(path, tensors, metadata, options).throw_if_error();
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
