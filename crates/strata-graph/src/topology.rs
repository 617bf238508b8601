//! The graph's adjacency in RAM (GIDS §3.5, Helios §3.2: topology accesses are 4-8 bytes, far
//! below a page, so it never goes to the SSD).

use std::path::Path;

use strata_store::array::{decode_ints, read_all_bytes};
use strata_store::ids::{IdCheck, IndptrCheck};
use strata_store::npy::DType;
use strata_store::Store;

use crate::error::{GraphError, Result};

/// Which neighbours a node's message-passing inputs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// In-neighbours (CSC): a node aggregates the sources of the edges that point to it.
    In,
    /// Out-neighbours (CSR).
    Out,
}

/// Read access to neighbour lists, all the sampler needs: the in-memory [`Topology`], or a
/// view that lays mutations over it (the graph service's overlay).
pub trait Adjacency: Sync {
    /// Node ids are `0..num_nodes()`.
    fn num_nodes(&self) -> usize;
    /// Neighbours of `v` (`v < num_nodes()`), in a fixed order: sampling picks positions.
    fn neighbors(&self, v: u32) -> &[u32];
}

impl Adjacency for Topology {
    fn num_nodes(&self) -> usize {
        Topology::num_nodes(self)
    }

    fn neighbors(&self, v: u32) -> &[u32] {
        Topology::neighbors(self, v)
    }
}

impl<A: Adjacency + Send + ?Sized> Adjacency for std::sync::Arc<A> {
    fn num_nodes(&self) -> usize {
        (**self).num_nodes()
    }

    fn neighbors(&self, v: u32) -> &[u32] {
        (**self).neighbors(v)
    }
}

/// Compressed adjacency: the neighbours of `v` are `indices[indptr[v]..indptr[v + 1]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub indptr: Vec<u64>,
    pub indices: Vec<u32>,
}

impl Topology {
    /// Builds from arrays already in memory; checks that they describe a graph.
    pub fn new(indptr: Vec<u64>, indices: Vec<u32>) -> Result<Topology> {
        let bad = |m: String| Err(GraphError::Config(format!("topology: {m}")));
        if indptr.is_empty() || indptr[0] != 0 {
            return bad("indptr must start with 0".into());
        }
        if let Some(i) = indptr.windows(2).position(|w| w[0] > w[1]) {
            return bad(format!("indptr decreases at node {i}"));
        }
        if *indptr.last().unwrap() != indices.len() as u64 {
            return bad(format!(
                "indptr ends at {} but there are {} indices",
                indptr.last().unwrap(),
                indices.len()
            ));
        }
        let n = (indptr.len() - 1) as u64;
        if let Some(&v) = indices.iter().find(|&&v| v as u64 >= n) {
            return bad(format!("neighbour {v} is out of range ({n} nodes)"));
        }
        Ok(Topology { indptr, indices })
    }

    /// Loads the store's CSC (`Direction::In`) or CSR into memory.
    pub fn load(store: &Store, direction: Direction) -> Result<Topology> {
        let prefix = match direction {
            Direction::In => "csc",
            Direction::Out => "csr",
        };
        let graph = &store.manifest().graph;
        if graph.num_nodes > u32::MAX as u64 {
            return Err(GraphError::Config(format!(
                "{}: {} nodes; the GNN data path handles at most {} (32-bit node ids)",
                store.path().display(),
                graph.num_nodes,
                u32::MAX
            )));
        }
        let (indptr_name, indices_name) = (format!("{prefix}_indptr"), format!("{prefix}_indices"));
        let indptr = read_ints(&store.array_path(&indptr_name)?)?;
        let indices = read_ints(&store.array_path(&indices_name)?)?;
        // The checks Topology::new makes, with the store's arrays and rows named.
        let mut offsets = IndptrCheck::array(store, &indptr_name, indices.len() as u64)?;
        offsets.check(&indptr)?;
        offsets.finish()?;
        let field = match direction {
            Direction::In => "src",
            Direction::Out => "dst",
        };
        IdCheck::nodes(store, &indices_name, field)?.check(&indices)?;
        Ok(Topology {
            indptr: indptr.into_iter().map(|x| x as u64).collect(),
            indices: indices.into_iter().map(|x| x as u32).collect(),
        })
    }

    pub fn num_nodes(&self) -> usize {
        self.indptr.len() - 1
    }

    pub fn num_edges(&self) -> u64 {
        self.indices.len() as u64
    }

    /// Neighbours of `v`.
    pub fn neighbors(&self, v: u32) -> &[u32] {
        let (a, b) = (self.indptr[v as usize], self.indptr[v as usize + 1]);
        &self.indices[a as usize..b as usize]
    }

    pub fn degree(&self, v: u32) -> u64 {
        self.indptr[v as usize + 1] - self.indptr[v as usize]
    }

    /// Bytes held in memory.
    pub fn bytes(&self) -> u64 {
        self.indptr.len() as u64 * 8 + self.indices.len() as u64 * 4
    }
}

fn read_ints(path: &Path) -> Result<Vec<i64>> {
    let (header, bytes) = read_all_bytes(path)?;
    if !matches!(header.dtype, DType::I32 | DType::I64) {
        return Err(GraphError::Config(format!(
            "{}: expected int32 or int64, found {:?}",
            path.display(),
            header.dtype
        )));
    }
    let mut out = Vec::with_capacity(header.len() as usize);
    decode_ints(&bytes, header.dtype, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_inconsistent_arrays() {
        assert!(Topology::new(vec![0, 2, 1], vec![0]).is_err());
        assert!(Topology::new(vec![0, 1], vec![]).is_err());
        assert!(Topology::new(vec![0, 1], vec![5]).is_err());
        let t = Topology::new(vec![0, 2, 3], vec![1, 0, 0]).unwrap();
        assert_eq!(t.neighbors(0), &[1, 0]);
        assert_eq!(t.degree(1), 1);
        assert_eq!(t.bytes(), 3 * 8 + 3 * 4);
    }
}
