use proptest::prelude::*;

use super::*;

/// Checks what every schedule must satisfy: each bucket trained exactly once, exactly one
/// partition swapped per state, no state over capacity, every bucket trained while both its
/// partitions are resident, and overlap buckets never using the partition being loaded.
fn check(s: &Schedule) {
    let n = s.partitions;
    let mut seen = vec![0u32; n * n];
    for (i, step) in s.steps.iter().enumerate() {
        assert!(
            step.state.len() <= s.capacity,
            "state {i} over capacity: {:?}",
            step.state
        );
        if i > 0 {
            let prev = &s.steps[i - 1].state;
            let out: Vec<_> = prev.iter().filter(|p| !step.state.contains(p)).collect();
            let inn: Vec<_> = step.state.iter().filter(|p| !prev.contains(p)).collect();
            assert_eq!(
                (out.len(), inn.len()),
                (1, 1),
                "step {i}: {prev:?} -> {:?}",
                step.state
            );
            assert_eq!((step.evicted, step.loaded), (Some(*out[0]), Some(*inn[0])));
        }
        for &(a, b) in step.overlap.iter().chain(&step.after_load) {
            assert!(
                step.state.contains(&a) && step.state.contains(&b),
                "bucket ({a},{b}) not resident at {i}"
            );
            seen[a as usize * n + b as usize] += 1;
        }
        for &(a, b) in &step.overlap {
            assert!(Some(a) != step.loaded && Some(b) != step.loaded);
        }
    }
    assert!(
        seen.iter().all(|&c| c == 1),
        "buckets trained other than once: {:?}",
        seen
    );
}

#[test]
fn table_8_of_the_legend_paper() {
    // Paper: Legend 8/16/24/36/50/66 and BETA 8/15/24/34/48/63 buffer states (capacity 3).
    let legend_max = [(6, 8), (8, 16), (10, 24), (12, 36), (14, 50), (16, 66)];
    let beta_max = [(6, 8), (8, 15), (10, 24), (12, 34), (14, 48), (16, 63)];
    for ((n, lmax), (_, bmax)) in legend_max.into_iter().zip(beta_max) {
        let l = schedule(OrderingKind::Legend, n, 3).unwrap();
        let b = schedule(OrderingKind::Beta, n, 3).unwrap();
        check(&l);
        check(&b);
        assert!(
            l.states() <= lmax,
            "legend n={n}: {} states > {lmax}",
            l.states()
        );
        assert!(
            b.states() <= bmax,
            "beta n={n}: {} states > {bmax}",
            b.states()
        );
        // Volume is states x S / n, as in the table.
        assert!((l.volume() - l.states() as f64 / n as f64).abs() < 1e-12);
    }
}

#[test]
fn legend_follows_algorithm_1_and_2_on_the_papers_example() {
    // Column 0 streams every partition past partition 0 (Alg. 1 lines 3-6), and the first
    // buckets are those of partition 1, the first victim (Alg. 2 line 2).
    let s = schedule(OrderingKind::Legend, 6, 3).unwrap();
    let states: Vec<Vec<u32>> = s.steps.iter().map(|x| x.state.clone()).collect();
    assert_eq!(
        &states[..4],
        &[vec![0, 1, 2], vec![0, 2, 3], vec![0, 3, 4], vec![0, 4, 5]]
    );
    let mut first: Vec<Bucket> = s.steps[0].overlap.clone();
    first.sort();
    assert_eq!(first, vec![(0, 1), (1, 0), (1, 1), (1, 2), (2, 1)]);
    // Most swaps have work to hide them (the paper: all but 4 of 36 at 12 partitions).
    let twelve = schedule(OrderingKind::Legend, 12, 3).unwrap();
    assert!(
        twelve.swaps() - twelve.hidden_swaps() <= 4,
        "{} of {} swaps stall",
        twelve.swaps() - twelve.hidden_swaps(),
        twelve.swaps()
    );
}

#[test]
fn sequential_is_one_pair_at_a_time() {
    let s = schedule(OrderingKind::Sequential, 5, 2).unwrap();
    check(&s);
    assert_eq!(s.states(), 10);
    assert_eq!(s.steps[0].state, vec![0, 1]);
}

#[test]
fn bad_capacities_are_explained() {
    assert!(schedule(OrderingKind::Legend, 8, 4)
        .unwrap_err()
        .to_string()
        .contains("use beta"));
    assert!(schedule(OrderingKind::Beta, 8, 1).is_err());
    assert!(schedule(OrderingKind::Sequential, 8, 3).is_err());
    assert!(schedule(OrderingKind::Beta, 0, 3).is_err());
}

