// Tensors delivered one by one, in file order, as soon as their bytes are read, with at most a
// bounded number of bytes of buffers alive at once: for engines that transform each weight as
// it arrives and cannot hold the checkpoint and its transformed copy together.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "safetensors/checkpoint.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/ffi/src/stream.rs.h"
#include "safetensors/request.hpp"
#include "safetensors/safe_open.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// How a `TensorStream` runs.
struct StreamOptions {
  /// Most bytes of buffers alive at once: being read, read ahead, and delivered to you and not
  /// yet dropped. A tensor larger than this is still delivered: it is read alone, once nothing
  /// else is alive, so the peak is max(max_inflight_bytes, largest tensor).
  std::uint64_t max_inflight_bytes = std::uint64_t{256} << 20;
  /// When the stream cannot go on until you drop tensors it gave you: false makes `next` report
  /// `BudgetExceeded` at once (the thread asking holds them: waiting would never end); true makes
  /// it wait, for programs whose other threads drop them.
  bool wait_for_release = false;
};

/// One delivered tensor (or selection) and where it came from.
struct StreamItem {
  /// The tensor's name.
  std::string name;
  /// Its dtype, its shape (the selection's, for a selection) and its bytes, which the view owns:
  /// they return to the stream's budget when the last copy of the view (and of this item) is
  /// dropped, on any thread, also after the stream is gone.
  TensorView view;
  /// Its position in the request list; streaming every tensor, its position in delivery order.
  std::size_t request = 0;
  /// The shard it came from (a position in `Checkpoint::shard_paths()`; 0 for a `SafeOpen`).
  std::size_t shard = 0;
  /// Its position in that file, in offset (file) order.
  std::size_t index = 0;
  /// Path of the file it came from (a `std::string`, as `SafeOpen::path()`).
  std::string path;
};

class TensorStream;

namespace nothrow {
/// `TensorStream(from, requests, options)` without exceptions.
///
///   auto stream = safetensors::nothrow::stream(f, {}, {.max_inflight_bytes = 64 << 20});
template <Readable From>
[[nodiscard]] Expected<TensorStream> stream(const From& from, Requests requests = {},
                                            StreamOptions options = {});
/// `TensorStream::next` without exceptions: the next item, `std::nullopt` at the end, or an
/// error: `BudgetExceeded` (recoverable: drop what you hold and call again), or the error that
/// ended the stream (reported again by every later call).
///
///   auto stream = safetensors::nothrow::stream(ckpt);
///   while (stream) {
///     auto item = safetensors::nothrow::next(*stream);
///     if (!item || !item->has_value()) break;  // the error (item.status()), or the end
///     const safetensors::StreamItem& t = **item;
///     std::printf("%s: %zu bytes\n", t.name.c_str(), t.view.data.size());
///   }
[[nodiscard]] Expected<std::optional<StreamItem>> next(TensorStream& stream);
}  // namespace nothrow

