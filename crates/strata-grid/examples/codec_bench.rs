//! How well each block code compresses a grid, and how fast one core decodes it:
//! `cargo run --release -p strata-grid --example codec_bench -- GRID_DIR [REPEATS]`.
//!
//! Reads a plain grid's blocks, encodes each with every code (sorting it, as a compressed
//! build does), checks the round trip, then decodes all blocks on one thread `REPEATS` times
//! (default 3). Prints one JSON line per code: bytes per edge, and the best repeat's decode
//! rate in edges/s and GB/s of records produced (8 bytes an edge). `benches/bench_grid.py
//! --only comp` runs it.

use std::path::Path;
use std::time::Instant;

use strata_grid::block_codec::{self, Compression, Keys};
use strata_grid::Grid;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: codec_bench GRID_DIR [REPEATS]");
        std::process::exit(2);
    };
    let repeats: usize = args.next().map_or(3, |r| r.parse().expect("REPEATS"));
    let grid = Grid::open(Path::new(&dir)).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    if grid.compression().is_compressed() {
        eprintln!("{dir} is compressed already: give a plain grid");
        std::process::exit(2);
    }
    let (_, bytes) = strata_store::array::read_all_bytes(&grid.array_path("edges")).unwrap();
    let records: Vec<[u32; 2]> = bytemuck::pod_collect_to_vec(&bytes);
    drop(bytes);
    let keys = Keys::new(grid.layout().chunk_size);
    let blocks: Vec<std::ops::Range<usize>> = (0..grid.layout().blocks())
        .map(|pos| {
            let e = grid.block_edges(pos);
            e.start as usize..e.end as usize
        })
        .filter(|r| !r.is_empty())
        .collect();
    let edges = records.len() as f64;
    for codec in [Compression::Byte, Compression::Packed] {
        let (mut codes, mut starts) = (Vec::new(), vec![0usize]);
        let largest = blocks.iter().map(|r| r.len()).max().unwrap_or(0);
        let mut out = vec![[0u32; 2]; largest];
        for r in &blocks {
            let mut block = records[r.clone()].to_vec();
            block_codec::sort_block(&mut block, None, &mut Vec::new());
            let at = codes.len();
            block_codec::encode(codec, keys, &block, &mut codes);
            starts.push(codes.len());
            let back = &mut out[..block.len()];
            block_codec::decode(codec, keys, &codes[at..], back).expect("round trip");
            assert_eq!(back, &block[..], "round trip");
        }
        let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..repeats.max(1) {
            let (t, cpu) = (Instant::now(), thread_cpu_seconds());
            for (k, r) in blocks.iter().enumerate() {
                let code = &codes[starts[k]..starts[k + 1]];
                block_codec::decode(codec, keys, code, &mut out[..r.len()]).expect("round trip");
            }
            best_cpu = best_cpu.min(thread_cpu_seconds() - cpu);
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{}",
            serde_json::json!({
                "codec": codec.name(),
                "grid": dir,
                "edges": records.len(),
                "blocks": blocks.len(),
                "bytes_per_edge": codes.len() as f64 / edges,
                "decode_cpu_seconds": best_cpu,
                "decode_edges_per_s": edges / best_cpu,
                "decode_gb_per_s": edges * 8.0 / best_cpu / 1e9,
                "decode_wall_seconds": best,
                "decode_wall_gb_per_s": edges * 8.0 / best / 1e9,
            })
        );
    }
}

/// This thread's time on a CPU so far, in seconds (the first field of
/// `/proc/thread-self/schedstat`, in nanoseconds).
fn thread_cpu_seconds() -> f64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: u64 = text
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("schedstat's first field");
    ns as f64 * 1e-9
}
