//! Training options (every field has a `///` description mirrored in the Python config).

use serde::{Deserialize, Serialize};

use crate::model::{LossKind, ScoreKind};
use crate::ordering::OrderingKind;

/// Most edges per chunk and negatives per side: a worker's update tag holds the row in 29 bits.
pub const MAX_ROWS: usize = 1 << 29;

/// Adagrad's state: one accumulator per element, or one per row (half the state, as PBG's
/// row-wise Adagrad).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    Adagrad,
    AdagradRow,
}

/// Which side of each edge is corrupted to make negatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Corrupt {
    Both,
    Tail,
    Head,
}

/// Where uniform negatives come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NegativePool {
    /// The partition of the corrupted side of the bucket (PyTorch-BigGraph): over an epoch a
    /// node meets negatives from every partition in proportion to its edges.
    Partition,
    /// Every resident partition (Marius, Legend): with few partitions resident, the softmax
    /// only ever sees a fraction of the nodes.
    Resident,
    /// Every node: resident partitions directly, partitions on disk through a block of their
    /// rows kept in memory (`bank_rows` per partition; see the `bank` module).
    All,
}

/// Evaluation protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Rank the true entity against every entity, skipping other known true triples.
    Filtered,
    /// Rank against `eval_negatives` uniform plus as many degree-weighted candidates.
    Sampled,
}

/// Everything a training run is set up with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Score function.
    pub model: ScoreKind,
    /// Reals per node embedding (ComplEx and RotatE use half as complex coordinates).
    pub dim: usize,
    /// Norm of TransE (1 or 2).
    pub transe_norm: u8,
    pub loss: LossKind,
    /// Margin of the margin-ranking loss.
    pub margin: f32,
    /// Learning rate.
    pub lr: f32,
    pub optimizer: OptimizerKind,
    /// Standard deviation of the initial node embeddings.
    pub init_scale: f32,
    pub epochs: usize,
    /// Positive edges per chunk (they share one set of negatives).
    pub chunk_size: usize,
    /// Negatives per chunk and corrupted side.
    pub negatives: usize,
    /// Fraction of the negatives drawn in proportion to degree (from the chunk's own edges);
    /// the rest are uniform over `negative_pool`.
    pub degree_fraction: f32,
    /// Where the uniform negatives are drawn from.
    pub negative_pool: NegativePool,
    /// Rows of each partition kept in memory as negatives while it is on disk (`all` pool;
    /// fewer when the budget is tight).
    pub bank_rows: usize,
    pub corrupt: Corrupt,
    /// Relations get a second, inverse row used when heads are corrupted (reciprocal
    /// relations); otherwise head corruption scores `(h', r, t)` through the model's reversed
    /// relation (the conjugate for ComplEx, the opposite rotation for RotatE, `-r` for TransE).
    pub reciprocal: bool,
    /// Node partitions; 0 plans the fewest that fit the memory budget (1 keeps the whole
    /// table in memory).
    pub partitions: u32,
    /// Partitions resident at once.
    pub buffer: usize,
    pub ordering: OrderingKind,
    /// Worker threads over a bucket's chunks; 0 means one per core.
    pub threads: usize,
    pub seed: u64,
    /// Memory budget in bytes (partition buffer, bucket edges, bookkeeping).
    pub memory: u64,
    /// Evaluate on the validation split every this many epochs (0: never).
    pub eval_every: usize,
    pub eval_protocol: Protocol,
    /// Uniform (and as many degree-weighted) candidates of the sampled protocol.
    pub eval_negatives: usize,
    /// Evaluate at most this many queries per split (0: all).
    pub eval_max_queries: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ScoreKind::ComplEx,
            dim: 100,
            transe_norm: 2,
            loss: LossKind::Softmax,
            margin: 0.1,
            lr: 0.1,
            optimizer: OptimizerKind::Adagrad,
            init_scale: 1e-3,
            epochs: 10,
            chunk_size: 1000,
            negatives: 1000,
            degree_fraction: 0.0,
            negative_pool: NegativePool::All,
            bank_rows: 4096,
            corrupt: Corrupt::Both,
            reciprocal: true,
            partitions: 0,
            buffer: 3,
            ordering: OrderingKind::Legend,
            threads: 0,
            seed: 0,
            memory: 1 << 30,
            eval_every: 1,
            eval_protocol: Protocol::Filtered,
            eval_negatives: 1000,
            eval_max_queries: 0,
        }
    }
}

impl TrainConfig {
    /// Checks every value's range; errors name the option as it appears in the config file.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |field: &str, what: String| Err(format!("embed.train.{field}: {what}"));
        if self.dim == 0 {
            return bad("dim", "must be positive".into());
        }
        if matches!(self.model, ScoreKind::ComplEx | ScoreKind::RotatE)
            && !self.dim.is_multiple_of(2)
        {
            return bad(
                "dim",
                format!(
                    "must be even for {:?} (real and imaginary halves), got {}",
                    self.model, self.dim
                ),
            );
        }
        if !matches!(self.transe_norm, 1 | 2) {
            return bad(
                "transe_norm",
                format!("must be 1 or 2, got {}", self.transe_norm),
            );
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad("lr", format!("must be a positive number, got {}", self.lr));
        }
        if !(self.init_scale > 0.0 && self.init_scale.is_finite()) {
            return bad(
                "init_scale",
                format!("must be a positive number, got {}", self.init_scale),
            );
        }
        if !(self.margin >= 0.0 && self.margin.is_finite()) {
            return bad(
                "margin",
                format!("must be a non-negative number, got {}", self.margin),
            );
        }
        if self.chunk_size == 0 || self.chunk_size >= MAX_ROWS {
            return bad(
                "chunk_size",
                format!("must be between 1 and 2^29 - 1, got {}", self.chunk_size),
            );
        }
        if self.negatives == 0 || self.negatives >= MAX_ROWS {
            return bad(
                "negatives",
                format!("must be between 1 and 2^29 - 1, got {}", self.negatives),
            );
        }
        if !(0.0..=1.0).contains(&self.degree_fraction) {
            return bad(
                "degree_fraction",
                format!("must be between 0 and 1, got {}", self.degree_fraction),
            );
        }
        if self.buffer == 0 {
            return bad("buffer", "must be at least 1".into());
        }
        if self.eval_negatives == 0 {
            return bad("eval_negatives", "must be positive".into());
        }
        Ok(())
    }
}
