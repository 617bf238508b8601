//! Tests of the batch pipeline: bytes and order, determinism across modes, the window's pins,
//! the accumulator, errors and shutdown.

use super::pins::WindowPins;
use super::*;
use strata_graph::features::{FeatureReader, ReadOptions};
use strata_graph::sampler::SamplerConfig;

use crate::cache::Eviction;
use std::panic;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use strata_io::{BackendKind, Engine};
use strata_store::npy::{self, DType};
use strata_store::rng::splitmix;

/// Nodes of the test graph.
const N: u32 = 2000;
/// Floats per row: 96-byte rows, so several share a page and the reader coalesces.
const DIM: usize = 24;
/// Training seeds: every third node, 667 of them, so 14 batches of 50 (the last of 17).
const BATCH: usize = 50;
const NUM_BATCHES: usize = 14;

/// A small engine on the thread-pool backend: the window is small, so gathers wait for
/// room, and it works on every file system.
fn engine() -> Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| strata_io::testing::engine(BackendKind::Threads, 16, 4))
        .clone()
}

/// `n` nodes with 0..12 in-neighbours each, drawn as the smaller of two uniform ids: low
/// ids are hubs, so batches overlap and the tiers hit.
fn graph(n: u32, seed: u64) -> Topology {
    let mut s = seed;
    let mut indptr = vec![0u64];
    let mut indices = Vec::new();
    for _ in 0..n {
        for _ in 0..splitmix(&mut s) % 12 {
            let a = splitmix(&mut s) % n as u64;
            let b = splitmix(&mut s) % n as u64;
            indices.push(a.min(b) as u32);
        }
        indptr.push(indices.len() as u64);
    }
    Topology::new(indptr, indices).unwrap()
}

/// A `(rows, dim)` float32 `.npy` with its data at byte 4096 (Strata's header); element
/// `(r, c)` is `r * dim + c + 0.5`, so every row is distinct.
fn write_features(dir: &Path, rows: u64, dim: usize) -> PathBuf {
    let path = dir.join(format!("features-{rows}.npy"));
    let mut bytes = npy::header_block(DType::F32, &[rows, dim as u64]);
    assert_eq!(bytes.len(), 4096);
    for r in 0..rows as usize {
        for c in 0..dim {
            bytes.extend_from_slice(&((r * dim + c) as f32 + 0.5).to_le_bytes());
        }
    }
    std::fs::write(&path, bytes).unwrap();
    path
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// The whole feature file, for direct reads.
    file: Vec<u8>,
    topo: Arc<Topology>,
    sampler: Arc<NeighborSampler>,
    train: Vec<u32>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = write_features(dir.path(), N as u64, DIM);
    let sampler = NeighborSampler::new(SamplerConfig {
        fanouts: vec![5, 3],
        seed: 7,
        threads: 1,
        ..SamplerConfig::default()
    })
    .unwrap();
    Fixture {
        file: std::fs::read(&path).unwrap(),
        path,
        _dir: dir,
        topo: Arc::new(graph(N, 3)),
        sampler: Arc::new(sampler),
        train: (0..N).step_by(3).collect(),
    }
}

impl Fixture {
    /// Tiers with the `hot` lowest ids (the hubs) in the hot set and a cache of
    /// `cache_rows` rows.
    fn tiers(&self, hot: u32, cache_rows: usize) -> Arc<FeatureTiers> {
        let reader =
            FeatureReader::with_engine(&self.path, engine(), ReadOptions::default()).unwrap();
        let hot: Vec<u32> = (0..hot).collect();
        Arc::new(FeatureTiers::build(reader, &hot, cache_rows, Eviction::Clock).unwrap())
    }

    fn loader(
        &self,
        tiers: &Arc<FeatureTiers>,
        seeds: Vec<u32>,
        epoch: u64,
        cfg: LoaderConfig,
    ) -> NodeLoader {
        NodeLoader::new(
            self.topo.clone(),
            self.sampler.clone(),
            tiers.clone(),
            seeds,
            epoch,
            cfg,
        )
        .unwrap()
    }

