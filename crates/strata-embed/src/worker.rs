//! One worker thread's share of a bucket: chunks of edges, each trained in both directions.

use std::time::Instant;

use strata_store::rng::{derive, Rng};

use crate::bank::Banks;
use crate::config::{Corrupt, MAX_ROWS};
use crate::model::{
    chunk_step, regularize, Chunk, Grads, LossKind, Regularizer, ScoreModel, Scratch,
};
use crate::shared::SharedRows;

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
        /// Node positions per partition and nodes in all (as in [`crate::partitioning::Partitioning`]).
        part_size: u64,
        num_nodes: u64,
    },
}

/// What every chunk of one bucket `(a, b)` trains against.
pub struct BucketCtx<'a> {
    pub model: ScoreModel,
    pub loss: LossKind,
    pub margin: f32,
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
    pub negatives: usize,
    pub degree_fraction: f32,
    pub pool: Pool<'a>,
    /// Added to the loss of every chunk direction (see [`regularize`]).
    pub reg: Regularizer,
}

/// Marks a negative taken from a bank: `(BANK | partition, row of the bank)`.
const BANK: usize = 1 << (usize::BITS - 1);
/// Part number of bank rows in update keys: `BANK_KEY + partition` (so that `part << 40`
/// still fits in 64 bits for up to 2^22 partitions).
const BANK_KEY: usize = 1 << 22;

