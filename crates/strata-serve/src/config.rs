//! The `serve` config section: what `strata serve` is given, checked and turned into the
//! server's [`ServeConfig`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::config::{check_address, check_seconds, AllSize, ConfigError, Section, Size};

use crate::executor::ExecConfig;
use crate::roots::DataRoots;
use crate::schedule::ScheduleConfig;
use crate::server::ServeConfig;
use crate::shared::Limits;
use crate::{Result, ServeError};
use strata_graph::order::glist::ReorderParams;

/// Options of `strata serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServeOptions {
    /// stores to register at start, each as NAME=PATH or PATH (named after its directory);
    /// skipped when the name is already registered
    #[schemars(extend("x-positional" = true))]
    pub stores: Vec<String>,
    /// HOST:PORT to listen on; port 0 picks a free one
    pub listen: String,
    /// where registered graphs, models and logs live
    #[schemars(extend("x-kind" = "path"))]
    pub state_dir: PathBuf,
    /// whole budget: runtime (24 MiB), graphs, models, working memory, executor, caches
    pub memory: Size,
    /// cache node embeddings until the graph changes (GLIST's C); off gives all of --memory
    /// to pages
    pub embedding_cache: bool,
    /// shared secret clients must send, required off loopback (default: --token-file, else
    /// $STRATA_SERVE_TOKEN); visible to every user of this machine in ps, so prefer
    /// --token-file or the environment
    pub token: String,
    /// seconds a connection may stay silent (nothing sent, or a request stalled half-way)
    /// before it is closed; live clients are pinged at half of it, so an idle client that
    /// answers pings keeps its connection
    #[schemars(range(min = 0.01, max = 86400.0))]
    pub idle_timeout: f64,
    /// largest request or response message
    pub max_message: Size,
    /// most ids (targets, seeds, vertices, edges, embedding queries) in one request
    #[schemars(range(min = 1))]
    pub max_ids: u64,
    /// most answers per query of an embedding run (top-k tails, neighbours)
    #[schemars(range(min = 1))]
    pub max_k: u64,
    /// embedding runs (`strata embed train`) to register at start, each as NAME=RUN_DIR or
    /// RUN_DIR (named after its directory); their best checkpoint is served; skipped when the
    /// name is already registered
    #[schemars(extend("x-kind" = "path"))]
    pub embedding: Vec<String>,
    /// directory whose stores, embedding runs and model files clients may name (repeatable;
    /// symlinks and `..` are resolved first); without one, only the stores and embedding
    /// runs given here
    #[schemars(extend("x-kind" = "path"))]
    pub data_root: Vec<PathBuf>,
    /// bytes each embedding run registered at start holds resident (partitions, relations,
    /// query scratch); all holds its whole table (0, as older configs say, reads as all)
    #[serde(deserialize_with = "AllSize::zero_is_word")]
    pub embedding_memory: AllSize,
    /// requests per second over all clients; 0 means no limit
    #[schemars(range(min = 0.0))]
    pub rate: f64,
    /// batching window: how long a request waits for others to join its batch
    #[schemars(range(min = 0.0))]
    pub window_ms: f64,
    /// most requests in one batch
    #[schemars(range(min = 1))]
    pub max_batch: u64,
    /// S: distinct vertices embedded together as one fused batch (GLIST Alg. 1)
    #[schemars(range(min = 1))]
    pub group_size: u64,
    /// re-order a batch's vertices by id distance (GLIST Alg. 1)
    pub reorder_requests: bool,
    /// re-number the vertices of stores registered at start (GLIST Alg. 2)
    pub reorder: bool,
    /// h of Alg. 2: hops of a centre vertex's working set
    #[schemars(range(min = 1, max = 4))]
    pub reorder_hops: u32,
    /// Cn of Alg. 2: centre vertices; 0 picks enough to cover the graph
    pub reorder_centers: u64,
    /// Td of Alg. 2: centres have in-degree below this; 0 means no limit
    pub reorder_max_degree: u64,
    /// seed of the neighbour sampling of analyses
    pub sample_seed: u64,
    /// seconds a finished result waits to be fetched
    #[schemars(range(min = 0.0))]
    pub result_ttl: f64,
    /// fold a graph's log into a new store version at this many records
    #[schemars(range(min = 1))]
    pub fold_records: u64,
    /// ... or once its oldest unfolded record is this many seconds old
    #[schemars(range(min = 0.0))]
    pub fold_after: f64,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            stores: Vec::new(),
            listen: "127.0.0.1:7100".into(),
            state_dir: PathBuf::from("strata-serve-state"),
            memory: Size(1 << 30),
            embedding_cache: true,
            token: String::new(),
            idle_timeout: 60.0,
            max_message: Size(64 << 20),
            max_ids: 1_000_000,
            max_k: 1000,
            embedding: Vec::new(),
            data_root: Vec::new(),
            embedding_memory: AllSize::All,
            rate: 0.0,
            window_ms: 2.0,
            max_batch: 4096,
            group_size: 256,
            reorder_requests: true,
            reorder: true,
            reorder_hops: 1,
            reorder_centers: 0,
            reorder_max_degree: 0,
            sample_seed: 0,
            result_ttl: 300.0,
            fold_records: 50_000,
            fold_after: 30.0,
        }
    }
}

