//! A served graph: a store version, the mutations acknowledged since (in the write-ahead log
//! and in memory as an overlay), and the fold that turns them into the next version.
//!
//! On disk, under the server's state directory:
//!
//! ```text
//! graphs/NAME/graph.json     what was registered, and how
//! graphs/NAME/CURRENT        {"version": K, "checkpoint_lsn": L}, replaced atomically
//! graphs/NAME/vK/            store version K: a complete Strata store
//! graphs/NAME/wal/           log records; those after L are replayed on start
//! ```
//!
//! A mutation is checked, appended to the log and synced, applied to the overlay, and only
//! then acknowledged. A fold writes base + overlay as version K+1, points CURRENT at it with
//! the log position it covers, and then drops the log segments it made redundant; a crash
//! at any point leaves CURRENT naming a complete version and a log holding everything after it.

pub mod features;
pub mod layer;
pub mod mutation;
pub mod overlay;
pub mod register;
pub mod version;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use strata_graph::feature_store::read_at;
use strata_graph::FeatureStore;
use strata_io::durable::replace_file;

use crate::commit::{Commit, GroupLog, Staging};
use crate::durable::sync_dir;
use crate::error::{Result, ServeError};
use crate::page_cache::PageCache;
use crate::wal::Wal;
use features::GraphFeatures;
use layer::{Layer, View};
use mutation::Mutation;
use overlay::Overlay;
use strata_graph::order::glist::ReorderParams;
use version::{write_version, Version, VersionMeta, VersionSource};

const CURRENT: &str = "CURRENT";
const GRAPH_JSON: &str = "graph.json";

/// `graph.json`: how the graph was registered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GraphMeta {
    pub name: String,
    pub source_path: String,
    pub reordered: bool,
    pub reorder_centers: usize,
    pub reorder_covered: usize,
}

/// `CURRENT`: the version to serve and the last log record it contains.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Current {
    version: u64,
    checkpoint_lsn: u64,
}

/// A change as a client asks for it, in store ids.
#[derive(Debug, Clone)]
pub enum Change {
    /// `count` new vertices with their rows (`count * feature_dim` values).
    AddVertices {
        count: usize,
        features: Vec<f32>,
    },
    RemoveVertices {
        ids: Vec<u64>,
    },
    UpdateVertices {
        ids: Vec<u64>,
        features: Vec<f32>,
    },
    AddEdges {
        src: Vec<u64>,
        dst: Vec<u64>,
    },
    RemoveEdges {
        src: Vec<u64>,
        dst: Vec<u64>,
    },
}

impl Change {
    /// How many ids it names or hands out (what `--max-ids` bounds).
    pub fn ids(&self) -> usize {
        match self {
            Change::AddVertices { count, .. } => *count,
            Change::RemoveVertices { ids } | Change::UpdateVertices { ids, .. } => ids.len(),
            Change::AddEdges { src, .. } | Change::RemoveEdges { src, .. } => src.len(),
        }
    }
}

/// An acknowledged change.
#[derive(Debug, Clone)]
pub struct Applied {
    pub applied: u64,
    /// Log sequence number of the record that made it durable.
    pub lsn: u64,
    /// Store ids of added vertices.
    pub new_ids: Vec<u64>,
}

/// A snapshot of a graph's counters.
#[derive(Debug, Clone)]
pub struct GraphStatus {
    pub meta: GraphMeta,
    pub num_nodes: u64,
    pub live_nodes: u64,
    pub num_edges: u64,
    pub feature_dim: usize,
    pub num_classes: u64,
    pub version: u64,
    pub last_lsn: u64,
    pub pending_log_records: u64,
}

struct State {
    version: Arc<Version>,
    overlay: Overlay,
    /// Internal id of each store id of the registered range.
    internal_of_external: Vec<u32>,
    last_lsn: u64,
    checkpoint_lsn: u64,
}

/// The writer side of a graph: mutations staged in the log but not yet on disk (so not yet
/// visible to readers), in lsn order, and the layer they lead to over the overlay, which the
/// next mutation is checked against.
struct Staged {
    queue: VecDeque<Mutation>,
    pending: Layer,
}

/// One registered graph. Readers share the state; mutations are checked and staged in order
/// under the log's lock and flushed in groups (`commit`), and a mutation becomes visible once
/// its group is on disk.
pub struct ServedGraph {
    pub meta: GraphMeta,
    /// Unique in this process, so caches never confuse two registrations of one name.
    pub uid: u64,
    dir: PathBuf,
    /// Shared with the log's flusher, which applies each flushed group ([`Publish`]).
    state: Arc<RwLock<State>>,
    log: GroupLog<Staged>,
    /// Only one fold at a time.
    folding: Mutex<()>,
    /// Bumped by every applied mutation: cached embeddings of an older epoch are stale.
    epoch: Arc<AtomicU64>,
}

