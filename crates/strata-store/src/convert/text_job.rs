//! The text edge-list converter (TSV, CSV, whitespace-separated; plain or gzip).
//!
//! String ids take two streaming passes: the first collects distinct names in bounded memory
//! (spilling sorted runs) and writes the sorted name table; the second encodes each edge by
//! looking names up, in as many sub-passes as the dictionary needs ranges to fit the budget.
//! Integer ids take one pass.
//!
//! A typed graph with names keys its dictionary by (node type, name) ([`name_key`]): each
//! edge's type, and so its endpoints' node types, follow from its relation field (or from its
//! file, for per-edge-type files), and the sorted keys give every node type a contiguous id
//! range holding its names in sorted order. Integer ids in per-edge-type files are local to
//! their node type (PyG's `edge_index_dict`); elsewhere they are global.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use super::bags::write_bags;
use super::dict::{table_bytes, NameCollector, NameDict};
use super::options::{Delimiter, IdKind};
use super::spool::{remove_spool, split_index, Attrs, EdgeBatch, Spool, Spooled};
use super::text::{
    for_each_record, is_canonical_uint, is_gzip, par_map_blocks, parse_uint, Block, BlockReader,
    Layout, BINARY_FORMATS, MAX_LINE,
};
use super::types::{name_key, split_key, KEY_PREFIX};
use super::{
    announce, check_inputs, finish, resolve_num_nodes, Clock, GraphOptions, Ingested, InputFile,
    NodeData, Summary, Types,
};
use crate::array::{read_i64_range, read_range, RowReader};
use crate::error::{quoted, Result, StoreError};
use crate::manifest::id_dtype_for;
use crate::npy::DType;
use crate::store::StoreBuilder;
use crate::strtab::StrTabWriter;
use crate::units::fmt_bytes;
use strata_io::progress::{Meter, Progress};

/// Text layout and inputs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextOptions {
    pub inputs: Vec<InputFile>,
    /// Meaning of each field: `src`, `dst`, optionally `rel`, `weight` (float32) and `time`
    /// (int64), and `_` for ignored fields.
    pub columns: Vec<String>,
    pub delimiter: Delimiter,
    /// Lines starting with this (after blanks) are comments; empty for none.
    pub comment: String,
    /// Each file starts with a header line to skip.
    pub header: bool,
    /// How node ids are read.
    pub ids: IdKind,
    /// How relation ids are read.
    pub relation_ids: IdKind,
    /// Node types in id order, `NAME<TAB>COUNT` lines (integer global ids) or `NAME` lines
    /// (node names) (a typed graph; see [`super::types`]).
    #[serde(default)]
    pub node_types: Option<PathBuf>,
    /// Edge types, `SRC_TYPE<TAB>RELATION<TAB>DST_TYPE` lines; required with `node_types`
    /// unless `edges_of` gives the edge types.
    #[serde(default)]
    pub edge_types: Option<PathBuf>,
    /// Edge files of one edge type each (train edges), in place of `inputs`: their lines hold
    /// no rel column, and integer ids in them are local to each node type.
    #[serde(default)]
    pub edges_of: Vec<EdgeTypeFile>,
    /// Feature bags of node types, `TYPE=FILE` items (see [`super::bags`]).
    #[serde(default)]
    pub node_bags: Vec<String>,
}

/// An edge file whose every edge has one edge type.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeTypeFile {
    pub path: PathBuf,
    /// (source type, relation, destination type) by node type names.
    pub edge_type: [String; 3],
}

/// A text conversion.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextJob {
    pub graph: GraphOptions,
    pub text: TextOptions,
}

/// Where each role sits among a line's fields.
#[derive(Clone, Copy)]
struct Columns {
    src: usize,
    dst: usize,
    rel: Option<usize>,
    weight: Option<usize>,
    time: Option<usize>,
    /// Edge features: the first of a run of fields, and the run's length (`feat:D`).
    feat: Option<(usize, usize)>,
    /// Fields a line holds.
    fields: usize,
}

impl Columns {
    /// The edge attributes the columns carry.
    fn attrs(&self) -> Attrs {
        Attrs {
            weights: self.weight.is_some(),
            times: self.time.is_some(),
            features: self.feat.map_or(0, |(_, d)| d),
        }
    }

    /// Reads `columns` items: `src`, `dst`, `rel`, `weight`, `time`, `_` (one field each) and
    /// `feat:D` (a run of `D` float32 edge features).
    fn parse(cols: &[String]) -> Result<Columns> {
        let bad = |msg: String| Err(StoreError::option("columns", msg));
        let mut at = std::collections::HashMap::new();
        let mut fields = 0;
        let mut feat = None;
        for c in cols {
            if let Some(d) = c.strip_prefix("feat:") {
                // Each feature takes at least two bytes of a line (a digit and a delimiter).
                let most = MAX_LINE / 2;
                let dim = match d.parse::<usize>() {
                    Ok(n) if (1..=most).contains(&n) => n,
                    _ => {
                        return bad(format!(
                            "'{c}': feat:D needs a feature count D from 1 to {most} (a line \
                             holds at most {MAX_LINE} bytes, two or more a feature)"
                        ))
                    }
                };
                if feat.is_some() {
                    return bad(format!("'feat:' appears more than once in {cols:?}"));
                }
                feat = Some((fields, dim));
                fields += dim;
                continue;
            }
            if !matches!(c.as_str(), "src" | "dst" | "rel" | "weight" | "time" | "_") {
                return bad(format!(
                    "unknown column '{c}' (expected src, dst, rel, weight, time, feat:D or _)"
                ));
            }
            if c != "_" && at.insert(c.as_str(), fields).is_some() {
                return bad(format!("'{c}' appears more than once in {cols:?}"));
            }
            fields += 1;
        }
        match (at.get("src"), at.get("dst")) {
            (Some(&src), Some(&dst)) => Ok(Columns {
                src,
                dst,
                rel: at.get("rel").copied(),
                weight: at.get("weight").copied(),
                time: at.get("time").copied(),
                feat,
                fields,
            }),
            _ => bad(format!("{cols:?} must name both a src and a dst column")),
        }
    }
}

