//! A whole training job, coordinated after PyTorch-BigGraph's training coordinator: plan the
//! budget, bucket the edges, create or resume the run ([`crate::train::checkpoint`]), check whether
//! I/O can hide, then train the epochs the [`IterationManager`] hands out with the job's
//! [`BucketScheduler`] (single-machine or distributed), validate and commit each, and finally
//! test the best checkpoint. Every piece of every bucket is trained through the job's
//! [`crate::compute::backend::Compute`] backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use strata_io::progress::Progress;
use strata_io::Engine;
use strata_store::budget::Planned;
use strata_store::units::fmt_bytes;
use strata_store::Store;

use crate::compute::device::for_device;
use crate::compute::kernels::sgemm_reference_flops;
use crate::config::{Corrupt, Protocol, TrainConfig, Which};
use crate::error::{EmbedError, Result};
use crate::eval::device::ranker_for;
use crate::eval::rank::Ranker;
use crate::eval::{EvalSet, EvalSpec, Metrics, Scorer};
use crate::model::ScoreModel;
use crate::plan::budget::{self, EmbedPlan, RankNeeds};
use crate::plan::device::DeviceBudget;
use crate::plan::store_plan;
use crate::run::incremental::{self, Origin};
use crate::run::run_dir::{EpochRecord, Run, RunLock, RunMeta};
use crate::storage::buffer::PartitionBuffer;
use crate::storage::entity_types::{load_bags, TypeSpec, TypedTraining};
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::{buckets, Buckets, Partitioning};
use crate::storage::table::TableFile;
use crate::train::all_entities;
use crate::train::bernoulli;
use crate::train::checkpoint::{
    create, open_prior, CheckpointManager, EpochTables, NewRun, Seat, Trained,
};
use crate::train::dist::{Cluster, PartitionSource};
use crate::train::epoch::Trainer;
use crate::train::group::leader_first;
use crate::train::iteration::{Iteration, IterationManager, ScheduleState};
use crate::train::overlap::EdgeRate;
use crate::train::owner;
use crate::train::schedule::{self, BucketScheduler};

/// The evaluation settings of a run's config.
pub fn eval_spec(cfg: &TrainConfig, plan: &EmbedPlan, threads: usize) -> EvalSpec {
    EvalSpec {
        protocol: cfg.eval_protocol,
        negatives: cfg.eval_negatives,
        batch: cfg.chunk_size,
        max_queries: cfg.eval_max_queries,
        corrupt: cfg.corrupt,
        seed: cfg.seed,
        threads,
        round: plan.eval_round,
    }
}

/// Trains `cfg` on the store at `store_path` in `run_dir`: resumes the run there if there is
/// one (unless `fresh`), else starts a new one. `on_epoch` sees every committed epoch.
///
/// With a `cluster` this is one rank of a distributed run (docs/distributed.md): rank 0
/// creates or resumes the run before the others open it, every rank trains the buckets the
/// scheduler hands it, and only rank 0 evaluates and commits; the others return the run as
/// rank 0 committed it after the last epoch.
#[cfg(test)]
pub fn train(
    store_path: &Path,
    run_dir: &Path,
    cfg: TrainConfig,
    fresh: bool,
    cluster: Option<&mut dyn Cluster>,
    progress: &dyn Progress,
    on_epoch: &mut dyn FnMut(&EpochRecord),
) -> Result<RunMeta> {
    train_group(
        store_path, run_dir, cfg, fresh, cluster, None, progress, on_epoch,
    )
}

/// [`train`] for one rank of a group, in owner mode when `peers` is given
/// (`dist_storage = owners`, docs/distributed.md): this rank's run is `RUN/rank-R`
/// ([`owner::rank_dir`]), its tables hold the partitions it owns, the others come from their
/// owners through `peers`, and every rank writes rank 0's commit of each epoch as its own.
/// Rank 0 validates and tests in owner mode by streaming the partitions it does not own from
/// their owners; `strata embed gather` makes one run of the rank directories for later use.
/// Without a `cluster` the job is a single process: a group of one with the single-machine
/// scheduler.
#[allow(clippy::too_many_arguments)]
pub fn train_group(
    store_path: &Path,
    run_dir: &Path,
    cfg: TrainConfig,
    fresh: bool,
    cluster: Option<&mut dyn Cluster>,
    peers: Option<&mut dyn PartitionSource>,
    progress: &dyn Progress,
    on_epoch: &mut dyn FnMut(&EpochRecord),
) -> Result<RunMeta> {
    strata_store::config::check_built(&cfg).map_err(|e| EmbedError::Config(e.to_string()))?;
    let mut scheduler = schedule::for_job(&cfg, cluster, peers)?;
    let paths = JobPaths {
        store: store_path,
        run_dir,
    };
    let mut job = Coordinator::start(paths, cfg, fresh, scheduler.as_mut(), progress)?;
    job.train(on_epoch)?;
    job.test()?;
    Ok(job.ckpt.run.meta)
}

