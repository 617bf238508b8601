//! The service's working memory: what requests, replies and finished results may hold, as a
//! planned part of `--memory`.
//!
//! Every RPC computes, from the request alone, an upper bound of its reply (ids x row bytes,
//! sampled vertices and edges from seeds x fanouts, targets x output width, ...) before it
//! allocates anything for it. A reply over the message limit is refused with `OUT_OF_RANGE`
//! (the status an oversized message gets); otherwise the bytes it will hold are reserved from
//! the [`Pool`], and a reservation the pool cannot grant is refused with `RESOURCE_EXHAUSTED`.
//! Both messages name the limit and the computed size. So no single request, and no set of
//! concurrent ones, takes the server past its budget.
//!
//! The registered graphs (topology, ids, labels) and models (weights) are a planned part of
//! `--memory` too ([`Resident`]): what a registration adds is taken from the page cache before
//! the graph or model is loaded, and a registration that would leave the page cache less than
//! [`MIN_PAGE_CACHE_BYTES`] is refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use strata_store::units::fmt_bytes;

use crate::error::{Result, ServeError};
use crate::page_cache::PageCache;

/// Least page cache a plan or a registration leaves: 64 pages, one shard.
pub const MIN_PAGE_CACHE_BYTES: u64 = 1 << 20;

/// Bytes of protobuf framing allowed per message and per repeated field on top of the data
/// (tags, lengths, shapes): a generous constant, so bounds stay upper bounds.
const FRAMING: u64 = 64;
/// Most bytes a `uint64` takes on the wire (varint).
const VARINT_U64: u64 = 10;
/// Most bytes a `uint32` takes on the wire (varint).
const VARINT_U32: u64 = 5;

/// A counter of reserved bytes against a capacity; reservations are released when dropped.
#[derive(Debug)]
pub struct Pool {
    capacity: u64,
    used: AtomicU64,
    /// What the capacity is, for messages ("working memory (1/8 of --memory)").
    name: &'static str,
}

/// Bytes held from a [`Pool`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    pool: Arc<Pool>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl Reservation {
    /// Holds `bytes` more for `what`, or refuses as [`Pool::reserve`] does.
    pub fn grow(&mut self, bytes: u64, what: &str) -> Result<()> {
        self.pool.take(bytes, what)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Gives `bytes` (at most what it holds) back to the pool.
    pub fn shrink(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        self.pool.used.fetch_sub(bytes, Ordering::AcqRel);
        self.bytes -= bytes;
    }
}

