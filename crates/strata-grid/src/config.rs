//! The options of a run (`strata run ALGO`) and of a grid build (`strata grid build`): the
//! config sections the CLI, the Python API and config files give ([`RunOptions`],
//! [`BuildOptions`]), and the jobs the engine runs ([`RunJob`], [`BuildJob`]).

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::config::{check_address, AutoSize, ConfigError, Section, Size};
use strata_store::convert::{Delimiter, EdgeLayout, IdKind, InputFormat};

use crate::algo::registry::{self, AlgoParams};
use crate::algo::Configured;
use crate::block_codec::Compression;
use crate::build::BuildJob;
use crate::error::Result;
use crate::far::FarConfig;
use crate::grid::is_grid_dir;
use crate::layout::{GridManifest, Order, WeightRequest, WeightSource, WeightSpec, STORE_WEIGHTS};
use crate::place::VertexPlacement;
use strata_farmem::TransportKind;

/// One run.
#[derive(Debug, Clone)]
pub struct RunJob {
    pub store: PathBuf,
    /// A registered algorithm with its parameters.
    pub algorithm: Configured,
    /// Grid name under `STORE/grids/`; `None` finds one that suits the algorithm or builds it.
    pub grid: Option<String>,
    /// Local memory budget.
    pub memory: Size,
    /// Compute threads; 0: one per core.
    pub threads: usize,
    /// Largest segment (unit of placement and fetch); `Auto` sizes segments from the budget
    /// (see [`MAX_AUTO_SEGMENT`](crate::budget::MAX_AUTO_SEGMENT)).
    pub segment: AutoSize,
    /// Segments fetched or waiting per source: 1 fetches the next segment only once compute
    /// has finished the last (no prefetch); 2 is double buffering.
    pub prefetch: usize,
    /// Threads reading from disk.
    pub disk_fetchers: usize,
    /// Vertex data in memory, in windows, or whichever the budget allows.
    pub vertex: VertexPlacement,
    /// Far memory, when used.
    pub far: Option<FarConfig>,
    /// Keep edge blocks resident in memory when the budget allows (false: stream them from
    /// disk every pass, as an out-of-core run of a larger graph would).
    pub keep_resident: bool,
    /// Where results go; `None`: `STORE/runs/grid-ALGO`.
    pub out: Option<PathBuf>,
    /// The weights of a weighted grid built for the run (and which existing grid suits it).
    pub weights: Option<WeightRequest>,
    /// In a distributed run, seconds between iteration checkpoints (0: after every
    /// iteration); `None`: no checkpoints, a restarted group starts from the beginning.
    pub checkpoint_seconds: Option<f64>,
}

impl RunJob {
    /// The weights the run's algorithm reads (`None` when it needs none), resolved against
    /// the store: its own when `weight_source` allows and it has them, else drawn ones. A
    /// grid built from an input, run on directly, is the grid: its own weights, if any.
    pub fn weights_wanted(&self) -> Result<Option<WeightSpec>> {
        if !self.algorithm.needs_weights() {
            return Ok(None);
        }
        let request = self.weights.unwrap_or_default();
        if is_grid_dir(&self.store) {
            let own = GridManifest::load(&self.store)?.weights;
            return own
                .map_or_else(|| request.resolve(false, &self.store), Ok)
                .map(Some);
        }
        let store = strata_store::Store::open(&self.store)?;
        request
            .resolve(store.array(STORE_WEIGHTS).is_some(), &self.store)
            .map(Some)
    }
}

/// Deep enough that the SSD sees about 32 MiB of reads in flight at 4 MiB segments: at 4 and 2,
/// PageRank out of core at RMAT scale 24 read at 77% of sequential bandwidth, at 8 and 4 at 95%.
fn default_prefetch() -> usize {
    8
}

fn default_disk_fetchers() -> usize {
    4
}

