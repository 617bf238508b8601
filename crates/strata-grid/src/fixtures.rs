//! Test fixtures shared by the grid's unit tests.

use std::path::{Path, PathBuf};

use strata_io::progress::NoProgress;

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