    /// [`Fixture::loader`] whose merged read holding batch `fail` fails.
    fn failing_loader(
        &self,
        tiers: &Arc<FeatureTiers>,
        cfg: LoaderConfig,
        fail: usize,
    ) -> NodeLoader {
        NodeLoader::start(
            self.topo.clone(),
            self.sampler.clone(),
            tiers.clone(),
            Items::Nodes(self.train.clone()),
            0,
            cfg,
            ReadFault { batch: Some(fail) },
        )
        .unwrap()
    }

    /// Every batch of an epoch over the training seeds, and the stats.
    fn epoch(
        &self,
        tiers: &Arc<FeatureTiers>,
        epoch: u64,
        cfg: LoaderConfig,
    ) -> (Vec<Batch>, PipelineStats) {
        let mut loader = self.loader(tiers, self.train.clone(), epoch, cfg);
        let batches: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
        (batches, loader.stats())
    }

    /// The rows of `nodes` read plainly from the file.
    fn expected(&self, nodes: &[u32]) -> Vec<u8> {
        let rb = DIM * 4;
        let mut out = Vec::with_capacity(nodes.len() * rb);
        for &v in nodes {
            out.extend_from_slice(&self.file[4096 + v as usize * rb..][..rb]);
        }
        out
    }

    fn check_batches(&self, batches: &[Batch]) {
        for (i, b) in batches.iter().enumerate() {
            assert_eq!(b.index, i, "batches arrive in order");
            assert_eq!(&b.sample.nodes[..b.seeds.len()], &b.seeds[..]);
            assert_eq!(b.features.len(), b.sample.nodes.len() * DIM * 4);
            assert!(
                b.features == self.expected(&b.sample.nodes),
                "batch {i}: features differ from the file's rows"
            );
            assert_eq!(
                b.stats.memory_rows + b.stats.disk_rows,
                b.sample.nodes.len()
            );
        }
    }
}

/// Every pin taken for the window was released.
fn check_no_pins(tiers: &FeatureTiers) {
    let cache = tiers.cache_for_tests();
    assert_eq!(cache.pinned_rows(), 0, "pinned cached rows after the epoch");
    if let Some(v) = (0..N).find(|&v| cache.pins(v) != 0) {
        panic!("node {v} still holds {} pins", cache.pins(v));
    }
}

fn cfg() -> LoaderConfig {
    LoaderConfig {
        batch_size: BATCH,
        window: 4,
        in_flight_target: 64,
        sampler_threads: 2,
        io_threads: 2,
        ..LoaderConfig::default()
    }
}

#[test]
fn batches_hold_the_file_rows_in_order_and_cover_every_seed_once() {
    let f = fixture();
    for pipeline in [true, false] {
        let tiers = f.tiers(100, 300);
        let cfg = LoaderConfig { pipeline, ..cfg() };
        let mut loader = f.loader(&tiers, f.train.clone(), 0, cfg);
        assert_eq!(loader.num_batches(), NUM_BATCHES);
        assert_eq!(loader.size_hint(), (1, Some(NUM_BATCHES)));
        let batches: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
        let stats = loader.stats();
        assert_eq!(batches.len(), NUM_BATCHES);
        f.check_batches(&batches);
        assert!(batches[..NUM_BATCHES - 1]
            .iter()
            .all(|b| b.seeds.len() == BATCH));
        assert_eq!(batches[NUM_BATCHES - 1].seeds.len(), f.train.len() % BATCH);
        let mut seen: Vec<u32> = batches.iter().flat_map(|b| b.seeds.clone()).collect();
        seen.sort_unstable();
        assert_eq!(seen, f.train, "each training seed exactly once");
        check_no_pins(&tiers);

        assert_eq!(stats.batches, NUM_BATCHES as u64);
        assert_eq!(stats.seeds, f.train.len() as u64);
        let nodes: usize = batches.iter().map(|b| b.sample.nodes.len()).sum();
        assert_eq!(stats.sampled_nodes, nodes as u64);
        assert_eq!(
            stats.tiers.rows, nodes as u64,
            "every row went through the tiers"
        );
        assert!(stats.tiers.hot_rows > 0 && stats.tiers.disk_rows > 0);
        assert_eq!(stats.read.rows_distinct, stats.read_rows);
        assert_eq!(stats.tiers.disk_requests, stats.read.requests);
        assert_eq!(stats.pipelined, pipeline);
        assert!(stats.wall_secs > 0.0 && stats.sample_busy_secs > 0.0);
        assert!(stats.io_busy_secs > 0.0 && stats.lookup_busy_secs > 0.0);
        assert!(stats.busy_secs() > 0.0 && stats.overlap() > 0.0);
        let json = serde_json::to_string(&stats).unwrap();
        assert!(json.contains("\"assemble_busy_secs\""), "{json}");
    }
}

