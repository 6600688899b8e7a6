// Private: memory for bytes copied out of a file (read backend, slices, conversions, rank
// buffers): aligned, backed by huge pages when large, and an `Io` error when it cannot be had;
// and vectors sized by a file or a caller, likewise.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "safetensors/error.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

/// How an `allocate_bytes` buffer is given back: its whole mapping when it is one (`len` > 0),
/// else the aligned `operator delete[]`. One deleter type for both kinds, so that a translation
/// unit instantiates `shared_ptr`'s control block for it once rather than once per kind.
struct ReleaseBytes {
  void* base = nullptr;
  std::size_t len = 0;
  std::align_val_t align{64};
  void operator()(std::byte* p) const noexcept {
#if defined(__linux__)
    if (len != 0) {
      ::munmap(base, len);
      return;
    }
#endif
    ::operator delete[](p, align);
  }
};

/// An uninitialised buffer, owned by a `shared_ptr`, for bytes copied out of a file (read
/// backend, slices): 64-byte aligned, and for large buffers on Linux 2 MiB aligned and backed by
/// transparent huge pages when the system allows them. Fresh memory costs one page fault per
/// 4 KiB page on first touch, which dominated loading into owned memory (measured: about 5x
/// the read itself); huge pages take 512 times fewer faults.
///
/// `n` comes from a file's header, so running out of memory is an `Io` error naming `what` and
/// the size, never a `std::bad_alloc`. (The `shared_ptr`'s own control block is a small
/// allocation of the ordinary kind.) `alignment` (a power of two, at most 2 MiB) may ask for
/// more than 64 bytes: the direct backend reads into buffers aligned to 4096.
inline Expected<std::shared_ptr<std::byte[]>> allocate_bytes(std::size_t n, std::string_view what,
                                                             std::size_t alignment = 64) {
  // The message is built only on failure (not one string allocation per buffer).
  const auto out_of_memory = [&] {
    return Status(ErrorKind::Io, "cannot allocate " + std::to_string(n) + " bytes for " + std::string(what) +
                                     " (out of memory); read it in pieces, or use the mapped backend");
  };
  // No object may exceed PTRDIFF_MAX bytes, and libstdc++'s aligned `operator new` rounds the
  // size up without an overflow check (SIZE_MAX becomes 0 and "succeeds").
  if (n > static_cast<std::size_t>(PTRDIFF_MAX)) return out_of_memory();
#if defined(__linux__)
  constexpr std::size_t huge = std::size_t{2} << 20;
  if (n >= 2 * huge) {  // at least 4 MiB, so rounding wastes at most a third
    std::size_t len = (n + huge - 1) / huge * huge + huge;
    void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) {
      auto addr = reinterpret_cast<std::uintptr_t>(base);
      auto* aligned = reinterpret_cast<std::byte*>((addr + huge - 1) / huge * huge);
      ::madvise(aligned, len - huge, MADV_HUGEPAGE);  // advice only: failure is harmless
      return std::shared_ptr<std::byte[]>(aligned, ReleaseBytes{base, len});
    }
  }
#endif
  // The non-throwing `operator new`: no `std::bad_alloc` to catch, with or without exceptions.
  const std::align_val_t align{alignment < 64 ? 64 : alignment};
  auto* p = static_cast<std::byte*>(::operator new[](n == 0 ? 1 : n, align, std::nothrow));
  if (p == nullptr) return out_of_memory();
  return std::shared_ptr<std::byte[]>(p, ReleaseBytes{nullptr, 0, align});
}

/// The error `checked_vector` reports: `n` elements of `size` bytes for `what` could not be had.
/// Built only on failure (a failed request is large: a message's few bytes can still be had),
/// and not a template, so that each element type costs a translation unit only the allocation.
inline Status vector_unavailable(std::size_t n, std::size_t size, std::string_view what,
                                 std::string_view advice) {
  const std::string count = size == 1 ? std::to_string(n) + " bytes"
                                      : std::to_string(n) + " elements of " + std::to_string(size) + " bytes";
  return Status(ErrorKind::Io, "cannot allocate " + count + " for " + std::string(what) +
                                   " (out of memory); " + std::string(advice));
}

/// A `std::vector` of `n` elements, as a typed `Io` error (naming `what` and the size, with
/// `advice`) when it cannot be had, never `std::bad_alloc`. (In a program built without
/// exceptions a vector that cannot get its memory aborts, as every standard container does
/// there; only sizes beyond what a vector can hold are caught.)
template <class T>
Expected<std::vector<T>> checked_vector(std::size_t n, std::string_view what, std::string_view advice) {
  // No vector holds more than PTRDIFF_MAX bytes; every standard library's `max_size()` is at
  // least this bound, so a size within it never throws `std::length_error`.
  constexpr std::size_t most = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(T);
  if (n > most) return vector_unavailable(n, sizeof(T), what, advice);
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  try {
    return std::vector<T>(n);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return vector_unavailable(n, sizeof(T), what, advice);
#else
  return std::vector<T>(n);
#endif
}

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
