//! The far-memory side of a run: connecting to the memory server, the controller's choice of
//! transfer threads, and writing the offloaded segments there (Fargraph+'s `Far_write_*`).

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_farmem::{ClientConfig, FarClient, FarCompletion, FarError, FarRead, TransportKind};
use strata_io::progress::{Meter, Progress};
use strata_store::units::fmt_bytes;

use crate::error::{GridError, Result};
use crate::fetch;
use crate::grid::{Grid, Segment};
use crate::stream::Tier;

/// How to reach and use far memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FarConfig {
    /// `HOST:PORT` of `strata farmem serve`.
    pub addr: String,
    /// Fraction of the run's footprint to place there.
    pub ratio: f64,
    /// Bytes per transfer chunk.
    #[serde(default = "default_chunk")]
    pub chunk_bytes: usize,
    /// How the data connections move bytes (`uring` falls back to `tcp`, with a message, where
    /// io_uring is unavailable).
    #[serde(default)]
    pub transport: TransportKind,
    /// Parallel data connections; 0: the controller picks.
    #[serde(default)]
    pub connections: usize,
    /// Threads fetching segments from far memory.
    #[serde(default = "default_fetchers")]
    pub fetchers: usize,
    /// The server's shared secret (`None` for a server without one); never serialized.
    #[serde(default, skip_serializing)]
    pub token: Option<String>,
}

fn default_chunk() -> usize {
    256 << 10
}

fn default_fetchers() -> usize {
    2
}

/// What the controller settled on.
#[derive(Debug, Clone, Serialize)]
pub struct FarSetup {
    pub addr: String,
    pub chunk_bytes: usize,
    /// The transport in use (`tcp` where `uring` was asked for but is unavailable).
    pub transport: TransportKind,
    pub connections: usize,
    pub fetchers: usize,
    pub free_capacity: u64,
    /// Probe throughput (bytes/s) per connection count tried.
    pub probe: Vec<(usize, f64)>,
    pub ping_us: f64,
}

/// Bytes each controller probe moves.
const PROBE_BYTES: usize = 32 << 20;
/// A connection count is kept only if it adds this much throughput (Fargraph+'s greedy
/// thread allocation stops when the marginal gain is no longer positive; this is its noise
/// margin).
const MIN_GAIN: f64 = 0.10;

/// The chunk sizes far memory is read in (`run.far_chunk`): from one aligned page to 64 MiB.
pub const FAR_CHUNK_BYTES: std::ops::RangeInclusive<u64> = strata_io::ALIGN as u64..=64 << 20;

