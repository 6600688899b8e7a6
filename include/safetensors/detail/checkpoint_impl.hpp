// Private: the definitions behind safetensors/checkpoint.hpp (which includes this at its end, after
// the classes these need): the doors of `Checkpoint` (opening, placing a tensor in its shard, the
// shards as sources), the shard-by-shard cursor its loops walk, and its nothrow face.
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

#include "safetensors/checkpoint.hpp"
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

namespace detail {
template <>
struct Access<Checkpoint> {
  /// The bridge checkpoint, or `Internal` for a moved-from Checkpoint.
  static Expected<const ffi::Checkpoint*> checkpoint(const Checkpoint& c) {
    if (!c.state_) return moved_from("Checkpoint");
    return c.state_->ckpt.operator->();
  }

  static Expected<Checkpoint> open(PathRef path, CheckpointOptions options) {
    auto c = adopt(attempt([&](ffi::Status& st) {
      return ffi::open_checkpoint(bytes(path.native()), static_cast<ffi::Backend>(options.backend),
                                  options.lenient, options.allow_trailing_bytes,
                                  static_cast<ffi::Populate>(options.populate), options.huge_pages, st);
    }));
    if (!c) return c.status();
    return Checkpoint(std::make_shared<const Checkpoint::Handle>(std::move(*c)));
  }

  template <class Remote>
  static Expected<Checkpoint> open_remote(std::string_view url, const Remote& remote,
                                          CheckpointOptions options) {
    const ffi::RemoteOptions crossing = remote_options(remote);
    auto c = adopt(attempt([&](ffi::Status& st) {
      return ffi::open_remote_checkpoint(bytes(url), crossing, options.lenient, options.allow_trailing_bytes,
                                         st);
    }));
    if (!c) return c.status();
    return Checkpoint(std::make_shared<const Checkpoint::Handle>(std::move(*c)));
  }

  static std::string shard_path(const ffi::Checkpoint& c, std::size_t i) {
    return Checkpoint::shard_path(c, i);
  }

  /// A tensor's open shard, and its entry there (its position in the shard's offset order).
  struct Placed {
    const ffi::File* file;
    std::size_t entry;
  };

  /// The open shard holding `name` and the tensor's entry in it, the shard opened (once) on
  /// first use. Once the shard is open this is one call: a hash probe in the core and a load.
  /// In lenient mode a listed tensor its shard lacks is `ShardMissing` here.
  static Expected<Placed> place(const Checkpoint& ckpt, std::string_view name) {
    if (!ckpt.state_) return moved_from("Checkpoint");
    const auto& h = *ckpt.state_;
    const ffi::Checkpoint& c = *h.ckpt;
    for (int tries = 0; tries < 2; ++tries) {
      std::size_t entry = 0;
      if (const ffi::File* file = c.find_open(bytes(name), entry)) return Placed{file, entry};
      // Not listed, not open yet, or (lenient) missing from its shard: the core says which,
      // with the error that names the file, and the shard is opened.
      auto shard = attempt([&](ffi::Status& st) { return c.shard_of(bytes(name), st); });
      if (!shard) return shard.status();
      if (auto opened = open_shard(h, *shard); !opened) return opened.status();
      if (auto held = attempt([&](ffi::Status& st) { return c.shard_holding(bytes(name), st); }); !held) {
        return held.status();
      }
    }
    return Status(ErrorKind::Internal,
                  "tensor `" + std::string(name) + "` is in an open shard the index cannot place");
  }

  /// The open shard holding `name`, as a source (see `place`).
  static Expected<OpenFile> open_file_for(const Checkpoint& ckpt, std::string_view name) {
    auto placed = place(ckpt, name);
    if (!placed) return placed.status();
    return source_of(ckpt, *placed);
  }

  /// The shard of `placed` as a source, sharing the checkpoint (which keeps it).
  static OpenFile source_of(const Checkpoint& ckpt, const Placed& placed) {
    return OpenFile::of(*placed.file, ckpt.state_);
  }

  /// The description of the tensor `placed`: no source made, no owner shared (the checkpoint
  /// keeps the shard), one call for its entry.
  static TensorInfo info_of(const Placed& placed) {
    const ffi::TensorMeta m = placed.file->meta_at(placed.entry);
    const std::size_t* dims = placed.file->dims().data;
    return TensorInfo{static_cast<Dtype>(m.dtype),
                      {dims + m.shape_start, dims + m.shape_start + m.shape_len},
                      {m.begin, m.end}};
  }

  /// Shard `shard` as a source, opened on first use; `ShardMissing` past the last one.
  static Expected<OpenFile> shard_source(const Checkpoint& ckpt, std::size_t index) {
    auto f = shard(ckpt, index);
    if (!f) return f.status();
    return OpenFile::of(**f, ckpt.state_);
  }