impl Pool {
    /// A pool of `capacity` bytes; `name` says what it is in refusals.
    pub fn new(capacity: u64, name: &'static str) -> Arc<Pool> {
        Arc::new(Pool {
            capacity,
            used: AtomicU64::new(0),
            name,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Reserves `bytes` for `what`, or refuses with `RESOURCE_EXHAUSTED`: permanently when
    /// `bytes` is over the whole capacity, for now when the pool is busy.
    pub fn reserve(self: &Arc<Self>, bytes: u64, what: &str) -> Result<Reservation> {
        self.take(bytes, what)?;
        Ok(Reservation {
            pool: Arc::clone(self),
            bytes,
        })
    }

    /// Counts `bytes` as used, or refuses as [`Pool::reserve`] does.
    fn take(&self, bytes: u64, what: &str) -> Result<()> {
        if bytes > self.capacity {
            return Err(ServeError::ResourceExhausted(format!(
                "{what} needs {bytes} bytes of memory, more than the {} bytes of the server's {}; ask for less in one call",
                self.capacity, self.name
            )));
        }
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            if used + bytes > self.capacity {
                return Err(ServeError::ResourceExhausted(format!(
                    "{what} needs {bytes} bytes of memory, but {used} of the {} bytes of the server's {} are in use by other calls and results not yet fetched; retry later",
                    self.capacity, self.name
                )));
            }
            match self.used.compare_exchange_weak(
                used,
                used + bytes,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }
}

/// What one load of client-named or client-sent data (a weights file) may allocate, charged
/// before each allocation: at most `limit` bytes in all, each charge also reserved from a
/// [`Pool`] when one is given (given back when the allowance is dropped).
#[derive(Debug)]
pub struct Allowance {
    limit: u64,
    used: u64,
    /// What the limit is, for refusals ("half the working memory").
    name: &'static str,
    /// What is charged, held from the pool when one was given.
    held: Option<Reservation>,
}

impl Allowance {
    /// No limit: for files the operator names (the state directory, the Python API).
    pub fn unbounded() -> Allowance {
        Allowance::new(u64::MAX, "no limit", None)
    }

    /// At most `limit` bytes (`name` says what it is), reserved from `pool` as they are charged.
    pub fn new(limit: u64, name: &'static str, pool: Option<Arc<Pool>>) -> Allowance {
        Allowance {
            limit,
            used: 0,
            name,
            held: pool.map(|pool| Reservation { pool, bytes: 0 }),
        }
    }

    /// Bytes that may still be charged.
    pub fn remaining(&self) -> u64 {
        self.limit - self.used
    }

    /// Charges `bytes` for `what`, or refuses with `RESOURCE_EXHAUSTED` naming the sizes and
    /// the limit (or the pool's refusal, when it is busy).
    pub fn charge(&mut self, bytes: u64, what: &dyn std::fmt::Display) -> Result<()> {
        if bytes > self.remaining() {
            return Err(self.refusal(bytes, what));
        }
        if let Some(held) = &mut self.held {
            held.grow(bytes, &what.to_string())?;
        }
        self.used += bytes;
        Ok(())
    }

    /// The `RESOURCE_EXHAUSTED` refusal of `bytes` more for `what`, naming the sizes and the
    /// limit.
    pub fn refusal(&self, bytes: u64, what: &dyn std::fmt::Display) -> ServeError {
        ServeError::ResourceExhausted(format!(
            "{what} needs {bytes} more bytes of memory, over what loading it may take: {} bytes \
             in all ({}), {} already taken; restart with a larger --memory",
            self.limit, self.name, self.used
        ))
    }

    /// Gives back `bytes` of what was charged (freed, or charged but not needed).
    pub fn release(&mut self, bytes: u64) {
        let bytes = bytes.min(self.used);
        if let Some(held) = &mut self.held {
            held.shrink(bytes);
        }
        self.used -= bytes;
    }
}

/// Refuses a reply of `bytes` (an upper bound) over the message limit `max_message`, before it
/// is built: `OUT_OF_RANGE`, as for an oversized request.
pub fn check_reply(bytes: u64, max_message: u64, what: &str) -> Result<()> {
    if bytes > max_message {
        return Err(ServeError::OutOfRange(format!(
            "{what}: the reply would be up to {bytes} bytes, over the message limit of {max_message} bytes (--max-message, at most half the working memory); ask for less in one call"
        )));
    }
    Ok(())
}

/// Upper bound of an encoded `Tensor` of `rows x cols` elements of `elem_bytes`.
pub fn tensor_bytes(rows: u64, cols: u64, elem_bytes: u64) -> u64 {
    rows.saturating_mul(cols)
        .saturating_mul(elem_bytes)
        .saturating_add(FRAMING)
}

/// Upper bound of a packed repeated `uint64` field of `n` values.
pub fn u64s_bytes(n: u64) -> u64 {
    n.saturating_mul(VARINT_U64).saturating_add(FRAMING)
}

/// What a neighbourhood sample can grow to, from the request alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleBound {
    /// Vertices (seeds included).
    pub nodes: u64,
    /// Sampled edges over all hops.
    pub edges: u64,
    /// Destinations over all hops (each block's indptr has one more entry).
    pub destinations: u64,
    pub hops: u64,
}

impl SampleBound {
    /// `seeds` vertices, before any hop.
    pub fn seeds(seeds: u64) -> SampleBound {
        SampleBound {
            nodes: seeds,
            edges: 0,
            destinations: 0,
            hops: 0,
        }
    }

    /// Adds a hop that samples at most `edges` edges for every vertex known so far, on a
    /// graph of `num_nodes` vertices: `n_{h+1} <= min(n_h + e_h, num_nodes)`.
    pub fn hop(mut self, edges: u64, num_nodes: u64) -> SampleBound {
        self.destinations = self.destinations.saturating_add(self.nodes);
        self.edges = self.edges.saturating_add(edges);
        self.nodes = self
            .nodes
            .saturating_add(edges)
            .min(num_nodes.max(self.nodes));
        self.hops += 1;
        self
    }

    /// Adds hops with `fanouts` (-1: all) on a graph of `num_nodes` vertices and `num_edges`
    /// edges. Each of the `n_h` distinct vertices known keeps at most `fanout` in-edges, and
    /// together never more than all edges: `e_h <= min(n_h * fanout, num_edges)`.
    pub fn hops(self, fanouts: &[i32], num_nodes: u64, num_edges: u64) -> SampleBound {
        fanouts.iter().fold(self, |b, &f| {
            let per = if f < 0 { num_edges } else { f as u64 };
            let e = b.nodes.saturating_mul(per).min(num_edges);
            b.hop(e, num_nodes)
        })
    }

    /// Upper bound of the encoded `SampleNeighborsResponse`: node ids, hop counts, and per
    /// block its indptr (u64) and indices (u32).
    pub fn reply_bytes(&self) -> u64 {
        u64s_bytes(self.nodes)
            .saturating_add(u64s_bytes(self.hops + 1))
            .saturating_add(u64s_bytes(self.destinations.saturating_add(self.hops)))
            .saturating_add(self.edges.saturating_mul(VARINT_U32))
            .saturating_add(self.hops.saturating_mul(FRAMING))
    }

    /// Upper bound of the memory sampling takes besides the reply: the local-id map (about 16
    /// bytes a vertex), the vertex list (4), each block's indptr (8 a destination) and indices
    /// (4 an edge), and the store ids of the reply's vertices (8).
    pub fn working_bytes(&self) -> u64 {
        self.nodes
            .saturating_mul(28)
            .saturating_add(self.destinations.saturating_mul(8))
            .saturating_add(self.edges.saturating_mul(4))
    }
}

/// Bytes a served graph of `num_nodes` vertices and `num_edges` edges holds in memory: its
/// in- and out-neighbour lists (an 8-byte offset per vertex and a 4-byte id per edge, each),
/// the removed flags (1 byte a vertex), the external ids and their inverse (4 + 4), and the
/// labels when it has any (4).
pub fn graph_bytes(num_nodes: u64, num_edges: u64, labels: bool) -> u64 {
    let lists = 2 * ((num_nodes + 1) * 8 + num_edges * 4);
    lists + num_nodes * (1 + 4 + 4 + if labels { 4 } else { 0 })
}

/// [`graph_bytes`] of the store at `path`, from its manifest (before it is registered).
pub fn store_graph_bytes(path: &Path) -> Result<u64> {
    let store = strata_store::Store::open(path)?;
    let m = store.manifest();
    Ok(graph_bytes(
        m.graph.num_nodes,
        m.graph.num_topology_edges,
        m.labels.is_some(),
    ))
}

/// What a registered graph, model or embedding run is, for [`Resident`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Graph,
    Model,
    Embedding,
}

impl Kind {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Graph => "graph",
            Kind::Model => "model",
            Kind::Embedding => "embedding run",
        }
    }
}

