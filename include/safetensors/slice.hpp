// Slicing tensors without reading what is not selected: for tensor parallelism.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/source.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {

class LoadPlan;  // include/safetensors/distributed.hpp

/// What to take along one dimension, as in Python: an integer selects one position and drops
/// the dimension (`a[3]`); `Index::all()` is `:`; `Index::range(start, stop, step)` is
/// `start:stop:step`. Negative positions count from the end. Positions out of range are errors,
/// never clamped; `start >= stop` is an empty range; the step must be at least 1.
class Index {
 public:
  /// Select one position (the dimension disappears from the result). Implicit, so that a
  /// plain integer reads like Python: `select({3, Index::all()})`.
  template <std::integral I>
  Index(I position) : kind_(0), start_(static_cast<std::int64_t>(position)) {}  // NOLINT

  /// The whole dimension, `:`.
  static Index all() { return range(std::nullopt, std::nullopt); }

  /// `start:stop:step`; `std::nullopt` leaves a bound open (`range(2, {})` is `2:`).
  static Index range(std::optional<std::int64_t> start, std::optional<std::int64_t> stop, std::int64_t step = 1) {
    Index i(0);
    i.kind_ = 1;
    i.start_ = start.value_or(0);
    i.stop_ = stop.value_or(0);
    i.has_start_ = start.has_value();
    i.has_stop_ = stop.has_value();
    i.step_ = step;
    return i;
  }

 private:
  friend class Slice;
  friend struct detail::Access;
  [[nodiscard]] ffi::SliceIndex raw() const { return {kind_, start_, stop_, step_, has_start_, has_stop_}; }

  std::uint8_t kind_ = 0;
  std::int64_t start_ = 0;
  std::int64_t stop_ = 0;
  std::int64_t step_ = 1;
  bool has_start_ = false;
  bool has_stop_ = false;
};

/// A contiguous byte run of a selection, relative to the start of the file's data buffer
/// (add `SafeOpen::data_offset()` for a position in the file).
struct ByteRun {
  std::size_t offset = 0;
  std::size_t length = 0;
  friend bool operator==(const ByteRun&, const ByteRun&) = default;
};

/// A planned selection: its shape and byte runs are known, no tensor byte has been read.
class Selection {
 public:
  [[nodiscard]] Dtype dtype() const { return dtype_; }
  [[nodiscard]] const std::vector<std::size_t>& shape() const { return shape_; }
  /// Bytes in the result.
  [[nodiscard]] std::size_t byte_size() const { return plan_->byte_len(); }

  /// The runs to read, in result order; runs that touch are merged, so consecutive runs leave
  /// a gap. A GPU path can read exactly these bytes.
  [[nodiscard]] std::vector<ByteRun> runs() const {
    auto raw = plan_->runs();
    std::vector<ByteRun> out;
    out.reserve(raw.size());
    for (const auto& r : raw) out.push_back({static_cast<std::size_t>(r.offset), static_cast<std::size_t>(r.length)});
    return out;
  }

  /// The selected elements as one contiguous tensor. A selection that is a single run of a
  /// mapped file is returned without copying; otherwise the bytes are copied into a new buffer
  /// owned by the view. Only the selected bytes are read.
  [[nodiscard]] TensorView read() const {
    TensorView v{dtype_, shape_, {}, {}};
    std::size_t len = byte_size();
    if (len == 0) return v;
    if (src_.data != nullptr && plan_->contiguous()) {
      auto [bytes_span, keep] = src_.bytes_at(static_cast<std::size_t>(plan_->runs()[0].offset), len);
      v.data = bytes_span;
      v.owner = std::move(keep);
      return v;
    }
    auto buffer = detail::allocate_bytes(len);
    read_into({buffer.get(), len});
    v.data = {buffer.get(), len};
    v.owner = std::move(buffer);
    return v;
  }

  /// Copies the selected bytes, contiguous and in row-major order, into `dst`, which must hold
  /// exactly `byte_size()` bytes (else `InvalidSlice`).
  void read_into(std::span<std::byte> dst) const {
    ::rust::Slice<std::uint8_t> out{reinterpret_cast<std::uint8_t*>(dst.data()), dst.size()};
    detail::call([&] { src_.file->read_slice(*plan_, out); });
  }

 private:
  friend class Slice;
  friend class LoadPlan;  // reads the file and plan a selection came from
  Selection(detail::Source src, Dtype dtype, ::rust::Box<ffi::SlicePlan> plan)
      : src_(std::move(src)), dtype_(dtype), plan_(detail::share(std::move(plan))) {
    auto s = plan_->shape();
    shape_.assign(s.data(), s.data() + s.size());  // not rust::Slice iterators: see detail/bridge.hpp
  }

  detail::Source src_;
  Dtype dtype_;
  std::vector<std::size_t> shape_;
  std::shared_ptr<const ffi::SlicePlan> plan_;
};

/// A tensor to slice, from `SafeOpen::get_slice` or `Checkpoint::get_slice`. Knows its dtype
/// and shape; reads nothing until a selection is read.
///
///   auto shard = f.get_slice("mlp.c_fc.weight");
///   auto cols = shard.select({Index::all(), Index::range(rank * 768, (rank + 1) * 768)});
///   cols.read_into(my_buffer);   // or: TensorView v = cols.read();
class Slice {
 public:
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] Dtype dtype() const { return dtype_; }
  [[nodiscard]] const std::vector<std::size_t>& shape() const { return shape_; }

  /// Plans a selection: at most one `Index` per dimension, missing trailing ones mean `:`.
  /// Throws `InvalidSlice` (too many indices, out of range, step < 1) or `MisalignedSlice`
  /// (a sub-byte dtype cut inside a byte).
  [[nodiscard]] Selection select(std::span<const Index> indices) const {
    std::vector<ffi::SliceIndex> raw;
    raw.reserve(indices.size());
    for (const auto& i : indices) raw.push_back(i.raw());
    ::rust::Slice<const ffi::SliceIndex> r{raw.data(), raw.size()};
    auto plan = detail::call([&] { return src_.file->plan_slice(index_, r); });
    return Selection(src_, dtype_, std::move(plan));
  }
  [[nodiscard]] Selection select(std::initializer_list<Index> indices) const {
    return select(std::span<const Index>(indices.begin(), indices.size()));
  }

 private:
  friend class SafeOpen;
  friend class Checkpoint;
  Slice(detail::Source src, std::string_view name) : src_(std::move(src)), name_(name) {
    auto m = src_.find(name);
    index_ = m.index;
    dtype_ = static_cast<Dtype>(m.dtype);
    shape_ = src_.shape_of(m);
  }

  detail::Source src_;
  std::string name_;
  std::size_t index_ = 0;
  Dtype dtype_{};
  std::vector<std::size_t> shape_;
};

}  // namespace safetensors
