//! GLIST's page cache (§4.2): data files are read in fixed pages through the I/O engine, and
//! the pages kept in RAM under least-recently-used replacement, so requests that touch the same
//! vertices again (GLIST's locality, improved by its graph reorganization) are served from
//! memory instead of the SSD.
//!
//! [`Lru`] is the generic byte-budgeted LRU underneath; it is also meant for other caches of the
//! service (e.g. computed embeddings). [`PageCache`] shards pages over several LRUs so that
//! concurrent readers rarely contend on one lock, and [`PagedFile`] reads rows of a file through
//! it. [`PagedRows`] is a feature file read that way, as a `strata_graph::FeatureStore`.

use std::collections::HashMap;
use std::hash::Hash;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use strata_graph::feature_store::read_on_complete;
use strata_graph::{FeatureStore, GraphError, Pending};
use strata_io::{AlignedBuf, Engine, IoFile, OpenMode, Request};

use crate::error::Result;

/// Bytes in one cached page: 16 KiB, the flash page of GLIST's SSD (feature vectors are packed
/// into 16 KB pages, §4.3.2), so one device read brings in every row stored on that page. It is
/// also a multiple of the 4096-byte `O_DIRECT` alignment, so every page read is aligned.
pub const PAGE_BYTES: usize = 16 * 1024;

/// Most shards of a [`PageCache`]; enough that a handful of reader threads seldom meet on one
/// lock.
const MAX_SHARDS: u64 = 16;

/// Least capacity of one shard, in bytes (64 pages). Shards evict independently, so a shard of
/// a few pages would evict while others still have room; small caches get fewer shards (one,
/// below 2 MiB, which makes them an exact LRU).
const MIN_SHARD_BYTES: u64 = 64 * PAGE_BYTES as u64;

/// Marks the end of the recency list.
const NIL: usize = usize::MAX;

/// A least-recently-used cache with a capacity in bytes.
///
/// Each entry is inserted with its weight in bytes (what it costs in memory, as the caller
/// counts it). Inserting evicts least recently used entries until the total weight is at most
/// the capacity; an entry heavier than the whole capacity is not kept. `get`, `insert` and
/// `remove` take O(1): entries live in a slab of slots linked in recency order by index, and a
/// hash map finds a key's slot.
pub struct Lru<K, V> {
    index: HashMap<K, usize>,
    slots: Vec<Slot<K, V>>,
    /// Slots whose entry was removed, for reuse.
    free: Vec<usize>,
    /// Most recently used slot, or `NIL`.
    head: usize,
    /// Least recently used slot, or `NIL`.
    tail: usize,
    capacity_bytes: u64,
    used_bytes: u64,
    hits: u64,
    misses: u64,
}

struct Slot<K, V> {
    /// `None` while the slot is free.
    entry: Option<(K, V)>,
    bytes: u64,
    /// Neighbour used more recently, or `NIL`.
    prev: usize,
    /// Neighbour used less recently, or `NIL`.
    next: usize,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// An empty cache holding up to `capacity_bytes` bytes of entries (0: keeps nothing).
    pub fn new(capacity_bytes: u64) -> Lru<K, V> {
        Lru {
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity_bytes,
            used_bytes: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// The value of `key`, now the most recently used entry; counts a hit or a miss.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        let Some(&i) = self.index.get(key) else {
            self.misses += 1;
            return None;
        };
        self.hits += 1;
        self.unlink(i);
        self.push_front(i);
        self.slots[i].entry.as_ref().map(|(_, v)| v)
    }

    /// Inserts `value` under `key` (replacing any value it had) as the most recently used
    /// entry, weighing `bytes` bytes, then evicts least recently used entries until the total
    /// is within the capacity. An entry heavier than the capacity is dropped at once.
    pub fn insert(&mut self, key: K, value: V, bytes: u64) {
        self.remove(&key);
        if bytes > self.capacity_bytes {
            return;
        }
        let slot = Slot {
            entry: Some((key.clone(), value)),
            bytes,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        self.index.insert(key, i);
        self.push_front(i);
        self.used_bytes += bytes;
        self.evict_to_capacity();
    }

    /// Sets the capacity, evicting least recently used entries until the total is within it.
    pub fn set_capacity(&mut self, capacity_bytes: u64) {
        self.capacity_bytes = capacity_bytes;
        self.evict_to_capacity();
    }

    fn evict_to_capacity(&mut self) {
        while self.used_bytes > self.capacity_bytes {
            self.release(self.tail);
        }
    }

    /// Removes `key`'s entry and returns its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = *self.index.get(key)?;
        Some(self.release(i))
    }

