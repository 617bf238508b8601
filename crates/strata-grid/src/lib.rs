//! Strata's out-of-core graph analytics: GridGraph's 2-level grid streamed through the I/O
//! engine, extended with Fargraph+'s far-memory tier.
//!
//! - [`layout`], [`build`], [`grid`]: the grid format, its builder and reader; the build's
//!   passes ([`spool`], [`blocks`]) and plan ([`build_budget`]), and builds straight from an
//!   input edge list ([`input`]); [`block_codec`]: the codes of compressed blocks.
//! - [`config`], [`budget`], [`run`]: a run's options, its plan within the memory budget, and
//!   the run itself.
//! - [`stream`], [`fetch`]: the streaming engine and how segments are fetched from each tier.
//! - [`algo`]: the algorithms; [`program`]: vertex programs of the user's own, written as
//!   expressions and compiled to vector code.
//! - [`vertex`]: vertex data shared by compute threads.
//! - [`dist`]: runs over several ranks (torchrun), each streaming its own columns;
//!   [`checkpoint`]: their iteration checkpoints, from which a restarted group resumes.

pub mod algo;
pub mod block_codec;
mod blocks;
pub mod budget;
pub mod build;
mod build_budget;
pub mod check;
pub mod checkpoint;
pub mod config;
pub mod dist;
pub mod error;
pub mod far;
pub mod fetch;
#[cfg(test)]
mod fixtures;
pub mod grid;
pub mod input;
pub mod layout;
pub mod place;
pub mod program;
pub mod run;
mod spool;
pub mod stream;
pub mod vertex;

pub use error::{GridError, Result};
pub use grid::Grid;
