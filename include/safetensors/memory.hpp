// Host memory: every tensor of a file or a checkpoint (or those asked for) loaded into one owned,
// aligned allocation with a name -> view map (`load`, `LoadedTensors`), and where a file's pages
// stay: locked in memory, unlocked, or released once a program has copied what it needs
// (`lock_pages`, `unlock_pages`, `release_pages`).
//
//   auto weights = safetensors::load(f);                   // one allocation, 64-byte aligned
//   safetensors::release_pages(f);                         // the file's pages leave RSS and cache
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/iteration.hpp"
#include "safetensors/detail/slices.hpp"
#include "safetensors/ffi/src/memory.rs.h"
#include "safetensors/request.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// Every tensor of a `load` starts on a multiple of this many bytes of its allocation (a cache
/// line: enough for any element type and for aligned SIMD loads); the allocation itself is
/// 64-byte aligned, and 2 MiB aligned (on huge pages where the system allows) from 4 MiB on.
inline constexpr std::size_t load_alignment = 64;

class LoadedTensors;

namespace detail {
struct LoadedCursor;
}  // namespace detail

namespace nothrow {
/// `safetensors::load` without exceptions.
///
///   auto weights = safetensors::nothrow::load(f);
///   if (!weights) std::puts(weights.status().message().c_str());
template <Readable From>
[[nodiscard]] Expected<LoadedTensors> load(const From& from, Requests requests = {});
/// `LoadedTensors::info` without exceptions.
[[nodiscard]] Expected<TensorInfo> info(const LoadedTensors& tensors, std::string_view name);
/// `LoadedTensors::get_tensor` without exceptions.
[[nodiscard]] Expected<TensorView> get_tensor(const LoadedTensors& tensors, std::string_view name);
/// `safetensors::lock_pages` without exceptions.
template <Readable From>
Status lock_pages(const From& from, Requests requests = {});
/// `safetensors::unlock_pages` without exceptions.
template <Readable From>
Status unlock_pages(const From& from, Requests requests = {});
/// `safetensors::release_pages` without exceptions.
template <Readable From>
Status release_pages(const From& from, Requests requests = {});
}  // namespace nothrow

/// Tensors loaded into one allocation the program owns (`safetensors::load`): the engine's own
/// copy of the weights, independent of the file (which may be closed, and its pages released,
/// right after). A name -> view map over the allocation: `get_tensor(name)` is a view into it
/// (zero copy) that keeps the whole allocation alive, as a file's views keep its mapping.
///
///   safetensors::LoadedTensors weights = safetensors::load(ckpt);
///   safetensors::TensorView w = weights.get_tensor("lm_head.weight");
///   for (const auto& [name, view] : weights) std::printf("%s\n", name.c_str());
///
/// Copies share the allocation. The bytes are the program's: `mutable_bytes()` may change them
/// in place (views see the change). Tensors are laid out as `safetensors::load` says; each
/// `info(name).data_offsets` is where it lies in `bytes()`.
class LoadedTensors {
 public:
  /// No tensors.
  LoadedTensors() = default;

  /// Number of tensors (placements; a name requested twice counts twice).
  [[nodiscard]] std::size_t size() const noexcept { return state_ ? state_->infos.size() : 0; }
  [[nodiscard]] bool contains(std::string_view name) const { return state_ && state_->index.contains(name); }
  /// The names in layout order (for every tensor: sorted, as `keys()` of the source).
  [[nodiscard]] const std::vector<std::string>& keys() const noexcept {
    return state_ ? state_->names : none();
  }
  /// A tensor's dtype, shape and `[begin, end)` in `bytes()`. Throws `TensorNotFound`.
  [[nodiscard]] TensorInfo info(std::string_view name) const { return nothrow::info(*this, name).value(); }
  /// A view of a tensor in the allocation, which it keeps alive. Throws `TensorNotFound`.
  [[nodiscard]] TensorView get_tensor(std::string_view name) const {
    return nothrow::get_tensor(*this, name).value();
  }

