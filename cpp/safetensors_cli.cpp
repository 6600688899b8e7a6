// `safetensors`: inspect, validate, edit the metadata of, and time safetensors files, through
// the public C++ API only. Usage text below; exit codes: 0 success, 1 a file is invalid or an
// operation failed (a failed write to standard output included), 2 the command line is wrong.
// Every user-controlled string it prints (names, metadata, paths, messages that embed them) goes
// through `printable` or `json_string`, so a file cannot forge output or drive the terminal.
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "measure.hpp"

#ifndef SAFETENSORS_VERSION
#define SAFETENSORS_VERSION "unknown"
#endif

namespace {

namespace fs = std::filesystem;
using safetensors::Backend;
using safetensors::Checkpoint;
using safetensors::OpenOptions;
using safetensors::SafeOpen;

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

std::string printable(std::string_view text);

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An argument that looks like an option but is none of the command's: a usage error rather
/// than a file name (a file whose name starts with "-" can be given as ./-name).
[[noreturn]] void unknown_option(const std::string& command, const std::string& arg) {
  throw UsageError(command + ": unknown option '" + printable(arg) + "'");
}

bool is_option(const std::string& a) { return a.size() > 1 && a[0] == '-'; }

std::string with_commas(std::uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// One UTF-8 sequence at `s[i]`: its code point and length, or length 0 where the bytes are not
/// valid UTF-8 (overlong forms, surrogates and values above U+10FFFF included).
std::pair<char32_t, std::size_t> decode_utf8(std::string_view s, std::size_t i) {
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b = byte(i);
  if (b < 0x80) return {b, 1};
  std::size_t len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc2 ? 2 : 0;
  if (len == 0 || b > 0xf4 || i + len > s.size()) return {0, 0};
  char32_t c = b & (0x7f >> len);
  for (std::size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return {0, 0};
    c = (c << 6) | (byte(i + k) & 0x3f);
  }
  if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
      (c >= 0xd800 && c <= 0xdfff)) {
    return {0, 0};
  }
  return {c, len};
}

/// Characters that could move the cursor, rewrite a line, switch the terminal's state or
/// reorder what is shown: C0 and C1 controls, DEL, and Unicode's invisible direction and line
/// controls.
bool is_control(char32_t c) {
  return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) || c == 0x200e || c == 0x200f ||
         (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069) || c == 0x2028 || c == 0x2029 ||
         c == 0xfeff;
}

/// `text` safe to print on a terminal: controls as `\n`, `\r`, `\t`, `\xNN` or `\u{NNNN}`,
/// bytes that are not UTF-8 as `\xNN`, and `\` as `\\` so that an escape cannot be forged.
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  for (std::size_t i = 0; i < text.size();) {
    auto [c, len] = decode_utf8(text, i);
    if (len == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(text[i]));
      out += buf;
      ++i;
      continue;
    }
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
    } else if (is_control(c)) {
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : "\\u{%04x}", static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}
std::string printable_path(const fs::path& p) {
  return printable(std::string_view(p.native()));
}

/// Characters a terminal shows for `printable` text (code points; wide characters count once).
std::size_t display_width(std::string_view text) {
  std::size_t n = 0;
  for (char ch : text) n += (static_cast<unsigned char>(ch) & 0xc0) != 0x80;
  return n;
}

/// `text` padded with spaces to `width` columns (never cut: a longer name is printed whole).
std::string padded(std::string text, std::size_t width) {
  std::size_t w = display_width(text);
  if (w < width) text.append(width - w, ' ');
  return text;
}

