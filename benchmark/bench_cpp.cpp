// bench_cpp: what loading, slicing and saving safetensors files costs from C++, through the
// public API only, next to what the machine's own limits are for the same bytes.
//
//   bench_cpp [--runs N] [--items open,load,load_copy,slice,save,gpu] [--json OUT] FILE...
//   bench_cpp --cold [--runs N] [--items disk,mmap,read,direct,prefetch,stream] [--json OUT] FILE...
//   bench_cpp [--items open,load,load_copy,gpu] [--cold] [--json OUT] MODEL... ITERATIONS
//
// Work items (bench.py measures the same ones with Python's safetensors):
//   open       open the file, list keys, take every tensor's shape (no data touched)
//   load       every byte of every tensor read (a checksum through the mapping): the honest
//              "load" of a zero-copy loader; limit: one plain read() of the file into memory
//              that is already mapped
//   load_copy  every tensor copied into memory the program owns (read backend: pread into new
//              buffers); compare with Python's load_file, which does the same
//   slice      a column slice (first half of the columns) of every 2-D tensor, copied out
//   save       the file's tensors written to a new file with save_file (synced); limit: a raw
//              sequential write() of the same bytes, synced
//   save_nosync  the same with SaveOptions{.sync = false}, like Python's save_file; limit: the
//              raw write() unsynced
//   gpu        every tensor copied to cuda:0, synchronized, through a reused Uploader, the file
//              opened inside the timed body; `gpu one-shot` the same through cuda::load (when
//              built with CUDA and a GPU exists). Device frees stay outside the timing.
//   ranks      only when asked for: the multi-rank device load, 2 and 4 threads as ranks on
//              cuda:0, via the host and via a device broadcast, every 2-D+ tensor split along
//              dimension 0 and vectors replicated (bench_ranks.hpp), beside the single-rank
//              `gpu` load of the same file
//   convert    not per file, and only when asked for (--items convert, no FILE needed): each
//              dtype to F32 and F32 to BF16/F16/F8_E4M3 on 64 Mi elements (bench_convert.hpp)
// A FILE that is a checkpoint index (`.json`: make_bench_files' moe-deepseek-v3) gets the items
// of a checkpoint, named by its directory, taking turns run by run:
//   open       Checkpoint open, keys(), every tensor's info (its shard opened on first use);
//              bench.py: json.load of the index, then per shard safe_open, keys, get_shape
//   load       every tensor's bytes copied into one buffer by range-for over the checkpoint;
//              limit: one read() of every shard file into the same buffer
//   plan_ep    a LoadPlan for expert parallelism over 8 ranks (each rank its own experts,
//              every rank every other tensor): the selections made and the plan built
//   plan_tp    a LoadPlan for tensor parallelism over 8 ranks (every 2-D tensor split by rows
//              where it has a row per rank, the rest replicated)
//   plan_upload  the upload plan of every tensor (cuda::plan: where each lands on the device;
//              no GPU needed)
// Limits also measured: read() into fresh memory (what any copy into new memory pays for page
// faults), the same into fresh memory that asked for huge pages (what an owned copy on one
// thread can reach: the kernel still zeroes each page), and one memcpy of the file's size.
// open, load and load_copy are the loads that `safetensors bench` times too (cpp/measure.hpp).
//
// Cold items (cold.hpp), the default with --cold: each a full read of the file with its page
// cache dropped first, next to the disk's own rate measured in the same run:
//   disk       the disk's sequential read rate: fio, direct I/O, 16 MiB requests, the faster of
//              one job at queue depth 8 and 4 jobs at depth 16 each over a quarter of the file
//              (dd iflag=direct x 4 in parallel where fio is missing)
//   mmap, read, direct   every tensor read in file order with that backend
//   prefetch   safetensors::prefetch of the whole file, then every tensor through the mapping
//   stream     every tensor delivered by a TensorStream (direct backend, 256 MiB bound)
// The items take turns run by run, so that a disk whose speed drifts affects them alike;
// medians, the spread (min-max) and each item's rate as a fraction of the disk's are printed
// and written to the JSON.
//
// Medians of --runs runs (default 7; 3 for files over 2 GB; 5 with --cold; the open item at
// least 201), after one warm-up run (none for the cold items). With a number ITERATIONS after
// the files instead (the seed README's `bench_cpp MODEL ITERATIONS`): the time per iteration of
// each load over ITERATIONS iterations, the first one included, as in its table of 1, 10 and 100
// iterations. The page cache is warm (see measure::warm) unless --cold (needs root), which
// drops it before every run. A bad argument or a missing file is a usage message and exit code
// 2; a file that is not valid safetensors, exit code 1.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "bench_convert.hpp"
#include "bench_ranks.hpp"
#include "checked_output.hpp"
#include "cold.hpp"
#include "gpu/probe.hpp"
#include "limits.hpp"
#include "peer_syoyo.hpp"

