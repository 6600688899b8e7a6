// The parity test's vocabulary: what one operation gave (an Outcome), how each API's run of it
// is recorded (via_c for the C API, safetensors.h; via_cxx for the C++ API), how a C status code
// maps to safetensors::ErrorKind, and the operations' inputs in a neutral form that each API's
// half turns into its own types (a selection, a tensor to write).
//
// Every comparison requires the same kind, the same message and the same bytes: both APIs are
// faces of one core, so any difference is a rule that one face decides for itself.
#pragma once

#include <safetensors.h>

#include <gtest/gtest.h>
#include <safetensors/safetensors.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace parity {

namespace st = safetensors;
namespace fs = std::filesystem;

/// What one operation (or a sequence of them) gave: "OK" or the kind of the error that ended
/// it, its message, and the transcript of everything it produced before (names, shapes, bytes,
/// the outcomes of inner steps).
struct Outcome {
  std::string kind = "OK";
  std::string message;
  std::string value;
  bool operator==(const Outcome&) const = default;
};

/// For gtest's messages: the transcript with bytes that are not printable as escapes.
inline void PrintTo(const Outcome& o, std::ostream* os) {
  *os << o.kind;
  if (!o.message.empty()) *os << " [" << o.message << "]";
  *os << " value (" << o.value.size() << " bytes): ";
  static const char* hex = "0123456789abcdef";
  for (std::size_t i = 0; i < o.value.size() && i < 600; ++i) {
    auto c = static_cast<unsigned char>(o.value[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      *os << static_cast<char>(c);
    } else {
      *os << "\\x" << hex[c >> 4] << hex[c & 15];
    }
  }
}

/// The C++ kind of a C status code. ST_ERR_* are ErrorKind's numbers; the table says so
/// explicitly for each, so that a renumbering on either side fails to compile rather than map
/// silently (the enums test checks both against the core's names).
inline std::optional<st::ErrorKind> kind_of(std::int32_t code) {
  using K = st::ErrorKind;
  static constexpr std::pair<std::int32_t, K> table[] = {
      {ST_ERR_HEADER_TOO_SMALL, K::HeaderTooSmall},
      {ST_ERR_HEADER_TOO_LARGE, K::HeaderTooLarge},
      {ST_ERR_INVALID_HEADER_LENGTH, K::InvalidHeaderLength},
      {ST_ERR_INVALID_HEADER, K::InvalidHeader},
      {ST_ERR_INVALID_HEADER_DESERIALIZATION, K::InvalidHeaderDeserialization},
      {ST_ERR_INVALID_OFFSET, K::InvalidOffset},
      {ST_ERR_VALIDATION_OVERFLOW, K::ValidationOverflow},
      {ST_ERR_MISALIGNED_SLICE, K::MisalignedSlice},
      {ST_ERR_TENSOR_INVALID_INFO, K::TensorInvalidInfo},
      {ST_ERR_METADATA_INCOMPLETE_BUFFER, K::MetadataIncompleteBuffer},
      {ST_ERR_TENSOR_NOT_FOUND, K::TensorNotFound},
      {ST_ERR_DUPLICATE_KEY, K::DuplicateKey},
      {ST_ERR_INVALID_TENSOR_NAME, K::InvalidTensorName},
      {ST_ERR_INVALID_SLICE, K::InvalidSlice},
      {ST_ERR_IO, K::Io},
      {ST_ERR_INVALID_INDEX, K::InvalidIndex},
      {ST_ERR_SHARD_MISSING, K::ShardMissing},
      {ST_ERR_SHARD_MISMATCH, K::ShardMismatch},
      {ST_ERR_INVALID_SHARD_PATH, K::InvalidShardPath},
      {ST_ERR_CUDA, K::Cuda},
      {ST_ERR_INTERNAL, K::Internal},
      {ST_ERR_TYPE_MISMATCH, K::TypeMismatch},
      {ST_ERR_BUDGET_EXCEEDED, K::BudgetExceeded},
  };
  static_assert(std::size(table) == st::error_kind_count);
  for (const auto& [c, k] : table) {
    if (c == code) return k;
  }
  return std::nullopt;
}

/// Runs `body(err, value)` against the C API: `body` appends what it produces to `value` and
/// returns whether every call succeeded; on a failure `err` holds the error that ended it.
template <class F>
Outcome via_c(F&& body) {
  Outcome out;
  st_error err = ST_ERROR_INIT;
  if (!body(&err, out.value)) {
    auto kind = kind_of(err.kind);
    out.kind = kind ? std::string(st::to_string(*kind)) : "ST_ERR " + std::to_string(err.kind);
    out.message = err.message ? std::string(err.message, err.message_len) : "(no message)";
  }
  st_error_clear(&err);
  return out;
}

/// Runs `body(value)` against the C++ API: the outcome is the `safetensors::Error` it throws,
/// if any.
template <class F>
Outcome via_cxx(F&& body) {
  Outcome out;
  try {
    body(out.value);
  } catch (const st::Error& e) {
    out.kind = std::string(st::to_string(e.kind()));
    out.message = e.what();
  }
  return out;
}

/// An inner step's outcome, written into the transcript of the sequence it belongs to (so that
/// a sequence goes on past a step that fails, as both APIs must agree on each).
inline void note(std::string& value, const Outcome& step) {
  value += "{" + step.kind;
  if (!step.message.empty()) value += ": " + step.message;
  value += "|" + step.value + "}";
}

/// How many comparisons the matrix made, reported at the end so that a fixture that silently
/// produced nothing is seen.
inline std::size_t& compared() {
  static std::size_t n = 0;
  return n;
}

/// The two APIs' outcomes of operation `what` must be equal.
inline void expect_same(const std::string& what, const Outcome& c, const Outcome& cxx) {
  ++compared();
  EXPECT_EQ(c, cxx) << what << "\n  C:   " << ::testing::PrintToString(c)
                    << "\n  C++: " << ::testing::PrintToString(cxx);
}

// ---- neutral inputs -------------------------------------------------------------------------

/// One index of a selection: a range (`start:stop:step`, each bound optional) or a position.
struct Ix {
  bool select = false;
  std::optional<std::int64_t> start, stop;
  std::int64_t step = 1;

  static Ix at(std::int64_t i) { return {true, i, std::nullopt, 1}; }
  static Ix all() { return {}; }
  static Ix range(std::optional<std::int64_t> a, std::optional<std::int64_t> b, std::int64_t s = 1) {
    return {false, a, b, s};
  }
};

inline st_index to_c(const Ix& i) {
  st_index out;
  std::memset(&out, 0, sizeof out);
  out.kind = i.select ? ST_INDEX_SELECT : ST_INDEX_RANGE;
  out.has_start = i.start.has_value();
  out.has_stop = i.stop.has_value();
  out.start = i.start.value_or(0);
  out.stop = i.stop.value_or(0);
  out.step = i.step;
  return out;
}

inline st::Index to_cxx(const Ix& i) {
  if (i.select) return st::Index(*i.start);
  return st::Index::range(i.start, i.stop, i.step);
}

/// A tensor to write: a name (any bytes), a dtype value (any, to reach the checks of values
/// that name no dtype), a shape and its bytes.
struct Tensor {
  std::string name;
  int dtype = 0;
  std::vector<std::size_t> shape;
  std::string bytes;
};

inline st_str c_str(std::string_view s) {
  return {s.data(), s.size()};
}

inline st_tensor to_c(const Tensor& t) {
  st_tensor out;
  std::memset(&out, 0, sizeof out);
  out.name = c_str(t.name);
  out.dtype = t.dtype;
  out.rank = t.shape.size();
  out.shape = t.shape.data();
  out.data = t.bytes.data();
  out.byte_size = t.bytes.size();
  return out;
}

inline st::TensorView to_cxx(const Tensor& t) {
  return {static_cast<st::Dtype>(t.dtype), t.shape, std::as_bytes(std::span(t.bytes.data(), t.bytes.size()))};
}

/// `n` bytes counting from `from`.
inline std::string counting(std::size_t n, unsigned from = 0) {
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>((from + i * 7) % 251);
  return out;
}

/// A shape as text.
template <class Dims>
std::string shape_text(const Dims& dims) {
  std::string out = "[";
  for (auto d : dims) out += std::to_string(d) + ",";
  return out + "]";
}

inline std::string file_text(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return "(no file)";
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace parity
