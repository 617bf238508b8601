//! Test fixtures shared by the grid's unit tests.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use strata_farmem::{Server, ServerConfig, StopHandle};
use strata_io::progress::NoProgress;

use crate::block_codec::Compression;
use crate::build::{build, BuildJob};
use crate::layout::WeightRequest;

/// A store of `m` edges `(k % n, (k * 7919) % n)` for k in 0..m.
pub fn store(dir: &Path, n: u64, m: u64) -> PathBuf {
    store_of(dir, n, (0..m).map(|k| (k % n, (k * 7919) % n)))
}

/// A store in `dir` of `edges` (source, destination) over `n` vertices, converted from a
/// binary edge list.
pub fn store_of(dir: &Path, n: u64, edges: impl IntoIterator<Item = (u64, u64)>) -> PathBuf {
    let bytes: Vec<u8> = edges
        .into_iter()
        .flat_map(|(u, v)| [(u as i32).to_le_bytes(), (v as i32).to_le_bytes()])
        .flatten()
        .collect();
    let bin = dir.join("e.bin");
    std::fs::write(&bin, bytes).unwrap();
    let out = dir.join("g.strata");
    let job: strata_store::convert::BinaryJob = serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 256u64 << 20, "num_nodes": n},
        "inputs": [{"path": bin}],
    }))
    .unwrap();
    strata_store::convert::convert_binary(&job, &NoProgress).unwrap();
    out
}

/// Builds the three grids of `store` that the algorithms between them ask for, each with
/// `partitions` partitions a side: directed, symmetrised, and directed with random weights
/// in (0, 1] (`s0-w0`, `s1-w0`, `s0-w1`; compressed ones named with `-CODE` after that).
pub fn grids(store: &Path, partitions: u32, compression: Compression) {
    for (symmetrize, weighted) in [(false, false), (true, false), (false, true)] {
        build(
            &BuildJob {
                store: store.to_path_buf(),
                name: coded_name(
                    &format!("s{}-w{}", symmetrize as u8, weighted as u8),
                    compression,
                ),
                partitions,
                symmetrize: Some(symmetrize),
                weights: weighted.then(WeightRequest::default),
                compression,
                ..Default::default()
            },
            &NoProgress,
        )
        .unwrap();
    }
}

/// `name` for a plain grid, `name-CODE` for a compressed one.
pub fn coded_name(name: &str, compression: Compression) -> String {
    match compression {
        Compression::None => name.to_string(),
        c => format!("{name}-{}", c.name()),
    }
}

/// A far-memory server of 64 MiB on a free loopback port, serving on a thread of its own: its
/// address, the handle that stops it, and the thread (join it once stopped).
pub fn far_server() -> (String, StopHandle, JoinHandle<()>) {
    let server = Server::bind(&ServerConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    let addr = server.local_addr().to_string();
    let stop = server.stop_handle();
    let serving = std::thread::spawn(move || server.run_until(&|| false).unwrap());
    (addr, stop, serving)
}
