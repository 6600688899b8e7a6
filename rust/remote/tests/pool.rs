//! One connection pool per endpoint, shared by every shard of a checkpoint and bounded: a
//! checkpoint of 300 shards read on demand, with small parts and many GETs in flight, under a
//! limit of 256 open files. Before, each shard kept a pool of its own: 300 shards held 300
//! sockets (up to 16 each with small parts) and the read failed at shard 248.
//!
//! A test program of its own: it lowers the process's file limit and counts its sockets.

mod common;

use std::fmt::Write;

use common::{nginx, sockets, Scratch};
use safetensors_core::{serialize, Dtype, TensorView};
use safetensors_remote::{open_checkpoint, RemoteOptions};

const SHARDS: usize = 300;

#[test]
fn a_checkpoint_of_many_shards_shares_one_bounded_pool() {
    let root = Scratch::new("pool-root");
    let work = Scratch::new("pool-nginx");
    let mut index = String::from(r#"{"metadata": {}, "weight_map": {"#);
    let mut want = Vec::new();
    for k in 0..SHARDS {
        let bytes: Vec<u8> = (0..20_000u32)
            .flat_map(|i| (i.wrapping_mul(k as u32 + 1)).to_le_bytes())
            .collect();
        let file = format!("model-{:05}-of-{SHARDS:05}.safetensors", k + 1);
        let name = format!("t{k}");
        let shard = serialize(
            [(
                name.as_str(),
                TensorView::new(Dtype::U32, &[20_000], &bytes),
            )],
            None,
        )
        .unwrap();
        std::fs::write(root.0.join(&file), shard).unwrap();
        write!(
            index,
            "{}\"{name}\": \"{file}\"",
            if k == 0 { "" } else { ", " }
        )
        .unwrap();
        want.push((name, bytes));
    }
    index.push_str("}}");
    std::fs::write(root.0.join("model.safetensors.index.json"), index).unwrap();
    let server = match nginx(&root.0, &work.0) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    // The server started with the usual limit; from here this process has 256 files.
    let limit = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 256,
    };
    // SAFETY: sets this process's own limit from a plain struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);

    let options = RemoteOptions {
        on_demand: true,
        first_read: 64,
        part_size: 8192,
        concurrency: 16,
        ..RemoteOptions::default()
    };
    let url = format!(
        "http://127.0.0.1:{}/model.safetensors.index.json",
        server.port
    );
    let ckpt = open_checkpoint(&url, &options, Default::default()).unwrap();
    let mut most = 0;
    for (name, bytes) in &want {
        let (file, _) = ckpt.locate(name).unwrap();
        assert_eq!(
            &*file.tensor_bytes(name).unwrap(),
            bytes.as_slice(),
            "{name}"
        );
        most = most.max(sockets());
    }
    assert_eq!(ckpt.shards_opened(), SHARDS);
    // One pool of at most 64 connections, whatever the number of shards (a few more sockets
    // may be the runtime's own).
    assert!(most <= 64 + 4, "{most} sockets open at once");
}
