//! The memory plan: how a byte budget splits between the buffer, edge pieces, scratch and evaluation (`budget`), and a torch device's budget beside it (`device`).

pub(crate) mod budget;
pub(crate) mod device;
pub(crate) mod store_plan;