  /// The whole allocation: every tensor, and zeros between them (alignment padding).
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
    return state_ ? std::span<const std::byte>(state_->buffer.get(), state_->size)
                  : std::span<const std::byte>{};
  }
  /// The same bytes, writable: they belong to the program.
  [[nodiscard]] std::span<std::byte> mutable_bytes() noexcept {
    return state_ ? std::span<std::byte>(state_->buffer.get(), state_->size) : std::span<std::byte>{};
  }
  /// What keeps the allocation alive (the `owner` of every view of it).
  [[nodiscard]] std::shared_ptr<const void> owner() const noexcept {
    return state_ ? std::shared_ptr<const void>(state_->buffer) : nullptr;
  }

  /// Iterating gives each tensor's name and view in layout order.
  [[nodiscard]] detail::TensorIterator<detail::LoadedCursor, false> begin() const;
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

 private:
  friend struct detail::Access<LoadedTensors>;

  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  struct State {
    std::shared_ptr<std::byte[]> buffer;
    std::size_t size = 0;
    std::vector<std::string> names;
    std::vector<TensorInfo> infos;
    std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> index;
  };

  explicit LoadedTensors(std::shared_ptr<const State> state) : state_(std::move(state)) {}

  static const std::vector<std::string>& none() noexcept {
    static const std::vector<std::string> empty;
    return empty;
  }

  std::shared_ptr<const State> state_;
};

namespace detail {
template <>
struct Access<LoadedTensors> {
  using State = LoadedTensors::State;

  /// The tensors `job` placed, read into a new allocation.
  static Expected<LoadedTensors> load(const ffi::HostLoad& job) {
    auto state = std::make_shared<State>();
    state->size = job.total_bytes();
    auto raw = job.placements();
    auto buffer = allocate_bytes(state->size, "a load of " + std::to_string(raw.size()) + " tensors");
    if (!buffer) return buffer.status();
    state->buffer = std::move(*buffer);
    ::rust::Slice<std::uint8_t> out{reinterpret_cast<std::uint8_t*>(state->buffer.get()), state->size};
    if (auto st = attempt([&](ffi::Status& s) { job.read_into(out, s); }); !st.ok()) return st;
    state->names.reserve(raw.size());
    state->infos.reserve(raw.size());
    for (const auto& p : raw) {
      const auto begin = static_cast<std::size_t>(p.offset);
      state->names.emplace_back(p.name.data(), p.name.size());
      state->infos.push_back({static_cast<Dtype>(p.dtype),
                              std::vector<std::size_t>(p.shape.data(), p.shape.data() + p.shape.size()),
                              {begin, begin + static_cast<std::size_t>(p.len)}});
      state->index.emplace(state->names.back(), state->names.size() - 1);  // the first of a name wins
    }
    return LoadedTensors(std::move(state));
  }

  /// Position `k` (in layout order) as a view that keeps the allocation alive.
  static NamedTensor at(const State& s, std::size_t k) {
    const TensorInfo& i = s.infos[k];
    std::span<const std::byte> data{s.buffer.get() + i.data_offsets.first, i.byte_size()};
    return {s.names[k], TensorView{i.dtype, i.shape, data, s.buffer}};
  }

  static Expected<std::size_t> find(const LoadedTensors& t, std::string_view name) {
    if (t.state_) {
      if (auto it = t.state_->index.find(name); it != t.state_->index.end()) return it->second;
    }
    return Status(ErrorKind::TensorNotFound, "no tensor `" + std::string(name) + "` among the " +
                                                 std::to_string(t.size()) + " loaded tensors");
  }

  static const std::shared_ptr<const State>& state(const LoadedTensors& t) { return t.state_; }
};

/// The tensors of a load in layout order (it holds the allocation).
struct LoadedCursor {
  std::shared_ptr<const Access<LoadedTensors>::State> state;
  std::size_t next_index = 0;

  Status next(std::optional<NamedTensor>& out) {
    out.reset();
    if (state && next_index < state->infos.size())
      out.emplace(Access<LoadedTensors>::at(*state, next_index++));
    return {};
  }
};

/// What a residency call does, as the bridge takes it.
template <Readable From>
Status residency(const From& from, const Requests& requests, ffi::Residency what) {
  auto r = reading(from, requests);
  if (!r) return r.status();
  return attempt([&](ffi::Status& st) { ffi::residency(*r->source, *r->requests, what, st); });
}
}  // namespace detail

/// Loads `requests` of a file or a checkpoint (`{}`: every tensor) into one new allocation the
/// returned `LoadedTensors` owns, as Python's `load_file` returns every tensor: each tensor on a
/// `load_alignment` boundary, in request order (every tensor: in `keys()` order), the padding
/// zeroed. A selection (`Request::select`) loads only the selected elements, packed. The bytes
/// are read in file order (shard by shard, each front to back), straight into the allocation:
/// from the mapping with the mapped backend, with `pread` with the others. Throws
/// `TensorNotFound` or `InvalidSlice` for a request that does not fit (before anything is
/// allocated), `Io` when the memory cannot be had or a read fails.
///
///   auto weights = safetensors::load(f);
///   std::vector<safetensors::Request> want{{"wte.weight"}, {"wpe.weight"}};
///   auto some = safetensors::load(ckpt, want);
template <Readable From>
[[nodiscard]] LoadedTensors load(const From& from, Requests requests = {}) {
  return nothrow::load(from, requests).value();
}

