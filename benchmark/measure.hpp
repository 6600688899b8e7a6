// Timing helpers shared by bench_cpp and `safetensors bench`: medians of repeated runs, and the
// machine's own limits for the same bytes (plain read(), memcpy, raw write).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace measure {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Timings of `runs` calls of `body`, each after `setup` (untimed), after one untimed warm-up
/// call (first calls pay for cold caches and lazy initialisation on both sides of a comparison).
inline std::vector<double> repeat(int runs, const std::function<void()>& body,
                                  const std::function<void()>& setup = [] {}) {
  setup();
  body();
  std::vector<double> out;
  for (int i = 0; i < runs; ++i) {
    setup();
    auto t = Clock::now();
    body();
    out.push_back(seconds_since(t));
  }
  return out;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// Memory that is not yet touched, like what a loader gets from malloc for a large tensor.
inline std::unique_ptr<std::byte[]> fresh_buffer(std::size_t n) {
  return std::unique_ptr<std::byte[]>(new std::byte[n == 0 ? 1 : n]);
}

/// Memory mapped and populated up front, so that reading into it pays no page faults.
struct MappedBuffer {
  explicit MappedBuffer(std::size_t n) : size(n == 0 ? 1 : n) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of the read() target failed");
    data = static_cast<std::byte*>(p);
  }
  ~MappedBuffer() { ::munmap(data, size); }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  std::size_t size;
  std::byte* data;
};

/// One plain sequential read() of the `size` bytes of `path` into `target`, which holds `size`
/// bytes. The length is the caller's, never measured again here: a file that another process
/// grows or replaces meanwhile must not overflow the buffer. One whose length is no longer
/// `size`, or that is no longer a regular file (O_NONBLOCK: a FIFO must not hang), is an error.
inline void read_whole_file(const std::filesystem::path& path, std::byte* target, std::size_t size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw std::runtime_error("open " + path.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) != size) {
    ::close(fd);
    throw std::runtime_error(path.string() +
                             " changed while it was measured: it is no longer a regular file of " +
                             std::to_string(size) + " bytes");
  }
  std::size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, target + done, size - done);
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("read " + path.string() + " failed (did it shrink?)");
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

/// The limit for copying `n` bytes in memory: one memcpy between two buffers already touched.
struct MemcpyLimit {
  explicit MemcpyLimit(std::size_t n) : src(n, std::byte{1}), dst(n, std::byte{0}) {}
  void run() { std::memcpy(dst.data(), src.data(), src.size()); }
  std::vector<std::byte> src, dst;
};

/// Where `write_file` writes in `dir`.
inline std::filesystem::path raw_write_path(const std::filesystem::path& dir) { return dir / ".bench-raw-write.tmp"; }

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
      ::close(fd);
      throw std::runtime_error("write " + path.string() + " failed");
    }
    done += static_cast<std::size_t>(n);
  }
  if (sync) ::fsync(fd);
  ::close(fd);
}

/// Drops the page cache (cold runs); needs root and a writable /proc/sys.
inline bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  return static_cast<bool>(f);
}

/// Reads every page of `path` once, so later runs find it in the page cache.
inline void warm(const std::filesystem::path& path) {
  std::size_t size = std::filesystem::file_size(path);
  read_whole_file(path, fresh_buffer(size).get(), size);
}

/// "AMD EPYC (2 cores), 23.4 GiB" from /proc.
inline std::string machine() {
  std::string cpu = "unknown CPU", line;
  std::ifstream info("/proc/cpuinfo");
  while (std::getline(info, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  double gib = 0;
  std::ifstream mem("/proc/meminfo");
  while (std::getline(mem, line)) {
    if (line.rfind("MemTotal:", 0) == 0) gib = std::stod(line.substr(9)) / (1024.0 * 1024.0);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, " (%u cores), %.1f GiB", std::thread::hardware_concurrency(), gib);
  return cpu + buf;
}

}  // namespace measure
