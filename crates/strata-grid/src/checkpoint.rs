//! Iteration checkpoints of distributed runs, from which a group that torchrun restarted
//! resumes (docs/distributed.md, "Faults").
//!
//! Every rank keeps its checkpoints in its own directory `OUT/checkpoint.rank-R`, so that
//! ranks on separate machines (each with its own copy of the store) need no shared file
//! system. A checkpoint after `K` iterations is written in two steps:
//!
//! 1. each rank writes the values of the vertices it owns (and its share of the frontier) to
//!    `iter-K.part`: a temporary file, fsynced, renamed, the directory fsynced;
//! 2. the ranks all-gather each part's length and CRC-32 (a rank takes part only once its file
//!    is durable), and each writes the same commit record `commit.json` the same way.
//!
//! A commit record on any rank therefore proves that every rank's part of `K` is durable. A
//! rank removes its older parts only after its own commit of `K`, so on restart the highest
//! iteration committed by any rank is one whose parts every rank still holds: the ranks
//! gather their records, agree on that one, check their part against its CRC, and load it.
//! Each rank writes only its own vertices (1/W of the values), rather than rank 0 the whole
//! array: the writes are spread over the ranks, and BFS's levels and parents, which are not
//! exchanged between iterations, exist only on their owner until the end.

use std::io::{BufReader, BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{GridError, Result};
use crate::vertex::{Bitmap, Shared};

/// The `format` of a commit record.
const FORMAT: &str = "strata-grid-checkpoint";
const VERSION: u32 = 1;
/// Vertices written or read per buffer (bounds the buffer at a few MiB).
const BATCH: u64 = 1 << 18;

/// What a checkpoint holds of an algorithm's state, for the vertices this rank owns.
pub struct State<'a> {
    /// Arrays whose owned values are saved and loaded (taking a value may set derived ones).
    pub saved: &'a [&'a dyn Shared],
    /// Arrays every rank keeps whole: after loading, the other ranks' values are gathered.
    pub whole: &'a [&'a dyn Shared],
    /// The frontier of the next iteration (saved for the owned vertices, restored whole).
    pub frontier: Option<&'a Bitmap>,
}

/// One rank's part of a checkpoint, as the commit record lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Part {
    bytes: u64,
    crc32: u32,
}

/// The commit record: a checkpoint every rank's part of which is durable.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Commit {
    format: String,
    format_version: u32,
    algorithm: String,
    params: serde_json::Value,
    /// Every rank's vertices, as [start, end).
    vertices: Vec<[u64; 2]>,
    /// Iterations done when it was written.
    iterations: usize,
    /// Every rank's part, in rank order.
    parts: Vec<Part>,
}

/// A rank's checkpoint figures, reported in the run's summary.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointFigures {
    /// Checkpoints committed.
    pub written: u64,
    /// Bytes of this rank's parts written.
    pub bytes: u64,
    /// Seconds spent writing and committing them (this rank's, collectives included).
    pub seconds: f64,
    /// Iterations done in the checkpoint this attempt resumed from (none: from the beginning).
    pub resumed_from: Option<usize>,
}

/// A rank's checkpoints: where they go, how often, and what was written.
pub struct Checkpoints {
    dir: PathBuf,
    /// Seconds between checkpoints (0: after every iteration).
    every: f64,
    last: Instant,
    /// This attempt follows one that died: resume from the last commit.
    restarted: bool,
    algorithm: String,
    params: serde_json::Value,
    pub figures: CheckpointFigures,
}

/// The directory of rank `rank`'s checkpoints in run directory `out`.
pub fn rank_dir(out: &Path, rank: usize) -> PathBuf {
    out.join(format!("checkpoint.rank-{rank}"))
}

