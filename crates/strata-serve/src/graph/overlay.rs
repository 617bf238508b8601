//! Mutations laid over a read-only store version, in layers ([`super::layer`]). Mutations go
//! to the active layer; a fold freezes the active layer, writes base + frozen layers as a new
//! store version in the background, and then drops the frozen layers.

use std::collections::HashMap;
use std::sync::Arc;

use strata_graph::FeatureStore;

use super::features::GraphFeatures;
use super::layer::{Layer, View};
use super::mutation::Mutation;
use super::version::{BaseGraph, Version};

/// Frozen layers (newest first) and the active one that mutations go to.
#[derive(Debug, Default)]
pub struct Overlay {
    pub frozen: Vec<Arc<Layer>>,
    pub active: Layer,
}

impl Overlay {
    /// Calls `f` with a view of everything (active, frozen, base).
    pub fn view<R>(&self, base: &BaseGraph, base_live: u64, f: impl FnOnce(View<'_>) -> R) -> R {
        f(View::new(base, &self.layers(&[]), base_live))
    }

    /// Calls `f` with a view of `tops` (newest first) over everything: layers of staged
    /// mutations that readers do not see yet.
    pub fn view_under<R>(
        &self,
        tops: &[&Layer],
        base: &BaseGraph,
        base_live: u64,
        f: impl FnOnce(View<'_>) -> R,
    ) -> R {
        f(View::new(base, &self.layers(tops), base_live))
    }

    /// Applies a checked mutation to the active layer over `version`. Errors: rows that do not
    /// fit the graph (a log record that was never checked against it).
    pub fn apply(&mut self, version: &Version, m: &Mutation) -> strata_graph::Result<()> {
        let frozen: Vec<&Layer> = self.frozen.iter().map(Arc::as_ref).collect();
        let below = View::new(&version.graph, &frozen, version.live_nodes);
        apply(&mut self.active, below, version, m)
    }

    /// Applies a checked mutation to `top`, a layer over `under` (newest first) over
    /// everything (see [`Overlay::view_under`]).
    pub fn apply_over(
        &self,
        top: &mut Layer,
        under: &[&Layer],
        version: &Version,
        m: &Mutation,
    ) -> strata_graph::Result<()> {
        let layers = self.layers(under);
        let below = View::new(&version.graph, &layers, version.live_nodes);
        apply(top, below, version, m)
    }

    /// An empty layer to go over everything: its totals are those of the active layer.
    pub fn next_layer(&self) -> Layer {
        let a = &self.active;
        Layer::starting_at(a.num_nodes, a.live_nodes, a.num_edges)
    }

    /// The layers, newest first: `tops`, the active one, the frozen ones.
    fn layers<'a>(&'a self, tops: &[&'a Layer]) -> Vec<&'a Layer> {
        let mut layers: Vec<&Layer> = Vec::with_capacity(tops.len() + 1 + self.frozen.len());
        layers.extend_from_slice(tops);
        layers.push(&self.active);
        layers.extend(self.frozen.iter().map(Arc::as_ref));
        layers
    }
}

/// The list of `v` in `lists`, copied from `below` on first touch.
fn touch<'l>(
    lists: &'l mut HashMap<u32, Vec<u32>>,
    v: u32,
    below: impl FnOnce() -> &'l [u32],
) -> &'l mut Vec<u32> {
    lists.entry(v).or_insert_with(|| below().to_vec())
}

/// Applies `m` to `layer` over `below`; feature rows go through the graph's feature store
/// (`version`'s file under the layers, read around the page cache).
fn apply(
    layer: &mut Layer,
    below: View<'_>,
    version: &Version,
    m: &Mutation,
) -> strata_graph::Result<()> {
    match m {
        // Each in turn into the same layer: a later one sees what the earlier ones did.
        Mutation::Batch(ms) => return ms.iter().try_for_each(|m| apply(layer, below, version, m)),
        Mutation::AddVertices {
            first,
            count,
            features,
        } => {
            debug_assert_eq!(
                *first, layer.num_nodes,
                "vertex ids are handed out in order"
            );
            // The ids are handed out first: a row is written only below `num_nodes`.
            layer.num_nodes = first + count;
            layer.live_nodes += *count as u64;
            let ids: Vec<u32> = (*first..first + count).collect();
            write_rows(layer, below, version, &ids, features)?;
        }
        Mutation::RemoveVertices { ids } => {
            for &v in ids {
                if layer.removed.contains(&v) || below.is_removed(v) {
                    continue;
                }
                let ins = layer
                    .in_lists
                    .get(&v)
                    .cloned()
                    .unwrap_or_else(|| below.in_neighbors(v).to_vec());
                let outs = layer
                    .out_lists
                    .get(&v)
                    .cloned()
                    .unwrap_or_else(|| below.out_neighbors(v).to_vec());
                let mut gone = ins.len() as u64;
                for &u in &ins {
                    touch(&mut layer.out_lists, u, || below.out_neighbors(u)).retain(|&w| w != v);
                }
                for &w in &outs {
                    // A self loop was counted with the in-edges already.
                    if w != v {
                        gone += 1;
                    }
                    touch(&mut layer.in_lists, w, || below.in_neighbors(w)).retain(|&u| u != v);
                }
                layer.in_lists.insert(v, Vec::new());
                layer.out_lists.insert(v, Vec::new());
                layer.features.remove(&v);
                layer.removed.insert(v);
                layer.live_nodes -= 1;
                layer.num_edges -= gone;
            }
        }
        Mutation::UpdateVertices { ids, features } => {
            write_rows(layer, below, version, ids, features)?;
        }
        Mutation::AddEdges { src, dst } => {
            for (&u, &v) in src.iter().zip(dst) {
                touch(&mut layer.in_lists, v, || below.in_neighbors(v)).push(u);
                touch(&mut layer.out_lists, u, || below.out_neighbors(u)).push(v);
                layer.num_edges += 1;
            }
        }
        Mutation::RemoveEdges { src, dst } => {
            for (&u, &v) in src.iter().zip(dst) {
                let ins = touch(&mut layer.in_lists, v, || below.in_neighbors(v));
                let before = ins.len();
                ins.retain(|&x| x != u);
                layer.num_edges -= (before - ins.len()) as u64;
                touch(&mut layer.out_lists, u, || below.out_neighbors(u)).retain(|&x| x != v);
            }
        }
    }
    layer.mutations += 1;
    Ok(())
}

/// Writes rows `features` (`dim` f32 per id of `ids`) of a mutation into `layer`.
fn write_rows(
    layer: &mut Layer,
    below: View<'_>,
    version: &Version,
    ids: &[u32],
    features: &[f32],
) -> strata_graph::Result<()> {
    let rows = version.feature_rows(&version.direct);
    GraphFeatures::writing(layer, below, rows).update(ids, bytemuck::cast_slice(features))
}