namespace {

namespace fs = std::filesystem;
using safetensors::Backend;
using safetensors::Index;
using safetensors::SafeOpen;
using safetensors::TensorView;

constexpr const char* kUsage =
    "usage: bench_cpp [--runs N] [--items open,load,load_copy,slice,save,gpu,convert,ring,peer,ranks] "
    "[--cold] "
    "[--json "
    "OUT] "
    "FILE...\n"
    "       bench_cpp --cold [--runs N] [--items disk,mmap,read,direct,prefetch,stream] [--json OUT] "
    "FILE...\n"
    "       bench_cpp [--items open,load,load_copy,gpu] [--cold] [--json OUT] MODEL... ITERATIONS\n"
    "  The first form prints medians of N runs (default 7; 3 for files over 2 GB) next to the\n"
    "  machine's limits for the same bytes; the second, cold full reads (with each backend, after\n"
    "  a prefetch, streamed) next to the disk's own rate (fio, else dd), 5 runs by default; the\n"
    "  third, the time per iteration of each load over ITERATIONS iterations (the first one\n"
    "  included). --cold drops the page cache before every run (needs root). A file named like a\n"
    "  number is given as ./10. `peer` times syoyo/safetensors-cpp's open, load and load_copy when\n"
    "  bench_cpp was built with a checkout of it (CMake SAFETENSORS_SYOYO_DIR); it is a default item\n"
    "  then.\n";

const std::set<std::string> kColdItems{"disk", "mmap", "read", "direct", "prefetch", "stream"};
const std::set<std::string> kAllItems = [] {
  std::set<std::string> all{"open",    "load", "load_copy", "slice", "save", "gpu",
                            "convert", "ring", "peer",      "ranks", "plans"};
  all.insert(kColdItems.begin(), kColdItems.end());
  return all;
}();
/// Runs of the open item at least (bench.py's OPEN_RUNS is the same).
constexpr int kOpenRuns = 201;

const std::set<std::string> kIterationItems{"open", "load", "load_copy", "gpu"};

struct Options {
  int runs = 0;        // 0: the default for the file's size
  int iterations = 0;  // > 0: the MODEL ITERATIONS form
  bool cold = false;
  bool help = false;
  std::set<std::string> items;
  bool items_given = false;  // --items named them (else the defaults)
  std::string json;
  std::vector<fs::path> files;
};

struct Result {
  std::string item;
  std::vector<double> runs;
  std::size_t bytes = 0;  // bytes moved per run, for GB/s
  std::string skipped;    // non-empty: why the item did not run
};

std::uint64_t sink = 0;  // keeps results observable so nothing is optimized away

/// One of the loads shared with `safetensors bench` (cpp/measure.hpp), timed `runs` times.
Result load_result(measure::LoadItem::Kind kind, const std::filesystem::path& path, int runs,
                   const std::function<void()>& setup) {
  measure::LoadItem item(kind, path);
  bool reads_data = kind != measure::LoadItem::Kind::Open;
  Result r{std::string(item.name()),
           measure::repeat(runs, item, setup),
           reads_data ? std::filesystem::file_size(path) : 0,
           {}};
  sink += item.sink();
  return r;
}

Result slice_item(const std::filesystem::path& path, int runs, const std::function<void()>& setup) {
  Result r{"slice", {}, 0, {}};
  {
    SafeOpen f(path);
    for (const auto& k : f.keys()) {
      auto info = f.info(k);
      if (info.shape.size() == 2) r.bytes += info.byte_size() / info.shape[1] * (info.shape[1] / 2);
    }
  }
  std::vector<TensorView> kept;
  r.runs = measure::repeat(
      runs,
      [&] {
        SafeOpen f(path);
        kept.clear();
        for (const auto& k : f.keys()) {
          auto s = f.get_slice(k);
          if (s.shape().size() != 2) continue;
          kept.push_back(
              s.select({Index::all(), Index::range(0, static_cast<std::int64_t>(s.shape()[1] / 2))}).read());
        }
        sink += kept.size();
      },
      [&] {
        kept.clear();
        setup();
      });
  return r;
}

Result save_item(const std::filesystem::path& path, int runs, const std::function<void()>& setup, bool sync) {
  Result r{sync ? "save" : "save_nosync", {}, std::filesystem::file_size(path), {}};
  SafeOpen f(path);
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const auto& k : f.keys()) tensors.emplace_back(k, f.get_tensor(k));
  auto out = path.parent_path() / ".bench-save.safetensors";
  r.runs = measure::repeat(
      runs, [&] { safetensors::save_file(out, tensors, f.metadata(), {sync}); },
      [&] {
        std::filesystem::remove(out);
        setup();
      });
  std::filesystem::remove(out);
  return r;
}

/// Anonymous resident memory of this process (what it holds beyond the page cache), in bytes.
std::size_t rss_anon() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoul(line.substr(8)) * 1024;
  }
  return 0;
}

/// `threads` threads copying the file's bytes, mapped once (the page cache as `setup` leaves
/// it), each its contiguous share in 16 MiB pieces into a buffer of its own touched beforehand:
/// what the host can put into staging slots per second, with no GPU.
std::vector<double> parallel_copy(const std::filesystem::path& path, unsigned threads, int runs,
                                  const std::function<void()>& setup) {
  constexpr std::size_t kPiece = 16u << 20;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  const std::size_t size = std::filesystem::file_size(path);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw std::runtime_error("cannot map " + path.string());
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(map), size);
  struct Unmap {
    void* p;
    std::size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  std::vector<std::vector<std::byte>> slots(threads, std::vector<std::byte>(kPiece, std::byte{1}));
  return measure::repeat(
      runs,
      [&] {
        std::vector<std::thread> pool;
        const std::size_t share = (bytes.size() + threads - 1) / threads;
        for (unsigned t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            const std::size_t begin = std::min(bytes.size(), t * share);
            const std::size_t end = std::min(bytes.size(), begin + share);
            for (std::size_t at = begin; at < end; at += kPiece) {
              std::memcpy(slots[t].data(), bytes.data() + at, std::min(kPiece, end - at));
            }
          });
        }
        for (auto& th : pool) th.join();
        for (auto& sl : slots) sink += static_cast<std::uint64_t>(sl[0]);
      },
      setup);
}

/// What a load without the host copy would take: the file's mapping registered with the driver
/// (`cuMemHostRegister`, read-only: the page cache's own pages, pinned where they are), one
/// host-to-device copy straight out of it, then unregistered. Measured through the driver
/// itself (not a library path): whether skipping the readers' copy pays for the registration.
/// `register_only` gets the registration and unregistration alone. Skipped where the driver
/// lacks an entry point (the emulated one) or refuses.
struct RegisteredCopy {
  Result whole{"registered mapping H2D", {}, 0, "not measured"};
  Result register_only{"register + unregister the mapping", {}, 0, "not measured"};
};

RegisteredCopy registered_copy(const std::filesystem::path& path, int runs,
                               const std::function<void()>& setup) {
  RegisteredCopy r;
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return r;
  using CtxRetain = int (*)(void**, int);
  using CtxSet = int (*)(void*);
  using CtxGet = int (*)(void**);
  using Alloc = int (*)(std::uint64_t*, std::size_t);
  using Free = int (*)(std::uint64_t);
  using Register = int (*)(void*, std::size_t, unsigned);
  using Unregister = int (*)(void*);
  using HtoD = int (*)(std::uint64_t, const void*, std::size_t);
  auto sym = [&](const char* name) { return ::dlsym(lib, name); };
  auto retain = reinterpret_cast<CtxRetain>(sym("cuDevicePrimaryCtxRetain"));
  auto set = reinterpret_cast<CtxSet>(sym("cuCtxSetCurrent"));
  auto get = reinterpret_cast<CtxGet>(sym("cuCtxGetCurrent"));
  auto alloc = reinterpret_cast<Alloc>(sym("cuMemAlloc_v2"));
  auto free_ = reinterpret_cast<Free>(sym("cuMemFree_v2"));
  auto reg = reinterpret_cast<Register>(sym("cuMemHostRegister_v2"));
  auto unreg = reinterpret_cast<Unregister>(sym("cuMemHostUnregister"));
  auto htod = reinterpret_cast<HtoD>(sym("cuMemcpyHtoD_v2"));
  if (!retain || !set || !get || !alloc || !free_ || !reg || !unreg || !htod) {
    r.whole.skipped = r.register_only.skipped = "the driver lacks cuMemHostRegister or a call it needs";
    return r;
  }
  void* previous = nullptr;
  void* ctx = nullptr;
  if (get(&previous) != 0 || retain(&ctx, 0) != 0 || set(ctx) != 0) {
    r.whole.skipped = r.register_only.skipped = "no context on device 0";
    return r;
  }
  const std::size_t size = std::filesystem::file_size(path);
  std::uint64_t dst = 0;
  if (alloc(&dst, size) == 0) {
    constexpr unsigned kReadOnly = 0x08;  // CU_MEMHOSTREGISTER_READ_ONLY
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t span = (size + page - 1) / page * page;
    int failed = 0;
    auto once = [&](bool copy) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      void* map = fd < 0 ? MAP_FAILED : ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, 0);
      if (fd >= 0) ::close(fd);
      if (map == MAP_FAILED) {
        failed = -1;
        return;
      }
      if (int rc = reg(map, span, kReadOnly); rc != 0) {
        failed = rc;
      } else {
        if (copy && htod(dst, map, size) != 0) failed = -2;
        unreg(map);
      }
      ::munmap(map, span);
    };
    std::vector<double> whole = measure::repeat(
        runs, [&] { once(true); }, setup);
    std::vector<double> only = measure::repeat(
        runs, [&] { once(false); }, setup);
    if (failed != 0) {
      r.whole.skipped = r.register_only.skipped =
          "the driver refused (CUresult " + std::to_string(failed) + ")";
    } else {
      r.whole = {r.whole.item, std::move(whole), size, {}};
      r.register_only = {r.register_only.item, std::move(only), size, {}};
    }
    free_(dst);
  } else {
    r.whole.skipped = r.register_only.skipped = "cuMemAlloc failed";
  }
  set(previous);
  return r;
}