/// The registered graphs and models as a part of `--memory` taken from the page cache: the
/// page cache's capacity is what the plan gave it at start minus what was registered since
/// (plus what was unregistered).
pub struct Resident {
    page_cache: Arc<PageCache>,
    held: Mutex<BTreeMap<(Kind, String), u64>>,
}

impl Resident {
    /// Accounts for `held` ((kind, name) -> bytes), already planned, beside `page_cache`.
    pub fn new(page_cache: Arc<PageCache>, held: BTreeMap<(Kind, String), u64>) -> Resident {
        Resident {
            page_cache,
            held: Mutex::new(held),
        }
    }

    /// Takes `bytes` for `name` from the page cache, or refuses with `RESOURCE_EXHAUSTED`
    /// (naming the sizes) when the page cache would keep less than [`MIN_PAGE_CACHE_BYTES`].
    pub fn take(&self, kind: Kind, name: &str, bytes: u64) -> Result<()> {
        let mut held = self.held.lock().unwrap();
        let pages = self.page_cache.capacity_bytes();
        if pages < MIN_PAGE_CACHE_BYTES.saturating_add(bytes) {
            return Err(ServeError::ResourceExhausted(format!(
                "{} '{name}' needs {} in memory, but the page cache has {} of --memory left and keeps at least {}; unregister a graph, model or embedding run, or restart with a larger --memory",
                kind.name(),
                fmt_bytes(bytes),
                fmt_bytes(pages),
                fmt_bytes(MIN_PAGE_CACHE_BYTES)
            )));
        }
        self.page_cache.resize(pages - bytes);
        *held.entry((kind, name.to_string())).or_default() += bytes;
        Ok(())
    }