/// Decides `auto` id kinds from the first data lines of the first input, and measures their
/// mean length in bytes (at least 2), which sizes the parse blocks.
fn detect_kinds(
    opts: &TextOptions,
    layout: &Layout,
    cols: Columns,
) -> Result<(IdKind, IdKind, u64)> {
    let first = &opts.inputs[0].path;
    let mut reader = BlockReader::new(vec![first.clone()], layout.clone(), 256 << 10, 256 << 10);
    let (mut nodes_int, mut rels_int, mut seen) = (true, true, 0usize);
    let (mut bytes, mut lines) = (0u64, 0u64);
    while seen < 1000 {
        let Some(block) = reader.next_block()? else {
            break;
        };
        bytes += block.data.len() as u64;
        lines += max_records(&block) as u64;
        let r = for_each_record(&block, layout, first, |_, f| {
            if seen < 1000 {
                nodes_int &= is_canonical_uint(f[cols.src]) && is_canonical_uint(f[cols.dst]);
                if let Some(r) = cols.rel {
                    rels_int &= is_canonical_uint(f[r]);
                }
                seen += 1;
            }
            Ok(())
        });
        // A malformed line is reported by the real pass with full context.
        if r.is_err() {
            break;
        }
    }
    let pick = |asked: IdKind, ints: bool| match asked {
        IdKind::Auto if ints => IdKind::Int,
        IdKind::Auto => IdKind::String,
        k => k,
    };
    let record_bytes = (bytes / lines.max(1)).max(2);
    Ok((
        pick(opts.ids, nodes_int),
        pick(opts.relation_ids, rels_int),
        record_bytes,
    ))
}

/// Peak bytes of one parse block of `block` bytes whose records average `record_bytes`:
/// the block, plus its parsed edges (three `i64` ids per record, and the f32 weight, i64
/// time and f32 features of `attrs`) or, in the name pass, its names (`names_per_record` per record, at most
/// the block's bytes plus `key_bytes` per name) in a table sized for them.
fn block_cost(
    block: u64,
    record_bytes: u64,
    names_per_record: u64,
    key_bytes: u64,
    attrs: Attrs,
) -> u64 {
    let records = block.div_ceil(record_bytes);
    let record = 24 + 4 * attrs.weights as u64 + 8 * attrs.times as u64 + 4 * attrs.features as u64;
    let ids = record.saturating_mul(records);
    let names = match names_per_record {
        0 => 0,
        k => block + key_bytes * k * records + table_bytes(k * records),
    };
    block.saturating_add(ids.max(names))
}

/// Upper bound of the records in a block: its line count.
fn max_records(block: &Block) -> usize {
    memchr::memchr_iter(b'\n', &block.data).count() + 1
}

/// Converts text edge lists into a store.
pub fn convert_text(job: &TextJob, progress: &dyn Progress) -> Result<Summary> {
    let (builder, ingested, clock) = ingest_text(job, progress)?;
    finish(
        builder,
        &job.graph,
        ingested,
        NodeData::default(),
        clock,
        progress,
    )
}

