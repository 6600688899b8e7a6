// `safetensors`: inspect, validate, edit the metadata of, and time safetensors files, through
// the public C++ API only. Usage text below; exit codes: 0 success, 1 a file is invalid or an
// operation failed, 2 the command line is wrong.
#include <safetensors/safetensors.hpp>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "measure.hpp"

#ifndef SAFETENSORS_VERSION
#define SAFETENSORS_VERSION "unknown"
#endif

namespace {

namespace fs = std::filesystem;
using safetensors::Backend;
using safetensors::Checkpoint;
using safetensors::SafeOpen;

constexpr const char* kUsage = R"(safetensors: inspect, validate and edit safetensors files

usage:
  safetensors inspect FILE|INDEX [--json]
      Metadata, then every tensor (name, dtype, shape, bytes, offset), then totals
      (parameters, bytes by dtype). Reads only headers. INDEX is a sharded checkpoint's
      model.safetensors.index.json.
  safetensors validate [--header-only] FILE|INDEX...
      Checks each file: every header rule, then every data byte readable (unless
      --header-only); for an index, every shard against the index. Prints OK or the error
      kind, message and hint per file; shows progress on a terminal.
  safetensors metadata FILE [--set KEY=VALUE]... [--delete KEY]...
      Prints the metadata, or rewrites the file with the changes: atomically, through the
      writer, with every tensor's bytes compared with the original before the file is replaced.
  safetensors bench FILE [--runs N]
      Quick figures: open (keys and every view), load (every byte), load into owned memory,
      and a plain read() of the file for comparison.
  safetensors stats FILE|INDEX [TENSOR...] [--json]
      Per tensor: min, max, mean, std of the finite values; counts of NaN, +Inf, -Inf, zeros.
  safetensors [COMMAND] --help | --version

exit codes:
  0  success (validate: every file is valid)
  1  a file is invalid, or an operation failed (the error kind and message are printed)
  2  the command line is wrong
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An argument that looks like an option but is none of the command's: a usage error rather
/// than a file name (a file whose name starts with "-" can be given as ./-name).
[[noreturn]] void unknown_option(const std::string& command, const std::string& arg) {
  throw UsageError(command + ": unknown option '" + arg + "'");
}

bool is_option(const std::string& a) { return a.size() > 1 && a[0] == '-'; }

std::string with_commas(std::uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string json_string(std::string_view v) {
  std::string out = "\"";
  for (char ch : v) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

bool is_index(const fs::path& p) { return p.extension() == ".json"; }

void print_error(const fs::path& path, const safetensors::Error& e) {
  std::printf("FAIL %s: %s: %s\n", path.c_str(), std::string(safetensors::to_string(e.kind())).c_str(), e.what());
}

// ---- inspect -----------------------------------------------------------------------------

struct Row {
  std::string name;
  safetensors::TensorInfo info;
  std::string shard;  // empty for a single file
};

int inspect(const std::vector<std::string>& args) {
  bool json = false;
  std::optional<fs::path> path;
  for (const auto& a : args) {
    if (a == "--json") json = true;
    else if (is_option(a)) unknown_option("inspect", a);
    else if (!path) path = a;
    else throw UsageError("inspect takes one file");
  }
  if (!path) throw UsageError("inspect needs a file");

  std::vector<Row> rows;
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;
  std::uint64_t file_bytes = 0, header_bytes = 0;
  std::size_t shards = 1;
  if (is_index(*path)) {
    Checkpoint ckpt(*path, {Backend::Read});
    metadata = ckpt.metadata();
    has_metadata = ckpt.has_metadata();
    shards = ckpt.shard_count();
    for (const auto& k : ckpt.keys()) rows.push_back({k, ckpt.info(k), ckpt.shard_of(k).filename().string()});
    for (const auto& p : ckpt.shard_paths()) file_bytes += fs::file_size(p);
  } else {
    SafeOpen f(*path, {Backend::Read});  // the read backend reads the header and nothing else
    metadata = f.metadata();
    has_metadata = f.has_metadata();
    for (const auto& k : f.offset_keys()) rows.push_back({k, f.info(k), {}});
    file_bytes = fs::file_size(*path);
    header_bytes = f.header_size();
  }

  std::uint64_t params = 0, bytes = 0;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_dtype;  // params, bytes
  for (const auto& r : rows) {
    params += r.info.numel();
    bytes += r.info.byte_size();
    auto& d = by_dtype[std::string(safetensors::to_string(r.info.dtype))];
    d.first += r.info.numel();
    d.second += r.info.byte_size();
  }

  if (json) {
    std::string o = "{\"path\":" + json_string(path->string()) + ",\"file_bytes\":" + std::to_string(file_bytes);
    if (!is_index(*path)) o += ",\"header_bytes\":" + std::to_string(header_bytes);
    o += ",\"shards\":" + std::to_string(shards) + ",\"metadata\":";
    if (has_metadata) {
      o += "{";
      bool first = true;
      for (const auto& [k, v] : metadata) {
        o += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
        first = false;
      }
      o += "}";
    } else {
      o += "null";
    }
    o += ",\"tensors\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::string dims;
      for (std::size_t j = 0; j < r.info.shape.size(); ++j) dims += (j ? "," : "") + std::to_string(r.info.shape[j]);
      o += (i ? "," : "") + std::string("{\"name\":") + json_string(r.name) + ",\"dtype\":\"" +
           std::string(safetensors::to_string(r.info.dtype)) + "\",\"shape\":[" + dims +
           "],\"bytes\":" + std::to_string(r.info.byte_size()) + ",\"data_offsets\":[" +
           std::to_string(r.info.data_offsets.first) + "," + std::to_string(r.info.data_offsets.second) + "]";
      if (!r.shard.empty()) o += ",\"shard\":" + json_string(r.shard);
      o += "}";
    }
    o += "],\"totals\":{\"tensors\":" + std::to_string(rows.size()) + ",\"parameters\":" + std::to_string(params) +
         ",\"bytes\":" + std::to_string(bytes) + ",\"by_dtype\":{";
    bool first = true;
    for (const auto& [d, pb] : by_dtype) {
      o += (first ? "" : ",") + json_string(d) + ":{\"parameters\":" + std::to_string(pb.first) +
           ",\"bytes\":" + std::to_string(pb.second) + "}";
      first = false;
    }
    o += "}}}";
    std::puts(o.c_str());
    return 0;
  }

  std::printf("%s: %s bytes", path->c_str(), with_commas(file_bytes).c_str());
  if (is_index(*path)) std::printf(" in %zu shards\n", shards);
  else std::printf(", header %s bytes\n", with_commas(header_bytes).c_str());
  if (!has_metadata) {
    std::printf("metadata: none\n");
  } else {
    std::printf("metadata:\n");
    for (const auto& [k, v] : metadata) std::printf("  %s: %s\n", k.c_str(), v.c_str());
  }
  std::size_t wn = 4, ws = 5;
  for (const auto& r : rows) {
    wn = std::max(wn, r.name.size());
    ws = std::max(ws, shape_text(r.info.shape).size());
  }
  std::printf("tensors (%zu):\n", rows.size());
  std::printf("  %-*s  %-11s  %-*s  %15s  %15s%s\n", static_cast<int>(wn), "name", "dtype", static_cast<int>(ws), "shape",
              "bytes", "offset", is_index(*path) ? "  shard" : "");
  for (const auto& r : rows) {
    std::printf("  %-*s  %-11s  %-*s  %15s  %15s%s%s\n", static_cast<int>(wn), r.name.c_str(),
                std::string(safetensors::to_string(r.info.dtype)).c_str(), static_cast<int>(ws),
                shape_text(r.info.shape).c_str(), with_commas(r.info.byte_size()).c_str(),
                with_commas(r.info.data_offsets.first).c_str(), r.shard.empty() ? "" : "  ", r.shard.c_str());
  }
  std::printf("totals: %s parameters, %s bytes\n", with_commas(params).c_str(), with_commas(bytes).c_str());
  for (const auto& [d, pb] : by_dtype) {
    std::printf("  %-11s %s parameters, %s bytes\n", d.c_str(), with_commas(pb.first).c_str(), with_commas(pb.second).c_str());
  }
  return 0;
}

// ---- validate ----------------------------------------------------------------------------

/// Progress on stderr when it is a terminal, at most ten updates a second.
class Progress {
 public:
  explicit Progress(std::size_t files) : on_(::isatty(2) == 1), files_(files) {}
  void update(std::size_t index, const fs::path& path, std::uint64_t done, std::uint64_t total) {
    if (!on_) return;
    auto now = measure::Clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done != total) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %3.0f%% of %s bytes", index + 1, files_, path.filename().c_str(),
                 total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                 with_commas(total).c_str());
  }
  void clear() {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
  std::size_t files_;
  measure::Clock::time_point last_{};
};

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

int validate(const std::vector<std::string>& args) {
  bool header_only = false;
  std::vector<fs::path> paths;
  for (const auto& a : args) {
    if (a == "--header-only") header_only = true;
    else if (is_option(a)) unknown_option("validate", a);
    else paths.emplace_back(a);
  }
  if (paths.empty()) throw UsageError("validate needs at least one file");
  Progress progress(paths.size());
  int bad = 0;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const auto& path = paths[i];
    try {
      std::size_t tensors = 0;
      std::uint64_t bytes = 0;
      if (is_index(path)) {
        Checkpoint ckpt(path, {Backend::Read});
        for (const auto& k : ckpt.keys()) (void)ckpt.info(k);  // opens and checks every shard
        for (const auto& shard : ckpt.shard_paths()) {
          SafeOpen f(shard, {Backend::Read});
          if (!header_only) read_all(f, i, shard, progress);
          bytes += fs::file_size(shard);
        }
        tensors = ckpt.size();
      } else {
        SafeOpen f(path, {Backend::Read});
        if (!header_only) read_all(f, i, path, progress);
        tensors = f.size();
        bytes = fs::file_size(path);
      }
      progress.clear();
      std::printf("OK   %s (%zu tensors, %s bytes)\n", path.c_str(), tensors, with_commas(bytes).c_str());
    } catch (const safetensors::Error& e) {
      progress.clear();
      print_error(path, e);
      ++bad;
    }
  }
  if (paths.size() > 1) std::printf("%zu of %zu files valid\n", paths.size() - static_cast<std::size_t>(bad), paths.size());
  return bad ? 1 : 0;
}

