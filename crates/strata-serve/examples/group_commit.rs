//! How many mutations a second one graph's write-ahead log acknowledges with `THREADS`
//! concurrent writers, side by side in one run: one `fdatasync` per mutation (the path before
//! group commit: each writer holds the log for its own append and sync) against group commit
//! (`strata_serve::commit`). Each record is 80 bytes, about an `AddEdge` of three pairs. Only
//! the log is measured: no gRPC, no clients, so the figure is the write path's ceiling.
//!
//! ```text
//! cargo run --release -p strata-serve --example group_commit -- [THREADS] [SECONDS] [DIR]
//! ```
//!
//! `DIR` (default: the system's temporary directory) should be on the disk the server's state
//! directory uses.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use strata_serve::commit::{GroupLog, Staging};
use strata_serve::wal::Wal;

/// Group commit with no state beside the log.
struct Plain;

impl Staging<()> for Plain {
    fn durable(&self, _: &mut (), _: u64) {}
    fn discarded(&self, _: &mut (), _: u64) {}
}

const RECORD: [u8; 80] = [7; 80];

/// Acknowledged records a second: `threads` writers calling `append` for `seconds`.
fn rate(threads: usize, seconds: f64, append: &(dyn Fn() + Sync)) -> f64 {
    let done = AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while Instant::now() < until {
                    append();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn fresh(dir: &Path, name: &str) -> Wal {
    let path = dir.join(name);
    let _ = std::fs::remove_dir_all(&path);
    Wal::open(&path, 0).expect("open the log").0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(16, |a| a.parse().expect("THREADS"));
    let seconds: f64 = args.get(2).map_or(5.0, |a| a.parse().expect("SECONDS"));
    let base = args.get(3).map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = base.join(format!("strata-group-commit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    let mut ratios = Vec::new();
    for round in 1..=3 {
        let one = Mutex::new(fresh(&dir, "one"));
        let each = rate(threads, seconds, &|| {
            one.lock().unwrap().append(&[&RECORD]).expect("append");
        });
        let group = GroupLog::new(fresh(&dir, "group"), (), Plain);
        let grouped = rate(threads, seconds, &|| {
            group
                .stage(|_| Ok((RECORD.to_vec(), ())), |_, _, ()| ())
                .and_then(|commit| commit.wait())
                .expect("commit");
        });
        ratios.push(grouped / each);
        println!(
            "round {round}: {threads} writers, one fdatasync per mutation {each:.0}/s, group commit {grouped:.0}/s ({:.1}x)",
            grouped / each
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!("median ratio {:.1}x", ratios[1]);
    let _ = std::fs::remove_dir_all(&dir);
}
