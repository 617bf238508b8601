//! Export of a checkpoint in node-id order: `.npy` arrays with the id maps as text files, or
//! TSV rows `name<TAB>v1<TAB>...`, or rows handed to a [`RowSink`] from outside the crate (the
//! Python package's Parquet writer). The output directory is written beside its final path and
//! renamed into place only when complete.
//!
//! Partitions place nodes by a permutation, so id order is rebuilt in passes: each pass holds a
//! range of ids in memory (half the budget) and scans every partition for them; one partition
//! needs a single pass.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use strata_io::progress::{Meter, Progress};
use strata_store::array::{NpyWriter, IO_CHUNK};
use strata_store::strtab::NameTable;
use strata_store::DType;

use crate::config::ExportFormat;
use crate::error::{io_err, EmbedError, Result};
use crate::run::loaded::{name_of, Loaded};

/// The record an export writes beside its files, which marks a directory as an export.
const EXPORT_META: &str = "export.json";

/// A writer of rows in id order outside this crate, one file at a time.
pub trait RowSink {
    /// Starts file `path` of rows of `dim` floats.
    fn begin(&mut self, path: &Path, dim: usize) -> Result<()>;
    /// Rows `first..first + names.len()` (`names.len() x dim`, row-major) and their names.
    fn rows(&mut self, first: u64, names: &[String], rows: &[f32]) -> Result<()>;
    /// Ends the file begun last (written and synced).
    fn finish(&mut self) -> Result<()>;
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    pub out: PathBuf,
    pub files: Vec<String>,
    pub epoch: usize,
    pub num_nodes: u64,
    pub dim: usize,
    pub passes: u64,
    pub seconds: f64,
}

/// Where rows in id order go.
enum Sink<'a> {
    Npy(NpyWriter),
    Tsv(BufWriter<std::fs::File>, Option<NameTable>),
    External(&'a mut dyn RowSink, Option<NameTable>),
}

impl Sink<'_> {
    /// Writes rows of nodes `first..` (`rows x dim`).
    fn rows(&mut self, first: u64, rows: &[f32], dim: usize, path: &Path) -> Result<()> {
        match self {
            Sink::Npy(w) => Ok(w.write(rows)?),
            Sink::Tsv(w, names) => {
                for (i, row) in rows.chunks_exact(dim.max(1)).enumerate() {
                    tsv_row(w, name_of(names.as_ref(), first + i as u64)?, row)
                        .map_err(|e| io_err("write", path, e))?;
                }
                Ok(())
            }
            Sink::External(w, names) => {
                let count = rows.len() / dim.max(1);
                let labels = (first..first + count as u64)
                    .map(|v| name_of(names.as_ref(), v))
                    .collect::<Result<Vec<_>>>()?;
                w.rows(first, &labels, rows)
            }
        }
    }

    fn finish(self, path: &Path) -> Result<()> {
        match self {
            Sink::Npy(w) => w.finish().map(|_| ()).map_err(Into::into),
            Sink::Tsv(w, _) => w
                .into_inner()
                .map_err(|e| io_err("write", path, e.into_error()))?
                .sync_all()
                .map_err(|e| io_err("fsync", path, e)),
            Sink::External(w, _) => w.finish(),
        }
    }
}

fn tsv_row(w: &mut impl Write, name: String, row: &[f32]) -> std::io::Result<()> {
    w.write_all(name.as_bytes())?;
    for v in row {
        write!(w, "\t{v}")?;
    }
    w.write_all(b"\n")
}

