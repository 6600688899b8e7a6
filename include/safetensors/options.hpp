// Options for opening files and checkpoints.
#pragma once

#include "safetensors/abi.hpp"

#include <cstdint>

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// How tensor bytes are reached.
enum class Backend : std::uint8_t {
  /// Map the file read-only; views point into the mapping (zero copy). The default. The file is
  /// mapped at its first access of tensor bytes, not at open (docs/reading.md, "Backends"); a
  /// file truncated in between is an `Io` error then.
  Mmap = 0,
  /// Read the header at open, and each tensor's bytes with `pread` when asked. For network
  /// filesystems, unified-memory machines, and files another process may truncate.
  Read = 1,
  /// Like `Read`, with `O_DIRECT` (bypassing the page cache) into aligned buffers: cold loads at
  /// the disk's speed. Where the filesystem refuses `O_DIRECT` (tmpfs, some network
  /// filesystems) reads fall back to `pread`; `SafeOpen::direct_fallback()` says why.
  Direct = 2,
};

/// When a mapped file's pages are read in and mapped into the process (`OpenOptions::populate`).
enum class Populate : std::uint8_t {
  /// On first touch, page by page (the kernel's page faults). The default.
  Lazy = 0,
  /// At open (`MAP_POPULATE`): the open returns once every page is read and mapped, so no later
  /// access waits for the disk or faults.
  AtOpen = 1,
  /// After the open, by a thread of the library's (`MADV_POPULATE_READ`, 64 MiB at a time;
  /// `MADV_WILLNEED` before Linux 5.14) while the program goes on. It stops when the file is
  /// closed; it reports nothing (a file truncated meanwhile ends it, and the access that meets
  /// the missing pages fails as it would without it).
  Background = 2,
};

/// Options for `SafeOpen`.
///
///   safetensors::SafeOpen f("model.safetensors", {.populate = safetensors::Populate::AtOpen});
struct OpenOptions {
  Backend backend = Backend::Mmap;
  /// Open a file with bytes after its last tensor (some tools append them) instead of refusing
  /// it with `MetadataIncompleteBuffer`; `SafeOpen::trailing_bytes()` reports how many. Every
  /// other check still runs, and no view or read reaches those bytes.
  bool allow_trailing_bytes = false;
  /// When the mapping's pages are brought in. Only `Backend::Mmap` maps anything: the read and
  /// direct backends and files in memory ignore it.
  Populate populate = Populate::Lazy;
  /// Ask for transparent huge pages on the mapping (`MADV_HUGEPAGE`): fewer faults and TLB
  /// misses where the kernel and the filesystem back file mappings with huge pages, no effect
  /// elsewhere (never an error). Ignored as `populate` is.
  bool huge_pages = false;
};

/// Options for `Checkpoint`. The default is strict: the index must match its shards exactly.
///
///   safetensors::Checkpoint ckpt(index, {.lenient = true});
struct CheckpointOptions {
  Backend backend = Backend::Mmap;
  /// For shards (or the single file) with bytes after their last tensor; see
  /// `Checkpoint::trailing_bytes()`.
  bool allow_trailing_bytes = false;
  /// Read the index as an allow-list, as vLLM and transformers do: a listed tensor its shard
  /// lacks is `ShardMissing` only when asked for (`Checkpoint::missing()` lists them), and
  /// copies of a tensor in shards the index does not assign it to are ignored.
  bool lenient = false;
  /// `OpenOptions::populate` for each mapped shard, from the shard's (lazy) open on.
  Populate populate = Populate::Lazy;
  /// `OpenOptions::huge_pages` for each mapped shard.
  bool huge_pages = false;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