/// A JSON string: controls (as `is_control` defines them) as `\uNNNN`, bytes that are not
/// UTF-8 (possible in paths) as U+FFFD, since JSON cannot carry them.
std::string json_string(std::string_view v) {
  std::string out = "\"";
  char buf[16];  // "\\u" and up to 8 hex digits of an unsigned, as far as the compiler can tell
  for (std::size_t i = 0; i < v.size();) {
    auto [c, len] = decode_utf8(v, i);
    if (len == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (c == '"' || c == '\\') {
      out += c == '"' ? "\\\"" : "\\\\";
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
    } else if (is_control(c)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(v.substr(i, len));
    }
    i += len;
  }
  return out + "\"";
}

[[noreturn]] void throw_io(const std::string& doing, const fs::path& path, int err) {
  throw safetensors::Error(safetensors::ErrorKind::Io,
                           "cannot " + doing + " " + path.string() + ": " + std::strerror(err));
}

/// `fs::file_size` as a typed `Io` error (a shard removed meanwhile, a permission change).
std::uint64_t file_size_of(const fs::path& path) {
  std::error_code ec;
  auto n = fs::file_size(path, ec);
  if (ec) throw_io("get the size of", path, ec.value());
  return n;
}

/// Whether `p` names a checkpoint index: as `Checkpoint` decides, by an extension of `json` in
/// any case (`model.index.JSON` too), so that every command treats the path as the library does.
bool is_index(const fs::path& p) {
  std::string ext = p.extension().string();
  return ext.size() == 5 && std::equal(ext.begin(), ext.end(), ".json", [](char a, char b) {
           return (a >= 'A' && a <= 'Z' ? static_cast<char>(a - 'A' + 'a') : a) == b;
         });
}

void print_error(const fs::path& path, const safetensors::Error& e) {
  std::printf("FAIL %s: %s: %s\n", printable_path(path).c_str(),
              std::string(safetensors::to_string(e.kind())).c_str(), printable(e.what()).c_str());
}

// ---- inspect -----------------------------------------------------------------------------

struct Row {
  std::string name;
  safetensors::TensorInfo info;
  std::string shard;  // empty for a single file
};

int inspect(const std::vector<std::string>& args) {
  bool json = false;
  std::optional<fs::path> path;
  for (const auto& a : args) {
    if (a == "--json") json = true;
    else if (is_option(a)) unknown_option("inspect", a);
    else if (!path) path = a;
    else throw UsageError("inspect takes one file");
  }
  if (!path) throw UsageError("inspect needs a file");

  std::vector<Row> rows;
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;
  std::uint64_t file_bytes = 0, header_bytes = 0;
  std::size_t shards = 1;
  if (is_index(*path)) {
    Checkpoint ckpt(*path, {Backend::Read});
    metadata = ckpt.metadata();
    has_metadata = ckpt.has_metadata();
    shards = ckpt.shard_count();
    for (const auto& k : ckpt.keys()) rows.push_back({k, ckpt.info(k), ckpt.shard_of(k).filename().string()});
    for (const auto& p : ckpt.shard_paths()) file_bytes += file_size_of(p);
  } else {
    SafeOpen f(*path, {Backend::Read});  // the read backend reads the header and nothing else
    metadata = f.metadata();
    has_metadata = f.has_metadata();
    for (const auto& k : f.offset_keys()) rows.push_back({k, f.info(k), {}});
    file_bytes = f.data_offset() + f.data_size();  // the length validated, not measured again
    header_bytes = f.header_size();
  }

  std::uint64_t params = 0, bytes = 0;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_dtype;  // params, bytes
  for (const auto& r : rows) {
    params += r.info.numel();
    bytes += r.info.byte_size();
    auto& d = by_dtype[std::string(safetensors::to_string(r.info.dtype))];
    d.first += r.info.numel();
    d.second += r.info.byte_size();
  }

  if (json) {
    std::string o = "{\"path\":" + json_string(path->string()) + ",\"file_bytes\":" + std::to_string(file_bytes);
    if (!is_index(*path)) o += ",\"header_bytes\":" + std::to_string(header_bytes);
    o += ",\"shards\":" + std::to_string(shards) + ",\"metadata\":";
    if (has_metadata) {
      o += "{";
      bool first = true;
      for (const auto& [k, v] : metadata) {
        o += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
        first = false;
      }
      o += "}";
    } else {
      o += "null";
    }
    o += ",\"tensors\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::string dims;
      for (std::size_t j = 0; j < r.info.shape.size(); ++j) dims += (j ? "," : "") + std::to_string(r.info.shape[j]);
      o += (i ? "," : "") + std::string("{\"name\":") + json_string(r.name) + ",\"dtype\":\"" +
           std::string(safetensors::to_string(r.info.dtype)) + "\",\"shape\":[" + dims +
           "],\"bytes\":" + std::to_string(r.info.byte_size()) + ",\"data_offsets\":[" +
           std::to_string(r.info.data_offsets.first) + "," + std::to_string(r.info.data_offsets.second) + "]";
      if (!r.shard.empty()) o += ",\"shard\":" + json_string(r.shard);
      o += "}";
    }
    o += "],\"totals\":{\"tensors\":" + std::to_string(rows.size()) + ",\"parameters\":" + std::to_string(params) +
         ",\"bytes\":" + std::to_string(bytes) + ",\"by_dtype\":{";
    bool first = true;
    for (const auto& [d, pb] : by_dtype) {
      o += (first ? "" : ",") + json_string(d) + ":{\"parameters\":" + std::to_string(pb.first) +
           ",\"bytes\":" + std::to_string(pb.second) + "}";
      first = false;
    }
    o += "}}}";
    std::puts(o.c_str());
    return 0;
  }

  std::printf("%s: %s bytes", printable_path(*path).c_str(), with_commas(file_bytes).c_str());
  if (is_index(*path)) std::printf(" in %zu shards\n", shards);
  else std::printf(", header %s bytes\n", with_commas(header_bytes).c_str());
  if (!has_metadata) {
    std::printf("metadata: none\n");
  } else {
    std::printf("metadata:\n");
    for (const auto& [k, v] : metadata) std::printf("  %s: %s\n", printable(k).c_str(), printable(v).c_str());
  }
  // Columns fit the longest name and shape up to a cap: one huge name (a hostile file can hold
  // a 100,000-byte one) is printed whole on its own row instead of padding every row to it.
  constexpr std::size_t kMaxName = 60, kMaxShape = 32;
  std::size_t wn = 4, ws = 5;
  for (const auto& r : rows) {
    wn = std::max(wn, std::min(kMaxName, display_width(printable(r.name))));
    ws = std::max(ws, std::min(kMaxShape, shape_text(r.info.shape).size()));
  }
  std::printf("tensors (%zu):\n", rows.size());
  std::printf("  %s  %-11s  %s  %15s  %15s%s\n", padded("name", wn).c_str(), "dtype",
              padded("shape", ws).c_str(), "bytes", "offset", is_index(*path) ? "  shard" : "");
  for (const auto& r : rows) {
    std::printf("  %s  %-11s  %s  %15s  %15s%s%s\n", padded(printable(r.name), wn).c_str(),
                std::string(safetensors::to_string(r.info.dtype)).c_str(),
                padded(shape_text(r.info.shape), ws).c_str(), with_commas(r.info.byte_size()).c_str(),
                with_commas(r.info.data_offsets.first).c_str(), r.shard.empty() ? "" : "  ",
                printable(r.shard).c_str());
  }
  std::printf("totals: %s parameters, %s bytes\n", with_commas(params).c_str(), with_commas(bytes).c_str());
  for (const auto& [d, pb] : by_dtype) {
    std::printf("  %-11s %s parameters, %s bytes\n", d.c_str(), with_commas(pb.first).c_str(), with_commas(pb.second).c_str());
  }
  return 0;
}