/// The text converter's passes up to the spooled edges: ids decided, names collected into
/// the builder's sorted name tables, every edge parsed and encoded into a spool in the
/// builder's scratch directory.
pub(super) fn ingest_text(
    job: &TextJob,
    progress: &dyn Progress,
) -> Result<(StoreBuilder, Ingested, Clock)> {
    let graph = &job.graph;
    let opts = &with_edge_type_files(&job.text)?;
    graph.validate()?;
    let cols = Columns::parse(&opts.columns)?;
    if !opts.edges_of.is_empty() && cols.rel.is_some() {
        return Err(StoreError::option(
            "columns",
            "per-edge-type files (edges_of) hold no rel column: each file's edge type is given",
        ));
    }
    let input_bytes = check_inputs(&opts.inputs, graph)?;
    let layout = Layout {
        delimiter: opts.delimiter,
        comment: opts.comment.as_bytes().to_vec(),
        header: opts.header,
        num_fields: cols.fields,
    };
    let (types, file_etypes) = read_types(opts, graph, cols)?;
    let (node, rel, record_bytes) = detect_kinds(opts, &layout, cols)?;
    let kinds = Kinds {
        node: typed_node_kind(opts, &types, node)?,
        rel,
        has_rel: cols.rel.is_some(),
        typed: types.is_typed(),
    };
    kinds.check(graph)?;
    // A typed graph's integer ids are global ids, checked against its node types' total.
    let graph = &GraphOptions {
        num_nodes: if types.counted {
            Some(types.num_nodes())
        } else {
            graph.num_nodes
        },
        ..graph.clone()
    };
    let mut clock = Clock::new();
    let mut builder = StoreBuilder::create(&graph.out, graph.overwrite)?;
    // With threads left to the default (one per core), a budget too small for every core's
    // blocks parses with as many threads as it holds: a small budget on a many-core machine is
    // no reason to fail.
    let budget = fitting_threads(graph.threads(), graph.threads > 0, |threads| {
        ParseBudget::plan(threads, graph, opts, kinds, cols.attrs(), record_bytes)
    })?;
    let mut plan = vec![
        budget.describe(graph.memory.0, kinds),
        format!(
            "ids: nodes {}, relations {}",
            if kinds.typed_names() {
                "names (renumbered in (node type, name) order)"
            } else {
                kind_name(kinds.node)
            },
            match (kinds.typed, kinds.has_rel) {
                (true, _) => "edge types",
                (false, true) => kind_name(kinds.rel),
                (false, false) => "none",
            }
        ),
    ];
    let paths: Vec<PathBuf> = opts.inputs.iter().map(|f| f.path.clone()).collect();
    let ctx = Ctx {
        opts,
        layout: &layout,
        cols,
        kinds,
        types: &types,
        file_etypes: &file_etypes,
        paths: &paths,
        threads: budget.threads,
        block_bytes: budget.block_bytes,
        io_chunk: budget.io_chunk,
    };

    // Pass 1 (string ids only): collect names.
    let mut names = Names::default();
    let mut rows_per_file = vec![0u64; paths.len()];
    if kinds.node == IdKind::String || kinds.rel_names() {
        names = collect_names(
            &ctx,
            &mut builder,
            budget.dict_budget,
            &mut rows_per_file,
            progress,
        )?;
        plan.push(names.describe(kinds));
        clock.lap("names");
    }
    plan = announce(progress, plan);
    // With names, each node type's id range is known once its names are counted.
    let types = if kinds.typed_names() {
        types.with_counts(&names.type_counts)
    } else {
        types.clone()
    };
    let ctx = Ctx {
        types: &types,
        ..ctx
    };

    // Pass 2: encode edges (in several sub-passes when the dictionary does not fit).
    let spooled = encode_edges(
        &ctx,
        &builder,
        &names,
        graph,
        budget.dict_budget,
        &mut rows_per_file,
        progress,
    )?;
    clock.lap("parse");
    // The dictionaries are done: their memory goes to the topology step.
    names.node_dict = None;
    names.rel_dict = None;
    for (file, rows) in opts.inputs.iter().zip(&rows_per_file) {
        if *rows == 0 {
            return Err(StoreError::bad_file(
                &file.path,
                "contains no edges (only blank or comment lines)",
            ));
        }
    }
    let total = spooled.total_rows();
    let num_nodes = if kinds.node == IdKind::String {
        names.num_nodes
    } else {
        resolve_num_nodes(graph, spooled.max_node, total)?
    };
    let num_relations = match (kinds.has_rel, kinds.rel) {
        _ if kinds.typed => types.edge_types.len() as u64,
        (false, _) => 0,
        (true, IdKind::String) => names.num_relations,
        (true, _) => graph.num_relations.unwrap_or((spooled.max_rel + 1) as u64),
    };
    let mut types = types;
    if !opts.node_bags.is_empty() {
        if !types.is_typed() {
            return Err(StoreError::option(
                "node_bags",
                "feature bags belong to node types: give --node-types and --edge-types",
            ));
        }
        let lines = write_bags(
            &mut builder,
            &opts.node_bags,
            &mut types.node_types,
            kinds.node == IdKind::String,
            graph.memory.0,
        )?;
        plan.extend(announce(progress, lines));
        clock.lap("bags");
    }
    let ingested = Ingested {
        converter: "text",
        plan,
        spooled,
        types,
        num_nodes,
        num_relations,
        node_names: kinds.node == IdKind::String,
        relation_names: kinds.rel_names(),
        input_files: paths.len(),
        input_bytes,
        input_rows: total,
    };
    Ok((builder, ingested, clock))
}

/// The text options with the per-edge-type files (if any) as the input files, holding train
/// edges.
fn with_edge_type_files(opts: &TextOptions) -> Result<TextOptions> {
    if opts.edges_of.is_empty() {
        return Ok(opts.clone());
    }
    if !opts.inputs.is_empty() {
        return Err(StoreError::option(
            "edges_of",
            "replaces the input files: give edges either as input files (with a rel column) or as one file per edge type, not both",
        ));
    }
    let inputs = opts
        .edges_of
        .iter()
        .map(|f| InputFile {
            path: f.path.clone(),
            split: "train".into(),
        })
        .collect();
    Ok(TextOptions {
        inputs,
        ..opts.clone()
    })
}

/// Reads the node and edge types of a typed conversion (both files, or the node types file
/// and per-edge-type files, or none), and checks the options they constrain; returns them and
/// the edge type of each input file that has one.
fn read_types(
    opts: &TextOptions,
    graph: &GraphOptions,
    cols: Columns,
) -> Result<(Types, Vec<Option<u32>>)> {
    let per_file = !opts.edges_of.is_empty();
    let (nodes, edges) = match (&opts.node_types, &opts.edge_types) {
        (None, None) if !per_file => return Ok((Types::default(), vec![None; opts.inputs.len()])),
        (Some(n), e) if e.is_some() || per_file => (n, e.as_deref()),
        (Some(_), _) => {
            return Err(StoreError::option(
                "edge_types",
                "a typed graph needs an edge types file beside its node types file (or one edge file per edge type)",
            ))
        }
        (None, _) => {
            return Err(StoreError::option(
                "node_types",
                "a typed graph needs a node types file (NAME<TAB>COUNT lines for integer ids, NAME lines for names)",
            ))
        }
    };
    if graph.symmetrize {
        return Err(StoreError::option(
            "symmetrize",
            "is not supported for typed graphs: declare the reverse edge types and list the reverse edges instead",
        ));
    }
    let mut types = Types::read(nodes, edges)?;
    let mut file_etypes = Vec::with_capacity(opts.inputs.len());
    for f in &opts.edges_of {
        let etype = types
            .file_edge_type(&f.edge_type, edges.is_none())
            .map_err(|msg| {
                StoreError::option("edges_of", format!("{}: {msg}", f.path.display()))
            })?;
        file_etypes.push(Some(etype));
    }
    file_etypes.resize(opts.inputs.len(), None);
    if let Some(n) = graph
        .num_nodes
        .filter(|&n| types.counted && n != types.num_nodes())
    {
        return Err(StoreError::option(
            "num_nodes",
            format!(
                "is {n} but the node types of {} add up to {}",
                nodes.display(),
                types.num_nodes()
            ),
        ));
    }
    if types.counted && types.num_nodes() == 0 {
        return Err(StoreError::bad_file(nodes, "the node types hold no nodes"));
    }
    match (per_file, types.counted, edges) {
        (true, _, _) => {}
        (false, false, Some(edges)) => types.check_named_endpoints(cols.rel.is_some(), edges)?,
        (false, true, _) if cols.rel.is_none() => types.check_without_relation()?,
        _ => {}
    }
    Ok((types, file_etypes))
}

