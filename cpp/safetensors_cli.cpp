// `safetensors`: inspect, validate, edit the metadata of, reshard and time safetensors files, through
// the public API only. This file holds the usage text and the dispatch to the commands (one
// file each, cli_<command>.cpp), and turns what they throw into a message and an exit code:
// 0 success, 1 a file is invalid or an operation failed (a failed write to standard output
// included), 2 the command line is wrong. Every user-controlled string printed goes through
// cli_output.cpp (`printable`, `json_text`), so a file cannot forge output or drive the terminal.
#include <safetensors/safetensors.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "checked_output.hpp"
#include "cli.hpp"

#ifndef SAFETENSORS_VERSION
#define SAFETENSORS_VERSION "unknown"
#endif

namespace {

using namespace cli;

/// A command: its entry point and its own usage text (its lines of the global help).
struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* usage;
};

constexpr Command kCommands[] = {
    {"inspect", inspect_command, R"(  safetensors inspect FILE|URL|INDEX [--json]
      Metadata, then every tensor (name, dtype, shape, bytes, offset; for an index, the shard,
      relative to the index's folder), then totals (parameters, bytes by dtype). Reads only
      headers. INDEX is a sharded checkpoint's model.safetensors.index.json. URL is s3://,
      gs://, az://, http:// or https:// (its header fetched with one or two ranged GETs).
)"},
    {"validate", validate_command,
     R"(  safetensors validate [--header-only] [--lenient] [--allow-trailing-bytes] [--cache[=DIR]] [--json] FILE|URL|INDEX...
      Checks each file: every header rule, then every data byte readable (unless
      --header-only); for an index, every shard against the index. A URL (s3://, gs://, az://, http(s)://)
      is read as checked, or with --cache fetched whole into the cache of remote files (DIR,
      else ~/.cache/safetensors) that later opens map. One OK or error line per file.
      --lenient reads an index as an allow-list (tensors its shards lack are listed, not fatal;
      copies in other shards ignored); --allow-trailing-bytes accepts bytes after the last
      tensor and reports how many.
)"},
    {"metadata", metadata_command,
     R"(  safetensors metadata FILE|URL [--set KEY=VALUE]... [--delete KEY]... [--json]
      Prints the metadata (of a URL: its header fetched), or rewrites the file with the
      changes: atomically, through the writer, with every tensor's bytes compared with the
      original before the file is replaced. Only a local file can be rewritten.
)"},
    {"bench", bench_command, R"(  safetensors bench FILE [--runs N] [--json]
      Quick figures: open (keys and every view), load (every byte), load into owned memory,
      and a plain read() of the file for comparison. A local file only.
)"},
    {"stats", stats_command, R"(  safetensors stats FILE|URL|INDEX [TENSOR...] [--json]
      Per tensor: min, max, mean, std of the finite values (an integer tensor's min and max
      exactly); counts of NaN, +Inf, -Inf, zeros.
)"},
    {"reshard", reshard_command,
     R"(  safetensors reshard FILE|INDEX OUT [--max-shard-size SIZE] [--align N] [--prefix NAME] [--no-sync] [--json]
      Rewrites a file or a checkpoint as a checkpoint in the directory OUT (made if missing):
      shards of at most SIZE bytes of tensors (default 5GB; 500MB, 2GiB, or bytes), split and
      named as huggingface_hub does (model-00001-of-0000N.safetensors and
      model.safetensors.index.json, or one model.safetensors), published together once complete.
      --align N starts each shard's data on a multiple of N bytes (a power of two); --prefix
      names the files (default model); --no-sync skips the fsync. Shows progress on a terminal.
      Local files only: neither argument may be a URL.
)"},
};

constexpr const char* kExitCodes = R"(
An argument starting with s3://, gs://, az://, http:// or https:// (any case) is a URL, anything
else a local path; a command that acts on local files only refuses a URL (exit code 2).

--json prints one JSON document on standard output, an error included:
  {"error": {"kind": KIND, "message": MESSAGE}} (kind "Usage" for a wrong command line).

exit codes:
  0  success (validate: every file is valid)
  1  a file is invalid, or an operation failed (the error kind and message are printed)
  2  the command line is wrong
)";

std::string global_usage() {
  std::string text = "safetensors: inspect, validate and edit safetensors files\n\nusage:\n";
  for (const auto& c : kCommands) text += c.usage;
  text += "  safetensors [COMMAND] --help | --version\n";
  return text + kExitCodes;
}

/// One command's usage: what a wrong command line or `COMMAND --help` prints.
std::string command_usage(const Command& c) {
  return std::string("usage:\n") + c.usage + "(safetensors --help lists every command)\n";
}

const Command* find_command(const std::string& name) {
  for (const auto& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

/// Whether `args` hold `flag` other than as an option's value (`--set --json` sets a key).
bool has_flag(const std::vector<std::string>& args, std::initializer_list<std::string_view> flags) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--set" || args[i] == "--delete" || args[i] == "--runs" || args[i] == "--max-shard-size" ||
        args[i] == "--align" || args[i] == "--prefix") {
      ++i;  // the next argument is a value, even if it reads "--help"
    } else if (std::find(flags.begin(), flags.end(), args[i]) != flags.end()) {
      return true;
    }
  }
  return false;
}

