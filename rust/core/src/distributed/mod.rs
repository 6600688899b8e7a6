//! Multi-rank loading: the tensor-parallel shard rules and the plan that reads every needed byte
//! once across ranks. Pure computation over offsets, down to a rank's walk over the steps and its
//! results' device layout (`walk.rs`), and the needs gathered from files and the steps read
//! back out of them (`world.rs`); the bindings only move the bytes and call the collective
//! (`include/safetensors/distributed.hpp`, `distributed_cuda.hpp`).

mod need;
mod plan;
mod segments;
mod tp;
mod walk;
mod world;

pub use need::{Need, Part, Piece, Step, MERGE_GAP, SMALL_SEGMENT};
pub use plan::{LoadPlan, Pieces};
pub use tp::{
    qkv_indexers, qkv_part_rows, qkv_rows, shard_indexers, shard_range, Gqa, QkvPart, QkvRows,
    Split,
};
pub use walk::{Layout, Turn, Walk, MAX_TURN_BYTES};
pub use world::{FilePlan, Needs};
