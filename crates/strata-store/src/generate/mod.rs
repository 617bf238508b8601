//! Deterministic, streaming graph generators (being written: see docs/generators.md).
