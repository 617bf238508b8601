//! A whole training job: plan the budget, bucket the edges, create or resume the run, check
//! whether I/O can hide, train epoch by epoch with validation and checkpoints, and finally
//! evaluate the best checkpoint on the test split.

use std::path::Path;
use std::sync::Arc;

use strata_io::profile::DeviceProfile;
use strata_io::progress::Progress;
use strata_io::Engine;
use strata_store::units::fmt_bytes;
use strata_store::Store;

use crate::compute::kernels::sgemm_reference_flops;
use crate::config::{Corrupt, DistStorage, OptimizerKind, Protocol, TrainConfig, Which};
use crate::error::{EmbedError, Result};
use crate::eval::{EvalSet, EvalSpec, Metrics, Scorer};
use crate::model::ScoreModel;
use crate::plan::budget::{self, EmbedPlan, RankNeeds};
use crate::run::incremental;
use crate::run::run_dir::{is_run, sync_dir, Checkpoint, EpochRecord, Run, RunMeta};
use crate::storage::buffer::PartitionBuffer;
use crate::storage::entity_types::{load_bags, TypeSpec, TypedTraining};
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::{buckets, Partitioning};
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;
use crate::train::bernoulli;
use crate::train::dist::{
    check_holdings, describe_rank, fault_point, owner_of, Cluster, PartitionSource, RankReport,
    TableCrc,
};
use crate::train::epoch::Trainer;
use crate::train::overlap;
use crate::train::owner::{self, Commit};
use strata_store::budget::Planned;

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

/// Fields that shape the stored state: a resumed run must keep them.
fn same_shape(a: &TrainConfig, b: &TrainConfig) -> Option<&'static str> {
    let checks: [(&'static str, bool); 14] = [
        ("model", a.model == b.model),
        ("operator", a.pbg_form().operator == b.pbg_form().operator),
        (
            "comparator",
            a.pbg_form().comparator == b.pbg_form().comparator,
        ),
        ("dim", a.dim == b.dim),
        ("transe_norm", a.transe_norm == b.transe_norm),
        ("optimizer", a.optimizer == b.optimizer),
        ("table_dtype", a.table_dtype == b.table_dtype),
        ("reciprocal", a.reciprocal == b.reciprocal),
        ("seed", a.seed == b.seed),
        ("init_from", a.init_from == b.init_from),
        ("entity_types", a.entity_types == b.entity_types),
        (
            "entity_partitions",
            a.entity_partitions == b.entity_partitions,
        ),
        ("featurized", a.featurized == b.featurized),
        (
            "partitions",
            a.partitions == 0 || b.partitions == 0 || a.partitions == b.partitions,
        ),
    ];
    checks.iter().find(|(_, same)| !same).map(|(name, _)| *name)
}