/// Exports the loaded checkpoint to `out` in `format`, the rows of the parquet format written
/// by `external` (npy and tsv need none).
pub fn export_with(
    l: &mut Loaded,
    out: &Path,
    format: ExportFormat,
    overwrite: bool,
    mut external: Option<&mut dyn RowSink>,
    progress: &dyn Progress,
) -> Result<ExportReport> {
    if format == ExportFormat::Pbg {
        return Err(EmbedError::Config(
            "export.format pbg is written by strata_embed::pbg::export (strata embed export --format pbg)".into(),
        ));
    }
    if format == ExportFormat::Parquet && external.is_none() {
        return Err(EmbedError::Config(
            "export.format parquet is written through the Python package (strata embed export --format parquet)".into(),
        ));
    }
    let start = std::time::Instant::now();
    let (files, passes) = write_published(out, overwrite, EXPORT_META, |tmp| {
        write_all(l, tmp, format, external.take(), progress)
    })?;
    Ok(ExportReport {
        out: out.to_path_buf(),
        files,
        epoch: l.epoch,
        num_nodes: l.run.meta.num_nodes,
        dim: l.model.dim,
        passes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Writes the directory `out` with `write` into a `.partial-PID` directory beside it, then
/// publishes it (renamed into place, or swapped with an existing `out` when `overwrite`); on
/// any error the partial directory is removed and `out` is untouched. `overwrite` replaces only
/// an earlier output of the same kind, a directory holding `marker` (`export.json`,
/// `run.json`, ...), or an empty directory: never a run, a store or a user's files named by
/// mistake.
pub(crate) fn write_published<T>(
    out: &Path,
    overwrite: bool,
    marker: &str,
    write: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    if out.exists() {
        if !overwrite {
            return Err(EmbedError::Config(format!(
                "{} exists; pass --overwrite to replace it",
                out.display()
            )));
        }
        let empty = std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_none());
        if !empty && !out.join(marker).is_file() {
            return Err(EmbedError::Config(format!(
                "{} exists and is not an earlier output of this command (no {marker}); refusing to \
                 replace it: choose a new directory",
                out.display()
            )));
        }
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| io_err("mkdir", parent, e))?;
    let file_name = out
        .file_name()
        .ok_or_else(|| EmbedError::Config(format!("{}: not a directory path", out.display())))?;
    let tmp = parent.join(format!(
        ".{}.partial-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).map_err(|e| io_err("mkdir", &tmp, e))?;
    let written = write(&tmp).and_then(|x| {
        strata_io::durable::publish_dir(&tmp, out, "export")?;
        Ok(x)
    });
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written
}

fn write_all(
    l: &mut Loaded,
    dir: &Path,
    format: ExportFormat,
    mut external: Option<&mut dyn RowSink>,
    progress: &dyn Progress,
) -> Result<(Vec<String>, u64)> {
    let d = l.model.dim;
    let n = l.run.meta.num_nodes;
    let names = l.node_names()?;
    let mut files = Vec::new();
    let emb_name = format!("embeddings.{}", format.suffix());
    let emb_path = dir.join(&emb_name);
    let mut sink = match format {
        ExportFormat::Npy => Sink::Npy(NpyWriter::create(
            &emb_path,
            DType::F32,
            &[d as u64],
            IO_CHUNK,
        )?),
        ExportFormat::Tsv => Sink::Tsv(
            BufWriter::new(
                std::fs::File::create(&emb_path).map_err(|e| io_err("create", &emb_path, e))?,
            ),
            names,
        ),
        ExportFormat::Pbg => unreachable!("refused by export_with"),
        ExportFormat::Parquet => {
            let w = external.as_deref_mut().expect("checked by export_with");
            w.begin(&emb_path, d)?;
            Sink::External(w, names)
        }
    };
    // Nodes per pass: half of what the budget leaves beside the buffer.
    let per_pass = (l.spare_bytes() / 2 / (d as u64 * 4)).clamp(1, n.max(1));
    let passes = n.div_ceil(per_pass).max(1);
    let partitioning = l.run.meta.partitioning.clone();
    let locator = partitioning.locator();
    let all = partitioning.regions();
    let mut meter = Meter::new(progress, "export", n * d as u64 * 4, n);
    let mut rows = Vec::new();
    for pass in 0..passes {
        let lo = pass * per_pass;
        let hi = (lo + per_pass).min(n);
        rows.clear();
        rows.resize((hi - lo) as usize * d, 0.0f32);
        l.buffer.visit(&all, &l.table, |p, emb| {
            for local in 0..partitioning.size_of(p) as u32 {
                let v = locator.node(p, local);
                if (lo..hi).contains(&v) {
                    let at = (v - lo) as usize * d;
                    emb.copy(local as usize * d, &mut rows[at..at + d]);
                }
            }
            Ok(())
        })?;
        sink.rows(lo, &rows, d, &emb_path)?;
        meter.add(hi - lo, (hi - lo) * d as u64 * 4)?;
    }
    sink.finish(&emb_path)?;
    meter.finish()?;
    files.push(emb_name);
    let rel_names = if l.store.manifest().graph.relation_names {
        Some(NameTable::open(&l.store, "relation_names")?)
    } else {
        None
    };
    let rd = l.relations.dim;
    let base = l.run.meta.num_relations.max(1) as usize;
    if rd > 0 {
        // Rows 0..R are the relations, R..2R their inverses (reciprocal runs).
        let rel_label = |i: usize| -> Result<String> {
            let (r, inv) = (i % base, i >= base);
            Ok(format!(
                "{}{}",
                name_of(rel_names.as_ref(), r as u64)?,
                if inv { "_inverse" } else { "" }
            ))
        };
        match format {
            ExportFormat::Npy => {
                let path = dir.join("relations.npy");
                let mut w = NpyWriter::create(&path, DType::F32, &[rd as u64], IO_CHUNK)?;
                w.write(&l.relations.params)?;
                w.finish()?;
                files.push("relations.npy".into());
            }
            ExportFormat::Pbg => unreachable!("refused by export_with"),
            ExportFormat::Parquet => {
                let path = dir.join("relations.parquet");
                let w = external.expect("checked by export_with");
                let labels = (0..l.relations.rows())
                    .map(rel_label)
                    .collect::<Result<Vec<_>>>()?;
                w.begin(&path, rd)?;
                w.rows(0, &labels, &l.relations.params)?;
                w.finish()?;
                files.push("relations.parquet".into());
            }
            ExportFormat::Tsv => {
                let path = dir.join("relations.tsv");
                let mut w = BufWriter::new(
                    std::fs::File::create(&path).map_err(|e| io_err("create", &path, e))?,
                );
                for (i, row) in l.relations.params.chunks_exact(rd).enumerate() {
                    tsv_row(&mut w, rel_label(i)?, row).map_err(|e| io_err("write", &path, e))?;
                }
                w.flush().map_err(|e| io_err("write", &path, e))?;
                files.push("relations.tsv".into());
            }
        }
    }
    if format == ExportFormat::Npy {
        // The id maps: line i names node (relation) i.
        if let Some(t) = l.node_names()? {
            write_lines(
                &dir.join("node_names.txt"),
                (0..n).map(|i| name_of(Some(&t), i)),
            )?;
            files.push("node_names.txt".into());
        }
        if let Some(t) = &rel_names {
            write_lines(
                &dir.join("relation_names.txt"),
                (0..base as u64).map(|i| name_of(Some(t), i)),
            )?;
            files.push("relation_names.txt".into());
        }
    }
    let meta = serde_json::json!({
        "format": "strata-embed-export",
        "run": l.run.dir,
        "store": l.run.meta.store,
        "epoch": l.epoch,
        "model": l.run.meta.config.model,
        "file_format": format,
        "dim": d,
        "num_nodes": n,
        "num_relations": l.run.meta.num_relations,
        "relation_rows": l.relations.rows(),
        "inverse_offset": l.relations.inverse_offset,
        "files": files,
    });
    let path = dir.join(EXPORT_META);
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&meta).expect("serialises"),
    )
    .map_err(|e| io_err("write", &path, e))?;
    files.push(EXPORT_META.into());
    Ok((files, passes))
}

fn write_lines(path: &Path, lines: impl Iterator<Item = Result<String>>) -> Result<()> {
    let mut w = BufWriter::new(std::fs::File::create(path).map_err(|e| io_err("create", path, e))?);
    for line in lines {
        let line = line?;
        w.write_all(line.as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .map_err(|e| io_err("write", path, e))?;
    }
    w.flush().map_err(|e| io_err("write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(out: &Path, overwrite: bool) -> Result<()> {
        write_published(out, overwrite, EXPORT_META, |dir| {
            std::fs::write(dir.join(EXPORT_META), b"{}").map_err(|e| io_err("write", dir, e))
        })
    }

    #[test]
    fn overwrite_replaces_only_an_earlier_export_or_an_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        publish(&out, false).unwrap();
        let again = publish(&out, false).unwrap_err().to_string();
        assert!(again.contains("pass --overwrite"), "{again}");
        publish(&out, true).unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        publish(&empty, true).unwrap();
        assert!(empty.join(EXPORT_META).is_file());
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join("run.json"), b"{}").unwrap();
        let refused = publish(&run, true).unwrap_err().to_string();
        assert!(refused.contains("no export.json"), "{refused}");
        assert!(run.join("run.json").is_file() && !run.join(EXPORT_META).exists());
    }
}