impl ServedGraph {
    /// Registers `source` as `name` under `graphs_dir`: writes the first version in a hidden
    /// directory and renames it into place, so a crash never leaves a half-registered graph.
    pub fn register(
        graphs_dir: &Path,
        name: &str,
        source: &Path,
        reorder: Option<&ReorderParams>,
    ) -> Result<ServedGraph> {
        let dir = graphs_dir.join(name);
        if dir.exists() {
            return Err(ServeError::AlreadyExists(format!(
                "graph '{name}' is already registered"
            )));
        }
        let partial = graphs_dir.join(format!(".partial-{name}"));
        if partial.exists() {
            std::fs::remove_dir_all(&partial)
                .map_err(|e| ServeError::io(partial.display().to_string(), e))?;
        }
        std::fs::create_dir_all(&partial)
            .map_err(|e| ServeError::io(partial.display().to_string(), e))?;
        let result = (|| {
            let reg = register::register(source, &partial.join(version_dir(1)), name, reorder)?;
            let meta = GraphMeta {
                name: name.to_string(),
                source_path: source.display().to_string(),
                reordered: reg.reordered,
                reorder_centers: reg.centers,
                reorder_covered: reg.covered,
            };
            let path = partial.join(GRAPH_JSON);
            replace_file(&path, &serde_json::to_vec_pretty(&meta).unwrap())
                .map_err(|e| ServeError::io(format!("write {}", path.display()), e))?;
            let current = Current {
                version: 1,
                checkpoint_lsn: 0,
            };
            let path = partial.join(CURRENT);
            replace_file(&path, &serde_json::to_vec(&current).unwrap())
                .map_err(|e| ServeError::io(format!("write {}", path.display()), e))?;
            std::fs::rename(&partial, &dir)
                .map_err(|e| ServeError::io(dir.display().to_string(), e))?;
            sync_dir(graphs_dir)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(e);
        }
        ServedGraph::open(&dir)
    }

    /// Opens a registered graph: the version CURRENT names, plus every log record after it.
    /// Versions CURRENT does not name (a fold that crashed before switching) are removed.
    pub fn open(dir: &Path) -> Result<ServedGraph> {
        let read =
            |p: &Path| std::fs::read(p).map_err(|e| ServeError::io(p.display().to_string(), e));
        let meta: GraphMeta =
            serde_json::from_slice(&read(&dir.join(GRAPH_JSON))?).map_err(|e| {
                ServeError::FailedPrecondition(format!("{}: {e}", dir.join(GRAPH_JSON).display()))
            })?;
        let current: Current = serde_json::from_slice(&read(&dir.join(CURRENT))?).map_err(|e| {
            ServeError::FailedPrecondition(format!("{}: {e}", dir.join(CURRENT).display()))
        })?;
        remove_other_versions(dir, current.version)?;
        let version = Version::open(&dir.join(version_dir(current.version)), current.version)?;
        let (wal, replay) = Wal::open(&dir.join("wal"), current.checkpoint_lsn)?;
        let mut internal_of_external = vec![u32::MAX; version.external_ids.len()];
        for (int, &ext) in version.external_ids.iter().enumerate() {
            internal_of_external[ext as usize] = int as u32;
        }
        let mut overlay = Overlay {
            frozen: Vec::new(),
            active: Layer::starting_at(
                version.graph.num_nodes(),
                version.live_nodes,
                version.graph.csc.num_edges(),
            ),
        };
        let mut last_lsn = current.checkpoint_lsn;
        for (lsn, payload) in &replay.records {
            let m = Mutation::decode(payload)?;
            overlay.apply(&version, &m)?;
            last_lsn = *lsn;
        }
        static NEXT_UID: AtomicU64 = AtomicU64::new(1);
        let staged = Staged {
            queue: VecDeque::new(),
            pending: overlay.next_layer(),
        };
        let state = Arc::new(RwLock::new(State {
            version: Arc::new(version),
            overlay,
            internal_of_external,
            last_lsn,
            checkpoint_lsn: current.checkpoint_lsn,
        }));
        let epoch = Arc::new(AtomicU64::new(0));
        let publish = Publish {
            state: Arc::clone(&state),
            epoch: Arc::clone(&epoch),
        };
        Ok(ServedGraph {
            meta,
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            dir: dir.to_path_buf(),
            state,
            log: GroupLog::new(wal, staged, publish),
            folding: Mutex::new(()),
            epoch,
        })
    }

    /// The directory holding the graph's versions and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Changes with every mutation; embeddings computed in another epoch may be stale.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn status(&self) -> GraphStatus {
        let st = self.state.read().unwrap();
        let pending = st.last_lsn - st.checkpoint_lsn;
        let v = &st.version;
        st.overlay.view(&v.graph, v.live_nodes, |view| GraphStatus {
            meta: self.meta.clone(),
            num_nodes: view.num_nodes() as u64,
            live_nodes: view.live_nodes(),
            num_edges: view.num_edges(),
            feature_dim: v.feature_dim,
            num_classes: v.num_classes,
            version: v.number,
            last_lsn: st.last_lsn,
            pending_log_records: pending,
        })
    }

    /// Page-cache id of the current version's feature file.
    pub fn features_file_id(&self) -> u64 {
        self.state.read().unwrap().version.features.file_id()
    }

    pub fn feature_dim(&self) -> usize {
        self.state.read().unwrap().version.feature_dim
    }

    pub fn num_classes(&self) -> u64 {
        self.state.read().unwrap().version.num_classes
    }

    /// Internal ids of live vertices `ids` (store ids); `what` names the field in errors.
    pub fn to_internal(&self, ids: &[u64], what: &str) -> Result<Vec<u32>> {
        let st = self.state.read().unwrap();
        let v = &st.version;
        st.overlay.view(&v.graph, v.live_nodes, |view| {
            resolve(&st, &view, ids, what)
        })
    }

    /// Store ids of internal ids.
    pub fn to_external(&self, ids: &[u32]) -> Vec<u64> {
        let st = self.state.read().unwrap();
        let ext = &st.version.external_ids;
        ids.iter()
            .map(|&i| ext.get(i as usize).map_or(i as u64, |&e| e as u64))
            .collect()
    }

