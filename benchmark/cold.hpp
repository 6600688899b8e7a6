// Cold loads for bench_cpp --cold: full reads of a file whose pages are not cached, with each
// backend, after a prefetch, and streamed, next to the disk's own sequential read rate measured
// in the same run (fio with direct I/O, several jobs and a queue depth; where fio is missing,
// several `dd iflag=direct` in parallel). Every run starts after the page cache is dropped.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <safetensors/prefetch.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "measure.hpp"

extern char** environ;

namespace cold {

/// Every tensor of `f` in file order, each dropped after its checksum (mmap: through the
/// mapping, faulting pages in; read and direct: into a buffer of its own).
inline std::uint64_t sum_tensors(const safetensors::SafeOpen& f) {
  std::uint64_t sum = 0;
  for (const auto& name : f.offset_keys()) {
    auto t = f.get_tensor(name);
    sum += measure::checksum(t.data);
  }
  return sum;
}

/// Every tensor of `path` read with `backend`.
inline std::uint64_t read_all(const std::filesystem::path& path, safetensors::Backend backend) {
  return sum_tensors(safetensors::SafeOpen(path, {backend}));
}

/// The whole file prefetched (several threads, large requests), then read through the mapping.
/// (Reading behind a prefetch still running, instead of after it, measured the same here.)
inline std::uint64_t prefetch_then_read(const std::filesystem::path& path) {
  safetensors::SafeOpen f(path);
  safetensors::prefetch(f).wait();
  return sum_tensors(f);
}

/// Every tensor delivered by a `TensorStream` (its reader thread reading ahead within the
/// default 256 MiB), checksummed and dropped as it arrives.
inline std::uint64_t streamed(const std::filesystem::path& path, safetensors::Backend backend) {
  safetensors::SafeOpen f(path, {backend});
  std::uint64_t sum = 0;
  for (auto& item : safetensors::TensorStream(f)) sum += measure::checksum(item.view.data);
  return sum;
}

// ---- the disk's own rate -------------------------------------------------------------------

/// Runs `argv` (searched on PATH) and returns its exit status and standard output; nullopt when
/// it cannot be started (not installed).
inline std::optional<std::pair<int, std::string>> run(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe(out) != 0) return std::nullopt;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return std::nullopt;
  }
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : 128, text);
}

/// The disk measurement's shapes (jobs, each over its own part of the file, and queue depth);
/// the fastest is the disk's rate. One sequential stream with a deep queue was the fastest on
/// this project's virtual disk (2.2-2.5 GB/s, where 4 jobs at depth 16 gave 1.5-1.6 GB/s: the
/// parallel streams seek against each other); several jobs are what a disk with more queues
/// wants. The dd fallback uses the last shape.
struct Shape {
  int jobs;
  int depth;
};
constexpr Shape kShapes[] = {{1, 8}, {4, 16}};
constexpr int kJobs = 4;
constexpr std::size_t kBlock = std::size_t{16} << 20;

/// fio's command for reading `size` bytes of `path` in `shape`.
inline std::vector<std::string> fio_command(const std::filesystem::path& path, std::size_t size,
                                            Shape shape) {
  const std::size_t part = size / static_cast<std::size_t>(shape.jobs) / kBlock * kBlock;
  return {"fio",
          "--name=disk",
          "--filename=" + path.string(),
          "--readonly",
          "--rw=read",
          "--direct=1",
          "--ioengine=libaio",
          "--iodepth=" + std::to_string(shape.depth),
          "--bs=" + std::to_string(kBlock),
          "--numjobs=" + std::to_string(shape.jobs),
          "--size=" + std::to_string(part),
          "--offset_increment=" + std::to_string(part),
          "--group_reporting",
          "--output-format=json"};
}

/// fio's aggregate read bandwidth (bytes/s) from its JSON (jobs[0].read.bw_bytes with
/// --group_reporting); 0 when it did not run or said nothing usable.
inline double fio_bandwidth(const std::vector<std::string>& command) {
  auto r = run(command);
  if (!r || r->first != 0) return 0;
  auto at = r->second.find("\"read\"");
  at = at == std::string::npos ? at : r->second.find("\"bw_bytes\"", at);
  at = at == std::string::npos ? at : r->second.find(':', at);
  return at == std::string::npos ? 0 : std::strtod(r->second.c_str() + at + 1, nullptr);
}

/// How the disk's rate was measured: by which tool, and the command (for the report).
struct DiskTool {
  std::string name;     // "fio" or "dd"
  std::string command;  // as run, for the record
};

/// Seconds the disk takes to read the `size` bytes of `path` sequentially with direct I/O, in
/// the fastest of kShapes: from fio's aggregate bandwidth (its own timing, without its
/// start-up), or the wall time of kJobs `dd iflag=direct` run at once where fio is missing.
/// `tool` says which (and the fastest command). Throws where neither works.
inline double disk_seconds(const std::filesystem::path& path, std::size_t size, DiskTool& tool) {
  double best = 0;
  for (Shape shape : kShapes) {
    if (size / static_cast<std::size_t>(shape.jobs) / kBlock == 0) continue;
    const auto fio = fio_command(path, size, shape);
    const double bw = fio_bandwidth(fio);
    if (bw > best) {
      best = bw;
      tool = {"fio", ""};
      for (const auto& a : fio) tool.command += (tool.command.empty() ? "" : " ") + a;
    }
  }
  if (best > 0) return static_cast<double>(size) / best;
  // dd: kJobs processes at once, each over its part (the last takes the rest).
  const std::size_t blocks = (size + kBlock - 1) / kBlock, each = (blocks + kJobs - 1) / kJobs;
  std::vector<pid_t> pids;
  auto start = measure::Clock::now();
  for (int j = 0; j < kJobs; ++j) {
    std::vector<std::string> dd = {"dd",
                                   "if=" + path.string(),
                                   "of=/dev/null",
                                   "iflag=direct",
                                   "bs=" + std::to_string(kBlock),
                                   "skip=" + std::to_string(static_cast<std::size_t>(j) * each),
                                   "count=" + std::to_string(each),
                                   "status=none"};
    std::vector<char*> args;
    for (auto& a : dd) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawnp(&pid, "dd", nullptr, nullptr, args.data(), environ) != 0)
      throw std::runtime_error(
          "--cold needs fio (Debian: apt-get install fio) or dd to measure the disk's rate");
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  double seconds = measure::seconds_since(start);
  if (!ok) throw std::runtime_error("dd iflag=direct failed on " + path.string());
  tool = {"dd", std::to_string(kJobs) +
                    " x dd if=FILE of=/dev/null iflag=direct bs=" + std::to_string(kBlock) + " skip=k*" +
                    std::to_string(each) + " count=" + std::to_string(each) + " (in parallel)"};
  return seconds;
}

}  // namespace cold
