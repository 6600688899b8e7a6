// bench_writer: what writing as engines write costs (docs/writing.md): a file's tensors handed
// to a StreamingWriter in pieces, next to write()+fsync of the same bytes from the same buffer,
// and the file resharded into a checkpoint, each with its time and the memory it added.
//
//   bench_writer [--runs N] [--piece-mib 64] [--shard-mb 1000] [--json OUT] FILE
//
// Items (each run writes beside FILE; what it wrote is removed between runs, untimed):
//   write_fsync  the limit: every tensor's bytes pread into one buffer of --piece-mib MiB and
//                written with write() to a new file in file order, then fsync
//   streaming    the same pieces from the same buffer handed to a StreamingWriter (declared
//                tensors, positioned writes, fsync, atomic publish): the file save_file writes
//   reshard      FILE rewritten as a checkpoint of shards of at most --shard-mb MB (decimal) of
//                tensors, as `safetensors reshard` does it (cpp/reshard.hpp, ShardedWriter)
// Per item: the median time of --runs runs (default 3) after a warm-up run, the rate, and the
// peak resident memory above the process's resident memory just before the item (the kernel's
// high-water mark reset through /proc/self/clear_refs), the piece buffer included: the writer
// keeps it at that buffer whatever the file's size. The source is read with the read backend (nothing
// mapped), so the page cache is not counted. A bad argument is exit code 2, a failure exit code 1.
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <safetensors/safetensors.hpp>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "checked_output.hpp"
#include "measure.hpp"
#include "reshard.hpp"

namespace {

namespace fs = std::filesystem;
using safetensors::Backend;
using safetensors::Checkpoint;

constexpr const char* kUsage =
    "usage: bench_writer [--runs N] [--piece-mib 64] [--shard-mb 1000] [--json OUT] FILE\n";

struct Options {
  int runs = 3;
  std::size_t piece = std::size_t{64} << 20;
  std::uint64_t shard = 1'000'000'000;
  fs::path json, file;
};

std::uint64_t number(const std::string& option, const char* text) {
  std::uint64_t n = 0;
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, n);
  if (ec != std::errc() || p != end || n == 0)
    throw std::invalid_argument(option + " needs a positive number");
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--runs") {
      o.runs = static_cast<int>(std::min<std::uint64_t>(number(a, value()), 1000));
    } else if (a == "--piece-mib") {
      o.piece = static_cast<std::size_t>(std::min<std::uint64_t>(number(a, value()), 4096)) << 20;
    } else if (a == "--shard-mb") {
      o.shard = number(a, value()) * 1'000'000;
    } else if (a == "--json") {
      o.json = value();
    } else if (a.starts_with("-") || !o.file.empty()) {
      throw std::invalid_argument("unexpected argument '" + a + "'");
    } else {
      o.file = a;
    }
  }
  if (o.file.empty()) throw std::invalid_argument("a FILE is needed");
  return o;
}

struct Result {
  std::string item;
  std::vector<double> runs;
  std::uint64_t bytes = 0;
  std::uint64_t peak_above_baseline = 0;
};

/// Times `body` (after `setup`, untimed) and records the peak memory it added over every run.
Result measure_item(const std::string& item, std::uint64_t bytes, int runs, const std::function<void()>& body,
                    const std::function<void()>& setup) {
  setup();
  measure::reset_peak();
  const std::uint64_t baseline = measure::status_bytes("VmRSS");
  Result r{item, measure::repeat(runs, body, setup), bytes, 0};
  const std::uint64_t peak = measure::status_bytes("VmHWM");
  r.peak_above_baseline = peak > baseline ? peak - baseline : 0;
  return r;
}

/// Every tensor of `from`, in file order, in pieces of at most `buffer.size()` bytes read into
/// `buffer`: `sink(item, offset in the tensor, piece)`.
template <class Sink>
void for_each_piece(const Checkpoint& from, std::vector<std::byte>& buffer, Sink&& sink) {
  for (const auto& item : reshard::physical_order(from)) {
    const std::size_t len = item.info.byte_size();
    for (std::size_t at = 0; at < len; at += buffer.size()) {
      std::span<std::byte> piece(buffer.data(), std::min(buffer.size(), len - at));
      from.read_shard_data(item.shard, item.info.data_offsets.first + at, piece);
      sink(item, at, piece);
    }
  }
}

