// `safetensors bench FILE [--runs N] [--json]`: quick figures for one file, through the loads that
// benchmark/bench_cpp times too (cpp/measure.hpp): open (keys and every view), load (every
// byte, mapped), load into owned memory, next to a plain read() of the file. Reads exactly the
// length it validated: a file replaced or resized meanwhile is an `Io` error.
#include <safetensors/safetensors.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "measure.hpp"

namespace cli {

namespace {

struct Arguments {
  fs::path path;
  int runs = 5;
  bool json = false;
};

Arguments read_arguments(const std::vector<std::string>& args) {
  Arguments out;
  std::optional<Location> file;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--runs") {
      if (i + 1 >= args.size()) throw UsageError("--runs needs a number");
      const std::string& v = args[++i];
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out.runs);
      if (ec != std::errc{} || end != v.data() + v.size() || out.runs < 1 || out.runs > 100000) {
        throw UsageError("--runs takes a number from 1 to 100000, got '" + printable(v) + "'");
      }
    } else if (args[i] == "--json") {
      out.json = true;
    } else if (is_option(args[i])) {
      unknown_option("bench", args[i]);
    } else if (!file) {
      file.emplace(args[i]);
    } else {
      throw UsageError("bench takes one file");
    }
  }
  if (!file) throw UsageError("bench needs a file");
  // The figures are of local reads (mapped, read(), page cache): a URL is refused, never
  // measured as the local file its folded text would name.
  out.path = local_path(*file, "bench times reads of a local file; download it first");
  return out;
}

/// Runs a measurement, whose failures (the file changed under it: replaced, resized, removed)
/// are `Io` errors rather than `Internal` ones.
template <class F>
auto io_errors(F&& measurement) {
  try {
    return measurement();
  } catch (const safetensors::Error&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw safetensors::Error(safetensors::ErrorKind::Io, e.what());
  }
}

/// The median of `runs` runs of one shared load (open gets at least 11: it is short and noisy).
double median_of(measure::LoadItem::Kind kind, const fs::path& path, int runs, std::uint64_t& sink) {
  measure::LoadItem item(kind, path);
  if (kind == measure::LoadItem::Kind::Open) runs = std::max(runs, 11);
  double m = io_errors([&] { return measure::median(measure::repeat(runs, item)); });
  sink += item.sink();
  return m;
}

}  // namespace

int bench_command(const std::vector<std::string>& args) {
  auto [path, runs, json] = read_arguments(args);
  std::uint64_t size = 0;
  {
    safetensors::SafeOpen probe(path);  // a missing or malformed file fails here, with its error kind
    size = probe.data_offset() + probe.data_size();  // the length just validated, exactly
  }
  io_errors([&] {
    measure::warm(path);
    return 0;
  });
  using Kind = measure::LoadItem::Kind;
  std::uint64_t sink = 0;
  double open = median_of(Kind::Open, path, runs, sink);
  double load = median_of(Kind::Load, path, runs, sink);
  double copy = median_of(Kind::LoadCopy, path, runs, sink);
  double read = io_errors([&] {
    measure::MappedBuffer target(size);
    return measure::median(measure::repeat(runs, [&] { measure::read_whole_file(path, target.data, size); }));
  });
  auto gbps = [&](double s) { return static_cast<double>(size) / s / 1e9; };
  if (json) {
    auto item = [&](const char* name, double s, bool rate) {
      Json j = Json::object({{"item", name}, {"median_s", s}});
      if (rate) j["gbps"] = gbps(s);
      return j;
    };
    Json items = Json::array({item("open", open, false), item("load", load, true),
                              item("load_copy", copy, true), item("read", read, true)});
    std::puts(json_text(Json::object({{"path", path.string()},
                                      {"bytes", size},
                                      {"machine", measure::machine()},
                                      {"runs", runs},
                                      {"items", std::move(items)}}))
                  .c_str());
    return sink == 42 ? 0 : 0;
  }
  std::printf("%s: %s bytes, %s\n", printable_path(path).c_str(), with_commas(size).c_str(),
              measure::machine().c_str());
  std::printf("  open (keys + every view)      %10.3f ms\n", open * 1e3);
  std::printf("  load (every byte, mapped)     %10.3f ms  %6.2f GB/s\n", load * 1e3, gbps(load));
  std::printf("  load into owned memory        %10.3f ms  %6.2f GB/s\n", copy * 1e3, gbps(copy));
  std::printf("  plain read() of the file      %10.3f ms  %6.2f GB/s\n", read * 1e3, gbps(read));
  return sink == 42 ? 0 : 0;
}

}  // namespace cli
