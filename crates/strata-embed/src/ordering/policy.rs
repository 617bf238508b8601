//! What an ordering is: the [`Ordering`] trait the registered orders implement and the buffer
//! [`Capacity`] each is defined for (beside the registry in `mod.rs`, so the orders need
//! nothing of their parent).

/// An ordering: a pure function from the partition count and the buffer capacity to the
/// sequence of buffer states (one partition swapped per step). The buckets of each state, and
/// which of them overlap the swap into it, are assigned by `schedule`, the same for every
/// ordering. Implementations are unit types, registered in `OrderingKind` with their
/// [`strata_store::registry::Named`] name and help.
pub trait Ordering: Sync {
    /// The buffer capacities the ordering is defined for.
    fn capacity(&self) -> Capacity;

    /// Why the capacity is what it is, for the error when it is not.
    fn capacity_hint(&self) -> &'static str;

    /// Whether the capacity is required even when every partition fits the buffer (then any
    /// ordering trains the one state there is).
    fn capacity_always(&self) -> bool {
        false
    }

    /// Candidate orders for `n` partitions and a buffer of `capacity` (already checked, and
    /// `n > capacity`): each a list of buffer states, consecutive states differing in one
    /// partition, that together hold every pair of partitions. `schedule` keeps the
    /// shortest (ties: the one hiding most swaps).
    fn orders(&self, n: usize, capacity: usize) -> Vec<Vec<Vec<u32>>>;
}

/// The buffer capacities an ordering is defined for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    /// Exactly this many slots.
    Exactly(usize),
    /// At least this many slots.
    AtLeast(usize),
}

impl Capacity {
    /// Whether `capacity` slots are allowed.
    pub fn allows(self, capacity: usize) -> bool {
        match self {
            Capacity::Exactly(c) => capacity == c,
            Capacity::AtLeast(c) => capacity >= c,
        }
    }
}

impl std::fmt::Display for Capacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Capacity::Exactly(c) => write!(f, "{c}"),
            Capacity::AtLeast(c) => write!(f, "at least {c}"),
        }
    }
}
