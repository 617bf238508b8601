//! Writing the renumbered arrays into the store builder: node-indexed rows permuted, node ids
//! mapped, topology segments moved to their nodes' new places.

use std::collections::BTreeMap;

use strata_store::array::{read_rows, NpyWriter};
use strata_store::ids::IdCheck;
use strata_store::{ArrayInfo, Progress, Store, StoreBuilder, StoreError};

use super::{for_each_chunk, load_indptr, scan_ids, ReorderPlan, ROW_ARRAYS};
use crate::error::{GraphError, Result};

/// The new numbering: `old_of_new[new] = old` and its inverse.
pub(super) struct Permutation<'a> {
    pub old_of_new: &'a [u32],
    pub new_of_old: &'a [u32],
}

/// Writes every array of `store` into `builder`, permuted (node-indexed rows) and mapped (node
/// ids), then `original_id`. Names that share a file in the input (the CSC of a symmetrized
/// store is its CSR) share one in the output.
pub(super) fn write_arrays(
    store: &Store,
    builder: &mut StoreBuilder,
    perm: &Permutation,
    plan: &ReorderPlan,
    progress: &dyn Progress,
) -> Result<()> {
    let arrays = &store.manifest().arrays;
    let mut written: BTreeMap<String, String> = BTreeMap::new();
    for (name, info) in arrays {
        if let Some(first) = written.get(&info.file) {
            builder.alias(name, first);
            continue;
        }
        progress.stage(&format!("write {name}"), 0, info.shape[0]);
        let done = if name.starts_with("edges_") {
            let out = writer(builder, info, plan)?;
            map_ids(
                store,
                name,
                out,
                perm,
                plan,
                IdCheck::edges(store, name)?,
                true,
            )?
        } else if matches!(name.as_str(), "node_train" | "node_valid" | "node_test") {
            let out = writer(builder, info, plan)?;
            map_ids(
                store,
                name,
                out,
                perm,
                plan,
                IdCheck::nodes(store, name, "node")?,
                false,
            )?
        } else if ROW_ARRAYS.contains(&name.as_str()) {
            let out = writer(builder, info, plan)?;
            permute_rows(store, name, out, perm, plan, progress)?
        } else if let Some(base) = name
            .strip_suffix("_indptr")
            .or_else(|| name.strip_suffix("_indices"))
        {
            for (part, info) in permute_topology(store, builder, base, perm, plan)? {
                written.insert(info.file.clone(), part.clone());
                builder.add(&part, info);
            }
            continue;
        } else {
            return Err(GraphError::Store(StoreError::Invalid {
                store: store.path().to_path_buf(),
                msg: format!(
                    "reorder: the store has an array this reorder cannot permute: '{name}'"
                ),
            }));
        };
        written.insert(info.file.clone(), name.clone());
        builder.add(name, done);
    }
    // A reordered input's original_id moved with its rows above.
    if arrays.contains_key("original_id") {
        return Ok(());
    }
    let id_dtype = store.manifest().graph.id_dtype;
    let mut out = builder.writer("original_id", id_dtype, &[], plan.io_chunk as usize)?;
    for chunk in perm.old_of_new.chunks(plan.io_chunk as usize / 8) {
        let ids: Vec<i64> = chunk.iter().map(|&v| v as i64).collect();
        out.write_ints(&ids)?;
    }
    builder.add("original_id", out.finish()?);
    Ok(())
}

/// A writer of the array described by `info` (same file name, dtype and row shape).
fn writer(builder: &StoreBuilder, info: &ArrayInfo, plan: &ReorderPlan) -> Result<NpyWriter> {
    Ok(NpyWriter::create(
        &builder.dir().join(&info.file),
        info.dtype,
        &info.shape[1..],
        plan.io_chunk as usize,
    )?)
}

