//! Per-tensor costs stay bounded by the shape: planning a slice of a tensor of huge rank (built
//! in memory: files are limited to `MAX_RANK` dimensions) allocates little beyond the result's
//! shape, measured with a counting allocator.

mod common;

use common::alloc::{measuring, peak_during};
use common::scratch_dir;
use safetensors_core::{
    serialize, Backend, Dtype, Indexer, SafeFile, SlicePlan, TensorInfo, TensorView, MAX_RANK,
};

#[global_allocator]
static ALLOCATOR: common::alloc::Counting = common::alloc::Counting;

const RANK: usize = 4_000_000;

#[test]
fn planning_a_slice_of_a_huge_rank_tensor_costs_about_its_result_shape() {
    let _turn = measuring();
    let mut shape = vec![1usize; RANK];
    shape[0] = 4;
    shape[RANK - 1] = 2;
    let info = TensorInfo {
        name: "deep",
        dtype: Dtype::U8,
        shape: &shape,
        data_offsets: (0, 8),
    };
    let shape_bytes = RANK * std::mem::size_of::<usize>();
    let requests: [&[Indexer]; 3] = [&[Indexer::range(1, 3)], &[Indexer::Select(2)], &[]];
    for indexers in requests {
        let (plan, peak) = peak_during(|| SlicePlan::new(&info, indexers).unwrap());
        // The result's shape is the one allocation proportional to the rank.
        assert!(
            peak <= shape_bytes + 64 * 1024,
            "{indexers:?}: peak {peak} bytes for a {shape_bytes}-byte result shape"
        );
        let want_first = match indexers.first() {
            Some(Indexer::Select(_)) => 1,
            Some(_) => 2,
            None => 4,
        };
        assert_eq!(plan.shape().iter().product::<usize>(), want_first * 2);
    }
    let plan = SlicePlan::new(&info, &[Indexer::range(1, 3)]).unwrap();
    assert_eq!(plan.runs().collect::<Vec<_>>(), [(2, 4)]);
    assert_eq!(plan.shape().len(), RANK);
}

#[test]
fn a_slice_error_about_a_huge_rank_tensor_is_short() {
    let _turn = measuring();
    let shape = vec![1usize; RANK];
    let info = TensorInfo {
        name: "deep",
        dtype: Dtype::U8,
        shape: &shape,
        data_offsets: (0, 1),
    };
    let too_many = vec![Indexer::FULL; RANK + 1];
    let err = SlicePlan::new(&info, &too_many).err().unwrap();
    assert!(
        err.to_string().len() < 200,
        "{} bytes",
        err.to_string().len()
    );
    assert!(err.to_string().contains("rank 4000000"), "{err}");
}

#[test]
fn slicing_a_tensor_of_the_largest_rank_from_a_file_reads_the_right_bytes() {
    let _turn = measuring();
    let dir = scratch_dir("huge_rank_file");
    let rank = MAX_RANK;
    let mut shape = vec![1usize; rank];
    shape[0] = 3;
    let data = [10u8, 11, 12];
    let bytes = serialize([("t", TensorView::new(Dtype::U8, &shape, &data))], None).unwrap();
    std::fs::write(dir.join("deep.safetensors"), bytes).unwrap();
    for backend in [Backend::Mmap, Backend::Read] {
        let f = SafeFile::open(dir.join("deep.safetensors"), backend).unwrap();
        let plan = f.plan_slice("t", &[Indexer::Select(-1)]).unwrap();
        assert_eq!(plan.shape().len(), rank - 1);
        let mut out = vec![0u8; plan.byte_len()];
        f.read_slice("t", &plan, &mut out).unwrap();
        assert_eq!(out, [12]);
    }
}
