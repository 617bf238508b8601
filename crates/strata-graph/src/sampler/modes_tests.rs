//! Tests of the weighted, temporal and per-edge-type samplers: exact small cases, the
//! distributions against PyG's documented semantics with fixed seeds, and properties of
//! random graphs.

use super::*;
use crate::topology::{EdgeColumns, Topology};
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};

/// One in-edge: (neighbour, weight, time, edge type).
type Edge = (u32, f32, i64, u32);

/// A topology whose node `v` has the in-edges `lists[v]`, each segment sorted by edge type
/// (stable, as a store's (edge type, edge id) order), with all three columns.
fn graph(lists: &[Vec<Edge>], num_types: usize) -> Topology {
    let mut indptr = vec![0u64];
    let (mut indices, mut weights, mut times, mut types) = (vec![], vec![], vec![], vec![]);
    for list in lists {
        let mut list = list.clone();
        list.sort_by_key(|e| e.3);
        for (u, w, t, ty) in list {
            indices.push(u);
            weights.push(w);
            times.push(t);
            types.push(ty);
        }
        indptr.push(indices.len() as u64);
    }
    let ids = (0..indices.len() as u64).map(|p| p + ID_BASE).collect();
    Topology::new(indptr, indices)
        .unwrap()
        .with_columns(EdgeColumns {
            weights: Some(weights),
            times: Some(times),
            ids: Some(ids),
            types: Some(types),
            num_types,
        })
        .unwrap()
}

/// [`graph`] gives the edge at adjacency position `p` the id `ID_BASE + p`, so an id is
/// checkable against the edge it names.
const ID_BASE: u64 = 1000;

/// Node 0's in-edges come from `1..=edges.len()` with the given (weight, time, type).
fn star(edges: &[(f32, i64, u32)], num_types: usize) -> Topology {
    let mut lists = vec![edges
        .iter()
        .enumerate()
        .map(|(i, &(w, t, ty))| (i as u32 + 1, w, t, ty))
        .collect::<Vec<_>>()];
    lists.resize(edges.len() + 1, Vec::new());
    graph(&lists, num_types)
}

fn sampler(config: SamplerConfig, threads: usize) -> NeighborSampler {
    let mut s = NeighborSampler::new(SamplerConfig { threads, ..config }).unwrap();
    // Split even tiny frontiers, so the tests exercise the threaded path.
    s.min_chunk = 1;
    s
}

fn weighted(fanouts: &[i32]) -> SamplerConfig {
    SamplerConfig {
        fanouts: fanouts.to_vec(),
        seed: 5,
        weighted: true,
        ..SamplerConfig::default()
    }
}

fn temporal(fanouts: &[i32], strategy: TemporalStrategy) -> SamplerConfig {
    SamplerConfig {
        fanouts: fanouts.to_vec(),
        seed: 9,
        temporal: Some(strategy),
        ..SamplerConfig::default()
    }
}

fn typed(per_type: &[Vec<i32>]) -> SamplerConfig {
    SamplerConfig {
        fanouts: vec![],
        seed: 3,
        edge_type_fanouts: per_type.to_vec(),
        ..SamplerConfig::default()
    }
}

/// The global ids of the sources the seed at local id `dst` kept at hop 1.
fn kept(s: &Sample, dst: usize) -> BTreeSet<u32> {
    let block = s.blocks.last().unwrap();
    block
        .sources(dst)
        .iter()
        .map(|&j| s.nodes[j as usize])
        .collect()
}

/// Chi-square statistic of observed counts against expected counts.
pub(super) fn chi2(observed: &[f64], expected: &[f64]) -> f64 {
    observed
        .iter()
        .zip(expected)
        .map(|(o, e)| (o - e).powi(2) / e)
        .sum()
}