    /// Removes every entry whose key `keep` rejects.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let doomed: Vec<usize> = self
            .index
            .iter()
            .filter(|(k, _)| !keep(k))
            .map(|(_, &i)| i)
            .collect();
        for i in doomed {
            self.release(i);
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Total weight of the entries, in bytes (at most the capacity).
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Calls of [`Lru::get`] that found their key.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Calls of [`Lru::get`] that did not.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Takes slot `i`'s entry out of the cache and frees the slot.
    fn release(&mut self, i: usize) -> V {
        self.unlink(i);
        let (key, value) = self.slots[i]
            .entry
            .take()
            .expect("a linked slot is occupied");
        self.index.remove(&key);
        self.used_bytes -= self.slots[i].bytes;
        self.free.push(i);
        value
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.slots[i].prev, self.slots[i].next);
        match prev {
            NIL => self.head = next,
            p => self.slots[p].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n].prev = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        self.slots[i].prev = NIL;
        self.slots[i].next = self.head;
        match self.head {
            NIL => self.tail = i,
            h => self.slots[h].prev = i,
        }
        self.head = i;
    }
}

/// A page in the cache: `(file id, page number)`.
type PageKey = (u64, u64);

/// A page's bytes: [`PAGE_BYTES`], fewer for the last page of a file. Shared, so a reader keeps
/// using a page that another thread evicts meanwhile.
type Page = Arc<AlignedBuf>;

/// Counters of a [`PageCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Bytes of pages the cache may hold.
    pub capacity_bytes: u64,
    /// Bytes of pages it holds (each page counted at its allocation, [`PAGE_BYTES`]).
    pub used_bytes: u64,
    /// Page lookups served from the cache.
    pub hits: u64,
    /// Page lookups that had to read the file.
    pub misses: u64,
    /// Bytes read from files to serve misses.
    pub bytes_read: u64,
}

/// GLIST's page cache: pages of [`PagedFile`]s, least recently used evicted first, within a
/// capacity in bytes. Shared by all readers (it is `Sync`): pages are spread by hash over up
/// to 16 independently locked LRU shards, so recency is exact within a shard and approximate
/// across them. Capacity 0 turns caching off: every read goes to the file, still correct.
pub struct PageCache {
    shards: Vec<Mutex<Lru<PageKey, Page>>>,
    capacity_bytes: AtomicU64,
    bytes_read: AtomicU64,
}

/// Shard `s`'s capacity out of `capacity_bytes` over `n` shards: they add up to exactly the
/// total, the first ones taking the rest.
fn shard_capacity(capacity_bytes: u64, n: u64, s: u64) -> u64 {
    capacity_bytes / n + u64::from(s < capacity_bytes % n)
}

impl PageCache {
    /// A cache of at most `capacity_bytes` bytes of pages.
    pub fn new(capacity_bytes: u64) -> PageCache {
        let n = (capacity_bytes / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS);
        let shards = (0..n)
            .map(|s| Mutex::new(Lru::new(shard_capacity(capacity_bytes, n, s))))
            .collect();
        PageCache {
            shards,
            capacity_bytes: AtomicU64::new(capacity_bytes),
            bytes_read: AtomicU64::new(0),
        }
    }

    /// Bytes of pages the cache may hold now.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes.load(Ordering::Acquire)
    }

    /// Changes the capacity (when registered graphs and models take or give back part of the
    /// budget), evicting least recently used pages of each shard that is over its new share.
    /// The number of shards stays what it was at start.
    pub fn resize(&self, capacity_bytes: u64) {
        self.capacity_bytes.store(capacity_bytes, Ordering::Release);
        let n = self.shards.len() as u64;
        for (s, shard) in self.shards.iter().enumerate() {
            shard
                .lock()
                .unwrap()
                .set_capacity(shard_capacity(capacity_bytes, n, s as u64));
        }
    }

    /// The counters, summed over the shards.
    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            capacity_bytes: self.capacity_bytes(),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            ..CacheStats::default()
        };
        for shard in &self.shards {
            let lru = shard.lock().unwrap();
            stats.used_bytes += lru.used_bytes();
            stats.hits += lru.hits();
            stats.misses += lru.misses();
        }
        stats
    }

    /// Drops every page of file `file_id` (see [`PagedFile::file_id`]), e.g. when the store
    /// version it belongs to is retired, so its memory goes to live files at once.
    pub fn forget_file(&self, file_id: u64) {
        for shard in &self.shards {
            shard.lock().unwrap().retain(|&(f, _)| f != file_id);
        }
    }

    fn get(&self, key: PageKey) -> Option<Page> {
        self.shard(key).lock().unwrap().get(&key).cloned()
    }

    fn insert(&self, key: PageKey, page: Page) {
        let bytes = page.capacity() as u64;
        self.shard(key).lock().unwrap().insert(key, page, bytes);
    }

    fn shard(&self, (file, page): PageKey) -> &Mutex<Lru<PageKey, Page>> {
        // Fibonacci hashing of both halves, so a file's consecutive pages spread over all
        // shards.
        let h = (file.rotate_left(32) ^ page).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[((h >> 32) % self.shards.len() as u64) as usize]
    }
}

