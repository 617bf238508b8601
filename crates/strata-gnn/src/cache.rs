//! The dynamic feature-row cache with window buffering (GIDS §3.4): rows read from the SSD are
//! kept in a fixed arena and evicted by CLOCK or SIEVE, except that rows which sampled-ahead
//! batches will still read are pinned and never evicted.
//!
//! # Layout and memory
//!
//! `capacity` rows of `row_bytes` bytes each live in one contiguous arena (`capacity *
//! row_bytes` bytes), addressed by slot. Besides the arena:
//!
//! - **4 bytes per graph node**: a node's state word, either "cached in slot `s`" (top bit set)
//!   or its pending pin count (below). A dense array rather than a hash map: a lookup is one
//!   load with no hashing, and pending pins cost nothing extra; the price is 4 bytes for every
//!   node, cached or not (400 MB at 100 M nodes).
//! - **9 bytes per slot** (node id, pin counter, reference bit), plus **8** for SIEVE's queue
//!   links. [`FeatureCache::footprint`] gives the total before allocating.
//!
//! # Eviction
//!
//! Both policies keep one reference ("visited") bit per row, set only by a hit ([`get`]); an
//! insertion leaves it clear, so a row must be read again to earn a second chance.
//!
//! - **CLOCK**: slots form a circle; the hand sweeps it, clearing set bits, and evicts the
//!   first slot whose bit is clear. The new row takes that slot, just behind the hand, so it is
//!   the last to be examined again (FIFO with reinsertion).
//! - **SIEVE** (Zhang et al., NSDI '24): rows sit in a FIFO queue, newest at the head. The hand
//!   moves from the tail towards the head, clearing set bits, and evicts the first row whose
//!   bit is clear; survivors stay where they are, the hand stays just past the victim for the
//!   next eviction (wrapping to the tail after the head), and new rows go in at the head. So
//!   new rows that are not read again are dropped on the hand's next pass, before older rows
//!   that proved popular.
//!
//! # Window buffering (pins)
//!
//! GIDS samples `W` batches ahead and keeps, per cache line, a future-reuse counter: a batch
//! entering the window increments the counters of its nodes, each read during its aggregation
//! decrements them, and a line with a positive counter is never evicted ("USE" vs "safe to
//! evict"). Here:
//!
//! - [`pin_future`] is called with a batch's nodes when it enters the window. A cached node's
//!   slot counter goes up. A node not yet cached gets a **pending** pin, kept in its state word,
//!   so a row inserted later starts with the pins of every window batch that already asked for
//!   it: a row fetched for batch `i` that batch `i + 3` also needs is protected from the moment
//!   it lands, without the caller re-pinning it.
//! - [`unpin`] is called once per earlier pin when the batch uses the node (hit, or read from
//!   the SSD whether or not the row could be inserted). Pending and slot counters are one count
//!   that follows the node in and out of the cache.
//! - The policies pass over pinned rows as if absent (their bits untouched). When every
//!   resident row is pinned, [`insert`] fails and returns `false` at once; the caller keeps the
//!   row it read and the cache simply does not hold it. Insertion never blocks and never evicts
//!   a pinned row. When nearly every row is pinned, a hand would pass most of the arena to find
//!   the few that are not, for every insertion (a merged read of a window's batches admitted
//!   into a cache their pins fill took seconds so); so a search gives up, and the insertion
//!   fails as above, once it has passed [`MAX_PINNED_PASSED`] pinned rows, its hand left
//!   where it stopped for the next search to go on from.
//!
//! Each pin needs its unpin: a node listed twice by [`pin_future`] is pinned twice. An unpin
//! without a pin saturates at zero.
//!
//! Single-threaded by design: a lookup is a few loads, so callers share one cache behind a
//! mutex (or shard by node id) rather than paying for atomics on every bit.
//!
//! [`get`]: FeatureCache::get
//! [`insert`]: FeatureCache::insert
//! [`pin_future`]: FeatureCache::pin_future
//! [`unpin`]: FeatureCache::unpin

use crate::error::{GnnError, Result};

/// Marks a node's state word as "cached"; the low 31 bits are then its slot. Without it the
/// word is the node's pending pin count.
const CACHED: u32 = 1 << 31;

/// No slot / no node (SIEVE links, hand).
const NIL: u32 = u32::MAX;

