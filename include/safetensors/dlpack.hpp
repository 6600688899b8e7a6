// Export tensors as DLPack tensors (the versioned ABI, `DLManagedTensorVersioned`, DLPack >= 1.0;
// and for host views the unversioned `DLManagedTensor`, which libtorch before 2.9 reads), so that
// NumPy, PyTorch, JAX, CuPy, TVM or any DLPack consumer can borrow them without a copy.
//
// Not included by <safetensors/safetensors.hpp>: include this header where you have DLPack's own
// `dlpack/dlpack.h` on the include path (TVM, CuPy and the `apache-tvm-ffi` Python package ship
// it; our tests use the last), or after libtorch's `ATen/DLConvertor.h`, which brings its copy.
// We use the consumer's header rather than defining the structs ourselves, so that both can be
// included in one program.
//
//   safetensors::DLPackTensor t = safetensors::to_dlpack(view);   // owns one reference
//   consumer_takes_ownership(t.release());                        // the consumer calls the deleter
//
// Device tensors (from `cuda::load`, `cuda::to_device`, an `Uploader`) export too, as `kDLCUDA`
// tensors whose deleter keeps the device allocation alive.
//
// Facts from the DLPack specification (dlpack.h, v1.3): strides are given in elements and may not
// be NULL when ndim != 0 from v1.2 on; a zero-size tensor has a NULL data pointer; sub-byte types
// (fp4, fp6) are packed little bit-endian, element i at bits [i*bits, (i+1)*bits), which is how
// the format's F4 tensors are laid out in practice (element 0 in the low nibble); the fp8, fp6 and
// fp4 type codes exist from DLPack v1.1.
#pragma once

#include "safetensors/abi.hpp"

// DLPack's header, unless one is included already: libtorch ships its copy as ATen/dlpack.h
// (under DLPack's own include guard), so including <ATen/DLConvertor.h> first is enough there.
#if !defined(DLPACK_DLPACK_H_)
#include <dlpack/dlpack.h>
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/cuda.hpp"
#include "safetensors/detail/extent.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/tensor.hpp"

static_assert(DLPACK_MAJOR_VERSION >= 1,
              "safetensors/dlpack.hpp needs DLPack 1.0 or later (DLManagedTensorVersioned)");

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// Whether the DLPack header in use has type codes for the fp8, fp6 and fp4 formats (v1.1+).
inline constexpr bool dlpack_has_narrow_floats = DLPACK_MAJOR_VERSION > 1 ||
                                                 (DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION >= 1);

