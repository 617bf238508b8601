//! Input formats as plugins (after PyTorch-BigGraph's `EdgelistReader`): each format is a unit
//! type in a file of its own implementing [`EdgeSource`] and registered by one line in
//! [`InputFormat`]. A format says whether some inputs look like it ([`EdgeSource::detect`]),
//! what it will read of them ([`EdgeSource::plan`]: the files by role, their sizes, the
//! options it takes), and reads them: into a store ([`EdgeSource::convert`], for
//! `strata convert`) or as a bounded stream of edge batches ([`EdgeSource::open`], for
//! engines that read an edge list once, such as a grid built straight from its input).
//!
//! `strata convert`'s options are the one checked `[convert]` section ([`ConvertOptions`]);
//! [`plan_inputs`] plans them and [`convert`] runs the plan.

mod auto;
mod bin32;
mod numpy;
mod parquet;
mod planetoid;
mod text;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use schemars::JsonSchema;
use serde::Deserialize;

use super::edges::EdgeInput;
use super::text_job::EdgeTypeFile;
use super::{
    Delimiter, EdgeLayout, Fractions, GraphOptions, IdKind, InputFile, StoredFeatureDtype, Summary,
};
use crate::config::{ConfigError, Section, Size};
use crate::error::{Result, StoreError};
use strata_io::progress::Progress;

crate::registry! {
    /// An input format (registered by name; see [`EdgeSource`]). Detection asks the formats
    /// in this order and takes the first that recognises the inputs, so `text`, which takes
    /// anything, comes last.
    pub enum InputFormat: dyn EdgeSource, "input format", "input format" {
        auto::Auto,
        planetoid::Planetoid,
        numpy::Numpy,
        parquet::Parquet,
        bin32::Bin32,
        text::Text,
    }
}

/// An input format. Implementations are unit types registered in [`InputFormat`] with their
/// [`crate::registry::Named`] name (`--format NAME`) and help.
pub trait EdgeSource: Sync {
    /// Whether `inputs` look like this format (file names and suffixes, a directory's files);
    /// `--format auto` takes the first registered format that says yes.
    fn detect(&self, inputs: &Inputs) -> bool;

    /// What this format reads of `inputs` with the options `opts`: the files by role (with
    /// their sizes) and the options it takes, or why the inputs do not fit it.
    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan>;

    /// Converts the planned inputs into the store `graph.out` within `graph.memory` bytes.
    fn convert(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        graph: GraphOptions,
        progress: &dyn Progress,
    ) -> Result<Summary>;

    /// Opens the planned train edges as a stream read in bounded batches (see [`EdgeInput`]);
    /// scratch files (a parse's spool) go under `scratch`, which the caller removes. Formats
    /// without such a reader refuse, naming the ones that have one.
    fn open(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        scratch: &Path,
        progress: &dyn Progress,
    ) -> Result<EdgeInput> {
        let _ = (opts, scratch, progress);
        Err(StoreError::option(
            "format",
            format!(
                "{} is a {} input; only {} edge lists are read as a stream: convert it into a store first (`strata convert`)",
                plan.first_input().display(),
                plan.kind,
                streamable().join(", ")
            ),
        ))
    }

    /// Whether [`EdgeSource::open`] reads this format (the formats named when it is refused).
    fn streams(&self) -> bool {
        false
    }
}

/// The formats [`EdgeSource::open`] reads, by name.
pub fn streamable() -> Vec<&'static str> {
    InputFormat::ALL
        .iter()
        .filter(|f| f.get().streams())
        .map(|f| f.name())
        .collect()
}

/// The inputs as given: one directory, or files.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The files (empty when a directory is given).
    pub files: &'a [PathBuf],
    /// The one directory given.
    pub dir: Option<&'a Path>,
    /// The options, for detection that depends on them (a typed NumPy directory's
    /// `--node-types`).
    pub opts: &'a ConvertOptions,
}

impl<'a> Inputs<'a> {
    /// One file.
    fn file(path: &'a PathBuf, opts: &'a ConvertOptions) -> Inputs<'a> {
        Inputs {
            files: std::slice::from_ref(path),
            dir: None,
            opts,
        }
    }
}

