// bench_remote: time until every byte of a remote safetensors file is in host memory
// (docs/remote.md), ours against a plain parallel download of the same object, the limit.
//
//   bench_remote [--runs N] [--concurrency 16] [--part-mib 8] [--budget-mib 256] [--json OUT]
//                [--local FILE] URL...
//
// Items per URL (http://, https:// or s3://), taking turns run by run so that a drifting server
// or link affects them alike:
//   plain      the limit: the whole object in `concurrency` contiguous ranges, each fetched by a
//              curl process of its own (a ranged GET; s3:// URLs path-style at $AWS_ENDPOINT,
//              signed with curl's --aws-sigv4 from $AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY) and
//              read from its pipe straight into one buffer: no checks, no parsing
//   whole      SafeOpen::open_remote: the header validated, then every byte into memory with
//              `concurrency` GETs of --part-mib each, every answer checked, pinned to the ETag
//   on_demand  SafeOpen::open_remote with on_demand, then a TensorStream delivering every tensor
//              into host memory with at most --budget-mib alive (each read's bytes fetched as
//              the stream reaches them)
//   local      (with --local FILE, the same file on disk) the same stream over the local file
//              (read backend, warm page cache): what the network costs over the disk
// Per item: the median of --runs runs (default 3) after one warm-up run, the spread, the rate,
// the ratio to `plain`, and the peak resident memory above what was resident before the item.
// The warm-up run of every item is checked: its bytes' checksum must equal `plain`'s (and the
// local file's). curl must be on PATH for `plain`. A bad argument is exit code 2, a failure 1.
#include <malloc.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "checked_output.hpp"
#include "measure.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: bench_remote [--runs N] [--concurrency 16] [--part-mib 8] [--budget-mib 256] [--json OUT] "
    "[--local FILE] URL...\n";

struct Options {
  int runs = 3;
  std::size_t concurrency = 16;
  std::size_t part = std::size_t{8} << 20;
  std::uint64_t budget = std::uint64_t{256} << 20;
  fs::path json, local;
  std::vector<std::string> urls;
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
    } else if (a == "--concurrency") {
      o.concurrency = static_cast<std::size_t>(std::min<std::uint64_t>(number(a, value()), 1024));
    } else if (a == "--part-mib") {
      o.part = static_cast<std::size_t>(std::min<std::uint64_t>(number(a, value()), 4096)) << 20;
    } else if (a == "--budget-mib") {
      o.budget = std::min<std::uint64_t>(number(a, value()), 1 << 20) << 20;
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--local") {
      o.local = value();
    } else if (a.starts_with("-")) {
      throw std::invalid_argument("unexpected argument '" + a + "'");
    } else if (!safetensors::is_url(a)) {
      throw std::invalid_argument(
          "'" + a + "' is not a URL (s3://, http://, https://); a local file goes after --local");
    } else {
      o.urls.push_back(a);
    }
  }
  if (o.urls.empty()) throw std::invalid_argument("a URL is needed");
  return o;
}

// ---- plain: curl processes into one buffer ----------------------------------------------------

