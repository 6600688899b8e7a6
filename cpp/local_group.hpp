// W threads of one process as the ranks of a `safetensors::Collective`: host broadcasts and
// all-gathers through pointers published between two barriers. The multi-rank tests
// (tests/cpp/multi_rank.hpp) and bench_cpp's `ranks` item (benchmark/bench_ranks.hpp) run their
// worlds on it, each adding a device broadcast of its own.
#pragma once

#include <safetensors/collective.hpp>

#include <barrier>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace local {

class Group {
 public:
  explicit Group(std::size_t world)
      : world_(world), sync_(static_cast<std::ptrdiff_t>(world)), slots_(world) {}

  class Member : public safetensors::Collective {
   public:
    Member(Group& g, std::size_t rank) : g_(g), rank_(rank) {}
    [[nodiscard]] std::size_t rank() const override { return rank_; }
    [[nodiscard]] std::size_t size() const override { return g_.world_; }
    void broadcast(std::span<std::byte> bytes, std::size_t root) override {
      if (rank_ == root) g_.slots_[root] = bytes.data();
      g_.sync_.arrive_and_wait();
      if (rank_ != root && !bytes.empty()) std::memcpy(bytes.data(), g_.slots_[root], bytes.size());
      g_.sync_.arrive_and_wait();
      host_broadcasts++;
    }
    void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override {
      g_.slots_[rank_] = const_cast<std::byte*>(mine.data());
      g_.sync_.arrive_and_wait();
      for (std::size_t r = 0; r < g_.world_; ++r) {
        if (!mine.empty()) std::memcpy(all.data() + r * mine.size(), g_.slots_[r], mine.size());
      }
      g_.sync_.arrive_and_wait();
    }
    std::size_t host_broadcasts = 0;

   protected:
    Group& g_;
    std::size_t rank_;
  };

 protected:
  std::size_t world_;
  std::barrier<> sync_;
  std::vector<std::byte*> slots_;
};

}  // namespace local
