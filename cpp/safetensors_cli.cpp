// `safetensors`: inspect, validate, edit the metadata of, and time safetensors files, through
// the public API only. This file holds the usage text and the dispatch to the commands (one
// file each, cli_<command>.cpp), and turns what they throw into a message and an exit code:
// 0 success, 1 a file is invalid or an operation failed (a failed write to standard output
// included), 2 the command line is wrong. Every user-controlled string printed goes through
// cli_output.cpp (`printable`, `json_text`), so a file cannot forge output or drive the terminal.
#include <safetensors/safetensors.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "cli.hpp"

#ifndef SAFETENSORS_VERSION
#define SAFETENSORS_VERSION "unknown"
#endif

namespace {

using namespace cli;

constexpr const char* kUsage = R"(safetensors: inspect, validate and edit safetensors files

usage:
  safetensors inspect FILE|INDEX [--json]
      Metadata, then every tensor (name, dtype, shape, bytes, offset), then totals
      (parameters, bytes by dtype). Reads only headers. INDEX is a sharded checkpoint's
      model.safetensors.index.json.
  safetensors validate [--header-only] [--lenient] [--allow-trailing-bytes] FILE|INDEX...
      Checks each file: every header rule, then every data byte readable (unless
      --header-only); for an index, every shard against the index. Prints OK or the error
      kind, message and hint per file; shows progress on a terminal. --lenient reads an
      index as an allow-list (tensors its shards lack are listed, not fatal; copies in
      other shards ignored); --allow-trailing-bytes accepts bytes after the last tensor and
      reports how many.
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

/// Whether the arguments ask for help: `--help` or `-h` anywhere but as an option's value.
bool asks_for_help(const std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--set" || args[i] == "--delete" || args[i] == "--runs") {
      ++i;  // the next argument is a value, even if it reads "--help"
    } else if (args[i] == "--help" || args[i] == "-h") {
      return true;
    }
  }
  return false;
}

int run(const std::string& command, const std::vector<std::string>& args) {
  if (command == "inspect") return inspect_command(args);
  if (command == "validate") return validate_command(args);
  if (command == "metadata") return metadata_command(args);
  if (command == "bench") return bench_command(args);
  if (command == "stats") return stats_command(args);
  throw UsageError("unknown command '" + printable(command) + "'");
}

}  // namespace

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
  if (asks_for_help(args)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  int code = 0;
  try {
    code = run(command, args);
  } catch (const cli::UsageError& e) {
    std::fprintf(stderr, "safetensors: %s\n\n%s", e.what(), kUsage);
    return 2;
  } catch (const safetensors::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "safetensors: %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(),
                 cli::printable(e.what()).c_str());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "safetensors: Io: %s\n", cli::printable(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "safetensors: Io: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors: Internal: %s\n", cli::printable(e.what()).c_str());
    return 1;
  }
  // What was printed must have arrived: a full disk or a closed pipe is an error, not success.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    int err = errno;
    std::fprintf(stderr, "safetensors: Io: cannot write to standard output: %s\n",
                 err ? std::strerror(err) : "write error");
    return 1;
  }
  return code;
}
