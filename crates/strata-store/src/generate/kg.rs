//! Knowledge graphs with planted latent structure, in the FB15k-237 file layout.
//!
//! Entities fall into clusters; each relation maps a head's cluster to a tail cluster and picks
//! tails among that cluster's most popular members, each `(head, relation)` pair taking distinct
//! tails. Structured triples are therefore unique by construction, so valid and test triples
//! never repeat a train triple while `(head, relation)` still pins the tail down to a handful of
//! candidates. The full construction is in `docs/generators.md`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use strata_io::SeqWriter;

use super::{
    check_fraction, config_check, decimal_width, push_decimal, run_ordered, worker_threads,
    GenerateSummary, Staging,
};
use crate::array::IO_CHUNK;
use crate::config::{ConfigError, Section};
use crate::disk_room;
use crate::error::{Result, StoreError};
use crate::perm::Perm;
use crate::rng::{derive, Rng};
use strata_io::progress::{Meter, Progress};

/// The files a KG directory holds, in split order.
const FILES: [&str; 3] = ["train.txt", "valid.txt", "test.txt"];
/// Triples per work chunk.
const CHUNK_TRIPLES: u64 = 1 << 14;
/// Largest `cluster_size`: the per-relation round tables have one entry per possible fact of a
/// `(head, relation)` pair, at most a cluster's size.
const MAX_CLUSTER_SIZE: u64 = 10_000;

// Stream keys, mixed with the seed.
const STREAM_KIND: u64 = 1;
const STREAM_SPLIT: u64 = 2;
const STREAM_ENTITY_NAMES: u64 = 3;
const STREAM_RELATION_NAMES: u64 = 4;
const STREAM_NOISE: u64 = 5;
const STREAM_LATENT: u64 = 6;
// Sub-streams of one latent relation's key.
const SUB_ROUND: u64 = 1;
const SUB_HEADS: u64 = 2;
const SUB_SLOTS: u64 = 3;
const SUB_CLUSTER_MAP: u64 = 4;
const SUB_TAILS: u64 = 5;

/// Options of [`kg`]: the `[generate.kg]` config section (see docs/generators.md for the
/// model each option shapes).
#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct KgOptions {
    /// output directory (train.txt, valid.txt, test.txt)
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// number of entities
    pub entities: u64,
    /// number of relations
    pub relations: u64,
    /// triples over all three splits
    pub triples: u64,
    /// fraction of triples in valid.txt
    pub valid_fraction: f64,
    /// fraction of triples in test.txt
    pub test_fraction: f64,
    /// entities per latent type; a head's type and the relation fix the tail's type
    pub cluster_size: u64,
    /// popularity spread of tails within a type (smaller: more predictable)
    pub tail_spread: u64,
    /// skew of head popularity within a relation, in [0.1, 10]
    pub head_skew: f64,
    /// skew of relation frequencies
    pub relation_skew: f64,
    /// fraction of relations that come in inverse pairs
    pub inverse_fraction: f64,
    /// fraction of pure-noise triples (1.0 removes all structure)
    pub noise: f64,
    /// random seed; equal options give byte-identical output
    pub seed: u64,
    /// worker threads; 0 = one per core
    pub threads: usize,
    /// replace an existing output directory
    // Only one holding nothing but the three files.
    pub overwrite: bool,
}

impl Default for KgOptions {
    /// `out` is required (empty is refused).
    fn default() -> Self {
        KgOptions {
            out: PathBuf::new(),
            entities: 10_000,
            relations: 50,
            triples: 200_000,
            valid_fraction: 0.05,
            test_fraction: 0.05,
            cluster_size: 50,
            tail_spread: 4,
            head_skew: 1.0,
            relation_skew: 0.5,
            inverse_fraction: 0.2,
            noise: 0.1,
            seed: 1,
            threads: 0,
            overwrite: false,
        }
    }
}

impl Section for KgOptions {
    const NAME: &'static str = "generate.kg";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        config_check(Self::NAME, &self.out, KgOptions::validate(self))
    }
}

impl KgOptions {
    /// Options writing to directory `out`, every other field at its default.
    pub fn new(out: impl AsRef<Path>) -> Self {
        KgOptions {
            out: out.as_ref().to_path_buf(),
            ..KgOptions::default()
        }
    }

