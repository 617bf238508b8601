//! The graph's adjacency in RAM (GIDS §3.5, Helios §3.2: topology accesses are 4-8 bytes, far
//! below a page, so it never goes to the SSD).

use std::path::Path;

use strata_store::array::{decode_f32, decode_ints, read_all_bytes};
use strata_store::ids::{IdCheck, IndptrCheck};
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
    /// The edge columns [`Adjacency::edges`] carries; none unless the adjacency overrides it.
    fn columns(&self) -> ColumnSet {
        ColumnSet::default()
    }
    /// `v`'s edges with the columns of [`Adjacency::columns`], each parallel to
    /// `neighbors(v)`; a column the adjacency lacks is an empty slice.
    fn edges(&self, v: u32) -> Edges<'_> {
        Edges {
            neighbors: self.neighbors(v),
            ..Edges::default()
        }
    }
}

impl Adjacency for Topology {
    fn num_nodes(&self) -> usize {
        Topology::num_nodes(self)
    }

    fn neighbors(&self, v: u32) -> &[u32] {
        Topology::neighbors(self, v)
    }

    fn columns(&self) -> ColumnSet {
        let c = &self.columns;
        ColumnSet {
            weights: c.weights.is_some(),
            times: c.times.is_some(),
            edge_types: c.types.as_ref().map_or(0, |_| c.num_types),
            ids: c.ids.is_some(),
        }
    }

    fn edges(&self, v: u32) -> Edges<'_> {
        let (a, b) = (
            self.indptr[v as usize] as usize,
            self.indptr[v as usize + 1] as usize,
        );
        let c = &self.columns;
        Edges {
            neighbors: &self.indices[a..b],
            weights: segment(&c.weights, a, b),
            times: segment(&c.times, a, b),
            types: segment(&c.types, a, b),
            ids: segment(&c.ids, a, b),
        }
    }
}

impl<A: Adjacency + Send + ?Sized> Adjacency for std::sync::Arc<A> {
    fn num_nodes(&self) -> usize {
        (**self).num_nodes()
    }

    fn neighbors(&self, v: u32) -> &[u32] {
        (**self).neighbors(v)
    }

    fn columns(&self) -> ColumnSet {
        (**self).columns()
    }

    fn edges(&self, v: u32) -> Edges<'_> {
        (**self).edges(v)
    }
}

/// Entries `a..b` of an optional column; empty when the column is absent.
fn segment<T>(column: &Option<Vec<T>>, a: usize, b: usize) -> &[T] {
    column.as_ref().map_or(&[], |c| &c[a..b])
}

/// Which per-edge columns an adjacency carries besides the neighbours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColumnSet {
    /// float32 edge weights.
    pub weights: bool,
    /// int64 edge times.
    pub times: bool,
    /// Number of edge types when it carries each edge's type; 0 when it does not.
    pub edge_types: usize,
    /// Each edge's id: its row in the store's `edges_train` (`csc_eid`/`csr_eid`).
    pub ids: bool,
}

/// One node's edges: its neighbours and the columns parallel to them (empty when absent). In
/// a store's CSC a segment is ordered by (edge type, edge id), so each type is one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Edges<'a> {
    pub neighbors: &'a [u32],
    pub weights: &'a [f32],
    pub times: &'a [i64],
    pub types: &'a [u32],
    pub ids: &'a [u64],
}

/// Per-edge columns held with a [`Topology`], each parallel to its `indices`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeColumns {
    /// Non-negative finite weights (a store's `csc_weights`/`csr_weights`).
    pub weights: Option<Vec<f32>>,
    /// Times in the user's unit (`csc_times`/`csr_times`).
    pub times: Option<Vec<i64>>,
    /// Edge-type ids, each `< num_types` (`csc_etype`/`csr_etype`).
    pub types: Option<Vec<u32>>,
    /// Number of edge types (the manifest's `edge_types`); 0 without `types`.
    pub num_types: usize,
    /// Edge ids, rows of the store's `edges_train` (`csc_eid`/`csr_eid`).
    pub ids: Option<Vec<u64>>,
}

impl EdgeColumns {
    fn bytes(&self) -> u64 {
        let len = |n: Option<usize>, size: u64| n.unwrap_or(0) as u64 * size;
        len(self.weights.as_ref().map(Vec::len), 4)
            + len(self.times.as_ref().map(Vec::len), 8)
            + len(self.types.as_ref().map(Vec::len), 4)
            + len(self.ids.as_ref().map(Vec::len), 8)
    }
}

