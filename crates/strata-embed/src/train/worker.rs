//! One worker thread's share of a bucket: chunks of edges, each trained in both directions.

use std::time::Instant;

use strata_store::rng::{derive, scale, Rng};

use crate::config::{Corrupt, MAX_ROWS};
use crate::model::{
    chunk_step, edge_negatives_step, regularize, Chunk, Dropout, Dropped, Grads, Loss, Regularizer,
    ScoreModel, Scratch,
};
use crate::storage::bank::Banks;
use crate::storage::entity_types::FeatureBags;
use crate::storage::shared::SharedRows;
use crate::train::typed_negatives::{NegSpace, Negative};
use crate::train::vs_all::{VsAll, VsAllWorker};

/// A resident partition's rows and node count.
#[derive(Clone, Copy)]
pub struct PartRows<'a> {
    pub rows: SharedRows<'a>,
    pub size: u32,
}

/// Where a chunk's uniform negatives come from (see [`NegativePool`]).
pub enum Pool<'a> {
    /// The partition of the corrupted side.
    Partition,
    /// Every resident partition.
    Resident,
    /// Every node: resident partitions directly, the others through their banks.
    All {
        banks: &'a Banks,
        /// Index into `parts` of each resident partition, by partition id.
        part_of: Vec<Option<usize>>,
        /// Node positions per partition and nodes in all (as in [`crate::storage::partitioning::Partitioning`]).
        part_size: u64,
        num_nodes: u64,
    },
}

/// What every chunk of one bucket `(a, b)` trains against.
pub struct BucketCtx<'a> {
    pub model: ScoreModel,
    pub loss: Loss,
    pub lr: f32,
    /// Every resident partition.
    pub parts: Vec<PartRows<'a>>,
    /// Indices into `parts` of the bucket's source (`a`) and destination (`b`) partitions.
    pub src_part: usize,
    pub dst_part: usize,
    pub rels: Option<SharedRows<'a>>,
    /// Row offset of the inverse relations (reciprocal), or 0.
    pub inverse_offset: u32,
    pub corrupt: Corrupt,
    /// `corrupt = bernoulli`: the probability of corrupting the head of an edge, by relation
    /// id (see [`crate::train::bernoulli`]); empty otherwise.
    pub head_prob: &'a [f32],
    /// Negatives per chunk (or per edge) of the side that corrupts tails.
    pub negatives: usize,
    /// Negatives per chunk (or per edge) of the side that corrupts heads.
    pub negatives_head: usize,
    /// Whether a chunk side's edges share its negatives (false: each edge draws its count).
    pub shared_negatives: bool,
    pub degree_fraction: f32,
    pub pool: Pool<'a>,
    /// Added to the loss of every chunk direction (see [`regularize`]).
    pub reg: Regularizer,
    /// Dropout on the gathered rows (see [`Dropout`]).
    pub dropout: Dropout,
    /// A typed run: the uniform negatives of tail and of head corruption (the destination's
    /// and the source's entity type; `None`: every node of the pool, untyped).
    pub negs: Option<[NegSpace; 2]>,
    /// A typed run's featurized entities, in part `feat.0`: their rows are their features'
    /// means (see [`BucketCtx::load_row`]).
    pub feat: Option<(usize, &'a FeatureBags)>,
    /// 1vsAll or KvsAll training: chunks score every candidate instead of negatives.
    pub vs_all: Option<VsAll<'a>>,
}

/// Marks a negative taken from a bank: `(BANK | partition, row of the bank)`.
const BANK: usize = 1 << (usize::BITS - 1);
/// Part number of bank rows in update keys: `BANK_KEY + partition` (so that `part << 40`
/// still fits in 64 bits for up to 2^22 partitions).
const BANK_KEY: usize = 1 << 22;