/// What one [`PagedFile::read_rows`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Distinct pages found in the cache.
    pub pages_hit: u64,
    /// Distinct pages read from the file.
    pub pages_missed: u64,
    /// Bytes read from the file.
    pub bytes_read: u64,
}

/// Ids of opened files; each [`PagedFile`] takes the next, so pages cached for one file are
/// never served for another, not even for a new file at the same path.
static NEXT_FILE_ID: AtomicU64 = AtomicU64::new(1);

/// A read-only data file read in [`PAGE_BYTES`] pages through a [`PageCache`] and the I/O
/// engine. The file must not change while it is open (store versions are immutable): cached
/// pages are never revalidated.
pub struct PagedFile {
    file: IoFile,
    engine: Arc<Engine>,
    file_id: u64,
    len: u64,
}

impl PagedFile {
    /// Opens `path` for reading through the process-wide I/O engine.
    pub fn open(path: &Path) -> Result<PagedFile> {
        PagedFile::with_engine(path, Engine::shared())
    }

    /// Opens `path` for reading through `engine`.
    pub fn with_engine(path: &Path, engine: Arc<Engine>) -> Result<PagedFile> {
        let file = engine.open(path, OpenMode::Read)?;
        let len = file.file().size()?;
        Ok(PagedFile {
            file,
            engine,
            file_id: NEXT_FILE_ID.fetch_add(1, Ordering::Relaxed),
            len,
        })
    }

