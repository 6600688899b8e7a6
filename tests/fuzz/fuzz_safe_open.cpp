// libFuzzer target: arbitrary bytes as a file, opened through the public C++ API with both
// backends and in memory (SafeOpen::from_bytes over the fuzzer's own buffer, so ASan sees any
// read outside it), every tensor read, sliced and checked. Only safetensors::Error may come out.
// Built by the `fuzz` preset (clang, -fsanitize=fuzzer,address,undefined); see tests/fuzz/run.
#include <safetensors/safetensors.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

/// Every byte of every tensor read, a slice of each taken; returns a checksum so that nothing
/// is optimised away.
std::uint64_t exercise(const safetensors::SafeOpen& f) {
  std::uint64_t sum = f.size() + f.metadata().size();
  for (const auto& name : f.keys()) {
    auto info = f.info(name);
    auto view = f.get_tensor(name);
    if (view.data.size() != info.byte_size()) std::abort();
    for (auto b : view.data) sum += static_cast<std::uint8_t>(b);
    try {
      auto sel = f.get_slice(name).select({safetensors::Index::range(0, 1)});
      sum += sel.read().data.size();
    } catch (const safetensors::Error&) {  // empty first dimension, scalars, sub-byte cuts
    }
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static int fd = ::memfd_create("safetensors-fuzz", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  static volatile std::uint64_t sink = 0;
  for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
    try {
      safetensors::SafeOpen f(path, {backend});
      sink = sink + exercise(f);
    } catch (const safetensors::Error& e) {
      sink = sink + static_cast<std::uint64_t>(e.kind());
    }
  }
  try {
    auto f = safetensors::SafeOpen::from_bytes({reinterpret_cast<const std::byte*>(data), size});
    sink = sink + exercise(f);
  } catch (const safetensors::Error& e) {
    sink = sink + static_cast<std::uint64_t>(e.kind());
  }
  return 0;
}
