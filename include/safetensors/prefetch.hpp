// Cold loads: warming the page cache for a file, a checkpoint or some of their tensors before
// reading them, and access hints for mapped files.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "safetensors/checkpoint.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/request.hpp"
#include "safetensors/safe_open.hpp"

namespace safetensors::inline SAFETENSORS_ABI {

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
/// `safetensors::prefetch` without exceptions: every tensor of `file`.
///
///   auto warming = safetensors::nothrow::prefetch(f);
///   if (warming) (void)safetensors::nothrow::wait(*warming);
[[nodiscard]] Expected<Prefetch> prefetch(const SafeOpen& file, PrefetchOptions options = {});
/// `requests` of `file` (only the bytes their selections need).
[[nodiscard]] Expected<Prefetch> prefetch(const SafeOpen& file, std::span<const Request> requests,
                                          PrefetchOptions options = {});
/// Every tensor the checkpoint's index lists, shard by shard.
[[nodiscard]] Expected<Prefetch> prefetch(const Checkpoint& ckpt, PrefetchOptions options = {});
/// `requests` of the checkpoint.
[[nodiscard]] Expected<Prefetch> prefetch(const Checkpoint& ckpt, std::span<const Request> requests,
                                          PrefetchOptions options = {});
/// `Prefetch::wait` without exceptions.
Status wait(const Prefetch& prefetch);
/// `safetensors::advise` without exceptions: every tensor of `file`.
Status advise(const SafeOpen& file, Advice advice);
/// `requests` of `file`.
Status advise(const SafeOpen& file, std::span<const Request> requests, Advice advice);
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
  Prefetch(const Prefetch&) = delete;
  Prefetch& operator=(const Prefetch&) = delete;
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

/// Starts warming every tensor of `file` (see `Prefetch`); throws what `nothrow::prefetch`
/// returns.
///
///   auto warming = safetensors::prefetch(f, {.threads = 8});
///   warming.wait();
[[nodiscard]] inline Prefetch prefetch(const SafeOpen& file, PrefetchOptions options = {}) {
  return nothrow::prefetch(file, options).value();
}

/// Starts warming `requests` of `file`: only the bytes they read. Throws `TensorNotFound` or
/// `InvalidSlice` for a request that does not fit, before anything is read.
///
///   std::vector<safetensors::Request> want{{"wte.weight"}, {"wpe.weight", {Index::range(0, 512)}}};
///   safetensors::prefetch(f, want).wait();
[[nodiscard]] inline Prefetch prefetch(const SafeOpen& file, std::span<const Request> requests,
                                       PrefetchOptions options = {}) {
  return nothrow::prefetch(file, requests, options).value();
}

/// Starts warming every tensor of a checkpoint, shard by shard (opening each shard's header
/// first, to know where its tensors are).
///
///   safetensors::prefetch(ckpt).wait();
[[nodiscard]] inline Prefetch prefetch(const Checkpoint& ckpt, PrefetchOptions options = {}) {
  return nothrow::prefetch(ckpt, options).value();
}

/// Starts warming `requests` of a checkpoint (opening the shards they touch).
[[nodiscard]] inline Prefetch prefetch(const Checkpoint& ckpt, std::span<const Request> requests,
                                       PrefetchOptions options = {}) {
  return nothrow::prefetch(ckpt, requests, options).value();
}

/// Gives the kernel `advice` for every tensor byte of a mapped file (`madvise`); nothing for
/// the read and direct backends, which map nothing. A hint the kernel refuses is `Io`.
///
///   safetensors::advise(f, safetensors::Advice::Sequential);
inline void advise(const SafeOpen& file, Advice advice) {
  nothrow::advise(file, advice).throw_if_error();
}

/// `advice` for the bytes `requests` read.
inline void advise(const SafeOpen& file, std::span<const Request> requests, Advice advice) {
  nothrow::advise(file, requests, advice).throw_if_error();
}

namespace detail {
template <>
struct Access<Prefetch> {
  static Expected<Prefetch> of_file(const SafeOpen& file, std::optional<std::span<const Request>> requests,
                                    PrefetchOptions o) {
    auto src = Access<SafeOpen>::source(file);
    if (!src) return src.status();
    auto list = request_list(requests);
    if (!list) return list.status();
    auto job = adopt(attempt([&](ffi::Status& st) {
      return ffi::prefetch_file(*(*src)->file, **list, o.threads, o.request_bytes, st);
    }));
    if (!job) return job.status();
    return Prefetch(std::move(*job));
  }

  static Expected<Prefetch> of_checkpoint(const Checkpoint& ckpt,
                                          std::optional<std::span<const Request>> requests,
                                          PrefetchOptions o) {
    auto list = request_list(requests);
    if (!list) return list.status();
    auto c = Access<Checkpoint>::open_shards_for(ckpt, **list);
    if (!c) return c.status();
    auto job = adopt(attempt([&](ffi::Status& st) {
      return ffi::prefetch_checkpoint(**c, **list, o.threads, o.request_bytes, st);
    }));
    if (!job) return job.status();
    return Prefetch(std::move(*job));
  }

  static Status wait(const Prefetch& p) {
    if (!p.job_) return moved_from("Prefetch");
    return attempt([&](ffi::Status& st) { p.job_->wait(st); });
  }

  static Status advise(const SafeOpen& file, std::optional<std::span<const Request>> requests,
                       Advice advice) {
    auto src = Access<SafeOpen>::source(file);
    if (!src) return src.status();
    auto list = request_list(requests);
    if (!list) return list.status();
    return attempt([&](ffi::Status& st) {
      ffi::advise_file(*(*src)->file, **list, static_cast<std::uint8_t>(advice), st);
    });
  }
};
}  // namespace detail

inline Expected<Prefetch> nothrow::prefetch(const SafeOpen& file, PrefetchOptions options) {
  return detail::Access<Prefetch>::of_file(file, std::nullopt, options);
}

inline Expected<Prefetch> nothrow::prefetch(const SafeOpen& file, std::span<const Request> requests,
                                            PrefetchOptions options) {
  return detail::Access<Prefetch>::of_file(file, requests, options);
}

inline Expected<Prefetch> nothrow::prefetch(const Checkpoint& ckpt, PrefetchOptions options) {
  return detail::Access<Prefetch>::of_checkpoint(ckpt, std::nullopt, options);
}

inline Expected<Prefetch> nothrow::prefetch(const Checkpoint& ckpt, std::span<const Request> requests,
                                            PrefetchOptions options) {
  return detail::Access<Prefetch>::of_checkpoint(ckpt, requests, options);
}

inline Status nothrow::wait(const Prefetch& prefetch) {
  return detail::Access<Prefetch>::wait(prefetch);
}

inline Status nothrow::advise(const SafeOpen& file, Advice advice) {
  return detail::Access<Prefetch>::advise(file, std::nullopt, advice);
}

inline Status nothrow::advise(const SafeOpen& file, std::span<const Request> requests, Advice advice) {
  return detail::Access<Prefetch>::advise(file, requests, advice);
}

}  // namespace safetensors::inline SAFETENSORS_ABI
