//! Labelled degree-corrected stochastic block models with class-centroid features, for GNN
//! node classification tests.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::planted::{
    centroids, check_feature_dim, check_noise, check_power_law, check_split_fractions, other_class,
    push_features, split_counts, split_slot, Blocks, FeatureDtype,
};
use super::{check_fraction, config_check, run_ordered, worker_threads, GenerateSummary, Staging};
use crate::array::{NpyWriter, IO_CHUNK};
use crate::config::{ConfigError, Section};
use crate::disk_room;
use crate::error::{Result, StoreError};
use crate::manifest::id_dtype_for;
use crate::npy::{DType, DATA_OFFSET};
use crate::perm::Perm;
use crate::rng::{derive, Rng};
use strata_io::progress::{Meter, Progress};

/// The files an SBM directory holds.
const FILES: [&str; 6] = [
    "edges.npy",
    "features.npy",
    "labels.npy",
    "train_idx.npy",
    "valid_idx.npy",
    "test_idx.npy",
];
/// Edges per work chunk.
const CHUNK_EDGES: u64 = 1 << 17;
/// Target feature bytes per work chunk of nodes.
const CHUNK_FEATURE_BYTES: u64 = 1 << 20;
/// Largest number of nodes: the keyed permutation's domain limit.
const MAX_NODES: u64 = 1 << 62;

// Stream keys, mixed with the seed.
const STREAM_IDS: u64 = 1;
const STREAM_SPLIT: u64 = 2;
const STREAM_EDGES: u64 = 3;
const STREAM_CENTROIDS: u64 = 4;
const STREAM_FEATURES: u64 = 5;

/// Options of [`sbm`]: the `[generate.sbm]` config section (see docs/generators.md for the
/// model each option shapes).
#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct SbmOptions {
    /// output directory (edges.npy, features.npy, labels.npy, *_idx.npy)
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// number of nodes
    pub nodes: u64,
    /// number of classes (communities)
    // Classes differ in size by at most one node.
    pub classes: u64,
    /// mean degree; nodes * avg_degree / 2 edges, each written once
    pub avg_degree: f64,
    /// fraction of edges inside a community (edge homophily)
    pub p_in: f64,
    /// exponent of the power-law degree distribution (> 2)
    pub power_law: f64,
    /// features per node
    pub feature_dim: u64,
    /// feature element type
    pub feature_dtype: FeatureDtype,
    /// std of Gaussian noise around each class centroid
    // The centroids' coordinates have std 1 / sqrt(feature_dim); 0.55 gives a nearest-centroid
    // accuracy of about 0.63 with 8 classes, so neighbourhood aggregation helps.
    pub feature_noise: f64,
    /// fraction of nodes in train_idx.npy
    pub train_fraction: f64,
    /// fraction of nodes in valid_idx.npy
    pub valid_fraction: f64,
    /// fraction of nodes in test_idx.npy
    pub test_fraction: f64,
    /// random seed; equal options give byte-identical output
    pub seed: u64,
    /// worker threads; 0 = one per core
    pub threads: usize,
    /// replace an existing output directory
    // Only one holding nothing but the six files.
    pub overwrite: bool,
}

impl Default for SbmOptions {
    /// `out` is required (empty is refused).
    fn default() -> Self {
        SbmOptions {
            out: PathBuf::new(),
            nodes: 100_000,
            classes: 8,
            avg_degree: 10.0,
            p_in: 0.8,
            power_law: 2.5,
            feature_dim: 128,
            feature_dtype: FeatureDtype::Float32,
            feature_noise: 0.55,
            train_fraction: 0.6,
            valid_fraction: 0.2,
            test_fraction: 0.2,
            seed: 1,
            threads: 0,
            overwrite: false,
        }
    }
}

impl Section for SbmOptions {
    const NAME: &'static str = "generate.sbm";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        config_check(Self::NAME, &self.out, SbmOptions::validate(self))
    }
}

