//! A loaded model: its layers' weights in the served precision, and its forward pass.

use std::fmt;
use std::path::Path;

use strata_graph::Block;

use super::arch::Architecture;
use super::assemble;
use super::file;
use super::layers::Layer;
use super::precision::Precision;
use crate::error::{Result, ServeError};
use crate::memory::Allowance;

/// A loaded GNN, ready to run: its architecture and its layers' weights in the served
/// precision. Immutable once loaded, so one `Arc<Model>` serves concurrent requests.
pub struct Model {
    arch: Architecture,
    precision: Precision,
    layers: Vec<Box<dyn Layer>>,
    /// Scalars in the weights file (before any quantization).
    parameters: u64,
}

impl fmt::Debug for Model {
    // The weights are megabytes of numbers: show what identifies the model instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("architecture", &self.arch)
            .field("precision", &self.precision)
            .field("parameters", &self.parameters)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Model {
    /// Loads the weights file at `path`: `format` is `safetensors` or `npz`, or None to tell
    /// from the suffix (then the magic bytes). `arch` overrides the architecture the file
    /// declares; the file must hold exactly the tensors of that architecture, with the shapes
    /// it implies. `precision` is how the linear layers are served. What is not a regular
    /// file is refused before any read.
    pub fn load(
        path: &Path,
        format: Option<&str>,
        arch: Option<Architecture>,
        precision: Precision,
    ) -> Result<Model> {
        let source = path.display().to_string();
        let mut allowance = Allowance::unbounded();
        let bytes = file::read_file(path, &source, &mut allowance)?;
        let format = file::Format::resolve(format, Some(path), &bytes, &source)?;
        Model::build(&bytes, format, arch, precision, &source, &mut allowance)
    }

    /// [`Model::load`] from the bytes of a weights file (e.g. uploaded by a client): the format
    /// is `format`, or told from the magic bytes when None.
    pub fn from_bytes(
        bytes: &[u8],
        format: Option<&str>,
        arch: Option<Architecture>,
        precision: Precision,
    ) -> Result<Model> {
        let source = "model weights";
        let format = file::Format::resolve(format, None, bytes, source)?;
        Model::build(
            bytes,
            format,
            arch,
            precision,
            source,
            &mut Allowance::unbounded(),
        )
    }

    /// [`Model::from_bytes`] of the weights file `source` names, in the format already
    /// resolved, charging what parsing allocates (decoded tensors, inflated npz members) to
    /// `allowance` before it allocates it.
    pub fn build(
        bytes: &[u8],
        format: file::Format,
        arch: Option<Architecture>,
        precision: Precision,
        source: &str,
        allowance: &mut Allowance,
    ) -> Result<Model> {
        let weights = file::parse(bytes, format, source, allowance)?;
        let arch = match (arch, weights.architecture) {
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => {
                return Err(ServeError::FailedPrecondition(format!(
                    "{source}: the file declares no architecture and none was given \
                     (export it with strata.serve.export_model, or pass the architecture)"
                )))
            }
        };
        arch.validate()?;
        let parameters = weights.tensors.values().map(|t| t.data.len() as u64).sum();
        let layers = assemble::build(&arch, weights.tensors, precision, source)?;
        Ok(Model {
            arch,
            precision,
            layers,
            parameters,
        })
    }

    /// The architecture the model was loaded with.
    pub fn architecture(&self) -> &Architecture {
        &self.arch
    }

    /// The precision the linear layers are served in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Number of scalars in the weights (float32 parameters of the trained model).
    pub fn parameters(&self) -> u64 {
        self.parameters
    }

    /// Bytes the weights occupy in memory as served (int8 weights count one byte each plus
    /// their per-channel scales).
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes()).sum()
    }
}

impl Model {
    /// Runs the model on sampled `blocks` (input to output order: `blocks[0]` reads `x`, one
    /// block per layer) and the input rows `x`, row-major `(blocks[0].num_src, in_dim)`.
    /// Returns row-major `(blocks.last().num_dst, out_dim)` float32 outputs, one row per seed.
    /// Malformed blocks or a wrong-sized `x` are InvalidArgument, naming what was expected.
    pub fn forward(&self, blocks: &[Block], x: &[f32]) -> Result<Vec<f32>> {
        check_inputs(self, blocks, x)?;
        let mut h: Option<Vec<f32>> = None;
        for (i, (layer, block)) in self.layers.iter().zip(blocks).enumerate() {
            let input = h.as_deref().unwrap_or(x);
            let mut out = layer.forward(block, input);
            if i + 1 < self.layers.len() {
                out.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            h = Some(out);
        }
        Ok(h.expect("a model has at least one layer"))
    }
}

/// Checks the blocks' structure and chaining and `x`'s size against `model`.
fn check_inputs(model: &Model, blocks: &[Block], x: &[f32]) -> Result<()> {
    let arch = model.architecture();
    let bad = |msg: String| Err(ServeError::InvalidArgument(msg));
    if blocks.len() != arch.layers {
        return bad(format!(
            "blocks: the model has {} layers, so it needs {} blocks, got {}",
            arch.layers,
            arch.layers,
            blocks.len()
        ));
    }
    for (i, b) in blocks.iter().enumerate() {
        if b.num_dst > b.num_src {
            return bad(format!(
                "blocks[{i}]: num_dst {} exceeds num_src {} (destinations are the first sources)",
                b.num_dst, b.num_src
            ));
        }
        if b.indptr.len() != b.num_dst + 1 {
            return bad(format!(
                "blocks[{i}]: indptr has {} offsets, expected num_dst + 1 = {}",
                b.indptr.len(),
                b.num_dst + 1
            ));
        }
        if b.indptr[0] != 0 || b.indptr.windows(2).any(|w| w[0] > w[1]) {
            return bad(format!(
                "blocks[{i}]: indptr must start at 0 and never decrease"
            ));
        }
        if b.indptr[b.num_dst] != b.indices.len() as u64 {
            return bad(format!(
                "blocks[{i}]: indptr ends at {} but there are {} indices",
                b.indptr[b.num_dst],
                b.indices.len()
            ));
        }
        if let Some(&u) = b.indices.iter().find(|&&u| u as usize >= b.num_src) {
            return bad(format!(
                "blocks[{i}]: source index {u} is out of range (num_src {})",
                b.num_src
            ));
        }
        if i > 0 && b.num_src != blocks[i - 1].num_dst {
            return bad(format!(
                "blocks[{i}]: num_src {} must equal blocks[{}].num_dst {} (blocks chain from \
                 the input layer to the seeds)",
                b.num_src,
                i - 1,
                blocks[i - 1].num_dst
            ));
        }
    }
    let rows = blocks[0].num_src;
    if x.len() != rows * arch.in_dim {
        return bad(format!(
            "x: expected blocks[0].num_src x in_dim = {rows} x {} = {} values, got {}",
            arch.in_dim,
            rows * arch.in_dim,
            x.len()
        ));
    }
    Ok(())
}
