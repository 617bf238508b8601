//! The grids of a store, and a grid built on its own, for `strata check`: each grid's manifest and arrays, its block index
//! (from 0 to the edge count, never decreasing), every edge record's offsets inside its block
//! (a compressed grid's blocks decoded first: a code that does not decode is a problem naming
//! the block), and its degree arrays (non-negative, summing to the edge count). Problems are added to the
//! store's [`Checked`] under the grid's path inside the store (`grids/NAME/edges.npy`), or a
//! grid's own under its file names.

use std::path::Path;

use strata_io::progress::{Meter, Progress};
use strata_store::array::{decode_ints, RowReader};
use strata_store::check::{Checked, CHUNK};
use strata_store::ids::IndptrCheck;
use strata_store::npy::read_header;
use strata_store::Store;

use crate::build::grids_dir;
use crate::error::GridError;
use crate::error::Result;
use crate::grid::Grid;
use crate::layout::{GridManifest, EDGE_BYTES, EDGE_CODES, GRID_MANIFEST};

/// Checks every grid built for `store` (none is fine).
pub fn check_grids(store: &Store, checked: &mut Checked, progress: &dyn Progress) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(grids_dir(store.path())) else {
        return Ok(());
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // A build in progress (or killed) is not a grid yet; readers skip it too.
        .filter(|n| !n.contains(".partial-"))
        .collect();
    names.sort();
    let n = store.manifest().graph.num_nodes;
    for name in names {
        let dir = grids_dir(store.path()).join(&name);
        check_grid(&dir, &format!("grids/{name}/"), Some(n), checked, progress)?;
    }
    Ok(())
}

/// Checks the grid in `dir` on its own: one built straight from an input edge list
/// (`strata grid build INPUT --out DIR`), which no store's vertex count bounds. Its files are
/// named as in `dir` (`edges.npy`).
pub fn check_grid_dir(dir: &Path, checked: &mut Checked, progress: &dyn Progress) -> Result<()> {
    check_grid(dir, "", None, checked, progress)
}

/// Checks the grid in `dir`, naming its files `PREFIX + FILE`; a store's grid must have the
/// store's `num_nodes` vertices.
fn check_grid(
    dir: &Path,
    prefix: &str,
    num_nodes: Option<u64>,
    checked: &mut Checked,
    progress: &dyn Progress,
) -> Result<()> {
    let rel = |file: &str| format!("{prefix}{file}");
    let manifest = match GridManifest::load(dir) {
        Ok(m) => m,
        Err(e) => {
            checked
                .problems
                .add(&rel(GRID_MANIFEST), None, e.to_string());
            return Ok(());
        }
    };
    if let Some(n) = num_nodes.filter(|&n| n != manifest.num_vertices) {
        checked.problems.add(
            &rel(GRID_MANIFEST),
            None,
            format!(
                "num_vertices is {} but the store has {n} nodes",
                manifest.num_vertices
            ),
        );
    }
    if let Some(info) = manifest.arrays.get("block_index") {
        let mut offsets = IndptrCheck::new(dir, &info.file, "block offset", manifest.num_edges);
        let mut sound = true;
        let file = rel(&info.file);
        ints(
            dir,
            &info.file,
            &file,
            checked,
            progress,
            |checked, vals| {
                offsets.scan(vals, |row, msg| {
                    sound = false;
                    checked.problems.add(&file, Some(row), msg);
                })
            },
        )?;
        if let Some((row, msg)) = offsets.end_problem() {
            checked.problems.add(&file, Some(row), msg);
            sound = false;
        }
        if !sound {
            // Rows cannot be assigned to blocks: the edge records are not checked.
            return Ok(());
        }
    }
    let grid = match Grid::open(dir) {
        Ok(g) => g,
        Err(e) => {
            checked
                .problems
                .add(&rel(GRID_MANIFEST), None, e.to_string());
            return Ok(());
        }
    };
    match grid.compression().is_compressed() {
        true => codes(
            &grid,
            &rel(&grid.manifest().arrays[EDGE_CODES].file),
            checked,
            progress,
        )?,
        false => edges(&grid, &rel("edges.npy"), checked, progress)?,
    }
    for degree in ["out_degree", "in_degree"] {
        let file = grid.manifest().arrays[degree].file.clone();
        let (mut sum, mut row) = (0i64, 0u64);
        let path = rel(&file);
        ints(dir, &file, &path, checked, progress, |checked, vals| {
            for &d in vals {
                if d < 0 {
                    let msg = format!("{file} row {row}: degree {d} is negative");
                    checked.problems.add(&path, Some(row), msg);
                }
                sum = sum.saturating_add(d.max(0));
                row += 1;
            }
        })?;
        if sum as u64 != manifest.num_edges {
            checked.problems.add(
                &path,
                None,
                format!(
                    "{file}: degrees sum to {sum} but the grid has {} edges",
                    manifest.num_edges
                ),
            );
        }
    }
    Ok(())
}

