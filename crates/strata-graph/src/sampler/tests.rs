use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn sampler(fanouts: &[i32], threads: usize) -> NeighborSampler {
    let mut s = NeighborSampler::new(SamplerConfig {
        fanouts: fanouts.to_vec(),
        seed: 42,
        threads,
        ..SamplerConfig::default()
    })
    .unwrap();
    // Split even tiny frontiers, so the tests exercise the threaded path.
    s.min_chunk = 1;
    s
}

fn from_lists(lists: &[Vec<u32>]) -> Topology {
    let mut indptr = vec![0u64];
    let mut indices = Vec::new();
    for l in lists {
        indices.extend_from_slice(l);
        indptr.push(indices.len() as u64);
    }
    Topology::new(indptr, indices).unwrap()
}

/// Node 0 points to `1..=degree`; the others have no neighbours.
fn star(degree: u32) -> Topology {
    let mut lists = vec![(1..=degree).collect::<Vec<_>>()];
    lists.resize(degree as usize + 1, Vec::new());
    from_lists(&lists)
}

/// Random graphs without parallel edges, a distinct seed list and fanouts.
fn case() -> impl Strategy<Value = (Topology, Vec<u32>, Vec<i32>)> {
    (1usize..40)
        .prop_flat_map(|n| {
            let lists =
                prop::collection::vec(prop::collection::btree_set(0..n as u32, 0..n.min(12)), n);
            let seeds = Just((0..n as u32).collect::<Vec<_>>()).prop_shuffle();
            (lists, seeds, 1..=n)
        })
        .prop_flat_map(|(lists, seeds, num_seeds)| {
            let lists: Vec<Vec<u32>> = lists.into_iter().map(|s| s.into_iter().collect()).collect();
            let fanouts = prop::collection::vec(prop_oneof![Just(-1), 1i32..6], 1..4);
            (
                Just(from_lists(&lists)),
                Just(seeds[..num_seeds].to_vec()),
                fanouts,
            )
        })
}

