// Opening a safetensors file and reading tensors from it.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/iteration.hpp"
#include "safetensors/detail/open_file.hpp"
#include "safetensors/detail/remote_open.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/options.hpp"
#include "safetensors/path.hpp"
#include "safetensors/slice.hpp"
#include "safetensors/tensor.hpp"

/// Releases a `std::shared_ptr<const void>` the core holds for a file in memory
/// (`SafeOpen::from_bytes`): called once by the core, from whichever thread drops the bytes last.
extern "C" inline void safetensors_detail_release_keep_alive(void* owner) noexcept {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

namespace safetensors {
inline namespace SAFETENSORS_ABI {

class SafeOpen;

namespace nothrow {
/// Opens and validates `path`, as `SafeOpen(path, options)`, without exceptions.
///
///   auto opened = safetensors::nothrow::open("model.safetensors");
///   if (!opened) std::puts(opened.status().message().c_str());
[[nodiscard]] Expected<SafeOpen> open(PathRef path, OpenOptions options = {});
/// `SafeOpen::from_bytes` without exceptions.
[[nodiscard]] Expected<SafeOpen> from_bytes(std::span<const std::byte> bytes,
                                            std::shared_ptr<const void> keep_alive = {},
                                            OpenOptions options = {}, std::string name = "<memory>");
/// `SafeOpen::open_remote` without exceptions (`RemoteOptions` and this function's use need
/// safetensors/remote.hpp, as `SafeOpen::open_remote` says).
///
///   auto opened = safetensors::nothrow::open_remote("https://example.com/model.safetensors");
template <class Remote = RemoteOptions>
[[nodiscard]] Expected<SafeOpen> open_remote(std::string_view url, const Remote& remote = {},
                                             OpenOptions options = {});
/// `SafeOpen::from_bytes_copy` without exceptions.
[[nodiscard]] Expected<SafeOpen> from_bytes_copy(std::span<const std::byte> bytes, OpenOptions options = {},
                                                 std::string name = "<memory>");
/// `SafeOpen::keys` without exceptions (`Internal` for a moved-from SafeOpen).
[[nodiscard]] Expected<std::vector<std::string>> keys(const SafeOpen& file);
/// `SafeOpen::metadata` without exceptions.
[[nodiscard]] Expected<std::map<std::string, std::string>> metadata(const SafeOpen& file);
/// `SafeOpen::info` without exceptions.
[[nodiscard]] Expected<TensorInfo> info(const SafeOpen& file, std::string_view name);
/// `SafeOpen::get_tensor` without exceptions.
///
///   auto w = safetensors::nothrow::get_tensor(f, "wte.weight");
///   if (w) std::printf("%zu bytes\n", w->data.size());
[[nodiscard]] Expected<TensorView> get_tensor(const SafeOpen& file, std::string_view name);
/// `SafeOpen::get_slice` without exceptions.
[[nodiscard]] Expected<Slice> get_slice(const SafeOpen& file, std::string_view name);
/// `SafeOpen::read_data` without exceptions.
Status read_data(const SafeOpen& file, std::size_t offset, std::span<std::byte> dst);
/// `SafeOpen::get_tensor_into` without exceptions.
Status get_tensor_into(const SafeOpen& file, std::string_view name, std::span<std::byte> dst);
/// `SafeOpen::get_tensor_as` (into a buffer) without exceptions.
Status get_tensor_as(const SafeOpen& file, std::string_view name, Dtype to, std::span<std::byte> dst);
/// `SafeOpen::get_tensor_as` (into a new buffer) without exceptions.
[[nodiscard]] Expected<TensorView> get_tensor_as(const SafeOpen& file, std::string_view name, Dtype to);
/// The tensors of `file` in file order, as iterating over it gives them, each an
/// `Expected<NamedTensor>`: an error (a failed read, a moved-from SafeOpen) is the last item.
///
///   for (const auto& item : safetensors::nothrow::tensors(f)) {
///     if (!item) { std::puts(item.status().message().c_str()); break; }
///     std::printf("%s\n", item->name.c_str());
///   }
[[nodiscard]] detail::TensorRange<detail::FileCursor, true> tensors(const SafeOpen& file);
}  // namespace nothrow

/// An open, validated safetensors file.
///
///   safetensors::SafeOpen f("model.safetensors");
///   for (const auto& name : f.keys()) {
///     safetensors::TensorView w = f.get_tensor(name);  // the view keeps the mapping alive
///     std::span<const float> values = w.as<float>();   // so the span needs it in a variable
///   }
///   for (const auto& [name, view] : f) std::printf("%s\n", name.c_str());   // in file order
///
/// Opening reads and validates the whole header (every check of the format) and nothing else.
/// Copies share one open file. Views returned by `get_tensor` keep it alive on their own.
/// All methods are safe to call from several threads at once. Every method that can fail has
/// a twin in `safetensors::nothrow` returning the error as a value (`nothrow::open`,
/// `nothrow::get_tensor`, ...); the methods here are those twins' `.value()`.
class SafeOpen {
 public:
  explicit SafeOpen(PathRef path, OpenOptions options = {})
      : SafeOpen(nothrow::open(path, options).value()) {}

  /// A file already in memory (downloaded, embedded), validated exactly as a file on disk.
  /// Views borrow `bytes` (no copy) and hold `keep_alive`, which must own them: then views and
  /// copies of this SafeOpen keep the bytes alive on their own. Without an owner the caller
  /// must keep the bytes alive and unchanged as long as this SafeOpen, its copies and every
  /// view from them. `name` stands for the file in error messages. `options.backend` is
  /// ignored (`backend()` says `Mmap`: views point into the bytes).
  ///
  ///   auto buf = std::make_shared<std::vector<std::byte>>(download());
  ///   auto f = safetensors::SafeOpen::from_bytes(*buf, buf);
  [[nodiscard]] static SafeOpen from_bytes(std::span<const std::byte> bytes,
                                           std::shared_ptr<const void> keep_alive = {},
                                           OpenOptions options = {}, std::string name = "<memory>") {
    return nothrow::from_bytes(bytes, std::move(keep_alive), options, std::move(name)).value();
  }

  /// A remote file (`s3://bucket/key`, `gs://`, `az://`, `http(s)://` URL; see `is_url`) fetched
  /// into memory: its header with one ranged GET (two when longer than `remote.first_read`),
  /// validated with every check a local file gets, then the whole object with concurrent
  /// ranged GETs of the version whose header was read (its ETag pinned: an object replaced
  /// meanwhile is an `Io` error, never bytes of two versions). The result is a file in memory,
  /// as `from_bytes` makes: everything a SafeOpen does works on it, and nothing is fetched
  /// later (with `remote.header_only`, only the header is fetched, and tensor reads are `Io`
  /// errors). S3 credentials, region and endpoint come from the AWS_* environment variables.
  /// Errors (`Io` for everything the network or the server does) name the URL, never a
  /// credential. See docs/remote.md.
  ///
  /// `RemoteOptions` is in safetensors/remote.hpp, which a program that opens remote files
  /// includes (safetensors.hpp does): the reading headers leave it out, and with it <chrono>
  /// (without it, a call here stops at "incomplete type RemoteOptions").
  ///
  ///   #include <safetensors/remote.hpp>
  ///   auto f = safetensors::SafeOpen::open_remote("s3://models/gpt2/model.safetensors");
  template <class Remote = RemoteOptions>
  [[nodiscard]] static SafeOpen open_remote(std::string_view url, const Remote& remote = {},
                                            OpenOptions options = {}) {
    return nothrow::open_remote(url, remote, options).value();
  }

  /// `from_bytes` over a copy of `bytes` (64-byte aligned) that the SafeOpen owns: the caller's
  /// buffer may go away right after the call.
  [[nodiscard]] static SafeOpen from_bytes_copy(std::span<const std::byte> bytes, OpenOptions options = {},
                                                std::string name = "<memory>") {
    return nothrow::from_bytes_copy(bytes, options, std::move(name)).value();
  }

  /// Bytes after the last tensor: 0 unless opened with `allow_trailing_bytes`.
  [[nodiscard]] std::uint64_t trailing_bytes() const { return file().trailing_bytes(); }

  /// Tensor names sorted byte-wise, like Python's `safe_open(...).keys()`.
  [[nodiscard]] std::vector<std::string> keys() const { return nothrow::keys(*this).value(); }

  /// Tensor names in file (offset) order: the order of their bytes in the file, and of
  /// iterating over the file. Reading in this order reads the file front to back.
  [[nodiscard]] std::vector<std::string> offset_keys() const {
    const auto& f = file();
    std::vector<std::string> out;
    out.reserve(f.tensor_count());
    for (std::size_t i = 0; i < f.tensor_count(); ++i) out.emplace_back(detail::view(f.name_at(i)));
    return out;
  }

  /// The `__metadata__` map (empty when the file has none).
  [[nodiscard]] std::map<std::string, std::string> metadata() const {
    return nothrow::metadata(*this).value();
  }

  /// Whether the header has a `__metadata__` map at all.
  [[nodiscard]] bool has_metadata() const { return file().has_metadata(); }

  [[nodiscard]] bool contains(std::string_view name) const {
    return file().position(detail::bytes(name)) >= 0;
  }

  /// Number of tensors.
  [[nodiscard]] std::size_t size() const { return file().tensor_count(); }

  /// A tensor's dtype, shape and offsets; touches no tensor data. Throws `TensorNotFound`.
  [[nodiscard]] TensorInfo info(std::string_view name) const { return nothrow::info(*this, name).value(); }

  /// A view of a tensor: into the mapping (no copy), or with the read backend into a buffer
  /// read for this call. Throws `TensorNotFound`, or `Io` when a read fails.
  [[nodiscard]] TensorView get_tensor(std::string_view name) const {
    return nothrow::get_tensor(*this, name).value();
  }

  /// Copies tensor `name` into `dst`, a buffer the caller owns (an engine's weight buffer),
  /// which must hold exactly its bytes (`info(name).byte_size()`). Throws `TensorNotFound`,
  /// `InvalidSlice` for a `dst` of another size or one that overlaps the file's memory, `Io`.
  ///
  ///   std::vector<std::byte> mine(f.info("wte.weight").byte_size());
  ///   f.get_tensor_into("wte.weight", mine);
  void get_tensor_into(std::string_view name, std::span<std::byte> dst) const {
    nothrow::get_tensor_into(*this, name, dst).throw_if_error();
  }

  /// Tensor `name` converted to `to` into `dst` (numel × size(to) bytes), as
  /// `safetensors::convert` converts: straight out of the mapping, with no intermediate copy
  /// when mapped. Throws what `get_tensor` and `convert` throw, and `InvalidSlice` for a `dst`
  /// that overlaps the file's memory.
  ///
  ///   std::vector<float> w(f.info("wte.weight").numel());
  ///   f.get_tensor_as("wte.weight", safetensors::Dtype::F32, std::as_writable_bytes(std::span(w)));
  void get_tensor_as(std::string_view name, Dtype to, std::span<std::byte> dst) const {
    nothrow::get_tensor_as(*this, name, to, dst).throw_if_error();
  }
  /// Tensor `name` converted to `to`, in a buffer the returned view owns.
  [[nodiscard]] TensorView get_tensor_as(std::string_view name, Dtype to) const {
    return nothrow::get_tensor_as(*this, name, to).value();
  }

  /// Iterating gives each tensor's name and view in file order (`offset_keys()`), taking each
  /// view when the loop reaches it (with the read backend, reading it then): `for (const auto&
  /// [name, view] : f)`. The loop holds the file, as views do. An error (a failed read) is
  /// thrown when the loop reaches that tensor; `nothrow::tensors(f)` gives it as a value.
  [[nodiscard]] detail::TensorIterator<detail::FileCursor, false> begin() const;
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

  /// A lazily read slice of a tensor (see `Slice`); nothing is read until you select.
  ///
  ///   auto half = f.get_slice("w").select({Index::all(), Index::range(0, 384)}).read();
  [[nodiscard]] Slice get_slice(std::string_view name) const {
    return nothrow::get_slice(*this, name).value();
  }

  /// Copies bytes `[offset, offset + dst.size())` of the data buffer into `dst`.
  void read_data(std::size_t offset, std::span<std::byte> dst) const {
    nothrow::read_data(*this, offset, dst).throw_if_error();
  }

  /// The path this file was opened with, as given (the URL for a remote file, the name given to
  /// `from_bytes` for one in memory); `std::filesystem::path(f.path())` for a path object.
  [[nodiscard]] std::string path() const { return handle().path; }

  [[nodiscard]] Backend backend() const { return static_cast<Backend>(file().backend()); }

  /// With `Backend::Direct`: why reads go through the page cache after all (the filesystem
  /// refused `O_DIRECT`); empty while they bypass it, and with the other backends.
  [[nodiscard]] std::string direct_fallback() const {
    return std::string(detail::view(file().direct_fallback()));
  }

  /// The header length `N` from the file's first 8 bytes.
  [[nodiscard]] std::size_t header_size() const { return file().header_len(); }

  /// Where the data buffer starts in the file: `8 + N`.
  [[nodiscard]] std::size_t data_offset() const { return 8 + header_size(); }

  /// Length of the data buffer in bytes.
  [[nodiscard]] std::size_t data_size() const { return file().data_len(); }

  /// Data bytes the read backend has fetched so far (0 with the mapped backend).
  [[nodiscard]] std::uint64_t bytes_read() const { return file().bytes_read(); }

 private:
  friend struct detail::Access<SafeOpen>;

  explicit SafeOpen(std::shared_ptr<const detail::FileHandle> state)
      : state_(std::move(state)), open_file_(detail::OpenFile::of(*state_->file, state_)) {}

  // Every method goes through these: a moved-from SafeOpen (null state) reports `Internal`
  // instead of dereferencing null.
  [[nodiscard]] const detail::FileHandle& handle() const {
    if (!state_) detail::moved_from("SafeOpen").throw_if_error();
    return *state_;
  }
  [[nodiscard]] const ffi::File& file() const { return *handle().file; }

  std::shared_ptr<const detail::FileHandle> state_;
  detail::OpenFile open_file_;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

// The private doors and the nothrow definitions (after the classes they need).
#include "safetensors/detail/safe_open_impl.hpp"