#[test]
fn weighted_skips_zero_weights_and_keeps_all_positive_ones_when_few() {
    let topo = star(
        &[
            (0.0, 0, 0),
            (1.0, 0, 0),
            (0.0, 0, 0),
            (2.0, 0, 0),
            (3.0, 0, 0),
        ],
        1,
    );
    let positive: BTreeSet<u32> = [2, 4, 5].into();
    for key in 0..200 {
        let two = sampler(weighted(&[2]), 1).sample(&topo, &[0], key).unwrap();
        let got = kept(&two, 0);
        assert_eq!(got.len(), 2);
        assert!(got.is_subset(&positive), "{got:?}");
    }
    for fanout in [3, 5, -1] {
        let s = sampler(weighted(&[fanout]), 2)
            .sample(&topo, &[0], 1)
            .unwrap();
        assert_eq!(kept(&s, 0), positive, "fanout {fanout}");
    }
}

#[test]
fn weighted_inclusion_matches_successive_draws() {
    // PyG's semantics: k = 2 successive draws without replacement, each proportional to the
    // weights left. Node i is kept with probability w_i/W + sum_j w_j/W * w_i/(W - w_j).
    let w = [1.0f64, 2.0, 3.0, 4.0, 0.5];
    let edges: Vec<(f32, i64, u32)> = w.iter().map(|&x| (x as f32, 0, 0)).collect();
    let topo = star(&edges, 1);
    let total: f64 = w.iter().sum();
    let expected_p: Vec<f64> = (0..w.len())
        .map(|i| {
            let first = w[i] / total;
            let second: f64 = (0..w.len())
                .filter(|&j| j != i)
                .map(|j| w[j] / total * w[i] / (total - w[j]))
                .sum();
            first + second
        })
        .collect();
    let trials = 20_000u64;
    let s = sampler(weighted(&[2]), 1);
    let mut counts = vec![0f64; w.len()];
    for key in 0..trials {
        for v in kept(&s.sample(&topo, &[0], key).unwrap(), 0) {
            counts[v as usize - 1] += 1.0;
        }
    }
    let expected: Vec<f64> = expected_p.iter().map(|p| p * trials as f64).collect();
    // Inclusion counts sum to 2 * trials, so 4 degrees of freedom at most; P(chi2 > 30) is
    // below 1e-5.
    let stat = chi2(&counts, &expected);
    assert!(stat < 30.0, "chi2 {stat}: {counts:?} against {expected:?}");
}

#[test]
fn temporal_last_takes_the_newest_eligible_edges() {
    // In-edges from 1..=6 at times 5, 1, 9, 3, 7, 3.
    let times = [5, 1, 9, 3, 7, 3];
    let edges: Vec<(f32, i64, u32)> = times.iter().map(|&t| (1.0, t, 0)).collect();
    let topo = star(&edges, 1);
    let s = sampler(temporal(&[2], TemporalStrategy::Last), 1);
    // At time 5: eligible 1 (5), 2 (1), 4 (3), 6 (3); the newest two are 1 and, of the tie
    // at 3, the later edge 6.
    let got = s.sample_temporal(&topo, &[0], &[5], 0).unwrap();
    assert_eq!(kept(&got, 0), [1, 6].into());
    assert_eq!(got.batch, [0, 0, 0]);
    // The whole eligible set when the fanout is larger; nothing before the first edge.
    let s4 = sampler(temporal(&[10], TemporalStrategy::Last), 1);
    let all = s4.sample_temporal(&topo, &[0], &[5], 0).unwrap();
    assert_eq!(kept(&all, 0), [1, 2, 4, 6].into());
    let none = s4.sample_temporal(&topo, &[0], &[0], 0).unwrap();
    assert_eq!(none.num_edges(), 0);
    // "last" is deterministic: every batch key gives the same.
    for key in 1..20 {
        assert_eq!(
            kept(&s.sample_temporal(&topo, &[0], &[5], key).unwrap(), 0),
            [1, 6].into()
        );
    }
}

