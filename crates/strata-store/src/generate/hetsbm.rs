//! Heterogeneous stochastic block models shaped like ogbn-mag (papers, authors, institutions,
//! fields of study), with planted communities that cross the types, edge weights and times,
//! written straight into a typed store (format 2) for typed GNN quality checks.
//!
//! Every node of every type belongs to one of `classes` communities; an edge joins its owner's
//! community with a per-relation probability and otherwise a uniform other one, and weighs more
//! inside the community. Papers are labelled by community and their features are noisy
//! community centroids, so a paper's label is predictable from its typed neighbours beyond its
//! own features. The construction is in `docs/generators.md`.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::planted::{
    centroids, check_feature_dim, check_noise, check_power_law, check_split_fractions, other_class,
    push_features, split_counts, split_slot, Blocks, FeatureDtype,
};
use super::{check_fraction, config_check, run_ordered, worker_threads, GenerateSummary};
use crate::array::IO_CHUNK;
use crate::config::{ConfigError, Section, Size};
use crate::convert::{build_topology, io_chunk_within, Payload, TopologyInput};
use crate::disk_room;
use crate::error::{Result, StoreError};
use crate::manifest::{
    etype_dtype_for, id_dtype_for, EdgeAttributes, EdgeType, FeatureInfo, GraphInfo, LabelInfo,
    Manifest, NodeType, FORMAT_NAME, FORMAT_VERSION, SPLITS,
};
use crate::npy::DType;
use crate::perm::Perm;
use crate::rng::{derive, Rng};
use crate::store::{StoreBuilder, MANIFEST};
use strata_io::progress::{Meter, Progress};

/// Node types in id order (ogbn-mag's names).
const NODE_TYPES: [&str; 4] = ["paper", "author", "institution", "field_of_study"];
const PAPER: usize = 0;
const AUTHOR: usize = 1;
const INSTITUTION: usize = 2;
const FIELD: usize = 3;

/// Owners (nodes whose edges are drawn together) per work chunk.
const CHUNK_OWNERS: u64 = 1 << 13;
/// Target feature bytes per work chunk of nodes.
const CHUNK_FEATURE_BYTES: u64 = 1 << 20;
/// Largest count of one node type.
const MAX_COUNT: u64 = 1 << 40;
/// Largest number of classes (per-class tables are kept for every type).
const MAX_CLASSES: u64 = 1 << 16;
/// Largest mean number of edges per owner (Poisson draws cost one step per unit of mean).
const MAX_MEAN: f64 = 100.0;

// Stream keys, mixed with the seed; per-type and per-relation keys derive from them.
const STREAM_IDS: u64 = 1;
const STREAM_SPLIT: u64 = 2;
const STREAM_EDGES: u64 = 3;
const STREAM_CENTROIDS: u64 = 4;
const STREAM_FEATURES: u64 = 5;

/// The four relations, in edge-type order (ogbn-mag's): each is drawn per node of its owner
/// type, its "owner", which is the source or, for `writes`, the destination.
struct Relation {
    src: usize,
    name: &'static str,
    dst: usize,
    /// The owner is the source (else the destination).
    owner_is_src: bool,
}

const RELATIONS: [Relation; 4] = [
    Relation {
        src: AUTHOR,
        name: "affiliated_with",
        dst: INSTITUTION,
        owner_is_src: true,
    },
    Relation {
        src: AUTHOR,
        name: "writes",
        dst: PAPER,
        owner_is_src: false,
    },
    Relation {
        src: PAPER,
        name: "cites",
        dst: PAPER,
        owner_is_src: true,
    },
    Relation {
        src: PAPER,
        name: "has_topic",
        dst: FIELD,
        owner_is_src: true,
    },
];
const CITES: usize = 2;

impl Relation {
    fn owner(&self) -> usize {
        if self.owner_is_src {
            self.src
        } else {
            self.dst
        }
    }

    fn target(&self) -> usize {
        if self.owner_is_src {
            self.dst
        } else {
            self.src
        }
    }

    /// The relation's edge type, or its reverse `(dst, rev_NAME, src)` as PyG's
    /// `ToUndirected(merge=False)` names it.
    fn edge_type(&self, reverse: bool) -> EdgeType {
        if reverse {
            EdgeType {
                src_type: self.dst as u64,
                relation: format!("rev_{}", self.name),
                dst_type: self.src as u64,
            }
        } else {
            EdgeType {
                src_type: self.src as u64,
                relation: self.name.to_string(),
                dst_type: self.dst as u64,
            }
        }
    }
}

/// How papers are split into train, valid and test.
#[derive(
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
)]
#[serde(rename_all = "lowercase")]
pub enum SplitBy {
    /// By publication order, as ogbn-mag: train the oldest papers, test the newest.
    #[default]
    Time,
    /// Uniformly at random.
    Random,
}

