// Private: the generated bridge and the helpers that keep its types out of the public API.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/error.hpp"
#include "safetensors/version.hpp"
// cxx.h first: it defines rust::Error, which the generated header leaves out.
#include "safetensors/ffi/lib.rs.h"
#include "safetensors/ffi/rust/cxx.h"

namespace safetensors::detail {

/// Rebuilds a typed `Error` from a bridge error, whose text is `"<kind>:<message>"`.
[[noreturn]] inline void rethrow(const ::rust::Error& e) {
  std::string_view text = e.what();
  unsigned kind = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), kind);
  if (ec != std::errc{} || end == text.data() + text.size() || *end != ':' || kind >= error_kind_count) {
    throw Error(ErrorKind::Internal, "unexpected error from the safetensors core: " + std::string(text));
  }
  throw Error(static_cast<ErrorKind>(kind), std::string(end + 1, text.data() + text.size()));
}

/// A method called on a moved-from `SafeOpen`, `Checkpoint`, `Slice` or `Selection`: a defined
/// error rather than a null dereference. A caller's mistake, reported as `Internal` (no error
/// kind fits better; a new one would change the stable set).
[[noreturn]] inline void moved_from(std::string_view type) {
  throw Error(ErrorKind::Internal, "this " + std::string(type) +
                                       " was moved from and holds nothing; use the " + std::string(type) +
                                       " it was moved into");
}

/// `[2, 3]`, for messages.
inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Calls into the bridge, translating its errors into `safetensors::Error`.
template <class F>
decltype(auto) call(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const ::rust::Error& e) {
    rethrow(e);
  }
}

/// Bytes of a string, as the bridge takes them (no UTF-8 check: invalid names simply match
/// nothing).
inline ::rust::Slice<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

inline std::string_view view(::rust::Str s) {
  return {s.data(), s.size()};
}

// Copy out of `rust::Slice` through data() and size(), never its iterators: instantiating their
// arithmetic trips -Wsign-conversion inside cxx.h, which would break users building with
// -Wconversion -Werror.

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

/// Shared ownership of a Rust object, so the C++ value types holding it stay copyable.
template <class T>
std::shared_ptr<const T> share(::rust::Box<T> box) {
  return std::shared_ptr<const T>(box.into_raw(),
                                  [](const T* p) { ::rust::Box<T>::from_raw(const_cast<T*>(p)); });
}

}  // namespace safetensors::detail
