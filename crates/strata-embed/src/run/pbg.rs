//! PyTorch-BigGraph checkpoints, both ways: a run exported as a checkpoint directory PBG
//! loads (`strata embed export --format pbg`), and a PBG checkpoint imported as a run on a
//! store whose node names are PBG's entity names (`strata embed import-pbg`).
//!
//! PBG's layout (its `checkpoint_storage.py`, `checkpoint_manager.py`, `graph_storages.py`):
//!
//! ```text
//! config.json                          the ConfigSchema as JSON
//! checkpoint_version.txt               V
//! embeddings_{entity}_{part}.v{V}.h5   dataset `embeddings` (count, dim) float32, attr format_version = 1
//! model.v{V}.h5                        group `model`: relations/{i}/operator/{lhs,rhs}/{param}
//!                                      (attr state_dict_key: {side}_operators.{i}.{param}),
//!                                      entities/{type}/global_embedding
//! entity_count_{entity}_{part}.txt     in the entity path: the partition's entity count
//! entity_names_{entity}_{part}.json    its entity names, in row order
//! dynamic_rel_count.txt, dynamic_rel_names.json   the relation types
//! ```
//!
//! PBG scores `(u, r, v)` as `cmp(u, f_r(v))` with one right-hand operator per relation, or
//! with dynamic relations as `cmp(g_r(u), v')` when tails are corrupted and `cmp(u', h_r(v))`
//! when heads are, with operator rows `lhs[r] = g_r` and `rhs[r] = h_r`. Strata scores a tail
//! query as `cmp(op_r(h), t)` and a head query with the row [`Relations::query_row`] gives
//! (the inverse row, or the reversed one), so an export always writes dynamic relations:
//! `lhs[r]` the tail-query row, `rhs[r]` the head-query row. Import reads either form back:
//! dynamic rows whose `rhs` is the reversed `lhs` become a run without reciprocal relations,
//! other dynamic rows a run with them; static operators (reversible forms only) become the
//! reversed rows. The Strata model is the named one when PBG's form is exactly it (`dot` =
//! none + dot, `distmult` = diagonal + dot, `complex` = complex_diagonal + dot, `transe` (L2)
//! = translation + l2), else `pbg` with that operator and comparator. PBG's `l2` clamps squared
//! distances at 1e-30 where Strata adds 1e-9, so distance scores differ by at most ~3e-5 near
//! zero. HDF5 is read and written through an [`Hdf5`] implementation (the Python package's,
//! with h5py).

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use strata_io::progress::{Meter, Progress};
use strata_io::{AlignedBuf, Engine};
use strata_store::config::{ConfigError, Section, Size};
use strata_store::strtab::NameTable;
use strata_store::Store;

use crate::config::{OptimizerKind, TableDtype, TrainConfig};
use crate::error::{io_err, EmbedError, Result};
use crate::model::{Comparator, Operator, PbgForm, ScoreKind, ScoreModel};
use crate::run::export::write_published;
use crate::run::loaded::{lookup, name_of, Loaded};
use crate::run::run_dir::{Run, RunMeta};
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::Partitioning;
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;

/// The entity type of an export (PBG's examples name a single type `all`).
pub const ENTITY: &str = "all";
/// The checkpoint version an export writes.
const VERSION: u64 = 1;
/// PBG's `FORMAT_VERSION` of its HDF5 files.
pub const FORMAT_VERSION: i64 = 1;

/// One float32 dataset of an HDF5 file.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Path below the file's root (`embeddings`, `model/relations/0/operator/lhs/diagonals`).
    pub name: String,
    pub shape: Vec<u64>,
    /// Row-major values.
    pub data: Vec<f32>,
    /// PBG's `state_dict_key` attribute (the model's parameters only).
    pub state_dict_key: Option<String>,
}

/// HDF5 files as PBG reads and writes them, outside this crate (h5py in the Python package).
pub trait Hdf5 {
    /// Writes file `path` with `datasets` and the root attribute `format_version` =
    /// [`FORMAT_VERSION`].
    fn write(&mut self, path: &Path, datasets: &[Dataset]) -> Result<()>;
    /// The root attribute `format_version` of file `path` (None when it has none), and the
    /// shape of its dataset `dataset` (None when it has none).
    fn info(&mut self, path: &Path, dataset: &str) -> Result<(Option<i64>, Option<Vec<u64>>)>;
    /// Every dataset below group `group` of file `path` (none when it has no such group), as
    /// float32 with its name relative to `group`.
    fn datasets(&mut self, path: &Path, group: &str) -> Result<Vec<Dataset>>;
    /// Rows `lo..hi` of the 2-D dataset `dataset` of file `path`, as float32 (row-major).
    fn rows(&mut self, path: &Path, dataset: &str, lo: u64, hi: u64) -> Result<Vec<f32>>;
}

/// The PBG operator and comparator that score exactly as `model`, or why none does.
pub fn form_of(model: &ScoreModel) -> Result<PbgForm> {
    model.pbg_form().map_err(EmbedError::Config)
}

/// The Strata model that scores as PBG's `form`: the registered model whose form it is (TransE
/// in the L2 norm, the one PBG has), else `pbg` with that operator and comparator.
fn kind_of(form: PbgForm, dim: usize) -> (ScoreKind, Option<PbgForm>) {
    let named = ScoreKind::ALL.iter().copied().find(|&kind| {
        let model = ScoreModel {
            kind,
            dim,
            transe_norm: 2,
            pbg: form,
        };
        // `pbg` itself takes every form: only a model of its own form names it.
        kind != ScoreKind::Pbg && model.pbg_form() == Ok(form)
    });
    match named {
        Some(kind) => (kind, None),
        None => (ScoreKind::Pbg, Some(form)),
    }
}

