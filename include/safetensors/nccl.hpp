// `Collective` over NCCL, for device memory. NCCL is loaded at run time (dlopen of
// `libnccl.so.2`), like the CUDA driver, so building needs no NCCL; a missing NCCL is a `Cuda`
// error naming the library.
#pragma once

#include "safetensors/abi.hpp"

#include <dlfcn.h>

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "safetensors/collective.hpp"
#include "safetensors/error.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// The NCCL entry points this library uses, resolved from a shared library at run time. The
/// signatures are NCCL's public C API (nccl.h, NCCL 2.x): `ncclResult_t` is an int, the
/// communicator and stream are opaque pointers, `ncclUniqueId` is 128 bytes, `ncclUint8` is 1.
class NcclLibrary {
 public:
  using Id = std::array<char, 128>;

  /// Loads `library` (default `libnccl.so.2`), for the rest of the process: it is never
  /// unloaded, not even when the last `NcclLibrary` is gone, as NCCL's own threads may still be
  /// running its code then. Throws `Cuda` naming it when it cannot be loaded or lacks an entry
  /// point.
  explicit NcclLibrary(const std::string& library = "libnccl.so.2")
      : handle_(::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
    if (handle_ == nullptr) {
      const char* why = ::dlerror();
      detail::raise(ErrorKind::Cuda, "NCCL is not available: cannot load " + library + " (" +
                                         (why != nullptr ? why : "unknown reason") +
                                         "); install NCCL 2 or put it on LD_LIBRARY_PATH");
    }
    sym(get_error_string, "ncclGetErrorString", library);
    sym(get_unique_id, "ncclGetUniqueId", library);
    sym(comm_init_rank, "ncclCommInitRank", library);
    sym(comm_destroy, "ncclCommDestroy", library);
    sym(bcast, "ncclBroadcast", library);
    sym(all_gather, "ncclAllGather", library);
  }

  int (*get_unique_id)(Id*) = nullptr;
  int (*comm_init_rank)(void** comm, int nranks, Id id, int rank) = nullptr;
  int (*comm_destroy)(void* comm) = nullptr;
  int (*bcast)(const void* send, void* recv, std::size_t count, int dtype, int root, void* comm,
               void* stream) = nullptr;
  int (*all_gather)(const void* send, void* recv, std::size_t count, int dtype, void* comm,
                    void* stream) = nullptr;

  /// Throws `Cuda` naming `what` and NCCL's message when `rc` is not `ncclSuccess` (0).
  void check(int rc, const char* what) const {
    if (rc == 0) return;
    const char* text = get_error_string != nullptr ? get_error_string(rc) : nullptr;
    detail::raise(ErrorKind::Cuda, std::string(what) +
                                       " failed: " + (text != nullptr ? text : "unknown NCCL error") +
                                       " (ncclResult_t " + std::to_string(rc) + ")");
  }

 private:
  template <class F>
  void sym(F& f, const char* name, const std::string& library) {
    void* p = ::dlsym(handle_, name);
    if (p == nullptr) {
      detail::raise(ErrorKind::Cuda,
                    "NCCL library " + library + " has no " + name + "; NCCL 2.x is required");
    }
    f = reinterpret_cast<F>(p);
  }
  const char* (*get_error_string)(int) = nullptr;
  // Never dlclose'd (and loaded RTLD_NODELETE, so that no other handle's dlclose unloads it).
  void* handle_ = nullptr;
};

/// A `Collective` on an NCCL communicator: device memory only (host calls throw `Cuda`).
///
///   auto nccl = std::make_shared<safetensors::NcclLibrary>();
///   safetensors::NcclCollective comm(nccl, id, rank, world);   // id from rank 0's unique_id()
class NcclCollective final : public Collective {
 public:
  /// A new communicator: every rank passes the same `id` (rank 0's `unique_id()`, sent by any
  /// means) and its own rank. The current CUDA device is the one it uses.
  NcclCollective(std::shared_ptr<const NcclLibrary> nccl, const NcclLibrary::Id& id, std::size_t rank,
                 std::size_t world)
      : nccl_(std::move(nccl)), rank_(rank), size_(world), owned_(true) {
    nccl_->check(nccl_->comm_init_rank(&comm_, static_cast<int>(world), id, static_cast<int>(rank)),
                 "ncclCommInitRank");
  }
  /// Wraps a communicator the caller made and keeps owning.
  NcclCollective(std::shared_ptr<const NcclLibrary> nccl, void* comm, std::size_t rank, std::size_t world)
      : nccl_(std::move(nccl)), comm_(comm), rank_(rank), size_(world) {}
  NcclCollective(const NcclCollective&) = SAFETENSORS_DELETE("an NcclCollective owns its communicator");
  NcclCollective& operator=(const NcclCollective&) =
      SAFETENSORS_DELETE("an NcclCollective owns its communicator");
  ~NcclCollective() override {
    if (owned_ && comm_ != nullptr) nccl_->comm_destroy(comm_);
  }

  /// A fresh unique id (on rank 0), to share with the other ranks.
  [[nodiscard]] static NcclLibrary::Id unique_id(const NcclLibrary& nccl) {
    NcclLibrary::Id id{};
    nccl.check(nccl.get_unique_id(&id), "ncclGetUniqueId");
    return id;
  }

  [[nodiscard]] std::size_t rank() const override { return rank_; }
  [[nodiscard]] std::size_t size() const override { return size_; }

  void broadcast(std::span<std::byte>, std::size_t) override { host_refused(); }
  void all_gather(std::span<const std::byte>, std::span<std::byte>) override { host_refused(); }

  void broadcast_device(void* bytes, std::size_t len, std::size_t root, void* stream) override {
    nccl_->check(nccl_->bcast(bytes, bytes, len, uint8, static_cast<int>(root), comm_, stream),
                 "ncclBroadcast");
  }
  void all_gather_device(const void* mine, void* all, std::size_t len, void* stream) override {
    nccl_->check(nccl_->all_gather(mine, all, len, uint8, comm_, stream), "ncclAllGather");
  }

 private:
  static constexpr int uint8 = 1;  // ncclUint8
  [[noreturn]] static void host_refused() {
    detail::raise(ErrorKind::Cuda,
                  "NcclCollective moves device memory only; use an MPI or own collective for host loads");
  }
  std::shared_ptr<const NcclLibrary> nccl_;
  void* comm_ = nullptr;
  std::size_t rank_ = 0;
  std::size_t size_ = 0;
  bool owned_ = false;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
