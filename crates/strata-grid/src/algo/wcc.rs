//! Weakly connected components by min-label propagation over a symmetric grid: a vertex's
//! label is the smallest id of its component when no label changes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::frontier::{Frontier, MinLabel};
use super::{chunk_bases, frontier_loop, Algorithm, Ctx, IterationValue, Output, Values};
use crate::error::{GridError, Result};
use crate::stream::Streamer;
use crate::vertex::{Bitmap, U64Array};

/// Weakly connected components (no parameters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Wcc {}

impl Algorithm for Wcc {
    const NAME: &'static str = "wcc";
    const ABOUT: &'static str = "weakly connected components, on a symmetric grid";
    const ARRAYS: &'static [&'static str] = &["component"];
    const VALUE: IterationValue = IterationValue::Count("activated");

    /// The label (u64) and two bitmaps.
    fn vertex_bytes(&self) -> u64 {
        9
    }

    fn needs_symmetric(&self) -> bool {
        true
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        if !s.grid().manifest().symmetric {
            return Err(GridError::config(
                "grid",
                "wcc needs a symmetric grid (strata grid build --symmetrize)",
            ));
        }
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let label = U64Array::from_fn(s.vertex(), n, |v| v as u64)?;
        let (frontier, next) = (Bitmap::full(n), Bitmap::new(n));
        let kernel = Frontier {
            frontier: &frontier,
            next: &next,
            base: &base,
            step: MinLabel { label: &label },
        };
        let iterations = frontier_loop(
            s,
            ctx,
            &frontier,
            &next,
            &kernel,
            &[&label],
            &[&label],
            |_| {},
        )?;
        let components = (0..n).filter(|&v| label.get(v) == v as u64).count();
        let mut summary = serde_json::Map::new();
        summary.insert("components".into(), components.into());
        Ok(Output {
            arrays: vec![("component".into(), Values::Ids(label))],
            summary,
            iterations,
        })
    }
}