impl SbmOptions {
    /// Options writing to directory `out`, every other field at its default.
    pub fn new(out: impl AsRef<Path>) -> Self {
        SbmOptions {
            out: out.as_ref().to_path_buf(),
            ..SbmOptions::default()
        }
    }

    /// Checks ranges and consistency; errors name the offending option.
    pub fn validate(&self) -> Result<()> {
        if !(2..=MAX_NODES).contains(&self.nodes) {
            return Err(StoreError::option(
                "nodes",
                format!("must be within [2, 2^62], got {}", self.nodes),
            ));
        }
        if self.classes < 2 || self.classes > self.nodes.min(i32::MAX as u64) {
            return Err(StoreError::option(
                "classes",
                format!(
                    "must be within [2, nodes] (and fit int32), got {}",
                    self.classes
                ),
            ));
        }
        let edges = self.nodes as f64 * self.avg_degree / 2.0;
        if !(self.avg_degree >= 0.0 && edges < MAX_NODES as f64) {
            return Err(StoreError::option(
                "avg_degree",
                format!(
                    "must be non-negative with nodes * avg_degree / 2 below 2^62, got {}",
                    self.avg_degree
                ),
            ));
        }
        check_fraction("p_in", self.p_in)?;
        check_power_law(self.power_law)?;
        check_feature_dim(self.feature_dim)?;
        check_noise("feature_noise", self.feature_noise)?;
        check_split_fractions(self.fractions())
    }

    /// Train, valid and test fractions.
    fn fractions(&self) -> [f64; 3] {
        [self.train_fraction, self.valid_fraction, self.test_fraction]
    }
}

/// The generator: edges and node rows are pure functions of their index and these tables.
///
/// Node `j` in canonical order has class `j % classes` and degree rank `j / classes` within
/// it (see [`Blocks`]).
struct SbmModel {
    classes: u64,
    p_in: f64,
    nodes: Blocks,
    split: Perm,
    /// Split sizes: train, valid, test.
    split_counts: [u64; 3],
    edge_key: u64,
    feature_key: u64,
    dim: usize,
    noise: f64,
    /// Row-major `classes x dim` centroids.
    centroids: Vec<f32>,
}

impl SbmModel {
    fn new(o: &SbmOptions) -> SbmModel {
        let n = o.nodes;
        let dim = o.feature_dim as usize;
        SbmModel {
            classes: o.classes,
            p_in: o.p_in,
            nodes: Blocks::new(n, o.classes, o.power_law, derive(o.seed, STREAM_IDS)),
            split: Perm::new(n, derive(o.seed, STREAM_SPLIT)),
            split_counts: split_counts(n, o.fractions()),
            edge_key: derive(o.seed, STREAM_EDGES),
            feature_key: derive(o.seed, STREAM_FEATURES),
            dim,
            noise: o.feature_noise,
            centroids: centroids(derive(o.seed, STREAM_CENTROIDS), o.classes, dim),
        }
    }

    /// Edge `e`: a uniform source class, the target in the same class with probability `p_in`
    /// and otherwise in a uniform other class, both endpoints by weight.
    #[inline]
    fn edge(&self, e: u64) -> (u64, u64) {
        let mut rng = Rng::new(derive(self.edge_key, e));
        let cs = rng.below(self.classes);
        let src = self.nodes.draw(cs, rng.next_f64());
        let cd = if rng.next_f64() < self.p_in {
            cs
        } else {
            other_class(&mut rng, cs, self.classes)
        };
        (src, self.nodes.draw(cd, rng.next_f64()))
    }

    /// Fills `out` with the labels, features and split membership of nodes `range`.
    fn fill_nodes(&self, range: std::ops::Range<u64>, dtype: FeatureDtype, out: &mut NodeChunk) {
        out.labels.clear();
        out.features.clear();
        out.splits.iter_mut().for_each(Vec::clear);
        for id in range {
            let c = self.nodes.class_of(id) as usize;
            out.labels.push(c as i32);
            let slot = split_slot(self.split.apply(id), &self.split_counts);
            if let Some(split) = out.splits.get_mut(slot) {
                split.push(id as i64);
            }
            let centroid = &self.centroids[c * self.dim..(c + 1) * self.dim];
            let mut rng = Rng::new(derive(self.feature_key, id));
            push_features(&mut out.features, centroid, self.noise, &mut rng, dtype);
        }
    }
}

