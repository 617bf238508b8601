//! PyTorch-BigGraph checkpoints from Python: the HDF5 files go through a Python object
//! (`strata.embed.hdf5.Hdf5`, h5py), everything else is `strata_embed::{export_pbg, import_pbg}`.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use strata_embed::{
    export_pbg, import_pbg, Dataset, EmbedError, ExportOptions, Hdf5, ImportPbgOptions, Loaded,
};

use crate::call::run;
use crate::callback::CallbackError;
use crate::config::section;

/// HDF5 files through a Python object's `write(path, datasets)`, `info(path, dataset)`,
/// `datasets(path, group)` and `rows(path, dataset, lo, hi)`; datasets travel as
/// `(name, shape, float32 bytes, state_dict_key or None)`. Its first exception is raised as
/// itself.
struct PyHdf5<'a> {
    h5: Py<PyAny>,
    error: &'a CallbackError,
}

type Raw = (String, Vec<u64>, Vec<u8>, Option<String>);

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

impl Hdf5 for PyHdf5<'_> {
    fn write(&mut self, path: &Path, datasets: &[Dataset]) -> strata_embed::Result<()> {
        self.error
            .call_method::<Py<PyAny>>(&self.h5, "write", |py| {
                let items = PyList::empty(py);
                for d in datasets {
                    let bytes = PyBytes::new(py, bytemuck::cast_slice(&d.data));
                    items.append((&d.name, &d.shape, bytes, &d.state_dict_key))?;
                }
                (path.to_path_buf(), items).into_pyobject(py)
            })
            .map(drop)
            .map_err(EmbedError::Config)
    }

    fn info(
        &mut self,
        path: &Path,
        dataset: &str,
    ) -> strata_embed::Result<(Option<i64>, Option<Vec<u64>>)> {
        self.error
            .call_method(&self.h5, "info", |py| {
                (path.to_path_buf(), dataset).into_pyobject(py)
            })
            .map_err(EmbedError::Config)
    }

    fn datasets(&mut self, path: &Path, group: &str) -> strata_embed::Result<Vec<Dataset>> {
        let raw: Vec<Raw> = self
            .error
            .call_method(&self.h5, "datasets", |py| {
                (path.to_path_buf(), group).into_pyobject(py)
            })
            .map_err(EmbedError::Config)?;
        Ok(raw
            .into_iter()
            .map(|(name, shape, data, state_dict_key)| Dataset {
                name,
                shape,
                data: floats(&data),
                state_dict_key,
            })
            .collect())
    }

    fn rows(
        &mut self,
        path: &Path,
        dataset: &str,
        lo: u64,
        hi: u64,
    ) -> strata_embed::Result<Vec<f32>> {
        let data: Vec<u8> = self
            .error
            .call_method(&self.h5, "rows", |py| {
                (path.to_path_buf(), dataset, lo, hi).into_pyobject(py)
            })
            .map_err(EmbedError::Config)?;
        Ok(floats(&data))
    }
}

/// Exports a run's checkpoint as a PyTorch-BigGraph checkpoint directory (the
/// `[embed.export]` section's `out`, `checkpoint`, `overwrite`, `memory`), writing HDF5 with `h5`.
#[pyfunction]
#[pyo3(signature = (run_dir, options, h5, progress=None))]
fn embed_export_pbg(
    py: Python<'_>,
    run_dir: PathBuf,
    options: &Bound<'_, PyAny>,
    h5: Py<PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ExportOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    let error = CallbackError::default();
    let result = run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, o.checkpoint, memory, 0, p)?;
        let mut h5 = PyHdf5 { h5, error: &error };
        export_pbg(&mut l, &o.out, o.overwrite, &mut h5, p)
    });
    error.or(result)
}

/// Imports a PyTorch-BigGraph checkpoint as a run (the `[embed.import_pbg]` section),
/// reading HDF5 with `h5`.
#[pyfunction]
#[pyo3(signature = (options, h5, progress=None))]
fn embed_import_pbg(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    h5: Py<PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ImportPbgOptions = section(options)?;
    let error = CallbackError::default();
    let result = run(py, progress, |p| {
        let mut h5 = PyHdf5 { h5, error: &error };
        import_pbg(&o, &mut h5, p)
    });
    error.or(result)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(embed_export_pbg, m)?)?;
    m.add_function(wrap_pyfunction!(embed_import_pbg, m)?)?;
    Ok(())
}
