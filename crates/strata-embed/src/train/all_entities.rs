//! 1vsAll and KvsAll training (LibKGE's `TrainingJob1vsAll` and `TrainingJobKvsAll`): a
//! chunk's queries are scored against every candidate entity as one matrix product per
//! corrupted side ([`all_step`]), and every candidate row takes an Adagrad step.
//!
//! - **Queries.** 1vsAll asks each edge `(s, r, t)` of the chunk both queries, `(s, r, ?)` and
//!   (with `corrupt = both`) `(t, r⁻¹, ?)` (or the reversed row without reciprocal
//!   relations), the true entity the one label. KvsAll asks each distinct query of the
//!   training edges once per epoch: an edge asks `(s, r, ?)` only when `t` is the smallest
//!   known answer of `(s, r)` ([`Answers`]), so that the epoch's shuffled edges carry every
//!   distinct query exactly once, labelled with all its answers.
//! - **Candidates.** The rows of every resident partition, in `BucketCtx::parts` order: in
//!   memory that is the whole table (one partition); with `vsall_candidates = "resident"` the
//!   resident partitions only, which hold both ends of the bucket's edges.
//! - **Optimizer.** Every candidate's gradient is non-zero (the softmax or BCE touches every
//!   score), so every candidate row takes one Adagrad step per chunk with the sum of its
//!   gradients as a candidate, source and target of either side, as LibKGE's dense
//!   embeddings do under torch's Adagrad; relation rows take one step per touched row.
//! - **Regularizer.** The chunk's regularizer over each side's source, relation and (1vsAll)
//!   true target rows, as in negative sampling, rows as stored. Weighted (`reg_weighted`):
//!   each row once per query that references it, and 1vsAll's head side of `corrupt = both`,
//!   which asks the tail side's edges again, takes only its own (inverse) relation rows, as
//!   the negative-sampling step's repeated side does ([`crate::model::Regularizer::rows`]).
//!   KvsAll's two sides ask different queries, so each regularizes its own.
//! - **Dropout.** As in negative sampling ([`crate::model::Dropped`]): each side drops its
//!   source rows and every candidate row at the entity rate and its relation rows at the
//!   relation rate (LibKGE's `embed` and `embed_all` each draw their own masks), with masks
//!   from the side's own generator (`derive(key, side)`), and the gradients reach the stored
//!   rows through the same masks.

use std::sync::Arc;
use std::time::Instant;

use strata_io::progress::Progress;
use strata_io::Engine;
use strata_store::rng::{derive, Rng};
use strata_store::units::fmt_bytes;

use crate::config::{Corrupt, TrainConfig, TrainingMode, VsAllCandidates};
use crate::error::{EmbedError, Result};
use crate::model::{
    all_step, regularize, regularize_table, AllBatch, Chunk, Grads, Labels, ProductQuery,
    ScoreModel,
};
use crate::plan::budget::EmbedPlan;
use crate::sizes::part_bytes;
use crate::storage::epoch_io::prefetch_edges;
use crate::storage::partitioning::Buckets;
use crate::train::vs_all::{Answers, VsAll, VsAllWorker, ANSWER_BYTES, DEVICE_ANSWER_BYTES};
use crate::train::worker::{step_relation_rows, BucketCtx, Orientation, Worker};

/// Reads the training edges of `buckets` (in pieces of `piece_rows`) into KvsAll's
/// [`Answers`]. Only for a run of one partition, whose local rows are the table's.
pub fn read_answers(
    engine: &Arc<Engine>,
    buckets: &Arc<Buckets>,
    piece_rows: u64,
    relations: u64,
) -> Result<Answers> {
    let n = buckets.partitioning.partitions;
    debug_assert_eq!(n, 1, "KvsAll needs the table in one partition");
    let order: Vec<(u32, u32)> = (0..n).flat_map(|a| (0..n).map(move |b| (a, b))).collect();
    let (rx, handle) = prefetch_edges(
        engine.clone(),
        buckets.clone(),
        order,
        piece_rows,
        2,
        relations,
        false,
        None,
    );
    let mut edges = Vec::with_capacity(buckets.num_edges as usize);
    for piece in rx.iter() {
        edges.extend(piece.edges?.0);
    }
    handle
        .join()
        .map_err(|_| EmbedError::Corrupt("the edge reader panicked".into()))?;
    Ok(Answers::new(&edges))
}

