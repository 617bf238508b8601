//! The device side of the compute seam: a [`Compute`] that hands each piece to a
//! [`DeviceStep`] (the torch backend of the Python package, registered by the extension with
//! [`register_device`]), described in plain values ([`DeviceCtx`]) that need nothing of this
//! crate's types. The epoch loop, the planner, the ordering, the partition buffer and the I/O
//! stay as they are; the step trains the slots it is lent and returns its counters.
//!
//! The slot hooks of the seam reach the step as [`DeviceStep::slot_in`] and
//! [`DeviceStep::slot_out`]: a table the step holds (keyed by the address of its host rows,
//! [`DeviceTable::key`]) is trained on the device with no per-piece copy; one it does not hold
//! (a run path that calls no hooks) is copied in and out around the piece.

use std::sync::OnceLock;

use crate::compute::backend::{
    Compute, DeviceCounters, Landing, PieceChunk, SlotKind, StepCounters,
};
use crate::config::{Corrupt, DeviceMatmul, TableDtype};
use crate::error::{EmbedError, Result};
use crate::model::{LossKind, RegScope, RegularizerKind};
use crate::storage::bank::Banks;
use crate::storage::shared::SharedRows;
use crate::train::typed_negatives::DrawSpan;
use crate::train::worker::{BucketCtx, Pool};

/// A table's rows lent to a device step: `params` (`params_len` values of `dtype`, rows of
/// the model's width) and their Adagrad state (`state_len` values of `dtype`: one per element
/// or one per row), of which the first `rows` rows are in use (a partition's nodes; a slot may
/// hold more). Valid during the [`DeviceStep::train_piece`] call it is given to, which may
/// write both.
#[derive(Debug, Clone, Copy)]
pub struct DeviceTable {
    pub params: *mut u8,
    pub params_len: usize,
    pub state: *mut u8,
    pub state_len: usize,
    pub rows: usize,
    /// The storage type: a `table_dtype = "bf16"` run's partitions are bf16, relations f32.
    pub dtype: TableDtype,
    /// Bytes from `params` on that are this table's host buffer for the whole job (a
    /// partition slot's allocation, which the step may page-lock in place until
    /// [`DeviceStep::release_host`]); 0 for memory that is not (relations).
    pub span: usize,
}

impl DeviceTable {
    /// What identifies the table's host memory to the step while it holds a device copy:
    /// the address of its rows (a slot keeps its buffer for the whole job).
    pub fn key(&self) -> usize {
        self.params as usize
    }

    /// Bytes of the params and of the state.
    pub fn bytes(&self) -> (usize, usize) {
        let size = self.dtype.bytes();
        (self.params_len * size, self.state_len * size)
    }
}

