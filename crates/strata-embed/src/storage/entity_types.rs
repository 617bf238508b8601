//! PyTorch-BigGraph's entity types in Strata's partitioned table.
//!
//! In a typed run (a store with node types, `entity_types = true`) every node type is an
//! entity type with its own place in the table, as PBG's `EntitySchema` gives it:
//!
//! - a **partitioned** type is split over the run's `P` partitions by its own seeded
//!   permutation: partition `r` holds its positions `r * ceil(n_t / P) ..` (the last
//!   partitions may hold fewer, or none). Every partitioned type has the same `P`, as PBG
//!   requires ("all other entity types must have the same number of partitions").
//! - an **unpartitioned** type (`num_partitions = 1` in PBG) lives in one extra region, the
//!   *pinned* region `P`, read at the start of each epoch and held in memory until its end
//!   (PBG's unpartitioned embeddings). With `P = 1` every non-featurized type simply shares
//!   partition 0, which is resident all epoch anyway (PBG: with one partition on both sides
//!   unpartitioned types are treated as partitioned).
//! - a **featurized** type (PBG's `featurized`) is always pinned: its region rows are its
//!   features, and an entity's embedding is the mean of its features' rows.
//!
//! Inside a region, types follow each other in type order (in the pinned region the plain
//! types first, then the featurized ones), so each type is one contiguous **section**.
//! Rows are addressed in two views: the *entity view* (one row per entity: what bucketed
//! edges, evaluation, export and queries address) and the *storage view* (what the table
//! holds). They agree everywhere except the featurized sections of the pinned region, whose
//! entity rows are materialised from the features when read ([`FeatureBags`]).

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use strata_store::array::{decode_ints, read_all_bytes};
use strata_store::perm::Perm;
use strata_store::rng::derive;
use strata_store::Store;

use crate::config::{OptimizerKind, TableDtype, TrainConfig};
use crate::error::{EmbedError, Result};
use crate::sizes::part_bytes;

/// What the node table holds, for planning: the rows a partition count gives and what stays
/// in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeShape {
    /// Node counts of the partitioned entity types (an untyped run: one, every node).
    pub partitioned: Vec<u64>,
    /// The partition count the entity types fix (`entity_partitions`), if any.
    pub partitions: Option<u32>,
    /// A typed run's pinned region: the rows it stores (unpartitioned types' entities and
    /// featurized types' features), the featurized entities read through its entity view,
    /// and the bytes of their feature bags.
    pub pinned_rows: u64,
    pub featurized_entities: u64,
    pub bag_bytes: u64,
}

impl NodeShape {
    /// One table of `num_nodes` nodes.
    pub fn untyped(num_nodes: u64) -> NodeShape {
        NodeShape {
            partitioned: vec![num_nodes],
            partitions: None,
            pinned_rows: 0,
            featurized_entities: 0,
            bag_bytes: 0,
        }
    }

    /// Rows of a partition region with `n` partitions.
    pub fn rows(&self, n: u64) -> u64 {
        self.partitioned.iter().map(|c| c.div_ceil(n)).sum()
    }

    /// The largest partitioned type: the most partitions that leave none of them all empty.
    pub(crate) fn largest(&self) -> u64 {
        self.partitioned.iter().copied().max().unwrap_or(0)
    }

    /// Bank segments per partition (one per partitioned type).
    pub(crate) fn segments(&self) -> usize {
        self.partitioned.len().max(1)
    }

    /// Bytes of the pinned region in memory: its rows (embeddings and optimizer state), the
    /// entity view of its featurized entities and their bags.
    pub fn pinned_bytes(&self, dim: usize, optimizer: OptimizerKind, dtype: TableDtype) -> u64 {
        if self.pinned_rows == 0 {
            return 0;
        }
        part_bytes(self.pinned_rows, dim, optimizer, dtype)
            + self.featurized_entities * dim as u64 * 4
            + self.bag_bytes
    }