/// What a format will read: the files by role, their size, the options it takes.
#[derive(Debug, Clone, Serialize)]
pub struct SourcePlan {
    /// The format that reads the inputs.
    pub format: InputFormat,
    /// What it reads: the format's name, or a variant of it (`numpy-typed` for a typed NumPy
    /// directory).
    pub kind: String,
    /// Edge files of each split.
    pub train: Vec<PathBuf>,
    pub valid: Vec<PathBuf>,
    pub test: Vec<PathBuf>,
    /// Other files by role (a NumPy directory's `features`, `labels`, `node_train`, ...).
    pub files: BTreeMap<String, PathBuf>,
    /// Edge files of one edge type each (`--edges-of`), in place of `train`.
    pub edges_of: Vec<EdgeTypeFile>,
    /// Planetoid's directory and dataset name.
    pub dataset: Option<(PathBuf, String)>,
    /// A typed NumPy directory.
    pub typed: Option<PathBuf>,
    /// Bytes of the planned files that exist (Planetoid's prefix counts its files).
    pub bytes: u64,
    /// The `[convert]` options this format reads beside the shared ones.
    pub options: &'static [&'static str],
    /// The format the front end stages this one as (Parquet through pyarrow, Planetoid's
    /// pickles): the front end reads the inputs, writes them in that format and converts
    /// those; `None` when Strata reads the inputs itself.
    pub staged_as: Option<InputFormat>,
}

impl SourcePlan {
    /// A plan of `format` reading edge files of each split.
    pub(crate) fn edges(
        format: InputFormat,
        train: Vec<PathBuf>,
        valid: Vec<PathBuf>,
        test: Vec<PathBuf>,
    ) -> SourcePlan {
        SourcePlan {
            format,
            kind: format.name().into(),
            train,
            valid,
            test,
            files: BTreeMap::new(),
            edges_of: Vec::new(),
            dataset: None,
            typed: None,
            bytes: 0,
            options: &[],
            staged_as: None,
        }
    }

    /// The edge files of every split, as the converters take them.
    pub fn inputs(&self) -> Vec<InputFile> {
        [
            ("train", &self.train),
            ("valid", &self.valid),
            ("test", &self.test),
        ]
        .into_iter()
        .flat_map(|(split, paths)| {
            paths.iter().map(move |p| InputFile {
                path: p.clone(),
                split: split.into(),
            })
        })
        .collect()
    }

    /// The first file read (for messages).
    fn first_input(&self) -> &Path {
        self.train
            .first()
            .or(self.typed.as_ref())
            .or(self.dataset.as_ref().map(|d| &d.0))
            .map_or(Path::new(""), |p| p.as_path())
    }

