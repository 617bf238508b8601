//! Sparse matrix-vector product over the edge matrix: `y[v] = sum over (u, v) of w x[u]`.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{chunk_bases, full_pass, Algorithm, Ctx, IterationValue, Output, Values};
use crate::error::{GridError, Result};
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::F64Array;

/// The sparse matrix-vector product's parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Spmv {
    /// float .npy vector x of length V (default: all ones)
    #[schemars(extend("x-kind" = "path"))]
    pub vector: Option<PathBuf>,
    /// multiply by the edge weights (uses a weighted grid)
    pub weighted: bool,
}

struct Multiply<'a> {
    x: &'a F64Array,
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
            let add = w * self.x.get(sb + s as usize);
            if owns_dst {
                self.y.add_owned(db + d as usize, add);
            } else {
                self.y.add_shared(db + d as usize, add);
            }
        }
        0
    }
}

impl Algorithm for Spmv {
    const NAME: &'static str = "spmv";
    const ABOUT: &'static str = "y = A^T x";
    const ARRAYS: &'static [&'static str] = &["y"];
    const VALUE: IterationValue = IterationValue::None;

    /// `x` and `y`, one f64 each.
    fn vertex_bytes(&self) -> u64 {
        16
    }

    fn needs_weights(&self) -> bool {
        self.weighted
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let n = s.grid().layout().num_vertices as usize;
        if self.weighted && s.grid().manifest().weights.is_none() {
            return Err(GridError::config(
                "weighted",
                "the grid has no weights (strata grid build --weighted)",
            ));
        }
        let x = match &self.vector {
            None => F64Array::filled(s.vertex(), n, 1.0)?,
            Some(path) => read_vector(path, F64Array::filled(s.vertex(), n, 0.0)?)?,
        };
        let base = chunk_bases(s);
        let y = F64Array::filled(s.vertex(), n, 0.0)?;
        let kernel = Multiply {
            x: &x,
            y: &y,
            base: &base,
            weighted: self.weighted,
        };
        full_pass(s, ctx, &kernel, 0)?;
        ctx.gather(&[&y])?;
        Ok(Output {
            arrays: vec![("y".into(), Values::F64(y))],
            summary: serde_json::Map::new(),
            iterations: 1,
        })
    }
}

/// Fills `x` from a float `.npy` vector of its length, a batch at a time.
fn read_vector(path: &std::path::Path, x: F64Array) -> Result<F64Array> {
    let header = strata_store::npy::read_header(path)?;
    let n = x.len();
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
    if !header.dtype.is_float() {
        return Err(GridError::config(
            "vector",
            format!(
                "{}: expected a float array, found {}",
                path.display(),
                header.dtype.name()
            ),
        ));
    }
    let mut reader =
        strata_store::array::RowReader::open(path, &header, strata_store::array::IO_CHUNK)?;
    let (mut next, mut floats) = (0, Vec::new());
    while let Some(bytes) = reader.next_batch()? {
        if header.dtype == strata_store::DType::F64 {
            for c in bytes.chunks_exact(8) {
                x.set(next, f64::from_le_bytes(c.try_into().unwrap()));
                next += 1;
            }
        } else {
            floats.clear();
            strata_store::array::decode_f32(bytes, header.dtype, &mut floats);
            for &f in &floats {
                x.set(next, f as f64);
                next += 1;
            }
        }
    }
    Ok(x)
}
