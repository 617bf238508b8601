//! `strata bench-disk`: sequential bandwidth with 1 MiB requests and 4 KiB random-read IOPS by
//! queue depth, through the engine, on one file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::aligned::AlignedBuf;
use crate::engine::{Engine, IoBuf, IoFile, Request};
use crate::error::{IoError, Result};
use crate::file::OpenMode;
use crate::profile::{device_of, DeviceProfile, QdPoint};
use crate::progress::{Meter, Progress};
use crate::units::fmt_bytes;

/// What to measure.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchOptions {
    /// Directory for the benchmark file (on the device to measure).
    pub dir: PathBuf,
    /// Size of the benchmark file in bytes; larger than RAM caches is not needed (O_DIRECT).
    pub size: u64,
    /// The benchmark file: created (with the write test) and kept when it does not exist;
    /// measured read-only when it does. Default: a temporary file in `dir`.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Queue depths of the random-read test.
    pub queue_depths: Vec<usize>,
    /// Seconds per random-read queue depth.
    pub seconds: f64,
    /// Requests in flight in the sequential tests.
    pub seq_depth: usize,
    /// Keep the benchmark file afterwards.
    #[serde(default)]
    pub keep: bool,
}

const SEQ_BLOCK: usize = 1 << 20;
const RAND_BLOCK: usize = 4096;

/// Visits `[0, n)` in a scrambled order, each value once per pass (as fio's default random
/// map does): a full-period linear congruential sequence modulo the next power of two, with
/// values outside the range skipped.
struct BlockOrder {
    state: u64,
    mask: u64,
    n: u64,
}

impl BlockOrder {
    fn new(n: u64, seed: u64) -> Self {
        BlockOrder {
            state: seed,
            mask: n.next_power_of_two() - 1,
            n,
        }
    }

    fn next(&mut self) -> u64 {
        loop {
            // a = 1 (mod 4) and c odd give period 2^k (Hull–Dobell).
            self.state = (self
                .state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407))
                & self.mask;
            if self.state < self.n {
                return self.state;
            }
        }
    }
}

/// Runs the benchmark and returns the device profile (not yet saved).
pub fn bench_disk(
    engine: &Arc<Engine>,
    opts: &BenchOptions,
    progress: &dyn Progress,
) -> Result<DeviceProfile> {
    let max_qd = opts
        .queue_depths
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(opts.seq_depth);
    if engine.depth() < max_qd {
        return Err(IoError::Invalid(format!(
            "the engine's depth {} is below the largest queue depth asked for ({max_qd})",
            engine.depth()
        )));
    }
    if !opts.dir.is_dir() {
        return Err(IoError::Invalid(format!(
            "{} is not a directory",
            opts.dir.display()
        )));
    }
    let (path, temporary) = match &opts.file {
        Some(f) => (f.clone(), false),
        None => (
            opts.dir
                .join(format!(".strata-bench-disk-{}.bin", std::process::id())),
            true,
        ),
    };
    let create = !path.exists();
    if create {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let free = crate::space::available(parent)?;
        if opts.size > free {
            return Err(IoError::Invalid(format!(
                "the benchmark file of {} does not fit: the filesystem of {} has {} free; give a smaller --size",
                fmt_bytes(opts.size),
                parent.display(),
                fmt_bytes(free)
            )));
        }
    }
    run(
        engine,
        opts,
        &path,
        create,
        temporary && !opts.keep,
        progress,
    )
}

/// Measures `path` (written first when `create`); `unlink`: the file is the benchmark's own,
/// removed as soon as it is open, so that no exit, not even `kill -9`, leaves it behind.
fn run(
    engine: &Arc<Engine>,
    opts: &BenchOptions,
    path: &Path,
    create: bool,
    unlink: bool,
    progress: &dyn Progress,
) -> Result<DeviceProfile> {
    let mode = if create {
        OpenMode::Create
    } else {
        OpenMode::Read
    };
    let file = engine.open(path, mode)?;
    if create && unlink {
        std::fs::remove_file(path).map_err(|e| IoError::os("remove", path, 0, e))?;
    }
    let seq_write_mb_s = if create {
        let size = opts.size / SEQ_BLOCK as u64 * SEQ_BLOCK as u64;
        let s = sequential(engine, &file, size, opts.seq_depth, true, progress)?;
        file.file().sync()?;
        s
    } else {
        0.0
    };
    let size = file.file().size()?;
    if size < (SEQ_BLOCK * 4) as u64 {
        return Err(IoError::Invalid(format!(
            "{}: {} bytes is too small to measure (need at least 4 MiB)",
            path.display(),
            size
        )));
    }
    let seq_read_mb_s = sequential(
        engine,
        &file,
        size / SEQ_BLOCK as u64 * SEQ_BLOCK as u64,
        opts.seq_depth,
        false,
        progress,
    )?;
    let mut points = Vec::new();
    for &qd in &opts.queue_depths {
        points.push(random_reads(
            engine,
            &file,
            size,
            qd,
            Duration::from_secs_f64(opts.seconds),
            progress,
        )?);
    }
    let (id, name) = device_of(path.parent().unwrap_or(Path::new(".")))?;
    Ok(DeviceProfile {
        format_version: 1,
        device: format!("{id} ({name})"),
        measured_in: opts.dir.clone(),
        measured_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        backend: engine.kind().name().into(),
        file_bytes: size,
        seq_read_mb_s,
        seq_write_mb_s,
        rand_read_4k: points,
    })
}

