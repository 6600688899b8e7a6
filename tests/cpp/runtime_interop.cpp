// A C ABI over cuda::Uploader::load_into for tests/python/runtime_interop.py, which makes the
// destination and the stream with the CUDA runtime (PyTorch, CuPy) or, without one, with driver
// calls as the runtime makes them, and hands their addresses over through ctypes. The script
// checks the bytes with the runtime's own copies, never with ours.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace {

namespace cuda = safetensors::cuda;
namespace nc = safetensors::nothrow::cuda;

thread_local std::string last_error;

int fail(const safetensors::Status& st) {
  last_error = std::string(safetensors::to_string(st.kind())) + ": " + st.message();
  return 1;
}

/// `s` as a JSON string: tensor names are the file's text, not ours.
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

extern "C" {

/// Why the last call on this thread failed ("Kind: message").
__attribute__((visibility("default"))) const char* st_interop_last_error() {
  return last_error.c_str();
}

/// An uploader for `device` (default options), or NULL (see st_interop_last_error).
__attribute__((visibility("default"))) void* st_interop_uploader(int device) {
  auto up = nc::make_uploader(device);
  if (!up) {
    fail(up.status());
    return nullptr;
  }
  return new cuda::Uploader(std::move(*up));
}

/// Waits for the uploader's copies, then frees it.
__attribute__((visibility("default"))) void st_interop_free(void* uploader) {
  delete static_cast<cuda::Uploader*>(uploader);
}

/// The plan of every tensor of the file at `path`: writes `{"total": N, "placements": [{"name":
/// ..., "offset": ..., "bytes": ...}, ...]}` into `out` when it fits in `out_size` bytes
/// (NUL included) and returns its length, or -1 on error.
__attribute__((visibility("default"))) long st_interop_plan(const char* path, char* out,
                                                            std::size_t out_size) {
  auto file = safetensors::nothrow::open(path);
  auto plan = file ? nc::plan(*file) : file.status();
  if (!plan) {
    fail(plan.status());
    return -1;
  }
  std::string json = "{\"total\":" + std::to_string(plan->first) + ",\"placements\":[";
  for (std::size_t i = 0; i < plan->second.size(); ++i) {
    const auto& p = plan->second[i];
    json += (i ? "," : "") + std::string("{\"name\":") + json_string(p.name) +
            ",\"offset\":" + std::to_string(p.offset) + ",\"bytes\":" + std::to_string(p.byte_size) + "}";
  }
  json += "]}";
  if (json.size() < out_size) std::snprintf(out, out_size, "%s", json.c_str());
  return static_cast<long>(json.size());
}

/// Every tensor of the file at `path` into `dst` (`capacity` bytes) on `stream`, through
/// `uploader`: 0 once every copy is enqueued, else 1 (see st_interop_last_error).
__attribute__((visibility("default"))) int st_interop_load_into(void* uploader, const char* path, void* dst,
                                                                std::size_t capacity, std::uintptr_t stream) {
  auto file = safetensors::nothrow::open(path);
  if (!file) return fail(file.status());
  auto placed = nc::load_into(*static_cast<cuda::Uploader*>(uploader), *file, {}, dst, capacity, stream);
  return placed ? 0 : fail(placed.status());
}
}
