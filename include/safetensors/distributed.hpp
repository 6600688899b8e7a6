// Multi-rank loading: a plan that reads every byte the ranks need exactly once across the
// world (balanced by bytes, shards read where they are needed) and moves shared bytes through a
// `Collective`, then each rank's `load`. The plan itself is computed by the Rust core
// (`rust/core/src/distributed/plan.rs`); this header runs the reads and the collective.
#pragma once

#include "safetensors/abi.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "safetensors/collective.hpp"
#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/slices.hpp"
#include "safetensors/ffi/src/distributed.rs.h"
#include "safetensors/slice.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

namespace detail {
struct DeviceLoad;  // the device half of `LoadPlan::load` (safetensors/distributed_cuda.hpp)
}  // namespace detail

struct LoadOptions {
  /// The longest single read (and broadcast); a rank stages at most this much at a time (a
  /// device load, two such buffers: one filling while the other's copies run). Consecutive
  /// steps that a rank reads for itself alone are read together, on several threads, up to
  /// this many bytes and at most 64 MiB (the core's walk, `rust/core/src/distributed/walk.rs`).
  std::size_t max_step_bytes = std::size_t{64} << 20;
};

namespace detail {

/// The steps of a turn of a rank's walk, as the bridge takes them.
inline ::rust::Slice<const std::size_t> turn_steps(const ffi::DistWalk& walk, const ffi::DistTurn& t) {
  return {walk.steps.data() + t.first, t.count};
}

}  // namespace detail

/// One read a plan object has done: `[offset, offset + length)` of the data buffer of the
/// plan's file number `file` (files numbered in the order the requests first name them).
struct PlannedRead {
  std::size_t file = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::size_t reader = 0;
};

/// What every rank of a world needs, planned so that each needed byte is read once.
///
///   // On every rank, the same requests for every rank (the plan is deterministic):
///   std::vector<std::vector<Selection>> needs(world);
///   for (std::size_t r = 0; r < world; ++r)
///     needs[r] = {column_parallel(ckpt.get_slice("up.weight"), r, world),
///                 ckpt.get_slice("norm.weight").select({})};   // replicated: read once
///   LoadPlan plan(needs);
///   std::vector<TensorView> mine = plan.load(comm);          // comm: MpiCollective, ...
///
/// Build every rank's selections from one open `SafeOpen` or `Checkpoint` object: files are told
/// apart by identity, so two separately opened copies of a file would be read separately.
class LoadPlan {
 public:
  explicit LoadPlan(std::span<const std::vector<Selection>> needs, LoadOptions options = {}) {
    auto builder = ffi::new_dist_plan_builder(needs.size());
    shapes_.resize(needs.size());
    for (std::size_t r = 0; r < needs.size(); ++r) {
      shapes_[r].reserve(needs[r].size());
      for (const auto& sel : needs[r]) {
        const auto* plan = detail::Access<Selection>::plan(sel).value();
        const auto& src = detail::Access<Selection>::open_file(sel);
        detail::attempt([&](ffi::Status& st) {
          builder->add_need(r, *src.file, *plan, st);
        }).throw_if_error();
        // The name is shared, not copied: a plan over many ranks holds one entry per tensor per rank.
        shapes_[r].push_back({detail::Access<Selection>::shared_name(sel), sel.dtype(),
                              detail::Access<Selection>::shared_plan(sel)});
      }
    }
    max_step_bytes_ = options.max_step_bytes;
    plan_ = detail::share(detail::adopt(detail::attempt([&](ffi::Status& st) {
                            return builder->build_plan(options.max_step_bytes, st);
                          })).value());
    // One hold per run of selections from the same file (selections come file by file in
    // practice), not one per selection.
    for (const auto& rank_needs : needs) {
      for (const auto& sel : rank_needs) {
        const auto& owner = detail::Access<Selection>::open_file(sel).owner;
        if (owners_.empty() || owners_.back() != owner) owners_.push_back(owner);
      }
    }
  }
  explicit LoadPlan(const std::vector<std::vector<Selection>>& needs, LoadOptions options = {})
      : LoadPlan(std::span<const std::vector<Selection>>(needs.data(), needs.size()), options) {}

  [[nodiscard]] std::size_t world() const { return plan_->world(); }

  /// Bytes rank `rank` reads from storage under this plan.
  [[nodiscard]] std::uint64_t bytes_read_by(std::size_t rank) const {
    return plan_->planned_bytes_read_by(rank);
  }
  /// Bytes read across the world: the union of every rank's needs, each byte once.
  [[nodiscard]] std::uint64_t bytes_read() const { return plan_->planned_bytes_read(); }
  /// Bytes the collective delivers to ranks that need them (not counting the reader).
  [[nodiscard]] std::uint64_t bytes_delivered() const { return plan_->bytes_delivered(); }
  /// Bytes the whole-world broadcasts `load` uses move (`len * (world - 1)` per shared read).
  [[nodiscard]] std::uint64_t bytes_broadcast() const { return plan_->bytes_broadcast(); }
  /// Bytes a naive load reads: every rank reads each tensor it touches whole, then slices.
  [[nodiscard]] std::uint64_t naive_bytes_read() const { return plan_->naive_bytes_read(); }

