//! Running a checked program on the streaming engine: the init pass, then per iteration an
//! edge pass (the edge code over the blocks of the active chunks, messages combined into the
//! destinations' accumulators) and a vertex pass (the apply code over each chunk, on the
//! compute threads), as GridGraph's `stream_edges` and `stream_vertices` do.

use std::sync::Mutex;
use std::time::Instant;

use serde_json::{Map, Value};

use super::code::{Arg, Batch, Code, Compiler, Op, Regs, StoreFault, Val, BATCH};
use super::columns::{Array, Columns};
use super::expr::{Column, Leaf, Node, Side};
use super::spec::{Checked, Fold, FIRST_AGGREGATE, UNIFORM_ITERATION, UNIFORM_N};
use crate::algo::{chunk_bases, Ctx, Iteration, Output};
use crate::dist::Reduce;
use crate::error::{GridError, Result};
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, Shared};

/// A checked program compiled to vector code.
pub(crate) struct Compiled {
    edge: Code,
    /// Where the edge code leaves each edge's message.
    message: Arg,
    /// The message is `src.X` of program array X: the edge pass gathers and combines in one
    /// loop, as a native kernel does.
    fused: Option<usize>,
    init: Code,
    start: Option<Arg>,
    init_aggregates: Vec<Arg>,
    apply: Code,
    active: Option<Arg>,
    aggregates: Vec<Arg>,
    /// Uniform subtrees, computed into slot `first_derived + k` at each iteration's start.
    derived: Vec<Node>,
    first_derived: usize,
    /// Registers the largest code needs.
    regs: usize,
}

impl Compiled {
    pub fn new(p: &Checked) -> Compiled {
        let first_derived = FIRST_AGGREGATE + p.aggregates.len();
        let mut derived = Vec::new();
        let mut c = Compiler::new(&mut derived, first_derived);
        let message = c.expr(&p.edge);
        let edge = c.finish();
        let fused = match (edge.ops.as_slice(), message) {
            (
                [Op::Load {
                    out,
                    side: Side::Src,
                    column: Column::Value(k),
                }],
                Arg::Reg(r),
            ) if *out == r => Some(*k),
            _ => None,
        };
        let aggregate_nodes = || p.aggregates.iter().map(|(_, _, n)| n);
        // Init: the arrays in order, then (over the initial values, `old.X` being `X`) the
        // first active set and the first aggregates.
        let mut c = Compiler::new(&mut derived, first_derived);
        for (k, node) in p.init.iter().enumerate() {
            c.store(k, node);
        }
        c.pin_old(aggregate_nodes());
        let start = p.start.as_ref().map(|n| c.expr(n));
        let init_aggregates = aggregate_nodes().map(|n| c.expr(n)).collect();
        let init = c.finish();
        // Apply: the old values first, then the assignments, the next active set and the
        // aggregates over the new values.
        let mut c = Compiler::new(&mut derived, first_derived);
        c.pin_old(
            p.apply
                .iter()
                .map(|(_, n)| n)
                .chain(&p.active)
                .chain(aggregate_nodes()),
        );
        for (k, node) in &p.apply {
            c.store(*k, node);
        }
        let active = p.active.as_ref().map(|n| c.expr(n));
        let aggregates = aggregate_nodes().map(|n| c.expr(n)).collect();
        let apply = c.finish();
        let regs = edge.regs.max(init.regs).max(apply.regs);
        Compiled {
            edge,
            message,
            fused,
            init,
            start,
            init_aggregates,
            apply,
            active,
            aggregates,
            derived,
            first_derived,
            regs,
        }
    }

    /// The uniform slots for a graph of `n` vertices: `n`, the iteration, the aggregates (at
    /// their identities) and the derived slots.
    fn uniforms(&self, p: &Checked, n: usize) -> Vec<f64> {
        let mut u = vec![0.0; self.first_derived + self.derived.len()];
        u[UNIFORM_N] = n as f64;
        for (k, (_, fold, _)) in p.aggregates.iter().enumerate() {
            u[FIRST_AGGREGATE + k] = fold.identity();
        }
        self.refresh(&mut u);
        u
    }

    /// Recomputes the derived slots from the others.
    fn refresh(&self, u: &mut [f64]) {
        for (k, node) in self.derived.iter().enumerate() {
            u[self.first_derived + k] = node.scalar(u);
        }
    }
}