/// PBG's parameters of `op` for node rows of `d` reals: name (plural for dynamic relations,
/// whose tensors hold a row per relation), shape per relation, and the reals of a Strata
/// relation row it holds.
fn operator_params(
    op: Operator,
    d: usize,
    dynamic: bool,
) -> Vec<(&'static str, Vec<u64>, Range<usize>)> {
    let n = |one: &'static str, many: &'static str| if dynamic { many } else { one };
    let d64 = d as u64;
    match op {
        Operator::None => vec![],
        Operator::Translation => vec![(n("translation", "translations"), vec![d64], 0..d)],
        Operator::Diagonal => vec![(n("diagonal", "diagonals"), vec![d64], 0..d)],
        Operator::Linear => vec![(
            n("linear_transformation", "linear_transformations"),
            vec![d64, d64],
            0..d * d,
        )],
        Operator::Affine => vec![
            (
                n("linear_transformation", "linear_transformations"),
                vec![d64, d64],
                0..d * d,
            ),
            (
                n("translation", "translations"),
                vec![d64],
                d * d..d * d + d,
            ),
        ],
        Operator::ComplexDiagonal => vec![
            ("real", vec![d64 / 2], 0..d / 2),
            ("imag", vec![d64 / 2], d / 2..d),
        ],
    }
}

/// The names of relations `0..count` of `store` (ids as text without names).
fn relation_names(store: &Store, count: u64) -> Result<Vec<String>> {
    let table = if store.manifest().graph.relation_names {
        Some(NameTable::open(store, "relation_names")?)
    } else {
        None
    };
    (0..count).map(|r| name_of(table.as_ref(), r)).collect()
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| io_err("write", path, e))
}

/// Writes `names` as a JSON list of strings to `path`, one name at a time.
fn write_names(path: &Path, names: impl Iterator<Item = Result<String>>) -> Result<()> {
    let file = std::fs::File::create(path).map_err(|e| io_err("create", path, e))?;
    let mut w = BufWriter::new(file);
    let mut put = |text: &str| {
        w.write_all(text.as_bytes())
            .map_err(|e| io_err("write", path, e))
    };
    put("[")?;
    for (i, name) in names.enumerate() {
        let quoted = serde_json::to_string(&name?).expect("a string serialises");
        put(if i == 0 { "\n    " } else { ",\n    " })?;
        put(&quoted)?;
    }
    put("\n]")?;
    w.flush().map_err(|e| io_err("write", path, e))
}

/// What an export or import wrote.
#[derive(Debug, Clone, Serialize)]
pub struct PbgReport {
    pub out: PathBuf,
    pub epoch: usize,
    pub num_nodes: u64,
    pub num_relations: u64,
    pub dim: usize,
    pub partitions: u32,
    pub model: String,
    pub operator: &'static str,
    pub comparator: &'static str,
    /// Strata run: reciprocal relations; PBG checkpoint: dynamic relations (always).
    pub reciprocal: bool,
    pub seconds: f64,
}

