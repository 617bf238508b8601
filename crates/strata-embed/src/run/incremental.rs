//! Incremental training (`embed.train.init_from`): a new run on a store that gained nodes and
//! edges starts from a checkpoint of an earlier run.
//!
//! Nodes are matched through the two stores' id maps: by name where the stores keep node names
//! (`node_names_*`, sorted, so the match is one merge of the two tables), else by id (the old
//! store's ids `0..n_old` are the new store's first `n_old` ids). In typed stores the match is
//! per node type, types matched by name. Relations are matched by name (`relation_names_*`, or
//! a typed store's `(source type, relation, destination type)`), else by id. A known node keeps
//! its embedding row and optimizer state, bit for bit, at its new id; a new node keeps the
//! usual initialisation of the new run; the same holds for relation rows and their inverses.
//! A node or relation of the old run missing from the new store is refused: carrying all of
//! the old model is the point of the option.
//!
//! The old table is remapped into the new run's partitioning in a streaming pass: groups of
//! new partitions held in memory, the old table read through in row chunks once per group, all
//! within the budget (see [`remap_table`]).

use std::path::Path;
use std::sync::Arc;

use strata_io::progress::{Meter, Progress};
use strata_io::{AlignedBuf, Engine};
use strata_store::error::quoted;
use strata_store::strtab::NameTable;
use strata_store::units::fmt_bytes;
use strata_store::Store;

use crate::config::{TrainConfig, Which};
use crate::error::{EmbedError, Result};
use crate::run::run_dir::{is_run, Run, RunMeta};
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::Partitioning;
use crate::storage::relations::Relations;
use crate::storage::shared::SharedRows;
use crate::storage::table::TableFile;

/// Examples of missing names quoted in an error.
const EXAMPLES: usize = 5;

/// Refuses an old run whose stored state cannot seed `cfg`: a different model, dimension,
/// TransE norm, optimizer (state layout) or reciprocal setting, or an owner-mode rank's run.
pub fn check_compatible(old: &RunMeta, cfg: &TrainConfig, from: &Path) -> Result<()> {
    if old.partitioning.featurized() {
        return Err(featurized_init_error());
    }
    let a = &old.config;
    let (form_a, form_b) = (a.pbg_form(), cfg.pbg_form());
    let fields: [(&str, String, String); 7] = [
        ("model", a.model.to_string(), cfg.model.to_string()),
        (
            "operator",
            format!("{:?}", form_a.operator),
            format!("{:?}", form_b.operator),
        ),
        (
            "comparator",
            format!("{:?}", form_a.comparator),
            format!("{:?}", form_b.comparator),
        ),
        ("dim", a.dim.to_string(), cfg.dim.to_string()),
        (
            "transe_norm",
            a.transe_norm.to_string(),
            cfg.transe_norm.to_string(),
        ),
        (
            "optimizer",
            format!("{:?}", a.optimizer),
            format!("{:?}", cfg.optimizer),
        ),
        (
            "reciprocal",
            a.reciprocal.to_string(),
            cfg.reciprocal.to_string(),
        ),
    ];
    if let Some((field, was, is)) = fields.iter().find(|(_, was, is)| was != is) {
        return Err(EmbedError::Config(format!(
            "embed.train.init_from: run {} was trained with {field} {was}, this run asks for {is}; the rows can only seed a run of the same {field}",
            from.display()
        )));
    }
    if old.owner_rank.is_some() {
        return Err(EmbedError::Config(format!(
            "embed.train.init_from: {} holds one rank's partitions of an owner-mode run; gather the ranks into one run first (strata embed gather)",
            from.display()
        )));
    }
    Ok(())
}

/// Node id ranges matched by name between stores: `(type name, first id, end id)`; one
/// unnamed range in an untyped store.
fn node_segments(store: &Store) -> Vec<(String, u64, u64)> {
    let m = store.manifest();
    if m.node_types.is_empty() {
        return vec![(String::new(), 0, m.graph.num_nodes)];
    }
    m.node_types
        .iter()
        .map(|t| (t.name.clone(), t.offset, t.offset + t.count))
        .collect()
}

fn missing_error(
    what: &str,
    count: u64,
    examples: &[String],
    old: &Store,
    new: &Store,
) -> EmbedError {
    EmbedError::Config(format!(
        "embed.train.init_from: {count} {what}(s) of the old run's store {} are not in store {} (e.g. {}); the new store must hold every {what} of the old one (incremental training carries all of them)",
        old.path().display(),
        new.path().display(),
        examples.join(", ")
    ))
}