/// A batch of a block's edges: (source, destination) offsets from the chunk bases.
struct EdgeBatch<'a> {
    edges: &'a [[u32; 2]],
    weights: &'a [f32],
    sb: usize,
    db: usize,
}

impl Batch for EdgeBatch<'_> {
    fn len(&self) -> usize {
        self.edges.len()
    }

    #[inline]
    fn gather(&self, columns: &Columns, side: Side, column: Column, out: &mut [f64]) {
        let e = self.edges;
        match side {
            Side::Src => columns.gather(column, out, |k| self.sb + e[k][0] as usize),
            Side::Dst => columns.gather(column, out, |k| self.db + e[k][1] as usize),
            Side::Vertex => unreachable!("an edge step reads its endpoints"),
        }
    }

    fn weight(&self, out: &mut [f64]) {
        for (o, w) in out.iter_mut().zip(self.weights) {
            *o = *w as f64;
        }
    }

    fn vertex(&self, _: usize) -> usize {
        unreachable!("an edge step stores nothing")
    }
}

/// A batch of a chunk's vertices: `base + offsets[k]`.
struct VertexBatch<'a> {
    base: usize,
    offsets: &'a [u32],
}

impl Batch for VertexBatch<'_> {
    fn len(&self) -> usize {
        self.offsets.len()
    }

    #[inline]
    fn gather(&self, columns: &Columns, side: Side, column: Column, out: &mut [f64]) {
        debug_assert_eq!(side, Side::Vertex);
        columns.gather(column, out, |k| self.base + self.offsets[k] as usize)
    }

    fn weight(&self, _: &mut [f64]) {
        unreachable!("a vertex step reads no weight")
    }

    #[inline]
    fn vertex(&self, k: usize) -> usize {
        self.base + self.offsets[k] as usize
    }
}

/// A compute thread's working memory for the edge code.
struct EdgeScratch {
    regs: Regs,
    edges: Vec<[u32; 2]>,
    weights: Vec<f32>,
}

/// The edge pass's kernel: per block, the edge code over batches of its edges (those whose
/// source is active), each message combined into its destination's accumulator.
struct EdgeStep<'a> {
    program: &'a Compiled,
    columns: &'a Columns,
    uniforms: &'a [f64],
    /// Sources that send (all when `None`).
    frontier: Option<&'a Bitmap>,
    /// Marks the destinations that received a message (programs with an active set).
    received: Option<&'a Bitmap>,
    base: &'a [u64],
    weighted: bool,
    scratch: Mutex<Vec<EdgeScratch>>,
}

impl EdgeKernel for EdgeStep<'_> {
    fn weighted(&self) -> bool {
        self.weighted
    }

    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], weights: &[f32], owns_dst: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        let acc = &self.columns.acc;
        if let (Some(x), None) = (self.program.fused, self.frontier) {
            let (n, src) = (edges.len(), |k: usize| sb + edges[k][0] as usize);
            match &self.columns.values[x] {
                Array::F32(a) => acc.combine(n, owns_dst, destinations(edges, db), |k| {
                    a.get(src(k)) as f64
                }),
                Array::F64(a) => {
                    acc.combine(n, owns_dst, destinations(edges, db), |k| a.get(src(k)))
                }
                Array::I64(a) => acc.combine(n, owns_dst, destinations(edges, db), |k| {
                    a.get(src(k)) as i64 as f64
                }),
            }
            return edges.len() as u64;
        }
        let mut scratch = self.scratch.lock().unwrap().pop();
        let EdgeScratch {
            regs,
            edges: kept,
            weights: kept_weights,
        } = scratch.get_or_insert_with(|| EdgeScratch {
            regs: Regs::new(self.program.regs),
            edges: Vec::with_capacity(BATCH),
            weights: Vec::with_capacity(BATCH),
        });
        let mut sent = 0;
        for start in (0..edges.len()).step_by(BATCH) {
            let end = (start + BATCH).min(edges.len());
            let mut e = &edges[start..end];
            let mut w = match self.weighted {
                true => &weights[start..end],
                false => &[][..],
            };
            if let Some(frontier) = self.frontier {
                kept.clear();
                kept_weights.clear();
                for (k, edge) in e.iter().enumerate() {
                    if frontier.get(sb + edge[0] as usize) {
                        kept.push(*edge);
                        if self.weighted {
                            kept_weights.push(w[k]);
                        }
                    }
                }
                e = kept.as_slice();
                w = kept_weights.as_slice();
            }
            if e.is_empty() {
                continue;
            }
            let batch = EdgeBatch {
                edges: e,
                weights: w,
                sb,
                db,
            };
            let stored = self
                .program
                .edge
                .run(&batch, self.columns, self.uniforms, regs);
            debug_assert!(stored.is_ok(), "an edge step stores nothing");
            match regs.val(self.program.message, self.uniforms, e.len()) {
                Val::Each(m) => acc.combine(e.len(), owns_dst, destinations(e, db), |k| m[k]),
                Val::All(x) => acc.combine(e.len(), owns_dst, destinations(e, db), |_| x),
            }
            if let Some(received) = self.received {
                for edge in e {
                    let v = db + edge[1] as usize;
                    if !received.get(v) {
                        received.set(v);
                    }
                }
            }
            sent += e.len() as u64;
        }
        self.scratch.lock().unwrap().extend(scratch);
        sent
    }
}

