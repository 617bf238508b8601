//! A run on disk and its ways in and out: the run directory, export, incremental starts, gathering owner-mode runs, PyTorch-BigGraph checkpoints.

pub mod export;
pub mod gather;
pub mod incremental;
pub mod pbg;
pub mod run_dir;