/// What the chunks of one group of a piece train against, in plain values (the
/// `BucketCtx` of the CPU worker; names are the config's spellings).
#[derive(Debug, Clone)]
pub struct DeviceCtx<'a> {
    pub model: &'static str,
    /// `pbg`'s operator and comparator ([`ScoreModel::pbg_names`](crate::model::ScoreModel)).
    pub pbg: Option<(&'static str, &'static str)>,
    pub dim: usize,
    pub transe_norm: u8,
    pub loss: &'static str,
    pub margin: f32,
    pub gamma: f32,
    pub adversarial: Option<f32>,
    pub lr: f32,
    /// Every resident partition's slot.
    pub parts: Vec<DeviceTable>,
    pub src_part: usize,
    pub dst_part: usize,
    pub rels: Option<DeviceTable>,
    pub inverse_offset: u32,
    pub corrupt: &'static str,
    /// `corrupt = bernoulli`: the head probability of each relation; empty otherwise.
    pub head_prob: Vec<f32>,
    /// Negatives per chunk (or per edge) of the side that corrupts tails.
    pub negatives: usize,
    /// Negatives per chunk (or per edge) of the side that corrupts heads.
    pub negatives_head: usize,
    /// Whether a chunk side's edges share its negatives (false: each edge draws its own).
    pub shared_negatives: bool,
    pub degree_fraction: f32,
    /// `partition`, `resident` or `all` (`part_of` maps each partition id to its index in
    /// `parts`, or `None` for one on disk, whose negatives come from `bank`), or `typed`: a
    /// typed run's negatives.
    pub pool: &'static str,
    pub part_of: Vec<Option<usize>>,
    pub part_size: u64,
    pub num_nodes: u64,
    pub bank: Option<DeviceBank<'a>>,
    /// `typed`: the spans each side's uniform negatives are drawn among, tail corruption's
    /// then head corruption's, in draw order
    /// ([`NegSpace::spans`](crate::train::typed_negatives::NegSpace::spans)).
    pub typed_spans: Option<[Vec<DrawSpan>; 2]>,
    /// A typed run's featurized entities: their rows are their features' means.
    pub feat: Option<DeviceFeat<'a>>,
    pub reg: &'static str,
    pub reg_weight: f32,
    /// `reg_weighted`, and `relation_reg_weight` (`None`: `reg_weight`).
    pub reg_weighted: bool,
    pub rel_reg_weight: Option<f32>,
    /// `entity_dropout` and `relation_dropout`, and whether `dropout_masks = "independent"`.
    pub entity_dropout: f32,
    pub relation_dropout: f32,
    pub independent_masks: bool,
    /// `negative_sampling`, `1vsAll` or `KvsAll`.
    pub training: &'static str,
    /// 1vsAll and KvsAll: `label_smoothing`, and whether `reg_scope = "table"`.
    pub label_smoothing: f32,
    pub reg_table: bool,
    /// KvsAll: the known answers of every training query, per side (0: rows `[s, r, t]` of
    /// the tail queries, 1: `[t, r, s]` of the head queries), sorted; `None` otherwise.
    pub answers: Option<[&'a [[u32; 3]]; 2]>,
}

/// Featurized entities (PyTorch-BigGraph's `featurized`) in part `part` (the pinned region):
/// its rows from `plain` on are entities, entity `k` the mean of the part's storage rows
/// `rows[offsets[k]..offsets[k + 1]]` (an empty bag is the zero row); the part's slot holds
/// storage rows.
#[derive(Debug, Clone, Copy)]
pub struct DeviceFeat<'a> {
    pub part: usize,
    pub plain: u32,
    pub offsets: &'a [u64],
    pub rows: &'a [u32],
}

/// The negative banks of the `all` pool ([`Banks`]): `rows` holds a block of `capacity`
/// rows of `dim` floats per partition (`partitions x capacity x dim`), of which partition
/// `p`'s first `lens[p]` are in use; `version` changes whenever the rows may have. A uniform
/// negative at node position `pos` of a partition on disk is its bank's row
/// `scale(rest, lens[p])`, `rest` the low half of the draw's product
/// ([`Rng::below_and_rest`](strata_store::rng::Rng::below_and_rest)); the step returns the
/// gradient the rows received, summed, in [`DeviceStep::train_piece`]'s `bank_grad`.
#[derive(Debug, Clone)]
pub struct DeviceBank<'a> {
    pub rows: &'a [f32],
    pub version: u64,
    pub capacity: usize,
    pub lens: Vec<u32>,
}

/// One piece in plain values: chunk `c` is rows `bounds[c]..bounds[c + 1]` of `edges`
/// (`[source, relation, destination]` rows, local) and of `weights` (empty: unweighted),
/// trained against `ctxs[groups[c]]` with its negatives drawn from `derive(key, c)`.
pub struct DevicePiece<'a> {
    pub ctxs: &'a [DeviceCtx<'a>],
    pub groups: &'a [usize],
    pub bounds: &'a [usize],
    pub edges: &'a [[i32; 3]],
    pub weights: &'a [f32],
    pub key: u64,
}

