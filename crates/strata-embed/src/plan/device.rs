//! The device budget of a run trained on a torch device (`device_memory`): what the device
//! holds beside `--memory`, and how many partitions the table needs so that the buffer's
//! slots fit it (Legend's placement: the partition buffer in GPU memory).
//!
//! `auto` asks the device backend (the Python package registers [`register_device_memory`])
//! for the device's free memory and takes [`AUTO_SHARE`] of it; on the CPU twin (`torch-cpu`),
//! which has no memory of its own, `auto` means the host buffer's slots (no further bound). An
//! explicit size bounds the device's slots the same way on every device.

use std::sync::OnceLock;

use serde::Serialize;
use strata_store::budget::{MemoryPlan, Planned};
use strata_store::config::AutoSize;
use strata_store::units::fmt_bytes;

use crate::config::{Corrupt, TrainConfig};
use crate::error::{EmbedError, Result};
use crate::model::{ScoreKind, ScoreModel};

/// Share of the device's free memory (as torch reports it when the run starts) that
/// `device_memory = auto` budgets on a GPU: the rest is left to the CUDA context's growth and
/// the caching allocator's rounding.
pub const AUTO_SHARE: f64 = 0.8;

/// What the device backend says of a `device` option: its free memory in bytes (`None`: the
/// CPU twin, no memory of its own) and the bytes one evaluation tile takes there.
pub type DeviceMemoryInfo = fn(&str) -> std::result::Result<(Option<u64>, u64), String>;

static INFO: OnceLock<DeviceMemoryInfo> = OnceLock::new();

/// Registers how to ask a device for its memory (the Python extension does, when it loads).
pub fn register_device_memory(info: DeviceMemoryInfo) {
    let _ = INFO.set(info);
}

/// A device run's budget, resolved from `device_memory` before planning.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceBudget {
    /// The device (`cuda:0`, `torch-cpu`).
    pub device: String,
    /// Bytes the device may hold (`None`: `auto` on the CPU twin, as many slots as the host
    /// buffer has).
    pub memory: Option<u64>,
    /// How `auto` was sized, for the plan's heading (`None`: a size was given).
    pub auto: Option<String>,
    /// Bytes of one evaluation tile on the device (0: the run does not evaluate).
    pub eval_tile: u64,
}

impl DeviceBudget {
    /// The budget of `cfg` (`None`: the CPU engine, no device), asking the registered backend
    /// for the device's memory.
    pub fn of(cfg: &TrainConfig) -> Result<Option<DeviceBudget>> {
        if cfg.device == "cpu" {
            return Ok(None);
        }
        let Some(info) = INFO.get() else {
            return Err(EmbedError::Config(format!(
                "device = {} needs the torch backend of the Python package to size \
                 device_memory: train with `strata embed train` or strata.embed.train",
                cfg.device
            )));
        };
        let (free, tile) = info(&cfg.device).map_err(EmbedError::Config)?;
        let eval_tile = if cfg.eval_every > 0 { tile } else { 0 };
        let (memory, auto) = match (cfg.device_memory, free) {
            (AutoSize::Bytes(b), _) => (Some(b), None),
            (AutoSize::Auto, None) => (None, Some("auto: the host buffer's slots".to_string())),
            (AutoSize::Auto, Some(free)) => (
                Some((free as f64 * AUTO_SHARE) as u64),
                Some(format!(
                    "auto: {:.0}% of {} free on {}",
                    AUTO_SHARE * 100.0,
                    fmt_bytes(free),
                    cfg.device
                )),
            ),
        };
        Ok(Some(DeviceBudget {
            device: cfg.device.clone(),
            memory,
            auto,
            eval_tile,
        }))
    }
}