/// Connects to the memory server. With `connections = 0` the controller probes read
/// throughput at 1, 2, 4, ... connections and keeps adding while each step gains at least
/// [`MIN_GAIN`] (Fargraph+ §7's greedy marginal-gain rule, with a measurement in place of the
/// offline table).
pub fn connect(cfg: &FarConfig, progress: &dyn Progress) -> Result<(Arc<FarClient>, FarSetup)> {
    if !FAR_CHUNK_BYTES.contains(&(cfg.chunk_bytes as u64)) {
        return Err(GridError::config(
            "far.chunk_bytes",
            format!("must be between 4 KiB and 64 MiB, got {}", cfg.chunk_bytes),
        ));
    }
    let unreachable = |e: FarError| {
        GridError::config(
            "far",
            format!("cannot use the memory server at {}: {e}", cfg.addr),
        )
    };
    let transport = usable_transport(cfg.transport, progress);
    let client_cfg = |connections: usize| ClientConfig {
        addr: cfg.addr.clone(),
        chunk_bytes: cfg.chunk_bytes,
        data_connections: connections,
        transport,
        token: cfg.token.clone(),
        ..ClientConfig::default()
    };
    let mut probe = Vec::new();
    let connections = match cfg.connections {
        0 => {
            let mut best = (1usize, 0.0f64);
            for c in [1usize, 2, 4, 8] {
                let rate = probe_rate(&client_cfg(c)).map_err(unreachable)?;
                probe.push((c, rate));
                if c > 1 && rate < best.1 * (1.0 + MIN_GAIN) {
                    break;
                }
                if rate > best.1 {
                    best = (c, rate);
                }
            }
            best.0
        }
        c => c,
    };
    let client = FarClient::connect(&client_cfg(connections)).map_err(unreachable)?;
    let free_capacity = client.free_capacity().map_err(unreachable)?;
    let ping_us = client.ping().map_err(unreachable)?.as_secs_f64() * 1e6;
    progress.message(&format!(
        "far memory {}: {} free, ping {:.0} us, chunks of {}, {} data connections over {}{}",
        cfg.addr,
        fmt_bytes(free_capacity),
        ping_us,
        fmt_bytes(cfg.chunk_bytes as u64),
        connections,
        transport,
        if probe.is_empty() {
            String::new()
        } else {
            format!(
                " (probe: {})",
                probe
                    .iter()
                    .map(|(c, r)| format!("{c} -> {:.0} MB/s", r / 1e6))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    ));
    Ok((
        Arc::new(client),
        FarSetup {
            addr: cfg.addr.clone(),
            chunk_bytes: cfg.chunk_bytes,
            transport,
            connections,
            fetchers: cfg.fetchers.max(1),
            free_capacity,
            probe,
            ping_us,
        },
    ))
}

/// `asked`, or `tcp` with a message when `uring` is asked for and this process cannot use
/// io_uring (the disk copy's reads fall back the same way: the run goes on, slower).
fn usable_transport(asked: TransportKind, progress: &dyn Progress) -> TransportKind {
    if asked == TransportKind::Uring {
        if let Err(e) = strata_farmem::check_transport(asked) {
            progress.message(&format!("far memory: {e}; using the tcp transport"));
            return TransportKind::Tcp;
        }
    }
    asked
}

/// Read throughput (bytes/s) of a fresh client with `cfg`'s connections.
fn probe_rate(cfg: &ClientConfig) -> std::result::Result<f64, FarError> {
    let client = FarClient::connect(cfg)?;
    let id = u64::MAX - 1;
    client.alloc(id, PROBE_BYTES as u64)?;
    client.write(id, 0, &vec![0u8; PROBE_BYTES])?;
    let (tx, rx) = crossbeam_channel::unbounded::<FarCompletion>();
    let piece = 4 << 20;
    let t0 = Instant::now();
    let reqs: Vec<FarRead> = (0..PROBE_BYTES / piece)
        .map(|k| FarRead {
            segment: id,
            offset: (k * piece) as u64,
            len: piece,
            buf: vec![0u8; piece],
            tag: k as u64,
        })
        .collect();
    let n = reqs.len();
    client.submit(reqs, &tx);
    for _ in 0..n {
        rx.recv().expect("every read completes").result?;
    }
    let rate = PROBE_BYTES as f64 / t0.elapsed().as_secs_f64();
    client.free(id)?;
    Ok(rate)
}

/// Writes every segment placed in far memory to the server (segment id = its index): its
/// edges as stored (records, or a compressed grid's codes), then its weights when `weighted`.
pub fn preload(
    client: &FarClient,
    grid: &Grid,
    segments: &[Segment],
    tiers: &[Tier],
    weighted: bool,
    progress: &dyn Progress,
) -> Result<()> {
    let engine = strata_io::Engine::shared();
    let edges_file = engine.open(
        &grid.array_path(grid.manifest().edge_array()),
        strata_io::OpenMode::Read,
    )?;
    let weights_file = match weighted {
        true => Some(engine.open(&grid.array_path("weights"), strata_io::OpenMode::Read)?),
        false => None,
    };
    let total: u64 = segments
        .iter()
        .zip(tiers)
        .filter(|(_, t)| **t == Tier::Far)
        .map(|(s, _)| s.stored_bytes())
        .sum();
    let mut meter = Meter::new(progress, "grid: write edge blocks to far memory", total, 0);
    let mut q = engine.queue();
    let far_err = |e: strata_farmem::FarError| GridError::config("far", e.to_string());
    for (k, seg) in segments.iter().enumerate() {
        if tiers[k] != Tier::Far {
            continue;
        }
        let r = fetch::load_stored(&mut q, &edges_file, weights_file.as_ref(), seg)?;
        let wbytes = r.weights.as_ref().map_or(0, |w| w.len());
        client
            .alloc(k as u64, (r.edges.len() + wbytes) as u64)
            .map_err(far_err)?;
        client
            .write(k as u64, 0, r.edges.as_slice())
            .map_err(far_err)?;
        if let Some(w) = &r.weights {
            client
                .write(k as u64, r.edges.len() as u64, w.as_slice())
                .map_err(far_err)?;
        }
        meter.add(0, seg.stored_bytes())?;
    }
    meter.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Far memory end to end: the placement offloads edge blocks to a memory server, results
    //! equal a local run, and losing the server mid-run costs speed, not the result.

    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use strata_farmem::TransportKind;
    use strata_io::progress::{NoProgress, Progress};
    use strata_store::array::read_all_bytes;
    use strata_store::rng::Rng;

    use super::FarConfig;
    use crate::algo::{Configured, Iteration, PageRank};
    use crate::block_codec::Compression;
    use crate::build::{build, BuildJob};
    use crate::config::RunJob;
    use crate::fixtures::{far_server, store_of};
    use crate::run::{run, RunSummary};
    use strata_store::config::{AutoSize, Size};

    /// A store of 300,000 random edges over 4,000 vertices and its grid of 16 x 16 blocks.
    fn store(dir: &Path) -> PathBuf {
        let mut rng = Rng::new(9);
        let n = 4000u64;
        let edges: Vec<(u64, u64)> = (0..300_000).map(|_| (rng.below(n), rng.below(n))).collect();
        let out = store_of(dir, n, edges);
        let grid = BuildJob {
            store: out.clone(),
            partitions: 16,
            ..Default::default()
        };
        build(&grid, &NoProgress).unwrap();
        out
    }

    fn job(store: &Path, far: Option<String>) -> RunJob {
        job_on(store, far, TransportKind::Tcp)
    }

    fn job_on(store: &Path, far: Option<String>, transport: TransportKind) -> RunJob {
        RunJob {
            store: store.to_path_buf(),
            algorithm: Configured::new(PageRank {
                iterations: 12,
                tolerance: 0.0,
                damping: 0.85,
            }),
            grid: None,
            memory: Size(1 << 30),
            threads: 2,
            segment: AutoSize::Bytes(16 << 10),
            prefetch: 2,
            disk_fetchers: 2,
            vertex: Default::default(),
            far: far.map(|addr| FarConfig {
                addr,
                ratio: 0.7,
                chunk_bytes: 4096,
                transport,
                connections: 2,
                fetchers: 2,
                token: None,
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
        let (_, b) = read_all_bytes(Path::new(&s.arrays[0])).unwrap();
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

    #[test]
    fn far_run_equals_local_and_survives_losing_the_server() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path());
        let local = run(&job(&st, None), &NoProgress, &mut |_: &Iteration| Ok(())).unwrap();
        assert_eq!(local.bytes_far, 0);

        let (addr, stop, h) = far_server();
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
        let (addr2, stop2, h2) = far_server();
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

    #[test]
    fn compressed_blocks_go_to_far_memory_as_codes_and_decode_to_the_same_ranks() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path());
        let plain = run(&job(&st, None), &NoProgress, &mut |_: &Iteration| Ok(())).unwrap();
        build(
            &BuildJob {
                store: st.clone(),
                name: "packed".into(),
                partitions: 16,
                compression: Compression::Packed,
                ..Default::default()
            },
            &NoProgress,
        )
        .unwrap();
        // The far run goes over io_uring (the other far tests over tcp).
        let on_packed = |far: Option<String>| RunJob {
            grid: Some("packed".into()),
            ..job_on(&st, far, TransportKind::Uring)
        };
        let local = run(&on_packed(None), &NoProgress, &mut |_: &Iteration| Ok(())).unwrap();
        assert!(local.stored_bytes_per_edge < 4.0, "{local:?}");
        let (addr, stop, h) = far_server();
        let far = run(&on_packed(Some(addr)), &NoProgress, &mut |_: &Iteration| {
            Ok(())
        })
        .unwrap();
        stop.stop();
        h.join().unwrap();
        assert!(
            far.far_failure.is_none() && far.edges_decoded > 0,
            "{far:?}"
        );
        // Far memory holds and sends the codes; resident blocks were decoded at load.
        let per_pass = far.bytes_far / far.iterations as u64;
        assert_eq!(per_pass, far.placement.far_bytes);
        assert!(per_pass < far.edges_decoded / far.iterations as u64 * 4);
        assert_eq!(ranks(&far), ranks(&local));
        for (a, b) in ranks(&local).iter().zip(ranks(&plain)) {
            assert!((a - b).abs() <= 1e-6 * b.abs() + 1e-9, "{a} vs {b}");
        }
    }
}
