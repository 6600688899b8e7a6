// The everyday safetensors C++20 API in one include: opening and reading files (views, slices),
// sharded checkpoints, writing, dtype conversion. The heavier parts have headers of their own,
// included where they are used: safetensors/cuda.hpp (GPU uploads), prefetch.hpp and stream.hpp
// (cold loads), distributed.hpp (multi-rank loading), dlpack.hpp, mpi.hpp, nccl.hpp.
//
//   #include <safetensors/safetensors.hpp>
//   safetensors::SafeOpen f("model.safetensors");
//   auto w = f.get_tensor("wte.weight");          // zero-copy view into the mapped file
//   std::span<const float> values = w.as<float>();
#pragma once

#include "safetensors/checkpoint.hpp"
#include "safetensors/convert.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/options.hpp"
#include "safetensors/path.hpp"
#include "safetensors/remote.hpp"
#include "safetensors/safe_open.hpp"
#include "safetensors/slice.hpp"
#include "safetensors/streaming_writer.hpp"
#include "safetensors/tensor.hpp"
#include "safetensors/version.hpp"
#include "safetensors/writer.hpp"