impl BucketCtx<'_> {
    /// Negatives per chunk (per edge with `shared_negatives = false`) of the side that
    /// corrupts tails (`tail`) or heads.
    pub fn negatives_of(&self, tail: bool) -> usize {
        if tail {
            self.negatives
        } else {
            self.negatives_head
        }
    }

    /// A uniform negative for side `k` (0: tail corruption, 1: head) whose targets lie in
    /// part `target`: `(part index, local row)`, or `(BANK | partition, bank row)` for a node
    /// of a partition on disk.
    fn uniform_node(&self, k: usize, target: usize, rng: &mut Rng) -> (usize, u32) {
        if let Some(negs) = &self.negs {
            let banks = match &self.pool {
                Pool::All { banks, .. } => Some(*banks),
                _ => None,
            };
            return match negs[k].draw(banks, rng) {
                Negative::Part(part, row) => (part, row),
                Negative::Bank(p, row) => (BANK | p as usize, row),
            };
        }
        match &self.pool {
            Pool::Partition => (target, rng.below(self.parts[target].size as u64) as u32),
            Pool::Resident => {
                let total: u64 = self.parts.iter().map(|p| p.size as u64).sum();
                let mut r = rng.below(total);
                for (i, p) in self.parts.iter().enumerate() {
                    if r < p.size as u64 {
                        return (i, r as u32);
                    }
                    r -= p.size as u64;
                }
                unreachable!("r is below the resident node count")
            }
            Pool::All {
                banks,
                part_of,
                part_size,
                num_nodes,
            } => {
                // One draw per negative, bank or not (a device step addresses draws by
                // position): a bank row is chosen by the rest of the draw.
                let (pos, rest) = rng.below_and_rest(*num_nodes);
                let (p, local) = ((pos / part_size) as u32, (pos % part_size) as u32);
                match part_of[p as usize] {
                    Some(i) => (i, local),
                    None => (BANK | p as usize, scale(rest, banks.len(p) as u64) as u32),
                }
            }
        }
    }

    /// Copies negative `id`'s row into `out`.
    fn load_negative(&self, (part, row): (usize, u32), out: &mut [f32]) {
        match &self.pool {
            Pool::All { banks, .. } if part & BANK != 0 => {
                out.copy_from_slice(banks.row((part & !BANK) as u32, row))
            }
            _ => self.load_row(part, row, out),
        }
    }

    /// The features of row `row` of part `part` when it is a featurized entity.
    #[inline]
    fn bag(&self, part: usize, row: u32) -> Option<&[u32]> {
        self.feat
            .and_then(|(p, bags)| if p == part { bags.bag(row) } else { None })
    }

    /// Asks the CPU for row `row` of part `part` ahead of its load (a featurized entity's
    /// features are left alone: its row is no storage row).
    #[inline]
    fn prefetch_row(&self, part: usize, row: u32) {
        if self.bag(part, row).is_none() {
            self.parts[part].rows.prefetch(row as usize);
        }
    }

    /// Copies row `row` of part `part` into `out`: a featurized entity's is the mean of its
    /// features' rows.
    #[inline]
    pub fn load_row(&self, part: usize, row: u32, out: &mut [f32]) {
        let rows = &self.parts[part].rows;
        match self.bag(part, row) {
            Some(bag) => FeatureBags::mean(bag, |f, acc| rows.add_to(f, acc), out),
            None => rows.load(row as usize, out),
        }
    }
}

/// One corrupted side of a chunk: the rows it loaded, its negatives and its gradients.
#[derive(Default)]
struct Side {
    src: Vec<f32>,
    rel: Vec<f32>,
    dst: Vec<f32>,
    neg: Vec<f32>,
    /// `(part index, local row)` of each negative.
    neg_ids: Vec<(usize, u32)>,
    grads: Grads,
    /// One edge's gradients, with negatives per edge.
    edge_grads: Grads,
    /// The rows as the step saw them, with dropout on.
    dropped: Dropped,
}

/// A worker's buffers and counters.
#[derive(Default)]
pub struct Worker {
    scratch: Scratch,
    /// The chunk's corrupted sides in training order (tail corruption first).
    sides: [Side; 2],
    /// `corrupt = bernoulli`: the chunk's edges (and weights) whose tails, and whose heads,
    /// are corrupted.
    split: [(Vec<[i32; 3]>, Vec<f32>); 2],
    updates: Vec<(u64, u32)>,
    sum: Vec<f32>,
    /// Gradients of featurized entities' features (rows of `dim`), and the updates they
    /// replace the entities' with.
    feat_grads: Vec<f32>,
    feat_updates: Vec<(u64, u32)>,
    /// Loss summed over chunks and directions.
    pub loss: f64,
    /// Positive edge-directions trained.
    pub edges: u64,
    /// Floating-point operations of the chunk steps.
    pub flops: f64,
    /// Seconds spent in chunk steps.
    pub busy: f64,
    /// The buffers of 1vsAll and KvsAll chunks.
    pub(crate) vs_all: VsAllWorker,
}

/// Rows ahead whose cache lines the gathers of a chunk's rows, and its Adagrad updates
/// (parameters and state: random rows, each a cache miss otherwise), request early.
const PREFETCH_AHEAD: usize = 4;

/// Bits of an update key below the part index.
const PART_SHIFT: u32 = 40;
/// An update's tag: which side (bit 31), which gradient (bits 29-30: source, destination or
/// negative rows of the step) and the row within it (bits 0-28).
const SIDE_BIT: u32 = 1 << 31;
const FROM_SRC: u32 = 0;
const FROM_DST: u32 = 1 << 29;
const FROM_NEG: u32 = 2 << 29;
/// A featurized entity's feature: a row of the worker's `feat_grads`.
const FROM_FEAT: u32 = 3 << 29;
const FROM_MASK: u32 = 3 << 29;
const ROW_MASK: u32 = (MAX_ROWS - 1) as u32;