/// Options of [`hetsbm`]: the `[generate.hetsbm]` config section (see docs/generators.md for
/// the model each option shapes).
#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct HetSbmOptions {
    /// output store directory (a typed store, format 2)
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// number of paper nodes (labelled by community, split into train/valid/test)
    pub papers: u64,
    /// number of author nodes
    pub authors: u64,
    /// number of institution nodes
    pub institutions: u64,
    /// number of field_of_study nodes
    pub fields: u64,
    /// number of communities (the papers' classes), shared by all node types
    pub classes: u64,
    /// mean citations per paper (Poisson), each to a strictly older paper
    pub citations: f64,
    /// mean authors per paper (1 + Poisson(mean - 1)), at least 1
    pub authors_per_paper: f64,
    /// mean fields of study per paper (1 + Poisson(mean - 1)), at least 1
    pub fields_per_paper: f64,
    /// mean institutions per author (1 + Poisson(mean - 1)), at least 1
    pub affiliations_per_author: f64,
    /// fraction of citations to a paper of the citing paper's community
    pub cites_homophily: f64,
    /// fraction of a paper's authors from the paper's community
    pub writes_homophily: f64,
    /// fraction of a paper's fields of study from the paper's community
    pub has_topic_homophily: f64,
    /// fraction of an author's institutions from the author's community
    pub affiliated_with_homophily: f64,
    /// exponent of the power-law popularity within each community and type (> 2)
    pub power_law: f64,
    /// in-community edges weigh U(s, 1], others U(0, 1 - s]; 0 = weights carry no signal
    pub weight_signal: f64,
    /// distinct paper times 0 .. time_steps - 1, increasing with publication order
    pub time_steps: u64,
    /// features per node, every node type
    pub feature_dim: u64,
    /// feature element type
    pub feature_dtype: FeatureDtype,
    /// std of Gaussian noise around the community centroid, papers
    // The centroids' coordinates have std 1 / sqrt(feature_dim); with 8 classes 0.7 leaves a
    // nearest-centroid accuracy of about 0.5, so neighbours must carry the rest.
    pub paper_feature_noise: f64,
    /// std of feature noise, authors
    pub author_feature_noise: f64,
    /// std of feature noise, institutions
    pub institution_feature_noise: f64,
    /// std of feature noise, fields of study
    pub field_feature_noise: f64,
    /// how papers are split: time (oldest train, newest test) or random
    pub split_by: SplitBy,
    /// fraction of papers in the train split
    pub train_fraction: f64,
    /// fraction of papers in the valid split
    pub valid_fraction: f64,
    /// fraction of papers in the test split
    pub test_fraction: f64,
    /// add a rev_RELATION edge type for every relation, as PyG's ToUndirected(merge=False)
    pub reverse_edges: bool,
    /// memory budget of the CSR/CSC build
    pub memory: Size,
    /// random seed; equal options give identical arrays
    pub seed: u64,
    /// worker threads; 0 = one per core
    pub threads: usize,
    /// replace an existing store (atomically, once the new one is complete)
    pub overwrite: bool,
}

impl Default for HetSbmOptions {
    /// `out` is required (empty is refused).
    fn default() -> Self {
        HetSbmOptions {
            out: PathBuf::new(),
            papers: 100_000,
            authors: 150_000,
            institutions: 2_000,
            fields: 10_000,
            classes: 8,
            citations: 8.0,
            authors_per_paper: 3.0,
            fields_per_paper: 3.0,
            affiliations_per_author: 1.2,
            cites_homophily: 0.7,
            writes_homophily: 0.8,
            has_topic_homophily: 0.7,
            affiliated_with_homophily: 0.8,
            power_law: 2.5,
            weight_signal: 0.5,
            time_steps: 50,
            feature_dim: 64,
            feature_dtype: FeatureDtype::Float32,
            paper_feature_noise: 0.7,
            author_feature_noise: 1.0,
            institution_feature_noise: 1.0,
            field_feature_noise: 1.0,
            split_by: SplitBy::Time,
            train_fraction: 0.6,
            valid_fraction: 0.2,
            test_fraction: 0.2,
            reverse_edges: true,
            memory: Size(1 << 30),
            seed: 1,
            threads: 0,
            overwrite: false,
        }
    }
}

impl Section for HetSbmOptions {
    const NAME: &'static str = "generate.hetsbm";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        config_check(Self::NAME, &self.out, HetSbmOptions::validate(self))
    }
}

impl HetSbmOptions {
    /// Options writing to store `out`, every other field at its default.
    pub fn new(out: impl AsRef<Path>) -> Self {
        HetSbmOptions {
            out: out.as_ref().to_path_buf(),
            ..HetSbmOptions::default()
        }
    }

    /// Node counts in type order.
    fn counts(&self) -> [u64; 4] {
        [self.papers, self.authors, self.institutions, self.fields]
    }

    /// How each relation's edges are drawn, in relation order.
    fn relation_draws(&self) -> [RelationDraws; 4] {
        let draws = |mean, homophily, at_least_one| RelationDraws {
            mean,
            homophily,
            at_least_one,
        };
        [
            draws(
                self.affiliations_per_author,
                self.affiliated_with_homophily,
                true,
            ),
            draws(self.authors_per_paper, self.writes_homophily, true),
            draws(self.citations, self.cites_homophily, false),
            draws(self.fields_per_paper, self.has_topic_homophily, true),
        ]
    }

    /// Feature noise in type order.
    fn noises(&self) -> [f64; 4] {
        [
            self.paper_feature_noise,
            self.author_feature_noise,
            self.institution_feature_noise,
            self.field_feature_noise,
        ]
    }

    fn fractions(&self) -> [f64; 3] {
        [self.train_fraction, self.valid_fraction, self.test_fraction]
    }

