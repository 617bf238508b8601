//! Input formats as plugins (after PyTorch-BigGraph's `EdgelistReader`): each format is a unit
//! type in a file of its own implementing [`EdgeSource`] and registered by one line in
//! [`InputFormat`]. A format says whether some inputs look like it ([`EdgeSource::detect`]),
//! what it will read of them ([`EdgeSource::plan`]: the files by role, their sizes, the
//! options it takes), and reads them: into a store ([`EdgeSource::convert`], for
//! `strata convert`) or as a bounded stream of edge batches ([`EdgeSource::open`], for
//! engines that read an edge list once, such as a grid built straight from its input).
//!
//! The formats are written in the vocabulary of [`plugin`] (the trait, the plan), below them;
//! this module is the registry above them, with `auto` (the registry's own choice: the first
//! format that recognises the inputs). `strata convert`'s options are the one checked
//! `[convert]` section ([`ConvertOptions`]); [`plan_inputs`] plans them and [`convert`] runs
//! the plan.

mod bin32;
mod numpy;
mod parquet;
mod planetoid;
pub(crate) mod plugin;
mod text;

use std::path::{Path, PathBuf};

use schemars::JsonSchema;

use super::edges::EdgeInput;
use super::options::{Delimiter, FormatName};
use super::text_job::EdgeTypeFile;
use super::{ConvertOptions, GraphOptions, Summary};
use crate::config::{ConfigError, Section};
use crate::error::{Result, StoreError};
use crate::registry::Named;
use strata_io::progress::Progress;

use plugin::{missing, usage};
pub use plugin::{EdgeSource, Inputs, SourcePlan};

crate::registry! {
    /// An input format (registered by name; see [`EdgeSource`]). Detection asks the formats
    /// in this order and takes the first that recognises the inputs, so `text`, which takes
    /// anything, comes last.
    pub enum InputFormat: dyn EdgeSource, "input format", "input format" {
        self::Auto,
        planetoid::Planetoid,
        numpy::Numpy,
        parquet::Parquet,
        bin32::Bin32,
        text::Text,
    }
}

/// `auto`: the first registered format that recognises the inputs. It lives with the
/// registry it asks; a plan names the format it picked, never `auto`.
#[derive(Debug)]
pub struct Auto;

impl Named for Auto {
    const NAME: &'static str = "auto";
    const HELP: &'static str = "decided from the file names and contents";
}

impl EdgeSource for Auto {
    fn detect(&self, _: &Inputs) -> bool {
        false
    }

    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan> {
        let format = InputFormat::ALL
            .iter()
            .copied()
            .filter(|f| *f != InputFormat::Auto)
            .find(|f| f.get().detect(inputs))
            .unwrap_or(InputFormat::Text);
        format.get().plan(inputs, opts)
    }

    fn convert(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        graph: GraphOptions,
        progress: &dyn Progress,
    ) -> Result<Summary> {
        plan.source.convert(plan, opts, graph, progress)
    }
}

/// The format `name` names (checked with the section; see `Section::validate`).
fn chosen(name: &FormatName) -> Result<InputFormat> {
    name.as_str()
        .parse()
        .map_err(|e: crate::registry::UnknownName| StoreError::option("format", e.to_string()))
}

impl From<InputFormat> for FormatName {
    fn from(f: InputFormat) -> FormatName {
        FormatName(f.name().into())
    }
}

impl JsonSchema for FormatName {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        InputFormat::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        InputFormat::json_schema(generator)
    }
}

impl GraphOptions {
    /// The shared options of the `[convert]` section `opts`; `provenance` is what the front
    /// end wants recorded in the manifest.
    pub fn from_section(opts: &ConvertOptions, provenance: serde_json::Value) -> GraphOptions {
        GraphOptions {
            out: opts.out.clone(),
            name: opts.name.clone(),
            overwrite: opts.overwrite,
            memory: opts.memory,
            threads: opts.threads,
            symmetrize: opts.symmetrize,
            split: opts.split.map(|f| f.0),
            seed: opts.seed,
            num_nodes: opts.num_nodes,
            num_relations: opts.num_relations,
            io_chunk: opts.io_chunk,
            provenance,
        }
    }
}