/// Bytes the device step allocates for one chunk of `cfg` in a table of `nodes` entities (the
/// shapes of `strata.embed.device.step.train_chunk`, every gathered row counted as distinct):
/// the node keys, their unique set and inverse (`8 x 3` per use); the gathered leaf rows, their
/// gradient and Adagrad's temporaries (state rows, accumulator, update, parameter rows: `6 x 4`
/// bytes a real); per corrupted side the source, target, negative, relation and query rows and
/// their gradients; and per side six score matrices (scores, their gradient, the loss's
/// intermediates), `b x n`, or `b x n x dim` for the pairwise models (TransE-L1, RotatE).
/// 1vsAll and KvsAll (`vs_all.train_chunk`) score against at most every entity, `n = nodes`:
/// the candidates, their dropped copies, gradients and Adagrad temporaries, and the label and
/// score matrices fall within the same terms. With negatives per edge a side gathers `b x n`
/// negative rows (and their gradients), its score matrices staying `b x n`.
pub fn step_bytes(model: &ScoreModel, cfg: &TrainConfig, nodes: u64) -> u64 {
    let (b, n) = (cfg.chunk_size as u64, cfg.scored_per_chunk(nodes));
    let neg_rows = cfg.gathered_per_chunk(nodes);
    let (d, rd) = (model.dim as u64, model.rel_dim() as u64);
    let sides = match cfg.corrupt {
        Corrupt::Both | Corrupt::Bernoulli => 2,
        Corrupt::Tail | Corrupt::Head => 1,
    };
    let uses = sides * (2 * b + neg_rows);
    let keys = 8 * 3 * uses;
    let gathered = 4 * 6 * (uses * d + sides * b * rd);
    let rows = sides * 2 * 4 * ((3 * b + neg_rows) * d + b * rd);
    let pairwise = match model.kind {
        ScoreKind::TransE if model.transe_norm == 1 => true,
        ScoreKind::RotatE => true,
        _ => false,
    };
    let matrix = if pairwise { b * n * d } else { b * n };
    keys + gathered + rows + sides * 6 * 4 * matrix
}

/// Bytes of an edge piece of `rows` edges on the device: the staged `i32` rows, their `i64`
/// widening and the weights.
pub fn edge_bytes(rows: u64) -> u64 {
    rows * (12 + 24 + 4)
}

/// How a device run's budget is spent.
#[derive(Debug, Clone, Serialize)]
pub struct DevicePlan {
    pub device: String,
    /// The budget (with `auto` on the CPU twin: what the plan holds).
    pub memory: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<String>,
    /// Partition slots on the device (the host buffer's, its lookahead included) and bytes each.
    pub slots: usize,
    pub part_bytes: u64,
    pub relation_bytes: u64,
    /// A typed run's pinned region (a slot of its own size) and its feature bags.
    pub pinned_bytes: u64,
    pub edge_bytes: u64,
    pub step_bytes: u64,
    pub eval_bytes: u64,
    /// The smallest budget that holds the fixed parts and the ordering's minimum slots.
    pub minimum: u64,
    /// Whether `memory` bounds the device (false: `auto` on the CPU twin, which has no memory
    /// of its own, and `memory` is what the plan holds).
    #[serde(skip)]
    pub bounded: bool,
}

impl DevicePlan {
    /// Bytes of the parts that do not depend on the partitions.
    pub fn fixed(&self) -> u64 {
        self.relation_bytes
            + self.pinned_bytes
            + self.edge_bytes
            + self.step_bytes
            + self.eval_bytes
    }

    /// Bytes the plan holds: the fixed parts and the partition slots.
    pub fn planned(&self) -> u64 {
        self.fixed() + self.slots as u64 * self.part_bytes
    }
}

impl Planned for DevicePlan {
    fn memory_plan(&self) -> MemoryPlan {
        let engine = match &self.auto {
            Some(how) => format!("embed device {} ({how})", self.device),
            None => format!("embed device {}", self.device),
        };
        let plan = MemoryPlan::new(&engine, self.memory)
            .minimum(self.minimum)
            .part(
                "partition slots",
                self.slots as u64 * self.part_bytes,
                format!(
                    "{} x {} (embeddings + Adagrad state, trained in place)",
                    self.slots,
                    fmt_bytes(self.part_bytes)
                ),
            );
        let plan = if self.pinned_bytes > 0 {
            plan.part(
                "in-memory entity types",
                self.pinned_bytes,
                "the pinned region's slot and feature bags, resident all epoch",
            )
        } else {
            plan
        };
        plan.part("relations", self.relation_bytes, "resident all run")
            .part(
                "edge piece",
                self.edge_bytes,
                "staged from the host, i64 rows",
            )
            .part(
                "step scratch",
                self.step_bytes,
                "one chunk's rows, keys and scores",
            )
            .part(
                "evaluation",
                self.eval_bytes,
                if self.eval_bytes > 0 {
                    "one tile of scores"
                } else {
                    "none"
                },
            )
    }
}
