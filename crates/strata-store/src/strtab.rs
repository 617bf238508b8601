//! String tables: names of nodes or relations as two arrays, `NAME_offsets` (int64, n + 1
//! entries) and `NAME_bytes` (uint8, UTF-8 names concatenated). Names are sorted byte-wise and
//! unique, so a name's dense id is its rank and lookups are binary searches. A typed store's
//! node names are sorted and unique within each node type's id range instead (the same name
//! may name nodes of two types), and a lookup searches each range.

use std::path::{Path, PathBuf};

use crate::array::{NpyWriter, IO_CHUNK};
use crate::error::{quoted, Result, StoreError};
use crate::ids::{Field, IdCheck, OutOfRange};
use crate::manifest::ArrayInfo;
use crate::npy::{self, DType};
use crate::store::{Store, StoreBuilder};

/// Streams names, in id order, into a string table of a store being built.
pub struct StrTabWriter {
    offsets: NpyWriter,
    bytes: NpyWriter,
    end: i64,
    pending: Vec<i64>,
}

impl StrTabWriter {
    /// Starts the table `PREFIX_offsets` / `PREFIX_bytes` in `builder`.
    pub fn create(builder: &StoreBuilder, prefix: &str) -> Result<Self> {
        let mut offsets =
            builder.writer(&format!("{prefix}_offsets"), DType::I64, &[], IO_CHUNK)?;
        offsets.write(&[0i64])?;
        Ok(StrTabWriter {
            offsets,
            bytes: builder.writer(&format!("{prefix}_bytes"), DType::U8, &[], IO_CHUNK)?,
            end: 0,
            pending: Vec::with_capacity(4096),
        })
    }