/// Decides the format and the role of each input from the `[convert]` section and the files.
pub fn plan_inputs(opts: &ConvertOptions) -> Result<SourcePlan> {
    let plan = if !opts.edges_of.is_empty() {
        plan_edges_of(opts)?
    } else {
        plan_given(opts)?
    };
    check_options(&plan, opts)?;
    Ok(plan.with_sizes())
}

fn plan_given(opts: &ConvertOptions) -> Result<SourcePlan> {
    if opts.inputs.is_empty() {
        return Err(usage(
            "convert: no input given (a file, several files, or a directory)",
        ));
    }
    let format = chosen(&opts.format)?;
    let prefix_ok = matches!(format, InputFormat::Auto | InputFormat::Planetoid);
    for p in opts.inputs.iter().chain(&opts.valid).chain(&opts.test) {
        // A Planetoid prefix (`DIR/ind.NAME`) names files, not itself.
        let prefix = || planetoid::Planetoid.detect(&Inputs::file(p, opts));
        if !(p.exists() || prefix_ok && prefix()) {
            return Err(missing(p, "no such file or directory"));
        }
    }
    let inputs = if opts.inputs.len() == 1 && opts.inputs[0].is_dir() {
        Inputs {
            files: &[],
            dir: Some(&opts.inputs[0]),
            opts,
        }
    } else {
        if opts.inputs.iter().any(|p| p.is_dir()) {
            return Err(usage("convert: give one directory, or files, not both"));
        }
        Inputs {
            files: &opts.inputs,
            dir: None,
            opts,
        }
    };
    format.get().plan(&inputs, opts)
}

/// The plan of `--edges-of SRC_TYPE:RELATION:DST_TYPE=FILE` files (GraphBolt's
/// `src:relation:dst` edge type strings; commas would split the list option): text, or
/// Parquet when a file is named like one.
fn plan_edges_of(opts: &ConvertOptions) -> Result<SourcePlan> {
    if !opts.inputs.is_empty() || !opts.valid.is_empty() || !opts.test.is_empty() {
        return Err(usage(
            "convert: --edges-of files hold the train edges: give no input, --valid or --test files beside them (--split makes a random split)",
        ));
    }
    let mut files = Vec::new();
    for spec in &opts.edges_of {
        let (triple, path) = spec.split_once('=').unwrap_or((spec, ""));
        let names: Vec<&str> = triple.split(':').collect();
        if !spec.contains('=')
            || path.is_empty()
            || names.len() != 3
            || names.iter().any(|n| n.is_empty())
        {
            return Err(usage(format!(
                "convert.edges_of: expected SRC_TYPE:RELATION:DST_TYPE=FILE, got '{spec}'"
            )));
        }
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(missing(
                &path,
                format!("no such file (convert.edges_of '{spec}')"),
            ));
        }
        files.push(EdgeTypeFile {
            path,
            edge_type: [names[0].into(), names[1].into(), names[2].into()],
        });
    }
    let parquet = files
        .iter()
        .any(|f| parquet::Parquet.detect(&Inputs::file(&f.path, opts)));
    let format = if parquet {
        InputFormat::Parquet
    } else {
        InputFormat::Text
    };
    let none = Inputs {
        files: &[],
        dir: None,
        opts,
    };
    let mut plan = format.get().plan(&none, opts)?;
    plan.edges_of = files;
    Ok(plan)
}

/// Refuses format-specific options given to a format that does not read them, and edge files
/// that mix text and Parquet.
fn check_options(plan: &SourcePlan, opts: &ConvertOptions) -> Result<()> {
    let takes = |o: &str| plan.options.contains(&o);
    let text_options = opts.header || opts.delimiter != Delimiter::Auto || opts.comment != "#";
    if text_options && !takes("header") {
        return Err(usage(format!(
            "convert: --header, --delimiter and --comment apply to text inputs, not {} inputs",
            plan.kind
        )));
    }
    if plan.kind == text::Text::NAME || plan.kind == parquet::Parquet::NAME {
        parquet::check_unmixed(plan)?;
    }
    if (opts.node_types.is_some() || opts.edge_types.is_some()) && !takes("node_types") {
        return Err(usage(format!(
            "convert: --node-types and --edge-types apply to text and Parquet edge lists and typed NumPy directories, not {} inputs",
            plan.kind
        )));
    }
    if !opts.node_bags.is_empty() && !takes("node_bags") {
        return Err(usage(format!(
            "convert: --node-bags applies to typed text and Parquet edge lists, not {} inputs",
            plan.kind
        )));
    }
    match given_options(opts).into_iter().find(|(key, _)| !takes(key)) {
        Some((key, reads)) => Err(usage(format!(
            "convert: --{} would be ignored: the {} converter does not read it ({reads})",
            key.replace('_', "-"),
            plan.kind
        ))),
        None => Ok(()),
    }
}