  /// Shard `shard`, opened on first use; `ShardMissing` past the last one.
  static Expected<const ffi::File*> shard(const Checkpoint& ckpt, std::size_t shard) {
    if (!ckpt.state_) return moved_from("Checkpoint");
    std::size_t count = ckpt.state_->ckpt->shard_count();
    if (shard >= count) {
      return Status(ErrorKind::ShardMissing, "no shard number " + std::to_string(shard) +
                                                 ": the checkpoint has " + std::to_string(count) + " shards");
    }
    return open_shard(*ckpt.state_, shard);
  }

  /// Opens every shard, several at once (the core's `open_all_shards`), before a question about
  /// all of them (`missing`, `trailing_bytes`).
  static Status open_every_shard(const Checkpoint& ckpt) {
    if (!ckpt.state_) return moved_from("Checkpoint");
    return attempt([&](ffi::Status& st) { ckpt.state_->ckpt->open_all_shards(st); });
  }

  /// Shard `shard`, opened on first use (once: the core's lock).
  static Expected<const ffi::File*> open_shard(const Checkpoint::Handle& h, std::size_t shard) {
    return attempt([&](ffi::Status& st) { return h.ckpt->shard_file(shard, st); });
  }
};

/// The tensors of a checkpoint in file order: shard by shard, each shard's in offset order,
/// those the index assigns to it (the core lists them when the shard opens: no lookup per
/// tensor). The cursor of iterating over a `Checkpoint`; it holds a copy of it (and with it the
/// shards).
struct ShardCursor {
  Checkpoint ckpt;
  std::size_t shard = 0;
  std::optional<OpenFile> file;
  /// The entries of `shard` the index assigns to it (the core's memory, living as long as the
  /// checkpoint), and the next one to read.
  const std::size_t* entries = nullptr;
  std::size_t entry_count = 0;
  std::size_t next_entry = 0;

  Status next(std::optional<NamedTensor>& out) {
    out.reset();
    auto c = Access<Checkpoint>::checkpoint(ckpt);
    if (!c) return c.status();
    const ffi::Checkpoint& index = **c;
    for (;;) {
      if (!file) {
        if (shard >= index.shard_count()) return {};
        // The shards the loop reaches next are opened several at once (one per core), so
        // that their headers are parsed in parallel; an error waits for the loop to get there.
        if (!index.shard_is_open(shard)) index.open_ahead(shard);
        auto src = Access<Checkpoint>::shard_source(ckpt, shard);
        if (!src) return src.status();
        file.emplace(std::move(*src));
        const ffi::Sizes listed = index.shard_entries(shard);
        entries = listed.data;
        entry_count = listed.len;
        next_entry = 0;
      }
      if (next_entry >= entry_count) {
        file.reset();
        ++shard;
        continue;
      }
      auto item = file->tensor_at(entries[next_entry++]);
      if (!item) return item.status();
      out.emplace(std::move(*item));
      return {};
    }
  }
};
}  // namespace detail

inline Expected<Checkpoint> nothrow::open_checkpoint(PathRef path, CheckpointOptions options) {
  return detail::Access<Checkpoint>::open(path, options);
}

template <class Remote>
Expected<Checkpoint> nothrow::open_remote_checkpoint(std::string_view url, const Remote& remote,
                                                     CheckpointOptions options) {
  static_assert(std::is_same_v<Remote, RemoteOptions>, "open_remote takes a safetensors::RemoteOptions");
  return detail::Access<Checkpoint>::open_remote(url, remote, options);
}

inline Expected<std::vector<std::string>> nothrow::keys(const Checkpoint& ckpt) {
  auto c = detail::Access<Checkpoint>::checkpoint(ckpt);
  if (!c) return c.status();
  std::vector<std::string> out;
  out.reserve((*c)->tensor_count());
  for (std::size_t i = 0; i < (*c)->tensor_count(); ++i) out.emplace_back(detail::view((*c)->name_at(i)));
  return out;
}

inline Expected<std::map<std::string, std::string>> nothrow::metadata(const Checkpoint& ckpt) {
  auto c = detail::Access<Checkpoint>::checkpoint(ckpt);
  if (!c) return c.status();
  return detail::metadata_of((*c)->metadata());
}

inline Expected<TensorInfo> nothrow::info(const Checkpoint& ckpt, std::string_view name) {
  auto placed = detail::Access<Checkpoint>::place(ckpt, name);
  if (!placed) return placed.status();
  return detail::Access<Checkpoint>::info_of(*placed);
}