/// Pinned rows an eviction's search passes before it gives up (the insertion then fails as
/// when every row is pinned). A search passes a row at most twice (its two turns), so caches
/// of up to half this many rows always find an unpinned one when it exists.
pub const MAX_PINNED_PASSED: usize = 512;

/// Largest capacity in rows: a slot index must fit in 31 bits (the top bit of a node's state
/// word marks it cached).
pub const MAX_CAPACITY: usize = CACHED as usize;

/// Which row to evict when the cache is full.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Eviction {
    /// CLOCK (second chance): a hand sweeps the slots in a circle.
    Clock,
    /// SIEVE: FIFO queue, hand from tail to head, retained rows stay in place.
    Sieve,
}

/// Counters since the cache was built (or [`FeatureCache::reset_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// [`FeatureCache::get`] calls that found the row.
    pub hits: u64,
    /// [`FeatureCache::get`] calls that did not.
    pub misses: u64,
    /// Rows added (to a free slot or in place of an evicted one).
    pub insertions: u64,
    /// [`FeatureCache::insert`] calls for a node already cached: its row is overwritten.
    pub updates: u64,
    /// Rows evicted to make room. `insertions - evictions` is the number cached.
    pub evictions: u64,
    /// Insertions refused because no row could be evicted: every resident row pinned (or
    /// capacity 0), or the search passed [`MAX_PINNED_PASSED`] pinned rows.
    pub insert_failures_pinned: u64,
}

