// What the `safetensors` tool's files share: the commands' entry points (one file each), usage
// errors, how text a file controls is printed (cli_output.cpp), and the one rule that tells a
// URL from a local path in every command's file arguments (`Location`).
// Exit codes: 0 success, 1 a file is invalid or an operation failed, 2 the command line is wrong.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
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

// ---- file arguments: a URL or a local path, decided once -------------------------------------

/// A file argument as the user typed it: a URL or a local path, decided from the raw text by
/// the library's one rule (`safetensors::is_url`: `s3://`, `http://`, `https://`, the scheme in
/// any case), once, for every command. The text never becomes a `fs::path` before that: a path
/// built from `http://host/m` names the local file `http:/host/m` (std::filesystem's normal
/// form and the kernel both fold the `//`), so a command would read, or rewrite, a file the
/// user never named. Commands reach the file only through `open_file`, `open_checkpoint` (a URL
/// remotely) and `local_path` (a URL refused). A URL is shown as the library's messages show it
/// (`safetensors::redact_url`): a pre-signed URL's query, or a password, never reaches the
/// output or --json.
class Location {
 public:
  explicit Location(std::string text)
      : text_(std::move(text)),
        url_(safetensors::is_url(text_)),
        shown_(url_ ? safetensors::redact_url(text_) : text_) {}

  [[nodiscard]] bool is_url() const noexcept { return url_; }
  /// The argument as output and --json show it: a path as typed, a URL without user
  /// information, query or fragment.
  [[nodiscard]] const std::string& text() const noexcept { return shown_; }
  /// The argument as typed, a URL's query included: what is opened, never what is printed.
  [[nodiscard]] const std::string& address() const noexcept { return text_; }
  /// Whether it names a checkpoint index: as `Checkpoint` decides, by an extension of `json` in
  /// any case (`model.index.JSON` too), of the text's last segment (a URL's path's, before any
  /// query, as a path's).
  [[nodiscard]] bool is_index() const {
    std::string_view name(shown_);
    name.remove_prefix(std::min(name.size(), name.rfind('/') + 1));  // npos + 1 is 0
    const auto dot = name.rfind('.');
    if (dot == std::string_view::npos || dot == 0 || name == "..") return false;  // as fs::path::extension
    const std::string_view ext = name.substr(dot);
    return ext.size() == 5 && std::equal(ext.begin(), ext.end(), ".json", [](char a, char b) {
             return (a >= 'A' && a <= 'Z' ? static_cast<char>(a - 'A' + 'a') : a) == b;
           });
  }
  /// The URL's scheme as messages name it (`http://`); empty for a path.
  [[nodiscard]] std::string scheme() const {
    if (!url_) return {};
    std::string s = text_.substr(0, text_.find("://"));
    for (char& c : s) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    return s + "://";
  }

 private:
  friend fs::path local_path(const Location& at, std::string_view refusal);
  std::string text_;
  bool url_;
  std::string shown_;
};

/// The local path `at` names, for what acts on local files only; a URL is a usage error ending
/// with `refusal` (what the command does instead of taking it, e.g. "download it first"),
/// raised before anything could touch a local file of a similar name. The URL itself is not
/// repeated: it may hold a signature or a password.
inline fs::path local_path(const Location& at, std::string_view refusal) {
  if (at.is_url()) throw UsageError("'" + at.scheme() + "...' is a URL: " + std::string(refusal));
  return fs::path(at.text_);
}

/// The arguments of a command that takes a file and flags without values: the flags of `known`
/// that were given, the file (the first other argument), and the arguments after it. Any other
/// option, or no file, is a usage error.
struct FileArguments {
  Location file{""};
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
      out.file = Location(a);
      have_path = true;
    } else {
      out.more.push_back(a);
    }
  }
  if (!have_path) throw UsageError(command + " needs a file");
  return out;
}

// ---- files ------------------------------------------------------------------------------------

/// How the CLI reads a URL: only its header when `header_only`; else, with a `cache` (a directory,
/// empty for the user's: `--cache`), fetched whole into the local cache and mapped from there (a
/// copy already cached, of the same version, is mapped after one ranged GET); else each read's
/// bytes when it is made (memory stays what one read needs, whatever the file's size).
inline safetensors::RemoteOptions remote_options(bool header_only, const std::optional<fs::path>& cache) {
  safetensors::RemoteOptions o{.header_only = header_only, .on_demand = !header_only && !cache};
  if (cache && !header_only) {
    o.cache = true;
    o.cache_dir = *cache;
  }
  return o;
}

/// Opens the file `at` names: a URL remotely, only its header when `header_only`, else each
/// read's bytes when it is made (memory stays what one read needs, whatever the file's size);
/// a path from disk with `options`.
inline safetensors::SafeOpen open_file(const Location& at, safetensors::OpenOptions options, bool header_only,
                                       const std::optional<fs::path>& cache = std::nullopt) {
  if (!at.is_url()) return safetensors::SafeOpen(local_path(at, {}), options);
  return safetensors::SafeOpen::open_remote(at.address(), remote_options(header_only, cache), options);
}

/// Opens the checkpoint `at` names (an index or one file), a URL remotely as `open_file` does
/// (its shards the objects next to the index), a path from disk.
inline safetensors::Checkpoint open_checkpoint(const Location& at, safetensors::CheckpointOptions options,
                                               bool header_only = false,
                                               const std::optional<fs::path>& cache = std::nullopt) {
  if (!at.is_url()) return safetensors::Checkpoint(local_path(at, {}), options);
  return safetensors::Checkpoint::open_remote(at.address(), remote_options(header_only, cache), options);
}

/// A failed system call on `path` as a typed `Io` error.
[[noreturn]] inline void throw_io(const std::string& doing, const fs::path& path, int err) {
  throw safetensors::Error(safetensors::ErrorKind::Io,
                           "cannot " + doing + " " + path.string() + ": " + std::strerror(err));
}

}  // namespace cli