#[test]
fn batches_are_identical_however_the_pipeline_runs() {
    let f = fixture();
    let base_cfg = LoaderConfig {
        pipeline: false,
        accumulator: false,
        window: 0,
        ..cfg()
    };
    let (base, _) = f.epoch(&f.tiers(0, 0), 5, base_cfg);
    f.check_batches(&base);
    // One set of tiers for all runs: the cache carries rows over, which must not change
    // a byte. A target no read reaches merges a window of batches, whose cache hits then wait
    // longest (pinned, in a cache of 250 rows) for their copy at assembly.
    let tiers = f.tiers(60, 250);
    for pipeline in [false, true] {
        for (accumulator, in_flight_target) in [(false, 64), (true, 64), (true, 1 << 30)] {
            for window in [0, 4, 8] {
                for sampler_threads in [1, 3] {
                    let cfg = LoaderConfig {
                        pipeline,
                        accumulator,
                        in_flight_target,
                        window,
                        sampler_threads,
                        io_threads: sampler_threads.min(2),
                        ..cfg()
                    };
                    let what = format!("{cfg:?}");
                    let (batches, _) = f.epoch(&tiers, 5, cfg);
                    assert_eq!(batches.len(), base.len(), "{what}");
                    for (a, b) in base.iter().zip(&batches) {
                        assert_eq!(a.index, b.index, "{what}");
                        assert_eq!(a.seeds, b.seeds, "{what}");
                        assert_eq!(a.sample, b.sample, "{what}");
                        assert!(a.features == b.features, "{what}: batch {}", a.index);
                    }
                    check_no_pins(&tiers);
                }
            }
        }
    }
}

#[test]
fn shuffle_is_a_function_of_seed_and_epoch() {
    let f = fixture();
    let tiers = f.tiers(0, 100);
    let order = |epoch: u64, cfg: LoaderConfig| -> Vec<u32> {
        let (batches, _) = f.epoch(&tiers, epoch, cfg);
        batches.into_iter().flat_map(|b| b.seeds).collect()
    };
    let a = order(0, cfg());
    assert_eq!(a, order(0, cfg()));
    assert_ne!(a, f.train, "shuffled");
    assert_ne!(a, order(1, cfg()), "another epoch, another order");
    assert_ne!(a, order(0, LoaderConfig { seed: 9, ..cfg() }));
    let plain = LoaderConfig {
        shuffle: false,
        ..cfg()
    };
    assert_eq!(order(0, plain.clone()), f.train);
    assert_eq!(order(3, plain), f.train, "unshuffled: the given order");

    let cfg = LoaderConfig {
        drop_last: true,
        ..cfg()
    };
    let (batches, _) = f.epoch(&tiers, 0, cfg);
    assert_eq!(batches.len(), f.train.len() / BATCH);
    assert!(batches.iter().all(|b| b.seeds.len() == BATCH));
    // The samples depend on the batch key only: a batch re-sampled alone matches.
    let b = &batches[2];
    assert_eq!(
        f.sampler
            .sample(&f.topo, &b.seeds, batch_key(0, 2))
            .unwrap(),
        b.sample
    );
    check_no_pins(&tiers);
}

