//! Strata's far-memory tier (Fargraph+): a memory server process that holds segments for
//! compute processes, and the client that reads them back in chunks.
//!
//! The compute process writes each segment once (preprocessing: [`FarClient::alloc`] +
//! [`FarClient::write`]) and then reads it back many times with asynchronous chunked reads
//! ([`FarClient::submit`]), prefetching along its known streaming order. The server is a plain
//! process holding the bytes in its RAM ([`Server`]); the link is TCP standing in for RDMA, with
//! control messages on one connection and bulk chunks on separate data connections (Fargraph+
//! §6.3). The wire format is documented in [`protocol`].
//!
//! Each side drives its data connections with one of two [`TransportKind`]s, a local choice
//! that does not change the wire: `tcp` (blocking sockets, a sender and a receiver thread per
//! data connection) or `uring` (io_uring: one thread and one ring per data connection on the
//! client, zero-copy sends of segment memory on the server). Either client works with either
//! server.
//!
//! The disk copy stays authoritative: when the server dies or a connection breaks, the client
//! turns dead, every pending and later operation fails with [`FarError::Unavailable`] (within
//! the client's `io_timeout`), and callers fall back to disk.
//!
//! ```ignore
//! // The calls strata-farmem's round-trip tests make (`src/tests.rs`), against a running server:
//! use strata_farmem::{ClientConfig, FarClient, FarRead};
//! let client = FarClient::connect(&ClientConfig { addr: "127.0.0.1:7000".into(), ..Default::default() })?;
//! client.alloc(1, 1 << 20)?;
//! client.write(1, 0, &vec![7u8; 1 << 20])?;
//! let (tx, rx) = crossbeam_channel::unbounded();
//! client.submit(vec![FarRead::new(1, 4096, 65536, 42)], &tx);
//! let done = rx.recv().unwrap();
//! assert_eq!(done.tag, 42);
//! assert_eq!(done.result?, 65536);
//! # Ok::<(), strata_farmem::FarError>(())
//! ```

#![warn(missing_docs)]

mod chunks;
mod client;
pub mod config;
mod error;
pub mod protocol;
mod server;
mod uring;
mod uring_client;
mod uring_server;

#[cfg(test)]
mod tests;

pub use chunks::FarCompletion;
pub use client::{ClientConfig, ClientStats, FarClient, FarRead};
pub use error::{FarError, Result};
pub use server::{Server, ServerConfig, ServerStats, StopHandle, DEFAULT_MAX_CONNECTIONS};
pub use uring_server::ZeroCopyStats;

/// How a client or server moves the bytes of its data connections (the wire is the same).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// Blocking sockets: a sender and a receiver thread per data connection.
    #[default]
    Tcp,
    /// io_uring: on the client one thread and one ring per data connection, receiving each
    /// chunk straight into its destination; on the server zero-copy sends (`SENDMSG_ZC`) of
    /// segment memory. Unavailable io_uring is reported as [`FarError::Unsupported`].
    Uring,
}

impl TransportKind {
    /// The name used in configuration (`tcp` or `uring`).
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Uring => "uring",
        }
    }
}

/// Checks, without connecting, that this process can run a client on `kind`:
/// [`FarError::Unsupported`] says why not (io_uring unavailable: old kernel, seccomp or
/// container policy, the `kernel.io_uring_disabled` sysctl).
pub fn check_transport(kind: TransportKind) -> Result<()> {
    match kind {
        TransportKind::Tcp => Ok(()),
        TransportKind::Uring => uring::ring(8, &uring::CLIENT_OPS).map(drop),
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The far-memory operations a compute engine needs, independent of the link.
///
/// [`FarClient`] implements it over TCP, with either [`TransportKind`]. An RDMA implementation would map `alloc`/`free`
/// onto registering memory regions on the memory node (over a message queue pair), `write` onto
/// one-sided writes, and `submit` onto one-sided reads posted on data queue pairs with the
/// completions harvested from a completion queue. Engines that want to stay link-agnostic hold
/// an `Arc<dyn Transport>`.
pub trait Transport: Send + Sync {
    /// Free bytes on the memory node.
    fn free_capacity(&self) -> Result<u64>;
    /// Allocates segment `segment` of `len` bytes; [`FarError::Capacity`] when it does not fit.
    fn alloc(&self, segment: u64, len: u64) -> Result<()>;
    /// Writes `data` at byte `offset` of `segment`; returns once it is acknowledged.
    fn write(&self, segment: u64, offset: u64, data: &[u8]) -> Result<()>;
    /// Starts reads without blocking; one completion per read arrives on `sink`.
    fn submit(&self, reqs: Vec<FarRead>, sink: &crossbeam_channel::Sender<FarCompletion>);
    /// Frees segment `segment`.
    fn free(&self, segment: u64) -> Result<()>;
    /// False once the far tier is unusable (callers fall back to disk).
    fn is_alive(&self) -> bool;
    /// Bytes per transfer chunk.
    fn chunk_bytes(&self) -> usize;
}

/// Compile-time check that the client can be shared between threads.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FarClient>();
    assert_send_sync::<Server>();
};