/// The new id of each old node (`len() == ` the old store's node count), matched by name
/// where both stores keep node names, else by id (per node type in typed stores).
pub fn node_map(old: &Store, new: &Store) -> Result<Vec<u64>> {
    let (om, nm) = (old.manifest(), new.manifest());
    if om.node_types.is_empty() != nm.node_types.is_empty() {
        return Err(EmbedError::Config(format!(
            "embed.train.init_from: store {} is {}typed and store {} is {}typed; nodes can only be matched between stores of the same kind",
            old.path().display(),
            if om.node_types.is_empty() { "un" } else { "" },
            new.path().display(),
            if nm.node_types.is_empty() { "un" } else { "" },
        )));
    }
    if om.graph.node_names != nm.graph.node_names {
        let (with, without) = if om.graph.node_names {
            (old, new)
        } else {
            (new, old)
        };
        return Err(EmbedError::Config(format!(
            "embed.train.init_from: store {} has node names and store {} has none; convert both with names, or both with integer ids",
            with.path().display(),
            without.path().display()
        )));
    }
    let names = if om.graph.node_names {
        Some((
            NameTable::open(old, "node_names")?,
            NameTable::open(new, "node_names")?,
        ))
    } else {
        None
    };
    let new_segments = node_segments(new);
    let mut map = vec![0u64; om.graph.num_nodes as usize];
    let mut missing = 0u64;
    let mut examples = Vec::new();
    for (ty, lo, hi) in node_segments(old) {
        let Some(&(_, nlo, nhi)) = new_segments.iter().find(|(t, _, _)| *t == ty) else {
            if hi > lo {
                return Err(missing_error(
                    "node type",
                    1,
                    &[format!("'{ty}'")],
                    old,
                    new,
                ));
            }
            continue;
        };
        match &names {
            Some((ot, nt)) => {
                // Both ranges are sorted byte-wise: one merge matches them.
                let mut j = nlo;
                for i in lo..hi {
                    let name = ot.get(i as usize)?;
                    while j < nhi && nt.get(j as usize)? < name {
                        j += 1;
                    }
                    if j < nhi && nt.get(j as usize)? == name {
                        map[i as usize] = j;
                        j += 1;
                    } else {
                        missing += 1;
                        if examples.len() < EXAMPLES {
                            examples.push(quoted(name));
                        }
                    }
                }
            }
            None => {
                let kept = (hi - lo).min(nhi - nlo);
                for i in 0..kept {
                    map[(lo + i) as usize] = nlo + i;
                }
                for i in kept..hi - lo {
                    missing += 1;
                    if examples.len() < EXAMPLES {
                        examples.push(format!("id {}", lo + i));
                    }
                }
            }
        }
    }
    if missing > 0 {
        return Err(missing_error("node", missing, &examples, old, new));
    }
    Ok(map)
}

/// Relation names of a store: `relation_names_*`, or a typed store's edge types as
/// `(source type, relation, destination type)`; `None` where relations have ids only.
fn relation_keys(store: &Store) -> Result<Option<Vec<String>>> {
    let m = store.manifest();
    if !m.node_types.is_empty() {
        let ty = |t: u64| m.node_types[t as usize].name.as_str();
        return Ok(Some(
            m.edge_types
                .iter()
                .map(|e| format!("({}, {}, {})", ty(e.src_type), e.relation, ty(e.dst_type)))
                .collect(),
        ));
    }
    if !m.graph.relation_names {
        return Ok(None);
    }
    let t = NameTable::open(store, "relation_names")?;
    Ok(Some(
        (0..t.len())
            .map(|i| t.name(i))
            .collect::<std::result::Result<_, _>>()?,
    ))
}

/// The new relation of each old relation (at least one entry: stores without relation types
/// train relation 0), matched by name where both stores name them, else by id.
pub fn relation_map(old: &Store, new: &Store) -> Result<Vec<u32>> {
    let (on, nn) = (
        old.manifest().graph.num_relations.max(1),
        new.manifest().graph.num_relations.max(1),
    );
    match (relation_keys(old)?, relation_keys(new)?) {
        (Some(ok), Some(nk)) => {
            let mut map = Vec::with_capacity(ok.len());
            let mut examples = Vec::new();
            for key in &ok {
                match nk.iter().position(|k| k == key) {
                    Some(r) => map.push(r as u32),
                    None => examples.push(format!("'{key}'")),
                }
            }
            if !examples.is_empty() {
                let count = examples.len() as u64;
                examples.truncate(EXAMPLES);
                return Err(missing_error("relation", count, &examples, old, new));
            }
            if map.is_empty() {
                map.push(0);
            }
            Ok(map)
        }
        (None, None) if on <= nn => Ok((0..on as u32).collect()),
        (None, None) => Err(missing_error(
            "relation",
            on - nn,
            &[format!("id {nn}")],
            old,
            new,
        )),
        (ok, _) => {
            let (with, without) = if ok.is_some() { (old, new) } else { (new, old) };
            Err(EmbedError::Config(format!(
                "embed.train.init_from: store {} names its relations and store {} does not; relations cannot be matched",
                with.path().display(),
                without.path().display()
            )))
        }
    }
}

