//! The name dictionary of string-id inputs: distinct names collected in bounded memory
//! (spilling sorted runs to disk), merged into the sorted node-name table, and looked up in
//! ranges that fit the budget.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Read;
use std::path::{Path, PathBuf};

use hashbrown::HashTable;
use strata_io::{SeqReader, SeqWriter};

use crate::error::{Result, StoreError};

/// Hashes a byte string (word-at-a-time multiply-rotate, then a full avalanche so that the high
/// bits, which the hash table uses for its control bytes, are well mixed).
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(K);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[derive(Clone, Copy)]
struct Entry {
    hash: u64,
    off: u64,
    len: u32,
    id: u64,
}

/// Bytes of one hash-table bucket: the entry and its control byte.
const BUCKET_BYTES: u64 = std::mem::size_of::<Entry>() as u64 + 1;

/// Bytes per name of the sort that emits names in order and ranks them: an `(offset, length,
/// position)` key and a `u64` rank.
const SORT_BYTES: u64 = 16 + 8;

/// Buckets hashbrown allocates to hold `names` entries (at most 7/8 full, a power of two).
fn buckets_for(names: u64) -> u64 {
    match names {
        0..4 => 4,
        4..8 => 8,
        _ => (names * 8).div_ceil(7).next_power_of_two(),
    }
}

/// Bytes of a dictionary table sized for `names` entries (the names themselves not included).
pub(crate) fn table_bytes(names: u64) -> u64 {
    buckets_for(names) * BUCKET_BYTES
}

/// A hash set/map of byte-string names stored in one arena, with a dense id per name.
#[derive(Default)]
pub(crate) struct NameDict {
    arena: Vec<u8>,
    table: HashTable<Entry>,
}

impl NameDict {
    pub fn new() -> Self {
        Self::default()
    }

