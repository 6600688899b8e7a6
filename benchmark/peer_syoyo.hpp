// The optional C++ peer of bench_cpp: syoyo/safetensors-cpp (a single header, in no package
// registry), compiled from a checkout the build is given (CMake `SAFETENSORS_SYOYO_DIR`, or the
// environment variable of that name). Its `safetensors` namespace is also ours, so it lives in a
// translation unit of its own (peer_syoyo.cpp) behind these three functions, each the same work
// as one of bench_cpp's items.
#pragma once

#include <cstdint>
#include <string>

namespace peer_syoyo {

/// Whether bench_cpp was built with the peer.
bool built();

/// `open`: `mmap_from_file`, then every tensor's shape (no data read by us; the peer maps with
/// MAP_POPULATE and POSIX_MADV_WILLNEED, so its open touches the whole file). Returns a value
/// that depends on every shape; throws std::runtime_error with the peer's message on failure.
std::uint64_t open_all(const std::string& path);

/// `load`: `mmap_from_file`, then a checksum of every tensor's bytes through its mapping.
std::uint64_t read_all(const std::string& path);

/// `load_copy`: `load_from_file` (the data copied into memory the peer owns), then every
/// tensor's first byte.
std::uint64_t copy_all(const std::string& path);

}  // namespace peer_syoyo