/// Copies each old relation's row and optimizer state (and its inverse's, with reciprocal
/// relations) to its new relation `map[r]`; the other rows of `new` keep their values.
pub fn remap_relations(old: &Relations, new: &mut Relations, map: &[u32]) {
    let (d, s) = (new.dim, new.state_per_row);
    if d == 0 {
        return;
    }
    let mut copy = |from: usize, to: usize| {
        new.params[to * d..(to + 1) * d].copy_from_slice(&old.params[from * d..(from + 1) * d]);
        new.state[to * s..(to + 1) * s].copy_from_slice(&old.state[from * s..(from + 1) * s]);
    };
    for (r, &to) in map.iter().enumerate() {
        copy(r, to as usize);
        if old.inverse_offset > 0 {
            copy(
                r + old.inverse_offset as usize,
                (to + new.inverse_offset) as usize,
            );
        }
    }
}

/// One side of a remap: a table file, its layout and its partitioning.
pub struct TableSide<'a> {
    pub file: &'a TableFile,
    pub layout: &'a TableLayout,
    pub partitioning: &'a Partitioning,
}

/// Old rows read at once at least (or a whole old partition, when smaller).
const MIN_CHUNK_ROWS: u64 = 1024;

/// Writes the rows of every old node, embedding and optimizer state, into the new table at
/// its new id `map[old id]`; rows of new nodes keep what the new table holds. Works within
/// `budget` bytes: groups of `k` new regions (the partitions, then a typed run's pinned
/// region) are held in memory while the old table's regions are read through in row chunks,
/// once per group. Returns the number of passes over the old
/// table. Both layouts must have the same `dim` and `state_per_row`; their dtypes may differ
/// (values are widened on reading and rounded to nearest on writing).
pub fn remap_table(
    engine: &Arc<Engine>,
    old: &TableSide,
    new: &TableSide,
    map: &[u64],
    budget: u64,
    progress: &dyn Progress,
) -> Result<usize> {
    let (dim, spr) = (new.layout.dim, new.layout.state_per_row);
    assert_eq!((old.layout.dim, old.layout.state_per_row), (dim, spr));
    // A chunk is read into an aligned buffer and decoded into the row vectors: twice its bytes.
    let row_cost = 2 * (dim + spr) as u64 * 4;
    let min_chunk = old.partitioning.part_size.min(MIN_CHUNK_ROWS) * row_cost;
    // The partitions, then a typed run's pinned region (of its own size).
    let regions = new.partitioning.regions();
    let region_bytes = |p: u32| new.layout.region(p).part_bytes();
    let part_bytes = regions.iter().map(|&p| region_bytes(p)).max().unwrap_or(0);
    if budget < part_bytes + min_chunk {
        return Err(EmbedError::Budget(format!(
            "embed.train.init_from: the remap of the old table needs at least {} (one new partition of {} and {} rows of the old table), the budget leaves {}; raise --memory",
            fmt_bytes(part_bytes + min_chunk),
            fmt_bytes(part_bytes),
            min_chunk / row_cost,
            fmt_bytes(budget)
        )));
    }
    let k = ((budget - min_chunk) / part_bytes).clamp(1, regions.len() as u64) as usize;
    let chunk_rows = ((budget - k as u64 * part_bytes) / row_cost)
        .clamp(1, old.partitioning.part_size.max(1)) as usize;
    let (old_loc, new_loc) = (old.partitioning.locator(), new.partitioning.locator());
    let mut group: Vec<AlignedBuf> = (0..k)
        .map(|_| AlignedBuf::new(part_bytes as usize))
        .collect();
    let mut emb = vec![0f32; chunk_rows * dim];
    let mut state = vec![0f32; chunk_rows * spr];
    let old_regions = old.partitioning.regions();
    let old_bytes = old.layout.table_bytes(old.partitioning.partitions);
    let mut passes = 0;
    for members in regions.chunks(k) {
        for (&p, buf) in members.iter().zip(group.iter_mut()) {
            new.file.read_partition(engine, new.layout, p, buf)?;
        }
        passes += 1;
        let mut meter = Meter::new(
            progress,
            &format!("init_from pass {passes}"),
            old_bytes,
            old.partitioning.num_nodes,
        );
        for &q in &old_regions {
            let size = old.partitioning.size_of(q);
            let mut start = 0u64;
            while start < size {
                let rows = (size - start).min(chunk_rows as u64) as usize;
                old.file
                    .read_rows(engine, old.layout, q, start, &mut emb[..rows * dim])?;
                old.file
                    .read_state_rows(engine, old.layout, q, start, &mut state[..rows * spr])?;
                for l in 0..rows {
                    let v = old_loc.node(q, (start + l as u64) as u32);
                    let (p, nl) = new_loc.locate(map[v as usize]);
                    let Some(at) = members.iter().position(|&m| m == p) else {
                        continue;
                    };
                    let rows = SharedRows::region(
                        &mut group[at].full_mut()[..region_bytes(p) as usize],
                        &new.layout.region(p),
                    );
                    rows.store(nl as usize, &emb[l * dim..(l + 1) * dim]);
                    rows.store_state(nl as usize, &state[l * spr..(l + 1) * spr]);
                }
                meter.add(rows as u64, rows as u64 * row_cost / 2)?;
                start += rows as u64;
            }
        }
        meter.finish()?;
        for (&p, buf) in members.iter().zip(group.iter_mut()) {
            new.file.write_partition(engine, new.layout, p, buf)?;
        }
    }
    new.file.sync()?;
    Ok(passes)
}