    /// A dictionary that holds `names` entries of `bytes` name bytes in all without growing.
    pub fn with_capacity(names: usize, bytes: usize) -> Self {
        NameDict {
            arena: Vec::with_capacity(bytes),
            table: HashTable::with_capacity(names),
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Bytes of the table's buckets now.
    fn table_now(&self) -> u64 {
        match self.table.capacity() {
            0 => 0,
            cap => table_bytes(cap as u64),
        }
    }

    /// Peak heap bytes while `names` more names of `bytes` bytes in all are added and the
    /// result is then sorted ([`NameDict::emit_sorted`] or a spill): a growing table holds its
    /// old and new buckets at once, and a growing arena its old and new buffers.
    pub fn peak_after(&self, names: u64, bytes: u64) -> u64 {
        let n = self.len() as u64 + names;
        let grow = if n > self.table.capacity() as u64 {
            table_bytes(n)
        } else {
            0
        };
        let table = self.table_now() + grow;
        let need = self.arena.len() as u64 + bytes;
        let cap = self.arena.capacity() as u64;
        let arena = if need > cap {
            cap + need.max(2 * cap)
        } else {
            cap
        };
        table.max(table_bytes(n) + n * SORT_BYTES) + arena
    }

    /// Inserts `name` with id `id` if absent; returns whether it was new.
    pub fn insert(&mut self, name: &[u8], id: u64) -> bool {
        self.insert_hashed(hash_bytes(name), name, id)
    }

    fn insert_hashed(&mut self, hash: u64, name: &[u8], id: u64) -> bool {
        let arena = &self.arena;
        if self
            .table
            .find(hash, |e| {
                e.hash == hash && &arena[e.off as usize..e.off as usize + e.len as usize] == name
            })
            .is_some()
        {
            return false;
        }
        let entry = Entry {
            hash,
            off: self.arena.len() as u64,
            len: name.len() as u32,
            id,
        };
        self.arena.extend_from_slice(name);
        self.table.insert_unique(hash, entry, |e| e.hash);
        true
    }

    /// The id of `name`, if present.
    pub fn get(&self, name: &[u8]) -> Option<u64> {
        let hash = hash_bytes(name);
        self.table
            .find(hash, |e| e.hash == hash && self.name(e) == name)
            .map(|e| e.id)
    }

    fn name(&self, e: &Entry) -> &[u8] {
        &self.arena[e.off as usize..e.off as usize + e.len as usize]
    }

    /// Adds every name of `other` (ids are not carried over).
    pub fn absorb(&mut self, other: &NameDict) {
        // Grow once, for the worst case of every name being new, as `peak_after` assumes:
        // growing entry by entry can double the arena or the table several times, and each
        // doubling holds the old and the new buffer at once.
        self.arena.reserve(other.arena.len());
        self.table.reserve(other.len(), |e| e.hash);
        for e in other.table.iter() {
            let name = &other.arena[e.off as usize..e.off as usize + e.len as usize];
            self.insert_hashed(e.hash, name, 0);
        }
    }

    /// The names in byte order.
    pub fn sorted_names(&self) -> Vec<&[u8]> {
        let mut names: Vec<&[u8]> = self.table.iter().map(|e| self.name(e)).collect();
        names.sort_unstable();
        names
    }

    /// Emits every name in byte order to `emit` and gives each its rank as its id. Costs
    /// [`SORT_BYTES`] per name beyond the dictionary.
    pub fn emit_sorted(&mut self, mut emit: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        // Keys in the table's iteration order, which stays fixed while only ids change.
        let mut order: Vec<(u64, u32, u32)> = self
            .table
            .iter()
            .enumerate()
            .map(|(pos, e)| (e.off, e.len, pos as u32))
            .collect();
        let arena = &self.arena;
        let name = |k: &(u64, u32, u32)| &arena[k.0 as usize..(k.0 + k.1 as u64) as usize];
        order.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        let mut rank = vec![0u64; order.len()];
        for (r, k) in order.iter().enumerate() {
            emit(name(k))?;
            rank[k.2 as usize] = r as u64;
        }
        drop(order);
        for (e, r) in self.table.iter_mut().zip(rank) {
            e.id = r;
        }
        Ok(())
    }

    pub fn clear(&mut self) {
        self.arena = Vec::new();
        self.table = HashTable::new();
    }
}

/// Collects distinct names within `budget` bytes, spilling sorted runs to `scratch`.
pub(crate) struct NameCollector {
    dict: NameDict,
    budget: u64,
    scratch: PathBuf,
    runs: Vec<PathBuf>,
    io_chunk: usize,
}

impl NameCollector {
    pub fn new(budget: u64, scratch: &Path, io_chunk: usize) -> Self {
        NameCollector {
            dict: NameDict::new(),
            budget,
            scratch: scratch.to_path_buf(),
            runs: Vec::new(),
            io_chunk,
        }
    }

    /// Adds every name of a block's local dictionary.
    pub fn add_all(&mut self, names: &NameDict) -> Result<()> {
        if self.dict.len() > 0
            && self
                .dict
                .peak_after(names.len() as u64, names.arena.len() as u64)
                > self.budget
        {
            self.spill()?;
        }
        self.dict.absorb(names);
        Ok(())
    }

    /// Number of sorted runs written so far.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    fn spill(&mut self) -> Result<()> {
        let path = self
            .scratch
            .join(format!("names-run-{}.bin", self.runs.len()));
        let mut w = SeqWriter::create(&path, 0, self.io_chunk)?;
        for name in self.dict.sorted_names() {
            w.write_all(&(name.len() as u32).to_le_bytes())?;
            w.write_all(name)?;
        }
        w.finish()?;
        self.dict.clear();
        self.runs.push(path);
        Ok(())
    }

    /// Emits every distinct name once, in byte order, to `emit`. When nothing was spilled the
    /// in-memory dictionary is returned with ids assigned (ready for encoding); otherwise the
    /// runs are merged from disk and `None` is returned.
    pub fn finish(mut self, mut emit: impl FnMut(&[u8]) -> Result<()>) -> Result<Option<NameDict>> {
        if self.runs.is_empty() {
            self.dict.emit_sorted(emit)?;
            return Ok(Some(self.dict));
        }
        if self.dict.len() > 0 {
            self.spill()?;
        }
        // Every run is read at once: each gets a read-ahead of two chunks and a buffer of one,
        // all within three quarters of the budget.
        let per_run = self.budget / (4 * self.runs.len() as u64);
        let chunk =
            strata_io::align_down(per_run).clamp(strata_io::ALIGN as u64, self.io_chunk as u64);
        let mut readers = Vec::with_capacity(self.runs.len());
        for path in &self.runs {
            readers.push(RunReader::open(path, chunk as usize)?);
        }
        let mut heap = BinaryHeap::new();
        for (i, r) in readers.iter_mut().enumerate() {
            if let Some(name) = r.next()? {
                heap.push(Reverse((name, i)));
            }
        }
        let mut last: Option<Vec<u8>> = None;
        while let Some(Reverse((name, i))) = heap.pop() {
            if last.as_deref() != Some(&name[..]) {
                emit(&name)?;
            }
            if let Some(next) = readers[i].next()? {
                heap.push(Reverse((next, i)));
            }
            last = Some(name);
        }
        for path in &self.runs {
            let _ = std::fs::remove_file(path);
        }
        Ok(None)
    }
}

/// Reads a sorted run written by [`NameCollector::spill`].
struct RunReader {
    r: std::io::BufReader<SeqReader>,
    path: PathBuf,
}

impl RunReader {
    fn open(path: &Path, io_chunk: usize) -> Result<Self> {
        Ok(RunReader {
            r: std::io::BufReader::with_capacity(io_chunk, SeqReader::open(path, 0, io_chunk)?),
            path: path.to_path_buf(),
        })
    }