/// Everything an epoch loop needs, set up.
struct Setup {
    run: Run,
    store: Store,
    plan: EmbedPlan,
    trainer: Trainer,
    resumed: bool,
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
#[allow(clippy::too_many_arguments)]
pub fn train_group(
    store_path: &Path,
    run_dir: &Path,
    cfg: TrainConfig,
    fresh: bool,
    mut cluster: Option<&mut dyn Cluster>,
    mut peers: Option<&mut dyn PartitionSource>,
    progress: &dyn Progress,
    on_epoch: &mut dyn FnMut(&EpochRecord),
) -> Result<RunMeta> {
    strata_store::config::check_built(&cfg).map_err(|e| EmbedError::Config(e.to_string()))?;
    let owners = cluster.is_some() && cfg.dist_storage == DistStorage::Owners;
    if owners != peers.is_some() {
        return Err(EmbedError::Config(format!(
            "embed.train.dist_storage is {:?} but the group {} partition transport",
            cfg.dist_storage,
            if peers.is_some() { "has a" } else { "has no" }
        )));
    }
    let (rank, world_size) = cluster
        .as_ref()
        .map_or((0, 1), |c| (c.rank(), c.world_size()));
    let leader = rank == 0;
    let needs = cluster.as_ref().map(|c| RankNeeds {
        group_anon_bytes: c.group_anon_bytes(),
        prefetch: cfg.dist_prefetch,
    });
    if let Some(n) = &needs {
        budget::check_rank_process(cfg.memory, n)?;
    }
    // Rank 0 creates or resumes the run (and buckets the edges) before the others open it;
    // in owner mode each rank then sets up its own directory (one at a time: ranks on one
    // machine may share the store, whose bucket index the first one writes).
    if let (Some(c), false) = (cluster.as_deref_mut(), leader) {
        c.barrier("run created by rank 0")?;
    }
    let own = owners.then_some(rank);
    let dir = match own {
        Some(r) => owner::rank_dir(run_dir, r),
        None => run_dir.to_path_buf(),
    };
    let mut s = setup(
        store_path,
        &dir,
        cfg,
        fresh && (leader || owners),
        leader || owners,
        world_size,
        own,
        needs,
        progress,
    )?;
    if let (Some(c), true) = (cluster.as_deref_mut(), leader) {
        c.barrier("run created by rank 0")?;
    }
    if let (Some(c), true) = (cluster.as_deref_mut(), owners) {
        owner::resume(&mut s.run, &mut s.trainer.relations, c, progress)?;
    }
    let model = s.trainer.model;
    let threads = s.trainer.threads();
    // The check is of the single-process schedule; a distributed epoch's buckets come from the
    // scheduler, one grant ahead at most.
    if cluster.is_none() {
        let sched = s.trainer.schedule()?;
        let t = overlap::measure_edge_seconds(&model, &s.trainer.cfg, threads);
        match DeviceProfile::for_path(run_dir) {
            _ if sched.swaps() == 0 => progress.message(&format!(
                "Theorem 3: all {} partition(s) stay resident, no swaps to hide (training takes {:.3} us/edge here)",
                s.plan.partitions,
                t * 1e6
            )),
            Some(profile) => {
                let c = overlap::check(&sched, &s.trainer.buckets, model.dim, s.plan.buffer_bytes, s.plan.part_bytes, t, &profile)
                    .expect("the schedule has swaps");
                c.describe().iter().for_each(|l| progress.message(l));
            }
            None => progress.message(&format!(
                "Theorem 3: no device profile for the disk holding {} (training takes {:.3} us/edge here); run `strata bench-disk --dir {}` to check whether swaps can hide",
                run_dir.display(),
                t * 1e6,
                run_dir.display()
            )),
        }
    } else if leader {
        let t = overlap::measure_edge_seconds(&model, &s.trainer.cfg, threads);
        progress.message(&format!(
            "Theorem 3 is not checked in a distributed run: its buckets come from the scheduler, not a precomputed schedule ({}; each rank's epoch line gives its partition wait); training takes {:.3} us/edge on rank 0",
            if s.plan.prefetch_slots > 0 {
                "rank 0 loads its next grant's partitions while it trains"
            } else {
                "rank 0 loads each grant's partitions before it trains"
            },
            t * 1e6
        ));
    }
    let spec = eval_spec(&s.trainer.cfg, &s.plan, threads);
    // Rank 0 validates each epoch for the whole group (in owner mode streaming the partitions
    // it does not own from their owners).
    let valid = if leader && s.trainer.cfg.eval_every > 0 && s.store.array("edges_valid").is_some()
    {
        Some(EvalSet::new(&s.store, "valid", &spec, progress)?)
    } else {
        None
    };
    let epochs = s.trainer.cfg.epochs;
    if leader && s.resumed && s.run.meta.current.epoch < epochs {
        progress.message(&format!(
            "resuming {} after epoch {}",
            s.run.dir.display(),
            s.run.meta.current.epoch
        ));
    }
    while s.run.meta.current.epoch < epochs {
        let epoch = s.run.meta.current.epoch;
        let spare = s.run.meta.spare();
        let current = Arc::new(TableFile::open(
            s.trainer.buffer.engine(),
            &s.run.table_path(&s.run.meta.current.table),
            false,
        )?);
        let next = Arc::new(TableFile::open(
            s.trainer.buffer.engine(),
            &s.run.table_path(spare),
            false,
        )?);
        let (report, timeline, ranks, table_crc) = match cluster.as_deref_mut() {
            None => {
                let (report, timeline) = s.trainer.epoch(epoch, &current, &next, progress)?;
                (report, timeline, None, None)
            }
            Some(c) => {
                let (mine, timeline) = s.trainer.epoch_scheduled(
                    epoch,
                    &current,
                    &next,
                    c,
                    peers.as_deref_mut(),
                    progress,
                )?;
                progress.message(&describe_rank(&mine, epochs));
                if owners {
                    // Each rank's directory must hold all of epoch E+1 but the commit marker.
                    let (rp, sp) = s.run.relation_paths(epoch + 1);
                    s.trainer.relations.save(&rp, &sp)?;
                    let ckpt = Checkpoint {
                        epoch: epoch + 1,
                        table: spare.to_string(),
                    };
                    owner::prepare(&s.run, &ckpt)?;
                }
                // Every rank has synced its partitions of `next` before it contributes: the
                // gather is the commit's prepare barrier.
                let all = c.gather(serde_json::to_string(&mine).expect("serialises"))?;
                fault_point(epoch, "prepared");
                if !leader && owners {
                    let text = c.broadcast(String::new())?;
                    let commit: Commit = serde_json::from_str(&text)
                        .map_err(|e| EmbedError::Group(format!("rank 0's commit: {e}")))?;
                    commit.apply(&mut s.run.meta);
                    s.run.commit()?;
                    owner::clear_prepared(&s.run);
                    if let Some(record) = &commit.record {
                        s.run.append_logs(record, &timeline)?;
                    }
                    c.barrier("epoch committed by rank 0")?;
                    continue;
                }
                if !leader {
                    c.barrier("epoch committed by rank 0")?;
                    s.run = Run::open(&s.run.dir)?;
                    continue;
                }
                let mut ranks = all
                    .iter()
                    .map(|text| {
                        serde_json::from_str::<RankReport>(text)
                            .map_err(|e| EmbedError::Corrupt(format!("a rank's epoch report: {e}")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let crc = check_holdings(epoch, s.run.meta.partitioning.partitions, &ranks)?;
                check_start(&s.run.meta.history, epoch, &crc)?;
                ranks.iter_mut().for_each(|r| r.holdings.clear());
                (
                    RankReport::combine(&ranks),
                    timeline,
                    Some(ranks),
                    Some(crc),
                )
            }
        };
        if !owners {
            let (rp, sp) = s.run.relation_paths(epoch + 1);
            s.trainer.relations.save(&rp, &sp)?;
        }
        let due = (epoch + 1) % s.trainer.cfg.eval_every.max(1) == 0 || epoch + 1 == epochs;
        let valid_metrics = match (&valid, due) {
            (Some(set), true) => {
                // Every rank's part of `next` is synced (the gather above), and the owners
                // serve it until the next epoch starts.
                let mut load =
                    owner::eval_loader(&next, peers.as_deref_mut(), rank, world_size, epoch, true);
                let rel_types = eval_types(&s.trainer);
                let mut scorer = Scorer {
                    model,
                    relations: &s.trainer.relations,
                    partitioning: &s.trainer.buckets.partitioning,
                    buffer: &mut s.trainer.buffer,
                    load: &mut *load,
                    rel_types,
                };
                Some(scorer.evaluate(set, &spec, progress)?)
            }
            _ => None,
        };
        let ckpt = Checkpoint {
            epoch: epoch + 1,
            table: spare.to_string(),
        };
        let improved = match (&valid_metrics, s.run.meta.best_mrr) {
            (Some(m), Some(best)) => m.mrr > best,
            (Some(_), None) => true,
            // Without validation the latest checkpoint is the best one known.
            (None, _) => valid.is_none(),
        };
        let meta = &mut s.run.meta;
        meta.current = ckpt.clone();
        if improved {
            meta.best = ckpt;
            meta.best_mrr = valid_metrics.as_ref().map(|m| m.mrr);
        }
        let record = EpochRecord {
            report,
            valid: valid_metrics,
            best: improved,
            ranks,
            table_crc,
        };
        meta.history.push(record.clone());
        // Test metrics belong to a finished run's best checkpoint; training on invalidates them.
        meta.test = None;
        s.run.commit()?;
        s.run.append_logs(&record, &timeline)?;
        progress.message(&describe_epoch(&record, epochs, s.run.meta.sgemm_flops));
        on_epoch(&record);
        if let Some(c) = cluster.as_deref_mut() {
            if owners {
                owner::clear_prepared(&s.run);
                c.broadcast(serde_json::to_string(&Commit::of(&s.run.meta)).expect("serialises"))?;
            }
            c.barrier("epoch committed by rank 0")?;
        }
    }
    let test_due = leader
        && s.run.meta.test.is_none()
        && s.trainer.cfg.eval_every > 0
        && s.store.array("edges_test").is_some();
    let test = match (cluster, peers) {
        (Some(c), Some(peers)) => {
            // Owner mode: every rank serves its copy of the best table while rank 0 tests it,
            // then writes rank 0's result into its own run.json.
            let best = Arc::new(TableFile::open(
                s.trainer.buffer.engine(),
                &s.run.table_path(&s.run.meta.best.table),
                false,
            )?);
            let served = s.run.meta.current.epoch;
            peers.serve(served, &best, &best, &s.trainer.buffer.layout)?;
            let test = match test_due {
                true => Some(evaluate(
                    &mut s,
                    "test",
                    Which::Best,
                    Some((peers, served)),
                    progress,
                )?),
                false => None,
            };
            let text = c.broadcast(serde_json::to_string(&test).expect("serialises"))?;
            serde_json::from_str(&text)
                .map_err(|e| EmbedError::Group(format!("rank 0's test metrics: {e}")))?
        }
        _ if test_due => Some(evaluate(&mut s, "test", Which::Best, None, progress)?),
        _ => None,
    };
    if let Some(test) = test {
        if leader {
            progress.message(&format!(
                "test ({} checkpoint, epoch {}): {}",
                "best",
                s.run.meta.best.epoch,
                describe_metrics(&test)
            ));
        }
        s.run.meta.test = Some(test);
        s.run.commit()?;
    }
    Ok(s.run.meta)
}

/// Refuses to commit distributed epoch `epoch` unless the table its ranks started from is the
/// one the last epoch committed (when that epoch recorded it: a distributed one).
fn check_start(history: &[EpochRecord], epoch: usize, crc: &TableCrc) -> Result<()> {
    match history.last().and_then(|r| r.table_crc.as_ref()) {
        Some(last) if last.end != crc.start => Err(EmbedError::Corrupt(format!(
            "epoch {}: the ranks started from a table with CRC-32 {}, but epoch {} committed {}; refusing to commit a mix of epochs",
            epoch + 1,
            crc.start,
            epoch,
            last.end
        ))),
        _ => Ok(()),
    }
}

/// Refuses what a typed run does not support yet, naming the option: entity types under
/// torchrun.
fn check_typed(spec: Option<&TypeSpec>, world_size: usize) -> Result<()> {
    if spec.is_some() && world_size > 1 {
        return Err(EmbedError::Config(
            "embed.train.entity_types: entity types (per-type partitions and negatives) are not supported in a distributed run yet; set entity_types = false to train the typed store as one table of every node".into(),
        ));
    }
    Ok(())
}

/// The refusal of `init_from` into a run whose entity types are not all partitioned.
pub(crate) fn pinned_init_error() -> EmbedError {
    EmbedError::Config(
        "embed.train.init_from: runs with unpartitioned or featurized entity types (entity_partitions TYPE=1 with more than one partition, featurized) cannot start from or seed another run yet; partition every type, or start from scratch".into(),
    )
}

/// Opens or creates the run, plans the budget and builds the trainer. Only the `leader`
/// (the single process, rank 0, or in owner mode each rank in its own directory) writes to
/// the run directory here. `owner`: owner mode, this rank's number; its run holds only the
/// partitions it owns and is committed by [`owner::resume`] once it agrees with rank 0's.
#[allow(clippy::too_many_arguments)]
fn setup(
    store_path: &Path,
    run_dir: &Path,
    cfg: TrainConfig,
    fresh: bool,
    leader: bool,
    world_size: usize,
    owner: Option<usize>,
    rank: Option<RankNeeds>,
    progress: &dyn Progress,
) -> Result<Setup> {
    let store = strata_store::open_checked(store_path, progress)?;
    let graph = store.manifest().graph.clone();
    let model = ScoreModel {
        kind: cfg.model,
        dim: cfg.dim,
        transe_norm: cfg.transe_norm,
        pbg: cfg.pbg_form(),
    };
    if model.rel_dim() == 0 && graph.num_relations > 0 {
        progress.message(&format!(
            "model {} ignores the {} relation types of the store",
            model.kind, graph.num_relations
        ));
    }
    if cfg.init_from.is_some() && owner.is_some() {
        return Err(EmbedError::Config(
            "embed.train.init_from is not supported with dist_storage = owners; start the run with dist_storage = shared".into(),
        ));
    }
    let existing = is_run(run_dir) && !fresh;
    let mut cfg = cfg;
    let prior = if existing {
        let run = Run::open(run_dir)?;
        if let Some(field) = same_shape(&run.meta.config, &cfg) {
            return Err(EmbedError::Config(format!(
                "run {} was trained with a different embed.train.{field}; pass --fresh to start over or choose another --run-dir",
                run_dir.display()
            )));
        }
        if owner.is_some() && (run.meta.owner_rank != owner || run.meta.world_size != world_size) {
            return Err(EmbedError::Config(format!(
                "run {} holds the partitions of rank {:?} of {} (owner mode); resume it with the same ranks, or pass --fresh",
                run_dir.display(),
                run.meta.owner_rank,
                run.meta.world_size
            )));
        }
        if run.store()?.path().canonicalize().ok() != store.path().canonicalize().ok() {
            return Err(EmbedError::Config(format!(
                "run {} belongs to store {}, not {}",
                run_dir.display(),
                run.meta.store.display(),
                store_path.display()
            )));
        }
        cfg.partitions = run.meta.partitioning.partitions;
        Some(run)
    } else {
        None
    };
    let spec = TypeSpec::of(&store, &cfg)?;
    check_typed(spec.as_ref(), world_size)?;
    // A new run's origin is checked before the run writes anything.
    let origin = match (&cfg.init_from, &prior) {
        (Some(from), None) => Some(incremental::Origin::open(from, Which::Best, &cfg, &store)?),
        _ => None,
    };
    let shape = spec.as_ref().map_or_else(
        || crate::storage::entity_types::NodeShape::untyped(graph.num_nodes),
        TypeSpec::shape,
    );
    let plan = budget::plan_fitting(&cfg, &model, &shape, graph.num_relations, rank)?;
    let threads = plan.threads;
    plan.memory_plan()
        .describe()
        .iter()
        .for_each(|l| progress.message(l));
    let partitioning = match &spec {
        Some(spec) => Partitioning::typed(spec.types.clone(), plan.partitions, cfg.seed)?,
        None => Partitioning::new(graph.num_nodes, plan.partitions, cfg.seed)?,
    };
    let typed = match (&spec, partitioning.typed_layout()) {
        (Some(spec), Some(layout)) => Some(TypedTraining {
            bags: load_bags(&store, &layout)?,
            layout,
            rel_types: spec.rel_types.clone(),
            typed_negatives: cfg.typed_negatives,
        }),
        _ => None,
    };
    if origin.is_some() && partitioning.pinned().is_some() {
        return Err(pinned_init_error());
    }
    let bags = typed.as_ref().and_then(|t| t.bags.clone());
    // Bucketing and the Bernoulli counts run before the buffer and workers take their share.
    let spare = cfg
        .memory
        .saturating_sub(plan.runtime_bytes + plan.group_bytes);
    let buckets = Arc::new(buckets(&store, &partitioning, spare, progress)?);
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
    let engine = Engine::shared();
    let head_prob = match cfg.corrupt {
        Corrupt::Bernoulli => {
            // A typed run's ends in the pinned region are counted as that region's nodes.
            let pinned_ends: Option<Vec<(bool, bool)>> = typed
                .as_ref()
                .filter(|_| partitioning.pinned().is_some())
                .map(|t| {
                    let pinned = |ty: usize| !t.layout.types[ty].partitioned;
                    t.rel_types
                        .iter()
                        .map(|&(s, d)| (pinned(s), pinned(d)))
                        .collect()
                });
            let counts = bernoulli::count_sides(
                &engine,
                &buckets,
                graph.num_relations,
                pinned_ends.as_deref(),
                spare,
                plan.piece_rows,
                progress,
            )?;
            let p = counts.head_probabilities();
            progress.message(&bernoulli::describe(&p));
            p
        }
        _ => Vec::new(),
    };
    let layout = TableLayout::new(&partitioning, cfg.dim, cfg.optimizer, cfg.table_dtype);
    let mut buffer =
        PartitionBuffer::new(engine.clone(), layout, plan.capacity + plan.prefetch_slots);
    buffer.set_bags(bags.clone());
    let resumed = prior.is_some();
    let mut run = match prior {
        Some(mut run) => {
            run.meta.config = TrainConfig {
                partitions: run.meta.config.partitions,
                ..cfg.clone()
            };
            if leader {
                run.rewrite_logs()?;
            }
            run
        }
        None => {
            let run = create(
                &store,
                run_dir,
                &cfg,
                &model,
                partitioning,
                layout,
                &mut buffer,
                owner.map(|r| (r, world_size)),
                progress,
            )?;
            if let Some(origin) = origin {
                // The remap streams through the memory the buffer's slots hold (and a slot
                // still holds a partition as initialised): free them, then allocate anew.
                drop(buffer);
                let held = plan.runtime_bytes + plan.group_bytes + plan.relation_bytes;
                let budget = cfg.memory.saturating_sub(held + origin.bytes());
                origin.apply(&run, budget, progress)?;
                buffer = PartitionBuffer::new(
                    engine.clone(),
                    layout,
                    plan.capacity + plan.prefetch_slots,
                );
                buffer.set_bags(bags);
            }
            run
        }
    };
    let mut relations = run.meta.empty_relations();
    let (rp, sp) = run.relation_paths(run.meta.current.epoch);
    relations.load(&rp, &sp)?;
    run.meta.memory_plan = Some(plan.memory_plan());
    run.meta.world_size = world_size;
    run.meta.owner_rank = owner;
    if run.meta.sgemm_flops == 0.0 {
        run.meta.sgemm_flops = sgemm_reference_flops();
    }
    if leader && owner.is_none() {
        run.commit()?;
    }
    let mut trainer = Trainer::new(
        cfg,
        model,
        buckets,
        buffer,
        relations,
        threads,
        plan.piece_rows,
        plan.bank_rows,
    );
    trainer.prefetch_slots = plan.prefetch_slots;
    trainer.typed = typed;
    trainer.head_prob = head_prob;
    Ok(Setup {
        run,
        store,
        plan,
        trainer,
        resumed,
    })
}

/// Creates a new run in `dir`: initial table and relations, committed as epoch 0. With
/// `owned = (rank, world_size)` (owner mode) only that rank's partitions are initialised; the
/// others' regions stay holes of the full-sized files.
#[allow(clippy::too_many_arguments)]
fn create(
    store: &Store,
    dir: &Path,
    cfg: &TrainConfig,
    model: &ScoreModel,
    partitioning: Partitioning,
    layout: TableLayout,
    buffer: &mut PartitionBuffer,
    owned: Option<(usize, usize)>,
    progress: &dyn Progress,
) -> Result<Run> {
    let io = |op, e| {
        EmbedError::Store(strata_store::StoreError::Io(strata_io::IoError::os(
            op, dir, 0, e,
        )))
    };
    if dir.exists() {
        let ours = |name: &str| {
            name.starts_with("run.json")
                || name == "metrics.jsonl"
                || name == "timeline.jsonl"
                || name.starts_with("table-")
                || name.starts_with("relations-e")
                || name.starts_with("relation_state-e")
                || name.starts_with("prepared-e")
                || name.starts_with("events.out.tfevents")
        };
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| io("list", e))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        // A directory that is no run yet holds only a run's files is a creation (or a --fresh
        // restart) killed before its first commit: starting again is what the user asked for.
        if !is_run(dir) && names.iter().any(|n| !ours(n)) {
            return Err(EmbedError::Config(format!(
                "{} exists and is not a run directory; choose an empty or new --run-dir",
                dir.display()
            )));
        }
        // run.json goes first: from then on the directory is no run, and a kill part-way
        // through leaves only files that the next start removes.
        names.sort_by_key(|n| n != "run.json");
        for name in names.iter().filter(|n| ours(n)) {
            std::fs::remove_file(dir.join(name)).map_err(|e| io("remove", e))?;
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| io("mkdir", e))?;
    let graph = &store.manifest().graph;
    let table_bytes = layout.table_bytes(partitioning.partitions);
    progress.message(&format!(
        "new run {}: {} nodes x {} dims ({:?}), table {} per checkpoint file",
        dir.display(),
        graph.num_nodes,
        cfg.dim,
        cfg.optimizer,
        fmt_bytes(table_bytes)
    ));
    let engine = buffer.engine().clone();
    for name in ["table-0.bin", "table-1.bin", "table-2.bin"] {
        let path = dir.join(name);
        TableFile::open(&engine, &path, true)?;
        if owned.is_some() {
            // Full size from the start, so that a table whose last partitions are another
            // owner's (holes) has the size every reader checks.
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(table_bytes))
                .map_err(|e| io("resize", e))?;
        }
    }
    let first = TableFile::open(&engine, &dir.join("table-0.bin"), false)?;
    let mut meter = strata_io::progress::Meter::new(
        progress,
        "init table",
        table_bytes,
        partitioning.partitions as u64,
    );
    for p in partitioning.regions() {
        if owned.is_some_and(|(rank, world)| owner_of(p, world) != rank) {
            continue;
        }
        let rows = partitioning.stored_rows(p);
        buffer.init(&first, p, rows, cfg.init_scale, cfg.seed)?;
        meter.add(1, layout.region_bytes(p))?;
    }
    first.sync()?;
    meter.finish()?;
    let run = Run {
        dir: dir.to_path_buf(),
        meta: RunMeta::fresh(store, cfg.clone(), partitioning, layout)?,
    };
    let relations = Relations::new(
        model,
        graph.num_relations,
        cfg.reciprocal,
        cfg.optimizer == OptimizerKind::AdagradRow,
        cfg.seed,
        cfg.init_scale,
    );
    let (rp, sp) = run.relation_paths(0);
    relations.save(&rp, &sp)?;
    sync_dir(dir)?;
    Ok(run)
}

/// Evaluates `split` on a checkpoint of the run being trained. In owner mode `owners` is the
/// partition transport and the epoch under which every rank serves its copy of the checkpoint's
/// table as `current`; the partitions this rank does not own are streamed from their owners.
fn evaluate(
    s: &mut Setup,
    split: &str,
    which: Which,
    owners: Option<(&mut dyn PartitionSource, usize)>,
    progress: &dyn Progress,
) -> Result<Metrics> {
    let ckpt = s.run.checkpoint(which).clone();
    let relations = s.run.relations(&ckpt)?;
    let table = TableFile::open(
        s.trainer.buffer.engine(),
        &s.run.table_path(&ckpt.table),
        false,
    )?;
    if ckpt.table != s.run.meta.current.table {
        // The slots mirror the current table; this checkpoint lives in another file.
        s.trainer.buffer.clear();
    }
    let spec = eval_spec(&s.trainer.cfg, &s.plan, s.trainer.threads());
    let set = EvalSet::new(&s.store, split, &spec, progress)?;
    let (rank, world_size) = (s.run.meta.owner_rank.unwrap_or(0), s.run.meta.world_size);
    let (peers, epoch) = owners.map_or((None, 0), |(p, e)| (Some(p), e));
    let mut load = owner::eval_loader(&table, peers, rank, world_size, epoch, false);
    let rel_types = eval_types(&s.trainer);
    let mut scorer = Scorer {
        model: s.trainer.model,
        relations: &relations,
        partitioning: &s.trainer.buckets.partitioning,
        buffer: &mut s.trainer.buffer,
        load: &mut *load,
        rel_types,
    };
    let m = scorer.evaluate(&set, &spec, progress);
    if ckpt.table != s.run.meta.current.table {
        s.trainer.buffer.clear();
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
    let mut line = format!(
        "epoch {}/{}: loss {:.4}, {:.2} s, {:.0} edges/s, I/O wait {:.2} s ({:.1}%), {} loads, read {}, wrote {}, step {:.1} GFLOP/s per thread ({:.0}% of SGEMM)",
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
    if let Some(v) = &r.valid {
        line.push_str(&format!(
            "; valid {}{}",
            describe_metrics(v),
            if r.best { " (best)" } else { "" }
        ));
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