#[test]
fn the_window_pins_batches_ahead_until_they_are_served() {
    let f = fixture();
    let tiers = f.tiers(0, 300);
    let pinned = |t: &FeatureTiers| -> u64 {
        let cache = t.cache_for_tests();
        (0..N).map(|v| cache.pins(v) as u64).sum()
    };
    let cfg = LoaderConfig {
        pipeline: false,
        window: 4,
        ..cfg()
    };
    let mut loader = f.loader(&tiers, f.train.clone(), 0, cfg);
    let first = loader.next().unwrap().unwrap();
    // Serial: batch 0 was looked up, read and filled (its misses exceed the target, so it was
    // read alone); batches 1 to 4 wait in the window, each node pinned once per batch.
    let held = pinned(&tiers);
    assert!(held > 0, "no pin held for the batches ahead");
    assert!(held as usize > first.sample.nodes.len() / 2);
    let rest: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
    assert_eq!(rest.len(), NUM_BATCHES - 1);
    assert_eq!(pinned(&tiers), 0);
    check_no_pins(&tiers);
}

#[test]
fn window_pins_release_exactly_what_a_batch_still_holds() {
    let f = fixture();
    // Nodes 0..10 are hot: never pinned.
    let tiers = f.tiers(10, 40);
    let rb = DIM * 4;
    let counts = |t: &FeatureTiers| -> Vec<u32> {
        let cache = t.cache_for_tests();
        (0..N).map(|v| cache.pins(v)).collect()
    };
    let want = |batches: &[&[u32]]| -> Vec<u32> {
        let mut w = vec![0u32; N as usize];
        for &v in batches.iter().flat_map(|b| b.iter()).filter(|&&v| v >= 10) {
            w[v as usize] += 1;
        }
        w
    };
    let a: Vec<u32> = vec![0, 3, 12, 12, 50, 51, 52, 300];
    let b: Vec<u32> = vec![12, 50, 60, 60, 400];
    // Cache some of a's rows, so that serving it has hits and misses.
    let mut out = vec![0u8; 3 * rb];
    tiers.gather(&[50, 12, 300], &mut out).unwrap();

    let pa = WindowPins::pin(&tiers, &a);
    let pb = WindowPins::pin(&tiers, &b);
    assert_eq!(counts(&tiers), want(&[&a, &b]));
    // a is looked up: hot 0 and 3, cached 12, 12, 50 and 300, missing 51 and 52; every pin
    // stays held, so that its hits stay cached until they are copied.
    let (lookup, miss_nodes) = pa.lookup(&a);
    assert_eq!(
        (lookup.misses.clone(), miss_nodes.clone()),
        (vec![5, 6], vec![51, 52])
    );
    assert_eq!(counts(&tiers), want(&[&a, &b]));
    // Abandoned before it was filled: all of its pins are released, b keeps its own.
    drop(pa);
    assert_eq!(counts(&tiers), want(&[&b]));

    // A batch filled holds nothing more (its hits copied, its disk rows admitted); dropping
    // it releases nothing, and its buffer holds every row.
    let (lookup, miss_nodes) = pb.lookup(&b);
    let pc = WindowPins::pin(&tiers, &b);
    let mut out = vec![0u8; b.len() * rb];
    pb.fill(&b, &lookup, &miss_nodes, &f.expected(&miss_nodes), &mut out);
    assert_eq!(out, f.expected(&b));
    assert_eq!(counts(&tiers), want(&[&b]), "only c's pins remain");
    // A batch only pinned releases all of its pins.
    drop(pc);
    check_no_pins(&tiers);

    // Without a dynamic cache nothing is pinned nor released.
    let no_cache = f.tiers(10, 0);
    let p = WindowPins::pin(&no_cache, &a);
    let (_, miss_nodes) = p.lookup(&a);
    assert_eq!(miss_nodes.len(), 6);
    drop(p);
    check_no_pins(&no_cache);
}

