//! Errors of the far-memory tier.

/// Result type of the far-memory tier.
pub type Result<T> = std::result::Result<T, FarError>;

/// What went wrong talking to (or inside) the far-memory server.
///
/// Callers that keep an authoritative disk copy treat [`FarError::Unavailable`] as "fall back to
/// disk from now on"; the other variants are bugs or planning mistakes of the caller.
#[derive(Debug, thiserror::Error)]
pub enum FarError {
    /// The server is dead, unreachable, timed out, or the client was closed: the client will not
    /// serve any further request.
    #[error("far memory unavailable: {0}")]
    Unavailable(String),
    /// The server cannot hold `asked` more bytes: only `free` bytes are left.
    #[error("far memory full: asked for {asked} bytes, {free} bytes free")]
    Capacity {
        /// Bytes the refused allocation asked for.
        asked: u64,
        /// Bytes still free on the server when it refused.
        free: u64,
    },
    /// The peer broke the wire protocol (bad magic, version, message size, unexpected reply).
    #[error("far memory protocol error: {0}")]
    Protocol(String),
    /// The server refused this client's shared secret (none given, or a wrong one).
    #[error("far memory refused this client: {0}")]
    Unauthenticated(String),
    /// A server setting refused before anything is served; the message names the setting.
    #[error("{0}")]
    Config(String),
    /// A request the server (or client) refuses: unknown segment, access outside a segment, bad
    /// arguments. The connection stays usable.
    #[error("bad far memory request: {0}")]
    BadRequest(String),
    /// This process cannot use the asked-for transport (io_uring unavailable: old kernel,
    /// seccomp or container policy, the `kernel.io_uring_disabled` sysctl); the message says why.
    #[error("far memory transport not supported here: {0}")]
    Unsupported(String),
    /// A local I/O failure (binding, accepting) with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl FarError {
    /// Wraps an OS error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        FarError::Io {
            context: context.into(),
            source,
        }
    }

    /// True for [`FarError::Unavailable`]: the far tier is gone and the caller should fall back.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, FarError::Unavailable(_))
    }
}
