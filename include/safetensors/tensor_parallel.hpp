// Tensor-parallel selections of a `Slice`: even/uneven splits, column- and row-parallel linear
// layers, and grouped-query attention projections. The rules themselves live in the Rust core
// (`rust/core/src/distributed/tp.rs`); these helpers ask it once and return ordinary selections.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/slices.hpp"
#include "safetensors/ffi/src/distributed.rs.h"
#include "safetensors/slice.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// How a dimension the world may not divide is split.
enum class Split : std::uint8_t {
  Even,    ///< Every rank the same share; a remainder is an `InvalidSlice` error.
  Uneven,  ///< The first `len % world` ranks get one more (like `numpy.array_split`); may be empty.
};

/// The attention geometry of a grouped-query attention layer (`kv_heads == heads` without GQA).
struct Gqa {
  std::size_t heads = 0;
  std::size_t kv_heads = 0;
  std::size_t head_dim = 0;
};

/// One projection stored as its own tensor (`q_proj`, `k_proj`, `v_proj`).
enum class Projection : std::uint8_t { Q, K, V };

/// A rank's three blocks of a fused `qkv_proj` tensor.
struct QkvSelection {
  Selection q;
  Selection k;
  Selection v;
};

namespace detail {
inline Selection tp_select(const Slice& s, const ffi::TpRule& rule) {
  return Access<Slice>::select_by(s, [&](const ffi::File& f, std::size_t index,
                                         ffi::Status& st) { return ffi::plan_tp(f, index, rule, st); })
      .value();
}
inline ffi::TpRule tp_rule(ffi::TpKind kind, std::size_t rank, std::size_t world) {
  return ffi::TpRule{kind, 0, rank, world, false, 0, 0, 0, ffi::Projection::Q, false};
}
/// The attention rule for rank `rank` of `world`: projection `p` (of a fused tensor when
/// `fused`) under the geometry `g`.
inline ffi::TpRule attention_rule(Gqa g, Projection p, bool fused, std::size_t rank, std::size_t world) {
  auto rule = tp_rule(ffi::TpKind::Attention, rank, world);
  rule.heads = g.heads;
  rule.kv_heads = g.kv_heads;
  rule.head_dim = g.head_dim;
  rule.projection = static_cast<ffi::Projection>(p);
  rule.fused = fused;
  return rule;
}
}  // namespace detail

/// Rank `rank` of `world`'s share of dimension `dim`; the other dimensions whole.
///
///   auto mine = shard(f.get_slice("lm_head.weight"), 0, rank, world).read();
[[nodiscard]] inline Selection shard(const Slice& s, std::size_t dim, std::size_t rank, std::size_t world,
                                     Split split = Split::Even) {
  auto rule = detail::tp_rule(ffi::TpKind::Split, rank, world);
  rule.dim = dim;
  rule.uneven = split == Split::Uneven;
  return detail::tp_select(s, rule);
}

/// A column-parallel linear layer's share (Megatron/vLLM `ColumnParallelLinear`): the weight
/// `[out, in]` and its bias `[out]` split along the output dimension, 0.
[[nodiscard]] inline Selection column_parallel(const Slice& s, std::size_t rank, std::size_t world,
                                               Split split = Split::Even) {
  return shard(s, 0, rank, world, split);
}

/// A row-parallel linear layer's share (`RowParallelLinear`): the weight `[out, in]` split along
/// the input dimension, 1. A bias (one dimension) is not split: every rank holds it whole, as the
/// layer adds it once after the all-reduce.
[[nodiscard]] inline Selection row_parallel(const Slice& s, std::size_t rank, std::size_t world,
                                            Split split = Split::Even) {
  if (s.shape().size() <= 1) return s.select({});
  return shard(s, 1, rank, world, split);
}

/// A rank's rows of one attention projection stored on its own, by vLLM's `QKVParallelLinear`
/// rule: query heads divided evenly; KV heads divided when the world is smaller than them, else
/// replicated so that `world / kv_heads` consecutive ranks share one. Indivisible layouts are
/// `InvalidSlice`; so is a tensor whose dimension 0 is not the projection's row count.
[[nodiscard]] inline Selection attention_shard(const Slice& s, Gqa g, Projection p, std::size_t rank,
                                               std::size_t world) {
  return detail::tp_select(s, detail::attention_rule(g, p, false, rank, world));
}

/// A rank's q, k and v blocks of a fused `qkv_proj` (`(heads + 2 * kv_heads) * head_dim` rows,
/// q then k then v), by the same rule as `attention_shard`.
///
///   auto [q, k, v] = qkv_shard(f.get_slice("attn.qkv_proj.weight"), {32, 8, 128}, rank, world);
[[nodiscard]] inline QkvSelection qkv_shard(const Slice& s, Gqa g, std::size_t rank, std::size_t world) {
  auto part = [&](Projection p) {
    return detail::tp_select(s, detail::attention_rule(g, p, true, rank, world));
  };
  return {part(Projection::Q), part(Projection::K), part(Projection::V)};
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
