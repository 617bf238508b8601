//! Strata's counter-based randomness (`strata_store::rng`) seen from Python: the reference
//! draws that the device kernels (`strata.device.rng`, on torch tensors) must reproduce bit for
//! bit, so a sample or a negative drawn on a GPU equals the one the Rust engine draws.

use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use strata_store::rng::{derive, Rng};

/// The child key `derive(key, index)`.
#[pyfunction]
fn rng_derive(key: u64, index: u64) -> u64 {
    derive(key, index)
}

/// `count` draws of the stream of `key` from draw `position` on (`Rng::seek(key, position)`),
/// as little-endian `u64` bytes; with `below = n`, each draw is `Rng::below(n)` instead.
#[pyfunction]
#[pyo3(signature = (key, position, count, below=None))]
fn rng_draws<'py>(
    py: Python<'py>,
    key: u64,
    position: u64,
    count: usize,
    below: Option<u64>,
) -> Bound<'py, PyByteArray> {
    let mut rng = Rng::seek(key, position);
    let draws: Vec<u64> = (0..count)
        .map(|_| match below {
            Some(n) => rng.below(n),
            None => rng.next_u64(),
        })
        .collect();
    PyByteArray::new(py, bytemuck::cast_slice(&draws))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rng_derive, m)?)?;
    m.add_function(wrap_pyfunction!(rng_draws, m)?)
}
