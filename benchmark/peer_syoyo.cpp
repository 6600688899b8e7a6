// See peer_syoyo.hpp. Compiled with the peer's header only when a checkout is given; otherwise
// `built()` is false and nothing else is called.
#include "peer_syoyo.hpp"

#include <cstring>
#include <stdexcept>

#if defined(BENCH_SYOYO)
#define SAFETENSORS_CPP_IMPLEMENTATION
#include "safetensors.hh"
#endif

namespace peer_syoyo {

#if defined(BENCH_SYOYO)

namespace {

/// The same checksum as ours (measure::checksum): 8-byte words, then the tail bytes.
std::uint64_t checksum(const std::uint8_t* p, std::size_t n) {
  std::uint64_t sum = 0;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    sum += w;
  }
  for (; i < n; ++i) sum += p[i];
  return sum;
}

void check(bool ok, const std::string& what, const std::string& path, const std::string& err) {
  if (!ok) throw std::runtime_error("syoyo/safetensors-cpp " + what + " of " + path + " failed: " + err);
}

}  // namespace

bool built() {
  return true;
}

namespace {

/// Maps `path` with the peer's `mmap_from_file`, then sums `each(file, tensor)` over its tensors.
template <class Each>
std::uint64_t mapped_sum(const std::string& path, Each each) {
  safetensors::safetensors_t st;
  std::string warn, err;
  check(safetensors::mmap_from_file(path, &st, &warn, &err), "mmap_from_file", path, err);
  std::uint64_t sink = 0;
  for (std::size_t i = 0; i < st.tensors.size(); ++i) {
    safetensors::tensor_t t;
    st.tensors.at(i, &t);
    sink += each(st, t);
  }
  return sink;
}

}  // namespace

std::uint64_t open_all(const std::string& path) {
  return mapped_sum(path, [](const safetensors::safetensors_t&, const safetensors::tensor_t& t) {
    return static_cast<std::uint64_t>(t.shape.size());
  });
}

std::uint64_t read_all(const std::string& path) {
  return mapped_sum(path, [](const safetensors::safetensors_t& st, const safetensors::tensor_t& t) {
    return checksum(st.databuffer_addr + t.data_offsets[0], t.data_offsets[1] - t.data_offsets[0]);
  });
}

std::uint64_t copy_all(const std::string& path) {
  safetensors::safetensors_t st;
  std::string warn, err;
  check(safetensors::load_from_file(path, &st, &warn, &err), "load_from_file", path, err);
  std::uint64_t sink = st.storage.size();
  for (std::size_t i = 0; i < st.tensors.size(); ++i) {
    safetensors::tensor_t t;
    st.tensors.at(i, &t);
    if (t.data_offsets[1] > t.data_offsets[0]) sink += st.storage[t.data_offsets[0]];
  }
  return sink;
}

#else

bool built() {
  return false;
}
std::uint64_t open_all(const std::string&) {
  throw std::logic_error("syoyo peer not built");
}
std::uint64_t read_all(const std::string&) {
  throw std::logic_error("syoyo peer not built");
}
std::uint64_t copy_all(const std::string&) {
  throw std::logic_error("syoyo peer not built");
}

#endif

}  // namespace peer_syoyo
