//! The registered graphs, models and embedding runs by name, kept in the server's state
//! directory so that a restart serves the same ones:
//!
//! ```text
//! STATE/graphs/NAME/     a served graph (see `graph`)
//! STATE/models/NAME/     weights (as uploaded) + model.json (resolved architecture, precision)
//! STATE/embeddings/NAME/ a served copy of an embedding run's checkpoint (see `embeddings`)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use serde::{Deserialize, Serialize};
use strata_graph::embedding_run::EmbeddingBackend;

use crate::durable::{create_dir_all, sync_dir};
use crate::embeddings::{Embeddings, ServedEmbedding};
use crate::error::{Result, ServeError};
use crate::graph::ServedGraph;
use crate::memory::{self, Allowance, Kind, Resident};
use crate::model::{Architecture, Model, Precision};
use crate::page_cache::PageCache;
use crate::registered::{check_name, list_dirs, remove_registered};
use strata_graph::order::glist::ReorderParams;
use strata_io::durable::replace_file;

/// A registered model; `id` tells apart two registrations under one name (embedding caches
/// key on it).
pub struct ServedModel {
    pub name: String,
    pub id: u64,
    pub model: Model,
}

#[derive(Serialize, Deserialize)]
struct ModelJson {
    format: String,
    architecture: Architecture,
    precision: Precision,
}

/// Graphs, models and embedding runs by name.
pub struct Registry {
    dir: PathBuf,
    graphs: RwLock<BTreeMap<String, Arc<ServedGraph>>>,
    models: RwLock<BTreeMap<String, Arc<ServedModel>>>,
    pub embeddings: Embeddings,
    next_model_id: AtomicU64,
    /// Once the server has planned its budget ([`Registry::attach`]): registrations take
    /// their memory from the page cache, or are refused.
    resident: OnceLock<Resident>,
}

/// Bytes `g` holds in memory ([`memory::graph_bytes`] of its current size).
fn served_graph_bytes(g: &ServedGraph) -> u64 {
    let s = g.status();
    memory::graph_bytes(s.num_nodes, s.num_edges, s.num_classes > 0)
}

impl Registry {
    /// Opens (creating) the state directory and everything registered in it; embedding runs
    /// are opened with `backend` (without one, a registered run is refused).
    pub fn open(dir: &Path, backend: Option<Arc<dyn EmbeddingBackend>>) -> Result<Registry> {
        create_dir_all(&dir.join("graphs"))?;
        create_dir_all(&dir.join("models"))?;
        let reg = Registry {
            dir: dir.to_path_buf(),
            graphs: RwLock::new(BTreeMap::new()),
            models: RwLock::new(BTreeMap::new()),
            embeddings: Embeddings::open(dir, backend)?,
            next_model_id: AtomicU64::new(1),
            resident: OnceLock::new(),
        };
        for (name, path) in list_dirs(&dir.join("graphs"))? {
            let g = ServedGraph::open(&path)?;
            reg.graphs.write().unwrap().insert(name, Arc::new(g));
        }
        for (name, path) in list_dirs(&dir.join("models"))? {
            let read = |p: PathBuf| {
                std::fs::read(&p).map_err(|e| ServeError::io(p.display().to_string(), e))
            };
            let json: ModelJson =
                serde_json::from_slice(&read(path.join("model.json"))?).map_err(|e| {
                    ServeError::FailedPrecondition(format!(
                        "{}: {e}",
                        path.join("model.json").display()
                    ))
                })?;
            let bytes = read(path.join("weights"))?;
            let model = Model::from_bytes(
                &bytes,
                Some(&json.format),
                Some(json.architecture),
                json.precision,
            )?;
            reg.insert_model(name, model);
        }
        Ok(reg)
    }

    /// What each registered graph, model and embedding run holds in memory, (kind, name) ->
    /// bytes.
    pub fn held_bytes(&self) -> BTreeMap<(Kind, String), u64> {
        let graphs = self.graphs.read().unwrap();
        let models = self.models.read().unwrap();
        graphs
            .iter()
            .map(|(n, g)| ((Kind::Graph, n.clone()), served_graph_bytes(g)))
            .chain(
                models
                    .iter()
                    .map(|(n, m)| ((Kind::Model, n.clone()), m.model.bytes())),
            )
            .chain(
                self.embeddings
                    .held_bytes()
                    .into_iter()
                    .map(|(n, b)| ((Kind::Embedding, n), b)),
            )
            .collect()
    }

    /// Registers checkpoint `checkpoint` of the run at `source` as `name` (see
    /// [`Embeddings::register`]), its resident bytes taken from the page cache.
    pub fn register_embedding(
        &self,
        name: &str,
        source: &Path,
        checkpoint: &str,
        memory: Option<u64>,
    ) -> Result<Arc<ServedEmbedding>> {
        self.embeddings
            .register(name, source, checkpoint, memory, self.resident.get())
    }

    /// Unregisters embedding run `name`, giving its bytes back to the page cache.
    pub fn unregister_embedding(&self, name: &str) -> Result<()> {
        self.embeddings.unregister(name, self.resident.get())
    }

    /// From now on, registrations take their memory from `page_cache` (what is registered
    /// now is already in the plan), and unregistrations give it back.
    pub fn attach(&self, page_cache: Arc<PageCache>) {
        let resident = Resident::new(page_cache, self.held_bytes());
        if self.resident.set(resident).is_err() {
            unreachable!("the registry's budget is attached once, at start");
        }
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn graph(&self, name: &str) -> Result<Arc<ServedGraph>> {
        self.graphs
            .read()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| ServeError::NotFound(format!("graph '{name}' is not registered")))
    }

