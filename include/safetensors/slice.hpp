// Slicing tensors without reading what is not selected: for tensor parallelism.
#pragma once

#include "safetensors/abi.hpp"

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "safetensors/convert.hpp"
#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/open_file.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

class LoadPlan;  // include/safetensors/distributed.hpp
class Selection;
class Slice;
class Index;

namespace nothrow {
/// `Slice::select` without exceptions.
[[nodiscard]] Expected<Selection> select(const Slice& slice, std::span<const Index> indices);
[[nodiscard]] Expected<Selection> select(const Slice& slice, std::initializer_list<Index> indices);
/// `Selection::read` without exceptions.
[[nodiscard]] Expected<TensorView> read(const Selection& selection);
/// `Selection::read_into` without exceptions.
Status read_into(const Selection& selection, std::span<std::byte> dst);
/// `Selection::read_as` without exceptions.
Status read_as(const Selection& selection, Dtype to, std::span<std::byte> dst);
[[nodiscard]] Expected<TensorView> read_as(const Selection& selection, Dtype to);
}  // namespace nothrow

/// What to take along one dimension, as in Python: an integer selects one position and drops
/// the dimension (`a[3]`); `Index::all()` is `:`; `Index::range(start, stop, step)` is
/// `start:stop:step`. Negative positions count from the end. Positions out of range are errors,
/// never clamped; `start >= stop` is an empty range; the step must be at least 1. Any integer
/// type is taken; a value outside the signed 64-bit range (`SIZE_MAX`, say) is `InvalidSlice`
/// when selecting, never wrapped to a negative position.
class Index {
 public:
  /// A bound or step of `range`: an integer, or open (`{}` or `std::nullopt`).
  class Bound {
   public:
    Bound() = default;
    Bound(std::nullopt_t) {}  // NOLINT: implicit, like std::optional
    template <std::integral I>
    Bound(I v) : set_(true) {     // NOLINT
      value_ = to_i64(v, fits_);  // in the body: `fits_` is initialised after `value_`
    }
    template <std::integral I>
    Bound(std::optional<I> v) {  // NOLINT
      if (v) *this = Bound(*v);
    }

   private:
    friend class Index;
    std::int64_t value_ = 0;
    bool set_ = false;
    bool fits_ = true;
  };

  /// Select one position (the dimension disappears from the result). Implicit, so that a
  /// plain integer reads like Python: `select({3, Index::all()})`.
  template <std::integral I>
  Index(I position) {                  // NOLINT
    start_ = to_i64(position, fits_);  // in the body: `fits_` is initialised after `start_`
  }

  /// The whole dimension, `:`.
  static Index all() { return range({}, {}); }

  /// `start:stop:step`; an open bound (`{}` or `std::nullopt`) leaves it open (`range(2, {})`
  /// is `2:`); an open step is 1.
  static Index range(Bound start, Bound stop, Bound step = 1) {
    Index i(0);
    i.kind_ = 1;
    i.start_ = start.value_;
    i.stop_ = stop.value_;
    i.has_start_ = start.set_;
    i.has_stop_ = stop.set_;
    i.step_ = step.set_ ? step.value_ : 1;
    i.fits_ = start.fits_ && stop.fits_ && step.fits_;
    return i;
  }

 private:
  friend struct detail::Access<Index>;

  /// `v` as a signed 64-bit value; `fits` false (and the value 0) when it has none.
  template <std::integral I>
  static std::int64_t to_i64(I v, bool& fits) {
    if constexpr (std::numeric_limits<I>::digits > 63) {
      if (v > static_cast<I>(std::numeric_limits<std::int64_t>::max())) {
        fits = false;
        return 0;
      }
      if constexpr (std::is_signed_v<I>) {
        if (v < static_cast<I>(std::numeric_limits<std::int64_t>::min())) {
          fits = false;
          return 0;
        }
      }
    }
    return static_cast<std::int64_t>(v);
  }

  /// The bridge's form; `InvalidSlice` for a value that did not fit (checked here, so that
  /// every path to the bridge, the CUDA uploader's included, refuses it).
  [[nodiscard]] Expected<ffi::SliceIndex> raw() const {
    if (!fits_) {
      return Status(ErrorKind::InvalidSlice,
                    "a slice position, bound or step does not fit in a signed 64-bit integer (above "
                    "2^63 - 1, for example SIZE_MAX); positions must lie inside the tensor");
    }
    return ffi::SliceIndex{static_cast<ffi::SliceKind>(kind_), start_, stop_, step_, has_start_, has_stop_};
  }

  std::uint8_t kind_ = 0;
  std::int64_t start_ = 0;
  std::int64_t stop_ = 0;
  std::int64_t step_ = 1;
  bool has_start_ = false;
  bool has_stop_ = false;
  bool fits_ = true;
};

