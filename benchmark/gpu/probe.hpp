// bench_cpp's `probe` item (`bench_cpp --items probe FILE`, run by the GPU kit's `probe` step):
// what decides how uploads should reach the link (docs/gpu.md, "The GPU probe"), measured in
// one process per file so that every variant is timed beside the same baseline on the same
// machine instance (runs vary ±15 % between machines of one kind). Each part prints a few lines
// and lands in the file's JSON under "probe":
//   loads      interleaved round by round, each a whole-file Uploader::load with the file opened
//              in the timed body: one pinned host-to-device copy (the link), whole chunks one
//              reader each (the schedule before stripes: SAFETENSORS_UPLOAD_STRIPE=0), the
//              default (2 MiB stripes), the read backend, zero-copy alone (one reader, the feeder:
//              SAFETENSORS_ZERO_COPY=1) and the hybrid (zero-copy beside the default readers)
//   trace      one traced load per variant (SAFETENSORS_UPLOAD_TRACE): the link's busy fraction
//              between its first and last copy, the time to the first copy, the drain after the
//              last fill, the fill rate, the allocation, from the device's own copy times
//   contention host copies (8 and 16 threads, the mapped file into pinned buffers) alone, a
//              pinned host-to-device loop alone, and each host copy beside the loop: whether
//              the CPU copy slows while DMA runs (DRAM-bound staging)
//   sweep      ring configurations: slot 2/4/16 MiB × readers 8/16 × mmap/read, 3 runs each
//   register   cuMemHostRegister(READ_ONLY) + cuMemHostUnregister of the mapped file in chunks
//              of 16/64/256 MiB on 1/2/4 threads (GB/s), and the longest stall of a loop
//              submitting 1 MiB copies while one thread registers 64 MiB chunks, beside the same
//              loop alone
// Against the emulated driver everything runs (briefly), and no figure says anything about a GPU.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpu_probe {

using ProbeClock = std::chrono::steady_clock;

inline double since(ProbeClock::time_point t) {
  return std::chrono::duration<double>(ProbeClock::now() - t).count();
}

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// An environment variable set for a scope (uploaders read theirs when they are made).
class Env {
 public:
  Env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~Env() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// The driver entry points the raw measurements call (the library does not lend its own).
struct Driver {
  template <class F>
  F sym(const char* name) {
    void* p = lib ? ::dlsym(lib, name) : nullptr;
    if (!p) missing = missing.empty() ? name : missing;
    return reinterpret_cast<F>(p);
  }
  Driver() : lib(::dlopen("libcuda.so.1", RTLD_NOW)) {
    retain = sym<int (*)(void**, int)>("cuDevicePrimaryCtxRetain");
    set_current = sym<int (*)(void*)>("cuCtxSetCurrent");
    host_alloc = sym<int (*)(void**, std::size_t, unsigned)>("cuMemHostAlloc");
    free_host = sym<int (*)(void*)>("cuMemFreeHost");
    alloc = sym<int (*)(std::uint64_t*, std::size_t)>("cuMemAlloc_v2");
    free_ = sym<int (*)(std::uint64_t)>("cuMemFree_v2");
    stream_create = sym<int (*)(void**, unsigned)>("cuStreamCreate");
    stream_destroy = sym<int (*)(void*)>("cuStreamDestroy_v2");
    stream_sync = sym<int (*)(void*)>("cuStreamSynchronize");
    htod = sym<int (*)(std::uint64_t, const void*, std::size_t, void*)>("cuMemcpyHtoDAsync_v2");
    reg = sym<int (*)(void*, std::size_t, unsigned)>("cuMemHostRegister_v2");
    unreg = sym<int (*)(void*)>("cuMemHostUnregister");
    emulated = lib && ::dlsym(lib, "fakecuda_hold") != nullptr;
    if (missing.empty() && retain(&ctx, 0) != 0) missing = "a context on device 0";
  }
  /// Makes device 0's primary context current on the calling thread.
  void enter() const { set_current(ctx); }
  [[nodiscard]] bool ok() const { return missing.empty(); }

