//! `parquet`: Apache Parquet edge tables (`.parquet`, `.pq`). They are read through pyarrow
//! (the `parquet` extra), so the front end stages each one as CSV, one record batch at a time,
//! and converts those as text.

use super::plugin::{
    plan_split_dir, split_files, staged_by_front_end, usage, EdgeSource, Inputs, SourcePlan,
};
use super::text::Text;
use crate::convert::{ConvertOptions, GraphOptions, Summary};
use crate::error::Result;
use crate::registry::Named;
use strata_io::progress::Progress;

#[derive(Debug)]
pub struct Parquet;

impl Named for Parquet {
    const NAME: &'static str = "parquet";
    const HELP: &'static str =
        "Apache Parquet edge tables, read through pyarrow (the parquet extra)";
}

/// Whether `path` is named like a Parquet file.
fn is_parquet(path: &std::path::Path) -> bool {
    path.extension()
        .map(|e| e.to_string_lossy().to_lowercase())
        .is_some_and(|e| e == "parquet" || e == "pq")
}

/// Refuses a text or Parquet plan whose edge files mix the two: the front end stages every
/// file of a Parquet plan through pyarrow, and the text converter would read a Parquet file's
/// bytes as lines.
pub(super) fn check_unmixed(plan: &SourcePlan) -> Result<()> {
    let files = plan.edges_of.iter().map(|e| &e.path);
    let mut files = files
        .chain(&plan.train)
        .chain(&plan.valid)
        .chain(&plan.test);
    let parquet = plan.kind == Parquet::NAME;
    match files.find(|p| is_parquet(p) != parquet) {
        Some(odd) => Err(usage(format!(
            "convert: give Parquet files only, or text files only; {} {}",
            odd.display(),
            if parquet {
                "is not Parquet"
            } else {
                "is Parquet"
            }
        ))),
        None => Ok(()),
    }
}

/// What a Parquet conversion reads beside the shared options (the text converter's, which
/// reads the staged CSV).
const OPTIONS: &[&str] = &[
    "columns",
    "relations",
    "ids",
    "relation_ids",
    "node_types",
    "edge_types",
    "edges_of",
    "node_bags",
];

impl EdgeSource for Parquet {
    fn detect(&self, inputs: &Inputs) -> bool {
        match inputs.dir {
            Some(dir) => split_files(dir)
                .is_ok_and(|[train, ..]| !train.is_empty() && train.iter().all(|p| is_parquet(p))),
            None => inputs.files.iter().all(|p| is_parquet(p)),
        }
    }

    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan> {
        let mut plan = match inputs.dir {
            Some(dir) => {
                let plan = plan_split_dir(&Parquet, dir, opts)?;
                if !plan.train.iter().all(|p| is_parquet(p)) {
                    // A directory of text split files asked for as Parquet reads as text.
                    return Text.plan(inputs, opts);
                }
                plan
            }
            None => SourcePlan::edges(
                &Parquet,
                inputs.files.to_vec(),
                opts.valid.clone(),
                opts.test.clone(),
            ),
        };
        plan.options = OPTIONS;
        plan.staged_as = Some(Text::NAME);
        Ok(plan)
    }

    fn convert(
        &self,
        plan: &SourcePlan,
        _: &ConvertOptions,
        _: GraphOptions,
        _: &dyn Progress,
    ) -> Result<Summary> {
        Err(staged_by_front_end(plan))
    }
}