#[test]
fn the_accumulator_merges_batches_up_to_the_window() {
    let f = fixture();
    for pipeline in [true, false] {
        // No memory tier: every row of every batch is a disk row.
        let tiers = f.tiers(0, 0);
        let run = |accumulator: bool, target: usize| {
            let cfg = LoaderConfig {
                pipeline,
                accumulator,
                in_flight_target: target,
                window: 4,
                ..cfg()
            };
            let (batches, stats) = f.epoch(&tiers, 0, cfg);
            f.check_batches(&batches);
            assert_eq!(stats.in_flight_target, target.max(1));
            (batches, stats)
        };
        let (alone, off) = run(false, 1 << 30);
        assert_eq!(off.reads, NUM_BATCHES as u64);
        assert_eq!(off.max_batches_per_read, 1);
        assert!(alone.iter().all(|b| b.stats.merged_batches == 1));
        let per_batch = alone.iter().map(|b| b.sample.nodes.len()).max().unwrap();

        // A target no batch reaches: merged up to the window (4), 14 = 4 + 4 + 4 + 2.
        let (merged, on) = run(true, 1 << 30);
        assert_eq!(on.reads, 4, "{on:?}");
        assert_eq!(on.read_batches, NUM_BATCHES as u64);
        assert_eq!(on.max_batches_per_read, 4);
        assert_eq!(on.mean_batches_per_read, 3.5);
        let sizes: Vec<usize> = merged.iter().map(|b| b.stats.merged_batches).collect();
        assert_eq!(sizes, [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2]);
        assert!(
            on.mean_rows_per_read > per_batch as f64,
            "merged reads ({}) exceed the largest batch ({per_batch})",
            on.mean_rows_per_read
        );
        assert!(on.mean_rows_per_read > off.mean_rows_per_read);
        // Rows shared by merged batches are read once.
        assert!(
            on.read_rows < off.read_rows,
            "{} vs {}",
            on.read_rows,
            off.read_rows
        );

        // A target every batch reaches alone: no merging.
        let (_, small) = run(true, 1);
        assert_eq!(small.reads, NUM_BATCHES as u64);
        assert_eq!(small.max_batches_per_read, 4);
    }
}

#[test]
fn the_in_flight_target_defaults_to_the_device_or_the_engine() {
    let f = fixture();
    let tiers = f.tiers(0, 0);
    let loader = f.loader(
        &tiers,
        f.train.clone(),
        0,
        LoaderConfig {
            in_flight_target: 0,
            ..cfg()
        },
    );
    let stats = loader.stats();
    assert!(loader.in_flight_target() >= 1);
    match stats.in_flight_source {
        Some(TargetSource::EngineDepth) => assert_eq!(loader.in_flight_target(), 16),
        Some(TargetSource::Profile) => {}
        other => panic!("unexpected source {other:?}"),
    }
}

#[test]
fn errors_arrive_in_order_and_end_the_epoch() {
    let f = fixture();
    // Batch 3 (unshuffled) holds a node the graph does not have.
    let mut seeds = f.train.clone();
    seeds[3 * BATCH + 7] = N + 5;
    for pipeline in [true, false] {
        for accumulator in [true, false] {
            let tiers = f.tiers(10, 100);
            let cfg = LoaderConfig {
                pipeline,
                accumulator,
                shuffle: false,
                sampler_threads: 3,
                ..cfg()
            };
            let mut loader = f.loader(&tiers, seeds.clone(), 0, cfg);
            for i in 0..3 {
                let b = loader.next().unwrap().unwrap();
                assert_eq!(b.index, i);
                assert!(b.features == f.expected(&b.sample.nodes));
            }
            let e = loader.next().unwrap().unwrap_err().to_string();
            assert!(e.contains("out of range"), "{e}");
            assert!(loader.next().is_none());
            assert!(loader.next().is_none());
            assert_eq!(loader.size_hint(), (0, Some(0)));
            assert_eq!(loader.stats().batches, 3);
            check_no_pins(&tiers);
        }
    }
}