impl Section for ServeOptions {
    const NAME: &'static str = "serve";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        check_address(Self::NAME, "listen", &self.listen)?;
        for (key, size) in [("memory", self.memory), ("max_message", self.max_message)] {
            if size.0 == 0 {
                return Err(ConfigError::new(Self::NAME, key, "must be positive, got 0"));
            }
        }
        if !self.rate.is_finite() {
            return Err(ConfigError::new(
                Self::NAME,
                "rate",
                format!("expected a finite number, got {}", self.rate),
            ));
        }
        check_seconds(Self::NAME, "window_ms", self.window_ms, 1e3)?;
        check_seconds(Self::NAME, "result_ttl", self.result_ttl, 1.0)?;
        check_seconds(Self::NAME, "fold_after", self.fold_after, 1.0)?;
        Ok(())
    }
}

impl ServeOptions {
    /// The server's config (an empty `token` is none; the stores to register as (name,
    /// absolute path); the data roots, by default the stores and runs registered at start).
    /// Refuses (`INVALID_ARGUMENT`) a store that has no manifest, a root that is not a
    /// directory.
    pub fn server_config(&self) -> Result<ServeConfig> {
        let register = self
            .stores
            .iter()
            .map(|spec| store_to_register(spec))
            .collect::<Result<Vec<_>>>()?;
        let register_embeddings = self
            .embedding
            .iter()
            .map(|spec| run_to_register(spec))
            .collect::<Result<Vec<_>>>()?;
        // Without --data-root, a client may name what the operator chose to serve and nothing
        // else: re-register those stores and runs (under other names, re-ordered), never
        // browse the rest of the disk.
        let roots = if self.data_root.is_empty() {
            // A run opens the store it was trained on, so that store is given too.
            let run_stores = register_embeddings
                .iter()
                .filter_map(|(_, run)| crate::roots::run_store(run))
                .filter(|store| store.is_dir());
            let given: Vec<PathBuf> = register
                .iter()
                .chain(&register_embeddings)
                .map(|(_, path)| path.clone())
                .chain(run_stores)
                .collect();
            DataRoots::new(&given, "serve.stores")?
        } else {
            DataRoots::new(&self.data_root, "serve.data_root")?
        };
        let token = Some(self.token.clone()).filter(|t| !t.is_empty());
        Ok(ServeConfig {
            listen: self.listen.clone(),
            state_dir: self.state_dir.clone(),
            memory: self.memory.0,
            embedding_cache: self.embedding_cache,
            token,
            idle_timeout: Duration::from_secs_f64(self.idle_timeout),
            max_message_bytes: usize::try_from(self.max_message.0).unwrap_or(usize::MAX),
            limits: Limits {
                max_ids: usize::try_from(self.max_ids).unwrap_or(usize::MAX),
                max_k: usize::try_from(self.max_k).unwrap_or(usize::MAX),
                rate: self.rate,
                roots,
            },
            exec: ExecConfig {
                window: Duration::from_secs_f64(self.window_ms / 1e3),
                max_batch: usize::try_from(self.max_batch).unwrap_or(usize::MAX),
                schedule: ScheduleConfig {
                    reorder: self.reorder_requests,
                    group_size: usize::try_from(self.group_size).unwrap_or(usize::MAX),
                },
                sample_seed: self.sample_seed,
                embedding_cache_bytes: 0,
                group_bytes: 0,
                result_ttl: Duration::from_secs_f64(self.result_ttl),
            },
            fold_records: self.fold_records,
            fold_after: Duration::from_secs_f64(self.fold_after),
            register,
            register_embeddings,
            embedding_memory: self.embedding_memory,
            reorder: self.reorder.then(|| ReorderParams {
                hops: self.reorder_hops,
                centers: usize::try_from(self.reorder_centers).unwrap_or(usize::MAX),
                max_degree: self.reorder_max_degree,
                ..ReorderParams::default()
            }),
        })
    }
}