/// A 1vsAll or KvsAll run's training inputs, held by the trainer.
pub struct VsAllTraining {
    pub label_smoothing: f32,
    pub query: ProductQuery,
    pub answers: Option<Answers>,
}

impl VsAllTraining {
    /// What each chunk context borrows.
    pub fn view(&self) -> VsAll<'_> {
        VsAll {
            label_smoothing: self.label_smoothing,
            query: self.query,
            answers: self.answers.as_ref(),
        }
    }
}

/// What a job's 1vsAll or KvsAll training needs, checked against the run it is part of.
pub struct VsAllJob<'a> {
    pub cfg: &'a TrainConfig,
    pub model: &'a ScoreModel,
    pub plan: &'a EmbedPlan,
    pub buckets: &'a Arc<Buckets>,
    pub engine: &'a Arc<Engine>,
    /// Whether the run scales edges by their weights.
    pub weighted: bool,
    /// Whether the run has entity types.
    pub typed: bool,
    pub world_size: usize,
    pub relations: u64,
}

/// The training inputs of `job` when it trains 1vsAll or KvsAll (None for negative
/// sampling), or why it cannot: entity types, distributed runs, KvsAll with edge weights,
/// and a table that does not fit the budget in memory (unless 1vsAll scores against the
/// resident partitions) are refused naming the option and the sizes.
pub fn setup(job: &VsAllJob, progress: &dyn Progress) -> Result<Option<VsAllTraining>> {
    let cfg = job.cfg;
    if !cfg.scores_all() {
        return Ok(None);
    }
    let mode = cfg.training.name();
    let refuse = |key: &str, why: String| {
        Err(EmbedError::Config(format!(
            "embed.train.{key}: training {mode:?} {why}"
        )))
    };
    if job.typed {
        return refuse(
            "entity_types",
            "ranks against every node, not per entity type; set entity_types = false".into(),
        );
    }
    if job.world_size > 1 {
        return refuse(
            "training",
            "is not supported in a distributed run (use negative_sampling under torchrun)".into(),
        );
    }
    let kvs = cfg.training == TrainingMode::KvsAll;
    if kvs && job.weighted {
        return refuse(
            "edge_weights",
            "trains distinct queries, not edges, so an edge's weight has no query to scale; set edge_weights = false".into(),
        );
    }
    let plan = job.plan;
    let candidates = cfg.vsall_candidates;
    let whole = if kvs {
        plan.partitions == 1
    } else {
        plan.in_memory()
    };
    if !whole && candidates == VsAllCandidates::All {
        let nodes = job.buckets.partitioning.num_nodes;
        return Err(EmbedError::Budget(format!(
            "training {mode:?} scores every entity, so the entity table must be in memory: {nodes} entities x {} reals with their {:?} state take {}, and memory {} plans {} partitions of {} with {} resident (beside workers {} and the rest); raise --memory{}",
            cfg.dim,
            cfg.optimizer,
            fmt_bytes(part_bytes(nodes, cfg.dim, cfg.optimizer, cfg.table_dtype)),
            fmt_bytes(cfg.memory.0),
            plan.partitions,
            fmt_bytes(plan.part_bytes),
            plan.capacity,
            fmt_bytes(plan.worker_bytes),
            if kvs {
                ""
            } else {
                ", or set vsall_candidates = \"resident\" to score each chunk against the resident partitions only"
            }
        )));
    }
    let answers = if kvs {
        let bytes = ANSWER_BYTES * job.buckets.num_edges;
        if plan.total() + bytes > cfg.memory.0 {
            return Err(EmbedError::Budget(format!(
                "training \"KvsAll\" holds the answers of every training query ({} edges: {}), which memory {} does not hold beside the plan's {}; raise --memory",
                job.buckets.num_edges,
                fmt_bytes(bytes),
                fmt_bytes(cfg.memory.0),
                fmt_bytes(plan.total())
            )));
        }
        let on_device = device_answers(plan, job.buckets.num_edges)?;
        let answers = read_answers(job.engine, job.buckets, plan.piece_rows, job.relations)?;
        progress.message(&format!(
            "KvsAll: {} tail and {} head queries of the training edges, each once per epoch with all its answers ({}{on_device})",
            answers.queries(0),
            answers.queries(1),
            fmt_bytes(bytes)
        ));
        Some(answers)
    } else {
        progress.message(&match candidates {
            VsAllCandidates::All => format!(
                "1vsAll: every query against all {} entities",
                job.buckets.partitioning.num_nodes
            ),
            VsAllCandidates::Resident => format!(
                "1vsAll: each chunk's queries against the {} resident of {} partitions' entities (vsall_candidates = \"resident\")",
                plan.capacity.min(plan.partitions as usize),
                plan.partitions
            ),
        });
        None
    };
    Ok(Some(VsAllTraining {
        label_smoothing: cfg.label_smoothing,
        query: job
            .model
            .product_query()
            .map_err(|why| EmbedError::Config(format!("embed.train.training: {why}")))?,
        answers,
    }))
}

