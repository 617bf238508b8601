//! Request scheduling (GLIST §4.2.1, Alg. 1): turns a window of user analysis requests into
//! groups of vertex embeddings to run, plus the table that maps each request's output rows back
//! to those embeddings (the paper's embedding-prediction mapping table, EP_MT). Pure policy: no
//! threads, no I/O.
//!
//! A GNN request splits into an **embedding** phase (sample, aggregate, combine: the costly,
//! shareable part) and a **prediction** phase (the request-specific decoder). So:
//!
//! - **Partition (Alg. 1 line 2)** is the caller's: one call to [`plan`] receives only requests
//!   on the same graph and model, since only those can share embeddings.
//! - **Decomposition (lines 3-9)**: a node request needs one embedding per target vertex; a
//!   link request needs one per endpoint plus a prediction that combines the two. Embeddings
//!   are deduplicated across the whole window: a vertex wanted by several requests, or as the
//!   endpoint of several links, is embedded once. (The paper's graph-level requests, whose
//!   `extract_graph` it does not describe, are not served.)
//! - **Reordering (line 10, `reorder_primitive_req`)**: only the embeddings are reordered;
//!   predictions keep request order and find their inputs through EP_MT. The paper's
//!   implementation "simply finds the vertex that has the minimum distance from the previously
//!   requested vertex"; we take the distance to be `|a - b|` in the vertex id space, which
//!   [`strata_graph::order::glist`] makes locality-preserving, so consecutive embeddings sample
//!   overlapping neighbourhoods whose feature pages are then still cached.
//! - **Grouping (line 11, `request_grouping`)**: the ordered embeddings are cut into groups of
//!   `S`; the executor fuses each group into one sampled batch.

use std::collections::HashMap;

use crate::error::{Result, ServeError};

/// Default group size `S`. GLIST's gains from grouping flatten beyond about 200 requests a
/// group (§5.2); 256 sits just past that knee, while a group stays one modest sampled batch
/// for the CPU executor (with fanouts `[15, 10]`, at most 256 × 166 ≈ 42k feature rows).
pub const DEFAULT_GROUP_SIZE: usize = 256;

/// What one user request asks about, as internal vertex ids (already checked against the
/// graph by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Node-level analysis (embedding or class) of each vertex.
    Nodes(Vec<u32>),
    /// Link-level analysis (a score) of each `(source, destination)` pair.
    Links(Vec<(u32, u32)>),
}

/// Scheduling policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// Reorder the embeddings into a nearest-id chain (`false`: first-arrival order).
    pub reorder: bool,
    /// `S`: at most this many embeddings a group, at least 1.
    pub group_size: usize,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            reorder: true,
            group_size: DEFAULT_GROUP_SIZE,
        }
    }
}

/// EP_MT entry of one request: for each of its output rows, the slot(s) of the embeddings it
/// reads. Slot `s` is the `s`-th vertex of the execution order, i.e. `groups.concat()[s]`: row
/// `s % S` of group `s / S`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestMap {
    /// One slot per target vertex: the row is that embedding (or its class).
    Nodes(Vec<u32>),
    /// `(source slot, destination slot)` per target pair: the prediction to run on the two.
    Links(Vec<(u32, u32)>),
}

/// A window's schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The distinct vertices to embed, in execution order, cut into groups of `S` (the last
    /// may be shorter); each group is fused into one sampled batch.
    pub groups: Vec<Vec<u32>>,
    /// EP_MT: entry `r` belongs to request `r`, in the order given to [`plan`].
    pub requests: Vec<RequestMap>,
}

/// Schedules one window of requests on one graph and model (Alg. 1): decomposition into
/// deduplicated embeddings, optional nearest-id reordering, grouping by `cfg.group_size`.
/// `O(p log p)` for `p` distinct vertices.
///
/// Errors: `InvalidArgument` if `cfg.group_size` is 0.
pub fn plan(requests: &[Targets], cfg: &ScheduleConfig) -> Result<Plan> {
    if cfg.group_size == 0 {
        return Err(ServeError::InvalidArgument(
            "group_size must be at least 1".into(),
        ));
    }
    // Decomposition: `vertices` holds each distinct vertex once, in first-arrival order, and
    // the request maps point into it until the order is known.
    let mut vertices: Vec<u32> = Vec::new();
    let mut index_of: HashMap<u32, u32> = HashMap::new();
    let mut primitive = |v: u32| {
        *index_of.entry(v).or_insert_with(|| {
            vertices.push(v);
            (vertices.len() - 1) as u32
        })
    };
    let mut maps: Vec<RequestMap> = requests
        .iter()
        .map(|request| match request {
            Targets::Nodes(nodes) => {
                RequestMap::Nodes(nodes.iter().map(|&v| primitive(v)).collect())
            }
            Targets::Links(links) => RequestMap::Links(
                links
                    .iter()
                    .map(|&(src, dst)| (primitive(src), primitive(dst)))
                    .collect(),
            ),
        })
        .collect();

    let order: Vec<u32> = if cfg.reorder {
        nearest_id_chain(&vertices)
    } else {
        (0..vertices.len() as u32).collect()
    };
    let mut slot_of = vec![0u32; vertices.len()];
    for (slot, &primitive) in order.iter().enumerate() {
        slot_of[primitive as usize] = slot as u32;
    }
    for map in &mut maps {
        match map {
            RequestMap::Nodes(rows) => rows.iter_mut().for_each(|p| *p = slot_of[*p as usize]),
            RequestMap::Links(rows) => rows.iter_mut().for_each(|(a, b)| {
                *a = slot_of[*a as usize];
                *b = slot_of[*b as usize];
            }),
        }
    }
    let groups = order
        .chunks(cfg.group_size)
        .map(|group| group.iter().map(|&p| vertices[p as usize]).collect())
        .collect();
    Ok(Plan {
        groups,
        requests: maps,
    })
}