impl Checkpoints {
    /// Rank `rank`'s checkpoints of `algorithm` (with `params`) in `out`, one every `every`
    /// seconds. On a first attempt (`restarted` false) checkpoints left by an earlier run are
    /// removed: only a restart of the same group resumes.
    pub fn open(
        out: &Path,
        rank: usize,
        every: f64,
        restarted: bool,
        algorithm: &str,
        params: serde_json::Value,
    ) -> Result<Checkpoints> {
        let dir = rank_dir(out, rank);
        if !restarted && dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| GridError::os("remove", &dir, e))?;
        }
        Ok(Checkpoints {
            dir,
            every,
            last: Instant::now(),
            restarted,
            algorithm: algorithm.to_string(),
            params,
            figures: CheckpointFigures::default(),
        })
    }

    /// Removes this rank's checkpoints (the run finished: nothing is left to resume).
    pub fn finish(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(GridError::os("remove", &self.dir, e))
            }
            _ => Ok(()),
        }
    }

    fn part_path(&self, iterations: usize) -> PathBuf {
        self.dir.join(format!("iter-{iterations}.part"))
    }

    fn commit_path(&self) -> PathBuf {
        self.dir.join("commit.json")
    }

    fn read_commit(&self) -> Result<Option<Vec<u8>>> {
        let path = self.commit_path();
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(GridError::os("read", &path, e)),
        }
    }
}

/// Writes `write`'s bytes to `path` atomically and durably
/// ([`strata_io::durable::replace_file_with`]).
fn publish(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    strata_io::durable::replace_file_with(path, write).map_err(|e| GridError::os("write", path, e))
}

/// Writes the owned part of `state` (`owned` vertices) to `out`; returns its length and CRC.
fn write_part(owned: Range<u64>, state: &State, out: &mut impl Write) -> std::io::Result<Part> {
    let mut crc = crc32fast::Hasher::new();
    let mut bytes = 0u64;
    let mut buf = Vec::new();
    let mut flush = |buf: &mut Vec<u8>| -> std::io::Result<()> {
        crc.update(buf);
        bytes += buf.len() as u64;
        out.write_all(buf)?;
        buf.clear();
        Ok(())
    };
    if let Some(frontier) = state.frontier {
        for start in (owned.start..owned.end).step_by(BATCH as usize) {
            let end = (start + BATCH).min(owned.end);
            buf.resize(((end - start) as usize).div_ceil(8), 0);
            for v in start..end {
                if frontier.get(v as usize) {
                    let k = (v - start) as usize;
                    buf[k / 8] |= 1 << (k % 8);
                }
            }
            flush(&mut buf)?;
        }
    }
    for start in (owned.start..owned.end).step_by(BATCH as usize) {
        for v in start..(start + BATCH).min(owned.end) {
            for a in state.saved {
                a.put(v as usize, &mut buf);
            }
        }
        flush(&mut buf)?;
    }
    Ok(Part {
        bytes,
        crc32: crc.finalize(),
    })
}

/// Reads the owned part of `state` from `input`, which must be `part` exactly; returns what
/// is wrong otherwise (nothing of the state is trusted then: the caller fails the run).
fn read_part(
    owned: Range<u64>,
    state: &State,
    part: &Part,
    input: &mut impl Read,
) -> std::result::Result<(), String> {
    let width: usize = state.saved.iter().map(|a| a.width()).sum();
    let mut crc = crc32fast::Hasher::new();
    let mut bytes = 0u64;
    let mut buf = Vec::new();
    let mut fill = |buf: &mut Vec<u8>, len: usize| -> std::result::Result<(), String> {
        buf.resize(len, 0);
        input
            .read_exact(buf)
            .map_err(|e| format!("{e} after {bytes} bytes, the commit says {}", part.bytes))?;
        crc.update(buf);
        bytes += len as u64;
        Ok(())
    };
    if let Some(frontier) = state.frontier {
        // The whole frontier is the checkpoint's: this rank's bits now, the others' after.
        frontier.fill(false);
        for start in (owned.start..owned.end).step_by(BATCH as usize) {
            let end = (start + BATCH).min(owned.end);
            fill(&mut buf, ((end - start) as usize).div_ceil(8))?;
            for v in start..end {
                let k = (v - start) as usize;
                if buf[k / 8] & (1 << (k % 8)) != 0 {
                    frontier.set(v as usize);
                }
            }
        }
    }
    for start in (owned.start..owned.end).step_by(BATCH as usize) {
        let end = (start + BATCH).min(owned.end);
        fill(&mut buf, (end - start) as usize * width)?;
        let mut at = 0;
        for v in start..end {
            for a in state.saved {
                a.take(v as usize, &buf[at..at + a.width()]);
                at += a.width();
            }
        }
    }
    let mut rest = [0u8; 1];
    if input.read(&mut rest).map_err(|e| e.to_string())? != 0 {
        return Err(format!(
            "longer than the {} bytes the commit says",
            part.bytes
        ));
    }
    let crc = crc.finalize();
    if bytes != part.bytes || crc != part.crc32 {
        return Err(format!(
            "{bytes} bytes with CRC-32 {crc:08x}, the commit says {} bytes with {:08x}",
            part.bytes, part.crc32
        ));
    }
    Ok(())
}

