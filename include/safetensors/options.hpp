// Options for opening files and checkpoints.
#pragma once

#include "safetensors/abi.hpp"

#include <cstdint>

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// How tensor bytes are reached.
enum class Backend : std::uint8_t {
  /// Map the file read-only; views point into the mapping (zero copy). The default.
  Mmap = 0,
  /// Read the header at open, and each tensor's bytes with `pread` when asked. For network
  /// filesystems, unified-memory machines, and files another process may truncate.
  Read = 1,
  /// Like `Read`, with `O_DIRECT` (bypassing the page cache) into aligned buffers: cold loads at
  /// the disk's speed. Where the filesystem refuses `O_DIRECT` (tmpfs, some network
  /// filesystems) reads fall back to `pread`; `SafeOpen::direct_fallback()` says why.
  Direct = 2,
};

struct OpenOptions {
  Backend backend = Backend::Mmap;
  /// Open a file with bytes after its last tensor (some tools append them) instead of refusing
  /// it with `MetadataIncompleteBuffer`; `SafeOpen::trailing_bytes()` reports how many. Every
  /// other check still runs, and no view or read reaches those bytes.
  bool allow_trailing_bytes = false;
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
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