void write_all(int fd, std::span<const std::byte> bytes, const fs::path& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw std::runtime_error("write " + path.string() + ": " + std::strerror(n < 0 ? errno : EIO));
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

std::vector<Result> bench(const Options& o) {
  Checkpoint from(o.file, {.backend = Backend::Read});
  std::vector<safetensors::TensorSpec> specs;
  std::uint64_t total = 0;
  for (const auto& item : reshard::physical_order(from)) {
    specs.push_back({item.name, item.info.dtype, item.info.shape});
    total += item.info.byte_size();
  }
  const fs::path dir = fs::absolute(o.file).parent_path();
  const fs::path raw = dir / ".bench-writer-raw.tmp", streamed = dir / ".bench-writer.safetensors",
                 shards = dir / ".bench-writer-shards";
  auto clean = [&] {
    fs::remove(raw);
    fs::remove(streamed);
    fs::remove_all(shards);
  };
  std::vector<Result> out;
  // Each body allocates its buffer, so that the peak memory counts it as the writer's own.
  out.push_back(measure_item(
      "write_fsync", total, o.runs,
      [&] {
        std::vector<std::byte> buffer(o.piece);
        int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) throw std::runtime_error("create " + raw.string() + ": " + std::strerror(errno));
        try {
          for_each_piece(from, buffer,
                         [&](const auto&, std::size_t, auto piece) { write_all(fd, piece, raw); });
        } catch (...) {
          ::close(fd);
          throw;
        }
        int err = ::fsync(fd) != 0 ? errno : 0;
        if (::close(fd) != 0 && err == 0) err = errno;
        if (err != 0) throw std::runtime_error("write " + raw.string() + ": " + std::strerror(err));
      },
      clean));
  out.push_back(measure_item(
      "streaming", total, o.runs,
      [&] {
        std::vector<std::byte> buffer(o.piece);
        safetensors::StreamingWriter w(streamed, specs, from.metadata());
        for_each_piece(from, buffer,
                       [&](const auto& item, std::size_t at, auto piece) { w.write(item.name, at, piece); });
        w.finish();
      },
      clean));
  out.push_back(measure_item(
      "reshard", total, o.runs,
      [&] {
        fs::create_directory(shards);
        (void)reshard::copy(from, false, shards, {.max_shard_size = o.shard}, {}, o.piece, {});
      },
      clean));
  clean();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_writer: %s\n%s", e.what(), kUsage);
    return 2;
  }
  // Large buffers from their own mappings, returned on free: glibc otherwise raises its mmap
  // threshold after the first free and keeps the next item's buffer in the heap, resident from
  // the run before, so that item's peak would not show it.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  try {
    std::optional<checked::OutputFile> json_file;
    if (!o.json.empty()) json_file.emplace(o.json);
    const auto results = bench(o);
    std::printf("bench_writer | %s | %s | pieces of %zu MiB, shards of %llu MB, %d runs\n",
                measure::machine().c_str(), o.file.filename().c_str(), o.piece >> 20,
                static_cast<unsigned long long>(o.shard / 1'000'000), o.runs);
    std::ostringstream json;
    json << "{\"tool\":\"bench_writer\",\"machine\":\"" << measure::machine() << "\",\"file\":\""
         << o.file.filename().string() << "\",\"piece_bytes\":" << o.piece << ",\"shard_bytes\":" << o.shard
         << ",\"items\":[";
    const double limit = measure::median(results.front().runs);
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      const double median = measure::median(r.runs);
      std::printf("  %-12s %10.3f s  %6.2f GB/s  %5.2fx write()+fsync  peak +%.1f MiB\n", r.item.c_str(),
                  median, static_cast<double>(r.bytes) / median / 1e9, limit / median,
                  static_cast<double>(r.peak_above_baseline) / 1048576.0);
      json << (i ? "," : "") << "{\"item\":\"" << r.item << "\",\"median_s\":" << median
           << ",\"bytes\":" << r.bytes << ",\"peak_rss_above_baseline\":" << r.peak_above_baseline
           << ",\"runs\":" << r.runs.size() << "}";
    }
    json << "]}";
    if (json_file) {
      json_file->write(json.str() + "\n");
      json_file->close();
    } else {
      std::printf("JSON %s\n", json.str().c_str());
    }
    return checked::stdout_arrived("bench_writer") ? 0 : 1;
  } catch (const safetensors::Error& e) {
    std::fprintf(stderr, "bench_writer: %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(),
                 e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_writer: %s\n", e.what());
    return 1;
  }
}
