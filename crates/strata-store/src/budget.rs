//! The one shape every engine's memory plan takes: the budget (`memory`), the parts it is
//! spent on (named, in bytes), and the data sets that are larger than what the plan keeps in
//! memory (how much of each is resident, and where the rest lives).
//!
//! Each engine plans with a pure function in its own `budget` module (config, store metadata
//! and device profile in, the engine's typed plan out) and turns its plan into a
//! [`MemoryPlan`] through [`Planned`]. The engines print [`MemoryPlan::describe`] at start and
//! save the plan in their run's JSON; `strata info --memory` prints the same plans, so what
//! the user is told and what the engine does cannot disagree: each engine exposes one
//! `plan_for(store, &section)` (a store and its checked config section in, a [`Planning`]
//! out) that makes the plan the engine would make at start.

use serde::{Deserialize, Serialize};

use crate::units::fmt_bytes;

/// Bytes of library code pages planned beside a measured process's anonymous memory: the
/// pages of torch's (and the extension's) libraries that training keeps using. File-backed
/// pages are clean page cache: a memory cgroup at its limit reclaims those not in use, so
/// only this working set needs room, not the ~1 GB of libraries torch's CUDA build maps nor
/// the read-ahead its import leaves in the page cache. Measured with torch 2.15 (CPU path,
/// GraphSAGE, `memlimit`): 50 MiB of them stayed mapped at full speed; with 47 MiB of room
/// beside the anonymous memory an epoch took 1.7x as long.
pub const CODE_PAGES_BYTES: u64 = 96 << 20;

/// Bytes an engine whose caller does not measure its process reserves for the process itself
/// (interpreter, libraries, allocator slack, the I/O engine's rings and bounce buffers):
/// strata-embed's plan and strata-gnn's, when nothing was measured.
pub const RUNTIME_BYTES: u64 = 64 << 20;

/// The name of the plan part that holds a distributed rank's torch and gloo.
pub const GROUP_PART: &str = "torch + gloo";

/// Bytes a distributed rank's plan sets aside for torch and gloo: `anon_bytes`, the process's
/// anonymous memory (`RssAnon`) measured after torch's import and the process group's start,
/// plus [`CODE_PAGES_BYTES`] of their library code; 0 for `None` (a process alone, or one whose
/// `/proc` did not tell).
pub fn group_bytes(anon_bytes: Option<u64>) -> u64 {
    anon_bytes.map_or(0, |b| b.saturating_add(CODE_PAGES_BYTES))
}

/// What `group_bytes` (from [`group_bytes`]) is made of, for a refusal: "torch and gloo take
/// 394 MiB (RssAnon 298 MiB measured after torch's import and the group's start, plus 96.0 MiB
/// of library code)".
pub fn group_takes(group_bytes: u64) -> String {
    format!(
        "torch and gloo take {} (RssAnon {} measured after torch's import and the group's start, plus {} of library code)",
        fmt_bytes(group_bytes),
        fmt_bytes(group_bytes.saturating_sub(CODE_PAGES_BYTES)),
        fmt_bytes(CODE_PAGES_BYTES)
    )
}

/// One use of the budget: `bytes` of memory for `name` (e.g. "partition buffer").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanPart {
    /// What the bytes hold, short and lowercase ("topology", "hot set").
    pub name: String,
    /// Bytes of memory the part may use.
    pub bytes: u64,
    /// How the bytes were sized, for the user ("3 x 512 MiB partitions"); may be empty.
    pub detail: String,
}

/// A data set and how much of it the plan keeps in memory; the rest lives in `elsewhere`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanData {
    /// The data ("node features", "embedding table").
    pub name: String,
    /// Its whole size in bytes.
    pub bytes: u64,
    /// Bytes of it held in memory (in one of the plan's parts); at most `bytes`.
    pub resident: u64,
    /// Where the rest is read from: "SSD", "far memory", "device memory".
    pub elsewhere: String,
}

impl PlanData {
    /// Whether all of it is held in memory.
    pub fn fits(&self) -> bool {
        self.resident >= self.bytes
    }
}

/// What an engine does with its budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// The engine ("embed", "gnn", "grid", "serve").
    pub engine: String,
    /// The budget in bytes (`memory`).
    pub memory: u64,
    /// The smallest budget this plan's fixed parts need, in bytes: below it the engine refuses
    /// to start.
    pub minimum: u64,
    /// Where the budget goes, in the order printed.
    pub parts: Vec<PlanPart>,
    /// The data sets the engine works on, and what of each is in memory.
    pub data: Vec<PlanData>,
}

