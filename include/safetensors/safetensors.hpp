// The safetensors C++20 API: one include for everything.
//
//   #include <safetensors/safetensors.hpp>
//   safetensors::SafeOpen f("model.safetensors");
//   auto w = f.get_tensor("wte.weight");          // zero-copy view into the mapped file
//   std::span<const float> values = w.as<float>();
#pragma once

#include "safetensors/checkpoint.hpp"
#include "safetensors/convert.hpp"
#include "safetensors/cuda.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/options.hpp"
#include "safetensors/prefetch.hpp"
#include "safetensors/request.hpp"
#include "safetensors/safe_open.hpp"
#include "safetensors/slice.hpp"
#include "safetensors/stream.hpp"
#include "safetensors/tensor.hpp"
#include "safetensors/version.hpp"
#include "safetensors/writer.hpp"
