// The collective a multi-rank load moves bytes through: an interface, so that MPI, NCCL, or a
// user's own communicator (torch.distributed, a custom transport) can carry it.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <span>
#include <string>

#include "safetensors/error.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// A group of ranks that can broadcast and all-gather bytes. Every rank must make the same
/// calls in the same order (as with MPI and NCCL collectives).
///
///   class MyComm : public safetensors::Collective { ... };   // or MpiCollective, NcclCollective
///   auto mine = plan.load(comm);
class Collective {
 public:
  virtual ~Collective() = default;

  /// This rank, in `[0, size())`.
  [[nodiscard]] virtual std::size_t rank() const = 0;
  /// Number of ranks.
  [[nodiscard]] virtual std::size_t size() const = 0;

  /// Host memory: after the call every rank's `bytes` holds what rank `root` passed. All ranks
  /// pass the same length.
  virtual void broadcast(std::span<std::byte> bytes, std::size_t root) = 0;

  /// Host memory: rank `r`'s `mine` lands at `all[r * mine.size(), (r + 1) * mine.size())` on
  /// every rank; `all.size() == size() * mine.size()`.
  virtual void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) = 0;

  /// Device memory, enqueued on `stream` (a `cudaStream_t`/`CUstream`, null for the default
  /// stream). Collectives without a device path throw `Cuda`.
  virtual void broadcast_device(void* bytes, std::size_t len, std::size_t root, void* stream) {
    (void)bytes, (void)len, (void)root, (void)stream;
    detail::raise(ErrorKind::Cuda,
                  "this collective has no device-memory path; use a host load or NcclCollective");
  }

  /// Device memory: the all-gather of `len` bytes per rank into `all` (`size() * len` bytes).
  virtual void all_gather_device(const void* mine, void* all, std::size_t len, void* stream) {
    (void)mine, (void)all, (void)len, (void)stream;
    detail::raise(ErrorKind::Cuda,
                  "this collective has no device-memory path; use a host load or NcclCollective");
  }
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