// ---- metadata ----------------------------------------------------------------------------

int metadata(const std::vector<std::string>& args) {
  std::optional<fs::path> path;
  std::map<std::string, std::string> sets;
  std::set<std::string> deletes;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "--set" || a == "--delete") {
      if (i + 1 >= args.size()) throw UsageError(a + " needs an argument");
      const auto& v = args[++i];
      if (a == "--delete") {
        deletes.insert(v);
        continue;
      }
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0) throw UsageError("--set takes KEY=VALUE, got '" + v + "'");
      sets[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (is_option(a)) {
      unknown_option("metadata", a);
    } else if (!path) {
      path = a;
    } else {
      throw UsageError("metadata takes one file");
    }
  }
  if (!path) throw UsageError("metadata needs a file");
  if (is_index(*path)) throw UsageError("metadata edits single files, not an index");

  SafeOpen original(*path);
  auto meta = original.metadata();
  if (sets.empty() && deletes.empty()) {
    if (!original.has_metadata()) std::puts("(no metadata)");
    for (const auto& [k, v] : meta) std::printf("%s: %s\n", k.c_str(), v.c_str());
    return 0;
  }
  for (const auto& k : deletes) {
    if (!meta.erase(k)) std::fprintf(stderr, "note: no key '%s' to delete\n", k.c_str());
  }
  for (const auto& [k, v] : sets) meta[k] = v;

  // Write beside the file, compare every tensor with the original, then swap it in.
  std::vector<std::pair<std::string, safetensors::TensorView>> tensors;
  for (const auto& k : original.keys()) tensors.emplace_back(k, original.get_tensor(k));
  fs::path staged = path->parent_path() / ("." + path->filename().string() + ".metadata-" + std::to_string(::getpid()));
  try {
    safetensors::save_file(staged, tensors, meta);
    SafeOpen written(staged);
    for (const auto& [name, view] : tensors) {
      auto w = written.get_tensor(name);
      if (w.dtype != view.dtype || w.shape != view.shape || w.data.size() != view.data.size() ||
          !std::equal(w.data.begin(), w.data.end(), view.data.begin())) {
        throw safetensors::Error(safetensors::ErrorKind::Internal, "tensor `" + name + "` differs after rewriting");
      }
    }
    if (written.size() != original.size() || written.metadata() != meta) {
      throw safetensors::Error(safetensors::ErrorKind::Internal, "the rewritten file does not hold what was asked");
    }
    fs::rename(staged, *path);
  } catch (...) {
    std::error_code ec;
    fs::remove(staged, ec);
    throw;
  }
  std::printf("updated %s: %zu tensors unchanged, metadata now has %zu keys\n", path->c_str(), tensors.size(), meta.size());
  return 0;
}