    /// This file's id in the page cache, unique in the process.
    pub fn file_id(&self) -> u64 {
        self.file_id
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads rows of `row_bytes` bytes, row `r` at file offset `data_offset + r * row_bytes`,
    /// into `out`: row `rows[i]` at `out[i * row_bytes..(i + 1) * row_bytes]` (any order,
    /// repeats allowed; a row may straddle pages).
    ///
    /// Pages found in `cache` are used as they are; all the missing ones are read in one batch
    /// through the I/O engine and added to the cache. `out.len()` must be
    /// `rows.len() * row_bytes`, and every row must end within the file.
    pub fn read_rows(
        &self,
        cache: &PageCache,
        data_offset: u64,
        row_bytes: usize,
        rows: &[u32],
        out: &mut [u8],
    ) -> strata_graph::Result<ReadStats> {
        let path = self.file.path().display();
        if row_bytes == 0 {
            return Err(GraphError::Config(format!(
                "{path}: rows of 0 bytes cannot be read"
            )));
        }
        if Some(out.len()) != rows.len().checked_mul(row_bytes) {
            return Err(GraphError::Config(format!(
                "{path}: {} rows of {row_bytes} bytes need an output of {} bytes, got {}",
                rows.len(),
                rows.len().saturating_mul(row_bytes),
                out.len()
            )));
        }
        let row_range = |r: u32| {
            let start = (r as u64)
                .checked_mul(row_bytes as u64)
                .and_then(|o| o.checked_add(data_offset))?;
            let end = start.checked_add(row_bytes as u64)?;
            (end <= self.len).then_some((start, end))
        };
        let mut ranges = Vec::with_capacity(rows.len());
        for &r in rows {
            ranges.push(row_range(r).ok_or_else(|| {
                GraphError::Config(format!(
                    "{path}: row {r} of {row_bytes} bytes from offset {data_offset} ends past \
                     the end of the file ({} bytes)",
                    self.len
                ))
            })?);
        }

        let page = PAGE_BYTES as u64;
        let mut pages: Vec<u64> = ranges
            .iter()
            .flat_map(|&(start, end)| start / page..=(end - 1) / page)
            .collect();
        pages.sort_unstable();
        pages.dedup();
        let mut found: Vec<Option<Page>> = pages
            .iter()
            .map(|&p| cache.get((self.file_id, p)))
            .collect();
        let hits = found.iter().filter(|p| p.is_some()).count() as u64;
        let bytes_read = self.read_missing(cache, &pages, &mut found)?;

        for (&(start, end), dst) in ranges.iter().zip(out.chunks_exact_mut(row_bytes)) {
            // A row's pages are consecutive page numbers, hence consecutive in `pages`.
            let mut at = pages
                .binary_search(&(start / page))
                .expect("every row's pages are listed");
            let mut pos = start;
            while pos < end {
                let bytes = found[at].as_ref().expect("every listed page was read");
                let page_start = pages[at] * page;
                let from = (pos - page_start) as usize;
                let to = ((end - page_start) as usize).min(PAGE_BYTES);
                let done = (pos - start) as usize;
                dst[done..done + to - from].copy_from_slice(&bytes.as_slice()[from..to]);
                pos = page_start + to as u64;
                at += 1;
            }
        }
        Ok(ReadStats {
            pages_hit: hits,
            pages_missed: pages.len() as u64 - hits,
            bytes_read,
        })
    }

    /// Reads the pages of `pages` that `found` lacks, in one batch, into `found` and `cache`.
    /// On an error it still waits for every request in flight, then returns the first error.
    /// Returns the bytes read.
    fn read_missing(
        &self,
        cache: &PageCache,
        pages: &[u64],
        found: &mut [Option<Page>],
    ) -> strata_graph::Result<u64> {
        let requests: Vec<Request> = found
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_none())
            .map(|(i, _)| {
                let offset = pages[i] * PAGE_BYTES as u64;
                // The file's last page may be short: ask for the bytes that exist (the engine
                // reads whole aligned blocks and reports just those).
                let len = (self.len - offset).min(PAGE_BYTES as u64) as usize;
                Request::read(
                    &self.file,
                    offset,
                    len,
                    AlignedBuf::new(PAGE_BYTES),
                    i as u64,
                )
            })
            .collect();
        if requests.is_empty() {
            return Ok(0);
        }
        let mut queue = self.engine.queue();
        queue.submit(requests);
        let mut bytes_read = 0u64;
        let mut failed = None;
        while let Some(c) = queue.wait() {
            match c.result {
                Ok(n) => {
                    let i = c.tag as usize;
                    let page = Arc::new(c.buf.into_heap().expect("pages are heap buffers"));
                    cache.insert((self.file_id, pages[i]), page.clone());
                    found[i] = Some(page);
                    bytes_read += n as u64;
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        cache.bytes_read.fetch_add(bytes_read, Ordering::Relaxed);
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(bytes_read),
        }
    }
}

/// Rows of a [`PagedFile`] read through a [`PageCache`]: the service's feature store (a store
/// version's features). Row `r` is `row_bytes` bytes at `data_offset + r * row_bytes`; the
/// rows are those the file holds in full.
pub struct PagedRows<'a> {
    file: &'a PagedFile,
    cache: &'a PageCache,
    data_offset: u64,
    row_bytes: usize,
}

impl<'a> PagedRows<'a> {
    /// The rows of `row_bytes` bytes (at least 1) from byte `data_offset` of `file`, read
    /// through `cache` (a cache of capacity 0 reads around it).
    pub fn new(
        file: &'a PagedFile,
        cache: &'a PageCache,
        data_offset: u64,
        row_bytes: usize,
    ) -> PagedRows<'a> {
        PagedRows {
            file,
            cache,
            data_offset,
            row_bytes,
        }
    }
}