/// How one side reads an edge `(s, r, t)`: tail corruption scores `(s, r, t')`, head
/// corruption `(t, r⁻¹, s')` (or `(t, r', s')` with the reversed relation).
pub(crate) struct Orientation {
    /// The side: 0 tail corruption, 1 head corruption.
    pub(crate) k: usize,
    pub(crate) s_part: usize,
    pub(crate) s_col: usize,
    pub(crate) d_part: usize,
    pub(crate) d_col: usize,
    pub(crate) rel_offset: u32,
    pub(crate) reverse: bool,
}

impl Orientation {
    pub(crate) fn new(ctx: &BucketCtx, tail: bool) -> Orientation {
        if tail {
            Orientation {
                k: 0,
                s_part: ctx.src_part,
                s_col: 0,
                d_part: ctx.dst_part,
                d_col: 2,
                rel_offset: 0,
                reverse: false,
            }
        } else {
            Orientation {
                k: 1,
                s_part: ctx.dst_part,
                s_col: 2,
                d_part: ctx.src_part,
                d_col: 0,
                rel_offset: ctx.inverse_offset,
                reverse: ctx.inverse_offset == 0 && ctx.model.rel_dim() > 0,
            }
        }
    }
}

impl Worker {
    /// Zeroes the loss, edge, FLOP and time counters (at the start of an epoch).
    pub fn reset_counters(&mut self) {
        self.loss = 0.0;
        self.edges = 0;
        self.flops = 0.0;
        self.busy = 0.0;
    }

    /// Trains one chunk (rows `(src_local, rel, dst_local)`, with `weights`, one per edge or
    /// none); `key` seeds its negatives (and, with `corrupt = bernoulli`, each edge's side).
    /// The corrupted sides are computed from the same parameters and their gradients summed
    /// into one Adagrad step per row (the loss is the sum of the sides' losses, as in Marius).
    pub fn train_chunk(&mut self, ctx: &BucketCtx, chunk: &[[i32; 3]], weights: &[f32], key: u64) {
        if let Some(v) = &ctx.vs_all {
            return self.train_vs_all(ctx, v, chunk, weights, key);
        }
        let start = Instant::now();
        let all = |tail| SideEdges {
            tail,
            edges: chunk,
            weights,
        };
        let mut split = std::mem::take(&mut self.split);
        let mut sides = [all(true), all(false)];
        let count = match ctx.corrupt {
            Corrupt::Both => 2,
            Corrupt::Tail => 1,
            Corrupt::Head => {
                sides[0] = all(false);
                1
            }
            Corrupt::Bernoulli => {
                let mut rng = Rng::new(derive(key, 2));
                split_by_side(chunk, weights, ctx.head_prob, &mut rng, &mut split);
                let mut count = 0;
                for (tail, (edges, weights)) in [true, false].into_iter().zip(&split) {
                    if !edges.is_empty() {
                        sides[count] = SideEdges {
                            tail,
                            edges,
                            weights,
                        };
                        count += 1;
                    }
                }
                count
            }
        };
        let sides = &sides[..count];
        for (k, side) in sides.iter().enumerate() {
            let mut rng = Rng::new(derive(key, k as u64));
            // The head side of `both` trains the tail side's edges again.
            let repeat = k == 1 && ctx.corrupt == Corrupt::Both;
            self.forward_backward(ctx, side, k, repeat, &mut rng);
        }
        self.update_nodes(ctx, sides, key);
        self.update_relations(ctx, sides, key);
        self.split = split;
        self.busy += start.elapsed().as_secs_f64();
    }