inline Expected<TensorView> nothrow::get_tensor(const Checkpoint& ckpt, std::string_view name) {
  auto placed = detail::Access<Checkpoint>::place(ckpt, name);
  if (!placed) return placed.status();
  return detail::Access<Checkpoint>::source_of(ckpt, *placed).get_tensor_at(placed->entry, name);
}

inline Expected<Slice> nothrow::get_slice(const Checkpoint& ckpt, std::string_view name) {
  auto src = detail::Access<Checkpoint>::open_file_for(ckpt, name);
  if (!src) return src.status();
  return detail::Access<Slice>::make(std::move(*src), name);
}

inline Expected<std::vector<std::string>> nothrow::missing(const Checkpoint& ckpt) {
  auto c = detail::Access<Checkpoint>::checkpoint(ckpt);
  if (!c) return c.status();
  if (auto opened = detail::Access<Checkpoint>::open_every_shard(ckpt); !opened.ok()) return opened;
  auto names = detail::adopt(detail::attempt([&](ffi::Status& st) { return (*c)->missing(st); }));
  if (!names) return names.status();
  std::vector<std::string> out;
  out.reserve((*names)->len());
  // As a string_view: the same `emplace_back` that `keys` instantiates.
  for (std::size_t i = 0; i < (*names)->len(); ++i) out.emplace_back(detail::view((*names)->at(i)));
  return out;
}

inline Expected<ShardSizes> nothrow::shard_sizes(const Checkpoint& ckpt, std::size_t shard) {
  auto f = detail::Access<Checkpoint>::shard(ckpt, shard);
  if (!f) return f.status();
  return ShardSizes{8 + static_cast<std::uint64_t>((*f)->header_len()), (*f)->data_len(),
                    (*f)->trailing_bytes()};
}

inline Status nothrow::read_shard_data(const Checkpoint& ckpt, std::size_t shard, std::size_t offset,
                                       std::span<std::byte> dst) {
  // Through the shard's `OpenFile`, whose read refuses a destination inside the shard's memory.
  auto src = detail::Access<Checkpoint>::shard_source(ckpt, shard);
  if (!src) return src.status();
  return src->read_data(offset, dst);
}

inline Expected<std::vector<std::pair<std::string, std::uint64_t>>> nothrow::trailing_bytes(
    const Checkpoint& ckpt) {
  auto c = detail::Access<Checkpoint>::checkpoint(ckpt);
  if (!c) return c.status();
  if (auto opened = detail::Access<Checkpoint>::open_every_shard(ckpt); !opened.ok()) return opened;
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (std::size_t i = 0; i < (*c)->shard_count(); ++i) {
    auto n = detail::attempt([&](ffi::Status& st) { return (*c)->shard_trailing_bytes(i, st); });
    if (!n) return n.status();
    if (*n > 0) out.emplace_back(detail::Access<Checkpoint>::shard_path(**c, i), *n);
  }
  return out;
}

inline Expected<std::string> nothrow::shard_of(const Checkpoint& ckpt, std::string_view name) {
  auto c = detail::Access<Checkpoint>::checkpoint(ckpt);
  if (!c) return c.status();
  auto shard = detail::attempt([&](ffi::Status& st) { return (*c)->shard_of(detail::bytes(name), st); });
  if (!shard) return shard.status();
  return detail::Access<Checkpoint>::shard_path(**c, *shard);
}

inline Status nothrow::get_tensor_into(const Checkpoint& ckpt, std::string_view name,
                                       std::span<std::byte> dst) {
  auto src = detail::Access<Checkpoint>::open_file_for(ckpt, name);
  if (!src) return src.status();
  return src->get_tensor_into(name, dst);
}

inline Status nothrow::get_tensor_as(const Checkpoint& ckpt, std::string_view name, Dtype to,
                                     std::span<std::byte> dst) {
  auto src = detail::Access<Checkpoint>::open_file_for(ckpt, name);
  if (!src) return src.status();
  return detail::get_tensor_as(*src, name, to, dst);
}

inline Expected<TensorView> nothrow::get_tensor_as(const Checkpoint& ckpt, std::string_view name, Dtype to) {
  auto view = nothrow::get_tensor(ckpt, name);
  if (!view) return view.status();
  return nothrow::convert(*view, to);
}

inline detail::TensorRange<detail::ShardCursor, true> nothrow::tensors(const Checkpoint& ckpt) {
  return detail::TensorRange<detail::ShardCursor, true>(detail::ShardCursor{ckpt, 0, std::nullopt});
}

inline detail::TensorIterator<detail::ShardCursor, false> Checkpoint::begin() const {
  return detail::TensorIterator<detail::ShardCursor, false>(detail::ShardCursor{*this, 0, std::nullopt});
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