    /// Checks ranges and consistency; errors name the offending option.
    pub fn validate(&self) -> Result<()> {
        if !(2..=MAX_CLASSES).contains(&self.classes) {
            return Err(StoreError::option(
                "classes",
                format!("must be within [2, 2^16], got {}", self.classes),
            ));
        }
        let count_fields = ["papers", "authors", "institutions", "fields"];
        for (field, count) in count_fields.into_iter().zip(self.counts()) {
            if !(self.classes..=MAX_COUNT).contains(&count) {
                return Err(StoreError::option(
                    field,
                    format!(
                        "must be within [classes, 2^40] (every community needs a member of every type), got {count} with {} classes",
                        self.classes
                    ),
                ));
            }
        }
        let mean_fields = [
            "affiliations_per_author",
            "authors_per_paper",
            "citations",
            "fields_per_paper",
        ];
        for (field, d) in mean_fields.into_iter().zip(self.relation_draws()) {
            let low = if d.at_least_one { 1.0 } else { 0.0 };
            if !(low..=MAX_MEAN).contains(&d.mean) {
                return Err(StoreError::option(
                    field,
                    format!("must be a mean within [{low}, {MAX_MEAN}], got {}", d.mean),
                ));
            }
        }
        let homophily_fields = [
            "affiliated_with_homophily",
            "writes_homophily",
            "cites_homophily",
            "has_topic_homophily",
        ];
        for (field, d) in homophily_fields.into_iter().zip(self.relation_draws()) {
            check_fraction(field, d.homophily)?;
        }
        check_power_law(self.power_law)?;
        if !(0.0..1.0).contains(&self.weight_signal) {
            return Err(StoreError::option(
                "weight_signal",
                format!("must be within [0, 1), got {}", self.weight_signal),
            ));
        }
        if !(1..=MAX_COUNT).contains(&self.time_steps) {
            return Err(StoreError::option(
                "time_steps",
                format!("must be within [1, 2^40], got {}", self.time_steps),
            ));
        }
        check_feature_dim(self.feature_dim)?;
        let noise_fields = [
            "paper_feature_noise",
            "author_feature_noise",
            "institution_feature_noise",
            "field_feature_noise",
        ];
        for (field, noise) in noise_fields.into_iter().zip(self.noises()) {
            check_noise(field, noise)?;
        }
        check_split_fractions(self.fractions())
    }
}

/// How one relation's edges are drawn.
#[derive(Debug, Clone, Copy)]
struct RelationDraws {
    /// Mean edges per owner.
    mean: f64,
    /// Fraction of the edges inside the owner's community.
    homophily: f64,
    /// Every owner has an edge: 1 + Poisson(mean - 1) edges, else Poisson(mean).
    at_least_one: bool,
}

/// One drawn edge of an owner: the other endpoint's local id, the weight and the time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Draw {
    target: u64,
    weight: f32,
    time: i64,
}

/// The generator: every edge and node row is a pure function of its owner's or node's local
/// id and these tables.
struct Model {
    classes: u64,
    counts: [u64; 4],
    offsets: [u64; 4],
    blocks: [Blocks; 4],
    /// Per relation: how its edges are drawn, and its stream key.
    draws: [RelationDraws; 4],
    edge_keys: [u64; 4],
    weight_signal: f64,
    time_steps: u64,
    split_by: SplitBy,
    split: Perm,
    /// Paper split sizes: train, valid, test.
    split_counts: [u64; 3],
    dim: usize,
    noises: [f64; 4],
    /// Per type, row-major `classes x dim` centroids.
    centroids: [Vec<f32>; 4],
    feature_keys: [u64; 4],
}

impl Model {
    fn new(o: &HetSbmOptions) -> Model {
        let counts = o.counts();
        let mut offsets = [0u64; 4];
        for t in 1..4 {
            offsets[t] = offsets[t - 1] + counts[t - 1];
        }
        let dim = o.feature_dim as usize;
        let ids = derive(o.seed, STREAM_IDS);
        let edges = derive(o.seed, STREAM_EDGES);
        let centroid_key = derive(o.seed, STREAM_CENTROIDS);
        let feature_key = derive(o.seed, STREAM_FEATURES);
        Model {
            classes: o.classes,
            counts,
            offsets,
            blocks: std::array::from_fn(|t| {
                Blocks::new(counts[t], o.classes, o.power_law, derive(ids, t as u64))
            }),
            draws: o.relation_draws(),
            edge_keys: std::array::from_fn(|r| derive(edges, r as u64)),
            weight_signal: o.weight_signal,
            time_steps: o.time_steps,
            split_by: o.split_by,
            split: Perm::new(o.papers, derive(o.seed, STREAM_SPLIT)),
            split_counts: split_counts(o.papers, o.fractions()),
            dim,
            noises: o.noises(),
            centroids: std::array::from_fn(|t| {
                centroids(derive(centroid_key, t as u64), o.classes, dim)
            }),
            feature_keys: std::array::from_fn(|t| derive(feature_key, t as u64)),
        }
    }

    /// The time of the paper with canonical (publication) index `j`: `j * time_steps / papers`.
    fn paper_time(&self, j: u64) -> u64 {
        (j as u128 * self.time_steps as u128 / self.counts[PAPER] as u128) as u64
    }

    /// The first canonical paper index whose time is `t` or later.
    fn first_paper_at(&self, t: u64) -> u64 {
        (t as u128 * self.counts[PAPER] as u128).div_ceil(self.time_steps as u128) as u64
    }