    /// Loads side `k`'s rows and negatives and computes its loss and gradients (`repeat`: its
    /// edges were trained by the chunk's other side already).
    fn forward_backward(
        &mut self,
        ctx: &BucketCtx,
        edges: &SideEdges,
        k: usize,
        repeat: bool,
        rng: &mut Rng,
    ) {
        let (d, rd) = (ctx.model.dim, ctx.model.rel_dim());
        let o = Orientation::new(ctx, edges.tail);
        let chunk = edges.edges;
        let b = chunk.len();
        let side = &mut self.sides[k];
        resize(&mut side.src, b * d);
        resize(&mut side.dst, b * d);
        resize(&mut side.rel, b * rd);
        for (i, e) in chunk.iter().enumerate() {
            // The rows are scattered over the table: ask for a later edge's rows now, so that
            // their cache misses overlap this edge's copies.
            if let Some(ahead) = chunk.get(i + PREFETCH_AHEAD) {
                ctx.prefetch_row(o.s_part, ahead[o.s_col] as u32);
                ctx.prefetch_row(o.d_part, ahead[o.d_col] as u32);
            }
            ctx.load_row(
                o.s_part,
                e[o.s_col] as u32,
                &mut side.src[i * d..(i + 1) * d],
            );
            ctx.load_row(
                o.d_part,
                e[o.d_col] as u32,
                &mut side.dst[i * d..(i + 1) * d],
            );
            if let Some(rels) = &ctx.rels {
                let row = &mut side.rel[i * rd..(i + 1) * rd];
                rels.load((e[1] as u32 + o.rel_offset) as usize, row);
                if o.reverse {
                    ctx.model.reverse_relation(row);
                }
            }
        }
        // Negatives shared by the chunk (or each edge's own, one set after another): a
        // degree-weighted part (targets of the chunk's own edges: each node appears in
        // proportion to its degree) and a uniform part.
        let n = ctx.negatives_of(edges.tail);
        let sets = if ctx.shared_negatives { 1 } else { b };
        let n_degree = ((n as f32) * ctx.degree_fraction).round() as usize;
        side.neg_ids.clear();
        for j in (0..sets).flat_map(|_| 0..n) {
            let id = if j < n_degree {
                (
                    o.d_part,
                    chunk[rng.below(b as u64) as usize][o.d_col] as u32,
                )
            } else {
                ctx.uniform_node(o.k, o.d_part, rng)
            };
            side.neg_ids.push(id);
        }
        resize(&mut side.neg, sets * n * d);
        for (j, &id) in side.neg_ids.iter().enumerate() {
            if let Some(&(part, row)) = side.neg_ids.get(j + PREFETCH_AHEAD) {
                if part & BANK == 0 {
                    ctx.prefetch_row(part, row);
                }
            }
            ctx.load_negative(id, &mut side.neg[j * d..(j + 1) * d]);
        }
        let c = Chunk {
            b,
            n: sets * n,
            src: &side.src,
            rel: &side.rel,
            dst: &side.dst,
            neg: &side.neg,
            weights: edges.weights,
            pos_query: None,
        };
        if ctx.dropout.active(rd) {
            // The step scores the dropped rows (masks drawn after the negatives, from the
            // side's own generator); the regularizer takes the rows as stored.
            let dr = &mut side.dropped;
            dr.apply(ctx.dropout, [c.src, c.rel, c.dst, c.neg], rng);
            let dropped = Chunk {
                src: &dr.src,
                rel: &dr.rel,
                dst: &dr.dst,
                neg: &dr.neg,
                pos_query: dr.pos_query(),
                ..c
            };
            let (g, e) = (&mut side.grads, &mut side.edge_grads);
            self.loss += step(ctx, &dropped, n, g, e, &mut self.scratch);
            dr.backward(&mut side.grads);
        } else {
            let (g, e) = (&mut side.grads, &mut side.edge_grads);
            self.loss += step(ctx, &c, n, g, e, &mut self.scratch);
        }
        let which = ctx.reg.rows(repeat, ctx.inverse_offset > 0);
        self.loss += regularize(&ctx.reg, &ctx.model, &c, &mut side.grads, which);
        if o.reverse {
            side.grads
                .rel
                .chunks_mut(rd)
                .for_each(|g| ctx.model.reverse_relation(g));
        }
        self.edges += b as u64;
        self.flops += ctx.model.flops(b, n);
    }