#[test]
fn temporal_uniform_is_uniform_over_eligible_edges() {
    // 6 edges at time <= 10, 3 later ones that must never appear.
    let times = [1, 20, 2, 3, 30, 4, 5, 40, 10];
    let edges: Vec<(f32, i64, u32)> = times.iter().map(|&t| (1.0, t, 0)).collect();
    let topo = star(&edges, 1);
    let s = sampler(temporal(&[2], TemporalStrategy::Uniform), 1);
    let trials = 12_000u64;
    let mut counts = [0f64; 9];
    for key in 0..trials {
        for v in kept(&s.sample_temporal(&topo, &[0], &[10], key).unwrap(), 0) {
            counts[v as usize - 1] += 1.0;
        }
    }
    for (i, &t) in times.iter().enumerate() {
        if t > 10 {
            assert_eq!(counts[i], 0.0, "edge at time {t} was taken");
        }
    }
    let eligible: Vec<f64> = (0..9)
        .filter(|&i| times[i] <= 10)
        .map(|i| counts[i])
        .collect();
    // Each eligible edge is kept with probability 2/6.
    let expected = vec![trials as f64 / 3.0; eligible.len()];
    let stat = chi2(&eligible, &expected);
    assert!(stat < 30.0, "chi2 {stat}: {eligible:?}");
}

#[test]
fn temporal_weighted_draws_by_weight_among_eligible_edges() {
    // Weights 1 and 3 eligible, a heavy later edge never.
    let topo = star(&[(1.0, 1, 0), (100.0, 50, 0), (3.0, 2, 0)], 1);
    let config = SamplerConfig {
        weighted: true,
        ..temporal(&[1], TemporalStrategy::Uniform)
    };
    let s = sampler(config, 1);
    let trials = 8000u64;
    let mut heavy = 0f64;
    for key in 0..trials {
        let got = kept(&s.sample_temporal(&topo, &[0], &[10], key).unwrap(), 0);
        assert!(!got.contains(&2));
        heavy += f64::from(u8::from(got.contains(&3)));
    }
    let freq = heavy / trials as f64;
    assert!((freq - 0.75).abs() < 0.025, "weight 3 of 4 taken {freq}");
}

#[test]
fn temporal_samples_are_disjoint_per_seed() {
    // 0 <- 2 (t 1), 1 <- 2 (t 1), 2 <- 3 (t 5), 2 <- 4 (t 1).
    let lists = vec![
        vec![(2, 1.0, 1, 0)],
        vec![(2, 1.0, 1, 0)],
        vec![(3, 1.0, 5, 0), (4, 1.0, 1, 0)],
        vec![],
        vec![],
    ];
    let topo = graph(&lists, 1);
    let s = sampler(temporal(&[-1, -1], TemporalStrategy::Uniform), 2);
    let got = s.sample_temporal(&topo, &[0, 1], &[2, 9], 4).unwrap();
    // Seed 0 (time 2) reaches 2 then only 4; seed 1 (time 9) reaches 2 then 3 and 4.
    assert_eq!(got.nodes, [0, 1, 2, 2, 4, 3, 4]);
    assert_eq!(got.batch, [0, 1, 0, 1, 0, 1, 1]);
    assert_eq!(got.hop_counts, [2, 2, 3]);
    // The same node at two times is two seeds.
    let twice = s.sample_temporal(&topo, &[2, 2], &[2, 9], 4).unwrap();
    assert_eq!(twice.nodes, [2, 2, 4, 3, 4]);
    assert_eq!(twice.batch, [0, 1, 0, 1, 1]);
}