    /// Calls `f` with a consistent view of the graph (under the read lock: keep it short).
    pub fn with_view<R>(&self, f: impl FnOnce(&View<'_>) -> R) -> R {
        let st = self.state.read().unwrap();
        let v = &st.version;
        st.overlay.view(&v.graph, v.live_nodes, |view| f(&view))
    }

    /// Feature rows of internal ids `ids` into `out` (`ids.len() * feature_dim` little-endian
    /// f32, as bytes), rows a mutation wrote from memory and the rest from the version's file
    /// through `cache`. Returns the bytes read from disk.
    pub fn gather(&self, cache: &PageCache, ids: &[u32], out: &mut [u8]) -> Result<u64> {
        // The rows in memory under the lock, the file's outside it: a disk read must not hold
        // up the writers.
        let (version, from_file) = {
            let st = self.state.read().unwrap();
            let v = &st.version;
            let from_file = st.overlay.view(&v.graph, v.live_nodes, |view| {
                GraphFeatures::reading(view, v.feature_rows(cache)).read_written(ids, out)
            })?;
            (Arc::clone(v), from_file)
        };
        // No row in memory (the common case) reads straight into `out`.
        Ok(read_at(&version.feature_rows(cache), ids, &from_file, out)?)
    }

    /// Checks `change` against the graph with every earlier mutation (staged ones included)
    /// and stages it in the log. It is acknowledged once the returned [`Pending`] resolves: a
    /// group flush has put it on disk and it is applied (visible to readers).
    pub fn stage(&self, change: &Change) -> Result<Pending<Applied>> {
        self.stage_record(
            |st, view, _| check(st, view, change).map(|(m, applied, ids)| (m, (applied, ids))),
            |lsn, (applied, new_ids)| Applied {
                applied,
                lsn,
                new_ids,
            },
        )
    }

    /// Stages `changes` as one log record (see [`Mutation::Batch`]), all or nothing: each is
    /// checked against the graph as the earlier ones of the batch leave it, and the first that
    /// fails refuses the whole batch with its error (its kind, so its status code), the
    /// message starting `mutations[i]`. Resolves to one [`Applied`] per change, in order, all
    /// with the batch's lsn. An empty batch is refused (there is nothing to acknowledge).
    pub fn stage_batch(&self, changes: &[Change]) -> Result<Pending<Vec<Applied>>> {
        if changes.is_empty() {
            return Err(ServeError::InvalidArgument(
                "mutations: empty; give at least one".into(),
            ));
        }
        self.stage_record(
            |st, view, w| {
                let v = &st.version;
                // The batch's own changes so far, over the staged ones: what the next is
                // checked against. The last one's changes are never looked at, so not made.
                let mut scratch =
                    Layer::starting_at(view.num_nodes(), view.live_nodes(), view.num_edges());
                let mut ms = Vec::with_capacity(changes.len());
                let mut done = Vec::with_capacity(changes.len());
                for (i, change) in changes.iter().enumerate() {
                    let (m, applied, new_ids) = st
                        .overlay
                        .view_under(&[&scratch, &w.pending], &v.graph, v.live_nodes, |view| {
                            check(st, &view, change)
                        })
                        .map_err(|e| e.within(&format!("mutations[{i}]")))?;
                    if i + 1 < changes.len() {
                        st.overlay
                            .apply_over(&mut scratch, &[&w.pending], v, &m)
                            .expect("a checked mutation fits the graph it was checked against");
                    }
                    ms.push(m);
                    done.push((applied, new_ids));
                }
                Ok((Mutation::Batch(ms), done))
            },
            |lsn, done| {
                done.into_iter()
                    .map(|(applied, new_ids)| Applied {
                        applied,
                        lsn,
                        new_ids,
                    })
                    .collect()
            },
        )
    }

    /// Stages one log record: `check` turns the graph (with the staged mutations, through
    /// `view`) into the record's mutation and what checking it found, under the log's lock;
    /// the mutation then goes onto the staged layer and queue, and `ack` makes the
    /// acknowledgement from the record's lsn and what `check` found.
    fn stage_record<F, T>(
        &self,
        check: impl FnOnce(&State, &View<'_>, &Staged) -> Result<(Mutation, F)>,
        ack: impl FnOnce(u64, F) -> T,
    ) -> Result<Pending<T>> {
        let commit = self.log.stage(
            |w| {
                let st = self.state.read().unwrap();
                let v = &st.version;
                let (m, found) =
                    st.overlay
                        .view_under(&[&w.pending], &v.graph, v.live_nodes, |view| {
                            check(&st, &view, w)
                        })?;
                Ok((m.encode(), (m, found)))
            },
            |w, lsn, (m, found)| {
                let st = self.state.read().unwrap();
                let v = &st.version;
                st.overlay
                    .apply_over(&mut w.pending, &[], v, &m)
                    .expect("a checked mutation fits the graph it was checked against");
                w.queue.push_back(m);
                ack(lsn, found)
            },
        )?;
        Ok(Pending(commit))
    }

    /// [`ServedGraph::stage`], then blocks the thread until the mutation is acknowledged.
    pub fn mutate(&self, change: &Change) -> Result<Applied> {
        self.stage(change)?.wait()
    }

    /// Acknowledged mutations not yet in a store version.
    pub fn pending_log_records(&self) -> u64 {
        let st = self.state.read().unwrap();
        st.last_lsn - st.checkpoint_lsn
    }

    /// Folds every mutation acknowledged so far into a new store version (readers and writers
    /// go on meanwhile); returns false when there was nothing to fold. `on_retire` gets the old
    /// version once nothing new will read it, to drop its cached pages.
    pub fn fold(&self, on_retire: impl FnOnce(&Version)) -> Result<bool> {
        let _one = self.folding.lock().unwrap();
        // With no flush under way, everything on disk is applied: the rotation's boundary is
        // exactly what the frozen layers hold, and staged records go to the new segment.
        let frozen = self.log.with_wal(|wal, _| {
            let mut st = self.state.write().unwrap();
            if st.last_lsn == st.checkpoint_lsn {
                return Ok(None);
            }
            let boundary = wal.rotate()?;
            debug_assert_eq!(boundary, st.last_lsn);
            let fresh = st.overlay.next_layer();
            let frozen = std::mem::replace(&mut st.overlay.active, fresh);
            st.overlay.frozen.insert(0, Arc::new(frozen));
            Ok::<_, ServeError>(Some((
                Arc::clone(&st.version),
                st.overlay.frozen.clone(),
                boundary,
            )))
        })?;
        let Some((version, layers, boundary)) = frozen else {
            return Ok(false);
        };
        let next = version.number + 1;
        let path = self.dir.join(version_dir(next));
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .map_err(|e| ServeError::io(path.display().to_string(), e))?;
        }
        let refs: Vec<&Layer> = layers.iter().map(Arc::as_ref).collect();
        let source = Folded {
            view: View::new(&version.graph, &refs, version.live_nodes),
            version: &version,
        };
        let meta = VersionMeta {
            name: &self.meta.name,
            feature_dim: version.feature_dim,
            num_classes: version.labels.as_ref().map(|_| version.num_classes),
            external_ids: &version.external_ids,
            provenance: serde_json::json!({"served_graph": self.meta.name, "folded_through_lsn": boundary}),
        };
        write_version(&path, &source, &meta)?;
        let new_version = Arc::new(Version::open(&path, next)?);
        let current = Current {
            version: next,
            checkpoint_lsn: boundary,
        };
        let current_path = self.dir.join(CURRENT);
        replace_file(&current_path, &serde_json::to_vec(&current).unwrap())
            .map_err(|e| ServeError::io(format!("write {}", current_path.display()), e))?;
        {
            let mut st = self.state.write().unwrap();
            st.version = new_version;
            let keep = st.overlay.frozen.len() - layers.len();
            st.overlay.frozen.truncate(keep);
            st.checkpoint_lsn = boundary;
        }
        self.log.with_wal(|wal, _| wal.drop_through(boundary))?;
        on_retire(&version);
        let old = version.path.clone();
        drop(version);
        std::fs::remove_dir_all(&old).map_err(|e| ServeError::io(old.display().to_string(), e))?;
        Ok(true)
    }
}

/// A staged mutation or batch (see [`ServedGraph::stage`]); resolves to its acknowledgement.
#[must_use = "a staged mutation is not acknowledged until it is waited for"]
pub struct Pending<T>(Commit<T>);

impl<T> Pending<T> {
    /// Waits, holding no thread, until the mutation is on disk and applied.
    pub async fn applied(self) -> Result<T> {
        self.0.durable().await.map(|(_, t)| t)
    }