namespace nothrow {
/// `safetensors::dlpack_dtype` without exceptions.
[[nodiscard]] inline Expected<DLDataType> dlpack_dtype(Dtype dtype) {
  using enum Dtype;
  auto type = [](auto code, std::size_t bits) {
    return DLDataType{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
  };
  switch (dtype) {
    case BOOL:
      return type(kDLBool, 8);
    case U8:
    case U16:
    case U32:
    case U64:
      return type(kDLUInt, bit_size(dtype));
    case I8:
    case I16:
    case I32:
    case I64:
      return type(kDLInt, bit_size(dtype));
    case F16:
    case F32:
    case F64:
      return type(kDLFloat, bit_size(dtype));
    case BF16:
      return type(kDLBfloat, 16);
    case C64:
      return type(kDLComplex, 64);
    default:
      break;
  }
#if DLPACK_MAJOR_VERSION > 1 || (DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION >= 1)
  // The format's names follow ml_dtypes/PyTorch: F8_E4M3 is e4m3fn (no infinities), F8_E8M0 is
  // e8m0fnu (unsigned, no zero), F4 is e2m1fn.
  switch (dtype) {
    case F8_E4M3:
      return type(kDLFloat8_e4m3fn, 8);
    case F8_E5M2:
      return type(kDLFloat8_e5m2, 8);
    case F8_E4M3FNUZ:
      return type(kDLFloat8_e4m3fnuz, 8);
    case F8_E5M2FNUZ:
      return type(kDLFloat8_e5m2fnuz, 8);
    case F8_E8M0:
      return type(kDLFloat8_e8m0fnu, 8);
    case F6_E2M3:
      return type(kDLFloat6_e2m3fn, 6);
    case F6_E3M2:
      return type(kDLFloat6_e3m2fn, 6);
    case F4:
      return type(kDLFloat4_e2m1fn, 4);
    default:
      break;
  }
#endif
  return Status(ErrorKind::TypeMismatch, "DLPack " + std::to_string(DLPACK_MAJOR_VERSION) + "." +
                                             std::to_string(DLPACK_MINOR_VERSION) + " has no type for " +
                                             std::string(to_string(dtype)) +
                                             " (its fp8, fp6 and fp4 codes came in DLPack 1.1)");
}

}  // namespace nothrow

/// The DLPack type of a dtype. Throws `Error` (`TypeMismatch`) for a dtype the DLPack version in
/// use cannot express (the fp8/fp6/fp4 types before DLPack 1.1).
///
///   DLDataType t = safetensors::dlpack_dtype(Dtype::BF16);   // {kDLBfloat, 16, 1}
[[nodiscard]] inline DLDataType dlpack_dtype(Dtype dtype) {
  return nothrow::dlpack_dtype(dtype).value();
}

/// Calls a DLPack tensor's deleter: what a `DLPackTensor` does when it is destroyed.
struct DLPackDeleter {
  void operator()(DLManagedTensorVersioned* t) const noexcept {
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
};

/// A DLPack tensor this program still owns; `release()` hands it to a consumer, which must call
/// its deleter exactly once.
using DLPackTensor = std::unique_ptr<DLManagedTensorVersioned, DLPackDeleter>;

namespace detail {
/// What a DLPack tensor's `manager_ctx` holds: the DLPack struct itself, the arrays it points to,
/// and whatever keeps the bytes alive.
struct DLPackExport {
  DLManagedTensorVersioned managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::shared_ptr<const void> owner;
};

/// Why `bytes` cannot hold a tensor of `dtype` and `shape`, if so: checked so that a bogus view or
/// placement cannot lie to a consumer. The size is the core's tensor byte-length rule
/// (`check_extent`); an element count that overflows is `ValidationOverflow` (and a dtype value
/// outside `Dtype` is `TypeMismatch`), any other disagreement (bytes missing or left over,
/// sub-byte elements that end inside a byte) `TensorInvalidInfo`. `what` names the tensor.
inline Status extent_error(Dtype dtype, const std::vector<std::size_t>& shape, std::size_t bytes,
                           std::string_view what) {
  auto bad = check_extent(what, dtype, shape, bytes);
  if (bad.kind() == ErrorKind::MisalignedSlice) return Status(ErrorKind::TensorInvalidInfo, bad.message());
  return bad;
}

/// Compact row-major strides of `shape`, in elements, as DLPack's `int64_t`. A zero-size tensor
/// may have dimensions whose products pass 2^63 (`[0, 2^40, 2^40]` of U8 is a valid tensor of no
/// bytes), and no consumer could index such strides: `ValidationOverflow`, rather than a wrapped
/// (and, signed, undefined) product.
inline Status dlpack_strides(const std::vector<std::int64_t>& shape, std::vector<std::int64_t>& strides,
                             std::string_view what) {
  strides.assign(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) {
    if (shape[i] != 0 && strides[i] > INT64_MAX / shape[i]) {
      return Status(ErrorKind::ValidationOverflow,
                    std::string(what) + " has shape " +
                        shape_text(std::vector<std::size_t>(shape.begin(), shape.end())) +
                        ", whose row-major strides do not fit DLPack's int64; such a tensor (it holds no "
                        "bytes) cannot be exported");
    }
    strides[i - 1] = strides[i] * shape[i];
  }
  return {};
}

/// Fills everything but the data pointer, device and flags; `shape` is in elements.
inline Expected<std::unique_ptr<DLPackExport>> dlpack_export(Dtype dtype,
                                                             const std::vector<std::size_t>& shape,
                                                             std::shared_ptr<const void> owner,
                                                             std::string_view what) {
  auto type = nothrow::dlpack_dtype(dtype);
  if (!type) return type.status();
  auto out = std::make_unique<DLPackExport>();
  out->shape.reserve(shape.size());
  for (auto d : shape) {
    if (d > static_cast<std::size_t>(INT64_MAX)) {
      return Status(ErrorKind::ValidationOverflow,
                    "a dimension of " + std::to_string(d) + " does not fit DLPack's int64");
    }
    out->shape.push_back(static_cast<std::int64_t>(d));
  }
  // Compact row-major strides, in elements (DLPack 1.2+ requires them whenever ndim > 0).
  if (auto bad = dlpack_strides(out->shape, out->strides, what); !bad.ok()) return bad;
  out->owner = std::move(owner);
  DLManagedTensorVersioned& m = out->managed;
  m.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  m.manager_ctx = out.get();
  m.deleter = [](DLManagedTensorVersioned* self) { delete static_cast<DLPackExport*>(self->manager_ctx); };
  m.dl_tensor.ndim = static_cast<std::int32_t>(shape.size());
  m.dl_tensor.dtype = *type;
  m.dl_tensor.shape = out->shape.empty() ? nullptr : out->shape.data();
  m.dl_tensor.strides = out->strides.empty() ? nullptr : out->strides.data();
  m.dl_tensor.byte_offset = 0;
  return out;
}
}  // namespace detail

namespace nothrow {
/// `safetensors::to_dlpack` without exceptions.
[[nodiscard]] inline Expected<DLPackTensor> to_dlpack(const TensorView& view) {
  if (auto bad = detail::extent_error(view.dtype, view.shape, view.data.size(), "the view"); !bad.ok()) {
    return bad;
  }
  auto out = detail::dlpack_export(view.dtype, view.shape, view.owner, "the view");
  if (!out) return out.status();
  DLTensor& t = (*out)->managed.dl_tensor;
  t.data = view.data.empty() ? nullptr : const_cast<std::byte*>(view.data.data());
  t.device = DLDevice{kDLCPU, 0};
  (*out)->managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  return DLPackTensor(&out->release()->managed);
}

/// `to_dlpack(tensors, name)` without exceptions.
[[nodiscard]] Expected<DLPackTensor> to_dlpack(std::shared_ptr<const cuda::DeviceTensors> tensors,
                                               std::string_view name);
/// `to_dlpack(std::move(tensor))` without exceptions.
[[nodiscard]] Expected<DLPackTensor> to_dlpack(cuda::DeviceTensor&& tensor);
}  // namespace nothrow

namespace detail {
/// A `kDLCUDA` tensor of `dtype` and `shape` at device address `address` (`bytes` long) of
/// `device`, whose deleter releases `owner`, which keeps the allocation alive. DLPack asks for
/// a data pointer aligned to 256 bytes, with `byte_offset` pointing to the first element: so the
/// address is split into the 256-byte boundary below it and the rest.
inline Expected<DLPackTensor> dlpack_device_export(Dtype dtype, const std::vector<std::size_t>& shape,
                                                   void* address, std::size_t bytes, int device,
                                                   std::shared_ptr<const void> owner, std::string_view what) {
  if (auto bad = extent_error(dtype, shape, bytes, what); !bad.ok()) return bad;
  auto out = dlpack_export(dtype, shape, std::move(owner), what);
  if (!out) return out.status();
  DLTensor& t = (*out)->managed.dl_tensor;
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  t.data = bytes == 0 ? nullptr : reinterpret_cast<void*>(at - at % 256);
  t.byte_offset = bytes == 0 ? 0 : at % 256;
  t.device = DLDevice{kDLCUDA, device};
  (*out)->managed.flags = 0;  // device memory the program owns: writable
  return DLPackTensor(&out->release()->managed);
}
}  // namespace detail

inline Expected<DLPackTensor> nothrow::to_dlpack(std::shared_ptr<const cuda::DeviceTensors> tensors,
                                                 std::string_view name) {
  if (!tensors) return Status(ErrorKind::Internal, "to_dlpack: no DeviceTensors (a null shared_ptr)");
  auto address = nothrow::cuda::data(*tensors, name);  // TensorNotFound, or Internal once released
  if (!address) return address.status();
  const auto& p = tensors->at(name);
  const int device = tensors->buffer().device();
  return detail::dlpack_device_export(p.dtype, p.shape, *address, p.byte_size, device, std::move(tensors),
                                      "device tensor `" + std::string(name) + "`");
}

inline Expected<DLPackTensor> nothrow::to_dlpack(cuda::DeviceTensor&& tensor) {
  if (tensor.buffer.data() == nullptr) {  // every upload allocates at least one byte
    return Status(
        ErrorKind::Internal,
        "to_dlpack: this DeviceTensor holds no device memory (its buffer was released or moved away)");
  }
  // Checked before the buffer moves: a refused export leaves the caller's tensor as it was.
  if (auto bad = detail::extent_error(tensor.dtype, tensor.shape, tensor.buffer.size(), "the device tensor");
      !bad.ok()) {
    return bad;
  }
  if (auto type = nothrow::dlpack_dtype(tensor.dtype); !type) return type.status();
  void* address = tensor.buffer.data();
  const std::size_t bytes = tensor.buffer.size();
  const int device = tensor.buffer.device();
  auto owner = std::make_shared<safetensors::cuda::DeviceBuffer>(std::move(tensor.buffer));
  return detail::dlpack_device_export(tensor.dtype, tensor.shape, address, bytes, device, std::move(owner),
                                      "the device tensor");
}

/// Exports a view (CPU memory) as a DLPack tensor that keeps the view's bytes alive (its `owner`:
/// the mapped file or the view's own buffer) until the consumer calls the deleter. The tensor is
/// marked read-only: views are read-only, and a mapped file's pages must never be written. A view
/// over your own memory (`owner` empty) borrows it: keep that memory alive as long as the consumer
/// may use it. Throws `TypeMismatch` for a dtype DLPack cannot express, and `TensorInvalidInfo`
/// when the view's byte count disagrees with its dtype and shape.
///
///   auto t = safetensors::to_dlpack(f.get_tensor("wte.weight"));
[[nodiscard]] inline DLPackTensor to_dlpack(const TensorView& view) {
  return nothrow::to_dlpack(view).value();
}

/// Calls an unversioned DLPack tensor's deleter: what a `DLPackUnversionedTensor` does when it is
/// destroyed.
struct DLPackUnversionedDeleter {
  void operator()(DLManagedTensor* t) const noexcept {
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
};

/// An unversioned DLPack tensor (`DLManagedTensor`, the ABI before DLPack 1.0) this program still
/// owns; `release()` hands it to a consumer, which must call its deleter exactly once.
using DLPackUnversionedTensor = std::unique_ptr<DLManagedTensor, DLPackUnversionedDeleter>;

namespace detail {
/// What an unversioned DLPack tensor's `manager_ctx` holds, as `DLPackExport` for the versioned.
struct DLPackUnversionedExport {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::shared_ptr<const void> owner;
};
}  // namespace detail

namespace nothrow {
/// `safetensors::to_dlpack_unversioned` without exceptions.
[[nodiscard]] inline Expected<DLPackUnversionedTensor> to_dlpack_unversioned(const TensorView& view) {
  // The versioned export makes every check and every array once; its parts move over.
  auto versioned = nothrow::to_dlpack(view);
  if (!versioned) return versioned.status();
  auto* from = static_cast<detail::DLPackExport*>((*versioned)->manager_ctx);
  auto out = std::make_unique<detail::DLPackUnversionedExport>();
  out->shape = std::move(from->shape);
  out->strides = std::move(from->strides);
  out->owner = std::move(from->owner);
  DLManagedTensor& m = out->managed;
  m.dl_tensor = from->managed.dl_tensor;
  m.dl_tensor.shape = out->shape.empty() ? nullptr : out->shape.data();
  m.dl_tensor.strides = out->strides.empty() ? nullptr : out->strides.data();
  m.manager_ctx = out.get();
  m.deleter = [](DLManagedTensor* self) {
    delete static_cast<detail::DLPackUnversionedExport*>(self->manager_ctx);
  };
  return DLPackUnversionedTensor(&out.release()->managed);
}
}  // namespace nothrow

/// Exports a view (CPU memory) as an unversioned DLPack tensor (`DLManagedTensor`), for consumers
/// that read only the ABI before DLPack 1.0: libtorch before 2.9 (`at::fromDLPack`), older
/// NumPy, CuPy and TVM. Everything else is as `to_dlpack`: the deleter keeps the view's bytes
/// alive, the strides are explicit, the checks the same. One difference the old ABI imposes: it
/// has no read-only flag, so the consumer cannot be told that the bytes must not be written.
/// A mapped file's pages are read-only (writing them faults, `SIGSEGV`): copy the tensor on the
/// consumer's side before writing to it (`at::fromDLPack(t).clone()`).
///
///   consumer_takes_ownership(safetensors::to_dlpack_unversioned(f.get_tensor("wte.weight")).release());
[[nodiscard]] inline DLPackUnversionedTensor to_dlpack_unversioned(const TensorView& view) {
  return nothrow::to_dlpack_unversioned(view).value();
}

/// Exports tensor `name` of an upload as a `kDLCUDA` DLPack tensor on the upload's device. The
/// DLPack tensor shares ownership of the whole allocation: it stays valid after `tensors` and
/// every other reference are gone, until the consumer calls the deleter (export as many tensors
/// as you like; the allocation is freed after the last deleter). Device memory is writable, so
/// the read-only flag is not set. Throws `TensorNotFound` for a tensor the upload lacks,
/// `Internal` for tensors whose buffer was released.
///
///   auto all = std::make_shared<safetensors::cuda::DeviceTensors>(safetensors::cuda::load(f));
///   consumer_takes_ownership(safetensors::to_dlpack(all, "wte.weight").release());
[[nodiscard]] inline DLPackTensor to_dlpack(std::shared_ptr<const cuda::DeviceTensors> tensors,
                                            std::string_view name) {
  return nothrow::to_dlpack(std::move(tensors), name).value();
}

/// Exports a single uploaded tensor (`cuda::to_device`) as a `kDLCUDA` DLPack tensor that takes
/// over its allocation: the deleter frees it.
///
///   consumer_takes_ownership(safetensors::to_dlpack(safetensors::cuda::to_device(f, "w")).release());
[[nodiscard]] inline DLPackTensor to_dlpack(cuda::DeviceTensor&& tensor) {
  return nothrow::to_dlpack(std::move(tensor)).value();
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
