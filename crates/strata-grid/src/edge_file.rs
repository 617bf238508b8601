//! Writing a grid's edge arrays block by block: every block a build makes goes through
//! [`EdgeWriter::push`], which stores it as plain records (`edges.npy`) or, in a compressed
//! grid, sorts it and appends its code ([`block_codec`]) to `edge_codes.npy`, with the
//! weights in the same order.

use std::collections::BTreeMap;
use std::path::Path;

use strata_store::array::NpyWriter;
use strata_store::npy::DType;
use strata_store::ArrayInfo;

use crate::block_codec::{self, Compression, Keys};
use crate::error::Result;
use crate::layout::{CODE_INDEX, EDGE_CODES};

/// The edge (and weight) arrays of a grid being written in `dir`.
pub struct EdgeWriter {
    compression: Compression,
    keys: Keys,
    edges: NpyWriter,
    weights: Option<NpyWriter>,
    /// Compressed: first byte of each block's code so far, then the bytes written.
    code_index: Vec<i64>,
    code: Vec<u8>,
}

impl EdgeWriter {
    /// Starts the arrays of a grid with `chunk_size` vertices a chunk in `dir`; `weighted`
    /// writes `weights.npy` too.
    pub fn create(
        dir: &Path,
        compression: Compression,
        chunk_size: u64,
        weighted: bool,
    ) -> Result<EdgeWriter> {
        let edges = match compression {
            Compression::None => {
                NpyWriter::create(&dir.join("edges.npy"), DType::U32, &[2], 4 << 20)?
            }
            _ => NpyWriter::create(
                &dir.join(format!("{EDGE_CODES}.npy")),
                DType::U8,
                &[],
                4 << 20,
            )?,
        };
        let weights = match weighted {
            true => Some(NpyWriter::create(
                &dir.join("weights.npy"),
                DType::F32,
                &[],
                4 << 20,
            )?),
            false => None,
        };
        Ok(EdgeWriter {
            compression,
            keys: Keys::new(chunk_size),
            edges,
            weights,
            code_index: vec![0],
            code: Vec::new(),
        })
    }

    /// Appends the next block in file order: its `edges` (in-block offsets) and, in a
    /// weighted grid, their `weights`. A compressed grid sorts both (the order it stores).
    pub fn push(&mut self, edges: &mut [[u32; 2]], weights: &mut [f32]) -> Result<()> {
        if self.compression.is_compressed() {
            block_codec::sort_block(edges, weights);
            self.code.clear();
            block_codec::encode(self.compression, self.keys, edges, &mut self.code);
            self.edges.write_bytes(&self.code)?;
            let end = self.code_index.last().copied().unwrap_or(0) + self.code.len() as i64;
            self.code_index.push(end);
        } else {
            self.edges.write_bytes(bytemuck::cast_slice(edges))?;
        }
        if let Some(w) = self.weights.as_mut() {
            w.write(weights)?;
        }
        Ok(())
    }

    /// Finishes the arrays (and, compressed, writes the code index to `dir`); returns them
    /// by name, for the manifest.
    pub fn finish(self, dir: &Path) -> Result<BTreeMap<String, ArrayInfo>> {
        let mut arrays = BTreeMap::new();
        let name = match self.compression {
            Compression::None => "edges",
            _ => EDGE_CODES,
        };
        arrays.insert(name.to_string(), self.edges.finish()?);
        if let Some(w) = self.weights {
            arrays.insert("weights".to_string(), w.finish()?);
        }
        if self.compression.is_compressed() {
            let mut w = NpyWriter::create(
                &dir.join(format!("{CODE_INDEX}.npy")),
                DType::I64,
                &[],
                1 << 20,
            )?;
            w.write(&self.code_index)?;
            arrays.insert(CODE_INDEX.to_string(), w.finish()?);
        }
        Ok(arrays)
    }
}