#[test]
fn per_type_fanouts_take_each_types_share() {
    // Node 0: five in-edges of type 0 (from 1..=5) and four of type 1 (from 6..=9), listed
    // in reverse; the graph sorts each segment by type.
    let lists: Vec<Vec<Edge>> = std::iter::once(
        (1..=5u32)
            .map(|u| (u, 1.0, 0, 0))
            .chain((6..=9).map(|u| (u, 1.0, 0, 1)))
            .rev()
            .collect(),
    )
    .chain((1..=9).map(|_| Vec::new()))
    .collect();
    let topo = graph(&lists, 2);
    let type0: BTreeSet<u32> = (1..=5).collect();
    let type1: BTreeSet<u32> = (6..=9).collect();
    for key in 0..50 {
        let s = sampler(typed(&[vec![2], vec![3]]), 1)
            .sample(&topo, &[0], key)
            .unwrap();
        let got = kept(&s, 0);
        assert_eq!(got.intersection(&type0).count(), 2);
        assert_eq!(got.intersection(&type1).count(), 3);
        // Each kept edge's type is recorded alongside it.
        let block = s.blocks.last().unwrap();
        for (i, &j) in block.sources(0).iter().enumerate() {
            let want = u32::from(s.nodes[j as usize] >= 6);
            assert_eq!(s.edge_types[0][i], want);
        }
    }
    let only_one = sampler(typed(&[vec![0], vec![-1]]), 1)
        .sample(&topo, &[0], 0)
        .unwrap();
    assert_eq!(kept(&only_one, 0), type1);
}

#[test]
fn bad_modes_are_refused_naming_the_option() {
    let err = |r: Result<NeighborSampler>| r.unwrap_err().to_string();
    let last_weighted = SamplerConfig {
        weighted: true,
        ..temporal(&[2], TemporalStrategy::Last)
    };
    assert!(err(NeighborSampler::new(last_weighted)).starts_with("gnn.weighted:"));
    let both = SamplerConfig {
        fanouts: vec![2],
        ..typed(&[vec![1]])
    };
    assert!(err(NeighborSampler::new(both)).contains("give one or the other"));
    let uneven = typed(&[vec![1, 2], vec![1]]);
    assert!(err(NeighborSampler::new(uneven)).contains("same number of hops"));
    assert!(err(NeighborSampler::new(typed(&[vec![-2]]))).contains("at least 0"));
    assert!(err(NeighborSampler::new(typed(&[vec![]]))).contains("at least one hop"));
    assert!(NeighborSampler::new(typed(&[vec![0, -1], vec![3, 0]])).is_ok());

    // A plain topology has none of the columns.
    let plain = Topology::new(vec![0, 1, 1], vec![1]).unwrap();
    let msg = |r: Result<Sample>| r.unwrap_err().to_string();
    let w = sampler(weighted(&[1]), 1);
    assert!(msg(w.sample(&plain, &[0], 0)).starts_with("gnn.weighted:"));
    let t = sampler(temporal(&[1], TemporalStrategy::Uniform), 1);
    assert!(msg(t.sample_temporal(&plain, &[0], &[1], 0)).starts_with("gnn.temporal_strategy:"));
    let ty = sampler(typed(&[vec![1]]), 1);
    assert!(msg(ty.sample(&plain, &[0], 0)).contains("need a graph with edge types"));
    let ids = sampler(
        SamplerConfig {
            fanouts: vec![1],
            edge_ids: true,
            ..SamplerConfig::default()
        },
        1,
    );
    assert!(msg(ids.sample(&plain, &[0], 0)).contains("edge ids were asked for"));

    let topo = star(&[(1.0, 1, 0), (1.0, 2, 1)], 2);
    assert!(
        msg(ty.sample(&topo, &[0], 0)).contains("1 per-edge-type fanout lists for a graph with 2")
    );
    assert!(msg(t.sample(&topo, &[0], 0)).contains("needs a time per seed"));
    assert!(msg(t.sample_temporal(&topo, &[0, 1], &[1], 0)).contains("2 seeds but 1 seed times"));
    assert!(msg(w.sample_temporal(&topo, &[0], &[1], 0)).starts_with("gnn.temporal_strategy:"));
    let links = t
        .sample_links(&topo, &[0], &[1], 1, 0)
        .unwrap_err()
        .to_string();
    assert!(links.contains("not supported"), "{links}");
}