// ---- validate ----------------------------------------------------------------------------

/// Progress on stderr when it is a terminal, at most ten updates a second.
class Progress {
 public:
  explicit Progress(std::size_t files) : on_(::isatty(2) == 1), files_(files) {}
  void update(std::size_t index, const fs::path& path, std::uint64_t done, std::uint64_t total) {
    if (!on_) return;
    auto now = measure::Clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done != total) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %3.0f%% of %s bytes", index + 1, files_,
                 printable_path(path.filename()).c_str(),
                 total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                 with_commas(total).c_str());
  }
  void clear() {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
  std::size_t files_;
  measure::Clock::time_point last_{};
};

/// Reads every data byte of `f`, in 16 MiB pieces.
void read_all(const SafeOpen& f, std::size_t index, const fs::path& path, Progress& progress) {
  std::vector<std::byte> buffer(16u << 20);
  std::uint64_t total = f.data_size();
  for (std::uint64_t at = 0; at < total; at += buffer.size()) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), total - at));
    f.read_data(static_cast<std::size_t>(at), {buffer.data(), n});
    progress.update(index, path, at + n, total);
  }
}

/// What lenient reading accepted in one file, printed under its OK line: never silent.
void print_quirks(const std::vector<std::string>& missing,
                  const std::vector<std::pair<fs::path, std::uint64_t>>& trailing) {
  for (const auto& name : missing)
    std::printf("     missing: tensor `%s` is listed in the index but absent from its shard\n",
                printable(name).c_str());
  for (const auto& [shard, n] : trailing)
    std::printf("     trailing: %s has %s bytes after its last tensor\n", printable_path(shard).c_str(),
                with_commas(n).c_str());
}