/// Where a job's store and run directory are, as the user gave them.
#[derive(Clone, Copy)]
struct JobPaths<'a> {
    store: &'a Path,
    run_dir: &'a Path,
}

/// A training job under way: its parts, and the loop that runs them (after PyTorch-BigGraph's
/// `TrainingCoordinator`).
struct Coordinator<'a> {
    scheduler: &'a mut dyn BucketScheduler,
    progress: &'a dyn Progress,
    store: Store,
    trainer: Trainer,
    ckpt: CheckpointManager,
    // Keeps another job out of the run directory until this one ends.
    _lock: Option<RunLock>,
    iterations: IterationManager,
    /// The validation split, on the rank that validates (rank 0) when the job validates.
    valid: Option<EvalSet>,
    spec: EvalSpec,
    /// Scores the validation and the test: on the run's device.
    ranker: Box<dyn Ranker>,
    /// This rank and the group's size; rank 0 leads (validates, tests and commits).
    rank: usize,
    world_size: usize,
    /// The plan holds a write-behind copy: epochs that validate leave their table to be
    /// written beside validation.
    write_behind: bool,
    /// A device run's Theorem 3 check, made once its first epoch has given the device's rate:
    /// the plan and the run directory it needs.
    overlap_after_epoch: Option<(EmbedPlan, PathBuf)>,
}