/// The `gpu` items of one file and what they are compared with.
struct GpuResults {
  Result gpu;
  Result one_shot{"gpu one-shot", {}, 0, "no GPU"};
  // The same load with the read or direct backend, and with the file opened once, outside the
  // timed body (its mapping's page faults paid once): which part of the host side costs what.
  Result read_backend{"gpu (read backend)", {}, 0, "no GPU"};
  Result direct_backend{"gpu (direct backend)", {}, 0, "no GPU"};
  Result kept_open{"gpu (file kept open)", {}, 0, "no GPU"};
  Result every_core{"gpu (a reader per core)", {}, 0, "no GPU"};
  Result pinned{"pinned H2D", {}, 0, "no GPU"};
  // The host side's own limit: as many threads as the ring has readers by default (half the
  // cores, at most 8), and as the machine has cores, copying the file's mapped bytes, page cache warm, into
  // 16 MiB buffers of their own, as the readers fill staging slots; no GPU involved.
  Result host_copy{"host copy, ring's readers", {}, 0, "no GPU"};
  Result host_copy_all{"host copy, every core", {}, 0, "no GPU"};
  RegisteredCopy registered;
  std::size_t host_extra = 0;  // host memory the upload added (RssAnon), in bytes
};

/// Every tensor of the file into one device allocation, complete, through a reused `Uploader`
/// (`gpu`) and through the one-shot `cuda::load` (`gpu one-shot`, the process's shared
/// uploader); and the limit for the same bytes, one copy from pinned host memory. The file is
/// opened inside the timed body, as Python's `load_file` does (so each run pays its page faults,
/// and `--cold` can evict what no live mapping holds); the device memory is freed outside it,
/// before the next run. Also reports the host memory the upload adds.
GpuResults gpu_item(const std::filesystem::path& path, int runs, const std::function<void()>& setup) {
  namespace cuda = safetensors::cuda;
  if (!cuda::available()) {
    GpuResults none;
    none.gpu = {"gpu", {}, 0, "no usable GPU: " + cuda::why_unavailable()};
    return none;
  }
  std::size_t size = std::filesystem::file_size(path);
  GpuResults g;
  g.gpu = {"gpu", {}, size, {}};
  std::size_t before = rss_anon();
  std::optional<cuda::DeviceTensors> loaded;  // freed by the untimed setup of the next run
  auto free_then = [&] {
    loaded.reset();
    setup();
  };
  {
    cuda::Uploader up(0);
    g.gpu.runs = measure::repeat(
        runs, [&] { loaded = up.load(SafeOpen(path)); }, free_then);
    loaded.reset();
  }
  g.one_shot = {"gpu one-shot",
                measure::repeat(
                    runs, [&] { loaded = cuda::load(SafeOpen(path)); }, free_then),
                size,
                {}};
  loaded.reset();
  g.host_extra = rss_anon() - std::min(before, rss_anon());
  auto variant = [&](Result& r, auto&& load) {
    try {
      r = {r.item, measure::repeat(runs, load, free_then), size, {}};
    } catch (const safetensors::Error& e) {
      r.skipped = e.what();
    }
    loaded.reset();
  };
  {
    cuda::Uploader up(0);
    variant(g.read_backend, [&] { loaded = up.load(SafeOpen(path, {safetensors::Backend::Read})); });
    variant(g.direct_backend, [&] { loaded = up.load(SafeOpen(path, {safetensors::Backend::Direct})); });
    SafeOpen kept(path);
    variant(g.kept_open, [&] { loaded = up.load(kept); });
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  {
    cuda::Uploader up(0, {.readers = cores});
    variant(g.every_core, [&] { loaded = up.load(SafeOpen(path)); });
  }
  const unsigned readers = std::clamp(cores / 2, 1u, 8u);  // the ring's default (cuda.hpp)
  g.host_copy = {g.host_copy.item, parallel_copy(path, readers, runs, setup), size, {}};
  g.host_copy_all = {g.host_copy_all.item, parallel_copy(path, cores, runs, setup), size, {}};
  g.registered = registered_copy(path, runs, setup);
  // pinned_copy_seconds times the copy itself, not the allocation around it.
  g.pinned = {"pinned H2D", {}, size, {}};
  (void)cuda::pinned_copy_seconds(size);
  for (int i = 0; i < runs; ++i) g.pinned.runs.push_back(cuda::pinned_copy_seconds(size));
  return g;
}

/// `gpu` for ITERATIONS: `iterations` uploads through one `Uploader`, the first one included.
Result gpu_iterations(const std::filesystem::path& path, int iterations, const std::function<void()>& setup) {
  namespace cuda = safetensors::cuda;
  if (!cuda::available()) return {"gpu", {}, 0, "no usable GPU: " + cuda::why_unavailable()};
  cuda::Uploader up(0);
  std::optional<cuda::DeviceTensors> loaded;
  auto runs = measure::timings(
      iterations, [&] { loaded = up.load(SafeOpen(path)); },
      [&] {
        loaded.reset();
        setup();
      });
  return {"gpu", std::move(runs), std::filesystem::file_size(path), {}};
}

struct Limits {
  Result read, read_fresh, read_fresh_huge, memcpy, write_sync, write_nosync;
};

Limits limits(const std::filesystem::path& path, int runs, bool want_write,
              const std::function<void()>& setup) {
  Limits l;
  std::size_t size = std::filesystem::file_size(path);
  measure::MappedBuffer target(size);
  l.read = {"read()",
            measure::repeat(
                runs, [&] { measure::read_whole_file(path, target.data, size); }, setup),
            size,
            {}};
  l.read_fresh = {
      "read() into new memory",
      measure::repeat(
          runs, [&] { measure::read_whole_file(path, measure::fresh_buffer(size).get(), size); }, setup),
      size,
      {}};
  // Kept past its run, as a load keeps what it read: unmapping it is not part of the read.
  std::unique_ptr<measure::MappedBuffer> huge;
  l.read_fresh_huge = {"read() into new huge pages",
                       measure::repeat(
                           runs,
                           [&] {
                             huge = std::make_unique<measure::MappedBuffer>(size,
                                                                            measure::MappedBuffer::FreshHuge);
                             measure::read_whole_file(path, huge->data, size);
                           },
                           [&] {
                             huge.reset();
                             setup();
                           }),
                       size,
                       {}};
  huge.reset();
  measure::MemcpyLimit copy(size);
  l.memcpy = {"memcpy", measure::repeat(runs, [&] { copy.run(); }), size, {}};
  if (want_write) {
    std::vector<std::byte> bytes(size, std::byte{3});
    auto dir = path.parent_path();
    auto remove = [&] { std::filesystem::remove(measure::raw_write_path(dir)); };
    l.write_sync = {"write()+fsync",
                    measure::repeat(
                        runs, [&] { measure::write_file(dir, bytes, true); }, remove),
                    size,
                    {}};
    l.write_nosync = {"write()",
                      measure::repeat(
                          runs, [&] { measure::write_file(dir, bytes, false); }, remove),
                      size,
                      {}};
    remove();
  }
  return l;
}

/// One item in the JSON report: its median, or with `per_iteration` its time per iteration.
std::string json_result(const Result& r, bool per_iteration = false) {
  std::ostringstream o;
  o << "{\"item\":\"" << r.item << "\"";
  if (!r.skipped.empty()) {
    o << ",\"skipped\":\"" << r.skipped << "\"}";
    return o.str();
  }
  if (per_iteration) o << ",\"per_iteration_s\":" << measure::mean(r.runs);
  o << ",\"median_s\":" << measure::median(r.runs);
  if (!r.runs.empty()) {
    auto [lo, hi] = std::minmax_element(r.runs.begin(), r.runs.end());
    o << ",\"min_s\":" << *lo << ",\"max_s\":" << *hi;
  }
  o << ",\"bytes\":" << r.bytes << ",\"runs_s\":[";
  for (std::size_t i = 0; i < r.runs.size(); ++i) o << (i ? "," : "") << r.runs[i];
  o << "]}";
  return o.str();
}

void print_result(const Result& r, const Result* limit) {
  if (!r.skipped.empty()) {
    std::printf("  %-14s skipped: %s\n", r.item.c_str(), r.skipped.c_str());
    return;
  }
  double m = measure::median(r.runs);
  std::printf("  %-14s %10.3f ms", r.item.c_str(), m * 1e3);
  if (r.bytes) std::printf("  %6.2f GB/s", static_cast<double>(r.bytes) / m / 1e9);
  if (limit && !limit->runs.empty()) {
    double lm = measure::median(limit->runs);
    std::printf("   vs %s %.3f ms: %.2fx of the limit", limit->item.c_str(), lm * 1e3, lm / m);
  }
  std::printf("\n");
}

// ---- the command line ----------------------------------------------------------------------

/// A command line bench_cpp cannot run: printed with the usage text, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `text` as a count from 1 to 1,000,000, or a usage error naming `what`.
int count(const std::string& text, const std::string& what) {
  int n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc{} || end != text.data() + text.size() || n < 1 || n > 1'000'000) {
    throw UsageError(what + " takes a number from 1 to 1000000, got '" + text + "'");
  }
  return n;
}

