//! Relation parameters, kept in memory: one row per relation, and with reciprocal relations a
//! second block of rows for the inverse relations used when heads are corrupted.

use std::path::Path;

use strata_store::array::{read_all_bytes, NpyWriter, IO_CHUNK};
use strata_store::rng::{derive, Rng};
use strata_store::DType;

use crate::config::RowInit;
use crate::error::{EmbedError, Result};
use crate::model::ScoreModel;
use crate::storage::shared::SharedRows;
use crate::storage::table::Reals;

/// Relation rows and their Adagrad state.
pub struct Relations {
    /// `rows x dim`, row-major.
    pub params: Vec<f32>,
    /// `rows x state_per_row`.
    pub state: Vec<f32>,
    pub dim: usize,
    pub state_per_row: usize,
    /// Row of relation `r`'s inverse is `r + inverse_offset` (0 without reciprocal relations).
    pub inverse_offset: u32,
}

impl Relations {
    /// Initial rows for `num_relations` relations (at least one: graphs without relation
    /// types use relation 0 everywhere), doubled when `reciprocal`; random rows are a pure
    /// function of `seed`: by the model's own start (see [`ScoreModel::init_relation`]) with
    /// `RowInit::Normal`, else every real drawn as `init` draws a table of these rows (see
    /// [`RowInit::reals`]).
    pub fn new(
        model: &ScoreModel,
        num_relations: u64,
        reciprocal: bool,
        row_wise_state: bool,
        seed: u64,
        init: RowInit,
    ) -> Relations {
        let base = num_relations.max(1) as usize;
        let rows = if reciprocal { 2 * base } else { base };
        let dim = model.rel_dim();
        let mut params = vec![0.0f32; rows * dim];
        if dim > 0 {
            let mut rng = Rng::new(derive(seed, 0x7e1a));
            match init {
                RowInit::Normal(scale) => params
                    .chunks_mut(dim)
                    .for_each(|row| model.init_relation(row, &mut rng, scale)),
                _ => {
                    let mut reals = Reals::new(init.reals(rows as u64, dim), rng);
                    params.iter_mut().for_each(|v| *v = reals.next());
                }
            }
        }
        let state_per_row = if row_wise_state { 1 } else { dim };
        Relations {
            state: vec![0.0; rows * state_per_row],
            params,
            dim,
            state_per_row,
            inverse_offset: if reciprocal { base as u32 } else { 0 },
        }
    }

    pub fn rows(&self) -> usize {
        self.params.len().checked_div(self.dim).unwrap_or(0)
    }

    /// Bytes held in memory.
    pub fn bytes(&self) -> u64 {
        ((self.params.len() + self.state.len()) * 4) as u64
    }

    /// Shared view for the workers (`None` for models without relation parameters).
    pub fn shared(&mut self) -> Option<SharedRows<'_>> {
        (self.dim > 0).then(|| {
            SharedRows::new(
                &mut self.params,
                &mut self.state,
                self.dim,
                self.state_per_row,
            )
        })
    }

    /// The relation row that scores queries of relation `r` as tail queries: the row itself,
    /// for a head query `(?, r, t)` the inverse row (reciprocal relations) or the row reversed
    /// by the model (see [`ScoreModel::reverse_relation`]). Written into `out` (`dim` floats).
    pub fn query_row(&self, model: &ScoreModel, r: u32, head: bool, out: &mut [f32]) {
        let reciprocal = self.inverse_offset > 0;
        let i = (r + if head && reciprocal {
            self.inverse_offset
        } else {
            0
        }) as usize;
        out.copy_from_slice(&self.params[i * self.dim..(i + 1) * self.dim]);
        if head && !reciprocal {
            model.reverse_relation(out);
        }
    }

    /// Writes `params` and `state` to `params_path` and `state_path` (fsynced).
    pub fn save(&self, params_path: &Path, state_path: &Path) -> Result<()> {
        let rows = self.rows() as u64;
        for (path, data, cols) in [
            (params_path, &self.params, self.dim),
            (state_path, &self.state, self.state_per_row),
        ] {
            let mut w = NpyWriter::create(path, DType::F32, &[cols as u64], IO_CHUNK)?;
            w.write(data)?;
            let info = w.finish()?;
            debug_assert!(self.dim == 0 || info.shape[0] == rows);
            std::fs::File::open(path)
                .and_then(|f| f.sync_all())
                .map_err(|e| {
                    strata_store::StoreError::Io(strata_io::IoError::os("fsync", path, 0, e))
                })?;
        }
        Ok(())
    }

    /// Reads rows saved by [`Relations::save`] into `self` (whose shape they must match).
    pub fn load(&mut self, params_path: &Path, state_path: &Path) -> Result<()> {
        for (path, data) in [
            (params_path, &mut self.params),
            (state_path, &mut self.state),
        ] {
            let (header, bytes) = read_all_bytes(path)?;
            if header.dtype != DType::F32 || bytes.len() != data.len() * 4 {
                return Err(EmbedError::Corrupt(format!(
                    "{}: expected {} float32 values, found {} {:?}",
                    path.display(),
                    data.len(),
                    header.len(),
                    header.dtype
                )));
            }
            for (i, (v, c)) in data.iter_mut().zip(bytes.chunks_exact(4)).enumerate() {
                *v = f32::from_le_bytes(c.try_into().expect("4 bytes"));
                if !v.is_finite() {
                    return Err(EmbedError::Corrupt(format!(
                        "{}: value {i} is {v}, not a finite number; the checkpoint is damaged",
                        path.display()
                    )));
                }
            }
        }
        Ok(())
    }
}