/// `{"error": {"kind": ..., "message": ...}}`: a failure as --json prints it.
void print_json_error(std::string_view kind, const std::string& message) {
  std::puts(
      json_text(Json::object({{"error", Json::object({{"kind", kind}, {"message", message}})}})).c_str());
}

/// A failure, reported once: one line on stderr, and with --json also as JSON on stdout (after
/// whatever the command printed before failing has been flushed, so the two never interleave).
void report(bool json, std::string_view kind, const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "safetensors: %s: %s\n", std::string(kind).c_str(), printable(message).c_str());
  if (json) print_json_error(kind, message);
}

/// Runs `command` and turns what it throws into a report and an exit code. A wrong command
/// line gets the command's own usage, not the whole help.
int run(const Command& command, const std::vector<std::string>& args, bool json) {
  try {
    return command.run(args);
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "safetensors: %s\n\n%s", e.what(), command_usage(command).c_str());
    if (json) print_json_error("Usage", e.what());
    return 2;
  } catch (const safetensors::Error& e) {
    report(json, safetensors::to_string(e.kind()), e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    report(json, "Io", e.what());
  } catch (const std::bad_alloc&) {
    report(json, "Io", "out of memory");
  } catch (const std::exception& e) {
    report(json, "Internal", e.what());
  }
  return 1;
}

/// What was printed must have arrived: a full disk or a closed pipe is an error, not success.
int check_stdout(int code) {
  return checked::stdout_arrived("safetensors", "Io: ") ? code : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(global_usage().c_str(), args.empty() ? stderr : stdout);
    return args.empty() ? 2 : check_stdout(0);
  }
  if (args[0] == "--version") {
    std::printf("safetensors %s\n", SAFETENSORS_VERSION);
    return check_stdout(0);
  }
  const Command* command = find_command(args[0]);
  args.erase(args.begin());
  const bool json = has_flag(args, {"--json"});
  if (command == nullptr) {
    std::string why = "unknown command '" + printable(argv[1]) + "'";
    std::string names;
    for (const auto& c : kCommands) names += std::string(names.empty() ? "" : ", ") + c.name;
    std::fprintf(stderr, "safetensors: %s (commands: %s; safetensors --help says more)\n", why.c_str(),
                 names.c_str());
    if (json) print_json_error("Usage", why);
    return check_stdout(2);
  }
  if (has_flag(args, {"--help", "-h"})) {
    std::fputs(command_usage(*command).c_str(), stdout);
    return check_stdout(0);
  }
  return check_stdout(run(*command, args, json));
}
