// `safetensors stats FILE|INDEX [TENSOR...] [--json]`: per tensor, the minimum, maximum, mean
// and standard deviation of its finite values, and counts of NaN, +Inf, -Inf and zeros, for
// every float and integer dtype, in 1 Mi-element chunks so that memory stays bounded whatever
// the tensor's size: floats through safetensors::convert to F64, integers as integers (their
// minimum and maximum exact, 64-bit ones included). Progress on a terminal; exit codes as the
// other commands: 0 success, 1 an error (printed with its kind), 2 a usage error.
#include <safetensors/safetensors.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "cli.hpp"

namespace cli {

namespace {

using safetensors::Dtype;

/// One tensor's figures. `min` and `max` are values of the tensor, held exactly: an integer
/// tensor's as integers (through F64, 64-bit values beyond 2^53 would print rounded), a float
/// tensor's as doubles; both null when no value is finite.
struct Summary {
  std::uint64_t count = 0;  // finite values
  Json min, max;
  double mean = 0, std = 0;
  std::uint64_t nan = 0, pos_inf = 0, neg_inf = 0, zeros = 0;
};

/// Running mean and sum of squared deviations, merged chunk by chunk (Chan et al.): stable for
/// any number of chunks. Long double: exact for every 64-bit integer a chunk holds.
struct Moments {
  std::uint64_t count = 0;
  long double mean = 0, m2 = 0;