impl Checkpoints {
    /// Seconds between checkpoints (0: after every iteration) and when the last one was
    /// written (or the run started).
    pub(crate) fn timing(&self) -> (f64, Instant) {
        (self.every, self.last)
    }

    /// Writes this rank's part of the checkpoint after `iterations` iterations (the `owned`
    /// vertices of `state`) durably, and returns its record (length and CRC) for the ranks to
    /// all-gather before [`Checkpoints::commit`].
    pub(crate) fn write_part(
        &self,
        iterations: usize,
        owned: Range<u64>,
        state: &State,
    ) -> Result<Vec<u8>> {
        std::fs::create_dir_all(&self.dir).map_err(|e| GridError::os("create", &self.dir, e))?;
        let path = self.part_path(iterations);
        let mut part = None;
        publish(&path, |f| {
            part = Some(write_part(owned, state, f)?);
            Ok(())
        })?;
        Ok(serde_json::to_vec(&part.expect("written")).expect("a part serialises"))
    }

    /// Commits the checkpoint after `iterations` iterations once every rank's part is durable:
    /// `records` are the ranks' part records in rank order (this one's is `rank`'s), `vertices`
    /// every rank's vertices. Writes the commit record, removes this rank's older parts and
    /// counts the checkpoint (`started`: when it began) in the figures.
    pub(crate) fn commit(
        &mut self,
        iterations: usize,
        rank: usize,
        vertices: Vec<[u64; 2]>,
        records: &[Vec<u8>],
        started: Instant,
    ) -> Result<()> {
        let parts = records
            .iter()
            .enumerate()
            .map(|(q, p)| {
                serde_json::from_slice(p)
                    .map_err(|e| GridError::Group(format!("rank {q}'s checkpoint part: {e}")))
            })
            .collect::<Result<Vec<Part>>>()?;
        let bytes = parts[rank].bytes;
        let commit = Commit {
            format: FORMAT.into(),
            format_version: VERSION,
            algorithm: self.algorithm.clone(),
            params: self.params.clone(),
            vertices,
            iterations,
            parts,
        };
        let record = serde_json::to_vec_pretty(&commit).expect("a commit serialises");
        publish(&self.commit_path(), |f| f.write_all(&record))?;
        let path = self.part_path(iterations);
        for entry in
            std::fs::read_dir(&self.dir).map_err(|e| GridError::os("list", &self.dir, e))?
        {
            let old = entry
                .map_err(|e| GridError::os("list", &self.dir, e))?
                .path();
            if old.extension().is_some_and(|x| x == "part") && old != path {
                std::fs::remove_file(&old).map_err(|e| GridError::os("remove", &old, e))?;
            }
        }
        self.last = Instant::now();
        self.figures.written += 1;
        self.figures.bytes += bytes;
        self.figures.seconds += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// What this rank shares with the others before a resume: `None` on a first attempt
    /// (nothing to resume), else its commit record (empty when it has none).
    pub(crate) fn record_to_share(&self) -> Result<Option<Vec<u8>>> {
        if !self.restarted {
            return Ok(None);
        }
        Ok(Some(self.read_commit()?.unwrap_or_default()))
    }

    /// Loads into `state` (this rank's `owned` vertices) the checkpoint of the highest
    /// iteration among the ranks' commit `records` that belongs to this run (same algorithm,
    /// parameters and split of `vertices`); returns its iterations, `None` when there is none.
    pub(crate) fn load(
        &self,
        records: &[Vec<u8>],
        vertices: &[[u64; 2]],
        rank: usize,
        owned: Range<u64>,
        state: &State,
    ) -> Result<Option<usize>> {
        let mut best: Option<Commit> = None;
        for (q, text) in records.iter().enumerate() {
            if text.is_empty() {
                continue;
            }
            let commit: Commit =
                serde_json::from_slice(text).map_err(|e| GridError::Checkpoint {
                    path: rank_dir(self.dir.parent().unwrap_or(Path::new(".")), q)
                        .join("commit.json"),
                    msg: format!("rank {q}'s commit record does not parse: {e}"),
                })?;
            // Another run's record (another algorithm, parameters or split) is not this one's.
            let ours = commit.format == FORMAT
                && commit.algorithm == self.algorithm
                && commit.params == self.params
                && commit.vertices == vertices
                && commit.parts.len() == vertices.len();
            if ours
                && best
                    .as_ref()
                    .is_none_or(|b| commit.iterations > b.iterations)
            {
                best = Some(commit);
            }
        }
        let Some(commit) = best else {
            return Ok(None);
        };
        let path = self.part_path(commit.iterations);
        let part = &commit.parts[rank];
        let file = std::fs::File::open(&path).map_err(|e| GridError::Checkpoint {
            path: path.clone(),
            msg: format!(
                "the group committed the checkpoint after iteration {} but this rank's part cannot be opened: {e}",
                commit.iterations
            ),
        })?;
        read_part(owned, state, part, &mut BufReader::new(file)).map_err(|msg| {
            GridError::Checkpoint {
                path: path.clone(),
                msg: format!("refusing to resume from a part that is not the committed one: {msg}"),
            }
        })?;
        Ok(Some(commit.iterations))
    }

    /// Records that the run resumed from the checkpoint after `iterations` iterations.
    pub(crate) fn resumed(&mut self, iterations: usize) {
        self.figures.resumed_from = Some(iterations);
        self.last = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vertex::{U64Array, VertexMemory};

    #[test]
    fn a_part_reads_back_only_as_the_commit_describes_it() {
        let mem = VertexMemory::Heap;
        let values = U64Array::from_fn(&mem, 1000, |v| v as u64 * 7).unwrap();
        let frontier = Bitmap::new(1000);
        [250usize, 251, 599].iter().for_each(|&v| frontier.set(v));
        let owned = 250..600u64;
        let state = State {
            saved: &[&values],
            whole: &[],
            frontier: Some(&frontier),
        };
        let mut bytes = Vec::new();
        let part = write_part(owned.clone(), &state, &mut bytes).unwrap();
        assert_eq!(part.bytes, bytes.len() as u64);
        assert_eq!(bytes.len(), 350usize.div_ceil(8) + 350 * 8);

        let into = U64Array::filled(&mem, 1000, 0).unwrap();
        let back = Bitmap::full(1000);
        let load = State {
            saved: &[&into],
            whole: &[],
            frontier: Some(&back),
        };
        read_part(owned.clone(), &load, &part, &mut &bytes[..]).unwrap();
        assert_eq!(back.count(), 3);
        assert!(back.get(250) && back.get(251) && back.get(599));
        assert!((250..600).all(|v| into.get(v) == v as u64 * 7));
        assert!((0..250).all(|v| into.get(v) == 0));

        let mut flipped = bytes.clone();
        flipped[100] ^= 1;
        let err = read_part(owned.clone(), &load, &part, &mut &flipped[..]).unwrap_err();
        assert!(err.contains("CRC-32"), "{err}");
        let err =
            read_part(owned.clone(), &load, &part, &mut &bytes[..bytes.len() - 1]).unwrap_err();
        assert!(err.contains("the commit says"), "{err}");
        let longer = [&bytes[..], &[0u8]].concat();
        let err = read_part(owned, &load, &part, &mut &longer[..]).unwrap_err();
        assert!(err.contains("longer"), "{err}");
    }
}