int validate(const std::vector<std::string>& args) {
  bool header_only = false;
  bool lenient = false;
  bool allow_trailing = false;
  std::vector<fs::path> paths;
  for (const auto& a : args) {
    if (a == "--header-only") header_only = true;
    else if (a == "--lenient")
      lenient = true;
    else if (a == "--allow-trailing-bytes")
      allow_trailing = true;
    else if (is_option(a)) unknown_option("validate", a);
    else paths.emplace_back(a);
  }
  if (paths.empty()) throw UsageError("validate needs at least one file");
  Progress progress(paths.size());
  int bad = 0;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const auto& path = paths[i];
    try {
      std::size_t tensors = 0;
      std::uint64_t bytes = 0;
      std::vector<std::string> missing;
      std::vector<std::pair<fs::path, std::uint64_t>> trailing;
      const OpenOptions file_options{.backend = Backend::Read, .allow_trailing_bytes = allow_trailing};
      if (is_index(path)) {
        Checkpoint ckpt(
            path, {.backend = Backend::Read, .allow_trailing_bytes = allow_trailing, .lenient = lenient});
        if (lenient) {
          missing = ckpt.missing();  // opens every shard
        } else {
          for (const auto& k : ckpt.keys()) (void)ckpt.info(k);  // opens and checks every shard
        }
        for (const auto& shard : ckpt.shard_paths()) {
          SafeOpen f(shard, file_options);
          if (!header_only) read_all(f, i, shard, progress);
          bytes += f.data_offset() + f.data_size() + f.trailing_bytes();
          if (f.trailing_bytes() > 0) trailing.emplace_back(shard, f.trailing_bytes());
        }
        tensors = ckpt.size() - missing.size();
      } else {
        SafeOpen f(path, file_options);
        if (!header_only) read_all(f, i, path, progress);
        tensors = f.size();
        // The length of the file just validated: measuring the path again could report another
        // file's size, or fail, when another process replaces or removes it meanwhile.
        bytes = f.data_offset() + f.data_size() + f.trailing_bytes();
        if (f.trailing_bytes() > 0) trailing.emplace_back(path, f.trailing_bytes());
      }
      progress.clear();
      std::printf("OK   %s (%zu tensors, %s bytes)\n", printable_path(path).c_str(), tensors,
                  with_commas(bytes).c_str());
      print_quirks(missing, trailing);
    } catch (const safetensors::Error& e) {
      progress.clear();
      print_error(path, e);
      ++bad;
    }
  }
  if (paths.size() > 1) std::printf("%zu of %zu files valid\n", paths.size() - static_cast<std::size_t>(bad), paths.size());
  return bad ? 1 : 0;
}

// ---- metadata ----------------------------------------------------------------------------