/// The curl command that GETs `url` (without its range), s3:// made path-style and signed.
std::vector<std::string> curl_command(const std::string& url) {
  std::vector<std::string> cmd{"curl", "-sS", "-f", "--http1.1"};
  if (!url.starts_with("s3://") && !url.starts_with("S3://")) {
    cmd.push_back(url);
    return cmd;
  }
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  std::string endpoint = env("AWS_ENDPOINT");
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  const std::string id = env("AWS_ACCESS_KEY_ID"), secret = env("AWS_SECRET_ACCESS_KEY");
  if (endpoint.empty() || id.empty() || secret.empty())
    throw std::invalid_argument(
        "plain s3:// needs AWS_ENDPOINT, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
  std::string region = env("AWS_REGION");
  if (region.empty()) region = env("AWS_DEFAULT_REGION");
  if (region.empty()) region = "us-east-1";
  while (endpoint.ends_with("/")) endpoint.pop_back();
  // The secret travels on curl's command line: this benchmark runs against a local server with
  // test credentials, never real ones.
  // S3 wants the payload's hash declared (none for a GET).
  cmd.insert(cmd.end(), {"--aws-sigv4", "aws:amz:" + region + ":s3", "--user", id + ":" + secret, "-H",
                         "x-amz-content-sha256: UNSIGNED-PAYLOAD", endpoint + "/" + url.substr(5)});
  return cmd;
}

/// Bytes [from, from + dst.size()) of the object, by one curl process, into `dst`.
void curl_range(const std::vector<std::string>& command, std::uint64_t from, std::span<std::byte> dst) {
  std::vector<std::string> args = command;
  args.insert(args.end() - 1, {"-r", std::to_string(from) + "-" + std::to_string(from + dst.size() - 1)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDOUT_FILENO);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, "curl", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  if (spawned != 0) {
    ::close(pipefd[0]);
    throw std::runtime_error(std::string("cannot run curl (install it: apt-get install curl): ") +
                             std::strerror(spawned));
  }
  std::size_t got = 0;
  bool longer = false;
  for (;;) {
    std::byte spill[4096];
    std::byte* at = got < dst.size() ? dst.data() + got : spill;
    const std::size_t room = got < dst.size() ? dst.size() - got : sizeof spill;
    ssize_t n = ::read(pipefd[0], at, room);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (at == spill) longer = true;
    got += static_cast<std::size_t>(n);
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != dst.size() || longer)
    throw std::runtime_error("curl range " + std::to_string(from) + "+" + std::to_string(dst.size()) +
                             " failed (exit " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                             ", " + std::to_string(got) + " bytes)");
}

/// The whole object into `buffer` in `n` contiguous ranges fetched at once.
void plain_download(const std::vector<std::string>& command, std::vector<std::byte>& buffer, std::size_t n) {
  const std::uint64_t size = buffer.size();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t a = size * i / n, b = size * (i + 1) / n;
    if (a == b) continue;
    threads.emplace_back([&, i, a, b] {
      try {
        curl_range(command, a, std::span(buffer.data() + a, b - a));
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
}

// ---- the items ---------------------------------------------------------------------------------

/// Every tensor's bytes, in file order, folded into one checksum.
std::uint64_t checksum_tensors(const safetensors::SafeOpen& f) {
  std::uint64_t sum = 0;
  for (const auto& name : f.offset_keys()) sum = sum * 31 + measure::checksum(f.get_tensor(name).data);
  return sum;
}

/// Every tensor delivered by a stream over `f`; their checksum when `verify`.
std::uint64_t stream_all(const safetensors::SafeOpen& f, std::uint64_t budget, bool verify) {
  std::uint64_t sum = 0;
  for (auto& item : safetensors::TensorStream(f, {}, {.max_inflight_bytes = budget})) {
    if (verify) sum = sum * 31 + measure::checksum(item.view.data);
  }
  return sum;
}

struct Result {
  std::string url, item;
  std::vector<double> runs;
  std::uint64_t bytes = 0;
  std::uint64_t peak_above_baseline = 0;
};

struct Item {
  std::string name;
  std::function<std::uint64_t(bool)> run;  // verify: return the bytes' checksum
};

std::vector<Result> bench(const Options& o) {
  std::vector<Result> out;
  std::optional<std::uint64_t> local_sum;
  for (const auto& url : o.urls) {
    const safetensors::RemoteOptions whole{.concurrency = o.concurrency, .part_size = o.part};
    safetensors::RemoteOptions lazy = whole;
    lazy.on_demand = true;
    const auto head = safetensors::SafeOpen::open_remote(url, {.header_only = true});
    const std::uint64_t size = head.data_offset() + head.data_size() + head.trailing_bytes();
    const std::uint64_t data_start = head.data_offset();
    const auto command = curl_command(url);
    std::vector<Item> items{
        {"plain",
         [&](bool verify) {
           std::vector<std::byte> buffer(size);
           plain_download(command, buffer, o.concurrency);
           if (!verify) return std::uint64_t{0};
           auto f = safetensors::SafeOpen::from_bytes(std::span<const std::byte>(buffer));
           return checksum_tensors(f);
         }},
        {"whole",
         [&](bool verify) {
           auto f = safetensors::SafeOpen::open_remote(url, whole);
           return verify ? checksum_tensors(f) : 0;
         }},
        {"on_demand",
         [&](bool verify) {
           auto f = safetensors::SafeOpen::open_remote(url, lazy);
           return stream_all(f, o.budget, verify);
         }},
    };
    if (!o.local.empty()) {
      items.push_back({"local", [&](bool verify) {
                         safetensors::SafeOpen f(o.local, {.backend = safetensors::Backend::Read});
                         return stream_all(f, o.budget, verify);
                       }});
    }
    (void)data_start;
    // The warm-up run of each item, checked against the others.
    std::optional<std::uint64_t> expect;
    for (const auto& item : items) {
      const std::uint64_t sum = item.run(true);
      if (!expect) expect = sum;
      if (sum != *expect)
        throw std::runtime_error(url + ": " + item.name + " delivered other bytes than " + items[0].name);
    }
    if (local_sum && *local_sum != *expect)
      throw std::runtime_error(url + " holds other bytes than the first URL");
    local_sum = expect;
    std::vector<Result> results;
    for (const auto& item : items) results.push_back({url, item.name, {}, size, 0});
    for (int run = 0; run < o.runs; ++run) {
      for (std::size_t i = 0; i < items.size(); ++i) {
        measure::reset_peak();
        const std::uint64_t baseline = measure::status_bytes("VmRSS");
        auto t = measure::Clock::now();
        (void)items[i].run(false);
        results[i].runs.push_back(measure::seconds_since(t));
        const std::uint64_t peak = measure::status_bytes("VmHWM");
        results[i].peak_above_baseline =
            std::max(results[i].peak_above_baseline, peak > baseline ? peak - baseline : 0);
      }
    }
    out.insert(out.end(), results.begin(), results.end());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_remote: %s\n%s", e.what(), kUsage);
    return 2;
  }
  // Large buffers from their own mappings, returned on free, so that each run's peak shows them.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  try {
    std::optional<checked::OutputFile> json_file;
    if (!o.json.empty()) json_file.emplace(o.json);
    const auto results = bench(o);
    std::printf("bench_remote | %s | concurrency %zu, parts of %zu MiB, stream budget %llu MiB, %d runs\n",
                measure::machine().c_str(), o.concurrency, o.part >> 20,
                static_cast<unsigned long long>(o.budget >> 20), o.runs);
    std::ostringstream json;
    json << "{\"tool\":\"bench_remote\",\"machine\":\"" << measure::machine()
         << "\",\"concurrency\":" << o.concurrency << ",\"part_bytes\":" << o.part
         << ",\"budget_bytes\":" << o.budget << ",\"items\":[";
    double limit = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      const double median = measure::median(r.runs);
      if (r.item == "plain") {
        limit = median;
        std::printf("%s (%.1f MB)\n", r.url.c_str(), static_cast<double>(r.bytes) / 1e6);
      }
      const auto [lo, hi] = std::minmax_element(r.runs.begin(), r.runs.end());
      std::printf("  %-10s %8.3f s (%.3f-%.3f)  %6.2f GB/s  %5.2fx plain  peak +%.1f MiB\n", r.item.c_str(),
                  median, *lo, *hi, static_cast<double>(r.bytes) / median / 1e9, limit / median,
                  static_cast<double>(r.peak_above_baseline) / 1048576.0);
      json << (i ? "," : "") << "{\"url\":\"" << r.url << "\",\"item\":\"" << r.item
           << "\",\"median_s\":" << median << ",\"runs_s\":[";
      for (std::size_t k = 0; k < r.runs.size(); ++k) json << (k ? "," : "") << r.runs[k];
      json << "],\"bytes\":" << r.bytes << ",\"x_plain\":" << limit / median
           << ",\"peak_rss_above_baseline\":" << r.peak_above_baseline << "}";
    }
    json << "]}";
    if (json_file) {
      json_file->write(json.str() + "\n");
      json_file->close();
    } else {
      std::printf("JSON %s\n", json.str().c_str());
    }
    return checked::stdout_arrived("bench_remote") ? 0 : 1;
  } catch (const safetensors::Error& e) {
    std::fprintf(stderr, "bench_remote: %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(),
                 e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_remote: %s\n", e.what());
    return 1;
  }
}