/// Options of `strata run ALGO STORE` (the `run` section). Unknown options are refused by
/// [`AlgoParams::validate`] (the flattened parameters take every key the other fields do not,
/// which serde's `deny_unknown_fields` cannot be combined with).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct RunOptions {
    // The help text lists the registered algorithms (`registry::name_schema`).
    #[schemars(
        schema_with = "registry::name_schema",
        extend("x-positional" = true, "x-required" = true)
    )]
    pub algorithm: String,
    /// store to run on (its grids live in STORE/grids/), or a grid directory built straight
    /// from an input (`strata grid build INPUT --out DIR`)
    #[schemars(extend("x-positional" = true, "x-required" = true, "x-kind" = "path"))]
    pub store: PathBuf,
    /// The parameters of every registered algorithm, each an option of the section.
    #[serde(flatten)]
    pub params: AlgoParams,
    /// grid name under STORE/grids/; unset finds one that suits, or builds it
    pub grid: Option<String>,
    /// local memory budget: vertex data, fetch buffers, resident edge blocks
    pub memory: Size,
    /// compute threads; 0 = one per core
    #[schemars(range(max = 1024))]
    pub threads: u64,
    /// edge blocks are grouped into segments of up to this size, the unit of placement and
    /// fetching (a bigger block is a segment by itself); auto picks up to 4 MiB, keeping fetch
    /// buffers within a third of --memory (0, as older configs say, reads as auto)
    #[serde(deserialize_with = "AutoSize::zero_is_word")]
    pub segment: AutoSize,
    /// segments fetched ahead per source; 1 = no prefetch, 2 = double buffering
    #[schemars(range(min = 1))]
    pub prefetch: u64,
    /// where vertex data lives: memory, windows (scratch files in the run directory, paged by
    /// the kernel within --memory) or auto (memory when it fits next to the fetch buffers, else
    /// windows)
    pub vertex: VertexPlacement,
    /// threads reading edge segments from disk
    #[schemars(range(min = 1))]
    pub disk_fetchers: u64,
    /// HOST:PORT of a `strata farmem serve` to offload edge blocks to
    pub far: Option<String>,
    /// share of the run's footprint to place in far memory, in [0, 1]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub far_ratio: f64,
    /// bytes per far-memory transfer chunk (4 KiB to 64 MiB)
    pub far_chunk: Size,
    /// how the far-memory data connections move bytes: tcp (blocking sockets, two threads per
    /// connection) or uring (io_uring, one thread per connection, chunks received straight into
    /// place; falls back to tcp, with a message, where io_uring is unavailable)
    pub far_transport: TransportKind,
    /// parallel data connections to far memory; 0 = the controller probes
    pub far_connections: u64,
    /// threads fetching segments from far memory
    #[schemars(range(min = 1))]
    pub far_fetchers: u64,
    /// the memory server's shared secret (default: --far-token-file, else
    /// $STRATA_FARMEM_TOKEN); visible to every user of this machine in ps, so prefer
    /// --far-token-file or the environment
    pub far_token: String,
    /// keep edge blocks in memory when they fit (false: stream every pass)
    pub keep_resident: bool,
    /// where the edge weights of sssp and weighted spmv come from: auto (the store's weights
    /// when it has them, else drawn), store (its edge_weights_train column) or random (drawn
    /// from weight_seed, uniform in (weight_low, weight_high])
    pub weight_source: WeightSource,
    /// seed of the weights when a weighted grid must be built (sssp, spmv --weighted)
    pub weight_seed: u64,
    /// weights of an automatically built grid are uniform in (low, high]
    pub weight_low: f64,
    /// upper end of the weights of an automatically built grid
    pub weight_high: f64,
    /// directory for the results, run.json and metrics.jsonl (STORE/runs/grid-ALGO)
    #[schemars(extend("x-kind" = "path"))]
    pub out: Option<PathBuf>,
    /// under torchrun: seconds a rank waits for the others (joining, each exchange) before
    /// it gives up naming the rendezvous address
    #[schemars(range(min = 1))]
    pub dist_timeout: u64,
    /// under torchrun: write iteration checkpoints, from which a group that torchrun restarts
    /// (--max-restarts) resumes; false: a restarted group starts from the beginning
    pub checkpoints: bool,
    /// under torchrun: seconds between iteration checkpoints (each rank writes the values of
    /// its own vertices); 0 writes one after every iteration
    #[schemars(range(min = 0.0))]
    pub checkpoint_seconds: f64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            algorithm: registry::ALGORITHMS[0].name.to_string(),
            store: PathBuf::new(),
            params: AlgoParams::default(),
            grid: None,
            memory: Size(1 << 30),
            threads: 0,
            segment: AutoSize::Auto,
            prefetch: default_prefetch() as u64,
            vertex: VertexPlacement::Auto,
            disk_fetchers: default_disk_fetchers() as u64,
            far: None,
            far_ratio: 0.5,
            far_chunk: Size(256 << 10),
            far_transport: TransportKind::Tcp,
            far_connections: 0,
            far_fetchers: 2,
            far_token: String::new(),
            keep_resident: true,
            weight_source: WeightSource::Auto,
            weight_seed: 0,
            weight_low: 0.0,
            weight_high: 1.0,
            out: None,
            dist_timeout: 600,
            checkpoints: true,
            checkpoint_seconds: 60.0,
        }
    }
}