/// An exclusive `flock` on the file a path names, held until destruction. Concurrent `metadata`
/// runs on one file take turns: the second waits, then finds that the path now names the first
/// one's rewrite (a new inode) and locks that instead, so it edits the updated file and no
/// update is lost. Programs that do not take the lock are not excluded (advisory locking).
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    for (int attempt = 0; attempt < 1000; ++attempt) {
      // O_NONBLOCK: opening a FIFO must not hang; SafeOpen refuses non-regular files later.
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) throw_io("open", path, errno);
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) {
          int err = errno;
          ::close(fd);
          throw_io("lock", path, err);
        }
        std::fprintf(stderr, "waiting for another process editing %s\n", printable_path(path).c_str());
        while (::flock(fd, LOCK_EX) != 0) {
          if (errno != EINTR) {
            int err = errno;
            ::close(fd);
            throw_io("lock", path, err);
          }
        }
      }
      struct stat locked {
      }, named{};
      if (::fstat(fd, &locked) == 0 && ::stat(path.c_str(), &named) == 0 && locked.st_dev == named.st_dev &&
          locked.st_ino == named.st_ino) {
        fd_ = fd;
        stat_ = locked;
        return;
      }
      ::close(fd);  // replaced while we waited: lock what the path names now
    }
    throw safetensors::Error(safetensors::ErrorKind::Io,
                             path.string() + " keeps being replaced by other processes; try again");
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  /// The locked file's status: mode, owner, inode.
  [[nodiscard]] const struct stat& status() const { return stat_; }
  /// Whether `path` still names the locked file.
  [[nodiscard]] bool still_named_by(const fs::path& path) const {
    struct stat now {};
    return ::stat(path.c_str(), &now) == 0 && now.st_dev == stat_.st_dev && now.st_ino == stat_.st_ino;
  }

 private:
  int fd_ = -1;
  struct stat stat_ {};
};

/// SIGINT, SIGTERM and SIGHUP held back while a rewrite is staged, so that none can end the
/// process between creating the staged file and removing or renaming it. `pending()` says
/// whether one arrived (the rewrite is then abandoned); the destructor lets it through, so the
/// process still ends by that signal, as it would have.
class HeldSignals {
 public:
  HeldSignals() {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set_, sig);
    ::sigprocmask(SIG_BLOCK, &set_, &old_);
  }
  ~HeldSignals() { ::sigprocmask(SIG_SETMASK, &old_, nullptr); }
  HeldSignals(const HeldSignals&) = delete;
  HeldSignals& operator=(const HeldSignals&) = delete;
  [[nodiscard]] bool pending() const {
    sigset_t p;
    sigemptyset(&p);
    ::sigpending(&p);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      if (sigismember(&p, sig) == 1) return true;
    }
    return false;
  }

 private:
  sigset_t set_{}, old_{};
};

/// Gives the staged file the original's owner (where permitted) and then its mode (after the
/// owner: a change of owner clears set-id bits), so a rewrite never widens access.
void copy_owner_and_mode(const fs::path& staged, const struct stat& original, const fs::path& path) {
  if (::chown(staged.c_str(), original.st_uid, original.st_gid) != 0) {
    // Not permitted (we are not root): keep the group if we may, and say that the owner changes.
    if (::chown(staged.c_str(), static_cast<uid_t>(-1), original.st_gid) != 0 ||
        ::geteuid() != original.st_uid) {
      std::fprintf(stderr, "note: %s is owned by uid %u gid %u; the rewritten file belongs to you\n",
                   printable_path(path).c_str(), static_cast<unsigned>(original.st_uid),
                   static_cast<unsigned>(original.st_gid));
    }
  }
  // Set-id bits apply only to the identity they were set for: one that could not be kept drops
  // them (as the library's writer does), else the rewrite would be set-id to the caller.
  mode_t mode = original.st_mode & 07777;
  struct stat now {};
  if (::stat(staged.c_str(), &now) != 0) throw_io("get the status of", staged, errno);
  if (now.st_uid != original.st_uid) mode &= static_cast<mode_t>(~S_ISUID);
  if (now.st_gid != original.st_gid) mode &= static_cast<mode_t>(~S_ISGID);
  if (::chmod(staged.c_str(), mode) != 0) throw_io("set the mode of", staged, errno);
}

/// Creates the staged file: hidden, beside the target, named for this process, the target's
/// name cut so that it stays within NAME_MAX. It is created here, exclusively and private
/// (0600), because the writer follows a symlink at the path it is given and keeps an existing
/// file's mode: a link planted at this predictable name (or a stale file of another user) must
/// never be written through or have its mode copied. A name already taken gets a suffix.
fs::path create_staged(const fs::path& target) {
  std::string base = target.filename().string();
  if (base.size() > 100) base.resize(100);
  std::string stem = "." + base + ".metadata-" + std::to_string(::getpid());
  for (int n = 0;; ++n) {
    fs::path staged = target.parent_path() / (n == 0 ? stem : stem + "-" + std::to_string(n));
    int fd = ::open(staged.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      return staged;
    }
    if (errno != EEXIST || n == 99) throw_io("create", staged, errno);
  }
}

