// libFuzzer target: arbitrary views (dtype, shape, bytes), numbers and output buffers through the
// entry points that take them from a caller: conversion and dequantization, `as<T>()`, DLPack
// export (when dlpack/dlpack.h is on the include path) and the tensor-parallel helpers. Each must
// check a view's bytes against its shape before sizing anything (so a view that lies is never an
// `Io` "cannot allocate"), use checked arithmetic (UBSan aborts on signed overflow), refuse an
// output that overlaps its input without writing it, and succeed only with results the rules
// give, computed here independently in 128 bits. Only safetensors::Error may come out.
// Built by the `fuzz` preset (clang, -fsanitize=fuzzer,address,undefined); see tests/fuzz/run.
#include <safetensors/safetensors.hpp>
#include <safetensors/tensor_parallel.hpp>

#if __has_include(<dlpack/dlpack.h>)
#include <safetensors/dlpack.hpp>
#define SAFETENSORS_FUZZ_DLPACK 1
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

namespace st = safetensors;
using st::Dtype;
using st::ErrorKind;
using u128 = unsigned __int128;

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_views: %s\n", what);
    std::abort();
  }
}

/// The fuzzer's bytes as numbers, dtypes and flags; zeros once they run out.
struct Input {
  const std::uint8_t* p;
  std::size_t n;

  std::uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }
  /// A number of any magnitude: small ones often, and the edges of 64 bits.
  std::uint64_t number() {
    switch (byte() % 6) {
      case 0:
        return byte() % 8;
      case 1:
        return byte();
      case 2:
        return u64() % 65536;
      case 3:
        return std::uint64_t{1} << (byte() % 64);
      case 4:
        return (std::uint64_t{1} << (byte() % 64)) + byte() % 3 - 1;  // around a power of two
      default:
        return u64();
    }
  }
  /// Any dtype value, two past the enumeration included.
  Dtype dtype() { return static_cast<Dtype>(byte() % 24); }
  std::vector<std::size_t> shape(std::size_t max_rank) {
    std::vector<std::size_t> s(byte() % (max_rank + 1));
    for (auto& d : s) d = number();
    return s;
  }
};

/// 128-bit products and sums that stop at the largest value instead of wrapping.
u128 sat_mul(u128 a, u128 b) {
  constexpr u128 most = ~u128{0};
  return a != 0 && b > most / a ? most : a * b;
}
u128 sat_add(u128 a, u128 b) {
  return a + b < a ? ~u128{0} : a + b;
}

bool valid(Dtype d) {
  return static_cast<unsigned>(d) < 22;
}

/// The tensor byte-length rule, independently: dtype × shape bits (the element count multiplied
/// in order, as the core does), or nothing when that overflows 64 bits or ends inside a byte.
std::optional<std::uint64_t> byte_len(Dtype d, const std::vector<std::size_t>& shape) {
  if (!valid(d)) return std::nullopt;
  u128 numel = 1;
  for (auto s : shape) {
    numel *= s;
    if (numel > kMax) return std::nullopt;
  }
  const u128 bits = numel * st::bit_size(d);
  if (bits > kMax || bits % 8 != 0) return std::nullopt;
  return static_cast<std::uint64_t>(bits / 8);
}

bool fits(const st::TensorView& v) {
  auto want = byte_len(v.dtype, v.shape);
  return want && *want == v.data.size();
}

/// A failed call on a view that lies about its bytes: a typed refusal, never an allocation of
/// the claimed size (`Io`) or a defect (`Internal`).
void require_refusal(const st::Status& s, const char* what) {
  require(!s.ok(), what);
  require(s.kind() != ErrorKind::Io && s.kind() != ErrorKind::Internal, what);
}

bool float_target(Dtype d) {
  return valid(d) && st::is_float(d);
}