impl<'a> Coordinator<'a> {
    /// Sets the job up: rank 0 creates or resumes the run (and buckets the edges) before the
    /// others open it; in owner mode each rank then sets up its own directory (ranks on one
    /// machine may share the store, whose bucket index the first one writes).
    fn start(
        paths: JobPaths,
        cfg: TrainConfig,
        fresh: bool,
        scheduler: &'a mut dyn BucketScheduler,
        progress: &'a dyn Progress,
    ) -> Result<Coordinator<'a>> {
        let needs = scheduler.rank_needs(&cfg);
        if let Some(n) = &needs {
            budget::check_rank_process(cfg.memory.0, n)?;
        }
        let owner = scheduler.owner();
        let group = scheduler.group();
        let (rank, world_size) = (group.rank(), group.world_size());
        let leads = group.leads();
        let dir = owner.map_or_else(
            || paths.run_dir.to_path_buf(),
            |r| owner::rank_dir(paths.run_dir, r),
        );
        let side = RunSide {
            dir,
            // The single process, rank 0, or in owner mode each rank in its own directory.
            writes: leads || owner.is_some(),
            seat: Seat { owner, world_size },
            needs,
        };
        let s = leader_first(group, "run created by rank 0", || {
            setup(paths.store, &side, cfg, fresh, progress)
        })?;
        let write_behind = s.plan.write_behind_bytes > 0;
        let (mut trainer, store, lock) = (s.trainer, s.store, s.lock);
        let mut ckpt = CheckpointManager { run: s.run };
        scheduler.join(&mut ckpt, &mut trainer.relations, progress)?;
        let overlap_after_epoch = if trainer.cfg.device == "cpu" {
            scheduler.describe_overlap(&trainer, &s.plan, paths.run_dir, None, progress)?;
            None
        } else {
            if leads {
                progress.message(
                    "Theorem 3: checked after the first epoch, at the rate the device trains",
                );
            }
            Some((s.plan.clone(), paths.run_dir.to_path_buf()))
        };
        let spec = eval_spec(&trainer.cfg, &s.plan, trainer.threads());
        let ranker = ranker_for(&trainer.cfg.device, spec.threads)?;
        // Rank 0 validates each epoch for the whole group (in owner mode streaming the
        // partitions it does not own from their owners).
        let valid =
            match leads && trainer.cfg.eval_every > 0 && store.array("edges_valid").is_some() {
                true => {
                    let nodes = &trainer.buckets.partitioning;
                    Some(EvalSet::new(&store, "valid", &spec, nodes, progress)?)
                }
                false => None,
            };
        if let Some(key) = trainer.cfg.schedules() {
            if store.array("edges_valid").is_none() {
                return Err(EmbedError::Config(format!(
                    "embed.train.{key} decides on the validation MRR, but store {} has no validation split (edges_valid)",
                    paths.store.display()
                )));
            }
        }
        let committed = ckpt.run.meta.current.epoch;
        let iterations =
            IterationManager::new(trainer.cfg.epochs, trainer.cfg.eval_every, committed);
        let stopped = stop_of(&ckpt.run.meta);
        if leads && s.resumed && iterations.remaining() {
            progress.message(&match stopped {
                Some(why) => format!(
                    "{} stopped early after epoch {committed}: {why}; nothing left to train (a larger patience goes on, --fresh starts over)",
                    ckpt.run.dir.display()
                ),
                None => format!(
                    "resuming {} after epoch {} at lr {}",
                    ckpt.run.dir.display(),
                    iterations.start(),
                    lr_of(&ckpt.run.meta) as f32
                ),
            });
        }
        Ok(Coordinator {
            scheduler,
            progress,
            store,
            trainer,
            ckpt,
            _lock: lock,
            iterations,
            valid,
            spec,
            ranker,
            rank,
            world_size,
            write_behind,
            overlap_after_epoch,
        })
    }

    /// Trains the epochs left, committing each (rank 0) or taking rank 0's commit, each at the
    /// rate the run's schedule holds, until the schedule stops early: every rank reads the
    /// rate and the stop from the commit rank 0 made, so the group agrees.
    fn train(&mut self, on_epoch: &mut dyn FnMut(&EpochRecord)) -> Result<()> {
        let iterations = self.iterations;
        for it in iterations.iter() {
            if stop_of(&self.ckpt.run.meta).is_some() {
                break;
            }
            self.trainer.cfg.lr = lr_of(&self.ckpt.run.meta) as f32;
            // Nothing would hide the write of an epoch that does not validate.
            self.trainer.writes_behind = self.write_behind && it.validate && self.valid.is_some();
            let tables = self.ckpt.tables(self.trainer.buffer.engine())?;
            let trained = self.scheduler.train_epoch(
                &mut self.trainer,
                &mut self.ckpt,
                it.epoch,
                &tables,
                self.progress,
            )?;
            if let Some(trained) = trained {
                if let Some((plan, run_dir)) = self.overlap_after_epoch.take() {
                    let rate = EdgeRate::device_epoch(&trained.report);
                    self.scheduler.describe_overlap(
                        &self.trainer,
                        &plan,
                        &run_dir,
                        Some(rate),
                        self.progress,
                    )?;
                }
                self.commit(it, &tables, trained, on_epoch)?;
            }
        }
        Ok(())
    }

    /// Saves the epoch's relations (owner mode saved them before the commit's gather),
    /// validates when due, commits the epoch and tells the group.
    fn commit(
        &mut self,
        it: Iteration,
        tables: &EpochTables,
        mut trained: Trained,
        on_epoch: &mut dyn FnMut(&EpochRecord),
    ) -> Result<()> {
        // An epoch written behind: its table is written and synced on a thread of its own
        // while the relations are saved and the epoch validated, before the commit.
        let behind = self.trainer.take_write_behind();
        let valid = std::thread::scope(|scope| -> Result<_> {
            let writer = behind.map(|copy| {
                let at = (copy.origin, copy.step);
                (at, scope.spawn(|| copy.write(&tables.next)))
            });
            let valid = self.save_and_validate(it, &tables.next);
            let ready = Instant::now();
            if let Some(((origin, step), thread)) = writer {
                let written = thread.join().expect("the write-behind thread");
                trained.add_written_behind(&written, origin, step, ready);
                self.trainer.keep_copy_buffers(written.buffers);
                written.result?;
            }
            valid
        })?;
        let validating = self.valid.is_some();
        let record = self
            .ckpt
            .commit_epoch(it.epoch, tables.spare, trained, valid, validating)?;
        let flops = self.ckpt.run.meta.sgemm_flops;
        let epochs = self.iterations.epochs();
        self.progress
            .message(&describe_epoch(&record, epochs, flops));
        on_epoch(&record);
        self.scheduler.committed(&self.ckpt.run)
    }

    /// Saves the epoch's relations (owner mode saved them before the commit's gather), then
    /// validates when due.
    fn save_and_validate(&mut self, it: Iteration, next: &TableFile) -> Result<Option<Metrics>> {
        if self.scheduler.owner().is_none() {
            self.ckpt
                .save_relations(it.epoch, &self.trainer.relations)?;
        }
        self.validate(it, next)
    }

    /// Validates the table epoch `it` wrote (`next`) when due. Every rank's part of `next` is
    /// synced (the commit's gather), and in owner mode the owners serve it until the next
    /// epoch starts.
    fn validate(&mut self, it: Iteration, next: &TableFile) -> Result<Option<Metrics>> {
        let Some(set) = self.valid.as_ref().filter(|_| it.validate) else {
            return Ok(None);
        };
        let peers = self.scheduler.peers();
        let mut load = owner::eval_loader(next, peers, self.rank, self.world_size, it.epoch, true);
        let t = &mut self.trainer;
        let rel_types = eval_types(t);
        let mut scorer = Scorer {
            model: t.model,
            relations: &t.relations,
            partitioning: &t.buckets.partitioning,
            buffer: &mut t.buffer,
            load: &mut *load,
            rel_types,
            ranker: &mut *self.ranker,
        };
        Ok(Some(scorer.evaluate(set, &self.spec, self.progress)?))
    }

    /// Tests the best checkpoint once training is done (rank 0, when the store has a test
    /// split and the job validates), and records the metrics.
    fn test(&mut self) -> Result<()> {
        let due = self.rank == 0
            && self.ckpt.run.meta.test.is_none()
            && self.trainer.cfg.eval_every > 0
            && self.store.array("edges_test").is_some();
        let test = match self.scheduler.owner() {
            Some(_) => self.test_owners(due)?,
            None if due => Some(self.evaluate_best(None)?),
            None => None,
        };
        let Some(test) = test else {
            return Ok(());
        };
        if self.rank == 0 {
            self.progress.message(&format!(
                "test ({} checkpoint, epoch {}): {}",
                "best",
                self.ckpt.run.meta.best.epoch,
                describe_metrics(&test)
            ));
        }
        self.ckpt.commit_test(test)
    }

    /// Owner mode's test: every rank serves its copy of the best table while rank 0 tests it
    /// (when `due`), then takes rank 0's result.
    fn test_owners(&mut self, due: bool) -> Result<Option<Metrics>> {
        let run = &self.ckpt.run;
        let best = Arc::new(TableFile::open(
            self.trainer.buffer.engine(),
            &run.table_path(&run.meta.best.table),
            false,
        )?);
        let served = run.meta.current.epoch;
        let mut test = None;
        if let Some(peers) = self.scheduler.peers() {
            peers.serve(served, &best, &best, &self.trainer.buffer.layout)?;
            if due {
                let on = Evaluation {
                    trainer: &mut self.trainer,
                    run,
                    store: &self.store,
                    spec: &self.spec,
                    ranker: &mut *self.ranker,
                };
                let owners = Some((peers, served));
                test = Some(evaluate(on, "test", Which::Best, owners, self.progress)?);
            }
        }
        let text = serde_json::to_string(&test).expect("serialises");
        let text = self.scheduler.group().broadcast(text)?;
        serde_json::from_str(&text)
            .map_err(|e| EmbedError::Group(format!("rank 0's test metrics: {e}")))
    }

    /// Evaluates the test split on the best checkpoint (see [`evaluate`]).
    fn evaluate_best(
        &mut self,
        owners: Option<(&mut dyn PartitionSource, usize)>,
    ) -> Result<Metrics> {
        let on = Evaluation {
            trainer: &mut self.trainer,
            run: &self.ckpt.run,
            store: &self.store,
            spec: &self.spec,
            ranker: &mut *self.ranker,
        };
        evaluate(on, "test", Which::Best, owners, self.progress)
    }
}