/// Exports the loaded checkpoint to `out` as a PBG checkpoint directory (checkpoint and
/// entity path in one): one PBG partition per Strata partition, entity type [`ENTITY`],
/// dynamic relations, no global embeddings; written beside `out` and renamed into place.
/// Optimizer state is not written (PBG starts Adagrad afresh when it trains on).
pub fn export(
    l: &mut Loaded,
    out: &Path,
    overwrite: bool,
    h5: &mut dyn Hdf5,
    progress: &dyn Progress,
) -> Result<PbgReport> {
    let start = std::time::Instant::now();
    let form = form_of(&l.model)?;
    refuse_entity_types(&l.run)?;
    let abs_out = std::path::absolute(out).map_err(|e| io_err("resolve", out, e))?;
    write_published(out, overwrite, "checkpoint_version.txt", |dir| {
        write_checkpoint(l, dir, &abs_out, form, h5, progress)
    })?;
    Ok(PbgReport {
        out: out.to_path_buf(),
        epoch: l.epoch,
        num_nodes: l.run.meta.num_nodes,
        num_relations: l.run.meta.num_relations,
        dim: l.model.dim,
        partitions: l.run.meta.partitioning.partitions,
        model: l.run.meta.config.model.to_string(),
        operator: form.operator.name(),
        comparator: form.comparator.name(),
        reciprocal: true,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Refuses a run of several entity types (or an in-memory one): the export writes one PBG
/// entity type, [`ENTITY`], over the partitions.
fn refuse_entity_types(run: &Run) -> Result<()> {
    let partitioning = &run.meta.partitioning;
    match &partitioning.types {
        Some(types) if types.len() > 1 || partitioning.pinned().is_some() => {
            Err(EmbedError::Config(format!(
                "run {}: PyTorch-BigGraph export of a run with entity types ({}) is not supported: the export writes one entity type '{ENTITY}'; train with embed.train.entity_types = false (--no-entity-types) for a run it can export",
                run.dir.display(),
                types.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
            )))
        }
        _ => Ok(()),
    }
}

fn write_checkpoint(
    l: &mut Loaded,
    dir: &Path,
    abs_out: &Path,
    form: PbgForm,
    h5: &mut dyn Hdf5,
    progress: &dyn Progress,
) -> Result<()> {
    let d = l.model.dim;
    let meta = l.run.meta.clone();
    let partitioning = meta.partitioning.clone();
    let locator = partitioning.locator();
    let names = l.node_names()?;
    let mut meter = Meter::new(
        progress,
        "export pbg",
        meta.num_nodes * d as u64 * 4,
        meta.num_nodes,
    );
    for p in 0..partitioning.partitions {
        let size = partitioning.size_of(p);
        let mut rows = vec![0.0f32; size as usize * d];
        l.buffer.visit(&[p], &l.table, |_, emb| {
            emb.copy(0, &mut rows);
            Ok(())
        })?;
        h5.write(
            &dir.join(format!("embeddings_{ENTITY}_{p}.v{VERSION}.h5")),
            &[Dataset {
                name: "embeddings".into(),
                shape: vec![size, d as u64],
                data: rows,
                state_dict_key: None,
            }],
        )?;
        write_text(
            &dir.join(format!("entity_count_{ENTITY}_{p}.txt")),
            &format!("{size}\n"),
        )?;
        write_names(
            &dir.join(format!("entity_names_{ENTITY}_{p}.json")),
            (0..size as u32).map(|local| name_of(names.as_ref(), locator.node(p, local))),
        )?;
        meter.add(size, size * d as u64 * 4)?;
    }
    meter.finish()?;
    let count = meta.num_relations.max(1);
    let mut datasets = Vec::new();
    let rd = l.model.rel_dim();
    for (side, head) in [("lhs", false), ("rhs", true)] {
        let mut rows = vec![0.0f32; count as usize * rd];
        if rd > 0 {
            for (r, row) in rows.chunks_exact_mut(rd).enumerate() {
                l.relations.query_row(&l.model, r as u32, head, row);
            }
        }
        for (param, shape, reals) in operator_params(form.operator, d, true) {
            let data: Vec<f32> = rows
                .chunks_exact(rd)
                .flat_map(|row| row[reals.clone()].iter().copied())
                .collect();
            datasets.push(Dataset {
                name: format!("model/relations/0/operator/{side}/{param}"),
                shape: [vec![count], shape].concat(),
                data,
                state_dict_key: Some(format!("{side}_operators.0.{param}")),
            });
        }
    }
    h5.write(&dir.join(format!("model.v{VERSION}.h5")), &datasets)?;
    let store = l.store.clone();
    write_names(
        &dir.join("dynamic_rel_names.json"),
        relation_names(&store, count)?.into_iter().map(Ok),
    )?;
    write_text(&dir.join("dynamic_rel_count.txt"), &format!("{count}\n"))?;
    let cfg = &meta.config;
    let (loss_fn, margin) = match cfg.loss {
        crate::model::LossKind::Softmax => ("softmax", 0.1),
        crate::model::LossKind::Logistic => ("logistic", 0.1),
        crate::model::LossKind::Margin => ("ranking", cfg.margin),
    };
    let out = abs_out.display().to_string();
    let config = json!({
        "entities": {ENTITY: {"num_partitions": partitioning.partitions}},
        "relations": [{"name": "all_edges", "lhs": ENTITY, "rhs": ENTITY, "operator": form.operator.name()}],
        "dynamic_relations": true,
        "dimension": d,
        "comparator": form.comparator.name(),
        "global_emb": false,
        "bias": false,
        "loss_fn": loss_fn,
        "margin": margin,
        "init_scale": cfg.init_scale,
        "entity_path": out,
        "edge_paths": [],
        "checkpoint_path": out,
    });
    write_text(
        &dir.join("config.json"),
        &serde_json::to_string_pretty(&config).expect("serialises"),
    )?;
    write_text(&dir.join("checkpoint_version.txt"), &format!("{VERSION}\n"))
}

/// The `[embed.import_pbg]` section: a PyTorch-BigGraph checkpoint as a Strata run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ImportPbgOptions {
    /// PBG checkpoint directory (config.json, checkpoint_version.txt, model and embeddings .h5)
    #[schemars(extend("x-required" = true, "x-positional" = true, "x-kind" = "path"))]
    pub checkpoint: PathBuf,
    /// Strata store whose node (and relation) names are PBG's entity (and relation) names
    #[schemars(extend("x-required" = true, "x-kind" = "path"))]
    pub store: PathBuf,
    /// run directory to write
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// PBG's entity path (entity counts and names, relation names); default: the config's
    /// entity_path, else the checkpoint directory
    #[schemars(extend("x-kind" = "path"))]
    pub entity_path: Option<PathBuf>,
    /// node partitions of the run; 0 picks the fewest whose partition fits half of --memory
    pub partitions: u32,
    /// memory budget: one partition of the table being written, and the rows read at a time
    pub memory: Size,
    /// replace OUT if it exists
    pub overwrite: bool,
}

impl Default for ImportPbgOptions {
    /// `checkpoint`, `store` and `out` are required (empty is refused).
    fn default() -> Self {
        ImportPbgOptions {
            checkpoint: PathBuf::new(),
            store: PathBuf::new(),
            out: PathBuf::new(),
            entity_path: None,
            partitions: 0,
            memory: Size(1 << 30),
            overwrite: false,
        }
    }
}

impl Section for ImportPbgOptions {
    const NAME: &'static str = "embed.import_pbg";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        for (key, path) in [
            ("checkpoint", &self.checkpoint),
            ("store", &self.store),
            ("out", &self.out),
        ] {
            if path.as_os_str().is_empty() {
                return Err(ConfigError::new(Self::NAME, key, "is required"));
            }
        }
        if self.memory.0 < 8 << 20 {
            return Err(ConfigError::new(
                Self::NAME,
                "memory",
                "needs at least 8 MiB",
            ));
        }
        Ok(())
    }
}

/// A field of PBG's `config.json`.
struct PbgConfig {
    path: PathBuf,
    value: Value,
}

impl PbgConfig {
    fn bad(&self, key: &str, want: &str) -> EmbedError {
        EmbedError::Config(format!(
            "{}: {key}: expected {want}, got {}",
            self.path.display(),
            self.value
                .get(key)
                .map_or("nothing".into(), |v| v.to_string())
        ))
    }

    fn str_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str> {
        match self.value.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(self.bad(key, "a string")),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.value.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.bad(key, "true or false")),
        }
    }

    fn unsupported(&self, what: String) -> EmbedError {
        EmbedError::Config(format!("{}: {what}", self.path.display()))
    }
}

/// The operator named `name` in `config`.
fn operator_named(config: &PbgConfig, name: &str) -> Result<Operator> {
    serde_json::from_value(Value::String(name.into())).map_err(|_| {
        config.unsupported(format!(
            "unknown operator '{name}': expected none, translation, diagonal, linear, affine or complex_diagonal"
        ))
    })
}

