//! Nearest entities of nodes' embeddings: an exact scan of every partition through the
//! buffer, so tables larger than memory are searched within the budget. Several query nodes
//! share one scan (one matrix product per tile of candidates); as many as the budget holds go
//! in one scan, the rest in further scans.

use std::cmp::Reverse;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::config::{ConfigError, Section, Size};

use crate::compute::kernels::{dot, gemm_abt};
use crate::config::Which;
use crate::error::{EmbedError, Result};
use crate::model::{Comparator, ScoreModel};
use crate::run::loaded::{name_of, Loaded};
use crate::serve::query::{candidate_rows, scan_groups, single_rows, Best, OrdF32};
use crate::sizes::TILE;
use crate::storage::entity_types::TypedLayout;

/// How two node embeddings are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// The comparator natural to the run's model (see [`Metric::natural`]).
    #[default]
    Model,
    /// Cosine similarity (higher is nearer).
    Cos,
    /// Dot product (higher is nearer).
    Dot,
    /// Euclidean distance (lower is nearer).
    L2,
}

impl Metric {
    /// The metric of `model`'s geometry: the comparator its score function names
    /// ([`ScoreModel::natural_comparator`]: dot for dot, L2 for the distance models, cosine
    /// for the bilinear models that weight coordinates by the relation, `pbg`'s own).
    pub fn natural(model: &ScoreModel) -> Metric {
        match model.natural_comparator() {
            Comparator::Dot => Metric::Dot,
            Comparator::Cos => Metric::Cos,
            // Squared L2 ranks as L2.
            Comparator::L2 | Comparator::SquaredL2 => Metric::L2,
        }
    }

    /// `self`, or the model's natural metric for [`Metric::Model`].
    pub fn resolve(self, model: &ScoreModel) -> Metric {
        match self {
            Metric::Model => Metric::natural(model),
            m => m,
        }
    }

    /// The option value naming this metric.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Model => "model",
            Metric::Cos => "cos",
            Metric::Dot => "dot",
            Metric::L2 => "l2",
        }
    }
}

/// The `[embed.neighbors]` section: the nearest entities of nodes' embeddings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NeighborsOptions {
    /// query node: a name, or an id without names (repeat for several; they share one scan)
    pub node: Vec<String>,
    /// file of query nodes, one name (or id) a line
    #[schemars(extend("x-kind" = "path"))]
    pub nodes_file: Option<PathBuf>,
    /// neighbours per query node
    #[schemars(range(min = 1))]
    pub top: usize,
    /// cos, dot or l2 (model: the run's model's own, see docs/embed.md)
    pub metric: Metric,
    /// checkpoint to use: best (by validation MRR) or last
    pub checkpoint: Which,
    /// memory budget (default: the run's); a table larger than it is scanned partition by partition
    pub memory: Option<Size>,
    /// in a run with entity types, search every type, not only the query node's own
    pub any_type: bool,
}

impl Default for NeighborsOptions {
    fn default() -> Self {
        NeighborsOptions {
            node: Vec::new(),
            nodes_file: None,
            top: 10,
            metric: Metric::Model,
            checkpoint: Which::Best,
            memory: None,
            any_type: false,
        }
    }
}

impl Section for NeighborsOptions {
    const NAME: &'static str = "embed.neighbors";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        if self.node.is_empty() && self.nodes_file.is_none() {
            return Err(ConfigError::new(
                Self::NAME,
                "node",
                "give at least one --node or a --nodes-file",
            ));
        }
        Ok(())
    }
}

/// One neighbour of a query node.
#[derive(Debug, Clone, Serialize)]
pub struct Neighbor {
    pub node: u64,
    pub name: String,
    /// Cosine similarity, dot product or L2 distance, as the metric says.
    pub score: f32,
}

/// The neighbours of one query node, nearest first.
#[derive(Debug, Clone, Serialize)]
pub struct NeighborList {
    pub node: u64,
    pub name: String,
    pub neighbors: Vec<Neighbor>,
}

/// What a search found and what it read.
#[derive(Debug, Clone, Serialize)]
pub struct NeighborsReport {
    pub epoch: usize,
    pub metric: &'static str,
    pub top: usize,
    pub results: Vec<NeighborList>,
    /// Scans of the whole table (query nodes beyond what the budget holds need more).
    pub scans: u64,
    /// Partitions read from disk (resident ones are not read again).
    pub partitions_read: u64,
    pub seconds: f64,
}

