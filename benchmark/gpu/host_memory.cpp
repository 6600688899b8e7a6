// gpu_host_memory: the host memory a whole-file upload adds while it runs, beside the staging
// ring that is meant to bound it (the goal: at most the ring + 64 MiB, whatever the file's size).
//
//   gpu_host_memory [--json OUT] FILE...
//
// For each file and backend (mmap, read), in a process whose CUDA context already exists (a 1 MiB
// pinned copy first, so the driver's own memory is in the baseline): the peak resident set is
// reset (writing 5 to /proc/self/clear_refs), then one Uploader with the default ring loads every
// tensor, and the program reports
//   peak_rss_added   VmHWM after the load less VmRSS before: every resident page, the file's
//                    mapped pages included
//   peak_anon_added  the highest RssAnon + RssShmem sampled every 200 µs during the load, less
//                    the same before (memory the load allocated, not page cache it mapped)
//   staging_bytes    the uploader's ring, once the load is done
// The figure held against the goal ("added") is peak_rss_added for the read backend, where
// nothing of the file is mapped, and peak_anon_added for mmap. Without a usable GPU it says why
// and writes that to the JSON (exit code 0); a bad argument is exit code 2.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace cuda = safetensors::cuda;
using safetensors::Backend;

constexpr std::size_t kSlack = std::size_t{64} << 20;

/// The fields of /proc/self/status counted in kB (VmRSS, VmHWM, RssAnon, ...), in bytes.
std::map<std::string, std::size_t> status() {
  std::map<std::string, std::size_t> out;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos || line.find(" kB") == std::string::npos) continue;
    out[line.substr(0, colon)] = std::stoull(line.substr(colon + 1)) * 1024;
  }
  return out;
}

std::size_t allocated(const std::map<std::string, std::size_t>& s) {
  auto at = [&](const char* k) { return s.count(k) ? s.at(k) : 0; };
  return at("RssAnon") + at("RssShmem");
}

/// Resets VmHWM to the current resident set; false where the kernel does not allow it.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5\n";
  f.flush();
  return static_cast<bool>(f);
}

struct Measured {
  std::string backend;
  std::size_t staging_bytes = 0, peak_rss_added = 0, peak_anon_added = 0, samples = 0;
  bool peak_reset = false;
  double seconds = 0;

  [[nodiscard]] std::size_t added() const { return backend == "read" ? peak_rss_added : peak_anon_added; }
};

Measured measure_load(const std::filesystem::path& path, Backend backend) {
  Measured m;
  m.backend = backend == Backend::Read ? "read" : "mmap";
  auto before = status();
  m.peak_reset = reset_peak();
  std::atomic<bool> done{false};
  std::size_t peak = allocated(before);
  std::thread sampler([&] {
    while (!done.load()) {
      peak = std::max(peak, allocated(status()));
      ++m.samples;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  auto start = std::chrono::steady_clock::now();
  {
    cuda::Uploader up(0);
    auto loaded = up.load(safetensors::SafeOpen(path, {backend}));
    m.staging_bytes = up.staging_bytes();
    done = true;
    sampler.join();
  }
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto after = status();
  peak = std::max(peak, allocated(after));
  if (m.peak_reset) m.peak_rss_added = after["VmHWM"] - std::min(after["VmHWM"], before["VmRSS"]);
  m.peak_anon_added = peak - std::min(peak, allocated(before));
  return m;
}

std::string mib(std::size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return s;
}

std::string json_result(const Measured& m) {
  std::ostringstream o;
  bool within = m.added() <= m.staging_bytes + kSlack;
  o << "{\"backend\":\"" << m.backend << "\",\"staging_bytes\":" << m.staging_bytes
    << ",\"peak_rss_added\":" << m.peak_rss_added << ",\"peak_anon_added\":" << m.peak_anon_added
    << ",\"added\":" << m.added() << ",\"limit\":" << m.staging_bytes + kSlack
    << ",\"within\":" << (within ? "true" : "false")
    << ",\"peak_reset\":" << (m.peak_reset ? "true" : "false") << ",\"samples\":" << m.samples
    << ",\"seconds\":" << m.seconds << "}";
  return o.str();
}

/// One file's entry in the JSON report: each backend's measurement, printed as it is made.
std::string measure_file(const std::filesystem::path& path) {
  auto size = static_cast<std::size_t>(std::filesystem::file_size(path));
  std::printf("%s (%zu bytes)\n", path.filename().c_str(), size);
  std::string json =
      "{\"name\":\"" + path.filename().string() + "\",\"bytes\":" + std::to_string(size) + ",\"backends\":[";
  for (auto backend : {Backend::Mmap, Backend::Read}) {
    auto m = measure_load(path, backend);
    std::printf("  %-4s  added %s (peak resident +%s, allocated +%s; %zu samples) vs ring %s + 64 MiB: %s\n",
                m.backend.c_str(), mib(m.added()).c_str(), mib(m.peak_rss_added).c_str(),
                mib(m.peak_anon_added).c_str(), m.samples, mib(m.staging_bytes).c_str(),
                m.added() <= m.staging_bytes + kSlack ? "within" : "OVER");
    json += (backend == Backend::Mmap ? "" : ",") + json_result(m);
  }
  return json + "]}";
}

/// `s` as JSON string content (the reason a GPU is unusable names paths).
std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage = "usage: gpu_host_memory [--json OUT] FILE...\n";
  std::string json_path;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!a.empty() && a[0] != '-' && std::filesystem::is_regular_file(a)) {
      files.emplace_back(a);
    } else {
      std::fprintf(stderr, "gpu_host_memory: bad argument or no such file '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  std::string json = "{\"tool\":\"gpu_host_memory\",\"slack_bytes\":" + std::to_string(kSlack);
  try {
    if (!cuda::available()) {
      std::string why = "no usable GPU: " + cuda::why_unavailable();
      std::printf("skipped: %s\n", why.c_str());
      json += ",\"skipped\":\"" + escaped(why) + "\"}";
    } else {
      (void)cuda::pinned_copy_seconds(1 << 20);  // the context and the driver's memory, before the baseline
      json += ",\"files\":[";
      for (std::size_t i = 0; i < files.size(); ++i) json += (i ? "," : "") + measure_file(files[i]);
      json += "]}";
    }
  } catch (const safetensors::Error& e) {
    std::fprintf(stderr, "gpu_host_memory: %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(),
                 e.what());
    return 1;
  }
  if (json_path.empty()) {
    std::printf("JSON %s\n", json.c_str());
  } else {
    std::ofstream(json_path) << json << "\n";
  }
  return 0;
}
