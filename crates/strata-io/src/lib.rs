//! Strata's direct-I/O layer.
//!
//! Every engine reads and writes its data files through this crate so that the page cache never
//! holds the data set behind the engine's back: files are opened with `O_DIRECT` where the file
//! system allows it (and fall back to buffered I/O where it does not, e.g. tmpfs), buffers are
//! aligned to [`ALIGN`] bytes, and unaligned requests are served by reading the covering aligned
//! range.

mod aligned;
pub mod bench;
pub mod durable;
mod engine;
mod error;
mod file;
pub mod profile;
pub mod progress;
mod seq;
pub mod space;
mod stats;
pub mod testing;
pub mod units;

pub use aligned::{align_down, align_up, AlignedBuf, ALIGN};
pub use engine::{
    explain_uring_setup_error, BackendKind, Completion, Engine, EngineConfig, FixedBuf, FixedPool,
    IoBuf, IoFile, IoQueue, Op, Request,
};
pub use error::{IoError, Result};
pub use file::{DirectFile, OpenMode};
pub use seq::{SeqReader, SeqWriter};
pub use stats::{IoStats, StatsSnapshot, StatsSummary};

/// Worker threads for a `threads` option: the number asked for, or one per core for 0.
pub fn resolve_threads(requested: usize) -> usize {
    match requested {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        t => t,
    }
}