/// A training step on a device: trains a piece into the tables it is lent (see the seam's
/// contract in [`crate::compute::backend`]) and returns what the steps added up to, or why it
/// could not.
pub trait DeviceStep: Send {
    /// Trains `piece`; with negative banks ([`DeviceCtx::bank`]) it writes the gradient their
    /// rows received into `bank_grad` (shaped as the bank's rows; empty without banks).
    fn train_piece(
        &mut self,
        piece: &DevicePiece,
        bank_grad: &mut [f32],
    ) -> std::result::Result<StepCounters, String>;
    /// Copies `table` (host memory the I/O engine just filled) to the device and holds it
    /// until `slot_out` with `evict` or `forget_partitions`; relations only when it holds
    /// none at that address. `table` is valid during the call only.
    fn slot_in(&mut self, kind: SlotKind, table: &DeviceTable) -> std::result::Result<(), String>;
    /// Copies the device's rows of `table` (if it holds them) into its host memory before the
    /// call returns; with `evict` it then forgets them.
    fn slot_out(&mut self, table: &DeviceTable, evict: bool) -> std::result::Result<(), String>;
    /// Starts copying the device's rows of `table` out and forgets them; the returned call
    /// (made once, from any thread, while `table`'s memory is still the slot's) waits for the
    /// copy and puts the rows into `table`'s host memory.
    fn slot_evict_async(
        &mut self,
        table: &DeviceTable,
    ) -> std::result::Result<DeviceLanding, String>;
    /// Forgets every partition slot it holds (relations stay).
    fn forget_partitions(&mut self) -> std::result::Result<(), String>;
    /// Unpins the host memory it page-locked in place ([`DeviceTable::span`]), once the
    /// device is done with it: called before the partition buffer frees its slots.
    fn release_host(&mut self) -> std::result::Result<(), String>;
    /// Zeroes the device counters.
    fn reset_counters(&mut self) -> std::result::Result<(), String>;
    /// The device counters since the last reset (waits for the device's queued work), with the
    /// loss of the pieces `train_piece` returned before their loss was known.
    fn counters(&mut self) -> std::result::Result<DeviceCounters, String>;
    /// One line for the run's output: the device, and how its slots reach it.
    fn describe(&mut self) -> std::result::Result<String, String>;
}

/// The rest of an asynchronous write-back ([`DeviceStep::slot_evict_async`]).
pub type DeviceLanding = Box<dyn FnOnce() -> std::result::Result<(), String> + Send>;

/// Makes the device step of a `device` option (`cuda`, `cuda:N`, `torch-cpu`) with its
/// `device_matmul` (`float32` or `tf32`), or says why it cannot (no torch, no CUDA).
pub type DeviceFactory = fn(&str, &str) -> std::result::Result<Box<dyn DeviceStep>, String>;

static FACTORY: OnceLock<DeviceFactory> = OnceLock::new();

/// Registers the maker of device steps (the Python extension does, when it loads).
pub fn register_device(factory: DeviceFactory) {
    let _ = FACTORY.set(factory);
}

/// The backend of a job: the CPU kernels with `threads` workers for `device = cpu`, the
/// registered device step otherwise, its products at `matmul`.
pub fn for_device(device: &str, matmul: DeviceMatmul, threads: usize) -> Result<Box<dyn Compute>> {
    if device == "cpu" {
        return Ok(Box::new(crate::compute::backend::CpuCompute::new(threads)));
    }
    let Some(factory) = FACTORY.get() else {
        return Err(EmbedError::Config(format!(
            "device = {device} needs the torch backend of the Python package: train with \
             `strata embed train` or strata.embed.train (or use device = cpu)"
        )));
    };
    let step = factory(device, matmul.name()).map_err(EmbedError::Config)?;
    Ok(Box::new(DeviceCompute {
        step,
        counters: StepCounters::default(),
        failure: None,
        bank_grad: Vec::new(),
    }))
}

/// A [`Compute`] that trains every piece through a [`DeviceStep`]; the first failure stops
/// further steps and is reported by [`Compute::failure`].
pub struct DeviceCompute {
    step: Box<dyn DeviceStep>,
    counters: StepCounters,
    failure: Option<String>,
    /// A piece's gradient of the negative banks' rows, from the step.
    bank_grad: Vec<f32>,
}

/// `rows` lent, `used` of its rows in use.
fn table(rows: &SharedRows, used: usize) -> DeviceTable {
    let (params, params_len, state, state_len, dtype) = rows.raw_memory();
    DeviceTable {
        params,
        params_len,
        state,
        state_len,
        rows: used,
        dtype,
        span: rows.span,
    }
}

