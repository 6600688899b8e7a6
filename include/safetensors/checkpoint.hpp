// Sharded checkpoints: `model.safetensors.index.json` and its shards, read as one.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/iteration.hpp"
#include "safetensors/detail/open_file.hpp"
#include "safetensors/detail/remote_open.hpp"
#include "safetensors/ffi/src/checkpoint.rs.h"
#include "safetensors/options.hpp"
#include "safetensors/path.hpp"
#include "safetensors/slice.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

class Checkpoint;

namespace detail {
struct ShardCursor;
}  // namespace detail

/// The lengths of one shard as opened and validated: its header (the 8-byte prefix included),
/// its data buffer, and the bytes after its last tensor (0 unless `allow_trailing_bytes`).
struct ShardSizes {
  std::uint64_t header = 0;
  std::uint64_t data = 0;
  std::uint64_t trailing = 0;
  /// The whole file, as validated (not measured again).
  [[nodiscard]] std::uint64_t file() const { return header + data + trailing; }
};

namespace nothrow {
/// Opens a checkpoint, as `Checkpoint(path, options)`, without exceptions.
///
///   auto opened = safetensors::nothrow::open_checkpoint(index);
///   if (!opened) std::puts(opened.status().message().c_str());
[[nodiscard]] Expected<Checkpoint> open_checkpoint(PathRef path, CheckpointOptions options = {});
/// `Checkpoint::open_remote` without exceptions (needs safetensors/remote.hpp, as
/// `SafeOpen::open_remote` says).
template <class Remote = RemoteOptions>
[[nodiscard]] Expected<Checkpoint> open_remote_checkpoint(std::string_view url, const Remote& remote = {},
                                                          CheckpointOptions options = {});
/// `Checkpoint::keys` without exceptions.
[[nodiscard]] Expected<std::vector<std::string>> keys(const Checkpoint& ckpt);
/// `Checkpoint::metadata` without exceptions.
[[nodiscard]] Expected<std::map<std::string, std::string>> metadata(const Checkpoint& ckpt);
/// `Checkpoint::info` without exceptions.
[[nodiscard]] Expected<TensorInfo> info(const Checkpoint& ckpt, std::string_view name);
/// `Checkpoint::get_tensor` without exceptions.
[[nodiscard]] Expected<TensorView> get_tensor(const Checkpoint& ckpt, std::string_view name);
/// `Checkpoint::get_slice` without exceptions.
[[nodiscard]] Expected<Slice> get_slice(const Checkpoint& ckpt, std::string_view name);
/// `Checkpoint::missing` without exceptions.
[[nodiscard]] Expected<std::vector<std::string>> missing(const Checkpoint& ckpt);
/// `Checkpoint::trailing_bytes` without exceptions.
[[nodiscard]] Expected<std::vector<std::pair<std::string, std::uint64_t>>> trailing_bytes(
    const Checkpoint& ckpt);
/// `Checkpoint::shard_of` without exceptions.
[[nodiscard]] Expected<std::string> shard_of(const Checkpoint& ckpt, std::string_view name);
/// `Checkpoint::shard_sizes` without exceptions.
[[nodiscard]] Expected<ShardSizes> shard_sizes(const Checkpoint& ckpt, std::size_t shard);
/// `Checkpoint::read_shard_data` without exceptions.
Status read_shard_data(const Checkpoint& ckpt, std::size_t shard, std::size_t offset,
                       std::span<std::byte> dst);
/// `Checkpoint::get_tensor_into` without exceptions.
Status get_tensor_into(const Checkpoint& ckpt, std::string_view name, std::span<std::byte> dst);
/// `Checkpoint::get_tensor_as` (into a buffer) without exceptions.
Status get_tensor_as(const Checkpoint& ckpt, std::string_view name, Dtype to, std::span<std::byte> dst);
/// `Checkpoint::get_tensor_as` (into a new buffer) without exceptions.
[[nodiscard]] Expected<TensorView> get_tensor_as(const Checkpoint& ckpt, std::string_view name, Dtype to);
/// The tensors of `ckpt` in file order, as iterating over it gives them, each an
/// `Expected<NamedTensor>`: an error (a shard that fails to open, a failed read) is the last item.
[[nodiscard]] detail::TensorRange<detail::ShardCursor, true> tensors(const Checkpoint& ckpt);
}  // namespace nothrow

