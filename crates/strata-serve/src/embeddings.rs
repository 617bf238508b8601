//! Registered embedding runs, kept in the server's state directory so that a restart serves
//! the same ones:
//!
//! ```text
//! STATE/embeddings/NAME/embedding.json   how it was registered (source run, checkpoint, memory)
//! STATE/embeddings/NAME/run/             the served copy of that checkpoint (a run directory)
//! ```
//!
//! The copy is made by the embedding backend ([`EmbeddingBackend::snapshot`]); training the
//! source run further never changes what is served, as a registered graph is a copy of its
//! store. A registration is written under `.partial-NAME` and renamed into place once complete
//! (and its directory synced), so after a crash a run is registered whole or not at all. A run
//! holds its planned resident set ([`EmbeddingBackend::resident_bytes`]) from the server's
//! budget, taken from the page cache like a graph's topology.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use serde::{Deserialize, Serialize};
use strata_graph::embedding_run::{EmbeddingBackend, EmbeddingError, EmbeddingRun, RunInfo};

use crate::durable::{create_dir_all, sync_dir};
use crate::error::{Result, ServeError};
use crate::memory::{Kind, Resident};
use crate::registered::{check_name, list_dirs, remove_registered};
use strata_io::durable::replace_file;

/// How a run was registered (`embedding.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingJson {
    /// The run directory registered (absolute).
    pub source: PathBuf,
    /// `best` or `last`.
    pub checkpoint: String,
    /// Bytes resident asked for (`None`: the whole table).
    pub memory: Option<u64>,
}

/// A registered run. Its queries take the run's lock: a scan reads and replaces the run's
/// resident partitions, so one runs at a time per run.
pub struct ServedEmbedding {
    pub name: String,
    pub json: EmbeddingJson,
    /// What the backend opened (fixed while registered).
    pub info: RunInfo,
    run: Mutex<Box<dyn EmbeddingRun>>,
}

