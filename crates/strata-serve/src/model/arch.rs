//! What a model is: the kind of its layers (the registry of servable layer kinds) and the
//! widths, depth and fanouts of its stack.

use serde::{Deserialize, Serialize};

use super::layers::{gcn, gin, sage, sage_pool, LayerKind};
use crate::error::{Result, ServeError};

strata_store::registry! {
    /// The layer kind of a servable GNN (every layer of a model has the same kind; registered
    /// by name, see [`LayerKind`]).
    pub enum ModelKind: dyn LayerKind, "layer kind", "layer kind" {
        sage::Sage,
        sage_pool::SagePool,
        gcn::Gcn,
        gin::Gin,
    }
}

/// Layer kinds renamed since models were exported, `(old name, kind)`: `sage_mean` is `sage`,
/// the name training gives it. A weights file or a registered model that names a kind by its
/// old name still loads, as that kind, with a note naming the new name on standard error.
pub const RENAMED_KINDS: &[(&str, ModelKind)] = &[("sage_mean", ModelKind::Sage)];

/// `kind` by its registered name, or by a name in [`RENAMED_KINDS`] (with the note).
fn kind_by_name<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<ModelKind, D::Error> {
    let name = String::deserialize(d)?;
    if let Some(&(old, kind)) = RENAMED_KINDS.iter().find(|(old, _)| *old == name) {
        eprintln!(
            "strata: layer kind `{old}` is deprecated and loads as `{kind}`, its name now; \
             export the model again to write `{kind}`"
        );
        return Ok(kind);
    }
    name.parse()
        .map_err(|e: strata_store::registry::UnknownName| {
            <D::Error as serde::de::Error>::custom(e.serde_message())
        })
}

/// What a weights file is a model of: the layer type and the widths of a `layers`-deep stack
/// (`in_dim -> hidden_dim -> ... -> hidden_dim -> out_dim`; `hidden_dim` is unused with one
/// layer) and the sampling fanouts it was trained with, from the seeds outwards as in
/// `strata gnn train --fanouts` (so `fanouts[0]` is the hop of the *last* block).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Architecture {
    #[serde(deserialize_with = "kind_by_name")]
    pub kind: ModelKind,
    /// Feature width of the input rows.
    pub in_dim: usize,
    /// Width of every hidden layer's output.
    pub hidden_dim: usize,
    /// Width of the output rows (classes, or the embedding width).
    pub out_dim: usize,
    /// Number of GNN layers (= hops = blocks per request).
    pub layers: usize,
    /// Neighbours sampled per hop, seeds outwards; -1 keeps all.
    pub fanouts: Vec<i32>,
}

impl Architecture {
    /// Checks the declared numbers: widths and depth at least 1, one fanout per layer, each
    /// fanout >= 1 or -1. The error names the field and the value found.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("in_dim", self.in_dim),
            ("hidden_dim", self.hidden_dim),
            ("out_dim", self.out_dim),
            ("layers", self.layers),
        ] {
            if v < 1 {
                return Err(ServeError::InvalidArgument(format!(
                    "architecture.{field}: need at least 1, got {v}"
                )));
            }
        }
        if self.fanouts.len() != self.layers {
            return Err(ServeError::InvalidArgument(format!(
                "architecture.fanouts: need one fanout per layer ({}), got {} ({:?})",
                self.layers,
                self.fanouts.len(),
                self.fanouts
            )));
        }
        if let Some(f) = self.fanouts.iter().find(|&&f| f != -1 && f < 1) {
            return Err(ServeError::InvalidArgument(format!(
                "architecture.fanouts: each fanout must be >= 1 or -1 (all), got {f} in {:?}",
                self.fanouts
            )));
        }
        Ok(())
    }

    /// `(input width, output width)` of layer `i` (0 reads the features).
    pub fn layer_dims(&self, i: usize) -> (usize, usize) {
        let width = |j: usize| match j {
            0 => self.in_dim,
            j if j == self.layers => self.out_dim,
            _ => self.hidden_dim,
        };
        (width(i), width(i + 1))
    }
}