  /// Merges a chunk of `n` values whose mean is `cmean` and squared deviations sum `cm2`.
  void merge(std::uint64_t n, long double cmean, long double cm2) {
    if (n == 0) return;
    auto total = static_cast<long double>(count + n);
    long double delta = cmean - mean;
    mean += delta * static_cast<long double>(n) / total;
    m2 += cm2 + delta * delta * static_cast<long double>(count) * static_cast<long double>(n) / total;
    count += n;
  }
  [[nodiscard]] double stddev() const {
    return count ? static_cast<double>(std::sqrt(m2 / static_cast<long double>(count))) : 0;
  }
};

/// Elements per chunk: a multiple of 4, so F4 and F6 chunks end on byte boundaries.
constexpr std::size_t kChunk = std::size_t{1} << 20;

/// A float tensor (or BOOL), through `safetensors::convert` to F64 one chunk at a time, so
/// memory stays bounded whatever the tensor's size. F64 holds every value of these dtypes.
Summary float_stats(const safetensors::TensorView& t, const std::function<void(std::size_t)>& progress) {
  Summary s;
  Moments moments;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  std::size_t numel = t.numel();
  std::vector<double> buf(std::min(numel, kChunk));
  std::size_t bits = safetensors::bit_size(t.dtype);
  for (std::size_t at = 0; at < numel; at += kChunk) {
    std::size_t n = std::min(kChunk, numel - at);
    auto bytes = t.data.subspan(at * bits / 8, n * bits / 8);
    safetensors::convert(safetensors::TensorView{t.dtype, {n}, bytes, {}}, Dtype::F64,
                         std::as_writable_bytes(std::span(buf.data(), n)));
    std::uint64_t finite = 0;
    long double sum = 0;
    for (double x : std::span(buf.data(), n)) {
      if (std::isnan(x)) {
        ++s.nan;
      } else if (std::isinf(x)) {
        ++(x > 0 ? s.pos_inf : s.neg_inf);
      } else {
        ++finite;
        sum += x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        if (x == 0) ++s.zeros;
      }
    }
    long double cmean = finite ? sum / static_cast<long double>(finite) : 0, cm2 = 0;
    for (double x : std::span(buf.data(), n)) {
      if (std::isfinite(x)) cm2 += (x - cmean) * (x - cmean);
    }
    moments.merge(finite, cmean, cm2);
    progress(at + n);
  }
  s.count = moments.count;
  if (s.count) {
    s.min = lo;
    s.max = hi;
  }
  s.mean = static_cast<double>(moments.mean);
  s.std = moments.stddev();
  return s;
}

/// An integer tensor of element type `T`, read as integers: min and max exact, zeros counted,
/// mean and standard deviation from long double sums (rounded to double only at the end).
template <class T>
Summary integer_stats(const safetensors::TensorView& t, const std::function<void(std::size_t)>& progress) {
  Summary s;
  Moments moments;
  T lo = std::numeric_limits<T>::max(), hi = std::numeric_limits<T>::lowest();
  std::size_t numel = t.numel();
  std::vector<T> buf(std::min(numel, kChunk));
  for (std::size_t at = 0; at < numel; at += kChunk) {
    std::size_t n = std::min(kChunk, numel - at);
    std::memcpy(buf.data(), t.data.data() + at * sizeof(T), n * sizeof(T));  // little-endian, as the format
    long double sum = 0;
    for (T x : std::span(buf.data(), n)) {
      sum += static_cast<long double>(x);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      if (x == 0) ++s.zeros;
    }
    long double cmean = sum / static_cast<long double>(n), cm2 = 0;
    for (T x : std::span(buf.data(), n)) {
      long double d = static_cast<long double>(x) - cmean;
      cm2 += d * d;
    }
    moments.merge(n, cmean, cm2);
    progress(at + n);
  }
  s.count = moments.count;
  if (s.count) {
    s.min = lo;
    s.max = hi;
  }
  s.mean = static_cast<double>(moments.mean);
  s.std = moments.stddev();
  return s;
}

/// The figures of `t`, by the path its dtype needs; empty for complex values, which have no order.
std::optional<Summary> stats_of(const safetensors::TensorView& t,
                                const std::function<void(std::size_t)>& progress) {
  switch (t.dtype) {
    case Dtype::C64:
      return std::nullopt;
    case Dtype::U8:
      return integer_stats<std::uint8_t>(t, progress);
    case Dtype::I8:
      return integer_stats<std::int8_t>(t, progress);
    case Dtype::U16:
      return integer_stats<std::uint16_t>(t, progress);
    case Dtype::I16:
      return integer_stats<std::int16_t>(t, progress);
    case Dtype::U32:
      return integer_stats<std::uint32_t>(t, progress);
    case Dtype::I32:
      return integer_stats<std::int32_t>(t, progress);
    case Dtype::U64:
      return integer_stats<std::uint64_t>(t, progress);
    case Dtype::I64:
      return integer_stats<std::int64_t>(t, progress);
    default:
      return float_stats(t, progress);
  }
}

/// Percent done of one tensor on stderr when `shows_progress`, at most ten updates a second.
class Progress {
 public:
  explicit Progress(bool json) : on_(shows_progress(json)) {}
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
  std::optional<Summary> stats;
};

constexpr const char* kSkipped = "complex values have no order";

Json figures_json(const Figures& f) {
  Json t = Json::object(
      {{"name", f.name}, {"dtype", safetensors::to_string(f.dtype)}, {"shape", f.shape}, {"numel", f.numel}});
  if (!f.stats) {
    t["skipped"] = kSkipped;
    return t;
  }
  const Summary& s = *f.stats;
  auto value = [&](double x) { return s.count ? Json(x) : Json(nullptr); };
  t["min"] = s.min;
  t["max"] = s.max;
  t["mean"] = value(s.mean);
  t["std"] = value(s.std);
  t["nan"] = s.nan;
  t["pos_inf"] = s.pos_inf;
  t["neg_inf"] = s.neg_inf;
  t["zeros"] = s.zeros;
  return t;
}

/// A figure for the table: an integer exactly, a float to 6 significant digits, none as "-".
std::string figure_text(const Json& x) {
  char b[32];
  return std::visit(
      [&](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>) {
          return std::to_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          std::snprintf(b, sizeof b, "%.6g", v);
          return b;
        } else {
          return "-";
        }
      },
      x.value());
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
  const Summary& s = *f.stats;
  auto real = [&](double x) { return s.count ? figure_text(x) : std::string("-"); };
  std::printf("%-40s %-11s %14zu %14s %14s %14s %14s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 "\n",
              printable(f.name).c_str(), dtype.c_str(), f.numel, figure_text(s.min).c_str(),
              figure_text(s.max).c_str(), real(s.mean).c_str(), real(s.std).c_str(), s.nan, s.pos_inf,
              s.neg_inf, s.zeros);
}

}  // namespace

/// Entry point, dispatched from safetensors_cli.cpp's main.
int stats_command(const std::vector<std::string>& args) {
  FileArguments a = read_file_arguments("stats", args, {"--json"});
  const bool json = a.flags.count("--json") > 0;
  std::vector<std::string>& names = a.more;  // empty: every tensor
  // A URL (a file or an index): each tensor fetched when its figures are computed.
  safetensors::Checkpoint ckpt = open_checkpoint(a.file, {});
  if (names.empty()) names = ckpt.keys();
  for (const auto& n : names) (void)ckpt.info(n);  // TensorNotFound before any work
  Progress progress(json);
  // With --json the document is printed whole at the end, so that a failure midway leaves
  // only the error document on stdout, never half of this one.
  std::string doc = "{\"tensors\": [";
  if (!json) print_table_heading();
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& name = names[i];
    auto t = ckpt.get_tensor(name);
    Figures f{name, t.dtype, t.shape, t.numel(), std::nullopt};
    f.stats = stats_of(t, progress.of(i, names.size(), name, f.numel));
    progress.clear();
    if (json) {
      doc += (i ? ",\n  " : "\n  ") + json_text(figures_json(f), JsonLayout::Spaced);
    } else {
      print_row(f);
    }
  }
  if (json) std::printf("%s\n]}\n", doc.c_str());
  return 0;
}

}  // namespace cli