/// Every tensor (or the requested tensors and selections) of a file or a checkpoint, in file
/// order (shard by shard, offsets ascending within each), each delivered as soon as its bytes
/// are read, with at most `max_inflight_bytes` of buffers alive at once. Works with every
/// backend (the mapped one copies out of the mapping: the bound counts the copies, not the page
/// cache). A background thread reads ahead as far as the bound allows.
///
///   safetensors::TensorStream stream(ckpt, {}, {.max_inflight_bytes = 512 << 20});
///   for (safetensors::StreamItem& t : stream) {
///     std::printf("%s from shard %zu\n", t.name.c_str(), t.shard);   // transform t.view here;
///   }                                                                // dropping it frees its bytes
///
/// Iterating (or `next()`) throws the error that ends the stream; `nothrow::next` returns it.
/// A tensor's bytes return to the budget when the last copy of its view is dropped. When the
/// next tensor cannot be read until you drop some (you hold more than the bound minus its
/// size, or anything before a tensor larger than the bound), `next` reports `BudgetExceeded` at
/// once, unless `wait_for_release` is set, in which case it waits for other threads to drop
/// what they hold. A range-for drops each item before asking for the next, so a loop that keeps
/// nothing never sees that error.
///
/// `BudgetExceeded` is recoverable: once you drop what you hold, the next `next` goes on where
/// the stream was, skipping nothing.
///
/// Errors: those of the requests (`TensorNotFound`, `InvalidSlice`, ...) when the stream is
/// made, before anything is read; then every other error ends the stream and frees what was
/// read but not delivered, and every later `next` reports it again (a stream that failed never
/// looks like one that ended): a file that shrinks gives `Io` for the tensor it cuts short,
/// never other bytes (with the read and direct backends; the mapped backend copies out of the mapping, and a
/// mapping of a file cut short faults with `SIGBUS`, as any view of it would: stream files other
/// processes may change with `Backend::Read` or `Backend::Direct`). Destroying the stream early
/// cancels the reads not yet started and returns once the read in progress reaches the end of
/// its 64 MiB piece (a selection: the selection); items already delivered stay valid.
///
/// An empty request list streams nothing (`{}`, the default, streams every tensor).
///
/// Threads: a TensorStream is used by one thread at a time (`next`, iteration and the byte
/// counts are not synchronised with one another), like a `std::ifstream`; the items it delivers
/// are independent values that any thread may use, copy and drop. Move-only; iterators and
/// `begin()` belong to the object they came from (call `begin()` once, as for an input stream).
class TensorStream {
 public:
  /// `requests` of a file or a checkpoint (`{}`: every tensor; a checkpoint's, shard by shard),
  /// each delivered (repeats included) in file order.
  ///
  ///   std::vector<safetensors::Request> want{{"wte.weight"},
  ///                                          {"h.0.mlp.c_fc.weight", {Index::all(), Index::range(0, 768)}}};
  ///   safetensors::TensorStream some(f, want);
  template <Readable From>
  explicit TensorStream(const From& from, Requests requests = {}, StreamOptions options = {})
      : TensorStream(nothrow::stream(from, requests, options).value()) {}

  TensorStream(TensorStream&&) noexcept = default;
  TensorStream& operator=(TensorStream&&) noexcept = default;
  TensorStream(const TensorStream&) =
      SAFETENSORS_DELETE("a TensorStream is an input stream, read once: move it");
  TensorStream& operator=(const TensorStream&) =
      SAFETENSORS_DELETE("a TensorStream is an input stream: move it");
  ~TensorStream() = default;

  /// The next item, or `std::nullopt` once every one was delivered. Throws `BudgetExceeded`
  /// (recoverable: drop what you hold and call again), or the error that ended the stream
  /// (`Io`, ...), again on every later call.
  [[nodiscard]] std::optional<StreamItem> next() { return nothrow::next(*this).value(); }

  /// Items the stream delivers in all.
  [[nodiscard]] std::size_t size() const { return stream().tensor_count(); }
  /// Bytes it delivers in all.
  [[nodiscard]] std::uint64_t total_bytes() const { return stream().total_bytes(); }
  /// The most bytes of buffers alive at once so far (instrumentation, for tests and tuning):
  /// at most max(`max_inflight_bytes`, largest tensor).
  [[nodiscard]] std::uint64_t peak_inflight_bytes() const { return stream().peak_inflight_bytes(); }
  /// Bytes of buffers alive now (read, read ahead, or delivered and not dropped).
  [[nodiscard]] std::uint64_t inflight_bytes() const { return stream().inflight_bytes(); }
  [[nodiscard]] StreamOptions options() const { return options_; }

  /// An input iterator over the items: each `++` drops the current item (the iterator's copy;
  /// yours stay valid) and then asks for the next, throwing the error that ends the stream.
  class iterator {
   public:
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;
    using value_type = StreamItem;
    using difference_type = std::ptrdiff_t;
    using reference = StreamItem&;