/// How a typed graph's node ids are read: integers when its node types file gives counts,
/// names when it does not; `detected` (the `auto` decision) for an untyped graph.
fn typed_node_kind(opts: &TextOptions, types: &Types, detected: IdKind) -> Result<IdKind> {
    if !types.is_typed() {
        return Ok(detected);
    }
    let file = opts.node_types.as_deref().expect("a typed conversion");
    match (types.counted, opts.ids, detected) {
        (true, IdKind::String, _) | (true, IdKind::Auto, IdKind::String) => Err(StoreError::option(
            "ids",
            format!(
                "{} gives each node type a count, so edges hold integer global ids (a node type owns a range of them), but these inputs hold names: list the node types without counts to read names",
                file.display()
            ),
        )),
        (true, _, _) => Ok(IdKind::Int),
        (false, IdKind::Int, _) => Err(StoreError::option(
            "ids",
            format!(
                "is int, but {} gives no node type a count: integer global ids need a NAME<TAB>COUNT line per node type",
                file.display()
            ),
        )),
        (false, _, _) => Ok(IdKind::String),
    }
}

/// How node and relation ids are read, once `auto` is decided.
#[derive(Clone, Copy)]
struct Kinds {
    node: IdKind,
    rel: IdKind,
    /// The input has a relation column.
    has_rel: bool,
    /// A typed graph: the relation field names an edge type's relation.
    typed: bool,
}

impl Kinds {
    /// Refuses counts given for ids that are counted, not read.
    fn check(&self, graph: &GraphOptions) -> Result<()> {
        if self.typed && graph.num_relations.is_some() {
            return Err(StoreError::option(
                "num_relations",
                "does not apply to a typed graph: its edge types file lists the relations",
            ));
        }
        if self.node == IdKind::String && graph.num_nodes.is_some() {
            return Err(StoreError::option(
                "num_nodes",
                "applies to integer ids only; string ids are counted",
            ));
        }
        if (self.rel == IdKind::String || !self.has_rel) && graph.num_relations.is_some() {
            return Err(StoreError::option(
                "num_relations",
                "applies to an integer relation column only",
            ));
        }
        Ok(())
    }

    /// A typed graph whose edges hold node names, keyed by (node type, name).
    fn typed_names(&self) -> bool {
        self.typed && self.node == IdKind::String
    }

    /// Bytes each node name's dictionary key adds to the name ([`name_key`]).
    fn key_bytes(&self) -> u64 {
        if self.typed_names() {
            KEY_PREFIX
        } else {
            0
        }
    }

    /// Relations are read as names into a relation-name table (untyped graphs).
    fn rel_names(&self) -> bool {
        self.has_rel && self.rel == IdKind::String && !self.typed
    }

    /// Names per record the name pass collects.
    fn names_per_record(&self) -> u64 {
        match (self.node, self.rel_names()) {
            (IdKind::String, rel) => 2 + rel as u64,
            (_, true) => 1,
            _ => 0,
        }
    }
}

/// How the parse spends the budget: parse blocks in flight, I/O buffers, and the rest for the
/// name dictionary.
struct ParseBudget {
    threads: usize,
    /// Blocks in flight: `threads` queued, `threads` parsed, one per worker, one being read.
    in_flight: u64,
    block_bytes: usize,
    /// Peak bytes of one block with its parsed ids or names (see [`block_cost`]).
    block_cost: u64,
    io_chunk: usize,
    /// Bytes left for the name dictionary.
    dict_budget: u64,
}

impl ParseBudget {
    /// Sizes the parse blocks of `threads` parse threads so that the blocks in flight take at
    /// most a quarter of the budget (records of `record_bytes` on average); refuses a budget
    /// that cannot hold them, the I/O buffers and a gzip decoder (see [`fitting_threads`]).
    fn plan(
        threads: usize,
        graph: &GraphOptions,
        opts: &TextOptions,
        kinds: Kinds,
        attrs: Attrs,
        record_bytes: u64,
    ) -> Result<ParseBudget> {
        let io_chunk = graph.io_chunk();
        let in_flight = 3 * threads as u64 + 2;
        let names_per_record = kinds.names_per_record();
        let cost = |block| {
            block_cost(
                block,
                record_bytes,
                names_per_record,
                kinds.key_bytes(),
                attrs,
            )
        };
        let mut block_bytes = (graph.memory.0 / (16 * in_flight)).clamp(4096, io_chunk as u64);
        while block_bytes > 64 << 10
            && in_flight.saturating_mul(cost(block_bytes)) > graph.memory.0 / 4
        {
            block_bytes /= 2;
        }
        let block_cost = cost(block_bytes);
        // A gzip input adds its decoder window and a 1 MiB read-ahead buffer.
        let gzip = if opts.inputs.iter().any(|f| is_gzip(&f.path)) {
            2 << 20
        } else {
            0
        };
        let fixed = in_flight.saturating_mul(block_cost) + 6 * io_chunk as u64 + gzip;
        let dict_budget = graph
            .memory
            .0
            .checked_sub(fixed)
            .ok_or(StoreError::Budget {
                budget: graph.memory.0,
                needed: fixed,
                what: format!(
                    "parsing with {threads} threads ({} blocks of {})",
                    in_flight,
                    fmt_bytes(block_bytes)
                ),
            })?;
        Ok(ParseBudget {
            threads,
            in_flight,
            block_bytes: block_bytes as usize,
            block_cost,
            io_chunk,
            dict_budget,
        })
    }

    /// The plan as a line for the user.
    fn describe(&self, memory: u64, kinds: Kinds) -> String {
        format!(
            "budget {}: {} parse threads with {} blocks of {} ({} each parsed), {} I/O buffers of {}{}",
            fmt_bytes(memory),
            self.threads,
            self.in_flight,
            fmt_bytes(self.block_bytes as u64),
            fmt_bytes(self.block_cost),
            6,
            fmt_bytes(self.io_chunk as u64),
            if kinds.node == IdKind::String {
                format!(
                    ", name dictionary up to {} (sorted runs spill to disk beyond)",
                    fmt_bytes(self.dict_budget)
                )
            } else {
                String::new()
            }
        )
    }
}