    /// The edges of relation `r` drawn for its owner `owner` (a local id), into `out`
    /// (cleared first). Draws that repeat an earlier target of the same owner are dropped, so
    /// no edge appears twice.
    fn owner_edges(&self, r: usize, owner: u64, out: &mut Vec<Draw>) {
        out.clear();
        let rel = &RELATIONS[r];
        let d = self.draws[r];
        let mut rng = Rng::new(derive(self.edge_keys[r], owner));
        let j = self.blocks[rel.owner()].canonical(owner);
        let c = j % self.classes;
        let count = if d.at_least_one {
            1 + poisson(&mut rng, d.mean - 1.0)
        } else {
            poisson(&mut rng, d.mean)
        };
        // A paper's edges carry its time, and its citations go to strictly older papers; an
        // author's affiliations (the relation a paper does not own) have uniform times.
        let paper_time = (rel.owner() == PAPER).then(|| self.paper_time(j));
        let older = paper_time.map_or(0, |t| self.first_paper_at(t));
        let targets = &self.blocks[rel.target()];
        for _ in 0..count {
            let inside = rng.next_f64() < d.homophily;
            let tc = if inside {
                c
            } else {
                other_class(&mut rng, c, self.classes)
            };
            let u = rng.next_f64();
            let wu = rng.next_f64();
            let s = self.weight_signal;
            let weight = if inside {
                s + (1.0 - s) * (1.0 - wu)
            } else {
                (1.0 - s) * (1.0 - wu)
            };
            let time = paper_time.unwrap_or_else(|| rng.below(self.time_steps));
            let target = if r == CITES {
                match targets.count_before(tc, older) {
                    0 => continue,
                    limit => targets.draw_among(tc, limit, u),
                }
            } else {
                targets.draw(tc, u)
            };
            if out.iter().all(|prev| prev.target != target) {
                out.push(Draw {
                    target,
                    weight: weight as f32,
                    time: time as i64,
                });
            }
        }
    }

    /// Fills `out` with the `(src, etype, dst)` rows (global ids), weights and times of edge
    /// type `etype`, relation `r` reversed or not, for the owners `range`.
    fn fill_edges(
        &self,
        r: usize,
        etype: u64,
        reverse: bool,
        range: Range<u64>,
        out: &mut EdgeChunk,
    ) {
        out.rows.clear();
        out.weights.clear();
        out.times.clear();
        let rel = &RELATIONS[r];
        let (owner_base, target_base) = (self.offsets[rel.owner()], self.offsets[rel.target()]);
        for owner in range {
            self.owner_edges(r, owner, &mut out.draws);
            for d in &out.draws {
                let (o, t) = (owner_base + owner, target_base + d.target);
                let (src, dst) = if rel.owner_is_src != reverse {
                    (o, t)
                } else {
                    (t, o)
                };
                out.rows.extend([src as i64, etype as i64, dst as i64]);
                out.weights.push(d.weight);
                out.times.push(d.time);
            }
        }
    }

    /// Fills `out` with the features of type `t`'s nodes `range` (local ids) and, for papers,
    /// their labels and split membership.
    fn fill_nodes(&self, t: usize, range: Range<u64>, dtype: FeatureDtype, out: &mut NodeChunk) {
        out.features.clear();
        out.labels.clear();
        out.splits.iter_mut().for_each(Vec::clear);
        for id in range {
            let j = self.blocks[t].canonical(id);
            let c = (j % self.classes) as usize;
            if t == PAPER {
                out.labels.push(c as i32);
                let rank = match self.split_by {
                    SplitBy::Time => j,
                    SplitBy::Random => self.split.apply(id),
                };
                if let Some(split) = out.splits.get_mut(split_slot(rank, &self.split_counts)) {
                    split.push(id as i64);
                }
            }
            let centroid = &self.centroids[t][c * self.dim..(c + 1) * self.dim];
            let mut rng = Rng::new(derive(self.feature_keys[t], id));
            push_features(&mut out.features, centroid, self.noises[t], &mut rng, dtype);
        }
    }
}

/// A Poisson(`mean`) count by Knuth's multiplication method (`mean` at most [`MAX_MEAN`], so
/// `exp(-mean)` stays far from underflow and the cost is about `mean` draws).
fn poisson(rng: &mut Rng, mean: f64) -> u64 {
    let floor = (-mean).exp();
    let mut k = 0;
    let mut p = 1.0 - rng.next_f64();
    while p > floor {
        k += 1;
        p *= 1.0 - rng.next_f64();
    }
    k
}

/// The edges of one chunk of owners.
#[derive(Default)]
struct EdgeChunk {
    /// `(src, etype, dst)` rows, global ids.
    rows: Vec<i64>,
    weights: Vec<f32>,
    times: Vec<i64>,
    /// Scratch for one owner's draws.
    draws: Vec<Draw>,
}

/// The per-node outputs of one chunk of a type's nodes.
#[derive(Default)]
struct NodeChunk {
    features: Vec<u8>,
    labels: Vec<i32>,
    /// Local ids in the train, valid and test splits, ascending.
    splits: [Vec<i64>; 3],
}

