//! The plan `strata serve` makes for a store, without serving it (`strata info --memory`): the
//! engine's one `plan_for(store, &section)`.

use std::path::Path;

use strata_store::budget::Planning;

use crate::budget::{plan, Registered};
use crate::config::ServeOptions;
use crate::error::Result;
use crate::memory::store_graph_bytes;

/// The plan `strata serve` makes at start with `options` and `store`'s graph registered. A
/// budget below the server's minimum is [`Planning::Refused`]; errors: the store's manifest
/// cannot be read.
pub fn plan_for(store: &Path, options: &ServeOptions) -> Result<Planning> {
    let registered = Registered {
        graphs: store_graph_bytes(store)?,
        ..Default::default()
    };
    let max_message = usize::try_from(options.max_message.0).unwrap_or(usize::MAX);
    Ok(
        match plan(
            options.memory.0,
            registered,
            options.embedding_cache,
            max_message,
        ) {
            Ok(p) => Planning::of(&p),
            Err(e) => Planning::Refused(e.to_string()),
        },
    )
}
