// `safetensors validate [--header-only] [--lenient] [--allow-trailing-bytes] FILE|INDEX...`:
// every header rule, then every data byte readable (unless --header-only); for an index, every
// shard against the index. One OK or FAIL line per file (the error kind and message), what a
// lenient read accepted listed under its OK line, progress on stderr when it is a terminal.
#include <safetensors/safetensors.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cli.hpp"

namespace cli {

namespace {

using safetensors::Backend;
using safetensors::SafeOpen;

/// Progress on stderr when it is a terminal, at most ten updates a second.
class Progress {
 public:
  explicit Progress(std::size_t files) : on_(::isatty(2) == 1), files_(files) {}
  void update(std::size_t index, const fs::path& path, std::uint64_t done, std::uint64_t total) {
    if (!on_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done != total) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %3.0f%% of %s bytes", index + 1, files_,
                 printable_path(path.filename()).c_str(),
                 total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                 with_commas(total).c_str());
  }
  void clear() {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
  std::size_t files_;
  std::chrono::steady_clock::time_point last_{};
};

struct Arguments {
  bool header_only = false;
  bool lenient = false;
  bool allow_trailing = false;
  std::vector<fs::path> paths;
};

Arguments read_arguments(const std::vector<std::string>& args) {
  Arguments out;
  for (const auto& a : args) {
    if (a == "--header-only") {
      out.header_only = true;
    } else if (a == "--lenient") {
      out.lenient = true;
    } else if (a == "--allow-trailing-bytes") {
      out.allow_trailing = true;
    } else if (is_option(a)) {
      unknown_option("validate", a);
    } else {
      out.paths.emplace_back(a);
    }
  }
  if (out.paths.empty()) throw UsageError("validate needs at least one file");
  return out;
}

/// Reads every data byte of `f`, in 16 MiB pieces.
void read_all(const SafeOpen& f, std::size_t index, const fs::path& path, Progress& progress) {
  std::vector<std::byte> buffer(16u << 20);
  std::uint64_t total = f.data_size();
  for (std::uint64_t at = 0; at < total; at += buffer.size()) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), total - at));
    f.read_data(static_cast<std::size_t>(at), {buffer.data(), n});
    progress.update(index, path, at + n, total);
  }
}

/// What one file turned out to hold, and what a lenient read accepted in it.
struct Checked {
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;
  std::vector<std::string> missing;
  std::vector<std::pair<fs::path, std::uint64_t>> trailing;

  /// Counts the bytes of one file just validated (its own length: measuring the path again
  /// could report another file's size, or fail, when another process replaces or removes it).
  void add_file(const fs::path& path, const SafeOpen& f) {
    bytes += f.data_offset() + f.data_size() + f.trailing_bytes();
    if (f.trailing_bytes() > 0) trailing.emplace_back(path, f.trailing_bytes());
  }
};

Checked check_index(const Arguments& a, std::size_t i, Progress& progress) {
  const auto& path = a.paths[i];
  Checked out;
  safetensors::Checkpoint ckpt(
      path, {.backend = Backend::Read, .allow_trailing_bytes = a.allow_trailing, .lenient = a.lenient});
  if (a.lenient) {
    out.missing = ckpt.missing();  // opens every shard
  } else {
    for (const auto& k : ckpt.keys()) (void)ckpt.info(k);  // opens and checks every shard
  }
  for (const auto& shard : ckpt.shard_paths()) {
    SafeOpen f(shard, {.backend = Backend::Read, .allow_trailing_bytes = a.allow_trailing});
    if (!a.header_only) read_all(f, i, shard, progress);
    out.add_file(shard, f);
  }
  out.tensors = ckpt.size() - out.missing.size();
  return out;
}

Checked check_file(const Arguments& a, std::size_t i, Progress& progress) {
  const auto& path = a.paths[i];
  Checked out;
  SafeOpen f(path, {.backend = Backend::Read, .allow_trailing_bytes = a.allow_trailing});
  if (!a.header_only) read_all(f, i, path, progress);
  out.tensors = f.size();
  out.add_file(path, f);
  return out;
}

/// The OK line, then what lenient reading accepted in the file: never silent.
void print_ok(const fs::path& path, const Checked& c) {
  std::printf("OK   %s (%zu tensors, %s bytes)\n", printable_path(path).c_str(), c.tensors,
              with_commas(c.bytes).c_str());
  for (const auto& name : c.missing) {
    std::printf("     missing: tensor `%s` is listed in the index but absent from its shard\n",
                printable(name).c_str());
  }
  for (const auto& [shard, n] : c.trailing) {
    std::printf("     trailing: %s has %s bytes after its last tensor\n", printable_path(shard).c_str(),
                with_commas(n).c_str());
  }
}

void print_error(const fs::path& path, const safetensors::Error& e) {
  std::printf("FAIL %s: %s: %s\n", printable_path(path).c_str(),
              std::string(safetensors::to_string(e.kind())).c_str(), printable(e.what()).c_str());
}

}  // namespace

int validate_command(const std::vector<std::string>& args) {
  Arguments a = read_arguments(args);
  Progress progress(a.paths.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.paths.size(); ++i) {
    try {
      Checked c = is_index(a.paths[i]) ? check_index(a, i, progress) : check_file(a, i, progress);
      progress.clear();
      print_ok(a.paths[i], c);
    } catch (const safetensors::Error& e) {
      progress.clear();
      print_error(a.paths[i], e);
      ++bad;
    }
  }
  if (a.paths.size() > 1) std::printf("%zu of %zu files valid\n", a.paths.size() - bad, a.paths.size());
  return bad ? 1 : 0;
}

}  // namespace cli
