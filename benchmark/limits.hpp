// The machine's own limits that only bench_cpp measures, beside those shared with the CLI in
// cpp/measure.hpp: one memcpy of a file's size, one raw write() of it (synced or not), and
// dropping the page cache for cold runs.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "measure.hpp"

namespace measure {

/// The limit for copying `n` bytes in memory: one memcpy between two buffers already touched.
struct MemcpyLimit {
  explicit MemcpyLimit(std::size_t n) : src(n, std::byte{1}), dst(n, std::byte{0}) {}
  void run() { std::memcpy(dst.data(), src.data(), src.size()); }
  std::vector<std::byte> src, dst;
};

/// Where `write_file` writes in `dir`.
inline std::filesystem::path raw_write_path(const std::filesystem::path& dir) {
  return dir / ".bench-raw-write.tmp";
}

/// The limit for saving `n` bytes: one sequential write() of a new file in `dir`, optionally
/// fsynced (our writer syncs, so that is the like-for-like figure). The file is left in place:
/// remove it outside the timed region (unlinking a file whose pages are cached costs time that
/// no save pays, since every save item writes to a path that does not exist yet).
inline void write_file(const std::filesystem::path& dir, const std::vector<std::byte>& bytes, bool sync) {
  auto path = raw_write_path(dir);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("create " + path.string() + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw std::runtime_error("write " + path.string() + ": " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  // A failed sync or close is a write that did not land: the figure would be for less work.
  int err = sync && ::fsync(fd) != 0 ? errno : 0;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) throw std::runtime_error("write " + path.string() + ": " + std::strerror(err));
}

/// Drops the page cache (cold runs); needs root and a writable /proc/sys.
inline bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  return static_cast<bool>(f);
}

}  // namespace measure
