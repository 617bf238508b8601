//! The vocabulary an input format is written in: the [`EdgeSource`] trait a format
//! implements, the [`Inputs`] it is asked about, the [`SourcePlan`] it answers with, and the
//! helpers formats share (split files of a directory, suffixes, refusals). The registry of
//! formats (`source::InputFormat`) sits above the formats and this module below them, so a
//! format reaches nothing that reaches it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::convert::edges::EdgeInput;
use crate::convert::text_job::EdgeTypeFile;
use crate::convert::{ConvertOptions, GraphOptions, InputFile, NodeColumns, Summary};
use crate::error::{Result, StoreError};
use crate::registry::Named;
use strata_io::progress::Progress;

/// An input format. Implementations are unit types registered in the registry of input
/// formats (`source::InputFormat`) with their [`Named`] name (`--format NAME`) and help.
pub trait EdgeSource: Sync + std::fmt::Debug {
    /// Whether `inputs` look like this format (file names and suffixes, a directory's files);
    /// `--format auto` takes the first registered format that says yes.
    fn detect(&self, inputs: &Inputs) -> bool;

    /// What this format reads of `inputs` with the options `opts`: the files by role (with
    /// their sizes) and the options it takes, or why the inputs do not fit it.
    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan>;

    /// The node columns the planned inputs bring (features, labels, node splits; one set per
    /// node type of a typed input), each read in batches of whole rows; none by default.
    /// Checked before a store is created: a missing or misshapen file is named here.
    fn node_columns(&self, plan: &SourcePlan, opts: &ConvertOptions) -> Result<Vec<NodeColumns>> {
        let _ = (plan, opts);
        Ok(Vec::new())
    }

    /// Converts the planned inputs, edges and [`EdgeSource::node_columns`], into the store
    /// `graph.out` within `graph.memory` bytes.
    fn convert(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        graph: GraphOptions,
        progress: &dyn Progress,
    ) -> Result<Summary>;

    /// Opens the planned train edges as a stream read in bounded batches (see [`EdgeInput`]);
    /// scratch files (a parse's spool) go under `scratch`, which the caller removes. Only
    /// formats whose [`EdgeSource::streams`] says so implement it (`source::open` refuses the
    /// others, naming the formats that stream).
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
            format!("{} inputs are not read as a stream", plan.kind),
        ))
    }

    /// Whether [`EdgeSource::open`] reads this format (the formats named when it is refused).
    fn streams(&self) -> bool {
        false
    }
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
    pub(crate) fn file(path: &'a PathBuf, opts: &'a ConvertOptions) -> Inputs<'a> {
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
    /// The format that reads the inputs (its registered name).
    pub format: &'static str,
    /// The format's implementation, which converts or opens what it planned.
    #[serde(skip)]
    pub source: &'static dyn EdgeSource,
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
    pub staged_as: Option<&'static str>,
}

impl SourcePlan {
    /// A plan of the format `source` reading edge files of each split.
    pub(crate) fn edges<S: EdgeSource + Named>(
        source: &'static S,
        train: Vec<PathBuf>,
        valid: Vec<PathBuf>,
        test: Vec<PathBuf>,
    ) -> SourcePlan {
        SourcePlan {
            format: S::NAME,
            source,
            kind: S::NAME.into(),
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
    pub(crate) fn first_input(&self) -> &Path {
        self.train
            .first()
            .or(self.typed.as_ref())
            .or(self.dataset.as_ref().map(|d| &d.0))
            .map_or(Path::new(""), |p| p.as_path())
    }

    /// The plan with [`SourcePlan::bytes`] filled in.
    pub(crate) fn with_sizes(mut self) -> SourcePlan {
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

/// The refusal of a format read by the front end, for callers that reach the store directly.
pub(crate) fn staged_by_front_end(plan: &SourcePlan) -> StoreError {
    usage(format!(
        "convert: {} inputs are read by the front end (`strata convert`), which stages them as {} and converts those",
        plan.kind,
        plan.staged_as.unwrap_or("")
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
pub(crate) fn plan_split_dir<S: EdgeSource + Named>(
    source: &'static S,
    dir: &Path,
    opts: &ConvertOptions,
) -> Result<SourcePlan> {
    let [train, valid, test] = split_files(dir)?;
    if train.is_empty() && dir.join(crate::store::MANIFEST).is_file() {
        return Err(StoreError::bad_file(
            dir,
            "is a Strata store already: train on it as it is, or `strata reorder` it into a \
             renumbered copy",
        ));
    }
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
        source,
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
