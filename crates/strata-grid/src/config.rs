//! The options of a run (`strata run ALGO`), as the CLI, the Python API and config files give
//! them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::algo::AlgoConfig;
use crate::far::FarConfig;
use crate::layout::WeightSpec;
use crate::place::VertexPlacement;

/// One run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunJob {
    pub store: PathBuf,
    pub algorithm: AlgoConfig,
    /// Grid name under `STORE/grids/`; `None` finds one that suits the algorithm or builds it.
    #[serde(default)]
    pub grid: Option<String>,
    /// Local memory budget in bytes.
    pub memory: u64,
    /// Compute threads; 0: one per core.
    #[serde(default)]
    pub threads: usize,
    /// Largest segment (unit of placement and fetch) in bytes; 0 sizes segments from the
    /// budget (see [`MAX_AUTO_SEGMENT`](crate::budget::MAX_AUTO_SEGMENT)).
    #[serde(default)]
    pub segment_bytes: u64,
    /// Segments fetched or waiting per source: 1 fetches the next segment only once compute
    /// has finished the last (no prefetch); 2 is double buffering.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
    /// Threads reading from disk.
    #[serde(default = "default_disk_fetchers")]
    pub disk_fetchers: usize,
    /// Vertex data in memory, in windows, or whichever the budget allows.
    #[serde(default)]
    pub vertex: VertexPlacement,
    /// Far memory, when used.
    #[serde(default)]
    pub far: Option<FarConfig>,
    /// Keep edge blocks resident in memory when the budget allows (false: stream them from
    /// disk every pass, as an out-of-core run of a larger graph would).
    #[serde(default = "default_true")]
    pub keep_resident: bool,
    /// Where results go; `None`: `STORE/runs/grid-ALGO`.
    #[serde(default)]
    pub out: Option<PathBuf>,
    /// Weights drawn when a weighted grid must be built.
    #[serde(default)]
    pub weights: Option<WeightSpec>,
}

fn default_true() -> bool {
    true
}

/// Deep enough that the SSD sees about 32 MiB of reads in flight at 4 MiB segments: at 4 and 2,
/// PageRank out of core at RMAT scale 24 read at 77% of sequential bandwidth, at 8 and 4 at 95%.
fn default_prefetch() -> usize {
    8
}

fn default_disk_fetchers() -> usize {
    4
}
