// bench_memory: what the mapping controls and page residency change, per file.
//
//   bench_memory [--runs N] [--json OUT] FILE...
//   bench_memory [--runs N] [--json OUT] --make MIB [--dir DIR]
//                                        (a file of MIB MiB it writes into DIR, default the
//                                         system's temporary folder, and removes)
//
// Each figure is one control against its absence. Memory, as the kernel accounts it
// (/proc/self/status, /proc/self/smaps_rollup, mincore), page cache warm before each part:
//   mapped_rss_added         VmRSS added by touching every page of every tensor through the mapping
//   released_rss_added       the same after release_pages(f) (MADV_DONTNEED): what stays mapped
//   cached_before, cached_after   the file's data in the page cache before and after that
//                            release (POSIX_FADV_DONTNEED)
//   load_rss_added           VmRSS added by load(f): the program's copy and the file's pages
//   load_anon_added          RssAnon added by load(f): the copy alone
//   load_anon_huge           AnonHugePages added by load(f): the copy on transparent huge pages
//   load_released_rss_added  VmRSS added by load(f) then release_pages(f): the file's pages gone
//   load_cached_after        the file's data in the page cache after that release
//   locked_added, unlocked_added  VmLck added by lock_pages(f), and after unlock_pages(f)
//                            (skipped, with the reason, where RLIMIT_MEMLOCK refuses)
//   file_pmd_mapped          FilePmdMapped added by the first touch: the file's bytes mapped with
//                            huge pages without asking (filesystems caching in large folios)
//   huge_file_pmd_mapped     the same for a mapping opened with huge_pages (MADV_HUGEPAGE)
// Timings (seconds, medians of --runs runs, default 5): a first touch of every page
//   lazy_touch_s             of a fresh mapping (page faults), cache warm
//   populate_open_s, populated_touch_s   the open with Populate::AtOpen, then the touch
//   background_open_s, background_touch_s   the same with Populate::Background
//   huge_touch_s             of a mapping opened with huge_pages
//   cold_lazy_touch_s, cold_populate_open_s   lazy touch and populating open with the file's
//                            pages dropped from the cache first (release_pages: no root needed)
//   load_s                   load(f), cache warm
// A bad argument is exit code 2; a file that cannot be read or an output that cannot be written
// exit code 1.
#include <safetensors/memory.hpp>
#include <safetensors/safetensors.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checked_output.hpp"

namespace {

namespace fs = std::filesystem;
using safetensors::OpenOptions;
using safetensors::Populate;
using safetensors::SafeOpen;
using Clock = std::chrono::steady_clock;

/// A field counted in kB (VmRSS, RssAnon, AnonHugePages, ...) of a /proc file, in bytes.
std::size_t proc_field(const char* file, const std::string& field) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}
std::size_t status(const std::string& field) {
  return proc_field("/proc/self/status", field);
}
std::size_t rollup(const std::string& field) {
  return proc_field("/proc/self/smaps_rollup", field);
}

double added(std::size_t before, std::size_t after) {
  return after > before ? static_cast<double>(after - before) : 0.0;
}

/// Touches one byte per page of every tensor; the sum keeps the reads.
std::uint64_t touch(const SafeOpen& f) {
  std::uint64_t sum = 0;
  for (const auto& [name, view] : f) {
    for (std::size_t i = 0; i < view.data.size(); i += 4096) sum += static_cast<std::uint8_t>(view.data[i]);
  }
  return sum;
}

/// Bytes of the file's data buffer in the page cache (mincore over a fresh mapping, which
/// maps nothing in: mincore reports the cache, not this mapping).
std::size_t cached(const fs::path& path) {
  SafeOpen probe(path);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t total = 0;
  for (const auto& [name, view] : probe) {
    if (view.data.empty()) continue;
    auto base = reinterpret_cast<std::uintptr_t>(view.data.data());
    auto start = base - base % page;
    std::size_t len = base + view.data.size() - start;
    std::vector<unsigned char> v((len + page - 1) / page);
    if (::mincore(reinterpret_cast<void*>(start), len, v.data()) != 0) return 0;
    total +=
        static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
  }
  // Pages shared by neighbouring tensors count once per tensor: never more than the file.
  return std::min(total * page, static_cast<std::size_t>(fs::file_size(path)));
}

/// Reads the whole file once: its pages in the page cache.
void warm(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buf(std::size_t{8} << 20);
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
  }
}

/// Drops the file's pages from the page cache (they are clean: nothing else writes the file).
void chill(const fs::path& path) {
  safetensors::release_pages(SafeOpen(path));
}

double seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Figures {
  std::vector<std::pair<std::string, double>> values;
  std::vector<std::pair<std::string, std::string>> skipped;  // figure -> why
  void set(std::string key, double value) { values.emplace_back(std::move(key), value); }
};

