//! Orderings of partition-based training, as pure functions (the policy): given `n`
//! partitions and a buffer of capacity `c`, the sequence of buffer states (one partition
//! swapped per step) and the edge buckets to train in each. The partition buffer (the
//! mechanism) executes a [`Schedule`] and never decides order itself.
//!
//! Buckets are assigned as late as possible: bucket `(a, b)` trains in the last state of the
//! first stretch in which `a` and `b` are both resident, i.e. just before one of them is
//! evicted. Within a state, the buckets that do not need the partition loaded by the swap into
//! that state can train while that swap is in flight (`overlap`); the rest wait for the load
//! (`after_load`). For Legend's order this is exactly its Algorithm 2 (the buckets of the next
//! victim, first without and then with the newly loaded partition); for the others it gives the
//! same prefetch structure wherever their order allows it.

mod beta;
mod coverage;
mod legend;
mod policy;
mod sequential;
mod tail;

use serde::Serialize;

pub use policy::{Capacity, Ordering};

strata_store::registry! {
    /// Which order (registered by name; see [`Ordering`]).
    pub enum OrderingKind: dyn Ordering, "ordering", "partition order" {
        legend::Legend,
        beta::Beta,
        sequential::Sequential,
    }
}

impl OrderingKind {
    /// Checks a buffer of `buffer` partitions for this ordering (`partitioned`: more
    /// partitions than slots); the message is for `embed.train.buffer`.
    pub fn check_buffer(self, buffer: usize, partitioned: bool) -> Result<(), String> {
        let ordering = self.get();
        let capacity = ordering.capacity();
        if (partitioned || ordering.capacity_always()) && !capacity.allows(buffer) {
            return Err(format!(
                "ordering {self} needs a buffer of {capacity}, got {buffer}"
            ));
        }
        Ok(())
    }
}

/// An edge bucket: edges from partition `.0` to partition `.1`.
pub type Bucket = (u32, u32);

/// One buffer state and the work done in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Partitions resident, sorted.
    pub state: Vec<u32>,
    /// Partition written back by the swap into this state (`None` for the first state).
    pub evicted: Option<u32>,
    /// Partition read by the swap into this state.
    pub loaded: Option<u32>,
    /// Buckets that can train while the swap into this state is in flight.
    pub overlap: Vec<Bucket>,
    /// Buckets that need the partition just loaded.
    pub after_load: Vec<Bucket>,
}

/// A whole epoch's order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    pub kind: OrderingKind,
    pub partitions: usize,
    pub capacity: usize,
    pub steps: Vec<Step>,
}

/// Why a schedule cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderingError {
    #[error("at least 1 partition is needed")]
    NoPartitions,
    #[error("ordering {kind} needs a buffer capacity of {need}, got {got} ({hint})")]
    Capacity {
        kind: OrderingKind,
        need: Capacity,
        got: usize,
        hint: &'static str,
    },
}

/// The schedule of `kind` for `n` partitions and a buffer of `capacity`.
pub fn schedule(kind: OrderingKind, n: usize, capacity: usize) -> Result<Schedule, OrderingError> {
    if n == 0 {
        return Err(OrderingError::NoPartitions);
    }
    if n <= capacity {
        // Everything is resident at once: one state, whatever the order.
        return Ok(from_states(
            kind,
            n,
            capacity,
            vec![(0..n as u32).collect()],
        ));
    }
    let ordering = kind.get();
    if !ordering.capacity().allows(capacity) {
        return Err(OrderingError::Capacity {
            kind,
            need: ordering.capacity(),
            got: capacity,
            hint: ordering.capacity_hint(),
        });
    }
    Ok(ordering
        .orders(n, capacity)
        .into_iter()
        .map(|states| from_states(kind, n, capacity, states))
        .min_by_key(|s| (s.steps.len(), s.steps.len() - s.hidden_swaps()))
        .expect("an ordering gives at least one order"))
}

