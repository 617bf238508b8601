//! The layers of a loaded model: which tensors each architecture needs (the names and shapes
//! of `strata.gnn.models.GNN.state_dict()`), checked against a weights file and turned into
//! linear layers in the served precision.
//!
//! Each layer kind is a unit type in a file of its own implementing [`LayerKind`] (its
//! tensors, and building a [`Layer`] from them), registered in [`super::ModelKind`]; the
//! layer it builds runs its own kernel ([`Layer::forward`]), over the aggregations of
//! [`super::kernels`].
//!
//! Tensor names, for layer `i` with input width `d_in` and output width `d_out`
//! (`torch.nn.Linear` weights are `(out, in)`):
//!
//! | kind | tensors of `convs.{i}` |
//! |---|---|
//! | sage | `self_lin.weight (d_out, d_in)`, `self_lin.bias (d_out)`, `neigh_lin.weight (d_out, d_in)` |
//! | sage_pool | the three of sage, `pool_lin.weight (d_in, d_in)`, `pool_lin.bias (d_in)` |
//! | gcn | `lin.weight (d_out, d_in)`, `lin.bias (d_out)` |
//! | gin | `lin1.weight (d_out, d_in)`, `lin1.bias (d_out)`, `lin2.weight (d_out, d_out)`, `lin2.bias (d_out)`, `eps ()` |

pub(super) mod gcn;
pub(super) mod gin;
mod kind;
mod linear;
pub(super) mod sage;
pub(super) mod sage_pool;

pub use kind::{Layer, LayerKind};
pub use linear::{Linear, Weight};