/// What a PBG checkpoint holds, checked against the store it is imported onto.
struct Checkpointed {
    version: u64,
    entity: String,
    parts: u32,
    dim: usize,
    form: PbgForm,
    dynamic: bool,
    /// Operator rows in Strata's layout by Strata relation id: the lhs (dynamic) and rhs rows.
    lhs: Vec<f32>,
    rhs: Vec<f32>,
    global: Option<Vec<f32>>,
    max_norm: Option<f32>,
    init_scale: f32,
}

/// Reads and checks the checkpoint's config, version, relation names and model parameters.
fn read_checkpoint(
    o: &ImportPbgOptions,
    store: &Store,
    entity_path: &Path,
    h5: &mut dyn Hdf5,
) -> Result<Checkpointed> {
    let dir = &o.checkpoint;
    let (config, version) = read_config(dir)?;
    let (entity, parts, dim) = entity_schema(&config)?;
    let rels = relation_schema(&config, &entity, dim)?;
    let count = store.manifest().graph.num_relations.max(1);
    let ids = relation_ids(store, entity_path, &rels, count)?;
    // The operator parameters, as Strata relation rows.
    let model_path = dir.join(format!("model.v{version}.h5"));
    // Read only when there is something to read (global_emb is looked up only then, as PBG).
    let needed = rels.form.operator.rel_dim(dim) > 0 || config.bool_or("global_emb", true)?;
    let mut model = ModelFile::open(h5, model_path, needed)?;
    let rhs = side_rows(&mut model, "rhs", &rels, dim, &ids, count)?;
    let lhs = if rels.dynamic {
        side_rows(&mut model, "lhs", &rels, dim, &ids, count)?
    } else {
        Vec::new()
    };
    let global = if config.bool_or("global_emb", true)? {
        Some(global_embedding(&mut model, &entity, dim)?)
    } else {
        None
    };
    model.finish(rels.form.operator)?;
    let max_norm = match config.value.get("max_norm") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|m| *m > 0.0)
                .ok_or_else(|| config.bad("max_norm", "a positive number or null"))?
                as f32,
        ),
    };
    let init_scale = config
        .value
        .get("init_scale")
        .and_then(Value::as_f64)
        .unwrap_or(1e-3) as f32;
    Ok(Checkpointed {
        version,
        entity,
        parts,
        dim,
        form: rels.form,
        dynamic: rels.dynamic,
        lhs,
        rhs,
        global,
        max_norm,
        init_scale,
    })
}

/// A text file of the checkpoint, or an error naming it.
fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| EmbedError::Config(format!("{}: cannot read it: {e}", path.display())))
}

/// The checkpoint's `config.json` and its version (`checkpoint_version.txt`).
fn read_config(dir: &Path) -> Result<(PbgConfig, u64)> {
    let path = dir.join("config.json");
    let config = PbgConfig {
        value: serde_json::from_str(&read_text(&path)?).map_err(|e| {
            EmbedError::Config(format!("{}: not PBG's config JSON: {e}", path.display()))
        })?,
        path,
    };
    let version_path = dir.join("checkpoint_version.txt");
    let version: u64 = read_text(&version_path)?.trim().parse().map_err(|_| {
        EmbedError::Config(format!(
            "{}: expected the checkpoint's version number",
            version_path.display()
        ))
    })?;
    Ok((config, version))
}

/// The config's one entity type: its name, partition count and the embedding dimension.
fn entity_schema(config: &PbgConfig) -> Result<(String, u32, usize)> {
    let entities = config
        .value
        .get("entities")
        .and_then(Value::as_object)
        .ok_or_else(|| config.bad("entities", "an object of entity types"))?;
    let [(entity, schema)] = entities.iter().collect::<Vec<_>>()[..] else {
        return Err(config.unsupported(format!(
            "entities: {} entity types; a Strata run holds one (import one type's checkpoint per store)",
            entities.len()
        )));
    };
    let parts = schema
        .get("num_partitions")
        .and_then(Value::as_u64)
        .filter(|&n| n >= 1 && n <= u32::MAX as u64)
        .ok_or_else(|| config.bad("entities", "num_partitions of at least 1"))?
        as u32;
    if schema.get("featurized").and_then(Value::as_bool) == Some(true) {
        return Err(config.unsupported(format!(
            "entities: '{entity}' is featurized (embeddings of features, not of entities), which Strata runs do not hold"
        )));
    }
    let dim = config
        .value
        .get("dimension")
        .and_then(Value::as_u64)
        .filter(|&d| d >= 1)
        .ok_or_else(|| config.bad("dimension", "a positive integer"))? as usize;
    if let Some(other) = schema.get("dimension").and_then(Value::as_u64) {
        if other as usize != dim {
            return Err(config.unsupported(format!(
                "entities: '{entity}' overrides the dimension ({other} instead of {dim}); import it with dimension = {other}"
            )));
        }
    }
    Ok((entity.clone(), parts, dim))
}

/// The config's relation types: the one operator they share with the comparator, whether
/// they are dynamic, and their entries.
struct RelationSchema<'a> {
    form: PbgForm,
    dynamic: bool,
    entries: &'a [Value],
}

