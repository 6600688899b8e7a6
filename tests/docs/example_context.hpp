// What the C++ examples of the README, of docs/ and of the public headers take as given, so that
// each compiles as written (tests/docs/compile_examples.py turns every example into a function):
// the public headers, `using namespace safetensors`, and the objects examples name without
// declaring them (an open file `f`, a tensor `view`, this `rank` of a `world`, ...), passed as the
// function's parameters. An example may declare the same names itself: its code sits in a nested block.
#pragma once

#include <safetensors/collective.hpp>
#include <safetensors/distributed.hpp>
#include <safetensors/distributed_cuda.hpp>
#include <safetensors/nccl.hpp>
#include <safetensors/prefetch.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>
#include <safetensors/tensor_parallel.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

using namespace safetensors;

/// Functions the examples call that stand for the reader's own code.
std::vector<std::byte> download();
void consumer(const void* dlpack_tensor);
void consumer_takes_ownership(const void* dlpack_tensor);
void show_progress(std::uint64_t bytes_done);
void transform(const TensorView& tensor);

#define SAFETENSORS_EXAMPLE_GIVEN                                                                       \
  SafeOpen &f, Checkpoint &ckpt, TensorView &view, TensorView &w, Selection &cols, std::size_t rank,    \
      std::size_t world, Collective &comm, LoadPlan &plan, std::span<std::byte> my_span,                \
      std::span<std::byte> my_buffer, void *my_device_ptr, void *my_stream,                             \
      const std::filesystem::path &index, std::shared_ptr<NcclLibrary> nccl, const NcclLibrary::Id &id, \
      int argc, char **argv