impl FeatureStore for PagedRows<'_> {
    fn num_rows(&self) -> u64 {
        self.file.len().saturating_sub(self.data_offset) / self.row_bytes.max(1) as u64
    }

    fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Reads when completed, through the page cache (a miss is read then, synchronously).
    fn submit(&self, rows: &[u32]) -> strata_graph::Result<Pending<'_>> {
        let path = self.file.file.path().display().to_string();
        read_on_complete(self, &path, rows, |rows, out| {
            let stats =
                self.file
                    .read_rows(self.cache, self.data_offset, self.row_bytes, rows, out)?;
            Ok(stats.bytes_read)
        })
    }

    /// Refused: a store version's file is read-only (mutations go to the served graph's
    /// overlay, see `graph::features::GraphFeatures`).
    fn update(&mut self, _rows: &[u32], _data: &[u8]) -> strata_graph::Result<()> {
        Err(GraphError::ReadOnly(
            self.file.file.path().display().to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    const P: u64 = PAGE_BYTES as u64;

    /// The keys of `lru`, most recently used first.
    fn order<K: Hash + Eq + Clone, V>(lru: &Lru<K, V>) -> Vec<K> {
        let mut keys = Vec::new();
        let mut i = lru.head;
        while i != NIL {
            keys.push(lru.slots[i].entry.as_ref().unwrap().0.clone());
            i = lru.slots[i].next;
        }
        keys
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut lru = Lru::new(30);
        lru.insert('a', 1, 10);
        lru.insert('b', 2, 10);
        lru.insert('c', 3, 10);
        assert_eq!(order(&lru), ['c', 'b', 'a']);
        assert_eq!(lru.get(&'a'), Some(&1));
        assert_eq!(order(&lru), ['a', 'c', 'b']);
        lru.insert('d', 4, 10);
        assert_eq!(order(&lru), ['d', 'a', 'c']);
        assert_eq!(lru.get(&'b'), None);
        assert_eq!((lru.hits(), lru.misses()), (1, 1));
        assert_eq!(
            (lru.len(), lru.used_bytes(), lru.capacity_bytes()),
            (3, 30, 30)
        );
        // A heavy entry evicts as many as it takes.
        lru.insert('e', 5, 25);
        assert_eq!(order(&lru), ['e']);
        assert_eq!(lru.used_bytes(), 25);
    }

    #[test]
    fn lru_replaces_removes_and_retains() {
        let mut lru = Lru::new(100);
        lru.insert(1, "one", 10);
        lru.insert(2, "two", 10);
        lru.insert(1, "uno", 30);
        assert_eq!(order(&lru), [1, 2]);
        assert_eq!(lru.used_bytes(), 40);
        assert_eq!(lru.get(&1), Some(&"uno"));
        // Too heavy to keep: dropped, and the old value under that key with it.
        lru.insert(2, "huge", 101);
        assert_eq!(order(&lru), [1]);
        assert_eq!(lru.remove(&1), Some("uno"));
        assert_eq!(lru.remove(&1), None);
        assert!(lru.is_empty());
        assert_eq!(lru.used_bytes(), 0);
        for k in 0..10 {
            lru.insert(k, "n", 1);
        }
        lru.retain(|k| k % 3 == 0);
        assert_eq!(order(&lru), [9, 6, 3, 0]);
        assert_eq!(lru.used_bytes(), 4);
        // Freed slots are reused.
        lru.insert(20, "m", 1);
        assert_eq!(lru.slots.len(), 10);
    }

    #[test]
    fn resizing_evicts_the_least_recently_used_of_each_shard() {
        let mut lru = Lru::new(40);
        for (k, bytes) in [('a', 10), ('b', 10), ('c', 10), ('d', 10)] {
            lru.insert(k, (), bytes);
        }
        lru.get(&'a');
        lru.set_capacity(25);
        assert_eq!((lru.len(), lru.used_bytes()), (2, 20));
        assert!(lru.get(&'a').is_some() && lru.get(&'d').is_some());
        // A cache's shards share the new capacity; growing it evicts nothing.
        let cache = PageCache::new(4 * MIN_SHARD_BYTES);
        cache.resize(2 * MIN_SHARD_BYTES + 1);
        let shares: Vec<u64> = cache
            .shards
            .iter()
            .map(|s| s.lock().unwrap().capacity_bytes())
            .collect();
        assert_eq!(shares.iter().sum::<u64>(), 2 * MIN_SHARD_BYTES + 1);
        assert_eq!(cache.stats().capacity_bytes, 2 * MIN_SHARD_BYTES + 1);
    }

    #[test]
    fn lru_of_capacity_zero_keeps_nothing() {
        let mut lru = Lru::new(0);
        lru.insert("k", 1, 1);
        lru.insert("free", 2, 0);
        assert_eq!(lru.get(&"k"), None);
        // An entry weighing nothing fits in nothing.
        assert_eq!(lru.get(&"free"), Some(&2));
        assert_eq!((lru.len(), lru.used_bytes()), (1, 0));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Get(u8),
        Insert(u8, u64),
        Remove(u8),
        RetainOdd,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..12).prop_map(Op::Get),
            4 => (0u8..12, 0u64..40).prop_map(|(k, w)| Op::Insert(k, w)),
            1 => (0u8..12).prop_map(Op::Remove),
            1 => Just(Op::RetainOdd),
        ]
    }

    proptest! {
        #[test]
        fn lru_matches_a_simple_model(capacity in 0u64..100, ops in proptest::collection::vec(op(), 0..200)) {
            let mut lru = Lru::new(capacity);
            // (key, value, bytes), most recently used first.
            let mut model: Vec<(u8, usize, u64)> = Vec::new();
            let (mut hits, mut misses) = (0, 0);
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Get(k) => {
                        let want = model.iter().position(|e| e.0 == k).map(|at| {
                            let e = model.remove(at);
                            model.insert(0, e);
                            e.1
                        });
                        if want.is_some() { hits += 1 } else { misses += 1 }
                        prop_assert_eq!(lru.get(&k).copied(), want);
                    }
                    Op::Insert(k, w) => {
                        lru.insert(k, step, w);
                        model.retain(|e| e.0 != k);
                        if w <= capacity {
                            model.insert(0, (k, step, w));
                        }
                        while model.iter().map(|e| e.2).sum::<u64>() > capacity {
                            model.pop();
                        }
                    }
                    Op::Remove(k) => {
                        let want = model.iter().position(|e| e.0 == k).map(|at| model.remove(at).1);
                        prop_assert_eq!(lru.remove(&k), want);
                    }
                    Op::RetainOdd => {
                        lru.retain(|k| k % 2 == 1);
                        model.retain(|e| e.0 % 2 == 1);
                    }
                }
                prop_assert_eq!(order(&lru), model.iter().map(|e| e.0).collect::<Vec<_>>());
                prop_assert_eq!(lru.used_bytes(), model.iter().map(|e| e.2).sum::<u64>());
                prop_assert_eq!((lru.hits(), lru.misses()), (hits, misses));
            }
        }
    }

    /// The engines under test: the thread pool, and io_uring unless STRATA_TEST_NO_URING.
    fn engines() -> &'static [Arc<Engine>] {
        static ENGINES: OnceLock<Vec<Arc<Engine>>> = OnceLock::new();
        // A small window, so a batch of page reads waits for room.
        ENGINES.get_or_init(|| strata_io::testing::engines(4, 3))
    }

    /// A file of `len` pseudo-random bytes.
    fn write_file(dir: &Path, name: &str, len: u64, seed: u64) -> (std::path::PathBuf, Vec<u8>) {
        let mut s = seed;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect();
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    }

    /// What `read_rows` should produce, from the file's bytes.
    fn expected(bytes: &[u8], data_offset: u64, row_bytes: usize, rows: &[u32]) -> Vec<u8> {
        rows.iter()
            .flat_map(|&r| {
                let start = data_offset as usize + r as usize * row_bytes;
                bytes[start..start + row_bytes].iter().copied()
            })
            .collect()
    }

    fn read(
        file: &PagedFile,
        cache: &PageCache,
        data_offset: u64,
        row_bytes: usize,
        rows: &[u32],
    ) -> (Vec<u8>, ReadStats) {
        let mut out = vec![0u8; rows.len() * row_bytes];
        let stats = file
            .read_rows(cache, data_offset, row_bytes, rows, &mut out)
            .unwrap();
        (out, stats)
    }

    fn err_text<T, E: std::fmt::Display>(r: std::result::Result<T, E>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn rows_match_plain_reads(
            // Rows within a page, straddling pages (sizes that do not divide 16 KiB), a page,
            // and longer than a page.
            row_bytes in prop_oneof![Just(1usize), Just(12), Just(1000), Just(4096), Just(5000),
                                     Just(PAGE_BYTES), Just(PAGE_BYTES + 4), Just(40_000)],
            data_offset in prop_oneof![Just(0u64), Just(128), Just(4096), Just(7)],
            num_rows in 1u32..120,
            // Bytes after the last row: the last page is usually short.
            tail in prop_oneof![Just(0u64), 1u64..5000],
            picks in proptest::collection::vec(any::<u32>(), 0..80),
            capacity in prop_oneof![Just(0u64), Just(2 * P), Just(1 << 20), Just(64 << 20)],
            seed in any::<u64>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let len = data_offset + num_rows as u64 * row_bytes as u64 + tail;
            let (path, bytes) = write_file(dir.path(), "rows", len, seed);
            // Random rows with repeats, and the last row.
            let mut rows: Vec<u32> = picks.iter().map(|&p| p % num_rows).collect();
            rows.push(num_rows - 1);
            rows.extend_from_slice(&rows.clone()[..rows.len() / 3]);
            let want = expected(&bytes, data_offset, row_bytes, &rows);
            for engine in engines() {
                let file = PagedFile::with_engine(&path, engine.clone()).unwrap();
                prop_assert_eq!(file.len(), len);
                let cache = PageCache::new(capacity);
                let (out, first) = read(&file, &cache, data_offset, row_bytes, &rows);
                prop_assert!(out == want, "rows differ");
                let pages = first.pages_hit + first.pages_missed;
                prop_assert_eq!(first.pages_hit, 0);
                let (out, second) = read(&file, &cache, data_offset, row_bytes, &rows);
                prop_assert!(out == want, "rows differ on the second read");
                prop_assert_eq!(second.pages_hit + second.pages_missed, pages);
                let stats = cache.stats();
                prop_assert!(stats.used_bytes <= capacity);
                prop_assert_eq!(stats.bytes_read, first.bytes_read + second.bytes_read);
                prop_assert_eq!(stats.hits + stats.misses, 2 * pages);
                if pages * P <= capacity / 16 {
                    // Even the smallest shard can hold every page: all hits the second time.
                    prop_assert_eq!((second.pages_hit, second.bytes_read), (pages, 0));
                }
            }
        }
    }

    #[test]
    fn hits_misses_and_bytes_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes) = write_file(dir.path(), "pages", 10 * P, 1);
        let cache = PageCache::new(64 << 20);
        for engine in engines() {
            let file = PagedFile::with_engine(&path, engine.clone()).unwrap();
            let (out, stats) = read(&file, &cache, 0, PAGE_BYTES, &[0, 1, 2, 1]);
            assert_eq!(out, expected(&bytes, 0, PAGE_BYTES, &[0, 1, 2, 1]));
            let miss3 = ReadStats {
                pages_hit: 0,
                pages_missed: 3,
                bytes_read: 3 * P,
            };
            assert_eq!(stats, miss3);
            let (_, stats) = read(&file, &cache, 0, PAGE_BYTES, &[2, 1, 0]);
            assert_eq!(
                (stats.pages_hit, stats.pages_missed, stats.bytes_read),
                (3, 0, 0)
            );
            // A row straddling pages 2 and 3: one hit, one miss.
            let (out, stats) = read(&file, &cache, P / 2, PAGE_BYTES, &[2]);
            assert_eq!(out, expected(&bytes, P / 2, PAGE_BYTES, &[2]));
            assert_eq!((stats.pages_hit, stats.pages_missed), (1, 1));
        }
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses), (2 * 4, 2 * 4));
        assert_eq!(stats.bytes_read, 2 * 4 * P);
        assert_eq!(stats.used_bytes, 2 * 4 * P);
        assert_eq!(stats.capacity_bytes, 64 << 20);
    }

    #[test]
    fn the_last_page_may_be_short() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes) = write_file(dir.path(), "short", 2 * P + 100, 2);
        for engine in engines() {
            let file = PagedFile::with_engine(&path, engine.clone()).unwrap();
            let cache = PageCache::new(1 << 20);
            let (out, stats) = read(&file, &cache, 2 * P, 50, &[1, 0]);
            assert_eq!(out, expected(&bytes, 2 * P, 50, &[1, 0]));
            assert_eq!((stats.pages_missed, stats.bytes_read), (1, 100));
            let e = err_text(file.read_rows(&cache, 2 * P, 50, &[0, 2], &mut [0; 100]));
            assert!(
                e.contains("row 2 of 50 bytes from offset 32768 ends past the end")
                    && e.contains("32868 bytes")
                    && e.contains("short"),
                "{e}"
            );
        }
    }

    #[test]
    fn paged_rows_are_a_feature_store() {
        let dir = tempfile::tempdir().unwrap();
        // 3 pages + 100 bytes hold, from offset 128, 1023 whole rows of 48 bytes, then 20
        // bytes that are no row.
        let (path, bytes) = write_file(dir.path(), "rows", 3 * P + 100, 3);
        let file = PagedFile::open(&path).unwrap();
        let cache = PageCache::new(1 << 20);
        let rows = PagedRows::new(&file, &cache, 128, 48);
        let store: &dyn FeatureStore = &rows;
        assert_eq!((store.num_rows(), store.row_bytes()), (1023, 48));
        let ids = [1022, 0, 341, 0];
        let mut out = vec![0u8; ids.len() * 48];
        // Pages 0, 1 and the short page 3.
        assert_eq!(store.read(&ids, &mut out).unwrap(), 2 * P + 100);
        assert_eq!(out, expected(&bytes, 128, 48, &ids));
        assert_eq!(store.read(&ids, &mut out).unwrap(), 0);
        // Refused at submit, naming the file.
        let e = err_text(store.submit(&[1023]));
        assert!(
            e.contains(&format!("{}: row 1023 is out of range", path.display())),
            "{e}"
        );
        let mut rows = rows;
        let e = rows.update(&[0], &[0; 48]).unwrap_err();
        assert!(matches!(&e, GraphError::ReadOnly(p) if p == &path.display().to_string()));
    }

    #[test]
    fn bad_arguments_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = write_file(dir.path(), "f", 1000, 3);
        let file = PagedFile::open(&path).unwrap();
        let cache = PageCache::new(1 << 20);
        let e = err_text(file.read_rows(&cache, 0, 10, &[1, 2], &mut [0; 19]));
        assert!(
            e.contains("2 rows of 10 bytes need an output of 20 bytes, got 19"),
            "{e}"
        );
        let e = err_text(file.read_rows(&cache, 0, 0, &[1], &mut []));
        assert!(e.contains("rows of 0 bytes"), "{e}");
        let e = err_text(file.read_rows(&cache, u64::MAX - 5, 10, &[0], &mut [0; 10]));
        assert!(e.contains("row 0 of 10 bytes"), "{e}");
        let e = err_text(file.read_rows(&cache, 0, 10, &[u32::MAX], &mut [0; 10]));
        assert!(e.contains(&format!("row {}", u32::MAX)), "{e}");
        // Nothing asked, nothing read.
        let (_, stats) = read(&file, &cache, 0, 10, &[]);
        assert_eq!(stats, ReadStats::default());
        assert!(!file.is_empty());
        let e = err_text(PagedFile::open(&dir.path().join("missing")));
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn capacity_bounds_the_pages_kept_in_lru_order() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = write_file(dir.path(), "lru", 8 * P, 4);
        let file = PagedFile::with_engine(&path, engines()[0].clone()).unwrap();
        // Two pages, one shard: an exact LRU.
        let cache = PageCache::new(2 * P);
        let missed = |pages: &[u32]| read(&file, &cache, 0, PAGE_BYTES, pages).1.pages_missed;
        assert_eq!(missed(&[0, 1]), 2);
        assert_eq!(missed(&[0]), 0);
        // Page 1 is the least recently used: page 2 takes its place.
        assert_eq!(missed(&[2]), 1);
        assert_eq!(missed(&[0]), 0);
        assert_eq!(missed(&[1]), 1);
        assert_eq!(missed(&[2]), 1);
        assert_eq!(cache.stats().used_bytes, 2 * P);
        // A batch larger than the cache is still read whole and correct.
        assert_eq!(missed(&[0, 1, 2, 3, 4, 5, 6, 7]), 6);
        assert_eq!(cache.stats().used_bytes, 2 * P);
        // Big caches shard; the shards add up to the capacity.
        let big = PageCache::new(100 * MIN_SHARD_BYTES + 5);
        assert_eq!(big.shards.len(), 16);
        let total: u64 = big
            .shards
            .iter()
            .map(|s| s.lock().unwrap().capacity_bytes())
            .sum();
        assert_eq!(total, 100 * MIN_SHARD_BYTES + 5);
        assert_eq!(PageCache::new(3 * MIN_SHARD_BYTES).shards.len(), 3);
    }

    #[test]
    fn capacity_zero_turns_caching_off() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes) = write_file(dir.path(), "off", 3 * P + 10, 5);
        let file = PagedFile::open(&path).unwrap();
        let cache = PageCache::new(0);
        for _ in 0..2 {
            let (out, stats) = read(&file, &cache, 10, 3000, &[0, 15, 5]);
            assert_eq!(out, expected(&bytes, 10, 3000, &[0, 15, 5]));
            assert_eq!((stats.pages_hit, stats.pages_missed), (0, 3));
        }
        let stats = cache.stats();
        assert_eq!((stats.used_bytes, stats.hits, stats.misses), (0, 0, 6));
    }

    #[test]
    fn concurrent_readers() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes) = write_file(dir.path(), "shared", 300 * 1000 + 77, 6);
        let bytes = Arc::new(bytes);
        for engine in engines() {
            let file = Arc::new(PagedFile::with_engine(&path, engine.clone()).unwrap());
            // Smaller than the file, so readers evict each other's pages.
            let cache = Arc::new(PageCache::new(6 * P));
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let (file, cache, bytes) = (file.clone(), cache.clone(), bytes.clone());
                    std::thread::spawn(move || {
                        let mut s = t + 1;
                        for _ in 0..20 {
                            let rows: Vec<u32> = (0..30)
                                .map(|_| {
                                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                                    ((s >> 33) % 300) as u32
                                })
                                .collect();
                            let (out, _) = read(&file, &cache, 77, 1000, &rows);
                            assert_eq!(out, expected(&bytes, 77, 1000, &rows));
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let stats = cache.stats();
            assert!(stats.used_bytes <= 6 * P);
            assert!(stats.hits > 0 && stats.misses > 0, "{stats:?}");
        }
    }

    #[test]
    fn forget_file_drops_only_that_files_pages() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = write_file(dir.path(), "v1", 4 * P, 7);
        let cache = PageCache::new(1 << 20);
        let old = PagedFile::open(&path).unwrap();
        // The same path opened again is a new file: it never sees the old one's pages.
        let new = PagedFile::open(&path).unwrap();
        assert_ne!(old.file_id(), new.file_id());
        let missed = |f: &PagedFile| read(f, &cache, 0, PAGE_BYTES, &[0, 3]).1.pages_missed;
        assert_eq!(missed(&old), 2);
        assert_eq!(missed(&new), 2);
        assert_eq!(cache.stats().used_bytes, 4 * P);
        cache.forget_file(old.file_id());
        assert_eq!(cache.stats().used_bytes, 2 * P);
        assert_eq!(missed(&new), 0);
        assert_eq!(missed(&old), 2);
    }

    #[test]
    fn shared_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<PageCache>();
        check::<PagedFile>();
    }
}
