//! A program's per-vertex storage: its arrays in their declared dtypes, the degrees it reads
//! and its accumulator, all in the run's vertex memory (the heap, or windows out of core).

use crate::algo::Values;
use crate::error::Result;
use crate::grid::Grid;
use crate::vertex::{F32Array, F64Array, Shared, U64Array, VertexMemory};

use super::expr::Column;
use super::spec::{AccType, Checked, DType, Fold};

/// A program array.
pub(crate) enum Array {
    F32(F32Array),
    F64(F64Array),
    /// int64 values, kept as their two's-complement bits.
    I64(U64Array),
}

/// 2^63: the first float an int64 cannot hold.
const I64_END: f64 = 9_223_372_036_854_775_808.0;

impl Array {
    /// `n` zeros of `dtype` in `mem`.
    pub fn zeros(mem: &VertexMemory, n: usize, dtype: DType) -> Result<Array> {
        Ok(match dtype {
            DType::F32 => Array::F32(F32Array::filled(mem, n, 0.0)?),
            DType::F64 => Array::F64(F64Array::filled(mem, n, 0.0)?),
            DType::I64 => Array::I64(U64Array::filled(mem, n, 0)?),
        })
    }

    /// `out[k] = self[index(k)]`, the dtype matched once.
    #[inline]
    pub fn gather(&self, out: &mut [f64], index: impl Fn(usize) -> usize) {
        match self {
            Array::F32(a) => fill(out, |k| a.get(index(k)) as f64),
            Array::F64(a) => fill(out, |k| a.get(index(k))),
            Array::I64(a) => fill(out, |k| a.get(index(k)) as i64 as f64),
        }
    }

    /// Sets `self[index(k)] = value(k)` for k in 0..len in the array's dtype (an f32 rounds);
    /// `Err((k, x))` at the first value an int64 cannot hold (not finite, or not within ±2^63
    /// after truncation towards zero), the ones before it stored.
    #[inline]
    pub fn scatter(
        &self,
        len: usize,
        index: impl Fn(usize) -> usize,
        value: impl Fn(usize) -> f64,
    ) -> std::result::Result<(), (usize, f64)> {
        match self {
            Array::F32(a) => (0..len).for_each(|k| a.set(index(k), value(k) as f32)),
            Array::F64(a) => (0..len).for_each(|k| a.set(index(k), value(k))),
            Array::I64(a) => {
                for k in 0..len {
                    let x = value(k);
                    if !(x.is_finite() && (-I64_END..I64_END).contains(&x)) {
                        return Err((k, x));
                    }
                    a.set(index(k), x as i64 as u64)
                }
            }
        }
        Ok(())
    }

    /// The array as a result.
    pub fn into_values(self) -> Values {
        match self {
            Array::F32(a) => Values::F32(a),
            Array::F64(a) => Values::F64(a),
            Array::I64(a) => Values::Ids(a),
        }
    }

    pub fn shared(&self) -> &dyn Shared {
        match self {
            Array::F32(a) => a,
            Array::F64(a) => a,
            Array::I64(a) => a,
        }
    }
}

#[inline(always)]
fn fill(out: &mut [f64], f: impl Fn(usize) -> f64) {
    for (k, o) in out.iter_mut().enumerate() {
        *o = f(k);
    }
}

/// Float cells a combine writes into.
trait Cells: Sync {
    fn read(&self, i: usize) -> f64;
    fn write(&self, i: usize, x: f64);
    fn update(&self, i: usize, f: impl Fn(f64) -> f64);
}

impl Cells for F32Array {
    #[inline(always)]
    fn read(&self, i: usize) -> f64 {
        self.get(i) as f64
    }
    #[inline(always)]
    fn write(&self, i: usize, x: f64) {
        self.set(i, x as f32)
    }
    #[inline(always)]
    fn update(&self, i: usize, f: impl Fn(f64) -> f64) {
        self.update_shared(i, |x| f(x as f64) as f32)
    }
}

impl Cells for F64Array {
    #[inline(always)]
    fn read(&self, i: usize) -> f64 {
        self.get(i)
    }
    #[inline(always)]
    fn write(&self, i: usize, x: f64) {
        self.set(i, x)
    }
    #[inline(always)]
    fn update(&self, i: usize, f: impl Fn(f64) -> f64) {
        self.update_shared(i, f)
    }
}

/// The accumulator: one float per vertex into which messages combine, holding the fold's
/// identity between iterations.
pub(crate) struct Acc {
    cells: AccCells,
    fold: Fold,
}

enum AccCells {
    F32(F32Array),
    F64(F64Array),
}

