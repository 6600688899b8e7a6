// How the API takes a path: `PathRef`, which accepts a `std::filesystem::path` without this
// header (or any public header) including <filesystem>.
//
// Why not `const std::filesystem::path&`: <filesystem> alone costs about 0.15 s of CPU in every
// translation unit that includes it (g++ 12, -fsyntax-only; docs/benchmarks.md, "What the headers
// cost"), a quarter of the reading include's budget, for a type the library only ever reads the
// characters of. A program that has a `std::filesystem::path` has included <filesystem> already;
// `PathRef` takes it through its `native()` string. Paths the library gives back (`SafeOpen::
// path()`, `Checkpoint::shard_paths()`, `StreamingWriter::files()`, ...) are `std::string`s, the
// characters as opened: `std::filesystem::path(f.path())` where a path object is wanted.
#pragma once

#include "safetensors/abi.hpp"

#include <concepts>
#include <string>
#include <string_view>

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// A path as a caller passes it: a `std::filesystem::path` (anything whose `native()` is a
/// `std::string`), a `std::string`, a `std::string_view` or a C string. It borrows the caller's
/// characters for the length of the call; the library copies what it keeps.
///
///   safetensors::SafeOpen a("model.safetensors");
///   safetensors::SafeOpen b(std::filesystem::path("/models") / "model.safetensors");
class PathRef {
 public:
  /// A C string (null counts as the empty path, which no file has).
  PathRef(const char* path) noexcept : text_(path != nullptr ? std::string_view(path) : std::string_view()) {}
  PathRef(const std::string& path) noexcept : text_(path) {}
  PathRef(std::string_view path) noexcept : text_(path) {}
  /// A `std::filesystem::path`, or any type whose `native()` gives a reference to the path's
  /// characters as a `std::string` (as a POSIX `std::filesystem::path` does). A `native()` that
  /// returns a string by value is refused: the view would outlive it.
  template <class P>
  requires requires(const P& p) {
    { p.native() } -> std::same_as<const std::string&>;
  }
  PathRef(const P& path) noexcept(noexcept(path.native())) : text_(path.native()) {}

  /// The path's characters, as the operating system takes them.
  [[nodiscard]] std::string_view native() const noexcept { return text_; }

 private:
  std::string_view text_;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
