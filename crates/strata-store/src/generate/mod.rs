//! Deterministic, streaming graph generators: Graph500 R-MAT edge lists ([`rmat`]), knowledge
//! graphs with planted structure ([`kg`]), labelled degree-corrected block models ([`sbm`]) and
//! heterogeneous ones with weights and times, written as a typed store ([`hetsbm`]).
//!
//! Every random value is a pure function of the seed and the index of the thing it belongs to
//! (see [`rng`]), so worker threads can generate disjoint index ranges in any order while a
//! single writer appends them in index order: output is byte-identical for any thread count.
//! Memory stays bounded by a few chunks per thread plus small per-class or per-relation tables.
//! The construction of each generator is documented in `docs/generators.md`.

mod hetsbm;
mod kg;
mod planted;
mod rmat;
mod sbm;

pub use hetsbm::{hetsbm, HetSbmOptions, SplitBy};
pub use kg::{kg, KgOptions};
pub use planted::FeatureDtype;
pub use rmat::{rmat, RmatFormat, RmatOptions};
pub use sbm::{sbm, SbmOptions};

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::ConfigError;
use crate::disk_room;
use crate::error::{Result, StoreError};
use crate::store::{output_parent, remove_path, remove_stale_partials};

/// What a generator wrote, for the CLI to print and for provenance records.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerateSummary {
    /// `"rmat"`, `"kg"`, `"sbm"` or `"hetsbm"`.
    pub kind: String,
    /// The output path as given (a file for rmat, a directory otherwise: a store for hetsbm).
    pub out: PathBuf,
    /// Final paths of the files written.
    pub files: Vec<PathBuf>,
    /// Vertices (rmat), entities (kg) or nodes (sbm, hetsbm: all types).
    pub num_nodes: u64,
    /// Edges or triples written, over all splits.
    pub num_edges: u64,
    /// Total size of `files` in bytes.
    pub bytes_written: u64,
    /// Wall-clock time of the whole generation in seconds.
    pub seconds: f64,
    /// Generator-specific facts: split counts, classes, the parameters actually used.
    pub details: serde_json::Value,
}

impl GenerateSummary {
    /// Fills in the sizes of `files` and the time elapsed since `start`.
    fn new(
        kind: &str,
        out: &Path,
        files: Vec<PathBuf>,
        num_nodes: u64,
        num_edges: u64,
        start: Instant,
        details: serde_json::Value,
    ) -> Result<Self> {
        let mut bytes_written = 0;
        for f in &files {
            bytes_written += std::fs::metadata(f)
                .map_err(|e| StoreError::os("stat", f, e))?
                .len();
        }
        Ok(GenerateSummary {
            kind: kind.to_string(),
            out: out.to_path_buf(),
            files,
            num_nodes,
            num_edges,
            bytes_written,
            seconds: start.elapsed().as_secs_f64(),
            details,
        })
    }
}

/// A generator section's check for its config route: `out` given, then the generator's own
/// `validate` (a [`StoreError::Option`] naming the option becomes a [`ConfigError`] naming
/// `section.option`).
fn config_check(
    section: &str,
    out: &Path,
    validated: Result<()>,
) -> std::result::Result<(), ConfigError> {
    if out.as_os_str().is_empty() {
        return Err(ConfigError::new(section, "out", "needs an output path"));
    }
    validated.map_err(|e| match e {
        StoreError::Option { field, msg } => ConfigError::new(section, &field, msg),
        other => ConfigError::new(section, "out", other.to_string()),
    })
}

/// Number of worker threads for a `threads` option (0 = all available cores).
fn worker_threads(requested: usize) -> usize {
    if requested > 0 {
        requested
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    }
}

/// Checks that a fraction option lies in `[0, 1]`.
fn check_fraction(field: &str, value: f64) -> Result<()> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(StoreError::option(
            field,
            format!("must be a fraction within [0, 1], got {value}"),
        ))
    }
}