    /// Bytes of the pinned region on a torch device: its rows and optimizer state (float32,
    /// a slot of its own size) and the feature bags, whose rows the device holds as i64.
    pub fn device_pinned_bytes(&self, dim: usize, optimizer: OptimizerKind) -> u64 {
        if self.pinned_rows == 0 {
            return 0;
        }
        part_bytes(self.pinned_rows, dim, optimizer, TableDtype::F32) + 2 * self.bag_bytes
    }
}

/// One node type of a typed run, as PyTorch-BigGraph's entity schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityType {
    pub name: String,
    /// Global id of its first node; its nodes are `first .. first + count`.
    pub first: u64,
    pub count: u64,
    /// Split over the run's partitions; false: in the pinned region for the whole epoch.
    pub partitioned: bool,
    /// Featurized: the number of features its entities are bags of (the rows it trains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<u64>,
}

/// Where every type's entities lie in the regions of a typed partitioning: `P` partitions
/// and, when a type is not partitioned, the pinned region `P`.
#[derive(Debug, Clone)]
pub struct TypedLayout {
    pub types: Vec<EntityType>,
    pub partitions: u32,
    /// Per type: positions per partition (`ceil(count / P)`; 0 for types not partitioned).
    per_part: Vec<u64>,
    /// `start[r * T + t]` and `len[r * T + t]`: the entity-view rows of type `t` in region
    /// `r` (`r` in `0..=P`, row `P` being the pinned region).
    start: Vec<u64>,
    len: Vec<u64>,
    /// Storage rows of the pinned region's featurized types: their first row and features.
    feature_rows: Vec<Option<(u64, u64)>>,
    perms: Vec<Option<Perm>>,
}

impl TypedLayout {
    /// The layout of `types` over `partitions` partitions; permutations keyed by `seed`.
    pub fn new(types: &[EntityType], partitions: u32, seed: u64) -> TypedLayout {
        let (p, t_count) = (partitions as u64, types.len());
        let per_part: Vec<u64> = types
            .iter()
            .map(|t| {
                if t.partitioned {
                    t.count.div_ceil(p)
                } else {
                    0
                }
            })
            .collect();
        let regions = partitions as usize + 1;
        let (mut start, mut len) = (vec![0u64; regions * t_count], vec![0u64; regions * t_count]);
        for r in 0..partitions as usize {
            let mut at = 0;
            for (t, ty) in types.iter().enumerate() {
                let n = if ty.partitioned {
                    ty.count
                        .saturating_sub(r as u64 * per_part[t])
                        .min(per_part[t])
                } else {
                    0
                };
                start[r * t_count + t] = at;
                len[r * t_count + t] = n;
                at += n;
            }
        }
        // The pinned region: plain types first (entity and storage views agree there), then
        // the featurized ones.
        let pinned = partitions as usize * t_count;
        let mut feature_rows = vec![None; t_count];
        let mut at = 0;
        for featurized in [false, true] {
            for (t, ty) in types.iter().enumerate() {
                if !ty.partitioned && ty.features.is_some() == featurized {
                    start[pinned + t] = at;
                    len[pinned + t] = ty.count;
                    at += ty.count;
                }
            }
        }
        let mut stored = types
            .iter()
            .filter(|t| !t.partitioned && t.features.is_none())
            .map(|t| t.count)
            .sum::<u64>();
        for (t, ty) in types.iter().enumerate() {
            if let (false, Some(f)) = (ty.partitioned, ty.features) {
                feature_rows[t] = Some((stored, f));
                stored += f;
            }
        }
        let perms = types
            .iter()
            .enumerate()
            .map(|(t, ty)| {
                (ty.partitioned && partitions > 1 && ty.count > 0)
                    .then(|| Perm::new(ty.count, derive(derive(seed, 0x9a27), t as u64)))
            })
            .collect();
        TypedLayout {
            types: types.to_vec(),
            partitions,
            per_part,
            start,
            len,
            feature_rows,
            perms,
        }
    }