/// A checkpoint split over several files by a Hugging Face index (`{"metadata": {...},
/// "weight_map": {"tensor": "model-00001-of-00003.safetensors", ...}}`), or a single file:
/// the same reading interface as `SafeOpen`.
///
///   safetensors::Checkpoint ckpt("model.safetensors.index.json");
///   auto w = ckpt.get_tensor("model.layers.0.mlp.up_proj.weight");
///
/// The `weight_map` is the authority. Opening checks the index, that every shard path stays in
/// the index's directory (`InvalidShardPath`), and that every shard file exists
/// (`ShardMissing`). Shards are opened lazily, each once, and checked against the index when
/// opened: a listed tensor absent from its shard is `ShardMissing`, a tensor a shard holds but
/// the index assigns to another shard is `ShardMismatch`. Tensors a shard holds but the index
/// does not list are ignored. Copies share the open shards; views keep them alive. Every method
/// that can fail has a twin in `safetensors::nothrow` returning the error as a value.
class Checkpoint {
 public:
  explicit Checkpoint(PathRef path, CheckpointOptions options = {})
      : Checkpoint(nothrow::open_checkpoint(path, options).value()) {}

  /// A remote checkpoint: an index (`s3://`, `gs://`, `az://` or `http(s)://` URL whose path ends in
  /// `.json`) fetched whole and checked as a local one, its shards the objects next to it, each
  /// opened with `remote` (whole into memory, `on_demand`, or header only) on first use and
  /// checked against the index; or one remote file, as a checkpoint of one shard. Of `options`,
  /// `lenient` and `allow_trailing_bytes` apply. A shard the server lacks is `ShardMissing` when
  /// first used (no request per shard at open). `shard_path(i)` gives each shard's URL. See
  /// docs/remote.md. `RemoteOptions` is in safetensors/remote.hpp, as for `SafeOpen::open_remote`.
  ///
  ///   auto ckpt = safetensors::Checkpoint::open_remote("s3://models/llama/model.safetensors.index.json",
  ///                                                    {.on_demand = true});
  template <class Remote = RemoteOptions>
  [[nodiscard]] static Checkpoint open_remote(std::string_view url, const Remote& remote = {},
                                              CheckpointOptions options = {}) {
    return nothrow::open_remote_checkpoint(url, remote, options).value();
  }

  /// Tensors the index lists but their shard lacks, sorted; opens every shard to know. Always
  /// empty in strict mode, where such a shard fails to open (`ShardMissing`) instead.
  [[nodiscard]] std::vector<std::string> missing() const { return nothrow::missing(*this).value(); }

  /// Shards with bytes after their last tensor, with the count; opens every shard to know.
  /// Empty unless opened with `allow_trailing_bytes` (without it such a shard fails to open).
  [[nodiscard]] std::vector<std::pair<std::string, std::uint64_t>> trailing_bytes() const {
    return nothrow::trailing_bytes(*this).value();
  }

  /// Tensor names, sorted byte-wise.
  [[nodiscard]] std::vector<std::string> keys() const { return nothrow::keys(*this).value(); }

  /// The index's `metadata` (non-string values, like `total_size`, as their JSON text), or the
  /// single file's `__metadata__`.
  [[nodiscard]] std::map<std::string, std::string> metadata() const {
    return nothrow::metadata(*this).value();
  }
  [[nodiscard]] bool has_metadata() const { return ckpt().has_metadata(); }

  [[nodiscard]] bool contains(std::string_view name) const {
    return ckpt().position(detail::bytes(name)) >= 0;
  }
  [[nodiscard]] std::size_t size() const { return ckpt().tensor_count(); }

  [[nodiscard]] TensorInfo info(std::string_view name) const { return nothrow::info(*this, name).value(); }
  [[nodiscard]] TensorView get_tensor(std::string_view name) const {
    return nothrow::get_tensor(*this, name).value();
  }
  [[nodiscard]] Slice get_slice(std::string_view name) const {
    return nothrow::get_slice(*this, name).value();
  }
  /// As `SafeOpen::get_tensor_into`: tensor `name` copied into `dst` (exactly its bytes).
  void get_tensor_into(std::string_view name, std::span<std::byte> dst) const {
    nothrow::get_tensor_into(*this, name, dst).throw_if_error();
  }
  /// As `SafeOpen::get_tensor_as`: tensor `name` converted to `to` into `dst`.
  void get_tensor_as(std::string_view name, Dtype to, std::span<std::byte> dst) const {
    nothrow::get_tensor_as(*this, name, to, dst).throw_if_error();
  }
  /// Tensor `name` converted to `to`, in a buffer the returned view owns.
  [[nodiscard]] TensorView get_tensor_as(std::string_view name, Dtype to) const {
    return nothrow::get_tensor_as(*this, name, to).value();
  }

