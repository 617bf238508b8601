//! Registration: a Strata store, re-numbered for page locality (GLIST Alg. 2) when asked,
//! written as the served graph's first version.

use std::path::Path;

use strata_graph::features::FeatureReader;
use strata_graph::topology::Direction;
use strata_graph::Topology;
use strata_store::ids::IdCheck;
use strata_store::{open_checked, NoProgress};

use super::version::{write_version, VersionMeta, VersionSource};
use crate::error::{Result, ServeError};
use strata_graph::order::glist::{reorganize, ReorderParams};

/// The source store seen through the new numbering.
struct Renumbered {
    csc: Topology,
    csr: Topology,
    old_of_new: Vec<u32>,
    features: FeatureReader,
    labels: Option<Vec<i32>>,
}

impl VersionSource for Renumbered {
    fn num_nodes(&self) -> u32 {
        self.csc.num_nodes() as u32
    }

    fn in_neighbors(&self, v: u32) -> &[u32] {
        self.csc.neighbors(v)
    }

    fn out_neighbors(&self, v: u32) -> &[u32] {
        self.csr.neighbors(v)
    }

    fn is_removed(&self, _v: u32) -> bool {
        false
    }

    fn read_features(&self, first: u32, out: &mut [f32]) -> Result<()> {
        let count = out.len() / self.features.meta().dim;
        let rows = &self.old_of_new[first as usize..first as usize + count];
        self.features.gather_f32(rows, out)?;
        Ok(())
    }

    fn label(&self, v: u32) -> i32 {
        self.labels
            .as_ref()
            .map_or(-1, |l| l[self.old_of_new[v as usize] as usize])
    }
}

/// What registration did, for the graph's description.
pub struct Registered {
    pub reordered: bool,
    pub centers: usize,
    pub covered: usize,
}

/// Writes the first served version of `source` at `out`.
pub fn register(
    source: &Path,
    out: &Path,
    name: &str,
    reorder: Option<&ReorderParams>,
) -> Result<Registered> {
    let store = open_checked(source, &NoProgress)?;
    if store.manifest().features.is_none() {
        return Err(ServeError::FailedPrecondition(format!(
            "{}: the store has no node features; the service needs them for GNN inference",
            source.display()
        )));
    }
    let features = FeatureReader::open(&store.array_path("features")?)?;
    let csc = Topology::load(&store, Direction::In)?;
    let csr = Topology::load(&store, Direction::Out)?;
    let n = csc.num_nodes();
    let (new_of_old, registered) = match reorder {
        Some(params) => {
            let r = reorganize(&csc, params)?;
            let reg = Registered {
                reordered: true,
                centers: r.sequence.len(),
                covered: r.covered,
            };
            (r.new_of_old, reg)
        }
        None => (
            (0..n as u32).collect(),
            Registered {
                reordered: false,
                centers: 0,
                covered: 0,
            },
        ),
    };
    let mut old_of_new = vec![0u32; n];
    for (old, &new) in new_of_old.iter().enumerate() {
        old_of_new[new as usize] = old as u32;
    }
    let labels = match &store.manifest().labels {
        Some(_) => {
            let (header, bytes) =
                strata_store::array::read_all_bytes(&store.array_path("labels")?)?;
            let mut vals = Vec::with_capacity(header.len() as usize);
            strata_store::array::decode_ints(&bytes, header.dtype, &mut vals);
            IdCheck::labels(&store)?.check(&vals)?;
            Some(vals.into_iter().map(|x| x as i32).collect())
        }
        None => None,
    };
    let source_view = Renumbered {
        csc: renumber(&csc, &new_of_old, &old_of_new)?,
        csr: renumber(&csr, &new_of_old, &old_of_new)?,
        old_of_new,
        features,
        labels,
    };
    let meta = VersionMeta {
        name,
        feature_dim: source_view.features.meta().dim,
        num_classes: store.manifest().labels.as_ref().map(|l| l.num_classes),
        external_ids: &source_view.old_of_new,
        provenance: serde_json::json!({
            "served_graph": name,
            "source": source.display().to_string(),
            "reordered": registered.reordered,
        }),
    };
    write_version(out, &source_view, &meta)?;
    Ok(registered)
}

/// `topo` with vertex `v` renamed `new_of_old[v]`, lists keeping their order.
fn renumber(topo: &Topology, new_of_old: &[u32], old_of_new: &[u32]) -> Result<Topology> {
    let mut indptr = Vec::with_capacity(topo.indptr.len());
    let mut indices = Vec::with_capacity(topo.indices.len());
    indptr.push(0u64);
    for &old in old_of_new {
        indices.extend(topo.neighbors(old).iter().map(|&u| new_of_old[u as usize]));
        indptr.push(indices.len() as u64);
    }
    Ok(Topology::new(indptr, indices)?)
}
