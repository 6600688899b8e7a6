// Options for opening files and checkpoints.
#pragma once

#include <cstdint>

namespace safetensors {

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
};

}  // namespace safetensors
