//! The plan `strata embed train` makes for a store, without training (`strata info --memory`):
//! the engine's one `plan_for(store, &section)`.

use std::path::Path;

use strata_store::budget::{Planned, Planning};
use strata_store::Store;

use crate::config::TrainConfig;
use crate::error::{EmbedError, Result};
use crate::model::ScoreModel;
use crate::plan::budget::{plan_fitting, EmbedPlan};
use crate::plan::device::DeviceBudget;
use crate::storage::entity_types::node_shape;
use crate::storage::epoch_io::{ROW_BYTES, WEIGHT_BYTES};
use crate::storage::partitioning::WEIGHTS;

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
        Ok(plan) => Ok(Planning::Plan(
            with_kept_data(plan, cfg, &store, true).memory_plan(),
        )),
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

/// `plan` holding `store`'s training edges in memory after their first read, then the evicted
/// partitions, where it has room for them ([`EmbedPlan::keep_edges`],
/// [`EmbedPlan::keep_partitions`]); `alone`: the process is not a rank of a group.
pub(crate) fn with_kept_data(
    plan: EmbedPlan,
    cfg: &TrainConfig,
    store: &Store,
    alone: bool,
) -> EmbedPlan {
    let rows = store.array("edges_train").map_or(0, |a| a.shape[0]);
    let weighted = cfg.edge_weights && store.array(WEIGHTS).is_some();
    let row_bytes = ROW_BYTES + if weighted { WEIGHT_BYTES } else { 0 };
    plan.keep_edges(cfg, alone, rows, row_bytes)
        .keep_partitions(cfg, alone)
}