    fn next(&mut self) -> Result<Option<Vec<u8>>> {
        let mut len = [0u8; 4];
        match self.r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(StoreError::os("read", &self.path, e)),
        }
        let mut name = vec![0u8; u32::from_le_bytes(len) as usize];
        self.r
            .read_exact(&mut name)
            .map_err(|e| StoreError::os("read", &self.path, e))?;
        Ok(Some(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn collector_emits_sorted_distinct_names_for_any_budget(
            names in proptest::collection::vec("[a-d]{0,6}", 0..400),
            budget in 0u64..20_000,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut c = NameCollector::new(budget, dir.path(), 4096);
            for block in names.chunks(17) {
                let mut local = NameDict::new();
                for n in block {
                    local.insert(n.as_bytes(), 0);
                }
                c.add_all(&local).unwrap();
            }
            let mut out: Vec<Vec<u8>> = Vec::new();
            let dict = c.finish(|n| { out.push(n.to_vec()); Ok(()) }).unwrap();
            let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
            want.sort();
            want.dedup();
            prop_assert_eq!(&out, &want);
            if let Some(d) = dict {
                for (i, n) in want.iter().enumerate() {
                    prop_assert_eq!(d.get(n), Some(i as u64));
                }
            }
        }
    }

    proptest! {
        /// The collector spills before its dictionary, grown and then sorted, would pass the
        /// budget; only a single block's names may exceed it.
        #[test]
        fn collector_stays_within_its_budget(
            names in proptest::collection::vec("[a-z]{1,12}", 0..3000),
            budget in 1_000u64..60_000,
            block in 1usize..200,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut c = NameCollector::new(budget, dir.path(), 4096);
            for chunk in names.chunks(block) {
                let mut local = NameDict::new();
                for n in chunk {
                    local.insert(n.as_bytes(), 0);
                }
                c.add_all(&local).unwrap();
                if c.dict.len() > local.len() {
                    prop_assert!(c.dict.peak_after(0, 0) <= budget);
                }
            }
        }
    }

    #[test]
    fn lookup_misses_absent_names() {
        let mut d = NameDict::new();
        assert!(d.insert(b"alpha", 3));
        assert!(!d.insert(b"alpha", 4));
        assert_eq!(d.get(b"alpha"), Some(3));
        assert_eq!(d.get(b"beta"), None);
        assert_eq!(d.get(b""), None);
    }
}