/// The format-specific options given (set away from their defaults) that the checks above do
/// not cover: the key, and which inputs read it.
fn given_options(opts: &ConvertOptions) -> Vec<(&'static str, &'static str)> {
    const EDGE_LISTS: &str = "text and Parquet edge lists read it";
    const NODE_DATA: &str = "node features, labels and splits come with NumPy edges (a directory \
                             holding edges.npy and features.npy, ..., or --format numpy) or \
                             Planetoid files";
    let d = ConvertOptions::default();
    [
        ("columns", opts.columns != d.columns, EDGE_LISTS),
        ("relations", opts.relations, EDGE_LISTS),
        ("ids", opts.ids != d.ids, EDGE_LISTS),
        (
            "relation_ids",
            opts.relation_ids != d.relation_ids,
            EDGE_LISTS,
        ),
        (
            "layout",
            opts.layout != d.layout,
            "NumPy edge arrays read it",
        ),
        ("features", opts.features.is_some(), NODE_DATA),
        (
            "feature_dtype",
            opts.feature_dtype != d.feature_dtype,
            NODE_DATA,
        ),
        ("labels", opts.labels.is_some(), NODE_DATA),
        ("node_train", opts.node_train.is_some(), NODE_DATA),
        ("node_valid", opts.node_valid.is_some(), NODE_DATA),
        ("node_test", opts.node_test.is_some(), NODE_DATA),
        ("node_split", opts.node_split.is_some(), NODE_DATA),
    ]
    .into_iter()
    .filter(|(_, given, _)| *given)
    .map(|(key, _, reads)| (key, reads))
    .collect()
}

/// Converts the inputs of the `[convert]` section `opts` into the store `opts.out`;
/// `provenance` is what the front end records in the manifest.
pub fn convert(
    opts: &ConvertOptions,
    provenance: serde_json::Value,
    progress: &dyn Progress,
) -> Result<Summary> {
    let plan = plan_inputs(opts)?;
    let graph = GraphOptions::from_section(opts, provenance);
    plan.source.convert(&plan, opts, graph, progress)
}

/// Opens the planned train edges of a format that reads them as a stream
/// ([`EdgeSource::open`]); the others are refused, naming the formats that do.
pub fn open(
    plan: &SourcePlan,
    opts: &ConvertOptions,
    scratch: &Path,
    progress: &dyn Progress,
) -> Result<EdgeInput> {
    if !plan.source.streams() {
        return Err(StoreError::option(
            "format",
            format!(
                "{} is a {} input; only {} edge lists are read as a stream: convert it into a store first (`strata convert`)",
                plan.first_input().display(),
                plan.kind,
                streamable().join(", ")
            ),
        ));
    }
    plan.source.open(plan, opts, scratch, progress)
}

/// The formats [`EdgeSource::open`] reads, by name.
pub fn streamable() -> Vec<&'static str> {
    InputFormat::ALL
        .iter()
        .filter(|f| f.get().streams())
        .map(|f| f.name())
        .collect()
}

impl Section for ConvertOptions {
    const NAME: &'static str = "convert";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        let refuse = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
        if let Err(e) = self.format.as_str().parse::<InputFormat>() {
            return refuse("format", e.serde_message());
        }
        if self.out.as_os_str().is_empty() {
            return refuse("out", "needs a store directory to create".into());
        }
        if !self.columns.is_empty()
            && self.relations
            && !self.columns.split(',').any(|c| c.trim() == "rel")
        {
            return refuse(
                "columns",
                format!("--relations needs a 'rel' column, got '{}'", self.columns),
            );
        }
        if self.split.is_some() && !(self.valid.is_empty() && self.test.is_empty()) {
            return refuse(
                "split",
                "a random split cannot be combined with --valid/--test files".into(),
            );
        }
        if self.io_chunk.0 == 0 || !self.io_chunk.0.is_multiple_of(strata_io::ALIGN as u64) {
            return refuse(
                "io_chunk",
                format!(
                    "must be a positive multiple of 4096, got {}",
                    self.io_chunk.0
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