/// Streams the integers of the `.npy` file `file` of `dir` (called `label` in progress and in
/// the files checked), calling `f` with each batch.
fn ints(
    dir: &Path,
    file: &str,
    label: &str,
    checked: &mut Checked,
    progress: &dyn Progress,
    mut f: impl FnMut(&mut Checked, &[i64]),
) -> Result<()> {
    let path = dir.join(file);
    let header = read_header(&path)?;
    let mut reader = RowReader::open(&path, &header, CHUNK)?;
    let mut meter = Meter::new(
        progress,
        &format!("check {label}"),
        header.data_bytes(),
        header.len(),
    );
    let mut vals = Vec::new();
    while let Some(bytes) = reader.next_batch()? {
        vals.clear();
        decode_ints(bytes, header.dtype, &mut vals);
        f(checked, &vals);
        meter.add(vals.len() as u64, bytes.len() as u64)?;
    }
    meter.finish()?;
    checked.read(label, header.data_bytes());
    Ok(())
}

/// Checks every edge record's offsets against its block's chunks, block by block in file order.
fn edges(grid: &Grid, file: &str, checked: &mut Checked, progress: &dyn Progress) -> Result<()> {
    let path = grid.array_path("edges");
    let header = read_header(&path)?;
    let mut reader = RowReader::open(&path, &header, CHUNK)?;
    let total = grid.manifest().num_edges;
    let mut meter = Meter::new(
        progress,
        &format!("check {file}"),
        total * EDGE_BYTES,
        total,
    );
    let (mut pos, mut row) = (0usize, 0u64);
    while let Some(bytes) = reader.next_batch()? {
        let records: Vec<[u32; 2]> = bytemuck::pod_collect_to_vec(bytes);
        let mut k = 0;
        while k < records.len() {
            while grid.block_edges(pos).end <= row {
                pos += 1;
            }
            let end = records
                .len()
                .min(k + (grid.block_edges(pos).end - row) as usize);
            grid.scan_block(pos, row, &records[k..end], |r, msg| {
                checked.problems.add(file, Some(r), msg)
            });
            row += (end - k) as u64;
            k = end;
        }
        meter.add(records.len() as u64, bytes.len() as u64)?;
    }
    meter.finish()?;
    checked.read(file, total * EDGE_BYTES);
    Ok(())
}

/// Decodes every block of a compressed grid's `edge_codes.npy` (`file` in the report) and
/// checks its offsets, block by block in file order, holding one block's code and records.
fn codes(grid: &Grid, file: &str, checked: &mut Checked, progress: &dyn Progress) -> Result<()> {
    let path = grid.array_path(EDGE_CODES);
    let header = read_header(&path)?;
    let mut reader = RowReader::open(&path, &header, CHUNK)?;
    let total = header.data_bytes();
    let mut meter = Meter::new(progress, &format!("check {file}"), total, total);
    let blocks = grid.layout().blocks();
    // `pending` holds the code bytes from `consumed` on that no decoded block has used yet.
    let (mut pending, mut consumed, mut pos) = (Vec::<u8>::new(), 0u64, 0usize);
    let mut records = Vec::new();
    while let Some(bytes) = reader.next_batch()? {
        pending.extend_from_slice(bytes);
        while pos < blocks && grid.block_bytes(pos).end <= consumed + pending.len() as u64 {
            let (b, e) = (grid.block_bytes(pos), grid.block_edges(pos));
            records.clear();
            records.resize((e.end - e.start) as usize, [0u32; 2]);
            let code = &pending[(b.start - consumed) as usize..(b.end - consumed) as usize];
            match grid.decode_codes(pos, code, &mut records) {
                Ok(()) => grid.scan_block(pos, e.start, &records, |r, msg| {
                    checked.problems.add(file, Some(r), msg)
                }),
                Err(GridError::Invalid { msg, .. }) => checked.problems.add(file, None, msg),
                Err(other) => return Err(other),
            }
            pos += 1;
        }
        let keep_from = match pos < blocks {
            true => grid.block_bytes(pos).start,
            false => consumed + pending.len() as u64,
        };
        pending.drain(..(keep_from - consumed) as usize);
        consumed = keep_from;
        meter.add(bytes.len() as u64, bytes.len() as u64)?;
    }
    meter.finish()?;
    checked.read(file, total);
    Ok(())
}