/// Touch every page of the mapping, then release_pages: RSS and page cache before and after.
void release_after_touch(const fs::path& path, Figures& out) {
  warm(path);
  const auto rss = status("VmRSS");
  const auto pmd = rollup("FilePmdMapped");
  SafeOpen f(path);
  volatile auto sum = touch(f);
  (void)sum;
  out.set("mapped_rss_added", added(rss, status("VmRSS")));
  out.set("file_pmd_mapped", added(pmd, rollup("FilePmdMapped")));
  out.set("cached_before", static_cast<double>(cached(path)));
  safetensors::release_pages(f);
  out.set("released_rss_added", added(rss, status("VmRSS")));
  out.set("cached_after", static_cast<double>(cached(path)));
}

/// load(f): what the copy adds, and what stays once the file's pages are released.
void release_after_load(const fs::path& path, Figures& out) {
  warm(path);
  const auto anon = status("RssAnon");
  const auto rss = status("VmRSS");
  const auto huge = rollup("AnonHugePages");
  SafeOpen f(path);
  auto weights = safetensors::load(f);
  out.set("load_rss_added", added(rss, status("VmRSS")));
  out.set("load_anon_added", added(anon, status("RssAnon")));
  out.set("load_anon_huge", added(huge, rollup("AnonHugePages")));
  safetensors::release_pages(f);
  out.set("load_released_rss_added", added(rss, status("VmRSS")));
  out.set("load_cached_after", static_cast<double>(cached(path)));
}

/// lock_pages and unlock_pages: VmLck; a refusal (RLIMIT_MEMLOCK) is reported, not fatal.
void lock_and_unlock(const fs::path& path, Figures& out) {
  SafeOpen f(path);
  const auto locked = status("VmLck");
  if (auto st = safetensors::nothrow::lock_pages(f); !st.ok()) {
    out.skipped.emplace_back("locked_added", st.message());
    return;
  }
  out.set("locked_added", added(locked, status("VmLck")));
  safetensors::unlock_pages(f);
  out.set("unlocked_added", added(locked, status("VmLck")));
}

/// A mapping with huge pages asked for: how much of it the kernel maps with them.
void huge_pages(const fs::path& path, Figures& out) {
  warm(path);
  const auto pmd = rollup("FilePmdMapped");
  SafeOpen f(path, OpenOptions{.huge_pages = true});
  volatile auto sum = touch(f);
  (void)sum;
  out.set("huge_file_pmd_mapped", added(pmd, rollup("FilePmdMapped")));
}

/// Seconds to open with `options` and seconds to touch every page after.
std::pair<double, double> open_then_touch(const fs::path& path, OpenOptions options) {
  auto t = Clock::now();
  SafeOpen f(path, options);
  const double open = seconds(t);
  t = Clock::now();
  volatile auto sum = touch(f);
  (void)sum;
  return {open, seconds(t)};
}

void timings(const fs::path& path, int runs, Figures& out) {
  const char* names[] = {
      "lazy_touch_s", "populate_open_s", "populated_touch_s", "background_open_s",   "background_touch_s",
      "huge_touch_s", "load_s",          "cold_lazy_touch_s", "cold_populate_open_s"};
  std::vector<std::vector<double>> t(std::size(names));
  auto both = [&](std::size_t open, std::size_t then, std::pair<double, double> s) {
    t[open].push_back(s.first);
    t[then].push_back(s.second);
  };
  for (int r = 0; r < runs; ++r) {
    warm(path);
    t[0].push_back(open_then_touch(path, {}).second);
    both(1, 2, open_then_touch(path, {.populate = Populate::AtOpen}));
    both(3, 4, open_then_touch(path, {.populate = Populate::Background}));
    t[5].push_back(open_then_touch(path, {.huge_pages = true}).second);
    {
      SafeOpen f(path);
      auto start = Clock::now();
      auto weights = safetensors::load(f);
      t[6].push_back(seconds(start));
    }
    chill(path);
    t[7].push_back(open_then_touch(path, {}).second);
    chill(path);
    t[8].push_back(open_then_touch(path, {.populate = Populate::AtOpen}).first);
  }
  for (std::size_t k = 0; k < std::size(names); ++k) out.set(names[k], median(t[k]));
}

Figures measure(const fs::path& path, int runs) {
  Figures out;
  release_after_touch(path, out);
  release_after_load(path, out);
  lock_and_unlock(path, out);
  huge_pages(path, out);
  timings(path, runs, out);
  return out;
}

