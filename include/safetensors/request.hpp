// What a prefetch, a piece of advice or a stream reads: tensors, whole or sliced, of a file or a
// checkpoint, optionally pinned to one shard.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/slice.hpp"

namespace safetensors::inline SAFETENSORS_ABI {

/// One tensor to read, whole or a selection of it, for `prefetch`, `advise` and `TensorStream`.
/// A selection reads (and delivers) exactly what `get_slice(name).select(select).read()` gives:
/// the selected bytes packed in row-major order, nothing else is read.
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

namespace detail {
/// Requests as the bridge takes them, all in one call: `std::nullopt` for every tensor of the
/// source. `InvalidSlice` for an index that does not fit in 64 bits.
inline Expected<::rust::Box<ffi::RequestList>> request_list(
    std::optional<std::span<const Request>> requests) {
  std::vector<ffi::RequestSpan> spans;
  std::string names;
  std::vector<ffi::SliceIndex> indices;
  if (requests) {
    spans.reserve(requests->size());
    for (const auto& r : *requests) {
      auto raw = raw_indices(r.select);
      if (!raw) return raw.status();
      spans.push_back({names.size(), r.name.size(), r.shard.has_value(), r.shard.value_or(0), !raw->empty(),
                       indices.size(), raw->size()});
      names += r.name;
      indices.insert(indices.end(), raw->begin(), raw->end());
    }
  }
  ::rust::Slice<const ffi::RequestSpan> s{spans.data(), spans.size()};
  ::rust::Slice<const ffi::SliceIndex> i{indices.data(), indices.size()};
  return adopt(
      attempt([&](ffi::Status& st) { return ffi::new_request_list(!requests, s, bytes(names), i, st); }));
}
}  // namespace detail

}  // namespace safetensors::inline SAFETENSORS_ABI