/// Where this rank's run lives and what it may do there.
struct RunSide {
    /// The run directory (in owner mode this rank's own).
    dir: PathBuf,
    /// Whether this rank writes the run directory while setting up.
    writes: bool,
    seat: Seat,
    /// What a distributed rank's memory plan leaves to its group.
    needs: Option<RankNeeds>,
}

/// Everything an epoch loop needs, set up.
struct Setup {
    run: Run,
    /// Held by a rank that writes the run directory, for the whole job.
    lock: Option<RunLock>,
    store: Store,
    plan: EmbedPlan,
    trainer: Trainer,
    resumed: bool,
}

/// Refuses `init_from` in owner mode.
fn check_owner_init(cfg: &TrainConfig, side: &RunSide) -> Result<()> {
    if cfg.init_from.is_some() && side.seat.owner.is_some() {
        return Err(EmbedError::Config(
            "embed.train.init_from is not supported with dist_storage = owners; start the run with dist_storage = shared".into(),
        ));
    }
    Ok(())
}

/// The model `cfg` trains on `store`.
fn job_model(store: &Store, cfg: &TrainConfig, progress: &dyn Progress) -> ScoreModel {
    let model = ScoreModel {
        kind: cfg.model,
        dim: cfg.dim,
        transe_norm: cfg.transe_norm,
        pbg: cfg.pbg_form(),
    };
    let relations = store.manifest().graph.num_relations;
    if model.rel_dim() == 0 && relations > 0 {
        progress.message(&format!(
            "model {} ignores the {} relation types of the store",
            model.kind, relations
        ));
    }
    model
}

