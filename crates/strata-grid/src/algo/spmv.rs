//! Sparse matrix-vector product over the edge matrix: `y[v] = sum over (u, v) of w x[u]`.

use super::{chunk_bases, full_pass, Ctx, Output, Values};
use crate::error::{GridError, Result};
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::F64Array;
use std::path::PathBuf;

pub struct Spmv {
    pub vector: Option<PathBuf>,
    pub weighted: bool,
}

struct Multiply<'a> {
    x: &'a [f64],
    y: &'a F64Array,
    base: &'a [u64],
    weighted: bool,
}

impl EdgeKernel for Multiply<'_> {
    fn weighted(&self) -> bool {
        self.weighted
    }

    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], weights: &[f32], owns_dst: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        for (k, &[s, d]) in edges.iter().enumerate() {
            let w = if self.weighted {
                weights[k] as f64
            } else {
                1.0
            };
            let add = w * self.x[sb + s as usize];
            if owns_dst {
                self.y.add_owned(db + d as usize, add);
            } else {
                self.y.add_shared(db + d as usize, add);
            }
        }
        0
    }
}

impl Spmv {
    pub fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let n = s.grid().layout().num_vertices as usize;
        if self.weighted && s.grid().manifest().weights.is_none() {
            return Err(GridError::config(
                "weighted",
                "the grid has no weights (strata grid build --weights)",
            ));
        }
        let x = match &self.vector {
            None => vec![1.0; n],
            Some(path) => read_vector(path, n)?,
        };
        let base = chunk_bases(s);
        let y = F64Array::filled(n, 0.0);
        let kernel = Multiply {
            x: &x,
            y: &y,
            base: &base,
            weighted: self.weighted,
        };
        full_pass(s, ctx, &kernel, 0)?;
        Ok(Output {
            arrays: vec![("y".into(), Values::F64(y.into_vec()))],
            summary: serde_json::Map::new(),
            iterations: 1,
        })
    }
}

/// A float vector of length `n` from a `.npy` file.
fn read_vector(path: &std::path::Path, n: usize) -> Result<Vec<f64>> {
    let (header, bytes) = strata_store::array::read_all_bytes(path)?;
    if header.shape != [n as u64] {
        return Err(GridError::config(
            "vector",
            format!(
                "{}: expected shape ({n},), found {:?}",
                path.display(),
                header.shape
            ),
        ));
    }
    let mut out = Vec::with_capacity(n);
    match header.dtype {
        strata_store::DType::F64 => out.extend(bytemuck::pod_collect_to_vec::<u8, f64>(&bytes)),
        dt if dt.is_float() => {
            let mut f = Vec::new();
            strata_store::array::decode_f32(&bytes, dt, &mut f);
            out.extend(f.into_iter().map(|v| v as f64));
        }
        dt => {
            return Err(GridError::config(
                "vector",
                format!(
                    "{}: expected a float array, found {}",
                    path.display(),
                    dt.name()
                ),
            ))
        }
    }
    Ok(out)
}
