// What the GPU tests (cuda_test, cuda_upload_test, distributed_cuda_test) share: the rule for
// when a GPU test runs (always under the emulated driver, which ctest puts on the library path;
// elsewhere it skips, saying why, without a usable GPU), and the driver entry points the tests
// call themselves, found with dlsym.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <safetensors/safetensors.hpp>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string_view>

#ifndef SAFETENSORS_TEST_EMULATED_DRIVER
#error "SAFETENSORS_TEST_EMULATED_DRIVER must name the emulated driver's directory"
#endif

namespace test {

/// Whether ctest put the emulated driver (tests/cuda) on the library path: there a GPU is
/// always available, and the GPU tests must run, never skip.
inline bool emulated_driver_expected() {
  const char* path = std::getenv("LD_LIBRARY_PATH");
  return path && std::string_view(path).find(SAFETENSORS_TEST_EMULATED_DRIVER) != std::string_view::npos;
}

/// Whether a GPU, real or emulated, is usable; if not, says why (a skip), or fails the test
/// under the emulated driver.
inline bool gpu_or_skip() {
  namespace cuda = safetensors::cuda;
  if (cuda::available()) return true;
  if (emulated_driver_expected()) {
    ADD_FAILURE() << "the emulated CUDA driver is on the library path, yet: " << cuda::why_unavailable();
    return false;
  }
  std::cout << "[  SKIPPED ] no usable GPU: " << cuda::why_unavailable() << "\n";
  return false;
}

using Ctx = void*;
using Stream = void*;

/// The driver entry points the tests call themselves, as an engine would, and the emulated
/// driver's controls and counters (tests/cuda/emulated_cuda.h; absent from a real driver).
struct Driver {
  Driver() : lib(::dlopen("libcuda.so.1", RTLD_NOW)) {
    if (!lib) lib = ::dlopen("libcuda.so", RTLD_NOW);
  }
  template <class F>
  F get(const char* name) const {
    return lib ? reinterpret_cast<F>(::dlsym(lib, name)) : nullptr;
  }
  [[nodiscard]] bool emulated() const { return get<void*>("fakecuda_hold") != nullptr; }

  Ctx current() const {
    Ctx c = nullptr;
    EXPECT_EQ(get<int (*)(Ctx*)>("cuCtxGetCurrent")(&c), 0);
    return c;
  }
  void set_current(Ctx c) const { ASSERT_EQ(get<int (*)(Ctx)>("cuCtxSetCurrent")(c), 0); }
  /// A context of the caller's own on `device` (not the primary one), made current.
  Ctx create_context(int device) const {
    int dev = 0;
    EXPECT_EQ(get<int (*)(int*, int)>("cuDeviceGet")(&dev, device), 0);
    Ctx c = nullptr;
    EXPECT_EQ(get<int (*)(Ctx*, unsigned, int)>("cuCtxCreate_v2")(&c, 0, dev), 0);
    return c;
  }
  void destroy_context(Ctx c) const { EXPECT_EQ(get<int (*)(Ctx)>("cuCtxDestroy_v2")(c), 0); }
  /// Retains `device`'s primary context (as the CUDA runtime would) and makes it current.
  Ctx enter_primary(int device) const {
    int dev = 0;
    EXPECT_EQ(get<int (*)(int*, int)>("cuDeviceGet")(&dev, device), 0);
    Ctx c = nullptr;
    EXPECT_EQ(get<int (*)(Ctx*, int)>("cuDevicePrimaryCtxRetain")(&c, dev), 0);
    set_current(c);
    return c;
  }
  void leave_primary(int device) const {
    set_current(nullptr);
    EXPECT_EQ(get<int (*)(int)>("cuDevicePrimaryCtxRelease_v2")(device), 0);
  }
  std::uint64_t alloc(std::size_t bytes) const {
    std::uint64_t p = 0;
    EXPECT_EQ(get<int (*)(std::uint64_t*, std::size_t)>("cuMemAlloc_v2")(&p, bytes), 0);
    return p;
  }
  void free(std::uint64_t p) const { EXPECT_EQ(get<int (*)(std::uint64_t)>("cuMemFree_v2")(p), 0); }
  Stream stream() const {
    Stream s = nullptr;
    EXPECT_EQ(get<int (*)(Stream*, unsigned)>("cuStreamCreate")(&s, 1 /* non-blocking */), 0);
    return s;
  }
  void sync(Stream s) const { EXPECT_EQ(get<int (*)(Stream)>("cuStreamSynchronize")(s), 0); }
  void destroy(Stream s) const { EXPECT_EQ(get<int (*)(Stream)>("cuStreamDestroy_v2")(s), 0); }
  int counter(const char* name) const { return get<int (*)()>(name)(); }
  /// Calls of driver entry point `fn` so far (its name with or without _v2).
  [[nodiscard]] unsigned long long calls(const char* fn) const {
    return get<unsigned long long (*)(const char*)>("fakecuda_calls")(fn);
  }
  [[nodiscard]] unsigned long long pageable_copies() const {
    return get<unsigned long long (*)()>("fakecuda_pageable_async_copies")();
  }
  int ctx_resets(int device) const { return get<int (*)(int)>("fakecuda_primary_ctx_resets")(device); }
  void fail(const char* spec) const {
    ASSERT_EQ(get<int (*)(const char*)>("fakecuda_set_failures")(spec), 0);
  }

  void* lib;
};

}  // namespace test