    /// Checks ranges and consistency; errors name the offending option. (Whether the triples fit
    /// the entities is checked by [`kg`], which builds the per-relation tables.)
    pub fn validate(&self) -> Result<()> {
        if !(2..=1 << 40).contains(&self.entities) {
            return Err(StoreError::option(
                "entities",
                format!("must be within [2, 2^40], got {}", self.entities),
            ));
        }
        if !(1..=1 << 20).contains(&self.relations) {
            return Err(StoreError::option(
                "relations",
                format!("must be within [1, 2^20], got {}", self.relations),
            ));
        }
        if !(1..=1 << 60).contains(&self.triples) {
            return Err(StoreError::option(
                "triples",
                format!("must be within [1, 2^60], got {}", self.triples),
            ));
        }
        check_fraction("valid_fraction", self.valid_fraction)?;
        check_fraction("test_fraction", self.test_fraction)?;
        if self.valid_fraction + self.test_fraction >= 1.0 {
            return Err(StoreError::option(
                "test_fraction",
                "valid_fraction + test_fraction must be below 1, leaving triples to train on",
            ));
        }
        if !(1..=MAX_CLUSTER_SIZE).contains(&self.cluster_size) {
            return Err(StoreError::option(
                "cluster_size",
                format!(
                    "must be within [1, {MAX_CLUSTER_SIZE}], got {}",
                    self.cluster_size
                ),
            ));
        }
        if self.tail_spread == 0 {
            return Err(StoreError::option("tail_spread", "must be at least 1"));
        }
        if !(0.1..=10.0).contains(&self.head_skew) {
            return Err(StoreError::option(
                "head_skew",
                format!("must be within [0.1, 10], got {}", self.head_skew),
            ));
        }
        if !(0.0..=10.0).contains(&self.relation_skew) {
            return Err(StoreError::option(
                "relation_skew",
                format!("must be within [0, 10], got {}", self.relation_skew),
            ));
        }
        check_fraction("inverse_fraction", self.inverse_fraction)?;
        check_fraction("noise", self.noise)
    }
}

/// One latent relation: a cluster map and a schedule of facts, shared by a relation and, for
/// an inverse pair, its inverse.
///
/// Its facts are enumerated by slot. Slots are grouped in rounds: round k holds one fact for
/// each of the `round_size[k]` most popular heads (in a shuffled order), and a head's fact in
/// round k is its k-th, so it takes the k-th tail of its tail ordering. Round sizes never grow,
/// which makes a head's rounds exactly 0, 1, ... and its facts distinct.
struct Latent {
    /// First slot of each round, then the number of slots.
    round_start: Vec<u64>,
    /// Heads taking part in each round.
    round_size: Vec<u64>,
    /// Shuffles slots so the two relations of a pair take unbiased halves.
    slots: Option<Perm>,
    /// Head popularity rank to entity.
    heads: Perm,
    key: u64,
}

/// How a relation draws on its latent relation: slots `[offset, offset + count)` of it,
/// mirrored for the inverse of a pair.
struct RelationSlots {
    latent: usize,
    offset: u64,
    inverse: bool,
}

/// The generator: every triple is a pure function of its index and these small tables.
struct KgModel {
    entities: u64,
    relations: u64,
    clusters: u64,
    tail_spread: u64,
    /// Triples `i` with `kind.apply(i) < structured` follow the latent structure.
    structured: u64,
    n_train: u64,
    n_valid: u64,
    /// First structured index of each relation, then `structured`.
    rel_start: Vec<u64>,
    rel: Vec<RelationSlots>,
    latents: Vec<Latent>,
    kind: Perm,
    split: Perm,
    entity_names: Perm,
    relation_names: Perm,
    noise_key: u64,
    entity_width: usize,
    relation_width: usize,
}

