//! Memory in proportion to bytes: planning a prefetch, advice, an upload or a multi-rank load
//! of a strided selection costs a record per merged range (or per selection), not one per run.
//! Every other byte of a 16 MiB tensor is 8 Mi one-byte runs; each of these plans used to hold
//! them one by one (hundreds of megabytes). Measured with a counting allocator.

mod common;

use std::sync::Arc;

use common::alloc::{measuring, peak_during};
use common::{raw_file, scratch_dir};
use safetensors_core::distributed::{LoadPlan, Need};
use safetensors_core::upload::UploadPlan;
use safetensors_core::{advise, Advice, Backend, Indexer, Plan, Request, SafeFile, Source};

#[global_allocator]
static ALLOCATOR: common::alloc::Counting = common::alloc::Counting;

const LEN: usize = 16 << 20;

/// What a plan may allocate for one selection, whatever its number of runs.
const SMALL: usize = 64 << 10;

fn every_other() -> Vec<Indexer> {
    vec![Indexer::Range {
        start: None,
        stop: None,
        step: 2,
    }]
}

fn wide_file(name: &str) -> SafeFile {
    let dir = scratch_dir(name);
    let path = dir.join("wide.safetensors");
    let json = format!(r#"{{"t":{{"dtype":"U8","shape":[{LEN}],"data_offsets":[0,{LEN}]}}}}"#);
    std::fs::write(&path, raw_file(&json, LEN)).unwrap();
    SafeFile::open(&path, Backend::Mmap).unwrap()
}

#[test]
fn a_prefetch_plan_of_a_strided_selection_is_one_range() {
    let _turn = measuring();
    let f = Arc::new(wide_file("proportional_prefetch"));
    let files = [f.clone()];
    let requests = [Request::slice("t", every_other())];
    let (plan, peak) = peak_during(|| Plan::of(Source::Files(&files), Some(&requests)).unwrap());
    assert!(peak < SMALL, "{peak} bytes to plan a prefetch");
    // The one-byte gaps are warmed with the bytes around them.
    assert_eq!(plan.ranges(), [(0, LEN as u64 - 1)]);
    let ((), peak) = peak_during(|| advise(&f, &plan, Advice::WillNeed).unwrap());
    assert!(peak < SMALL, "{peak} bytes to advise");
    let slice = f.plan_slice("t", &every_other()).unwrap();
    let mut by_hand = Plan::new(&f);
    let ((), peak) = peak_during(|| by_hand.add_slice(&f, "t", &slice).unwrap());
    assert!(peak < SMALL, "{peak} bytes to add a slice to a plan");
    assert_eq!(by_hand.ranges(), plan.ranges());
}

#[test]
fn runs_of_a_slice_a_page_apart_or_more_stay_separate_ranges() {
    let f = wide_file("proportional_pages");
    // Every 8192nd byte: the pages between the runs are not warmed.
    let slice = f
        .plan_slice(
            "t",
            &[Indexer::Range {
                start: None,
                stop: None,
                step: 8192,
            }],
        )
        .unwrap();
    let mut plan = Plan::new(&f);
    plan.add_slice(&f, "t", &slice).unwrap();
    assert_eq!(plan.ranges().len(), LEN / 8192);
    assert_eq!(plan.total_bytes(), (LEN / 8192) as u64);
}

#[test]
fn an_upload_plan_of_a_strided_selection_is_one_piece() {
    let _turn = measuring();
    let f = wide_file("proportional_upload");
    let mut plan = UploadPlan::new(256);
    let (placement, peak) =
        peak_during(|| plan.add_slice(0, &f, "t", &every_other()).unwrap().clone());
    assert!(peak < SMALL, "{peak} bytes to plan an upload");
    assert_eq!(placement.len, LEN as u64 / 2);
    assert_eq!(plan.payload(), LEN as u64 / 2);
}

#[test]
fn a_load_plan_of_a_strided_selection_is_one_step() {
    let _turn = measuring();
    let f = wide_file("proportional_load");
    let need = Need::new(0, 0, 0, f.plan_slice("t", &every_other()).unwrap().into());
    let mut out = vec![0u8; LEN / 2];
    let (plan, peak) = peak_during(|| {
        let plan = LoadPlan::new(vec![vec![need]], 64 << 20).unwrap();
        let parts = plan.parts(0).unwrap();
        let s = &plan.steps()[0];
        let staging = f.tensor_bytes("t").unwrap();
        let staging = &staging[s.offset as usize..(s.offset + s.len) as usize];
        for p in parts {
            plan.scatter(0, p.step, p.request, staging, &mut out)
                .unwrap();
        }
        plan
    });
    assert!(peak < SMALL, "{peak} bytes to plan and scatter a load");
    assert_eq!(plan.steps().len(), 1);
    assert!(out
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (2 * i % 251) as u8));
}