/// The banks of an `all` pool with partitions on disk, in plain values.
fn bank(banks: &Banks, partitions: usize) -> DeviceBank<'_> {
    let (rows, version) = banks.rows();
    DeviceBank {
        rows,
        version,
        capacity: banks.capacity(),
        lens: (0..partitions as u32).map(|p| banks.len(p)).collect(),
    }
}

/// `ctx` in plain values, or why a device step cannot train it.
pub fn describe<'a>(ctx: &'a BucketCtx) -> std::result::Result<DeviceCtx<'a>, String> {
    let (pool, part_of, part_size, num_nodes, banks) = match &ctx.pool {
        Pool::Partition => ("partition", Vec::new(), 0, 0, None),
        Pool::Resident => ("resident", Vec::new(), 0, 0, None),
        Pool::All {
            part_of,
            part_size,
            num_nodes,
            banks,
        } => {
            let on_disk = part_of.iter().any(Option::is_none);
            let banks = on_disk.then(|| bank(banks, part_of.len()));
            ("all", part_of.clone(), *part_size, *num_nodes, banks)
        }
    };
    // A typed run draws each side's negatives from its entity type's spans instead.
    let (pool, typed_spans) = match &ctx.negs {
        None => (pool, None),
        Some([tail, head]) => {
            let banks = match &ctx.pool {
                Pool::All { banks, .. } => Some(*banks),
                _ => None,
            };
            ("typed", Some([tail.spans(banks), head.spans(banks)]))
        }
    };
    Ok(DeviceCtx {
        model: ctx.model.kind.name(),
        pbg: ctx.model.pbg_names(),
        dim: ctx.model.dim,
        transe_norm: ctx.model.transe_norm,
        loss: match ctx.loss.kind {
            LossKind::Softmax => "softmax",
            LossKind::Logistic => "logistic",
            LossKind::Margin => "margin",
        },
        margin: ctx.loss.margin,
        gamma: ctx.loss.gamma,
        adversarial: ctx.loss.adversarial,
        lr: ctx.lr,
        parts: ctx
            .parts
            .iter()
            .map(|p| table(&p.rows, p.size as usize))
            .collect(),
        src_part: ctx.src_part,
        dst_part: ctx.dst_part,
        rels: ctx.rels.as_ref().map(|r| table(r, r.rows())),
        inverse_offset: ctx.inverse_offset,
        corrupt: match ctx.corrupt {
            Corrupt::Both => "both",
            Corrupt::Tail => "tail",
            Corrupt::Head => "head",
            Corrupt::Bernoulli => "bernoulli",
        },
        head_prob: ctx.head_prob.to_vec(),
        negatives: ctx.negatives,
        negatives_head: ctx.negatives_head,
        shared_negatives: ctx.shared_negatives,
        degree_fraction: ctx.degree_fraction,
        pool,
        part_of,
        part_size,
        num_nodes,
        bank: banks,
        typed_spans,
        feat: ctx.feat.map(|(part, bags)| DeviceFeat {
            part,
            plain: bags.plain,
            offsets: &bags.offsets,
            rows: &bags.rows,
        }),
        reg: match ctx.reg.kind {
            RegularizerKind::None => "none",
            RegularizerKind::N3 => "n3",
            RegularizerKind::L2 => "l2",
        },
        reg_weight: ctx.reg.weight,
        reg_weighted: ctx.reg.weighted,
        rel_reg_weight: ctx.reg.rel_weight,
        entity_dropout: ctx.dropout.entity,
        relation_dropout: ctx.dropout.relation,
        independent_masks: ctx.dropout.independent,
        training: match &ctx.vs_all {
            None => "negative_sampling",
            Some(v) if v.answers.is_some() => "KvsAll",
            Some(_) => "1vsAll",
        },
        label_smoothing: ctx.vs_all.as_ref().map_or(0.0, |v| v.label_smoothing),
        reg_table: ctx.reg.scope == RegScope::Table,
        answers: ctx
            .vs_all
            .as_ref()
            .and_then(|v| v.answers)
            .map(|a| [a.side(0), a.side(1)]),
    })
}

impl DeviceCompute {
    /// Keeps the first failure of a hook that cannot return one (the epoch loop asks after
    /// each piece).
    fn keep(&mut self, outcome: std::result::Result<(), String>) {
        if let Err(e) = outcome {
            self.failure.get_or_insert(e);
        }
    }