int metadata(const std::vector<std::string>& args) {
  std::optional<fs::path> path;
  std::map<std::string, std::string> sets;
  std::set<std::string> deletes;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "--set" || a == "--delete") {
      if (i + 1 >= args.size()) throw UsageError(a + " needs an argument");
      const auto& v = args[++i];
      if (a == "--delete") {
        deletes.insert(v);
        continue;
      }
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        throw UsageError("--set takes KEY=VALUE, got '" + printable(v) + "'");
      sets[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (is_option(a)) {
      unknown_option("metadata", a);
    } else if (!path) {
      path = a;
    } else {
      throw UsageError("metadata takes one file");
    }
  }
  if (!path) throw UsageError("metadata needs a file");
  if (is_index(*path)) throw UsageError("metadata edits single files, not an index");

  if (sets.empty() && deletes.empty()) {
    SafeOpen original(*path);
    if (!original.has_metadata()) std::puts("(no metadata)");
    for (const auto& [k, v] : original.metadata())
      std::printf("%s: %s\n", printable(k).c_str(), printable(v).c_str());
    return 0;
  }

  // A symbolic link is followed: the file it names is edited and the link stays a link.
  fs::path target = *path;
  std::error_code link_ec;
  if (fs::is_symlink(target, link_ec)) {
    target = fs::canonical(target, link_ec);
    if (link_ec) throw_io("resolve the link", *path, link_ec.value());
  }
  FileLock lock(target);
  SafeOpen original(target);
  if (!lock.still_named_by(target)) {
    throw safetensors::Error(safetensors::ErrorKind::Io,
                             target.string() + " was replaced by a program that does not lock it; try again");
  }
  auto meta = original.metadata();
  for (const auto& k : deletes) {
    if (!meta.erase(k)) std::fprintf(stderr, "note: no key '%s' to delete\n", printable(k).c_str());
  }
  for (const auto& [k, v] : sets) meta[k] = v;

  // Write beside the file, compare every tensor with the original, then swap it in.
  std::vector<std::pair<std::string, safetensors::TensorView>> tensors;
  for (const auto& k : original.keys()) tensors.emplace_back(k, original.get_tensor(k));
  fs::path staged;
  {
    HeldSignals held;
    staged = create_staged(target);
    // Created private (umask 077) and then given the original's owner and mode, so its bytes are
    // never readable by more users than the original's.
    mode_t old_mask = ::umask(077);
    try {
      safetensors::save_file(staged, tensors, meta);
      ::umask(old_mask);
      copy_owner_and_mode(staged, lock.status(), target);
      SafeOpen written(staged);
      for (const auto& [name, view] : tensors) {
        auto w = written.get_tensor(name);
        if (w.dtype != view.dtype || w.shape != view.shape || w.data.size() != view.data.size() ||
            !std::equal(w.data.begin(), w.data.end(), view.data.begin())) {
          throw safetensors::Error(safetensors::ErrorKind::Internal,
                                   "tensor `" + name + "` differs after rewriting");
        }
      }
      if (written.size() != original.size() || written.metadata() != meta) {
        throw safetensors::Error(safetensors::ErrorKind::Internal,
                                 "the rewritten file does not hold what was asked");
      }
      if (held.pending()) {
        throw safetensors::Error(safetensors::ErrorKind::Io,
                                 "interrupted: " + target.string() + " left unchanged");
      }
      if (::rename(staged.c_str(), target.c_str()) != 0) {
        int err = errno;
        throw safetensors::Error(safetensors::ErrorKind::Io, "cannot replace " + target.string() + " with " +
                                                                 staged.string() + ": " + std::strerror(err));
      }
    } catch (...) {
      ::umask(old_mask);
      ::unlink(staged.c_str());
      throw;  // a held signal, if any, ends the process when `held` lets it through
    }
  }
  std::printf("updated %s: %zu tensors unchanged, metadata now has %zu keys\n",
              printable_path(target).c_str(), tensors.size(), meta.size());
  return 0;
}

