// Output that is checked: every file a program of this project writes (bench_cpp --json, the
// benchmark's index files) and its standard output either arrive whole or become an error with
// the operating system's reason and a nonzero exit code. A missing directory, /dev/full, a full
// disk or a closed pipe must never end in exit code 0 with nothing written. Shared by the
// `safetensors` tool and the benchmark programs.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace checked {

/// A text file opened for writing when constructed, so that a path that cannot be written (a
/// missing directory, no permission) fails before any work whose result it would hold. Throws
/// `std::runtime_error` naming the path and the reason on any failure, closing included.
class OutputFile {
 public:
  explicit OutputFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("create", errno);
  }
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  /// Writes all of `text` (short writes continued, interruptions retried).
  void write(std::string_view text) {
    while (!text.empty()) {
      ssize_t n = ::write(fd_, text.data(), text.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write", n < 0 ? errno : EIO);
      text.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  /// Closes the file: where a network filesystem reports a write that did not land.
  void close() {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("write", errno);
  }

 private:
  [[noreturn]] void fail(const char* doing, int err) const {
    throw std::runtime_error("cannot " + std::string(doing) + " " + path_.string() + ": " +
                             std::strerror(err));
  }

  std::filesystem::path path_;
  int fd_ = -1;
};

/// Writes `text` to `path` (created or truncated), throwing as `OutputFile` does.
inline void write_file(const std::filesystem::path& path, std::string_view text) {
  OutputFile out(path);
  out.write(text);
  out.close();
}

/// Whether everything printed to standard output arrived; if not, says so on stderr as
/// `<program>: cannot write to standard output: <reason>`. Call it last, before exiting.
inline bool stdout_arrived(const char* program, const char* kind = "") {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return true;
  int err = errno;
  if (err == 0) {
    // stdio drops what it failed to write and keeps no reason, so a failure followed by nothing
    // left to flush (the last output larger than the buffer, written past it) reports none. Ask
    // the descriptor itself with one byte more: the output is already incomplete.
    if (::write(STDOUT_FILENO, "\n", 1) < 0) err = errno;
  }
  std::fprintf(stderr, "%s: %scannot write to standard output: %s\n", program, kind,
               err ? std::strerror(err) : "write error");
  return false;
}

}  // namespace checked