    /// Changes what `name` holds from `from` to `to` bytes (its exact size once loaded, after
    /// [`Resident::take`] took an estimate), moving the difference to or from the page cache
    /// without refusing.
    pub fn adjust(&self, kind: Kind, name: &str, from: u64, to: u64) {
        let mut held = self.held.lock().unwrap();
        let key = (kind, name.to_string());
        let now = held.get(&key).copied().unwrap_or(0);
        let pages = self.page_cache.capacity_bytes() + from.min(now);
        self.page_cache.resize(pages.saturating_sub(to));
        let after = now.saturating_sub(from) + to;
        if after == 0 {
            held.remove(&key);
        } else {
            held.insert(key, after);
        }
    }

    /// Gives all that `name` holds back to the page cache (it was unregistered).
    pub fn release(&self, kind: Kind, name: &str) {
        let bytes = self
            .held
            .lock()
            .unwrap()
            .get(&(kind, name.to_string()))
            .copied()
            .unwrap_or(0);
        self.adjust(kind, name, bytes, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_take_from_the_page_cache_and_give_back() {
        let cache = Arc::new(PageCache::new(10 << 20));
        let r = Resident::new(Arc::clone(&cache), BTreeMap::new());
        r.take(Kind::Graph, "g", 4 << 20).unwrap();
        assert_eq!(cache.capacity_bytes(), 6 << 20);
        // The exact size once loaded replaces the estimate.
        r.adjust(Kind::Graph, "g", 4 << 20, 3 << 20);
        assert_eq!(cache.capacity_bytes(), 7 << 20);
        r.take(Kind::Model, "m", 1 << 20).unwrap();
        assert_eq!(cache.capacity_bytes(), 6 << 20);
        let refused = r.take(Kind::Graph, "big", 6 << 20).unwrap_err().to_string();
        assert!(
            refused.contains("graph 'big' needs 6.00 MiB")
                && refused.contains("the page cache has 6.00 MiB of --memory left"),
            "{refused}"
        );
        assert_eq!(cache.capacity_bytes(), 6 << 20);
        // A failed registration gives back what it took.
        r.take(Kind::Graph, "h", 2 << 20).unwrap();
        r.adjust(Kind::Graph, "h", 2 << 20, 0);
        assert_eq!(cache.capacity_bytes(), 6 << 20);
        r.release(Kind::Graph, "g");
        r.release(Kind::Model, "m");
        assert_eq!(cache.capacity_bytes(), 10 << 20);
        assert!(r.held.lock().unwrap().is_empty());
    }

    #[test]
    fn graph_bytes_counts_lists_ids_and_labels() {
        // 10 vertices, 30 edges: 2 x (11 x 8 + 30 x 4) + 10 x 9, and 40 more with labels.
        assert_eq!(graph_bytes(10, 30, false), 2 * (88 + 120) + 90);
        assert_eq!(graph_bytes(10, 30, true), 2 * (88 + 120) + 130);
    }

    #[test]
    fn reservations_are_released_and_refusals_name_the_sizes() {
        let pool = Pool::new(1000, "working memory");
        let a = pool.reserve(600, "GetFeatures").unwrap();
        assert_eq!(pool.used(), 600);
        let busy = pool.reserve(500, "GetFeatures").unwrap_err().to_string();
        assert!(
            busy.contains("needs 500 bytes") && busy.contains("600 of the 1000 bytes"),
            "{busy}"
        );
        let never = pool.reserve(1001, "GetFeatures").unwrap_err().to_string();
        assert!(
            never.contains("more than the 1000 bytes of the server's working memory"),
            "{never}"
        );
        drop(a);
        assert_eq!(pool.used(), 0);
        let _all = pool.reserve(1000, "x").unwrap();
        assert_eq!(pool.used(), 1000);
    }

    #[test]
    fn an_allowance_holds_what_it_charges_from_the_pool() {
        let pool = Pool::new(1000, "working memory");
        let other = pool.reserve(500, "GetFeatures").unwrap();
        let mut a = Allowance::new(600, "half the working memory", Some(Arc::clone(&pool)));
        a.charge(400, &"file").unwrap();
        assert_eq!((pool.used(), a.remaining()), (900, 200));
        // Over the allowance: refused naming both sizes, nothing more held.
        let e = a.charge(201, &"tensor w").unwrap_err().to_string();
        assert!(
            e.contains("tensor w needs 201 more bytes")
                && e.contains("600 bytes in all (half the working memory), 400 already taken"),
            "{e}"
        );
        // Within the allowance but over what the pool has free: the pool's refusal.
        let e = a.charge(200, &"tensor v").unwrap_err().to_string();
        assert!(e.contains("retry later"), "{e}");
        a.release(300);
        assert_eq!((pool.used(), a.remaining()), (600, 500));
        drop(other);
        a.charge(500, &"tensor v").unwrap();
        assert_eq!(pool.used(), 600);
        drop(a);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn oversized_replies_are_out_of_range() {
        assert!(check_reply(100, 100, "x").is_ok());
        match check_reply(101, 100, "GetFeatures") {
            Err(ServeError::OutOfRange(m)) => {
                assert!(
                    m.contains("101 bytes") && m.contains("limit of 100 bytes"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sample_bounds_hold_and_saturate() {
        // 10 seeds, fanouts [5, 3], on a big graph: 10 + 50 vertices after hop 1, then
        // 60 * 3 more edges.
        let b = SampleBound::seeds(10).hops(&[5, 3], 1 << 40, 1 << 40);
        assert_eq!(
            (b.edges, b.destinations, b.nodes, b.hops),
            (50 + 180, 10 + 60, 240, 2)
        );
        // A first hop known exactly (here 7 edges), then bounded hops.
        let exact = SampleBound::seeds(10)
            .hop(7, 1 << 40)
            .hops(&[3], 1 << 40, 1 << 40);
        assert_eq!((exact.edges, exact.nodes), (7 + 51, 68));
        // "All neighbours" is bounded by the graph, however many hops.
        let all = SampleBound::seeds(3).hops(&[-1; 4], 100, 500);
        assert_eq!((all.nodes, all.edges), (100, 4 * 500));
        // Absurd requests saturate instead of overflowing.
        let huge = SampleBound::seeds(u64::MAX).hops(&[i32::MAX; 3], u64::MAX, u64::MAX);
        assert_eq!(huge.reply_bytes(), u64::MAX);
    }
}
