//! A run's checkpoint opened to be read: [`Loaded`] (the run, its store, the planned buffer and
//! the table file) and the name lookups every reader of a run shares. Evaluation and
//! predictions (`serve::query`), neighbours, scoring, export and PyTorch-BigGraph's export read
//! a run through it.

use std::path::Path;

use strata_io::progress::Progress;
use strata_io::Engine;
use strata_store::budget::Planned;
use strata_store::config::Size;
use strata_store::strtab::NameTable;
use strata_store::Store;

use crate::config::{TrainConfig, Which};
use crate::error::{EmbedError, Result};
use crate::model::ScoreModel;
use crate::plan::budget::{self, EmbedPlan};
use crate::run::run_dir::Run;
use crate::storage::buffer::PartitionBuffer;
use crate::storage::entity_types::{load_bags, node_shape, relation_types};
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;

/// A checkpoint ready to score: store, relations, buffer and table file.
pub struct Loaded {
    pub run: Run,
    pub store: Store,
    pub cfg: TrainConfig,
    pub model: ScoreModel,
    pub plan: EmbedPlan,
    pub relations: Relations,
    pub buffer: PartitionBuffer,
    pub table: TableFile,
    pub epoch: usize,
}

impl Loaded {
    /// Opens checkpoint `which` of the run in `dir` with a budget of `memory` bytes (0: the
    /// run's own) and `threads` threads (0: the run's own), planned as training would plan it
    /// (the plan's lines go to `progress`).
    pub fn open(
        dir: &Path,
        which: Which,
        memory: u64,
        threads: usize,
        progress: &dyn Progress,
    ) -> Result<Loaded> {
        let loaded = Loaded::open_unsaid(dir, which, memory, threads)?;
        loaded.say_plan(progress);
        Ok(loaded)
    }

    /// [`open`](Self::open) without printing the plan, for a caller that checks its query
    /// first (a name not in the store is refused before any plan is shown), then calls
    /// [`say_plan`](Self::say_plan).
    pub fn open_unsaid(dir: &Path, which: Which, memory: u64, threads: usize) -> Result<Loaded> {
        Loaded::open_planned(dir, which, |run, store, cfg, model| {
            if memory > 0 {
                cfg.memory = Size(memory);
            }
            if threads > 0 {
                cfg.threads = threads;
            }
            // A loaded checkpoint trains no epoch to write behind.
            cfg.write_behind = false;
            let shape = node_shape(store, cfg)?;
            let plan =
                budget::plan_fitting(cfg, model, &shape, run.meta.num_relations, None, None)?;
            plan.check_machine()?;
            Ok(plan)
        })
    }

    /// Prints the plan's lines to `progress`.
    pub fn say_plan(&self, progress: &dyn Progress) {
        self.plan
            .memory_plan()
            .describe()
            .iter()
            .for_each(|l| progress.message(l));
    }

    /// Opens checkpoint `which` of the run in `dir` with the plan `plan` makes from the run,
    /// its store, its config (which it may change) and its model; the buffer gets the plan's
    /// capacity (and a typed run's pinned region a slot of its own).
    pub fn open_planned(
        dir: &Path,
        which: Which,
        plan: impl FnOnce(&Run, &Store, &mut TrainConfig, &ScoreModel) -> Result<EmbedPlan>,
    ) -> Result<Loaded> {
        let run = Run::open_whole(dir)?;
        let store = run.store()?;
        let mut cfg = run.meta.config.clone();
        cfg.partitions = run.meta.partitioning.partitions;
        let model = run.meta.model();
        let plan = plan(&run, &store, &mut cfg, &model)?;
        let ckpt = run.checkpoint(which).clone();
        let relations = run.relations(&ckpt)?;
        let engine = Engine::shared();
        let mut buffer = PartitionBuffer::new(engine.clone(), run.meta.layout, plan.capacity);
        let table = TableFile::open(&engine, &run.table_path(&ckpt.table), false)?;
        // A typed run's pinned region is held from the start, as in training (its featurized
        // entities are read through their features).
        if let Some(layout) = run.meta.partitioning.typed_layout() {
            buffer.set_bags(load_bags(&store, &layout)?);
        }
        if let Some(pinned) = run.meta.partitioning.pinned() {
            buffer.load(0, pinned, &table)?;
        }
        Ok(Loaded {
            store,
            cfg,
            model,
            plan,
            relations,
            buffer,
            table,
            epoch: ckpt.epoch,
            run,
        })
    }

    /// A typed run's relation types when its evaluation and predictions rank answers
    /// against their own type (`typed_eval`).
    pub fn answer_types(&self) -> Option<Vec<(usize, usize)>> {
        (self.cfg.typed_eval && self.run.meta.partitioning.types.is_some())
            .then(|| relation_types(&self.store))
    }

    /// Bytes the budget leaves beside the partition buffer for a query's own arrays: what
    /// training would give to edges, evaluation and workers, plus what the plan leaves unused,
    /// less the widened tile of candidates a scan of a bf16 table holds.
    pub fn spare_bytes(&self) -> u64 {
        (self.plan.memory.saturating_sub(self.plan.total())
            + self.plan.eval_bytes
            + self.plan.edge_bytes
            + self.plan.worker_bytes)
            .saturating_sub(budget::widened_tile_bytes(
                self.cfg.table_dtype,
                self.model.dim,
            ))
    }

    /// The id of node `name` (a name from the store's id map, or a number when it has none).
    pub fn node_id(&self, name: &str) -> Result<u64> {
        lookup(
            &self.store,
            "node_names",
            name,
            self.run.meta.num_nodes,
            "node",
        )
    }

    /// The id of relation `name`.
    pub fn relation_id(&self, name: &str) -> Result<u32> {
        let count = self.run.meta.num_relations.max(1);
        lookup(&self.store, "relation_names", name, count, "relation").map(|r| r as u32)
    }

    /// The store's node names, if it has them.
    pub fn node_names(&self) -> Result<Option<NameTable>> {
        if self.store.manifest().graph.node_names {
            Ok(Some(NameTable::open(&self.store, "node_names")?))
        } else {
            Ok(None)
        }
    }
}

/// The name of node (or relation) `id`: from `names`, or the id itself without a table.
pub(crate) fn name_of(names: Option<&NameTable>, id: u64) -> Result<String> {
    match names {
        Some(t) => Ok(t.name(id as usize)?),
        None => Ok(id.to_string()),
    }
}

/// The id of `name` in name table `table` of `store`, or `name` as a number below `count`
/// when the store has no such table.
pub(crate) fn lookup(
    store: &Store,
    table: &str,
    name: &str,
    count: u64,
    what: &str,
) -> Result<u64> {
    let has_names = store.array(&format!("{table}_offsets")).is_some();
    if has_names {
        let t = NameTable::open(store, table)?;
        return t.find(name.as_bytes())?.ok_or_else(|| {
            EmbedError::Config(format!(
                "{what} '{name}' is not in store {} (names are case-sensitive)",
                store.path().display()
            ))
        });
    }
    match name.parse::<u64>() {
        Ok(id) if id < count => Ok(id),
        _ => Err(EmbedError::Config(format!(
            "store {} has no {what} names: give a {what} id between 0 and {}, got '{name}'",
            store.path().display(),
            count - 1
        ))),
    }
}
