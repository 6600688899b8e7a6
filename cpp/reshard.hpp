// Resharding, as `safetensors reshard` does it and benchmark/bench_writer measures it: every
// tensor of a file or a checkpoint copied into a new checkpoint by a `ShardedWriter`, in pieces
// through one buffer, so that memory stays at that buffer whatever the checkpoint's size.
//
// Decisions: the tensors keep the order they lie in on disk (shard by shard as the index first
// names them, by offset within each), so the new shards group what the old ones grouped; the
// source is read with the read backend (pread into the buffer: nothing mapped, nothing of the
// source counted in the process's memory); the new shards' metadata is the source's per-file
// metadata (the single file's, or the first shard's, `format` among it, which transformers
// checks), plus an index's own metadata other than `total_size`, which the new index recomputes.
#pragma once

#include <safetensors/safetensors.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace reshard {

/// One tensor of the source: its shard and its header entry (offsets in that shard's data).
struct Item {
  std::string name;
  std::size_t shard = 0;
  safetensors::TensorInfo info;
};

/// The tensors of `from` in the order they lie on disk: shard by shard, by offset.
inline std::vector<Item> physical_order(const safetensors::Checkpoint& from) {
  std::map<std::filesystem::path, std::size_t> shard_index;
  const auto shards = from.shard_paths();
  for (std::size_t i = 0; i < shards.size(); ++i) shard_index.emplace(shards[i], i);
  std::vector<Item> out;
  for (const auto& name : from.keys())
    out.push_back({name, shard_index.at(from.shard_of(name)), from.info(name)});
  std::sort(out.begin(), out.end(), [](const Item& a, const Item& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.info.data_offsets < b.info.data_offsets;
  });
  return out;
}

/// The metadata the new shards get (see the file comment).
inline safetensors::Metadata metadata_of(const safetensors::Checkpoint& from, bool is_index) {
  if (!is_index) return from.metadata();
  safetensors::Metadata out;
  if (from.shard_count() > 0) {
    out =
        safetensors::SafeOpen(from.shard_paths().front(), {.backend = safetensors::Backend::Read}).metadata();
  }
  for (const auto& [key, value] : from.metadata()) {
    if (key != "total_size") out.emplace(key, value);
  }
  return out;
}

/// Copies every tensor of `from` into a new checkpoint in `dir` (an existing directory), through
/// a buffer of `piece_bytes`, calling `progress(bytes done, bytes in all)` after each piece.
/// Returns the files written (shards, then the index when there are several).
inline std::vector<std::filesystem::path> copy(
    const safetensors::Checkpoint& from, bool is_index, const std::filesystem::path& dir,
    safetensors::ShardOptions shards, safetensors::SaveOptions options, std::size_t piece_bytes,
    const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  const auto items = physical_order(from);
  std::vector<safetensors::TensorSpec> specs;
  specs.reserve(items.size());
  std::uint64_t total = 0;
  for (const auto& item : items) {
    specs.push_back({item.name, item.info.dtype, item.info.shape});
    total += item.info.byte_size();
  }
  safetensors::ShardedWriter out(dir, specs, metadata_of(from, is_index), std::move(shards), options);
  std::vector<std::byte> buffer(
      static_cast<std::size_t>(std::min<std::uint64_t>(piece_bytes, std::max<std::uint64_t>(total, 1))));
  std::uint64_t done = 0;
  for (const auto& item : items) {
    const std::size_t len = item.info.byte_size();
    for (std::size_t at = 0; at < len; at += buffer.size()) {
      const std::size_t n = std::min(buffer.size(), len - at);
      std::span<std::byte> piece(buffer.data(), n);
      from.read_shard_data(item.shard, item.info.data_offsets.first + at, piece);
      out.write(item.name, at, piece);
      done += n;
      if (progress) progress(done, total);
    }
  }
  const auto published = out.files();
  std::vector<std::filesystem::path> files(published.begin(), published.end());
  out.finish();
  return files;
}

}  // namespace reshard