/// Writes a heterogeneous SBM as a typed store (format 2) at `opts.out`: four node types with
/// features (`features_tI`), paper labels and splits (`labels_t0`, `node_SPLIT_t0`), four edge
/// types (eight with `reverse_edges`) with float32 weights and int64 times, and CSR/CSC built
/// within `opts.memory` bytes. Every edge is a train edge.
pub fn hetsbm(opts: &HetSbmOptions, progress: &dyn Progress) -> Result<GenerateSummary> {
    opts.validate()?;
    let start = Instant::now();
    let model = Model::new(opts);
    let n: u64 = model.counts.iter().sum();
    let threads = worker_threads(opts.threads);
    let io_chunk = io_chunk_within(opts.memory.0, IO_CHUNK as u64);
    let mut edge_types: Vec<(usize, bool)> = (0..RELATIONS.len()).map(|r| (r, false)).collect();
    if opts.reverse_edges {
        edge_types.extend((0..RELATIONS.len()).map(|r| (r, true)));
    }
    let num_etypes = edge_types.len() as u64;
    let id_dtype = id_dtype_for(n.max(num_etypes));
    let mut builder = StoreBuilder::create(&opts.out, opts.overwrite)?;
    // The features alone; the topology's own check follows once the edges are counted.
    let row_bytes = opts.feature_dim * opts.feature_dtype.dtype().size() as u64;
    disk_room::ensure(builder.parent_dir(), disk_room::bytes(n, row_bytes), || {
        format!(
            "hetsbm's features ({n} nodes of {} features)",
            opts.feature_dim
        )
    })?;

    let node_types = write_nodes(
        &mut builder,
        &model,
        opts,
        id_dtype,
        threads,
        io_chunk,
        progress,
    )?;
    let per_type = write_edges(
        &mut builder,
        &model,
        &edge_types,
        id_dtype,
        threads,
        io_chunk,
        progress,
    )?;
    let num_edges: u64 = per_type.iter().sum();

    let edges = builder.arrays()["edges_train"].clone();
    let weights = builder.arrays()["edge_weights_train"].clone();
    let times = builder.arrays()["edge_times_train"].clone();
    let mut graph = GraphInfo {
        num_nodes: n,
        num_relations: num_etypes,
        id_dtype,
        num_edges: BTreeMap::from([("train".to_string(), num_edges)]),
        num_topology_edges: num_edges,
        symmetrized: false,
        node_names: false,
        relation_names: false,
    };
    let topo = build_topology(
        &mut builder,
        &TopologyInput {
            edges: &edges,
            num_nodes: n,
            id_dtype,
            degree_dtype: graph.degree_dtype(),
            symmetrize: false,
            budget: opts.memory.0,
            io_chunk,
            payload: Some(Payload {
                num_etypes,
                etype_dtype: etype_dtype_for(num_etypes),
                eid_dtype: id_dtype_for(num_edges),
                weights: Some(&weights),
                times: Some(&times),
            }),
        },
        progress,
    )?;
    graph.num_topology_edges = topo.num_topology_edges;
    let edge_type_list: Vec<EdgeType> = edge_types
        .iter()
        .map(|&(r, reverse)| RELATIONS[r].edge_type(reverse))
        .collect();
    let name = opts
        .out
        .file_stem()
        .map_or_else(|| "hetsbm".into(), |s| s.to_string_lossy().into_owned());
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        strata_version: env!("CARGO_PKG_VERSION").into(),
        name,
        graph,
        features: None,
        labels: None,
        node_splits: BTreeMap::new(),
        node_types,
        edge_types: edge_type_list.clone(),
        edge_attributes: Some(EdgeAttributes {
            weights: true,
            times: true,
            features: None,
        }),
        stats: topo.stats,
        arrays: BTreeMap::new(),
        provenance: serde_json::json!({
            "generator": "hetsbm",
            "options": opts,
            "seconds": start.elapsed().as_secs_f64(),
        }),
    };
    let store = builder.commit(manifest)?;
    let mut files: Vec<PathBuf> = store
        .manifest()
        .arrays
        .values()
        .map(|a| store.path().join(&a.file))
        .collect();
    files.sort();
    files.dedup();
    files.push(store.path().join(MANIFEST));
    let [train, valid, test] = model.split_counts;
    let details = serde_json::json!({
        "node_types": NODE_TYPES
            .iter()
            .zip(model.counts)
            .map(|(t, c)| serde_json::json!({"name": t, "count": c}))
            .collect::<Vec<_>>(),
        "edge_types": edge_type_list
            .iter()
            .zip(&per_type)
            .map(|(e, &count)| serde_json::json!({
                "src": NODE_TYPES[e.src_type as usize],
                "relation": e.relation,
                "dst": NODE_TYPES[e.dst_type as usize],
                "edges": count,
            }))
            .collect::<Vec<_>>(),
        "classes": opts.classes,
        "feature_dim": opts.feature_dim,
        "feature_dtype": opts.feature_dtype.dtype().name(),
        "time_steps": opts.time_steps,
        "split_by": opts.split_by,
        "splits": { "train": train, "valid": valid, "test": test },
        "id_dtype": id_dtype.name(),
        "topology": topo.plan,
        "seed": opts.seed,
    });
    GenerateSummary::new("hetsbm", &opts.out, files, n, num_edges, start, details)
}

