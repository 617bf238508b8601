//! Breadth-first traversal, shared by the `bfs` and `rcm` orders (all hops, one search per
//! component) and by the `glist` order (a few hops around each centre, searches independent).

use strata_store::registry::Named;

use super::shared::{by_decreasing_degree, sorted_by};
use super::{Input, NodeOrder};
use crate::error::Result;
use crate::topology::Adjacency;
use crate::Topology;

/// In which order a search takes a node's unvisited neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expand {
    /// As its neighbour list names them.
    AsListed,
    /// By increasing degree, then id (Cuthill-McKee).
    ByDegree,
}

/// Breadth-first search that reuses its buffers: [`Bfs::search`] appends to one visit order,
/// skipping nodes already visited, so consecutive searches from the roots of each component
/// traverse a whole graph; [`Bfs::run`] forgets the previous visits first (in O(1): a visit is
/// stamped with the current epoch).
pub struct Bfs {
    /// `seen[v] == epoch`: `v` was visited since the last reset.
    seen: Vec<u32>,
    epoch: u32,
    order: Vec<u32>,
    scratch: Vec<u32>,
}

impl Bfs {
    /// A search over nodes `0..n`, nothing visited. Memory: 4 bytes a node, plus 4 a visited
    /// node in the order.
    pub fn new(n: usize) -> Bfs {
        Bfs {
            seen: vec![0; n],
            epoch: 1,
            order: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Forgets every visit and empties the order.
    pub fn reset(&mut self) {
        if self.epoch == u32::MAX {
            self.seen.fill(0);
            self.epoch = 0;
        }
        self.epoch += 1;
        self.order.clear();
    }

    /// Whether `v` was visited since the last reset.
    pub fn visited(&self, v: u32) -> bool {
        self.seen[v as usize] == self.epoch
    }

    /// The nodes visited since the last reset, in visit order.
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    /// The visit order, consuming the search.
    pub fn into_order(self) -> Vec<u32> {
        self.order
    }

    fn visit(&mut self, v: u32) {
        self.seen[v as usize] = self.epoch;
        self.order.push(v);
    }

    /// Visits `root` (unless visited) and then, hop by hop up to `hops` hops, every unvisited
    /// node the previous hop's nodes reach, in the order of [`Expand`]: a node follows its
    /// earliest-visited neighbour. Appends them to [`Bfs::order`].
    pub fn search<A: Adjacency + ?Sized>(&mut self, adj: &A, root: u32, hops: u32, expand: Expand) {
        if self.visited(root) {
            return;
        }
        let mut level = self.order.len();
        self.visit(root);
        for _ in 0..hops {
            let end = self.order.len();
            for i in level..end {
                let v = self.order[i];
                match expand {
                    Expand::AsListed => {
                        for &u in adj.neighbors(v) {
                            if !self.visited(u) {
                                self.visit(u);
                            }
                        }
                    }
                    Expand::ByDegree => {
                        let mut next = std::mem::take(&mut self.scratch);
                        next.clear();
                        next.extend(adj.neighbors(v).iter().filter(|&&u| !self.visited(u)));
                        next.sort_by_key(|&u| (adj.neighbors(u).len(), u));
                        for &u in &next {
                            if !self.visited(u) {
                                self.visit(u);
                            }
                        }
                        self.scratch = next;
                    }
                }
            }
            if self.order.len() == end {
                break;
            }
            level = end;
        }
    }

    /// `root` and the nodes within `hops` hops, in breadth-first order (neighbours as listed),
    /// forgetting earlier searches.
    pub fn run<A: Adjacency + ?Sized>(&mut self, adj: &A, root: u32, hops: u32) -> &[u32] {
        self.reset();
        self.search(adj, root, hops, Expand::AsListed);
        &self.order
    }
}

/// Every node of `adj`, component by component, each component searched from the first of
/// `roots` it holds.
fn traverse(adj: &Topology, roots: &[u32], expand: Expand) -> Vec<u32> {
    let mut bfs = Bfs::new(adj.num_nodes());
    for &root in roots {
        bfs.search(adj, root, u32::MAX, expand);
    }
    bfs.into_order()
}

/// Breadth-first from the highest-degree node of each component.
pub struct BreadthFirst;

impl Named for BreadthFirst {
    const NAME: &'static str = "bfs";
    const HELP: &'static str = "breadth-first from the highest-degree node of each connected component (components in order of their highest degree), neighbours as listed: a node's neighbours get ids close to each other";
}

impl NodeOrder for BreadthFirst {
    fn input(&self) -> Input {
        Input::Undirected
    }

    /// Roots, visit stamps and the order: 4 bytes a node each.
    fn work_bytes(&self) -> (u64, u64) {
        (12, 0)
    }

    fn order(&self, adj: &Topology) -> Result<Vec<u32>> {
        Ok(traverse(adj, &by_decreasing_degree(adj), Expand::AsListed))
    }
}

/// Reverse Cuthill-McKee.
pub struct CuthillMcKee;

impl Named for CuthillMcKee {
    const NAME: &'static str = "rcm";
    const HELP: &'static str = "reverse Cuthill-McKee: breadth-first from a lowest-degree node of each component, each node's new neighbours by increasing degree, the whole order reversed; it narrows the bandwidth (largest id difference over edges) heuristically";
}

impl NodeOrder for CuthillMcKee {
    fn input(&self) -> Input {
        Input::Undirected
    }

    /// As `bfs`, plus one node's neighbours sorted at a time (at most one id an entry).
    fn work_bytes(&self) -> (u64, u64) {
        (12, 4)
    }

    fn order(&self, adj: &Topology) -> Result<Vec<u32>> {
        let roots = sorted_by(adj, |v| adj.degree(v));
        let mut order = traverse(adj, &roots, Expand::ByDegree);
        order.reverse();
        Ok(order)
    }
}
