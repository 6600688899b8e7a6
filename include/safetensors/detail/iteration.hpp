// Private: iterating over (name, view) pairs one tensor at a time, for `SafeOpen`, `Checkpoint`
// and `LoadedTensors` alike (`for (const auto& [name, view] : f)`), and the nothrow face of it.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>

#include "safetensors/error.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

/// An input iterator over the tensors a `Cursor` walks. A cursor has `Status next(std::optional<
/// NamedTensor>& out)`: the next tensor in `out`, `out` empty at the end, or the error that ends
/// the walk; it holds whatever keeps its source alive, so the loop may outlive the object it
/// began from. Each tensor is made (its view taken, read with the read backend) when the
/// iterator reaches it, once.
///
/// `Nothrow` false: `*it` is the `NamedTensor`, and an error is thrown there (`Error`, as the
/// throwing API does). `Nothrow` true: `*it` is an `Expected<NamedTensor>` holding the error,
/// after which the walk ends.
template <class Cursor, bool Nothrow>
class TensorIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using difference_type = std::ptrdiff_t;
  using value_type = std::conditional_t<Nothrow, Expected<NamedTensor>, NamedTensor>;
  using reference = const value_type&;

  /// The end.
  TensorIterator() = default;
  /// The first tensor of `cursor`'s walk, or the error that kept it from starting.
  explicit TensorIterator(Expected<Cursor> cursor) {
    if (!cursor) {
      item_ = cursor.status();
      return;
    }
    cursor_.emplace(std::move(*cursor));
    advance();
  }
  TensorIterator(const TensorIterator&) = default;
  TensorIterator& operator=(const TensorIterator&) = default;
  /// A moved-from iterator holds nothing: what it points at is `Internal`, then its walk ends.
  /// (Left as moved, its cursor would still point into the file it gave away, and step on
  /// into that file once the iterator it was moved into let go of it.)
  TensorIterator(TensorIterator&& other)
      : cursor_(std::move(other.cursor_)), item_(std::move(other.item_)), done_(other.done_) {
    other.empty();
  }
  TensorIterator& operator=(TensorIterator&& other) {
    if (this != &other) {
      cursor_ = std::move(other.cursor_);
      item_ = std::move(other.item_);
      done_ = other.done_;
      other.empty();
    }
    return *this;
  }
  ~TensorIterator() = default;

  [[nodiscard]] reference operator*() const {
    if constexpr (Nothrow) {
      return item_;
    } else {
      return item_.value();
    }
  }
  [[nodiscard]] const value_type* operator->() const { return &**this; }

  TensorIterator& operator++() {
    if (!item_.has_value()) {
      done_ = true;  // an error ends the walk
    } else {
      advance();
    }
    return *this;
  }
  void operator++(int) { ++*this; }

  friend bool operator==(const TensorIterator& it, std::default_sentinel_t) noexcept { return it.done_; }

 private:
  void advance() {
    std::optional<NamedTensor> next;
    if (Status st = cursor_->next(next); !st.ok()) {
      item_ = std::move(st);
    } else if (!next) {
      done_ = true;
      item_ = Status(ErrorKind::Internal, "an iterator past the last tensor was dereferenced");
    } else {
      item_ = std::move(*next);
    }
  }

  void empty() {
    cursor_.reset();
    item_ = moved_from("tensor iterator");
    done_ = false;
  }

  std::optional<Cursor> cursor_;
  Expected<NamedTensor> item_{Status(ErrorKind::Internal, "the end iterator was dereferenced")};
  bool done_ = false;
};

/// A range over a cursor's tensors: `begin()` starts the walk (each call a new one), `end()` is
/// `std::default_sentinel`.
template <class Cursor, bool Nothrow>
class TensorRange {
 public:
  explicit TensorRange(Expected<Cursor> cursor) : cursor_(std::move(cursor)) {}
  TensorRange(const TensorRange&) = default;
  TensorRange& operator=(const TensorRange&) = default;
  /// A moved-from range holds nothing: its walk is one `Internal` error (as an iterator's).
  TensorRange(TensorRange&& other) : cursor_(std::move(other.cursor_)) {
    other.cursor_ = moved_from("tensor range");
  }
  TensorRange& operator=(TensorRange&& other) {
    if (this != &other) {
      cursor_ = std::move(other.cursor_);
      other.cursor_ = moved_from("tensor range");
    }
    return *this;
  }
  ~TensorRange() = default;
  [[nodiscard]] TensorIterator<Cursor, Nothrow> begin() const {
    return TensorIterator<Cursor, Nothrow>(cursor_);
  }
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

 private:
  Expected<Cursor> cursor_;
};

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