    /// [`Pending::applied`] for a thread outside the async runtime: blocks it until then.
    pub fn wait(self) -> Result<T> {
        self.0.wait().map(|(_, t)| t)
    }
}

/// What the log's flusher does with each group: makes it visible to readers.
struct Publish {
    state: Arc<RwLock<State>>,
    epoch: Arc<AtomicU64>,
}

impl Staging<Staged> for Publish {
    /// Applies the mutations of a flushed group, in order, and rebuilds the pending layer from
    /// those still staged (a group's worth at most), so it never grows beyond them.
    fn durable(&self, w: &mut Staged, through: u64) {
        let mut st = self.state.write().unwrap();
        let version = Arc::clone(&st.version);
        let count = (through - st.last_lsn) as usize;
        for m in w.queue.drain(..count) {
            st.overlay
                .apply(&version, &m)
                .expect("a staged mutation fits the graph it was checked against");
        }
        st.last_lsn = through;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        w.pending = st.overlay.next_layer();
        for m in &w.queue {
            st.overlay
                .apply_over(&mut w.pending, &[], &version, m)
                .expect("a staged mutation fits the graph it was checked against");
        }
    }

    /// Forgets every staged mutation: none of them reached the disk.
    fn discarded(&self, w: &mut Staged, _durable: u64) {
        w.queue.clear();
        w.pending = self.state.read().unwrap().overlay.next_layer();
    }
}

/// A version and the frozen layers over it, as the next version's source.
struct Folded<'a> {
    view: View<'a>,
    version: &'a Version,
}

impl VersionSource for Folded<'_> {
    fn num_nodes(&self) -> u32 {
        self.view.num_nodes()
    }

    fn in_neighbors(&self, v: u32) -> &[u32] {
        self.view.in_neighbors(v)
    }

    fn out_neighbors(&self, v: u32) -> &[u32] {
        self.view.out_neighbors(v)
    }

    fn is_removed(&self, v: u32) -> bool {
        self.view.is_removed(v)
    }

    fn read_features(&self, first: u32, out: &mut [f32]) -> Result<()> {
        let ids: Vec<u32> =
            (first..first + (out.len() / self.version.feature_dim) as u32).collect();
        // Read around the page cache: a fold must not evict the pages requests are using.
        let rows = self.version.feature_rows(&self.version.direct);
        GraphFeatures::reading(self.view, rows).read(&ids, bytemuck::cast_slice_mut(out))?;
        Ok(())
    }

    fn label(&self, v: u32) -> i32 {
        self.version
            .labels
            .as_ref()
            .and_then(|l| l.get(v as usize).copied())
            .unwrap_or(-1)
    }
}

fn version_dir(version: u64) -> String {
    format!("v{version:08}")
}