/// Each edge's destination: its offset in `edges` plus the destination chunk's base `db`.
fn destinations(edges: &[[u32; 2]], db: usize) -> impl Fn(usize) -> usize + '_ {
    move |k| db + edges[k][1] as usize
}

/// What a vertex pass does besides its code's stores.
struct VertexPass<'a> {
    code: &'a Code,
    /// Runs on the vertices marked here only (and clears them), else on all.
    only: Option<&'a Bitmap>,
    /// Marks the vertices where this value is true.
    mark: Option<(Arg, &'a Bitmap)>,
    aggregates: Vec<(Fold, Arg)>,
    /// Sets each accumulator back to the identity once read.
    reset_acc: bool,
    /// The step named in an error, given the array whose store failed.
    step: &'a (dyn Fn(usize) -> String + Sync),
}

/// What a vertex pass found.
struct Totals {
    aggregates: Vec<f64>,
    marked: u64,
    computed: u64,
}

/// One run of a program on a streamer.
struct Exec<'a> {
    p: &'a Checked,
    c: Compiled,
    columns: Columns,
    base: Vec<u64>,
    /// `0..BATCH`: the offsets of a full batch.
    iota: Vec<u32>,
}

impl Exec<'_> {
    /// Runs `pass` over every chunk on the compute threads.
    fn vertex_pass(&self, s: &Streamer, pass: &VertexPass, uniforms: &[f64]) -> Result<Totals> {
        let parts = s.par_chunks(|c| self.vertex_chunk(c as usize, pass, uniforms));
        let mut totals = Totals {
            aggregates: pass.aggregates.iter().map(|(f, _)| f.identity()).collect(),
            marked: 0,
            computed: 0,
        };
        for part in parts {
            let part = part?;
            for ((t, x), (f, _)) in totals
                .aggregates
                .iter_mut()
                .zip(part.aggregates)
                .zip(&pass.aggregates)
            {
                *t = f.apply(*t, x);
            }
            totals.marked += part.marked;
            totals.computed += part.computed;
        }
        Ok(totals)
    }

    fn vertex_chunk(&self, c: usize, pass: &VertexPass, uniforms: &[f64]) -> Result<Totals> {
        let (start, end) = (self.base[c] as usize, self.base[c + 1] as usize);
        let mut t = Totals {
            aggregates: pass.aggregates.iter().map(|(f, _)| f.identity()).collect(),
            marked: 0,
            computed: 0,
        };
        if pass.only.is_some_and(|m| !m.any_range(start, end)) {
            return Ok(t);
        }
        let mut regs = Regs::new(self.c.regs);
        let mut picked: Vec<u32> = Vec::with_capacity(BATCH);
        for b0 in (start..end).step_by(BATCH) {
            let b1 = (b0 + BATCH).min(end);
            let offsets: &[u32] = match pass.only {
                Some(m) => {
                    picked.clear();
                    picked.extend((b0..b1).filter(|&v| m.get(v)).map(|v| (v - b0) as u32));
                    &picked
                }
                None => &self.iota[..b1 - b0],
            };
            if offsets.is_empty() {
                continue;
            }
            let batch = VertexBatch { base: b0, offsets };
            pass.code
                .run(&batch, &self.columns, uniforms, &mut regs)
                .map_err(|f| self.fault(f, pass.step))?;
            let len = offsets.len();
            if let Some((arg, marks)) = pass.mark {
                let on = regs.val(arg, uniforms, len);
                for k in 0..len {
                    if on.at(k) != 0.0 {
                        marks.set(batch.vertex(k));
                        t.marked += 1;
                    }
                }
            }
            for (total, (fold, arg)) in t.aggregates.iter_mut().zip(&pass.aggregates) {
                *total = match regs.val(*arg, uniforms, len) {
                    Val::Each(v) => v.iter().fold(*total, |a, &x| fold.apply(a, x)),
                    Val::All(x) => (0..len).fold(*total, |a, _| fold.apply(a, x)),
                };
            }
            if pass.reset_acc {
                self.columns.acc.reset(len, |k| batch.vertex(k));
            }
            if let Some(m) = pass.only {
                for k in 0..len {
                    m.clear(batch.vertex(k));
                }
            }
            t.computed += len as u64;
        }
        Ok(t)
    }

    /// The error for a value an int64 array cannot hold.
    fn fault(&self, f: StoreFault, step: &(dyn Fn(usize) -> String + Sync)) -> GridError {
        GridError::Program(format!(
            "program '{}': {}: vertex {} got {}, which the int64 array '{}' cannot hold \
             (int64 arrays take finite values below 2^63 in magnitude, truncated towards zero)",
            self.p.name,
            step(f.array),
            f.vertex,
            match f.value {
                x if x.is_nan() => "nan".to_string(),
                x => format!("{x}"),
            },
            self.p.values[f.array].0
        ))
    }
}

