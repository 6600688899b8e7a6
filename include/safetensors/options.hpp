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
};

struct OpenOptions {
  Backend backend = Backend::Mmap;
};

}  // namespace safetensors