impl MemoryPlan {
    /// An empty plan of `engine` under a budget of `memory` bytes.
    pub fn new(engine: &str, memory: u64) -> MemoryPlan {
        MemoryPlan {
            engine: engine.to_string(),
            memory,
            minimum: 0,
            parts: Vec::new(),
            data: Vec::new(),
        }
    }

    /// Adds a part of `bytes` bytes.
    pub fn part(mut self, name: &str, bytes: u64, detail: impl Into<String>) -> MemoryPlan {
        self.parts.push(PlanPart {
            name: name.to_string(),
            bytes,
            detail: detail.into(),
        });
        self
    }

    /// Adds the [`GROUP_PART`] of `group_bytes` bytes (from [`group_bytes`]) with its measured
    /// figure; a process alone (0) gets none.
    pub fn group_part(self, group_bytes: u64) -> MemoryPlan {
        if group_bytes == 0 {
            return self;
        }
        self.part(
            GROUP_PART,
            group_bytes,
            format!(
                "measured: RssAnon {} after torch's import and the group's start, plus {} of library code",
                fmt_bytes(group_bytes.saturating_sub(CODE_PAGES_BYTES)),
                fmt_bytes(CODE_PAGES_BYTES)
            ),
        )
    }

    /// Adds a data set of `bytes` bytes of which `resident` are in memory.
    pub fn data(mut self, name: &str, bytes: u64, resident: u64, elsewhere: &str) -> MemoryPlan {
        self.data.push(PlanData {
            name: name.to_string(),
            bytes,
            resident: resident.min(bytes),
            elsewhere: elsewhere.to_string(),
        });
        self
    }

    /// Sets the smallest budget the plan accepts.
    pub fn minimum(mut self, bytes: u64) -> MemoryPlan {
        self.minimum = bytes;
        self
    }

    /// Bytes of all parts together.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// Refuses a plan that holds more than `machine` bytes (this machine's memory:
    /// [`physical_memory`]) with a message naming both: a budget beyond the machine lets the
    /// engine plan to keep in memory what the kernel can only kill it for. A plan within the
    /// machine passes, whatever the budget (a large budget and a small graph hold little).
    pub fn check_machine(&self, machine: u64) -> Result<(), String> {
        if self.total() <= machine {
            return Ok(());
        }
        Err(format!(
            "{} budget {}: the plan holds {}, more than this machine's {} of memory; give --memory at most {}, so that the rest stays on disk",
            self.engine,
            fmt_bytes(self.memory),
            fmt_bytes(self.total()),
            fmt_bytes(machine),
            fmt_bytes(machine)
        ))
    }

    /// The plan as lines for the user: the budget and total, one line per part, one per data
    /// set (all in memory, or what share is and where the rest is read from).
    pub fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{} budget {}: planned {} (minimum {})",
            self.engine,
            fmt_bytes(self.memory),
            fmt_bytes(self.total()),
            fmt_bytes(self.minimum)
        )];
        let width = self.parts.iter().map(|p| p.name.len()).max().unwrap_or(0);
        for p in &self.parts {
            let detail = if p.detail.is_empty() {
                String::new()
            } else {
                format!("  {}", p.detail)
            };
            lines.push(format!(
                "  {:<width$}  {:>10}{detail}",
                p.name,
                fmt_bytes(p.bytes)
            ));
        }
        for d in &self.data {
            let placement = if d.fits() {
                "all in memory".to_string()
            } else {
                format!(
                    "{:.1}% in memory ({}), the rest from {}",
                    100.0 * d.resident as f64 / d.bytes.max(1) as f64,
                    fmt_bytes(d.resident),
                    d.elsewhere
                )
            };
            lines.push(format!("  {} {}: {placement}", d.name, fmt_bytes(d.bytes)));
        }
        lines
    }
}

/// Bytes of physical memory in this machine (`u64::MAX` where the system does not say).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf reads system constants; it has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (u64::try_from(pages), u64::try_from(page)) {
        (Ok(p), Ok(b)) if p > 0 && b > 0 => p.saturating_mul(b),
        _ => u64::MAX,
    }
}

