//! End-to-end tests of the rooms together: stores converted from text, trained, evaluated,
//! exported and used to start incremental runs.

mod all_entities;
mod incremental;
mod loss_options;
mod schedules;
mod train_eval;

use crate::config::TrainConfig;
use strata_store::config::Section;

/// The key `validate` names for `cfg`, if it refuses it.
pub(crate) fn refused_key(cfg: TrainConfig) -> Option<String> {
    cfg.validate().err().map(|e| e.key)
}
