// One program, two cxx-based Rust libraries: safetensors' shared library and an independent static
// one (tests/consumers/other_cxx_lib) that carries its own copy of cxx's runtime. Both must work.
#include <safetensors/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

// The other library's bridge function, as its generated header declares it.
namespace other {
::rust::String describe_sum(::rust::Slice<const std::uint8_t> bytes) noexcept;
}

int main() {
  const std::uint8_t bytes[3] = {1, 2, 3};
  std::string sum(other::describe_sum(::rust::Slice<const std::uint8_t>(bytes, 3)));
  try {
    auto path = std::filesystem::temp_directory_path() / "safetensors-two-libraries.safetensors";
    std::vector<float> data = {1, 2, 3, 4};
    safetensors::save_file(path, {{"w", {safetensors::Dtype::F32, {4}, std::as_bytes(std::span(data))}}});
    safetensors::SafeOpen f(path);
    std::filesystem::remove(path);
    auto w = f.get_tensor("w");
    auto values = w.as<float>();
    // And an error crossing our bridge, caught as a typed error in this program.
    bool typed = false;
    try {
      (void)f.get_tensor("missing");
    } catch (const safetensors::Error& e) {
      typed = e.kind() == safetensors::ErrorKind::TensorNotFound;
    }
    bool ok = sum == "sum 6" && values.size() == 4 && values[3] == 4.0f && typed &&
              safetensors::version() == safetensors::header_version;
    std::printf("two libraries: %s (%s, w[3] = %g, safetensors %s)\n", ok ? "ok" : "WRONG", sum.c_str(),
                double(values[3]), safetensors::version().to_string().c_str());
    return ok ? 0 : 1;
  } catch (const safetensors::Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
