//! The memory plan: how a byte budget splits between the buffer, edge pieces, scratch and evaluation.

pub(crate) mod budget;
pub(crate) mod store_plan;
