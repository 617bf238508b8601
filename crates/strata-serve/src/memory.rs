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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Result, ServeError};

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
                Ok(_) => {
                    return Ok(Reservation {
                        pool: Arc::clone(self),
                        bytes,
                    })
                }
                Err(now) => used = now,
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