    fn train(
        &mut self,
        buckets: &[BucketCtx],
        chunks: &[PieceChunk],
        key: u64,
    ) -> std::result::Result<(), String> {
        let ctxs: Vec<DeviceCtx> = buckets
            .iter()
            .map(describe)
            .collect::<std::result::Result<_, _>>()?;
        // The chunks of a piece are consecutive slices of its edges: lend them as one.
        let mut edges = Vec::with_capacity(chunks.iter().map(|c| c.1.len()).sum());
        let mut weights = Vec::new();
        let mut bounds = vec![0];
        for &(_, e, w) in chunks {
            edges.extend_from_slice(e);
            weights.extend_from_slice(w);
            bounds.push(edges.len());
        }
        if !weights.is_empty() && weights.len() != edges.len() {
            return Err("a piece mixes weighted and unweighted chunks".into());
        }
        let groups: Vec<usize> = chunks.iter().map(|c| c.0).collect();
        // A piece's groups share the run's one set of banks.
        let banks = buckets.iter().zip(&ctxs).find_map(|(c, d)| match &c.pool {
            Pool::All { banks, .. } if d.bank.is_some() => Some(*banks),
            _ => None,
        });
        self.bank_grad.clear();
        if let Some(banks) = banks {
            self.bank_grad.resize(banks.rows().0.len(), 0.0);
        }
        let piece = DevicePiece {
            ctxs: &ctxs,
            groups: &groups,
            bounds: &bounds,
            edges: &edges,
            weights: &weights,
            key,
        };
        let c = self.step.train_piece(&piece, &mut self.bank_grad)?;
        if let Some(banks) = banks {
            banks.add_grads(&self.bank_grad);
        }
        self.counters.loss += c.loss;
        self.counters.directions += c.directions;
        self.counters.flops += c.flops;
        self.counters.busy += c.busy;
        Ok(())
    }
}

impl Compute for DeviceCompute {
    fn threads(&self) -> usize {
        1
    }

    fn reset_counters(&mut self) {
        self.counters = StepCounters::default();
        let reset = self.step.reset_counters();
        self.keep(reset);
    }

    fn counters(&self) -> StepCounters {
        self.counters
    }

    fn train_piece(&mut self, ctxs: &[BucketCtx], chunks: &[PieceChunk], key: u64) {
        if self.failure.is_some() {
            return;
        }
        if let Err(e) = self.train(ctxs, chunks, key) {
            self.failure = Some(e);
        }
    }

    fn failure(&mut self) -> Option<String> {
        self.failure.take()
    }

    fn slot_filled(&mut self, kind: SlotKind, rows: SharedRows) -> Result<()> {
        let t = table(&rows, rows.rows());
        self.step.slot_in(kind, &t).map_err(EmbedError::Config)
    }

    fn slot_leaving(&mut self, rows: SharedRows, evict: bool) -> Result<()> {
        let t = table(&rows, rows.rows());
        self.step.slot_out(&t, evict).map_err(EmbedError::Config)
    }

    fn slot_evicting(&mut self, rows: SharedRows) -> Result<Landing> {
        let t = table(&rows, rows.rows());
        let land = self.step.slot_evict_async(&t).map_err(EmbedError::Config)?;
        Ok(Box::new(move || land().map_err(EmbedError::Config)))
    }

    fn forget_partitions(&mut self) {
        let forgot = self.step.forget_partitions();
        self.keep(forgot);
    }

    fn release_host(&mut self) {
        // At the trainer's end, with no run left to fail: said, not kept.
        if let Err(e) = self.step.release_host() {
            eprintln!("strata: device: releasing the page-locked slot buffers: {e}");
        }
    }

    fn device_counters(&mut self) -> Option<DeviceCounters> {
        match self.step.counters() {
            Ok(c) => {
                self.counters.loss += c.late_loss;
                Some(c)
            }
            Err(e) => {
                self.keep(Err(e));
                None
            }
        }
    }

    fn describe(&mut self) -> Option<String> {
        match self.step.describe() {
            Ok(line) => Some(line),
            Err(e) => {
                self.keep(Err(e));
                None
            }
        }
    }
}
