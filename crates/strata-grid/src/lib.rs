//! Strata's out-of-core graph analytics: GridGraph's 2-level grid streamed through the I/O
//! engine, extended with Fargraph+'s far-memory tier.
//!
//! - [`layout`], [`build`], [`grid`]: the grid format, its builder and reader;
//!   [`edge_file`]: how a build writes each block; [`block_codec`]: the codes of compressed
//!   blocks.
//! - [`config`], [`budget`], [`run`]: a run's options, its plan within the memory budget, and
//!   the run itself.
//! - [`stream`], [`fetch`]: the streaming engine and how segments are fetched from each tier.
//! - [`algo`]: the algorithms.
//! - [`vertex`]: vertex data shared by compute threads.
//! - [`dist`]: runs over several ranks (torchrun), each streaming its own columns;
//!   [`checkpoint`]: their iteration checkpoints, from which a restarted group resumes.

pub mod algo;
pub mod block_codec;
pub mod budget;
pub mod build;
pub mod check;
pub mod checkpoint;
pub mod config;
pub mod dist;
pub mod edge_file;
pub mod error;
pub mod far;
pub mod fetch;
#[cfg(test)]
mod fixtures;
pub mod grid;
pub mod layout;
pub mod place;
pub mod run;
pub mod stream;
pub mod vertex;

pub use error::{GridError, Result};
pub use grid::Grid;
