//! `auto`: the first registered format that recognises the inputs.

use super::{EdgeSource, InputFormat, Inputs, SourcePlan};
use crate::convert::{ConvertOptions, GraphOptions, Summary};
use crate::error::Result;
use crate::registry::Named;
use strata_io::progress::Progress;

pub struct Auto;

impl Named for Auto {
    const NAME: &'static str = "auto";
    const HELP: &'static str = "decided from the file names and contents";
}

impl Auto {
    /// The first registered format that recognises `inputs` (`text` takes anything).
    fn pick(inputs: &Inputs) -> InputFormat {
        InputFormat::ALL
            .iter()
            .copied()
            .filter(|f| *f != InputFormat::Auto)
            .find(|f| f.get().detect(inputs))
            .unwrap_or(InputFormat::Text)
    }
}

impl EdgeSource for Auto {
    fn detect(&self, _: &Inputs) -> bool {
        false
    }

    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan> {
        Auto::pick(inputs).get().plan(inputs, opts)
    }

    fn convert(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        graph: GraphOptions,
        progress: &dyn Progress,
    ) -> Result<Summary> {
        // A plan names the format it detected, never `auto`.
        plan.format.get().convert(plan, opts, graph, progress)
    }
}
