// `Collective` over MPI, for host memory. Header-only and optional: include it only in programs
// that build with an MPI implementation (CMake: link `safetensors::mpi`, present when the
// package found MPI).
#pragma once

#include "safetensors/abi.hpp"

// The C API only: Open MPI's and MPICH's deprecated C++ bindings would need their own library.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "safetensors/collective.hpp"
#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/overlap.hpp"
#include "safetensors/error.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// A `Collective` on an MPI communicator (not owned; `MPI_COMM_WORLD` by default). MPI must be
/// initialised before and finalised after its use.
///
///   MPI_Init(&argc, &argv);
///   safetensors::MpiCollective comm;                 // MPI_COMM_WORLD
///   auto mine = plan.load(comm);
///
/// Errors an MPI call returns are `Io` errors naming the call (MPI's default handler aborts the
/// job before that; set `MPI_ERRORS_RETURN` on the communicator to get them).
class MpiCollective final : public Collective {
 public:
  explicit MpiCollective(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    int r = 0;
    int n = 0;
    check(MPI_Comm_rank(comm_, &r), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &n), "MPI_Comm_size");
    rank_ = static_cast<std::size_t>(r);
    size_ = static_cast<std::size_t>(n);
  }

  [[nodiscard]] std::size_t rank() const override { return rank_; }
  [[nodiscard]] std::size_t size() const override { return size_; }

  void broadcast(std::span<std::byte> bytes, std::size_t root) override {
    // MPI counts are `int`: larger buffers go in chunks.
    for (std::size_t at = 0; at < bytes.size(); at += chunk) {
      int n = static_cast<int>(std::min(chunk, bytes.size() - at));
      check(MPI_Bcast(bytes.data() + at, n, MPI_BYTE, static_cast<int>(root), comm_), "MPI_Bcast");
    }
  }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    // Divided rather than multiplied, so that no size wraps to one that seems to fit.
    if (size_ == 0 || all.size() % size_ != 0 || all.size() / size_ != mine.size()) {
      detail::raise(ErrorKind::InvalidSlice, "all_gather needs " + std::to_string(size_) + " × " +
                                                 std::to_string(mine.size()) + " destination bytes, got " +
                                                 std::to_string(all.size()));
    }
    // MPI forbids a send buffer inside the receive buffer (MPI_IN_PLACE is the way to say that).
    if (auto st = detail::refuse_overlap("all_gather", mine, all); !st.ok()) detail::raise(st);
    if (mine.size() <= chunk) {
      check(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(),
                          static_cast<int>(mine.size()), MPI_BYTE, comm_),
            "MPI_Allgather");
      return;
    }
    // One chunk from every rank: world GiB, which a host may not have (an `Io` error then).
    auto tmp = detail::checked_vector<std::byte>(chunk * size_, "an all-gather's staging buffer",
                                                 "gather less than 1 GiB per rank at a time")
                   .value();
    for (std::size_t at = 0; at < mine.size(); at += chunk) {
      std::size_t n = std::min(chunk, mine.size() - at);
      check(MPI_Allgather(mine.data() + at, static_cast<int>(n), MPI_BYTE, tmp.data(), static_cast<int>(n),
                          MPI_BYTE, comm_),
            "MPI_Allgather");
      for (std::size_t r = 0; r < size_; ++r)
        std::memcpy(all.data() + r * mine.size() + at, tmp.data() + r * n, n);
    }
  }

 private:
  static constexpr std::size_t chunk = std::size_t{1} << 30;

  static void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    detail::raise(ErrorKind::Io,
                  std::string(what) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
  }

  MPI_Comm comm_;
  std::size_t rank_ = 0;
  std::size_t size_ = 0;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