    /// Appends the next name.
    pub fn push(&mut self, name: &[u8]) -> Result<()> {
        self.bytes.write_bytes(name)?;
        self.end += name.len() as i64;
        self.pending.push(self.end);
        if self.pending.len() == self.pending.capacity() {
            self.offsets.write(&self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }

    /// Finishes both arrays and records them in `builder`; returns the number of names.
    pub fn finish(mut self, builder: &mut StoreBuilder, prefix: &str) -> Result<u64> {
        self.offsets.write(&self.pending)?;
        let offsets: ArrayInfo = self.offsets.finish()?;
        let count = offsets.shape[0] - 1;
        builder.add(&format!("{prefix}_offsets"), offsets);
        builder.add(&format!("{prefix}_bytes"), self.bytes.finish()?);
        Ok(count)
    }
}

/// A string table opened for lookups (memory-mapped). Offsets are checked as they are read (a
/// lookup touches a few of them), so a corrupt table fails with the row named.
pub struct NameTable {
    offsets: memmap2::Mmap,
    bytes: memmap2::Mmap,
    offsets_start: usize,
    bytes_start: usize,
    len: usize,
    /// Id ranges `[lo, hi)` each sorted on its own: the node types' ranges of a typed store's
    /// node names, else the whole table.
    segments: Vec<(u64, u64)>,
    store: PathBuf,
    offsets_file: String,
}

impl NameTable {
    /// Opens table `prefix` of `store`.
    pub fn open(store: &Store, prefix: &str) -> Result<NameTable> {
        let offsets_name = format!("{prefix}_offsets");
        let types = &store.manifest().node_types;
        let segments = (prefix == "node_names" && !types.is_empty()).then(|| {
            types
                .iter()
                .map(|t| (t.offset, t.offset + t.count))
                .collect()
        });
        NameTable::open_at(
            store.path(),
            store.require(&offsets_name)?,
            store.require(&format!("{prefix}_bytes"))?,
            segments,
        )
    }

    /// Opens the table of arrays `offsets` and `bytes` in `dir` (a store, one being built,
    /// or a grid built from an input), each id range of `segments` sorted on its own (None:
    /// the whole table).
    pub fn open_at(
        dir: &Path,
        offsets: &ArrayInfo,
        bytes: &ArrayInfo,
        segments: Option<Vec<(u64, u64)>>,
    ) -> Result<NameTable> {
        let map = |info: &ArrayInfo| -> Result<(memmap2::Mmap, usize)> {
            let path = dir.join(&info.file);
            let header = npy::read_header(&path)?;
            let file = std::fs::File::open(&path).map_err(|e| StoreError::os("open", &path, e))?;
            // SAFETY: store and grid files are never modified in place once published.
            let mmap = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| StoreError::os("mmap", &path, e))?;
            Ok((mmap, header.data_offset as usize))
        };
        let (offsets_map, offsets_start) = map(offsets)?;
        let (bytes_map, bytes_start) = map(bytes)?;
        let len = (offsets_map.len() - offsets_start) / 8 - 1;
        Ok(NameTable {
            offsets: offsets_map,
            bytes: bytes_map,
            offsets_start,
            bytes_start,
            len,
            segments: segments.unwrap_or_else(|| vec![(0, len as u64)]),
            store: dir.to_path_buf(),
            offsets_file: offsets.file.clone(),
        })
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn offset(&self, i: usize) -> i64 {
        let at = self.offsets_start + i * 8;
        i64::from_le_bytes(self.offsets[at..at + 8].try_into().unwrap())
    }

    /// The name of id `i < len()` (bytes; UTF-8 for text inputs).
    pub fn get(&self, i: usize) -> Result<&[u8]> {
        let (a, b) = (self.offset(i), self.offset(i + 1));
        let total = (self.bytes.len() - self.bytes_start) as i64;
        let ids = |row: usize, lo: i64, value: i64| {
            let f = Field::new("offset", lo, total + 1);
            IdCheck::new(&self.store, &self.offsets_file, vec![f]).error(&OutOfRange {
                row: row as u64,
                column: 0,
                value,
            })
        };
        if !(0..=total).contains(&a) {
            return Err(ids(i, 0, a));
        }
        if !(a..=total).contains(&b) {
            return Err(ids(i + 1, a, b));
        }
        Ok(&self.bytes[self.bytes_start + a as usize..self.bytes_start + b as usize])
    }

    /// The name of id `i < len()` as text (invalid UTF-8 replaced).
    pub fn name(&self, i: usize) -> Result<String> {
        Ok(String::from_utf8_lossy(self.get(i)?).into_owned())
    }

    /// The id of `name`, if present. In a typed store's node names, the name must name a node
    /// of one type only (else an error lists the ids; [`NameTable::find_in`] searches one type).
    pub fn find(&self, name: &[u8]) -> Result<Option<u64>> {
        let mut found = Vec::new();
        for &(lo, hi) in &self.segments {
            found.extend(self.find_in(name, lo, hi)?);
        }
        match found[..] {
            [] => Ok(None),
            [id] => Ok(Some(id)),
            _ => Err(StoreError::Invalid {
                store: self.store.clone(),
                msg: format!(
                    "the name {} names nodes {found:?} of different node types: look it up within one node type",
                    quoted(name)
                ),
            }),
        }
    }

    /// The id of `name` among ids `[lo, hi)` (a range sorted on its own, such as a node type's),
    /// if present.
    pub fn find_in(&self, name: &[u8], lo: u64, hi: u64) -> Result<Option<u64>> {
        let (mut lo, mut hi) = (lo as usize, (hi as usize).min(self.len));
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.get(mid)?.cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Some(mid as u64)),
            }
        }
        Ok(None)
    }
}

/// Reads every name of a table file pair into memory (for small tables such as relations).
pub fn read_names(dir: &Path, offsets: &ArrayInfo, bytes: &ArrayInfo) -> Result<Vec<String>> {
    let (_, off) = crate::array::read_all_bytes(&dir.join(&offsets.file))?;
    let (_, data) = crate::array::read_all_bytes(&dir.join(&bytes.file))?;
    let offs: Vec<i64> = off
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Ok(offs
        .windows(2)
        .map(|w| String::from_utf8_lossy(&data[w[0] as usize..w[1] as usize]).into_owned())
        .collect())
}