/// Reads and checks the relation types of `config` (every one between `entity` and itself,
/// one operator, a form Strata scores alike in both directions unless dynamic).
fn relation_schema<'a>(
    config: &'a PbgConfig,
    entity: &str,
    dim: usize,
) -> Result<RelationSchema<'a>> {
    if config.bool_or("bias", false)? {
        return Err(config.unsupported(
            "bias = true (the first coordinate as a bias) has no Strata score function".into(),
        ));
    }
    let comparator: Comparator =
        serde_json::from_value(Value::String(config.str_or("comparator", "cos")?.into()))
            .map_err(|_| config.bad("comparator", "dot, cos, l2 or squared_l2"))?;
    let dynamic = config.bool_or("dynamic_relations", false)?;
    let relations = config
        .value
        .get("relations")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty())
        .ok_or_else(|| config.bad("relations", "a list of relation types"))?;
    let mut operator = None;
    for (i, rel) in relations.iter().enumerate() {
        for side in ["lhs", "rhs"] {
            if rel.get(side).and_then(Value::as_str) != Some(entity) {
                return Err(config.unsupported(format!(
                    "relations[{i}].{side}: expected entity type '{entity}', got {}",
                    rel.get(side).unwrap_or(&Value::Null)
                )));
            }
        }
        let op = operator_named(
            config,
            rel.get("operator")
                .and_then(Value::as_str)
                .unwrap_or("none"),
        )?;
        if operator.is_some_and(|o| o != op) {
            return Err(config.unsupported(format!(
                "relations[{i}].operator: '{}' differs from relations[0]'s '{}'; a Strata run scores every relation with one operator",
                op.name(),
                operator.map_or("", Operator::name)
            )));
        }
        operator = Some(op);
    }
    let form = PbgForm {
        operator: operator.expect("at least one relation"),
        comparator,
    };
    if dynamic && relations.len() != 1 {
        return Err(config.unsupported(format!(
            "dynamic_relations = true with {} entries in relations; PBG needs exactly one",
            relations.len()
        )));
    }
    if !dynamic && !form.reversible() {
        return Err(config.unsupported(format!(
            "relations without dynamic_relations score (u, r, v) as {}(u, {}_r(v)) for both directions, which Strata computes only for forms whose reversed operator scores alike; this one is not (see docs/embed.md, PyTorch-BigGraph)",
            form.comparator.name(),
            form.operator.name()
        )));
    }
    if form.operator == Operator::ComplexDiagonal && dim % 2 == 1 {
        return Err(config.unsupported(format!(
            "operator complex_diagonal needs an even dimension, got {dim}"
        )));
    }
    Ok(RelationSchema {
        form,
        dynamic,
        entries: relations,
    })
}

/// PBG's relation names, in its relation order, as the store's relation ids (the store has
/// `count` relation types, as many as PBG's).
fn relation_ids(
    store: &Store,
    entity_path: &Path,
    rels: &RelationSchema,
    count: u64,
) -> Result<Vec<usize>> {
    let names_path = entity_path.join("dynamic_rel_names.json");
    let names: Vec<String> = if names_path.exists() {
        serde_json::from_str(&read_text(&names_path)?).map_err(|e| {
            EmbedError::Config(format!(
                "{}: expected a JSON list of relation names: {e}",
                names_path.display()
            ))
        })?
    } else if !rels.dynamic {
        rels.entries
            .iter()
            .map(|r| {
                r.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            })
            .collect()
    } else {
        return Err(EmbedError::Config(format!(
            "{}: missing; dynamic relations are named there (give --entity-path)",
            names_path.display()
        )));
    };
    let pbg_count = if rels.dynamic {
        names.len()
    } else {
        rels.entries.len()
    };
    if pbg_count as u64 != count || names.len() != pbg_count {
        return Err(EmbedError::Config(format!(
            "{}: {} relation types, but store {} has {count}",
            names_path.display(),
            names.len(),
            store.path().display()
        )));
    }
    let mut ids = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let r = lookup(store, "relation_names", name, count, "relation")
            .map_err(|e| EmbedError::Config(format!("{} entry {i}: {e}", names_path.display())))?;
        ids.push(r as usize);
    }
    Ok(ids)
}

/// The datasets of the checkpoint's model file, taken one by one: what is left at the end is
/// not a parameter Strata knows.
struct ModelFile {
    path: PathBuf,
    left: BTreeMap<String, Dataset>,
}

impl ModelFile {
    /// The datasets of `path`'s `model` group, read only when `needed` (the model has
    /// operator parameters or a global embedding).
    fn open(h5: &mut dyn Hdf5, path: PathBuf, needed: bool) -> Result<ModelFile> {
        let datasets = if needed {
            check_format(h5, &path, "model")?;
            h5.datasets(&path, "model")?
        } else {
            Vec::new()
        };
        let left = datasets.into_iter().map(|d| (d.name.clone(), d)).collect();
        Ok(ModelFile { path, left })
    }

    /// Dataset `model/{name}` of shape `shape`; `why` says why it must be there.
    fn take(&mut self, name: &str, shape: &[u64], why: &str) -> Result<Dataset> {
        let ds = self.left.remove(name).ok_or_else(|| {
            EmbedError::Config(format!(
                "{}: dataset model/{name} is missing ({why})",
                self.path.display()
            ))
        })?;
        if ds.shape != shape {
            return Err(EmbedError::Config(format!(
                "{}: dataset model/{name} has shape {:?}, expected {shape:?}",
                self.path.display(),
                ds.shape
            )));
        }
        Ok(ds)
    }

    /// Refuses a dataset no parameter of `operator` took.
    fn finish(self, operator: Operator) -> Result<()> {
        match self.left.keys().next() {
            Some(extra) => Err(EmbedError::Config(format!(
                "{}: dataset model/{extra} is not a parameter of operator {} (a different operator or a newer PBG?)",
                self.path.display(),
                operator.name()
            ))),
            None => Ok(()),
        }
    }
}