#[test]
fn small_cases() {
    for kind in [OrderingKind::Legend, OrderingKind::Beta] {
        for n in 1..=4 {
            check(&schedule(kind, n, 3).unwrap());
        }
    }
    check(&schedule(OrderingKind::Sequential, 1, 2).unwrap());
    check(&schedule(OrderingKind::Sequential, 2, 2).unwrap());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn every_order_is_valid(n in 1usize..=64, c in 2usize..=6) {
        check(&schedule(OrderingKind::Beta, n, c).unwrap());
        check(&schedule(OrderingKind::Sequential, n, 2).unwrap());
    }
}

#[test]
fn legend_is_valid() {
    // Every count up to 24, then a few large ones: Legend's search is the slowest schedule to
    // build, and 40 random counts up to 64 repeated the large ones (a minute unoptimised).
    for n in (1..=24).chain([31, 48, 64]) {
        check(&schedule(OrderingKind::Legend, n, 3).unwrap());
    }
}

#[test]
fn legend_hides_more_swaps_than_beta() {
    // The paper's reason for Algorithm 1: about BETA's number of loads, with work to overlap
    // almost every swap (BETA's order leaves many swaps with nothing to compute).
    for n in [8, 10, 12, 14, 16, 32] {
        let l = schedule(OrderingKind::Legend, n, 3).unwrap();
        let b = schedule(OrderingKind::Beta, n, 3).unwrap();
        assert!(
            l.states() <= b.states() + b.states() / 10,
            "n={n}: {} vs {}",
            l.states(),
            b.states()
        );
        assert!(
            l.hidden_swaps() * 10 >= l.swaps() * 8,
            "n={n}: {} of {}",
            l.hidden_swaps(),
            l.swaps()
        );
        let factor = if n >= 12 { 2 } else { 1 };
        assert!(
            l.hidden_swaps() > factor * b.hidden_swaps(),
            "n={n}: {} vs {}",
            l.hidden_swaps(),
            b.hidden_swaps()
        );
    }
}

proptest! {
    /// A relabelled schedule is still a valid schedule with the same loads and overlap.
    #[test]
    fn relabelled_schedules_stay_valid(n in 4usize..24, seed in 0u64..1000, kind in 0usize..3) {
        let (kind, cap) = [(OrderingKind::Legend, 3), (OrderingKind::Beta, 4), (OrderingKind::Sequential, 2)][kind];
        let s = schedule(kind, n, cap).unwrap();
        let mut perm: Vec<u32> = (0..n as u32).collect();
        let mut rng = strata_store::rng::Rng::new(seed);
        for i in (1..n).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let r = s.relabel(&perm, seed);
        check(&r);
        prop_assert_eq!(r.states(), s.states());
        prop_assert_eq!(r.hidden_swaps(), s.hidden_swaps());
    }
}

/// Every registered ordering: a unique name that parses back, and for each partition count a
/// schedule that trains every bucket exactly once, at each capacity it allows (and a refusal,
/// naming it, at one it does not).
#[test]
fn every_registered_ordering_covers_every_bucket_once() {
    let names = OrderingKind::names();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    for &kind in OrderingKind::ALL {
        assert_eq!(kind.name().parse::<OrderingKind>().unwrap(), kind);
        let (allowed, refused) = match kind.get().capacity() {
            Capacity::Exactly(c) => (vec![c], c + 1),
            Capacity::AtLeast(c) => (vec![c, c + 1, c + 3], c - 1),
        };
        for &capacity in &allowed {
            for n in 1..=11 {
                let s = schedule(kind, n, capacity).unwrap();
                check(&s);
                assert_eq!(s.kind, kind);
            }
        }
        let e = schedule(kind, refused + 4, refused).unwrap_err();
        assert!(e.to_string().contains(kind.name()), "{e}");
    }
}

/// A partition's last eviction is the one after which the schedule does not load it again; a
/// partition that ends the epoch in the buffer has none.
#[test]
fn each_partitions_last_eviction_is_after_its_last_load() {
    for kind in [OrderingKind::Legend, OrderingKind::Beta] {
        let s = schedule(kind, 8, 3).unwrap();
        let last = s.last_evictions();
        let end = &s.steps.last().unwrap().state;
        for p in 0..8u32 {
            let loads: Vec<usize> = (1..s.steps.len())
                .filter(|&i| s.steps[i].loaded == Some(p))
                .collect();
            match last[p as usize] {
                Some(i) => {
                    assert_eq!(s.steps[i].evicted, Some(p), "{kind:?}");
                    assert!(
                        loads.iter().all(|&l| l < i) && !end.contains(&p),
                        "{kind:?} {p}"
                    );
                }
                None => assert!(end.contains(&p), "{kind:?}: {p} never written back"),
            }
        }
    }
}