/// `NAME=PATH` or `PATH` (named after its directory, less `.strata`) as (name, absolute path).
fn store_to_register(spec: &str) -> Result<(String, PathBuf)> {
    named_path(spec, "serve.stores", "manifest.json", "a Strata store")
}

/// `NAME=RUN_DIR` or `RUN_DIR` (named after its directory) as (name, absolute path).
fn run_to_register(spec: &str) -> Result<(String, PathBuf)> {
    named_path(
        spec,
        "serve.embedding",
        "run.json",
        "a run directory of `strata embed train`",
    )
}

/// `NAME=PATH` or `PATH` as (name, absolute path), refusing (`INVALID_ARGUMENT`, naming
/// option `key`) a path without the file `marker` that makes it `what`. Without a name, the
/// directory's name less `.strata` names it.
fn named_path(spec: &str, key: &str, marker: &str, what: &str) -> Result<(String, PathBuf)> {
    let (name, path) = match spec.split_once('=') {
        Some((name, path)) => (Some(name), Path::new(path)),
        None => (None, Path::new(spec)),
    };
    if !path.join(marker).exists() {
        return Err(ServeError::InvalidArgument(format!(
            "{key}: {} is not {what} (no {marker})",
            path.display()
        )));
    }
    let path = path
        .canonicalize()
        .map_err(|e| ServeError::io(format!("resolving {}", path.display()), e))?;
    let name = match name {
        Some(n) => n.to_string(),
        None => path
            .file_name()
            .map(|n| {
                let n = n.to_string_lossy();
                n.strip_suffix(".strata").unwrap_or(&n).to_string()
            })
            .unwrap_or_default(),
    };
    Ok((name, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store::config::check;

    #[test]
    fn listen_must_be_host_and_port() {
        let e = check::<ServeOptions>(&serde_json::json!({"listen": "localhost"})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "serve.listen: expected HOST:PORT such as 127.0.0.1:7000, got 'localhost'"
        );
        check::<ServeOptions>(&serde_json::json!({"listen": "[::1]:0"})).unwrap();
    }

    #[test]
    fn a_store_without_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let o = ServeOptions {
            stores: vec![format!("g={}", dir.path().display())],
            ..ServeOptions::default()
        };
        let e = o.server_config().unwrap_err().to_string();
        assert!(e.contains("is not a Strata store"), "{e}");
        let o = ServeOptions {
            embedding: vec![format!("r={}", dir.path().display())],
            ..ServeOptions::default()
        };
        let e = o.server_config().unwrap_err().to_string();
        assert!(
            e.contains("serve.embedding: ") && e.contains("(no run.json)"),
            "{e}"
        );
    }

    #[test]
    fn the_roots_default_to_the_stores_and_runs_given() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("g.strata");
        std::fs::create_dir(&store).unwrap();
        std::fs::write(store.join("manifest.json"), b"{}").unwrap();
        let o = ServeOptions {
            stores: vec![store.display().to_string()],
            ..ServeOptions::default()
        };
        let roots = o.server_config().unwrap().limits.roots;
        assert_eq!(roots.dirs(), [store.canonicalize().unwrap()]);
        assert!(ServeOptions::default()
            .server_config()
            .unwrap()
            .limits
            .roots
            .dirs()
            .is_empty());
        let o = ServeOptions {
            stores: vec![store.display().to_string()],
            data_root: vec![dir.path().join("none")],
            ..ServeOptions::default()
        };
        let e = o.server_config().unwrap_err().to_string();
        assert!(
            e.starts_with("serve.data_root: ") && e.ends_with("is not a directory"),
            "{e}"
        );
    }

    #[test]
    fn durations_beyond_a_duration_are_refused() {
        let e = check::<ServeOptions>(&serde_json::json!({"fold_after": 1e300})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "serve.fold_after: expected a duration from 0 to 1e9 (about 31 years), got 1e300"
        );
        let e = check::<ServeOptions>(&serde_json::json!({"window_ms": 1e15})).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("serve.window_ms: expected a duration from 0 to 1e12"));
        check::<ServeOptions>(&serde_json::json!({"result_ttl": 1e9}))
            .unwrap()
            .server_config()
            .unwrap();
    }

    #[test]
    fn an_empty_token_is_none() {
        let o = ServeOptions::default();
        assert_eq!(o.server_config().unwrap().token, None);
        assert_eq!(o.server_config().unwrap().reorder.unwrap().hops, 1);
        let o = ServeOptions {
            token: "s".into(),
            reorder: false,
            ..ServeOptions::default()
        };
        assert_eq!(o.server_config().unwrap().token.as_deref(), Some("s"));
        assert_eq!(o.server_config().unwrap().reorder, None);
    }
}
