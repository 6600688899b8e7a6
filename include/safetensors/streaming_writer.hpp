// Writing as engines write: a file, or a sharded checkpoint with its index, whose tensors are
// declared up front and whose bytes arrive later, tensor by tensor or in pieces, from any
// thread (checkpoints larger than memory, tensors copied off a GPU as they are produced).
//
//   std::vector<safetensors::TensorSpec> specs{{"w", safetensors::Dtype::F32, {4096, 4096}}};
//   safetensors::StreamingWriter out("model.safetensors", specs, {{"format", "pt"}});
//   out.write("w", 0, first_half);               // pieces at their offsets, any order, any thread
//   out.write("w", first_half.size(), second_half);
//   out.finish();                                // checks every byte arrived, then publishes
//
// The declarations alone decide the header and where every byte goes, so the header is written
// first and each piece lands with a positioned write at its offset: the file is byte-identical to
// `save_file` of the same tensors, and the writer holds no tensor bytes of its own. Nothing
// appears under the target's name before `finish`; a writer destroyed (or a process killed)
// before it leaves the target as it was and no temporary file. docs/writing.md says more.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/open_file.hpp"
#include "safetensors/detail/slices.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/ffi/src/writer.rs.h"
#include "safetensors/path.hpp"
#include "safetensors/writer.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// A tensor declared to a writer before its bytes: its name, dtype and shape.
struct TensorSpec {
  std::string name;
  Dtype dtype{};
  std::vector<std::size_t> shape;
};

/// How a sharded checkpoint is cut and named, as `huggingface_hub`'s `save_torch_state_dict`
/// does it.
struct ShardOptions {
  /// The most tensor bytes in one shard (headers not counted); a larger tensor gets a shard of
  /// its own. The default is huggingface_hub's "5GB" (decimal).
  std::uint64_t max_shard_size = 5'000'000'000;
  /// The files' common name: `model.safetensors` for one shard, else
  /// `model-00001-of-0000N.safetensors`... and `model.safetensors.index.json`.
  std::string prefix = "model";
};

class StreamingWriter;
class ShardedWriter;

namespace nothrow {
/// `StreamingWriter(path, tensors, metadata, options)` without exceptions.
///
///   auto out = safetensors::nothrow::make_streaming_writer("out.safetensors", specs);
///   if (!out) std::puts(out.status().message().c_str());
[[nodiscard]] Expected<StreamingWriter> make_streaming_writer(PathRef path,
                                                              const std::vector<TensorSpec>& tensors,
                                                              const Metadata& metadata = {},
                                                              SaveOptions options = {});
/// `ShardedWriter(dir, tensors, metadata, shards, options)` without exceptions.
[[nodiscard]] Expected<ShardedWriter> make_sharded_writer(PathRef dir, const std::vector<TensorSpec>& tensors,
                                                          const Metadata& metadata = {},
                                                          ShardOptions shards = {}, SaveOptions options = {});
/// `StreamingWriter::write(name, bytes)` without exceptions.
Status write(const StreamingWriter& writer, std::string_view name, std::span<const std::byte> bytes);
/// `StreamingWriter::write(name, offset, bytes)` without exceptions.
Status write(const StreamingWriter& writer, std::string_view name, std::uint64_t offset,
             std::span<const std::byte> bytes);
/// `StreamingWriter::finish` without exceptions.
Status finish(StreamingWriter& writer);
/// `safetensors::save_sharded` without exceptions.
template <NamedTensorRange R>
Status save_sharded(PathRef dir, R&& tensors, const Metadata& metadata = {}, ShardOptions shards = {},
                    SaveOptions options = {});
Status save_sharded(PathRef dir, detail::TensorList tensors, const Metadata& metadata = {},
                    ShardOptions shards = {}, SaveOptions options = {});
}  // namespace nothrow

namespace detail {
Status save_sharded_list(PathRef dir, TensorList tensors, const Metadata& metadata, ShardOptions shards,
                         SaveOptions options);
}  // namespace detail

