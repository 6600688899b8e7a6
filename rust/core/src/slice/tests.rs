//! Slice plans against NumPy's rules: shapes, runs, merging, steps, negative bounds, and the
//! errors for what does not fit.

use super::*;

fn info<'a>(dtype: Dtype, shape: &'a [usize]) -> TensorInfo<'a> {
    let numel: usize = shape.iter().product();
    TensorInfo {
        name: "t",
        dtype,
        shape,
        data_offsets: (0, numel * dtype.bits() / 8),
    }
}

/// Reference semantics: enumerate every selected element's byte offset in row-major order.
fn naive(shape: &[usize], idx: &[Indexer], elem: usize) -> (Vec<usize>, Vec<usize>) {
    let dims: Vec<Resolved> = shape
        .iter()
        .enumerate()
        .map(|(a, &s)| resolve(idx.get(a).copied().unwrap_or(Indexer::FULL), s).unwrap())
        .collect();
    let mut strides = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * shape[a + 1];
    }
    let mut out = vec![];
    let total: usize = dims.iter().map(|d| d.count).product();
    for mut flat in 0..total {
        let mut off = 0;
        for a in (0..shape.len()).rev() {
            let i = flat % dims[a].count;
            flat /= dims[a].count;
            off += (dims[a].start + i * dims[a].step) * strides[a];
        }
        out.push(off * elem);
    }
    out.sort_unstable();
    let new_shape = dims.iter().filter(|d| d.keep).map(|d| d.count).collect();
    (out, new_shape)
}

fn expand(plan: &SlicePlan, elem: usize) -> Vec<usize> {
    plan.runs()
        .flat_map(|(o, l)| (0..l / elem).map(move |k| o + k * elem))
        .collect()
}