/// Assigns every bucket to a state (as late as possible) and splits each state's buckets into
/// those that can overlap the swap into it and those that need its new partition.
fn from_states(kind: OrderingKind, n: usize, capacity: usize, states: Vec<Vec<u32>>) -> Schedule {
    let mut trained = vec![false; n * n];
    let mut steps: Vec<Step> = Vec::with_capacity(states.len());
    for (i, state) in states.iter().enumerate() {
        let (evicted, loaded) = match i {
            0 => (None, None),
            _ => {
                let prev = &states[i - 1];
                (
                    prev.iter().copied().find(|p| !state.contains(p)),
                    state.iter().copied().find(|p| !prev.contains(p)),
                )
            }
        };
        let next = states.get(i + 1);
        let leaving = next.and_then(|nx| state.iter().copied().find(|p| !nx.contains(p)));
        let mut step = Step {
            state: state.clone(),
            evicted,
            loaded,
            overlap: Vec::new(),
            after_load: Vec::new(),
        };
        for &a in state {
            for &b in state {
                let idx = a as usize * n + b as usize;
                // Last chance while both are resident: the next swap evicts one of them, or
                // this is the final state.
                let last_chance = match leaving {
                    None => true,
                    Some(l) => a == l || b == l,
                };
                if trained[idx] || !last_chance {
                    continue;
                }
                trained[idx] = true;
                if Some(a) == loaded || Some(b) == loaded {
                    step.after_load.push((a, b));
                } else {
                    step.overlap.push((a, b));
                }
            }
        }
        steps.push(step);
    }
    Schedule {
        kind,
        partitions: n,
        capacity,
        steps,
    }
}

impl Schedule {
    /// Buffer states in the epoch: the paper's "I/O times" (Legend, Table 8).
    pub fn states(&self) -> usize {
        self.steps.len()
    }

    /// Partition swaps (each writes one partition back and reads one).
    pub fn swaps(&self) -> usize {
        self.steps.len() - 1
    }

    /// Partition reads in the epoch: the initial fill plus one per swap.
    pub fn partition_loads(&self) -> usize {
        self.steps.first().map_or(0, |s| s.state.len()) + self.swaps()
    }

    /// By partition id, the step of the eviction after which the epoch does not load that
    /// partition again: its last one (`None`: it ends the epoch in the buffer, evicted before
    /// or not).
    pub fn last_evictions(&self) -> Vec<Option<usize>> {
        let mut last = vec![None; self.partitions];
        for (i, step) in self.steps.iter().enumerate() {
            if let Some(e) = step.evicted {
                last[e as usize] = Some(i);
            }
        }
        for &p in self.steps.last().map_or(&[][..], |s| &s.state) {
            last[p as usize] = None;
        }
        last
    }

    /// Swaps with training work to overlap them (the rest stall on I/O).
    pub fn hidden_swaps(&self) -> usize {
        self.steps
            .iter()
            .skip(1)
            .filter(|s| !s.overlap.is_empty())
            .count()
    }

    /// Data moved per epoch in units of the whole table (embeddings plus optimizer state),
    /// the paper's communication volume: states x S / n.
    pub fn volume(&self) -> f64 {
        self.states() as f64 / self.partitions as f64
    }

    /// The same schedule with partition `p` renamed `perm[p]` and the buckets of each group
    /// (overlap, after-load) shuffled by `seed`: as many loads and the same overlap, a
    /// different order of training. Run each epoch with a fresh one so that successive epochs
    /// do not visit the partition pairs in the same order.
    pub fn relabel(&self, perm: &[u32], seed: u64) -> Schedule {
        assert_eq!(perm.len(), self.partitions, "one new name per partition");
        let mut rng = strata_store::rng::Rng::new(seed);
        let mut shuffled = |buckets: &[Bucket]| {
            let mut v: Vec<Bucket> = buckets
                .iter()
                .map(|&(a, b)| (perm[a as usize], perm[b as usize]))
                .collect();
            for i in (1..v.len()).rev() {
                v.swap(i, rng.below(i as u64 + 1) as usize);
            }
            v
        };
        let steps = self
            .steps
            .iter()
            .map(|s| {
                let mut state: Vec<u32> = s.state.iter().map(|&p| perm[p as usize]).collect();
                state.sort_unstable();
                Step {
                    state,
                    evicted: s.evicted.map(|p| perm[p as usize]),
                    loaded: s.loaded.map(|p| perm[p as usize]),
                    overlap: shuffled(&s.overlap),
                    after_load: shuffled(&s.after_load),
                }
            })
            .collect();
        Schedule {
            steps,
            ..self.clone()
        }
    }

    /// Every bucket in training order.
    pub fn buckets(&self) -> impl Iterator<Item = Bucket> + '_ {
        self.steps
            .iter()
            .flat_map(|s| s.overlap.iter().chain(&s.after_load).copied())
    }
}

#[cfg(test)]
mod tests;
