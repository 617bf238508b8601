//! `strata embed gather`: one ordinary run from the directories of an owner-mode run
//! (`dist_storage = owners`, docs/distributed.md). Each rank's directory holds the partitions
//! it owns (`p mod W`) of every table, plus identical relations and run records; gathering
//! copies partition `p` of the committed (and best) table from its owner's directory, so that
//! eval, predict and export read one table as after a single-process run.

use std::path::{Path, PathBuf};

use strata_io::progress::{Meter, Progress};
use strata_io::{AlignedBuf, Engine};
use strata_store::Store;

use crate::error::{io_err, EmbedError, Result};
use crate::run::run_dir::{is_run, sync_dir, Run, RunMeta};
use crate::storage::table::TableFile;
use crate::train::dist::owner_of;

/// The runs of `dirs` in rank order, checked to be every rank of one owner-mode run at one
/// committed epoch.
fn ranks(dirs: &[PathBuf]) -> Result<Vec<Run>> {
    let mut runs = dirs
        .iter()
        .map(|d| Run::open(d))
        .collect::<Result<Vec<_>>>()?;
    let world = runs.first().map_or(0, |r| r.meta.world_size);
    for run in &runs {
        if run.meta.owner_rank.is_none() {
            return Err(EmbedError::Config(format!(
                "{} is not a rank's directory of an owner-mode run (no owner_rank in its run.json)",
                run.dir.display()
            )));
        }
        if run.meta.world_size != world {
            return Err(EmbedError::Config(format!(
                "{} belongs to a run of {} ranks, {} to one of {world}",
                run.dir.display(),
                run.meta.world_size,
                runs[0].dir.display()
            )));
        }
    }
    runs.sort_by_key(|r| r.meta.owner_rank);
    let have: Vec<usize> = runs.iter().filter_map(|r| r.meta.owner_rank).collect();
    if have != (0..world).collect::<Vec<_>>() {
        return Err(EmbedError::Config(format!(
            "gather needs the directory of every rank 0..{} exactly once, got ranks {have:?}",
            world.saturating_sub(1)
        )));
    }
    let first = &runs[0].meta;
    for run in &runs[1..] {
        let m = &run.meta;
        if m.current != first.current || m.best != first.best {
            return Err(EmbedError::Config(format!(
                "{} is at epoch {} (best {}), {} at epoch {} (best {}): resume training with every rank so that they commit the same epoch, then gather",
                run.dir.display(),
                m.current.epoch,
                m.best.epoch,
                runs[0].dir.display(),
                first.current.epoch,
                first.best.epoch
            )));
        }
        if m.layout != first.layout || m.partitioning.partitions != first.partitioning.partitions {
            return Err(EmbedError::Config(format!(
                "{} and {} have different tables (another run's directory?)",
                run.dir.display(),
                runs[0].dir.display()
            )));
        }
    }
    Ok(runs)
}

/// Gathers the owner-mode run whose rank directories are `dirs` into a new run at `out`
/// (replacing a run there when `overwrite`). `store` replaces the store path recorded by
/// rank 0 (its copy may live elsewhere on this machine); it must hold the same train edges.
/// Returns the gathered run's record.
pub fn gather(
    dirs: &[PathBuf],
    out: &Path,
    store: Option<&Path>,
    overwrite: bool,
    progress: &dyn Progress,
) -> Result<RunMeta> {
    let runs = ranks(dirs)?;
    let mut meta = runs[0].meta.clone();
    let world = meta.world_size;
    let store_path = store.map_or_else(|| meta.store.clone(), Path::to_path_buf);
    let opened = Store::open(&store_path).map_err(|e| {
        EmbedError::Config(format!(
            "the run's store {}: {e}; pass --store with this machine's copy",
            store_path.display()
        ))
    })?;
    if !meta.trained_on(&opened)? {
        return Err(EmbedError::Config(format!(
            "store {} is not the one the run trained on (different nodes or train edges)",
            store_path.display()
        )));
    }
    meta.store = store_path.canonicalize().unwrap_or(store_path);
    meta.owner_rank = None;
    if out.exists()
        && std::fs::read_dir(out)
            .map_err(|e| io_err("list", out, e))?
            .next()
            .is_some()
    {
        if !(overwrite && is_run(out)) {
            return Err(EmbedError::Config(format!(
                "{} exists and is not empty; choose a new directory{}",
                out.display(),
                if is_run(out) {
                    " or pass --overwrite"
                } else {
                    ""
                }
            )));
        }
        std::fs::remove_dir_all(out).map_err(|e| io_err("remove", out, e))?;
    }
    std::fs::create_dir_all(out).map_err(|e| io_err("mkdir", out, e))?;
    let engine = Engine::shared();
    let layout = meta.layout;
    // Every partition, from its owner, and a typed run's pinned region, which every rank
    // holds alike (from its owner too).
    let regions = meta.partitioning.regions();
    let table_bytes = layout.table_bytes(meta.partitioning.partitions);
    for name in ["table-0.bin", "table-1.bin", "table-2.bin"] {
        let path = out.join(name);
        TableFile::open(&engine, &path, true)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(table_bytes))
            .map_err(|e| io_err("resize", &path, e))?;
    }
    let mut tables = vec![meta.current.table.clone()];
    if meta.best.table != meta.current.table {
        tables.push(meta.best.table.clone());
    }
    let mut meter = Meter::new(
        progress,
        "gather partitions",
        table_bytes * tables.len() as u64,
        (regions.len() * tables.len()) as u64,
    );
    let largest = regions.iter().map(|&p| layout.region_bytes(p)).max();
    let mut buf = AlignedBuf::new(largest.unwrap_or(0) as usize);
    for name in &tables {
        let target = TableFile::open(&engine, &out.join(name), false)?;
        let sources = runs
            .iter()
            .map(|r| TableFile::open(&engine, &r.table_path(name), false))
            .collect::<Result<Vec<_>>>()?;
        for &p in &regions {
            sources[owner_of(p, world)].read_partition(&engine, &layout, p, &mut buf)?;
            target.write_partition(&engine, &layout, p, &mut buf)?;
            meter.add(1, layout.region_bytes(p))?;
        }
        target.sync()?;
    }
    meter.finish()?;
    let run = Run {
        dir: out.to_path_buf(),
        meta,
    };
    // Every rank saved the same relation rows (the epoch's last round leaves them identical).
    for epoch in [run.meta.current.epoch, run.meta.best.epoch] {
        let (from_rows, from_state) = runs[0].relation_paths(epoch);
        let (rows, state) = run.relation_paths(epoch);
        for (from, to) in [(from_rows, rows), (from_state, state)] {
            std::fs::copy(&from, &to).map_err(|e| io_err("copy", &from, e))?;
        }
    }
    sync_dir(out)?;
    run.commit()?;
    run.rewrite_logs()?;
    progress.message(&format!(
        "gathered epoch {} of {} ranks' partitions ({} regions, {} table{}) into {}",
        run.meta.current.epoch,
        world,
        regions.len(),
        tables.len(),
        if tables.len() == 1 { "" } else { "s" },
        out.display()
    ));
    Ok(run.meta)
}
