// bench_cpp: what loading, slicing and saving safetensors files costs from C++, through the
// public API only, next to what the machine's own limits are for the same bytes.
//
//   bench_cpp [--runs N] [--items open,load,load_copy,slice,save,gpu] [--cold] [--json OUT] FILE...
//
// Work items (bench.py measures the same ones with Python's safetensors):
//   open       open the file, list keys, take every tensor's view (no data touched)
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
//   convert    not per file, and only when asked for (--items convert, no FILE needed): each
//              dtype to F32 and F32 to BF16/F16/F8_E4M3 on 64 Mi elements (bench_convert.hpp)
// Limits also measured: read() into fresh memory (what any copy into new memory pays for page
// faults), and one memcpy of the file's size.
//
// Medians of --runs runs (default 7; 3 for files over 2 GB). The page cache is warm unless
// --cold (needs root), which drops it before every run.
#include <safetensors/safetensors.hpp>

#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "bench_convert.hpp"
#include "measure.hpp"

namespace {

using safetensors::Backend;
using safetensors::Index;
using safetensors::SafeOpen;
using safetensors::TensorView;

struct Options {
  int runs = 0;
  bool cold = false;
  std::set<std::string> items{"open", "load", "load_copy", "slice", "save", "gpu"};
  std::string json;
  std::vector<std::filesystem::path> files;
};

struct Result {
  std::string item;
  std::vector<double> runs;
  std::size_t bytes = 0;      // bytes moved per run, for GB/s
  std::string skipped;        // non-empty: why the item did not run
};

std::uint64_t sink = 0;  // keeps results observable so nothing is optimized away

Result open_item(const std::filesystem::path& path, int runs, const std::function<void()>& setup) {
  Result r{"open", {}, 0, {}};
  r.runs = measure::repeat(runs, [&] {
    SafeOpen f(path);
    for (const auto& k : f.keys()) sink += f.get_tensor(k).shape.size();
  }, setup);
  return r;
}

Result load_copy_item(const std::filesystem::path& path, int runs, const std::function<void()>& setup) {
  Result r{"load_copy", {}, std::filesystem::file_size(path), {}};
  std::vector<TensorView> kept;
  r.runs = measure::repeat(runs, [&] {
    SafeOpen f(path, {Backend::Read});
    kept.clear();
    for (const auto& k : f.offset_keys()) kept.push_back(f.get_tensor(k));
    sink += kept.size();
  }, [&] {
    kept.clear();  // freeing the previous run's buffers is not part of the next load
    setup();
  });
  return r;
}

Result load_item(const std::filesystem::path& path, int runs, const std::function<void()>& setup) {
  Result r{"load", {}, std::filesystem::file_size(path), {}};
  r.runs = measure::repeat(runs, [&] {
    SafeOpen f(path);
    std::uint64_t sum = 0;
    for (const auto& k : f.offset_keys()) {
      auto view = f.get_tensor(k);
      auto bytes = view.data;
      std::size_t i = 0;
      for (; i + 8 <= bytes.size(); i += 8) {
        std::uint64_t w;
        std::memcpy(&w, bytes.data() + i, 8);
        sum += w;
      }
      for (; i < bytes.size(); ++i) sum += static_cast<std::uint8_t>(bytes[i]);
    }
    sink += sum;
  }, setup);
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
  r.runs = measure::repeat(runs, [&] {
    SafeOpen f(path);
    kept.clear();
    for (const auto& k : f.keys()) {
      auto s = f.get_slice(k);
      if (s.shape().size() != 2) continue;
      kept.push_back(s.select({Index::all(), Index::range(0, static_cast<std::int64_t>(s.shape()[1] / 2))}).read());
    }
    sink += kept.size();
  }, [&] {
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
  r.runs = measure::repeat(runs, [&] { safetensors::save_file(out, tensors, f.metadata(), {sync}); }, [&] {
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

/// Every tensor of the file into one device allocation, complete, through a reused `Uploader`
/// (`gpu`) and through the one-shot `cuda::load` (`gpu one-shot`, the process's shared
/// uploader); and the limit for the same bytes, one copy from pinned host memory. The file is
/// opened inside the timed body, as Python's `load_file` does (so each run pays its page faults,
/// and `--cold` can evict what no live mapping holds); the device memory is freed outside it,
/// before the next run. Also reports the host memory the upload adds.
Result gpu_item(const std::filesystem::path& path, int runs, const std::function<void()>& setup, Result& pinned,
                Result& one_shot, std::size_t& host_extra) {
  namespace cuda = safetensors::cuda;
  if (!cuda::available()) return {"gpu", {}, 0, "no usable GPU: " + cuda::why_unavailable()};
  std::size_t size = std::filesystem::file_size(path);
  Result r{"gpu", {}, size, {}};
  std::size_t before = rss_anon();
  std::optional<cuda::DeviceTensors> loaded;  // freed by the untimed setup of the next run
  auto free_then = [&] {
    loaded.reset();
    setup();
  };
  {
    cuda::Uploader up(0);
    r.runs = measure::repeat(runs, [&] { loaded = up.load(SafeOpen(path)); }, free_then);
    loaded.reset();
  }
  one_shot = {"gpu one-shot", measure::repeat(runs, [&] { loaded = cuda::load(SafeOpen(path)); }, free_then), size,
              {}};
  loaded.reset();
  host_extra = rss_anon() - std::min(before, rss_anon());
  // pinned_copy_seconds times the copy itself, not the allocation around it.
  pinned = {"pinned H2D", {}, size, {}};
  (void)cuda::pinned_copy_seconds(size);
  for (int i = 0; i < runs; ++i) pinned.runs.push_back(cuda::pinned_copy_seconds(size));
  return r;
}

struct Limits {
  Result read, read_fresh, memcpy, write_sync, write_nosync;
};

Limits limits(const std::filesystem::path& path, int runs, bool want_write, const std::function<void()>& setup) {
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
  measure::MemcpyLimit copy(size);
  l.memcpy = {"memcpy", measure::repeat(runs, [&] { copy.run(); }), size, {}};
  if (want_write) {
    std::vector<std::byte> bytes(size, std::byte{3});
    auto dir = path.parent_path();
    auto remove = [&] { std::filesystem::remove(measure::raw_write_path(dir)); };
    l.write_sync = {"write()+fsync", measure::repeat(runs, [&] { measure::write_file(dir, bytes, true); }, remove), size, {}};
    l.write_nosync = {"write()", measure::repeat(runs, [&] { measure::write_file(dir, bytes, false); }, remove), size, {}};
    remove();
  }
  return l;
}

std::string json_result(const Result& r) {
  std::ostringstream o;
  o << "{\"item\":\"" << r.item << "\"";
  if (!r.skipped.empty()) {
    o << ",\"skipped\":\"" << r.skipped << "\"}";
    return o.str();
  }
  o << ",\"median_s\":" << measure::median(r.runs) << ",\"bytes\":" << r.bytes << ",\"runs_s\":[";
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

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--runs") o.runs = std::stoi(value());
    else if (a == "--cold") o.cold = true;
    else if (a == "--json") o.json = value();
    else if (a == "--items") {
      o.items.clear();
      std::istringstream s(value());
      for (std::string it; std::getline(s, it, ',');) o.items.insert(it);
    } else if (a == "--help" || a == "-h") {
      std::puts("usage: bench_cpp [--runs N] [--items open,load,load_copy,slice,save,gpu] [--cold] [--json OUT] FILE...");
      std::exit(0);
    } else o.files.emplace_back(a);
  }
  if (o.files.empty() && !o.items.count("convert")) throw std::runtime_error("no file given (see --help)");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto opt = parse(argc, argv);
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    std::string machine = measure::machine();
    std::string cache = opt.cold ? "cold" : "warm";
    std::printf("bench_cpp | %s | page cache %s | %s\n", machine.c_str(), cache.c_str(), date);
    std::ostringstream json;
    json << "{\"tool\":\"bench_cpp\",\"date\":\"" << date << "\",\"machine\":\"" << machine << "\",\"cache\":\""
         << cache << "\",\"files\":[";
    for (std::size_t fi = 0; fi < opt.files.size(); ++fi) {
      const auto& path = opt.files[fi];
      std::size_t size = std::filesystem::file_size(path);
      int runs = opt.runs ? opt.runs : (size > (2ull << 30) ? 3 : 7);
      std::function<void()> setup = [] {};
      if (opt.cold) {
        if (!measure::drop_caches()) throw std::runtime_error("--cold needs root and a writable /proc/sys/vm/drop_caches");
        setup = [] { measure::drop_caches(); };
      } else {
        measure::warm(path);
      }
      std::size_t tensors = SafeOpen(path).size();
      std::printf("%s (%zu bytes, %zu tensors, %d runs)\n", path.filename().c_str(), size, tensors, runs);
      bool want_save = opt.items.count("save") && size < (2ull << 30);
      auto lim = limits(path, runs, want_save, setup);
      std::vector<std::pair<Result, const Result*>> results;
      if (opt.items.count("open")) results.push_back({open_item(path, std::max(runs, 21), setup), nullptr});
      if (opt.items.count("load")) results.push_back({load_item(path, runs, setup), &lim.read});
      if (opt.items.count("load_copy")) results.push_back({load_copy_item(path, runs, setup), &lim.read});
      if (opt.items.count("slice")) results.push_back({slice_item(path, runs, setup), nullptr});
      if (want_save) {
        results.push_back({save_item(path, runs, setup, true), &lim.write_sync});
        results.push_back({save_item(path, runs, setup, false), &lim.write_nosync});
      }
      Result pinned{"pinned H2D", {}, 0, "no GPU"};
      Result one_shot{"gpu one-shot", {}, 0, "no GPU"};
      std::size_t host_extra = 0;
      if (opt.items.count("gpu")) {
        results.push_back({gpu_item(path, runs, setup, pinned, one_shot, host_extra), nullptr});
        if (pinned.skipped.empty()) {
          results.back().second = &pinned;
          results.push_back({one_shot, &pinned});
        }
      }
      for (const auto& [r, l] : results) print_result(r, l);
      print_result(lim.read, nullptr);
      print_result(lim.read_fresh, nullptr);
      print_result(lim.memcpy, nullptr);
      if (want_save) {
        print_result(lim.write_sync, nullptr);
        print_result(lim.write_nosync, nullptr);
      }
      if (pinned.skipped.empty()) {
        print_result(pinned, nullptr);
        std::printf("  host memory added by the GPU upload (RssAnon): %.1f MiB\n", static_cast<double>(host_extra) / (1 << 20));
      }
      json << (fi ? "," : "") << "{\"name\":\"" << path.filename().string() << "\",\"bytes\":" << size
           << ",\"tensors\":" << tensors << ",\"items\":[";
      for (std::size_t i = 0; i < results.size(); ++i) json << (i ? "," : "") << json_result(results[i].first);
      json << "],\"limits\":[" << json_result(lim.read) << "," << json_result(lim.read_fresh) << ","
           << json_result(lim.memcpy);
      if (want_save) json << "," << json_result(lim.write_sync) << "," << json_result(lim.write_nosync);
      if (pinned.skipped.empty()) json << "," << json_result(pinned);
      json << "],\"gpu_host_extra_bytes\":" << host_extra << "}";
    }
    json << "]";
    if (opt.items.count("convert")) {
      int runs = opt.runs ? opt.runs : 3;
      std::printf("convert (64 Mi elements, %d runs, single thread)\n", runs);
      json << ",\"convert\":" << bench_convert::run(std::size_t{64} << 20, runs);
    }
    json << "}";
    if (!opt.json.empty()) {
      std::ofstream(opt.json) << json.str() << "\n";
    } else {
      std::printf("JSON %s\n", json.str().c_str());
    }
    std::fprintf(stderr, "%s", sink == 42 ? " " : "");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpp: %s\n", e.what());
    return 1;
  }
}
