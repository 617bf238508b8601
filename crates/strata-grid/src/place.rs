//! Fargraph+'s front end: which tier holds each segment.
//!
//! The data segments of a run fall into Fargraph+'s groups (§5.1): vertex arrays and
//! frontiers are small and written every iteration (group 1, *resistant*: always local); I/O
//! buffers and iterators are group 2 (local); edge blocks and their weights are large and
//! read-only (group 3, *transferable*). With a far-memory ratio R, transferable segments are
//! offloaded in streaming order until far memory holds R of the run's footprint (read-only
//! data first: here, all of it is read-only). What stays local and fits the budget next to
//! the resistant set is kept resident; the rest streams from disk.

use serde::Serialize;
use strata_store::units::fmt_bytes;

use crate::error::{GridError, Result};
use crate::grid::Segment;
use crate::stream::Tier;

/// Memory the runtime needs besides the planned buffers (allocator slack, bitmaps' rounding,
/// the front end).
pub const RUNTIME_RESERVE: u64 = 64 << 20;

/// What the placement needs to know.
#[derive(Debug, Clone)]
pub struct PlaceInput {
    /// Bytes of vertex data (the resistant set).
    pub vertex_bytes: u64,
    /// Bytes of fetch buffers.
    pub buffer_bytes: u64,
    /// Bytes per edge fetched (8, or 12 with weights).
    pub bytes_per_edge: u64,
    /// Local memory budget.
    pub memory: u64,
    /// Far-memory ratio R of the footprint, when a memory server is used.
    pub far_ratio: Option<f64>,
    /// Bytes the memory server can take.
    pub far_capacity: u64,
    /// Keep edge blocks resident when they fit (false: stream every pass from disk).
    pub keep_resident: bool,
}

/// Where everything lives.
#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    pub tiers: Vec<Tier>,
    /// Vertex data, buffers and edges together.
    pub footprint: u64,
    pub vertex_bytes: u64,
    pub buffer_bytes: u64,
    pub local_edge_bytes: u64,
    pub far_bytes: u64,
    pub disk_bytes: u64,
    /// Far bytes over the footprint (what the ratio became).
    pub far_ratio: f64,
}

impl Placement {
    /// The plan as lines for the user.
    pub fn describe(&self, memory: u64) -> Vec<String> {
        let mut out = vec![format!(
            "budget {}: vertex data {} (local), fetch buffers {}, resident edge blocks {}",
            fmt_bytes(memory),
            fmt_bytes(self.vertex_bytes),
            fmt_bytes(self.buffer_bytes),
            fmt_bytes(self.local_edge_bytes)
        )];
        out.push(format!(
            "edge blocks: {} resident, {} in far memory, {} streamed from disk; far ratio {:.2} of a {} footprint",
            fmt_bytes(self.local_edge_bytes),
            fmt_bytes(self.far_bytes),
            fmt_bytes(self.disk_bytes),
            self.far_ratio,
            fmt_bytes(self.footprint)
        ));
        out
    }
}

/// Places `segments` (see the module documentation).
pub fn place(segments: &[Segment], input: &PlaceInput) -> Result<Placement> {
    let payload = |s: &Segment| (s.edges.end - s.edges.start) * input.bytes_per_edge;
    let edges: u64 = segments.iter().map(payload).sum();
    let fixed = input.vertex_bytes + input.buffer_bytes + RUNTIME_RESERVE;
    if fixed > input.memory {
        return Err(GridError::Budget(format!(
            "memory budget of {} is too small: vertex data takes {}, fetch buffers {} and the runtime {}; \
             vertex data must stay in memory (windowed vertex data is not supported) and the buffers grow with the \
             largest segment (a smaller --segment, fewer prefetched segments or a grid with more partitions shrink \
             them), so raise --memory to at least {}",
            fmt_bytes(input.memory),
            fmt_bytes(input.vertex_bytes),
            fmt_bytes(input.buffer_bytes),
            fmt_bytes(RUNTIME_RESERVE),
            fmt_bytes(fixed)
        )));
    }
    let footprint = input.vertex_bytes + input.buffer_bytes + edges;
    let far_target = match input.far_ratio {
        Some(r) if !(0.0..=1.0).contains(&r) => {
            return Err(GridError::config(
                "far_ratio",
                format!("must be in [0, 1], got {r}"),
            ))
        }
        Some(r) => ((r * footprint as f64) as u64)
            .min(edges)
            .min(input.far_capacity),
        None => 0,
    };
    let mut local_room = input.memory - fixed;
    let (mut far, mut local, mut disk) = (0u64, 0u64, 0u64);
    let tiers = segments
        .iter()
        .map(|s| {
            let b = payload(s);
            if far < far_target && far + b <= input.far_capacity {
                far += b;
                Tier::Far
            } else if input.keep_resident && b <= local_room {
                local_room -= b;
                local += b;
                Tier::Local
            } else {
                disk += b;
                Tier::Disk
            }
        })
        .collect();
    Ok(Placement {
        tiers,
        footprint,
        vertex_bytes: input.vertex_bytes,
        buffer_bytes: input.buffer_bytes,
        local_edge_bytes: local,
        far_bytes: far,
        disk_bytes: disk,
        far_ratio: far as f64 / footprint.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(n: usize, edges: u64) -> Vec<Segment> {
        (0..n)
            .map(|k| Segment {
                major: k as u32,
                blocks: k..k + 1,
                edges: k as u64 * edges..(k as u64 + 1) * edges,
            })
            .collect()
    }

    fn input(memory: u64, ratio: Option<f64>) -> PlaceInput {
        PlaceInput {
            vertex_bytes: 10 << 20,
            buffer_bytes: 6 << 20,
            bytes_per_edge: 8,
            memory,
            far_ratio: ratio,
            far_capacity: u64::MAX,
            keep_resident: true,
        }
    }

    #[test]
    fn everything_local_when_it_fits() {
        let p = place(&segs(10, 1 << 20), &input(1 << 30, None)).unwrap();
        assert!(p.tiers.iter().all(|t| *t == Tier::Local));
        assert_eq!(p.local_edge_bytes, 80 << 20);
    }

    #[test]
    fn far_ratio_offloads_edges_first_and_the_rest_fits_locally() {
        // Footprint 16 MiB + 80 MiB = 96 MiB; R = 0.5 puts 48 MiB of edges (6 segments) far.
        let p = place(&segs(10, 1 << 20), &input(1 << 30, Some(0.5))).unwrap();
        let far = p.tiers.iter().filter(|t| **t == Tier::Far).count();
        assert_eq!(far, 6);
        assert!((p.far_ratio - 0.5).abs() < 0.01);
        // A ratio beyond the edges' share stops at all edges: vertex data never leaves.
        let p = place(&segs(10, 1 << 20), &input(1 << 30, Some(1.0))).unwrap();
        assert!(p.tiers.iter().all(|t| *t == Tier::Far));
    }

    #[test]
    fn a_tight_budget_streams_from_disk_and_too_tight_fails() {
        let p = place(
            &segs(10, 1 << 20),
            &input(RUNTIME_RESERVE + (16 << 20) + (24 << 20), None),
        )
        .unwrap();
        assert_eq!(p.tiers.iter().filter(|t| **t == Tier::Local).count(), 3);
        assert_eq!(p.disk_bytes, 56 << 20);
        let e = place(&segs(10, 1 << 20), &input(8 << 20, None)).unwrap_err();
        assert!(e.to_string().contains("vertex data"), "{e}");
    }
}