namespace detail {
template <>
struct Access<Index> {
  static Expected<ffi::SliceIndex> raw(const Index& i) { return i.raw(); }
  static bool fits(const Index& i) { return i.fits_; }
};

/// Every index of a selection in the bridge's form; `InvalidSlice` naming the first that does
/// not fit in 64 bits.
inline Expected<std::vector<ffi::SliceIndex>> raw_indices(std::span<const Index> indices) {
  std::vector<ffi::SliceIndex> raw;
  raw.reserve(indices.size());
  for (const auto& i : indices) {
    auto r = Access<Index>::raw(i);
    if (!r) return r.status();
    raw.push_back(*r);
  }
  return raw;
}

/// A name held by a slice and its selections together; "" for a moved-from one.
inline const std::string& shared_name(const std::shared_ptr<const std::string>& name) {
  static const std::string none;
  return name ? *name : none;
}

/// What a slice and its copies share: the tensor's name (shared on with every selection) and
/// the whole tensor's selection plan, made on the first `select({})` and shared by every later
/// one, since a tensor-parallel plan selects each replicated tensor whole once per rank. The
/// first thread to finish making it keeps it (`whole_state`: 0 none, 1 being kept, 2 kept);
/// a thread that finds it being kept uses the plan it made itself. Nothing waits.
struct SliceShared {
  explicit SliceShared(std::string_view n) : name(n) {}
  std::string name;
  mutable std::atomic<int> whole_state{0};
  mutable std::shared_ptr<const ffi::SlicePlan> whole;
};
}  // namespace detail

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
  /// The tensor this selects from.
  [[nodiscard]] const std::string& name() const { return detail::shared_name(name_); }
  /// Bytes in the result.
  [[nodiscard]] std::size_t byte_size() const { return plan().byte_len(); }

  /// The runs to read, in result order; runs that touch are merged, so consecutive runs leave
  /// a gap. A GPU path can read exactly these bytes. A strided selection has a run per element:
  /// more runs than memory holds is an `Io` error.
  [[nodiscard]] std::vector<ByteRun> runs() const {
    const auto count = detail::attempt([&](ffi::Status& st) { return plan().run_count(st); }).value();
    auto out =
        detail::checked_vector<ByteRun>(count, "a selection's runs", "walk a smaller selection").value();
    // The core writes the runs straight into `out`: the two run types are laid out alike.
    static_assert(std::is_standard_layout_v<ByteRun> && std::is_trivially_copyable_v<ByteRun> &&
                  sizeof(ByteRun) == sizeof(ffi::ByteRun) && alignof(ByteRun) == alignof(ffi::ByteRun) &&
                  offsetof(ByteRun, offset) == offsetof(ffi::ByteRun, offset) &&
                  offsetof(ByteRun, length) == offsetof(ffi::ByteRun, length) &&
                  sizeof(std::size_t) == sizeof(std::uint64_t));
    ffi::ByteRunsMut room{reinterpret_cast<ffi::ByteRun*>(out.data()), out.size()};
    detail::attempt([&](ffi::Status& st) { plan().write_runs(room, st); }).throw_if_error();
    return out;
  }

  /// The selected elements as one contiguous tensor. A selection that is a single run of a
  /// mapped file is returned without copying; with the direct backend, a single run of at least
  /// one block is read straight from the disk into an aligned buffer the view owns (as
  /// `get_tensor` does); otherwise the bytes are copied into a new buffer owned by the view.
  /// Only the selected bytes are read.
  [[nodiscard]] TensorView read() const { return nothrow::read(*this).value(); }

  /// Reads the selection and converts it to `to` in one step (see `safetensors::convert`):
  /// `dst` holds exactly numel × size(to) bytes. A selection that is one run of a mapped file
  /// is converted straight out of the mapping, without an intermediate copy.
  ///
  ///   std::vector<float> part(cols.numel());
  ///   cols.read_as(Dtype::F32, std::as_writable_bytes(std::span(part)));
  void read_as(Dtype to, std::span<std::byte> dst) const {
    nothrow::read_as(*this, to, dst).throw_if_error();
  }

  /// The selection converted to `to`, in a buffer the returned view owns.
  [[nodiscard]] TensorView read_as(Dtype to) const { return nothrow::read_as(*this, to).value(); }

  /// Number of elements in the selection.
  [[nodiscard]] std::size_t numel() const { return detail::element_count(shape_); }

  /// Copies the selected bytes, contiguous and in row-major order, into `dst`, which must hold
  /// exactly `byte_size()` bytes (else `InvalidSlice`).
  void read_into(std::span<std::byte> dst) const { nothrow::read_into(*this, dst).throw_if_error(); }

 private:
  friend struct detail::Access<Selection>;
  friend class LoadPlan;  // reads the file and plan a selection came from

  Selection(detail::OpenFile src, std::shared_ptr<const std::string> name, Dtype dtype,
            std::shared_ptr<const ffi::SlicePlan> plan)
      : src_(std::move(src)), name_(std::move(name)), dtype_(dtype), plan_(std::move(plan)) {
    auto s = plan_->shape();
    shape_.assign(s.data, s.data + s.len);
  }

  /// The plan; a moved-from Selection reports `Internal` the throwing way.
  [[nodiscard]] const ffi::SlicePlan& plan() const {
    if (!plan_) detail::moved_from("Selection").throw_if_error();
    return *plan_;
  }

  detail::OpenFile src_;
  /// Shared with the slice and every other selection of it: a plan over many ranks makes one
  /// selection of each tensor per rank.
  std::shared_ptr<const std::string> name_;
  Dtype dtype_;
  std::vector<std::size_t> shape_;
  std::shared_ptr<const ffi::SlicePlan> plan_;
};