/// What the job's plan is made of: its entity types, a new run's origin and the memory plan.
struct Planning {
    spec: Option<TypeSpec>,
    origin: Option<Origin>,
    plan: EmbedPlan,
    partitioning: Partitioning,
}

/// Checks the entity types and a new run's origin, plans the budget and partitions the nodes.
fn plan_job(
    store: &Store,
    cfg: &TrainConfig,
    model: &ScoreModel,
    side: &RunSide,
    new_run: bool,
    progress: &dyn Progress,
) -> Result<Planning> {
    let graph = &store.manifest().graph;
    let cfg = &store_plan::planned_config(cfg, store);
    let spec = TypeSpec::of(store, cfg)?;
    // A new run's origin is checked before the run writes anything.
    let origin = match (&cfg.init_from, new_run) {
        (Some(from), true) => Some(incremental::Origin::open(from, Which::Best, cfg, store)?),
        _ => None,
    };
    let shape = spec.as_ref().map_or_else(
        || crate::storage::entity_types::NodeShape::untyped(graph.num_nodes),
        TypeSpec::shape,
    );
    let device = DeviceBudget::of(cfg)?;
    let plan = budget::plan_fitting(
        cfg,
        model,
        &shape,
        graph.num_relations,
        side.needs,
        device.as_ref(),
    )?;
    let plan = store_plan::with_kept_data(plan, cfg, store, side.needs.is_none());
    plan.check_machine()?;
    let device_lines = plan.device.iter().flat_map(|d| d.memory_plan().describe());
    plan.memory_plan()
        .describe()
        .into_iter()
        .chain(device_lines)
        .for_each(|l| progress.message(&l));
    let partitioning = match &spec {
        Some(spec) => Partitioning::typed(spec.types.clone(), plan.partitions, cfg.seed)?,
        None => Partitioning::new(graph.num_nodes, plan.partitions, cfg.seed)?,
    };
    Ok(Planning {
        spec,
        origin,
        plan,
        partitioning,
    })
}

/// A typed run's training inputs (None untyped); refuses `init_from` into a run with pinned
/// entity types.
fn typed_training(store: &Store, cfg: &TrainConfig, p: &Planning) -> Result<Option<TypedTraining>> {
    let typed = match (&p.spec, p.partitioning.typed_layout()) {
        (Some(spec), Some(layout)) => Some(TypedTraining {
            bags: load_bags(store, &layout)?,
            layout,
            rel_types: spec.rel_types.clone(),
            typed_negatives: cfg.typed_negatives,
        }),
        _ => None,
    };
    if p.origin.is_some() && p.partitioning.featurized() {
        return Err(incremental::featurized_init_error());
    }
    Ok(typed)
}

/// Buckets the train edges by partition pair within `spare` bytes, and says how their weights
/// are used.
fn bucket_edges(
    store: &Store,
    partitioning: &Partitioning,
    cfg: &TrainConfig,
    spare: u64,
    progress: &dyn Progress,
) -> Result<Arc<Buckets>> {
    let buckets = Arc::new(buckets(store, partitioning, spare, progress)?);
    match (&buckets.weights, cfg.edge_weights) {
        (Some(w), true) => {
            w.check(store.path())?;
            progress.message(&format!(
                "edge weights ({}): each edge's loss scaled by its weight, min {}, max {}, mean {:.4}",
                crate::storage::partitioning::WEIGHTS,
                w.min,
                w.max,
                w.sum / buckets.num_edges.max(1) as f64
            ));
        }
        (Some(_), false) => progress.message(&format!(
            "edge weights ({}) ignored: edge_weights = false",
            crate::storage::partitioning::WEIGHTS
        )),
        (None, _) => {}
    }
    Ok(buckets)
}

/// Bytes left to bucketing and the Bernoulli counts, which run before the buffer and workers
/// take their share.
fn spare_bytes(cfg: &TrainConfig, plan: &EmbedPlan) -> u64 {
    cfg.memory
        .0
        .saturating_sub(plan.runtime_bytes + plan.group_bytes)
}

