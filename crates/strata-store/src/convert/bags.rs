//! Feature bags of a typed store's node types: each node a bag of feature ids, what
//! PyTorch-BigGraph's featurized entities are (an entity's embedding is the mean of its
//! features'). Read from `--node-bags TYPE=FILE` files of `NODE<TAB>FEATURE FEATURE ...`
//! lines (blank lines and `#` comments skipped; a node without a line has an empty bag), and
//! written as `bag_offsets_tI` (int64, count + 1), `bag_features_tI` (feature ids) and the
//! feature names `bag_names_tI_offsets` / `bag_names_tI_bytes`, sorted and unique, so that a
//! feature's id is its rank (docs/formats.md, "Feature bags").
//!
//! A node is named as in the edge lists: by name in a store with node names, else by its
//! local id within its type. A bags file is held in memory while it is converted (its bytes,
//! the features' names and the bags), so it must fit the conversion's `--memory`.

use std::path::{Path, PathBuf};

use crate::array::IO_CHUNK;
use crate::error::{quoted, Result, StoreError};
use crate::manifest::{id_dtype_for, BagInfo, NodeType};
use crate::npy::DType;
use crate::store::StoreBuilder;
use crate::strtab::{NameTable, StrTabWriter};

/// One node's bag: the line it came from and its features (slices of the file).
type Bag<'d> = Option<(u64, Vec<&'d [u8]>)>;

/// Bytes a bags file of `len` bytes holds in memory while converted: the file, a slice per
/// feature listed (16 bytes) and a feature id (8) for about one listed feature per 4 bytes.
fn held_bytes(len: u64) -> u64 {
    len + len / 4 * 24
}

/// Writes the feature bags `specs` (`TYPE=FILE` items) into `builder` and records them in
/// `node_types`; `node_names`: the store names its nodes. Returns a summary line per type.
pub(crate) fn write_bags(
    builder: &mut StoreBuilder,
    specs: &[String],
    node_types: &mut [NodeType],
    node_names: bool,
    memory: u64,
) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for spec in specs {
        let (name, file) = spec.split_once('=').ok_or_else(|| {
            StoreError::option("node_bags", format!("expected TYPE=FILE, got '{spec}'"))
        })?;
        let t = node_types
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| {
                let known: Vec<&str> = node_types.iter().map(|t| t.name.as_str()).collect();
                StoreError::option(
                    "node_bags",
                    format!(
                        "'{name}' is not a node type (the node types: {})",
                        known.join(", ")
                    ),
                )
            })?;
        if node_types[t].bags.is_some() {
            return Err(StoreError::option(
                "node_bags",
                format!("node type '{name}' is given twice"),
            ));
        }
        let path = PathBuf::from(file);
        let len = super::file_len(&path)?;
        if held_bytes(len) > memory {
            return Err(StoreError::option(
                "node_bags",
                format!(
                    "{} ({len} bytes) is held in memory while it is converted, about {} bytes, more than --memory {memory}; raise --memory",
                    path.display(),
                    held_bytes(len)
                ),
            ));
        }
        let data = std::fs::read(&path).map_err(|e| StoreError::os("read", &path, e))?;
        let names = if node_names {
            let arrays = builder.arrays();
            Some(NameTable::open_at(
                builder.dir(),
                &arrays["node_names_offsets"],
                &arrays["node_names_bytes"],
                None,
            )?)
        } else {
            None
        };
        let bags = parse(&path, &data, &node_types[t], names.as_ref())?;
        let info = write(builder, t, &bags, &path)?;
        lines.push(format!(
            "feature bags of '{name}': {} features, {} listed over {} nodes ({} with a bag)",
            info.num_features,
            info.entries,
            node_types[t].count,
            bags.iter().filter(|b| b.is_some()).count()
        ));
        node_types[t].bags = Some(info);
    }
    Ok(lines)
}

/// The bag of each local id of `ty` (None: no line), as slices of `data`.
fn parse<'d>(
    path: &Path,
    data: &'d [u8],
    ty: &NodeType,
    names: Option<&NameTable>,
) -> Result<Vec<Bag<'d>>> {
    let mut bags: Vec<Bag> = vec![None; ty.count as usize];
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        let line_no = i as u64 + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) || line.starts_with(b"#") {
            continue;
        }
        let split = line
            .iter()
            .position(|&b| b == b'\t')
            .or_else(|| line.iter().position(u8::is_ascii_whitespace))
            .unwrap_or(line.len());
        let (node, rest) = (&line[..split], &line[split..]);
        let local = match names {
            Some(table) => table
                .find_in(node, ty.offset, ty.offset + ty.count)?
                .map(|v| v - ty.offset),
            None => std::str::from_utf8(node)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|&v| v < ty.count),
        }
        .ok_or_else(|| {
            StoreError::input(
                path,
                line_no,
                match names {
                    Some(_) => format!(
                        "node {} is not a '{}' node of the edge lists",
                        quoted(node),
                        ty.name
                    ),
                    None => format!(
                        "node {} is not a local id of node type '{}' (0..{})",
                        quoted(node),
                        ty.name,
                        ty.count
                    ),
                },
            )
        })?;
        let features: Vec<&[u8]> = rest
            .split(u8::is_ascii_whitespace)
            .filter(|f| !f.is_empty())
            .collect();
        if let Some((first, _)) = bags[local as usize].replace((line_no, features)) {
            return Err(StoreError::input(
                path,
                line_no,
                format!("node {} has a bag already (line {first})", quoted(node)),
            ));
        }
    }
    Ok(bags)
}

/// Writes type `t`'s bags: offsets, feature ids (ranks of the sorted unique feature names)
/// and the names.
fn write(builder: &mut StoreBuilder, t: usize, bags: &[Bag], path: &Path) -> Result<BagInfo> {
    let mut features: Vec<&[u8]> = bags.iter().flatten().flat_map(|(_, f)| f.clone()).collect();
    let entries = features.len() as u64;
    features.sort_unstable();
    features.dedup();
    if features.is_empty() {
        return Err(StoreError::bad_file(path, "lists no features"));
    }
    let num_features = features.len() as u64;
    let mut offsets = builder.writer(&format!("bag_offsets_t{t}"), DType::I64, &[], IO_CHUNK)?;
    let mut ids = builder.writer(
        &format!("bag_features_t{t}"),
        id_dtype_for(num_features),
        &[],
        IO_CHUNK,
    )?;
    let mut end = 0i64;
    offsets.write(&[0i64])?;
    for bag in bags {
        let bag = bag.as_ref().map_or(&[][..], |(_, f)| &f[..]);
        let found: Vec<i64> = bag
            .iter()
            .map(|f| features.binary_search(f).expect("listed") as i64)
            .collect();
        ids.write_ints(&found)?;
        end += found.len() as i64;
        offsets.write(&[end])?;
    }
    builder.add(&format!("bag_offsets_t{t}"), offsets.finish()?);
    builder.add(&format!("bag_features_t{t}"), ids.finish()?);
    let prefix = format!("bag_names_t{t}");
    let mut names = StrTabWriter::create(builder, &prefix)?;
    for f in &features {
        names.push(f)?;
    }
    names.finish(builder, &prefix)?;
    Ok(BagInfo {
        num_features,
        entries,
    })
}
