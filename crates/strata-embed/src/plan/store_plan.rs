//! The plan `strata embed train` makes for a store, without training (`strata info --memory`):
//! the engine's one `plan_for(store, &section)`.

use std::path::Path;

use strata_store::budget::{Planned, Planning};
use strata_store::Store;

use crate::config::TrainConfig;
use crate::error::{EmbedError, Result};
use crate::model::ScoreModel;
use crate::plan::budget::plan_fitting;
use crate::plan::device::DeviceBudget;
use crate::storage::entity_types::node_shape;

/// The plan a single-process run of `cfg` on `store` starts with: the store's node shape
/// (typed or not) and relation count, `cfg`'s model. A budget below the minimum is
/// [`Planning::Refused`]; errors: the store cannot be opened, or its entity types do not
/// fit `cfg`.
pub fn plan_for(store: &Path, cfg: &TrainConfig) -> Result<Planning> {
    let store = Store::open(store)?;
    let cfg = &planned_config(cfg, &store);
    let shape = node_shape(&store, cfg)?;
    let model = ScoreModel {
        kind: cfg.model,
        dim: cfg.dim,
        transe_norm: cfg.transe_norm,
        pbg: cfg.pbg_form(),
    };
    let num_relations = store.manifest().graph.num_relations;
    // A device run's partitions are those whose slots fit both budgets.
    let device = DeviceBudget::of(cfg)?;
    match plan_fitting(cfg, &model, &shape, num_relations, None, device.as_ref()) {
        Ok(plan) => Ok(Planning::Plan(plan.memory_plan())),
        Err(EmbedError::Budget(why)) => Ok(Planning::Refused(why)),
        Err(e) => Err(e),
    }
}

/// `cfg` as training plans it on `store`: the write-behind copy hides its write behind
/// validation, so a run that never validates (`eval_every = 0`, or a store without a
/// validation split) plans none.
pub(crate) fn planned_config(cfg: &TrainConfig, store: &Store) -> TrainConfig {
    let validates = cfg.eval_every > 0 && store.array("edges_valid").is_some();
    TrainConfig {
        write_behind: cfg.write_behind && validates,
        ..cfg.clone()
    }
}