void conversions(Input& in, std::vector<std::byte>& buf) {
  // A view over part of `buf`, and a destination over another part (overlapping, often).
  const std::size_t at = in.byte() % (buf.size() + 1);
  const std::size_t len = in.number() % (buf.size() - at + 1);
  st::TensorView v{in.dtype(), in.shape(4), std::span<const std::byte>(buf).subspan(at, len)};
  const Dtype to = in.dtype();
  const bool fine = fits(v);

  auto out = st::nothrow::convert(v, to);
  if (out) {
    require(fine && float_target(to) && v.dtype != Dtype::C64,
            "convert succeeded on a view it should refuse");
    require(out->shape == v.shape && byte_len(to, v.shape) == out->data.size(), "convert's result size");
  } else if (!fine) {
    require_refusal(out.status(), "convert of a lying view");
  }
  if (auto f = st::nothrow::as_f32(v); !f) {
    if (!fine) require_refusal(f.status(), "as_f32 of a lying view");
  } else {
    require(fine && byte_len(Dtype::F32, v.shape) == f->size() * 4, "as_f32's result size");
  }

  const std::size_t dst_at = in.byte() % (buf.size() + 1);
  const std::size_t dst_len = in.number() % (buf.size() - dst_at + 1);
  std::span<std::byte> dst = std::span(buf).subspan(dst_at, dst_len);
  const bool overlap = len > 0 && dst_len > 0 && at < dst_at + dst_len && dst_at < at + len;
  const std::vector<std::byte> before = buf;
  auto into = st::nothrow::convert(v, to, dst);
  if (overlap) {
    require(into.kind() == ErrorKind::InvalidSlice, "an overlapping output was not refused");
    require(buf == before, "a refused conversion wrote its output");
  }
  if (into.ok())
    require(fine && byte_len(to, v.shape) == dst.size(), "convert into a buffer of the wrong size");

  auto floats = st::nothrow::as<float>(v);
  if (floats) require(v.dtype == Dtype::F32 && fine && floats->size() * 4 == v.data.size(), "as<float>");
  auto raw = st::nothrow::as<std::byte>(v);
  require(raw && raw->size() == v.data.size(), "as<std::byte>");
}

void dequantizers(Input& in, const std::vector<std::byte>& buf) {
  const auto bytes = std::span<const std::byte>(buf);
  const std::size_t split = in.byte() % (buf.size() + 1);
  st::TensorView weight{in.dtype(), {in.number(), in.number()}, bytes.first(split)};
  st::TensorView scale{Dtype::F32, {in.number(), in.number()}, bytes.subspan(split)};
  auto w = st::nothrow::dequantize_fp8_blocks(weight, scale, Dtype::F32, in.number(), in.number());
  if (w) {
    require(fits(weight) && fits(scale), "fp8 dequantization of lying views");
  } else if (!fits(weight) || !fits(scale)) {
    require_refusal(w.status(), "fp8 dequantization of a lying view");
  }
  st::TensorView blocks{Dtype::U8, in.shape(3), bytes.first(split)};
  blocks.shape.push_back(16);
  std::vector<std::size_t> groups(blocks.shape.begin(), blocks.shape.end() - 1);
  st::TensorView scales{Dtype::U8, groups, bytes.subspan(split)};
  auto m = st::nothrow::dequantize_mxfp4(blocks, scales, Dtype::BF16);
  if (m) {
    require(fits(blocks) && fits(scales), "MXFP4 dequantization of lying views");
  } else if (!fits(blocks) || !fits(scales)) {
    require_refusal(m.status(), "MXFP4 dequantization of a lying view");
  }
}

#if defined(SAFETENSORS_FUZZ_DLPACK)
void dlpack(Input& in, std::span<const std::byte> bytes) {
  st::TensorView v{in.dtype(), in.shape(5), bytes.first(in.number() % (bytes.size() + 1))};
  auto t = st::nothrow::to_dlpack(v);
  // Row-major strides in 128 bits: each must fit int64, as must each dimension.
  bool representable = true;
  std::vector<u128> strides(v.shape.size(), 1);
  for (std::size_t i = v.shape.size(); i-- > 1;) strides[i - 1] = sat_mul(strides[i], v.shape[i]);
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    if (v.shape[i] > INT64_MAX || strides[i] > INT64_MAX) representable = false;
  }
  if (!t) {
    const bool typed = !valid(v.dtype) || !st::nothrow::dlpack_dtype(v.dtype);
    require(!fits(v) || !representable || typed, "to_dlpack refused a view it can export");
    require(t.status().kind() != ErrorKind::Internal, "to_dlpack: Internal");
    return;
  }
  require(fits(v) && representable, "to_dlpack exported a view it should refuse");
  const DLTensor& d = (*t)->dl_tensor;
  require(d.ndim == static_cast<std::int32_t>(v.shape.size()), "to_dlpack: ndim");
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    require(d.shape[i] == static_cast<std::int64_t>(v.shape[i]), "to_dlpack: a dimension");
    require(d.strides[i] == static_cast<std::int64_t>(strides[i]), "to_dlpack: a stride");
  }
  require((d.data == nullptr) == v.data.empty(), "to_dlpack: the data pointer");
}
#endif

