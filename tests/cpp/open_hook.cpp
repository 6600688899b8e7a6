// A preloadable library (LD_PRELOAD) that watches the open(2)-family calls of a program:
//   SAFETENSORS_OPEN_LOG=<file>    appends each opened path to <file>, one per line;
//   SAFETENSORS_OPEN_SWAP=<suffix>|<n>|<replacement>
//                                  just before the n-th open of a path ending in <suffix>, renames
//                                  <replacement> over that path: another process replacing the
//                                  file between two opens, at a chosen moment.
// Tests use it to count how often a command opens a file, and to check that a command never
// reads a file other than the one it checked (a path opened twice may name two files).
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace {

using Open = int (*)(const char*, int, ...);

int real_open(const char* path, int flags, mode_t mode) {
  static auto next = reinterpret_cast<Open>(dlsym(RTLD_NEXT, "open"));
  return next(path, flags, mode);
}

void log_path(const char* path) {
  const char* log = std::getenv("SAFETENSORS_OPEN_LOG");
  if (log == nullptr) return;
  int fd = real_open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  // One write per line: O_APPEND keeps lines of concurrent threads whole.
  char line[4096];
  std::size_t n = std::strlen(path);
  if (n > sizeof line - 1) n = sizeof line - 1;
  std::memcpy(line, path, n);
  line[n] = '\n';
  [[maybe_unused]] auto written = ::write(fd, line, n + 1);
  ::close(fd);
}

void maybe_swap(const char* path) {
  const char* spec = std::getenv("SAFETENSORS_OPEN_SWAP");
  if (spec == nullptr) return;
  std::string_view s(spec);
  auto bar = s.find('|'), bar2 = s.find('|', bar + 1);
  if (bar == std::string_view::npos || bar2 == std::string_view::npos) return;
  std::string_view suffix = s.substr(0, bar);
  long nth = std::strtol(std::string(s.substr(bar + 1, bar2 - bar - 1)).c_str(), nullptr, 10);
  std::string replacement(s.substr(bar2 + 1));
  std::string_view p(path);
  if (p.size() < suffix.size() || p.substr(p.size() - suffix.size()) != suffix) return;
  static std::atomic<long> seen{0};
  if (++seen == nth) ::rename(replacement.c_str(), path);
}

void watch(const char* path) {
  if (path == nullptr) return;
  log_path(path);
  maybe_swap(path);
}

mode_t mode_of(int flags, va_list args) {
  return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE ? static_cast<mode_t>(va_arg(args, int))
                                                                    : 0;
}

template <class Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {

int open(const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  mode_t mode = mode_of(flags, args);
  va_end(args);
  watch(path);
  return real_open(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  mode_t mode = mode_of(flags, args);
  va_end(args);
  watch(path);
  static auto real = next<Open>("open64");
  return real(path, flags, mode);
}

int openat(int dir, const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  mode_t mode = mode_of(flags, args);
  va_end(args);
  watch(path);
  static auto real = next<int (*)(int, const char*, int, ...)>("openat");
  return real(dir, path, flags, mode);
}

int openat64(int dir, const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  mode_t mode = mode_of(flags, args);
  va_end(args);
  watch(path);
  static auto real = next<int (*)(int, const char*, int, ...)>("openat64");
  return real(dir, path, flags, mode);
}

}  // extern "C"