/// Splits `total` into shares proportional to `weights` that sum to `total` exactly (largest
/// remainders first, ties to the lower index).
fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| total as f64 * w / sum).collect();
    let mut shares: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let given: u64 = shares.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&x, &y| {
        (exact[y] - exact[y].floor())
            .total_cmp(&(exact[x] - exact[x].floor()))
            .then(x.cmp(&y))
    });
    for &r in order
        .iter()
        .cycle()
        .take(total.saturating_sub(given) as usize)
    {
        shares[r] += 1;
    }
    shares
}

/// Round sizes for `total` facts over `heads` heads with at most `max_rounds` facts per head:
/// size_k = min(heads, ceil(scale * (k + 1)^-decay)), with the smallest `scale` that provides
/// `total` slots. Returns `(round_start, round_size)`, or `None` when even `max_rounds` full
/// rounds are too few.
fn plan_rounds(
    total: u64,
    heads: u64,
    max_rounds: u64,
    decay: f64,
) -> Option<(Vec<u64>, Vec<u64>)> {
    if total > heads.saturating_mul(max_rounds) {
        return None;
    }
    let size = |scale: f64, k: u64| {
        ((scale * ((k + 1) as f64).powf(-decay)).ceil() as u64).clamp(1, heads)
    };
    let capacity = |scale: f64| {
        let mut sum = 0u64;
        for k in 0..max_rounds {
            let s = size(scale, k);
            if s == 1 {
                return sum + (max_rounds - k);
            }
            sum += s;
        }
        sum
    };
    let (mut lo, mut hi) = (0.0f64, heads as f64 * (max_rounds as f64).powf(decay));
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if capacity(mid) >= total {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let (mut starts, mut sizes) = (Vec::new(), Vec::new());
    let mut at = 0;
    for k in 0..max_rounds {
        if at >= total {
            break;
        }
        starts.push(at);
        sizes.push(size(hi, k));
        at += size(hi, k);
    }
    starts.push(total);
    Some((starts, sizes))
}

impl KgModel {
    fn new(o: &KgOptions) -> Result<KgModel> {
        let e = o.entities;
        let clusters = e.div_ceil(o.cluster_size);
        let min_cluster = e / clusters;
        let noise = (o.triples as f64 * o.noise).round() as u64;
        let structured = o.triples - noise;
        let n_valid = (o.triples as f64 * o.valid_fraction).round() as u64;
        let n_test = (o.triples as f64 * o.test_fraction).round() as u64;
        let n_train = o.triples - n_valid - n_test;

        let weights: Vec<f64> = (0..o.relations)
            .map(|r| ((r + 1) as f64).powf(-o.relation_skew))
            .collect();
        let counts = apportion(structured, &weights);
        let mut rel_start = vec![0u64];
        rel_start.extend(counts.iter().scan(0u64, |acc, &c| {
            *acc += c;
            Some(*acc)
        }));
        let pairs = if o.relations >= 2 {
            (o.relations as f64 * o.inverse_fraction / 2.0).floor() as u64
        } else {
            0
        };
        let mut rel = Vec::with_capacity(o.relations as usize);
        let mut latent_totals = Vec::new();
        for r in 0..o.relations {
            let (latent, inverse) = if r < 2 * pairs {
                ((r / 2) as usize, r % 2 == 1)
            } else {
                ((r - pairs) as usize, false)
            };
            if latent == latent_totals.len() {
                latent_totals.push(0);
            }
            rel.push(RelationSlots {
                latent,
                offset: latent_totals[latent],
                inverse,
            });
            latent_totals[latent] += counts[r as usize];
        }
        let latent_key = derive(o.seed, STREAM_LATENT);
        let mut latents = Vec::with_capacity(latent_totals.len());
        for (l, &total) in latent_totals.iter().enumerate() {
            let (round_start, round_size) = plan_rounds(total, e, min_cluster, 1.0 / o.head_skew).ok_or_else(|| {
                StoreError::option(
                    "triples",
                    format!(
                        "a relation would need {total} distinct facts, more than entities * (entities per cluster) = {e} * {min_cluster}; \
                         lower triples or raise entities, relations or cluster_size"
                    ),
                )
            })?;
            let key = derive(latent_key, l as u64);
            latents.push(Latent {
                round_start,
                round_size,
                slots: (total > 0).then(|| Perm::new(total, derive(key, SUB_SLOTS))),
                heads: Perm::new(e, derive(key, SUB_HEADS)),
                key,
            });
        }
        Ok(KgModel {
            entities: e,
            relations: o.relations,
            clusters,
            tail_spread: o.tail_spread,
            structured,
            n_train,
            n_valid,
            rel_start,
            rel,
            latents,
            kind: Perm::new(o.triples, derive(o.seed, STREAM_KIND)),
            split: Perm::new(o.triples, derive(o.seed, STREAM_SPLIT)),
            entity_names: Perm::new(e, derive(o.seed, STREAM_ENTITY_NAMES)),
            relation_names: Perm::new(o.relations, derive(o.seed, STREAM_RELATION_NAMES)),
            noise_key: derive(o.seed, STREAM_NOISE),
            entity_width: decimal_width(e - 1),
            relation_width: decimal_width(o.relations - 1),
        })
    }

    /// Cluster of entity `j` (entities are dealt round-robin, so `j / clusters` is its
    /// popularity rank within the cluster).
    fn cluster(&self, j: u64) -> u64 {
        j % self.clusters
    }

    /// Triple `i` as `(head, relation, tail, split)` in internal ids; split 0, 1, 2 = train,
    /// valid, test.
    fn triple(&self, i: u64) -> (u64, u64, u64, usize) {
        let q = self.kind.apply(i);
        let (h, r, t) = if q < self.structured {
            self.structured_triple(q)
        } else {
            let mut rng = Rng::new(derive(self.noise_key, i));
            (
                rng.below(self.entities),
                rng.below(self.relations),
                rng.below(self.entities),
            )
        };
        let s = self.split.apply(i);
        let split = if s < self.n_train {
            0
        } else if s < self.n_train + self.n_valid {
            1
        } else {
            2
        };
        (h, r, t, split)
    }

    /// Structured triple number `q` (< `structured`).
    fn structured_triple(&self, q: u64) -> (u64, u64, u64) {
        let r = self.rel_start.partition_point(|&s| s <= q) - 1;
        let slots = &self.rel[r];
        let lat = &self.latents[slots.latent];
        let perm = lat
            .slots
            .as_ref()
            .expect("a relation with triples has latent slots");
        let z = perm.apply(slots.offset + q - self.rel_start[r]);
        let round = lat.round_start.partition_point(|&s| s <= z) - 1;
        let size = lat.round_size[round];
        let rank = Perm::new(size, derive(derive(lat.key, SUB_ROUND), round as u64))
            .apply(z - lat.round_start[round]);
        let head = lat.heads.apply(rank);
        let tail_cluster = Rng::new(derive(derive(lat.key, SUB_CLUSTER_MAP), self.cluster(head)))
            .below(self.clusters);
        let members = (self.entities - tail_cluster).div_ceil(self.clusters);
        let member = self.tail_member(
            round as u64,
            members,
            derive(derive(lat.key, SUB_TAILS), head),
        );
        let tail = tail_cluster + self.clusters * member;
        if slots.inverse {
            (tail, r as u64, head)
        } else {
            (head, r as u64, tail)
        }
    }

    /// The popularity rank (within a cluster of `members`) of a head's `k`-th tail: members are
    /// taken in blocks of `tail_spread`, `2 * tail_spread`, `4 * tail_spread`, ... by popularity,
    /// each block in an order of the head's own. A bijection on `[0, members)`, so a head's tails
    /// are distinct.
    fn tail_member(&self, k: u64, members: u64, key: u64) -> u64 {
        let (mut start, mut len) = (0, self.tail_spread);
        while k >= start + len {
            start += len;
            len *= 2;
        }
        let len = len.min(members - start);
        start + Perm::new(len, derive(key, start)).apply(k - start)
    }

    fn push_entity(&self, buf: &mut Vec<u8>, j: u64) {
        buf.push(b'e');
        push_decimal(buf, self.entity_names.apply(j), self.entity_width);
    }

    fn push_relation(&self, buf: &mut Vec<u8>, r: u64) {
        buf.push(b'r');
        push_decimal(buf, self.relation_names.apply(r), self.relation_width);
    }

    /// Name of entity `j`.
    #[cfg(test)]
    fn entity_name(&self, j: u64) -> String {
        let mut buf = Vec::new();
        self.push_entity(&mut buf, j);
        String::from_utf8(buf).unwrap()
    }

    /// Appends the lines of triples `range` to the buffers of their splits.
    fn fill(&self, range: std::ops::Range<u64>, out: &mut [Vec<u8>; 3]) {
        out.iter_mut().for_each(Vec::clear);
        for i in range {
            let (h, r, t, split) = self.triple(i);
            let buf = &mut out[split];
            self.push_entity(buf, h);
            buf.push(b'\t');
            self.push_relation(buf, r);
            buf.push(b'\t');
            self.push_entity(buf, t);
            buf.push(b'\n');
        }
    }
}

/// Writes a knowledge graph with planted structure to the directory `opts.out`: `train.txt`,
/// `valid.txt` and `test.txt` of `head\trelation\ttail` lines.
pub fn kg(opts: &KgOptions, progress: &dyn Progress) -> Result<GenerateSummary> {
    opts.validate()?;
    let start = Instant::now();
    let model = KgModel::new(opts)?;
    let staging = Staging::dir(&opts.out, opts.overwrite, &FILES)?;
    // A triple's line is at least "0\t0\t0\n".
    staging.ensure_room(disk_room::bytes(opts.triples, 6), || {
        format!("kg of {} triples", opts.triples)
    })?;
    let mut writers = Vec::with_capacity(FILES.len());
    for name in FILES {
        writers.push(SeqWriter::create(&staging.path().join(name), 0, IO_CHUNK)?);
    }
    let mut meter = Meter::new(progress, "kg", 0, opts.triples);
    run_ordered(
        worker_threads(opts.threads),
        opts.triples,
        CHUNK_TRIPLES,
        |range, out: &mut [Vec<u8>; 3]| model.fill(range, out),
        |rows, out| {
            for (w, buf) in writers.iter_mut().zip(out) {
                w.write_all(buf)?;
            }
            Ok(meter.add(rows, out.iter().map(|b| b.len() as u64).sum())?)
        },
    )?;
    meter.finish()?;
    for w in writers {
        w.finish()?;
    }
    let files = staging.final_paths(&FILES);
    staging.commit()?;
    let n_test = opts.triples - model.n_train - model.n_valid;
    let max_facts = model
        .latents
        .iter()
        .map(|l| l.round_size.len())
        .max()
        .unwrap_or(0);
    let details = serde_json::json!({
        "entities": opts.entities,
        "relations": opts.relations,
        "clusters": model.clusters,
        "entities_per_cluster": [opts.entities / model.clusters, opts.entities.div_ceil(model.clusters)],
        "inverse_pairs": opts.relations as usize - model.latents.len(),
        "structured_triples": model.structured,
        "noise_triples": opts.triples - model.structured,
        "splits": { "train": model.n_train, "valid": model.n_valid, "test": n_test },
        "max_tails_per_head_relation": max_facts,
        "tail_spread": opts.tail_spread,
        "head_skew": opts.head_skew,
        "relation_skew": opts.relation_skew,
        "seed": opts.seed,
    });
    GenerateSummary::new(
        "kg",
        &opts.out,
        files,
        opts.entities,
        opts.triples,
        start,
        details,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use strata_io::progress::NoProgress;

    type Triple = (String, String, String);

    fn read_split(dir: &Path, name: &str) -> Vec<Triple> {
        std::fs::read_to_string(dir.join(name))
            .unwrap()
            .lines()
            .map(|l| {
                let mut f = l.split('\t');
                let t = (
                    f.next().unwrap().to_string(),
                    f.next().unwrap().to_string(),
                    f.next().unwrap().to_string(),
                );
                assert!(f.next().is_none(), "three fields per line: {l}");
                t
            })
            .collect()
    }

    fn small(dir: &Path, name: &str) -> KgOptions {
        let mut o = KgOptions::new(dir.join(name));
        o.entities = 2000;
        o.relations = 20;
        o.triples = 40_000;
        o
    }

    /// Filtered tail MRR on the test split of a count baseline that sees only train triples and
    /// the generator's entity clusters: candidates are ranked by how often they were the tail of
    /// the relation for heads of the same cluster, then by how often they were a tail at all.
    /// Returns the MRR and the MRR of a uniformly random ranking.
    fn baseline_mrr(o: &KgOptions) -> (f64, f64) {
        let model = KgModel::new(o).unwrap();
        let cluster: HashMap<String, u64> = (0..o.entities)
            .map(|j| (model.entity_name(j), model.cluster(j)))
            .collect();
        let index: HashMap<&String, usize> = cluster
            .keys()
            .enumerate()
            .map(|(k, name)| (name, k))
            .collect();
        let (train, valid, test) = (
            read_split(&o.out, "train.txt"),
            read_split(&o.out, "valid.txt"),
            read_split(&o.out, "test.txt"),
        );
        let mut group: HashMap<(u64, &str), HashMap<usize, u64>> = HashMap::new();
        let mut tail_count = vec![0u64; o.entities as usize];
        for (h, r, t) in &train {
            *group
                .entry((cluster[h], r))
                .or_default()
                .entry(index[t])
                .or_default() += 1;
            tail_count[index[t]] += 1;
        }
        let mut known: HashMap<(&str, &str), HashSet<usize>> = HashMap::new();
        for (h, r, t) in train.iter().chain(&valid).chain(&test) {
            known.entry((h, r)).or_default().insert(index[t]);
        }
        let big = train.len() as u64 + 1;
        let mut mrr = 0.0;
        let mut scores = vec![0u64; o.entities as usize];
        for (h, r, t) in &test {
            let counts = group.get(&(cluster[h], r.as_str()));
            for (e, s) in scores.iter_mut().enumerate() {
                *s = counts.and_then(|c| c.get(&e)).copied().unwrap_or(0) * big + tail_count[e];
            }
            let target = index[t];
            let filtered = &known[&(h.as_str(), r.as_str())];
            let (mut above, mut ties) = (0u64, 0u64);
            for (e, &s) in scores.iter().enumerate() {
                if e == target || filtered.contains(&e) {
                    continue;
                }
                above += (s > scores[target]) as u64;
                ties += (s == scores[target]) as u64;
            }
            // Expected reciprocal rank under random tie-breaking.
            mrr += (0..=ties)
                .map(|k| 1.0 / (above + k + 1) as f64)
                .sum::<f64>()
                / (ties + 1) as f64;
        }
        let random = (1..=o.entities).map(|k| 1.0 / k as f64).sum::<f64>() / o.entities as f64;
        (mrr / test.len() as f64, random)
    }

    #[test]
    fn planted_structure_beats_random_and_noise_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let o = small(dir.path(), "kg");
        let summary = kg(&o, &NoProgress).unwrap();
        assert_eq!(summary.num_edges, 40_000);
        let (mrr, random) = baseline_mrr(&o);
        assert!(mrr > 10.0 * random, "baseline MRR {mrr} vs random {random}");

        let mut noisy = small(dir.path(), "noise");
        noisy.noise = 1.0;
        kg(&noisy, &NoProgress).unwrap();
        let (mrr_noise, random) = baseline_mrr(&noisy);
        assert!(
            mrr_noise < 2.0 * random,
            "pure noise still has MRR {mrr_noise} (random {random})"
        );
    }

    #[test]
    fn splits_exact_names_distinct_few_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let o = small(dir.path(), "kg");
        let s = kg(&o, &NoProgress).unwrap();
        assert_eq!(
            s.files,
            vec![
                o.out.join("train.txt"),
                o.out.join("valid.txt"),
                o.out.join("test.txt")
            ]
        );
        let (train, valid, test) = (
            read_split(&o.out, "train.txt"),
            read_split(&o.out, "valid.txt"),
            read_split(&o.out, "test.txt"),
        );
        assert_eq!((train.len(), valid.len(), test.len()), (36_000, 2000, 2000));
        let entities: HashSet<&String> = train
            .iter()
            .chain(&valid)
            .chain(&test)
            .flat_map(|(h, _, t)| [h, t])
            .collect();
        let relations: HashSet<&String> = train
            .iter()
            .chain(&valid)
            .chain(&test)
            .map(|(_, r, _)| r)
            .collect();
        assert!(
            entities.len() <= 2000 && entities.len() > 1900,
            "{} entities used",
            entities.len()
        );
        assert_eq!(relations.len(), 20);
        assert!(
            entities.iter().all(|e| !relations.contains(e)),
            "entity and relation names are distinct"
        );
        let train_set: HashSet<&Triple> = train.iter().collect();
        for split in [&valid, &test] {
            let dup = split.iter().filter(|t| train_set.contains(t)).count();
            assert!(
                (dup as f64) < 0.01 * split.len() as f64,
                "{dup} evaluation triples repeat a train triple"
            );
        }
    }

    #[test]
    fn deterministic_across_threads() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = small(dir.path(), "a");
        a.threads = 1;
        let mut b = small(dir.path(), "b");
        b.threads = 3;
        kg(&a, &NoProgress).unwrap();
        kg(&b, &NoProgress).unwrap();
        for f in FILES {
            assert!(
                std::fs::read(a.out.join(f)).unwrap() == std::fs::read(b.out.join(f)).unwrap(),
                "{f} differs"
            );
        }
    }

    #[test]
    fn structured_facts_are_unique() {
        let mut o = KgOptions::new("unused");
        o.entities = 300;
        o.relations = 6;
        o.triples = 20_000;
        o.noise = 0.0;
        o.cluster_size = 40;
        let model = KgModel::new(&o).unwrap();
        let facts: HashSet<(u64, u64, u64)> = (0..o.triples)
            .map(|i| model.triple(i))
            .map(|(h, r, t, _)| (h, r, t))
            .collect();
        assert_eq!(facts.len() as u64, o.triples);
    }

    #[test]
    fn rounds_never_grow_and_cover_the_total() {
        for (total, heads, max_rounds, decay) in [
            (1, 10, 5, 1.0),
            (4000, 10_000, 50, 1.0),
            (500, 10, 50, 0.5),
            (999, 100, 10, 3.0),
            (1000, 100, 10, 0.1),
        ] {
            let (starts, sizes) = plan_rounds(total, heads, max_rounds, decay).unwrap();
            assert_eq!(*starts.last().unwrap(), total);
            assert_eq!(starts.len(), sizes.len() + 1);
            assert!(sizes.len() as u64 <= max_rounds);
            assert!(sizes.windows(2).all(|w| w[0] >= w[1]) && sizes[0] <= heads);
            for k in 0..sizes.len() {
                assert!(starts[k + 1] - starts[k] <= sizes[k] && starts[k + 1] > starts[k]);
            }
        }
        assert!(plan_rounds(1001, 100, 10, 1.0).is_none());
        assert_eq!(apportion(10, &[1.0, 1.0, 1.0]), [4, 3, 3]);
        assert_eq!(apportion(7, &[3.0, 1.0]).iter().sum::<u64>(), 7);
    }

    #[test]
    fn validation_names_the_field() {
        let field_of = |f: &dyn Fn(&mut KgOptions)| {
            let mut o = KgOptions::new("kg");
            f(&mut o);
            match o.validate().and_then(|_| KgModel::new(&o).map(drop)) {
                Err(StoreError::Option { field, .. }) => field,
                other => panic!("expected an option error, got {other:?}"),
            }
        };
        assert_eq!(field_of(&|o| o.entities = 1), "entities");
        assert_eq!(field_of(&|o| o.relations = 0), "relations");
        assert_eq!(field_of(&|o| o.noise = 1.5), "noise");
        assert_eq!(field_of(&|o| o.valid_fraction = -0.1), "valid_fraction");
        assert_eq!(field_of(&|o| o.test_fraction = 0.95), "test_fraction");
        assert_eq!(field_of(&|o| o.cluster_size = 0), "cluster_size");
        assert_eq!(field_of(&|o| o.head_skew = 0.0), "head_skew");
        assert_eq!(field_of(&|o| o.tail_spread = 0), "tail_spread");
        assert_eq!(field_of(&|o| o.inverse_fraction = 2.0), "inverse_fraction");
        assert_eq!(field_of(&|o| o.triples = 1 << 30), "triples");
    }
}