std::set<std::string> item_list(const std::string& text) {
  std::set<std::string> items;
  std::istringstream s(text);
  for (std::string it; std::getline(s, it, ',');) {
    // `probe` (gpu/probe.hpp): only when asked for, as `ranks`.
    if (!kAllItems.count(it) && it != "probe") throw UsageError("unknown item '" + it + "' in --items");
    items.insert(it);
  }
  return items;
}

bool is_number(const std::string& a) {
  return !a.empty() && std::all_of(a.begin(), a.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// Options and positional arguments as given, every value checked.
Options read_arguments(int argc, char** argv) {
  Options o;
  bool items_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--runs") {
      o.runs = count(value(), "--runs");
    } else if (a == "--cold") {
      o.cold = true;
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--items") {
      o.items = item_list(value());
      items_given = true;
      o.items_given = true;
    } else if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + a + "'");
    } else if (is_number(a)) {
      if (o.iterations) throw UsageError("ITERATIONS is given twice ('" + a + "'); name a file like ./" + a);
      o.iterations = count(a, "ITERATIONS");
    } else {
      o.files.emplace_back(a);
    }
  }
  if (!items_given) {
    o.items = o.iterations ? kIterationItems
              : o.cold     ? kColdItems
                           : std::set<std::string>{"open", "load", "load_copy", "slice", "save", "gpu"};
    if (!o.iterations && !o.cold && peer_syoyo::built()) o.items.insert("peer");
  }
  return o;
}

/// The command line, checked as a whole: every combination it runs, every file it reads present.
Options parse(int argc, char** argv) {
  Options o = read_arguments(argc, argv);
  if (o.help) return o;
  if (o.iterations) {
    if (o.runs) throw UsageError("give either --runs N or ITERATIONS, not both");
    if (o.files.empty()) throw UsageError("ITERATIONS needs a MODEL file before it");
    for (const auto& item : o.items) {
      if (!kIterationItems.count(item)) throw UsageError("item '" + item + "' is not timed per iteration");
    }
  }
  if (o.files.empty() && !o.items.count("convert")) throw UsageError("no file given");
  for (const auto& f : o.files) {
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) throw UsageError("no such file '" + f.string() + "'");
  }
  return o;
}

// ---- FILE...: medians next to the limits -------------------------------------------------------

/// Why --cold cannot run here, checked before any work: it drops the page cache, which needs root.
constexpr const char* kColdNeedsRoot =
    "--cold drops the page cache before every run (sync, then echo 3 > /proc/sys/vm/drop_caches), "
    "which needs root and a writable /proc/sys/vm/drop_caches: run it as root, or without --cold";

/// What runs before every timed run: nothing with a warm page cache (warmed once here), or
/// dropping the cache (--cold).
std::function<void()> cache_setup(const Options& opt, const fs::path& path) {
  if (!opt.cold) {
    measure::warm(path);
    return [] {};
  }
  if (!measure::drop_caches()) throw std::runtime_error(kColdNeedsRoot);
  // A drop that fails midway would time warm reads as cold ones.
  return [] {
    if (!measure::drop_caches()) throw std::runtime_error("cannot drop the page cache between runs");
  };
}

