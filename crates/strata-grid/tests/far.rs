//! Far memory end to end: the placement offloads edge blocks to a memory server, results
//! equal a local run, and losing the server mid-run costs speed, not the result.

use std::path::Path;
use std::sync::Arc;

use strata_farmem::{Server, ServerConfig};
use strata_grid::algo::{Configured, Iteration, PageRank};
use strata_grid::config::RunJob;
use strata_grid::far::FarConfig;
use strata_grid::run::{run, RunSummary};
use strata_io::progress::Progress;
use strata_store::convert::{convert_binary, BinaryJob};
use strata_store::rng::Rng;
use strata_store::NoProgress;

fn store(dir: &Path) -> std::path::PathBuf {
    let mut rng = Rng::new(9);
    let n = 4000u64;
    let bytes: Vec<u8> = (0..300_000)
        .flat_map(|_| {
            [
                (rng.below(n) as i32).to_le_bytes(),
                (rng.below(n) as i32).to_le_bytes(),
            ]
        })
        .flatten()
        .collect();
    let bin = dir.join("e.bin");
    std::fs::write(&bin, bytes).unwrap();
    let out = dir.join("g.strata");
    let job: BinaryJob = serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 256u64 << 20, "num_nodes": n},
        "inputs": [{"path": bin}],
    }))
    .unwrap();
    convert_binary(&job, &NoProgress).unwrap();
    let grid = strata_grid::build::BuildJob {
        store: out.clone(),
        partitions: 16,
        ..Default::default()
    };
    strata_grid::build::build(&grid, &NoProgress).unwrap();
    out
}

fn job(store: &Path, far: Option<String>) -> RunJob {
    RunJob {
        store: store.to_path_buf(),
        algorithm: Configured::new(PageRank {
            iterations: 12,
            tolerance: 0.0,
            damping: 0.85,
        }),
        grid: None,
        memory: 1 << 30,
        threads: 2,
        segment_bytes: 16 << 10,
        prefetch: 2,
        disk_fetchers: 2,
        vertex: Default::default(),
        far: far.map(|addr| FarConfig {
            addr,
            ratio: 0.7,
            chunk_bytes: 4096,
            connections: 2,
            fetchers: 2,
        }),
        keep_resident: true,
        out: Some(store.join(format!("out-{}", rand_tag()))),
        weights: None,
        checkpoint_seconds: None,
    }
}

fn rand_tag() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn ranks(s: &RunSummary) -> Vec<f32> {
    let (_, b) = strata_store::array::read_all_bytes(Path::new(&s.arrays[0])).unwrap();
    bytemuck::pod_collect_to_vec(&b)
}

/// Collects progress messages.
#[derive(Default)]
struct Messages(std::sync::Mutex<Vec<String>>);

impl Progress for Messages {
    fn stage(&self, _: &str, _: u64, _: u64) {}
    fn update(&self, _: u64, _: u64) -> bool {
        true
    }
    fn message(&self, text: &str) {
        self.0.lock().unwrap().push(text.to_string());
    }
}

fn serve() -> (
    String,
    strata_farmem::StopHandle,
    std::thread::JoinHandle<()>,
) {
    let server = Server::bind(&ServerConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    let addr = server.local_addr().to_string();
    let stop = server.stop_handle();
    let h = std::thread::spawn(move || server.run_until(&|| false).unwrap());
    (addr, stop, h)
}

#[test]
fn far_run_equals_local_and_survives_losing_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(tmp.path());
    let local = run(&job(&st, None), &NoProgress, &mut |_: &Iteration| Ok(())).unwrap();
    assert_eq!(local.bytes_far, 0);

    let (addr, stop, h) = serve();
    let far = run(&job(&st, Some(addr)), &NoProgress, &mut |_: &Iteration| {
        Ok(())
    })
    .unwrap();
    assert!(far.bytes_far > 0 && far.far_failure.is_none(), "{far:?}");
    // Vertex data and buffers stay local, so the ratio reaches 0.7 only within a segment.
    let p = &far.placement;
    assert!(
        p.far_ratio > 0.6 && p.far_ratio <= 0.75 && p.local_edge_bytes > 0,
        "{p:?}"
    );
    assert_eq!(ranks(&far), ranks(&local));

    // Kill the server after the second iteration: the run finishes from disk.
    let msgs = Arc::new(Messages::default());
    let mut stop_once = Some(stop);
    let (addr2, stop2, h2) = serve();
    let lost = run(&job(&st, Some(addr2)), &*msgs, &mut |it: &Iteration| {
        if it.iteration == 1 {
            if let Some(s) = stop_once.take() {
                s.stop();
                stop2.stop();
            }
        }
        Ok(())
    })
    .unwrap();
    h.join().unwrap();
    h2.join().unwrap();
    assert!(lost.far_failure.is_some(), "{lost:?}");
    assert!(lost.bytes_disk > 0 && lost.bytes_far > 0);
    assert_eq!(ranks(&lost), ranks(&local));
    assert!(msgs
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|m| m.contains("continuing from the disk copy")));

    // Nobody listening: a clear error before any work.
    let e = run(
        &job(&st, Some("127.0.0.1:1".into())),
        &NoProgress,
        &mut |_: &Iteration| Ok(()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("memory server"), "{e}");
}