/// Plans with `asked` threads; where the budget is too small for them and the count was not
/// `explicit` (the default, one per core), with one thread fewer until a plan fits. The error
/// then names the one-thread plan: the least the budget must hold.
fn fitting_threads<T>(
    asked: usize,
    explicit: bool,
    plan: impl Fn(usize) -> Result<T>,
) -> Result<T> {
    let fewest = if explicit { asked } else { 1 };
    let mut threads = asked;
    loop {
        match plan(threads) {
            Err(StoreError::Budget { .. }) if threads > fewest => threads -= 1,
            planned => return planned,
        }
    }
}

/// The id type of the edge spool: small enough for every id the pass can write, and int64
/// with attribute columns (times are int64).
fn spool_dtype(kinds: Kinds, attrs: Attrs, names: &Names, graph: &GraphOptions) -> DType {
    if attrs.any() {
        DType::I64
    } else if kinds.node == IdKind::String {
        id_dtype_for(
            names
                .num_nodes
                .max(names.num_relations)
                .max(graph.num_relations.unwrap_or(0)),
        )
    } else if let Some(n) = graph.num_nodes {
        id_dtype_for(n.max(graph.num_relations.unwrap_or(0)))
    } else {
        DType::I64
    }
}

/// Pass 2: encodes every edge into a spool, in one sub-pass per range of the node dictionary
/// when the whole dictionary does not fit `dict_budget` (each sub-pass patches the ids of
/// its range into the previous spool). Counts the rows of each file into `rows_per_file`
/// when the name pass did not.
fn encode_edges(
    ctx: &Ctx,
    builder: &StoreBuilder,
    names: &Names,
    graph: &GraphOptions,
    dict_budget: u64,
    rows_per_file: &mut [u64],
    progress: &dyn Progress,
) -> Result<Spooled> {
    let kinds = ctx.kinds;
    let scratch = builder.scratch()?;
    let attrs = ctx.cols.attrs();
    let spool_dtype = spool_dtype(kinds, attrs, names, graph);
    let cols_out = if kinds.has_rel || kinds.typed { 3 } else { 2 };
    let mut spooled: Option<Spooled> = None;
    let ranges = match (&names.node_dict, kinds.node) {
        (_, IdKind::Int) => vec![None],
        (Some(_), _) => vec![None],
        (None, _) => dictionary_ranges(
            builder,
            names.num_nodes,
            dict_budget,
            kinds.key_bytes(),
            ctx.io_chunk,
        )?,
    };
    if ranges.len() > 1 {
        progress.message(&format!(
            "encoding in {} passes: the name dictionary is larger than its budget",
            ranges.len()
        ));
    }
    for (k, range) in ranges.iter().enumerate() {
        let range_dict = match range {
            Some((lo, hi)) => Some(load_range(builder, *lo, *hi, ctx.types)?),
            None => None,
        };
        let node_dict = range_dict.as_ref().or(names.node_dict.as_ref());
        let spool = match &spooled {
            None => Spool::new(
                &scratch,
                &format!("p{k}"),
                spool_dtype,
                cols_out,
                attrs,
                ctx.io_chunk,
            ),
            Some(prev) => Spool::patching(&scratch, &format!("p{k}"), prev, ctx.io_chunk)?,
        };
        let lookup = Lookup {
            node_kind: kinds.node,
            rel_kind: kinds.rel,
            node_dict,
            rel_dict: names.rel_dict.as_ref(),
            num_nodes: graph.num_nodes,
            num_relations: graph.num_relations,
            must_resolve: ranges.len() == 1,
            types: ctx.types,
        };
        let stage = if ranges.len() > 1 {
            format!("encode {}/{}", k + 1, ranges.len())
        } else {
            "parse".to_string()
        };
        let count_rows = k == 0 && kinds.node == IdKind::Int && !kinds.rel_names();
        let next = encode_pass(
            ctx,
            &lookup,
            spool,
            &stage,
            if count_rows {
                Some(&mut *rows_per_file)
            } else {
                None
            },
            progress,
        )?;
        if let Some(prev) = spooled.take() {
            remove_spool(&prev);
        }
        spooled = Some(next);
    }
    Ok(spooled.expect("at least one encode pass"))
}

fn kind_name(k: IdKind) -> &'static str {
    match k {
        IdKind::Auto => "auto",
        IdKind::String => "names (renumbered in sorted order)",
        IdKind::Int => "integers (used as ids)",
    }
}

/// What every pass needs to read the inputs.
struct Ctx<'a> {
    opts: &'a TextOptions,
    layout: &'a Layout,
    cols: Columns,
    kinds: Kinds,
    types: &'a Types,
    /// The edge type of each input file that holds one edge type.
    file_etypes: &'a [Option<u32>],
    paths: &'a [PathBuf],
    threads: usize,
    block_bytes: usize,
    io_chunk: usize,
}

impl Ctx<'_> {
    fn reader(&self) -> BlockReader {
        BlockReader::new(
            self.paths.to_vec(),
            self.layout.clone(),
            self.block_bytes,
            self.io_chunk,
        )
    }

    /// The edge type of an edge of input `file` known before its endpoints are read: the
    /// file's, or (typed graphs with names) the one its relation field `rel` names.
    fn known_edge_type(&self, file: usize, rel: Option<&[u8]>, line: u64) -> Result<u32> {
        match self.file_etypes[file] {
            Some(e) => Ok(e),
            None => self
                .types
                .named_edge_type(rel)
                .map_err(|msg| StoreError::input(&self.paths[file], line, msg)),
        }
    }

    fn input_bytes(&self) -> u64 {
        self.paths
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }
}

