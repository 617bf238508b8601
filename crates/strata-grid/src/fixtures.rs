//! Test fixtures shared by the grid's unit tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use strata_farmem::{Server, ServerConfig, StopHandle};
use strata_io::progress::NoProgress;

use crate::algo::registry::ALGORITHMS;
use crate::algo::{Algorithm, Ctx, Iteration, Output, Values};
use crate::block_codec::Compression;
use crate::build::{build, BuildJob};
use crate::grid::Grid;
use crate::layout::{Order, WeightRequest};
use crate::stream::{StreamConfig, Streamer, Tier};
use crate::vertex::VertexMemory;

/// The `[run]` options `options` less the parameters of algorithms other than its
/// `algorithm` (which it would refuse), so that one table serves a loop over the algorithms.
pub fn for_algorithm(mut options: serde_json::Value) -> serde_json::Value {
    let name = options["algorithm"]
        .as_str()
        .expect("options name an algorithm")
        .to_string();
    let takes =
        |key: &str, e: &crate::algo::registry::Entry| e.defaults().iter().any(|(k, _)| k == key);
    let table = options.as_object_mut().expect("options are an object");
    table.retain(|key, _| {
        ALGORITHMS.iter().all(|e| !takes(key, e))
            || ALGORITHMS.iter().any(|e| e.name == name && takes(key, e))
    });
    options
}

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

/// Builds the four grids of `store` that the algorithms between them ask for, each with
/// `partitions` partitions a side: directed, symmetrised, symmetrised and simple, and directed
/// with random weights in (0, 1] (`s0-w0`, `s1-w0`, `s1-w0-simple`, `s0-w1`; compressed ones
/// named with `-CODE` after that).
pub fn grids(store: &Path, partitions: u32, compression: Compression) {
    for (symmetrize, weighted, simple) in [
        (false, false, false),
        (true, false, false),
        (true, false, true),
        (false, true, false),
    ] {
        let name = format!(
            "s{}-w{}{}",
            symmetrize as u8,
            weighted as u8,
            if simple { "-simple" } else { "" }
        );
        build(
            &BuildJob {
                store: store.to_path_buf(),
                name: coded_name(&name, compression),
                partitions,
                symmetrize: Some(symmetrize),
                simple,
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

/// The block orders and storage an algorithm's tests run it on: both orders plain, and each
/// compressed with one of the codes (so that every read of its blocks is also checked
/// through the fetch stage's decoding).
pub const KINDS: [(Order, Compression); 4] = [
    (Order::Column, Compression::None),
    (Order::Row, Compression::None),
    (Order::Column, Compression::Packed),
    (Order::Row, Compression::Byte),
];

/// Builds grid `name` of `store` with `partitions` a side in `order`, symmetrised or not,
/// its blocks stored as `compression` says; returns its directory.
pub fn grid(
    store: &Path,
    name: &str,
    partitions: u32,
    layout: (Order, Compression),
    symmetrize: bool,
) -> PathBuf {
    grid_weighted(store, name, partitions, layout, symmetrize, None)
}

/// [`grid`], with the edge weights `weights` asks for (`None`: the store's, if any).
pub fn grid_weighted(
    store: &Path,
    name: &str,
    partitions: u32,
    (order, compression): (Order, Compression),
    symmetrize: bool,
    weights: Option<WeightRequest>,
) -> PathBuf {
    build(
        &BuildJob {
            store: store.to_path_buf(),
            name: name.into(),
            partitions,
            order,
            symmetrize: Some(symmetrize),
            weights,
            overwrite: true,
            compression,
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap()
    .dir
}

/// Where a test runs an algorithm: its edge blocks resident or read from disk (segments of
/// 4 KiB), its vertex arrays in the heap or in windows (scratch files in `scratch`), and the
/// bytes of its work buffer.
pub struct Setting<'a> {
    pub tier: Tier,
    pub windowed: bool,
    pub work_bytes: u64,
    pub scratch: &'a Path,
}

/// Runs `algorithm` alone on the grid at `dir` as `setting` says, on two compute threads;
/// returns its output and the iterations it reported, or its error.
pub fn run_alone<A: Algorithm>(
    algorithm: &A,
    dir: &Path,
    setting: &Setting,
) -> crate::error::Result<(Output, Vec<Iteration>)> {
    let grid = Arc::new(Grid::open(dir).unwrap());
    let segments = grid.segments(4096);
    let tiers = vec![setting.tier; segments.len()];
    let cfg = StreamConfig {
        threads: 2,
        disk_fetchers: 2,
        far_fetchers: 0,
        prefetch: 2,
        work_bytes: setting.work_bytes,
    };
    let vertex = match setting.windowed {
        true => VertexMemory::windowed(setting.scratch).unwrap(),
        false => VertexMemory::Heap,
    };
    let mut s =
        Streamer::new(grid, segments, tiers, None, false, cfg, vertex, &NoProgress).unwrap();
    s.set_scratch_dir(setting.scratch);
    let mut iterations = Vec::new();
    let mut record = |it: &Iteration| {
        iterations.push(it.clone());
        Ok(())
    };
    let mut ctx = Ctx {
        progress: &NoProgress,
        on_iteration: &mut record,
        dist: None,
    };
    let out = algorithm.run(&mut s, &mut ctx)?;
    Ok((out, iterations))
}

/// The values of result array `k` of `out`, as f64 (ids and counts exactly, below 2^53).
pub fn values(out: &Output, k: usize) -> Vec<f64> {
    match &out.arrays[k].1 {
        Values::F32(a) => (0..a.len()).map(|i| a.get(i) as f64).collect(),
        Values::F64(a) => (0..a.len()).map(|i| a.get(i)).collect(),
        Values::Ids(a) => (0..a.len()).map(|i| a.get(i) as f64).collect(),
    }
}

/// `m` random edges over `n` vertices, a tenth of the endpoints among the first 8 (hubs),
/// with the self-loops and parallel edges that come.
pub fn hub_edges(n: u64, m: u64, seed: u64) -> Vec<(u64, u64)> {
    let mut rng = strata_store::rng::Rng::new(seed);
    let mut pick = move || match rng.below(10) {
        0 => rng.below(8),
        _ => rng.below(n),
    };
    (0..m).map(|_| (pick(), pick())).collect()
}

/// Adversarial shapes on 64 vertices: a clique on 0..12 (some edges given twice, once each
/// way), a star centred on 12 with leaves 13..40, a path 40..60 with a self-loop at 45, and
/// isolated vertices 60..64.
pub fn shapes() -> (u64, Vec<(u64, u64)>) {
    let mut edges = Vec::new();
    for u in 0..12 {
        for v in u + 1..12 {
            edges.push((u, v));
        }
    }
    edges.extend([(3, 1), (7, 2), (11, 0), (2, 7)]);
    edges.extend((13..40).map(|leaf| (12, leaf)));
    edges.extend((40..59).map(|v| (v, v + 1)));
    edges.push((45, 45));
    (64, edges)
}
