//! The interface to a trained embedding run that a service answers queries from: top-k
//! answers of `(head, relation, ?)`, scores of triples and nearest neighbours of nodes.
//!
//! The embedding engine (`strata-embed`) owns the run format and the score functions; the
//! service (`strata-serve`) owns registration, limits, authentication and the memory plan.
//! Engines never depend on each other, so the service holds an [`EmbeddingBackend`] handed to
//! it at start (`strata-py` hands it `strata_embed::ServingBackend`), as it holds feature
//! rows through [`crate::FeatureStore`]. Every score is computed by the engine's own code: the
//! service never scores.

use std::path::Path;

use strata_io::progress::Progress;

/// Why a backend refused or failed a call; each kind maps to one status code of the service.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddingError {
    /// An unknown node or relation name; names it.
    #[error("{0}")]
    NotFound(String),
    /// An id out of range, an unknown metric or checkpoint, a run the backend cannot serve;
    /// names the field and what was expected.
    #[error("{0}")]
    InvalidArgument(String),
    /// The memory the run was offered cannot hold its minimum; names both sizes.
    #[error("{0}")]
    Budget(String),
    /// The call's [`Progress`] asked to stop (a deadline passed).
    #[error("cancelled")]
    Cancelled,
    /// A run directory or store that does not hold what it should, or an I/O error; names the
    /// file.
    #[error("{0}")]
    Failed(String),
}

pub type EmbeddingResult<T> = std::result::Result<T, EmbeddingError>;

/// What a served run is.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// The store its nodes and known edges come from.
    pub store: String,
    /// Epochs trained by the served checkpoint.
    pub epoch: u64,
    /// The score function's name (`complex`, `pbg`, ...).
    pub model: String,
    pub dim: u64,
    pub num_nodes: u64,
    pub num_relations: u64,
    /// Partitions of the table and how many stay resident.
    pub partitions: u64,
    pub resident_partitions: u64,
    /// Bytes of the table on disk (embeddings and optimizer state).
    pub table_bytes: u64,
    /// Bytes the open run holds in memory (its planned resident set).
    pub resident_bytes: u64,
}

/// One query of [`EmbeddingRun::top_k`]: the best tails of `(node, relation, ?)`, or with
/// `head` the best heads of `(?, relation, node)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkQuery {
    pub node: u64,
    pub relation: u32,
    pub head: bool,
}

/// One ranked answer: a node, its score (or the metric's value for neighbours), and whether
/// the edge it completes is in one of the store's splits (top-k answers only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    pub node: u64,
    pub score: f32,
    pub known: bool,
}

/// Opens trained runs to serve them.
pub trait EmbeddingBackend: Send + Sync {
    /// Copies checkpoint `checkpoint` (`best` or `last`) of the run at `source` into the new
    /// directory `dest` as a run of its own (that checkpoint only), so that training the
    /// source further never changes what is served. `dest` must not exist.
    fn snapshot(&self, source: &Path, checkpoint: &str, dest: &Path) -> EmbeddingResult<()>;

    /// Bytes the run at `dir` holds in memory once opened with `memory` bytes (`None`: the
    /// whole table resident), without opening it: the service takes them from its budget first.
    fn resident_bytes(&self, dir: &Path, memory: Option<u64>) -> EmbeddingResult<u64>;

    /// Opens the run at `dir` (a snapshot) with at most `memory` bytes resident (`None`: the
    /// whole table).
    fn open(&self, dir: &Path, memory: Option<u64>) -> EmbeddingResult<Box<dyn EmbeddingRun>>;
}

/// An opened run. Calls that scan the table take `&mut self` (they share its resident
/// partitions); a service serialises them per run. `progress` is polled as the table is
/// scanned: returning `false` from `update` stops the call with [`EmbeddingError::Cancelled`].
pub trait EmbeddingRun: Send {
    fn info(&self) -> &RunInfo;

    /// Node ids of `names` (a store's node names, or ids as text in a store without names);
    /// an unknown name is `NotFound` naming `field[i]`.
    fn node_ids(&self, field: &str, names: &[String]) -> EmbeddingResult<Vec<u64>>;

    /// Relation ids of `names`; an unknown name is `NotFound` naming `relations[i]`.
    fn relation_ids(&self, names: &[String]) -> EmbeddingResult<Vec<u32>>;

    /// Names of node ids `ids` (the id as text in a store without names).
    fn node_names(&self, ids: &[u64]) -> EmbeddingResult<Vec<String>>;

    /// The `k` best answers of each query, best first (ties: lower id first), with one scan
    /// of the table for all of them; with `filtered`, answers already in the store (any split)
    /// are left out, else marked `known`.
    fn top_k(
        &mut self,
        queries: &[LinkQuery],
        k: usize,
        filtered: bool,
        progress: &dyn Progress,
    ) -> EmbeddingResult<Vec<Vec<Ranked>>>;

    /// Scores of `(head, relation, tail)` triples with the run's score function, in order.
    fn score(
        &mut self,
        triples: &[(u64, u32, u64)],
        progress: &dyn Progress,
    ) -> EmbeddingResult<Vec<f32>>;

    /// The `k` nearest nodes of each of `nodes` (itself left out) by `metric` (`model`, `cos`,
    /// `dot` or `l2`), nearest first, and the metric `model` resolved to. In a run with entity
    /// types only nodes of each query node's own type are candidates, unless `any_type`.
    fn neighbors(
        &mut self,
        nodes: &[u64],
        k: usize,
        metric: &str,
        any_type: bool,
        progress: &dyn Progress,
    ) -> EmbeddingResult<(String, Vec<Vec<Ranked>>)>;
}