#[test]
fn matches_elementwise_enumeration() {
    let shape = [3usize, 4, 5];
    let choices = [
        Indexer::FULL,
        Indexer::Select(1),
        Indexer::Select(-1),
        Indexer::range(1, 3),
        Indexer::range(0, 0),
        Indexer::Range {
            start: Some(0),
            stop: None,
            step: 2,
        },
        Indexer::Range {
            start: Some(-2),
            stop: None,
            step: 1,
        },
        Indexer::Range {
            start: Some(1),
            stop: Some(3),
            step: 3,
        },
    ];
    for a in choices {
        for b in choices {
            for c in choices {
                for given in 0..=3 {
                    // Fewer indexers than axes: the rest are taken whole.
                    let idx = &[a, b, c][..given];
                    let i = info(Dtype::F32, &shape);
                    let plan = SlicePlan::new(&i, idx).unwrap();
                    let (want, want_shape) = naive(&shape, idx, 4);
                    assert_eq!(expand(&plan, 4), want, "{idx:?}");
                    assert_eq!(plan.shape(), want_shape.as_slice(), "{idx:?}");
                    let runs: Vec<_> = plan.runs().collect();
                    for w in runs.windows(2) {
                        assert!(
                            w[0].0 + w[0].1 < w[1].0,
                            "runs not maximal for {idx:?}: {runs:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn runs_in_a_range_are_the_runs_clipped_to_it() {
    let shape = [4usize, 3, 6];
    let i = info(Dtype::U16, &shape);
    let choices = [
        Indexer::FULL,
        Indexer::Select(2),
        Indexer::range(1, 3),
        Indexer::Range {
            start: Some(1),
            stop: None,
            step: 2,
        },
    ];
    for a in choices {
        for b in choices {
            for c in choices {
                let plan = SlicePlan::new(&i, &[a, b, c]).unwrap();
                // Every selected byte as (tensor offset, result offset).
                let bytes: Vec<(usize, usize)> = plan
                    .runs()
                    .flat_map(|(o, l)| o..o + l)
                    .enumerate()
                    .map(|(out, src)| (src, out))
                    .collect();
                let flat = |parts: Placed<'_>| -> Vec<(usize, usize)> {
                    parts
                        .flat_map(|(src, out, len)| (0..len).map(move |k| (src + k, out + k)))
                        .collect()
                };
                let total = plan.byte_len();
                for (lo, hi) in [(0, 144), (0, 7), (5, 77), (40, 41), (100, 144), (30, 30)] {
                    let want: Vec<_> = bytes
                        .iter()
                        .copied()
                        .filter(|b| (lo..hi).contains(&b.0))
                        .collect();
                    assert_eq!(
                        flat(plan.runs_in_tensor(lo, hi)),
                        want,
                        "{a:?} {b:?} {c:?} {lo}..{hi}"
                    );
                    let (lo, hi) = (lo.min(total), hi.min(total));
                    let want: Vec<_> = bytes
                        .iter()
                        .copied()
                        .filter(|b| (lo..hi).contains(&b.1))
                        .collect();
                    assert_eq!(
                        flat(plan.runs_in_result(lo, hi)),
                        want,
                        "{a:?} {b:?} {c:?} result {lo}..{hi}"
                    );
                    for from in [0, 1, 3, 10] {
                        let want: Vec<_> = want.iter().copied().filter(|b| b.1 >= from).collect();
                        assert_eq!(flat(plan.runs_in_result(lo, hi).starting_at(from)), want);
                    }
                }
                assert_eq!(
                    plan.extent(),
                    bytes.first().map(|f| (f.0, bytes.last().unwrap().0 + 1))
                );
            }
        }
    }
}

#[test]
fn too_many_indexers_is_invalid_slice() {
    let e = SlicePlan::new(&info(Dtype::F32, &[2]), &[Indexer::FULL, Indexer::FULL]).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidSlice);
}

#[test]
fn out_of_range_is_an_error_not_clamped() {
    let i = info(Dtype::F32, &[4]);
    for bad in [
        Indexer::Select(4),
        Indexer::Select(-5),
        Indexer::range(0, 5),
        Indexer::range(-5, 2),
    ] {
        assert_eq!(
            SlicePlan::new(&i, &[bad]).unwrap_err().kind(),
            crate::ErrorKind::InvalidSlice
        );
    }
    assert_eq!(
        SlicePlan::new(&i, &[Indexer::range(4, 4)]).unwrap().shape(),
        &[0]
    );
}

#[test]
fn start_after_stop_is_empty() {
    let plan = SlicePlan::new(&info(Dtype::F32, &[4, 2]), &[Indexer::range(3, 1)]).unwrap();
    assert_eq!(plan.shape(), &[0, 2]);
    assert_eq!(plan.byte_len(), 0);
    assert_eq!(plan.runs().count(), 0);
}

#[test]
fn sub_byte_slices_must_stay_on_byte_boundaries() {
    let i = info(Dtype::F4, &[4, 4]);
    assert!(SlicePlan::new(&i, &[Indexer::range(1, 3)]).is_ok());
    assert_eq!(
        SlicePlan::new(&i, &[Indexer::FULL, Indexer::range(1, 3)])
            .unwrap_err()
            .kind(),
        crate::ErrorKind::MisalignedSlice
    );
    let ok = SlicePlan::new(&i, &[Indexer::FULL, Indexer::range(2, 4)]).unwrap();
    assert_eq!(
        ok.runs().collect::<Vec<_>>(),
        [(1, 1), (3, 1), (5, 1), (7, 1)]
    );
}

#[test]
fn non_positive_step_is_refused() {
    let i = info(Dtype::U8, &[4]);
    for step in [0, -1] {
        let r = Indexer::Range {
            start: None,
            stop: None,
            step,
        };
        assert_eq!(
            SlicePlan::new(&i, &[r]).unwrap_err().kind(),
            crate::ErrorKind::InvalidSlice
        );
    }
}

#[test]
fn gather_copies_the_runs() {
    let bytes: Vec<u8> = (0..24).collect();
    let i = info(Dtype::U8, &[4, 6]);
    let plan = SlicePlan::new(
        &i,
        &[
            Indexer::range(1, 3),
            Indexer::Range {
                start: Some(0),
                stop: None,
                step: 2,
            },
        ],
    )
    .unwrap();
    let mut out = vec![0; plan.byte_len()];
    plan.gather(&bytes, &mut out).unwrap();
    assert_eq!(out, [6, 8, 10, 12, 14, 16]);
    for (src, dst) in [(&bytes[1..], out.len()), (&bytes[..], out.len() + 1)] {
        let mut dst = vec![0; dst];
        let e = plan.gather(src, &mut dst).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidSlice, "{e}");
        assert!(e.to_string().starts_with("wrong buffer length: "), "{e}");
    }
}

#[test]
fn a_tensor_that_cannot_exist_has_no_plan() {
    let i = info(Dtype::F4, &[3]);
    let e = SlicePlan::new(&i, &[Indexer::range(0, 2)]).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::MisalignedSlice);
    let huge = [usize::MAX, 2];
    let i = TensorInfo {
        name: "t",
        dtype: Dtype::U8,
        shape: &huge,
        data_offsets: (0, 0),
    };
    let e = SlicePlan::new(&i, &[Indexer::Select(0)]).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::ValidationOverflow);
}

#[test]
fn contiguous_is_at_most_one_run_after_merging() {
    let t = info(Dtype::F32, &[4, 3]);
    let plan = |idx: &[Indexer]| SlicePlan::new(&t, idx).unwrap();
    assert!(plan(&[]).is_contiguous());
    // Whole rows touch and merge into one run.
    assert!(plan(&[Indexer::range(1, 3)]).is_contiguous());
    assert!(plan(&[Indexer::Select(2)]).is_contiguous());
    assert!(plan(&[Indexer::range(3, 1)]).is_contiguous());
    // A column, or every other row, leaves gaps.
    let column = [Indexer::range(0, 4), Indexer::Select(1)];
    assert!(!plan(&column).is_contiguous());
    let strided = [Indexer::Range {
        start: None,
        stop: None,
        step: 2,
    }];
    assert!(!plan(&strided).is_contiguous());
}
