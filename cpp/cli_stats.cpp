// `safetensors stats FILE|INDEX [TENSOR...] [--json]`: per tensor, the minimum, maximum, mean
// and standard deviation of its finite values, and counts of NaN, +Inf, -Inf and zeros, for
// every float and integer dtype (through safetensors::convert, in 1 Mi-element chunks, so
// memory stays bounded whatever the tensor's size). Progress on a terminal; exit codes as the
// other commands: 0 success, 1 an error (printed with its kind), 2 a usage error.
#include <safetensors/safetensors.hpp>

#include <unistd.h>

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

namespace {

namespace fs = std::filesystem;
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

std::string json_text(std::string_view v) {
  std::string out = "\"";
  for (char ch : v) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\')
      out += {'\\', ch};
    else if (c < 0x20 || c == 0x7F) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else
      out += ch;
  }
  return out + "\"";
}

/// A name for a terminal: control characters escaped, so output stays data.
std::string printable(std::string_view v) {
  std::string out;
  for (char ch : v) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    } else
      out += ch;
  }
  return out;
}

std::string num(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

/// Entry point, dispatched from safetensors_cli.cpp's main.
int stats_command(const std::vector<std::string>& args) {
  bool json = false;
  std::optional<fs::path> path;
  std::vector<std::string> names;
  for (const auto& a : args) {
    if (a == "--json")
      json = true;
    else if (a.size() > 1 && a[0] == '-') {
      std::fprintf(stderr, "safetensors: stats: unknown option '%s'\n\n%s", a.c_str(), kStatsUsage);
      return 2;
    } else if (!path)
      path = a;
    else
      names.push_back(a);
  }
  if (!path) {
    std::fprintf(stderr, "safetensors: stats needs a file\n\n%s", kStatsUsage);
    return 2;
  }
  safetensors::Checkpoint ckpt(*path);
  if (names.empty()) names = ckpt.keys();
  for (const auto& n : names) (void)ckpt.info(n);  // TensorNotFound before any work
  const bool tty = ::isatty(2) == 1;
  auto last = std::chrono::steady_clock::now();
  if (json)
    std::printf("{\"tensors\": [");
  else
    std::printf("%-40s %-11s %14s %14s %14s %14s %14s %8s %8s %8s %10s\n", "name", "dtype", "numel", "min",
                "max", "mean", "std", "nan", "+inf", "-inf", "zeros");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& name = names[i];
    auto t = ckpt.get_tensor(name);
    std::size_t numel = t.numel();
    auto progress = [&](std::size_t done) {
      auto now = std::chrono::steady_clock::now();
      if (!tty || now - last < std::chrono::milliseconds(100)) return;
      last = now;
      std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %3.0f%%", i + 1, names.size(), printable(name).c_str(),
                   numel ? 100.0 * static_cast<double>(done) / static_cast<double>(numel) : 100.0);
    };
    bool skipped = t.dtype == Dtype::C64;
    Stats s = skipped ? Stats{} : stats_of(t, progress);
    if (tty) std::fprintf(stderr, "\r\033[K");
    std::string dtype(safetensors::to_string(t.dtype));
    bool any = s.count > 0;
    if (json) {
      std::printf("%s\n  {\"name\": %s, \"dtype\": \"%s\", \"shape\": %s, \"numel\": %zu", i ? "," : "",
                  json_text(name).c_str(), dtype.c_str(), shape_text(t.shape).c_str(), numel);
      if (skipped) {
        std::printf(", \"skipped\": \"complex values have no order\"}");
        continue;
      }
      std::printf(", \"min\": %s, \"max\": %s, \"mean\": %s, \"std\": %s", any ? num(s.min).c_str() : "null",
                  any ? num(s.max).c_str() : "null", any ? num(s.mean).c_str() : "null",
                  any ? num(s.stddev()).c_str() : "null");
      std::printf(", \"nan\": %" PRIu64 ", \"pos_inf\": %" PRIu64 ", \"neg_inf\": %" PRIu64
                  ", \"zeros\": %" PRIu64 "}",
                  s.nan, s.pos_inf, s.neg_inf, s.zeros);
    } else if (skipped) {
      std::printf("%-40s %-11s %14zu  skipped: complex values have no order\n", printable(name).c_str(),
                  dtype.c_str(), numel);
    } else {
      auto g = [&](double x) {
        char b[32];
        std::snprintf(b, sizeof b, "%.6g", x);
        return any ? std::string(b) : std::string("-");
      };
      std::printf("%-40s %-11s %14zu %14s %14s %14s %14s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64
                  "\n",
                  printable(name).c_str(), dtype.c_str(), numel, g(s.min).c_str(), g(s.max).c_str(),
                  g(s.mean).c_str(), g(s.stddev()).c_str(), s.nan, s.pos_inf, s.neg_inf, s.zeros);
    }
  }
  if (json) std::printf("\n]}\n");
  return 0;
}