/// What KvsAll's answers take on the device of a device run (`", on the device ..."`; empty
/// for the CPU engine), or the refusal when the device's budget cannot hold them beside what
/// its plan holds (the planner knows no edge counts, so they are checked here).
fn device_answers(plan: &EmbedPlan, edges: u64) -> Result<String> {
    let Some(dev) = &plan.device else {
        return Ok(String::new());
    };
    let bytes = DEVICE_ANSWER_BYTES * edges;
    if dev.bounded && dev.planned() + bytes > dev.memory {
        return Err(EmbedError::Budget(format!(
            "training \"KvsAll\" indexes the answers of every training query on {} ({edges} edges: {}), which device_memory {} does not hold beside the plan's {}; raise device_memory",
            dev.device,
            fmt_bytes(bytes),
            fmt_bytes(dev.memory),
            fmt_bytes(dev.planned())
        )));
    }
    Ok(format!(", {} on the device", fmt_bytes(bytes)))
}

impl Worker {
    /// Trains one chunk of a 1vsAll or KvsAll run (edges `chunk`, with `weights` one per edge
    /// or none); `salt` (the chunk's key) draws the dropout masks and the rounding of a bf16
    /// table.
    pub(crate) fn train_vs_all(
        &mut self,
        ctx: &BucketCtx,
        v: &VsAll,
        chunk: &[[i32; 3]],
        weights: &[f32],
        salt: u64,
    ) {
        let start = Instant::now();
        let w = &mut self.vs_all;
        let d = ctx.model.dim;
        w.first.clear();
        let mut n = 0u32;
        for part in &ctx.parts {
            w.first.push(n);
            n += part.size;
        }
        let n = n as usize;
        w.cands.resize(n * d, 0.0);
        for (p, part) in ctx.parts.iter().enumerate() {
            let at = w.first[p] as usize;
            for row in 0..part.size as usize {
                ctx.load_row(
                    p,
                    row as u32,
                    &mut w.cands[(at + row) * d..(at + row + 1) * d],
                );
            }
        }
        w.grad.clear();
        w.grad.resize(n * d, 0.0);
        let tails: &[bool] = match ctx.corrupt {
            Corrupt::Tail => &[true],
            Corrupt::Head => &[false],
            // Bernoulli is refused by the config.
            Corrupt::Both | Corrupt::Bernoulli => &[true, false],
        };
        for (k, &tail) in tails.iter().enumerate() {
            let o = Orientation::new(ctx, tail);
            w.gather(ctx, v, &o, chunk, weights, k);
            // 1vsAll's head side of `both` asks the tail side's edges again.
            let repeat = k == 1 && ctx.corrupt == Corrupt::Both && v.answers.is_none();
            let mut rng = Rng::new(derive(salt, k as u64));
            let (loss, queries) = w.step(ctx, v, &o, (k, repeat), n, &mut rng);
            self.loss += loss;
            self.edges += queries as u64;
            self.flops += ctx.model.flops(queries, n);
        }
        let w = &mut self.vs_all;
        // With table scope every candidate row is penalised once per chunk.
        self.loss += regularize_table(&ctx.reg, &ctx.model, chunk.len(), &w.cands, &mut w.grad);
        for (p, part) in ctx.parts.iter().enumerate() {
            let at = w.first[p] as usize;
            for row in 0..part.size as usize {
                let g = &w.grad[(at + row) * d..(at + row + 1) * d];
                part.rows.adagrad(row, g, ctx.lr, salt);
            }
        }
        w.update_relations(ctx, tails.len(), salt);
        self.busy += start.elapsed().as_secs_f64();
    }
}