    /// One Adagrad step per node row touched by the chunk, with its gradients from every side
    /// and role (source, target, negative) summed; `salt` (the chunk's key) draws the rounding
    /// of a bf16 table.
    fn update_nodes(&mut self, ctx: &BucketCtx, sides: &[SideEdges], salt: u64) {
        let d = ctx.model.dim;
        let key = |part: usize, row: u32| ((part as u64) << PART_SHIFT) | row as u64;
        // Rows fit 32 bits, below PART_SHIFT.
        let split = |k: u64| ((k >> PART_SHIFT) as usize, k as u32);
        self.updates.clear();
        for (k, side) in sides.iter().enumerate() {
            let o = Orientation::new(ctx, side.tail);
            let side_bit = if k == 1 { SIDE_BIT } else { 0 };
            for (i, e) in side.edges.iter().enumerate() {
                self.updates.push((
                    key(o.s_part, e[o.s_col] as u32),
                    side_bit | FROM_SRC | i as u32,
                ));
                self.updates.push((
                    key(o.d_part, e[o.d_col] as u32),
                    side_bit | FROM_DST | i as u32,
                ));
            }
            for (j, &(part, local)) in self.sides[k].neg_ids.iter().enumerate() {
                // Bank rows (partitions on disk) are keyed apart: their gradient goes to the bank.
                let part = if part & BANK == 0 {
                    part
                } else {
                    BANK_KEY + (part & !BANK)
                };
                self.updates
                    .push((key(part, local), side_bit | FROM_NEG | j as u32));
            }
        }
        if ctx.feat.is_some() {
            // A featurized entity is the mean of its features: each feature takes the
            // entity's gradient over the bag's size, summed with its other updates below.
            self.feat_grads.clear();
            self.feat_updates.clear();
            for &(k, tag) in &self.updates {
                let (part, row) = split(k);
                let Some(bag) = ctx.bag(part, row) else {
                    self.feat_updates.push((k, tag));
                    continue;
                };
                let g = grad_of(&self.sides, &[], d, tag);
                let scale = 1.0 / bag.len() as f32;
                for &f in bag {
                    let at = (self.feat_grads.len() / d) as u32;
                    self.feat_grads.extend(g.iter().map(|x| x * scale));
                    self.feat_updates.push((key(part, f), FROM_FEAT | at));
                }
            }
            std::mem::swap(&mut self.updates, &mut self.feat_updates);
        }
        self.updates.sort_unstable_by_key(|u| u.0);
        let (sides, feat) = (&self.sides, &self.feat_grads);
        let grad_row = |tag: u32| grad_of(sides, feat, d, tag);
        let banked = |part: usize| matches!(&ctx.pool, Pool::All { .. } if part >= BANK_KEY);
        let prefetch = |k: u64| {
            let (part, row) = split(k);
            if !banked(part) {
                ctx.parts[part].rows.prefetch_update(row as usize);
            }
        };
        apply_sorted(
            &self.updates,
            &mut self.sum,
            d,
            grad_row,
            prefetch,
            |k, g| {
                let (part, row) = split(k);
                match &ctx.pool {
                    Pool::All { banks, .. } if part >= BANK_KEY => {
                        banks.add_grad((part - BANK_KEY) as u32, row, g)
                    }
                    _ => ctx.parts[part].rows.adagrad(row as usize, g, ctx.lr, salt),
                }
            },
        );
    }

    /// One Adagrad step per relation row touched by the chunk.
    fn update_relations(&mut self, ctx: &BucketCtx, sides: &[SideEdges], key: u64) {
        if ctx.rels.is_none() {
            return;
        }
        self.updates.clear();
        for (k, side) in sides.iter().enumerate() {
            let o = Orientation::new(ctx, side.tail);
            let side_bit = if k == 1 { SIDE_BIT } else { 0 };
            for (i, e) in side.edges.iter().enumerate() {
                self.updates
                    .push(((e[1] as u32 + o.rel_offset) as u64, side_bit | i as u32));
            }
        }
        let grads = [&self.sides[0].grads.rel[..], &self.sides[1].grads.rel[..]];
        step_relation_rows(ctx, &mut self.updates, &mut self.sum, grads, key);
    }
}

/// The loss and gradients of chunk side `c` (see [`chunk_step`]): its edges score shared
/// negatives, or (`shared_negatives = false`) each its own `n`, `e` holding one edge's
/// gradients.
fn step(
    ctx: &BucketCtx,
    c: &Chunk,
    n: usize,
    g: &mut Grads,
    e: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    if ctx.shared_negatives {
        chunk_step(&ctx.model, &ctx.loss, c, g, s)
    } else {
        edge_negatives_step(&ctx.model, &ctx.loss, (c, n), g, e, s)
    }
}

/// One Adagrad step per relation row in `updates` (`(row, side << 31 | i)`: the chunk's `i`-th
/// row of side `side`, whose gradient is `grads[side][i * rel_dim..]`), with the sum of the
/// row's gradients where the chunk touched it more than once; `updates` is sorted in place.
pub(crate) fn step_relation_rows(
    ctx: &BucketCtx,
    updates: &mut [(u64, u32)],
    sum: &mut Vec<f32>,
    grads: [&[f32]; 2],
    salt: u64,
) {
    let Some(rels) = &ctx.rels else { return };
    let rd = ctx.model.rel_dim();
    updates.sort_unstable_by_key(|u| u.0);
    apply_sorted(
        updates,
        sum,
        rd,
        |tag| {
            let i = (tag & !SIDE_BIT) as usize;
            &grads[(tag >> 31) as usize][i * rd..(i + 1) * rd]
        },
        |_| {},
        |row, g| rels.adagrad(row as usize, g, ctx.lr, salt),
    );
}

/// The gradient row an update's `tag` names: a side's source, destination or negative
/// gradient, or a featurized entity's feature gradient in `feat` (rows of `d`).
fn grad_of<'g>(sides: &'g [Side; 2], feat: &'g [f32], d: usize, tag: u32) -> &'g [f32] {
    let g = &sides[(tag >> 31) as usize].grads;
    let r = (tag & ROW_MASK) as usize;
    match tag & FROM_MASK {
        FROM_SRC => &g.src[r * d..(r + 1) * d],
        FROM_DST => &g.dst[r * d..(r + 1) * d],
        FROM_NEG => &g.neg[r * d..(r + 1) * d],
        _ => &feat[r * d..(r + 1) * d],
    }
}