    fn at(&self, region: u32, t: usize) -> usize {
        region as usize * self.types.len() + t
    }

    /// Whether the layout has a pinned region (some type is not partitioned).
    pub fn has_pinned(&self) -> bool {
        self.types.iter().any(|t| !t.partitioned)
    }

    /// Entity-view rows of type `t` in region `region` (`partitions` is the pinned region).
    pub fn section(&self, t: usize, region: u32) -> Range<u64> {
        let i = self.at(region, t);
        self.start[i]..self.start[i] + self.len[i]
    }

    /// Entities in region `region` (entity view).
    pub fn entities_in(&self, region: u32) -> u64 {
        (0..self.types.len())
            .map(|t| self.len[self.at(region, t)])
            .sum()
    }

    /// Rows region `region` stores (the pinned region's featurized types store features).
    pub fn stored_rows(&self, region: u32) -> u64 {
        if region < self.partitions {
            return self.entities_in(region);
        }
        let plain: u64 = self
            .types
            .iter()
            .filter(|t| !t.partitioned && t.features.is_none())
            .map(|t| t.count)
            .sum();
        plain + self.feature_rows.iter().flatten().map(|f| f.1).sum::<u64>()
    }

    /// Entity-view rows of the pinned region that are plain (not featurized): the featurized
    /// entities follow them.
    pub fn plain_pinned_rows(&self) -> u64 {
        self.types
            .iter()
            .filter(|t| !t.partitioned && t.features.is_none())
            .map(|t| t.count)
            .sum()
    }

    /// The first storage row and the number of features of featurized type `t`.
    pub fn feature_rows(&self, t: usize) -> Option<(u64, u64)> {
        self.feature_rows[t]
    }

    /// Positions of partitioned type `t` per partition (0 for a type not partitioned).
    pub fn per_part(&self, t: usize) -> u64 {
        self.per_part[t]
    }

    /// The type owning global id `v`.
    pub fn type_of(&self, v: u64) -> usize {
        self.types.partition_point(|t| t.first <= v) - 1
    }

    /// `(region, entity-view row)` of global node `v`.
    #[inline]
    pub fn locate(&self, v: u64) -> (u32, u32) {
        let t = self.type_of(v);
        let ty = &self.types[t];
        let i = v - ty.first;
        if !ty.partitioned {
            let region = self.partitions;
            return (region, (self.start[self.at(region, t)] + i) as u32);
        }
        let pos = self.perms[t].as_ref().map_or(i, |p| p.apply(i));
        let r = (pos / self.per_part[t]) as u32;
        (
            r,
            (self.start[self.at(r, t)] + pos % self.per_part[t]) as u32,
        )
    }

    /// The global node at entity-view row `local` of region `region`.
    pub fn node(&self, region: u32, local: u32) -> u64 {
        let local = local as u64;
        let t = (0..self.types.len())
            .find(|&t| self.section(t, region).contains(&local))
            .expect("the row holds an entity");
        let ty = &self.types[t];
        let within = local - self.start[self.at(region, t)];
        if !ty.partitioned {
            return ty.first + within;
        }
        let pos = region as u64 * self.per_part[t] + within;
        ty.first + self.perms[t].as_ref().map_or(pos, |p| p.invert(pos))
    }
}

/// A typed run's entity types as its config asks for them, before the partitions are planned.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeSpec {
    pub types: Vec<EntityType>,
    /// The partition count `entity_partitions` (or `partitions`) fixes, if any.
    pub partitions: Option<u32>,
    /// Source and destination entity type of each relation (the store's edge types).
    pub rel_types: Vec<(usize, usize)>,
    /// Feature-bag entries of the featurized types (for the plan).
    bag_entries: u64,
}