impl VsAllWorker {
    /// Side `k`'s queries of `chunk` under orientation `o`: rows, labels and weights.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &mut self,
        ctx: &BucketCtx,
        v: &VsAll,
        o: &Orientation,
        chunk: &[[i32; 3]],
        weights: &[f32],
        k: usize,
    ) {
        let (d, rd) = (ctx.model.dim, ctx.model.rel_dim());
        let side = &mut self.sides[k];
        for buf in [
            &mut side.src_at,
            &mut side.rel_row,
            &mut side.one,
            &mut side.ids,
        ] {
            buf.clear();
        }
        side.offsets.clear();
        side.offsets.push(0);
        side.weights.clear();
        let (s_first, d_first) = (self.first[o.s_part], self.first[o.d_part]);
        for (i, e) in chunk.iter().enumerate() {
            let (s, r, t) = (e[o.s_col] as u32, e[1] as u32, e[o.d_col] as u32);
            if let Some(answers) = v.answers {
                // The query is asked by the edge of its smallest answer only.
                let known = answers.of(o.k, s, r);
                if known.first().map(|a| a[2]) != Some(t) {
                    continue;
                }
                side.ids.extend(known.iter().map(|a| d_first + a[2]));
                side.offsets.push(side.ids.len() as u32);
            } else {
                side.one.push(d_first + t);
            }
            side.src_at.push(s_first + s);
            side.rel_row.push(r + o.rel_offset);
            if let Some(&w) = weights.get(i) {
                side.weights.push(w);
            }
        }
        let b = side.src_at.len();
        side.src.resize(b * d, 0.0);
        side.rel.resize(b * rd, 0.0);
        for (i, &at) in side.src_at.iter().enumerate() {
            let at = at as usize;
            side.src[i * d..(i + 1) * d].copy_from_slice(&self.cands[at * d..(at + 1) * d]);
        }
        if let Some(rels) = &ctx.rels {
            for (i, &row) in side.rel_row.iter().enumerate() {
                let out = &mut side.rel[i * rd..(i + 1) * rd];
                rels.load(row as usize, out);
                if o.reverse {
                    ctx.model.reverse_relation(out);
                }
            }
        }
        side.dst.clear();
        if v.answers.is_none() {
            side.dst.resize(b * d, 0.0);
            for (i, &at) in side.one.iter().enumerate() {
                let at = at as usize;
                side.dst[i * d..(i + 1) * d].copy_from_slice(&self.cands[at * d..(at + 1) * d]);
            }
        }
    }

    /// Side `k`'s step against the `n` candidates (`repeat`: its edges were asked by the
    /// chunk's other side already; `rng` draws its dropout masks): its loss (with the
    /// regularizer) and queries; its node gradients are added to `grad` and its relation
    /// gradients kept.
    fn step(
        &mut self,
        ctx: &BucketCtx,
        v: &VsAll,
        o: &Orientation,
        (k, repeat): (usize, bool),
        n: usize,
        rng: &mut Rng,
    ) -> (f64, usize) {
        let (d, rd) = (ctx.model.dim, ctx.model.rel_dim());
        let side = &mut self.sides[k];
        let b = side.src_at.len();
        if b == 0 {
            side.g_rel.clear();
            return (0.0, 0);
        }
        let labels = match v.answers {
            Some(_) => Labels::Many {
                offsets: &side.offsets,
                ids: &side.ids,
            },
            None => Labels::One(&side.one),
        };
        let dropout = ctx.dropout.active(rd);
        let dr = &mut self.dropped;
        if dropout {
            // The step scores the dropped rows; the regularizer below takes them as stored.
            dr.apply(ctx.dropout, [&side.src, &side.rel, &[], &self.cands], rng);
        }
        let (src, rel, cands) = if dropout {
            (&dr.src, &dr.rel, &dr.neg)
        } else {
            (&side.src, &side.rel, &self.cands)
        };
        let batch = AllBatch {
            b,
            n,
            src,
            rel,
            cands,
            labels,
            weights: &side.weights,
            label_smoothing: v.label_smoothing,
        };
        let s = &mut self.scratch;
        let mut loss = all_step(&ctx.model.shape(), &ctx.loss, &v.query, &batch, s);
        let mut g = Grads {
            src: std::mem::take(&mut s.g_src),
            rel: std::mem::take(&mut s.g_rel),
            dst: Vec::new(),
            neg: std::mem::take(&mut s.g_cands),
            ..Default::default()
        };
        if dropout {
            // Back through the masks to the gathered rows.
            dr.backward(&mut g);
        }
        s.g_cands = std::mem::take(&mut g.neg);
        // The regularizer of the queries' rows (and 1vsAll's true targets) adds to their
        // gradients, as in a negative-sampling chunk.
        g.dst.resize(side.dst.len(), 0.0);
        let c = Chunk {
            b,
            n: 0,
            src: &side.src,
            rel: &side.rel,
            dst: &side.dst,
            neg: &[],
            weights: &side.weights,
            pos_query: None,
        };
        let which = ctx.reg.rows(repeat, ctx.inverse_offset > 0);
        loss += regularize(&ctx.reg, &ctx.model, &c, &mut g, which);
        for (x, gc) in self.grad.iter_mut().zip(&s.g_cands) {
            *x += gc;
        }
        let mut add = |at: u32, g: &[f32]| {
            let at = at as usize;
            for (x, gi) in self.grad[at * d..(at + 1) * d].iter_mut().zip(g) {
                *x += gi;
            }
        };
        for (i, &at) in side.src_at.iter().enumerate() {
            add(at, &g.src[i * d..(i + 1) * d]);
        }
        if !g.dst.is_empty() {
            for (i, &at) in side.one.iter().enumerate() {
                add(at, &g.dst[i * d..(i + 1) * d]);
            }
        }
        if o.reverse {
            g.rel
                .chunks_mut(rd)
                .for_each(|r| ctx.model.reverse_relation(r));
        }
        std::mem::swap(&mut side.g_rel, &mut g.rel);
        (s.g_src, s.g_rel) = (g.src, g.rel);
        (loss, b)
    }

    /// One Adagrad step per relation row the chunk's `sides` touched.
    fn update_relations(&mut self, ctx: &BucketCtx, sides: usize, salt: u64) {
        if ctx.rels.is_none() {
            return;
        }
        self.updates.clear();
        for (k, side) in self.sides[..sides].iter().enumerate() {
            for (i, &row) in side.rel_row.iter().enumerate() {
                self.updates
                    .push((row as u64, ((k as u32) << 31) | i as u32));
            }
        }
        let grads = [&self.sides[0].g_rel[..], &self.sides[1].g_rel[..]];
        step_relation_rows(ctx, &mut self.updates, &mut self.sum, grads, salt);
    }
}

#[cfg(test)]
mod tests;
