// Cold loads: warming the page cache for a file, a checkpoint or some of their tensors before
// reading them, and access hints for mapped files.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>

#include "safetensors/checkpoint.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/ffi/src/stream.rs.h"
#include "safetensors/request.hpp"
#include "safetensors/safe_open.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// How a prefetch runs.
struct PrefetchOptions {
  /// Reader threads (at least 1). Four keep a virtual disk's queue busy.
  std::size_t threads = 4;
  /// Bytes per read request: rounded up to 64 KiB, at most 256 MiB (each reader thread holds one
  /// buffer of this size, or of the largest request when smaller).
  std::size_t request_bytes = std::size_t{16} << 20;
};

/// Access-pattern hints for the mapped backend (`madvise`).
enum class Advice : std::uint8_t {
  /// Read soon: start reading it in (`MADV_WILLNEED`).
  WillNeed = 0,
  /// Read front to back: larger readahead (`MADV_SEQUENTIAL`).
  Sequential = 1,
  /// Scattered reads: no readahead (`MADV_RANDOM`).
  Random = 2,
};

class Prefetch;

namespace nothrow {
/// `safetensors::prefetch` without exceptions.
///
///   auto warming = safetensors::nothrow::prefetch(f);
///   if (warming) (void)safetensors::nothrow::wait(*warming);
template <Readable From>
[[nodiscard]] Expected<Prefetch> prefetch(const From& from, Requests requests = {},
                                          PrefetchOptions options = {});
/// `Prefetch::wait` without exceptions.
Status wait(const Prefetch& prefetch);
/// `safetensors::advise` without exceptions.
template <Readable From>
Status advise(const From& from, Advice advice, Requests requests = {});
}  // namespace nothrow

/// A prefetch in progress, from `safetensors::prefetch`: reader threads put the bytes it covers
/// into the page cache, file by file (shard by shard) and in offset order within each, with
/// large requests, while the program does something else. Destroying it cancels the requests
/// not yet started and waits for those running (at most one per thread).
///
///   auto warming = safetensors::prefetch(ckpt);          // every tensor of every shard
///   while (warming.bytes_done() < warming.total_bytes()) show_progress(warming.bytes_done());
///   warming.wait();                                       // throws the first error (Io)
///
/// It needs only the files' paths and data offsets: each thread opens a file by path when it
/// reaches it (at most one descriptor per thread, whatever the shard count) and makes no view.
/// A file in memory (`SafeOpen::from_bytes`) has nothing to warm (`total_bytes()` is 0). Every
/// method may be called from several threads at once. Move-only; a moved-from Prefetch throws
/// `Internal` from every method.
class Prefetch {
 public:
  Prefetch(Prefetch&&) noexcept = default;
  Prefetch& operator=(Prefetch&&) noexcept = default;
  Prefetch(const Prefetch&) = SAFETENSORS_DELETE("a Prefetch owns its reader threads: move it, or share it");
  Prefetch& operator=(const Prefetch&) = SAFETENSORS_DELETE("a Prefetch owns its reader threads: move it");
  ~Prefetch() = default;

  /// Bytes of the plan read into the page cache so far.
  [[nodiscard]] std::uint64_t bytes_done() const { return job().bytes_done(); }
  /// Bytes the plan covers (a selection counts only what it selects).
  [[nodiscard]] std::uint64_t total_bytes() const { return job().total_bytes(); }
  /// Waits until every byte is read, or the first error (an `Io` error naming the file that
  /// could not be opened or read, which ends the prefetch); every later call reports the same.
  void wait() const { nothrow::wait(*this).throw_if_error(); }

 private:
  friend struct detail::Access<Prefetch>;
  explicit Prefetch(::rust::Box<ffi::PrefetchJob> job) : job_(detail::share(std::move(job))) {}

  [[nodiscard]] const ffi::PrefetchJob& job() const {
    if (!job_) detail::moved_from("Prefetch").throw_if_error();
    return *job_;
  }

  std::shared_ptr<const ffi::PrefetchJob> job_;
};

/// Starts warming `requests` of a file or a checkpoint (`{}`: every tensor; a checkpoint's shards
/// in order, each shard's header opened first to know where its tensors are), only the bytes they
/// read; see `Prefetch`. Throws what `nothrow::prefetch` returns: `TensorNotFound` or
/// `InvalidSlice` for a request that does not fit, before anything is read.
///
///   auto warming = safetensors::prefetch(ckpt, {}, {.threads = 8});
///   std::vector<safetensors::Request> want{{"wte.weight"}, {"wpe.weight", {Index::range(0, 512)}}};
///   safetensors::prefetch(f, want).wait();
template <Readable From>
[[nodiscard]] Prefetch prefetch(const From& from, Requests requests = {}, PrefetchOptions options = {}) {
  return nothrow::prefetch(from, requests, options).value();
}

/// Gives the kernel `advice` (`madvise`) for the bytes `requests` read (`{}`: every tensor byte)
/// of a mapped file, or of a checkpoint's mapped shards; nothing for the read and direct
/// backends, which map nothing. A hint the kernel refuses is `Io`.
///
///   safetensors::advise(f, safetensors::Advice::Sequential);
template <Readable From>
void advise(const From& from, Advice advice, Requests requests = {}) {
  nothrow::advise(from, advice, requests).throw_if_error();
}

namespace detail {
template <>
struct Access<Prefetch> {
  static Prefetch make(::rust::Box<ffi::PrefetchJob> job) { return Prefetch(std::move(job)); }

  static Status wait(const Prefetch& p) {
    if (!p.job_) return moved_from("Prefetch");
    return attempt([&](ffi::Status& st) { p.job_->wait(st); });
  }
};
}  // namespace detail

template <Readable From>
Expected<Prefetch> nothrow::prefetch(const From& from, Requests requests, PrefetchOptions options) {
  auto r = detail::reading(from, requests);
  if (!r) return r.status();
  auto job = detail::adopt(detail::attempt([&](ffi::Status& st) {
    return ffi::prefetch(*r->source, *r->requests, options.threads, options.request_bytes, st);
  }));
  if (!job) return job.status();
  return detail::Access<Prefetch>::make(std::move(*job));
}

inline Status nothrow::wait(const Prefetch& prefetch) {
  return detail::Access<Prefetch>::wait(prefetch);
}

template <Readable From>
Status nothrow::advise(const From& from, Advice advice, Requests requests) {
  auto r = detail::reading(from, requests);
  if (!r) return r.status();
  return detail::attempt(
      [&](ffi::Status& st) { ffi::advise(*r->source, *r->requests, static_cast<ffi::Advice>(advice), st); });
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
