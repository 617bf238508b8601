//! String tables: names of nodes or relations as two arrays, `NAME_offsets` (int64, n + 1
//! entries) and `NAME_bytes` (uint8, UTF-8 names concatenated). Names are sorted byte-wise and
//! unique, so a name's dense id is its rank and lookups are binary searches.

use std::path::Path;

use crate::array::{NpyWriter, IO_CHUNK};
use crate::error::{Result, StoreError};
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

/// A string table opened for lookups (memory-mapped).
pub struct NameTable {
    offsets: memmap2::Mmap,
    bytes: memmap2::Mmap,
    offsets_start: usize,
    bytes_start: usize,
    len: usize,
}

impl NameTable {
    /// Opens table `prefix` of `store`.
    pub fn open(store: &Store, prefix: &str) -> Result<NameTable> {
        let map = |name: &str| -> Result<(memmap2::Mmap, usize)> {
            let path = store.array_path(name)?;
            let header = npy::read_header(&path)?;
            let file = std::fs::File::open(&path).map_err(|e| StoreError::os("open", &path, e))?;
            // SAFETY: store files are never modified in place after a store is committed.
            let mmap = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| StoreError::os("mmap", &path, e))?;
            Ok((mmap, header.data_offset as usize))
        };
        let (offsets, offsets_start) = map(&format!("{prefix}_offsets"))?;
        let (bytes, bytes_start) = map(&format!("{prefix}_bytes"))?;
        let len = (offsets.len() - offsets_start) / 8 - 1;
        Ok(NameTable {
            offsets,
            bytes,
            offsets_start,
            bytes_start,
            len,
        })
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn offset(&self, i: usize) -> usize {
        let at = self.offsets_start + i * 8;
        i64::from_le_bytes(self.offsets[at..at + 8].try_into().unwrap()) as usize
    }

    /// The name of id `i` (bytes; UTF-8 for text inputs).
    pub fn get(&self, i: usize) -> &[u8] {
        let (a, b) = (self.offset(i), self.offset(i + 1));
        &self.bytes[self.bytes_start + a..self.bytes_start + b]
    }

    /// The id of `name`, if present.
    pub fn find(&self, name: &[u8]) -> Option<u64> {
        let (mut lo, mut hi) = (0usize, self.len);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.get(mid).cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid as u64),
            }
        }
        None
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
