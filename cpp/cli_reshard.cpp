// `safetensors reshard IN OUT [--max-shard-size SIZE] [--align N] [--prefix NAME] [--no-sync]
// [--json]`: a file or a checkpoint (IN) rewritten as a checkpoint in the directory OUT, split as
// huggingface_hub splits (`ShardedWriter`), through one 64 MiB buffer (cpp/reshard.hpp). OUT is
// made if missing (its parent must exist); nothing in it changes until every shard is complete,
// then the set is published (docs/writing.md). Progress on stderr when standard output and
// standard error are terminals; a line per file written, or with --json one document.
#include <safetensors/safetensors.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "reshard.hpp"

namespace cli {

namespace {

struct Arguments {
  fs::path in, out;  // local: a URL is refused for either (`local_path`)
  bool index = false;
  safetensors::ShardOptions shards;
  safetensors::SaveOptions save;
  bool json = false;
};

/// A size as huggingface_hub's `parse_size_to_int` reads it ("5GB", "500MB", "1.5GB": decimal
/// units KB, MB, GB, TB in any case), or binary units (KiB, MiB, GiB, TiB), or plain bytes.
std::uint64_t parse_size(const std::string& text) {
  struct Unit {
    std::string_view name;
    double bytes;
  };
  static constexpr Unit kUnits[] = {
      {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
      {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
      {"B", 1.0}};
  std::string upper;
  for (char c : text) upper += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  double scale = 1.0;
  std::string_view number = upper;
  for (const auto& u : kUnits) {
    if (number.size() > u.name.size() && number.substr(number.size() - u.name.size()) == u.name) {
      number.remove_suffix(u.name.size());
      scale = u.bytes;
      break;
    }
  }
  while (!number.empty() && number.back() == ' ') number.remove_suffix(1);
  double value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  const double bytes = value * scale;
  if (ec != std::errc() || end != number.data() + number.size() || !(bytes >= 1) || bytes > 1.8e19) {
    throw UsageError("reshard: '" + printable(text) +
                     "' is not a shard size (a number of bytes, or with a unit: 5GB, 500MB, 2GiB)");
  }
  return static_cast<std::uint64_t>(bytes);
}

std::uint64_t parse_count(const std::string& option, const std::string& text) {
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw UsageError("reshard: " + option + " needs a number of bytes, not '" + printable(text) + "'");
  }
  return n;
}

Arguments read_arguments(const std::vector<std::string>& args) {
  Arguments a;
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& arg = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw UsageError("reshard: " + arg + " needs a value");
      return args[++i];
    };
    if (arg == "--max-shard-size") {
      a.shards.max_shard_size = parse_size(value());
    } else if (arg == "--align") {
      a.save.alignment = static_cast<std::size_t>(parse_count(arg, value()));
    } else if (arg == "--prefix") {
      a.shards.prefix = value();
    } else if (arg == "--no-sync") {
      a.save.sync = false;
    } else if (arg == "--json") {
      a.json = true;
    } else if (is_option(arg)) {
      unknown_option("reshard", arg);
    } else {
      paths.push_back(arg);
    }
  }
  if (paths.size() != 2)
    throw UsageError("reshard needs an input (a file or an index) and an output directory");
  const Location in(paths[0]), out(paths[1]);
  a.in = local_path(in, "reshard reads local files; download it first");
  a.out = local_path(out, "reshard writes a local directory; upload it afterwards");
  a.index = in.is_index();
  return a;
}

/// Progress on stderr when `shows_progress`, at most ten updates a second.
class Progress {
 public:
  explicit Progress(bool json) : on_(shows_progress(json)) {}
  void update(std::uint64_t done, std::uint64_t total) {
    if (!on_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done != total) return;
    last_ = now;
    constexpr int kWidth = 30;
    const double part = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(part * kWidth);
    std::fprintf(stderr, "\r\033[K[%-*s] %3.0f%% of %s bytes", kWidth,
                 std::string(static_cast<std::size_t>(filled), '#').c_str(), 100.0 * part,
                 with_commas(total).c_str());
  }
  void clear() {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

int reshard_command(const std::vector<std::string>& args) {
  const Arguments a = read_arguments(args);
  const bool index = a.index;
  safetensors::Checkpoint from(a.in, {.backend = safetensors::Backend::Read});
  std::error_code ec;
  if (!fs::is_directory(a.out) && !fs::create_directory(a.out, ec)) {
    throw safetensors::Error(safetensors::ErrorKind::Io,
                             "cannot make the output directory " + a.out.string() + ": " +
                                 (ec ? ec.message() : std::string("something else is there")));
  }
  std::uint64_t total = 0;
  for (const auto& name : from.keys()) total += from.info(name).byte_size();
  Progress progress(a.json);
  std::vector<fs::path> files;
  try {
    files = reshard::copy(from, index, a.out, a.shards, a.save, std::size_t{64} << 20,
                          [&](std::uint64_t done, std::uint64_t all) { progress.update(done, all); });
  } catch (...) {
    progress.clear();
    throw;
  }
  progress.clear();
  const std::size_t shard_count = files.size() > 1 ? files.size() - 1 : 1;
  if (a.json) {
    std::vector<std::string> names;
    for (const auto& f : files) names.push_back(f.string());
    const bool has_index = files.size() > 1;
    std::puts(json_text(Json::object({{"input", a.in.string()},
                                      {"output", a.out.string()},
                                      {"files", names},
                                      {"index", has_index ? Json(files.back().string()) : Json()},
                                      {"shards", shard_count},
                                      {"tensors", from.size()},
                                      {"total_size", total}}),
                        JsonLayout::Spaced)
                  .c_str());
  } else {
    for (const auto& f : files) std::printf("wrote %s\n", printable_path(f).c_str());
    std::printf("%zu shard%s, %zu tensors, %s bytes of tensors\n", shard_count, shard_count == 1 ? "" : "s",
                from.size(), with_commas(total).c_str());
  }
  return 0;
}

}  // namespace cli
