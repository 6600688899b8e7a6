// `safetensors metadata FILE [--set KEY=VALUE]... [--delete KEY]... [--json]`: prints a file's metadata,
// or rewrites the file with the changes: under an exclusive lock, staged beside it (private,
// then given the original's owner, mode and extended attributes, ACLs among them), written
// through the library's writer, every tensor compared with the original, and renamed over it
// with SIGINT, SIGTERM and SIGHUP held so that no signal leaves the staged file behind.
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli.hpp"

namespace cli {

namespace {

using safetensors::SafeOpen;

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
  /// The locked file's descriptor (read-only).
  [[nodiscard]] int fd() const { return fd_; }
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

/// Fills `out` with the bytes a size-then-fill xattr call gives (`call(buffer, size)` returns
/// the length or -1), asking again if they grew in between; false, with `errno` set, when the
/// call fails.
template <class Call>
bool xattr_bytes(Call call, std::string& out) {
  for (;;) {
    const ssize_t len = call(nullptr, 0);
    if (len < 0) return false;
    out.assign(static_cast<std::size_t>(len), '\0');
    const ssize_t got = call(out.data(), out.size());
    if (got >= 0) {
      out.resize(static_cast<std::size_t>(got));
      return true;
    }
    if (errno != ERANGE) return false;
  }
}

/// Gives the staged file the original's extended attributes, its ACL among them, by the rule of
/// the library's writer (rust/core/src/writer/atomic.rs): without them a file whose ACL narrows
/// its group would get that group the ACL mask's rights from the mode bits, wider than before.
/// An attribute only a privileged process may set (`security.*`, `trusted.*`) is left out when
/// refused; failing to copy any other fails the rewrite before anything is replaced.
void copy_extended_attributes(const fs::path& staged, int original, const fs::path& path) {
  std::string names;
  if (!xattr_bytes([&](char* b, std::size_t n) { return ::flistxattr(original, b, n); }, names)) {
    if (errno == ENOTSUP) return;  // no extended attributes on this filesystem
    throw_io("list the extended attributes of", path, errno);
  }
  for (std::size_t at = 0; at < names.size();) {
    const std::string name = names.c_str() + at;
    at += name.size() + 1;
    if (name.empty()) continue;
    std::string value;
    if (!xattr_bytes([&](char* b, std::size_t n) { return ::fgetxattr(original, name.c_str(), b, n); },
                     value)) {
      if (errno == ENODATA) continue;  // removed since it was listed
      throw_io("read the extended attributes of", path, errno);
    }
    if (::lsetxattr(staged.c_str(), name.c_str(), value.data(), value.size(), 0) != 0) {
      const int err = errno;
      const bool privileged = name.rfind("security.", 0) == 0 || name.rfind("trusted.", 0) == 0;
      if (privileged && (err == EPERM || err == EACCES)) continue;
      throw safetensors::Error(safetensors::ErrorKind::Io,
                               "cannot copy the extended attribute `" + printable(name) +
                                   "` (an ACL or xattr) of " + path.string() + " to its rewrite: " +
                                   std::strerror(err) + "; " + path.string() + " left unchanged");
    }
  }
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

struct Edit {
  Location file{""};
  fs::path path;  // the local file an edit rewrites (a URL is refused)
  bool json = false;
  std::map<std::string, std::string> sets;
  std::set<std::string> deletes;
  [[nodiscard]] bool empty() const { return sets.empty() && deletes.empty(); }
};

Edit read_arguments(const std::vector<std::string>& args) {
  Edit edit;
  std::optional<Location> file;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "--set" || a == "--delete") {
      if (i + 1 >= args.size()) throw UsageError(a + " needs an argument");
      const auto& v = args[++i];
      if (a == "--delete") {
        edit.deletes.insert(v);
        continue;
      }
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        throw UsageError("--set takes KEY=VALUE, got '" + printable(v) + "'");
      edit.sets[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (a == "--json") {
      edit.json = true;
    } else if (is_option(a)) {
      unknown_option("metadata", a);
    } else if (!file) {
      file.emplace(a);
    } else {
      throw UsageError("metadata takes one file");
    }
  }
  if (!file) throw UsageError("metadata needs a file");
  if (file->is_index()) throw UsageError("metadata edits single files, not an index");
  edit.file = *file;
  if (!edit.empty()) {
    // Refused here, before anything opens, locks or stages a file of a similar local name.
    edit.path = local_path(
        *file, "--set and --delete rewrite a local file; download it, edit the copy and upload that");
  }
  return edit;
}

/// Prints the metadata of the file `at` names (a URL's header fetched, a path's read).
void print_metadata(const Location& at, bool json) {
  SafeOpen original = open_file(at, {.backend = safetensors::Backend::Read}, /*header_only=*/true);
  if (json) {
    Json meta = original.has_metadata() ? Json(original.metadata()) : Json(nullptr);
    std::puts(json_text(Json::object({{"path", at.text()}, {"metadata", std::move(meta)}})).c_str());
    return;
  }
  if (!original.has_metadata()) std::puts("(no metadata)");
  for (const auto& [k, v] : original.metadata())
    std::printf("%s: %s\n", printable(k).c_str(), printable(v).c_str());
}

/// The file `path` names: a symbolic link is followed, so that the file it names is edited and
/// the link stays a link.
fs::path resolve_link(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_symlink(path, ec)) return path;
  fs::path target = fs::canonical(path, ec);
  if (ec) throw_io("resolve the link", path, ec.value());
  return target;
}

std::map<std::string, std::string> edited(std::map<std::string, std::string> meta, const Edit& edit) {
  for (const auto& k : edit.deletes) {
    if (!meta.erase(k)) std::fprintf(stderr, "note: no key '%s' to delete\n", printable(k).c_str());
  }
  for (const auto& [k, v] : edit.sets) meta[k] = v;
  return meta;
}

using Tensors = std::vector<std::pair<std::string, safetensors::TensorView>>;

/// The staged file holds exactly the original's tensors and the edited metadata.
void check_rewrite(const fs::path& staged, const SafeOpen& original, const Tensors& tensors,
                   const std::map<std::string, std::string>& meta) {
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
}

/// Writes the staged file and gives it the original's owner, mode and extended attributes. It is
/// written private (umask 077) first, so its bytes are never readable by more users than the
/// original's.
void write_staged(const fs::path& staged, const Tensors& tensors,
                  const std::map<std::string, std::string>& meta, const FileLock& lock,
                  const fs::path& target) {
  mode_t old_mask = ::umask(077);
  try {
    safetensors::save_file(staged, tensors, meta);
  } catch (...) {
    ::umask(old_mask);
    throw;
  }
  ::umask(old_mask);
  copy_owner_and_mode(staged, lock.status(), target);
  copy_extended_attributes(staged, lock.fd(), target);
}

/// Stages the rewrite beside `target`, checks it, and renames it over `target`; on any error
/// or a held signal the staged file is removed and `target` left as it was.
void replace_with(const fs::path& target, const FileLock& lock, const SafeOpen& original,
                  const Tensors& tensors, const std::map<std::string, std::string>& meta) {
  HeldSignals held;
  fs::path staged = create_staged(target);
  try {
    write_staged(staged, tensors, meta, lock, target);
    check_rewrite(staged, original, tensors, meta);
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
    ::unlink(staged.c_str());
    throw;  // a held signal, if any, ends the process when `held` lets it through
  }
}

}  // namespace

int metadata_command(const std::vector<std::string>& args) {
  Edit edit = read_arguments(args);
  if (edit.empty()) {
    print_metadata(edit.file, edit.json);
    return 0;
  }
  fs::path target = resolve_link(edit.path);
  FileLock lock(target);
  SafeOpen original(target);
  if (!lock.still_named_by(target)) {
    throw safetensors::Error(safetensors::ErrorKind::Io,
                             target.string() + " was replaced by a program that does not lock it; try again");
  }
  auto meta = edited(original.metadata(), edit);
  Tensors tensors;
  for (const auto& k : original.keys()) tensors.emplace_back(k, original.get_tensor(k));
  replace_with(target, lock, original, tensors, meta);
  if (edit.json) {
    std::puts(json_text(Json::object({{"path", target.string()},
                                      {"updated", true},
                                      {"tensors", tensors.size()},
                                      {"metadata", meta}}))
                  .c_str());
  } else {
    std::printf("updated %s: %zu tensors unchanged, metadata now has %zu keys\n",
                printable_path(target).c_str(), tensors.size(), meta.size());
  }
  return 0;
}

}  // namespace cli