#[test]
fn a_failed_read_ends_the_epoch_and_releases_every_pin() {
    let f = Arc::new(fixture());
    const FAIL: usize = 5;
    for pipeline in [true, false] {
        for (accumulator, window) in [(false, 0), (false, 4), (true, 4), (true, 8)] {
            let f = f.clone();
            let what = format!("pipeline {pipeline}, accumulator {accumulator}, window {window}");
            within(60, &what.clone(), move || {
                let tiers = f.tiers(10, 100);
                let cfg = LoaderConfig {
                    pipeline,
                    accumulator,
                    window,
                    in_flight_target: 1 << 20,
                    sampler_threads: 3,
                    ..cfg()
                };
                let mut loader = f.failing_loader(&tiers, cfg, FAIL);
                let mut delivered = 0;
                let e = loop {
                    match loader.next().expect("the epoch ends with the error") {
                        Ok(b) => {
                            assert_eq!(b.index, delivered, "{what}");
                            assert!(b.features == f.expected(&b.sample.nodes));
                            delivered += 1;
                        }
                        Err(e) => break e.to_string(),
                    }
                };
                assert!(e.contains("injected read error"), "{what}: {e}");
                // The batches before the failed read's first one are delivered: all of them
                // when each batch is read alone, else those of the earlier merged reads.
                if accumulator {
                    assert!(delivered <= FAIL && delivered + window > FAIL, "{what}");
                } else {
                    assert_eq!(delivered, FAIL, "{what}");
                }
                // The failed read's batches, those behind it in the window and any in flight
                // gave their pins back when the error was handed out, not only at drop.
                check_no_pins(&tiers);
                assert!(loader.next().is_none());
                drop(loader);
                check_no_pins(&tiers);
                assert_eq!(Arc::strong_count(&tiers), 1, "{what}");
            });
        }
    }
}

/// Runs `f` on another thread and fails if it does not return in time (a hang).
fn within(secs: u64, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        // The thread panicked: report its panic.
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                panic::resume_unwind(p)
            }
        }
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => panic!("{what}: hung"),
    }
}

#[test]
fn dropping_the_loader_mid_epoch_stops_every_stage_and_releases_every_pin() {
    let f = Arc::new(fixture());
    for take in [0usize, 1, 5, NUM_BATCHES, NUM_BATCHES + 1] {
        for (pipeline, window, io_threads) in [
            (true, 0, 1),
            (true, 8, 2),
            (true, 4, 1),
            (false, 0, 1),
            (false, 8, 1),
        ] {
            let f = f.clone();
            let what = format!("drop after {take} batches, pipeline {pipeline}, window {window}");
            within(60, &what.clone(), move || {
                let tiers = f.tiers(10, 50);
                let cfg = LoaderConfig {
                    pipeline,
                    window,
                    io_threads,
                    sampler_threads: 3,
                    ..cfg()
                };
                let mut loader = f.loader(&tiers, f.train.clone(), 0, cfg);
                for _ in 0..take {
                    if let Some(b) = loader.next() {
                        b.unwrap();
                    }
                }
                drop(loader);
                // Every stage thread held the tiers; joined threads released them.
                assert_eq!(
                    Arc::strong_count(&tiers),
                    1,
                    "{what}: a stage thread outlived drop"
                );
                // Batches pinned, served or in a read when the loader went gave back exactly
                // the pins they still held.
                check_no_pins(&tiers);
            });
        }
    }
}

