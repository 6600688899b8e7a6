// The `convert` item of bench_cpp: safetensors::convert from each source dtype to F32, and from
// F32 to BF16, F16 and F8_E4M3, on tensors whose F32 side is 256 MiB (64 Mi elements), beside
// one memcpy of the output's size. Each is timed twice: as the library runs it (outputs from
// 16 MiB on several threads, one per core up to eight) and with this thread pinned to one core
// (the library then converts on the caller's thread alone: it asks for the cores it may use at
// every large conversion). memcpy and NumPy run on one thread. bench.py times ml_dtypes'
// astype on the same data (the same generator, below) for comparison.
//
// Every buffer is faulted in before timing and, like NumPy's large arrays (which NumPy advises
// onto transparent huge pages, `numpy/_core/src/multiarray/alloc.c`), and like the outputs the
// library allocates itself (`detail::allocate_bytes`), advised onto huge pages: with 4 KiB
// pages a 256 MiB pass is TLB-bound (memcpy measured 8 GB/s against 15 with huge pages on a
// virtual machine), which charged our side for a page size NumPy's side did not pay.
#pragma once

#include <safetensors/safetensors.hpp>

#include <sched.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <span>
#include <sstream>
#include <stdexcept>
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

/// Anonymous memory advised onto huge pages and faulted in (filled with `fill`).
class Buffer {
 public:
  Buffer(std::size_t n, int fill) : len_(n == 0 ? 1 : n) {
    void* p = ::mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of a conversion buffer failed");
    ::madvise(p, len_, MADV_HUGEPAGE);  // advice only
    data_ = static_cast<std::byte*>(p);
    std::memset(data_, fill, len_);
  }
  ~Buffer() { ::munmap(data_, len_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  [[nodiscard]] std::byte* data() { return data_; }
  std::byte& operator[](std::size_t i) { return data_[i]; }

 private:
  std::size_t len_;
  std::byte* data_;
};

/// Pins the calling thread to the core it runs on for its lifetime, then restores its mask.
class OneCore {
 public:
  OneCore() {
    ok_ = ::sched_getaffinity(0, sizeof(saved_), &saved_) == 0;
    int cpu = ::sched_getcpu();
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu < 0 ? 0 : cpu, &one);
    ok_ = ok_ && ::sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  ~OneCore() {
    if (ok_) ::sched_setaffinity(0, sizeof(saved_), &saved_);
  }
  OneCore(const OneCore&) = delete;
  OneCore& operator=(const OneCore&) = delete;
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  cpu_set_t saved_{};
  bool ok_ = false;
};

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
  Buffer out(elements * 8, 2);
  Buffer src(elements * 8, 0);
  std::ostringstream json;
  json << "[";
  double memcpy_s = 0;
  {
    const std::size_t n = elements * 4;
    Buffer a(n, 1);
    memcpy_s = measure::median(measure::repeat(runs, [&] { std::memcpy(out.data(), a.data(), n); }));
    std::printf("  convert: memcpy of %zu MiB            %8.1f ms  %6.2f GB/s\n", n >> 20, memcpy_s * 1e3,
                static_cast<double>(n) / memcpy_s / 1e9);
    json << "{\"item\":\"memcpy\",\"median_s\":" << memcpy_s << ",\"bytes\":" << n << "}";
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
    double one = 0;
    {
      OneCore pin;
      if (pin.ok()) one = measure::median(measure::repeat(runs, [&] { safetensors::convert(t, c.to, dst); }));
    }
    // The memcpy of the output's size, scaled from the F32-sized one.
    double limit = memcpy_s * static_cast<double>(out_bytes) / static_cast<double>(elements * 4);
    std::printf("  convert: %-11s -> %-7s %8.1f ms  %6.2f Gelem/s  %.2fx memcpy of the output",
                std::string(safetensors::to_string(c.from)).c_str(),
                std::string(safetensors::to_string(c.to)).c_str(), m * 1e3,
                static_cast<double>(elements) / m / 1e9, limit / m);
    if (one > 0) std::printf("  (one core %.1f ms, %.2fx)", one * 1e3, limit / one);
    std::printf("\n");
    json << ",{\"item\":\"convert " << safetensors::to_string(c.from) << "->" << safetensors::to_string(c.to)
         << "\",\"median_s\":" << m << ",\"bytes\":" << out_bytes << ",\"elements\":" << elements;
    if (one > 0) json << ",\"one_core_s\":" << one;
    json << "}";
  }
  json << "]";
  return json.str();
}

}  // namespace bench_convert