/// `corrupt = bernoulli`: the probability of corrupting the head, by relation id, counted
/// over the bucketed edges (empty for other corruptions).
fn head_probabilities(
    store: &Store,
    engine: &Arc<Engine>,
    buckets: &Arc<Buckets>,
    typed: Option<&TypedTraining>,
    cfg: &TrainConfig,
    plan: &EmbedPlan,
    progress: &dyn Progress,
) -> Result<Vec<f32>> {
    if cfg.corrupt != Corrupt::Bernoulli {
        return Ok(Vec::new());
    }
    // A typed run's ends in the pinned region are counted as that region's nodes.
    let pinned_ends: Option<Vec<(bool, bool)>> = typed
        .filter(|_| buckets.partitioning.pinned().is_some())
        .map(|t| {
            let pinned = |ty: usize| !t.layout.types[ty].partitioned;
            t.rel_types
                .iter()
                .map(|&(s, d)| (pinned(s), pinned(d)))
                .collect()
        });
    let counts = bernoulli::count_sides(
        engine,
        buckets,
        store.manifest().graph.num_relations,
        pinned_ends.as_deref(),
        spare_bytes(cfg, plan),
        plan.piece_rows,
        progress,
    )?;
    let p = counts.head_probabilities();
    progress.message(&bernoulli::describe(&p));
    Ok(p)
}

/// Opens or creates the run, plans the budget and builds the trainer. Only a rank that
/// `side.writes` (the single process, rank 0, or in owner mode each rank in its own
/// directory) writes to the run directory here. In owner mode the run holds only the
/// partitions this rank owns and is committed by [`owner::resume`] once it agrees with rank 0's.
fn setup(
    store_path: &Path,
    side: &RunSide,
    mut cfg: TrainConfig,
    fresh: bool,
    progress: &dyn Progress,
) -> Result<Setup> {
    let store = strata_store::open_checked(store_path, progress)?;
    let model = job_model(&store, &cfg, progress);
    check_owner_init(&cfg, side)?;
    let fresh = fresh && side.writes;
    let lock = side.writes.then(|| RunLock::take(&side.dir)).transpose()?;
    let prior = open_prior(&side.dir, store_path, &mut cfg, fresh, side.seat, &store)?;
    let p = plan_job(&store, &cfg, &model, side, prior.is_none(), progress)?;
    let typed = typed_training(&store, &cfg, &p)?;
    let Planning {
        origin,
        plan,
        partitioning,
        ..
    } = p;
    let mut compute = for_device(&cfg.device, cfg.device_matmul, plan.threads)?;
    let buckets = bucket_edges(
        &store,
        &partitioning,
        &cfg,
        spare_bytes(&cfg, &plan),
        progress,
    )?;
    let engine = Engine::shared();
    let head_prob = head_probabilities(
        &store,
        &engine,
        &buckets,
        typed.as_ref(),
        &cfg,
        &plan,
        progress,
    )?;
    let vs_all = all_entities::setup(
        &all_entities::VsAllJob {
            cfg: &cfg,
            model: &model,
            plan: &plan,
            buckets: &buckets,
            engine: &engine,
            weighted: cfg.edge_weights && buckets.weights.is_some(),
            typed: typed.is_some(),
            world_size: side.seat.world_size,
            // The edge reader's bound on relation ids, as the epochs' (see `relation_ids`).
            relations: match model.rel_dim() {
                0 => u64::MAX,
                _ => store.manifest().graph.num_relations.max(1),
            },
        },
        progress,
    )?;
    let layout = TableLayout::new(&partitioning, cfg.dim, cfg.optimizer, cfg.table_dtype);
    let slots = Slots::of(engine, layout, &plan, typed.as_ref());
    let resumed = prior.is_some();
    let (run, buffer) = match prior {
        Some(run) => (resume(run, &cfg, side.writes)?, slots.buffer()),
        None => {
            let new = NewRun {
                store: &store,
                cfg: &cfg,
                model: &model,
                partitioning,
                layout,
                owned: side.seat.owner.map(|r| (r, side.seat.world_size)),
            };
            create_run(&side.dir, new, origin, &slots, &plan, progress)?
        }
    };
    let (run, relations) = settle_run(run, &plan, side)?;
    if let Some(line) = compute.describe() {
        progress.message(&line);
    }
    if let Some(e) = compute.failure() {
        return Err(EmbedError::Config(e));
    }
    let mut trainer = Trainer::new(
        cfg,
        model,
        buckets,
        buffer,
        relations,
        compute,
        plan.piece_rows,
        plan.bank_rows,
    );
    trainer.prefetch_slots = plan.prefetch_slots;
    trainer.swap_spare = (0..plan.swap_spares())
        .map(|_| strata_io::AlignedBuf::new(trainer.buffer.layout.part_bytes() as usize))
        .collect();
    trainer.edge_cache = (plan.kept_edge_bytes > 0).then(Default::default);
    if plan.kept_partition_bytes > 0 {
        trainer.buffer.keep_partitions(Default::default());
    }
    trainer.typed = typed;
    trainer.head_prob = head_prob;
    trainer.vs_all = vs_all;
    Ok(Setup {
        run,
        lock,
        store,
        plan,
        trainer,
        resumed,
    })
}