// ---- bench -------------------------------------------------------------------------------

/// Runs a measurement helper from measure.hpp, whose failures (the file changed under the
/// measurement: replaced, resized, removed) are `Io` errors rather than `Internal` ones.
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

int bench(const std::vector<std::string>& args) {
  std::optional<fs::path> path;
  int runs = 5;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--runs") {
      if (i + 1 >= args.size()) throw UsageError("--runs needs a number");
      const std::string& v = args[++i];
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), runs);
      if (ec != std::errc{} || end != v.data() + v.size() || runs < 1 || runs > 100000) {
        throw UsageError("--runs takes a number from 1 to 100000, got '" + printable(v) + "'");
      }
    } else if (is_option(args[i])) {
      unknown_option("bench", args[i]);
    } else if (!path) {
      path = args[i];
    } else {
      throw UsageError("bench takes one file");
    }
  }
  if (!path) throw UsageError("bench needs a file");
  std::uint64_t size = 0;
  {
    SafeOpen probe(*path);  // a missing or malformed file fails here, with its error kind
    size = probe.data_offset() + probe.data_size();  // the length just validated, exactly
  }
  io_errors([&] {
    measure::warm(*path);
    return 0;
  });
  std::uint64_t sink = 0;
  auto open = measure::median(measure::repeat(std::max(runs, 11), [&] {
    SafeOpen f(*path);
    for (const auto& k : f.keys()) sink += f.get_tensor(k).shape.size();
  }));
  auto load = measure::median(measure::repeat(runs, [&] {
    SafeOpen f(*path);
    for (const auto& k : f.offset_keys()) {
      auto v = f.get_tensor(k);
      for (std::size_t i = 0; i < v.data.size(); i += 64) sink += static_cast<std::uint8_t>(v.data[i]);
    }
  }));
  auto copy = measure::median(measure::repeat(runs, [&] {
    SafeOpen f(*path, {Backend::Read});
    for (const auto& k : f.offset_keys()) sink += f.get_tensor(k).data.size();
  }));
  measure::MappedBuffer target(size);
  auto read = io_errors([&] {
    return measure::median(
        measure::repeat(runs, [&] { measure::read_whole_file(*path, target.data, size); }));
  });
  auto gbps = [&](double s) { return static_cast<double>(size) / s / 1e9; };
  std::printf("%s: %s bytes, %s\n", printable_path(*path).c_str(), with_commas(size).c_str(),
              measure::machine().c_str());
  std::printf("  open (keys + every view)      %10.3f ms\n", open * 1e3);
  std::printf("  load (every byte, mapped)     %10.3f ms  %6.2f GB/s\n", load * 1e3, gbps(load));
  std::printf("  load into owned memory        %10.3f ms  %6.2f GB/s\n", copy * 1e3, gbps(copy));
  std::printf("  plain read() of the file      %10.3f ms  %6.2f GB/s\n", read * 1e3, gbps(read));
  return sink == 42 ? 0 : 0;
}

}  // namespace

int stats_command(const std::vector<std::string>& args);  // cli_stats.cpp

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
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--set" || args[i] == "--delete" || args[i] == "--runs") {
      ++i;  // the next argument is a value, even if it reads "--help"
    } else if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  int code = 0;
  try {
    if (command == "inspect")
      code = inspect(args);
    else if (command == "validate")
      code = validate(args);
    else if (command == "metadata")
      code = metadata(args);
    else if (command == "bench")
      code = bench(args);
    else if (command == "stats")
      code = stats_command(args);  // cli_stats.cpp
    else
      throw UsageError("unknown command '" + printable(command) + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "safetensors: %s\n\n%s", e.what(), kUsage);
    return 2;
  } catch (const safetensors::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "safetensors: %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(),
                 printable(e.what()).c_str());
    return 1;
  } catch (const fs::filesystem_error& e) {
    std::fprintf(stderr, "safetensors: Io: %s\n", printable(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "safetensors: Io: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors: Internal: %s\n", printable(e.what()).c_str());
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
