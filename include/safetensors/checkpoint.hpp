// Sharded checkpoints: `model.safetensors.index.json` and its shards, read as one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/source.hpp"
#include "safetensors/options.hpp"
#include "safetensors/slice.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {

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
/// does not list are ignored. Copies share the open shards; views keep them alive.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& path, CheckpointOptions options = {})
      : state_(std::make_shared<const Handle>(detail::call([&] {
          return ffi::open_checkpoint_with(detail::bytes(path.native()),
                                           static_cast<std::uint8_t>(options.backend), options.lenient,
                                           options.allow_trailing_bytes);
        }))) {}

  /// Tensors the index lists but their shard lacks, sorted; opens every shard to know. Always
  /// empty in strict mode, where such a shard fails to open (`ShardMissing`) instead.
  [[nodiscard]] std::vector<std::string> missing() const {
    auto names = detail::call([&] { return ckpt().missing(); });
    std::vector<std::string> out;
    out.reserve(names.size());
    for (const auto& n : names) out.emplace_back(std::string(n));
    return out;
  }

  /// Shards with bytes after their last tensor, with the count; opens every shard to know.
  /// Empty unless opened with `allow_trailing_bytes` (without it such a shard fails to open).
  [[nodiscard]] std::vector<std::pair<std::filesystem::path, std::uint64_t>> trailing_bytes() const {
    const auto& c = ckpt();
    std::vector<std::pair<std::filesystem::path, std::uint64_t>> out;
    for (std::size_t i = 0; i < c.shard_count(); ++i) {
      const std::uint64_t n = detail::call([&] { return c.shard_trailing_bytes(i); });
      if (n > 0) out.emplace_back(shard_path(i), n);
    }
    return out;
  }

  /// Tensor names, sorted byte-wise.
  [[nodiscard]] std::vector<std::string> keys() const {
    const auto& c = ckpt();
    std::vector<std::string> out;
    out.reserve(c.tensor_count());
    for (std::size_t i = 0; i < c.tensor_count(); ++i) out.emplace_back(detail::view(c.name_at(i)));
    return out;
  }

  /// The index's `metadata` (non-string values, like `total_size`, as their JSON text), or the
  /// single file's `__metadata__`.
  [[nodiscard]] std::map<std::string, std::string> metadata() const {
    return detail::metadata_of(ckpt().metadata());
  }
  [[nodiscard]] bool has_metadata() const { return ckpt().has_metadata(); }

  [[nodiscard]] bool contains(std::string_view name) const {
    return ckpt().position(detail::bytes(name)) >= 0;
  }
  [[nodiscard]] std::size_t size() const { return ckpt().tensor_count(); }

  [[nodiscard]] TensorInfo info(std::string_view name) const { return source_for(name).info(name); }
  [[nodiscard]] TensorView get_tensor(std::string_view name) const {
    return source_for(name).get_tensor(name);
  }
  [[nodiscard]] Slice get_slice(std::string_view name) const { return Slice(source_for(name), name); }

  /// Number of shard files.
  [[nodiscard]] std::size_t shard_count() const { return ckpt().shard_count(); }
  /// The shard files, in the order the index first names them.
  [[nodiscard]] std::vector<std::filesystem::path> shard_paths() const {
    std::vector<std::filesystem::path> out;
    for (std::size_t i = 0; i < shard_count(); ++i) out.emplace_back(shard_path(i));
    return out;
  }
  /// The file holding `name` (throws `TensorNotFound`). Opens nothing.
  [[nodiscard]] std::filesystem::path shard_of(std::string_view name) const {
    return shard_path(detail::call([&] { return ckpt().shard_of(detail::bytes(name)); }));
  }
  /// How many shard files have been opened so far.
  [[nodiscard]] std::size_t shards_opened() const { return ckpt().shards_opened(); }

 private:
  friend struct detail::Access;

  // The Rust side already opens each shard once, under its own lock. That lock lives in code
  // the user's ThreadSanitizer build does not instrument, so the order between one thread
  // opening a shard and another reading it would be invisible there and reported as a race.
  // Each shard is therefore published again here, through a C++ atomic (one acquire load per
  // lookup) and a per-shard mutex for the first open.
  struct Handle {
    explicit Handle(::rust::Box<ffi::Checkpoint> c)
        : ckpt(std::move(c)),
          files(std::make_unique<std::atomic<const ffi::File*>[]>(ckpt->shard_count())),
          opening(std::make_unique<std::mutex[]>(ckpt->shard_count())) {}
    ::rust::Box<ffi::Checkpoint> ckpt;
    std::unique_ptr<std::atomic<const ffi::File*>[]> files;
    std::unique_ptr<std::mutex[]> opening;
  };

  // A moved-from Checkpoint (null state) throws here instead of dereferencing null.
  [[nodiscard]] const Handle& handle() const {
    if (!state_) detail::moved_from("Checkpoint");
    return *state_;
  }
  [[nodiscard]] const ffi::Checkpoint& ckpt() const { return *handle().ckpt; }

  [[nodiscard]] std::filesystem::path shard_path(std::size_t i) const {
    auto p = ckpt().shard_path(i);
    return std::string(reinterpret_cast<const char*>(p.data()), p.size());
  }

  [[nodiscard]] detail::Source source_for(std::string_view name) const {
    const auto& c = ckpt();
    // The index's shard (no shard is opened for that); the shard itself is opened below, once,
    // and published through C++ atomics so that ThreadSanitizer sees the ordering (the Rust core
    // is not instrumented).
    std::size_t shard = detail::call([&] { return c.shard_of(detail::bytes(name)); });
    auto& slot = handle().files[shard];
    const ffi::File* file = slot.load(std::memory_order_acquire);
    if (file == nullptr) {
      std::lock_guard lock(handle().opening[shard]);
      file = slot.load(std::memory_order_relaxed);
      if (file == nullptr) {
        file = &detail::call([&]() -> const ffi::File& { return c.shard_file(shard); });
        slot.store(file, std::memory_order_release);
      }
    }
    // In lenient mode a listed tensor its (now open) shard lacks is `ShardMissing` here.
    (void)detail::call([&] { return c.shard_holding(detail::bytes(name)); });
    return detail::Source::of(*file, state_);
  }

  std::shared_ptr<const Handle> state_;
};

}  // namespace safetensors