/// The partition buffer's slots: how to allocate them (again, after a new run's origin is
/// remapped through their memory).
struct Slots {
    engine: Arc<Engine>,
    layout: TableLayout,
    count: usize,
    bags: Option<Arc<crate::storage::entity_types::FeatureBags>>,
}

impl Slots {
    /// The slots `plan` holds for the partitions and their lookahead, with a typed run's
    /// feature bags.
    fn of(
        engine: Arc<Engine>,
        layout: TableLayout,
        plan: &EmbedPlan,
        typed: Option<&TypedTraining>,
    ) -> Slots {
        Slots {
            engine,
            layout,
            count: plan.capacity + plan.prefetch_slots,
            bags: typed.and_then(|t| t.bags.clone()),
        }
    }

    fn buffer(&self) -> PartitionBuffer {
        let mut buffer = PartitionBuffer::new(self.engine.clone(), self.layout, self.count);
        buffer.set_bags(self.bags.clone());
        buffer
    }
}

/// Creates a new run in `dir` (through the buffer's slots), and when it starts from another
/// run (`origin`, `init_from`) remaps that run's rows into it; returns the run and the buffer.
fn create_run(
    dir: &Path,
    new: NewRun,
    origin: Option<Origin>,
    slots: &Slots,
    plan: &EmbedPlan,
    progress: &dyn Progress,
) -> Result<(Run, PartitionBuffer)> {
    let memory = new.cfg.memory.0;
    let mut buffer = slots.buffer();
    let run = create(dir, new, &mut buffer, progress)?;
    if let Some(origin) = origin {
        // The remap streams through the memory the buffer's slots hold (and a slot still
        // holds a partition as initialised): free them, then allocate anew.
        drop(buffer);
        let held = plan.runtime_bytes + plan.group_bytes + plan.relation_bytes;
        let budget = memory.saturating_sub(held + origin.bytes());
        origin.apply(&run, budget, progress)?;
        buffer = slots.buffer();
    }
    Ok((run, buffer))
}

/// A resumed run with this job's config (keeping the run's partition count); a rank that
/// writes the run rewrites its logs to its last commit and settles the schedule it continues
/// under this config (the others take it from rank 0's commit).
fn resume(mut run: Run, cfg: &TrainConfig, writes: bool) -> Result<Run> {
    run.meta.config = TrainConfig {
        partitions: run.meta.config.partitions,
        ..cfg.clone()
    };
    if writes {
        let meta = &mut run.meta;
        meta.schedule = Some(ScheduleState::resumed(
            meta.schedule.take(),
            &meta.config,
            meta.current.epoch,
            meta.best_mrr,
        ));
        run.rewrite_logs()?;
    }
    Ok(run)
}

/// The rate the run's next epoch trains with.
fn lr_of(meta: &RunMeta) -> f64 {
    meta.schedule
        .as_ref()
        .map_or_else(|| ScheduleState::new(&meta.config).lr, |s| s.lr)
}

/// Why the run stopped early, if it did.
fn stop_of(meta: &RunMeta) -> Option<&str> {
    meta.schedule.as_ref().and_then(|s| s.stopped.as_deref())
}

/// Loads the run's relations at its current checkpoint, records this job's plan and group in
/// its metadata, and commits it (outside owner mode, where [`owner::resume`] commits).
fn settle_run(
    mut run: Run,
    plan: &EmbedPlan,
    side: &RunSide,
) -> Result<(Run, crate::storage::relations::Relations)> {
    let mut relations = run.meta.empty_relations();
    let (rp, sp) = run.relation_paths(run.meta.current.epoch);
    relations.load(&rp, &sp)?;
    run.meta.memory_plan = Some(plan.memory_plan());
    run.meta.device_memory_plan = plan.device.as_ref().map(|d| d.memory_plan());
    run.meta.world_size = side.seat.world_size;
    run.meta.owner_rank = side.seat.owner;
    if run.meta.sgemm_flops == 0.0 {
        run.meta.sgemm_flops = sgemm_reference_flops();
    }
    if side.writes && side.seat.owner.is_none() {
        run.commit()?;
    }
    Ok((run, relations))
}

/// What [`evaluate`] works on: the trainer's model, buffer and typed settings, the run, its
/// store and the evaluation settings.
struct Evaluation<'e> {
    trainer: &'e mut Trainer,
    run: &'e Run,
    store: &'e Store,
    spec: &'e EvalSpec,
    ranker: &'e mut dyn Ranker,
}

