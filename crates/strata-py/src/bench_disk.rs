//! The `[bench_disk]` section, the one config section the bindings declare themselves: the
//! section registry (`config`) lists it and the benchmark's entry point (`io`) takes it, so it
//! sits below both.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_io::BackendKind;
use strata_store::config::{check_seconds, ConfigError, Section, Size};

/// The `[bench_disk]` section: what `strata bench-disk` measures and how. It is declared here,
/// where the benchmark ([`BenchOptions`]) and the engine choice meet, because strata-io sits
/// below the config mechanism (`strata_store::config`). Saving the profile is Python's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BenchDiskOptions {
    /// directory on the device to measure (the benchmark file goes there)
    #[schemars(extend("x-kind" = "path"))]
    pub dir: PathBuf,
    /// size of the benchmark file
    pub size: Size,
    /// benchmark file: created (write test) and kept if absent, measured read-only if present;
    /// default a temporary file in --dir
    #[schemars(extend("x-kind" = "path"))]
    pub file: Option<PathBuf>,
    /// queue depths of the 4 KiB random-read test
    #[schemars(inner(range(min = 1)))]
    pub queue_depths: Vec<usize>,
    /// seconds per random-read queue depth
    pub seconds: f64,
    /// 1 MiB requests in flight in the sequential tests
    #[schemars(range(min = 1))]
    pub seq_depth: usize,
    /// I/O backend to measure
    pub backend: BackendKind,
    /// keep the benchmark file
    pub keep: bool,
}

/// The smallest benchmark file created: the sequential tests need a few 1 MiB requests.
const MIN_BENCH_FILE: u64 = 4 << 20;

impl Default for BenchDiskOptions {
    fn default() -> Self {
        BenchDiskOptions {
            dir: PathBuf::from("."),
            size: Size(4 << 30),
            file: None,
            queue_depths: vec![1, 4, 16, 64, 128, 256],
            seconds: 3.0,
            seq_depth: 32,
            backend: BackendKind::Auto,
            keep: false,
        }
    }
}

impl Section for BenchDiskOptions {
    const NAME: &'static str = "bench_disk";

    fn validate(&self) -> Result<(), ConfigError> {
        let refuse = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
        if self.queue_depths.is_empty() {
            return refuse("queue_depths", "needs at least one queue depth".into());
        }
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            return refuse("seconds", format!("must be positive, got {}", self.seconds));
        }
        check_seconds(Self::NAME, "seconds", self.seconds, 1.0)?;
        if self.size.0 < MIN_BENCH_FILE && self.file.is_none() {
            return refuse("size", format!("at least 4M, got {}", self.size.0));
        }
        Ok(())
    }
}
