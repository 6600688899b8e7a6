// Private: what the reading headers need to open remote files without including
// safetensors/remote.hpp, whose `RemoteOptions` holds `std::chrono` durations (<chrono> costs
// every translation unit about 0.05 s; docs/benchmarks.md, "What the headers cost"). The
// `open_remote` functions are templates on their options' type, so nothing of them is compiled
// unless a program calls them, and a program that passes a `RemoteOptions` has included
// remote.hpp, which defines `remote_options`.
#pragma once

#include "safetensors/abi.hpp"

#include "safetensors/detail/bridge.hpp"
#include "safetensors/ffi/src/remote.rs.h"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

struct RemoteOptions;  // safetensors/remote.hpp

namespace detail {
/// `RemoteOptions` as it crosses into the core (defined in safetensors/remote.hpp).
inline ffi::RemoteOptions remote_options(const RemoteOptions& o);
}  // namespace detail

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