impl Section for RunOptions {
    const NAME: &'static str = "run";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        let refuse = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
        if self.store.as_os_str().is_empty() {
            return refuse("store", "needs a store".into());
        }
        // Every value is checked first, so that a bad one is named as bad, whichever runs.
        self.params.validate(Self::NAME)?;
        let algorithm = self.params.configure(Self::NAME, &self.algorithm)?;
        if let AutoSize::Bytes(bytes) = self.segment {
            if bytes < strata_io::ALIGN as u64 {
                return refuse(
                    "segment",
                    format!("must be auto or at least 4 KiB, got {bytes}"),
                );
            }
        }
        if !crate::far::FAR_CHUNK_BYTES.contains(&self.far_chunk.0) {
            return refuse(
                "far_chunk",
                format!("must be between 4 KiB and 64 MiB, got {}", self.far_chunk.0),
            );
        }
        if let Some(far) = &self.far {
            check_address(Self::NAME, "far", far)?;
        }
        if let Some(grid) = &self.grid {
            check_grid_name(Self::NAME, "grid", grid, false)?;
        }
        if !(self.checkpoint_seconds >= 0.0 && self.checkpoint_seconds.is_finite()) {
            return refuse(
                "checkpoint_seconds",
                format!(
                    "must be a number of seconds >= 0, got {}",
                    self.checkpoint_seconds
                ),
            );
        }
        check_weights(Self::NAME, self.weight_low, self.weight_high)?;
        match self.weight_option_set() {
            Some(key) if !algorithm.needs_weights() => refuse(
                key,
                format!(
                    "{} reads no edge weights, so it would ignore the option",
                    algorithm.name()
                ),
            ),
            _ => Ok(()),
        }
    }
}

impl RunOptions {
    /// The first option of the weights of a weighted grid set away from its default.
    fn weight_option_set(&self) -> Option<&'static str> {
        let d = RunOptions::default();
        [
            ("weight_source", self.weight_source != d.weight_source),
            ("weight_seed", self.weight_seed != d.weight_seed),
            ("weight_low", self.weight_low != d.weight_low),
            ("weight_high", self.weight_high != d.weight_high),
        ]
        .into_iter()
        .find_map(|(key, set)| set.then_some(key))
    }

    /// The engine's job; results go to `out`, by default `STORE/runs/grid-ALGO`. Errors: the
    /// algorithm is not registered, or its parameters are refused (naming `run.KEY`).
    pub fn job(&self) -> std::result::Result<RunJob, ConfigError> {
        let algorithm = self.params.configure(Self::NAME, &self.algorithm)?;
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let out = self.out.clone().unwrap_or_else(|| {
            self.store
                .join("runs")
                .join(format!("grid-{}", algorithm.name()))
        });
        Ok(RunJob {
            store: self.store.clone(),
            grid: self.grid.clone(),
            memory: self.memory,
            threads: count(self.threads),
            segment: self.segment,
            prefetch: count(self.prefetch),
            disk_fetchers: count(self.disk_fetchers),
            vertex: self.vertex,
            far: self.far.as_ref().map(|addr| FarConfig {
                addr: addr.clone(),
                ratio: self.far_ratio,
                chunk_bytes: count(self.far_chunk.0),
                transport: self.far_transport,
                connections: count(self.far_connections),
                fetchers: count(self.far_fetchers),
                token: Some(self.far_token.clone()).filter(|t| !t.is_empty()),
            }),
            algorithm,
            keep_resident: self.keep_resident,
            out: Some(out),
            weights: Some(weight_request(
                self.weight_source,
                self.weight_seed,
                self.weight_low,
                self.weight_high,
            )),
            checkpoint_seconds: self.checkpoints.then_some(self.checkpoint_seconds),
        })
    }
}