#[test]
fn topology_columns_are_checked() {
    let t = || Topology::new(vec![0, 2, 2], vec![1, 1]).unwrap();
    let cols = |w: Vec<f32>, ty: Vec<u32>, n| EdgeColumns {
        weights: Some(w),
        times: None,
        types: Some(ty),
        num_types: n,
        ids: None,
    };
    let err = |c| t().with_columns(c).unwrap_err().to_string();
    assert!(err(cols(vec![1.0], vec![0, 0], 1)).contains("1 edge weights for 2 edges"));
    assert!(err(cols(vec![-1.0, 1.0], vec![0, 0], 1)).contains("not a finite non-negative"));
    assert!(err(cols(vec![f32::NAN, 1.0], vec![0, 0], 1)).contains("not a finite non-negative"));
    assert!(err(cols(vec![1.0, 1.0], vec![0, 2], 2)).contains("edge type 2 is out of range"));
    assert!(err(cols(vec![1.0, 1.0], vec![1, 0], 2)).contains("node 0 are not in increasing order"));
    let ok = t()
        .with_columns(cols(vec![1.0, 0.0], vec![0, 1], 2))
        .unwrap();
    assert_eq!(ok.bytes(), 3 * 8 + 2 * 4 + 2 * 4 + 2 * 4);
    assert_eq!(
        ok.columns(),
        crate::topology::ColumnSet {
            weights: true,
            times: false,
            edge_types: 2,
            ids: false,
        }
    );
}

/// (source node type, destination node type) of the 4 edge types of [`attributed_case`].
const EDGE_TYPES: [(usize, usize); 4] = [(0, 0), (1, 0), (0, 1), (1, 1)];

/// A random typed graph with every column: `n` nodes of 2 node types (ids below `n / 2`, and
/// the rest), up to 10 in-edges each, of an edge type into the node's type with a source of
/// the edge type's source type; weights with zeros, times in 0..20. Returns the type offsets
/// and distinct seeds too.
fn attributed_case() -> impl Strategy<Value = (Topology, [u64; 2], Vec<u32>)> {
    (2usize..30)
        .prop_flat_map(|n| {
            let edge = (
                any::<bool>(),
                any::<u32>(),
                prop_oneof![Just(0.0f32), 0.1f32..5.0],
                0i64..20,
            );
            let lists = prop::collection::vec(prop::collection::vec(edge, 0..10), n);
            let seeds = Just((0..n as u32).collect::<Vec<_>>()).prop_shuffle();
            (Just(n), lists, seeds, 1..=n)
        })
        .prop_map(|(n, raw, seeds, k)| {
            let half = (n / 2) as u32;
            let range = |t: usize| if t == 0 { (0, half) } else { (half, n as u32) };
            let lists: Vec<Vec<Edge>> = raw
                .iter()
                .enumerate()
                .map(|(v, edges)| {
                    let dst_t = usize::from(v as u32 >= half);
                    edges
                        .iter()
                        .map(|&(other, pick, w, t)| {
                            let src_t = usize::from(other);
                            let ty = EDGE_TYPES
                                .iter()
                                .position(|&e| e == (src_t, dst_t))
                                .unwrap();
                            let (lo, hi) = range(src_t);
                            (lo + pick % (hi - lo), w, t, ty as u32)
                        })
                        .collect()
                })
                .collect();
            (graph(&lists, 4), [0, half as u64], seeds[..k].to_vec())
        })
}

/// The node's in-edges (neighbour, weight, time, type) as a multiset.
fn in_edges(topo: &Topology, v: u32) -> Vec<Edge> {
    let e = topo.edges(v);
    (0..e.neighbors.len())
        .map(|i| (e.neighbors[i], e.weights[i], e.times[i], e.types[i]))
        .collect()
}