/// `out = new_of_old[src]`, of every value (`edges` false) or of the first and last column of
/// each row (an edge's source and destination; a relation between them stays), checked by
/// `check` first.
fn map_ids(
    store: &Store,
    name: &str,
    mut out: NpyWriter,
    perm: &Permutation,
    plan: &ReorderPlan,
    mut check: IdCheck,
    edges: bool,
) -> Result<ArrayInfo> {
    let columns = store.require(name)?.shape.get(1).copied().unwrap_or(1) as usize;
    let map = |v: i64| perm.new_of_old[v as usize] as i64;
    let mut mapped = Vec::new();
    for_each_chunk(store, name, plan.io_chunk, |vals| {
        check.check(vals)?;
        mapped.clear();
        mapped.extend_from_slice(vals);
        if edges {
            for row in mapped.chunks_exact_mut(columns) {
                row[0] = map(row[0]);
                row[columns - 1] = map(row[columns - 1]);
            }
        } else {
            mapped.iter_mut().for_each(|v| *v = map(*v));
        }
        Ok(out.write_ints(&mapped)?)
    })?;
    Ok(out.finish()?)
}

/// `out[new] = src[old_of_new[new]]` for the rows of array `name`, gathered through the I/O
/// engine in chunks of the plan's rows.
fn permute_rows(
    store: &Store,
    name: &str,
    mut out: NpyWriter,
    perm: &Permutation,
    plan: &ReorderPlan,
    progress: &dyn Progress,
) -> Result<ArrayInfo> {
    let path = store.array_path(name)?;
    let mut rows: Vec<u64> = Vec::with_capacity(plan.chunk_rows as usize);
    let (mut done_rows, mut done_bytes) = (0u64, 0u64);
    for chunk in perm.old_of_new.chunks(plan.chunk_rows as usize) {
        rows.clear();
        rows.extend(chunk.iter().map(|&v| v as u64));
        let (_, bytes) = read_rows(&path, &rows)?;
        out.write_bytes(&bytes)?;
        done_rows += chunk.len() as u64;
        done_bytes += bytes.len() as u64;
        if !progress.update(done_rows, done_bytes) {
            return Err(GraphError::Store(StoreError::Cancelled));
        }
    }
    Ok(out.finish()?)
}

/// The topology `{base}_indptr`/`{base}_indices` renumbered: new node `v`'s segment is old node
/// `old_of_new[v]`'s, its ids mapped, in the same order within the segment. The indices are
/// read into memory (one id an entry): the segments of consecutive new nodes lie anywhere in
/// them. Returns both arrays' names and manifest entries.
fn permute_topology(
    store: &Store,
    builder: &StoreBuilder,
    base: &str,
    perm: &Permutation,
    plan: &ReorderPlan,
) -> Result<Vec<(String, ArrayInfo)>> {
    let (ip_name, ix_name) = (format!("{base}_indptr"), format!("{base}_indices"));
    let (Some(ip_info), Some(ix_info)) = (store.array(&ip_name), store.array(&ix_name)) else {
        return Err(GraphError::Store(StoreError::Invalid {
            store: store.path().to_path_buf(),
            msg: format!("reorder: array '{base}_*' has no matching indptr or indices"),
        }));
    };
    let ip = load_indptr(store, &ip_name, ix_info.shape[0], plan.io_chunk)?;
    let mut ix = vec![0u32; ix_info.shape[0] as usize];
    let field = if base == "csc" { "src" } else { "dst" };
    scan_ids(store, &ix_name, field, plan.io_chunk, |k, v| ix[k] = v)?;
    let batch = (plan.io_chunk / 8).max(1) as usize;
    let mut buf: Vec<i64> = Vec::with_capacity(batch);

    let mut out_ip = writer(builder, ip_info, plan)?;
    let mut end = 0i64;
    buf.push(0);
    for &old in perm.old_of_new {
        end += (ip[old as usize + 1] - ip[old as usize]) as i64;
        buf.push(end);
        if buf.len() >= batch {
            out_ip.write_ints(&buf)?;
            buf.clear();
        }
    }
    out_ip.write_ints(&buf)?;
    buf.clear();

    let mut out_ix = writer(builder, ix_info, plan)?;
    for &old in perm.old_of_new {
        let segment = &ix[ip[old as usize] as usize..ip[old as usize + 1] as usize];
        for piece in segment.chunks(batch) {
            if buf.len() + piece.len() > batch {
                out_ix.write_ints(&buf)?;
                buf.clear();
            }
            buf.extend(piece.iter().map(|&v| perm.new_of_old[v as usize] as i64));
        }
    }
    out_ix.write_ints(&buf)?;
    Ok(vec![
        (ip_name, out_ip.finish()?),
        (ix_name, out_ix.finish()?),
    ])
}