/// Reads or writes `[0, size)` in 1 MiB requests with `depth` in flight; returns MB/s.
fn sequential(
    engine: &Arc<Engine>,
    file: &IoFile,
    size: u64,
    depth: usize,
    write: bool,
    progress: &dyn Progress,
) -> Result<f64> {
    let name = if write {
        "sequential write"
    } else {
        "sequential read"
    };
    let mut meter = Meter::new(progress, name, size, size / SEQ_BLOCK as u64);
    let mut q = engine.queue();
    let mut bufs: Vec<AlignedBuf> = (0..depth)
        .map(|i| {
            let mut b = AlignedBuf::new(SEQ_BLOCK);
            b.full_mut()
                .iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = (i + j) as u8);
            b.set_len(SEQ_BLOCK);
            b
        })
        .collect();
    let start = Instant::now();
    let mut next = 0u64;
    let request = |off: u64, b: AlignedBuf| {
        if write {
            Request::write(file, off, SEQ_BLOCK, b, off)
        } else {
            Request::read(file, off, SEQ_BLOCK, b, off)
        }
    };
    while next < size && !bufs.is_empty() {
        q.submit([request(next, bufs.pop().unwrap())]);
        next += SEQ_BLOCK as u64;
    }
    while let Some(c) = q.wait() {
        c.result?;
        meter.add(1, SEQ_BLOCK as u64)?;
        if next < size {
            let mut b = c.buf.into_heap().expect("heap buffer");
            b.set_len(SEQ_BLOCK);
            q.submit([request(next, b)]);
            next += SEQ_BLOCK as u64;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    meter.finish()?;
    Ok(size as f64 / secs / 1e6)
}

/// Keeps `qd` random 4 KiB reads in flight for `duration`.
fn random_reads(
    engine: &Arc<Engine>,
    file: &IoFile,
    size: u64,
    qd: usize,
    duration: Duration,
    progress: &dyn Progress,
) -> Result<QdPoint> {
    let mut meter = Meter::new(progress, &format!("random 4K qd {qd}"), 0, 0);
    let blocks = size / RAND_BLOCK as u64;
    let pool = engine.fixed_pool(qd, RAND_BLOCK);
    let mut order = BlockOrder::new(blocks, qd as u64);
    let mut q = engine.queue();
    let before = engine.stats();
    let start = Instant::now();
    let mut offset = || order.next() * RAND_BLOCK as u64;
    q.submit((0..qd).map(|_| {
        let off = offset();
        Request::read(file, off, RAND_BLOCK, IoBuf::Fixed(pool.take()), off)
    }));
    let mut done = 0u64;
    let mut again = Vec::with_capacity(qd);
    while q.pending() > 0 {
        let first = q.wait().expect("pending");
        let more = std::iter::from_fn(|| q.poll());
        let running = start.elapsed() < duration;
        for c in std::iter::once(first).chain(more) {
            c.result?;
            done += 1;
            if running {
                let off = offset();
                again.push(Request::read(file, off, RAND_BLOCK, c.buf, off));
            }
        }
        let n = again.len() as u64;
        if !again.is_empty() {
            q.submit(again.drain(..));
        }
        meter.add(n, n * RAND_BLOCK as u64)?;
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = engine.stats().since(&before);
    meter.finish()?;
    let iops = done as f64 / secs;
    Ok(QdPoint {
        queue_depth: qd,
        iops,
        mean_latency_us: qd as f64 / iops * 1e6,
        p50_latency_us: stats.latency_us(0.5),
        p99_latency_us: stats.latency_us(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;
    use std::sync::Mutex;

    /// Lists `dir` at each stage the benchmark starts.
    struct Watch<'a> {
        dir: &'a Path,
        seen: Mutex<Vec<(String, usize)>>,
    }

    impl Progress for Watch<'_> {
        fn stage(&self, name: &str, _: u64, _: u64) {
            let files = std::fs::read_dir(self.dir).unwrap().count();
            self.seen.lock().unwrap().push((name.into(), files));
        }
        fn update(&self, _: u64, _: u64) -> bool {
            true
        }
        fn message(&self, _: &str) {}
    }

    fn options(dir: &Path, size: u64) -> BenchOptions {
        BenchOptions {
            dir: dir.to_path_buf(),
            size,
            file: None,
            queue_depths: vec![1],
            seconds: 0.01,
            seq_depth: 2,
            keep: false,
        }
    }

    #[test]
    fn the_temporary_file_is_unlinked_while_it_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        let engine = crate::testing::engine(crate::testing::backends()[0], 4, 2);
        let watch = Watch {
            dir: dir.path(),
            seen: Mutex::default(),
        };
        let profile = bench_disk(&engine, &options(dir.path(), 4 << 20), &watch).unwrap();
        assert_eq!(profile.file_bytes, 4 << 20);
        // A kill at any stage, even -9, leaves nothing: no stage saw the file.
        let seen = watch.seen.into_inner().unwrap();
        assert!(
            seen.iter().any(|(name, _)| name == "sequential write"),
            "{seen:?}"
        );
        assert!(seen.iter().all(|&(_, files)| files == 0), "{seen:?}");
    }

    #[test]
    fn a_file_larger_than_the_free_space_is_refused_before_a_byte_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let engine = crate::testing::engine(crate::testing::backends()[0], 4, 2);
        let err = bench_disk(&engine, &options(dir.path(), u64::MAX), &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not fit") && err.contains(" free; give a smaller --size"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn block_order_visits_each_block_once_per_pass() {
        for n in [1u64, 2, 3, 1000, 4096, 5000] {
            let mut o = BlockOrder::new(n, 7);
            let mut seen: Vec<u64> = (0..n).map(|_| o.next()).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }
}