  void* lib;
  std::string missing;
  void* ctx = nullptr;
  bool emulated = false;
  int (*retain)(void**, int) = nullptr;
  int (*set_current)(void*) = nullptr;
  int (*host_alloc)(void**, std::size_t, unsigned) = nullptr;
  int (*free_host)(void*) = nullptr;
  int (*alloc)(std::uint64_t*, std::size_t) = nullptr;
  int (*free_)(std::uint64_t) = nullptr;
  int (*stream_create)(void**, unsigned) = nullptr;
  int (*stream_destroy)(void*) = nullptr;
  int (*stream_sync)(void*) = nullptr;
  int (*htod)(std::uint64_t, const void*, std::size_t, void*) = nullptr;
  int (*reg)(void*, std::size_t, unsigned) = nullptr;
  int (*unreg)(void*) = nullptr;
};

/// The file mapped read-only, every page touched (warm and faulted in), unmapped at the end.
struct Mapping {
  explicit Mapping(const std::filesystem::path& path) : size(std::filesystem::file_size(path)) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    span = (size + page - 1) / page * page;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    void* p = fd < 0 ? MAP_FAILED : ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) ::close(fd);
    if (p == MAP_FAILED) throw std::runtime_error("cannot map " + path.string());
    data = static_cast<const std::byte*>(p);
    volatile std::uint8_t sink = 0;
    for (std::size_t i = 0; i < size; i += page) sink = sink + static_cast<std::uint8_t>(data[i]);
  }
  ~Mapping() { ::munmap(const_cast<std::byte*>(data), span); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::size_t size = 0, span = 0;
  const std::byte* data = nullptr;
};