/// Options of `strata grid build STORE` and `strata grid build INPUT --out DIR` (the
/// `grid.build` section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BuildOptions {
    /// store whose train edges become the grid, or, with --out, an input edge list (bin32
    /// pairs, a text edge list, a NumPy edge array or a directory with edges.npy) to build
    /// the grid from directly, without a store
    #[schemars(extend("x-positional" = true, "x-required" = true, "x-kind" = "path"))]
    pub store: PathBuf,
    /// the grid directory to create from an input edge list (no store: `strata run` takes
    /// the directory in place of a store)
    #[schemars(extend("x-short" = "o", "x-kind" = "path"))]
    pub out: Option<PathBuf>,
    /// input format, with --out; auto decides from the file names and contents
    pub format: InputFormat,
    /// with --out, text inputs: the meaning of each field, comma-separated: src, dst, rel,
    /// weight (float32), or _ to ignore (default src,dst)
    pub columns: String,
    /// with --out, text inputs: node ids: int uses non-negative integers as ids directly,
    /// string renumbers names densely in sorted order and keeps the name table; auto picks
    /// int when the first lines hold only plain integers
    pub ids: IdKind,
    /// with --out, text inputs: field separator; auto detects it per file
    pub delimiter: Delimiter,
    /// with --out, text inputs: lines starting with this are skipped; empty for none
    pub comment: String,
    /// with --out, text inputs: each file starts with a header line to skip
    pub header: bool,
    /// with --out: the number of vertices (integer ids must be below it); default the
    /// largest id + 1, found by a pass over binary inputs
    #[schemars(range(min = 1))]
    pub num_nodes: Option<u64>,
    /// with --out, NumPy inputs: edges as rows (E, 2|3) or columns (2|3, E)
    pub layout: EdgeLayout,
    /// with --out, text inputs: parsing threads; 0 = one per core
    pub threads: usize,
    /// grid name under STORE/grids/ (default: p{P}-{order}[-sym][-simple][-w])
    pub name: String,
    /// vertex chunks P of the P x P grid; 0 chooses from the vertex count and --memory
    #[schemars(range(max = 4096))]
    pub partitions: u32,
    /// block order on disk: column keeps blocks of one destination chunk together, row of one
    /// source
    pub order: Order,
    /// store both directions of every edge (needed by wcc and kcore); unset follows the store
    /// (an input: not symmetrised)
    pub symmetrize: Option<bool>,
    /// a simple graph: drop self-loops and store each repeated edge once (with symmetrize, an
    /// edge given in both directions is one undirected edge); needed by kcore; not with weighted
    pub simple: bool,
    /// weight every edge (needed by sssp and weighted spmv), from weight_source
    pub weighted: bool,
    /// where weights come from: auto (the edges' own weights when they have them, else
    /// drawn), store (the store's edge_weights_train column, or the input's weight column) or
    /// random (drawn from weight_seed)
    pub weight_source: WeightSource,
    /// seed of the edge weights (a weight depends on the seed and the endpoint pair)
    pub weight_seed: u64,
    /// edge weights are uniform in (weight_low, weight_high]
    pub weight_low: f64,
    /// upper end of the edge weights
    pub weight_high: f64,
    /// memory budget of the build (and of the runs P is planned for)
    pub memory: Size,
    /// replace an existing grid of the same name
    pub overwrite: bool,
    /// how blocks store their edges: none (8 B an edge, uint32 pairs), packed (each block
    /// sorted and its key gaps bit-packed in frames of 32: about 2.5 B an edge on RMAT,
    /// decoded as blocks are fetched) or byte (Ligra+'s run-length byte code of the gaps)
    pub compression: Compression,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            store: PathBuf::new(),
            out: None,
            format: InputFormat::Auto,
            columns: String::new(),
            ids: IdKind::Auto,
            delimiter: Delimiter::Auto,
            comment: "#".into(),
            header: false,
            num_nodes: None,
            layout: EdgeLayout::Auto,
            threads: 0,
            name: String::new(),
            partitions: 0,
            order: Order::Column,
            symmetrize: None,
            simple: false,
            weighted: false,
            weight_source: WeightSource::Auto,
            weight_seed: 0,
            weight_low: 0.0,
            weight_high: 1.0,
            memory: Size(1 << 30),
            overwrite: false,
            compression: Compression::None,
        }
    }
}

impl Section for BuildOptions {
    const NAME: &'static str = "grid.build";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        if self.store.as_os_str().is_empty() {
            return Err(ConfigError::new(Self::NAME, "store", "needs a store"));
        }
        check_grid_name(Self::NAME, "name", &self.name, true)?;
        check_weights(Self::NAME, self.weight_low, self.weight_high)
    }
}