/// Counts per (dst local id, edge type) of a block, checking that every edge exists in the
/// graph with its type, and that `allowed(destination, edge)` holds for one such edge.
fn check_edges(
    topo: &Topology,
    s: &Sample,
    hop: usize,
    allowed: impl Fn(usize, &Edge) -> bool,
) -> HashMap<(usize, u32), usize> {
    let hops = s.blocks.len();
    let block = &s.blocks[hops - hop];
    let types = &s.edge_types[hops - hop];
    let mut counts = HashMap::new();
    for dst in 0..block.num_dst {
        let v = s.nodes[dst];
        let edges = in_edges(topo, v);
        let first = block.indptr[dst] as usize;
        for (i, &j) in block.sources(dst).iter().enumerate() {
            let (u, ty) = (s.nodes[j as usize], types[first + i]);
            assert!(
                edges
                    .iter()
                    .any(|e| e.0 == u && e.3 == ty && allowed(dst, e)),
                "edge {u} -> {v} of type {ty} at hop {hop} is not an allowed edge"
            );
            *counts.entry((dst, ty)).or_insert(0) += 1;
        }
    }
    counts
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    #[test]
    fn modes_do_not_depend_on_threads((topo, _, seeds) in attributed_case(), key in any::<u64>()) {
        let times: Vec<i64> = seeds.iter().map(|&v| v as i64 % 20).collect();
        for config in [
            weighted(&[2, 3]),
            temporal(&[2, -1], TemporalStrategy::Uniform),
            temporal(&[1, 2], TemporalStrategy::Last),
            typed(&[vec![1, 0], vec![2, -1], vec![0, 1], vec![3, 3]]),
        ] {
            let one = sampler(config.clone(), 1);
            let three = sampler(config, 3);
            if one.config().temporal.is_some() {
                prop_assert_eq!(
                    one.sample_temporal(&topo, &seeds, &times, key).unwrap(),
                    three.sample_temporal(&topo, &seeds, &times, key).unwrap()
                );
            } else {
                prop_assert_eq!(
                    one.sample(&topo, &seeds, key).unwrap(),
                    three.sample(&topo, &seeds, key).unwrap()
                );
            }
        }
    }

    #[test]
    fn weighted_samples_keep_positive_edges_up_to_the_fanout(
        (topo, _, seeds) in attributed_case(),
        fanouts in prop::collection::vec(prop_oneof![Just(-1), 1i32..4], 1..3),
        key in any::<u64>(),
    ) {
        let s = sampler(weighted(&fanouts), 2).sample(&topo, &seeds, key).unwrap();
        for hop in 1..=fanouts.len() {
            let counts = check_edges(&topo, &s, hop, |_, e| e.1 > 0.0);
            let block = &s.blocks[fanouts.len() - hop];
            for dst in 0..block.num_dst {
                let positive = in_edges(&topo, s.nodes[dst]).iter().filter(|e| e.1 > 0.0).count();
                let want = if fanouts[hop - 1] < 0 { positive } else { positive.min(fanouts[hop - 1] as usize) };
                let got: usize = counts.iter().filter(|((d, _), _)| *d == dst).map(|(_, c)| c).sum();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn temporal_samples_respect_each_seeds_time(
        (topo, _, seeds) in attributed_case(),
        last in any::<bool>(),
        fanouts in prop::collection::vec(prop_oneof![Just(-1), 1i32..4], 1..3),
        key in any::<u64>(),
    ) {
        let times: Vec<i64> = seeds.iter().map(|&v| (v as i64 * 7) % 20).collect();
        let strategy = if last { TemporalStrategy::Last } else { TemporalStrategy::Uniform };
        let s = sampler(temporal(&fanouts, strategy), 2).sample_temporal(&topo, &seeds, &times, key).unwrap();
        prop_assert_eq!(s.batch.len(), s.nodes.len());
        prop_assert_eq!(&s.batch[..seeds.len()], &(0..seeds.len() as u32).collect::<Vec<_>>()[..]);
        // Nodes are distinct within each seed's tree.
        let pairs: BTreeSet<(u32, u32)> = s.batch.iter().copied().zip(s.nodes.iter().copied()).collect();
        prop_assert_eq!(pairs.len(), s.nodes.len());
        for hop in 1..=fanouts.len() {
            let cutoff = |dst: usize| times[s.batch[dst] as usize];
            let counts = check_edges(&topo, &s, hop, |dst, e| e.2 <= cutoff(dst));
            let block = &s.blocks[fanouts.len() - hop];
            for dst in 0..block.num_dst {
                // Sources belong to their destination's seed.
                for &j in block.sources(dst) {
                    prop_assert_eq!(s.batch[j as usize], s.batch[dst]);
                }
                let eligible: Vec<Edge> = in_edges(&topo, s.nodes[dst]).into_iter().filter(|e| e.2 <= cutoff(dst)).collect();
                let f = fanouts[hop - 1];
                let want = if f < 0 { eligible.len() } else { eligible.len().min(f as usize) };
                let got: usize = counts.iter().filter(|((d, _), _)| *d == dst).map(|(_, c)| c).sum();
                prop_assert_eq!(got, want);
                if last && f >= 0 && eligible.len() > f as usize {
                    // "last": no eligible edge left out is later than one kept.
                    let mut by_time: Vec<i64> = eligible.iter().map(|e| e.2).collect();
                    by_time.sort_unstable();
                    let threshold = by_time[by_time.len() - f as usize];
                    let first = block.indptr[dst] as usize;
                    let kept_times: Vec<i64> = block.sources(dst).iter().enumerate().map(|(i, &j)| {
                        let u = s.nodes[j as usize];
                        let ty = s.edge_types[fanouts.len() - hop][first + i];
                        // The time of some matching edge at or after the threshold exists.
                        eligible.iter().filter(|e| e.0 == u && e.3 == ty).map(|e| e.2).max().unwrap()
                    }).collect();
                    prop_assert!(kept_times.iter().all(|&t| t >= threshold), "{kept_times:?} below {threshold}");
                }
            }
        }
    }

    #[test]
    fn typed_samples_take_each_types_fanout_and_group_by_type(
        (topo, offsets, seeds) in attributed_case(),
        per_type in prop::collection::vec(prop::collection::vec(-1i32..4, 2), 4),
        key in any::<u64>(),
    ) {
        let s = sampler(typed(&per_type), 2).sample(&topo, &seeds, key).unwrap();
        for hop in 1..=2 {
            let counts = check_edges(&topo, &s, hop, |_, _| true);
            let block = &s.blocks[2 - hop];
            for dst in 0..block.num_dst {
                let edges = in_edges(&topo, s.nodes[dst]);
                for (ty, fanouts) in per_type.iter().enumerate() {
                    let have = edges.iter().filter(|e| e.3 == ty as u32).count();
                    let f = fanouts[hop - 1];
                    let want = if f < 0 { have } else { have.min(f as usize) };
                    prop_assert_eq!(counts.get(&(dst, ty as u32)).copied().unwrap_or(0), want);
                }
            }
        }
        // Grouped by type, every edge maps back through its edge type's endpoint types to
        // the same (source, destination, type) as in the homogeneous sample.
        let hetero = HeteroSample::new(&s, &offsets, 4).unwrap();
        let global = |t: usize, i: u32| hetero.nodes[t][i as usize] as u64 + offsets[t];
        let mut nodes: Vec<u64> = (0..2)
            .flat_map(|t| (0..hetero.nodes[t].len() as u32).map(move |i| (t, i)))
            .map(|(t, i)| global(t, i))
            .collect();
        let mut want_nodes: Vec<u64> = s.nodes.iter().map(|&v| v as u64).collect();
        nodes.sort_unstable();
        want_nodes.sort_unstable();
        prop_assert_eq!(nodes, want_nodes);
        for t in 0..2 {
            prop_assert_eq!(hetero.hop_counts[t].iter().sum::<usize>(), hetero.nodes[t].len());
            // Seeds of the type come first, in the seeds' order.
            let seeds_of_t: Vec<u64> = seeds.iter().map(|&v| v as u64)
                .filter(|&v| usize::from(v >= offsets[1]) == t).collect();
            let first: Vec<u64> = (0..hetero.hop_counts[t][0] as u32).map(|i| global(t, i)).collect();
            prop_assert_eq!(first, seeds_of_t);
        }
        let (row, col) = s.edge_index();
        let all_types = Sample::by_hop(&s.edge_types);
        let mut want: Vec<(u64, u64, u32)> = row.iter().zip(&col).zip(&all_types)
            .map(|((&r, &c), &e)| (s.nodes[r as usize] as u64, s.nodes[c as usize] as u64, e))
            .collect();
        let mut got = Vec::new();
        for (e, &(src_t, dst_t)) in EDGE_TYPES.iter().enumerate() {
            prop_assert_eq!(hetero.edges_per_hop[e].iter().sum::<usize>(), hetero.rows[e].len());
            prop_assert_eq!(hetero.edges_per_hop[e][0], s.edge_types[1].iter().filter(|&&x| x == e as u32).count());
            for (&r, &c) in hetero.rows[e].iter().zip(&hetero.cols[e]) {
                got.push((global(src_t, r), global(dst_t, c), e as u32));
            }
        }
        want.sort_unstable();
        got.sort_unstable();
        prop_assert_eq!(got, want);
        prop_assert!(hetero.batch.iter().all(Vec::is_empty));
        prop_assert!(s.edge_ids.iter().all(Vec::is_empty));
        prop_assert!(hetero.edge_ids.iter().all(Vec::is_empty));
    }

    #[test]
    fn edge_ids_name_each_sampled_edge(
        (topo, offsets, seeds) in attributed_case(),
        per_type in prop::collection::vec(prop::collection::vec(-1i32..4, 2), 4),
        key in any::<u64>(),
    ) {
        let config = SamplerConfig { edge_ids: true, ..typed(&per_type) };
        let s = sampler(config, 2).sample(&topo, &seeds, key).unwrap();
        let (row, col) = s.edge_index();
        let ids = Sample::by_hop(&s.edge_ids);
        let types = Sample::by_hop(&s.edge_types);
        prop_assert_eq!(ids.len(), row.len());
        // Each id is an edge into the destination from the source, of the edge's type.
        let edge_of = |id: u64| (id - ID_BASE) as usize;
        for i in 0..ids.len() {
            let (u, v) = (s.nodes[row[i] as usize], s.nodes[col[i] as usize]);
            let p = edge_of(ids[i]);
            let segment = topo.indptr[v as usize] as usize..topo.indptr[v as usize + 1] as usize;
            prop_assert!(segment.contains(&p), "id {} is not an edge into {}", ids[i], v);
            prop_assert_eq!(topo.indices[p], u);
            prop_assert_eq!(topo.columns.types.as_ref().unwrap()[p], types[i]);
        }
        // Within a hop, a destination's edges are distinct (drawn without replacement).
        let mut at = 0;
        for &count in &s.edges_per_hop {
            let mut hop: Vec<(u32, u64)> = (at..at + count).map(|i| (col[i], ids[i])).collect();
            hop.sort_unstable();
            hop.dedup();
            prop_assert_eq!(hop.len(), count);
            at += count;
        }
        // Grouped by type, each edge keeps its id.
        let hetero = HeteroSample::new(&s, &offsets, 4).unwrap();
        for (e, &(src_t, dst_t)) in EDGE_TYPES.iter().enumerate() {
            prop_assert_eq!(hetero.edge_ids[e].len(), hetero.rows[e].len());
            for ((&r, &c), &id) in hetero.rows[e].iter().zip(&hetero.cols[e]).zip(&hetero.edge_ids[e]) {
                let p = edge_of(id);
                let v = hetero.nodes[dst_t][c as usize] as u64 + offsets[dst_t];
                prop_assert!(topo.indptr[v as usize] as usize <= p && p < topo.indptr[v as usize + 1] as usize);
                prop_assert_eq!(topo.indices[p] as u64, hetero.nodes[src_t][r as usize] as u64 + offsets[src_t]);
            }
        }
    }
}
