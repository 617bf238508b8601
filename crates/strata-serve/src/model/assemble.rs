//! Checks a weights file's tensors against an architecture (exactly the tensors it needs, with
//! their shapes) and builds the model's layers from them.

use std::collections::BTreeMap;

use super::arch::Architecture;
use super::layers::Layer;
use super::precision::Precision;
use super::tensor::Tensor;
use crate::error::{Result, ServeError};

/// The tensors (name, shape) of layer `i` of `arch`, in the module table's order.
pub(crate) fn layer_tensors(arch: &Architecture, i: usize) -> Vec<(String, Vec<usize>)> {
    let (d_in, d_out) = arch.layer_dims(i);
    arch.kind
        .get()
        .tensors(d_in, d_out)
        .into_iter()
        .map(|(suffix, shape)| (format!("convs.{i}.{suffix}"), shape))
        .collect()
}

/// Whether a tensor of shape `found` can serve as `expected`: equal, or a one-element `[1]`
/// for a scalar (PyG's GINConv keeps `eps` as a 1-element vector).
fn shape_fits(expected: &[usize], found: &[usize]) -> bool {
    expected == found || (expected.is_empty() && found == [1])
}

/// Checks that `tensors` are exactly the tensors `arch` needs, with its shapes, and builds the
/// layers in `precision`. A missing or extra tensor means a file of a different architecture
/// (FailedPrecondition, naming them); a wrong shape is a malformed file (InvalidArgument,
/// naming the tensor, the expected and the found shape). `source` names the file.
pub fn build(
    arch: &Architecture,
    mut tensors: BTreeMap<String, Tensor>,
    precision: Precision,
    source: &str,
) -> Result<Vec<Box<dyn Layer>>> {
    let expected: Vec<Vec<(String, Vec<usize>)>> =
        (0..arch.layers).map(|i| layer_tensors(arch, i)).collect();
    let missing: Vec<&str> = expected
        .iter()
        .flatten()
        .filter(|(name, _)| !tensors.contains_key(name))
        .map(|(name, _)| name.as_str())
        .collect();
    let described = || {
        format!(
            "a {}-layer {} model ({} -> {} -> {})",
            arch.layers, arch.kind, arch.in_dim, arch.hidden_dim, arch.out_dim
        )
    };
    if !missing.is_empty() {
        return Err(ServeError::FailedPrecondition(format!(
            "{source}: missing tensors that {} needs: {} (is the file for a different \
             architecture?)",
            described(),
            missing.join(", ")
        )));
    }
    if tensors.len() > expected.iter().map(Vec::len).sum() {
        let wanted: Vec<&String> = expected.iter().flatten().map(|(n, _)| n).collect();
        let extra: Vec<&str> = tensors
            .keys()
            .filter(|n| !wanted.contains(n))
            .map(String::as_str)
            .collect();
        return Err(ServeError::FailedPrecondition(format!(
            "{source}: tensors that {} does not have: {} (is the file for a different \
             architecture?)",
            described(),
            extra.join(", ")
        )));
    }
    for (name, shape) in expected.iter().flatten() {
        let found = &tensors[name].shape;
        if !shape_fits(shape, found) {
            return Err(ServeError::InvalidArgument(format!(
                "{source}: tensor {name}: expected shape {shape:?} for {}, found {found:?}",
                described()
            )));
        }
    }

    let layers = (0..arch.layers)
        .map(|i| {
            let mut take = |suffix: &str| {
                tensors
                    .remove(&format!("convs.{i}.{suffix}"))
                    .expect("checked above")
            };
            arch.kind.get().build(&mut take, precision)
        })
        .collect();
    Ok(layers)
}