/// Every structural promise of `Sample`, checked against the topology.
fn check_sample(topo: &Topology, seeds: &[u32], fanouts: &[i32], s: &Sample) {
    let hops = fanouts.len();
    assert_eq!(&s.nodes[..seeds.len()], seeds);
    assert_eq!(s.hop_counts.len(), hops + 1);
    assert_eq!(s.hop_counts[0], seeds.len());
    assert_eq!(s.hop_counts.iter().sum::<usize>(), s.nodes.len());
    assert_eq!(s.blocks.len(), hops);
    assert_eq!(s.edges_per_hop.len(), hops);
    let distinct: BTreeSet<u32> = s.nodes.iter().copied().collect();
    assert_eq!(distinct.len(), s.nodes.len(), "nodes repeat");

    for hop in 1..=hops {
        let block = &s.blocks[hops - hop];
        let known_before: usize = s.hop_counts[..hop].iter().sum();
        assert_eq!(block.num_dst, known_before);
        assert_eq!(block.num_src, known_before + s.hop_counts[hop]);
        assert_eq!(block.indptr.len(), block.num_dst + 1);
        assert_eq!(*block.indptr.last().unwrap() as usize, block.indices.len());
        assert_eq!(s.edges_per_hop[hop - 1], block.num_edges());
        let mut reached = BTreeSet::new();
        for dst in 0..block.num_dst {
            let v = s.nodes[dst];
            let adjacency: BTreeSet<u32> = topo.neighbors(v).iter().copied().collect();
            let sources = block.sources(dst);
            let chosen: BTreeSet<u32> = sources
                .iter()
                .map(|&j| {
                    assert!((j as usize) < block.num_src, "source id out of range");
                    reached.insert(j);
                    s.nodes[j as usize]
                })
                .collect();
            assert_eq!(chosen.len(), sources.len(), "a neighbour is kept twice");
            assert!(
                chosen.is_subset(&adjacency),
                "a sampled edge is not in the graph"
            );
            let fanout = fanouts[hop - 1];
            let want = if fanout < 0 {
                adjacency.len()
            } else {
                adjacency.len().min(fanout as usize)
            };
            assert_eq!(sources.len(), want, "node {v} at hop {hop}");
            if fanout < 0 {
                assert_eq!(chosen, adjacency);
            }
        }
        // The nodes new at this hop are exactly the sources not seen before.
        let new: BTreeSet<u32> = (known_before as u32..block.num_src as u32).collect();
        let reached_new: BTreeSet<u32> = reached
            .into_iter()
            .filter(|&j| j as usize >= known_before)
            .collect();
        assert_eq!(reached_new, new);
    }
    // Consecutive blocks chain: a layer's outputs are the next layer's inputs.
    for pair in s.blocks.windows(2) {
        assert_eq!(pair[0].num_dst, pair[1].num_src);
    }
    if let Some(last) = s.blocks.last() {
        assert_eq!(last.num_dst, seeds.len());
    }
    assert_eq!(s.blocks[0].num_src, s.nodes.len());

    let (row, col) = s.edge_index();
    assert_eq!(row.len(), s.num_edges());
    assert_eq!(col.len(), s.num_edges());
    let mut at = 0;
    for hop in 1..=hops {
        let block = &s.blocks[hops - hop];
        for dst in 0..block.num_dst {
            for &src in block.sources(dst) {
                assert_eq!((row[at], col[at]), (src, dst as u32));
                at += 1;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn samples_are_well_formed((topo, seeds, fanouts) in case(), key in any::<u64>()) {
        let s = sampler(&fanouts, 3).sample(&topo, &seeds, key).unwrap();
        check_sample(&topo, &seeds, &fanouts, &s);
    }

    #[test]
    fn thread_count_does_not_matter((topo, seeds, fanouts) in case(), key in any::<u64>()) {
        let one = sampler(&fanouts, 1).sample(&topo, &seeds, key).unwrap();
        let three = sampler(&fanouts, 3).sample(&topo, &seeds, key).unwrap();
        prop_assert_eq!(one, three);
    }

    #[test]
    fn link_ids_map_back(
        (topo, nodes, fanouts) in case(),
        picks in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..10),
        negatives in 0usize..4,
        key in any::<u64>(),
    ) {
        let src: Vec<u32> = picks.iter().map(|(a, _)| *a.get(&nodes)).collect();
        let dst: Vec<u32> = picks.iter().map(|(_, b)| *b.get(&nodes)).collect();
        let links = sampler(&fanouts, 2)
            .sample_links(&topo, &src, &dst, negatives, key)
            .unwrap();
        let s = &links.sample;
        let global = |l: &[u32]| l.iter().map(|&i| s.nodes[i as usize]).collect::<Vec<_>>();
        prop_assert_eq!(global(&links.src_local), src.clone());
        prop_assert_eq!(global(&links.dst_local), dst.clone());
        prop_assert_eq!(links.neg_dst_local.len(), src.len() * negatives);
        let mut seeds: Vec<u32> = Vec::new();
        for v in src.iter().chain(&dst).chain(&global(&links.neg_dst_local)) {
            if !seeds.contains(v) {
                seeds.push(*v);
            }
        }
        prop_assert_eq!(s.num_seeds(), seeds.len());
        for &i in links.src_local.iter().chain(&links.dst_local).chain(&links.neg_dst_local) {
            prop_assert!((i as usize) < s.num_seeds());
        }
        check_sample(&topo, &seeds, &fanouts, s);
    }
}

#[test]
fn neighbours_do_not_depend_on_the_rest_of_the_batch() {
    let topo = star(50);
    let alone = sampler(&[5], 1).sample(&topo, &[0], 9).unwrap();
    let shared = sampler(&[5], 1).sample(&topo, &[3, 0], 9).unwrap();
    let globals = |s: &Sample, dst: usize| -> Vec<u32> {
        let b = s.blocks.last().unwrap();
        b.sources(dst)
            .iter()
            .map(|&j| s.nodes[j as usize])
            .collect()
    };
    assert_eq!(globals(&alone, 0), globals(&shared, 1));
}

#[test]
fn batch_keys_and_seeds_change_the_sample() {
    let topo = star(50);
    let s = sampler(&[5], 1);
    let samples: BTreeSet<Vec<u32>> = (0..10)
        .map(|k| s.sample(&topo, &[0], k).unwrap().nodes)
        .collect();
    assert!(
        samples.len() >= 9,
        "only {} distinct samples",
        samples.len()
    );
    let reseeded = NeighborSampler::new(SamplerConfig {
        seed: 43,
        ..s.config().clone()
    })
    .unwrap();
    assert_ne!(
        s.sample(&topo, &[0], 0).unwrap(),
        reseeded.sample(&topo, &[0], 0).unwrap()
    );
    // And a fixed key gives the same sample again.
    assert_eq!(
        s.sample(&topo, &[0], 7).unwrap(),
        s.sample(&topo, &[0], 7).unwrap()
    );
}

#[test]
fn choices_are_uniform() {
    // Degree 10, fanout 2: each neighbour is kept with probability 1/5 and each of the 45
    // pairs with probability 1/45.
    let topo = star(10);
    let s = sampler(&[2], 1);
    let trials = 20_000;
    let mut singles = [0u32; 10];
    let mut pairs = HashMap::new();
    for key in 0..trials {
        let sample = s.sample(&topo, &[0], key).unwrap();
        let kept: Vec<u32> = sample.nodes[1..].to_vec();
        assert_eq!(kept.len(), 2);
        for &v in &kept {
            singles[v as usize - 1] += 1;
        }
        let (a, b) = (kept[0].min(kept[1]), kept[0].max(kept[1]));
        *pairs.entry((a, b)).or_insert(0u32) += 1;
    }
    let chi2 = |counts: &[u32], expected: f64| -> f64 {
        counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum()
    };
    for &c in &singles {
        let freq = c as f64 / trials as f64;
        assert!((freq - 0.2).abs() < 0.015, "frequencies {singles:?}");
    }
    // 9 degrees of freedom: P(chi2 > 40) is about 1e-5.
    let single_chi2 = chi2(&singles, trials as f64 * 2.0 / 10.0);
    assert!(single_chi2 < 40.0, "chi2 {single_chi2}: {singles:?}");
    assert_eq!(pairs.len(), 45);
    // 44 degrees of freedom: P(chi2 > 100) is below 1e-5.
    let pair_counts: Vec<u32> = pairs.values().copied().collect();
    let pair_chi2 = chi2(&pair_counts, trials as f64 / 45.0);
    assert!(pair_chi2 < 100.0, "chi2 {pair_chi2}");
}

#[test]
fn hubs_keep_distinct_neighbours_both_ways() {
    let topo = star(100_000);
    for fanout in [LINEAR_PICKS as i32, LINEAR_PICKS as i32 + 1, 1000] {
        let s = sampler(&[fanout], 1).sample(&topo, &[0], 5).unwrap();
        check_sample(&topo, &[0], &[fanout], &s);
        assert_eq!(s.num_edges(), fanout as usize);
    }
    let full = sampler(&[-1], 1).sample(&topo, &[0], 5).unwrap();
    assert_eq!(full.nodes.len(), 100_001);
}

#[test]
fn large_frontiers_split_the_same_way_at_the_default_chunk_size() {
    // Enough nodes that the default chunking really spreads over threads.
    let n = 5000u32;
    let lists: Vec<Vec<u32>> = (0..n)
        .map(|v| (1..=7).map(|d| (v * 31 + d * 977) % n).collect())
        .collect();
    let topo = from_lists(&lists);
    let seeds: Vec<u32> = (0..n).step_by(3).collect();
    let config = |threads| SamplerConfig {
        fanouts: vec![3, 2],
        seed: 1,
        threads,
        ..SamplerConfig::default()
    };
    let one = NeighborSampler::new(config(1)).unwrap();
    let many = NeighborSampler::new(config(4)).unwrap();
    let all = NeighborSampler::new(config(0)).unwrap();
    let s = one.sample(&topo, &seeds, 11).unwrap();
    assert_eq!(s, many.sample(&topo, &seeds, 11).unwrap());
    assert_eq!(s, all.sample(&topo, &seeds, 11).unwrap());
}

#[test]
fn empty_batches_are_empty() {
    let topo = star(3);
    let s = sampler(&[2, 2], 2).sample(&topo, &[], 0).unwrap();
    assert!(s.nodes.is_empty());
    assert_eq!(s.hop_counts, [0, 0, 0]);
    assert_eq!(s.blocks.len(), 2);
    assert_eq!(s.edge_index(), (vec![], vec![]));
    let links = sampler(&[2], 1)
        .sample_links(&topo, &[], &[], 3, 0)
        .unwrap();
    assert!(links.neg_dst_local.is_empty() && links.sample.nodes.is_empty());
}

#[test]
fn rejects_bad_config_and_inputs() {
    let err = |r: Result<NeighborSampler>| r.unwrap_err().to_string();
    let cfg = |fanouts: Vec<i32>| SamplerConfig {
        fanouts,
        ..SamplerConfig::default()
    };
    assert!(err(NeighborSampler::new(cfg(vec![]))).starts_with("gnn.fanouts:"));
    for bad in [vec![0], vec![5, -2], vec![i32::MIN]] {
        let msg = err(NeighborSampler::new(cfg(bad)));
        assert!(msg.starts_with("gnn.fanouts:"), "{msg}");
    }
    assert!(NeighborSampler::new(cfg(vec![-1, 1, i32::MAX])).is_ok());

    let topo = star(4);
    let s = sampler(&[2], 1);
    let msg = s.sample(&topo, &[1, 2, 1], 0).unwrap_err().to_string();
    assert!(msg.contains("node 1 appears twice"), "{msg}");
    let msg = s.sample(&topo, &[1, 5], 0).unwrap_err().to_string();
    assert!(msg.contains("node 5") && msg.contains("5 nodes"), "{msg}");
    let msg = s
        .sample_links(&topo, &[1, 2], &[3], 1, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("2 edge sources but 1 destinations"), "{msg}");
    let msg = s
        .sample_links(&topo, &[1], &[9], 1, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("destinations include node 9"), "{msg}");
}

#[test]
fn config_reads_from_json() {
    let c: SamplerConfig =
        serde_json::from_str(r#"{"fanouts": [25, 10], "seed": 3, "threads": 2}"#).unwrap();
    assert_eq!(c.fanouts, [25, 10]);
    assert!(serde_json::from_str::<SamplerConfig>(
        r#"{"fanouts": [1], "seed": 0, "threads": 0, "replace": true}"#
    )
    .is_err());
}