/// Compressed adjacency: the neighbours of `v` are `indices[indptr[v]..indptr[v + 1]]`, with
/// optional per-edge columns parallel to `indices`.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub indptr: Vec<u64>,
    pub indices: Vec<u32>,
    pub columns: EdgeColumns,
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
        Ok(Topology {
            indptr,
            indices,
            columns: EdgeColumns::default(),
        })
    }

    /// This topology with `columns`, checked: each column has one entry per edge, weights
    /// are finite and non-negative, types are below `num_types`.
    pub fn with_columns(mut self, columns: EdgeColumns) -> Result<Topology> {
        let e = self.indices.len();
        let bad = |m: String| Err(GraphError::Config(format!("topology: {m}")));
        let lens = [
            ("weights", columns.weights.as_ref().map(Vec::len)),
            ("times", columns.times.as_ref().map(Vec::len)),
            ("types", columns.types.as_ref().map(Vec::len)),
            ("ids", columns.ids.as_ref().map(Vec::len)),
        ];
        for (name, len) in lens {
            if let Some(len) = len.filter(|&len| len != e) {
                return bad(format!("{len} edge {name} for {e} edges"));
            }
        }
        if let Some(w) = columns
            .weights
            .iter()
            .flatten()
            .find(|w| !(w.is_finite() && **w >= 0.0))
        {
            return bad(format!(
                "edge weight {w} is not a finite non-negative number"
            ));
        }
        let num_types = columns.num_types;
        if let Some(t) = columns
            .types
            .iter()
            .flatten()
            .find(|&&t| t as usize >= num_types)
        {
            return bad(format!(
                "edge type {t} is out of range ({num_types} edge types)"
            ));
        }
        // The sampler finds a type's edges by binary search of the node's segment.
        if let Some(types) = &columns.types {
            let unsorted = self.indptr.windows(2).position(|w| {
                types[w[0] as usize..w[1] as usize]
                    .windows(2)
                    .any(|p| p[0] > p[1])
            });
            if let Some(v) = unsorted {
                return bad(format!(
                    "the edge types of node {v} are not in increasing order"
                ));
            }
        }
        self.columns = columns;
        Ok(self)
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
            columns: EdgeColumns::default(),
        })
    }

    /// Loads the store's CSC (`Direction::In`) or CSR with the edge columns in `wanted`
    /// (`edge_types` > 0 asks for the types). A column the store lacks is an error naming
    /// the column and how a store gets it; `strata check` validates the columns' values, and
    /// [`Topology::with_columns`] checks them again here.
    pub fn load_with(store: &Store, direction: Direction, wanted: ColumnSet) -> Result<Topology> {
        let topo = Topology::load(store, direction)?;
        let prefix = match direction {
            Direction::In => "csc",
            Direction::Out => "csr",
        };
        let m = store.manifest();
        let attrs = m.edge_attributes.clone().unwrap_or_default();
        let missing = |what: &str, how: &str| {
            GraphError::Config(format!(
                "{}: the store has no edge {what}; {how}",
                store.path().display()
            ))
        };
        let mut columns = EdgeColumns::default();
        if wanted.weights {
            if !attrs.weights {
                return Err(missing("weights", "convert with --columns src,dst,weight"));
            }
            let (header, bytes) = read_all_bytes(&store.array_path(&format!("{prefix}_weights"))?)?;
            let mut w = Vec::with_capacity(header.len() as usize);
            decode_f32(&bytes, header.dtype, &mut w);
            columns.weights = Some(w);
        }
        if wanted.times {
            if !attrs.times {
                return Err(missing("times", "convert with --columns src,dst,time"));
            }
            columns.times = Some(read_ints(&store.array_path(&format!("{prefix}_times"))?)?);
        }
        if wanted.edge_types > 0 {
            if !m.is_typed() {
                return Err(missing(
                    "types",
                    "convert with --node-types FILE --edge-types FILE",
                ));
            }
            let types = read_ints(&store.array_path(&format!("{prefix}_etype"))?)?;
            columns.types = Some(types.into_iter().map(|t| t as u32).collect());
            columns.num_types = m.edge_types.len();
        }
        if wanted.ids {
            if m.required_version() < 2 {
                return Err(missing(
                    "ids (a format-1 store: its edges have no attributes or types)",
                    "convert with an edge attribute column (--columns src,dst,weight) or with edge types",
                ));
            }
            let path = store.array_path(&format!("{prefix}_eid"))?;
            let train = m.graph.num_edges.get("train").copied().unwrap_or(0);
            let ids = read_ints(&path)?;
            if let Some((at, id)) = ids
                .iter()
                .enumerate()
                .find(|(_, &i)| i < 0 || i as u64 >= train)
            {
                return Err(GraphError::Config(format!(
                    "{} row {at}: edge id {id} is out of range [0, {train}) (the train edges)",
                    path.display()
                )));
            }
            columns.ids = Some(ids.into_iter().map(|i| i as u64).collect());
        }
        topo.with_columns(columns)
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

    /// Bytes held in memory, edge columns included.
    pub fn bytes(&self) -> u64 {
        self.indptr.len() as u64 * 8 + self.indices.len() as u64 * 4 + self.columns.bytes()
    }
}

fn read_ints(path: &Path) -> Result<Vec<i64>> {
    let (header, bytes) = read_all_bytes(path)?;
    if !header.dtype.is_int() {
        return Err(GraphError::Config(format!(
            "{}: expected integers, found {:?}",
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