/// Generates items `[0, total)` in chunks of `chunk` items on `threads` workers and hands each
/// chunk's output to `sink` on the calling thread, in index order, with the chunk's item count.
///
/// Worker `w` fills chunks `w, w + threads, ...` and queues at most two ahead, so memory is a
/// few chunk buffers per worker whatever `total` is. `fill` receives a recycled buffer and must
/// overwrite its contents. An error from `sink` stops the workers and is returned.
fn run_ordered<T, F, S>(threads: usize, total: u64, chunk: u64, fill: F, mut sink: S) -> Result<()>
where
    T: Default + Send,
    F: Fn(Range<u64>, &mut T) + Sync,
    S: FnMut(u64, &T) -> Result<()>,
{
    let chunk = chunk.max(1);
    let chunks = total.div_ceil(chunk);
    let workers = threads.clamp(1, chunks.max(1) as usize);
    std::thread::scope(|scope| {
        let mut filled = Vec::with_capacity(workers);
        let mut recycle = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = crossbeam_channel::bounded::<T>(2);
            let (back_tx, back_rx) = crossbeam_channel::bounded::<T>(4);
            let fill = &fill;
            scope.spawn(move || {
                for c in (w as u64..chunks).step_by(workers) {
                    let mut buf = back_rx.try_recv().unwrap_or_default();
                    fill(c * chunk..((c + 1) * chunk).min(total), &mut buf);
                    if tx.send(buf).is_err() {
                        return;
                    }
                }
            });
            filled.push(rx);
            recycle.push(back_tx);
        }
        for c in 0..chunks {
            let w = (c % workers as u64) as usize;
            // A worker only hangs up early by panicking, which the scope re-raises on exit.
            let Ok(buf) = filled[w].recv() else { break };
            sink(((c + 1) * chunk).min(total) - c * chunk, &buf)?;
            let _ = recycle[w].try_send(buf);
        }
        Ok(())
    })
}

/// A generator's output while it is written: `<out>.partial-<pid>` beside `out`, renamed onto
/// `out` by [`Staging::commit`] and removed when dropped uncommitted (on an error or a panic),
/// so `out` never holds a half-written graph.
struct Staging {
    out: PathBuf,
    tmp: PathBuf,
    /// For a directory output, the only file names it may hold (an existing `out` with anything
    /// else in it is not a generator's output and is never replaced).
    dir_files: Option<&'static [&'static str]>,
    overwrite: bool,
    committed: bool,
}

impl Staging {
    /// Stages a single output file.
    fn file(out: &Path, overwrite: bool) -> Result<Staging> {
        Self::new(out, overwrite, None)
    }

    /// Stages an output directory that will hold `files`.
    fn dir(out: &Path, overwrite: bool, files: &'static [&'static str]) -> Result<Staging> {
        Self::new(out, overwrite, Some(files))
    }

    fn new(
        out: &Path,
        overwrite: bool,
        dir_files: Option<&'static [&'static str]>,
    ) -> Result<Staging> {
        let (parent, name) = output_parent(out)?;
        check_replaceable(out, overwrite, dir_files)?;
        remove_stale_partials(&parent, &name);
        let tmp = parent.join(format!("{name}.partial-{}", std::process::id()));
        if dir_files.is_some() {
            std::fs::create_dir(&tmp).map_err(|e| StoreError::os("mkdir", &tmp, e))?;
        }
        Ok(Staging {
            out: out.to_path_buf(),
            tmp,
            dir_files,
            overwrite,
            committed: false,
        })
    }

    /// The path being written: the partial file, or the partial directory.
    fn path(&self) -> &Path {
        &self.tmp
    }

    /// Refuses the job before it writes when the disk holding the output has less free than
    /// `needed` bytes, the least it writes (`what` names it).
    fn ensure_room(&self, needed: u64, what: impl FnOnce() -> String) -> Result<()> {
        let parent = self.tmp.parent().expect("a partial path has a parent");
        disk_room::ensure(parent, needed, what)
    }

    /// Final paths of `names` inside a staged directory.
    fn final_paths(&self, names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(|n| self.out.join(n)).collect()
    }

    /// Moves the finished output onto `out`, replacing what was there when `overwrite` allows
    /// (checked at creation, and again now in case `out` appeared or changed meanwhile).
    fn commit(mut self) -> Result<()> {
        check_replaceable(&self.out, self.overwrite, self.dir_files)?;
        if self.dir_files.is_some() && self.out.exists() {
            std::fs::remove_dir_all(&self.out)
                .map_err(|e| StoreError::os("remove", &self.out, e))?;
        }
        std::fs::rename(&self.tmp, &self.out)
            .map_err(|e| StoreError::os("rename", &self.out, e))?;
        self.committed = true;
        let parent = self.tmp.parent().expect("a partial path has a parent");
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::os("fsync", parent, e))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = remove_path(&self.tmp);
        }
    }
}

