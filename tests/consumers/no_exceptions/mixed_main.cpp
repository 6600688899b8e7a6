// The other half of mixed_modes, built with exceptions and RTTI, linked after mixed_noexc.cpp and
// unoptimised, so that the linker meets the no-exceptions copies of any shared inline function
// first: the throwing API must still throw here, and the caught `Error` must still have its
// type information. Exit code 0 when both halves behave.
#include <safetensors/safetensors.hpp>

#include <cstdio>
#include <string>
#include <typeinfo>

std::string noexc_open_kind(const char* path);

int main() {
  const char* missing = "/nonexistent/safetensors-mixed-modes.safetensors";
  std::string there = noexc_open_kind(missing);
  try {
    safetensors::SafeOpen f(missing);
    std::puts("mixed modes: opening a missing file threw nothing");
    return 1;
  } catch (const std::exception& e) {
    if (typeid(e) != typeid(safetensors::Error)) {
      std::puts("mixed modes: the caught error has the wrong type information");
      return 2;
    }
    const auto* error = dynamic_cast<const safetensors::Error*>(&e);
    if (error == nullptr || error->kind() != safetensors::ErrorKind::Io) {
      std::puts("mixed modes: the caught error is not an Io safetensors::Error");
      return 3;
    }
  }
  if (there != "Io") {
    std::printf("mixed modes: the no-exceptions half got %s, not Io\n", there.c_str());
    return 4;
  }
  std::puts("mixed modes: both halves report Io");
  return 0;
}