    fn with_sizes(mut self) -> SourcePlan {
        let planned = self
            .train
            .iter()
            .chain(&self.valid)
            .chain(&self.test)
            .chain(self.files.values())
            .chain(self.edges_of.iter().map(|e| &e.path));
        self.bytes = planned
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        self
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

/// A refusal of the options as given, in the front end's words (`convert: ...`).
pub(crate) fn usage(msg: impl Into<String>) -> StoreError {
    StoreError::Usage(msg.into())
}

/// An input that is not there.
pub(crate) fn missing(path: &Path, msg: impl Into<String>) -> StoreError {
    StoreError::Missing {
        path: path.to_path_buf(),
        msg: msg.into(),
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
    let prefix_ok = matches!(opts.format, InputFormat::Auto | InputFormat::Planetoid);
    for p in opts.inputs.iter().chain(&opts.valid).chain(&opts.test) {
        // A Planetoid prefix (`DIR/ind.NAME`) names files, not itself.
        let prefix = || InputFormat::Planetoid.get().detect(&Inputs::file(p, opts));
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
    opts.format.get().plan(&inputs, opts)
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
    let parquet = files.iter().any(|f| {
        InputFormat::Parquet
            .get()
            .detect(&Inputs::file(&f.path, opts))
    });
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

/// Refuses format-specific options given to a format that does not read them.
fn check_options(plan: &SourcePlan, opts: &ConvertOptions) -> Result<()> {
    let takes = |o: &str| plan.options.contains(&o);
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
    Ok(())
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
    plan.format.get().convert(&plan, opts, graph, progress)
}

/// The refusal of a format read by the front end, for callers that reach the store directly.
pub(crate) fn staged_by_front_end(plan: &SourcePlan) -> StoreError {
    usage(format!(
        "convert: {} inputs are read by the front end (`strata convert`), which stages them as {} and converts those",
        plan.kind,
        plan.staged_as.map_or("", |f| f.name())
    ))
}

/// Files of a directory by split, recognised by their stem (`train.txt`, `valid.tsv.gz`,
/// `val.csv`, `dev.txt`, `test.txt`), each split in name order.
pub(crate) fn split_files(dir: &Path) -> Result<[Vec<PathBuf>; 3]> {
    const STEMS: [&[&str]; 3] = [
        &["train"],
        &["valid", "validation", "val", "dev"],
        &["test"],
    ];
    let mut found: [Vec<PathBuf>; 3] = Default::default();
    for p in sorted_entries(dir)? {
        if !p.is_file() {
            continue;
        }
        let name = p.file_name().map(|n| n.to_string_lossy().to_lowercase());
        let stem = name
            .as_deref()
            .unwrap_or("")
            .split('.')
            .next()
            .unwrap_or("");
        for (split, stems) in STEMS.iter().enumerate() {
            if stems.contains(&stem) {
                found[split].push(p.clone());
            }
        }
    }
    Ok(found)
}

/// The entries of `dir`, sorted by path.
pub(crate) fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| StoreError::os("read", dir, e))?
        .map(|e| {
            e.map(|e| e.path())
                .map_err(|e| StoreError::os("read", dir, e))
        })
        .collect::<Result<_>>()?;
    entries.sort();
    Ok(entries)
}

/// A directory's split files as a plan of `format`, with `--valid`/`--test` files in place of
/// the directory's own when given.
pub(crate) fn plan_split_dir(
    format: InputFormat,
    dir: &Path,
    opts: &ConvertOptions,
) -> Result<SourcePlan> {
    let [train, valid, test] = split_files(dir)?;
    if train.is_empty() {
        return Err(missing(
            dir,
            "found no train file (train.txt, train.tsv, ...), edges.npy, or Planetoid files",
        ));
    }
    let or = |given: &Vec<PathBuf>, found| {
        if given.is_empty() {
            found
        } else {
            given.clone()
        }
    };
    Ok(SourcePlan::edges(
        format,
        train,
        or(&opts.valid, valid),
        or(&opts.test, test),
    ))
}

/// Whether `path`'s last suffix (with the dot, as written) is one of `suffixes`.
pub(crate) fn has_suffix(path: &Path, suffixes: &[&str]) -> bool {
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()));
    ext.is_some_and(|e| suffixes.contains(&e.as_str()))
}

/// `strata convert`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConvertOptions {
    /// input files (train edges), or one directory holding train/valid/test files, NumPy
    /// arrays (edges.npy, ...) or Planetoid files (ind.NAME.*)
    #[schemars(extend("x-positional" = true, "x-kind" = "path"))]
    pub inputs: Vec<PathBuf>,
    /// store directory to create
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// input format; auto decides from the file names and contents
    pub format: InputFormat,
    /// files of validation edges (text or bin32), or one .npy for numpy
    #[schemars(extend("x-kind" = "path"))]
    pub valid: Vec<PathBuf>,
    /// files of test edges (text or bin32), or one .npy for numpy
    #[schemars(extend("x-kind" = "path"))]
    pub test: Vec<PathBuf>,
    /// text lines are (src, relation, dst) triples; same as columns = src,rel,dst
    pub relations: bool,
    /// meaning of each text field, comma-separated: src, dst, rel, weight (float32), time
    /// (int64), feat:D (D float32 edge features), or _ to ignore (default src,dst; src,rel,dst
    /// with --relations); for Parquet inputs ROLE or ROLE=COLUMN names the column each role
    /// reads (default: the role's name), feat=COLUMN repeated for features
    pub columns: String,
    /// typed graph: file of node types in id order, one `NAME<TAB>COUNT` line each (edges hold
    /// integer global ids, each type owning the next COUNT) or one `NAME` line each (edges hold
    /// node names, numbered by type then name); needs --edge-types
    #[schemars(extend("x-kind" = "path"))]
    pub node_types: Option<PathBuf>,
    /// typed graph: file of edge types, one `SRC_TYPE<TAB>RELATION<TAB>DST_TYPE` line each;
    /// the rel column (if any) names the relation
    #[schemars(extend("x-kind" = "path"))]
    pub edge_types: Option<PathBuf>,
    /// typed graph: edge files of one edge type each, `SRC_TYPE:RELATION:DST_TYPE=FILE` (as
    /// GraphBolt writes edge types), in place of input files (like PyG's edge_index_dict):
    /// lines hold src and dst, no rel column; integer ids are local to each node type; without
    /// --edge-types the edge types are these, in order
    pub edges_of: Vec<String>,
    /// typed graph: feature bags of a node type, TYPE=FILE with lines NODE<TAB>FEATURE
    /// FEATURE ... (a node by name, or by local id without names; features are names):
    /// PyTorch-BigGraph's featurized entities (strata embed train --featurized TYPE)
    pub node_bags: Vec<String>,
    /// field separator of text inputs; auto detects per file from its first data line
    pub delimiter: Delimiter,
    /// lines starting with this are skipped; empty for none
    pub comment: String,
    /// each text file starts with a header line to skip
    pub header: bool,
    /// node ids: int uses non-negative integers as ids directly, string renumbers names densely
    /// (sorted order); auto picks int when the first lines hold only plain integers
    pub ids: IdKind,
    /// relation ids, as for ids
    pub relation_ids: IdKind,
    /// number of nodes with integer ids (default: largest id + 1)
    #[schemars(range(min = 1))]
    pub num_nodes: Option<u64>,
    /// number of relations with integer relation ids
    pub num_relations: Option<u64>,
    /// random edge split train,valid,test, e.g. 0.9,0.05,0.05 (exact counts; not with
    /// --valid/--test)
    pub split: Option<Fractions>,
    /// seed of the random edge and node splits
    pub seed: u64,
    /// treat the graph as undirected: CSR/CSC hold every edge both ways
    pub symmetrize: bool,
    /// numpy: node features (nodes, dim)
    #[schemars(extend("x-kind" = "path"))]
    pub features: Option<PathBuf>,
    /// stored feature dtype; auto keeps float16 and stores everything else as float32
    pub feature_dtype: StoredFeatureDtype,
    /// numpy: node labels (nodes,), -1 for unlabelled
    #[schemars(extend("x-kind" = "path"))]
    pub labels: Option<PathBuf>,
    /// numpy: train nodes (ids, or a boolean mask)
    #[schemars(extend("x-kind" = "path"))]
    pub node_train: Option<PathBuf>,
    /// numpy: validation nodes (ids, or a boolean mask)
    #[schemars(extend("x-kind" = "path"))]
    pub node_valid: Option<PathBuf>,
    /// numpy: test nodes (ids, or a boolean mask)
    #[schemars(extend("x-kind" = "path"))]
    pub node_test: Option<PathBuf>,
    /// numpy: random node split over labelled nodes
    pub node_split: Option<Fractions>,
    /// numpy edges as rows (E, 2|3) or columns (2|3, E) like PyG's edge_index
    pub layout: EdgeLayout,
    /// dataset name in the manifest (default: the store's name); for Planetoid, which dataset
    /// of the directory (cora, citeseer)
    pub name: Option<String>,
    /// memory budget of the conversion
    pub memory: Size,
    /// parsing threads; 0 = one per core
    pub threads: usize,
    /// size of each aligned I/O request
    #[schemars(extend("x-flag" = false))]
    pub io_chunk: Size,
    /// replace an existing store (atomically, once the new one is complete)
    pub overwrite: bool,
}

impl Default for ConvertOptions {
    /// `out` is required (empty is refused).
    fn default() -> Self {
        ConvertOptions {
            inputs: Vec::new(),
            out: PathBuf::new(),
            format: InputFormat::Auto,
            valid: Vec::new(),
            test: Vec::new(),
            relations: false,
            columns: String::new(),
            node_types: None,
            edge_types: None,
            edges_of: Vec::new(),
            node_bags: Vec::new(),
            delimiter: Delimiter::Auto,
            comment: "#".into(),
            header: false,
            ids: IdKind::Auto,
            relation_ids: IdKind::Auto,
            num_nodes: None,
            num_relations: None,
            split: None,
            seed: 0,
            symmetrize: false,
            features: None,
            feature_dtype: StoredFeatureDtype::Auto,
            labels: None,
            node_train: None,
            node_valid: None,
            node_test: None,
            node_split: None,
            layout: EdgeLayout::Auto,
            name: None,
            memory: Size(1 << 30),
            threads: 0,
            io_chunk: super::default_io_chunk(),
            overwrite: false,
        }
    }
}

impl Section for ConvertOptions {
    const NAME: &'static str = "convert";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        let refuse = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
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