/// Locks the pages `requests` read (`{}`: every tensor) of a mapped file, or of a checkpoint's
/// mapped shards, in memory (`mlock`): they are read in now and never paged out, until
/// `unlock_pages` or the file's close (its last view gone). Locks do not nest: one
/// `unlock_pages` undoes them. Pages are whole: a page a tensor shares with its neighbour is
/// locked with it. Nothing for the read and direct backends and files in memory, which map no
/// file (their views own memory of their own). A refusal is `Io`, naming `RLIMIT_MEMLOCK` (the
/// most an unprivileged process may lock, often 8 MiB; `ulimit -l`), its value, and how to
/// raise it.
///
///   safetensors::lock_pages(f, {{"wte.weight"}});
template <Readable From>
void lock_pages(const From& from, Requests requests = {}) {
  nothrow::lock_pages(from, requests).throw_if_error();
}

/// Unlocks the pages `lock_pages` locked; pages never locked are left as they are.
template <Readable From>
void unlock_pages(const From& from, Requests requests = {}) {
  nothrow::unlock_pages(from, requests).throw_if_error();
}

/// Releases the pages `requests` read (`{}`: every tensor) once the program has copied them
/// (uploaded them, loaded them into its own buffers): drops them from this process's mapping
/// (`MADV_DONTNEED`: the resident set shrinks by them) and asks the kernel to drop them from
/// the page cache (`POSIX_FADV_DONTNEED`: pages another process maps stay). Nothing is lost:
/// views of the file stay valid, and a later access reads the bytes from the file again. With
/// the read and direct backends only the page cache is released; a file in memory (the
/// caller's bytes) is never touched. Pages locked with `lock_pages` are `Io` (unlock them
/// first). Whole pages, as `lock_pages`. A file renamed over (a new version published by an
/// atomic rename) or removed since it was opened is released too: its mapping needs no path,
/// and the file the path names now is never touched (the page cache is reached through the
/// path only while it names the file opened; the old file's cached pages this process mapped
/// are reclaimed with the mapping, the rest go when the file is closed).
///
///   auto gpu = safetensors::cuda::load(f);
///   safetensors::release_pages(f);   // the host copy goes: RSS and page cache
template <Readable From>
void release_pages(const From& from, Requests requests = {}) {
  nothrow::release_pages(from, requests).throw_if_error();
}

template <Readable From>
Expected<LoadedTensors> nothrow::load(const From& from, Requests requests) {
  auto r = detail::reading(from, requests);
  if (!r) return r.status();
  auto job = detail::adopt(detail::attempt(
      [&](ffi::Status& st) { return ffi::plan_load(*r->source, *r->requests, load_alignment, st); }));
  if (!job) return job.status();
  return detail::Access<LoadedTensors>::load(**job);
}

inline Expected<TensorInfo> nothrow::info(const LoadedTensors& tensors, std::string_view name) {
  auto k = detail::Access<LoadedTensors>::find(tensors, name);
  if (!k) return k.status();
  return detail::Access<LoadedTensors>::state(tensors)->infos[*k];
}

inline Expected<TensorView> nothrow::get_tensor(const LoadedTensors& tensors, std::string_view name) {
  auto k = detail::Access<LoadedTensors>::find(tensors, name);
  if (!k) return k.status();
  return detail::Access<LoadedTensors>::at(*detail::Access<LoadedTensors>::state(tensors), *k).view;
}

template <Readable From>
Status nothrow::lock_pages(const From& from, Requests requests) {
  return detail::residency(from, requests, ffi::Residency::Lock);
}

template <Readable From>
Status nothrow::unlock_pages(const From& from, Requests requests) {
  return detail::residency(from, requests, ffi::Residency::Unlock);
}

template <Readable From>
Status nothrow::release_pages(const From& from, Requests requests) {
  return detail::residency(from, requests, ffi::Residency::Release);
}

inline detail::TensorIterator<detail::LoadedCursor, false> LoadedTensors::begin() const {
  return detail::TensorIterator<detail::LoadedCursor, false>(detail::LoadedCursor{state_, 0});
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
