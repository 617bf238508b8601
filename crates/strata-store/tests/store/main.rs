//! strata-store's integration tests, one binary (a test binary each would link the crate and
//! its dependencies once per file): the converters, opening a store, typed conversions and the
//! fuzzers. Each module is one former test file; `common` holds their helpers.

mod common;
mod convert_numpy;
mod convert_text;
mod convert_typed_numpy;
mod fuzz;
mod store_open;
mod typed;
mod typed_names;