/// A file of 64 MiB tensors (the last smaller) of random bytes, `mib` MiB in all.
void make_file(const fs::path& path, std::size_t mib) {
  std::mt19937_64 rng(42);
  std::vector<std::vector<std::uint8_t>> data;
  for (std::size_t left = mib << 20; left > 0;) {
    std::size_t n = std::min(left, std::size_t{64} << 20);
    auto& d = data.emplace_back(n);
    for (auto& b : d) b = static_cast<std::uint8_t>(rng());
    left -= n;
  }
  std::vector<std::pair<std::string, safetensors::TensorView>> tensors;
  for (std::size_t k = 0; k < data.size(); ++k) {
    tensors.emplace_back(
        "t" + std::to_string(k),
        safetensors::TensorView{safetensors::Dtype::U8, {data[k].size()}, std::as_bytes(std::span(data[k]))});
  }
  safetensors::save_file(path, tensors);
}

/// `text` as a JSON string's contents: a file name is the user's, and may hold anything.
std::string json_escaped(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void print(const fs::path& file, const Figures& m) {
  std::printf("%s\n", file.c_str());
  for (const auto& [key, value] : m.values) {
    if (key.ends_with("_s")) {
      std::printf("  %-24s %10.4f s\n", key.c_str(), value);
    } else {
      std::printf("  %-24s %10.1f MiB\n", key.c_str(), value / (1 << 20));
    }
  }
  for (const auto& [key, why] : m.skipped) std::printf("  %-24s skipped: %s\n", key.c_str(), why.c_str());
}

std::string json_of(const fs::path& file, const Figures& m) {
  std::ostringstream out;
  out.precision(12);
  out << "{\"file\": \"" << json_escaped(file.filename().string())
      << "\", \"bytes\": " << fs::file_size(file);
  for (const auto& [key, value] : m.values) out << ", \"" << key << "\": " << value;
  out << ", \"skipped\": {";
  for (std::size_t k = 0; k < m.skipped.size(); ++k) {
    out << (k ? ", " : "") << "\"" << m.skipped[k].first << "\": \"" << json_escaped(m.skipped[k].second)
        << "\"";
  }
  out << "}}";
  return out.str();
}

int usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_memory: %s\nusage: bench_memory [--runs N] [--json OUT] FILE...\n"
               "       bench_memory [--runs N] [--json OUT] --make MIB [--dir DIR]\n",
               why.c_str());
  return 2;
}

/// A file the program made, removed however the program ends.
struct Scratch {
  fs::path path;
  ~Scratch() {
    std::error_code ignored;
    if (!path.empty()) fs::remove(path, ignored);
  }
};

struct Options {
  int runs = 5;
  std::optional<fs::path> json;
  std::optional<std::size_t> make;
  fs::path dir = fs::temp_directory_path();
  std::vector<fs::path> files;
};

/// The command line, every value checked; a message on failure.
std::optional<std::string> parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" || a == "--json" || a == "--make" || a == "--dir") {
      if (i + 1 >= argc) return a + " needs a value";
      std::string v = argv[++i];
      try {
        std::size_t used = 0;
        if (a == "--runs") o.runs = std::stoi(v, &used);
        if (a == "--make") o.make = std::stoull(v, &used);
        if ((a == "--runs" || a == "--make") && used != v.size()) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        return a + " needs a number, not '" + v + "'";
      }
      if (a == "--json") o.json = v;
      if (a == "--dir") o.dir = v;
    } else if (a.rfind("--", 0) == 0) {
      return "unknown option " + a;
    } else if (!fs::is_regular_file(a)) {
      return "no such file '" + a + "'";
    } else {
      o.files.emplace_back(a);
    }
  }
  if (o.runs < 1) return "--runs must be at least 1";
  if (o.make && (*o.make == 0 || *o.make > 1024)) return "--make takes 1 to 1024 MiB";
  if (o.make && !fs::is_directory(o.dir)) return "no such folder '" + o.dir.string() + "'";
  if (!o.make && o.files.empty()) return "no file given";
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (auto why = parse(argc, argv, o)) return usage(*why);
  try {
    // Opened first: an output that cannot be written fails before any measurement.
    std::optional<checked::OutputFile> json;
    if (o.json) json.emplace(*o.json);
    Scratch made;
    if (o.make) {
      made.path = o.dir / ("bench_memory_" + std::to_string(::getpid()) + ".safetensors");
      make_file(made.path, *o.make);
      o.files.push_back(made.path);
    }
    std::string text = "{\"tool\": \"bench_memory\", \"runs\": " + std::to_string(o.runs) + ", \"files\": [";
    int code = 0;
    for (std::size_t k = 0; k < o.files.size(); ++k) {
      try {
        auto m = measure(o.files[k], o.runs);
        print(o.files[k], m);
        text += (k ? ", " : "") + json_of(o.files[k], m);
      } catch (const safetensors::Error& e) {
        std::fprintf(stderr, "bench_memory: %s\n", e.what());
        code = 1;
      }
    }
    if (json) {
      json->write(text + "]}\n");
      json->close();
    }
    return checked::stdout_arrived("bench_memory") ? code : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory: %s\n", e.what());
    return 1;
  }
}