/// One side's (`lhs` or `rhs`) operator parameters as Strata relation rows (`count x
/// rel_dim`), PBG's relation `i` at row `ids[i]`.
fn side_rows(
    model: &mut ModelFile,
    side: &str,
    rels: &RelationSchema,
    dim: usize,
    ids: &[usize],
    count: u64,
) -> Result<Vec<f32>> {
    let (operator, pbg_count) = (rels.form.operator, ids.len());
    let rd = operator.rel_dim(dim);
    let mut rows = vec![0.0f32; count as usize * rd];
    // Dynamic relations: one tensor (`relations/0/...`) with a row per relation; static
    // ones: a tensor per relation (`relations/{i}/...`).
    let tensors: Vec<(usize, Vec<usize>)> = if rels.dynamic {
        vec![(0, (0..pbg_count).collect())]
    } else {
        (0..pbg_count).map(|i| (i, vec![i])).collect()
    };
    for (param, shape, reals) in operator_params(operator, dim, rels.dynamic) {
        let per = reals.len();
        let want: Vec<u64> = if rels.dynamic {
            [vec![pbg_count as u64], shape].concat()
        } else {
            shape
        };
        for (idx, members) in &tensors {
            let name = format!("relations/{idx}/operator/{side}/{param}");
            let why = format!("operator {}", operator.name());
            let ds = model.take(&name, &want, &why)?;
            for (j, &i) in members.iter().enumerate() {
                let at = ids[i] * rd;
                rows[at + reals.start..at + reals.end]
                    .copy_from_slice(&ds.data[j * per..(j + 1) * per]);
            }
        }
    }
    Ok(rows)
}

/// The entity type's global embedding (`dim` reals, added to every entity by PBG).
fn global_embedding(model: &mut ModelFile, entity: &str, dim: usize) -> Result<Vec<f32>> {
    let name = format!("entities/{entity}/global_embedding");
    Ok(model.take(&name, &[dim as u64], "global_emb is on")?.data)
}

/// Refuses an HDF5 file whose `format_version` is not PBG's (or that lacks `dataset`).
fn check_format(h5: &mut dyn Hdf5, path: &Path, dataset: &str) -> Result<Option<Vec<u64>>> {
    let (version, shape) = h5.info(path, dataset)?;
    if version != Some(FORMAT_VERSION) {
        return Err(EmbedError::Config(format!(
            "{}: format_version {}, expected PyTorch-BigGraph's {FORMAT_VERSION}",
            path.display(),
            version.map_or("missing".into(), |v| v.to_string())
        )));
    }
    Ok(shape)
}

