//! What `strata check` finds ([`Problems`], gathered in a [`Checked`]) and how it reads a
//! store's arrays in bounded memory (a [`Stream`] per array read in lockstep), with the checks
//! every store format shares (name tables, finite floats). The checks themselves are
//! [`crate::check`]'s.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;
use strata_io::progress::{Meter, Progress};

use crate::array::{decode_f32, decode_ints, IntCursor, RowReader};
use crate::error::{quoted, Result};
use crate::ids::{IdCheck, IndptrCheck};
use crate::npy::DType;
use crate::store::Store;

/// Bytes of each streaming read.
pub const CHUNK: usize = 4 << 20;
/// Problems listed per file by default; the rest are counted.
pub const DEFAULT_MAX_PER_FILE: usize = 20;
/// Values taken from a cursor at a time when arrays are read in lockstep.
pub(crate) const PIECE: usize = 1 << 16;
/// Values a [`Stream`] reads from disk at a time (1 MiB once decoded to `i64`).
const STREAM_VALUES: usize = 1 << 17;
/// One problem: the file (relative to the store), the row when there is one, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub file: String,
    pub row: Option<u64>,
    pub message: String,
}

/// Problems found so far, at most `cap` listed per file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Problems {
    pub listed: Vec<Problem>,
    /// Problems found beyond the cap, by file.
    pub unlisted: BTreeMap<String, u64>,
    #[serde(skip)]
    cap: usize,
    #[serde(skip)]
    per_file: HashMap<String, usize>,
}

impl Problems {
    /// An empty list that keeps at most `cap` problems per file (at least one).
    pub fn new(cap: usize) -> Problems {
        Problems {
            cap: cap.max(1),
            ..Problems::default()
        }
    }

    /// Records a problem of `file`.
    pub fn add(&mut self, file: &str, row: Option<u64>, message: String) {
        let n = self.per_file.entry(file.to_string()).or_default();
        *n += 1;
        if *n > self.cap {
            *self.unlisted.entry(file.to_string()).or_default() += 1;
        } else {
            self.listed.push(Problem {
                file: file.to_string(),
                row,
                message,
            });
        }
    }

    /// Problems found, listed or not.
    pub fn total(&self) -> u64 {
        self.listed.len() as u64 + self.unlisted.values().sum::<u64>()
    }

    pub fn is_empty(&self) -> bool {
        self.listed.is_empty() && self.unlisted.is_empty()
    }
}

/// What a check found, and what it read.
pub struct Checked {
    /// The store, when it opened (its values were then checked too).
    pub store: Option<Store>,
    pub problems: Problems,
    /// Files read in full, in the order they were checked.
    pub files: Vec<String>,
    pub bytes_read: u64,
}

/// The summary `strata check` prints (and writes with `--json-summary`).
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub store: PathBuf,
    /// What `store` is: `store`, or `grid` for a grid built on its own (checked by itself).
    pub kind: &'static str,
    pub ok: bool,
    pub problems: u64,
    pub listed: Vec<Problem>,
    pub unlisted: BTreeMap<String, u64>,
    pub files_checked: Vec<String>,
    pub bytes_read: u64,
    pub seconds: f64,
}

impl Checked {
    /// Nothing checked yet; at most `max_per_file` problems will be listed per file.
    pub fn new(max_per_file: usize) -> Checked {
        Checked {
            store: None,
            problems: Problems::new(max_per_file),
            files: Vec::new(),
            bytes_read: 0,
        }
    }

    /// The report of the check of the store at `path`, which took `seconds`.
    pub fn report(&self, path: &Path, seconds: f64) -> CheckReport {
        CheckReport {
            store: path.to_path_buf(),
            kind: "store",
            ok: self.problems.is_empty(),
            problems: self.problems.total(),
            listed: self.problems.listed.clone(),
            unlisted: self.problems.unlisted.clone(),
            files_checked: self.files.clone(),
            bytes_read: self.bytes_read,
            seconds,
        }
    }

    /// Streams the integers of array `name` of `store` (progress stage `check FILE`), calling
    /// `f` with each batch of whole rows.
    pub fn ints(
        &mut self,
        store: &Store,
        name: &str,
        progress: &dyn Progress,
        mut f: impl FnMut(&mut Problems, &[i64]),
    ) -> Result<()> {
        let info = store.require(name)?.clone();
        let mut reader = RowReader::open_array(store.path(), &info, CHUNK)?;
        let cols = info.shape.iter().skip(1).product::<u64>().max(1);
        let mut meter = Meter::new(
            progress,
            &format!("check {}", info.file),
            info.data_bytes(),
            info.shape[0],
        );
        let mut vals = Vec::new();
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            decode_ints(bytes, info.dtype, &mut vals);
            f(&mut self.problems, &vals);
            meter.add(vals.len() as u64 / cols, bytes.len() as u64)?;
        }
        meter.finish()?;
        self.read(&info.file, info.data_bytes());
        Ok(())
    }

    /// Records a file read in full.
    pub fn read(&mut self, file: &str, bytes: u64) {
        if !self.files.iter().any(|f| f == file) {
            self.files.push(file.to_string());
        }
        self.bytes_read += bytes;
    }

    /// Lists every value of `check`'s array out of its range.
    pub(crate) fn ids(
        &mut self,
        store: &Store,
        name: &str,
        mut check: IdCheck,
        progress: &dyn Progress,
    ) -> Result<()> {
        let file = check.file().to_string();
        self.ints(store, name, progress, |problems, vals| {
            check.scan(vals, |row, msg| problems.add(&file, Some(row), msg))
        })
    }
}