impl BucketCtx<'_> {
    /// A uniform negative for a side whose targets lie in part `target`: `(part index, local
    /// row)`, or `(BANK | partition, bank row)` for a node of a partition on disk.
    fn uniform_node(&self, target: usize, rng: &mut Rng) -> (usize, u32) {
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
                let pos = rng.below(*num_nodes);
                let (p, local) = ((pos / part_size) as u32, (pos % part_size) as u32);
                match part_of[p as usize] {
                    Some(i) => (i, local),
                    None => (BANK | p as usize, rng.below(banks.len(p) as u64) as u32),
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
            _ => self.parts[part].rows.load(row as usize, out),
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
}

/// A worker's buffers and counters.
#[derive(Default)]
pub struct Worker {
    scratch: Scratch,
    /// Tail corruption, then head corruption.
    sides: [Side; 2],
    updates: Vec<(u64, u32)>,
    sum: Vec<f32>,
    /// Loss summed over chunks and directions.
    pub loss: f64,
    /// Positive edge-directions trained.
    pub edges: u64,
    /// Floating-point operations of the chunk steps.
    pub flops: f64,
    /// Seconds spent in chunk steps.
    pub busy: f64,
}

/// Rows ahead whose cache lines the gathers of a chunk's rows request early.
const PREFETCH_AHEAD: usize = 4;

/// Bits of an update key below the part index.
const PART_SHIFT: u32 = 40;
/// An update's tag: which side (bit 31), which gradient (bits 29-30: source, destination or
/// negative rows of the step) and the row within it (bits 0-28).
const SIDE_BIT: u32 = 1 << 31;
const FROM_SRC: u32 = 0;
const FROM_DST: u32 = 1 << 29;
const FROM_NEG: u32 = 2 << 29;
const FROM_MASK: u32 = 3 << 29;
const ROW_MASK: u32 = (MAX_ROWS - 1) as u32;

/// How one side reads an edge `(s, r, t)`: tail corruption scores `(s, r, t')`, head
/// corruption `(t, r⁻¹, s')` (or `(t, r', s')` with the reversed relation).
struct Orientation {
    s_part: usize,
    s_col: usize,
    d_part: usize,
    d_col: usize,
    rel_offset: u32,
    reverse: bool,
}

impl Orientation {
    fn new(ctx: &BucketCtx, tail: bool) -> Orientation {
        if tail {
            Orientation {
                s_part: ctx.src_part,
                s_col: 0,
                d_part: ctx.dst_part,
                d_col: 2,
                rel_offset: 0,
                reverse: false,
            }
        } else {
            Orientation {
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

    /// Trains one chunk (rows `(src_local, rel, dst_local)`); `key` seeds its negatives. Both
    /// corrupted sides are computed from the same parameters and their gradients summed into
    /// one Adagrad step per row (the loss is the sum of both sides' losses, as in Marius).
    pub fn train_chunk(&mut self, ctx: &BucketCtx, chunk: &[[i32; 3]], key: u64) {
        let start = Instant::now();
        let sides: &[bool] = match ctx.corrupt {
            Corrupt::Both => &[true, false],
            Corrupt::Tail => &[true],
            Corrupt::Head => &[false],
        };
        for (k, &tail) in sides.iter().enumerate() {
            let mut rng = Rng::new(derive(key, k as u64));
            self.forward_backward(ctx, chunk, k, &Orientation::new(ctx, tail), &mut rng);
        }
        self.update_nodes(ctx, chunk, sides, key);
        self.update_relations(ctx, chunk, sides, key);
        self.busy += start.elapsed().as_secs_f64();
    }

    /// Loads side `k`'s rows and negatives and computes its loss and gradients.
    fn forward_backward(
        &mut self,
        ctx: &BucketCtx,
        chunk: &[[i32; 3]],
        k: usize,
        o: &Orientation,
        rng: &mut Rng,
    ) {
        let (d, rd) = (ctx.model.dim, ctx.model.rel_dim());
        let b = chunk.len();
        let side = &mut self.sides[k];
        let (s_rows, d_rows) = (ctx.parts[o.s_part].rows, ctx.parts[o.d_part].rows);
        resize(&mut side.src, b * d);
        resize(&mut side.dst, b * d);
        resize(&mut side.rel, b * rd);
        for (i, e) in chunk.iter().enumerate() {
            // The rows are scattered over the table: ask for a later edge's rows now, so that
            // their cache misses overlap this edge's copies.
            if let Some(ahead) = chunk.get(i + PREFETCH_AHEAD) {
                s_rows.prefetch(ahead[o.s_col] as usize);
                d_rows.prefetch(ahead[o.d_col] as usize);
            }
            s_rows.load(e[o.s_col] as usize, &mut side.src[i * d..(i + 1) * d]);
            d_rows.load(e[o.d_col] as usize, &mut side.dst[i * d..(i + 1) * d]);
            if let Some(rels) = &ctx.rels {
                let row = &mut side.rel[i * rd..(i + 1) * rd];
                rels.load((e[1] as u32 + o.rel_offset) as usize, row);
                if o.reverse {
                    ctx.model.reverse_relation(row);
                }
            }
        }
        // Negatives shared by the chunk: a degree-weighted part (targets of the chunk's own
        // edges: each node appears in proportion to its degree) and a uniform part.
        let n = ctx.negatives;
        let n_degree = ((n as f32) * ctx.degree_fraction).round() as usize;
        side.neg_ids.clear();
        for j in 0..n {
            let id = if j < n_degree {
                (
                    o.d_part,
                    chunk[rng.below(b as u64) as usize][o.d_col] as u32,
                )
            } else {
                ctx.uniform_node(o.d_part, rng)
            };
            side.neg_ids.push(id);
        }
        resize(&mut side.neg, n * d);
        for (j, &id) in side.neg_ids.iter().enumerate() {
            if let Some(&(part, row)) = side.neg_ids.get(j + PREFETCH_AHEAD) {
                if part & BANK == 0 {
                    ctx.parts[part].rows.prefetch(row as usize);
                }
            }
            ctx.load_negative(id, &mut side.neg[j * d..(j + 1) * d]);
        }
        let c = Chunk {
            b,
            n,
            src: &side.src,
            rel: &side.rel,
            dst: &side.dst,
            neg: &side.neg,
        };
        self.loss += chunk_step(
            &ctx.model,
            ctx.loss,
            ctx.margin,
            &c,
            &mut side.grads,
            &mut self.scratch,
        );
        self.loss += regularize(&ctx.reg, &ctx.model, &c, &mut side.grads);
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
    fn update_nodes(&mut self, ctx: &BucketCtx, chunk: &[[i32; 3]], sides: &[bool], salt: u64) {
        let d = ctx.model.dim;
        let key = |part: usize, row: u32| ((part as u64) << PART_SHIFT) | row as u64;
        self.updates.clear();
        for (k, &tail) in sides.iter().enumerate() {
            let o = Orientation::new(ctx, tail);
            let side_bit = if k == 1 { SIDE_BIT } else { 0 };
            for (i, e) in chunk.iter().enumerate() {
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
        self.updates.sort_unstable_by_key(|u| u.0);
        let sides_ref = &self.sides;
        let grad_row = |tag: u32| -> &[f32] {
            let g = &sides_ref[(tag >> 31) as usize].grads;
            let r = (tag & ROW_MASK) as usize;
            match tag & FROM_MASK {
                FROM_SRC => &g.src[r * d..(r + 1) * d],
                FROM_DST => &g.dst[r * d..(r + 1) * d],
                _ => &g.neg[r * d..(r + 1) * d],
            }
        };
        apply_sorted(&self.updates, &mut self.sum, d, grad_row, |k, g| {
            let (part, row) = (
                (k >> PART_SHIFT) as usize,
                (k & ((1 << PART_SHIFT) - 1)) as u32,
            );
            match &ctx.pool {
                Pool::All { banks, .. } if part >= BANK_KEY => {
                    banks.add_grad((part - BANK_KEY) as u32, row, g)
                }
                _ => ctx.parts[part].rows.adagrad(row as usize, g, ctx.lr, salt),
            }
        });
    }

    /// One Adagrad step per relation row touched by the chunk.
    fn update_relations(&mut self, ctx: &BucketCtx, chunk: &[[i32; 3]], sides: &[bool], key: u64) {
        let Some(rels) = &ctx.rels else { return };
        let rd = ctx.model.rel_dim();
        self.updates.clear();
        for (k, &tail) in sides.iter().enumerate() {
            let o = Orientation::new(ctx, tail);
            let side_bit = if k == 1 { SIDE_BIT } else { 0 };
            for (i, e) in chunk.iter().enumerate() {
                self.updates
                    .push(((e[1] as u32 + o.rel_offset) as u64, side_bit | i as u32));
            }
        }
        self.updates.sort_unstable_by_key(|u| u.0);
        let sides_ref = &self.sides;
        apply_sorted(
            &self.updates,
            &mut self.sum,
            rd,
            |tag| {
                let (g, i) = (
                    &sides_ref[(tag >> 31) as usize].grads.rel,
                    (tag & ROW_MASK) as usize,
                );
                &g[i * rd..(i + 1) * rd]
            },
            |row, g| rels.adagrad(row as usize, g, ctx.lr, key),
        );
    }
}

/// Sums the gradients of equal keys (sorted `updates`) and applies each sum once.
fn apply_sorted<'g>(
    updates: &[(u64, u32)],
    sum: &mut Vec<f32>,
    dim: usize,
    grad: impl Fn(u32) -> &'g [f32],
    mut apply: impl FnMut(u64, &[f32]),
) {
    resize(sum, dim);
    let mut i = 0;
    while i < updates.len() {
        let key = updates[i].0;
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
