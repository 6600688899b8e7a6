// `safetensors stats FILE|INDEX [TENSOR...] [--json]`: per tensor, the minimum, maximum, mean
// and standard deviation of its finite values, and counts of NaN, +Inf, -Inf and zeros, for
// every float and integer dtype (through safetensors::convert, in 1 Mi-element chunks, so
// memory stays bounded whatever the tensor's size). Progress on a terminal; exit codes as the
// other commands: 0 success, 1 an error (printed with its kind), 2 a usage error.
#include <safetensors/safetensors.hpp>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli.hpp"

namespace cli {

namespace {

using safetensors::Dtype;

constexpr const char* kStatsUsage =
    "usage: safetensors stats FILE|INDEX [TENSOR...] [--json]\n"
    "  Per tensor: min, max, mean and population standard deviation of the finite values,\n"
    "  and counts of NaN, +Inf, -Inf and zeros (complex tensors are listed as skipped).\n";

struct Stats {
  std::uint64_t count = 0;  // finite values
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double mean = 0, m2 = 0;  // running mean and sum of squared deviations (Chan et al.)
  std::uint64_t nan = 0, pos_inf = 0, neg_inf = 0, zeros = 0;

  void add_chunk(std::span<const double> xs) {
    std::uint64_t n = 0;
    double sum = 0, lo = min, hi = max;
    for (double x : xs) {
      if (std::isnan(x))
        ++nan;
      else if (std::isinf(x))
        ++(x > 0 ? pos_inf : neg_inf);
      else {
        ++n;
        sum += x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        if (x == 0) ++zeros;
      }
    }
    if (n == 0) return;
    double cmean = sum / static_cast<double>(n), cm2 = 0;
    for (double x : xs) {
      if (std::isfinite(x)) cm2 += (x - cmean) * (x - cmean);
    }
    // Merge the chunk's (n, mean, m2) into the running one: stable for any number of chunks.
    double total = static_cast<double>(count + n);
    double delta = cmean - mean;
    mean += delta * static_cast<double>(n) / total;
    m2 += cm2 + delta * delta * static_cast<double>(count) * static_cast<double>(n) / total;
    count += n;
    min = lo;
    max = hi;
  }
  [[nodiscard]] double stddev() const { return count ? std::sqrt(m2 / static_cast<double>(count)) : 0; }
};

/// Elements per conversion chunk: a multiple of 4, so F4 and F6 chunks end on byte boundaries.
constexpr std::size_t kChunk = std::size_t{1} << 20;

Stats stats_of(const safetensors::TensorView& t, const std::function<void(std::size_t)>& progress) {
  Stats s;
  std::size_t numel = t.numel();
  std::vector<double> buf(std::min(numel, kChunk));
  std::size_t bits = safetensors::bit_size(t.dtype);
  for (std::size_t at = 0; at < numel; at += kChunk) {
    std::size_t n = std::min(kChunk, numel - at);
    auto bytes = t.data.subspan(at * bits / 8, n * bits / 8);
    safetensors::convert(safetensors::TensorView{t.dtype, {n}, bytes, {}}, Dtype::F64,
                         std::as_writable_bytes(std::span(buf.data(), n)));
    s.add_chunk({buf.data(), n});
    progress(at + n);
  }
  return s;
}

/// Percent done of one tensor on stderr when it is a terminal, at most ten updates a second.
class Progress {
 public:
  Progress() : on_(::isatty(2) == 1) {}
  /// The callback for tensor `i` of `count`.
  std::function<void(std::size_t)> of(std::size_t i, std::size_t count, const std::string& name,
                                      std::size_t numel) {
    return [this, i, count, name = printable(name), numel](std::size_t done) {
      auto now = std::chrono::steady_clock::now();
      if (!on_ || now - last_ < std::chrono::milliseconds(100)) return;
      last_ = now;
      std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %3.0f%%", i + 1, count, name.c_str(),
                   numel ? 100.0 * static_cast<double>(done) / static_cast<double>(numel) : 100.0);
    };
  }
  void clear() {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

/// One tensor's figures; `stats` is empty for a tensor whose values have no order (C64).
struct Figures {
  std::string name;
  Dtype dtype;
  std::vector<std::size_t> shape;
  std::size_t numel;
  std::optional<Stats> stats;
};

constexpr const char* kSkipped = "complex values have no order";

Json figures_json(const Figures& f) {
  Json t{
      {"name", f.name}, {"dtype", safetensors::to_string(f.dtype)}, {"shape", f.shape}, {"numel", f.numel}};
  if (!f.stats) {
    t["skipped"] = kSkipped;
    return t;
  }
  const Stats& s = *f.stats;
  auto value = [&](double x) { return s.count ? Json(x) : Json(nullptr); };
  t["min"] = value(s.min);
  t["max"] = value(s.max);
  t["mean"] = value(s.mean);
  t["std"] = value(s.stddev());
  t["nan"] = s.nan;
  t["pos_inf"] = s.pos_inf;
  t["neg_inf"] = s.neg_inf;
  t["zeros"] = s.zeros;
  return t;
}

void print_table_heading() {
  std::printf("%-40s %-11s %14s %14s %14s %14s %14s %8s %8s %8s %10s\n", "name", "dtype", "numel", "min",
              "max", "mean", "std", "nan", "+inf", "-inf", "zeros");
}

void print_row(const Figures& f) {
  std::string dtype(safetensors::to_string(f.dtype));
  if (!f.stats) {
    std::printf("%-40s %-11s %14zu  skipped: %s\n", printable(f.name).c_str(), dtype.c_str(), f.numel,
                kSkipped);
    return;
  }
  const Stats& s = *f.stats;
  auto g = [&](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", x);
    return s.count ? std::string(b) : std::string("-");
  };
  std::printf("%-40s %-11s %14zu %14s %14s %14s %14s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 "\n",
              printable(f.name).c_str(), dtype.c_str(), f.numel, g(s.min).c_str(), g(s.max).c_str(),
              g(s.mean).c_str(), g(s.stddev()).c_str(), s.nan, s.pos_inf, s.neg_inf, s.zeros);
}

}  // namespace

/// Entry point, dispatched from safetensors_cli.cpp's main.
int stats_command(const std::vector<std::string>& args) {
  FileArguments a;
  try {
    a = read_file_arguments("stats", args, {"--json"});
  } catch (const UsageError& e) {
    std::fprintf(stderr, "safetensors: %s\n\n%s", e.what(), kStatsUsage);  // this command's own usage
    return 2;
  }
  const bool json = a.flags.count("--json") > 0;
  std::vector<std::string>& names = a.more;  // empty: every tensor
  safetensors::Checkpoint ckpt(a.path);
  if (names.empty()) names = ckpt.keys();
  for (const auto& n : names) (void)ckpt.info(n);  // TensorNotFound before any work
  Progress progress;
  if (json) {
    std::printf("{\"tensors\": [");
  } else {
    print_table_heading();
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& name = names[i];
    auto t = ckpt.get_tensor(name);
    Figures f{name, t.dtype, t.shape, t.numel(), std::nullopt};
    if (t.dtype != Dtype::C64) f.stats = stats_of(t, progress.of(i, names.size(), name, f.numel));
    progress.clear();
    if (json) {
      std::printf("%s\n  %s", i ? "," : "", json_text(figures_json(f), JsonLayout::Spaced).c_str());
    } else {
      print_row(f);
    }
  }
  if (json) std::printf("\n]}\n");
  return 0;
}

}  // namespace cli
