//! Finishing an order exactly: once few partitions have uncovered buckets, the shortest
//! sequence of single swaps that covers them is found by breadth-first search.

use std::collections::{HashSet, VecDeque};

use super::coverage::Coverage;

/// Search effort beyond which the exact finish gives up (the heuristic finishes instead).
const MAX_NODES: usize = 200_000;

/// The shortest continuation of `last` (one partition swapped per step) after which every
/// bucket is covered, or `None` when the search would be too large. Partitions are limited to
/// those still unfinished plus those in `last`, which is where an optimal finish swaps.
pub(crate) fn exact_finish(cov: &Coverage, last: &[u32]) -> Option<Vec<Vec<u32>>> {
    let unfinished = cov.unfinished();
    if unfinished.is_empty() {
        return Some(Vec::new());
    }
    let mut universe: Vec<u32> = unfinished.iter().chain(last).copied().collect();
    universe.sort_unstable();
    universe.dedup();
    if universe.len() > 16 {
        return None;
    }
    // Uncovered unordered pairs among the universe, as bits (a bucket pair (a, b) and (b, a)
    // are covered together, as is (a, a) by any state holding a).
    let mut pairs = Vec::new();
    for (i, &a) in universe.iter().enumerate() {
        for &b in &universe[i..] {
            if !cov.is_covered(a, b) || !cov.is_covered(b, a) {
                pairs.push((a, b));
            }
        }
    }
    if pairs.len() > 64 {
        return None;
    }
    let bit = |x: u32| 1u64 << universe.iter().position(|&u| u == x).unwrap();
    let covers = |buf: u64| -> u64 {
        pairs
            .iter()
            .enumerate()
            .filter(|(_, &(a, b))| buf & bit(a) != 0 && buf & bit(b) != 0)
            .fold(0u64, |m, (i, _)| m | 1 << i)
    };
    let all: u64 = if pairs.len() == 64 {
        u64::MAX
    } else {
        (1u64 << pairs.len()) - 1
    };
    let start: u64 = last.iter().fold(0, |m, &x| m | bit(x));
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut queue: VecDeque<(u64, u64, Vec<u64>)> = VecDeque::new();
    queue.push_back((start, covers(start), Vec::new()));
    seen.insert((start, covers(start)));
    while let Some((buf, done, path)) = queue.pop_front() {
        for out in 0..universe.len() {
            if buf & (1 << out) == 0 {
                continue;
            }
            for inn in 0..universe.len() {
                if buf & (1 << inn) != 0 {
                    continue;
                }
                let next = buf & !(1 << out) | (1 << inn);
                let now = done | covers(next);
                let mut p = path.clone();
                p.push(next);
                if now == all {
                    return Some(
                        p.iter()
                            .map(|&m| {
                                (0..universe.len())
                                    .filter(|&i| m & (1 << i) != 0)
                                    .map(|i| universe[i])
                                    .collect()
                            })
                            .collect(),
                    );
                }
                if seen.insert((next, now)) {
                    if seen.len() > MAX_NODES {
                        return None;
                    }
                    queue.push_back((next, now, p));
                }
            }
        }
    }
    None
}