/// Reduces each aggregate's per-rank value over the ranks of a distributed run (alone, the
/// identity): sums and minima as they are, maxima as minima of their negations.
fn reduce_aggregates(ctx: &mut Ctx, folds: &[Fold], values: &mut [f64]) -> Result<()> {
    for (fold, op) in [
        (Fold::Sum, Reduce::Sum),
        (Fold::Min, Reduce::Min),
        (Fold::Max, Reduce::Min),
    ] {
        let sign = if fold == Fold::Max { -1.0 } else { 1.0 };
        let picked: Vec<usize> = (0..folds.len()).filter(|&k| folds[k] == fold).collect();
        if picked.is_empty() {
            continue;
        }
        let mut mine: Vec<f64> = picked.iter().map(|&k| sign * values[k]).collect();
        ctx.reduce(&mut mine, op)?;
        for (&k, x) in picked.iter().zip(mine) {
            values[k] = sign * x;
        }
    }
    Ok(())
}

/// Runs `p` on `s`, reporting each iteration to `ctx`. In a distributed run each rank
/// computes the vertices of its columns and, after each vertex pass, shares the values that
/// the other ranks' edge passes read (`src.X`), for every vertex or (with an active set) for
/// the active ones, with the activity marks; aggregates are reduced over the ranks and the
/// outputs gathered at the end.
pub(crate) fn run(p: &Checked, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
    let grid = s.grid().clone();
    let n = grid.layout().num_vertices as usize;
    let exec = Exec {
        p,
        c: Compiled::new(p),
        columns: Columns::new(p, &grid, s.vertex())?,
        base: chunk_bases(s),
        iota: (0..BATCH as u32).collect(),
    };
    let has_active = p.active.is_some();
    let (frontier, next, received) = match has_active {
        true => (
            Some(Bitmap::new(n)),
            Some(Bitmap::new(n)),
            Some(Bitmap::new(n)),
        ),
        false => (None, None, None),
    };
    let folds: Vec<Fold> = p.aggregates.iter().map(|(_, f, _)| *f).collect();
    let mut uniforms = exec.c.uniforms(p, n);
    let init_step = |k: usize| format!("init of {}", p.values[k].0);
    let init = VertexPass {
        code: &exec.c.init,
        only: None,
        mark: match (&frontier, exec.c.start) {
            (Some(f), Some(start)) => Some((start, f)),
            _ => None,
        },
        aggregates: folds
            .iter()
            .copied()
            .zip(exec.c.init_aggregates.iter().copied())
            .collect(),
        reset_acc: false,
        step: &init_step,
    };
    // The arrays the edge code reads at sources: what the other ranks need of this one's.
    let mut read_at_src = Vec::new();
    p.edge.leaves(&mut |l| {
        if let Leaf::Column(Side::Src, Column::Value(k)) = l {
            if !read_at_src.contains(k) {
                read_at_src.push(*k);
            }
        }
    });
    let shared: Vec<&dyn Shared> = read_at_src
        .iter()
        .map(|&k| exec.columns.values[k].shared())
        .collect();
    let mut first = exec.vertex_pass(s, &init, &uniforms)?;
    match (&frontier, exec.c.start) {
        (Some(f), None) => {
            f.fill(true);
            ctx.exchange(None, &shared, 0)?;
        }
        (f, _) => {
            ctx.exchange(f.as_ref(), &shared, first.marked)?;
        }
    }
    reduce_aggregates(ctx, &folds, &mut first.aggregates)?;
    uniforms[FIRST_AGGREGATE..FIRST_AGGREGATE + folds.len()].copy_from_slice(&first.aggregates);
    let apply_step = |k: usize| {
        let at = p.apply.iter().position(|(a, _)| *a == k).unwrap_or(0);
        format!("apply statement {} ({})", at + 1, p.values[k].0)
    };
    let apply = VertexPass {
        code: &exec.c.apply,
        only: received.as_ref(),
        mark: exec.c.active.zip(next.as_ref()),
        aggregates: folds
            .iter()
            .copied()
            .zip(exec.c.aggregates.iter().copied())
            .collect(),
        reset_acc: true,
        step: &apply_step,
    };
    let mut reason = "iterations";
    let mut done = 0;
    while p.iterations.is_none_or(|most| (done as u64) < most) {
        let active = frontier.as_ref().map_or(n as u64, |f| f.count());
        if active == 0 {
            reason = "no active vertex";
            break;
        }
        let t0 = Instant::now();
        uniforms[UNIFORM_ITERATION] = done as f64;
        exec.c.refresh(&mut uniforms);
        let kernel = EdgeStep {
            program: &exec.c,
            columns: &exec.columns,
            uniforms: &uniforms,
            frontier: frontier.as_ref(),
            received: received.as_ref(),
            base: &exec.base,
            weighted: p.weighted,
            scratch: Mutex::new(Vec::new()),
        };
        let pass = s.stream_edges(&kernel, frontier.as_ref(), ctx.progress)?;
        drop(kernel);
        let mut totals = exec.vertex_pass(s, &apply, &uniforms)?;
        let activated = ctx.exchange(next.as_ref(), &shared, totals.marked)?;
        if let (Some(f), Some(nx)) = (&frontier, &next) {
            f.take_from(nx);
        }
        reduce_aggregates(ctx, &folds, &mut totals.aggregates)?;
        uniforms[FIRST_AGGREGATE..FIRST_AGGREGATE + folds.len()]
            .copy_from_slice(&totals.aggregates);
        let activated = match has_active {
            true => activated,
            false => n as u64,
        };
        done += 1;
        ctx.report(Iteration::new(
            done - 1,
            pass,
            active,
            activated as f64,
            t0.elapsed().as_secs_f64(),
        ))?;
        if let Some(until) = &p.until {
            exec.c.refresh(&mut uniforms);
            if until.scalar(&uniforms) != 0.0 {
                reason = "until";
                break;
            }
        }
    }
    let mut summary = Map::new();
    summary.insert("program".into(), Value::from(p.name.clone()));
    summary.insert("stopped".into(), Value::from(reason));
    let aggregates: Map<String, Value> = p
        .aggregates
        .iter()
        .enumerate()
        .map(|(k, (name, _, _))| (name.clone(), Value::from(uniforms[FIRST_AGGREGATE + k])))
        .collect();
    if !aggregates.is_empty() {
        summary.insert("aggregates".into(), Value::Object(aggregates));
    }
    let outputs: Vec<&dyn Shared> = p
        .outputs
        .iter()
        .map(|&k| exec.columns.values[k].shared())
        .collect();
    ctx.gather(&outputs)?;
    // What borrows the arrays ends here: they become the results.
    drop((init, apply, shared, outputs));
    let Exec { columns, .. } = exec;
    let mut values: Vec<Option<Array>> = columns.values.into_iter().map(Some).collect();
    let arrays = p
        .outputs
        .iter()
        .filter_map(|&k| Some((p.values[k].0.clone(), values[k].take()?.into_values())))
        .collect();
    Ok(Output {
        arrays,
        summary,
        iterations: done,
    })
}