/// Writes every type's features and the papers' labels and splits; returns the node types.
fn write_nodes(
    builder: &mut StoreBuilder,
    model: &Model,
    opts: &HetSbmOptions,
    id_dtype: DType,
    threads: usize,
    io_chunk: usize,
    progress: &dyn Progress,
) -> Result<Vec<NodeType>> {
    let dtype = opts.feature_dtype.dtype();
    let row_bytes = opts.feature_dim * dtype.size() as u64;
    let n: u64 = model.counts.iter().sum();
    let mut meter = Meter::new(progress, "hetsbm nodes", n * row_bytes, n);
    let mut node_types = Vec::with_capacity(NODE_TYPES.len());
    for (t, name) in NODE_TYPES.iter().enumerate() {
        let count = model.counts[t];
        let features_name = format!("features_t{t}");
        let mut features = builder.writer(&features_name, dtype, &[opts.feature_dim], io_chunk)?;
        let paper = t == PAPER;
        let mut labels = paper
            .then(|| builder.writer("labels_t0", DType::I32, &[], io_chunk))
            .transpose()?;
        // Only papers have splits, and only the non-empty ones are written.
        let split_arrays = SPLITS.map(|s| format!("node_{s}_t{t}"));
        let mut splits = Vec::new();
        if paper {
            for (array, &k) in split_arrays.iter().zip(&model.split_counts) {
                splits.push(
                    (k > 0)
                        .then(|| builder.writer(array, id_dtype, &[], io_chunk))
                        .transpose()?,
                );
            }
        }
        run_ordered(
            threads,
            count,
            (CHUNK_FEATURE_BYTES / row_bytes).max(1),
            |range, out: &mut NodeChunk| model.fill_nodes(t, range, opts.feature_dtype, out),
            |rows, out| {
                features.write_bytes(&out.features)?;
                if let Some(l) = labels.as_mut() {
                    l.write(&out.labels)?;
                }
                for (w, ids) in splits.iter_mut().zip(&out.splits) {
                    if let Some(w) = w {
                        w.write_ints(ids)?;
                    }
                }
                Ok(meter.add(rows, out.features.len() as u64)?)
            },
        )?;
        builder.add(&features_name, features.finish()?);
        let mut node_splits = BTreeMap::new();
        if let Some(l) = labels {
            builder.add("labels_t0", l.finish()?);
        }
        for ((w, array), split) in splits.into_iter().zip(&split_arrays).zip(SPLITS) {
            if let Some(w) = w {
                let info = w.finish()?;
                node_splits.insert(split.to_string(), info.shape[0]);
                builder.add(array, info);
            }
        }
        node_types.push(NodeType {
            name: name.to_string(),
            offset: model.offsets[t],
            count,
            features: Some(FeatureInfo {
                dim: opts.feature_dim,
                dtype,
            }),
            labels: paper.then_some(LabelInfo {
                num_classes: opts.classes,
            }),
            node_splits,
            bags: None,
        });
    }
    meter.finish()?;
    Ok(node_types)
}

