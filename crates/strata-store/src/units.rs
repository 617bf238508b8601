//! Formatting of byte counts for plans, summaries and errors (the I/O engine's, which the
//! layers below the store share).

pub use strata_io::units::fmt_bytes;