#[derive(Default)]
struct Names {
    num_nodes: u64,
    num_relations: u64,
    /// Distinct names per node type in id order (typed graphs with names).
    type_counts: Vec<u64>,
    /// The whole node dictionary, when it fit in memory.
    node_dict: Option<NameDict>,
    rel_dict: Option<NameDict>,
    runs: usize,
}

impl Names {
    /// What the name pass found, as a line for the user.
    fn describe(&self, kinds: Kinds) -> String {
        format!(
            "names: {} nodes{}{}",
            self.num_nodes,
            if kinds.rel_names() {
                format!(", {} relations", self.num_relations)
            } else {
                String::new()
            },
            if self.runs > 0 {
                format!(" ({} sorted runs merged)", self.runs)
            } else {
                String::new()
            }
        )
    }
}

/// Pass 1: collects distinct node and relation names and writes their sorted tables.
fn collect_names(
    ctx: &Ctx,
    builder: &mut StoreBuilder,
    dict_budget: u64,
    rows_per_file: &mut [u64],
    progress: &dyn Progress,
) -> Result<Names> {
    let want_nodes = ctx.kinds.node == IdKind::String;
    let want_rels = ctx.kinds.rel_names();
    let typed_names = ctx.kinds.typed_names();
    let scratch = builder.scratch()?;
    let mut collector = NameCollector::new(dict_budget, &scratch, ctx.io_chunk);
    let mut rels = NameDict::new();
    let reader = ctx.reader();
    let counter = reader.counter();
    let mut meter = Meter::new(progress, "collect names", ctx.input_bytes(), 0);
    let cols = ctx.cols;
    par_map_blocks(
        reader,
        ctx.threads,
        |block: &Block| {
            // Sized for every name of the block, so it never grows (a growing table holds
            // its old and new buckets at once).
            let records = max_records(block);
            let mut nodes = if want_nodes {
                let keys = 2 * records * ctx.kinds.key_bytes() as usize;
                NameDict::with_capacity(2 * records, block.data.len() + keys)
            } else {
                NameDict::new()
            };
            let mut key = Vec::new();
            let mut rels = NameDict::new();
            let mut rows = 0u64;
            let path = &ctx.paths[block.file];
            for_each_record(block, ctx.layout, path, |line, f| {
                rows += 1;
                for (role, i) in [("src", cols.src), ("dst", cols.dst)]
                    .into_iter()
                    .chain(cols.rel.map(|r| ("rel", r)))
                {
                    if f[i].is_empty() {
                        return Err(StoreError::input(
                            path,
                            line,
                            format!("the {role} field is empty"),
                        ));
                    }
                    if let Some(problem) = name_problem(f[i]) {
                        return Err(StoreError::input(
                            path,
                            line,
                            format!("the {role} name {problem}"),
                        ));
                    }
                }
                if typed_names {
                    let rel = cols.rel.map(|r| f[r]);
                    let etype = ctx.known_edge_type(block.file, rel, line)?;
                    let (ts, td) = ctx.types.endpoints(etype);
                    name_key(ts, f[cols.src], &mut key);
                    nodes.insert(&key, 0);
                    name_key(td, f[cols.dst], &mut key);
                    nodes.insert(&key, 0);
                } else if want_nodes {
                    nodes.insert(f[cols.src], 0);
                    nodes.insert(f[cols.dst], 0);
                }
                if want_rels {
                    rels.insert(f[cols.rel.unwrap()], 0);
                }
                Ok(())
            })?;
            Ok((nodes, rels, rows))
        },
        |block, (nodes, block_rels, rows)| {
            rows_per_file[block.file] += rows;
            collector.add_all(&nodes)?;
            rels.absorb(&block_rels);
            let read = counter.get();
            Ok(meter.add(rows, read - meter.bytes())?)
        },
    )?;
    meter.finish()?;
    let runs = collector.runs();
    let mut names = Names {
        runs,
        ..Names::default()
    };
    if typed_names {
        let mut table = StrTabWriter::create(builder, "node_names")?;
        let mut counts = vec![0u64; ctx.types.node_types.len()];
        names.node_dict = collector.finish(|key| {
            let (t, name) = split_key(key);
            counts[t as usize] += 1;
            table.push(name)
        })?;
        names.num_nodes = table.finish(builder, "node_names")?;
        names.type_counts = counts;
    } else if want_nodes {
        let mut table = StrTabWriter::create(builder, "node_names")?;
        names.node_dict = collector.finish(|n| table.push(n))?;
        names.num_nodes = table.finish(builder, "node_names")?;
    }
    if want_rels {
        let mut table = StrTabWriter::create(builder, "relation_names")?;
        rels.emit_sorted(|n| table.push(n))?;
        names.num_relations = table.finish(builder, "relation_names")?;
        names.rel_dict = Some(rels);
    }
    Ok(names)
}

/// Cuts the sorted node-name table into id ranges whose dictionaries (with `key_bytes` more
/// per name, see [`name_key`]) fit in `budget`.
fn dictionary_ranges(
    builder: &StoreBuilder,
    n: u64,
    budget: u64,
    key_bytes: u64,
    io_chunk: usize,
) -> Result<Vec<Option<(u64, u64)>>> {
    let offsets = &builder.arrays()["node_names_offsets"];
    let mut reader = RowReader::open_array(builder.dir(), offsets, io_chunk)?;
    let mut ranges = Vec::new();
    let (mut lo, mut prev_off, mut range_bytes, mut id) = (0u64, 0i64, 0u64, 0u64);
    let mut first = true;
    while let Some(bytes) = reader.next_batch()? {
        for c in bytes.chunks_exact(8) {
            let off = i64::from_le_bytes(c.try_into().unwrap());
            if first {
                first = false;
                prev_off = off;
                continue;
            }
            let len = (off - prev_off) as u64;
            prev_off = off;
            if id > lo && range_cost(id + 1 - lo, range_bytes + len, key_bytes) > budget {
                ranges.push(Some((lo, id)));
                lo = id;
                range_bytes = 0;
            }
            range_bytes += len;
            id += 1;
        }
    }
    ranges.push(Some((lo, n)));
    Ok(ranges)
}