/// Pinned host memory, freed at the end.
struct PinnedBuffer {
  PinnedBuffer(Driver& d, std::size_t n) : drv(d), bytes(n) {
    if (drv.host_alloc(&p, n, 0) != 0) throw std::runtime_error("cuMemHostAlloc failed");
    std::memset(p, 1, n);
  }
  ~PinnedBuffer() { drv.free_host(p); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  Driver& drv;
  std::size_t bytes;
  void* p = nullptr;
};

// ---- loads -------------------------------------------------------------------------------------

struct Variant {
  std::string name;
  std::vector<std::pair<const char*, const char*>> env;  // set while its uploader is made
  safetensors::Backend backend = safetensors::Backend::Mmap;
  unsigned readers = 0;  // 0: the default
};

inline std::vector<Variant> variants() {
  using safetensors::Backend;
  return {
      {"whole chunks (before)",
       {{"SAFETENSORS_UPLOAD_STRIPE", "0"}, {"SAFETENSORS_ZERO_COPY", "0"}},
       Backend::Mmap,
       0},
      {"default (2 MiB stripes)", {{"SAFETENSORS_ZERO_COPY", "0"}}, Backend::Mmap, 0},
      {"read backend", {{"SAFETENSORS_ZERO_COPY", "0"}}, Backend::Read, 0},
      {"zero-copy alone", {{"SAFETENSORS_ZERO_COPY", "1"}}, Backend::Mmap, 1},
      {"hybrid", {{"SAFETENSORS_ZERO_COPY", "1"}}, Backend::Mmap, 0},
  };
}

/// An uploader made for `v` (its environment set meanwhile), plus `extra` variables.
inline std::unique_ptr<safetensors::cuda::Uploader> uploader_for(
    const Variant& v, const std::vector<std::pair<const char*, const char*>>& extra = {}) {
  std::vector<std::unique_ptr<Env>> set;
  for (const auto& [k, val] : v.env) set.push_back(std::make_unique<Env>(k, val));
  for (const auto& [k, val] : extra) set.push_back(std::make_unique<Env>(k, val));
  safetensors::cuda::UploadOptions o;
  if (v.readers) {
    o.readers = v.readers;
    o.staging_slots = v.readers + 4;
  }
  return std::make_unique<safetensors::cuda::Uploader>(0, o);
}

inline std::string json_number(double v) {
  std::ostringstream o;
  o.precision(6);
  o << (std::isfinite(v) ? v : 0.0);
  return o.str();
}

/// The loads, interleaved round by round: (name, runs in seconds).
inline std::string loads(const std::filesystem::path& path, int runs, std::vector<std::string>& lines) {
  namespace cuda = safetensors::cuda;
  const std::size_t size = std::filesystem::file_size(path);
  auto vs = variants();
  std::vector<std::unique_ptr<cuda::Uploader>> ups;
  for (const auto& v : vs) ups.push_back(uploader_for(v));
  std::vector<std::vector<double>> times(vs.size());
  std::vector<double> pinned;
  (void)cuda::pinned_copy_seconds(size);
  for (std::size_t i = 0; i < vs.size(); ++i)
    (void)ups[i]->load(safetensors::SafeOpen(path, {vs[i].backend}));
  for (int r = 0; r < runs; ++r) {
    pinned.push_back(cuda::pinned_copy_seconds(size));
    for (std::size_t i = 0; i < vs.size(); ++i) {
      std::optional<cuda::DeviceTensors> t;
      const auto t0 = ProbeClock::now();
      t = ups[i]->load(safetensors::SafeOpen(path, {vs[i].backend}));
      times[i].push_back(since(t0));
    }
  }
  const double p = median_of(pinned);
  std::ostringstream json;
  json << "[{\"variant\":\"pinned H2D\",\"median_s\":" << json_number(p) << "}";
  char line[200];
  std::snprintf(line, sizeof line, "  %-26s %9.3f ms  %6.2f GB/s", "pinned H2D", p * 1e3,
                static_cast<double>(size) / p / 1e9);
  lines.emplace_back(line);
  for (std::size_t i = 0; i < vs.size(); ++i) {
    const double m = median_of(times[i]);
    json << ",{\"variant\":\"" << vs[i].name << "\",\"median_s\":" << json_number(m)
         << ",\"of_pinned\":" << json_number(p / m) << ",\"runs_s\":[";
    for (std::size_t k = 0; k < times[i].size(); ++k) json << (k ? "," : "") << json_number(times[i][k]);
    json << "]}";
    std::snprintf(line, sizeof line, "  %-26s %9.3f ms  %6.2f GB/s  %.2fx of pinned", vs[i].name.c_str(),
                  m * 1e3, static_cast<double>(size) / m / 1e9, p / m);
    lines.emplace_back(line);
  }
  json << "]";
  return json.str();
}

/// The number after `"key":` in `text` (0 when absent).
inline double field(const std::string& text, const std::string& key) {
  auto at = text.find("\"" + key + "\":");
  return at == std::string::npos ? 0.0 : std::strtod(text.c_str() + at + key.size() + 3, nullptr);
}

/// One traced load per variant: its summary.
inline std::string traces(const std::filesystem::path& path, std::vector<std::string>& lines) {
  namespace cuda = safetensors::cuda;
  std::ostringstream json;
  json << "[";
  bool first = true;
  for (const auto& v : variants()) {
    char name[] = "/tmp/safetensors-probe-trace-XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd < 0) continue;
    ::close(fd);
    {
      auto up = uploader_for(v, {{"SAFETENSORS_UPLOAD_TRACE", name}});
      for (int i = 0; i < 2; ++i) (void)up->load(safetensors::SafeOpen(path, {v.backend}));
    }
    std::ifstream in(name);
    std::string line, last;
    while (std::getline(in, line)) last = line;
    std::filesystem::remove(name);
    const auto at = last.find("\"summary\":");
    if (at == std::string::npos) {
      json << (first ? "" : ",") << "{\"variant\":\"" << v.name << "\",\"skipped\":\"no trace written\"}";
      first = false;
      lines.push_back("  trace " + v.name + ": no trace written");
      continue;
    }
    const auto summary = last.substr(at);
    json << (first ? "" : ",") << "{\"variant\":\"" << v.name << "\"";
    for (const char* k : {"link_busy", "first_copy_ms", "drain_ms", "fill_gbps", "alloc_ms", "total_ms"})
      json << ",\"" << k << "\":" << json_number(field(summary, k));
    json << ",\"zero_copy_chunks\":" << field(summary, "zero_copy_chunks") << "}";
    first = false;
    char out[240];
    std::snprintf(
        out, sizeof out,
        "  trace %-24s link busy %.2f, first copy %.2f ms, drain %.2f ms, fill %.1f GB/s, alloc %.2f ms, "
        "%.0f zero-copy chunks",
        v.name.c_str(), field(summary, "link_busy"), field(summary, "first_copy_ms"),
        field(summary, "drain_ms"), field(summary, "fill_gbps"), field(summary, "alloc_ms"),
        field(summary, "zero_copy_chunks"));
    lines.emplace_back(out);
  }
  json << "]";
  return json.str();
}

// ---- contention: host copies and DMA at once -----------------------------------------------------

/// Runs `copiers` threads copying the mapping into pinned buffers and, with `dma`, a thread
/// looping pinned host-to-device copies, for `seconds`: (host GB/s, DMA GB/s).
inline std::pair<double, double> contend(Driver& drv, const Mapping& m, unsigned copiers, bool dma,
                                         double seconds) {
  constexpr std::size_t kPiece = 16u << 20, kDma = 64u << 20;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> host_bytes{0}, dma_bytes{0};
  std::vector<std::unique_ptr<PinnedBuffer>> bufs;
  for (unsigned i = 0; i < copiers; ++i) bufs.push_back(std::make_unique<PinnedBuffer>(drv, kPiece));
  std::unique_ptr<PinnedBuffer> src;
  std::uint64_t dst = 0;
  void* stream = nullptr;
  if (dma) {
    src = std::make_unique<PinnedBuffer>(drv, kDma);
    if (drv.alloc(&dst, kDma) != 0 || drv.stream_create(&stream, 1) != 0)
      throw std::runtime_error("cuMemAlloc");
  }
  std::vector<std::thread> threads;
  const auto t0 = ProbeClock::now();
  for (unsigned i = 0; i < copiers; ++i) {
    threads.emplace_back([&, i] {
      std::size_t at = (m.size / copiers * i) / kPiece * kPiece;
      while (!stop) {
        if (at >= m.size) at = 0;
        const std::size_t n = std::min(kPiece, m.size - at);
        std::memcpy(bufs[i]->p, m.data + at, n);
        host_bytes += n;
        at += n;
      }
    });
  }
  if (dma) {
    threads.emplace_back([&] {
      drv.enter();
      while (!stop) {
        drv.htod(dst, src->p, kDma, stream);
        drv.stream_sync(stream);
        dma_bytes += kDma;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double took = since(t0);
  if (dma) {
    drv.stream_destroy(stream);
    drv.free_(dst);
  }
  return {static_cast<double>(host_bytes) / took / 1e9, static_cast<double>(dma_bytes) / took / 1e9};
}

inline std::string contention(Driver& drv, const Mapping& m, double seconds,
                              std::vector<std::string>& lines) {
  std::ostringstream json;
  const double dma_alone = contend(drv, m, 0, true, seconds).second;
  json << "{\"dma_alone_gbps\":" << json_number(dma_alone);
  char line[200];
  std::snprintf(line, sizeof line, "  contention: pinned H2D loop alone %.1f GB/s", dma_alone);
  lines.emplace_back(line);
  for (unsigned n : {8u, 16u}) {
    const double alone = contend(drv, m, n, false, seconds).first;
    const auto [host, dma] = contend(drv, m, n, true, seconds);
    json << ",\"host_" << n << "_alone_gbps\":" << json_number(alone) << ",\"host_" << n
         << "_with_dma_gbps\":" << json_number(host) << ",\"dma_with_host_" << n
         << "_gbps\":" << json_number(dma);
    std::snprintf(
        line, sizeof line,
        "  contention: host copy, %2u threads: %.1f GB/s alone, %.1f GB/s beside the H2D loop (which "
        "then ran at %.1f GB/s)",
        n, alone, host, dma);
    lines.emplace_back(line);
  }
  json << "}";
  return json.str();
}

// ---- the ring sweep --------------------------------------------------------------------------------

inline std::string sweep(const std::filesystem::path& path, int runs, std::vector<std::string>& lines) {
  namespace cuda = safetensors::cuda;
  using safetensors::Backend;
  const std::size_t size = std::filesystem::file_size(path);
  Env no_zero_copy("SAFETENSORS_ZERO_COPY", "0");
  std::ostringstream json;
  json << "[";
  bool first = true;
  for (Backend b : {Backend::Mmap, Backend::Read}) {
    for (unsigned readers : {8u, 16u}) {
      for (std::size_t slot : {std::size_t{2} << 20, std::size_t{4} << 20, std::size_t{16} << 20}) {
        cuda::Uploader up(0, {.staging_slots = readers + 4, .slot_bytes = slot, .readers = readers});
        (void)up.load(safetensors::SafeOpen(path, {b}));
        std::vector<double> t;
        for (int r = 0; r < runs; ++r) {
          std::optional<cuda::DeviceTensors> d;
          const auto t0 = ProbeClock::now();
          d = up.load(safetensors::SafeOpen(path, {b}));
          t.push_back(since(t0));
        }
        const double m = median_of(t);
        const char* backend = b == Backend::Mmap ? "mmap" : "read";
        json << (first ? "" : ",") << "{\"backend\":\"" << backend << "\",\"readers\":" << readers
             << ",\"slot_bytes\":" << slot << ",\"median_s\":" << json_number(m) << "}";
        first = false;
        char line[200];
        std::snprintf(line, sizeof line, "  sweep %s, %2u readers, %2zu MiB slots: %9.3f ms  %6.2f GB/s",
                      backend, readers, slot >> 20, m * 1e3, static_cast<double>(size) / m / 1e9);
        lines.emplace_back(line);
      }
    }
  }
  json << "]";
  return json.str();
}

// ---- registration ------------------------------------------------------------------------------------

/// Registers and unregisters the mapping in `chunk`-byte pieces on `threads` threads: seconds,
/// or a negative CUresult when the driver refused.
inline double register_pass(Driver& drv, const Mapping& m, std::size_t chunk, unsigned threads) {
  constexpr unsigned kReadOnly = 0x08;
  std::atomic<std::size_t> next{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> ts;
  const auto t0 = ProbeClock::now();
  for (unsigned i = 0; i < threads; ++i) {
    ts.emplace_back([&] {
      drv.enter();
      for (;;) {
        const std::size_t at = next.fetch_add(chunk);
        if (at >= m.span) return;
        void* p = const_cast<std::byte*>(m.data) + at;
        const std::size_t n = std::min(chunk, m.span - at);
        if (int rc = drv.reg(p, n, kReadOnly); rc != 0) {
          failed = rc;
          return;
        }
        drv.unreg(p);
      }
    });
  }
  for (auto& t : ts) t.join();
  return failed ? -failed : since(t0);
}

/// The longest time one 1 MiB cuMemcpyHtoDAsync call took (ms) while `busy` runs beside.
inline double longest_submission(Driver& drv, const std::function<void()>& busy) {
  constexpr std::size_t kCopy = 1u << 20;
  PinnedBuffer src(drv, kCopy);
  std::uint64_t dst = 0;
  void* stream = nullptr;
  if (drv.alloc(&dst, kCopy) != 0 || drv.stream_create(&stream, 1) != 0) return -1;
  std::atomic<bool> stop{false};
  double longest = 0;
  std::thread loop([&] {
    drv.enter();
    for (int i = 0; !stop; ++i) {
      const auto t0 = ProbeClock::now();
      drv.htod(dst, src.p, kCopy, stream);
      longest = std::max(longest, since(t0));
      if (i % 16 == 15) drv.stream_sync(stream);
    }
    drv.stream_sync(stream);
  });
  busy();
  stop = true;
  loop.join();
  drv.stream_destroy(stream);
  drv.free_(dst);
  return longest * 1e3;
}

inline std::string registration(Driver& drv, const Mapping& m, std::vector<std::string>& lines) {
  std::ostringstream json;
  json << "{\"passes\":[";
  bool first = true;
  char line[200];
  for (std::size_t chunk : {std::size_t{16} << 20, std::size_t{64} << 20, std::size_t{256} << 20}) {
    for (unsigned threads : {1u, 2u, 4u}) {
      const double s = register_pass(drv, m, chunk, threads);
      json << (first ? "" : ",") << "{\"chunk_bytes\":" << chunk << ",\"threads\":" << threads;
      if (s < 0) {
        json << ",\"refused\":" << -s << "}";
        std::snprintf(line, sizeof line, "  register %3zu MiB chunks, %u threads: refused (CUresult %.0f)",
                      chunk >> 20, threads, -s);
      } else {
        json << ",\"seconds\":" << json_number(s)
             << ",\"gbps\":" << json_number(static_cast<double>(m.size) / s / 1e9) << "}";
        std::snprintf(line, sizeof line,
                      "  register %3zu MiB chunks, %u threads: %.1f GB/s (register + unregister)",
                      chunk >> 20, threads, static_cast<double>(m.size) / s / 1e9);
      }
      first = false;
      lines.emplace_back(line);
    }
  }
  const double quiet =
      longest_submission(drv, [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
  const double busy = longest_submission(drv, [&] { (void)register_pass(drv, m, std::size_t{64} << 20, 1); });
  json << "],\"longest_submission_ms_alone\":" << json_number(quiet)
       << ",\"longest_submission_ms_while_registering\":" << json_number(busy) << "}";
  std::snprintf(
      line, sizeof line,
      "  register: the longest 1 MiB copy submission took %.2f ms while 64 MiB chunks were registered "
      "(%.2f ms alone)",
      busy, quiet);
  lines.emplace_back(line);
  return json.str();
}

/// The whole probe of one file: JSON (an object), and its lines printed.
inline std::string run(const std::filesystem::path& path, int runs) {
  namespace cuda = safetensors::cuda;
  if (!cuda::available()) return "{\"skipped\":\"no usable GPU: " + cuda::why_unavailable() + "\"}";
  Driver drv;
  std::vector<std::string> lines;
  std::ostringstream json;
  json << "{\"emulated\":" << (drv.emulated ? "true" : "false");
  auto part = [&](const char* name, const std::function<std::string()>& f) {
    const auto t0 = ProbeClock::now();
    try {
      json << ",\"" << name << "\":" << f();
    } catch (const std::exception& e) {
      std::string why = e.what();
      std::replace(why.begin(), why.end(), '"', '\'');
      json << ",\"" << name << "\":{\"skipped\":\"" << why << "\"}";
      lines.push_back(std::string("  ") + name + " skipped: " + why);
    }
    json << ",\"" << name << "_seconds\":" << json_number(since(t0));
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
    std::fflush(stdout);
    lines.clear();
  };
  part("loads", [&] { return loads(path, runs, lines); });
  part("trace", [&] { return traces(path, lines); });
  if (drv.ok()) {
    drv.enter();
    Mapping m(path);
    part("contention", [&] { return contention(drv, m, drv.emulated ? 0.2 : 1.0, lines); });
    part("register", [&] { return registration(drv, m, lines); });
  } else {
    json << ",\"contention\":{\"skipped\":\"the driver lacks " << drv.missing << "\"}";
  }
  part("sweep", [&] { return sweep(path, std::min(runs, 3), lines); });
  json << "}";
  return json.str();
}

}  // namespace gpu_probe