/// An integer array read value by value, in chunks (for reading arrays in lockstep).
pub(crate) struct Stream {
    cursor: IntCursor,
    buf: Vec<i64>,
    pos: usize,
}

impl Stream {
    pub(crate) fn open(checked: &mut Checked, store: &Store, name: &str) -> Result<Stream> {
        let info = store.require(name)?;
        checked.read(&info.file, info.data_bytes());
        // A float32 array (weights) is read as its bit patterns, for exact comparisons.
        let dtype = match info.dtype {
            DType::F32 => DType::I32,
            d => d,
        };
        // Values are decoded to i64: read at most STREAM_VALUES at a time, so that the several
        // streams read in lockstep stay small whatever their element size.
        let batch = STREAM_VALUES * info.dtype.size();
        Ok(Stream {
            cursor: IntCursor::new(RowReader::open_array(store.path(), info, batch)?, dtype),
            buf: Vec::new(),
            pos: 0,
        })
    }

    pub(crate) fn next(&mut self) -> Result<Option<i64>> {
        if self.pos == self.buf.len() {
            self.cursor.take(PIECE, &mut self.buf)?;
            self.pos = 0;
        }
        let v = self.buf.get(self.pos).copied();
        self.pos += v.is_some() as usize;
        Ok(v)
    }

    /// The next `n` values (fewer at the end) into `out`.
    pub(crate) fn take(&mut self, n: usize, out: &mut Vec<i64>) -> Result<()> {
        out.clear();
        let here = (self.buf.len() - self.pos).min(n);
        out.extend_from_slice(&self.buf[self.pos..self.pos + here]);
        self.pos += here;
        if out.len() < n {
            let mut rest = Vec::new();
            self.cursor.take(n - out.len(), &mut rest)?;
            out.extend_from_slice(&rest);
        }
        Ok(())
    }
}

/// Checks a name table: offsets from 0 to the byte count, never decreasing; names sorted and
/// unique (ids are ranks, found by binary search).
pub(crate) fn name_table(
    store: &Store,
    checked: &mut Checked,
    table: &str,
    progress: &dyn Progress,
) -> Result<()> {
    let (offsets_name, bytes_name) = (format!("{table}_offsets"), format!("{table}_bytes"));
    let total = store.require(&bytes_name)?.shape[0];
    let offsets_file = store.require(&offsets_name)?.file.clone();
    let mut check = IndptrCheck::array(store, &offsets_name, total)?;
    let mut sound = true;
    checked.ints(store, &offsets_name, progress, |problems, vals| {
        check.scan(vals, |row, msg| {
            sound = false;
            problems.add(&offsets_file, Some(row), msg);
        })
    })?;
    if let Some((row, msg)) = check.end_problem() {
        sound = false;
        checked.problems.add(&offsets_file, Some(row), msg);
    }
    if !sound {
        return Ok(());
    }
    let bytes_file = store.require(&bytes_name)?.file.clone();
    let mut offsets = Stream::open(checked, store, &offsets_name)?;
    let mut bytes = Stream::open(checked, store, &bytes_name)?;
    let (mut prev, mut name, mut vals) = (Vec::<u8>::new(), Vec::<u8>::new(), Vec::new());
    // A typed store's node names are sorted within each node type's id range.
    let restarts: Vec<u64> = match table {
        "node_names" => store
            .manifest()
            .node_types
            .iter()
            .map(|t| t.offset)
            .collect(),
        _ => Vec::new(),
    };
    let mut start = offsets.next()?.unwrap_or(0);
    let mut id = 0u64;
    while let Some(end) = offsets.next()? {
        bytes.take((end - start) as usize, &mut vals)?;
        name.clear();
        name.extend(vals.iter().map(|&b| b as u8));
        if id > 0 && restarts.binary_search(&id).is_err() && name <= prev {
            checked.problems.add(
                &bytes_file,
                Some(id),
                format!(
                    "{bytes_file}: name {id} ({}) does not sort after name {} ({}): names must be sorted and unique",
                    quoted(&name),
                    id - 1,
                    quoted(&prev)
                ),
            );
        }
        std::mem::swap(&mut prev, &mut name);
        start = end;
        id += 1;
    }
    Ok(())
}

/// Checks that every value of float array `name` (features, weights) is finite (a NaN poisons
/// every model that reads the row).
pub(crate) fn finite(
    store: &Store,
    checked: &mut Checked,
    name: &str,
    progress: &dyn Progress,
) -> Result<()> {
    let info = store.require(name)?.clone();
    let dim = info.shape.get(1).copied().unwrap_or(1).max(1) as usize;
    let mut reader = RowReader::open_array(store.path(), &info, CHUNK)?;
    let mut meter = Meter::new(
        progress,
        &format!("check {}", info.file),
        info.data_bytes(),
        info.shape[0],
    );
    let (mut row, mut vals) = (0u64, Vec::new());
    while let Some(bytes) = reader.next_batch()? {
        vals.clear();
        decode_f32(bytes, info.dtype, &mut vals);
        for r in vals.chunks_exact(dim) {
            if let Some(col) = r.iter().position(|x| !x.is_finite()) {
                checked.problems.add(
                    &info.file,
                    Some(row),
                    format!(
                        "{} row {row}: column {col} is {} ({name} must be finite)",
                        info.file, r[col]
                    ),
                );
            }
            row += 1;
        }
        meter.add((vals.len() / dim) as u64, bytes.len() as u64)?;
    }
    meter.finish()?;
    checked.read(&info.file, info.data_bytes());
    Ok(())
}