/// The `top` nearest nodes of each of `queries` (node ids) by `metric`, each query node left
/// out of its own list, nearest first (ties: lower id first). In a run with entity types the
/// candidates are the query node's own type unless `any_type`: queries are grouped by type
/// and each group's scans read only that type's section of every region.
pub fn neighbors(
    l: &mut Loaded,
    queries: &[u64],
    top: usize,
    metric: Metric,
    any_type: bool,
    progress: &dyn Progress,
) -> Result<NeighborsReport> {
    let start = std::time::Instant::now();
    let metric = metric.resolve(&l.model);
    let d = l.model.dim;
    let n = l.run.meta.num_nodes;
    if let Some(&bad) = queries.iter().find(|&&q| q >= n) {
        return Err(EmbedError::Config(format!(
            "node id {bad} is out of range: the run has {n} nodes"
        )));
    }
    let top = top.min(n.saturating_sub(1) as usize);
    // Per query node: its row, a tile of scores and its heap of `top` entries (16 bytes each).
    let per_query = ((d + TILE) * 4 + (top + 1) * 16) as u64;
    let per_scan = (l.spare_bytes() / per_query).max(1) as usize;
    let names = l.node_names()?;
    let layout = (!any_type)
        .then(|| l.run.meta.partitioning.typed_layout())
        .flatten();
    let type_of = |q: u64| layout.as_ref().map(|t| t.type_of(q));
    let groups = scan_groups(queries.len(), |i| type_of(queries[i]), per_scan);
    let mut results: Vec<Option<NeighborList>> = vec![None; queries.len()];
    let mut scans = 0;
    let mut partitions_read = 0;
    let mut meter = Meter::new(
        progress,
        "neighbors",
        groups.len() as u64 * n * d as u64 * 4,
        groups.len() as u64 * n,
    );
    for group in &groups {
        let nodes: Vec<u64> = group.iter().map(|&i| queries[i]).collect();
        let rows = single_rows(l, &nodes)?;
        let within = layout.as_ref().zip(type_of(nodes[0]));
        let (best, read) = scan(l, &nodes, &rows, top, metric, within, &mut meter)?;
        scans += 1;
        partitions_read += read;
        for (&i, list) in group.iter().zip(best) {
            let neighbors = list
                .into_iter()
                .map(|(score, node)| {
                    Ok(Neighbor {
                        node,
                        name: name_of(names.as_ref(), node)?,
                        score,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            results[i] = Some(NeighborList {
                node: queries[i],
                name: name_of(names.as_ref(), queries[i])?,
                neighbors,
            });
        }
    }
    meter.finish()?;
    let results = results.into_iter().flatten().collect();
    Ok(NeighborsReport {
        epoch: l.epoch,
        metric: metric.name(),
        top,
        results,
        scans,
        partitions_read,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The embedding rows of `nodes` (`nodes.len() x dim`), read partition by partition (each
/// partition holding one of them is read once, whatever their number).
pub(crate) fn query_rows(l: &mut Loaded, nodes: &[u64]) -> Result<Vec<f32>> {
    let d = l.model.dim;
    let locator = l.run.meta.partitioning.locator();
    let places: Vec<(u32, u32)> = nodes.iter().map(|&v| locator.locate(v)).collect();
    let mut parts: Vec<u32> = places.iter().map(|&(p, _)| p).collect();
    parts.sort_unstable();
    parts.dedup();
    let mut rows = vec![0.0f32; nodes.len() * d];
    l.buffer.visit(&parts, &l.table, |p, emb| {
        for (i, &(q, local)) in places.iter().enumerate() {
            if q == p {
                let at = local as usize * d;
                emb.copy(at, &mut rows[i * d..(i + 1) * d]);
            }
        }
        Ok(())
    })?;
    Ok(rows)
}

/// `(score, node)` pairs, nearest first.
type Ranked = Vec<(f32, u64)>;

/// One scan of every partition for the query nodes `group` (rows `rows`): per query, its
/// `top` best as `(score, node)` nearest first, and the partitions read from disk. `within`:
/// a typed run's layout and the one type whose sections are the candidates.
fn scan(
    l: &mut Loaded,
    group: &[u64],
    rows: &[f32],
    top: usize,
    metric: Metric,
    within: Option<(&TypedLayout, usize)>,
    meter: &mut Meter,
) -> Result<(Vec<Ranked>, u64)> {
    let d = l.model.dim;
    let b = group.len();
    let query_norms: Vec<f32> = rows.chunks_exact(d).map(|r| dot(r, r)).collect();
    let mut heaps: Vec<Best> = (0..b).map(|_| Best::with_capacity(top + 1)).collect();
    let partitioning = l.run.meta.partitioning.clone();
    let locator = partitioning.locator();
    let all = partitioning.regions();
    let read = all
        .iter()
        .filter(|&&p| l.buffer.slot_of(p).is_none())
        .count() as u64;
    let mut products = Vec::new();
    let (mut cand_norms, mut widened) = (Vec::new(), Vec::new());
    l.buffer.visit(&all, &l.table, |p, emb| {
        let size = partitioning.size_of(p) as usize;
        let span = candidate_rows(&partitioning, within, p);
        for lo in span.clone().step_by(TILE) {
            let t = TILE.min(span.end - lo);
            let cands = emb.span(lo * d, t * d, &mut widened);
            products.clear();
            products.resize(b * t, 0.0f32);
            gemm_abt(b, t, d, 1.0, rows, cands, 0.0, &mut products);
            cand_norms.clear();
            cand_norms.extend(cands.chunks_exact(d).map(|c| dot(c, c)));
            for (i, heap) in heaps.iter_mut().enumerate() {
                for (j, &x) in products[i * t..(i + 1) * t].iter().enumerate() {
                    let node = locator.node(p, (lo + j) as u32);
                    if node == group[i] {
                        continue;
                    }
                    let key = match metric {
                        Metric::Dot | Metric::Model => x,
                        Metric::Cos => cosine(x, query_norms[i], cand_norms[j]),
                        // The distance itself is taken for the kept ones only.
                        Metric::L2 => -(query_norms[i] - 2.0 * x + cand_norms[j]),
                    };
                    if key.is_nan() {
                        continue;
                    }
                    heap.push(Reverse((OrdF32(key), Reverse(node))));
                    if heap.len() > top {
                        heap.pop();
                    }
                }
            }
        }
        meter.add(size as u64, (span.len() * d * 4) as u64)?;
        Ok(())
    })?;
    let best = heaps
        .into_iter()
        .map(|heap| {
            let mut list: Vec<(f32, u64)> = heap
                .into_iter()
                .map(|Reverse((k, Reverse(node)))| (k.0, node))
                .collect();
            list.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            if metric == Metric::L2 {
                // Rounding can make a squared distance of near-equal rows slightly negative.
                list.iter_mut()
                    .for_each(|(k, _)| *k = (-*k).max(0.0).sqrt());
            }
            list
        })
        .collect();
    Ok((best, read))
}

/// `x / (‖q‖ ‖c‖)` from the squared norms; 0 against a zero row.
fn cosine(x: f32, q2: f32, c2: f32) -> f32 {
    let norm = (q2 * c2).sqrt();
    if norm > 0.0 {
        x / norm
    } else {
        0.0
    }
}

/// The options' query nodes as ids: `--node` values, then the file's lines; an unknown name
/// is an error naming it (and the file line).
pub fn resolve_queries(l: &Loaded, o: &NeighborsOptions) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for name in &o.node {
        ids.push(l.node_id(name)?);
    }
    if let Some(path) = &o.nodes_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            EmbedError::Config(format!(
                "--nodes-file {}: cannot read it: {e}",
                path.display()
            ))
        })?;
        // A UTF-8 byte order mark (Windows editors write one) is no part of the first name.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        for (i, line) in text.lines().enumerate() {
            let name = line.trim();
            if name.is_empty() {
                continue;
            }
            ids.push(l.node_id(name).map_err(|e| {
                EmbedError::Config(format!("{} line {}: {e}", path.display(), i + 1))
            })?);
        }
    }
    if ids.is_empty() {
        return Err(EmbedError::Config(
            "no query nodes: --nodes-file holds no names".into(),
        ));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Operator, PbgForm, ScoreKind};

    /// docs/embed.md's table of default metrics, row by row.
    #[test]
    fn each_model_names_its_natural_metric() {
        let model = |kind, comparator| ScoreModel {
            kind,
            dim: 4,
            transe_norm: 2,
            pbg: PbgForm {
                operator: Operator::None,
                comparator,
            },
        };
        let named = [
            (ScoreKind::Dot, Metric::Dot),
            (ScoreKind::TransE, Metric::L2),
            (ScoreKind::RotatE, Metric::L2),
            (ScoreKind::DistMult, Metric::Cos),
            (ScoreKind::ComplEx, Metric::Cos),
        ];
        for (kind, want) in named {
            assert_eq!(
                Metric::natural(&model(kind, Comparator::Cos)),
                want,
                "{kind:?}"
            );
        }
        let pbg = [
            (Comparator::Dot, Metric::Dot),
            (Comparator::Cos, Metric::Cos),
            (Comparator::L2, Metric::L2),
            (Comparator::SquaredL2, Metric::L2),
        ];
        for (comparator, want) in pbg {
            let m = model(ScoreKind::Pbg, comparator);
            assert_eq!(Metric::natural(&m), want, "{comparator:?}");
        }
        assert_eq!(
            ScoreKind::ALL.len(),
            named.len() + 1,
            "a new model needs its row here"
        );
    }
}