/// Every requested item of one file, each beside the limit it is compared with.
struct FileResults {
  std::vector<std::pair<Result, const Result*>> items;
  std::vector<std::pair<std::string, Result>> peer;  // (our item it matches, the peer's result)
  Limits limits;
  bool with_save = false;
  GpuResults gpu;
  std::string probe;               // the GPU probe's JSON object (gpu/probe.hpp), when it ran
  std::deque<Result> ring_limits;  // the `ring` item's limits (a deque: items point at them)
};

/// `threads` threads `pread`ing the file, each its contiguous share in 16 MiB pieces into a
/// buffer of its own touched beforehand: the host-side limit for the `ring` item.
std::vector<double> parallel_pread(const fs::path& path, unsigned threads, int runs,
                                   const std::function<void()>& setup) {
  constexpr std::size_t kPiece = 16u << 20;
  const std::size_t size = fs::file_size(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  std::vector<std::vector<std::byte>> bufs(threads, std::vector<std::byte>(kPiece, std::byte{1}));
  return measure::repeat(
      runs,
      [&] {
        std::vector<std::thread> pool;
        std::atomic<int> failed{0};  // an errno (-1: the file ended early), reported after the join
        const std::size_t share = (size + threads - 1) / threads;
        for (unsigned t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            const std::size_t begin = std::min(size, t * share);
            const std::size_t end = std::min(size, begin + share);
            for (std::size_t at = begin; at < end && failed.load() == 0;) {
              const ssize_t got =
                  ::pread(fd, bufs[t].data(), std::min(kPiece, end - at), static_cast<off_t>(at));
              if (got < 0 && errno == EINTR) continue;
              if (got <= 0) {
                failed = got < 0 ? errno : -1;
                return;
              }
              at += static_cast<std::size_t>(got);
            }
          });
        }
        for (auto& th : pool) th.join();
        if (const int e = failed.load()) {
          throw std::runtime_error(
              "pread of " + path.string() +
              " failed: " + (e < 0 ? std::string("the file ended early") : std::string(std::strerror(e))));
        }
      },
      setup);
}

/// The host side of the GPU ring alone, on the emulated driver with free copies
/// (SAFETENSORS_FAKE_CUDA_FREE_COPIES=1, latency 0: benchmark/run sets both): what the ring's
/// readers put into pinned slots per second (`Uploader::load` with `Backend::Read`, N readers),
/// against N threads `pread`ing the same file into plain memory, for N = 1, 2, 4, 8.
void ring_items(const fs::path& path, int runs, const std::function<void()>& setup, FileResults& out) {
  namespace cuda = safetensors::cuda;
  const std::size_t size = fs::file_size(path);
  // Only the emulated driver, with its copies free: a real one would time real copies.
  const char* free = std::getenv("SAFETENSORS_FAKE_CUDA_FREE_COPIES");
  std::string why;
  if (!cuda::available()) {
    why = "no usable GPU: " + cuda::why_unavailable();
  } else {
    void* driver = ::dlopen("libcuda.so.1", RTLD_NOW);  // the driver available() loaded
    if (driver == nullptr) driver = ::dlopen("libcuda.so", RTLD_NOW);
    const bool emulated = driver != nullptr && ::dlsym(driver, "fakecuda_hold") != nullptr;
    if (!emulated || free == nullptr || std::string_view(free) != "1") {
      why =
          "needs the emulated driver with SAFETENSORS_FAKE_CUDA_FREE_COPIES=1 (benchmark/run --full runs it "
          "so)";
    }
  }
  for (unsigned readers : {1u, 2u, 4u, 8u}) {
    const std::string n = std::to_string(readers);
    Result ring{"ring, " + n + " readers", {}, size, why};
    if (!why.empty()) {
      out.items.push_back({ring, nullptr});
      continue;
    }
    // Into one destination made once, from the file opened once, outside the timing (as the
    // pread threads' file): the emulated driver's allocations are host memory, zero-filled and
    // faulted in, which a real cuMemAlloc is not.
    cuda::Uploader up(0, {.readers = readers});
    SafeOpen f(path, {Backend::Read});
    cuda::DeviceTensors dst = up.load(f);
    ring.runs = measure::repeat(
        runs,
        [&] {
          up.load_into(f, {}, dst.buffer().data(), dst.buffer().size(), 0);
          up.synchronize();
        },
        setup);
    out.ring_limits.push_back(
        {"pread, " + n + " threads", parallel_pread(path, readers, runs, setup), size, {}});
    out.items.push_back({ring, &out.ring_limits.back()});
  }
}

/// The `ranks` item (bench_ranks.hpp): W = 2 and 4 threads as ranks loading their shares onto
/// device 0, via the host and via the device, each run's device memory freed outside the
/// timing; against the single-rank `Uploader::load` of the whole file, timed here too so that
/// the two are side by side in one run.
void ranks_items(const fs::path& path, int runs, const std::function<void()>& setup, FileResults& out) {
  namespace cuda = safetensors::cuda;
  const std::size_t size = fs::file_size(path);
  std::string why = cuda::available() ? std::string() : "no usable GPU: " + cuda::why_unavailable();
  Result single{"ranks 1 (Uploader::load, the whole file)", {}, size, why};
  if (why.empty()) {
    cuda::Uploader up(0);
    std::optional<cuda::DeviceTensors> loaded;
    single.runs = measure::repeat(
        runs, [&] { loaded = up.load(SafeOpen(path)); },
        [&] {
          loaded.reset();
          setup();
        });
  }
  out.ring_limits.push_back(single);
  const Result* limit = why.empty() ? &out.ring_limits.back() : nullptr;
  out.items.push_back({single, nullptr});
  for (std::size_t world : {2u, 4u}) {
    for (cuda::Via via : {cuda::Via::Host, cuda::Via::Device}) {
      const bool host = via == cuda::Via::Host;
      Result r{"ranks " + std::to_string(world) + ", via the " + (host ? "host" : "device"), {}, size, why};
      if (why.empty()) {
        bench_ranks::Group group(world);
        if (!host && !group.has_device_path()) {
          r.skipped = "the driver lacks an entry point the in-process device broadcast needs";
        } else {
          std::vector<std::optional<cuda::DeviceTensors>> kept;
          try {
            r.runs = measure::repeat(
                runs, [&] { bench_ranks::load_once(path, world, via, group, kept); },
                [&] {
                  kept.clear();
                  setup();
                });
          } catch (const safetensors::Error& e) {
            r.skipped = e.what();
          }
        }
      }
      out.items.push_back({r, r.skipped.empty() ? limit : nullptr});
    }
  }
}