impl Acc {
    pub fn new(mem: &VertexMemory, n: usize, dtype: AccType, fold: Fold) -> Result<Acc> {
        let id = fold.identity();
        let cells = match dtype {
            AccType::F32 => AccCells::F32(F32Array::filled(mem, n, id as f32)?),
            AccType::F64 => AccCells::F64(F64Array::filled(mem, n, id)?),
        };
        Ok(Acc { cells, fold })
    }

    /// `out[k] = acc[index(k)]`.
    #[inline]
    pub fn gather(&self, out: &mut [f64], index: impl Fn(usize) -> usize) {
        match &self.cells {
            AccCells::F32(a) => fill(out, |k| a.get(index(k)) as f64),
            AccCells::F64(a) => fill(out, |k| a.get(index(k))),
        }
    }

    /// Sets `acc[index(k)]` for k in 0..len back to the identity (once the vertices read it).
    #[inline]
    pub fn reset(&self, len: usize, index: impl Fn(usize) -> usize) {
        let id = self.fold.identity();
        match &self.cells {
            AccCells::F32(a) => (0..len).for_each(|k| a.set(index(k), id as f32)),
            AccCells::F64(a) => (0..len).for_each(|k| a.set(index(k), id)),
        }
    }

    /// Combines message `msg(k)` into vertex `dst(k)` for k in 0..len; `owned`: no other
    /// thread writes these vertices meanwhile (plain stores, not read-modify-writes).
    #[inline]
    pub fn combine(
        &self,
        len: usize,
        owned: bool,
        dst: impl Fn(usize) -> usize,
        msg: impl Fn(usize) -> f64,
    ) {
        match &self.cells {
            AccCells::F32(a) => combine_into(a, self.fold, owned, len, dst, msg),
            AccCells::F64(a) => combine_into(a, self.fold, owned, len, dst, msg),
        }
    }
}

/// [`Acc::combine`] for one cell type, the fold and ownership matched once.
#[inline(always)]
fn combine_into<A: Cells>(
    a: &A,
    fold: Fold,
    owned: bool,
    len: usize,
    dst: impl Fn(usize) -> usize,
    msg: impl Fn(usize) -> f64,
) {
    macro_rules! each {
        ($f:expr) => {
            if owned {
                for k in 0..len {
                    let v = dst(k);
                    a.write(v, $f(a.read(v), msg(k)));
                }
            } else {
                for k in 0..len {
                    let m = msg(k);
                    a.update(dst(k), |x| $f(x, m));
                }
            }
        };
    }
    match fold {
        Fold::Sum => each!(|x: f64, m: f64| x + m),
        Fold::Min => each!(|x: f64, m: f64| x.min(m)),
        Fold::Max => each!(|x: f64, m: f64| x.max(m)),
    }
}

/// Everything a program reads per vertex.
pub(crate) struct Columns {
    pub values: Vec<Array>,
    pub out_degree: Option<F64Array>,
    pub in_degree: Option<F64Array>,
    pub acc: Acc,
}

impl Columns {
    /// The program's arrays (zeros until init), the degrees it reads from `grid`, and its
    /// accumulator, in `mem`.
    pub fn new(program: &Checked, grid: &Grid, mem: &VertexMemory) -> Result<Columns> {
        let n = grid.layout().num_vertices as usize;
        let values = program
            .values
            .iter()
            .map(|(_, dtype)| Array::zeros(mem, n, *dtype))
            .collect::<Result<Vec<_>>>()?;
        let degree = |read: bool, name: &str| -> Result<Option<F64Array>> {
            if !read {
                return Ok(None);
            }
            let a = F64Array::filled(mem, n, 0.0)?;
            grid.for_each_degree(name, |v, d| a.set(v, d as f64))?;
            Ok(Some(a))
        };
        Ok(Columns {
            values,
            out_degree: degree(program.out_degree, "out_degree")?,
            in_degree: degree(program.in_degree, "in_degree")?,
            acc: Acc::new(mem, n, program.accumulator, program.combine)?,
        })
    }

    /// `out[k] = column[index(k)]`.
    #[inline]
    pub fn gather(&self, column: Column, out: &mut [f64], index: impl Fn(usize) -> usize) {
        let degree = |d: &Option<F64Array>, out: &mut [f64]| {
            let d = d.as_ref().expect("degrees the program reads are loaded");
            fill(out, |k| d.get(index(k)))
        };
        match column {
            Column::Value(k) => self.values[k].gather(out, &index),
            Column::Id => fill(out, |k| index(k) as f64),
            Column::OutDegree => degree(&self.out_degree, out),
            Column::InDegree => degree(&self.in_degree, out),
        }
    }
}