impl CacheStats {
    /// Hits over lookups; 0 before any lookup.
    pub fn hit_ratio(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// A fixed-capacity cache of feature rows with CLOCK or SIEVE eviction and window pinning (see
/// the module docs).
#[derive(Debug, Clone)]
pub struct FeatureCache {
    eviction: Eviction,
    row_bytes: usize,
    capacity: usize,
    /// `capacity * row_bytes` bytes; slot `s` is `arena[s * row_bytes..][..row_bytes]`.
    arena: Vec<u8>,
    /// Per graph node: `CACHED | slot`, or its pending pin count.
    state: Vec<u32>,
    /// Per used slot (slots fill in order, so `node_of.len()` is the number cached).
    node_of: Vec<u32>,
    /// Per slot: reference (CLOCK) / visited (SIEVE) bit.
    visited: Vec<bool>,
    /// Per slot: future-reuse counter.
    pins: Vec<u32>,
    /// Slots whose counter is positive; when it equals the number cached nothing can go.
    pinned_slots: usize,
    /// CLOCK: the next slot to examine.
    clock_hand: usize,
    /// SIEVE: per slot, the neighbour towards the head (newer) and the tail (older).
    newer: Vec<u32>,
    older: Vec<u32>,
    /// SIEVE: newest and oldest slot.
    head: u32,
    tail: u32,
    /// SIEVE: the next slot to examine; `NIL` starts from the tail.
    sieve_hand: u32,
    stats: CacheStats,
}

impl FeatureCache {
    /// An empty cache of `capacity` rows of `row_bytes` bytes for a graph of `num_nodes` nodes.
    ///
    /// The arena is allocated zeroed up front (the OS commits its pages as rows land). Capacity
    /// 0 is allowed: every insertion then fails. Errors when the sizes overflow or exceed the
    /// 31-bit slot range.
    pub fn new(
        num_nodes: usize,
        capacity: usize,
        row_bytes: usize,
        eviction: Eviction,
    ) -> Result<FeatureCache> {
        if capacity > MAX_CAPACITY {
            return Err(GnnError::Config(format!(
                "feature cache: {capacity} rows; at most {MAX_CAPACITY} fit 31-bit slots"
            )));
        }
        if num_nodes > u32::MAX as usize + 1 {
            return Err(GnnError::Config(format!(
                "feature cache: {num_nodes} nodes; node ids are 32-bit"
            )));
        }
        let arena_bytes = capacity.checked_mul(row_bytes).ok_or_else(|| {
            GnnError::Budget(format!(
                "feature cache: {capacity} rows of {row_bytes} bytes overflow the address space"
            ))
        })?;
        let sieve = eviction == Eviction::Sieve;
        let links = if sieve { capacity } else { 0 };
        Ok(FeatureCache {
            eviction,
            row_bytes,
            capacity,
            arena: vec![0u8; arena_bytes],
            state: vec![0u32; num_nodes],
            node_of: Vec::with_capacity(capacity),
            visited: Vec::with_capacity(capacity),
            pins: Vec::with_capacity(capacity),
            pinned_slots: 0,
            clock_hand: 0,
            newer: Vec::with_capacity(links),
            older: Vec::with_capacity(links),
            head: NIL,
            tail: NIL,
            sieve_hand: NIL,
            stats: CacheStats::default(),
        })
    }

    /// Bytes a cache built with these arguments holds once full: the arena, 4 per node, 9 per
    /// slot, and 8 more per slot for SIEVE.
    pub fn footprint(
        num_nodes: usize,
        capacity: usize,
        row_bytes: usize,
        eviction: Eviction,
    ) -> u64 {
        let per_slot = match eviction {
            Eviction::Clock => 9,
            Eviction::Sieve => 17,
        };
        capacity as u64 * (row_bytes as u64 + per_slot) + 4 * num_nodes as u64
    }

    /// Bytes held (see [`FeatureCache::footprint`]).
    pub fn bytes(&self) -> u64 {
        Self::footprint(
            self.state.len(),
            self.capacity,
            self.row_bytes,
            self.eviction,
        )
    }

    /// The row of `v` if cached, marking it referenced; counts a hit or a miss. A node out of
    /// range is a miss.
    #[inline]
    pub fn get(&mut self, v: u32) -> Option<&[u8]> {
        match self.slot(v) {
            Some(s) => {
                self.stats.hits += 1;
                self.visited[s] = true;
                Some(&self.arena[s * self.row_bytes..][..self.row_bytes])
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The row of `v` if cached, without touching the reference bit or the counters.
    pub fn peek(&self, v: u32) -> Option<&[u8]> {
        self.slot(v)
            .map(|s| &self.arena[s * self.row_bytes..][..self.row_bytes])
    }

    /// Whether `v`'s row is cached (no side effects).
    #[inline]
    pub fn contains(&self, v: u32) -> bool {
        self.slot(v).is_some()
    }

    /// Caches `row` (exactly `row_bytes` bytes) as `v`'s, evicting an unpinned row if full.
    ///
    /// Returns whether `v` is now cached. `false` only when the cache is full and every row in
    /// it is pinned (or the capacity is 0), or the eviction's search passed
    /// [`MAX_PINNED_PASSED`] pinned rows; nothing changes then except `insert_failures_pinned`
    /// (and, in the second case, the hand and the reference bits the search cleared). A node already cached has its row overwritten in place (its
    /// reference bit and queue position kept). The new row starts unreferenced, with the
    /// node's pending pins.
    ///
    /// Panics if `v` is out of range or `row` has the wrong length.
    pub fn insert(&mut self, v: u32, row: &[u8]) -> bool {
        assert_eq!(
            row.len(),
            self.row_bytes,
            "feature cache: row of {} bytes, expected {}",
            row.len(),
            self.row_bytes
        );
        let word = self.state[v as usize];
        if word & CACHED != 0 {
            let s = (word & !CACHED) as usize;
            self.arena[s * self.row_bytes..][..self.row_bytes].copy_from_slice(row);
            self.stats.updates += 1;
            return true;
        }
        let s = if self.node_of.len() < self.capacity {
            let s = self.node_of.len();
            self.node_of.push(NIL);
            self.visited.push(false);
            self.pins.push(0);
            if self.eviction == Eviction::Sieve {
                self.newer.push(NIL);
                self.older.push(NIL);
            }
            s
        } else {
            match self.evict() {
                Some(s) => s,
                None => {
                    self.stats.insert_failures_pinned += 1;
                    return false;
                }
            }
        };
        // The state word held the pending pins; they become the slot's counter.
        let pending = word;
        self.state[v as usize] = CACHED | s as u32;
        self.node_of[s] = v;
        self.visited[s] = false;
        self.pins[s] = pending;
        if pending > 0 {
            self.pinned_slots += 1;
        }
        if self.eviction == Eviction::Sieve {
            self.push_head(s as u32);
        }
        self.arena[s * self.row_bytes..][..self.row_bytes].copy_from_slice(row);
        self.stats.insertions += 1;
        true
    }

    /// Window buffering: a batch with these nodes entered the window; each listed node (each
    /// time it is listed) is protected from eviction until a matching [`FeatureCache::unpin`],
    /// whether it is cached now or inserted later. Panics on a node out of range.
    pub fn pin_future(&mut self, nodes: &[u32]) {
        for &v in nodes {
            let word = self.state[v as usize];
            if word & CACHED != 0 {
                let s = (word & !CACHED) as usize;
                if self.pins[s] == 0 {
                    self.pinned_slots += 1;
                }
                self.pins[s] = self.pins[s].saturating_add(1);
            } else if word < CACHED - 1 {
                // Pending pins saturate below the CACHED bit.
                self.state[v as usize] = word + 1;
            }
        }
    }

    /// A batch in the window has used `v`: drops one of its pins (cached or pending); at zero
    /// the row may be evicted again. An unpin without a pin does nothing. Panics on a node out
    /// of range.
    #[inline]
    pub fn unpin(&mut self, v: u32) {
        let word = self.state[v as usize];
        if word & CACHED != 0 {
            let s = (word & !CACHED) as usize;
            if self.pins[s] > 0 {
                self.pins[s] -= 1;
                if self.pins[s] == 0 {
                    self.pinned_slots -= 1;
                }
            }
        } else if word > 0 {
            self.state[v as usize] = word - 1;
        }
    }

    /// [`FeatureCache::unpin`] for each listed node.
    pub fn unpin_all(&mut self, nodes: &[u32]) {
        for &v in nodes {
            self.unpin(v);
        }
    }

    /// Pins `v` holds (cached or pending); 0 for a node out of range.
    pub fn pins(&self, v: u32) -> u32 {
        match self.state.get(v as usize) {
            Some(&w) if w & CACHED != 0 => self.pins[(w & !CACHED) as usize],
            Some(&w) => w,
            None => 0,
        }
    }

    /// Cached rows whose node is pinned.
    pub fn pinned_rows(&self) -> usize {
        self.pinned_slots
    }

    /// Rows cached.
    pub fn len(&self) -> usize {
        self.node_of.len()
    }

    /// Whether no row is cached.
    pub fn is_empty(&self) -> bool {
        self.node_of.is_empty()
    }

    /// The node of each used slot, in slot order (not eviction order).
    pub fn nodes(&self) -> &[u32] {
        &self.node_of
    }

    /// Capacity in rows.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The eviction policy.
    pub fn eviction(&self) -> Eviction {
        self.eviction
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Zeroes the counters (contents, bits and pins stay).
    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::default();
    }

    #[inline]
    fn slot(&self, v: u32) -> Option<usize> {
        match self.state.get(v as usize) {
            Some(&w) if w & CACHED != 0 => Some((w & !CACHED) as usize),
            _ => None,
        }
    }

    /// Frees a slot of the full cache by the policy, or `None` when every row is pinned or
    /// the search passed [`MAX_PINNED_PASSED`] pinned rows. The victim's node becomes uncached
    /// with no pins (a pinned row is never chosen).
    fn evict(&mut self) -> Option<usize> {
        // Also covers capacity 0 (nothing cached, nothing to evict).
        if self.pinned_slots >= self.node_of.len() {
            return None;
        }
        // An unpinned row exists, so each sweep ends within two turns: the first clears every
        // unpinned bit it passes.
        let s = match self.eviction {
            Eviction::Clock => self.clock_victim(),
            Eviction::Sieve => self.sieve_victim(),
        }?;
        debug_assert_eq!(self.pins[s], 0);
        self.state[self.node_of[s] as usize] = 0;
        self.node_of[s] = NIL;
        self.stats.evictions += 1;
        Some(s)
    }

    fn clock_victim(&mut self) -> Option<usize> {
        let n = self.node_of.len();
        let mut passed = 0;
        loop {
            let s = self.clock_hand;
            self.clock_hand = if s + 1 == n { 0 } else { s + 1 };
            if self.pins[s] > 0 {
                passed += 1;
                if passed > MAX_PINNED_PASSED {
                    return None;
                }
                continue;
            }
            if self.visited[s] {
                self.visited[s] = false;
                continue;
            }
            return Some(s);
        }
    }

    fn sieve_victim(&mut self) -> Option<usize> {
        let mut o = if self.sieve_hand != NIL {
            self.sieve_hand
        } else {
            self.tail
        };
        let mut passed = 0;
        loop {
            let s = o as usize;
            if self.pins[s] == 0 {
                if !self.visited[s] {
                    break;
                }
                self.visited[s] = false;
            } else {
                passed += 1;
                if passed > MAX_PINNED_PASSED {
                    // The next search goes on from here.
                    self.sieve_hand = o;
                    return None;
                }
            }
            o = match self.newer[s] {
                NIL => self.tail,
                next => next,
            };
        }
        // The hand stays where the victim was: on the next newer row, or back to the tail.
        self.sieve_hand = self.newer[o as usize];
        self.unlink(o);
        Some(o as usize)
    }

    fn push_head(&mut self, s: u32) {
        self.newer[s as usize] = NIL;
        self.older[s as usize] = self.head;
        if self.head != NIL {
            self.newer[self.head as usize] = s;
        } else {
            self.tail = s;
        }
        self.head = s;
    }

    fn unlink(&mut self, s: u32) {
        let (newer, older) = (self.newer[s as usize], self.older[s as usize]);
        if newer != NIL {
            self.older[newer as usize] = older;
        } else {
            self.head = older;
        }
        if older != NIL {
            self.newer[older as usize] = newer;
        } else {
            self.tail = newer;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashMap, VecDeque};

    fn row(v: u32, version: u8) -> [u8; 3] {
        [v as u8, version, 0xa5]
    }

    fn cached(c: &FeatureCache) -> BTreeSet<u32> {
        c.nodes().iter().copied().collect()
    }

    /// Inserts `v` into a full cache and returns the node it evicted.
    fn victim_of(c: &mut FeatureCache, v: u32) -> u32 {
        let before = cached(c);
        assert!(c.insert(v, &row(v, 0)));
        let gone: Vec<u32> = before.difference(&cached(c)).copied().collect();
        assert_eq!(gone.len(), 1, "{before:?} -> {:?}", cached(c));
        gone[0]
    }

    #[test]
    fn clock_evicts_in_the_hand_traced_order() {
        // Capacity 4, nodes 1..=4 fill slots 0..=3, hand at slot 0, no bits set.
        let mut c = FeatureCache::new(16, 4, 3, Eviction::Clock).unwrap();
        for v in 1..=4 {
            assert!(c.insert(v, &row(v, 0)));
        }
        c.get(1);
        c.get(3);
        // Slots [1*, 2, 3*, 4] (* = bit set), hand 0.
        // Insert 5: slot 0 (1*) cleared, slot 1 (2) evicted; 5 takes slot 1, hand 2.
        assert_eq!(victim_of(&mut c, 5), 2);
        // [1, 5, 3*, 4], hand 2. Insert 6: slot 2 (3*) cleared, slot 3 (4) evicted; hand 0.
        assert_eq!(victim_of(&mut c, 6), 4);
        // [1, 5, 3, 6], hand 0. Read 1 again: [1*, 5, 3, 6].
        c.get(1);
        // Insert 7: slot 0 (1*) cleared, slot 1 (5) evicted; hand 2.
        assert_eq!(victim_of(&mut c, 7), 5);
        // [1, 7, 3, 6], hand 2. Insert 8: slot 2 (3, bit cleared while inserting 6) evicted.
        assert_eq!(victim_of(&mut c, 8), 3);
        assert_eq!(cached(&c), BTreeSet::from([1, 6, 7, 8]));
        let s = c.stats();
        assert_eq!((s.insertions, s.evictions, s.hits), (8, 4, 3));
    }

    #[test]
    fn sieve_evicts_in_the_hand_traced_order() {
        // The same requests as the CLOCK trace; the two part at the fourth eviction. Queue
        // written tail (oldest) -> head (newest), * = visited.
        let mut c = FeatureCache::new(16, 4, 3, Eviction::Sieve).unwrap();
        for v in 1..=4 {
            assert!(c.insert(v, &row(v, 0)));
        }
        c.get(1);
        c.get(3);
        // [1*, 2, 3*, 4], hand at the tail. Insert 5: 1* cleared (stays in place), 2 evicted;
        // hand moves to 3; 5 at the head.
        assert_eq!(victim_of(&mut c, 5), 2);
        // [1, 3*, 4, 5], hand at 3. Insert 6: 3* cleared, 4 evicted; hand at 5.
        assert_eq!(victim_of(&mut c, 6), 4);
        c.get(1);
        // [1*, 3, 5, 6], hand at 5. Insert 7: 5 is unvisited and goes; hand at 6.
        assert_eq!(victim_of(&mut c, 7), 5);
        // [1*, 3, 6, 7], hand at 6. Insert 8: 6 goes (CLOCK evicted 3 here: SIEVE drops the
        // new, unread rows first, and keeps 3 where it is); hand at 7.
        assert_eq!(victim_of(&mut c, 8), 6);
        // [1*, 3, 7, 8], hand at 7. Insert 9: 7 goes; hand at 8.
        assert_eq!(victim_of(&mut c, 9), 7);
        // [1*, 3, 8, 9]. Read 9, insert 10: 8 goes; hand at 9.
        c.get(9);
        assert_eq!(victim_of(&mut c, 10), 8);
        // [1*, 3, 9*, 10], hand at 9. Insert 11: 9* cleared, then 10 (the head, unvisited)
        // evicted; nothing is newer, so the hand goes back to the tail.
        assert_eq!(victim_of(&mut c, 11), 10);
        // [1*, 3, 9, 11], hand at the tail. Insert 12: 1* cleared, 3 evicted; hand at 9.
        assert_eq!(victim_of(&mut c, 12), 3);
        assert_eq!(cached(&c), BTreeSet::from([1, 9, 11, 12]));
        // [1, 9, 11, 12], hand at 9. Insert 13: 9 (cleared before) goes.
        assert_eq!(victim_of(&mut c, 13), 9);
    }

    #[test]
    fn pinned_rows_stay_and_full_pinning_refuses() {
        for eviction in [Eviction::Clock, Eviction::Sieve] {
            let mut c = FeatureCache::new(10, 2, 3, eviction).unwrap();
            assert!(c.insert(0, &row(0, 0)));
            assert!(c.insert(1, &row(1, 0)));
            // Node 0 is oldest and unreferenced, the policies' next victim, but pinned.
            c.pin_future(&[0]);
            assert_eq!(c.pins(0), 1);
            assert_eq!(victim_of(&mut c, 2), 1);
            // Node 3 is not cached yet: its pin waits for it.
            c.pin_future(&[2, 3, 3]);
            assert_eq!((c.pins(2), c.pins(3)), (1, 2));
            assert_eq!(c.pinned_rows(), 2);
            // Both rows pinned: 3 cannot get in, nothing is evicted, nothing blocks.
            assert!(!c.insert(3, &row(3, 0)));
            assert!(!c.contains(3));
            assert_eq!(c.pins(3), 2, "pending pins survive a refused insert");
            assert_eq!(c.stats().insert_failures_pinned, 1);
            // Batch reads 0: unpinned, evictable again; 3 goes in with its two pending pins.
            c.unpin(0);
            assert_eq!(victim_of(&mut c, 3), 0);
            assert_eq!(c.pins(3), 2);
            assert_eq!(c.pinned_rows(), 2);
            // Its batch uses 2 and one of 3's two batches uses 3: 2 may go, 3 may not.
            c.unpin_all(&[3, 2]);
            assert_eq!((c.pins(2), c.pins(3)), (0, 1));
            assert_eq!(victim_of(&mut c, 4), 2);
            // 4 is unpinned and unreferenced; 3 stays for its last batch.
            assert_eq!(victim_of(&mut c, 5), 4);
        }
    }

    #[test]
    fn a_search_gives_up_after_passing_its_share_of_pinned_rows() {
        // Four times the bound of rows, every one pinned but the last inserted: each search
        // from the first slot passes MAX_PINNED_PASSED pinned rows and fails, its hand left
        // there, so the searches after it go on and the fourth reaches the unpinned row.
        let n = 4 * MAX_PINNED_PASSED;
        for eviction in [Eviction::Clock, Eviction::Sieve] {
            let mut c = FeatureCache::new(n + 1, n, 3, eviction).unwrap();
            for v in 0..n as u32 {
                assert!(c.insert(v, &row(v, 0)));
            }
            let pinned: Vec<u32> = (0..n as u32 - 1).collect();
            c.pin_future(&pinned);
            let mut tries = 0;
            while !c.insert(n as u32, &row(n as u32, 1)) {
                tries += 1;
                assert!(
                    tries < 8,
                    "{eviction:?}: the searches did not go on from their hands"
                );
            }
            assert_eq!(tries, 3, "{eviction:?}");
            assert_eq!(c.stats().insert_failures_pinned, 3);
            assert!(!c.contains(n as u32 - 1) && c.contains(n as u32));
            assert!(
                pinned.iter().all(|&v| c.contains(v)),
                "no pinned row was evicted"
            );
        }
    }

    #[test]
    fn pending_pins_follow_the_node() {
        let mut c = FeatureCache::new(4, 1, 2, Eviction::Sieve).unwrap();
        c.pin_future(&[1]);
        c.unpin(1);
        c.unpin(1); // without a pin: no effect
        assert_eq!(c.pins(1), 0);
        c.pin_future(&[1]);
        assert!(c.insert(1, &[1, 1]));
        assert_eq!(c.pinned_rows(), 1);
        assert!(!c.insert(2, &[2, 2]));
        c.unpin(1);
        assert!(c.insert(2, &[2, 2]));
        assert!(!c.contains(1));
        assert_eq!(c.pins(1), 0);
        assert_eq!(c.pins(99), 0);
    }

    #[test]
    fn rows_updates_and_sizes() {
        let mut c = FeatureCache::new(5, 3, 4, Eviction::Clock).unwrap();
        assert!(c.is_empty());
        assert_eq!(c.get(2), None);
        assert_eq!(c.get(77), None);
        assert!(c.insert(2, &[1, 2, 3, 4]));
        assert_eq!(c.peek(2), Some(&[1, 2, 3, 4][..]));
        assert!(c.insert(2, &[5, 6, 7, 8]));
        assert_eq!(c.get(2), Some(&[5, 6, 7, 8][..]));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.insertions, s.updates), (1, 2, 1, 1));
        assert_eq!(s.hit_ratio(), 1.0 / 3.0);
        assert_eq!(c.len(), 1);
        assert_eq!((c.capacity(), c.row_bytes()), (3, 4));
        assert_eq!(c.bytes(), 3 * (4 + 9) + 5 * 4);
        assert_eq!(
            FeatureCache::footprint(5, 3, 4, Eviction::Sieve),
            3 * (4 + 17) + 5 * 4
        );
        c.reset_stats();
        assert_eq!(c.stats(), CacheStats::default());
        assert_eq!(CacheStats::default().hit_ratio(), 0.0);

        let mut empty = FeatureCache::new(5, 0, 4, Eviction::Sieve).unwrap();
        assert!(!empty.insert(1, &[0; 4]));
        assert_eq!(empty.stats().insert_failures_pinned, 1);
        let msg = FeatureCache::new(5, MAX_CAPACITY, usize::MAX / 4, Eviction::Clock)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("overflow"), "{msg}");
        assert!(FeatureCache::new(5, MAX_CAPACITY + 1, 0, Eviction::Clock).is_err());
    }

    #[test]
    #[should_panic(expected = "row of 2 bytes, expected 4")]
    fn wrong_row_length_panics() {
        let mut c = FeatureCache::new(5, 3, 4, Eviction::Clock).unwrap();
        c.insert(0, &[0, 0]);
    }

    #[test]
    fn policies_have_config_names() {
        assert_eq!(
            serde_json::to_string(&Eviction::Clock).unwrap(),
            "\"clock\""
        );
        assert_eq!(
            serde_json::from_str::<Eviction>("\"sieve\"").unwrap(),
            Eviction::Sieve
        );
    }

    /// The reference model: a queue in examination order, written naively. CLOCK is FIFO with
    /// reinsertion (a row the hand passes goes to the back); SIEVE keeps rows in place and an
    /// index for the hand. Pins are one map over all nodes.
    struct Model {
        eviction: Eviction,
        capacity: usize,
        /// CLOCK: front = next the hand examines. SIEVE: front = tail (oldest).
        queue: VecDeque<(u32, bool)>,
        sieve_hand: Option<usize>,
        rows: HashMap<u32, [u8; 3]>,
        pins: HashMap<u32, u32>,
        stats: CacheStats,
    }

    impl Model {
        fn new(eviction: Eviction, capacity: usize) -> Model {
            Model {
                eviction,
                capacity,
                queue: VecDeque::new(),
                sieve_hand: None,
                rows: HashMap::new(),
                pins: HashMap::new(),
                stats: CacheStats::default(),
            }
        }

        fn pinned(&self, v: u32) -> bool {
            self.pins.get(&v).copied().unwrap_or(0) > 0
        }

        fn get(&mut self, v: u32) -> Option<[u8; 3]> {
            match self.queue.iter_mut().find(|e| e.0 == v) {
                Some(e) => {
                    e.1 = true;
                    self.stats.hits += 1;
                    Some(self.rows[&v])
                }
                None => {
                    self.stats.misses += 1;
                    None
                }
            }
        }

        fn evict(&mut self) -> bool {
            if self.queue.is_empty() || self.queue.iter().all(|e| self.pinned(e.0)) {
                return false;
            }
            let victim = match self.eviction {
                Eviction::Clock => loop {
                    let (v, bit) = self.queue.pop_front().unwrap();
                    if self.pinned(v) {
                        self.queue.push_back((v, bit));
                    } else if bit {
                        self.queue.push_back((v, false));
                    } else {
                        break v;
                    }
                },
                Eviction::Sieve => {
                    let mut i = self.sieve_hand.unwrap_or(0);
                    loop {
                        let (v, bit) = self.queue[i];
                        if !self.pinned(v) {
                            if !bit {
                                break;
                            }
                            self.queue[i].1 = false;
                        }
                        i = (i + 1) % self.queue.len();
                    }
                    let (v, _) = self.queue.remove(i).unwrap();
                    self.sieve_hand = (i < self.queue.len()).then_some(i);
                    v
                }
            };
            self.rows.remove(&victim);
            self.stats.evictions += 1;
            true
        }

        fn insert(&mut self, v: u32, r: [u8; 3]) -> bool {
            if let Some(old) = self.rows.get_mut(&v) {
                *old = r;
                self.stats.updates += 1;
                return true;
            }
            if self.queue.len() == self.capacity && !self.evict() {
                self.stats.insert_failures_pinned += 1;
                return false;
            }
            self.queue.push_back((v, false));
            self.rows.insert(v, r);
            self.stats.insertions += 1;
            true
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Get(u32),
        Insert(u32),
        Pin(Vec<u32>),
        Unpin(u32),
    }

    const NODES: u32 = 12;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..NODES).prop_map(Op::Get),
            4 => (0..NODES).prop_map(Op::Insert),
            1 => prop::collection::vec(0..NODES, 0..4).prop_map(Op::Pin),
            2 => (0..NODES).prop_map(Op::Unpin),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn cache_matches_the_reference_model(
            sieve in any::<bool>(),
            capacity in 0usize..6,
            ops in prop::collection::vec(op(), 0..120),
        ) {
            let eviction = if sieve { Eviction::Sieve } else { Eviction::Clock };
            let mut c = FeatureCache::new(NODES as usize, capacity, 3, eviction).unwrap();
            let mut m = Model::new(eviction, capacity);
            let mut version = 0u8;
            let (mut gets, mut inserts) = (0u64, 0u64);
            for op in ops {
                let before = cached(&c);
                let pinned_before: Vec<u32> =
                    before.iter().copied().filter(|&v| c.pins(v) > 0).collect();
                match op {
                    Op::Get(v) => {
                        gets += 1;
                        let got = c.get(v).map(|r| <[u8; 3]>::try_from(r).unwrap());
                        prop_assert_eq!(got, m.get(v));
                        if let Some(r) = got {
                            prop_assert_eq!(r[0], v as u8);
                        }
                    }
                    Op::Insert(v) => {
                        inserts += 1;
                        version = version.wrapping_add(1);
                        let r = row(v, version);
                        let ok = c.insert(v, &r);
                        prop_assert_eq!(ok, m.insert(v, r));
                        if ok {
                            // Get after insert returns the same bytes.
                            prop_assert_eq!(c.peek(v), Some(&r[..]));
                        }
                    }
                    Op::Pin(vs) => {
                        c.pin_future(&vs);
                        for v in vs {
                            *m.pins.entry(v).or_insert(0) += 1;
                        }
                    }
                    Op::Unpin(v) => {
                        c.unpin(v);
                        if let Some(p) = m.pins.get_mut(&v) {
                            *p = p.saturating_sub(1);
                        }
                    }
                }
                let now = cached(&c);
                prop_assert!(now.len() <= capacity);
                for v in pinned_before {
                    prop_assert!(now.contains(&v), "pinned node {} was evicted", v);
                }
                let model: BTreeSet<u32> = m.rows.keys().copied().collect();
                prop_assert_eq!(&now, &model);
                for v in 0..NODES {
                    prop_assert_eq!(c.pins(v), m.pins.get(&v).copied().unwrap_or(0));
                    prop_assert_eq!(c.peek(v), m.rows.get(&v).map(|r| &r[..]));
                }
                prop_assert_eq!(
                    c.pinned_rows(),
                    now.iter().filter(|&&v| c.pins(v) > 0).count()
                );
                let s = c.stats();
                prop_assert_eq!(s, m.stats);
                prop_assert_eq!(s.hits + s.misses, gets);
                prop_assert_eq!(s.insertions + s.updates + s.insert_failures_pinned, inserts);
                prop_assert_eq!(s.insertions - s.evictions, c.len() as u64);
            }
        }
    }
}