/// The `peer` item: syoyo/safetensors-cpp doing the work of our open, load and load_copy on the
/// same file (see peer_syoyo.hpp), or one skipped line when bench_cpp was built without it.
void peer_items(const fs::path& path, int runs, const std::function<void()>& setup, FileResults& out) {
  if (!peer_syoyo::built()) {
    out.items.push_back({Result{"syoyo",
                                {},
                                0,
                                "bench_cpp was built without the syoyo/safetensors-cpp peer (configure with "
                                "SAFETENSORS_SYOYO_DIR=<a checkout of github.com/syoyo/safetensors-cpp>)"},
                         nullptr});
    return;
  }
  const std::size_t size = fs::file_size(path);
  const std::string p = path.string();
  struct Work {
    const char* ours;
    std::uint64_t (*run)(const std::string&);
    std::size_t bytes;
  };
  for (const Work& w : {Work{"open", peer_syoyo::open_all, 0}, Work{"load", peer_syoyo::read_all, size},
                        Work{"load_copy", peer_syoyo::copy_all, size}}) {
    Result r{std::string("syoyo ") + w.ours, {}, w.bytes, {}};
    r.runs = measure::repeat(
        runs, [&] { sink += w.run(p); }, setup);
    out.peer.emplace_back(w.ours, r);
    out.items.push_back({r, nullptr});
  }
}

void run_items(const Options& opt, const fs::path& path, int runs, const std::function<void()>& setup,
               FileResults& out) {
  using Kind = measure::LoadItem::Kind;
  std::size_t size = fs::file_size(path);
  if (opt.items.count("probe")) {
    out.probe = gpu_probe::run(path, runs);
    // The GPU kit's probe step asks for `probe` (and `ranks`) alone: the CPU limits beside the
    // other items would only spend its device time.
    if (std::all_of(opt.items.begin(), opt.items.end(),
                    [](const auto& i) { return i == "probe" || i == "ranks"; })) {
      const std::string why = "not measured beside --items probe";
      out.limits = {{"read()", {}, 0, why},
                    {"read() into new memory", {}, 0, why},
                    {"read() into new huge pages", {}, 0, why},
                    {"memcpy", {}, 0, why},
                    {},
                    {}};
      if (opt.items.count("ranks")) ranks_items(path, runs, setup, out);
      return;
    }
  }
  out.with_save = opt.items.count("save") && size < (2ull << 30);
  out.limits = limits(path, runs, out.with_save, setup);
  if (opt.items.count("open"))
    // An open takes tens of microseconds: 201 runs (bench.py takes as many) span a few
    // milliseconds, so that one stall of the machine cannot move the median (with 21, one in a
    // round of five moved gpt2's from 25 to 37 us).
    out.items.push_back({load_result(Kind::Open, path, std::max(runs, kOpenRuns), setup), nullptr});
  if (opt.items.count("load"))
    out.items.push_back({load_result(Kind::Load, path, runs, setup), &out.limits.read});
  if (opt.items.count("load_copy")) {
    out.items.push_back({load_result(Kind::LoadCopy, path, runs, setup), &out.limits.read});
  }
  if (opt.items.count("slice")) out.items.push_back({slice_item(path, runs, setup), nullptr});
  if (out.with_save) {
    out.items.push_back({save_item(path, runs, setup, true), &out.limits.write_sync});
    out.items.push_back({save_item(path, runs, setup, false), &out.limits.write_nosync});
  }
  if (opt.items.count("ring")) ring_items(path, runs, setup, out);
  if (opt.items.count("ranks")) ranks_items(path, runs, setup, out);
  if (opt.items.count("peer")) peer_items(path, std::max(runs, 5), setup, out);
  if (opt.items.count("gpu")) {
    out.gpu = gpu_item(path, runs, setup);
    bool ran = out.gpu.pinned.skipped.empty();
    out.items.push_back({out.gpu.gpu, ran ? &out.gpu.pinned : nullptr});
    if (ran) {
      out.items.push_back({out.gpu.one_shot, &out.gpu.pinned});
      for (const auto* r :
           {&out.gpu.read_backend, &out.gpu.direct_backend, &out.gpu.kept_open, &out.gpu.every_core}) {
        out.items.push_back({*r, &out.gpu.pinned});
      }
      out.items.push_back({out.gpu.host_copy, nullptr});
      out.items.push_back({out.gpu.host_copy_all, nullptr});
      if (out.gpu.registered.whole.skipped.empty()) {
        out.items.push_back({out.gpu.registered.whole, &out.gpu.pinned});
        out.items.push_back({out.gpu.registered.register_only, nullptr});
      }
    }
  }
}

void print_file(const FileResults& r) {
  for (const auto& [item, limit] : r.items) print_result(item, limit);
  for (const auto& [ours_name, theirs] : r.peer) {
    for (const auto& [ours, limit] : r.items) {
      if (ours.item != ours_name || ours.runs.empty() || theirs.runs.empty()) continue;
      const double a = measure::median(ours.runs), b = measure::median(theirs.runs);
      std::printf("  %-14s ours %.3f ms vs syoyo/safetensors-cpp %.3f ms: %.2fx\n", ours_name.c_str(),
                  a * 1e3, b * 1e3, b / a);
    }
  }
  print_result(r.limits.read, nullptr);
  print_result(r.limits.read_fresh, nullptr);
  print_result(r.limits.read_fresh_huge, nullptr);
  print_result(r.limits.memcpy, nullptr);
  if (r.with_save) {
    print_result(r.limits.write_sync, nullptr);
    print_result(r.limits.write_nosync, nullptr);
  }
  if (r.gpu.pinned.skipped.empty()) {
    print_result(r.gpu.pinned, nullptr);
    std::printf("  host memory added by the GPU upload (RssAnon): %.1f MiB\n",
                static_cast<double>(r.gpu.host_extra) / (1 << 20));
  }
}

/// The file's entry in the JSON report.
/// The file's entry in the JSON report; `cold` holds the cold items' entries (JSON objects,
/// comma-separated) and the disk measurement's description, when they ran.
std::string file_json(const fs::path& path, std::size_t size, std::size_t tensors, const FileResults& r,
                      bool classic, const std::pair<std::string, std::string>& cold) {
  std::ostringstream json;
  json << "{\"name\":\"" << path.filename().string() << "\",\"bytes\":" << size << ",\"tensors\":" << tensors
       << ",\"items\":[";
  for (std::size_t i = 0; i < r.items.size(); ++i) json << (i ? "," : "") << json_result(r.items[i].first);
  json << (!r.items.empty() && !cold.first.empty() ? "," : "") << cold.first << "],\"limits\":[";
  if (classic) {
    json << json_result(r.limits.read) << "," << json_result(r.limits.read_fresh) << ","
         << json_result(r.limits.read_fresh_huge) << "," << json_result(r.limits.memcpy);
    if (r.with_save)
      json << "," << json_result(r.limits.write_sync) << "," << json_result(r.limits.write_nosync);
    if (r.gpu.pinned.skipped.empty()) json << "," << json_result(r.gpu.pinned);
    for (const auto& l : r.ring_limits) json << "," << json_result(l);
  }
  json << "],\"gpu_host_extra_bytes\":" << r.gpu.host_extra;
  if (!r.probe.empty()) json << ",\"probe\":" << r.probe;
  if (!cold.second.empty()) json << ",\"disk\":" << cold.second;
  json << "}";
  return json.str();
}

