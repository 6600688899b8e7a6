// A C ABI over safetensors::to_dlpack for tests/python/dlpack_numpy.py, which hands the exported
// tensors to NumPy's from_dlpack through ctypes. Counts the exports still alive, so the script can
// check that NumPy's call of the deleter releases them.
#include <safetensors/dlpack.hpp>
#include <safetensors/safetensors.hpp>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

namespace {
std::atomic<long> live{0};
std::string last_error;
}  // namespace

extern "C" {

/// The tensor `name` of the file at `path`, as a DLPack tensor the caller owns; NULL on error
/// (then `st_last_error` says why).
__attribute__((visibility("default"))) DLManagedTensorVersioned* st_export(const char* path, const char* name,
                                                                           int read_backend) {
  try {
    safetensors::OpenOptions options;
    if (read_backend != 0) options.backend = safetensors::Backend::Read;
    safetensors::TensorView view = safetensors::SafeOpen(path, options).get_tensor(name);
    ++live;
    auto token = std::shared_ptr<void>(nullptr, [](void*) { --live; });
    view.owner =
        std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<void>>>(view.owner, token);
    return safetensors::to_dlpack(view).release();
  } catch (const safetensors::Error& e) {
    last_error = std::string(safetensors::to_string(e.kind())) + ": " + e.what();
    return nullptr;
  }
}

__attribute__((visibility("default"))) const char* st_last_error() {
  return last_error.c_str();
}

/// Exports made by st_export whose deleter has not run yet.
__attribute__((visibility("default"))) long st_live_exports() {
  return live.load();
}
}
