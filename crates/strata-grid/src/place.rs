//! Fargraph+'s front end: which tier holds each segment.
//!
//! The data segments of a run fall into Fargraph+'s groups (§5.1): vertex arrays and
//! frontiers are small and written every iteration (group 1, *resistant*: always local); I/O
//! buffers and iterators are group 2 (local); edge blocks and their weights are large and
//! read-only (group 3, *transferable*). With a far-memory ratio R, transferable segments are
//! offloaded in streaming order until far memory holds R of the run's footprint (read-only
//! data first: here, all of it is read-only). What stays local and fits the budget next to
//! the resistant set is kept resident; the rest streams from disk.
//!
//! When the vertex data itself does not fit, it goes to windows (see
//! [`VertexMemory`](crate::vertex::VertexMemory)): the budget then holds the windows, the
//! buffers and the runtime, every local edge block streams from disk, and what is left of the
//! budget caches vertex pages.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::budget::group_takes;
use strata_store::units::fmt_bytes;

use crate::error::{GridError, Result};
use crate::grid::Segment;
use crate::layout::EDGE_BYTES;
use crate::stream::Tier;

/// Memory the runtime needs besides the planned buffers (allocator slack, bitmaps' rounding,
/// the front end).
pub const RUNTIME_RESERVE: u64 = 32 << 20;

/// Where vertex data goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VertexPlacement {
    /// In memory when it fits next to the buffers, else in windows.
    #[default]
    Auto,
    /// In memory, or the run is refused.
    Memory,
    /// In windows even when it would fit (leaving the budget to other data).
    Windows,
}

/// What the placement needs to know.
#[derive(Debug, Clone)]
pub struct PlaceInput {
    /// Bytes of vertex data (the resistant set).
    pub vertex_bytes: u64,
    /// Bytes vertex data needs in memory when it is windowed: the compute threads' source and
    /// destination chunks and the bitmaps.
    pub window_bytes: u64,
    pub vertex_placement: VertexPlacement,
    /// Bytes of fetch buffers.
    pub buffer_bytes: u64,
    /// Bytes per edge in memory (8, or 12 with weights): what a resident segment takes, its
    /// blocks decoded in a compressed grid.
    pub bytes_per_edge: u64,
    /// Local memory budget.
    pub memory: u64,
    /// Far-memory ratio R of the footprint, when a memory server is used.
    pub far_ratio: Option<f64>,
    /// Bytes the memory server can take.
    pub far_capacity: u64,
    /// Keep edge blocks resident when they fit (false: stream every pass from disk).
    pub keep_resident: bool,
    /// Bytes a distributed rank's torch and gloo hold (0 alone): fixed, like the runtime.
    pub group_bytes: u64,
    /// The algorithm's work buffer: the least it runs with and the most it can use (0 and 0
    /// when it asks for none). It is fixed up to its minimum and takes what the budget has
    /// left up to its want before edge blocks are kept resident.
    pub work_minimum: u64,
    pub work_wanted: u64,
}

/// Where everything lives.
#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    pub tiers: Vec<Tier>,
    /// Vertex data, buffers and edges together.
    pub footprint: u64,
    pub vertex_bytes: u64,
    /// Vertex data is windowed (it does not fit next to the buffers).
    pub vertex_windowed: bool,
    pub window_bytes: u64,
    pub buffer_bytes: u64,
    pub local_edge_bytes: u64,
    pub far_bytes: u64,
    pub disk_bytes: u64,
    /// Far bytes over the footprint (what the ratio became).
    pub far_ratio: f64,
    /// Bytes of the algorithm's work buffer.
    pub work_bytes: u64,
}

