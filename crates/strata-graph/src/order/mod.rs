//! Locality-aware node orders: each a pure function from a graph's topology to a renumbering of
//! its nodes, so that nodes read together get nearby ids (and share feature pages). `strata
//! reorder` writes a store renumbered by one of them; the graph service registers a store in
//! the [`glist`] order.
//!
//! An order is a unit type implementing [`NodeOrder`], in a file of its own, listed once in
//! [`OrderKind`]'s registry line. The breadth-first traversal ([`Bfs`]) and the
//! label-propagation vote ([`most_frequent`]) are shared: by the orders here, and the vote by
//! the grid's label propagation.

mod community;
mod degree;
pub mod glist;
mod shared;
mod traverse;

pub use community::{communities, COMMUNITY_ROUNDS};
pub use shared::{inverse, mean_span, most_frequent, Input, NodeOrder};
pub use traverse::{Bfs, Expand};

strata_store::registry! {
    /// Which node order (registered by name; see [`NodeOrder`]).
    pub enum OrderKind: dyn NodeOrder, "order", "the node order" {
        degree::Degree,
        traverse::BreadthFirst,
        traverse::CuthillMcKee,
        glist::Glist,
        community::Community,
    }
}

#[cfg(test)]
mod tests;
