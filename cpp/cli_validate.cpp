// `safetensors validate [--header-only] [--lenient] [--allow-trailing-bytes] [--cache[=DIR]] [--json]
// FILE|URL|INDEX...`: every header rule, then every data byte readable (unless --header-only); for an index,
// every shard against the index, each shard opened once. One OK or FAIL line per file (the error kind and
// message), what a lenient read accepted listed under its OK line, progress on stderr when output is watched
// (`shows_progress`); with --json one document, a line per file.
#include <safetensors/safetensors.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.hpp"

namespace cli {

namespace {

using safetensors::Backend;
using safetensors::SafeOpen;

/// Progress on stderr when `shows_progress`, at most ten updates a second.
class Progress {
 public:
  Progress(std::size_t files, bool json) : on_(shows_progress(json)), files_(files) {}
  void update(std::size_t index, std::string_view path, std::uint64_t done, std::uint64_t total) {
    if (!on_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done != total) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %3.0f%% of %s bytes", index + 1, files_,
                 printable(path.substr(std::min(path.size(), path.rfind('/') + 1))).c_str(),
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
  bool json = false;
  std::optional<fs::path> cache;  // --cache[=DIR]: URLs fetched whole into the local cache
  std::vector<Location> paths;
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
    } else if (a == "--json") {
      out.json = true;
    } else if (a == "--cache") {
      out.cache = fs::path();  // the user's cache directory
    } else if (a.starts_with("--cache=")) {
      out.cache = fs::path(a.substr(std::string_view("--cache=").size()));
      if (out.cache->empty()) throw UsageError("validate --cache=DIR needs a directory");
    } else if (is_option(a)) {
      unknown_option("validate", a);
    } else {
      out.paths.emplace_back(a);  // a URL or a path, told apart from the text as typed
    }
  }
  if (out.paths.empty()) throw UsageError("validate needs at least one file");
  return out;
}

/// Reads `total` data bytes through `read(offset, dst)`, in 16 MiB pieces.
template <class Read>
void read_all(std::uint64_t total, std::size_t index, std::string_view path, Progress& progress,
              Read&& read) {
  std::vector<std::byte> buffer(16u << 20);
  for (std::uint64_t at = 0; at < total; at += buffer.size()) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), total - at));
    read(static_cast<std::size_t>(at), std::span(buffer.data(), n));
    progress.update(index, path, at + n, total);
  }
}

/// What one file turned out to hold, and what a lenient read accepted in it.
struct Checked {
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;  // the lengths validated, not measured again
  std::vector<std::string> missing;
  std::vector<std::pair<std::string, std::uint64_t>> trailing;
};

/// An index and every shard: each shard is opened once, by the checkpoint, which checks it
/// against the index and then reads its data (opening the path again could read another file,
/// one put there meanwhile).
Checked check_index(const Arguments& a, std::size_t i, Progress& progress) {
  const auto& path = a.paths[i];
  Checked out;
  // A URL: the index, then each shard's bytes fetched as they are read.
  safetensors::Checkpoint ckpt = open_checkpoint(
      path, {.backend = Backend::Read, .allow_trailing_bytes = a.allow_trailing, .lenient = a.lenient},
      a.header_only, a.cache);
  if (a.lenient) {
    out.missing = ckpt.missing();  // opens every shard
  } else {
    for (const auto& k : ckpt.keys()) (void)ckpt.info(k);  // opens and checks every shard
  }
  auto shards = ckpt.shard_paths();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    auto sizes = ckpt.shard_sizes(s);
    if (!a.header_only) {
      read_all(sizes.data, i, shards[s], progress,
               [&](std::size_t at, std::span<std::byte> dst) { ckpt.read_shard_data(s, at, dst); });
    }
    out.bytes += sizes.file();
    if (sizes.trailing > 0) out.trailing.emplace_back(shards[s], sizes.trailing);
  }
  out.tensors = ckpt.size() - out.missing.size();
  return out;
}

Checked check_file(const Arguments& a, std::size_t i, Progress& progress) {
  const auto& path = a.paths[i];
  Checked out;
  // A URL: its bytes fetched as they are read (header only with --header-only).
  SafeOpen f = open_file(path, {.backend = Backend::Read, .allow_trailing_bytes = a.allow_trailing},
                         a.header_only, a.cache);
  if (!a.header_only) {
    read_all(f.data_size(), i, path.text(), progress,
             [&](std::size_t at, std::span<std::byte> dst) { f.read_data(at, dst); });
  }
  out.tensors = f.size();
  out.bytes = f.data_offset() + f.data_size() + f.trailing_bytes();
  if (f.trailing_bytes() > 0) out.trailing.emplace_back(path.text(), f.trailing_bytes());
  return out;
}

/// The OK line, then what lenient reading accepted in the file: never silent.
void print_ok(const Location& path, const Checked& c) {
  std::printf("OK   %s (%zu tensors, %s bytes)\n", printable(path.text()).c_str(), c.tensors,
              with_commas(c.bytes).c_str());
  for (const auto& name : c.missing) {
    std::printf("     missing: tensor `%s` is listed in the index but absent from its shard\n",
                printable(name).c_str());
  }
  for (const auto& [shard, n] : c.trailing) {
    std::printf("     trailing: %s has %s bytes after its last tensor\n", printable(shard).c_str(),
                with_commas(n).c_str());
  }
}

void print_error(const Location& path, const safetensors::Error& e) {
  std::printf("FAIL %s: %s: %s\n", printable(path.text()).c_str(),
              std::string(safetensors::to_string(e.kind())).c_str(), printable(e.what()).c_str());
}

/// One file's line of the --json document.
Json ok_json(const Location& path, const Checked& c) {
  Json trailing = Json::array();
  for (const auto& [shard, n] : c.trailing) trailing.push_back(Json::object({{"path", shard}, {"bytes", n}}));
  return Json::object({{"path", path.text()},
                       {"valid", true},
                       {"tensors", c.tensors},
                       {"bytes", c.bytes},
                       {"missing", c.missing},
                       {"trailing", std::move(trailing)}});
}

Json error_json(const Location& path, const safetensors::Error& e) {
  return Json::object(
      {{"path", path.text()},
       {"valid", false},
       {"error", Json::object({{"kind", safetensors::to_string(e.kind())}, {"message", e.what()}})}});
}

}  // namespace

int validate_command(const std::vector<std::string>& args) {
  Arguments a = read_arguments(args);
  Progress progress(a.paths.size(), a.json);
  std::size_t bad = 0;
  std::string files;  // --json: one line per file
  for (std::size_t i = 0; i < a.paths.size(); ++i) {
    Json line;
    try {
      Checked c = a.paths[i].is_index() ? check_index(a, i, progress) : check_file(a, i, progress);
      progress.clear();
      if (a.json) {
        line = ok_json(a.paths[i], c);
      } else {
        print_ok(a.paths[i], c);
      }
    } catch (const safetensors::Error& e) {
      progress.clear();
      if (a.json) {
        line = error_json(a.paths[i], e);
      } else {
        print_error(a.paths[i], e);
      }
      ++bad;
    }
    if (a.json) files += (i ? ",\n  " : "\n  ") + json_text(line, JsonLayout::Spaced);
  }
  if (a.json) {
    std::printf("{\"files\": [%s\n], \"valid\": %zu, \"total\": %zu}\n", files.c_str(), a.paths.size() - bad,
                a.paths.size());
  } else if (a.paths.size() > 1) {
    std::printf("%zu of %zu files valid\n", a.paths.size() - bad, a.paths.size());
  }
  return bad ? 1 : 0;
}

}  // namespace cli