// ---- --cold: full reads from the disk, beside the disk's own rate ------------------------------

/// JSON text of `s`, quoted (the disk command holds a path).
std::string json_text(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

/// The cold items of one file, taking turns run by run, each after `setup` drops the page cache:
/// their JSON entries (with the spread and the fraction of the disk's rate) and the disk
/// measurement's description.
std::pair<std::string, std::string> cold_items(const Options& opt, const fs::path& path, int runs,
                                               const std::function<void()>& setup) {
  using safetensors::Backend;
  const std::size_t size = fs::file_size(path);
  struct Item {
    std::string name, label;
    std::function<std::uint64_t()> body;
    Result result;
  };
  std::vector<Item> items;
  auto add = [&](const std::string& name, const std::string& label, std::function<std::uint64_t()> body) {
    if (opt.items.count(name)) items.push_back({name, label, std::move(body), {name, {}, size, {}}});
  };
  cold::DiskTool tool;
  add("disk", "disk (direct I/O, the faster of 1 job x depth 8, 4 jobs x depth 16)", nullptr);
  add("mmap", "mmap: every tensor through the mapping", [&] { return cold::read_all(path, Backend::Mmap); });
  add("read", "read: pread of every tensor", [&] { return cold::read_all(path, Backend::Read); });
  add("direct", "direct: O_DIRECT of every tensor", [&] { return cold::read_all(path, Backend::Direct); });
  add("prefetch", "prefetch, then every tensor through the mapping",
      [&] { return cold::prefetch_then_read(path); });
  add("stream", "stream: TensorStream, direct backend",
      [&] { return cold::streamed(path, Backend::Direct); });
  for (int run = 0; run < runs; ++run) {
    for (auto& item : items) {
      setup();
      if (!item.body) {
        item.result.runs.push_back(cold::disk_seconds(path, size, tool));
        continue;
      }
      auto start = measure::Clock::now();
      sink += item.body();
      item.result.runs.push_back(measure::seconds_since(start));
    }
  }
  double disk = 0;
  for (const auto& item : items)
    if (item.name == "disk") disk = measure::median(item.result.runs);
  std::string json;
  for (const auto& item : items) {
    const auto& r = item.result.runs;
    double m = measure::median(r);
    auto [lo, hi] = std::minmax_element(r.begin(), r.end());
    std::printf("  %-50s %9.3f s (%.3f-%.3f)  %6.2f GB/s", item.label.c_str(), m, *lo, *hi,
                static_cast<double>(size) / m / 1e9);
    std::string entry = json_result(item.result);
    if (disk > 0 && item.name != "disk") {
      std::printf("  %.2fx the disk's rate", disk / m);
      entry.insert(entry.size() - 1, ",\"disk_ratio\":" + std::to_string(disk / m));
    }
    std::printf("\n");
    json += (json.empty() ? "" : ",") + entry;
  }
  if (tool.name.empty()) return {json, ""};
  std::printf("  disk measured with %s: %s\n", tool.name.c_str(), tool.command.c_str());
  return {json, "{\"tool\":" + json_text(tool.name) + ",\"command\":" + json_text(tool.command) + "}"};
}

// ---- a checkpoint index as FILE --------------------------------------------------------------

bool is_index(const fs::path& path) {
  std::string ext = path.extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".json";
}

/// Every shard of the checkpoint read whole into `buffer` (the files one after another), with
/// plain read()s: the machine's limit for reading the checkpoint's bytes.
void read_shards(const std::vector<std::string>& shards, std::vector<std::byte>& buffer) {
  std::size_t at = 0;
  for (const auto& shard : shards) {
    int fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open " + shard);
    for (;;) {
      ssize_t n = ::read(fd, buffer.data() + at, buffer.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }
  sink += at;
}

std::string bench_checkpoint(const Options& opt, const fs::path& index) {
  const std::string name = index.parent_path().filename().string();
  std::vector<std::string> shards;
  std::size_t tensors = 0, file_bytes = 0, tensor_bytes = 0;
  {
    safetensors::Checkpoint c(index);
    shards = c.shard_paths();
    tensors = c.size();
    for (const auto& s : shards) file_bytes += fs::file_size(s);
    for (const auto& [n, view] : c) tensor_bytes += view.data.size();
  }
  const int runs = opt.runs ? opt.runs : 7;
  std::printf("%s (checkpoint: %zu tensors in %zu shards, %zu bytes, %d runs)\n", name.c_str(), tensors,
              shards.size(), file_bytes, runs);
  std::vector<std::byte> buffer(std::max(file_bytes, tensor_bytes));
  std::memset(buffer.data(), 1, buffer.size());  // faulted in before any run
  struct Item {
    Result result;
    std::function<void()> body;
  };
  std::vector<Item> items;
  if (opt.items.count("open")) {
    items.push_back({{"open", {}, 0, {}}, [&] {
                       safetensors::Checkpoint c(index);
                       for (const auto& k : c.keys()) sink += c.info(k).shape.size();
                     }});
  }
  // The plans are a default item of a checkpoint (not of a file).
  if (opt.items.count("plans") || !opt.items_given) {
    // One open checkpoint, as an engine plans on: what is timed is making the plan.
    auto ckpt = std::make_shared<safetensors::Checkpoint>(index);
    auto keys = std::make_shared<std::vector<std::string>>(ckpt->keys());
    constexpr std::size_t world = 8;
    items.push_back({{"plan_ep", {}, 0, {}}, [ckpt, keys] {
                       std::vector<std::vector<safetensors::Selection>> needs(world);
                       for (const auto& k : *keys) {
                         auto slice = ckpt->get_slice(k);
                         // "...mlp.experts.E.": expert E belongs to rank E % world.
                         const auto at = k.find(".experts.");
                         if (at == std::string::npos) {
                           for (auto& n : needs) n.push_back(slice.select({}));
                         } else {
                           needs[std::stoul(k.substr(at + 9)) % world].push_back(slice.select({}));
                         }
                       }
                       safetensors::LoadPlan plan(needs);
                       sink += plan.bytes_read();
                     }});
    items.push_back({{"plan_tp", {}, 0, {}}, [ckpt, keys] {
                       std::vector<std::vector<safetensors::Selection>> needs(world);
                       for (const auto& k : *keys) {
                         auto slice = ckpt->get_slice(k);
                         const auto shape = slice.shape();
                         for (std::size_t r = 0; r < world; ++r) {
                           needs[r].push_back(shape.size() == 2 && shape[0] % world == 0
                                                  ? safetensors::column_parallel(slice, r, world)
                                                  : slice.select({}));
                         }
                       }
                       safetensors::LoadPlan plan(needs);
                       sink += plan.bytes_read();
                     }});
    items.push_back({{"plan_upload", {}, 0, {}}, [ckpt] { sink += safetensors::cuda::plan(*ckpt).first; }});
  }
  if (opt.items.count("load")) {
    items.push_back({{"load", {}, tensor_bytes, {}}, [&] {
                       safetensors::Checkpoint c(index);
                       std::size_t at = 0;
                       for (const auto& [n, view] : c) {
                         std::memcpy(buffer.data() + at, view.data.data(), view.data.size());
                         at += view.data.size();
                       }
                       sink += at;
                     }});
    items.push_back({{"read()", {}, file_bytes, {}}, [&] { read_shards(shards, buffer); }});
  }
  for (auto& item : items) item.body();  // warm-up
  for (int run = 0; run < runs; ++run) {
    for (auto& item : items) {
      auto start = measure::Clock::now();
      item.body();
      item.result.runs.push_back(measure::seconds_since(start));
    }
  }
  const Result* read_limit = nullptr;
  for (const auto& item : items)
    if (item.result.item == "read()") read_limit = &item.result;
  std::ostringstream json;
  json << "{\"name\":\"" << name << "\",\"bytes\":" << tensor_bytes << ",\"tensors\":" << tensors
       << ",\"shards\":" << shards.size() << ",\"items\":[";
  bool first = true;
  for (const auto& item : items) {
    if (item.result.item == "read()") continue;
    print_result(item.result, item.result.item == "load" ? read_limit : nullptr);
    json << (first ? "" : ",") << json_result(item.result);
    first = false;
  }
  json << "],\"limits\":[";
  if (read_limit) {
    print_result(*read_limit, nullptr);
    json << json_result(*read_limit);
  }
  json << "]}";
  return json.str();
}

std::string bench_file(const Options& opt, const fs::path& path) {
  if (is_index(path)) return bench_checkpoint(opt, path);
  std::size_t size = fs::file_size(path);
  int runs = opt.runs ? opt.runs : opt.cold ? 5 : (size > (2ull << 30) ? 3 : 7);
  auto setup = cache_setup(opt, path);
  std::size_t tensors = SafeOpen(path).size();
  std::printf("%s (%zu bytes, %zu tensors, %d runs)\n", path.filename().c_str(), size, tensors, runs);
  std::pair<std::string, std::string> cold;
  bool any_cold = false, classic = false;
  for (const auto& item : opt.items) (kColdItems.count(item) ? any_cold : classic) |= item != "convert";
  if (any_cold) cold = cold_items(opt, path, runs, setup);
  FileResults results;
  if (classic) {
    run_items(opt, path, runs, setup, results);
    print_file(results);
  }
  return file_json(path, size, tensors, results, classic, cold);
}

// ---- MODEL ITERATIONS: time per iteration ------------------------------------------------------

std::string bench_iterations(const Options& opt, const fs::path& path) {
  std::size_t size = fs::file_size(path);
  auto setup = cache_setup(opt, path);
  std::size_t tensors = SafeOpen(path).size();
  std::printf("%s (%zu bytes, %zu tensors, %d iterations): time per iteration\n", path.filename().c_str(),
              size, tensors, opt.iterations);
  std::ostringstream json;
  json << "{\"name\":\"" << path.filename().string() << "\",\"bytes\":" << size << ",\"tensors\":" << tensors
       << ",\"iterations\":" << opt.iterations << ",\"items\":[";
  bool first = true;
  auto report = [&](const Result& r) {
    if (r.skipped.empty()) {
      double per = measure::mean(r.runs);
      std::printf("  %-14s %12.6f s", r.item.c_str(), per);
      if (r.bytes) std::printf("  %6.2f GB/s", static_cast<double>(r.bytes) / per / 1e9);
      std::printf("\n");
    } else {
      std::printf("  %-14s skipped: %s\n", r.item.c_str(), r.skipped.c_str());
    }
    json << (first ? "" : ",") << json_result(r, /*per_iteration=*/true);
    first = false;
  };
  for (auto kind : measure::LoadItem::kAll) {
    measure::LoadItem item(kind, path);
    if (!opt.items.count(std::string(item.name()))) continue;
    auto runs = measure::timings(
        opt.iterations, [&] { item.run(); },
        [&] {
          item.release();
          setup();
        });
    sink += item.sink();
    report({std::string(item.name()), std::move(runs), kind == measure::LoadItem::Kind::Open ? 0 : size, {}});
  }
  if (opt.items.count("gpu")) report(gpu_iterations(path, opt.iterations, setup));
  json << "]}";
  return json.str();
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  try {
    opt = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "bench_cpp: %s\n\n%s", e.what(), kUsage);
    return 2;
  }
  if (opt.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (opt.cold && !measure::drop_caches()) {
    std::fprintf(stderr, "bench_cpp: %s\n", kColdNeedsRoot);
    return 1;
  }
  try {
    // Opened now: a path that cannot be written fails before the measurements, not after.
    std::optional<checked::OutputFile> out;
    if (!opt.json.empty()) out.emplace(opt.json);
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    std::string machine = measure::machine();
    std::string cache = opt.cold ? "cold" : "warm";
    std::printf("bench_cpp | %s | page cache %s | %s\n", machine.c_str(), cache.c_str(), date);
    std::ostringstream json;
    json << "{\"tool\":\"bench_cpp\",\"date\":\"" << date << "\",\"machine\":\"" << machine
         << "\",\"cache\":\"" << cache << "\",\"files\":[";
    for (std::size_t i = 0; i < opt.files.size(); ++i) {
      json << (i ? "," : "")
           << (opt.iterations ? bench_iterations(opt, opt.files[i]) : bench_file(opt, opt.files[i]));
    }
    json << "]";
    if (opt.items.count("convert")) {
      int runs = opt.runs ? opt.runs : 3;
      std::printf("convert (64 Mi elements, %d runs, as the library runs it, and on one core)\n", runs);
      json << ",\"convert\":" << bench_convert::run(std::size_t{64} << 20, runs);
    }
    json << "}";
    if (out) {
      out->write(json.str() + "\n");
      out->close();
    } else {
      std::printf("JSON %s\n", json.str().c_str());
    }
    std::fprintf(stderr, "%s", sink == 42 ? " " : "");
    return checked::stdout_arrived("bench_cpp") ? 0 : 1;
  } catch (const safetensors::Error& e) {
    std::fprintf(stderr, "bench_cpp: %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(),
                 e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpp: %s\n", e.what());
    return 1;
  }
}
