// The `ranks` item of bench_cpp: the multi-rank device load (`cuda::load(plan, collective)`) with
// W threads as ranks on device 0, every rank opening the file itself, planning, and loading its
// share: every tensor of two or more dimensions split along dimension 0 (`column_parallel`,
// uneven), every vector replicated (read once, shared through the collective). The bytes that
// land on the device add up to the file's (plus the replicated vectors W times), so the wall
// time reads directly against the single-rank `gpu` item (`Uploader::load` of the whole file).
//
// The collective is in-process (cpp/local_group.hpp, as the multi-rank tests use), with a
// device broadcast made of the driver's own device-to-device copies on the one GPU, each waited
// for before the barrier that lets the root reuse its buffer (a copy between device buffers
// does not wait for the host). Not NCCL: this times our side of the load, not a link.
#pragma once

#include <dlfcn.h>

#include <safetensors/cuda.hpp>
#include <safetensors/distributed.hpp>
#include <safetensors/distributed_cuda.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/tensor_parallel.hpp>

#include <barrier>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "local_group.hpp"
#include "measure.hpp"

namespace bench_ranks {

/// W threads' meeting point (cpp/local_group.hpp) with a device broadcast, which needs the
/// driver (its primary context on device 0, a stream wait and a device-to-device copy); without
/// those entry points only the host path runs.
class Group : public local::Group {
 public:
  explicit Group(std::size_t world) : local::Group(world) {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW);  // the driver the library loaded
    if (lib == nullptr) return;
    retain_ = reinterpret_cast<int (*)(void**, int)>(::dlsym(lib, "cuDevicePrimaryCtxRetain"));
    release_ = reinterpret_cast<int (*)(int)>(::dlsym(lib, "cuDevicePrimaryCtxRelease_v2"));
    set_ = reinterpret_cast<int (*)(void*)>(::dlsym(lib, "cuCtxSetCurrent"));
    stream_sync_ = reinterpret_cast<int (*)(void*)>(::dlsym(lib, "cuStreamSynchronize"));
    copy_ =
        reinterpret_cast<int (*)(std::uint64_t, std::uint64_t, std::size_t)>(::dlsym(lib, "cuMemcpyDtoD_v2"));
    if (retain_ && release_ && set_ && stream_sync_ && copy_ && retain_(&ctx_, 0) == 0) device_ = true;
  }
  ~Group() {
    if (device_) release_(0);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  [[nodiscard]] bool has_device_path() const { return device_; }

  class Member final : public local::Group::Member {
   public:
    Member(Group& g, std::size_t rank) : local::Group::Member(g, rank), group_(g) {}
    void broadcast_device(void* bytes, std::size_t len, std::size_t root, void* stream) override {
      auto& g = group_;
      // Every rank arrives at both barriers whatever fails, so that none is left waiting.
      int failed = g.set_(g.ctx_);
      if (failed == 0) failed = g.stream_sync_(stream);  // the root's bytes are there; ours are free
      if (rank_ == root) g.slots_[root] = static_cast<std::byte*>(bytes);
      g.sync_.arrive_and_wait();
      if (failed == 0 && rank_ != root && len > 0) {
        failed = g.copy_(reinterpret_cast<std::uintptr_t>(bytes),
                         reinterpret_cast<std::uintptr_t>(g.slots_[root]), len);
        // A device-to-device cuMemcpy does not wait for the host: wait for it (the legacy stream)
        // before the root may overwrite its buffer.
        if (failed == 0) failed = g.stream_sync_(nullptr);
      }
      g.sync_.arrive_and_wait();
      if (failed != 0)
        throw std::runtime_error("the device broadcast failed (CUresult " + std::to_string(failed) + ")");
    }

   private:
    Group& group_;
  };

 private:
  bool device_ = false;
  void* ctx_ = nullptr;
  int (*retain_)(void**, int) = nullptr;
  int (*release_)(int) = nullptr;
  int (*set_)(void*) = nullptr;
  int (*stream_sync_)(void*) = nullptr;
  int (*copy_)(std::uint64_t, std::uint64_t, std::size_t) = nullptr;
};

/// Rank `rank`'s selection of every tensor: dimension 0 split unevenly, vectors replicated.
inline std::vector<std::vector<safetensors::Selection>> needs(const safetensors::SafeOpen& f,
                                                              std::size_t world) {
  std::vector<std::vector<safetensors::Selection>> out(world);
  for (const auto& name : f.keys()) {
    auto s = f.get_slice(name);
    for (std::size_t r = 0; r < world; ++r) {
      out[r].push_back(s.shape().size() >= 2
                           ? safetensors::column_parallel(s, r, world, safetensors::Split::Uneven)
                           : s.select({}));
    }
  }
  return out;
}

/// One timed load by `world` threads via `via`; `kept` receives every rank's tensors (freed
/// by the caller outside the timing). Rethrows the first rank's error.
inline void load_once(const std::filesystem::path& path, std::size_t world, safetensors::cuda::Via via,
                      Group& group, std::vector<std::optional<safetensors::cuda::DeviceTensors>>& kept) {
  namespace cuda = safetensors::cuda;
  kept.resize(world);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (std::size_t rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        safetensors::SafeOpen f(path);  // each rank opens the file, as a process would
        safetensors::LoadPlan plan(needs(f, world));
        Group::Member me(group, rank);
        kept[rank] = cuda::load(plan, me, {.device = 0, .via = via});
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace bench_ranks