/// A safetensors file written in pieces. Declare every tensor (in any order) and the metadata;
/// then hand over each tensor's bytes, whole or in pieces at their offsets, in any order, from
/// any number of threads at once (`write` is thread-safe); then `finish`, once every write has
/// returned. Errors, each naming the file and the tensor: at construction those of `save_file`
/// for the declarations (a shape whose size does not add up: `ValidationOverflow`,
/// `MisalignedSlice`), `Io` for a directory that cannot be written or a disk too small for the
/// file (the whole file is reserved up front where the filesystem allows); from `write`,
/// `TensorNotFound` (not declared), `TensorInvalidInfo` (a whole tensor of the wrong size, or a
/// piece ending past the tensor), `InvalidOffset` (bytes already written), `Io` (the disk);
/// from `finish`, `MetadataIncompleteBuffer` (bytes never written), `Io` (the rename, or for a
/// sharded checkpoint its publishing), and after a failed write that write's error. After an
/// error of `finish` nothing was published (unless it says the new checkpoint is in place and
/// only a file of the earlier one is left) and the writer is as it was: write what was missing,
/// or clear the way, and `finish` again (a writer whose write or sync failed on the disk keeps
/// reporting that error). After a successful `finish` every call reports `Internal`.
/// Move-only; a moved-from writer reports `Internal`.
///
///   safetensors::StreamingWriter out("model.safetensors", {{"w", safetensors::Dtype::U8, {4}}});
///   out.write("w", std::as_bytes(std::span(bytes)));
///   out.finish();
class StreamingWriter {
 public:
  StreamingWriter(PathRef path, const std::vector<TensorSpec>& tensors, const Metadata& metadata = {},
                  SaveOptions options = {})
      : StreamingWriter(nothrow::make_streaming_writer(path, tensors, metadata, options).value()) {}
  StreamingWriter(StreamingWriter&&) noexcept = default;
  StreamingWriter& operator=(StreamingWriter&&) noexcept = default;
  StreamingWriter(const StreamingWriter&) =
      SAFETENSORS_DELETE("a StreamingWriter owns the file being written: move it");
  StreamingWriter& operator=(const StreamingWriter&) =
      SAFETENSORS_DELETE("a StreamingWriter owns the file being written: move it");
  /// Without `finish`, discards what was written: the target stays as it was.
  ~StreamingWriter() = default;

  /// Writes all of tensor `name` at once: exactly its dtype × shape bytes.
  void write(std::string_view name, std::span<const std::byte> bytes) const {
    nothrow::write(*this, name, bytes).throw_if_error();
  }
  /// Writes `bytes` at byte `offset` of tensor `name`; each byte of a tensor is written once.
  void write(std::string_view name, std::uint64_t offset, std::span<const std::byte> bytes) const {
    nothrow::write(*this, name, offset, bytes).throw_if_error();
  }
  /// Checks that every byte of every tensor arrived, then publishes: renames the file over the
  /// target (synced unless `SaveOptions::sync` is false), or the shards and the index as a
  /// transaction. On an error nothing was published and the writer may be finished again.
  void finish() { nothrow::finish(*this).throw_if_error(); }

  /// The files `finish` publishes: the target, or a checkpoint's shards then its index, each
  /// the directory as given joined with the file's name (`std::string`s; safetensors/path.hpp
  /// says why).
  [[nodiscard]] std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (!sharded_) {
      out.push_back(target_);
      return out;
    }
    const bool joined = target_.empty() || target_.back() == '/';
    for (const auto& name : impl().files()) {
      out.push_back((joined ? target_ : target_ + '/') + std::string(name.data(), name.size()));
    }
    return out;
  }
  /// The bytes of every tensor together (an index's `total_size`).
  [[nodiscard]] std::uint64_t total_size() const { return impl().total_size(); }

 private:
  friend struct detail::Access<StreamingWriter>;

  StreamingWriter(std::string target, bool sharded, ::rust::Box<ffi::StreamingWriter> impl)
      : target_(std::move(target)), sharded_(sharded), impl_(detail::share(std::move(impl))) {}

  [[nodiscard]] const ffi::StreamingWriter& impl() const {
    if (!impl_) detail::moved_from("StreamingWriter").throw_if_error();
    return *impl_;
  }

  std::string target_;
  bool sharded_ = false;
  std::shared_ptr<const ffi::StreamingWriter> impl_;
};