fn config_error(key: &str, msg: String) -> EmbedError {
    EmbedError::Config(format!("embed.train.{key}: {msg}"))
}

impl TypeSpec {
    /// The entity types `cfg` gives the node types of `store`; `None` for an untyped store or
    /// `entity_types = false` (one table of every node). Refuses, naming the option, what
    /// PyTorch-BigGraph's entity schema refuses: an unknown type, a count below 1, two
    /// partitioned types with different counts, a featurized type that is partitioned or
    /// whose store has no feature bags.
    pub fn of(store: &Store, cfg: &TrainConfig) -> Result<Option<TypeSpec>> {
        let m = store.manifest();
        if !m.is_typed() || !cfg.entity_types {
            let why = if m.is_typed() {
                "entity_types is false".to_string()
            } else {
                format!("store {} has no node types", store.path().display())
            };
            for (key, given) in [
                ("entity_partitions", !cfg.entity_partitions.is_empty()),
                ("featurized", !cfg.featurized.is_empty()),
            ] {
                if given {
                    return Err(config_error(
                        key,
                        format!(
                            "{why}; entity types apply to typed stores with entity_types = true"
                        ),
                    ));
                }
            }
            return Ok(None);
        }
        let names: Vec<&str> = m.node_types.iter().map(|t| t.name.as_str()).collect();
        let find = |key: &str, name: &str| {
            names.iter().position(|n| *n == name).ok_or_else(|| {
                config_error(
                    key,
                    format!(
                        "'{name}' is not a node type of store {} (its types: {})",
                        store.path().display(),
                        names.join(", ")
                    ),
                )
            })
        };
        let mut counts: Vec<Option<u32>> = vec![None; names.len()];
        for item in &cfg.entity_partitions {
            let key = "entity_partitions";
            let (name, n) = item.rsplit_once('=').ok_or_else(|| {
                config_error(
                    key,
                    format!("expected TYPE=N such as {}=4, got '{item}'", names[0]),
                )
            })?;
            let t = find(key, name)?;
            let n = n
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| {
                    config_error(
                        key,
                        format!("partitions of '{name}' must be an integer >= 1, got '{n}'"),
                    )
                })?;
            if counts[t].replace(n).is_some() {
                return Err(config_error(key, format!("'{name}' is given twice")));
            }
        }
        let mut featurized = vec![false; names.len()];
        for name in &cfg.featurized {
            let t = find("featurized", name)?;
            if std::mem::replace(&mut featurized[t], true) {
                return Err(config_error(
                    "featurized",
                    format!("'{name}' is given twice"),
                ));
            }
            if m.node_types[t].bags.is_none() {
                return Err(config_error(
                    "featurized",
                    format!(
                        "node type '{name}' has no feature bags in store {} (convert with --node-bags {name}=FILE)",
                        store.path().display()
                    ),
                ));
            }
            if counts[t].is_some_and(|n| n > 1) {
                return Err(config_error(
                    "entity_partitions",
                    format!("'{name}' is featurized, and featurized types are unpartitioned (held in memory); give it 1 or leave it out"),
                ));
            }
        }
        let given: std::collections::BTreeSet<u32> = counts
            .iter()
            .flatten()
            .copied()
            .filter(|&n| n > 1)
            .collect();
        if given.len() > 1 {
            return Err(config_error(
                "entity_partitions",
                format!(
                    "every partitioned entity type needs the same number of partitions, as in PyTorch-BigGraph (or 1: unpartitioned), got {}",
                    cfg.entity_partitions.join(", ")
                ),
            ));
        }
        let fixed = given.first().copied();
        if let (Some(p), true) = (fixed, cfg.partitions > 1) {
            if p != cfg.partitions {
                return Err(config_error(
                    "partitions",
                    format!(
                        "{} partitions for the types entity_partitions leaves out, but it partitions others into {p}: partitioned types share one count",
                        cfg.partitions
                    ),
                ));
            }
        }
        let types: Vec<EntityType> = m
            .node_types
            .iter()
            .enumerate()
            .map(|(t, nt)| EntityType {
                name: nt.name.clone(),
                first: nt.offset,
                count: nt.count,
                partitioned: !featurized[t] && counts[t].unwrap_or(cfg.partitions) != 1,
                features: featurized[t]
                    .then(|| nt.bags.as_ref().map(|b| b.num_features))
                    .flatten(),
            })
            .collect();
        let partitions = match (fixed, cfg.partitions) {
            _ if !types.iter().any(|t| t.partitioned) => Some(1),
            (Some(p), _) => Some(p),
            (None, 0) => None,
            (None, p) => Some(p),
        };
        Ok(Some(TypeSpec {
            partitions,
            rel_types: relation_types(store),
            bag_entries: m
                .node_types
                .iter()
                .zip(&featurized)
                .filter(|(_, &f)| f)
                .filter_map(|(t, _)| t.bags.as_ref().map(|b| b.entries))
                .sum(),
            types,
        }))
    }

    /// The node table to plan: with one partition every plain type is in partition 0.
    pub fn shape(&self) -> NodeShape {
        let one = self.partitions == Some(1);
        let partitioned = |t: &EntityType| t.features.is_none() && (t.partitioned || one);
        let featurized: Vec<&EntityType> =
            self.types.iter().filter(|t| t.features.is_some()).collect();
        NodeShape {
            partitioned: self
                .types
                .iter()
                .filter(|t| partitioned(t))
                .map(|t| t.count)
                .collect(),
            partitions: self.partitions,
            pinned_rows: self
                .types
                .iter()
                .filter(|t| !partitioned(t))
                .map(|t| t.features.unwrap_or(t.count))
                .sum(),
            featurized_entities: featurized.iter().map(|t| t.count).sum(),
            bag_bytes: featurized.iter().map(|t| (t.count + 1) * 8).sum::<u64>()
                + self.bag_entries * 4,
        }
    }
}