/// The run a new run starts from, checked against the new store and config, with its nodes
/// and relations matched to the new store's (all before the new run writes anything).
pub struct Origin {
    run: Run,
    which: Which,
    /// New id of each old node, and new relation of each old relation.
    nodes: Vec<u64>,
    relations: Vec<u32>,
}

impl Origin {
    /// Opens checkpoint `which` of the run in `from` to seed a run of `cfg` on `store`.
    pub fn open(from: &Path, which: Which, cfg: &TrainConfig, store: &Store) -> Result<Origin> {
        if !is_run(from) {
            return Err(EmbedError::Config(format!(
                "embed.train.init_from: {} is not a run directory (no run.json)",
                from.display()
            )));
        }
        let run = Run::open(from).map_err(|e| unreadable(from, e))?;
        check_compatible(&run.meta, cfg, from)?;
        // The old store names the old ids; it must be the one the run trained on, unchanged.
        let old_store = run.store().map_err(|e| unreadable(from, e))?;
        Ok(Origin {
            nodes: node_map(&old_store, store)?,
            relations: relation_map(&old_store, store)?,
            run,
            which,
        })
    }

    /// Bytes held while open (the node map).
    pub fn bytes(&self) -> u64 {
        self.nodes.len() as u64 * 8
    }

    /// Seeds `run`, a new run just created (epoch 0, not yet committed): node rows into its
    /// current table, relation rows into its epoch-0 relation files. `budget`: bytes the
    /// remap's buffers may hold besides [`Origin::bytes`] (the relations are held before the
    /// remap, not during it).
    pub fn apply(self, run: &Run, budget: u64, progress: &dyn Progress) -> Result<()> {
        let old = &self.run;
        let ckpt = old.checkpoint(self.which).clone();
        {
            let old_rel = old.relations(&ckpt).map_err(|e| unreadable(&old.dir, e))?;
            let (rp, sp) = run.relation_paths(run.meta.current.epoch);
            let mut new_rel = run.meta.empty_relations();
            new_rel.load(&rp, &sp)?;
            remap_relations(&old_rel, &mut new_rel, &self.relations);
            new_rel.save(&rp, &sp)?;
        }
        let engine = Engine::shared();
        let old_file = TableFile::open(&engine, &old.table_path(&ckpt.table), false)?;
        let new_file = TableFile::open(&engine, &run.table_path(&run.meta.current.table), false)?;
        let passes = remap_table(
            &engine,
            &TableSide {
                file: &old_file,
                layout: &old.meta.layout,
                partitioning: &old.meta.partitioning,
            },
            &TableSide {
                file: &new_file,
                layout: &run.meta.layout,
                partitioning: &run.meta.partitioning,
            },
            &self.nodes,
            budget,
            progress,
        )?;
        let known = self.nodes.len() as u64;
        progress.message(&format!(
            "initialised from {} epoch {} ({:?} checkpoint): {known} known nodes and {} relations carried with their optimizer state, {} new nodes fresh; {passes} pass(es) over the old table ({} partitions into {}) within {}",
            old.dir.display(),
            ckpt.epoch,
            self.which,
            self.relations.len(),
            run.meta.num_nodes - known,
            old.meta.partitioning.partitions,
            run.meta.partitioning.partitions,
            fmt_bytes(budget)
        ));
        Ok(())
    }
}

fn unreadable(from: &Path, e: EmbedError) -> EmbedError {
    EmbedError::Config(format!(
        "embed.train.init_from: cannot use run {}: {e}",
        from.display()
    ))
}

/// The refusal of `init_from` from or into a run with featurized entity types.
pub(crate) fn featurized_init_error() -> EmbedError {
    EmbedError::Config(
        "embed.train.init_from: runs with featurized entity types (embed.train.featurized) cannot start from or seed another run yet (their rows are features, matched by no node); train the featurized types as plain entities, or start from scratch".into(),
    )
}
