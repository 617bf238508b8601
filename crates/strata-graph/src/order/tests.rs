use proptest::prelude::*;
use strata_store::rng::{derive, Rng};

use std::cmp::Reverse;

use super::*;
use crate::Topology;

/// A symmetric adjacency of the undirected `pairs` over `n` nodes, each list sorted.
fn undirected_of(n: usize, pairs: &[(u32, u32)]) -> Topology {
    let mut lists = vec![Vec::new(); n];
    for &(u, v) in pairs {
        lists[u as usize].push(v);
        lists[v as usize].push(u);
    }
    lists.iter_mut().for_each(|l| l.sort_unstable());
    let mut indptr = vec![0u64];
    let mut indices = Vec::new();
    for l in &lists {
        indices.extend_from_slice(l);
        indptr.push(indices.len() as u64);
    }
    Topology::new(indptr, indices).unwrap()
}

/// `0..n` shuffled by `seed`.
fn shuffled(n: u32, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(derive(seed, 7));
    let mut ids: Vec<u32> = (0..n).collect();
    for i in (1..n as usize).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    ids
}

#[test]
fn the_degree_order_is_by_decreasing_degree_then_id() {
    let adj = Topology::new(vec![0, 1, 4, 5, 7, 7], vec![1, 0, 3, 3, 1, 1, 2]).unwrap();
    assert_eq!(
        OrderKind::Degree.get().order(&adj).unwrap(),
        [1, 3, 0, 2, 4]
    );
}

#[test]
fn traversals_lay_a_shuffled_path_out_in_a_line() {
    let n = 200;
    let ids = shuffled(n, 1);
    let pairs: Vec<(u32, u32)> = ids.windows(2).map(|w| (w[0], w[1])).collect();
    let adj = undirected_of(n as usize, &pairs);
    for (kind, widest) in [(OrderKind::BreadthFirst, 2), (OrderKind::CuthillMcKee, 1)] {
        let new = inverse(&kind.get().order(&adj).unwrap());
        let span = pairs
            .iter()
            .map(|&(u, v)| new[u as usize].abs_diff(new[v as usize]))
            .max();
        assert_eq!(span, Some(widest), "{kind}");
    }
}

#[test]
fn breadth_first_takes_components_by_their_highest_degree() {
    // A star 0-{1,2,3} and a path 4-5: the star's centre first, then its leaves, then the
    // path from its lower id (both degree 1).
    let adj = undirected_of(6, &[(0, 1), (0, 2), (0, 3), (4, 5)]);
    assert_eq!(
        OrderKind::BreadthFirst.get().order(&adj).unwrap(),
        [0, 1, 2, 3, 4, 5]
    );
    // Cuthill-McKee starts at the lowest degree (leaf 1), takes new neighbours by degree, and
    // is reversed.
    assert_eq!(
        OrderKind::CuthillMcKee.get().order(&adj).unwrap(),
        [5, 4, 3, 2, 0, 1]
    );
}

#[test]
fn the_community_order_lays_each_planted_clique_out_contiguously() {
    // Three cliques of different sizes with shuffled ids, joined by single edges.
    let sizes = [40usize, 25, 10];
    let ids = shuffled(75, 5);
    let mut cliques = Vec::new();
    let mut at = 0;
    for s in sizes {
        cliques.push(ids[at..at + s].to_vec());
        at += s;
    }
    let mut pairs = Vec::new();
    for c in &cliques {
        for (i, &u) in c.iter().enumerate() {
            pairs.extend(c[i + 1..].iter().map(|&v| (u, v)));
        }
    }
    pairs.push((cliques[0][0], cliques[1][0]));
    pairs.push((cliques[1][1], cliques[2][0]));
    let adj = undirected_of(75, &pairs);
    let label = communities(&adj, COMMUNITY_ROUNDS);
    for c in &cliques {
        assert!(c.iter().all(|&v| label[v as usize] == label[c[0] as usize]));
    }
    let mut distinct = label.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 3);
    let order = OrderKind::Community.get().order(&adj).unwrap();
    let new = inverse(&order);
    let mut start = 0;
    for c in &cliques {
        let mut placed: Vec<u32> = c.iter().map(|&v| new[v as usize]).collect();
        placed.sort_unstable();
        assert_eq!(placed, (start..start + c.len() as u32).collect::<Vec<_>>());
        start += c.len() as u32;
    }
    let degrees: Vec<u64> = order[..sizes[0]].iter().map(|&v| adj.degree(v)).collect();
    assert!(degrees.windows(2).all(|w| w[0] >= w[1]), "{degrees:?}");
}

#[test]
fn a_vote_goes_to_the_most_frequent_label_then_the_largest_key() {
    assert_eq!(most_frequent(&mut [5, 2, 5, 2, 9], |l| l), Some(5));
    assert_eq!(most_frequent(&mut [5, 2, 5, 2, 9], Reverse), Some(2));
    assert_eq!(most_frequent(&mut [4, 1, 1], |l| l), Some(1));
    assert_eq!(most_frequent(&mut [], |l| l), None);
}

#[test]
fn searches_continue_or_forget_their_visits() {
    // A path 0-1-2-3-4.
    let adj = undirected_of(5, &[(0, 1), (1, 2), (2, 3), (3, 4)]);
    let mut bfs = Bfs::new(5);
    assert_eq!(bfs.run(&adj, 2, 1), [2, 1, 3]);
    assert_eq!(bfs.run(&adj, 0, 2), [0, 1, 2]);
    bfs.search(&adj, 4, u32::MAX, Expand::AsListed);
    assert_eq!(bfs.order(), [0, 1, 2, 4, 3]);
    bfs.search(&adj, 3, 1, Expand::AsListed);
    assert_eq!(
        bfs.order(),
        [0, 1, 2, 4, 3],
        "visited nodes are not searched again"
    );
}

#[test]
fn mean_span_measures_id_distances_over_entries() {
    let adj = undirected_of(3, &[(0, 2), (1, 2)]);
    assert_eq!(mean_span(&adj, None), 1.5);
    assert_eq!(mean_span(&adj, Some(&[0, 2, 1])), 1.0);
    assert_eq!(mean_span(&undirected_of(2, &[]), None), 0.0);
}

fn arb_graph() -> impl Strategy<Value = Topology> {
    (1usize..80).prop_flat_map(|n| {
        prop::collection::vec((0..n as u32, 0..n as u32), 0..200)
            .prop_map(move |pairs| undirected_of(n, &pairs))
    })
}

proptest! {
    #[test]
    fn every_order_is_a_deterministic_permutation(adj in arb_graph()) {
        for &kind in OrderKind::ALL {
            let order = kind.get().order(&adj).unwrap();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..adj.num_nodes() as u32).collect::<Vec<_>>(), "{}", kind);
            prop_assert_eq!(&kind.get().order(&adj).unwrap(), &order, "{}", kind);
        }
    }
}
