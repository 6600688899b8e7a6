// Measurement shared by `safetensors bench` and benchmark/bench_cpp: the three loads both time
// (open, load, load_copy), written once so that both report the same work; repeated timings and
// their median; one plain read() of a file, the limit a load is compared with; the machine's
// description. Only the public API and POSIX: tool code that the benchmarks may include, never
// the other way round.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <safetensors/safetensors.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace measure {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Timings of `n` calls of `body`, each after `setup` (untimed), with no warm-up: the first call
/// pays for cold caches and lazy initialisation, as a program's first load does.
inline std::vector<double> timings(
    int n, const std::function<void()>& body, const std::function<void()>& setup = [] {}) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    setup();
    auto t = Clock::now();
    body();
    out.push_back(seconds_since(t));
  }
  return out;
}

/// Timings of `runs` calls of `body`, each after `setup` (untimed), after one untimed warm-up
/// call (first calls pay for cold caches and lazy initialisation on both sides of a comparison).
inline std::vector<double> repeat(
    int runs, const std::function<void()>& body, const std::function<void()>& setup = [] {}) {
  setup();
  body();
  return timings(runs, body, setup);
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

inline double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// ---- the loads both programs time ------------------------------------------------------------

/// Depends on every byte of `bytes`, so that no read of them can be optimised away.
inline std::uint64_t checksum(std::span<const std::byte> bytes) {
  std::uint64_t sum = 0;
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    sum += w;
  }
  for (; i < bytes.size(); ++i) sum += static_cast<std::uint8_t>(bytes[i]);
  return sum;
}

/// One of the ways of loading a whole file that both programs time, run again and again on one
/// path:
///   open       open the file, list keys, take every tensor's shape (`info`; Python's
///              `get_slice(k).get_shape()`, its way to a shape without reading the tensor)
///   load       every byte of every tensor read through the mapping (a checksum): the honest
///              "load" of a zero-copy loader
///   load_copy  every tensor copied into memory the program owns (read backend: pread into new
///              buffers), kept until `release`, so that freeing them is not part of the load
class LoadItem {
 public:
  enum class Kind { Open, Load, LoadCopy };
  static constexpr Kind kAll[] = {Kind::Open, Kind::Load, Kind::LoadCopy};

  LoadItem(Kind kind, std::filesystem::path path) : kind_(kind), path_(std::move(path)) {}

  [[nodiscard]] static std::string_view name(Kind kind) {
    return kind == Kind::Open ? "open" : kind == Kind::Load ? "load" : "load_copy";
  }
  [[nodiscard]] std::string_view name() const { return name(kind_); }

  /// The timed part.
  void run() {
    if (kind_ == Kind::Open) {
      safetensors::SafeOpen f(path_);
      for (const auto& k : f.keys()) sink_ += f.info(k).shape.size();
    } else if (kind_ == Kind::Load) {
      safetensors::SafeOpen f(path_);
      for (const auto& k : f.offset_keys()) sink_ += checksum(f.get_tensor(k).data);
    } else {
      safetensors::SafeOpen f(path_, {safetensors::Backend::Read});
      kept_.clear();
      for (const auto& k : f.offset_keys()) kept_.push_back(f.get_tensor(k));
      sink_ += kept_.size();
    }
  }
  /// Untimed: frees what `run` kept.
  void release() { kept_.clear(); }

  /// Depends on every byte the runs read, so that no read can be optimised away.
  [[nodiscard]] std::uint64_t sink() const { return sink_; }

 private:
  Kind kind_;
  std::filesystem::path path_;
  std::vector<safetensors::TensorView> kept_;
  std::uint64_t sink_ = 0;
};

/// Timings of `runs` runs of `load` after a warm-up run, each after `setup` (untimed).
inline std::vector<double> repeat(
    int runs, LoadItem& load, const std::function<void()>& setup = [] {}) {
  return repeat(
      runs, [&] { load.run(); },
      [&] {
        load.release();
        setup();
      });
}

// ---- the machine's own limit for the same bytes ----------------------------------------------

/// Memory that is not yet touched, like what a loader gets from malloc for a large tensor.
inline std::unique_ptr<std::byte[]> fresh_buffer(std::size_t n) {
  return std::unique_ptr<std::byte[]>(new std::byte[n == 0 ? 1 : n]);
}

/// Anonymous memory mapped for a read() target. `Populated` (the default): populated up front,
/// so that reading into it pays no page faults. `FreshHuge`: not touched, starting on a 2 MiB
/// boundary, with transparent huge pages asked for (`MADV_HUGEPAGE`): the best fresh memory one
/// thread can copy into, since the kernel still zeroes every page at its first write but takes
/// one fault per 2 MiB. The loaders' own large buffers are made so (`detail::allocate_bytes`),
/// which makes it the like-for-like limit of an owned copy.
struct MappedBuffer {
  enum Kind { Populated, FreshHuge };
  explicit MappedBuffer(std::size_t n, Kind kind = Populated) : size(n == 0 ? 1 : n) {
    constexpr std::size_t huge = std::size_t{2} << 20;
    const int populate = kind == Populated ? MAP_POPULATE : 0;
    mapped = kind == FreshHuge ? size + huge : size;  // room to start on a boundary
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of the read() target failed");
    base = static_cast<std::byte*>(p);
    data = base;
    if (kind == FreshHuge) {
      const auto at = reinterpret_cast<std::uintptr_t>(p);
      data = base + ((at + huge - 1) / huge * huge - at);
      (void)::madvise(data, size, MADV_HUGEPAGE);  // advice: may be ignored
    }
  }
  ~MappedBuffer() { ::munmap(base, mapped); }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  std::size_t size;
  std::size_t mapped;
  std::byte* base;
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

/// Reads every page of `path` once, so later runs find it in the page cache, and always in the
/// same shape: its cached pages are dropped first (`POSIX_FADV_DONTNEED`, which leaves alone the
/// pages a mapping holds and needs no privilege), so that what the runs find is what one
/// sequential read leaves. That shape matters to every read through a mapping: the kernel's
/// readahead caches a file read sequentially in large folios, which a mapping maps many pages
/// per fault, while a file another program faulted in through its own mapping, page by page
/// (Python's `load_file` does), is cached in 4 KiB pages. Reading gpt2's 548 MB through the
/// mapping took 21 ms in the first state and 58 ms in the second on the development VM
/// (populating at open or asking for huge pages changed neither), so without this a run's
/// `load` depended on which program had touched the file first.
inline void warm(const std::filesystem::path& path) {
  std::size_t size = std::filesystem::file_size(path);
  if (int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK); fd >= 0) {
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // advice: a refusal only keeps the pages
    ::close(fd);
  }
  read_whole_file(path, fresh_buffer(size).get(), size);
}

/// A field of /proc/self/status in bytes ("VmRSS": resident now, "VmHWM": the high-water mark).
inline std::uint64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with(field + ":")) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

/// Resets the kernel's high-water mark of resident memory (VmHWM) to what is resident now.
inline void reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5\n";
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