/// The (source, destination) node type of each relation of a typed store (its edge types).
pub fn relation_types(store: &Store) -> Vec<(usize, usize)> {
    store
        .manifest()
        .edge_types
        .iter()
        .map(|e| (e.src_type as usize, e.dst_type as usize))
        .collect()
}

/// The node table of `store` as `cfg` trains it: its typed shape, or one table of every node.
pub fn node_shape(store: &Store, cfg: &TrainConfig) -> Result<NodeShape> {
    Ok(match TypeSpec::of(store, cfg)? {
        Some(spec) => spec.shape(),
        None => NodeShape::untyped(store.manifest().graph.num_nodes),
    })
}

/// The feature bags of the featurized types of `layout` from `store` (`bag_offsets_tI` and
/// `bag_features_tI`), as storage rows of the pinned region, checked as they are read; `None`
/// without featurized types.
pub fn load_bags(store: &Store, layout: &TypedLayout) -> Result<Option<Arc<FeatureBags>>> {
    let mut bags = FeatureBags {
        plain: layout.plain_pinned_rows() as u32,
        offsets: vec![0],
        rows: Vec::new(),
    };
    let corrupt = |name: &str, msg: String| {
        EmbedError::Corrupt(format!(
            "store {}: array '{name}': {msg}",
            store.path().display()
        ))
    };
    for (t, ty) in layout.types.iter().enumerate() {
        let Some((first_row, features)) = layout.feature_rows(t) else {
            continue;
        };
        let read = |name: &str| -> Result<Vec<i64>> {
            let (header, bytes) = read_all_bytes(&store.array_path(name)?)?;
            let mut vals = Vec::new();
            decode_ints(&bytes, header.dtype, &mut vals);
            Ok(vals)
        };
        let (off_name, feat_name) = (format!("bag_offsets_t{t}"), format!("bag_features_t{t}"));
        let (offsets, feats) = (read(&off_name)?, read(&feat_name)?);
        if offsets.len() as u64 != ty.count + 1 || offsets[0] != 0 {
            return Err(corrupt(
                &off_name,
                format!("expected {} offsets from 0", ty.count + 1),
            ));
        }
        let base = bags.rows.len() as u64;
        for (i, w) in offsets.windows(2).enumerate() {
            if w[1] < w[0] || w[1] as usize > feats.len() {
                return Err(corrupt(
                    &off_name,
                    format!(
                        "row {}: offset {} after {} (of {} features listed)",
                        i + 1,
                        w[1],
                        w[0],
                        feats.len()
                    ),
                ));
            }
            bags.offsets.push(base + w[1] as u64);
        }
        if offsets[offsets.len() - 1] as usize != feats.len() {
            return Err(corrupt(
                &off_name,
                format!(
                    "the last offset is {}, but {} features are listed",
                    offsets[offsets.len() - 1],
                    feats.len()
                ),
            ));
        }
        for (i, &f) in feats.iter().enumerate() {
            if !(0..features as i64).contains(&f) {
                return Err(corrupt(
                    &feat_name,
                    format!(
                        "row {i}: feature {f} is out of range: type '{}' has {features} features",
                        ty.name
                    ),
                ));
            }
            bags.rows.push((first_row + f as u64) as u32);
        }
    }
    Ok((!bags.is_empty()).then(|| Arc::new(bags)))
}

