// What a prefetch, a piece of advice, a stream or a GPU upload reads: every tensor, or requests
// (tensors, whole or sliced, optionally pinned to one shard), from anything readable (a
// `SafeOpen` or a `Checkpoint`). One model for all four: a request means the same bytes to each.
#pragma once

#include "safetensors/abi.hpp"

#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "safetensors/checkpoint.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/slices.hpp"
#include "safetensors/ffi/src/stream.rs.h"
#include "safetensors/safe_open.hpp"
#include "safetensors/slice.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// One tensor to read, whole or a selection of it. A selection reads (and delivers) exactly
/// what `get_slice(name).select(select).read()` gives: the selected bytes packed in row-major
/// order; nothing else is read.
///
///   std::vector<safetensors::Request> want{{"wte.weight"}, {"wpe.weight", {Index::range(0, 512)}}};
struct Request {
  /// The tensor's name.
  std::string name;
  /// What to take along each dimension, as `Slice::select` takes it; empty: the whole tensor.
  std::vector<Index> select{};
  /// For a `Checkpoint`: the shard that must hold it (a position in `shard_paths()`); a shard
  /// other than the one its index names is `TensorNotFound` there. For a `SafeOpen`: 0. Empty:
  /// wherever it is.
  std::optional<std::size_t> shard{};
};

/// What to read: every tensor (`{}`, the default), or the given requests, in their order (an
/// empty list reads nothing). It borrows the list, which must outlive the call it is passed to.
///
///   std::vector<safetensors::Request> want{{"wte.weight"}};
///   safetensors::prefetch(f);                          // every tensor
///   safetensors::prefetch(f, want);                    // a std::vector<Request> (or a span)
///   safetensors::TensorStream s(ckpt, {}, {.max_inflight_bytes = 64 << 20});   // every tensor
class Requests {
 public:
  /// Every tensor.
  Requests() = default;
  Requests(std::span<const Request> requests) : list_(requests) {}     // NOLINT: implicit on purpose
  Requests(const std::vector<Request>& requests) : list_(requests) {}  // NOLINT: implicit on purpose
  Requests(std::initializer_list<Request> requests)                    // NOLINT: implicit on purpose
      : list_(std::span<const Request>(requests.begin(), requests.size())) {}

  /// Whether every tensor is read.
  [[nodiscard]] bool all() const noexcept { return !list_.has_value(); }
  /// The requests (empty for every tensor).
  [[nodiscard]] std::span<const Request> list() const noexcept {
    return list_.value_or(std::span<const Request>{});
  }

 private:
  std::optional<std::span<const Request>> list_;
};

/// What can be read: a `SafeOpen` or a `Checkpoint`. Every operation that reads from either is one
/// template constrained by this (`prefetch`, `TensorStream`, `cuda::Uploader::load`, ...).
template <class T>
concept Readable =
    std::same_as<std::remove_cvref_t<T>, SafeOpen> || std::same_as<std::remove_cvref_t<T>, Checkpoint>;

namespace detail {
/// Requests as the bridge takes them, all in one call. `InvalidSlice` for an index that does not
/// fit in 64 bits.
inline Expected<::rust::Box<ffi::RequestList>> request_list(const Requests& requests) {
  std::vector<ffi::RequestSpan> spans;
  std::string names;
  std::vector<ffi::SliceIndex> indices;
  spans.reserve(requests.list().size());
  for (const auto& r : requests.list()) {
    auto raw = raw_indices(r.select);
    if (!raw) return raw.status();
    spans.push_back({names.size(), r.name.size(), r.shard.has_value(), r.shard.value_or(0), !raw->empty(),
                     indices.size(), raw->size()});
    names += r.name;
    indices.insert(indices.end(), raw->begin(), raw->end());
  }
  ::rust::Slice<const ffi::RequestSpan> s{spans.data(), spans.size()};
  ::rust::Slice<const ffi::SliceIndex> i{indices.data(), indices.size()};
  return adopt(attempt(
      [&](ffi::Status& st) { return ffi::new_request_list(requests.all(), s, slice_bytes(names), i, st); }));
}

/// What the bridge reads from, and the requests, as one call takes them.
struct Reading {
  ::rust::Box<ffi::Source> source;
  ::rust::Box<ffi::RequestList> requests;
};

/// The bridge's source for a file.
inline Expected<::rust::Box<ffi::Source>> bridge_source(const SafeOpen& file, const ffi::RequestList&) {
  auto f = Access<SafeOpen>::open_file(file);
  if (!f) return f.status();
  return ffi::source_of_file(*(*f)->file);
}

/// The bridge's source for a checkpoint: the core opens the shards the requests touch as it
/// reads them (and announces each opened shard's hand-over to a ThreadSanitizer build itself).
inline Expected<::rust::Box<ffi::Source>> bridge_source(const Checkpoint& ckpt, const ffi::RequestList&) {
  auto c = Access<Checkpoint>::checkpoint(ckpt);
  if (!c) return c.status();
  return ffi::source_of_checkpoint(**c);
}

/// What `requests` of `from` reads, as the bridge takes it: the one door every reading
/// operation goes through.
template <Readable From>
Expected<Reading> reading(const From& from, const Requests& requests) {
  auto list = request_list(requests);
  if (!list) return list.status();
  auto source = bridge_source(from, **list);
  if (!source) return source.status();
  return Reading{std::move(*source), std::move(*list)};
}
}  // namespace detail

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