/// Rows a projection of `g` has: q, k or v alone, or the three fused (`part` 3), in 128 bits.
u128 rows_of(const st::Gqa& g, int part) {
  const u128 q = sat_mul(g.heads, g.head_dim);
  const u128 kv = sat_mul(g.kv_heads, g.head_dim);
  return part == 0 ? q : part < 3 ? kv : sat_add(q, sat_mul(2, kv));
}

void tensor_parallel(Input& in) {
  // A U8 [rows, cols] tensor in a file in memory.
  const std::size_t rows = in.number() % 4097;
  const std::size_t cols = 1 + in.byte() % 3;
  std::vector<std::byte> zeros(rows * cols);
  auto file = st::nothrow::serialize({{"w", st::TensorView{Dtype::U8, {rows, cols}, zeros}}});
  require(static_cast<bool>(file), "serialize");
  auto f = st::nothrow::from_bytes_copy(*file);
  require(static_cast<bool>(f), "from_bytes_copy");
  auto slice = f->get_slice("w");
  const auto begin = f->info("w").data_offsets.first;
  const std::size_t rank = in.number();
  const std::size_t world = in.number();
  const st::Gqa g{in.number(), in.number(), in.number()};
  auto inside = [&](const st::Selection& s) {
    require(s.shape().size() <= 2 && s.byte_size() <= rows * cols, "a share larger than its tensor");
    for (const auto& r : s.runs()) {
      require(r.offset >= begin && r.offset - begin <= rows * cols &&
                  r.length <= rows * cols - (r.offset - begin),
              "a share's run outside its tensor");
    }
  };
  try {
    const std::size_t dim = in.byte() % 3;
    inside(st::shard(slice, dim, rank, world, in.byte() % 2 ? st::Split::Uneven : st::Split::Even));
    require(world > 0 && rank < world && dim < 2, "shard accepted a rank, world or dimension");
  } catch (const st::Error& e) {
    require(e.kind() == ErrorKind::InvalidSlice, "shard: not InvalidSlice");
  }
  try {
    const int part = in.byte() % 3;
    inside(st::attention_shard(slice, g, static_cast<st::Projection>(part), rank, world));
    require(rows_of(g, part) == rows, "attention_shard accepted a geometry that is not the tensor's");
  } catch (const st::Error& e) {
    require(e.kind() == ErrorKind::InvalidSlice, "attention_shard: not InvalidSlice");
  }
  try {
    auto [q, k, v] = st::qkv_shard(slice, g, rank, world);
    inside(q);
    inside(k);
    inside(v);
    require(rows_of(g, 3) == rows, "qkv_shard accepted a geometry that is not the tensor's");
  } catch (const st::Error& e) {
    require(e.kind() == ErrorKind::InvalidSlice, "qkv_shard: not InvalidSlice");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in{data, size};
  // The tail of the input is the bytes the views hold (a copy: the outputs write into it).
  const std::size_t keep = size < 4096 ? size / 2 : 2048;
  std::vector<std::byte> buf(size - keep);
  if (!buf.empty()) std::memcpy(buf.data(), data + keep, buf.size());
  in.n = keep;
  try {
    switch (in.byte() % 4) {
      case 0:
        conversions(in, buf);
        break;
      case 1:
        dequantizers(in, buf);
        break;
      case 2:
#if defined(SAFETENSORS_FUZZ_DLPACK)
        dlpack(in, buf);
#endif
        break;
      default:
        tensor_parallel(in);
        break;
    }
  } catch (const st::Error&) {
    // The throwing faces may refuse; the nothrow ones are checked above.
  }
  return 0;
}