/// Evaluates `split` on a checkpoint of the run being trained. In owner mode `owners` is the
/// partition transport and the epoch under which every rank serves its copy of the checkpoint's
/// table as `current`; the partitions this rank does not own are streamed from their owners.
fn evaluate(
    on: Evaluation,
    split: &str,
    which: Which,
    owners: Option<(&mut dyn PartitionSource, usize)>,
    progress: &dyn Progress,
) -> Result<Metrics> {
    let (t, run) = (on.trainer, on.run);
    let ckpt = run.checkpoint(which).clone();
    let relations = run.relations(&ckpt)?;
    let table = TableFile::open(t.buffer.engine(), &run.table_path(&ckpt.table), false)?;
    if ckpt.table != run.meta.current.table {
        // The slots mirror the current table; this checkpoint lives in another file.
        t.buffer.clear();
    }
    let set = EvalSet::new(on.store, split, on.spec, &t.buckets.partitioning, progress)?;
    let (rank, world_size) = (run.meta.owner_rank.unwrap_or(0), run.meta.world_size);
    let (peers, epoch) = owners.map_or((None, 0), |(p, e)| (Some(p), e));
    let mut load = owner::eval_loader(&table, peers, rank, world_size, epoch, false);
    let rel_types = eval_types(t);
    let mut scorer = Scorer {
        model: t.model,
        relations: &relations,
        partitioning: &t.buckets.partitioning,
        buffer: &mut t.buffer,
        load: &mut *load,
        rel_types,
        ranker: on.ranker,
    };
    let m = scorer.evaluate(&set, on.spec, progress);
    if ckpt.table != run.meta.current.table {
        t.buffer.clear();
    }
    m
}

/// The relation types a typed run's evaluation ranks answers by (`typed_eval`).
fn eval_types(t: &Trainer) -> Option<Vec<(usize, usize)>> {
    t.typed
        .as_ref()
        .filter(|_| t.cfg.typed_eval)
        .map(|typed| typed.rel_types.clone())
}

/// One line per epoch for the user.
pub fn describe_epoch(r: &EpochRecord, epochs: usize, sgemm_flops: f64) -> String {
    let e = &r.report;
    let ahead = match e.loads_read_ahead {
        0 => String::new(),
        n => format!(" ({n} read ahead)"),
    };
    let mut line = format!(
        "epoch {}/{}: loss {:.4}, {:.2} s, {:.0} edges/s, I/O wait {:.2} s ({:.1}%), {} loads{ahead}, read {}, wrote {}, step {:.1} GFLOP/s per thread ({:.0}% of SGEMM)",
        e.epoch,
        epochs,
        e.loss,
        e.seconds,
        e.edges_per_second,
        e.io_wait_seconds,
        100.0 * e.io_wait_fraction,
        e.partition_loads,
        fmt_bytes(e.partition_bytes_read + e.edge_bytes_read),
        fmt_bytes(e.partition_bytes_written),
        e.step_flops_per_thread / 1e9,
        100.0 * e.step_flops_per_thread / sgemm_flops.max(1.0)
    );
    if let Some(w) = &e.written_behind {
        line.push_str(&format!(
            " (table written behind in {:.2} s, waited {:.2} s)",
            w.seconds, w.wait_seconds
        ));
    }
    if let Some(lr) = r.lr {
        // The rate as the kernels use it (f32): 0.01, not 0.010000000000000002.
        line.push_str(&format!(", lr {}", lr as f32));
    }
    if let Some(v) = &r.valid {
        line.push_str(&format!(
            "; valid {}{}",
            describe_metrics(v),
            if r.best { " (best)" } else { "" }
        ));
    }
    if let (Some(old), Some(new)) = (r.lr, r.lr_dropped_to) {
        line.push_str(&format!(
            "; validation MRR on a plateau: lr {} -> {}",
            old as f32, new as f32
        ));
    }
    if let Some(why) = &r.stopped {
        line.push_str(&format!("; stopping early: {why}"));
    }
    line
}

/// Metrics in one line.
pub fn describe_metrics(m: &Metrics) -> String {
    format!(
        "{} MRR {:.4}, MR {:.1}, Hits@1 {:.4}, Hits@3 {:.4}, Hits@10 {:.4} ({} queries, {:.1} s)",
        match m.protocol {
            Protocol::Filtered => "filtered",
            Protocol::Sampled => "sampled",
        },
        m.mrr,
        m.mr,
        m.hits_at_1,
        m.hits_at_3,
        m.hits_at_10,
        m.queries,
        m.seconds
    )
}