impl ServedEmbedding {
    /// The opened run, once no other query holds it.
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn EmbeddingRun>> {
        // A query that panicked leaves the run as consistent as any call does: its resident
        // partitions are whole partitions read from the table.
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A backend error as the service's: names are the caller's, budget refusals a lack of
/// memory, cancellation the call's deadline, the rest the served copy's.
pub fn embedding_error(e: EmbeddingError) -> ServeError {
    match e {
        EmbeddingError::NotFound(m) => ServeError::NotFound(m),
        EmbeddingError::InvalidArgument(m) => ServeError::InvalidArgument(m),
        EmbeddingError::Budget(m) => ServeError::ResourceExhausted(m),
        EmbeddingError::Cancelled => ServeError::DeadlineExceeded(
            "the call's deadline passed while its run's table was scanned; give a longer deadline or ask for fewer queries in one call".into(),
        ),
        EmbeddingError::Failed(m) => ServeError::FailedPrecondition(m),
    }
}

/// The registered runs by name, and the backend that opens them.
pub struct Embeddings {
    dir: PathBuf,
    backend: Option<Arc<dyn EmbeddingBackend>>,
    runs: RwLock<BTreeMap<String, Arc<ServedEmbedding>>>,
}

impl Embeddings {
    /// Opens (creating) `STATE/embeddings` and every run registered in it with `backend`;
    /// without a backend, a registered run is refused (`FAILED_PRECONDITION`).
    pub fn open(state: &Path, backend: Option<Arc<dyn EmbeddingBackend>>) -> Result<Embeddings> {
        let dir = state.join("embeddings");
        create_dir_all(&dir)?;
        let e = Embeddings {
            dir,
            backend,
            runs: RwLock::new(BTreeMap::new()),
        };
        for (name, path) in list_dirs(&e.dir)? {
            let json_path = path.join("embedding.json");
            let bytes = std::fs::read(&json_path)
                .map_err(|err| ServeError::io(json_path.display().to_string(), err))?;
            let json: EmbeddingJson = serde_json::from_slice(&bytes).map_err(|err| {
                ServeError::FailedPrecondition(format!("{}: {err}", json_path.display()))
            })?;
            let run = e
                .backend()
                .and_then(|b| {
                    b.open(&path.join("run"), json.memory)
                        .map_err(embedding_error)
                })
                .map_err(|err| err.within(&format!("embedding run '{name}'")))?;
            e.insert(name, json, run);
        }
        Ok(e)
    }

    fn backend(&self) -> Result<&Arc<dyn EmbeddingBackend>> {
        self.backend.as_ref().ok_or_else(|| {
            ServeError::FailedPrecondition(
                "this server was started without an embedding backend, so it cannot serve embedding runs".into(),
            )
        })
    }

    fn insert(
        &self,
        name: String,
        json: EmbeddingJson,
        run: Box<dyn EmbeddingRun>,
    ) -> Arc<ServedEmbedding> {
        let served = Arc::new(ServedEmbedding {
            name: name.clone(),
            json,
            info: run.info().clone(),
            run: Mutex::new(run),
        });
        self.runs.write().unwrap().insert(name, Arc::clone(&served));
        served
    }

    /// Resident bytes of each registered run, by name.
    pub fn held_bytes(&self) -> Vec<(String, u64)> {
        self.runs
            .read()
            .unwrap()
            .iter()
            .map(|(n, r)| (n.clone(), r.info.resident_bytes))
            .collect()
    }

    pub fn get(&self, name: &str) -> Result<Arc<ServedEmbedding>> {
        self.runs.read().unwrap().get(name).cloned().ok_or_else(|| {
            ServeError::NotFound(format!("embedding run '{name}' is not registered"))
        })
    }

    pub fn list(&self) -> Vec<Arc<ServedEmbedding>> {
        self.runs.read().unwrap().values().cloned().collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.runs.read().unwrap().contains_key(name)
    }

    /// Bytes the run at `source` would hold registered with `memory` (`None`: the whole
    /// table), from its record alone: what a registration at start is planned with.
    pub fn planned_bytes(&self, source: &Path, memory: Option<u64>) -> Result<u64> {
        check_run_dir(source)?;
        self.backend()?
            .resident_bytes(source, memory)
            .map_err(embedding_error)
    }

    /// Registers checkpoint `checkpoint` of the run at `source` as `name` with `memory`
    /// bytes resident (`None`: the whole table), taking them from `resident` when the
    /// server's budget is attached.
    pub fn register(
        &self,
        name: &str,
        source: &Path,
        checkpoint: &str,
        memory: Option<u64>,
        resident: Option<&Resident>,
    ) -> Result<Arc<ServedEmbedding>> {
        check_name(name, "embedding run")?;
        if self.contains(name) {
            return Err(ServeError::AlreadyExists(format!(
                "embedding run '{name}' is already registered"
            )));
        }
        check_run_dir(source)?;
        let backend = self.backend()?;
        let source = source
            .canonicalize()
            .map_err(|e| ServeError::io(format!("resolving {}", source.display()), e))?;
        // Charged before the copy and the open, from the run's record.
        let bytes = backend
            .resident_bytes(&source, memory)
            .map_err(embedding_error)?;
        if let Some(r) = resident {
            r.take(Kind::Embedding, name, bytes)?;
        }
        let release = || {
            if let Some(r) = resident {
                r.release(Kind::Embedding, name);
            }
        };
        let json = EmbeddingJson {
            source: source.clone(),
            checkpoint: if checkpoint.is_empty() {
                "best".into()
            } else {
                checkpoint.into()
            },
            memory,
        };
        let partial = self.dir.join(format!(".partial-{name}"));
        let placed = self.dir.join(name);
        let written = (|| {
            let _ = std::fs::remove_dir_all(&partial);
            create_dir_all(&partial)?;
            backend
                .snapshot(&source, &json.checkpoint, &partial.join("run"))
                .map_err(embedding_error)?;
            let path = partial.join("embedding.json");
            replace_file(
                &path,
                &serde_json::to_vec_pretty(&json).expect("serialises"),
            )
            .map_err(|e| ServeError::io(format!("write {}", path.display()), e))?;
            std::fs::rename(&partial, &placed)
                .map_err(|e| ServeError::io(placed.display().to_string(), e))?;
            sync_dir(&self.dir)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&partial);
            release();
            return Err(e);
        }
        let run = match backend.open(&placed.join("run"), memory) {
            Ok(run) => run,
            Err(e) => {
                let _ = remove_registered(&self.dir, name);
                release();
                return Err(embedding_error(e));
            }
        };
        if let Some(r) = resident {
            r.adjust(Kind::Embedding, name, bytes, run.info().resident_bytes);
        }
        Ok(self.insert(name.to_string(), json, run))
    }

    /// Unregisters `name` and deletes its served copy (the source run is untouched); its
    /// resident bytes go back to `resident`. Queries already holding the run finish on it.
    pub fn unregister(&self, name: &str, resident: Option<&Resident>) -> Result<()> {
        self.runs.write().unwrap().remove(name).ok_or_else(|| {
            ServeError::NotFound(format!("embedding run '{name}' is not registered"))
        })?;
        if let Some(r) = resident {
            r.release(Kind::Embedding, name);
        }
        remove_registered(&self.dir, name)
    }
}

/// Refuses a `run_path` that is not a run directory (`NOT_FOUND`, naming it).
fn check_run_dir(source: &Path) -> Result<()> {
    if source.join("run.json").is_file() {
        Ok(())
    } else {
        Err(ServeError::NotFound(format!(
            "run_path: {} is not a run directory of `strata embed train` (no run.json)",
            source.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_cache::PageCache;
    use strata_graph::embedding_run::{EmbeddingResult, LinkQuery, Ranked};
    use strata_io::progress::Progress;

    /// A backend whose runs hold `BYTES` (or refuse less than 1 MiB) and answer nothing; its
    /// snapshot is a directory with a `run.json`.
    struct Fake;

    const BYTES: u64 = 4 << 20;

    struct FakeRun(RunInfo);

    impl EmbeddingBackend for Fake {
        fn snapshot(&self, source: &Path, checkpoint: &str, dest: &Path) -> EmbeddingResult<()> {
            std::fs::create_dir(dest).unwrap();
            std::fs::copy(source.join("run.json"), dest.join("run.json")).unwrap();
            std::fs::write(dest.join("checkpoint"), checkpoint).unwrap();
            Ok(())
        }

        fn resident_bytes(&self, _dir: &Path, memory: Option<u64>) -> EmbeddingResult<u64> {
            match memory {
                Some(m) if m < 1 << 20 => {
                    Err(EmbeddingError::Budget(format!("{m} is below the minimum")))
                }
                Some(m) => Ok(m.min(BYTES)),
                None => Ok(BYTES),
            }
        }

        fn open(&self, dir: &Path, memory: Option<u64>) -> EmbeddingResult<Box<dyn EmbeddingRun>> {
            assert!(dir.join("checkpoint").is_file(), "opens the snapshot");
            Ok(Box::new(FakeRun(RunInfo {
                store: "s".into(),
                epoch: 3,
                model: "dot".into(),
                dim: 4,
                num_nodes: 10,
                num_relations: 1,
                partitions: 1,
                resident_partitions: 1,
                table_bytes: 160,
                resident_bytes: self.resident_bytes(dir, memory)?,
            })))
        }
    }

    impl EmbeddingRun for FakeRun {
        fn info(&self) -> &RunInfo {
            &self.0
        }
        fn node_ids(&self, _: &str, _: &[String]) -> EmbeddingResult<Vec<u64>> {
            Ok(vec![])
        }
        fn relation_ids(&self, _: &[String]) -> EmbeddingResult<Vec<u32>> {
            Ok(vec![])
        }
        fn node_names(&self, _: &[u64]) -> EmbeddingResult<Vec<String>> {
            Ok(vec![])
        }
        fn top_k(
            &mut self,
            _: &[LinkQuery],
            _: usize,
            _: bool,
            _: &dyn Progress,
        ) -> EmbeddingResult<Vec<Vec<Ranked>>> {
            Ok(vec![])
        }
        fn score(&mut self, _: &[(u64, u32, u64)], _: &dyn Progress) -> EmbeddingResult<Vec<f32>> {
            Ok(vec![])
        }
        fn neighbors(
            &mut self,
            _: &[u64],
            _: usize,
            _: &str,
            _: bool,
            _: &dyn Progress,
        ) -> EmbeddingResult<(String, Vec<Vec<Ranked>>)> {
            Ok((String::new(), vec![]))
        }
    }

    fn source() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("run.json"), "{}").unwrap();
        d
    }

    #[test]
    fn a_registration_takes_its_bytes_survives_a_reopen_and_unregisters() {
        let state = tempfile::tempdir().unwrap();
        let run = source();
        let cache = Arc::new(PageCache::new(64 << 20));
        let resident = Resident::new(Arc::clone(&cache), BTreeMap::new());
        let e = Embeddings::open(state.path(), Some(Arc::new(Fake))).unwrap();
        let r = e
            .register("r1", run.path(), "last", None, Some(&resident))
            .unwrap();
        assert_eq!((r.info.epoch, r.json.checkpoint.as_str()), (3, "last"));
        assert_eq!(cache.capacity_bytes(), (64 << 20) - BYTES);
        let placed = state.path().join("embeddings/r1");
        assert!(placed.join("embedding.json").is_file() && placed.join("run/run.json").is_file());
        let dup = e.register("r1", run.path(), "", None, Some(&resident));
        assert!(matches!(dup, Err(ServeError::AlreadyExists(_))));
        drop(e);
        let again = Embeddings::open(state.path(), Some(Arc::new(Fake))).unwrap();
        assert_eq!(again.held_bytes(), vec![("r1".to_string(), BYTES)]);
        assert_eq!(
            again.get("r1").unwrap().json.source,
            run.path().canonicalize().unwrap()
        );
        let resident = Resident::new(
            Arc::clone(&cache),
            [((Kind::Embedding, "r1".into()), BYTES)].into(),
        );
        again.unregister("r1", Some(&resident)).unwrap();
        assert_eq!(cache.capacity_bytes(), 64 << 20);
        assert!(!placed.exists() && again.list().is_empty());
        assert!(matches!(again.get("r1"), Err(ServeError::NotFound(_))));
    }

    #[test]
    fn refused_registrations_leave_nothing_behind() {
        let state = tempfile::tempdir().unwrap();
        let run = source();
        let cache = Arc::new(PageCache::new(3 << 20));
        let resident = Resident::new(Arc::clone(&cache), BTreeMap::new());
        let e = Embeddings::open(state.path(), Some(Arc::new(Fake))).unwrap();
        let small = e.register("a", run.path(), "", Some(1000), Some(&resident));
        assert!(matches!(small, Err(ServeError::ResourceExhausted(m)) if m.contains("minimum")));
        let big = e.register("b", run.path(), "", None, Some(&resident));
        assert!(
            matches!(big, Err(ServeError::ResourceExhausted(m)) if m.contains("embedding run 'b' needs"))
        );
        let missing = e.register("c", &state.path().join("nope"), "", None, Some(&resident));
        assert!(matches!(missing, Err(ServeError::NotFound(m)) if m.contains("no run.json")));
        assert_eq!(cache.capacity_bytes(), 3 << 20);
        assert_eq!(
            std::fs::read_dir(state.path().join("embeddings"))
                .unwrap()
                .count(),
            0
        );
        let fits = e
            .register("d", run.path(), "", Some(1 << 20), Some(&resident))
            .unwrap();
        assert_eq!(fits.info.resident_bytes, 1 << 20);
    }

    #[test]
    fn without_a_backend_runs_are_refused() {
        let state = tempfile::tempdir().unwrap();
        let run = source();
        let e = Embeddings::open(state.path(), None).unwrap();
        let r = e.register("r", run.path(), "", None, None);
        assert!(
            matches!(r, Err(ServeError::FailedPrecondition(m)) if m.contains("without an embedding backend"))
        );
        Embeddings::open(state.path(), Some(Arc::new(Fake)))
            .unwrap()
            .register("r", run.path(), "", None, None)
            .unwrap();
        let reopened = Embeddings::open(state.path(), None);
        assert!(
            matches!(reopened, Err(ServeError::FailedPrecondition(m)) if m.contains("embedding run 'r'"))
        );
    }
}