/// Peak bytes of [`load_range`] for `names` names of `bytes` bytes in all: their offsets and
/// bytes as read, and the dictionary (its arena, with `key_bytes` more per name, and a table
/// sized for them).
fn range_cost(names: u64, bytes: u64, key_bytes: u64) -> u64 {
    8 * (names + 1) + 2 * bytes + key_bytes * names + table_bytes(names)
}

/// Loads names `[lo, hi)` of the node-name table into a dictionary with their ids, keyed by
/// (node type, name) in a typed graph (`types` has its id ranges then).
fn load_range(builder: &StoreBuilder, lo: u64, hi: u64, types: &Types) -> Result<NameDict> {
    let offs = read_i64_range(
        &builder.array_file("node_names_offsets"),
        lo,
        hi - lo + 1,
        1 << 20,
    )?;
    let base = offs[0];
    let bytes = read_range(
        &builder.array_file("node_names_bytes"),
        1,
        base as u64,
        (offs[offs.len() - 1] - base) as u64,
    )?;
    let typed = types.is_typed();
    let names = offs.len() - 1;
    let keys = if typed {
        KEY_PREFIX as usize * names
    } else {
        0
    };
    let mut dict = NameDict::with_capacity(names, bytes.len() + keys);
    let mut key = Vec::new();
    for (i, w) in offs.windows(2).enumerate() {
        let id = lo + i as u64;
        let name = &bytes[(w[0] - base) as usize..(w[1] - base) as usize];
        if typed {
            name_key(types.type_of(id) as u32, name, &mut key);
            dict.insert(&key, id);
        } else {
            dict.insert(name, id);
        }
    }
    Ok(dict)
}

/// Why `name` cannot be stored as a name (a NUL byte, or bytes that are not UTF-8), or `None`.
/// Names are refused rather than escaped: stored names are what `node_id` looks up and what
/// exports write back, so only text that round-trips unchanged is accepted.
fn name_problem(name: &[u8]) -> Option<String> {
    if let Some(at) = memchr::memchr(0, name) {
        // Names are text; a NUL byte in one is most often a binary file read as text.
        return Some(format!(
            "holds a NUL byte at byte {}; names are text without NUL bytes (a binary file? \
             {BINARY_FORMATS})",
            at + 1
        ));
    }
    std::str::from_utf8(name).err().map(|e| {
        let at = e.valid_up_to();
        format!(
            "is not valid UTF-8 (byte 0x{:02x} at byte {}); names must be UTF-8 text \
             (re-encode the file, e.g. with iconv)",
            name[at],
            at + 1
        )
    })
}

/// Resolves the fields of one line to ids.
struct Lookup<'a> {
    node_kind: IdKind,
    rel_kind: IdKind,
    node_dict: Option<&'a NameDict>,
    rel_dict: Option<&'a NameDict>,
    num_nodes: Option<u64>,
    num_relations: Option<u64>,
    /// Every name must be in `node_dict` (one encode pass).
    must_resolve: bool,
    /// The node and edge types of a typed graph (empty otherwise).
    types: &'a Types,
}

impl Lookup<'_> {
    /// The id of endpoint `field` of node type `node_type` when the edge's type is known first
    /// (a name is looked up by its key, built in `key`; an integer is local to the type),
    /// else of the graph.
    fn node(
        &self,
        field: &[u8],
        node_type: Option<u32>,
        key: &mut Vec<u8>,
        role: &str,
        file: &PathBuf,
        line: u64,
    ) -> Result<i64> {
        let name = match node_type {
            Some(t) => {
                name_key(t, field, key);
                &key[..]
            }
            None => field,
        };
        match (self.node_kind, node_type) {
            (IdKind::Int, None) => int_id(field, role, self.num_nodes, "num_nodes", file, line),
            (IdKind::Int, Some(t)) => {
                let nt = &self.types.node_types[t as usize];
                let local = int_id(field, role, None, "", file, line)? as u64;
                if local >= nt.count {
                    return Err(StoreError::input(
                        file,
                        line,
                        format!(
                            "{role} id {local} is out of range: node type '{}' has {} nodes (ids in a per-edge-type file are local to their node type)",
                            nt.name, nt.count
                        ),
                    ));
                }
                Ok((nt.offset + local) as i64)
            }
            _ => match self.node_dict.and_then(|d| d.get(name)) {
                Some(id) => Ok(id as i64),
                None if self.must_resolve => {
                    panic!("name collected in pass 1 missing from the dictionary")
                }
                None => Ok(-1),
            },
        }
    }

    /// The edge type of a typed graph's edge `src -> dst` with relation field `rel`.
    fn edge_type(
        &self,
        src: i64,
        rel: Option<&[u8]>,
        dst: i64,
        file: &PathBuf,
        line: u64,
    ) -> Result<i64> {
        self.types
            .resolve(src as u64, rel, dst as u64)
            .map(i64::from)
            .map_err(|msg| StoreError::input(file, line, msg))
    }

    fn rel(&self, field: &[u8], file: &PathBuf, line: u64) -> Result<i64> {
        match self.rel_kind {
            IdKind::Int => int_id(
                field,
                "rel",
                self.num_relations,
                "num_relations",
                file,
                line,
            ),
            _ => Ok(self
                .rel_dict
                .and_then(|d| d.get(field))
                .expect("relation collected in pass 1") as i64),
        }
    }
}

/// Parses an integer id field, checking it against `limit` (or the int64 range).
fn int_id(
    field: &[u8],
    role: &str,
    limit: Option<u64>,
    limit_name: &str,
    file: &PathBuf,
    line: u64,
) -> Result<i64> {
    let v = parse_uint(field).ok_or_else(|| {
        StoreError::input(
            file,
            line,
            format!("{role} {} is not a non-negative integer (integer ids; set ids = \"string\" to map arbitrary names)", quoted(field)),
        )
    })?;
    match limit {
        Some(n) if v >= n => Err(StoreError::input(
            file,
            line,
            format!("{role} id {v} is out of range: {limit_name} is {n}"),
        )),
        _ if v > i64::MAX as u64 / 2 => Err(StoreError::input(
            file,
            line,
            format!("{role} id {v} is out of range (at most {})", i64::MAX / 2),
        )),
        _ => Ok(v as i64),
    }
}