/// Places `segments` (see the module documentation). Far memory and the disk hold a
/// segment as stored (a compressed grid's codes); resident memory holds it as records.
pub fn place(segments: &[Segment], input: &PlaceInput) -> Result<Placement> {
    let resident = |s: &Segment| (s.edges.end - s.edges.start) * input.bytes_per_edge;
    let stored = |s: &Segment| {
        s.stored_bytes() + (s.edges.end - s.edges.start) * (input.bytes_per_edge - EDGE_BYTES)
    };
    let edges: u64 = segments.iter().map(stored).sum();
    let whole = input.vertex_bytes
        + input.buffer_bytes
        + RUNTIME_RESERVE
        + input.group_bytes
        + input.work_minimum;
    let windowed = match input.vertex_placement {
        VertexPlacement::Auto => whole > input.memory,
        VertexPlacement::Memory => false,
        VertexPlacement::Windows => true,
    };
    let fixed = match windowed {
        true => {
            input.window_bytes
                + input.buffer_bytes
                + RUNTIME_RESERVE
                + input.group_bytes
                + input.work_minimum
        }
        false => whole,
    };
    if fixed > input.memory {
        let group = match input.group_bytes {
            0 => String::new(),
            b => format!(", {}", group_takes(b)),
        };
        let work = match input.work_minimum {
            0 => String::new(),
            b => format!(", the algorithm's work buffer at least {}", fmt_bytes(b)),
        };
        return Err(GridError::Budget(format!(
            "memory budget of {} is too small: vertex data takes {} (windows of it {}), fetch buffers {}, \
             the runtime {}{group}{work}; windows shrink with more partitions (strata grid build --partitions) and \
             buffers with a smaller --segment or fewer prefetched segments; or raise --memory to at least {}",
            fmt_bytes(input.memory),
            fmt_bytes(input.vertex_bytes),
            fmt_bytes(input.window_bytes),
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
    // The work buffer grows into what is left before edge blocks do: it saves passes.
    let work_bytes = input.work_minimum
        + input
            .work_wanted
            .saturating_sub(input.work_minimum)
            .min(input.memory - fixed);
    // Windowed vertex data needs the rest of the budget as its page cache.
    let mut local_room = match windowed {
        true => 0,
        false => input.memory - fixed - (work_bytes - input.work_minimum),
    };
    let (mut far, mut local, mut disk) = (0u64, 0u64, 0u64);
    // Far memory takes a prefix of the streaming order that stays within the target.
    let mut far_open = true;
    let tiers = segments
        .iter()
        .map(|s| {
            let (b, r) = (stored(s), resident(s));
            far_open &= far + b <= far_target;
            if far_open {
                far += b;
                Tier::Far
            } else if input.keep_resident && r <= local_room {
                local_room -= r;
                local += r;
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
        vertex_windowed: windowed,
        window_bytes: input.window_bytes,
        buffer_bytes: input.buffer_bytes,
        local_edge_bytes: local,
        far_bytes: far,
        disk_bytes: disk,
        far_ratio: far as f64 / footprint.max(1) as f64,
        work_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store::budget::group_bytes;

    fn segs(n: usize, edges: u64) -> Vec<Segment> {
        (0..n)
            .map(|k| Segment {
                major: k as u32,
                blocks: k..k + 1,
                edges: k as u64 * edges..(k as u64 + 1) * edges,
                bytes: k as u64 * edges * EDGE_BYTES..(k as u64 + 1) * edges * EDGE_BYTES,
            })
            .collect()
    }

    fn input(memory: u64, ratio: Option<f64>) -> PlaceInput {
        PlaceInput {
            vertex_bytes: 10 << 20,
            window_bytes: 1 << 20,
            vertex_placement: VertexPlacement::Auto,
            buffer_bytes: 6 << 20,
            bytes_per_edge: 8,
            memory,
            far_ratio: ratio,
            far_capacity: u64::MAX,
            keep_resident: true,
            group_bytes: 0,
            work_minimum: 0,
            work_wanted: 0,
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
        // Never past the target: at R = 0.45 (43.2 MiB) five segments go, not six.
        let p = place(&segs(10, 1 << 20), &input(1 << 30, Some(0.45))).unwrap();
        assert_eq!(p.far_bytes, 40 << 20);
        assert!(p.tiers[..5].iter().all(|t| *t == Tier::Far));
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
        assert!(!p.vertex_windowed);
        assert_eq!(p.tiers.iter().filter(|t| **t == Tier::Local).count(), 3);
        assert_eq!(p.disk_bytes, 56 << 20);
        let e = place(&segs(10, 1 << 20), &input(RUNTIME_RESERVE, None)).unwrap_err();
        assert!(e.to_string().contains("windows of it 1.00 MiB"), "{e}");
    }

    #[test]
    fn vertex_data_too_big_for_the_budget_is_windowed_and_edges_stream() {
        // 10 MiB of vertex data and 6 MiB of buffers do not fit 32 MiB + 12 MiB; windows do.
        let p = place(
            &segs(10, 1 << 20),
            &input(RUNTIME_RESERVE + (12 << 20), Some(0.3)),
        )
        .unwrap();
        assert!(p.vertex_windowed);
        assert_eq!(p.local_edge_bytes, 0);
        assert_eq!(p.far_bytes + p.disk_bytes, 80 << 20);
        assert!(p.far_bytes > 0);
        assert_eq!(p.window_bytes, 1 << 20);
        let forced = PlaceInput {
            vertex_placement: VertexPlacement::Windows,
            ..input(1 << 30, None)
        };
        assert!(place(&segs(10, 1 << 20), &forced).unwrap().vertex_windowed);
        let refused = PlaceInput {
            vertex_placement: VertexPlacement::Memory,
            ..input(RUNTIME_RESERVE + (12 << 20), None)
        };
        assert!(place(&segs(10, 1 << 20), &refused).is_err());
    }

    #[test]
    fn the_work_buffer_takes_its_minimum_then_grows_before_edge_blocks_stay() {
        // 10 + 6 + 32 MiB fixed, and a work buffer of 4 to 12 MiB: it takes 12 of the 32 MiB
        // left, and two segments of 8 MiB stay resident in the other 20.
        let memory = RUNTIME_RESERVE + (48 << 20);
        let with = |minimum: u64, wanted: u64| PlaceInput {
            work_minimum: minimum,
            work_wanted: wanted,
            ..input(memory, None)
        };
        let p = place(&segs(10, 1 << 20), &with(4 << 20, 12 << 20)).unwrap();
        assert_eq!(p.work_bytes, 12 << 20);
        assert_eq!(p.local_edge_bytes, 16 << 20);
        // Wanting more than is left, it takes all of it and no edge block stays.
        let p = place(&segs(10, 1 << 20), &with(4 << 20, 1 << 30)).unwrap();
        assert_eq!(p.work_bytes, 32 << 20);
        assert_eq!(p.local_edge_bytes, 0);
        // Its minimum counts in what the budget must hold: beside whole vertex data it does
        // not fit, and vertex data goes to windows; beside the windows it does not either.
        let p = place(&segs(10, 1 << 20), &with(40 << 20, 40 << 20)).unwrap();
        assert!(p.vertex_windowed && p.work_bytes == 40 << 20);
        let e = place(&segs(10, 1 << 20), &with(48 << 20, 48 << 20)).unwrap_err();
        assert!(
            e.to_string().contains("work buffer at least 48.0 MiB"),
            "{e}"
        );
    }

    #[test]
    fn a_ranks_torch_and_gloo_take_their_share_of_the_budget() {
        // 10 MiB of vertex data, 6 MiB of buffers and the runtime fit 64 MiB with room for
        // two 8 MiB segments of edges; with 8 MiB set aside for torch and gloo, one.
        let memory = RUNTIME_RESERVE + (32 << 20);
        let alone = place(&segs(10, 1 << 20), &input(memory, None)).unwrap();
        assert_eq!(alone.local_edge_bytes, 16 << 20);
        let rank = PlaceInput {
            group_bytes: 8 << 20,
            ..input(memory, None)
        };
        let p = place(&segs(10, 1 << 20), &rank).unwrap();
        assert!(!p.vertex_windowed);
        assert_eq!(p.local_edge_bytes, 8 << 20);
        // Windowed, the fixed parts are 1 + 6 + 32 + 136 MiB (40 MiB measured and the code
        // pages): more than 64 MiB.
        let tight = PlaceInput {
            group_bytes: group_bytes(Some(40 << 20)),
            ..input(memory, None)
        };
        let e = place(&segs(10, 1 << 20), &tight).unwrap_err().to_string();
        assert!(
            e.contains("torch and gloo take 136 MiB (RssAnon 40.0 MiB measured"),
            "{e}"
        );
        assert!(e.contains("at least 175 MiB"), "{e}");
    }

    #[test]
    fn compressed_segments_stream_as_codes_and_stay_resident_as_records() {
        // Ten segments of 1M edges stored in 2.5 MB each: far memory and the disk hold the
        // codes, resident memory the 8 MB of records.
        let segs: Vec<Segment> = segs(10, 1 << 20)
            .into_iter()
            .enumerate()
            .map(|(k, s)| Segment {
                bytes: k as u64 * 2_500_000..(k as u64 + 1) * 2_500_000,
                ..s
            })
            .collect();
        let p = place(
            &segs,
            &input(RUNTIME_RESERVE + (16 << 20) + (20 << 20), Some(0.2)),
        )
        .unwrap();
        let tier = |t| p.tiers.iter().filter(|x| **x == t).count() as u64;
        // Footprint 16 MiB + 25 MB: 20% is 8.6 MB, three segments of codes.
        assert_eq!(p.far_bytes, tier(Tier::Far) * 2_500_000);
        assert_eq!(tier(Tier::Far), 3);
        assert_eq!(p.local_edge_bytes, tier(Tier::Local) * (8 << 20));
        assert_eq!(tier(Tier::Local), 2);
        assert_eq!(p.disk_bytes, tier(Tier::Disk) * 2_500_000);
    }
}