/// An engine's typed plan, seen in the common shape.
pub trait Planned {
    /// The plan as named parts and data sets.
    fn memory_plan(&self) -> MemoryPlan;
}

/// What an engine's `plan_for(store, &section)` says: the plan it would start with, why the
/// budget cannot hold its minimum, or why there is nothing to plan yet. Other failures (an
/// unreadable store) are the engine's errors.
#[derive(Debug, Clone, PartialEq)]
pub enum Planning {
    /// The plan, in the common shape.
    Plan(MemoryPlan),
    /// The budget is below the engine's minimum: the planner's message, naming each figure.
    Refused(String),
    /// Nothing to plan yet (grid: no grid built for the algorithm), and why.
    NotPlanned(String),
}

impl Planning {
    /// [`Planning::Plan`] of a typed plan.
    pub fn of(plan: &impl Planned) -> Planning {
        Planning::Plan(plan.memory_plan())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_beyond_the_machine_is_refused_naming_both_and_one_within_it_passes() {
        let p = plan();
        assert_eq!(p.check_machine(p.total()), Ok(()));
        let msg = p.check_machine(512 << 20).unwrap_err();
        assert_eq!(
            msg,
            "gnn budget 1.00 GiB: the plan holds 600 MiB, more than this machine's 512 MiB of memory; give --memory at most 512 MiB, so that the rest stays on disk"
        );
        assert!(physical_memory() > 1 << 20);
    }

    fn plan() -> MemoryPlan {
        MemoryPlan::new("gnn", 1 << 30)
            .minimum(200 << 20)
            .part("topology", 100 << 20, "CSC, 26 M edges")
            .part("hot set", 500 << 20, "")
            .data("node features", 4 << 30, 500 << 20, "SSD")
            .data("labels", 1 << 20, 1 << 20, "SSD")
    }

    #[test]
    fn totals_and_fits() {
        let p = plan();
        assert_eq!(p.total(), 600 << 20);
        assert!(!p.data[0].fits());
        assert!(p.data[1].fits());
    }

    #[test]
    fn resident_never_exceeds_the_data() {
        let p = MemoryPlan::new("embed", 1 << 20).data("table", 10, 99, "SSD");
        assert_eq!(p.data[0].resident, 10);
        assert!(p.data[0].fits());
    }

    #[test]
    fn describes_every_part_and_data_set() {
        let lines = plan().describe();
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(
            lines[0].starts_with("gnn budget 1.00 GiB: planned 600 MiB (minimum 200 MiB)"),
            "{lines:?}"
        );
        assert!(
            lines[1].contains("topology") && lines[1].contains("CSC, 26 M edges"),
            "{lines:?}"
        );
        assert!(
            lines[3].contains("12.2% in memory") && lines[3].ends_with("the rest from SSD"),
            "{lines:?}"
        );
        assert!(lines[4].ends_with("all in memory"), "{lines:?}");
    }

    #[test]
    fn a_ranks_torch_and_gloo_are_planned_as_measured_plus_code_pages() {
        assert_eq!(group_bytes(None), 0);
        let g = group_bytes(Some(298 << 20));
        assert_eq!(g, (298 << 20) + CODE_PAGES_BYTES);
        let alone = MemoryPlan::new("grid", 1 << 30).group_part(group_bytes(None));
        assert!(alone.parts.is_empty());
        let rank = MemoryPlan::new("grid", 1 << 30).group_part(g);
        assert_eq!(rank.parts.len(), 1);
        assert_eq!(
            (rank.parts[0].name.as_str(), rank.parts[0].bytes),
            (GROUP_PART, g)
        );
        assert!(
            rank.parts[0]
                .detail
                .starts_with("measured: RssAnon 298 MiB after")
                && rank.parts[0]
                    .detail
                    .ends_with("plus 96.0 MiB of library code"),
            "{:?}",
            rank.parts[0]
        );
        let takes = group_takes(g);
        assert!(
            takes.starts_with("torch and gloo take 394 MiB (RssAnon 298 MiB measured"),
            "{takes}"
        );
    }

    #[test]
    fn serializes_to_the_json_runs_save() {
        let v = serde_json::to_value(plan()).unwrap();
        assert_eq!(v["engine"], "gnn");
        assert_eq!(v["parts"][1]["name"], "hot set");
        assert_eq!(v["data"][0]["resident"], 500u64 << 20);
    }
}