/// Fails unless `out` is absent, or `overwrite` is set and `out` is what a generator writes: a
/// file for file outputs, a directory holding only `dir_files` for directory outputs.
fn check_replaceable(out: &Path, overwrite: bool, dir_files: Option<&[&str]>) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(out) else {
        return Ok(());
    };
    if !overwrite {
        return Err(StoreError::Exists {
            path: out.to_path_buf(),
        });
    }
    match dir_files {
        None if meta.is_dir() => Err(StoreError::bad_file(
            out,
            "is a directory; refusing to replace it with a generated file",
        )),
        None => Ok(()),
        Some(_) if !meta.is_dir() => Err(StoreError::bad_file(
            out,
            "exists and is not a directory; refusing to replace it",
        )),
        Some(files) => {
            for entry in std::fs::read_dir(out).map_err(|e| StoreError::os("read_dir", out, e))? {
                let entry = entry.map_err(|e| StoreError::os("read_dir", out, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if !files.contains(&name.as_str()) {
                    return Err(StoreError::bad_file(
                        out,
                        format!("holds '{name}', which this generator does not write; refusing to replace the directory"),
                    ));
                }
            }
            Ok(())
        }
    }
}

/// Appends the decimal digits of `v`, left-padded with zeros to at least `width` digits.
fn push_decimal(buf: &mut Vec<u8>, v: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut at = digits.len();
    let mut rest = v;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let start = at.min(digits.len().saturating_sub(width));
    buf.extend_from_slice(&digits[start..]);
}

/// Number of decimal digits of `v` (1 for 0).
fn decimal_width(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |d| d as usize + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_formatting() {
        let mut buf = Vec::new();
        for (v, w, want) in [
            (0, 0, "0"),
            (7, 3, "007"),
            (1234, 2, "1234"),
            (u64::MAX, 0, "18446744073709551615"),
        ] {
            buf.clear();
            push_decimal(&mut buf, v, w);
            assert_eq!(std::str::from_utf8(&buf).unwrap(), want);
        }
        assert_eq!(decimal_width(0), 1);
        assert_eq!(decimal_width(9), 1);
        assert_eq!(decimal_width(10), 2);
        assert_eq!(decimal_width(9999), 4);
    }

    #[test]
    fn ordered_output_whatever_the_thread_count() {
        let collect = |threads: usize| {
            let mut out = Vec::new();
            let mut counts = Vec::new();
            run_ordered(
                threads,
                1003,
                10,
                |range: Range<u64>, buf: &mut Vec<u64>| {
                    buf.clear();
                    buf.extend(range);
                },
                |rows, buf| {
                    counts.push(rows);
                    out.extend_from_slice(buf);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(counts.iter().sum::<u64>(), 1003);
            out
        };
        let want: Vec<u64> = (0..1003).collect();
        for threads in [1, 2, 3, 7, 200] {
            assert_eq!(collect(threads), want, "threads = {threads}");
        }
        run_ordered(
            3,
            0,
            10,
            |_, _: &mut Vec<u8>| unreachable!(),
            |_, _| unreachable!(),
        )
        .unwrap();
    }

    #[test]
    fn sink_error_stops_the_workers() {
        let mut seen = 0;
        let err = run_ordered(
            3,
            1_000_000,
            10,
            |_, buf: &mut Vec<u8>| buf.push(0),
            |_, _| {
                seen += 1;
                if seen == 5 {
                    Err(StoreError::Cancelled)
                } else {
                    Ok(())
                }
            },
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::Cancelled));
        assert_eq!(seen, 5);
    }

    #[test]
    fn staging_refuses_to_clobber_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("g.bin");
        std::fs::write(&out, b"old").unwrap();
        assert!(matches!(
            Staging::file(&out, false),
            Err(StoreError::Exists { .. })
        ));
        let s = Staging::file(&out, true).unwrap();
        std::fs::write(s.path(), b"new").unwrap();
        let partial = s.path().to_path_buf();
        drop(s);
        assert!(!partial.exists(), "an uncommitted partial file is removed");
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        let s = Staging::file(&out, true).unwrap();
        std::fs::write(s.path(), b"new").unwrap();
        s.commit().unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");

        let out_dir = dir.path().join("kg");
        std::fs::create_dir(&out_dir).unwrap();
        std::fs::write(out_dir.join("train.txt"), b"x").unwrap();
        std::fs::write(out_dir.join("notes.md"), b"mine").unwrap();
        let err = Staging::dir(&out_dir, true, &["train.txt"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("notes.md"), "{err}");
        std::fs::remove_file(out_dir.join("notes.md")).unwrap();
        let s = Staging::dir(&out_dir, true, &["train.txt"]).unwrap();
        std::fs::write(s.path().join("train.txt"), b"y").unwrap();
        s.commit().unwrap();
        assert_eq!(std::fs::read(out_dir.join("train.txt")).unwrap(), b"y");
        assert!(matches!(
            Staging::file(&out_dir, true),
            Err(StoreError::BadFile { .. })
        ));
        let missing_parent = dir.path().join("no/such/dir/g.bin");
        assert!(matches!(
            Staging::file(&missing_parent, false),
            Err(StoreError::BadFile { .. })
        ));
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no partials are left behind"
        );
    }
}