/// Writes `edges_train`, `edge_weights_train` and `edge_times_train`, one edge type after the
/// other in `edge_types` order (relation, reversed); returns the edges of each type.
fn write_edges(
    builder: &mut StoreBuilder,
    model: &Model,
    edge_types: &[(usize, bool)],
    id_dtype: DType,
    threads: usize,
    io_chunk: usize,
    progress: &dyn Progress,
) -> Result<Vec<u64>> {
    let mut edges = builder.writer("edges_train", id_dtype, &[3], io_chunk)?;
    let mut weights = builder.writer("edge_weights_train", DType::F32, &[], io_chunk)?;
    let mut times = builder.writer("edge_times_train", DType::I64, &[], io_chunk)?;
    let owners = |r: usize| model.counts[RELATIONS[r].owner()];
    let total: u64 = edge_types.iter().map(|&(r, _)| owners(r)).sum();
    let mut meter = Meter::new(progress, "hetsbm edges", 0, total);
    let mut per_type = Vec::with_capacity(edge_types.len());
    for (etype, &(r, reverse)) in edge_types.iter().enumerate() {
        let mut count = 0u64;
        run_ordered(
            threads,
            owners(r),
            CHUNK_OWNERS,
            |range, out: &mut EdgeChunk| model.fill_edges(r, etype as u64, reverse, range, out),
            |rows, out| {
                edges.write_ints(&out.rows)?;
                weights.write(&out.weights)?;
                times.write(&out.times)?;
                count += out.weights.len() as u64;
                Ok(meter.add(rows, out.rows.len() as u64 * id_dtype.size() as u64)?)
            },
        )?;
        per_type.push(count);
    }
    meter.finish()?;
    builder.add("edges_train", edges.finish()?);
    builder.add("edge_weights_train", weights.finish()?);
    builder.add("edge_times_train", times.finish()?);
    Ok(per_type)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::array::{decode_f32, decode_ints, read_all_bytes};
    use crate::check::check_store;
    use crate::store::Store;
    use strata_io::progress::NoProgress;

    fn small(dir: &Path, name: &str) -> HetSbmOptions {
        let mut o = HetSbmOptions::new(dir.join(name));
        o.papers = 4000;
        o.authors = 5000;
        o.institutions = 100;
        o.fields = 1000;
        o.classes = 5;
        o.feature_dim = 8;
        o.time_steps = 20;
        o.threads = 2;
        o
    }

    fn ints(store: &Path, name: &str) -> Vec<i64> {
        let (h, bytes) = read_all_bytes(&store.join(format!("{name}.npy"))).unwrap();
        let mut v = Vec::new();
        decode_ints(&bytes, h.dtype, &mut v);
        v
    }

    fn floats(store: &Path, name: &str) -> Vec<f32> {
        let (h, bytes) = read_all_bytes(&store.join(format!("{name}.npy"))).unwrap();
        let mut v = Vec::new();
        decode_f32(&bytes, h.dtype, &mut v);
        v
    }

    #[test]
    fn typed_store_holds_the_planted_structure_with_consistent_times() {
        let dir = tempfile::tempdir().unwrap();
        let o = small(dir.path(), "g.strata");
        let summary = hetsbm(&o, &NoProgress).unwrap();
        let store = Store::open(&o.out).unwrap();
        let m = store.manifest();
        let types: Vec<_> = m
            .node_types
            .iter()
            .map(|t| (t.name.as_str(), t.offset, t.count))
            .collect();
        assert_eq!(
            types,
            [
                ("paper", 0, 4000),
                ("author", 4000, 5000),
                ("institution", 9000, 100),
                ("field_of_study", 9100, 1000)
            ]
        );
        let etypes: Vec<String> = m
            .edge_types
            .iter()
            .map(|e| {
                let t = |i: u64| NODE_TYPES[i as usize];
                format!("{}-{}-{}", t(e.src_type), e.relation, t(e.dst_type))
            })
            .collect();
        assert_eq!(
            etypes,
            [
                "author-affiliated_with-institution",
                "author-writes-paper",
                "paper-cites-paper",
                "paper-has_topic-field_of_study",
                "institution-rev_affiliated_with-author",
                "paper-rev_writes-author",
                "paper-rev_cites-paper",
                "field_of_study-rev_has_topic-paper",
            ]
        );
        assert_eq!(summary.num_nodes, 10_100);

        let edges = ints(&o.out, "edges_train");
        let weights = floats(&o.out, "edge_weights_train");
        let times = ints(&o.out, "edge_times_train");
        let e = weights.len();
        assert_eq!(
            (edges.len(), times.len(), e as u64),
            (3 * e, e, summary.num_edges)
        );
        let row = |i: usize| (edges[3 * i], edges[3 * i + 1] as usize, edges[3 * i + 2]);
        let type_of = |v: i64| m.node_type_of(v as u64).unwrap();
        let mut by_type = vec![Vec::new(); 8];
        let mut seen = HashSet::new();
        for i in 0..e {
            let (src, et, dst) = row(i);
            assert_eq!(type_of(src) as u64, m.edge_types[et].src_type, "edge {i}");
            assert_eq!(type_of(dst) as u64, m.edge_types[et].dst_type, "edge {i}");
            assert!(seen.insert((src, et, dst)), "edge {i} repeats");
            by_type[et].push(i);
        }
        // Edge ids run through one type after the other; reverse types mirror forward ones.
        assert!((1..e).all(|i| row(i - 1).1 <= row(i).1));
        for k in 0..4 {
            assert_eq!(by_type[k].len(), by_type[k + 4].len());
            for (&a, &b) in by_type[k].iter().zip(&by_type[k + 4]) {
                let ((s1, _, d1), (s2, _, d2)) = (row(a), row(b));
                assert_eq!(
                    (s1, d1, weights[a], times[a]),
                    (d2, s2, weights[b], times[b])
                );
            }
        }

        // Times: a paper's writes and has_topic edges carry its time; it cites strictly older
        // papers at its own time; affiliations fall anywhere in [0, time_steps).
        let model = Model::new(&o);
        let mut paper_time = vec![-1i64; 4000];
        for &i in &by_type[1] {
            let p = row(i).2 as usize;
            assert!(paper_time[p] < 0 || paper_time[p] == times[i]);
            paper_time[p] = times[i];
        }
        for (p, &t) in paper_time.iter().enumerate() {
            let j = model.blocks[PAPER].canonical(p as u64);
            assert_eq!(
                t,
                model.paper_time(j) as i64,
                "paper {p} has an author and its time"
            );
        }
        for &i in &by_type[2] {
            let (src, _, dst) = row(i);
            assert_eq!(times[i], paper_time[src as usize]);
            assert!(
                paper_time[dst as usize] < times[i],
                "citation {i} to a newer paper"
            );
        }
        for &i in &by_type[3] {
            assert_eq!(times[i], paper_time[row(i).0 as usize]);
        }
        assert!(by_type[0].iter().all(|&i| (0..20).contains(&times[i])));

        // Homophily as configured, and weights split by it at weight_signal = 0.5.
        let class = |v: i64| {
            let t = type_of(v);
            model.blocks[t].class_of(v as u64 - model.offsets[t])
        };
        for (k, d) in o.relation_draws().into_iter().enumerate() {
            let (mean, homophily) = (d.mean, d.homophily);
            let mut inside = 0;
            for &i in &by_type[k] {
                let (src, _, dst) = row(i);
                let w = weights[i];
                if class(src) == class(dst) {
                    inside += 1;
                    assert!((0.5..=1.0).contains(&w), "weight {w} inside");
                } else {
                    assert!(w > 0.0 && w <= 0.5, "weight {w} across");
                }
            }
            let got = inside as f64 / by_type[k].len() as f64;
            assert!(
                (got - homophily).abs() < 0.03,
                "relation {k}: homophily {got}"
            );
            let owners = model.counts[RELATIONS[k].owner()] as f64;
            let per_owner = by_type[k].len() as f64 / owners;
            // Citations lose the first time step's papers (they have nothing older to cite)
            // and every relation the draws that repeat a target of the same owner.
            let low = if k == CITES { 0.75 } else { 0.9 };
            assert!(
                (low * mean..=1.03 * mean).contains(&per_owner),
                "relation {k}: {per_owner} edges per owner, mean {mean}"
            );
        }

        // Papers are labelled by community; features for every type; splits by time.
        let labels = ints(&o.out, "labels_t0");
        assert!((0..4000).all(|p| labels[p] as u64 == model.blocks[PAPER].class_of(p as u64)));
        for (t, nt) in m.node_types.iter().enumerate() {
            assert_eq!(
                store.require(&format!("features_t{t}")).unwrap().shape,
                [nt.count, 8]
            );
        }
        let splits: Vec<Vec<i64>> = SPLITS
            .iter()
            .map(|s| ints(&o.out, &format!("node_{s}_t0")))
            .collect();
        assert_eq!(
            splits.iter().map(Vec::len).collect::<Vec<_>>(),
            [2400, 800, 800]
        );
        let span = |ids: &[i64]| {
            let t = ids.iter().map(|&p| paper_time[p as usize]);
            (t.clone().min().unwrap(), t.max().unwrap())
        };
        assert!(
            span(&splits[0]).1 <= span(&splits[1]).0 && span(&splits[1]).1 <= span(&splits[2]).0
        );

        // The planted signal: a paper's label is the majority label of the papers it cites.
        let mut votes = vec![[0u32; 5]; 4000];
        for &i in &by_type[2] {
            let (src, _, dst) = row(i);
            votes[src as usize][labels[dst as usize] as usize] += 1;
        }
        let (mut right, mut citing) = (0, 0);
        for (p, v) in votes.iter().enumerate() {
            if v.iter().sum::<u32>() > 0 {
                citing += 1;
                let best = (0..5)
                    .max_by_key(|&c| (v[c], std::cmp::Reverse(c)))
                    .unwrap();
                right += (best as i64 == labels[p]) as u32;
            }
        }
        let accuracy = right as f64 / citing as f64;
        assert!(
            accuracy > 0.8,
            "majority of cited labels: {accuracy} (chance 0.2)"
        );

        let checked = check_store(&o.out, 20, &NoProgress).unwrap();
        assert!(checked.problems.is_empty(), "{:?}", checked.problems.listed);
    }

    #[test]
    fn identical_across_threads_and_budgets_and_changed_by_the_seed() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = small(dir.path(), "a");
        a.threads = 1;
        let mut b = small(dir.path(), "b");
        b.threads = 3;
        b.memory = Size(1 << 20);
        let mut c = small(dir.path(), "c");
        c.seed = 2;
        hetsbm(&a, &NoProgress).unwrap();
        let tight = hetsbm(&b, &NoProgress).unwrap();
        hetsbm(&c, &NoProgress).unwrap();
        // The small budget really cut the topology into bucketed node ranges.
        let plan = tight.details["topology"].to_string();
        assert!(plan.contains("partitioned into bucket files"), "{plan}");
        let store = Store::open(&a.out).unwrap();
        for info in store.manifest().arrays.values() {
            let bytes = |o: &HetSbmOptions| std::fs::read(o.out.join(&info.file)).unwrap();
            assert!(bytes(&a) == bytes(&b), "{} differs", info.file);
        }
        assert_ne!(ints(&a.out, "edges_train"), ints(&c.out, "edges_train"));
    }

    #[test]
    fn random_split_without_reverse_edges() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = small(dir.path(), "r");
        o.split_by = SplitBy::Random;
        o.reverse_edges = false;
        o.train_fraction = 0.1;
        o.valid_fraction = 0.05;
        o.test_fraction = 0.0;
        hetsbm(&o, &NoProgress).unwrap();
        let store = Store::open(&o.out).unwrap();
        let m = store.manifest();
        assert_eq!(m.edge_types.len(), 4);
        assert_eq!(
            m.node_types[0].node_splits,
            BTreeMap::from([("train".into(), 400), ("valid".into(), 200)])
        );
        assert!(m.node_types[1..]
            .iter()
            .all(|t| t.node_splits.is_empty() && t.labels.is_none()));
        // A random split mixes old and new papers.
        let model = Model::new(&o);
        let time = |p: i64| model.paper_time(model.blocks[PAPER].canonical(p as u64));
        let train = ints(&o.out, "node_train_t0");
        assert!(train.windows(2).all(|w| w[0] < w[1]), "sorted local ids");
        let (lo, hi) = (
            train.iter().map(|&p| time(p)).min(),
            train.iter().map(|&p| time(p)).max(),
        );
        assert_eq!((lo, hi), (Some(0), Some(19)));
    }

    #[test]
    fn validation_names_the_field() {
        let field_of = |f: &dyn Fn(&mut HetSbmOptions)| {
            let mut o = HetSbmOptions::new("g");
            f(&mut o);
            match o.validate() {
                Err(StoreError::Option { field, .. }) => field,
                other => panic!("expected an option error, got {other:?}"),
            }
        };
        assert_eq!(field_of(&|o| o.classes = 1), "classes");
        assert_eq!(field_of(&|o| o.institutions = 7), "institutions");
        assert_eq!(field_of(&|o| o.citations = -1.0), "citations");
        assert_eq!(
            field_of(&|o| o.authors_per_paper = 0.5),
            "authors_per_paper"
        );
        assert_eq!(field_of(&|o| o.cites_homophily = 1.5), "cites_homophily");
        assert_eq!(field_of(&|o| o.power_law = 1.0), "power_law");
        assert_eq!(field_of(&|o| o.weight_signal = 1.0), "weight_signal");
        assert_eq!(field_of(&|o| o.time_steps = 0), "time_steps");
        assert_eq!(field_of(&|o| o.feature_dim = 0), "feature_dim");
        assert_eq!(
            field_of(&|o| o.field_feature_noise = f64::INFINITY),
            "field_feature_noise"
        );
        assert_eq!(field_of(&|o| o.valid_fraction = 0.5), "test_fraction");
        let parsed: HetSbmOptions =
            serde_json::from_str(r#"{"out": "x", "split_by": "random", "memory": "64M"}"#).unwrap();
        assert_eq!(
            (parsed.split_by, parsed.memory, parsed.papers),
            (SplitBy::Random, Size(64 << 20), 100_000)
        );
    }

    #[test]
    fn poisson_has_its_mean() {
        let mut rng = Rng::new(3);
        for mean in [0.0, 0.2, 2.0, 8.0] {
            let total: u64 = (0..20_000).map(|_| poisson(&mut rng, mean)).sum();
            let got = total as f64 / 20_000.0;
            assert!(
                (got - mean).abs() < 0.05 + 0.02 * mean,
                "mean {mean}: {got}"
            );
        }
    }
}
