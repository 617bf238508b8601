//! The `strata._native` extension module. Thin by design: each function turns a Python dict
//! into a typed Rust job (serde), runs it with the GIL released, and turns the result back
//! into Python objects. Progress and cancellation go through a Python callback; typed Rust
//! errors become the exception classes of `strata.errors`.

mod bench_disk;
mod call;
mod callback;
mod config;
mod convert;
mod embed;
mod embed_device;
mod embed_device_eval;
mod errors;
mod gnn;
mod grid;
mod io;
mod jobs;
mod pbg;
mod plans;
mod progress;
mod reorder;
mod rng;
mod sampling;
mod serve;
mod serve_model;
mod store;

use pyo3::prelude::*;

/// Makes glibc return large freed buffers to the OS at once. Its default raises the mmap
/// threshold after the first large free, after which freed buffers stay resident in per-thread
/// arenas: a job that plans its buffers within `--memory` would then exceed it in RSS.
fn pin_malloc_thresholds() {
    // SAFETY: mallopt only adjusts allocator parameters; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pin_malloc_thresholds();
    config::register(m)?;
    jobs::register(m)?;
    convert::register(m)?;
    store::register(m)?;
    io::register(m)?;
    embed::register(m)?;
    embed_device::register();
    embed_device_eval::register();
    pbg::register(m)?;
    gnn::register(m)?;
    sampling::register(m)?;
    grid::register(m)?;
    serve::register(m)?;
    serve_model::register(m)?;
    plans::register(m)?;
    reorder::register(m)?;
    rng::register(m)?;
    m.add("FORMAT_VERSION", strata_store::manifest::FORMAT_VERSION)?;
    Ok(())
}
