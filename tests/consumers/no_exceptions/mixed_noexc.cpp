// Half of mixed_modes: a file built with -fno-exceptions -fno-rtti, on the nothrow API, that also
// makes an `Error` value (so this mode's inline functions and `Error` vtable exist in the program).
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <string>

std::string noexc_open_kind(const char* path) {
  auto f = safetensors::nothrow::open(path);
  (void)safetensors::cuda::why_unavailable();  // builds an Error when CUDA is unavailable
  return f ? "OK" : std::string(safetensors::to_string(f.status().kind()));
}