/// Parses a `what` field (a weight or an edge feature): a finite number that float32 holds
/// (it is stored as float32).
fn parse_f32(field: &[u8], what: &str, file: &PathBuf, line: u64) -> Result<f32> {
    let text = String::from_utf8_lossy(field);
    let bad = |why: &str| StoreError::input(file, line, format!("{what} {} {why}", quoted(field)));
    let v: f64 = text.trim().parse().map_err(|_| bad("is not a number"))?;
    let w = v as f32;
    if !w.is_finite() {
        return Err(bad("is not a finite float32 number"));
    }
    Ok(w)
}

/// Parses a time field: an integer in the int64 range (e.g. seconds since the epoch).
fn parse_time(field: &[u8], file: &PathBuf, line: u64) -> Result<i64> {
    let text = String::from_utf8_lossy(field);
    text.trim().parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "is out of the int64 range"
            }
            _ => "is not an integer",
        };
        StoreError::input(file, line, format!("time {} {why}", quoted(field)))
    })
}

/// One encode pass over every input, appending edges to `spool`.
fn encode_pass(
    ctx: &Ctx,
    lookup: &Lookup,
    mut spool: Spool,
    stage: &str,
    mut rows_per_file: Option<&mut [u64]>,
    progress: &dyn Progress,
) -> Result<Spooled> {
    let reader = ctx.reader();
    let counter = reader.counter();
    let mut meter = Meter::new(progress, stage, ctx.input_bytes(), 0);
    let cols = ctx.cols;
    let lookup = Arc::new(lookup);
    par_map_blocks(
        reader,
        ctx.threads,
        |block: &Block| {
            let path = &ctx.paths[block.file];
            let typed = ctx.kinds.typed;
            let mut batch = EdgeBatch::with_capacity(
                max_records(block),
                cols.rel.is_some() || typed,
                cols.attrs(),
            );
            let mut key = Vec::new();
            for_each_record(block, ctx.layout, path, |line, f| {
                let rel = cols.rel.map(|r| f[r]);
                // With names or a per-edge-type file, the edge type comes first: it gives the
                // endpoints' node types.
                let named = if ctx.kinds.typed_names() || ctx.file_etypes[block.file].is_some() {
                    Some(ctx.known_edge_type(block.file, rel, line)?)
                } else {
                    None
                };
                let (ts, td) = named.map(|e| ctx.types.endpoints(e)).unzip();
                let src = lookup.node(f[cols.src], ts, &mut key, "src", path, line)?;
                let dst = lookup.node(f[cols.dst], td, &mut key, "dst", path, line)?;
                batch.src.push(src);
                batch.dst.push(dst);
                if typed {
                    let etype = match named {
                        Some(e) => i64::from(e),
                        None => lookup.edge_type(src, rel, dst, path, line)?,
                    };
                    batch.rel.push(etype);
                } else if let Some(r) = cols.rel {
                    batch.rel.push(lookup.rel(f[r], path, line)?);
                }
                if let Some(w) = cols.weight {
                    batch.weight.push(parse_f32(f[w], "weight", path, line)?);
                }
                if let Some(t) = cols.time {
                    batch.time.push(parse_time(f[t], path, line)?);
                }
                if let Some((first, dim)) = cols.feat {
                    for field in &f[first..first + dim] {
                        batch.feat.push(parse_f32(field, "feature", path, line)?);
                    }
                }
                Ok(())
            })?;
            Ok(batch)
        },
        |block, batch| {
            let split = split_index(&ctx.opts.inputs[block.file].split).expect("validated split");
            if let Some(rows) = rows_per_file.as_deref_mut() {
                rows[block.file] += batch.len() as u64;
            }
            spool.append(split, &batch)?;
            let read = counter.get();
            Ok(meter.add(batch.len() as u64, read - meter.bytes())?)
        },
    )?;
    meter.finish()?;
    spool.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan that fits when `threads` blocks of 10 bytes fit in 25 bytes.
    fn plan(threads: usize) -> Result<usize> {
        let needed = 10 * threads as u64;
        if needed > 25 {
            Err(StoreError::Budget {
                budget: 25,
                needed,
                what: format!("{threads} threads"),
            })
        } else {
            Ok(threads)
        }
    }

    #[test]
    fn the_default_thread_count_steps_down_to_what_the_budget_holds() {
        assert_eq!(fitting_threads(16, false, plan).unwrap(), 2);
        assert_eq!(fitting_threads(2, false, plan).unwrap(), 2);
    }

    #[test]
    fn an_explicit_thread_count_is_kept_or_refused() {
        let err = fitting_threads(16, true, plan).unwrap_err().to_string();
        assert!(err.contains("16 threads needs at least 160 B"), "{err}");
    }

    #[test]
    fn a_budget_too_small_for_one_thread_names_the_one_thread_plan() {
        let tiny = |threads: usize| -> Result<usize> {
            Err(StoreError::Budget {
                budget: 5,
                needed: 10 * threads as u64,
                what: format!("{threads} threads"),
            })
        };
        let err = fitting_threads(16, false, tiny).unwrap_err().to_string();
        assert!(err.contains("1 threads needs at least 10 B"), "{err}");
    }

    #[test]
    fn other_errors_are_not_retried() {
        let calls = std::cell::Cell::new(0);
        let failing = |_: usize| -> Result<usize> {
            calls.set(calls.get() + 1);
            Err(StoreError::option("io_chunk", "bad"))
        };
        assert!(fitting_threads(16, false, failing).is_err());
        assert_eq!(calls.get(), 1);
    }
}