/// Removes version directories other than `keep` (and partial ones from a crashed fold).
fn remove_other_versions(dir: &Path, keep: u64) -> Result<()> {
    let keep_name = version_dir(keep);
    let entries =
        std::fs::read_dir(dir).map_err(|e| ServeError::io(dir.display().to_string(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ServeError::io(dir.display().to_string(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_version = name.starts_with('v')
            && name.len() >= 9
            && name[1..9].bytes().all(|b| b.is_ascii_digit());
        if is_version && name != keep_name {
            let p = entry.path();
            std::fs::remove_dir_all(&p).map_err(|e| ServeError::io(p.display().to_string(), e))?;
        }
    }
    Ok(())
}

/// Internal ids of store ids `ids`, each live; `what` names the field in errors.
fn resolve(st: &State, view: &View<'_>, ids: &[u64], what: &str) -> Result<Vec<u32>> {
    let n = view.num_nodes() as u64;
    ids.iter()
        .map(|&ext| {
            if ext >= n {
                return Err(ServeError::InvalidArgument(format!(
                    "{what}: vertex {ext} is out of range (the graph has ids 0..{n})"
                )));
            }
            let int = match st.internal_of_external.get(ext as usize) {
                Some(&i) => i,
                None => ext as u32,
            };
            if view.is_removed(int) {
                return Err(ServeError::NotFound(format!(
                    "{what}: vertex {ext} was removed"
                )));
            }
            Ok(int)
        })
        .collect()
}

/// Checks a change against the graph and turns it into a log record; returns the record,
/// how many items it applies and the ids it hands out.
fn check(st: &State, view: &View<'_>, change: &Change) -> Result<(Mutation, u64, Vec<u64>)> {
    let dim = st.version.feature_dim;
    let rows = |features: &[f32], count: usize, what: &str| {
        if features.len() != count * dim {
            return Err(ServeError::InvalidArgument(format!(
                "{what}: {} values for {count} vertices; expected {count} x {dim} (the graph's feature width)",
                features.len()
            )));
        }
        if let Some(i) = features.iter().position(|x| !x.is_finite()) {
            return Err(ServeError::InvalidArgument(format!(
                "{what}: value {i} is {}; features must be finite",
                features[i]
            )));
        }
        Ok(())
    };
    let pairs = |src: &[u64], dst: &[u64]| {
        if src.len() != dst.len() {
            return Err(ServeError::InvalidArgument(format!(
                "src has {} ids but dst has {}; they must pair up",
                src.len(),
                dst.len()
            )));
        }
        Ok((
            resolve(st, view, src, "src")?,
            resolve(st, view, dst, "dst")?,
        ))
    };
    let distinct = |ids: &[u32], ext: &[u64]| {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        match ids.iter().position(|i| !seen.insert(*i)) {
            Some(p) => Err(ServeError::InvalidArgument(format!(
                "ids: vertex {} appears twice",
                ext[p]
            ))),
            None => Ok(()),
        }
    };
    Ok(match change {
        Change::AddVertices { count, features } => {
            rows(features, *count, "features")?;
            let first = view.num_nodes();
            if *count == 0 || first as u64 + *count as u64 >= u32::MAX as u64 {
                return Err(ServeError::InvalidArgument(format!(
                    "features: {count} new vertices; expected at least 1, and at most {} in all",
                    u32::MAX - 1
                )));
            }
            let new_ids = (first as u64..first as u64 + *count as u64).collect();
            let m = Mutation::AddVertices {
                first,
                count: *count as u32,
                features: features.clone(),
            };
            (m, *count as u64, new_ids)
        }
        Change::RemoveVertices { ids } => {
            let int = resolve(st, view, ids, "ids")?;
            distinct(&int, ids)?;
            (
                Mutation::RemoveVertices { ids: int },
                ids.len() as u64,
                Vec::new(),
            )
        }
        Change::UpdateVertices { ids, features } => {
            let int = resolve(st, view, ids, "ids")?;
            distinct(&int, ids)?;
            rows(features, ids.len(), "features")?;
            let m = Mutation::UpdateVertices {
                ids: int,
                features: features.clone(),
            };
            (m, ids.len() as u64, Vec::new())
        }
        Change::AddEdges { src, dst } => {
            let (s, d) = pairs(src, dst)?;
            (
                Mutation::AddEdges { src: s, dst: d },
                src.len() as u64,
                Vec::new(),
            )
        }
        Change::RemoveEdges { src, dst } => {
            let (s, d) = pairs(src, dst)?;
            for (i, (&u, &v)) in s.iter().zip(&d).enumerate() {
                if !view.in_neighbors(v).contains(&u) {
                    return Err(ServeError::NotFound(format!(
                        "edge {} -> {} does not exist",
                        src[i], dst[i]
                    )));
                }
            }
            (
                Mutation::RemoveEdges { src: s, dst: d },
                src.len() as u64,
                Vec::new(),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small graph to register: adjacency lists (in-neighbours), features `[v, v + 0.5]`.
    struct Lists {
        ins: Vec<Vec<u32>>,
        outs: Vec<Vec<u32>>,
    }

    impl Lists {
        fn new(n: u32, edges: &[(u32, u32)]) -> Lists {
            let mut ins = vec![Vec::new(); n as usize];
            let mut outs = vec![Vec::new(); n as usize];
            for &(u, v) in edges {
                ins[v as usize].push(u);
                outs[u as usize].push(v);
            }
            Lists { ins, outs }
        }
    }

    impl VersionSource for Lists {
        fn num_nodes(&self) -> u32 {
            self.ins.len() as u32
        }
        fn in_neighbors(&self, v: u32) -> &[u32] {
            &self.ins[v as usize]
        }
        fn out_neighbors(&self, v: u32) -> &[u32] {
            &self.outs[v as usize]
        }
        fn is_removed(&self, _v: u32) -> bool {
            false
        }
        fn read_features(&self, first: u32, out: &mut [f32]) -> Result<()> {
            for (i, row) in out.chunks_mut(2).enumerate() {
                let v = (first as usize + i) as f32;
                row.copy_from_slice(&[v, v + 0.5]);
            }
            Ok(())
        }
        fn label(&self, v: u32) -> i32 {
            v as i32 % 3
        }
    }

    const EDGES: &[(u32, u32)] = &[(0, 1), (1, 2), (2, 0), (3, 2), (4, 4), (5, 0), (0, 5)];

    /// Writes [`Lists`] of `n` vertices and `edges` as a store at `path`: 3 classes, rows
    /// `[v, v + 0.5]`.
    pub(super) fn write_lists(path: &Path, n: u32, edges: &[(u32, u32)]) {
        let ids: Vec<u32> = (0..n).collect();
        let meta = VersionMeta {
            name: "src",
            feature_dim: 2,
            num_classes: Some(3),
            external_ids: &ids,
            provenance: serde_json::Value::Null,
        };
        write_version(path, &Lists::new(n, edges), &meta).unwrap();
    }

    fn setup(reorder: bool) -> (tempfile::TempDir, ServedGraph) {
        let dir = tempfile::tempdir().unwrap();
        write_lists(&dir.path().join("src.strata"), 8, EDGES);
        let graphs = dir.path().join("graphs");
        std::fs::create_dir_all(&graphs).unwrap();
        let params = ReorderParams::default();
        let g = ServedGraph::register(
            &graphs,
            "g",
            &dir.path().join("src.strata"),
            reorder.then_some(&params),
        )
        .unwrap();
        (dir, g)
    }

    /// Store ids of the in-neighbours of store id `v`, sorted.
    fn ins(g: &ServedGraph, v: u64) -> Vec<u64> {
        let int = g.to_internal(&[v], "v").unwrap()[0];
        let list = g.with_view(|view| view.in_neighbors(int).to_vec());
        let mut ext = g.to_external(&list);
        ext.sort();
        ext
    }

    fn features(g: &ServedGraph, ids: &[u64]) -> Vec<f32> {
        let int = g.to_internal(ids, "ids").unwrap();
        let mut out = vec![0f32; ids.len() * 2];
        g.gather(
            &PageCache::new(1 << 20),
            &int,
            bytemuck::cast_slice_mut(&mut out),
        )
        .unwrap();
        out
    }

    /// Every check a client could make, as one comparable value.
    fn snapshot(g: &ServedGraph) -> (u64, u64, u64, Vec<Vec<u64>>, Vec<f32>) {
        let s = g.status();
        let live: Vec<u64> = (0..s.num_nodes)
            .filter(|&v| g.to_internal(&[v], "v").is_ok())
            .collect();
        let lists = live.iter().map(|&v| ins(g, v)).collect();
        (
            s.num_nodes,
            s.live_nodes,
            s.num_edges,
            lists,
            features(g, &live),
        )
    }

    fn mutate_a_lot(g: &ServedGraph) {
        let added = g
            .mutate(&Change::AddVertices {
                count: 2,
                features: vec![10.0, 10.5, 11.0, 11.5],
            })
            .unwrap();
        assert_eq!(added.new_ids, vec![8, 9]);
        g.mutate(&Change::AddEdges {
            src: vec![8, 9, 3],
            dst: vec![1, 8, 9],
        })
        .unwrap();
        g.mutate(&Change::RemoveEdges {
            src: vec![1],
            dst: vec![2],
        })
        .unwrap();
        g.mutate(&Change::UpdateVertices {
            ids: vec![3],
            features: vec![-1.0, -2.0],
        })
        .unwrap();
        g.mutate(&Change::RemoveVertices { ids: vec![0] }).unwrap();
    }

    #[test]
    fn mutations_apply_and_survive_a_restart() {
        for reorder in [false, true] {
            let (_dir, g) = setup(reorder);
            assert_eq!(ins(&g, 2), vec![1, 3]);
            mutate_a_lot(&g);
            // Removing 0 took (0,1), (2,0), (5,0), (0,5) with it.
            assert_eq!(ins(&g, 1), vec![8]);
            assert_eq!(ins(&g, 2), vec![3]);
            assert_eq!(ins(&g, 5), Vec::<u64>::new());
            assert_eq!(ins(&g, 9), vec![3]);
            assert_eq!(
                features(&g, &[3, 9, 7]),
                vec![-1.0, -2.0, 11.0, 11.5, 7.0, 7.5]
            );
            let s = g.status();
            assert_eq!((s.num_nodes, s.live_nodes, s.num_edges), (10, 9, 5));
            assert_eq!(s.pending_log_records, 5);
            assert!(matches!(
                g.to_internal(&[0], "v"),
                Err(ServeError::NotFound(_))
            ));
            assert!(matches!(
                g.to_internal(&[10], "v"),
                Err(ServeError::InvalidArgument(_))
            ));

            let before = snapshot(&g);
            let dir = g.dir().to_path_buf();
            drop(g);
            let reopened = ServedGraph::open(&dir).unwrap();
            assert_eq!(snapshot(&reopened), before, "reorder = {reorder}");
        }
    }

    #[test]
    fn a_fold_writes_the_next_version_and_empties_the_log() {
        let (_dir, g) = setup(true);
        mutate_a_lot(&g);
        let before = snapshot(&g);
        let mut retired = 0;
        assert!(g.fold(|_| retired += 1).unwrap());
        assert_eq!(retired, 1);
        assert!(!g.fold(|_| ()).unwrap(), "nothing left to fold");
        let s = g.status();
        assert_eq!((s.version, s.pending_log_records, s.last_lsn), (2, 0, 5));
        assert_eq!(snapshot(&g), before);
        assert!(!g.dir().join(version_dir(1)).exists());
        // Mutations after the fold go on from there, and a restart replays only them.
        g.mutate(&Change::AddEdges {
            src: vec![7],
            dst: vec![1],
        })
        .unwrap();
        let after = snapshot(&g);
        let dir = g.dir().to_path_buf();
        drop(g);
        let reopened = ServedGraph::open(&dir).unwrap();
        assert_eq!(snapshot(&reopened), after);
        assert_eq!(reopened.status().pending_log_records, 1);
        // The folded version is a valid store.
        let store = strata_store::Store::open(&dir.join(version_dir(2))).unwrap();
        assert_eq!(store.manifest().graph.num_nodes, 10);
    }

    #[test]
    fn a_version_left_by_a_crashed_fold_is_removed_on_open() {
        let (_dir, g) = setup(false);
        mutate_a_lot(&g);
        let before = snapshot(&g);
        let dir = g.dir().to_path_buf();
        drop(g);
        // A fold that wrote version 2 but died before switching CURRENT to it.
        std::fs::create_dir_all(dir.join(version_dir(2))).unwrap();
        let reopened = ServedGraph::open(&dir).unwrap();
        assert!(!dir.join(version_dir(2)).exists());
        assert_eq!(snapshot(&reopened), before);
    }

    /// Copies the files under `from` into `to` (creating directories), over what is there.
    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }

    #[test]
    fn a_kill_at_any_step_of_a_fold_opens_the_acknowledged_graph() {
        // A fold (1) writes the next version in `vK.partial-PID` and renames it into place,
        // (2) writes CURRENT's replacement to a temporary file and renames it over CURRENT,
        // (3) drops the log segments and (4) the old version. Each on-disk state a kill can
        // leave is built here from the directories before and after a real fold, and must
        // open as the graph with every acknowledged mutation, keeping only CURRENT's version.
        let tmp = tempfile::tempdir().unwrap();
        let (_dir, g) = setup(true);
        mutate_a_lot(&g);
        let expected = snapshot(&g);
        let dir = g.dir().to_path_buf();
        let before = tmp.path().join("before");
        copy_tree(&dir, &before);
        assert!(g.fold(|_| ()).unwrap());
        let after = tmp.path().join("after");
        copy_tree(&dir, &after);
        drop(g);
        let v1 = version_dir(1);
        let v2 = version_dir(2);
        let current_after = std::fs::read(after.join(CURRENT)).unwrap();
        // Both versions and all log segments, CURRENT still naming the old version.
        let new_version_unnamed = |d: &Path| {
            copy_tree(&before, d);
            copy_tree(&after, d);
            std::fs::write(
                d.join(CURRENT),
                std::fs::read(before.join(CURRENT)).unwrap(),
            )
            .unwrap();
        };
        type Step<'a> = Box<dyn Fn(&Path) + 'a>;
        let states: Vec<(&str, Step<'_>)> = vec![
            (
                "the next version half written",
                Box::new(|d| {
                    copy_tree(&before, d);
                    let partial = d.join(format!("{v2}.partial-4242"));
                    std::fs::create_dir(&partial).unwrap();
                    std::fs::copy(
                        after.join(&v2).join("features.npy"),
                        partial.join("features.npy"),
                    )
                    .unwrap();
                }),
            ),
            (
                "the next version complete, CURRENT not yet replaced",
                Box::new(new_version_unnamed),
            ),
            (
                "CURRENT's replacement written, not renamed",
                Box::new(|d| {
                    new_version_unnamed(d);
                    std::fs::write(d.join(".CURRENT.tmp-4242-0"), &current_after).unwrap();
                }),
            ),
            (
                "CURRENT replaced, log and old version not yet dropped",
                Box::new(|d| {
                    copy_tree(&before, d);
                    copy_tree(&after, d);
                }),
            ),
            (
                "log dropped, old version not yet",
                Box::new(|d| {
                    copy_tree(&after, d);
                    copy_tree(&before.join(&v1), &d.join(&v1));
                }),
            ),
            ("the fold complete", Box::new(|d| copy_tree(&after, d))),
        ];
        for (i, (what, build)) in states.iter().enumerate() {
            let d = tmp.path().join(format!("state{i}"));
            build(&d);
            let g = ServedGraph::open(&d).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(snapshot(&g), expected, "{what}");
            let versions: Vec<String> = std::fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('v'))
                .collect();
            assert_eq!(versions.len(), 1, "{what}: {versions:?}");
            // It goes on: a mutation, and a restart replays it on the version it opened.
            g.mutate(&Change::AddEdges {
                src: vec![7],
                dst: vec![1],
            })
            .unwrap();
            let next = snapshot(&g);
            drop(g);
            assert_eq!(snapshot(&ServedGraph::open(&d).unwrap()), next, "{what}");
        }
    }

    #[test]
    fn bad_changes_are_refused_and_leave_nothing_behind() {
        let (_dir, g) = setup(false);
        let refused = [
            Change::AddVertices {
                count: 1,
                features: vec![1.0],
            },
            Change::AddVertices {
                count: 1,
                features: vec![1.0, f32::NAN],
            },
            Change::RemoveVertices { ids: vec![1, 1] },
            Change::AddEdges {
                src: vec![1],
                dst: vec![],
            },
            Change::AddEdges {
                src: vec![1],
                dst: vec![99],
            },
            Change::RemoveEdges {
                src: vec![2],
                dst: vec![1],
            },
        ];
        for c in &refused {
            assert!(g.mutate(c).is_err(), "{c:?}");
        }
        assert_eq!(g.status().last_lsn, 0);
        let err = g
            .mutate(&Change::RemoveEdges {
                src: vec![2],
                dst: vec![1],
            })
            .unwrap_err();
        assert_eq!(err.to_string(), "edge 2 -> 1 does not exist");
    }

    /// A batch whose later mutations need the earlier ones: two new vertices, edges to and
    /// from them, one of those removed again, a row rewritten, a vertex removed.
    fn a_batch() -> Vec<Change> {
        vec![
            Change::AddVertices {
                count: 2,
                features: vec![10.0, 10.5, 11.0, 11.5],
            },
            Change::AddEdges {
                src: vec![8, 9, 3],
                dst: vec![1, 8, 9],
            },
            Change::RemoveEdges {
                src: vec![9],
                dst: vec![8],
            },
            Change::UpdateVertices {
                ids: vec![9],
                features: vec![-1.0, -2.0],
            },
            Change::RemoveVertices { ids: vec![0] },
        ]
    }

    #[test]
    fn a_batch_is_one_record_applied_in_order_and_replayed() {
        for reorder in [false, true] {
            let (_dir, g) = setup(reorder);
            let done = g.stage_batch(&a_batch()).unwrap().wait().unwrap();
            let lsns: Vec<u64> = done.iter().map(|a| a.lsn).collect();
            assert_eq!(lsns, [1; 5], "one record, one lsn");
            let counts: Vec<u64> = done.iter().map(|a| a.applied).collect();
            assert_eq!(counts, [2, 3, 1, 1, 1]);
            assert_eq!(done[0].new_ids, [8, 9]);
            assert_eq!(ins(&g, 1), vec![8]);
            assert_eq!(ins(&g, 8), Vec::<u64>::new());
            assert_eq!(ins(&g, 9), vec![3]);
            assert_eq!(features(&g, &[8, 9]), vec![10.0, 10.5, -1.0, -2.0]);
            let s = g.status();
            assert_eq!((s.num_nodes, s.live_nodes), (10, 9));
            assert_eq!((s.last_lsn, s.pending_log_records), (1, 1));
            // A mutation after the batch is checked against all of it.
            g.mutate(&Change::AddEdges {
                src: vec![9],
                dst: vec![8],
            })
            .unwrap();
            let before = snapshot(&g);
            let dir = g.dir().to_path_buf();
            drop(g);
            let reopened = ServedGraph::open(&dir).unwrap();
            assert_eq!(snapshot(&reopened), before, "reorder = {reorder}");
            // And a fold writes it into the next version.
            assert!(reopened.fold(|_| ()).unwrap());
            assert_eq!(snapshot(&reopened), before);
        }
    }

    #[test]
    fn a_bad_mutation_in_a_batch_refuses_all_of_it() {
        let (_dir, g) = setup(false);
        g.mutate(&Change::AddEdges {
            src: vec![7],
            dst: vec![6],
        })
        .unwrap();
        let before = snapshot(&g);
        // Each is refused only because of what the batch did before it, at index 2.
        let refused = [
            (
                Change::AddEdges {
                    src: vec![4],
                    dst: vec![0],
                },
                ServeError::NotFound("mutations[2]: dst: vertex 0 was removed".into()),
            ),
            (
                Change::RemoveEdges {
                    src: vec![0],
                    dst: vec![1],
                },
                ServeError::NotFound("mutations[2]: src: vertex 0 was removed".into()),
            ),
            (
                Change::UpdateVertices {
                    ids: vec![9],
                    features: vec![1.0, 2.0],
                },
                ServeError::InvalidArgument(
                    "mutations[2]: ids: vertex 9 is out of range (the graph has ids 0..9)".into(),
                ),
            ),
        ];
        for (bad, want) in refused {
            let batch = vec![
                Change::AddVertices {
                    count: 1,
                    features: vec![1.0, 1.0],
                },
                Change::RemoveVertices { ids: vec![0] },
                bad,
                Change::AddEdges {
                    src: vec![8],
                    dst: vec![1],
                },
            ];
            let e = g.stage_batch(&batch).err().expect("refused");
            // The same kind (so the same status code) and message.
            assert_eq!(std::mem::discriminant(&e), std::mem::discriminant(&want));
            assert_eq!(e.to_string(), want.to_string());
            assert_eq!(snapshot(&g), before);
            assert_eq!(g.status().last_lsn, 1);
        }
        let e = g.stage_batch(&[]).err().expect("refused");
        assert!(matches!(e, ServeError::InvalidArgument(_)), "{e:?}");
        // Nothing was staged: the next mutation gets the next lsn and sees none of them.
        let next = g
            .mutate(&Change::AddVertices {
                count: 1,
                features: vec![5.0, 5.0],
            })
            .unwrap();
        assert_eq!((next.lsn, next.new_ids.as_slice()), (2, &[8][..]));
        let dir = g.dir().to_path_buf();
        let after = snapshot(&g);
        drop(g);
        assert_eq!(snapshot(&ServedGraph::open(&dir).unwrap()), after);
    }

    #[test]
    fn a_cut_inside_a_batch_loses_the_batch_and_nothing_else() {
        let (_dir, g) = setup(false);
        let edge = Change::AddEdges {
            src: vec![7],
            dst: vec![6],
        };
        g.mutate(&edge).unwrap();
        let kept = snapshot(&g);
        let dir = g.dir().to_path_buf();
        let segment = std::fs::read_dir(dir.join("wal"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .max()
            .unwrap();
        let start = std::fs::metadata(&segment).unwrap().len();
        g.stage_batch(&a_batch()).unwrap().wait().unwrap();
        let end = std::fs::metadata(&segment).unwrap().len();
        drop(g);
        let whole = std::fs::read(&segment).unwrap();
        for cut in [start + 1, start + 16, (start + end) / 2, end - 1] {
            std::fs::write(&segment, &whole[..cut as usize]).unwrap();
            let g = ServedGraph::open(&dir).unwrap();
            assert_eq!(snapshot(&g), kept, "cut at byte {cut} of {start}..{end}");
            assert_eq!(g.status().last_lsn, 1);
            // The log goes on after the cut: the next record takes the lost one's lsn.
            assert_eq!(g.mutate(&edge).unwrap().lsn, 2);
        }
    }

    #[test]
    fn registering_twice_is_refused() {
        let (dir, _g) = setup(false);
        let again = ServedGraph::register(
            &dir.path().join("graphs"),
            "g",
            &dir.path().join("src.strata"),
            None,
        );
        assert!(matches!(again, Err(ServeError::AlreadyExists(_))));
    }
}
