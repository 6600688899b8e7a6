// Rust and C++ agree on every `Dtype` and `ErrorKind`: names, bit sizes and counts. Both
// enumerations cross the bridge as numbers, so a value that meant one thing in Rust and another
// in C++ would mislabel tensors or errors while every other test passed.
#include <gtest/gtest.h>
#include <safetensors/detail/bridge.hpp>
#include <safetensors/safetensors.hpp>

#include <cstdint>
#include <set>
#include <string_view>

namespace {

namespace ffi = safetensors::ffi;

std::string_view view(rust::Str s) {
  return {s.data(), s.size()};
}

TEST(Enums, EveryDtypeHasTheSameNameAndBitSizeInRust) {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < safetensors::dtype_count; ++i) {
    auto dtype = static_cast<safetensors::Dtype>(i);
    auto value = static_cast<std::uint8_t>(i);
    EXPECT_FALSE(safetensors::to_string(dtype).empty()) << i;
    EXPECT_EQ(view(ffi::dtype_name(value)), safetensors::to_string(dtype)) << i;
    EXPECT_EQ(ffi::dtype_bits(value), safetensors::bit_size(dtype)) << safetensors::to_string(dtype);
    EXPECT_EQ(safetensors::dtype_from_string(view(ffi::dtype_name(value))), dtype) << i;
    names.insert(safetensors::to_string(dtype));
  }
  EXPECT_EQ(names.size(), safetensors::dtype_count);
}

TEST(Enums, RustHasNoDtypePastTheLastOne) {
  for (auto value : {safetensors::dtype_count, std::size_t{255}}) {
    auto past = static_cast<std::uint8_t>(value);
    EXPECT_EQ(view(ffi::dtype_name(past)), "") << value;
    EXPECT_EQ(ffi::dtype_bits(past), 0u) << value;
    EXPECT_EQ(safetensors::to_string(static_cast<safetensors::Dtype>(past)), "") << value;
  }
}

TEST(Enums, EveryErrorKindHasTheSameNameInRust) {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < safetensors::error_kind_count; ++i) {
    auto kind = static_cast<safetensors::ErrorKind>(i);
    EXPECT_FALSE(safetensors::to_string(kind).empty()) << i;
    EXPECT_EQ(view(ffi::error_kind_name(static_cast<std::uint8_t>(i))), safetensors::to_string(kind)) << i;
    names.insert(safetensors::to_string(kind));
  }
  EXPECT_EQ(names.size(), safetensors::error_kind_count);
}

TEST(Enums, RustHasNoErrorKindPastTheLastOne) {
  for (auto value : {safetensors::error_kind_count, std::size_t{255}}) {
    auto past = static_cast<std::uint8_t>(value);
    EXPECT_EQ(view(ffi::error_kind_name(past)), "") << value;
    EXPECT_EQ(safetensors::to_string(static_cast<safetensors::ErrorKind>(past)), "") << value;
  }
}

}  // namespace