    iterator() = default;
    reference operator*() const { return *stream_->current_; }
    StreamItem* operator->() const { return &*stream_->current_; }
    iterator& operator++() {
      stream_->advance();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.at_end(); }

   private:
    [[nodiscard]] bool at_end() const { return stream_ == nullptr || !stream_->current_; }

    friend class TensorStream;
    explicit iterator(TensorStream* s) : stream_(s) {}
    TensorStream* stream_ = nullptr;
  };

  /// Asks for the first item (throwing as `next` does).
  [[nodiscard]] iterator begin() {
    advance();
    return iterator(this);
  }
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

 private:
  friend struct detail::Access<TensorStream>;

  // The bridge stream (whose reader thread announces each hand-over of a read tensor to a
  // ThreadSanitizer build of this program from inside the core, `safetensors_core::tsan`).
  struct State {
    std::optional<::rust::Box<ffi::TensorStream>> stream;
  };

  TensorStream(std::unique_ptr<State> state, StreamOptions options)
      : state_(std::move(state)), options_(options) {}

  [[nodiscard]] const ffi::TensorStream& stream() const {
    if (!state_) detail::moved_from("TensorStream").throw_if_error();
    return **state_->stream;
  }

  void advance() {
    current_.reset();  // first, so that the budget it held is free for the next one
    current_ = next();
  }

  std::unique_ptr<State> state_;
  StreamOptions options_;
  std::optional<StreamItem> current_;
};

namespace detail {
template <>
struct Access<TensorStream> {
  using State = TensorStream::State;

  template <class Open>
  static Expected<TensorStream> open(StreamOptions o, Open&& open) {
    auto state = std::make_unique<State>();
    auto made =
        adopt(attempt([&](ffi::Status& st) { return open(o.max_inflight_bytes, o.wait_for_release, st); }));
    if (!made) return made.status();
    state->stream.emplace(std::move(*made));
    return TensorStream(std::move(state), o);
  }

  /// An item that owns the delivered tensor: its view's owner is the bridge object, whose
  /// destruction returns the bytes to the budget.
  static StreamItem item(::rust::Box<ffi::StreamTensor> box) {
    std::shared_ptr<const ffi::StreamTensor> t = share(std::move(box));
    auto shape = t->shape();
    auto data = t->data();
    auto path = t->path();
    StreamItem out;
    out.name = std::string(view(t->name()));
    out.request = t->request();
    out.shard = t->file();
    out.index = t->index();
    out.path = std::string(reinterpret_cast<const char*>(path.data()), path.size());
    std::span<const std::byte> bytes;
    if (data.size() > 0) bytes = {reinterpret_cast<const std::byte*>(data.data()), data.size()};
    out.view =
        TensorView{static_cast<Dtype>(t->dtype()),
                   std::vector<std::size_t>(shape.data(), shape.data() + shape.size()), bytes, std::move(t)};
    return out;
  }

  static Expected<std::optional<StreamItem>> next(TensorStream& s) {
    if (!s.state_) return moved_from("TensorStream");
    State& state = *s.state_;
    auto got = attempt([&](ffi::Status& st) { return (*state.stream)->next_tensor(st); });
    if (!got) return got.status();
    if (*got == nullptr) return std::optional<StreamItem>{};
    return std::optional<StreamItem>(item(::rust::Box<ffi::StreamTensor>::from_raw(*got)));
  }
};
}  // namespace detail

template <Readable From>
Expected<TensorStream> nothrow::stream(const From& from, Requests requests, StreamOptions options) {
  auto r = detail::reading(from, requests);
  if (!r) return r.status();
  return detail::Access<TensorStream>::open(
      options, [&](auto&&... args) { return ffi::stream(*r->source, *r->requests, args...); });
}

inline Expected<std::optional<StreamItem>> nothrow::next(TensorStream& stream) {
  return detail::Access<TensorStream>::next(stream);
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