  /// Bytes this plan object has actually read, through `load` (for checks and benchmarks).
  [[nodiscard]] std::uint64_t bytes_read_here() const { return plan_->bytes_read_here(); }
  /// The reads this plan object has done: each reading rank's in the order it read them, rank by rank.
  [[nodiscard]] std::vector<PlannedRead> reads_here() const {
    auto raw = plan_->reads_here();
    std::vector<PlannedRead> out;
    out.reserve(raw.size());
    for (const auto& s : raw) out.push_back({s.file, s.offset, s.len, s.reader});
    return out;
  }

  /// Runs this rank's share (`c.rank()`): its reads, every broadcast (all ranks take part in
  /// each), and returns its tensors in the order its selections were given, in host memory.
  /// Throws `InvalidSlice` when the collective's size is not the plan's world, `Io` when a read
  /// fails, and whatever the collective throws.
  [[nodiscard]] std::vector<TensorView> load(Collective& c) const {
    const std::size_t rank = checked_rank(c);
    auto lens = plan_->result_lens(rank);
    std::vector<std::shared_ptr<std::byte[]>> buffers;
    buffers.reserve(lens.size());
    for (std::size_t i = 0; i < lens.size(); ++i)
      buffers.push_back(detail::allocate_bytes(static_cast<std::size_t>(lens[i]), "a rank's tensor").value());
    const auto parts = detail::attempt([&](ffi::Status& st) { return plan_->parts(rank, st); }).value();
    std::size_t next_part = 0;
    std::shared_ptr<std::byte[]> staging;
    std::size_t staging_len = 0;
    // The core's walk: turns of this rank's own reads (bounded), each shared step alone.
    const auto walk =
        detail::attempt([&](ffi::Status& st) { return plan_->walk(rank, max_step_bytes_, st); }).value();
    for (const auto& t : walk.turns) {
      const auto len = static_cast<std::size_t>(t.len);
      if (len > staging_len) {
        staging = detail::allocate_bytes(len, "a shared read").value();
        staging_len = len;
      }
      std::span<std::byte> buf{staging.get(), len};
      const auto steps = detail::turn_steps(walk, t);
      if (t.reads) {
        ::rust::Slice<std::uint8_t> dst{reinterpret_cast<std::uint8_t*>(buf.data()), buf.size()};
        detail::attempt([&](ffi::Status& st) { plan_->read_steps(steps, dst, st); }).throw_if_error();
      }
      if (t.shared) c.broadcast(buf, t.reader);
      // The core copies each request's bytes out of its step, walking its selection: a
      // strided selection is one step here, not one per element.
      std::size_t base = 0;
      for (const std::size_t i : steps) {
        const auto step_len = static_cast<std::size_t>(plan_->step(i).len);
        const ::rust::Slice<const std::uint8_t> from{reinterpret_cast<const std::uint8_t*>(buf.data() + base),
                                                     step_len};
        for (; next_part < parts.size() && parts.data()[next_part].step == i; ++next_part) {
          const auto& p = parts.data()[next_part];
          ::rust::Slice<std::uint8_t> to{reinterpret_cast<std::uint8_t*>(buffers[p.request].get()),
                                         static_cast<std::size_t>(lens[p.request])};
          detail::attempt([&](ffi::Status& st) {
            plan_->scatter(rank, i, p.request, from, to, st);
          }).throw_if_error();
        }
        base += step_len;
      }
    }
    std::vector<TensorView> out;
    out.reserve(lens.size());
    for (std::size_t i = 0; i < lens.size(); ++i) {
      const auto& sh = shapes_[rank][i];
      std::span<const std::byte> data{buffers[i].get(), static_cast<std::size_t>(lens[i])};
      out.push_back(TensorView{sh.dtype, sh.shape(), data, std::move(buffers[i])});
    }
    return out;
  }

 private:
  friend struct detail::DeviceLoad;

  /// The collective's rank, once the core has checked its size against the plan's world.
  [[nodiscard]] std::size_t checked_rank(const Collective& c) const {
    const std::size_t rank = c.rank();
    detail::attempt([&](ffi::Status& st) { plan_->check_collective(rank, c.size(), st); }).throw_if_error();
    return rank;
  }

  /// What a request gives back, shared with the selection it came from (not copied: a plan
  /// over many ranks holds one per tensor per rank).
  struct Shape {
    std::shared_ptr<const std::string> name;
    Dtype dtype;
    std::shared_ptr<const ffi::SlicePlan> plan;  // its shape is the result's
    [[nodiscard]] std::vector<std::size_t> shape() const {
      const auto s = plan->shape();
      return {s.data, s.data + s.len};
    }
  };
  std::shared_ptr<const ffi::DistPlan> plan_;
  std::size_t max_step_bytes_ = 0;
  std::vector<std::vector<Shape>> shapes_;
  std::vector<std::shared_ptr<const void>> owners_;  // keeps the files the plan reads open
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