/// `reorder_primitive_req`: indices into `vertices` (distinct ids), starting from the first and
/// moving each time to the remaining vertex nearest in id (ties: the smaller id).
///
/// The remaining vertices, sorted by id, form a doubly linked list; removing the current one
/// leaves its list neighbours as the nearest remaining on either side, so after the sort each
/// step is O(1).
fn nearest_id_chain(vertices: &[u32]) -> Vec<u32> {
    let n = vertices.len();
    if n == 0 {
        return Vec::new();
    }
    let mut by_id: Vec<u32> = (0..n as u32).collect();
    by_id.sort_unstable_by_key(|&p| vertices[p as usize]);
    let id = |position: usize| vertices[by_id[position] as usize];
    let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
    let mut next: Vec<Option<usize>> = (0..n).map(|i| Some(i + 1).filter(|&j| j < n)).collect();

    let mut current = by_id
        .iter()
        .position(|&p| p == 0)
        .expect("primitive 0 exists");
    let mut chain = Vec::with_capacity(n);
    loop {
        chain.push(by_id[current]);
        let (below, above) = (prev[current], next[current]);
        if let Some(b) = below {
            next[b] = above;
        }
        if let Some(a) = above {
            prev[a] = below;
        }
        current = match (below, above) {
            (None, None) => break,
            (Some(b), None) => b,
            (None, Some(a)) => a,
            (Some(b), Some(a)) => {
                if id(current) - id(b) <= id(a) - id(current) {
                    b
                } else {
                    a
                }
            }
        };
    }
    chain
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use proptest::prelude::*;

    fn cfg(reorder: bool, group_size: usize) -> ScheduleConfig {
        ScheduleConfig {
            reorder,
            group_size,
        }
    }

    /// The vertex behind each slot.
    fn slots(plan: &Plan) -> Vec<u32> {
        plan.groups.concat()
    }

    #[test]
    fn shared_endpoints_are_embedded_once() {
        let requests = [
            Targets::Links(vec![(1, 2), (2, 3)]),
            Targets::Nodes(vec![3, 4, 1]),
            Targets::Links(vec![(4, 1)]),
        ];
        let plan = plan(&requests, &cfg(false, 3)).unwrap();
        // 8 endpoint or target rows, 4 distinct vertices, in first-arrival order.
        assert_eq!(plan.groups, [vec![1, 2, 3], vec![4]]);
        assert_eq!(
            plan.requests,
            [
                RequestMap::Links(vec![(0, 1), (1, 2)]),
                RequestMap::Nodes(vec![2, 3, 0]),
                RequestMap::Links(vec![(3, 0)]),
            ]
        );
    }

    #[test]
    fn reorders_into_a_nearest_id_chain() {
        let requests = [Targets::Nodes(vec![50, 3]), Targets::Nodes(vec![49, 10, 2])];
        let chain = plan(&requests, &cfg(true, 2)).unwrap();
        assert_eq!(chain.groups, [vec![50, 49], vec![10, 3], vec![2]]);
        // Predictions keep request order; their rows follow the vertices to their slots.
        assert_eq!(
            chain.requests,
            [
                RequestMap::Nodes(vec![0, 3]),
                RequestMap::Nodes(vec![1, 2, 4])
            ]
        );
        // Equal distance on both sides: the smaller id first.
        let tie = plan(&[Targets::Nodes(vec![5, 7, 3])], &cfg(true, 8)).unwrap();
        assert_eq!(tie.groups, [vec![5, 3, 7]]);
    }

    #[test]
    fn without_reordering_keeps_first_arrival_order() {
        let requests = [
            Targets::Nodes(vec![50, 3, 50]),
            Targets::Links(vec![(49, 3), (10, 2)]),
        ];
        let plan = plan(&requests, &cfg(false, 10)).unwrap();
        assert_eq!(plan.groups, [vec![50, 3, 49, 10, 2]]);
        assert_eq!(
            plan.requests,
            [
                RequestMap::Nodes(vec![0, 1, 0]),
                RequestMap::Links(vec![(2, 1), (3, 4)])
            ]
        );
    }

    #[test]
    fn empty_windows_and_bad_group_size() {
        let empty = plan(&[], &ScheduleConfig::default()).unwrap();
        assert!(empty.groups.is_empty() && empty.requests.is_empty());
        let no_targets = plan(&[Targets::Links(vec![])], &ScheduleConfig::default()).unwrap();
        assert!(no_targets.groups.is_empty());
        assert_eq!(no_targets.requests, [RequestMap::Links(vec![])]);
        match plan(&[Targets::Nodes(vec![1])], &cfg(true, 0)) {
            Err(ServeError::InvalidArgument(m)) => assert!(m.contains("group_size"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chains_half_a_million_scattered_ids() {
        // 500k distinct scattered ids (a quadratic chain would take ~10^11 steps): each step
        // of the chain is checked against the remaining ids kept in a BTreeSet, where the
        // nearest (ties: the smaller) is one of the two around the current id.
        let n = 500_000u32;
        let ids: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let requests: Vec<Targets> = ids
            .chunks(1000)
            .map(|c| Targets::Nodes(c.to_vec()))
            .collect();
        let chain = slots(&plan(&requests, &ScheduleConfig::default()).unwrap());
        assert_eq!((chain.len(), chain[0]), (n as usize, ids[0]));
        let mut remaining: BTreeSet<u32> = ids.iter().copied().collect();
        remaining.remove(&chain[0]);
        for step in chain.windows(2) {
            let at = step[0];
            let below = remaining.range(..at).next_back();
            let above = remaining.range(at..).next();
            let nearest = below
                .into_iter()
                .chain(above)
                .min_by_key(|&&v| (v.abs_diff(at), v));
            assert_eq!(Some(&step[1]), nearest);
            remaining.remove(&step[1]);
        }
    }

    fn arb_requests() -> impl Strategy<Value = Vec<Targets>> {
        let node = prop::collection::vec(0u32..40, 0..6).prop_map(Targets::Nodes);
        let link = prop::collection::vec((0u32..40, 0u32..40), 0..6).prop_map(Targets::Links);
        prop::collection::vec(prop_oneof![node, link], 0..8)
    }

    proptest! {
        #[test]
        fn ep_mt_maps_every_row_to_its_vertex(
            requests in arb_requests(),
            reorder in any::<bool>(),
            group_size in 1usize..6,
        ) {
            let plan = plan(&requests, &cfg(reorder, group_size)).unwrap();
            let vertex = slots(&plan);
            // Groups partition the distinct targets, each group full but the last.
            let mut distinct: Vec<u32> = requests.iter().flat_map(|r| match r {
                Targets::Nodes(v) => v.clone(),
                Targets::Links(l) => l.iter().flat_map(|&(a, b)| [a, b]).collect(),
            }).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let mut scheduled = vertex.clone();
            scheduled.sort_unstable();
            prop_assert_eq!(&scheduled, &distinct);
            for (i, group) in plan.groups.iter().enumerate() {
                prop_assert!(!group.is_empty() && group.len() <= group_size);
                prop_assert!(i + 1 == plan.groups.len() || group.len() == group_size);
            }
            // Every row reads the embedding of the vertex it asked about.
            prop_assert_eq!(plan.requests.len(), requests.len());
            for (request, map) in requests.iter().zip(&plan.requests) {
                match (request, map) {
                    (Targets::Nodes(targets), RequestMap::Nodes(rows)) => {
                        let read: Vec<u32> = rows.iter().map(|&s| vertex[s as usize]).collect();
                        prop_assert_eq!(&read, targets);
                    }
                    (Targets::Links(targets), RequestMap::Links(rows)) => {
                        let read: Vec<(u32, u32)> =
                            rows.iter().map(|&(a, b)| (vertex[a as usize], vertex[b as usize])).collect();
                        prop_assert_eq!(&read, targets);
                    }
                    _ => prop_assert!(false, "request kind changed"),
                }
            }
            // The chain: from the first arrival, each next vertex is the nearest remaining
            // (ties: smaller id).
            if reorder && !vertex.is_empty() {
                prop_assert_eq!(vertex[0], distinct_in_arrival_order(&requests)[0]);
                for i in 1..vertex.len() {
                    let best = vertex[i..]
                        .iter()
                        .copied()
                        .min_by_key(|&v| (v.abs_diff(vertex[i - 1]), v))
                        .unwrap();
                    prop_assert_eq!(vertex[i], best);
                }
            } else {
                prop_assert_eq!(vertex, distinct_in_arrival_order(&requests));
            }
        }
    }

    fn distinct_in_arrival_order(requests: &[Targets]) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for request in requests {
            let targets: Vec<u32> = match request {
                Targets::Nodes(v) => v.clone(),
                Targets::Links(l) => l.iter().flat_map(|&(a, b)| [a, b]).collect(),
            };
            for v in targets {
                if !out.contains(&v) {
                    out.push(v);
                }
            }
        }
        out
    }
}
