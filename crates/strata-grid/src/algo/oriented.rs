//! The degree-oriented adjacency that triangle counting works on, built from a symmetric grid
//! within the work buffer: each undirected edge {u, v} (self-loops and parallel edges
//! dropped) kept once, at the endpoint of lower rank, rank being (degree, id). A vertex then
//! keeps at most sqrt(2m) neighbours: those ranked above it have at least its degree.
//!
//! One pass counts each vertex's records towards higher ranks; then vertex ranges whose
//! records fit the work buffer are gathered a pass each ([`gather`]), each list sorted and
//! its repeats dropped. When every range fits at once the adjacency stays in memory;
//! otherwise the lists go, range after range, to a scratch file in the run directory,
//! unlinked as soon as it is created (so a crash leaves nothing behind) and read back with
//! direct I/O.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use strata_io::{Engine, IoFile, SeqReader, SeqWriter};

use super::gather::{self, for_each_list, plan_ranges, too_big, Lists, VALUE_BYTES, VERTEX_BYTES};
use super::Passes;
use crate::error::{GridError, Result};
use crate::stream::Streamer;
use crate::vertex::U64Array;

/// The most bytes of each of the two buffers a scratch file's writer, or each of its readers,
/// holds (one is read or written while the other is used).
pub(crate) const MAX_IO_CHUNK: u64 = 1 << 20;

/// Bytes of each I/O buffer of the scratch file for a work buffer of `capacity` bytes shared
/// by `threads` readers: together they take at most a quarter of it, within a page and
/// [`MAX_IO_CHUNK`].
pub(crate) fn io_chunk(capacity: u64, threads: usize) -> u64 {
    let share = capacity / 4 / (2 * threads.max(1) as u64);
    const PAGE: u64 = strata_io::ALIGN as u64;
    strata_io::align_down(share).clamp(PAGE, MAX_IO_CHUNK)
}

/// The oriented adjacency: vertex v's neighbours of higher rank, ascending by id, are entries
/// `start[v]..start[v + 1]` (as [`orient`] leaves `start`).
pub(crate) enum Oriented {
    /// All the lists, in vertex order.
    Memory(Vec<u32>),
    /// In a scratch file.
    File(Scratch),
}

/// The lists in the (unlinked) scratch file, in vertex order, 4 bytes a neighbour.
pub(crate) struct Scratch {
    engine: Arc<Engine>,
    file: IoFile,
    path: PathBuf,
    /// Bytes of each of a reader's two buffers.
    chunk: u64,
}

impl Scratch {
    /// A sequential reader of entries `range`, with two read buffers of [`io_chunk`] bytes.
    pub fn reader(&self, range: Range<u64>) -> Entries {
        Entries {
            reader: SeqReader::new(
                &self.engine,
                self.file.clone(),
                range.start * VALUE_BYTES,
                range.end * VALUE_BYTES,
                self.chunk as usize,
            ),
            path: self.path.clone(),
        }
    }

    /// Bytes of each of a reader's two buffers.
    pub fn chunk(&self) -> u64 {
        self.chunk
    }
}

/// Entries of the scratch file, read in order.
pub(crate) struct Entries {
    reader: SeqReader,
    path: PathBuf,
}

impl Entries {
    /// Reads the next `out.len()` entries into `out`.
    pub fn fill(&mut self, out: &mut [u32]) -> Result<()> {
        use std::io::Read;
        self.reader
            .read_exact(bytemuck::cast_slice_mut(out))
            .map_err(|e| GridError::os("read", &self.path, e))
    }
}

/// Bytes of the longest list an oriented vertex can hold on a grid of `edges` records:
/// 4 x sqrt(2m) (a vertex's higher-ranked neighbours each have at least its degree).
pub(crate) fn longest_list_bytes(edges: u64) -> u64 {
    ((2.0 * edges as f64).sqrt().ceil() as u64) * VALUE_BYTES
}

/// Builds the oriented adjacency of `s`'s symmetric grid within `capacity` bytes of work
/// buffer, reporting each pass over the grid to `passes`. `degree` holds every vertex's
/// degree; `start` (V + 1 entries, zero) ends holding the offsets of the lists.
pub(crate) fn orient(
    s: &mut Streamer,
    passes: &mut Passes,
    degree: &U64Array,
    start: &U64Array,
    capacity: u64,
) -> Result<Oriented> {
    let n = s.grid().layout().num_vertices as usize;
    let higher =
        |owner: usize, other: usize| (degree.get(other), other) > (degree.get(owner), owner);
    let progress = passes.ctx().progress;
    let pass = gather::count(s, 0..n, start, higher, progress)?;
    let records = pass.total;
    passes.report(pass, n as u64)?;
    let in_memory = records * VALUE_BYTES + n as u64 * VERTEX_BYTES <= capacity;
    // Out of memory, the scratch file's writer takes its share of the buffer.
    let chunk = io_chunk(capacity, s.config().threads);
    let room = capacity.saturating_sub(2 * chunk);
    let ranges: Vec<Range<usize>> = match in_memory {
        true => std::iter::once(0..n).collect(),
        false => plan_ranges(0..n, |v| start.get(v), room)
            .map_err(|e| too_big("triangles", e, room, capacity))?,
    };
    let mut writer = match in_memory {
        true => None,
        false => Some(scratch(s, chunk)?),
    };
    let mut kept: Vec<u32> = Vec::new();
    let mut entries = 0u64;
    let threads = s.config().threads;
    let grid_dir = s.grid().dir().to_path_buf();
    for range in ranges {
        let lists = Lists::new(range.clone(), |v| start.get(v));
        let progress = passes.ctx().progress;
        let pass = gather::gather(
            s,
            &lists,
            |owner, other| higher(owner, other).then_some(other as u32),
            progress,
        )?;
        passes.report(pass, range.len() as u64)?;
        let (first, mut values) = lists.finish(&grid_dir)?;
        for_each_list(range.start, &first, &mut values, threads, |_, list| {
            list.sort_unstable()
        });
        // Drop repeats (parallel edges), moving each list down to where the last one ended.
        let mut at = 0usize;
        for (k, v) in range.clone().enumerate() {
            start.set(v, entries + at as u64);
            let mut last = None;
            for i in first[k] as usize..first[k + 1] as usize {
                let x = values[i];
                if last != Some(x) {
                    values[at] = x;
                    at += 1;
                    last = Some(x);
                }
            }
        }
        values.truncate(at);
        entries += at as u64;
        match writer.as_mut() {
            Some((w, _)) => w.write_all(bytemuck::cast_slice(&values))?,
            None => kept = values,
        }
    }
    start.set(n, entries);
    Ok(match writer {
        None => Oriented::Memory(kept),
        Some((w, path)) => {
            let (file, _) = w.finish()?;
            Oriented::File(Scratch {
                engine: Engine::shared(),
                file,
                path,
                chunk,
            })
        }
    })
}

/// A writer of a new scratch file in the run directory, unlinked at once; and its path (for
/// messages).
fn scratch(s: &Streamer, chunk: u64) -> Result<(SeqWriter, PathBuf)> {
    let dir = s.scratch_dir();
    std::fs::create_dir_all(dir).map_err(|e| GridError::os("mkdir", dir, e))?;
    let path = dir.join(format!(".oriented-{}.scratch", std::process::id()));
    let writer = SeqWriter::create(&path, 0, 2 * chunk as usize)?;
    std::fs::remove_file(&path).map_err(|e| GridError::os("unlink", &path, e))?;
    Ok((writer, path))
}
