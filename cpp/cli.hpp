// What the `safetensors` tool's files share: the commands' entry points (one file each), usage
// errors, how text a file controls is printed (cli_output.cpp), and how paths are classified.
// Exit codes: 0 success, 1 a file is invalid or an operation failed, 2 the command line is wrong.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <safetensors/checkpoint.hpp>
#include <safetensors/error.hpp>
#include <safetensors/remote.hpp>
#include <safetensors/safe_open.hpp>

#include "json.hpp"

namespace cli {

namespace fs = std::filesystem;

// ---- the commands: each takes the arguments after its name and returns the exit code ---------

int inspect_command(const std::vector<std::string>& args);   // cli_inspect.cpp
int validate_command(const std::vector<std::string>& args);  // cli_validate.cpp
int metadata_command(const std::vector<std::string>& args);  // cli_metadata.cpp
int bench_command(const std::vector<std::string>& args);     // cli_bench.cpp
int stats_command(const std::vector<std::string>& args);     // cli_stats.cpp
int reshard_command(const std::vector<std::string>& args);   // cli_reshard.cpp

// ---- output: everything a file controls goes through one of these (cli_output.cpp) ------------

/// `text` safe to print on a terminal: controls as `\n`, `\r`, `\t`, `\xNN` or `\u{NNNN}`,
/// bytes that are not UTF-8 as `\xNN`, and `\` as `\\` so that an escape cannot be forged.
std::string printable(std::string_view text);
std::string printable_path(const fs::path& p);

/// Characters a terminal shows for `printable` text (code points; wide characters count once).
std::size_t display_width(std::string_view text);
/// `text` padded with spaces to `width` columns (never cut: a longer name is printed whole).
std::string padded(std::string text, std::size_t width);

std::string with_commas(std::uint64_t n);

/// Whether a command shows progress on stderr: only when someone watches, that is when standard
/// output and standard error are both terminals and no --json was asked for. Output piped to a
/// file or a program, or a document a program reads, gets no control characters.
bool shows_progress(bool json);
/// `[2, 3]`.
std::string shape_text(const std::vector<std::size_t>& shape);

/// JSON documents are built as `Json` values (json.hpp), never by pasting text.
enum class JsonLayout {
  Compact,  // {"a":1,"b":[1,2]}: inspect
  Spaced,   // {"a": 1, "b": [1, 2]}: stats, one tensor per line
};
/// `value` as JSON text on one line. Strings escape what `printable` escapes (controls as
/// `\uNNNN`, Unicode's direction and line controls included); bytes that are not UTF-8
/// (possible in paths) become U+FFFD. Floats are written with 17 significant digits (exact),
/// infinities and NaN as null.
std::string json_text(const Json& value, JsonLayout layout = JsonLayout::Compact);

// ---- the command line -------------------------------------------------------------------------

/// A command line the tool cannot run: printed with the usage text, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline bool is_option(const std::string& a) {
  return a.size() > 1 && a[0] == '-';
}

/// An argument that looks like an option but is none of the command's: a usage error rather
/// than a file name (a file whose name starts with "-" can be given as ./-name).
[[noreturn]] inline void unknown_option(const std::string& command, const std::string& arg) {
  throw UsageError(command + ": unknown option '" + printable(arg) + "'");
}

/// The arguments of a command that takes a file and flags without values: the flags of `known`
/// that were given, the file (the first other argument), and the arguments after it. Any other
/// option, or no file, is a usage error.
struct FileArguments {
  fs::path path;
  std::set<std::string, std::less<>> flags;
  std::vector<std::string> more;
};

inline FileArguments read_file_arguments(const std::string& command, const std::vector<std::string>& args,
                                         std::initializer_list<std::string_view> known) {
  FileArguments out;
  bool have_path = false;
  for (const auto& a : args) {
    if (std::find(known.begin(), known.end(), a) != known.end()) {
      out.flags.insert(a);
    } else if (is_option(a)) {
      unknown_option(command, a);
    } else if (!have_path) {
      out.path = a;
      have_path = true;
    } else {
      out.more.push_back(a);
    }
  }
  if (!have_path) throw UsageError(command + " needs a file");
  return out;
}

// ---- files ------------------------------------------------------------------------------------

/// Whether `p` names a checkpoint index: as `Checkpoint` decides, by an extension of `json` in
/// any case (`model.index.JSON` too), so that every command treats the path as the library does.
inline bool is_index(const fs::path& p) {
  std::string ext = p.extension().string();
  return ext.size() == 5 && std::equal(ext.begin(), ext.end(), ".json", [](char a, char b) {
           return (a >= 'A' && a <= 'Z' ? static_cast<char>(a - 'A' + 'a') : a) == b;
         });
}

/// Opens the file `path` names: a URL (`safetensors::is_url`: `s3://`, `http://`, `https://`)
/// remotely, only its header when `header_only`, else each read's bytes when it is made
/// (memory stays what one read needs, whatever the file's size); anything else from disk with
/// `options`.
inline safetensors::SafeOpen open_file(const fs::path& path, safetensors::OpenOptions options,
                                       bool header_only) {
  const std::string& text = path.native();
  if (!safetensors::is_url(text)) return safetensors::SafeOpen(path, options);
  return safetensors::SafeOpen::open_remote(text, {.header_only = header_only, .on_demand = !header_only},
                                            options);
}

/// Opens the checkpoint `path` names (an index or one file), a URL remotely as `open_file`
/// does (its shards the objects next to the index), anything else from disk.
inline safetensors::Checkpoint open_checkpoint(const fs::path& path, safetensors::CheckpointOptions options,
                                               bool header_only = false) {
  const std::string& text = path.native();
  if (!safetensors::is_url(text)) return safetensors::Checkpoint(path, options);
  return safetensors::Checkpoint::open_remote(text, {.header_only = header_only, .on_demand = !header_only},
                                              options);
}

/// A failed system call on `path` as a typed `Io` error.
[[noreturn]] inline void throw_io(const std::string& doing, const fs::path& path, int err) {
  throw safetensors::Error(safetensors::ErrorKind::Io,
                           "cannot " + doing + " " + path.string() + ": " + std::strerror(err));
}

}  // namespace cli