/// The edges one corrupted side of a chunk trains: tail or head corruption, its edges and
/// their weights (one per edge, or empty: every weight 1).
#[derive(Clone, Copy)]
struct SideEdges<'c> {
    tail: bool,
    edges: &'c [[i32; 3]],
    weights: &'c [f32],
}

/// Bernoulli corruption (Wang et al. 2014): draws each edge's side, its head with probability
/// `head_prob[relation]`, and puts the edge (and its weight) in `split[0]` (tail corrupted) or
/// `split[1]` (head corrupted).
fn split_by_side(
    chunk: &[[i32; 3]],
    weights: &[f32],
    head_prob: &[f32],
    rng: &mut Rng,
    split: &mut [(Vec<[i32; 3]>, Vec<f32>); 2],
) {
    for (edges, w) in split.iter_mut() {
        edges.clear();
        w.clear();
    }
    for (i, e) in chunk.iter().enumerate() {
        let head = rng.next_f64() < head_prob[e[1] as usize] as f64;
        let (edges, w) = &mut split[head as usize];
        edges.push(*e);
        if let Some(&x) = weights.get(i) {
            w.push(x);
        }
    }
}

/// Sums the gradients of equal keys (sorted `updates`) and applies each sum once, having
/// called `prefetch` with the keys of the [`PREFETCH_AHEAD`] updates after it.
pub(crate) fn apply_sorted<'g>(
    updates: &[(u64, u32)],
    sum: &mut Vec<f32>,
    dim: usize,
    grad: impl Fn(u32) -> &'g [f32],
    prefetch: impl Fn(u64),
    mut apply: impl FnMut(u64, &[f32]),
) {
    resize(sum, dim);
    // The next update whose row is to be prefetched.
    let mut ahead = 0;
    let mut i = 0;
    while i < updates.len() {
        let key = updates[i].0;
        while ahead < updates.len() && ahead <= i + PREFETCH_AHEAD {
            prefetch(updates[ahead].0);
            ahead += 1;
        }
        let mut j = i + 1;
        while j < updates.len() && updates[j].0 == key {
            j += 1;
        }
        if j == i + 1 {
            // Most rows have one gradient in a chunk: apply it where it is.
            apply(key, grad(updates[i].1));
        } else {
            sum.copy_from_slice(grad(updates[i].1));
            for u in &updates[i + 1..j] {
                for (s, g) in sum.iter_mut().zip(grad(u.1)) {
                    *s += g;
                }
            }
            apply(key, sum);
        }
        i = j;
    }
}

