//! Header parsing: ours against the reference crate on the same bytes, in one run.
//!
//! Each iteration parses and validates a whole file held in memory (the data is lazily zeroed
//! pages, never touched) and then takes a view of every tensor. The two parsers take turns,
//! round by round (15 rounds; each round one ~20 ms batch of each), and the table gives the
//! medians, their ratio and the lowest and highest per-round ratio. Run with
//! `cargo bench -p safetensors-core --bench parse`; prints a table and one JSON line.

use std::hint::black_box;
use std::time::{Duration, Instant};

use safetensors_core::SafeTensors;

#[path = "../tests/common/inputs.rs"]
mod inputs;

/// gpt2's 160 tensors (names and shapes as in the published checkpoint), all F32.
fn gpt2() -> Vec<(String, Vec<usize>)> {
    let mut t = vec![
        ("wte.weight".to_string(), vec![50257, 768]),
        ("wpe.weight".to_string(), vec![1024, 768]),
        ("ln_f.weight".to_string(), vec![768]),
        ("ln_f.bias".to_string(), vec![768]),
    ];
    for l in 0..12 {
        for (name, shape) in [
            ("ln_1.weight", vec![768]),
            ("ln_1.bias", vec![768]),
            ("attn.bias", vec![1, 1, 1024, 1024]),
            ("attn.c_attn.weight", vec![768, 2304]),
            ("attn.c_attn.bias", vec![2304]),
            ("attn.c_proj.weight", vec![768, 768]),
            ("attn.c_proj.bias", vec![768]),
            ("ln_2.weight", vec![768]),
            ("ln_2.bias", vec![768]),
            ("mlp.c_fc.weight", vec![768, 3072]),
            ("mlp.c_fc.bias", vec![3072]),
            ("mlp.c_proj.weight", vec![3072, 768]),
            ("mlp.c_proj.bias", vec![768]),
        ] {
            t.push((format!("h.{l}.{name}"), shape));
        }
    }
    t
}

/// 20,000 small tensors with realistic long names.
fn many() -> Vec<(String, Vec<usize>)> {
    (0..20_000)
        .map(|i| {
            let kind = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"][i % 5];
            (
                format!("model.layers.{}.self_attn.{kind}.weight", i / 5),
                vec![4, 8],
            )
        })
        .collect()
}

/// A complete file for these tensors, F32, laid out in name order; the data is zeroed pages
/// that parsing never touches.
fn file_for(tensors: &[(String, Vec<usize>)]) -> Vec<u8> {
    let sizes: Vec<usize> = tensors
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() * 4)
        .collect();
    let total: usize = sizes.iter().sum();
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| tensors[a].0.cmp(&tensors[b].0));
    let mut json = String::from("{");
    let mut at = 0;
    for (k, &i) in order.iter().enumerate() {
        if k > 0 {
            json.push(',');
        }
        let shape: Vec<String> = tensors[i].1.iter().map(|d| d.to_string()).collect();
        json.push_str(&format!(
            "\"{}\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{at},{}]}}",
            tensors[i].0,
            shape.join(","),
            at + sizes[i]
        ));
        at += sizes[i];
    }
    json.push('}');
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut out = vec![0u8; 8 + json.len() + total];
    out[..8].copy_from_slice(&(json.len() as u64).to_le_bytes());
    out[8..8 + json.len()].copy_from_slice(json.as_bytes());
    out
}

/// How many calls of `f` last ~20 ms (at least 1).
fn calls_for(f: &mut impl FnMut() -> usize) -> u32 {
    let start = Instant::now();
    black_box(f());
    let once = start.elapsed().max(Duration::from_nanos(100));
    (Duration::from_millis(20).as_nanos() / once.as_nanos()).clamp(1, 100_000) as u32
}