/// A row as PBG's lookup and `adjust_embs` leave it: renormalised to `max_norm` (as
/// `torch.embedding_renorm_`, scale `max_norm / (norm + 1e-7)`), then the global embedding added.
fn adjust(row: &mut [f32], max_norm: Option<f32>, global: Option<&[f32]>) {
    if let Some(m) = max_norm {
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        if norm > m {
            let scale = m / (norm + 1e-7);
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
    if let Some(g) = global {
        row.iter_mut().zip(g).for_each(|(v, gv)| *v += gv);
    }
}

/// Imports the PBG checkpoint `o.checkpoint` as a run in `o.out` on store `o.store` (see the
/// module's notes), reading entity rows a chunk at a time: each Strata partition is filled in
/// memory and written whole, in as many passes over PBG's files as the table has partitions.
/// The run's optimizer state starts at zero; `strata embed train --resume` trains on.
pub fn import(
    o: &ImportPbgOptions,
    h5: &mut dyn Hdf5,
    progress: &dyn Progress,
) -> Result<PbgReport> {
    let start = std::time::Instant::now();
    let store = Store::open(&o.store)?;
    let graph = &store.manifest().graph;
    let (n, num_relations) = (graph.num_nodes, graph.num_relations);
    let entity_path = entity_path(o);
    let c = read_checkpoint(o, &store, &entity_path, h5)?;
    let parts = pbg_partitions(o, h5, &entity_path, &c, n)?;
    let (mut cfg, model) = import_config(o, &c);
    let params = relation_params(&c, &model, &mut cfg);
    let partitions = import_partitions(o, n, &cfg)?;
    cfg.partitions = partitions;
    cfg.validate()
        .map_err(|e| EmbedError::Config(e.to_string()))?;
    let partitioning = Partitioning::new(n, partitions, cfg.seed)?;
    let layout = import_layout(&partitioning, &cfg);
    let mut relations = Relations::new(
        &model,
        num_relations,
        cfg.reciprocal,
        false,
        cfg.seed,
        cfg.row_init(),
    );
    relations.params.copy_from_slice(&params);
    relations.state.fill(0.0);
    let meta = RunMeta::fresh(&store, cfg.clone(), partitioning.clone(), layout)?;
    let table = ImportTable {
        store: &store,
        checkpoint: &c,
        parts: &parts,
        partitioning: &partitioning,
        layout,
        rows_per_read: ((o.memory.0 / 4) / (c.dim as u64 * 4 + 64)).max(1),
    };
    write_published(&o.out, o.overwrite, "run.json", |dir| {
        table.write(dir, h5, progress)?;
        let run = Run {
            dir: dir.to_path_buf(),
            meta: meta.clone(),
        };
        let (rp, sp) = run.relation_paths(0);
        relations.save(&rp, &sp)?;
        run.commit()
    })?;
    Ok(PbgReport {
        out: o.out.clone(),
        epoch: 0,
        num_nodes: n,
        num_relations,
        dim: c.dim,
        partitions,
        model: model.kind.to_string(),
        operator: c.form.operator.name(),
        comparator: c.form.comparator.name(),
        reciprocal: cfg.reciprocal,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Where the checkpoint's entity counts and names are: `--entity-path`, else the config's
/// `entity_path` when it is a directory, else the checkpoint directory.
fn entity_path(o: &ImportPbgOptions) -> PathBuf {
    let config_entity_path = std::fs::read_to_string(o.checkpoint.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| {
            v.get("entity_path")
                .and_then(Value::as_str)
                .map(PathBuf::from)
        })
        .filter(|p| p.is_dir());
    o.entity_path
        .clone()
        .or(config_entity_path)
        .unwrap_or_else(|| o.checkpoint.clone())
}

/// One of PBG's partitions: its embeddings file, its names file and its entity count.
struct PbgPart {
    embeddings: PathBuf,
    names: PathBuf,
    count: u64,
}

/// PBG's partitions of the checkpoint, each checked against its entity count; together they
/// must hold the store's `n` nodes.
fn pbg_partitions(
    o: &ImportPbgOptions,
    h5: &mut dyn Hdf5,
    entity_path: &Path,
    c: &Checkpointed,
    n: u64,
) -> Result<Vec<PbgPart>> {
    let d = c.dim;
    let mut parts = Vec::with_capacity(c.parts as usize);
    let mut total = 0u64;
    for k in 0..c.parts {
        let count_path = entity_path.join(format!("entity_count_{}_{k}.txt", c.entity));
        let count: u64 = read_text(&count_path)?.trim().parse().map_err(|_| {
            EmbedError::Config(format!(
                "{}: expected the partition's entity count",
                count_path.display()
            ))
        })?;
        let embeddings = o
            .checkpoint
            .join(format!("embeddings_{}_{k}.v{}.h5", c.entity, c.version));
        let shape = check_format(h5, &embeddings, "embeddings")?;
        if shape != Some(vec![count, d as u64]) {
            return Err(EmbedError::Config(format!(
                "{}: dataset embeddings has shape {}, expected [{count}, {d}] ({} entities of dimension {d})",
                embeddings.display(),
                shape.map_or("missing".into(), |s| format!("{s:?}")),
                count_path.display()
            )));
        }
        let names = entity_path.join(format!("entity_names_{}_{k}.json", c.entity));
        parts.push(PbgPart {
            embeddings,
            names,
            count,
        });
        total += count;
    }
    if total != n {
        return Err(EmbedError::Config(format!(
            "{}: the checkpoint holds {total} entities of type '{}', but store {} has {n} nodes",
            entity_path.display(),
            c.entity,
            o.store.display()
        )));
    }
    Ok(parts)
}

/// The imported run's config (before its partition count) and model: the registered model
/// of the checkpoint's form, else `pbg` with it.
fn import_config(o: &ImportPbgOptions, c: &Checkpointed) -> (TrainConfig, ScoreModel) {
    let (kind, pbg) = kind_of(c.form, c.dim);
    let cfg = TrainConfig {
        model: kind,
        dim: c.dim,
        transe_norm: 2,
        operator: pbg.map(|f| f.operator),
        comparator: pbg.map(|f| f.comparator),
        optimizer: OptimizerKind::Adagrad,
        init_scale: c.init_scale,
        memory: o.memory,
        // One PBG entity type: one table of every node, also on a typed store.
        entity_types: false,
        ..TrainConfig::default()
    };
    let model = ScoreModel {
        kind,
        dim: c.dim,
        transe_norm: 2,
        pbg: c.form,
    };
    (cfg, model)
}

/// The Strata relation rows of the checkpoint's operators, and whether the run needs
/// reciprocal relations for them (set in `cfg`).
fn relation_params(c: &Checkpointed, model: &ScoreModel, cfg: &mut TrainConfig) -> Vec<f32> {
    let reversed = |rows: &[f32]| -> Vec<f32> {
        let mut out = rows.to_vec();
        let rd = model.rel_dim();
        if rd > 0 {
            out.chunks_exact_mut(rd)
                .for_each(|r| model.reverse_relation(r));
        }
        out
    };
    if !c.dynamic {
        // cmp(u, f_r(v)) both ways: the tail-query row is f_r reversed.
        cfg.reciprocal = false;
        reversed(&c.rhs)
    } else if c.form.reversible() && reversed(&c.lhs) == c.rhs {
        cfg.reciprocal = false;
        c.lhs.clone()
    } else {
        cfg.reciprocal = true;
        [c.lhs.clone(), c.rhs.clone()].concat()
    }
}

/// The table layout of an imported run. An imported table is float32 (the rows are written
/// as such); `--init-from` turns it into a bf16 run where wanted.
fn import_layout(p: &Partitioning, cfg: &TrainConfig) -> TableLayout {
    TableLayout::new(p, cfg.dim, cfg.optimizer, TableDtype::F32)
}

/// The partition count of the imported run: `--partitions`, else the fewest whose partition
/// fits half the budget.
fn import_partitions(o: &ImportPbgOptions, n: u64, cfg: &TrainConfig) -> Result<u32> {
    if o.partitions > 0 {
        return Ok(o.partitions);
    }
    (1..=n.max(1) as u32)
        .find(|&p| {
            Partitioning::new(n, p, cfg.seed)
                .is_ok_and(|q| import_layout(&q, cfg).part_bytes() <= o.memory.0 / 2)
        })
        .ok_or_else(|| {
            EmbedError::Budget(format!(
                "memory {} cannot hold one partition of a {}-dim table even with one node per partition",
                strata_store::units::fmt_bytes(o.memory.0),
                cfg.dim
            ))
        })
}

/// The imported run's table, written partition by partition from PBG's embedding files
/// (each read `rows_per_read` rows at a time, once per Strata partition).
struct ImportTable<'a> {
    store: &'a Store,
    checkpoint: &'a Checkpointed,
    parts: &'a [PbgPart],
    partitioning: &'a Partitioning,
    layout: TableLayout,
    rows_per_read: u64,
}

impl ImportTable<'_> {
    /// Writes `table-0.bin` in `dir`.
    fn write(&self, dir: &Path, h5: &mut dyn Hdf5, progress: &dyn Progress) -> Result<()> {
        let (n, d) = (self.partitioning.num_nodes, self.checkpoint.dim);
        let partitions = self.partitioning.partitions;
        let engine = Engine::shared();
        let table = TableFile::open(&engine, &dir.join("table-0.bin"), true)?;
        let mut seen = vec![0u64; n.div_ceil(64) as usize];
        let mut meter = Meter::new(
            progress,
            "import pbg",
            partitions as u64 * n * d as u64 * 4,
            partitions as u64 * n,
        );
        let mut buf = AlignedBuf::new(self.layout.part_bytes() as usize);
        for p in 0..partitions {
            buf.full_mut().fill(0);
            let floats: &mut [f32] =
                bytemuck::cast_slice_mut(&mut buf.full_mut()[..self.layout.part_bytes() as usize]);
            for part in self.parts {
                self.fill(p, part, floats, &mut seen, h5, &mut meter)?;
            }
            table.write_partition(&engine, &self.layout, p, &mut buf)?;
        }
        table.sync()?;
        meter.finish()?;
        Ok(())
    }

    /// Copies the rows of PBG partition `part` that Strata partition `p` holds into `floats`
    /// (its embeddings), with PBG's `max_norm` and global embedding applied. The first pass
    /// (`p == 0`) also refuses an entity named twice, marking each in `seen`.
    fn fill(
        &self,
        p: u32,
        part: &PbgPart,
        floats: &mut [f32],
        seen: &mut [u64],
        h5: &mut dyn Hdf5,
        meter: &mut Meter<'_>,
    ) -> Result<()> {
        let (n, d, c) = (
            self.partitioning.num_nodes,
            self.checkpoint.dim,
            self.checkpoint,
        );
        let locator = self.partitioning.locator();
        let names = read_names(&part.names, part.count)?;
        for lo in (0..part.count).step_by(self.rows_per_read as usize) {
            let hi = (lo + self.rows_per_read).min(part.count);
            let rows = h5.rows(&part.embeddings, "embeddings", lo, hi)?;
            if rows.len() != (hi - lo) as usize * d {
                return Err(EmbedError::Config(format!(
                    "{}: rows {lo}..{hi} of embeddings hold {} values, expected {}",
                    part.embeddings.display(),
                    rows.len(),
                    (hi - lo) as usize * d
                )));
            }
            for (i, row) in rows.chunks_exact(d).enumerate() {
                let at = lo as usize + i;
                let id = lookup(self.store, "node_names", &names[at], n, "node").map_err(|e| {
                    EmbedError::Config(format!("{} entry {at}: {e}", part.names.display()))
                })?;
                if p == 0 {
                    let (word, bit) = ((id / 64) as usize, id % 64);
                    if seen[word] >> bit & 1 == 1 {
                        return Err(EmbedError::Config(format!(
                            "{} entry {at}: '{}' appears twice in the checkpoint's entity names",
                            part.names.display(),
                            names[at]
                        )));
                    }
                    seen[word] |= 1 << bit;
                }
                let (q, local) = locator.locate(id);
                if q == p {
                    let out = &mut floats[local as usize * d..(local as usize + 1) * d];
                    out.copy_from_slice(row);
                    adjust(out, c.max_norm, c.global.as_deref());
                }
            }
            meter.add(hi - lo, (hi - lo) * d as u64 * 4)?;
        }
        Ok(())
    }
}

/// The `count` entity names of PBG's names file `path`.
fn read_names(path: &Path, count: u64) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| EmbedError::Config(format!("{}: cannot read it: {e}", path.display())))?;
    let names: Vec<String> = serde_json::from_str(&text).map_err(|e| {
        EmbedError::Config(format!(
            "{}: expected a JSON list of entity names: {e}",
            path.display()
        ))
    })?;
    if names.len() as u64 != count {
        return Err(EmbedError::Config(format!(
            "{}: {} names, but the partition has {count} entities",
            path.display(),
            names.len()
        )));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(kind: ScoreKind, pbg: PbgForm) -> ScoreModel {
        ScoreModel {
            kind,
            dim: 6,
            transe_norm: 2,
            pbg,
        }
    }

    #[test]
    fn named_models_map_to_their_pbg_form_and_back() {
        for kind in [
            ScoreKind::Dot,
            ScoreKind::DistMult,
            ScoreKind::ComplEx,
            ScoreKind::TransE,
        ] {
            let form = form_of(&model(kind, PbgForm::default())).unwrap();
            assert_eq!(kind_of(form, 4), (kind, None), "{kind:?}");
        }
        let rescal = PbgForm {
            operator: Operator::Linear,
            comparator: Comparator::Dot,
        };
        assert_eq!(form_of(&model(ScoreKind::Pbg, rescal)).unwrap(), rescal);
        assert_eq!(kind_of(rescal, 4), (ScoreKind::Pbg, Some(rescal)));
        let e = form_of(&model(ScoreKind::RotatE, PbgForm::default())).unwrap_err();
        assert!(e
            .to_string()
            .contains("model rotate has no PyTorch-BigGraph form"));
        let mut l1 = model(ScoreKind::TransE, PbgForm::default());
        l1.transe_norm = 1;
        assert!(form_of(&l1).unwrap_err().to_string().contains("no L1"));
    }

    #[test]
    fn operator_parameters_cover_the_relation_row_once() {
        let d = 6;
        for op in [
            Operator::None,
            Operator::Translation,
            Operator::Diagonal,
            Operator::Linear,
            Operator::Affine,
            Operator::ComplexDiagonal,
        ] {
            for dynamic in [false, true] {
                let params = operator_params(op, d, dynamic);
                let mut covered = vec![0; op.rel_dim(d)];
                for (name, shape, reals) in &params {
                    assert_eq!(
                        shape.iter().product::<u64>() as usize,
                        reals.len(),
                        "{name}"
                    );
                    reals.clone().for_each(|i| covered[i] += 1);
                }
                assert!(covered.iter().all(|&c| c == 1), "{op:?}: {covered:?}");
            }
        }
        let names: Vec<_> = operator_params(Operator::Affine, d, true)
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(names, ["linear_transformations", "translations"]);
        assert_eq!(
            operator_params(Operator::Diagonal, d, false)[0].0,
            "diagonal"
        );
    }

    #[test]
    fn rows_are_renormalised_then_shifted_as_pbg_looks_them_up() {
        let mut row = [3.0f32, 4.0];
        adjust(&mut row, Some(1.0), Some(&[0.5, -0.5]));
        let scale = 1.0 / (5.0 + 1e-7);
        assert_eq!(row, [3.0 * scale + 0.5, 4.0 * scale - 0.5]);
        let mut short = [0.3f32, 0.4];
        adjust(&mut short, Some(1.0), None);
        assert_eq!(short, [0.3, 0.4]);
    }
}