/// What a typed run's training needs beside its partitioning.
#[derive(Debug, Clone)]
pub struct TypedTraining {
    pub layout: TypedLayout,
    /// Source and destination entity type of each relation (the store's edge types).
    pub rel_types: Vec<(usize, usize)>,
    /// Negatives of the corrupted side's type (false: of every type).
    pub typed_negatives: bool,
    /// The featurized entities' features (None without featurized types).
    pub bags: Option<std::sync::Arc<FeatureBags>>,
}

impl TypedTraining {
    /// The entity types a side of type `t` draws negatives from.
    pub fn negative_types(&self, t: usize) -> Vec<usize> {
        if self.typed_negatives {
            vec![t]
        } else {
            (0..self.layout.types.len()).collect()
        }
    }
}

/// The features of a run's featurized entities, in the pinned region's entity-view order:
/// featurized entity `k` (entity-view row `plain + k`) is the mean of the storage rows
/// `rows[offsets[k]..offsets[k + 1]]`. An entity without features has a zero embedding (as
/// PBG's mean of an empty bag).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeatureBags {
    /// Entity-view rows of the pinned region before the first featurized entity.
    pub plain: u32,
    pub offsets: Vec<u64>,
    pub rows: Vec<u32>,
}

impl FeatureBags {
    /// Featurized entities.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        (self.offsets.len() * 8 + self.rows.len() * 4) as u64
    }

    /// Storage rows of entity-view row `local` of the pinned region, or `None` for a plain row.
    #[inline]
    pub fn bag(&self, local: u32) -> Option<&[u32]> {
        let k = local.checked_sub(self.plain)? as usize;
        Some(&self.rows[self.offsets[k] as usize..self.offsets[k + 1] as usize])
    }

    /// Writes the mean of `bag`'s rows into `out`, `add(row, out)` adding one row to `out`.
    #[inline]
    pub fn mean(bag: &[u32], add: impl Fn(usize, &mut [f32]), out: &mut [f32]) {
        out.fill(0.0);
        if bag.is_empty() {
            return;
        }
        for &f in bag {
            add(f as usize, out);
        }
        let scale = 1.0 / bag.len() as f32;
        out.iter_mut().for_each(|o| *o *= scale);
    }

    /// The entity view of a pinned region whose storage rows are `stored` (`rows x dim`):
    /// plain rows as stored, featurized entities as the means of their features.
    pub fn entity_view(&self, stored: &[f32], dim: usize, out: &mut Vec<f32>) {
        let plain = self.plain as usize * dim;
        out.clear();
        out.resize(plain + self.len() * dim, 0.0);
        out[..plain].copy_from_slice(&stored[..plain]);
        let add = |i: usize, acc: &mut [f32]| {
            acc.iter_mut()
                .zip(&stored[i * dim..(i + 1) * dim])
                .for_each(|(a, x)| *a += x)
        };
        for (k, dst) in out[plain..].chunks_exact_mut(dim).enumerate() {
            let bag = &self.rows[self.offsets[k] as usize..self.offsets[k + 1] as usize];
            FeatureBags::mean(bag, add, dst);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A plain entity type of `count` ids from `first` (tests here and in `partitioning`).
    pub(crate) fn ty(name: &str, first: u64, count: u64, partitioned: bool) -> EntityType {
        EntityType {
            name: name.into(),
            first,
            count,
            partitioned,
            features: None,
        }
    }

    #[test]
    fn every_node_has_one_place_and_sections_do_not_overlap() {
        let types = vec![
            ty("person", 0, 103, true),
            ty("genre", 103, 7, false),
            ty("film", 110, 40, true),
            EntityType {
                features: Some(12),
                ..ty("doc", 150, 9, false)
            },
        ];
        let l = TypedLayout::new(&types, 4, 5);
        assert!(l.has_pinned());
        let mut seen = std::collections::HashSet::new();
        for v in 0..159 {
            let (r, local) = l.locate(v);
            assert!(seen.insert((r, local)), "two nodes at {r}/{local}");
            assert_eq!(l.node(r, local), v);
            let t = l.type_of(v);
            assert!(l.section(t, r).contains(&(local as u64)), "{v}");
            assert_eq!(r == 4, !types[t].partitioned, "{v}");
        }
        // person: 26 per partition, 103 = 3 x 26 + 25; film: 10 each.
        assert_eq!(l.per_part(0), 26);
        assert_eq!(l.entities_in(3), 25 + 10);
        assert_eq!(l.section(2, 3), 25..35);
        // Pinned: genre's 7 rows, then doc's 9 entities over its 12 features.
        assert_eq!(l.section(1, 4), 0..7);
        assert_eq!(l.section(3, 4), 7..16);
        assert_eq!(l.plain_pinned_rows(), 7);
        assert_eq!(l.feature_rows(3), Some((7, 12)));
        assert_eq!(l.stored_rows(4), 19);
        assert_eq!(l.entities_in(4), 16);
    }

    #[test]
    fn a_type_smaller_than_the_partition_count_leaves_partitions_without_it() {
        let types = vec![ty("a", 0, 5, true), ty("b", 5, 100, true)];
        let l = TypedLayout::new(&types, 4, 0);
        let per: Vec<u64> = (0..4).map(|r| l.section(0, r).count() as u64).collect();
        assert_eq!(per, vec![2, 2, 1, 0]);
        assert!(!l.has_pinned());
        for v in 0..105 {
            let (r, local) = l.locate(v);
            assert_eq!(l.node(r, local), v);
        }
    }

    #[test]
    fn the_entity_view_is_the_mean_of_the_features() {
        let bags = FeatureBags {
            plain: 1,
            offsets: vec![0, 2, 2, 3],
            rows: vec![1, 2, 2],
        };
        // Stored rows: plain row 0, then features at rows 1 and 2.
        let stored = [1.0, 1.0, 2.0, 4.0, 6.0, 8.0];
        let mut view = Vec::new();
        bags.entity_view(&stored, 2, &mut view);
        assert_eq!(view, vec![1.0, 1.0, 4.0, 6.0, 0.0, 0.0, 6.0, 8.0]);
        assert_eq!(bags.bag(0), None);
        assert_eq!(bags.bag(2), Some(&[][..]));
    }
}
