// Private: the definitions behind safetensors/slice.hpp (which includes this at its end, after the
// classes these need): the doors of `Slice` (selecting, reading and converting a selection) and the
// nothrow face of slices and selections.
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
#include "safetensors/slice.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

namespace detail {
template <>
struct Access<Slice> {
  /// The slice of tensor `name` of `src` (`TensorNotFound` when it has none).
  static Expected<Slice> make(OpenFile src, std::string_view name) {
    auto m = src.find(name);
    if (!m) return m.status();
    return Slice(std::move(src), name, *m);
  }

  static Expected<Selection> select(const Slice& s, std::span<const Index> indices) {
    if (!s.src_.owner) return moved_from("Slice");
    for (std::size_t k = 0; k < indices.size(); ++k) {
      if (!Access<Index>::fits(indices[k])) {
        return Status(ErrorKind::InvalidSlice, "index " + std::to_string(k) + " of the slice of `" +
                                                   s.name() +
                                                   "` does not fit in a signed 64-bit integer (above 2^63 - "
                                                   "1, for example SIZE_MAX); its shape is " +
                                                   shape_text(s.shape_));
      }
    }
    if (indices.empty()) return whole(s);
    auto raw = raw_indices(indices);
    if (!raw) return raw.status();
    const ffi::SliceIndices r{raw->data(), raw->size()};
    return select_by(s, [&](const ffi::File& f, std::size_t index, ffi::Status& st) {
      return f.plan_slice(index, r, st);
    });
  }

  /// The whole tensor's selection, its plan made once per slice (see `SliceShared`).
  static Expected<Selection> whole(const Slice& s) {
    if (!s.src_.owner) return moved_from("Slice");
    const SliceShared& sh = *s.shared_;
    if (sh.whole_state.load(std::memory_order_acquire) == 2)
      return Access<Selection>::make(s.src_, name_of(s), s.dtype_, sh.whole);
    auto plan = adopt(attempt([&](ffi::Status& st) {
      return s.src_.file->plan_slice(s.index_, ffi::SliceIndices{nullptr, 0}, st);
    }));
    if (!plan) return plan.status();
    std::shared_ptr<const ffi::SlicePlan> made = share(std::move(*plan));
    int none = 0;
    if (sh.whole_state.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) {
      sh.whole = made;
      sh.whole_state.store(2, std::memory_order_release);
    }
    return Access<Selection>::make(s.src_, name_of(s), s.dtype_, std::move(made));
  }

  /// The slice's name as its selections share it.
  static std::shared_ptr<const std::string> name_of(const Slice& s) {
    return std::shared_ptr<const std::string>(s.shared_, &s.shared_->name);
  }

  /// The selection whose plan `plan_of(file, tensor index, status)` makes (a raw plan the
  /// caller adopts; null on failure): how the tensor-parallel rules select in one bridge call.
  template <class PlanOf>
  static Expected<Selection> select_by(const Slice& s, PlanOf&& plan_of) {
    if (!s.src_.owner) return moved_from("Slice");
    auto plan = adopt(attempt([&](ffi::Status& st) { return plan_of(*s.src_.file, s.index_, st); }));
    if (!plan) return plan.status();
    return Access<Selection>::make(s.src_, name_of(s), s.dtype_, std::move(*plan));
  }
};
}  // namespace detail

inline Expected<Selection> nothrow::select(const Slice& slice, std::span<const Index> indices) {
  return detail::Access<Slice>::select(slice, indices);
}

inline Expected<Selection> nothrow::select(const Slice& slice, std::initializer_list<Index> indices) {
  return detail::Access<Slice>::select(slice, std::span<const Index>(indices.begin(), indices.size()));
}

inline Status nothrow::read_into(const Selection& selection, std::span<std::byte> dst) {
  auto plan = detail::Access<Selection>::plan(selection);
  if (!plan) return plan.status();
  const auto& src = detail::Access<Selection>::open_file(selection);
  if (auto st = src.refuse_overlap_with("read_into", dst); !st.ok()) return st;
  return detail::attempt([&](ffi::Status& st) { src.file->read_slice(**plan, detail::bytes_mut(dst), st); });
}

inline Expected<TensorView> nothrow::read(const Selection& selection) {
  auto plan = detail::Access<Selection>::plan(selection);
  if (!plan) return plan.status();
  TensorView v{selection.dtype(), selection.shape(), {}, {}};
  const std::size_t len = (*plan)->byte_len();
  if (len == 0) return v;
  const auto& src = detail::Access<Selection>::open_file(selection);
  if ((src.mapped || src.direct) && (*plan)->contiguous()) {
    auto bytes = src.bytes_at(static_cast<std::size_t>((*plan)->first_offset()), len, "a slice");
    if (!bytes) return bytes.status();
    v.data = bytes->data;
    v.owner = std::move(bytes->owner);
    return v;
  }
  auto buffer = detail::allocate_bytes(len, "a slice");
  if (!buffer) return buffer.status();
  if (auto st = nothrow::read_into(selection, {buffer->get(), len}); !st.ok()) return st;
  v.data = {buffer->get(), len};
  v.owner = std::move(*buffer);
  return v;
}

inline Status nothrow::read_as(const Selection& selection, Dtype to, std::span<std::byte> dst) {
  // The whole file, not only the selection: `dst` inside a file in memory would be the file
  // changing under its own readers.
  const auto& src = detail::Access<Selection>::open_file(selection);
  if (auto st = src.refuse_overlap_with("read_as", dst); !st.ok()) return st;
  auto view = nothrow::read(selection);
  if (!view) return view.status();
  return nothrow::convert(*view, to, dst);
}

inline Expected<TensorView> nothrow::read_as(const Selection& selection, Dtype to) {
  auto view = nothrow::read(selection);
  if (!view) return view.status();
  return nothrow::convert(*view, to);
}

namespace detail {
/// Tensor `name` of `src` converted to `to` into `dst` (`get_tensor_as` of a file or a
/// checkpoint): `dst` refused when it overlaps the file's memory, as `read_as` refuses it, then
/// the tensor's view converted (straight out of the mapping when mapped).
inline Status get_tensor_as(const OpenFile& src, std::string_view name, Dtype to, std::span<std::byte> dst) {
  if (auto st = src.refuse_overlap_with("get_tensor_as", dst); !st.ok()) return st;
  auto view = src.get_tensor(name);
  if (!view) return view.status();
  return nothrow::convert(*view, to, dst);
}
}  // namespace detail

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
