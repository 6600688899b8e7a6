// Opening a safetensors file and reading tensors from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/source.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/options.hpp"
#include "safetensors/slice.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {

/// An open, validated safetensors file.
///
///   safetensors::SafeOpen f("model.safetensors");
///   for (const auto& name : f.keys()) auto w = f.get_tensor(name).as<float>();
///
/// Opening reads and validates the whole header (every check of the format) and nothing else.
/// Copies share one open file. Views returned by `get_tensor` keep it alive on their own.
/// All methods are safe to call from several threads at once.
class SafeOpen {
 public:
  explicit SafeOpen(const std::filesystem::path& path, OpenOptions options = {})
      : state_(open(path, options)), source_(detail::Source::of(*state_->file, state_)) {}

  /// Tensor names sorted byte-wise, like Python's `safe_open(...).keys()`.
  [[nodiscard]] std::vector<std::string> keys() const {
    const auto& f = file();
    const std::size_t n = f.tensor_count();
    std::vector<std::string> out;
    out.reserve(n);
    for (std::size_t k = 0; k < n; ++k) out.emplace_back(detail::view(f.sorted_name(k)));
    return out;
  }

  /// Tensor names in file (offset) order.
  [[nodiscard]] std::vector<std::string> offset_keys() const {
    const auto& f = file();
    std::vector<std::string> out;
    out.reserve(f.tensor_count());
    for (std::size_t i = 0; i < f.tensor_count(); ++i) out.emplace_back(detail::view(f.name_at(i)));
    return out;
  }

  /// The `__metadata__` map (empty when the file has none).
  [[nodiscard]] std::map<std::string, std::string> metadata() const {
    return detail::metadata_of(file().metadata());
  }

  /// Whether the header has a `__metadata__` map at all.
  [[nodiscard]] bool has_metadata() const { return file().has_metadata(); }

  [[nodiscard]] bool contains(std::string_view name) const {
    return file().position(detail::bytes(name)) >= 0;
  }

  /// Number of tensors.
  [[nodiscard]] std::size_t size() const { return file().tensor_count(); }

  /// A tensor's dtype, shape and offsets; touches no tensor data. Throws `TensorNotFound`.
  [[nodiscard]] TensorInfo info(std::string_view name) const { return source().info(name); }

  /// A view of a tensor: into the mapping (no copy), or with the read backend into a buffer
  /// read for this call. Throws `TensorNotFound`, or `Io` when a read fails.
  [[nodiscard]] TensorView get_tensor(std::string_view name) const { return source().get_tensor(name); }

  /// A lazily read slice of a tensor (see `Slice`); nothing is read until you select.
  ///
  ///   auto half = f.get_slice("w").select({Index::all(), Index::range(0, 384)}).read();
  [[nodiscard]] Slice get_slice(std::string_view name) const { return Slice(source(), name); }

  /// Copies bytes `[offset, offset + dst.size())` of the data buffer into `dst`.
  void read_data(std::size_t offset, std::span<std::byte> dst) const { source().read_data(offset, dst); }

  /// The path this file was opened with.
  [[nodiscard]] std::filesystem::path path() const { return handle().path; }

  [[nodiscard]] Backend backend() const { return file().is_mapped() ? Backend::Mmap : Backend::Read; }

  /// The header length `N` from the file's first 8 bytes.
  [[nodiscard]] std::size_t header_size() const { return file().header_len(); }

  /// Where the data buffer starts in the file: `8 + N`.
  [[nodiscard]] std::size_t data_offset() const { return 8 + header_size(); }

  /// Length of the data buffer in bytes.
  [[nodiscard]] std::size_t data_size() const { return file().data_len(); }

  /// Data bytes the read backend has fetched so far (0 with the mapped backend).
  [[nodiscard]] std::uint64_t bytes_read() const { return file().bytes_read(); }

 private:
  friend struct detail::Access;

  static std::shared_ptr<const detail::FileHandle> open(const std::filesystem::path& path,
                                                        OpenOptions options) {
    const auto& native = path.native();
    auto file = detail::call([&] {
      return ffi::open_file(detail::bytes(native), static_cast<std::uint8_t>(options.backend));
    });
    return std::make_shared<const detail::FileHandle>(detail::FileHandle{std::move(file), native});
  }

  // Every method goes through these: a moved-from SafeOpen (null state) throws instead of
  // dereferencing null.
  [[nodiscard]] const detail::FileHandle& handle() const {
    if (!state_) detail::moved_from("SafeOpen");
    return *state_;
  }
  [[nodiscard]] const ffi::File& file() const { return *handle().file; }
  [[nodiscard]] const detail::Source& source() const {
    (void)handle();
    return source_;
  }

  std::shared_ptr<const detail::FileHandle> state_;
  detail::Source source_;
};

}  // namespace safetensors