#[test]
fn configuration_errors_and_empty_epochs() {
    let f = fixture();
    let tiers = f.tiers(0, 10);
    let new = |cfg: LoaderConfig| {
        NodeLoader::new(
            f.topo.clone(),
            f.sampler.clone(),
            tiers.clone(),
            f.train.clone(),
            0,
            cfg,
        )
    };
    for (cfg, option) in [
        (
            LoaderConfig {
                batch_size: 0,
                ..cfg()
            },
            "batch_size",
        ),
        (
            LoaderConfig {
                sampler_threads: 0,
                ..cfg()
            },
            "sampler_threads",
        ),
        (
            LoaderConfig {
                io_threads: 0,
                ..cfg()
            },
            "io_threads",
        ),
    ] {
        let e = new(cfg).err().expect("rejected").to_string();
        assert!(e.contains(option), "{e}");
    }

    // Features with fewer rows than the graph has nodes.
    let small = write_features(f._dir.path(), 100, DIM);
    let reader = FeatureReader::with_engine(&small, engine(), ReadOptions::default()).unwrap();
    let small = Arc::new(FeatureTiers::build(reader, &[], 10, Eviction::Clock).unwrap());
    let e = NodeLoader::new(
        f.topo.clone(),
        f.sampler.clone(),
        small,
        f.train.clone(),
        0,
        cfg(),
    )
    .err()
    .expect("rejected")
    .to_string();
    assert!(e.contains("100 feature rows"), "{e}");

    for pipeline in [true, false] {
        let mut loader = f.loader(&tiers, Vec::new(), 0, LoaderConfig { pipeline, ..cfg() });
        assert_eq!(loader.num_batches(), 0);
        assert!(loader.next().is_none());
        assert_eq!(loader.stats().batches, 0);
    }

    let d = LoaderConfig::default();
    assert!(d.shuffle && d.accumulator && d.pipeline && !d.drop_last);
    assert_eq!((d.window, d.in_flight_target, d.batch_size), (8, 0, 1024));
    let parsed: LoaderConfig = serde_json::from_str(r#"{"window": 2}"#).unwrap();
    assert_eq!(parsed.window, 2);
    assert!(serde_json::from_str::<LoaderConfig>(r#"{"windw": 2}"#).is_err());
}

#[test]
fn loader_is_send() {
    fn check<T: Send>() {}
    check::<NodeLoader>();
    check::<Batch>();
}

// ---- link batches ----

/// Positive edges per link batch.
const LINK_BATCH: usize = 40;
const NEGATIVES: usize = 2;

impl Fixture {
    /// Every 20th edge of the graph as `(sources, destinations)`, a few hundred pairs.
    fn edges(&self) -> (Vec<u32>, Vec<u32>) {
        (0..N)
            .flat_map(|v| self.topo.neighbors(v).iter().map(move |&u| (u, v)))
            .step_by(20)
            .unzip()
    }

    fn link_loader(
        &self,
        tiers: &Arc<FeatureTiers>,
        (src, dst): (Vec<u32>, Vec<u32>),
        epoch: u64,
        cfg: LoaderConfig,
    ) -> Result<NodeLoader> {
        let edges = LinkEdges {
            src,
            dst,
            negatives_per_edge: NEGATIVES,
        };
        NodeLoader::links(
            self.topo.clone(),
            self.sampler.clone(),
            tiers.clone(),
            edges,
            epoch,
            cfg,
        )
    }

    fn link_epoch(&self, tiers: &Arc<FeatureTiers>, epoch: u64, cfg: LoaderConfig) -> Vec<Batch> {
        let loader = self.link_loader(tiers, self.edges(), epoch, cfg).unwrap();
        loader.map(|b| b.unwrap()).collect()
    }
}

fn link_cfg() -> LoaderConfig {
    LoaderConfig {
        batch_size: LINK_BATCH,
        ..cfg()
    }
}

/// A link batch's positive edges as global `(sources, destinations)`.
fn positives(b: &Batch) -> (Vec<u32>, Vec<u32>) {
    let links = b.links.as_ref().expect("a link batch");
    let global =
        |ids: &[u32]| -> Vec<u32> { ids.iter().map(|&i| b.sample.nodes[i as usize]).collect() };
    (global(&links.src_local), global(&links.dst_local))
}

#[test]
fn link_batches_are_sample_links_in_order_and_cover_every_edge_once() {
    let f = fixture();
    let (src, dst) = f.edges();
    let num_batches = src.len().div_ceil(LINK_BATCH);
    assert!(num_batches > 8, "{} edges", src.len());
    for pipeline in [true, false] {
        for shuffle in [true, false] {
            let tiers = f.tiers(100, 300);
            let cfg = LoaderConfig {
                pipeline,
                shuffle,
                ..link_cfg()
            };
            let mut loader = f.link_loader(&tiers, f.edges(), 4, cfg).unwrap();
            assert_eq!(loader.num_batches(), num_batches);
            let batches: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
            let stats = loader.stats();
            assert_eq!(batches.len(), num_batches);
            f.check_batches(&batches);
            let mut seen = Vec::new();
            for (i, b) in batches.iter().enumerate() {
                let (bs, bd) = positives(b);
                if !shuffle {
                    let range = i * LINK_BATCH..((i + 1) * LINK_BATCH).min(src.len());
                    assert_eq!((&bs[..], &bd[..]), (&src[range.clone()], &dst[range]));
                }
                // The pipeline's batch is sample_links with the batch's key, nothing more.
                let direct = f
                    .sampler
                    .sample_links(&f.topo, &bs, &bd, NEGATIVES, batch_key(4, i))
                    .unwrap();
                assert_eq!(b.sample, direct.sample, "batch {i}");
                let links = b.links.as_ref().unwrap();
                assert_eq!(links.src_local, direct.src_local);
                assert_eq!(links.dst_local, direct.dst_local);
                assert_eq!(links.neg_dst_local, direct.neg_dst_local);
                assert_eq!(links.neg_dst_local.len(), bs.len() * NEGATIVES);
                assert_eq!(b.seeds, &b.sample.nodes[..b.sample.hop_counts[0]]);
                seen.extend(bs.into_iter().zip(bd));
            }
            let mut want: Vec<(u32, u32)> = src.iter().copied().zip(dst.iter().copied()).collect();
            want.sort_unstable();
            seen.sort_unstable();
            assert_eq!(seen, want, "each edge exactly once");
            assert_eq!(stats.positive_edges, src.len() as u64);
            assert_eq!(stats.batches, num_batches as u64);
            check_no_pins(&tiers);
        }
    }

    // Node batches carry no link part.
    let (batches, stats) = f.epoch(&f.tiers(0, 100), 0, cfg());
    assert!(batches.iter().all(|b| b.links.is_none()));
    assert_eq!(stats.positive_edges, 0);
}

#[test]
fn link_batches_are_identical_however_the_pipeline_runs() {
    let f = fixture();
    let base_cfg = LoaderConfig {
        pipeline: false,
        accumulator: false,
        window: 0,
        ..link_cfg()
    };
    let base = f.link_epoch(&f.tiers(0, 0), 2, base_cfg);
    f.check_batches(&base);
    let tiers = f.tiers(60, 250);
    for pipeline in [false, true] {
        for accumulator in [false, true] {
            for window in [0, 4] {
                let cfg = LoaderConfig {
                    pipeline,
                    accumulator,
                    window,
                    sampler_threads: 3,
                    ..link_cfg()
                };
                let what = format!("{cfg:?}");
                let batches = f.link_epoch(&tiers, 2, cfg);
                assert_eq!(batches.len(), base.len(), "{what}");
                for (a, b) in base.iter().zip(&batches) {
                    assert_eq!(a.index, b.index, "{what}");
                    assert_eq!(a.seeds, b.seeds, "{what}");
                    assert_eq!(a.links, b.links, "{what}");
                    assert_eq!(a.sample, b.sample, "{what}");
                    assert!(a.features == b.features, "{what}: batch {}", a.index);
                }
                check_no_pins(&tiers);
            }
        }
    }
    // Another epoch shuffles the edges differently.
    let other = f.link_epoch(&tiers, 3, link_cfg());
    assert_ne!(positives(&other[0]), positives(&base[0]));
}

#[test]
fn link_epochs_check_their_edges() {
    let f = fixture();
    let tiers = f.tiers(10, 100);
    let (src, mut dst) = f.edges();
    let e = f
        .link_loader(&tiers, (src.clone(), dst[1..].to_vec()), 0, link_cfg())
        .err()
        .expect("rejected")
        .to_string();
    assert!(e.contains("must pair up"), "{e}");

    // Batch 3 (unshuffled) holds an endpoint the graph does not have.
    dst[3 * LINK_BATCH + 5] = N + 1;
    for pipeline in [true, false] {
        let cfg = LoaderConfig {
            pipeline,
            shuffle: false,
            ..link_cfg()
        };
        let mut loader = f
            .link_loader(&tiers, (src.clone(), dst.clone()), 0, cfg)
            .unwrap();
        for i in 0..3 {
            assert_eq!(loader.next().unwrap().unwrap().index, i);
        }
        let e = loader.next().unwrap().unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
        assert!(loader.next().is_none());
        check_no_pins(&tiers);
    }

    let cfg = LoaderConfig {
        drop_last: true,
        ..link_cfg()
    };
    let batches = f.link_epoch(&tiers, 0, cfg);
    assert_eq!(batches.len(), src.len() / LINK_BATCH);
    assert!(batches.iter().all(|b| positives(b).0.len() == LINK_BATCH));

    let mut empty = f
        .link_loader(&tiers, (Vec::new(), Vec::new()), 0, link_cfg())
        .unwrap();
    assert_eq!(empty.num_batches(), 0);
    assert!(empty.next().is_none());
}