    pub fn model(&self, name: &str) -> Result<Arc<ServedModel>> {
        self.models
            .read()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| ServeError::NotFound(format!("model '{name}' is not registered")))
    }

    pub fn graphs(&self) -> Vec<Arc<ServedGraph>> {
        self.graphs.read().unwrap().values().cloned().collect()
    }

    pub fn models(&self) -> Vec<Arc<ServedModel>> {
        self.models.read().unwrap().values().cloned().collect()
    }

    /// Registers the store at `source` as `name` (re-ordered with `reorder` when given).
    pub fn register_graph(
        &self,
        name: &str,
        source: &Path,
        reorder: Option<&ReorderParams>,
    ) -> Result<Arc<ServedGraph>> {
        check_name(name, "graph")?;
        if self.graphs.read().unwrap().contains_key(name) {
            return Err(ServeError::AlreadyExists(format!(
                "graph '{name}' is already registered"
            )));
        }
        // Charged before the graph is written and loaded, from its manifest; settled to the
        // exact size once loaded.
        let estimate = match self.resident.get() {
            Some(r) => {
                let bytes = memory::store_graph_bytes(source)?;
                r.take(Kind::Graph, name, bytes)?;
                bytes
            }
            None => 0,
        };
        let settle = |to: u64| {
            if let Some(r) = self.resident.get() {
                r.adjust(Kind::Graph, name, estimate, to);
            }
        };
        let g = match ServedGraph::register(&self.dir.join("graphs"), name, source, reorder) {
            Ok(g) => Arc::new(g),
            Err(e) => {
                settle(0);
                return Err(e);
            }
        };
        let mut graphs = self.graphs.write().unwrap();
        if graphs.contains_key(name) {
            settle(0);
            return Err(ServeError::AlreadyExists(format!(
                "graph '{name}' is already registered"
            )));
        }
        settle(served_graph_bytes(&g));
        graphs.insert(name.to_string(), Arc::clone(&g));
        Ok(g)
    }

    /// Unregisters `name` and deletes its served copy (the source store is untouched).
    /// Requests already holding the graph finish on it.
    pub fn unregister_graph(&self, name: &str) -> Result<Arc<ServedGraph>> {
        let g = self
            .graphs
            .write()
            .unwrap()
            .remove(name)
            .ok_or_else(|| ServeError::NotFound(format!("graph '{name}' is not registered")))?;
        if let Some(r) = self.resident.get() {
            r.release(Kind::Graph, name);
        }
        remove_registered(&self.dir.join("graphs"), name)?;
        Ok(g)
    }

    /// Registers weights `bytes` (a safetensors or npz file; `source` is the path it was read
    /// from) as `name`, charging what parsing allocates to `allowance`.
    #[allow(clippy::too_many_arguments)]
    pub fn register_model(
        &self,
        name: &str,
        bytes: &[u8],
        format: Option<&str>,
        arch: Option<Architecture>,
        precision: Precision,
        source: Option<&Path>,
        allowance: &mut Allowance,
    ) -> Result<Arc<ServedModel>> {
        check_name(name, "model")?;
        if self.models.read().unwrap().contains_key(name) {
            return Err(ServeError::AlreadyExists(format!(
                "model '{name}' is already registered"
            )));
        }
        let source_name = source.map_or("model weights".to_string(), |p| p.display().to_string());
        let fmt = crate::model::file::Format::resolve(format, source, bytes, &source_name)?;
        let fmt_name = match fmt {
            crate::model::file::Format::Safetensors => "safetensors",
            crate::model::file::Format::Npz => "npz",
        };
        let model = Model::build(bytes, fmt, arch, precision, &source_name, allowance)?;
        if let Some(r) = self.resident.get() {
            r.take(Kind::Model, name, model.bytes())?;
        }
        let models = self.dir.join("models");
        let partial = models.join(format!(".partial-{name}"));
        let _ = std::fs::remove_dir_all(&partial);
        create_dir_all(&partial)?;
        let json = ModelJson {
            format: fmt_name.to_string(),
            architecture: model.architecture().clone(),
            precision,
        };
        let persist = (|| {
            let path = partial.join("weights");
            replace_file(&path, bytes)
                .map_err(|e| ServeError::io(format!("write {}", path.display()), e))?;
            let path = partial.join("model.json");
            replace_file(&path, &serde_json::to_vec_pretty(&json).unwrap())
                .map_err(|e| ServeError::io(format!("write {}", path.display()), e))?;
            let dir = models.join(name);
            std::fs::rename(&partial, &dir)
                .map_err(|e| ServeError::io(dir.display().to_string(), e))?;
            sync_dir(&models)
        })();
        if let Err(e) = persist {
            let _ = std::fs::remove_dir_all(&partial);
            if let Some(r) = self.resident.get() {
                r.adjust(Kind::Model, name, model.bytes(), 0);
            }
            return Err(e);
        }
        Ok(self.insert_model(name.to_string(), model))
    }

    pub fn unregister_model(&self, name: &str) -> Result<()> {
        self.models
            .write()
            .unwrap()
            .remove(name)
            .ok_or_else(|| ServeError::NotFound(format!("model '{name}' is not registered")))?;
        if let Some(r) = self.resident.get() {
            r.release(Kind::Model, name);
        }
        remove_registered(&self.dir.join("models"), name)
    }

    fn insert_model(&self, name: String, model: Model) -> Arc<ServedModel> {
        let m = Arc::new(ServedModel {
            name: name.clone(),
            id: self.next_model_id.fetch_add(1, Ordering::Relaxed),
            model,
        });
        self.models.write().unwrap().insert(name, Arc::clone(&m));
        m
    }
}
