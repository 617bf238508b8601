//! Strata's store: the on-disk format (a directory of `manifest.json` plus aligned `.npy`
//! arrays), its validation, streaming converters from common graph formats, and generators.

#[cfg(target_endian = "big")]
compile_error!("Strata's file formats are little-endian and it reads them in place: build on a little-endian target");

pub mod array;
pub mod budget;
pub mod check;
mod check_stamp;
mod check_v2;
pub mod checked;
pub mod codec;
pub mod config;
pub mod convert;
pub mod digest;
pub mod disk_room;
pub mod error;
pub mod file_stamp;
pub mod generate;
pub mod ids;
pub mod manifest;
pub mod npy;
pub mod perm;
pub mod registry;
pub mod rng;
pub mod secret;
pub mod store;
pub mod strtab;
pub mod units;
pub mod verified;

pub use error::{Result, StoreError};
pub use manifest::{ArrayInfo, Manifest};
pub use npy::DType;
pub use store::{Store, StoreBuilder};
pub use strata_io::progress::{Cancelled, Meter, NoProgress, Progress};
pub use verified::open_checked;