/// `runs` rounds, each timing a batch of `a` then a batch of `b` (each batch ~20 ms, the time
/// per call kept): the two take turns, so that a machine whose speed drifts affects both alike.
/// Returns the medians of `a` and of `b`, and each round's `b / a`.
fn interleaved(
    runs: usize,
    mut a: impl FnMut() -> usize,
    mut b: impl FnMut() -> usize,
) -> (Duration, Duration, Vec<f64>) {
    let (na, nb) = (calls_for(&mut a), calls_for(&mut b));
    let batch = |f: &mut dyn FnMut() -> usize, n: u32| {
        let t = Instant::now();
        for _ in 0..n {
            black_box(f());
        }
        t.elapsed() / n
    };
    let mut ta = Vec::with_capacity(runs);
    let mut tb = Vec::with_capacity(runs);
    let mut ratios = Vec::with_capacity(runs);
    for _ in 0..runs {
        let x = batch(&mut a, na);
        let y = batch(&mut b, nb);
        ratios.push(y.as_secs_f64() / x.as_secs_f64());
        ta.push(x);
        tb.push(y);
    }
    ta.sort();
    tb.sort();
    (ta[runs / 2], tb[runs / 2], ratios)
}

/// The lowest and highest of the per-round ratios.
fn spread(ratios: &[f64]) -> (f64, f64) {
    ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)))
}

fn ours(bytes: &[u8]) -> usize {
    let file = SafeTensors::deserialize(bytes).unwrap();
    file.tensors()
        .map(|(_, v)| v.data.len() + v.shape.len())
        .sum()
}

fn reference(bytes: &[u8]) -> usize {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    file.iter()
        .map(|(_, v)| v.data().len() + v.shape().len())
        .sum()
}

fn main() {
    // `PARSE_PROFILE=1` loops our parser alone on the large header, for a profiler.
    if std::env::var_os("PARSE_PROFILE").is_some() {
        let bytes = file_for(&many());
        let mut sum = 0;
        for _ in 0..400 {
            sum += ours(&bytes);
        }
        println!("{sum}");
        return;
    }
    let mut json = Vec::new();
    println!(
        "{:<22} {:>10} {:>12} {:>12} {:>8} {:>14}",
        "header", "tensors", "ours", "reference", "speedup", "rounds"
    );
    for (label, tensors) in [("gpt2 (160 tensors)", gpt2()), ("20,000 tensors", many())] {
        let bytes = file_for(&tensors);
        assert_eq!(ours(&bytes), reference(&bytes));
        let (a, b, ratios) = interleaved(15, || ours(&bytes), || reference(&bytes));
        let ratio = b.as_secs_f64() / a.as_secs_f64();
        let (lo, hi) = spread(&ratios);
        println!(
            "{label:<22} {:>10} {:>12?} {:>12?} {:>7.1}x {:>6.1}-{:.1}x",
            tensors.len(),
            a,
            b,
            ratio,
            lo,
            hi
        );
        json.push(format!(
            "{{\"header\":\"{label}\",\"tensors\":{},\"header_bytes\":{},\"ours_us\":{:.2},\"reference_us\":{:.2},\"speedup\":{ratio:.2},\"speedup_min\":{lo:.2},\"speedup_max\":{hi:.2}}}",
            tensors.len(),
            u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            a.as_secs_f64() * 1e6,
            b.as_secs_f64() * 1e6
        ));
    }
    // The hostile extreme: a header at the size limit, made of tiny entries. Bounded time.
    let (big, count) = inputs::tiny_entries_at_the_limit();
    let (a, b, ratios) = interleaved(3, || ours(&big), || reference(&big));
    let ratio = b.as_secs_f64() / a.as_secs_f64();
    let (lo, hi) = spread(&ratios);
    println!(
        "{:<22} {:>10} {:>12?} {:>12?} {:>7.1}x {:>6.1}-{:.1}x",
        "100 MB, tiny entries", count, a, b, ratio, lo, hi
    );
    json.push(format!(
        "{{\"header\":\"100 MB of tiny entries\",\"tensors\":{count},\"header_bytes\":{},\"ours_us\":{:.0},\"reference_us\":{:.0},\"speedup\":{ratio:.2},\"speedup_min\":{lo:.2},\"speedup_max\":{hi:.2}}}",
        u64::from_le_bytes(big[..8].try_into().unwrap()),
        a.as_secs_f64() * 1e6,
        b.as_secs_f64() * 1e6
    ));
    println!("JSON [{}]", json.join(","));
}