  /// Iterating gives each tensor's name and view in file order: shard by shard (in
  /// `shard_paths()` order), each shard's tensors in offset order, so that the loop reads each
  /// shard front to back; it opens the shards it reaches next a few at once (one per core, at
  /// most 8), so that their headers are parsed in parallel. Only the tensors the index assigns
  /// to a shard come from it (a lenient checkpoint's missing tensors are not there; `missing()`
  /// lists them). `keys()` stays sorted. The loop holds the checkpoint; an error (a shard that
  /// fails to open, a failed read) is thrown when the loop reaches it, and `nothrow::tensors`
  /// gives it as a value.
  ///
  ///   for (const auto& [name, view] : ckpt) transform(view);
  [[nodiscard]] detail::TensorIterator<detail::ShardCursor, false> begin() const;
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

  /// Number of shard files.
  [[nodiscard]] std::size_t shard_count() const { return ckpt().shard_count(); }
  /// The shard files, in the order the index first names them (`std::string`s, as
  /// `SafeOpen::path()`; safetensors/path.hpp says why).
  [[nodiscard]] std::vector<std::string> shard_paths() const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < shard_count(); ++i) out.emplace_back(shard_path(ckpt(), i));
    return out;
  }
  /// The file holding `name` (throws `TensorNotFound`). Opens nothing.
  [[nodiscard]] std::string shard_of(std::string_view name) const {
    return nothrow::shard_of(*this, name).value();
  }
  /// How many shard files have been opened so far.
  [[nodiscard]] std::size_t shards_opened() const { return ckpt().shards_opened(); }

  /// Shard `shard` (of `shard_paths()`): its lengths, and a copy of its data-buffer bytes
  /// `[offset, offset + dst.size())`, as `SafeOpen::data_size` and `read_data` give for a file.
  /// The shard is opened once, as for any tensor in it, and checked against the index; tools
  /// that read whole shards (`safetensors validate`) use these rather than opening the path a
  /// second time. A shard number past the last is `ShardMissing`.
  ///
  ///   std::vector<std::byte> head(std::min<std::uint64_t>(ckpt.shard_sizes(0).data, 4096));
  ///   ckpt.read_shard_data(0, 0, head);
  [[nodiscard]] ShardSizes shard_sizes(std::size_t shard) const {
    return nothrow::shard_sizes(*this, shard).value();
  }
  void read_shard_data(std::size_t shard, std::size_t offset, std::span<std::byte> dst) const {
    nothrow::read_shard_data(*this, shard, offset, dst).throw_if_error();
  }

 private:
  friend struct detail::Access<Checkpoint>;

  // The Rust side opens each shard once, under its own lock, and announces the hand-over of an
  // opened shard to a ThreadSanitizer build of this program itself (`safetensors_core::tsan`):
  // nothing here needs to publish shards again.
  struct Handle {
    explicit Handle(::rust::Box<ffi::Checkpoint> c) : ckpt(std::move(c)) {}
    ::rust::Box<ffi::Checkpoint> ckpt;
  };

  explicit Checkpoint(std::shared_ptr<const Handle> state) : state_(std::move(state)) {}

  // A moved-from Checkpoint (null state) reports `Internal` here instead of dereferencing null.
  [[nodiscard]] const ffi::Checkpoint& ckpt() const {
    if (!state_) detail::moved_from("Checkpoint").throw_if_error();
    return *state_->ckpt;
  }

  [[nodiscard]] static std::string shard_path(const ffi::Checkpoint& c, std::size_t i) {
    auto p = c.shard_path(i);
    return std::string(reinterpret_cast<const char*>(p.data), p.len);
  }

  std::shared_ptr<const Handle> state_;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

// The private doors and the nothrow definitions (after the classes they need).
#include "safetensors/detail/checkpoint_impl.hpp"