// ---- bench -------------------------------------------------------------------------------

int bench(const std::vector<std::string>& args) {
  std::optional<fs::path> path;
  int runs = 5;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--runs") {
      if (i + 1 >= args.size()) throw UsageError("--runs needs a number");
      const std::string& v = args[++i];
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), runs);
      if (ec != std::errc{} || end != v.data() + v.size() || runs < 1 || runs > 100000) {
        throw UsageError("--runs takes a number from 1 to 100000, got '" + v + "'");
      }
    } else if (is_option(args[i])) {
      unknown_option("bench", args[i]);
    } else if (!path) {
      path = args[i];
    } else {
      throw UsageError("bench takes one file");
    }
  }
  if (!path) throw UsageError("bench needs a file");
  std::uint64_t size = 0;
  {
    SafeOpen probe(*path);  // a missing or malformed file fails here, with its error kind
    size = fs::file_size(*path);
  }
  measure::warm(*path);
  std::uint64_t sink = 0;
  auto open = measure::median(measure::repeat(std::max(runs, 11), [&] {
    SafeOpen f(*path);
    for (const auto& k : f.keys()) sink += f.get_tensor(k).shape.size();
  }));
  auto load = measure::median(measure::repeat(runs, [&] {
    SafeOpen f(*path);
    for (const auto& k : f.offset_keys()) {
      auto v = f.get_tensor(k);
      for (std::size_t i = 0; i < v.data.size(); i += 64) sink += static_cast<std::uint8_t>(v.data[i]);
    }
  }));
  auto copy = measure::median(measure::repeat(runs, [&] {
    SafeOpen f(*path, {Backend::Read});
    for (const auto& k : f.offset_keys()) sink += f.get_tensor(k).data.size();
  }));
  measure::MappedBuffer target(size);
  auto read = measure::median(measure::repeat(runs, [&] { measure::read_whole_file(*path, target.data); }));
  auto gbps = [&](double s) { return static_cast<double>(size) / s / 1e9; };
  std::printf("%s: %s bytes, %s\n", path->c_str(), with_commas(size).c_str(), measure::machine().c_str());
  std::printf("  open (keys + every view)      %10.3f ms\n", open * 1e3);
  std::printf("  load (every byte, mapped)     %10.3f ms  %6.2f GB/s\n", load * 1e3, gbps(load));
  std::printf("  load into owned memory        %10.3f ms  %6.2f GB/s\n", copy * 1e3, gbps(copy));
  std::printf("  plain read() of the file      %10.3f ms  %6.2f GB/s\n", read * 1e3, gbps(read));
  return sink == 42 ? 0 : 0;
}

}  // namespace

int stats_command(const std::vector<std::string>& args);  // cli_stats.cpp

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("safetensors %s\n", SAFETENSORS_VERSION);
    return 0;
  }
  std::string command = args[0];
  args.erase(args.begin());
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--set" || args[i] == "--delete" || args[i] == "--runs") {
      ++i;  // the next argument is a value, even if it reads "--help"
    } else if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  try {
    if (command == "inspect") return inspect(args);
    if (command == "validate") return validate(args);
    if (command == "metadata") return metadata(args);
    if (command == "bench") return bench(args);
    if (command == "stats") return stats_command(args);  // cli_stats.cpp
    throw UsageError("unknown command '" + command + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "safetensors: %s\n\n%s", e.what(), kUsage);
    return 2;
  } catch (const safetensors::Error& e) {
    std::fprintf(stderr, "safetensors: %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors: %s\n", e.what());
    return 1;
  }
}
