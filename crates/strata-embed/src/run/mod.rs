//! A run on disk and its ways in and out: the run directory, export, incremental starts, gathering owner-mode runs, PyTorch-BigGraph checkpoints.

pub(crate) mod export;
pub(crate) mod gather;
pub(crate) mod incremental;
pub(crate) mod loaded;
pub(crate) mod pbg;
pub(crate) mod run_dir;
