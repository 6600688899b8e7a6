//! Multi-rank loading: the tensor-parallel shard rules and the plan that reads every needed byte
//! once across ranks. Pure computation over offsets; the collective that moves the bytes lives in
//! the C++ layer (`include/safetensors/distributed.hpp`).

mod need;
mod plan;
mod segments;
mod tp;

pub use need::{Need, Part, Piece, Step, MERGE_GAP, SMALL_SEGMENT};
pub use plan::{LoadPlan, Pieces};
pub use tp::{
    qkv_indexers, qkv_part_rows, qkv_rows, shard_indexers, shard_range, Gqa, QkvPart, QkvRows,
    Split,
};