/// The per-node outputs of one chunk of node ids.
#[derive(Default)]
struct NodeChunk {
    features: Vec<u8>,
    labels: Vec<i32>,
    /// Ids in the train, valid and test splits, ascending.
    splits: [Vec<i64>; 3],
}

/// Writes a labelled degree-corrected SBM with node features and node splits to the directory
/// `opts.out` (the six `.npy` files of [`SbmOptions::out`]).
pub fn sbm(opts: &SbmOptions, progress: &dyn Progress) -> Result<GenerateSummary> {
    opts.validate()?;
    let start = Instant::now();
    let model = SbmModel::new(opts);
    let n = opts.nodes;
    let m = (n as f64 * opts.avg_degree / 2.0).round() as u64;
    let id = id_dtype_for(n);
    let threads = worker_threads(opts.threads);
    let staging = Staging::dir(&opts.out, opts.overwrite, &FILES)?;
    let row_bytes = opts.feature_dim * opts.feature_dtype.dtype().size() as u64;
    let least = disk_room::bytes(m, 2 * id.size() as u64)
        .saturating_add(disk_room::bytes(n, row_bytes + 4));
    staging.ensure_room(least, || {
        format!(
            "sbm of {n} nodes, {m} edges and {} features a node",
            opts.feature_dim
        )
    })?;
    let path = |name: &str| staging.path().join(name);

    let mut edges = NpyWriter::create(&path("edges.npy"), id, &[2], IO_CHUNK)?;
    let mut meter = Meter::new(
        progress,
        "sbm edges",
        DATA_OFFSET + m * 2 * id.size() as u64,
        m,
    );
    run_ordered(
        threads,
        m,
        CHUNK_EDGES,
        |range, buf: &mut Vec<i64>| {
            buf.clear();
            for e in range {
                let (s, d) = model.edge(e);
                buf.extend([s as i64, d as i64]);
            }
        },
        |rows, buf| {
            edges.write_ints(buf)?;
            Ok(meter.add(rows, buf.len() as u64 * id.size() as u64)?)
        },
    )?;
    meter.finish()?;
    edges.finish()?;

    let dtype = opts.feature_dtype.dtype();
    let mut features =
        NpyWriter::create(&path("features.npy"), dtype, &[opts.feature_dim], IO_CHUNK)?;
    let mut labels = NpyWriter::create(&path("labels.npy"), DType::I32, &[], IO_CHUNK)?;
    let mut splits = Vec::with_capacity(3);
    for name in &FILES[3..] {
        splits.push(NpyWriter::create(&path(name), id, &[], IO_CHUNK)?);
    }
    let mut meter = Meter::new(progress, "sbm features", n * row_bytes, n);
    run_ordered(
        threads,
        n,
        (CHUNK_FEATURE_BYTES / row_bytes).max(1),
        |range, out: &mut NodeChunk| model.fill_nodes(range, opts.feature_dtype, out),
        |rows, out| {
            features.write_bytes(&out.features)?;
            labels.write(&out.labels)?;
            for (w, ids) in splits.iter_mut().zip(&out.splits) {
                w.write_ints(ids)?;
            }
            Ok(meter.add(rows, out.features.len() as u64)?)
        },
    )?;
    meter.finish()?;
    features.finish()?;
    labels.finish()?;
    for w in splits {
        w.finish()?;
    }
    let files = staging.final_paths(&FILES);
    staging.commit()?;
    let [train, valid, test] = model.split_counts;
    let details = serde_json::json!({
        "classes": opts.classes,
        "edges": m,
        "avg_degree": opts.avg_degree,
        "p_in": opts.p_in,
        "power_law": opts.power_law,
        "feature_dim": opts.feature_dim,
        "feature_dtype": dtype.name(),
        "feature_noise": opts.feature_noise,
        "id_dtype": id.name(),
        "splits": { "train": train, "valid": valid, "test": test },
        "self_loops_and_duplicates": "kept",
        "seed": opts.seed,
    });
    GenerateSummary::new("sbm", &opts.out, files, n, m, start, details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{decode_f32, decode_ints, read_all_bytes};
    use strata_io::progress::NoProgress;

    fn read_ints(path: &Path) -> (Vec<u64>, Vec<i64>) {
        let (h, bytes) = read_all_bytes(path).unwrap();
        assert_eq!(h.data_offset, DATA_OFFSET);
        let mut v = Vec::new();
        decode_ints(&bytes, h.dtype, &mut v);
        (h.shape, v)
    }

    fn read_floats(path: &Path) -> (DType, Vec<u64>, Vec<f32>) {
        let (h, bytes) = read_all_bytes(path).unwrap();
        let mut v = Vec::new();
        decode_f32(&bytes, h.dtype, &mut v);
        (h.dtype, h.shape, v)
    }

    fn small(dir: &Path, name: &str, nodes: u64, dim: u64) -> SbmOptions {
        let mut o = SbmOptions::new(dir.join(name));
        o.nodes = nodes;
        o.feature_dim = dim;
        o
    }

    #[test]
    fn graph_labels_features_and_splits_have_the_documented_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let o = small(dir.path(), "sbm", 20_000, 32);
        let s = sbm(&o, &NoProgress).unwrap();
        assert_eq!((s.num_nodes, s.num_edges), (20_000, 100_000));
        assert_eq!(s.files.len(), 6);
        let (_, labels) = read_ints(&o.out.join("labels.npy"));
        assert_eq!(labels.len(), 20_000);
        let mut per_class = vec![0u64; 8];
        for &l in &labels {
            per_class[l as usize] += 1;
        }
        assert!(
            per_class.iter().all(|&c| c == 2500),
            "balanced classes: {per_class:?}"
        );

        let (shape, edges) = read_ints(&o.out.join("edges.npy"));
        assert_eq!(shape, [100_000, 2]);
        let mut degree = vec![0u64; 20_000];
        let mut same = 0;
        for e in edges.chunks_exact(2) {
            degree[e[0] as usize] += 1;
            degree[e[1] as usize] += 1;
            same += (labels[e[0] as usize] == labels[e[1] as usize]) as u64;
        }
        let homophily = same as f64 / 100_000.0;
        assert!((homophily - 0.8).abs() < 0.01, "homophily {homophily}");
        let max = *degree.iter().max().unwrap();
        assert!(max > 10 * 10, "heavy-tailed degrees: max {max}, mean 10");
        // Hubs are scattered over the id range.
        let low: u64 = degree[..10_000].iter().sum();
        assert!(
            (0.4..0.6).contains(&(low as f64 / 200_000.0)),
            "low ids hold {low} of 200000 endpoints"
        );

        let mut seen = vec![false; 20_000];
        let mut split_ids = Vec::new();
        for (name, want) in [
            ("train_idx.npy", 12_000),
            ("valid_idx.npy", 4000),
            ("test_idx.npy", 4000),
        ] {
            let (shape, ids) = read_ints(&o.out.join(name));
            assert_eq!(shape, [want]);
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{name} is sorted");
            for &v in &ids {
                assert!(!seen[v as usize], "{v} is in two splits");
                seen[v as usize] = true;
            }
            split_ids.push(ids);
        }

        let (dtype, shape, features) = read_floats(&o.out.join("features.npy"));
        assert_eq!((dtype, shape), (DType::F32, vec![20_000, 32]));
        let row = |v: i64| &features[v as usize * 32..(v as usize + 1) * 32];
        let mut centroid = vec![vec![0f64; 32]; 8];
        for &v in &split_ids[0] {
            for (acc, &x) in centroid[labels[v as usize] as usize].iter_mut().zip(row(v)) {
                *acc += x as f64 / 1500.0;
            }
        }
        let correct = split_ids[2]
            .iter()
            .filter(|&&v| {
                let dist = |c: &Vec<f64>| {
                    c.iter()
                        .zip(row(v))
                        .map(|(a, &b)| (a - b as f64).powi(2))
                        .sum::<f64>()
                };
                let best = (0..8)
                    .min_by(|&a, &b| dist(&centroid[a]).total_cmp(&dist(&centroid[b])))
                    .unwrap();
                best as i64 == labels[v as usize]
            })
            .count();
        let accuracy = correct as f64 / 4000.0;
        assert!(
            (0.55..0.72).contains(&accuracy),
            "nearest-centroid accuracy {accuracy}"
        );
    }

    #[test]
    fn deterministic_across_threads_and_float16_matches_float32() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = small(dir.path(), "a", 3001, 5);
        a.threads = 1;
        let mut b = small(dir.path(), "b", 3001, 5);
        b.threads = 3;
        sbm(&a, &NoProgress).unwrap();
        sbm(&b, &NoProgress).unwrap();
        for f in FILES {
            assert!(
                std::fs::read(a.out.join(f)).unwrap() == std::fs::read(b.out.join(f)).unwrap(),
                "{f} differs"
            );
        }
        let mut h = small(dir.path(), "h", 3001, 5);
        h.feature_dtype = FeatureDtype::Float16;
        sbm(&h, &NoProgress).unwrap();
        let (_, _, full) = read_floats(&a.out.join("features.npy"));
        let (dtype, shape, halves) = read_floats(&h.out.join("features.npy"));
        assert_eq!((dtype, shape), (DType::F16, vec![3001, 5]));
        let rounded: Vec<f32> = full
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f32())
            .collect();
        assert_eq!(halves, rounded);
    }

    #[test]
    fn partial_fractions_leave_nodes_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = small(dir.path(), "s", 1000, 2);
        o.train_fraction = 0.1;
        o.valid_fraction = 0.05;
        o.test_fraction = 0.3;
        let s = sbm(&o, &NoProgress).unwrap();
        assert_eq!(
            s.details["splits"],
            serde_json::json!({"train": 100, "valid": 50, "test": 300})
        );
        assert_eq!(read_ints(&o.out.join("test_idx.npy")).0, [300]);
    }

    #[test]
    fn validation_names_the_field() {
        let field_of = |f: &dyn Fn(&mut SbmOptions)| {
            let mut o = SbmOptions::new("sbm");
            f(&mut o);
            match o.validate() {
                Err(StoreError::Option { field, .. }) => field,
                other => panic!("expected an option error, got {other:?}"),
            }
        };
        assert_eq!(field_of(&|o| o.nodes = 1), "nodes");
        assert_eq!(field_of(&|o| o.classes = 1), "classes");
        assert_eq!(field_of(&|o| o.avg_degree = -1.0), "avg_degree");
        assert_eq!(field_of(&|o| o.p_in = 1.2), "p_in");
        assert_eq!(field_of(&|o| o.power_law = 2.0), "power_law");
        assert_eq!(field_of(&|o| o.feature_dim = 0), "feature_dim");
        assert_eq!(field_of(&|o| o.feature_noise = f64::NAN), "feature_noise");
        assert_eq!(field_of(&|o| o.train_fraction = 0.7), "test_fraction");
        let parsed: SbmOptions =
            serde_json::from_str(r#"{"out": "x", "feature_dtype": "float16"}"#).unwrap();
        assert_eq!(
            (parsed.feature_dtype, parsed.nodes, parsed.classes),
            (FeatureDtype::Float16, 100_000, 8)
        );
        assert!(
            serde_json::from_str::<SbmOptions>(r#"{"out": "x", "feature_dtype": "float64"}"#)
                .is_err()
        );
    }
}
