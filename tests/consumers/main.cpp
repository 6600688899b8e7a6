// A consumer program: writes a small safetensors file by hand, opens it through the public API,
// and checks what it reads. Exit code 0 on success.
#include <safetensors/safetensors.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

int main() {
  std::string json = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  json.resize((json.size() + 7) / 8 * 8, ' ');  // pad as writers do, so the data is aligned
  // Named for this process: consumer tests run side by side.
  auto path = std::filesystem::temp_directory_path() /
              ("safetensors-consumer-" + std::to_string(::getpid()) + ".safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    std::uint64_t n = json.size();
    out.write(reinterpret_cast<const char*>(&n), 8);  // little-endian on every supported target
    out << json;
    const float values[4] = {1, 2, 3, 4};
    out.write(reinterpret_cast<const char*>(values), sizeof values);
  }
  try {
    safetensors::SafeOpen f(path);
    auto view = f.get_tensor("w");
    auto w = view.as<float>();
    bool ok = f.keys().size() == 1 && w.size() == 4 && w[3] == 4.0f;
    std::printf("consumer: %s (%zu tensors, w[3] = %g)\n", ok ? "ok" : "WRONG", f.size(), double(w[3]));
    std::filesystem::remove(path);
    return ok ? 0 : 1;
  } catch (const safetensors::Error& e) {
    std::printf("consumer: error %s: %s\n", std::string(safetensors::to_string(e.kind())).c_str(), e.what());
    return 1;
  }
}
