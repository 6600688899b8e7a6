// Remote files: which strings are URLs, and how they are read (docs/remote.md).
// `SafeOpen::open_remote` (safe_open.hpp) and `Checkpoint::open_remote` (checkpoint.hpp) open
// them; a program that calls either includes this header too (safetensors.hpp does).
#pragma once

#include "safetensors/abi.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/remote_open.hpp"
#include "safetensors/ffi/src/remote.rs.h"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// How a remote file is read: `SafeOpen::open_remote(url, remote)` (safe_open.hpp). The defaults suit a model
/// on S3 or a CDN; docs/remote.md says when to change them.
///
///   safetensors::RemoteOptions remote{.concurrency = 32, .deadline = std::chrono::minutes(5)};
struct RemoteOptions {
  /// Ranged GETs in flight at once.
  std::size_t concurrency = 16;
  /// Bytes one GET asks for (adjacent byte runs are coalesced, then cut into parts this size);
  /// less than 4096 counts as 4096.
  std::size_t part_size = std::size_t{8} << 20;
  /// Bytes the first GET asks for: the header, speculatively with the first tensors; a longer
  /// header costs a second GET.
  std::size_t first_read = std::size_t{1} << 20;
  /// Longest one request may take, body included, before it is retried.
  std::chrono::milliseconds request_timeout{30'000};
  /// Longest a connection may take to open.
  std::chrono::milliseconds connect_timeout{5'000};
  /// Retries of a failed request (connection errors, timeouts, 5xx, 429), with backoff.
  std::size_t max_retries = 3;
  /// Longest the whole open may take (with `on_demand`: the open, and then each read on its
  /// own); zero for no limit beyond each request's timeout.
  std::chrono::milliseconds deadline{0};
  /// Fetch and validate the header only: keys, info and metadata work, and every read of
  /// tensor bytes is an `Io` error saying so (what `safetensors inspect URL` does).
  bool header_only = false;
  /// Fetch tensor bytes when they are read instead of the whole object at open: the open
  /// fetches the header only; each read (`get_tensor`, a slice's byte runs, a stream's or a GPU
  /// upload's pieces) fetches exactly its bytes with concurrent ranged GETs of the pinned
  /// version, written straight into the reader's buffer. Memory is what the reads ask for, not
  /// the object's size; bytes read twice are fetched twice. The file then reports
  /// `Backend::Read`.
  bool on_demand = false;
  /// Keep whole files in a local cache: a file fetched whole is written into `cache_dir`
  /// (atomically, named by its URL without query and its version) and mapped; a later open of
  /// the same URL and version maps that copy after one ranged GET that checks the version, and
  /// a copy that is corrupt or truncated is fetched again. Processes opening one file at once
  /// fetch it once. An `on_demand` open maps a copy the cache holds but writes nothing; a
  /// `header_only` open never touches it.
  bool cache = false;
  /// The cache's directory; empty for the user's (`$XDG_CACHE_HOME/safetensors`, else
  /// `~/.cache/safetensors`).
  std::filesystem::path cache_dir{};
  /// Bytes the cache may hold: the least recently used files are removed past it; a file larger
  /// is not cached. 0 means the default (128 GiB), as in C's `st_remote_options`.
  std::uint64_t cache_limit = std::uint64_t{128} << 30;
};

/// Whether `s` names a remote file rather than a local path: it starts with `s3://`, `gs://`,
/// `az://`, `http://` or `https://` (the scheme in any case). The one rule the library and its CLI apply.
[[nodiscard]] inline bool is_url(std::string_view s) {
  return ffi::is_url(detail::bytes(s));
}

/// `url` as the library's messages show it: scheme, host, port and path, without user
/// information, query (a pre-signed URL's signature) or fragment. For programs that print a URL
/// they were given.
///
///   safetensors::redact_url("https://h/m.safetensors?sig=x");  // "https://h/m.safetensors"
[[nodiscard]] inline std::string redact_url(std::string_view url) {
  return std::string(ffi::redact_url(detail::bytes(url)));
}

/// Whether this build opens remote files (configured with `SAFETENSORS_REMOTE`, the default);
/// without it `open_remote` is an `Io` error saying so.
[[nodiscard]] inline bool remote_built() {
  return ffi::remote_built();
}

namespace detail {
inline ffi::RemoteOptions remote_options(const RemoteOptions& o) {
  auto ms = [](std::chrono::milliseconds d) {
    return static_cast<std::uint64_t>(d.count() < 0 ? 0 : d.count());
  };
  return ffi::RemoteOptions{.concurrency = o.concurrency,
                            .part_size = o.part_size,
                            .first_read = o.first_read,
                            .request_timeout_ms = ms(o.request_timeout),
                            .connect_timeout_ms = ms(o.connect_timeout),
                            .max_retries = o.max_retries,
                            .deadline_ms = ms(o.deadline),
                            .header_only = o.header_only,
                            .on_demand = o.on_demand,
                            .cache = o.cache,
                            .cache_dir = detail::bytes(std::string_view(o.cache_dir.native())),
                            .cache_limit = o.cache_limit};
}
}  // namespace detail

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
