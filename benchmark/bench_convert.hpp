// The `convert` item of bench_cpp: safetensors::convert from each source dtype to F32, and from
// F32 to BF16, F16 and F8_E4M3, on tensors whose F32 side is 256 MiB (64 Mi elements), single
// thread, beside one memcpy of the output's size. bench.py times ml_dtypes' astype on the
// same data (the same generator, below) for comparison.
#pragma once

#include <safetensors/safetensors.hpp>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "measure.hpp"

namespace bench_convert {

using safetensors::Dtype;

/// Byte i of every source: a multiplicative hash, the same in bench.py.
inline std::uint8_t source_byte(std::uint64_t i) {
  return static_cast<std::uint8_t>((i * 2654435761u) >> 13);
}

/// F32 element i of the F32 source: values in [-8, 8) on a 1/4096 grid, the same in bench.py.
inline float source_f32(std::uint64_t i) {
  return static_cast<float>(((i * 2654435761u) >> 13) & 0xFFFF) / 4096.0f - 8.0f;
}

struct Case {
  Dtype from, to;
};

/// Runs every case; prints a line each and returns the JSON array.
inline std::string run(std::size_t elements, int runs) {
  using enum Dtype;
  const Case cases[] = {{F8_E4M3, F32}, {F8_E5M2, F32}, {F8_E4M3FNUZ, F32}, {F8_E5M2FNUZ, F32},
                        {F8_E8M0, F32}, {F4, F32},      {F6_E2M3, F32},     {F6_E3M2, F32},
                        {F16, F32},     {BF16, F32},    {U8, F32},          {I32, F32},
                        {F64, F32},     {F32, BF16},    {F32, F16},         {F32, F8_E4M3}};
  std::vector<std::byte> out(elements * 8);
  std::vector<std::byte> src(elements * 8);
  std::ostringstream json;
  json << "[";
  double memcpy_s = 0;
  {
    std::vector<std::byte> a(elements * 4);
    std::memset(a.data(), 1, a.size());
    std::memset(out.data(), 2, out.size());
    memcpy_s = measure::median(measure::repeat(runs, [&] { std::memcpy(out.data(), a.data(), a.size()); }));
    std::printf("  convert: memcpy of %zu MiB            %8.1f ms  %6.2f GB/s\n", a.size() >> 20,
                memcpy_s * 1e3, static_cast<double>(a.size()) / memcpy_s / 1e9);
    json << "{\"item\":\"memcpy\",\"median_s\":" << memcpy_s << ",\"bytes\":" << a.size() << "}";
  }
  for (auto c : cases) {
    std::size_t in_bytes = elements * safetensors::bit_size(c.from) / 8;
    std::size_t out_bytes = elements * safetensors::bit_size(c.to) / 8;
    if (c.from == F32) {
      for (std::size_t i = 0; i < elements; ++i) {
        float x = source_f32(i);
        std::memcpy(src.data() + 4 * i, &x, 4);
      }
    } else if (c.from == F64) {
      for (std::size_t i = 0; i < elements; ++i) {
        double x = source_f32(i);
        std::memcpy(src.data() + 8 * i, &x, 8);
      }
    } else {
      for (std::size_t i = 0; i < in_bytes; ++i) src[i] = std::byte{source_byte(i)};
    }
    safetensors::TensorView t{c.from, {elements}, {src.data(), in_bytes}, {}};
    std::span<std::byte> dst(out.data(), out_bytes);
    auto times = measure::repeat(runs, [&] { safetensors::convert(t, c.to, dst); });
    double m = measure::median(times);
    // The memcpy of the output's size, scaled from the F32-sized one.
    double limit = memcpy_s * static_cast<double>(out_bytes) / static_cast<double>(elements * 4);
    std::printf("  convert: %-11s -> %-7s %8.1f ms  %6.2f Gelem/s  %.2fx memcpy of the output\n",
                std::string(safetensors::to_string(c.from)).c_str(),
                std::string(safetensors::to_string(c.to)).c_str(), m * 1e3,
                static_cast<double>(elements) / m / 1e9, limit / m);
    json << ",{\"item\":\"convert " << safetensors::to_string(c.from) << "->" << safetensors::to_string(c.to)
         << "\",\"median_s\":" << m << ",\"bytes\":" << out_bytes << ",\"elements\":" << elements << "}";
  }
  json << "]";
  return json.str();
}

}  // namespace bench_convert