namespace detail {
template <>
struct Access<Selection> {
  static Selection make(OpenFile src, std::shared_ptr<const std::string> name, Dtype dtype,
                        ::rust::Box<ffi::SlicePlan> plan) {
    return Selection(std::move(src), std::move(name), dtype, share(std::move(plan)));
  }
  /// A selection sharing a plan another selection holds too.
  static Selection make(OpenFile src, std::shared_ptr<const std::string> name, Dtype dtype,
                        std::shared_ptr<const ffi::SlicePlan> plan) {
    return Selection(std::move(src), std::move(name), dtype, std::move(plan));
  }
  static const OpenFile& open_file(const Selection& s) { return s.src_; }
  /// The name as the selection shares it (null for a moved-from one).
  static const std::shared_ptr<const std::string>& shared_name(const Selection& s) { return s.name_; }
  /// The plan as the selection shares it (null for a moved-from one).
  static const std::shared_ptr<const ffi::SlicePlan>& shared_plan(const Selection& s) { return s.plan_; }
  /// The plan, or `Internal` for a moved-from Selection.
  static Expected<const ffi::SlicePlan*> plan(const Selection& s) {
    if (!s.plan_) return moved_from("Selection");
    return s.plan_.get();
  }
};
}  // namespace detail

/// A tensor to slice, from `SafeOpen::get_slice` or `Checkpoint::get_slice`. Knows its dtype
/// and shape; reads nothing until a selection is read.
///
///   auto shard = f.get_slice("mlp.c_fc.weight");
///   auto cols = shard.select({Index::all(), Index::range(rank * 768, (rank + 1) * 768)});
///   cols.read_into(my_buffer);   // or: TensorView v = cols.read();
class Slice {
 public:
  [[nodiscard]] const std::string& name() const {
    static const std::string none;
    return shared_ ? shared_->name : none;
  }
  [[nodiscard]] Dtype dtype() const { return dtype_; }
  [[nodiscard]] const std::vector<std::size_t>& shape() const { return shape_; }

  /// Plans a selection: at most one `Index` per dimension, missing trailing ones mean `:`.
  /// Throws `InvalidSlice` (too many indices, out of range, step < 1) or `MisalignedSlice`
  /// (a sub-byte dtype cut inside a byte).
  [[nodiscard]] Selection select(std::span<const Index> indices) const {
    return nothrow::select(*this, indices).value();
  }
  [[nodiscard]] Selection select(std::initializer_list<Index> indices) const {
    return nothrow::select(*this, indices).value();
  }

  /// The whole tensor converted to `to` into `dst` (numel × size(to) bytes): a fused read and
  /// `safetensors::convert`, with no intermediate copy for a mapped file.
  void read_as(Dtype to, std::span<std::byte> dst) const { select({}).read_as(to, dst); }

 private:
  friend struct detail::Access<Slice>;
  Slice(detail::OpenFile src, std::string_view name, const ffi::TensorMeta& m)
      : src_(std::move(src)),
        shared_(std::make_shared<const detail::SliceShared>(name)),
        index_(m.index),
        dtype_(static_cast<Dtype>(m.dtype)),
        shape_(src_.shape_of(m)) {}

  detail::OpenFile src_;
  std::shared_ptr<const detail::SliceShared> shared_;  // its name shared with its selections
  std::size_t index_ = 0;
  Dtype dtype_{};
  std::vector<std::size_t> shape_;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

// The private doors and the nothrow definitions (after the classes they need).
#include "safetensors/detail/slice_impl.hpp"
