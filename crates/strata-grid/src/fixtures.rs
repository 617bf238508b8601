//! Test fixtures shared by the grid's unit tests.

use std::path::{Path, PathBuf};

use strata_io::progress::NoProgress;

use crate::build::{build, BuildJob};
use crate::layout::WeightSpec;

/// A store of `m` edges `(k % n, (k * 7919) % n)` for k in 0..m.
pub fn store(dir: &Path, n: u64, m: u64) -> PathBuf {
    let bytes: Vec<u8> = (0..m)
        .flat_map(|k| {
            [
                ((k % n) as i32).to_le_bytes(),
                (((k * 7919) % n) as i32).to_le_bytes(),
            ]
        })
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
/// in (0, 1] (`s0-w0`, `s1-w0`, `s0-w1`).
pub fn grids(store: &Path, partitions: u32) {
    for (symmetrize, weighted) in [(false, false), (true, false), (false, true)] {
        build(
            &BuildJob {
                store: store.to_path_buf(),
                name: format!("s{}-w{}", symmetrize as u8, weighted as u8),
                partitions,
                symmetrize: Some(symmetrize),
                weights: weighted.then(|| WeightSpec {
                    kind: "random".into(),
                    seed: 1,
                    low: 0.0,
                    high: 1.0,
                }),
                ..Default::default()
            },
            &NoProgress,
        )
        .unwrap();
    }
}