/// A sharded checkpoint written in pieces: a `StreamingWriter` whose tensors are split into
/// shards in the directory `dir` (which must exist) exactly as `huggingface_hub`'s
/// `save_torch_state_dict` splits them: in declaration order, a shard closed when the next tensor
/// would take it past `max_shard_size`, a larger tensor in a shard of its own. Each shard gets
/// `metadata` as its `__metadata__` (give `{"format", "pt"}` for transformers, which refuses a
/// shard whose metadata lacks a format); the index gets `total_size` and the same metadata.
/// Nothing in the directory changes before `finish`, which publishes the set as a transaction:
/// the checkpoint already in the directory stays whole and opens through its index until the
/// new one is complete (an old shard whose name a new one takes is kept under a backup name the
/// old index is pointed at), the new index renamed into place is the commit, and then the
/// backups and the files of the earlier checkpoint that the new one lacks are removed. On any
/// failure, or a crash at any point, the directory opens as the old checkpoint or the new one,
/// never neither and never a mix (docs/writing.md).
///
///   safetensors::ShardedWriter out("ckpt", specs, {{"format", "pt"}}, {.max_shard_size = 1'000'000'000});
///   for (const auto& s : specs) out.write(s.name, bytes_of(s.name));
///   out.finish();   // ckpt/model-00001-of-0000N.safetensors..., ckpt/model.safetensors.index.json
class ShardedWriter : public StreamingWriter {
 public:
  ShardedWriter(PathRef dir, const std::vector<TensorSpec>& tensors, const Metadata& metadata = {},
                ShardOptions shards = {}, SaveOptions options = {})
      : ShardedWriter(
            nothrow::make_sharded_writer(dir, tensors, metadata, std::move(shards), options).value()) {}

 private:
  friend struct detail::Access<StreamingWriter>;
  explicit ShardedWriter(StreamingWriter w) : StreamingWriter(std::move(w)) {}
};

/// Saves `tensors` (any range `save_file` takes) as a sharded checkpoint in `dir`, as
/// `huggingface_hub`'s `save_torch_state_dict` does (see `ShardedWriter`): the tensors in the
/// range's order, one shard `model.safetensors` when they fit in one.
///
///   safetensors::save_sharded("ckpt", tensors, {{"format", "pt"}}, {.max_shard_size = 2'000'000'000});
template <NamedTensorRange R>
void save_sharded(PathRef dir, R&& tensors, const Metadata& metadata = {}, ShardOptions shards = {},
                  SaveOptions options = {}) {
  nothrow::save_sharded(dir, std::forward<R>(tensors), metadata, std::move(shards), options).throw_if_error();
}
inline void save_sharded(PathRef dir, detail::TensorList tensors, const Metadata& metadata = {},
                         ShardOptions shards = {}, SaveOptions options = {}) {
  detail::save_sharded_list(dir, tensors, metadata, std::move(shards), options).throw_if_error();
}

namespace detail {
template <>
struct Access<StreamingWriter> {
  /// The bridge's writer, or `Internal` for a moved-from one.
  static Expected<const ffi::StreamingWriter*> impl(const StreamingWriter& w) {
    if (!w.impl_) return moved_from("StreamingWriter");
    return w.impl_.get();
  }

  /// Declares `tensors` and `metadata` in one call: names, keys, values and the prefix in one
  /// text buffer, the shapes in another.
  static Expected<StreamingWriter> make(PathRef target, const std::vector<TensorSpec>& tensors,
                                        const Metadata& metadata, SaveOptions options,
                                        const ShardOptions* shards) {
    std::string text;
    std::vector<std::size_t> dims;
    std::vector<ffi::TensorDecl> decls;
    decls.reserve(tensors.size());
    for (const auto& t : tensors) {
      decls.push_back(
          {text.size(), t.name.size(), static_cast<std::uint8_t>(t.dtype), dims.size(), t.shape.size()});
      text += t.name;
      dims.insert(dims.end(), t.shape.begin(), t.shape.end());
    }
    std::vector<ffi::MetadataSpan> meta;
    meta.reserve(metadata.size());
    for (const auto& entry : metadata) {
      meta.push_back(
          {text.size(), entry.first.size(), text.size() + entry.first.size(), entry.second.size()});
      text += entry.first;
      text += entry.second;
    }
    const std::size_t prefix_start = text.size();
    if (shards) text += shards->prefix;
    const ffi::StreamingOptions o{options.sync,
                                  options.empty_metadata,
                                  options.alignment,
                                  shards != nullptr,
                                  shards ? shards->max_shard_size : 0,
                                  prefix_start,
                                  text.size() - prefix_start};
    auto made = adopt(attempt([&](ffi::Status& st) {
      return ffi::new_streaming_writer(slice_bytes(target.native()), {decls.data(), decls.size()},
                                       {meta.data(), meta.size()}, slice_bytes(text),
                                       {dims.data(), dims.size()}, o, st);
    }));
    if (!made) return made.status();
    return StreamingWriter(std::string(target.native()), shards != nullptr, std::move(*made));
  }

  static ShardedWriter sharded(StreamingWriter w) { return ShardedWriter(std::move(w)); }

  static Status write(const StreamingWriter& w, std::string_view name, std::uint64_t offset,
                      std::span<const std::byte> data, bool whole) {
    auto writer = impl(w);
    if (!writer) return writer.status();
    ::rust::Slice<const std::uint8_t> raw{reinterpret_cast<const std::uint8_t*>(data.data()), data.size()};
    return attempt(
        [&](ffi::Status& st) { (*writer)->write_tensor(slice_bytes(name), offset, raw, whole, st); });
  }