impl BuildOptions {
    /// The engine's job.
    pub fn job(&self) -> BuildJob {
        BuildJob {
            store: self.store.clone(),
            name: self.name.clone(),
            partitions: self.partitions,
            order: self.order,
            symmetrize: self.symmetrize,
            simple: self.simple,
            weights: self.weighted.then(|| {
                weight_request(
                    self.weight_source,
                    self.weight_seed,
                    self.weight_low,
                    self.weight_high,
                )
            }),
            memory: self.memory,
            overwrite: self.overwrite,
            compression: self.compression,
        }
    }
}

/// Weights from `source`; drawn ones uniform in (low, high] from `seed`.
fn weight_request(source: WeightSource, seed: u64, low: f64, high: f64) -> WeightRequest {
    WeightRequest {
        source,
        ..WeightRequest::random(seed, low as f32, high as f32)
    }
}

/// A plain directory name under `STORE/grids/` (empty only where `empty_ok`: a default name).
fn check_grid_name(
    section: &str,
    key: &str,
    name: &str,
    empty_ok: bool,
) -> std::result::Result<(), ConfigError> {
    if name.contains('/') || name.starts_with('.') || (name.is_empty() && !empty_ok) {
        return Err(ConfigError::new(
            section,
            key,
            format!("must be a plain directory name under STORE/grids/, got '{name}'"),
        ));
    }
    Ok(())
}

/// Finite weights with `low < high`.
fn check_weights(section: &str, low: f64, high: f64) -> std::result::Result<(), ConfigError> {
    if !(low.is_finite() && high.is_finite() && low < high) {
        return Err(ConfigError::new(
            section,
            "weight_low",
            format!("need finite weight_low < weight_high, got ({low}, {high}]"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store::config::check;

    fn refusal<S: Section + std::fmt::Debug>(values: serde_json::Value) -> String {
        check::<S>(&values).unwrap_err().to_string()
    }

    #[test]
    fn a_run_names_what_it_refuses() {
        let base = serde_json::json!({"algorithm": "bfs", "store": "g"});
        let with = |k: &str, v: serde_json::Value| {
            let mut o = base.clone();
            o[k] = v;
            o
        };
        assert_eq!(
            refusal::<RunOptions>(with("damping", 1.0.into())),
            "run.damping: must be in [0, 1), got 1"
        );
        assert!(refusal::<RunOptions>(with("far", "nohost".into()))
            .starts_with("run.far: expected HOST:PORT"));
        assert!(refusal::<RunOptions>(with("far_chunk", "1G".into()))
            .starts_with("run.far_chunk: must be between"));
        assert!(refusal::<RunOptions>(with("far_transport", "rdma".into()))
            .starts_with("run.far_transport"));
        assert!(refusal::<RunOptions>(with("grid", "../x".into()))
            .starts_with("run.grid: must be a plain"));
        assert!(refusal::<RunOptions>(with("weight_low", 2.0.into()))
            .starts_with("run.weight_low: need finite"));
        assert_eq!(
            refusal::<RunOptions>(serde_json::json!({})),
            "run.store: needs a store"
        );
    }

    #[test]
    fn the_job_carries_the_algorithm_and_far_memory() {
        let o: RunOptions = check(&serde_json::json!({
            "algorithm": "sssp", "store": "g", "root": 7, "far": "h:1", "far_ratio": 0.25,
            "far_transport": "uring"
        }))
        .unwrap();
        let job = o.job().unwrap();
        assert_eq!(
            job.algorithm,
            Configured::new(crate::algo::Sssp { root: 7 })
        );
        let far = job.far.unwrap();
        assert_eq!((far.ratio, far.transport), (0.25, TransportKind::Uring));
        assert_eq!(job.out, Some(PathBuf::from("g/runs/grid-sssp")));
    }

    #[test]
    fn a_build_draws_weights_only_when_asked() {
        let o: BuildOptions = check(&serde_json::json!({"store": "g", "partitions": 4})).unwrap();
        assert!(o.job().weights.is_none());
        assert_eq!(o.job().partitions, 4);
        assert!(
            refusal::<BuildOptions>(serde_json::json!({"store": "g", "partitions": 5000}))
                .starts_with("grid.build.partitions: must be <= 4096")
        );
        assert!(
            refusal::<BuildOptions>(serde_json::json!({"store": "g", "name": ".x"}))
                .starts_with("grid.build.name: must be a plain")
        );
    }
}