/// Sizes a buffer that the caller then overwrites entirely (so nothing is cleared).
fn resize(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LossKind, PbgForm, ScoreKind};
    use std::cell::RefCell;

    #[test]
    fn sorted_updates_sum_equal_keys_and_prefetch_each_update_ahead_of_its_step() {
        // Keys 1 (three gradients), 2, 5 (two), 7, 8, 9: gradient `tag` is [tag, 10 tag].
        let updates = [
            (1, 1),
            (1, 2),
            (1, 3),
            (2, 4),
            (5, 5),
            (5, 6),
            (7, 7),
            (8, 8),
            (9, 9),
        ];
        let grads: Vec<[f32; 2]> = (0..10).map(|t| [t as f32, 10.0 * t as f32]).collect();
        let events = RefCell::new(Vec::new());
        let mut sum = Vec::new();
        apply_sorted(
            &updates,
            &mut sum,
            2,
            |tag| &grads[tag as usize][..],
            |k| events.borrow_mut().push(("prefetch", k, 0.0)),
            |k, g| {
                assert_eq!(g[1], 10.0 * g[0]);
                events.borrow_mut().push(("apply", k, g[0]));
            },
        );
        let events = events.into_inner();
        let applied: Vec<_> = events
            .iter()
            .filter(|e| e.0 == "apply")
            .map(|e| (e.1, e.2))
            .collect();
        assert_eq!(
            applied,
            [(1, 6.0), (2, 4.0), (5, 11.0), (7, 7.0), (8, 8.0), (9, 9.0)]
        );
        // Every update is prefetched once, in order, and before its key is applied; when a key
        // is applied, the updates up to PREFETCH_AHEAD after its first one have been asked for.
        let prefetched: Vec<u64> = events
            .iter()
            .filter(|e| e.0 == "prefetch")
            .map(|e| e.1)
            .collect();
        assert_eq!(prefetched, updates.map(|u| u.0));
        for (at, e) in events.iter().enumerate().filter(|(_, e)| e.0 == "apply") {
            let first = updates.iter().position(|u| u.0 == e.1).unwrap();
            let asked = events[..at].iter().filter(|e| e.0 == "prefetch").count();
            assert_eq!(asked, (first + PREFETCH_AHEAD + 1).min(updates.len()));
        }
    }

    #[test]
    fn bernoulli_sides_follow_each_relations_probability_and_keep_weights() {
        let head_prob = [0.1f32, 0.5, 0.9, 0.0];
        let edges: Vec<[i32; 3]> = (0..40_000).map(|i| [i, i % 4, i + 1]).collect();
        let weights: Vec<f32> = (0..40_000).map(|i| i as f32).collect();
        let mut rng = Rng::new(7);
        let mut split = Default::default();
        let (mut heads, mut total) = ([0u32; 4], [0u32; 4]);
        for (chunk, w) in edges.chunks(1000).zip(weights.chunks(1000)) {
            split_by_side(chunk, w, &head_prob, &mut rng, &mut split);
            for (side, (e, w)) in split.iter().enumerate() {
                assert_eq!(e.len(), w.len());
                for (e, &w) in e.iter().zip(w) {
                    assert_eq!(w, e[0] as f32, "a weight left its edge");
                    total[e[1] as usize] += 1;
                    heads[e[1] as usize] += side as u32;
                }
            }
        }
        for r in 0..4 {
            let freq = heads[r] as f64 / total[r] as f64;
            // 10,000 draws each: 4 standard deviations are below 0.02.
            assert!(
                (freq - head_prob[r] as f64).abs() < 0.02,
                "relation {r}: heads corrupted {freq}, expected {}",
                head_prob[r]
            );
        }
        assert_eq!(heads[3], 0);
        assert_eq!(total.iter().sum::<u32>(), 40_000);
        // Unweighted chunks split without weights.
        split_by_side(&edges[..10], &[], &head_prob, &mut rng, &mut split);
        assert!(split.iter().all(|(e, w)| w.is_empty() && e.len() <= 10));
    }

    /// A DistMult bucket over one partition, softmax, the resident pool: node rows and their
    /// Adagrad state, then relation rows (each relation and its inverse) and theirs, in
    /// `tables`; the tests vary the corruption and the negatives.
    fn distmult_ctx<'a>(
        d: usize,
        tables: [&'a mut Vec<f32>; 4],
        corrupt: Corrupt,
        negatives: usize,
        shared_negatives: bool,
    ) -> BucketCtx<'a> {
        let [params, state, rel_params, rel_state] = tables;
        let size = (params.len() / d) as u32;
        BucketCtx {
            model: ScoreModel {
                kind: ScoreKind::DistMult,
                dim: d,
                transe_norm: 2,
                pbg: PbgForm::default(),
            },
            loss: Loss::plain(LossKind::Softmax, 0.0),
            lr: 0.1,
            parts: vec![PartRows {
                rows: SharedRows::new(params, state, d, d),
                size,
            }],
            src_part: 0,
            dst_part: 0,
            rels: Some(SharedRows::new(rel_params, rel_state, d, d)),
            inverse_offset: 1,
            corrupt,
            head_prob: &[0.3],
            negatives,
            negatives_head: negatives,
            shared_negatives,
            degree_fraction: 0.0,
            pool: Pool::Resident,
            reg: Regularizer::default(),
            dropout: Dropout::default(),
            negs: None,
            feat: None,
            vs_all: None,
        }
    }

    #[test]
    fn bernoulli_trains_each_edge_on_one_side() {
        let (d, rows) = (8usize, 64usize);
        let mut params: Vec<f32> = (0..rows * d).map(|i| (i % 7) as f32 * 0.01).collect();
        let mut state = vec![0.0f32; rows * d];
        let mut rel_params = vec![0.5f32; 2 * d];
        let mut rel_state = vec![0.0f32; 2 * d];
        let chunk: Vec<[i32; 3]> = (0..50).map(|i| [i % 64, 0, (i * 7) % 64]).collect();
        let mut edges_by = |corrupt: Corrupt| {
            let tables = [&mut params, &mut state, &mut rel_params, &mut rel_state];
            let ctx = distmult_ctx(d, tables, corrupt, 16, true);
            let mut w = Worker::default();
            w.train_chunk(&ctx, &chunk, &[], 3);
            assert!(w.loss.is_finite() && w.loss > 0.0);
            w.edges
        };
        assert_eq!(edges_by(Corrupt::Both), 100);
        assert_eq!(edges_by(Corrupt::Bernoulli), 50);
    }

    /// Each side draws its own count of shared negatives (`negatives` for the tail side,
    /// `negatives_head` for the head side), whichever sides a chunk corrupts.
    #[test]
    fn each_side_draws_its_own_count_of_shared_negatives() {
        let (d, rows) = (8usize, 64usize);
        let mut params: Vec<f32> = (0..rows * d).map(|i| (i % 5) as f32 * 0.01).collect();
        let mut state = vec![0.0f32; rows * d];
        let mut rel_params = vec![0.5f32; 2 * d];
        let mut rel_state = vec![0.0f32; 2 * d];
        let chunk: Vec<[i32; 3]> = (0..20).map(|i| [i % 64, 0, (i * 3) % 64]).collect();
        for (corrupt, want) in [
            (Corrupt::Both, [7, 3]),
            (Corrupt::Head, [3, 0]),
            (Corrupt::Tail, [7, 0]),
        ] {
            let tables = [&mut params, &mut state, &mut rel_params, &mut rel_state];
            let mut ctx = distmult_ctx(d, tables, corrupt, 7, true);
            ctx.negatives_head = 3;
            let mut w = Worker::default();
            w.train_chunk(&ctx, &chunk, &[], 5);
            let drawn = [w.sides[0].neg_ids.len(), w.sides[1].neg_ids.len()];
            assert_eq!(drawn, want, "{corrupt:?}");
            assert!(w.loss.is_finite() && w.loss > 0.0);
        }
    }

    /// `shared_negatives = false`: each edge of each side draws its own negatives (the tail
    /// side `negatives`, the head side `negatives_head`), the loss is each edge's against its
    /// own, and exactly the rows a side used take a step.
    #[test]
    fn negatives_per_edge_are_drawn_and_stepped_per_edge() {
        let (d, rows, counts) = (8usize, 64usize, [5usize, 2]);
        let mut rng = Rng::new(7);
        let mut random =
            |len: usize| -> Vec<f32> { (0..len).map(|_| rng.next_f64() as f32 - 0.5).collect() };
        let mut params = random(rows * d);
        let mut state = vec![0.0f32; rows * d];
        let mut rel_params = random(2 * d);
        let mut rel_state = vec![0.0f32; 2 * d];
        let (before, rels_before) = (params.clone(), rel_params.clone());
        let chunk: Vec<[i32; 3]> = (0..6).map(|i| [i * 5 % 64, 0, (i * 11 + 3) % 64]).collect();
        let mut w = Worker::default();
        let (model, loss) = {
            let tables = [&mut params, &mut state, &mut rel_params, &mut rel_state];
            let mut ctx = distmult_ctx(d, tables, Corrupt::Both, counts[0], false);
            ctx.negatives_head = counts[1];
            w.train_chunk(&ctx, &chunk, &[], 3);
            (ctx.model, ctx.loss)
        };
        let row = |t: &[f32], r: usize| t[r * d..(r + 1) * d].to_vec();
        let mut touched = std::collections::BTreeSet::new();
        let mut want = 0.0;
        for (k, (s_col, d_col)) in [(0, 2), (2, 0)].into_iter().enumerate() {
            let n = counts[k];
            let ids: Vec<usize> = w.sides[k]
                .neg_ids
                .iter()
                .map(|&(_, r)| r as usize)
                .collect();
            assert_eq!(ids.len(), chunk.len() * n, "side {k}: a set per edge");
            let sets: Vec<&[usize]> = ids.chunks(n).collect();
            assert!(
                sets.iter().any(|s| *s != sets[0]),
                "side {k}: every edge drew the same"
            );
            let gather = |col: usize| -> Vec<f32> {
                chunk
                    .iter()
                    .flat_map(|e| row(&before, e[col] as usize))
                    .collect()
            };
            let (src, dst) = (gather(s_col), gather(d_col));
            let rel: Vec<f32> = chunk.iter().flat_map(|_| row(&rels_before, k)).collect();
            let neg: Vec<f32> = ids.iter().flat_map(|&r| row(&before, r)).collect();
            let c = Chunk {
                b: chunk.len(),
                n: chunk.len() * n,
                src: &src,
                rel: &rel,
                dst: &dst,
                neg: &neg,
                weights: &[],
                pos_query: None,
            };
            let (mut g, mut e) = (Grads::default(), Grads::default());
            want += edge_negatives_step(
                &model,
                &loss,
                (&c, n),
                &mut g,
                &mut e,
                &mut Scratch::default(),
            );
            touched.extend(chunk.iter().flat_map(|e| [e[0] as usize, e[2] as usize]));
            touched.extend(ids);
        }
        assert!((w.loss - want).abs() < 1e-5 * want, "{} vs {want}", w.loss);
        for r in 0..rows {
            let moved = row(&params, r) != row(&before, r);
            assert_eq!(moved, touched.contains(&r), "row {r}");
        }
    }
}