  static Status finish(StreamingWriter& w) {
    auto writer = impl(w);
    if (!writer) return writer.status();
    return attempt([&](ffi::Status& st) { (*writer)->finish(st); });
  }
};
}  // namespace detail

inline Expected<StreamingWriter> nothrow::make_streaming_writer(PathRef path,
                                                                const std::vector<TensorSpec>& tensors,
                                                                const Metadata& metadata,
                                                                SaveOptions options) {
  return detail::Access<StreamingWriter>::make(path, tensors, metadata, options, nullptr);
}

inline Expected<ShardedWriter> nothrow::make_sharded_writer(PathRef dir,
                                                            const std::vector<TensorSpec>& tensors,
                                                            const Metadata& metadata, ShardOptions shards,
                                                            SaveOptions options) {
  auto made = detail::Access<StreamingWriter>::make(dir, tensors, metadata, options, &shards);
  if (!made) return made.status();
  return detail::Access<StreamingWriter>::sharded(std::move(*made));
}

inline Status nothrow::write(const StreamingWriter& writer, std::string_view name,
                             std::span<const std::byte> bytes) {
  return detail::Access<StreamingWriter>::write(writer, name, 0, bytes, true);
}

inline Status nothrow::write(const StreamingWriter& writer, std::string_view name, std::uint64_t offset,
                             std::span<const std::byte> bytes) {
  return detail::Access<StreamingWriter>::write(writer, name, offset, bytes, false);
}

inline Status nothrow::finish(StreamingWriter& writer) {
  return detail::Access<StreamingWriter>::finish(writer);
}

namespace detail {
/// One tensor of `save_sharded` listed: its declaration and its bytes.
template <class Tensor>
Status list_tensor(PathRef dir, std::string_view name, const Tensor& t, std::vector<TensorSpec>& specs,
                   std::vector<std::span<const std::byte>>& data) {
  TensorSpec spec{std::string(name), Dtype{t.dtype}, {}};
  if (auto st = dims_of(dir.native(), name, t, spec.shape); !st.ok()) return st;
  specs.push_back(std::move(spec));
  data.push_back(std::as_bytes(std::span(t.data)));
  return {};
}

/// `save_sharded` once its tensors are listed: the writer, each tensor's bytes, the finish.
inline Status save_listed(PathRef dir, const std::vector<TensorSpec>& specs,
                          const std::vector<std::span<const std::byte>>& data, const Metadata& metadata,
                          ShardOptions shards, SaveOptions options) {
  auto writer = nothrow::make_sharded_writer(dir, specs, metadata, std::move(shards), options);
  if (!writer) return writer.status();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (auto st = nothrow::write(*writer, specs[i].name, data[i]); !st.ok()) return st;
  }
  return nothrow::finish(*writer);
}

/// `nothrow::save_sharded` of a braced list, without the range templates (see `make_list_writer`
/// in writer.hpp for why).
inline Status save_sharded_list(PathRef dir, TensorList tensors, const Metadata& metadata,
                                ShardOptions shards, SaveOptions options) {
  std::vector<TensorSpec> specs;
  std::vector<std::span<const std::byte>> data;
  for (const auto& entry : tensors) {
    if (auto st = list_tensor(dir, entry.first, entry.second, specs, data); !st.ok()) return st;
  }
  return save_listed(dir, specs, data, metadata, std::move(shards), options);
}
}  // namespace detail

template <NamedTensorRange R>
Status nothrow::save_sharded(PathRef dir, R&& tensors, const Metadata& metadata, ShardOptions shards,
                             SaveOptions options) {
  // One pass over the range: each tensor's declaration, and its bytes kept alive until written.
  detail::KeptTensors<R> kept;
  std::vector<TensorSpec> specs;
  std::vector<std::span<const std::byte>> data;
  auto listed = detail::for_each_tensor(
      std::forward<R>(tensors), kept,
      [&](std::string_view name, const auto& t) { return detail::list_tensor(dir, name, t, specs, data); });
  if (!listed.ok()) return listed;
  return detail::save_listed(dir, specs, data, metadata, std::move(shards), options);
}

inline Status nothrow::save_sharded(PathRef dir, detail::TensorList tensors, const Metadata& metadata,
                                    ShardOptions shards, SaveOptions options) {
  return detail::save_sharded_list(dir, tensors, metadata, std::move(shards), options);
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
