// The device half of a multi-rank load: `cuda::load(plan, collective)` runs a rank's share of a
// `LoadPlan` and returns its tensors in ONE device allocation (a `cuda::DeviceTensors` the
// caller owns), each at a 256-byte-aligned placement. The rank's reads land in pinned staging
// memory (never pageable: an asynchronous copy from pageable memory is synchronous and staged
// by the driver), shared reads cross the collective either on the device (`Via::Device`: the
// collective's `broadcast_device`, e.g. NCCL) or on the host before the upload (`Via::Host`:
// MPI, an in-process or a user's host collective), and every copy is ordered on one stream.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "safetensors/collective.hpp"
#include "safetensors/cuda.hpp"
#include "safetensors/distributed.hpp"
#include "safetensors/ffi/src/cuda.rs.h"
#include "safetensors/ffi/src/distributed.rs.h"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace cuda {

/// How shared reads reach the ranks that need them.
enum class Via {
  /// The collective's host `broadcast`, on the pinned staging buffer, then an upload (MPI,
  /// in-process, or a user's host communicator).
  Host,
  /// The collective's `broadcast_device` on a device scratch buffer (NCCL): only the reading
  /// rank uploads; the others receive over the device link.
  Device,
};

struct DistributedOptions {
  int device = 0;
  Via via = Via::Host;
  /// Every tensor starts on a multiple of this many bytes of the allocation: a power of two, or
  /// 0 for the default, 256 (the one rule of every upload; else `InvalidSlice`).
  std::size_t alignment = 256;
};

}  // namespace cuda
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

struct DeviceLoad {
  static cuda::DeviceTensors run(const LoadPlan& plan, Collective& c, const cuda::DistributedOptions& o) {
    const std::size_t rank = plan.checked_rank(c);
    // The core's layout, by the rule of every upload: the alignment 0 is the default (256),
    // else a power of two; each result on a multiple of it, in request order, 2^64 checked.
    const auto layout =
        attempt([&](ffi::Status& st) { return plan.plan_->layout(rank, o.alignment, st); }).value();
    const std::size_t device = upload::device_ordinal(o.device).value();
    const auto& shapes = plan.shapes_[rank];
    const auto lens = plan.plan_->result_lens(rank);
    std::vector<cuda::Placement> placements;
    placements.reserve(shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto& sh = shapes[i];
      placements.push_back({detail::shared_name(sh.name), sh.dtype, sh.shape(),
                            static_cast<std::size_t>(layout.offsets[i]), static_cast<std::size_t>(lens[i])});
    }
    const auto end = static_cast<std::size_t>(layout.total);
    auto stage =
        adopt(attempt([&](ffi::Status& st) { return ffi::new_device_stage(device, end, st); })).value();
    auto* stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(stage->stream()));
    const auto parts = attempt([&](ffi::Status& st) { return plan.plan_->parts(rank, st); }).value();
    std::size_t next_part = 0;
    const auto walk =
        attempt([&](ffi::Status& st) { return plan.plan_->walk(rank, plan.max_step_bytes_, st); }).value();
    for (const auto& b : walk.turns) {
      const auto steps = turn_steps(walk, b);
      const auto len = static_cast<std::size_t>(b.len);
      // Shared bytes travel on the device only when asked; steps this rank alone needs never
      // leave it.
      const bool on_device = b.shared && o.via == cuda::Via::Device;
      if (b.reads || !on_device) {
        // The next of the two staging buffers, once the copies out of it are done: the copies
        // of the turn before run on while this one reads.
        auto host = attempt([&](ffi::Status& st) { return stage->host(len, st); }).value();
        if (b.reads) {
          attempt([&](ffi::Status& st) { plan.plan_->read_steps(steps, host, st); }).throw_if_error();
        }
        if (b.shared && !on_device) {
          c.broadcast({reinterpret_cast<std::byte*>(host.data()), host.size()}, b.reader);
        }
      }
      if (on_device) {  // one shared step
        const std::uint64_t scratch =
            attempt([&](ffi::Status& st) { return stage->scratch(len, st); }).value();
        if (b.reads) attempt([&](ffi::Status& st) { stage->host_to_scratch(len, st); }).throw_if_error();
        c.broadcast_device(reinterpret_cast<void*>(static_cast<std::uintptr_t>(scratch)), len, b.reader,
                           stream);
      }
      std::size_t base = 0;  // where step i starts in the staging buffer
      for (const std::size_t i : steps) {
        for (; next_part < parts.size() && parts.data()[next_part].step == i; ++next_part) {
          const auto& part = parts.data()[next_part];
          // The pieces come in bounded batches, each going on where the last one stopped.
          constexpr std::size_t batch = 4096;
          for (std::uint64_t next = 0;;) {
            const auto pieces = plan.plan_->pieces(rank, i, part.request, next, batch);
            for (std::size_t k = 0; k < pieces.size(); ++k) {
              const auto& p = pieces.data()[k];
              const auto from = base + static_cast<std::size_t>(p.step_offset);
              const auto n = static_cast<std::size_t>(p.len);
              const std::size_t to = placements[part.request].offset + static_cast<std::size_t>(p.out_offset);
              if (on_device) {
                attempt([&](ffi::Status& st) {
                  stage->scratch_to_destination(from, n, to, st);
                }).throw_if_error();
              } else {
                attempt([&](ffi::Status& st) {
                  stage->host_to_destination(from, n, to, st);
                }).throw_if_error();
              }
            }
            if (pieces.size() < batch) break;
            next = pieces.data()[pieces.size() - 1].next;
          }
        }
        base += static_cast<std::size_t>(plan.plan_->step(i).len);
      }
    }
    const std::uint64_t ptr = attempt([&](ffi::Status& st) { return stage->finish(st); }).value();
    return Access<cuda::DeviceTensors>::make(
        cuda::DeviceBuffer(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), end, o.device),
        std::move(placements));
  }
};

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace cuda {

/// Runs this rank's share of `plan` (`c.rank()`: its reads and every broadcast, in which all
/// ranks take part) and returns its tensors in one allocation on `options.device`, complete on
/// return, at placements in the order its selections were given (`placements()`; `data(name)`
/// finds the first selection of a tensor). With `Via::Device` the collective's device calls
/// are made on this load's own stream with the calling thread's current context as it was
/// (NCCL uses the device its communicator was made on: make it `options.device`).
///
///   safetensors::NcclCollective comm(nccl, id, rank, world);
///   auto mine = safetensors::cuda::load(plan, comm, {.device = 0, .via = cuda::Via::Device});
///
/// Throws what `LoadPlan::load` throws, `Cuda` for device failures, and whatever the collective
/// throws; on an error nothing is leaked and the device memory is freed.
[[nodiscard]] inline DeviceTensors load(const LoadPlan& plan, Collective& c,
                                        DistributedOptions options = {}) {
  return detail::DeviceLoad::run(plan, c, options);
}

}  // namespace cuda
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
