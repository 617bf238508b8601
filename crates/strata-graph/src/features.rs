//! Node features on disk, gathered row by row through the I/O engine, after GIDS and
//! Helios (coalesced, aligned, many in flight).
//!
//! A mini-batch needs the feature rows of an arbitrary set of nodes. The rows live in a C-ordered
//! `.npy` file of shape `(num_nodes, dim)` (float32 or float16) that is far larger than memory,
//! so every batch is a gather of scattered rows read with `O_DIRECT`, in whole aligned 4 KiB
//! units. Two things decide what that costs:
//!
//! - **The policy** ([`plan_reads`], pure and tested without I/O): the requested rows, sorted,
//!   become aligned extents. Rows that share a page are always read together (a page is read
//!   once per gather), and rows whose pages are close are merged into one request when the
//!   unneeded bytes in between are few ([`ReadOptions::max_gap`]) and the request stays small
//!   enough to keep many in flight ([`ReadOptions::max_request`]). Small requests in large
//!   numbers are what SSDs serve best, so the defaults only merge what is nearly free.
//! - **The mechanism** ([`FeatureReader::gather`]): the extents are read with up to the engine's
//!   depth in flight, into aligned buffers reused across requests (and calls), and each row is
//!   copied to every output position that asked for it. A gather is submitted
//!   ([`FeatureReader::submit_gather`]) and then completed ([`Gather::complete`]), so a caller
//!   can put the next gather's reads in flight before it finishes the current one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use half::f16;
use half::slice::HalfFloatSliceExt;
use strata_io::{
    align_down, align_up, AlignedBuf, Engine, IoFile, IoQueue, OpenMode, Request, ALIGN,
};
use strata_store::npy::{self, DType};
use strata_store::StoreError;

use crate::error::{GraphError, Result};
use crate::feature_store::{FeatureStore, Pending, PendingRead};

/// Element type of a feature file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureDType {
    /// Little-endian IEEE float32 (`<f4`), 4 bytes per element.
    F32,
    /// Little-endian IEEE float16 (`<f2`), 2 bytes per element; widened to f32 by
    /// [`FeatureReader::gather_f32`].
    F16,
}

impl FeatureDType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            FeatureDType::F32 => 4,
            FeatureDType::F16 => 2,
        }
    }

    /// The NumPy name (`float32`, `float16`).
    pub fn name(self) -> &'static str {
        self.dtype().name()
    }

    /// The store's element type.
    pub fn dtype(self) -> DType {
        match self {
            FeatureDType::F32 => DType::F32,
            FeatureDType::F16 => DType::F16,
        }
    }
}

/// The layout of a feature file: what [`FeatureFile::open`] learns from the `.npy` header.
///
/// Row `r` occupies bytes `[data_offset + r * row_bytes, data_offset + (r + 1) * row_bytes)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureFile {
    /// The `.npy` file.
    pub path: PathBuf,
    /// Element type.
    pub dtype: FeatureDType,
    /// Number of rows (nodes): the array's first dimension.
    pub num_rows: u64,
    /// Elements per row: the array's second dimension (at least 1).
    pub dim: usize,
    /// Bytes per row: `dim * dtype.size()`.
    pub row_bytes: usize,
    /// Byte offset of row 0 in the file (4096 in Strata stores; any value in foreign files,
    /// e.g. 128 for a small NumPy header).
    pub data_offset: u64,
}

impl FeatureFile {
    /// Reads and checks the header of the features `.npy` at `path`: a 2-D, C-ordered array of
    /// float32 or float16 with at least one column, whose data the file holds in full.
    pub fn open(path: &Path) -> Result<FeatureFile> {
        let header = npy::read_header(path)?;
        let bad = |msg: String| -> GraphError {
            StoreError::BadFile {
                path: path.to_path_buf(),
                msg,
            }
            .into()
        };
        let dtype = match header.dtype {
            DType::F32 => FeatureDType::F32,
            DType::F16 => FeatureDType::F16,
            other => {
                return Err(bad(format!(
                    "expected float32 or float16 features, found {other}"
                )))
            }
        };
        let &[num_rows, dim] = header.shape.as_slice() else {
            return Err(bad(format!(
                "expected a 2-D array of shape (num_nodes, dim), found shape {:?}",
                header.shape
            )));
        };
        if dim == 0 {
            return Err(bad(format!(
                "the features have dimension 0 (shape ({num_rows}, 0)): there is nothing to read"
            )));
        }
        if header.fortran_order {
            return Err(bad(
                "the features are stored in Fortran order, so a node's row is not contiguous; \
                 save them in C order (numpy.ascontiguousarray)"
                    .into(),
            ));
        }
        let row_bytes = dim
            .checked_mul(dtype.size() as u64)
            .filter(|&b| b <= isize::MAX as u64)
            .ok_or_else(|| bad(format!("rows of {dim} elements are too large")))?;
        let data_end = num_rows
            .checked_mul(row_bytes)
            .and_then(|b| b.checked_add(header.data_offset))
            .ok_or_else(|| bad(format!("shape ({num_rows}, {dim}) is too large")))?;
        let file_len = std::fs::metadata(path)
            .map_err(|e| strata_io::IoError::os("stat", path, 0, e))?
            .len();
        if file_len < data_end {
            return Err(bad(format!(
                "truncated: the header declares {num_rows} rows of {row_bytes} bytes from byte \
                 {} (ending at byte {data_end}) but the file has {file_len} bytes",
                header.data_offset
            )));
        }
        Ok(FeatureFile {
            path: path.to_path_buf(),
            dtype,
            num_rows,
            dim: dim as usize,
            row_bytes: row_bytes as usize,
            data_offset: header.data_offset,
        })
    }

    /// Byte offset of row `row` in the file.
    pub fn row_offset(&self, row: u64) -> u64 {
        self.data_offset + row * self.row_bytes as u64
    }

    /// Bytes of feature data (`num_rows * row_bytes`), header excluded.
    pub fn data_bytes(&self) -> u64 {
        self.num_rows * self.row_bytes as u64
    }
}

/// One planned read: an aligned byte range of the file holding a run of the requested rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset in the file, a multiple of [`ALIGN`].
    pub offset: u64,
    /// Length in bytes, a positive multiple of [`ALIGN`].
    pub len: u64,
    /// Index, in the planned (sorted) row list, of the first row inside.
    pub first: usize,
    /// Number of rows inside: `rows[first..first + count]`, at least 1.
    pub count: usize,
}

impl Extent {
    /// One past the last byte (exclusive end offset).
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// Plans the aligned reads that fetch `rows` of a file of fixed-size rows.
///
/// - `rows`: row ids, sorted ascending and distinct (panics otherwise: the guarantees below
///   would silently break).
/// - `row_bytes`: bytes per row (> 0); row `r` is `[data_offset + r * row_bytes, + row_bytes)`.
/// - `data_offset`: byte offset of row 0 (any value, aligned or not).
/// - `max_gap`: bytes of unneeded (aligned) data we accept reading to merge two rows' reads
///   into one request.
/// - `max_request`: bytes a merge may grow an extent to.
///
/// Each row's aligned range `[align_down(start), align_up(end))` is appended to the current
/// extent when it shares a page with it (always: reading that page twice, or holding a row in
/// two extents, is what this plan exists to avoid), or when it merely touches or is at most
/// `max_gap` bytes away and the grown extent stays within `max_request` bytes; otherwise it
/// starts a new extent.
///
/// The result: extents sorted by offset, aligned to [`ALIGN`], pairwise disjoint, each as
/// tight as its rows allow, partitioning `rows` in order (`first`/`count`), every row's bytes
/// inside its own extent and no other. An extent exceeds `max_request` only when a single
/// row's aligned range does, or when rows sharing pages chain past it (e.g. 3 KiB rows read
/// back to back: each shares a page with the next, so no cut leaves both sides whole);
/// [`FeatureReader`] reads such an extent as several requests of at most `max_request`
/// bytes, so its buffers stay bounded all the same.
pub fn plan_reads(
    rows: &[u64],
    row_bytes: u64,
    data_offset: u64,
    max_gap: u64,
    max_request: u64,
) -> Vec<Extent> {
    assert!(row_bytes > 0, "plan_reads: rows of 0 bytes");
    assert!(
        rows.windows(2).all(|w| w[0] < w[1]),
        "plan_reads: rows must be sorted and distinct"
    );
    let mut out: Vec<Extent> = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        let start = data_offset + r * row_bytes;
        let lo = align_down(start);
        let hi = align_up(start + row_bytes);
        if let Some(e) = out.last_mut() {
            let end = e.end();
            // Rows are disjoint and sorted, so `hi >= end`; `lo < end` means a shared page.
            let shares_page = lo < end;
            let near = !shares_page && lo - end <= max_gap && hi - e.offset <= max_request;
            if shares_page || near {
                e.len = hi.max(end) - e.offset;
                e.count += 1;
                continue;
            }
        }
        out.push(Extent {
            offset: lo,
            len: hi - lo,
            first: i,
            count: 1,
        });
    }
    out
}

/// How [`FeatureReader`] merges and sizes its reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadOptions {
    /// Bytes of unneeded data accepted between two rows' pages to read them in one request
    /// (default 4096: one spare page per merge, in exchange for one request fewer).
    pub max_gap: u64,
    /// Largest request in bytes (default 128 KiB; at least 4096). Bounds both how far merging
    /// goes and each read buffer, so many requests stay in flight.
    pub max_request: u64,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            max_gap: ALIGN as u64,
            max_request: 128 << 10,
        }
    }
}

/// What one gather did, for reporting read amplification (`bytes_read / bytes_useful`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadStats {
    /// Rows asked for, repeats included.
    pub rows_requested: u64,
    /// Distinct rows among them (each read once).
    pub rows_distinct: u64,
    /// I/O requests submitted to the engine.
    pub requests: u64,
    /// Bytes read from the device: the requests' aligned lengths (whole 4 KiB blocks).
    pub bytes_read: u64,
    /// Bytes of the distinct rows: `rows_distinct * row_bytes`.
    pub bytes_useful: u64,
}

impl ReadStats {
    /// Bytes read per useful byte (1.0 is perfect; 0 when nothing was read).
    pub fn amplification(&self) -> f64 {
        if self.bytes_useful == 0 {
            0.0
        } else {
            self.bytes_read as f64 / self.bytes_useful as f64
        }
    }

    /// Adds `other`'s counts to these (totals over several gathers).
    pub fn add(&mut self, other: &ReadStats) {
        self.rows_requested += other.rows_requested;
        self.rows_distinct += other.rows_distinct;
        self.requests += other.requests;
        self.bytes_read += other.bytes_read;
        self.bytes_useful += other.bytes_useful;
    }
}

/// Bytes of idle read buffers a reader keeps between gathers (beyond this they are freed).
const POOL_RETAIN_BYTES: usize = 32 << 20;

/// Aligned read buffers by size class: class `k` holds buffers of `ALIGN << k` bytes. Sizes are
/// rounded up to a power of two pages so that buffers of one gather fit the next one's requests.
#[derive(Default)]
struct BufPool {
    classes: Vec<Vec<AlignedBuf>>,
    bytes: usize,
}

impl BufPool {
    fn class_of(len: usize) -> usize {
        (len.div_ceil(ALIGN).next_power_of_two()).trailing_zeros() as usize
    }

    /// A buffer of at least `len` bytes.
    fn take(&mut self, len: usize) -> AlignedBuf {
        let k = Self::class_of(len);
        match self.classes.get_mut(k).and_then(Vec::pop) {
            Some(b) => {
                self.bytes -= b.capacity();
                b
            }
            None => AlignedBuf::new(ALIGN << k),
        }
    }

    /// Keeps `buf` for reuse unless the pool already holds `limit` bytes.
    fn give(&mut self, buf: AlignedBuf, limit: usize) {
        let cap = buf.capacity();
        if self.bytes + cap > limit {
            return;
        }
        let k = Self::class_of(cap);
        if self.classes.len() <= k {
            self.classes.resize_with(k + 1, Vec::new);
        }
        self.bytes += cap;
        self.classes[k].push(buf);
    }

    fn absorb(&mut self, other: BufPool, limit: usize) {
        for b in other.classes.into_iter().flatten() {
            self.give(b, limit);
        }
    }
}

/// One I/O request of a gather: a piece of an extent of at most `max_request` bytes.
#[derive(Clone, Copy)]
struct Piece {
    extent: usize,
    /// Byte offset in the file (aligned).
    offset: u64,
    /// Aligned length in bytes.
    len: u64,
}

/// Gathers feature rows from a [`FeatureFile`] through the I/O engine (see the module docs).
///
/// `Send + Sync`: threads may gather concurrently from one reader; each call has its own
/// completion queue, and the engine's window bounds what all of them keep in flight.
pub struct FeatureReader {
    meta: FeatureFile,
    engine: Arc<Engine>,
    file: IoFile,
    /// File size in bytes: reads are clamped to it (the engine rejects reads past the end).
    file_len: u64,
    options: ReadOptions,
    /// Read buffers kept between gathers (a whole gather's worth is taken at once, so
    /// concurrent gathers do not contend on it per request).
    pool: Mutex<BufPool>,
}

impl FeatureReader {
    /// Opens the features at `path` on the process-wide engine ([`Engine::shared`]) with the
    /// default [`ReadOptions`].
    pub fn open(path: &Path) -> Result<FeatureReader> {
        Self::with_engine(path, Engine::shared(), ReadOptions::default())
    }

    /// Opens the features at `path` on `engine` with `options`.
    pub fn with_engine(
        path: &Path,
        engine: Arc<Engine>,
        options: ReadOptions,
    ) -> Result<FeatureReader> {
        if options.max_request < ALIGN as u64 {
            return Err(GraphError::Config(format!(
                "features max_request: {} bytes is below one {ALIGN}-byte block",
                options.max_request
            )));
        }
        let meta = FeatureFile::open(path)?;
        let file = engine.open(path, OpenMode::Read)?;
        let file_len = file.file().size()?;
        Ok(FeatureReader {
            meta,
            engine,
            file,
            file_len,
            options,
            pool: Mutex::new(BufPool::default()),
        })
    }

    /// The file's layout.
    pub fn meta(&self) -> &FeatureFile {
        &self.meta
    }

    /// The merge and request-size options in use.
    pub fn options(&self) -> ReadOptions {
        self.options
    }

    /// The engine the reads go through.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Whether reads bypass the page cache (`O_DIRECT`; false on file systems without it).
    pub fn is_direct(&self) -> bool {
        self.file.is_direct()
    }

    /// Plans the reads of `rows` (sorted, distinct) under this reader's options.
    pub fn plan(&self, rows: &[u64]) -> Vec<Extent> {
        plan_reads(
            rows,
            self.meta.row_bytes as u64,
            self.meta.data_offset,
            self.options.max_gap,
            self.options.max_request,
        )
    }

    /// Reads rows `rows` (any order, repeats allowed) into `out`, row `rows[i]`'s raw
    /// little-endian bytes at `out[i * row_bytes..(i + 1) * row_bytes]`:
    /// [`FeatureReader::submit_gather`] then [`Gather::complete`].
    ///
    /// `out.len()` must be `rows.len() * row_bytes` bytes, and every id below `num_rows`.
    /// Each distinct row is read once, whatever its repeats.
    pub fn gather(&self, rows: &[u32], out: &mut [u8]) -> Result<ReadStats> {
        // Checked before anything is read, so a wrong buffer costs no I/O.
        self.check_output(rows.len(), out.len())?;
        self.submit_gather(rows)?.complete(out)
    }

    /// Starts reading rows `rows` (any order, repeats allowed, every id below `num_rows`):
    /// plans the reads and puts up to the engine's depth of them in flight before returning
    /// (waiting only while the engine's window is full of other reads). The rest are submitted,
    /// and the rows copied out, by [`Gather::complete`].
    ///
    /// Memory while pending: the plan (8 bytes per row, 16 per distinct row, 24 per request
    /// and 32 per extent) and one read buffer per request in flight, at most
    /// `engine.depth()` buffers of at most `max_request` bytes rounded up to a power of two
    /// pages (default depth 256 x 128 KiB = 32 MiB; 4 KiB each for scattered rows).
    ///
    /// Errors, before any read: a row out of range, or more than 2^32 rows
    /// ([`GraphError::Config`], naming the file).
    pub fn submit_gather(&self, rows: &[u32]) -> Result<Gather<'_>> {
        self.check_rows(rows)?;
        if rows.len() > u32::MAX as usize + 1 {
            return Err(GraphError::Config(format!(
                "{}: a gather of {} rows; at most {} per call",
                self.meta.path.display(),
                rows.len(),
                u32::MAX as u64 + 1
            )));
        }
        let rb = self.meta.row_bytes;
        // Sort (row, output position) pairs packed in one u64: the distinct rows are the runs.
        let mut keys: Vec<u64> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| (r as u64) << 32 | i as u64)
            .collect();
        keys.sort_unstable();
        let mut distinct: Vec<u64> = Vec::new();
        // starts[u]..starts[u + 1]: the keys (output positions) of distinct row u.
        let mut starts: Vec<usize> = Vec::new();
        for (i, &k) in keys.iter().enumerate() {
            let r = k >> 32;
            if distinct.last() != Some(&r) {
                distinct.push(r);
                starts.push(i);
            }
        }
        starts.push(keys.len());
        let extents = self.plan(&distinct);
        let piece_max = align_down(self.options.max_request).max(ALIGN as u64);
        let mut pieces = Vec::with_capacity(extents.len());
        for (x, e) in extents.iter().enumerate() {
            let mut offset = e.offset;
            while offset < e.end() {
                let len = piece_max.min(e.end() - offset);
                pieces.push(Piece {
                    extent: x,
                    offset,
                    len,
                });
                offset += len;
            }
        }
        let stats = ReadStats {
            rows_requested: rows.len() as u64,
            rows_distinct: distinct.len() as u64,
            requests: pieces.len() as u64,
            bytes_read: pieces.iter().map(|p| p.len).sum(),
            bytes_useful: distinct.len() as u64 * rb as u64,
        };
        let mut gather = Gather {
            reader: self,
            queue: self.engine.queue(),
            window: self.engine.depth().min(pieces.len()).max(1),
            pieces,
            next: 0,
            scatter: Scatter {
                extents,
                distinct,
                keys,
                starts,
                row_bytes: rb,
                data_offset: self.meta.data_offset,
            },
            pool: std::mem::take(&mut *self.pool.lock().unwrap()),
            failed: None,
            stats,
        };
        gather.fill();
        Ok(gather)
    }

    /// Like [`FeatureReader::gather`], as f32 values: `out.len()` must be `rows.len() * dim`
    /// elements, row `rows[i]` at `out[i * dim..(i + 1) * dim]`. Float16 files are widened.
    pub fn gather_f32(&self, rows: &[u32], out: &mut [f32]) -> Result<ReadStats> {
        let dim = self.meta.dim;
        if Some(out.len()) != rows.len().checked_mul(dim) {
            return Err(GraphError::Config(format!(
                "{}: a gather of {} rows of {dim} features needs an output of {} f32 values, got {}",
                self.meta.path.display(),
                rows.len(),
                rows.len().saturating_mul(dim),
                out.len()
            )));
        }
        match self.meta.dtype {
            FeatureDType::F32 => {
                let stats = self.gather(rows, bytemuck::cast_slice_mut(out))?;
                if cfg!(target_endian = "big") {
                    for x in out.iter_mut() {
                        *x = f32::from_bits(u32::from_le(x.to_bits()));
                    }
                }
                Ok(stats)
            }
            FeatureDType::F16 => {
                let mut halves = vec![f16::ZERO; out.len()];
                let stats = self.gather(rows, bytemuck::cast_slice_mut(&mut halves))?;
                if cfg!(target_endian = "big") {
                    for h in halves.iter_mut() {
                        *h = f16::from_bits(u16::from_le(h.to_bits()));
                    }
                }
                halves.convert_to_f32_slice(out);
                Ok(stats)
            }
        }
    }

    fn check_rows(&self, rows: &[u32]) -> Result<()> {
        let n = self.meta.num_rows;
        match rows.iter().find(|&&r| r as u64 >= n) {
            Some(r) => Err(GraphError::Config(format!(
                "{}: row {r} is out of range: the features have {n} rows",
                self.meta.path.display()
            ))),
            None => Ok(()),
        }
    }

    /// Checks that an output of `out_len` bytes holds `rows` rows.
    fn check_output(&self, rows: usize, out_len: usize) -> Result<()> {
        let rb = self.meta.row_bytes;
        if Some(out_len) != rows.checked_mul(rb) {
            return Err(GraphError::Config(format!(
                "{}: a gather of {rows} rows of {rb} bytes needs an output of {} bytes, got {out_len}",
                self.meta.path.display(),
                rows.saturating_mul(rb),
            )));
        }
        Ok(())
    }
}

/// A gather in progress ([`FeatureReader::submit_gather`]): its requests are in flight on the
/// engine, on a completion queue of its own, and it owns the plan and the read buffers, so
/// several gathers (of one reader or several, on one thread or several) may be pending at
/// once, and complete in any order. [`Gather::complete`] copies the rows into the caller's
/// output. Dropping it unfinished abandons it: the requests in flight finish in
/// the engine, which then frees their buffers.
pub struct Gather<'a> {
    reader: &'a FeatureReader,
    queue: IoQueue,
    /// Requests in flight at most (the engine's depth, or fewer when there are fewer).
    window: usize,
    pieces: Vec<Piece>,
    /// Pieces submitted so far.
    next: usize,
    scatter: Scatter,
    /// Read buffers, given back to the reader when the gather ends.
    pool: BufPool,
    /// The first error; once set, nothing more is submitted and what is in flight drains.
    failed: Option<GraphError>,
    /// What the gather reads (its counts are known from the plan).
    stats: ReadStats,
}

impl Gather<'_> {
    /// Rows asked for (the output holds this many rows).
    pub fn rows(&self) -> usize {
        self.stats.rows_requested as usize
    }

    /// Finishes the gather into `out` (`rows() * row_bytes` bytes): waits for each request in
    /// flight, copies the rows (or the parts of rows) it holds to their positions, and puts
    /// the next requests in flight, until every request has finished. Returns what it read.
    ///
    /// Errors: a wrong `out` length ([`GraphError::Config`]), before anything is copied; a read
    /// error naming the file, returned once the requests in flight have finished (the rest
    /// are never submitted).
    pub fn complete(self, out: &mut [u8]) -> Result<ReadStats> {
        self.complete_with(out, || {})
    }

    /// [`Gather::complete`], calling `between` each time a request has finished: a caller that
    /// has the next gather to submit does it there, so that its requests are in flight while
    /// this one finishes (and while the caller then uses its rows).
    pub fn complete_with(mut self, out: &mut [u8], mut between: impl FnMut()) -> Result<ReadStats> {
        self.reader.check_output(self.rows(), out.len())?;
        while let Some(c) = self.queue.wait() {
            match c.result {
                Ok(n) if self.failed.is_none() => {
                    self.scatter
                        .copy(self.pieces[c.tag as usize], &c.buf.as_slice()[..n], out);
                }
                Ok(_) => {}
                Err(e) => {
                    self.failed.get_or_insert(e.into());
                }
            }
            if let Some(b) = c.buf.into_heap() {
                self.pool.give(b, usize::MAX);
            }
            self.fill();
            between();
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(self.stats),
        }
    }

    /// Submits pieces until the window is full (none once a request has failed).
    fn fill(&mut self) {
        let pending = self.queue.pending();
        if self.failed.is_some() || self.next == self.pieces.len() || pending >= self.window {
            return;
        }
        let file_len = self.reader.file_len;
        let mut batch = Vec::with_capacity(self.window - pending);
        while self.next < self.pieces.len() && pending + batch.len() < self.window {
            let p = self.pieces[self.next];
            let buf = self.pool.take(p.len as usize);
            // The last piece may reach past the end of the file into its last block: ask for
            // the bytes that exist; the engine reads the whole block.
            let len = p.len.min(file_len - p.offset) as usize;
            batch.push(Request::read(
                &self.reader.file,
                p.offset,
                len,
                buf,
                self.next as u64,
            ));
            self.next += 1;
        }
        self.queue.submit(batch);
    }
}

impl Drop for Gather<'_> {
    fn drop(&mut self) {
        let pool = std::mem::take(&mut self.pool);
        self.reader
            .pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .absorb(pool, POOL_RETAIN_BYTES);
    }
}

/// A pending gather as a pending read of the feature store: completing it returns the
/// aligned bytes read.
impl PendingRead for Gather<'_> {
    fn complete(self: Box<Self>, out: &mut [u8]) -> Result<u64> {
        Ok(Gather::complete(*self, out)?.bytes_read)
    }
}

/// The file as a feature store: [`FeatureReader::submit_gather`], counting the aligned bytes
/// read.
impl FeatureStore for FeatureReader {
    fn num_rows(&self) -> u64 {
        self.meta.num_rows
    }

    fn row_bytes(&self) -> usize {
        self.meta.row_bytes
    }

    fn submit(&self, rows: &[u32]) -> Result<Pending<'_>> {
        Ok(Box::new(self.submit_gather(rows)?))
    }

    /// Refused: the reader opens its file for reading only.
    fn update(&mut self, _rows: &[u32], _data: &[u8]) -> Result<()> {
        Err(GraphError::ReadOnly(self.meta.path.display().to_string()))
    }
}

/// Where a gather's rows go: the plan and the output positions of each distinct row.
struct Scatter {
    extents: Vec<Extent>,
    /// The distinct rows, sorted.
    distinct: Vec<u64>,
    /// `(row << 32) | output position`, sorted: distinct row `u`'s positions are the low halves
    /// of `keys[starts[u]..starts[u + 1]]`.
    keys: Vec<u64>,
    starts: Vec<usize>,
    row_bytes: usize,
    data_offset: u64,
}

impl Scatter {
    /// Copies the parts of its extent's rows that piece `p` holds (`data`, read at
    /// `p.offset`) to every output position of each row. A row split across pieces gets each
    /// part from the piece holding it.
    fn copy(&self, p: Piece, data: &[u8], out: &mut [u8]) {
        let rb = self.row_bytes;
        let e = &self.extents[p.extent];
        let (c0, c1) = (p.offset, p.offset + data.len() as u64);
        let rows = &self.distinct[e.first..e.first + e.count];
        let row_start = |r: u64| self.data_offset + r * rb as u64;
        // The first row ending after the piece's start (the extent's first row unless the
        // extent was cut into several pieces).
        let skip = rows.partition_point(|&r| row_start(r) + rb as u64 <= c0);
        for (j, &r) in rows.iter().enumerate().skip(skip) {
            let s = row_start(r);
            if s >= c1 {
                break;
            }
            let lo = s.max(c0);
            let hi = (s + rb as u64).min(c1);
            let src = &data[(lo - c0) as usize..(hi - c0) as usize];
            let within = (lo - s) as usize;
            let u = e.first + j;
            for &k in &self.keys[self.starts[u]..self.starts[u + 1]] {
                let at = (k & u32::MAX as u64) as usize * rb + within;
                out[at..at + src.len()].copy_from_slice(src);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::sync::OnceLock;
    use strata_store::rng::splitmix;

    const A: u64 = ALIGN as u64;

    fn row_range(r: u64, rb: u64, off: u64) -> (u64, u64) {
        (off + r * rb, off + (r + 1) * rb)
    }

    fn aligned_range(r: u64, rb: u64, off: u64) -> (u64, u64) {
        let (s, e) = row_range(r, rb, off);
        (align_down(s), align_up(e))
    }

    /// Checks every documented property of `plan_reads`'s result.
    fn check_plan(
        rows: &[u64],
        rb: u64,
        off: u64,
        max_gap: u64,
        max_req: u64,
        ext: &[Extent],
    ) -> std::result::Result<(), TestCaseError> {
        prop_assert_eq!(rows.is_empty(), ext.is_empty());
        let mut next_row = 0usize;
        for (x, e) in ext.iter().enumerate() {
            prop_assert_eq!(e.offset % A, 0, "unaligned offset {:?}", e);
            prop_assert!(e.len > 0 && e.len % A == 0, "bad length {:?}", e);
            prop_assert!(e.count >= 1);
            // The extents partition the rows, in order.
            prop_assert_eq!(e.first, next_row);
            next_row += e.count;
            if x > 0 {
                prop_assert!(ext[x - 1].end() <= e.offset, "overlap/unsorted at {}", x);
            }
            let inside = &rows[e.first..e.first + e.count];
            // Tight: from the first row's first page to the last row's last page.
            prop_assert_eq!(e.offset, aligned_range(inside[0], rb, off).0);
            prop_assert_eq!(e.end(), aligned_range(*inside.last().unwrap(), rb, off).1);
            for (j, w) in inside.windows(2).enumerate() {
                let (_, a_hi) = aligned_range(w[0], rb, off);
                let (b_lo, b_hi) = aligned_range(w[1], rb, off);
                if b_lo >= a_hi {
                    // Merged without sharing a page: near enough, and within the cap then.
                    prop_assert!(b_lo - a_hi <= max_gap, "gap merge too far at {}", j);
                    prop_assert!(b_hi - e.offset <= max_req, "merge past max_request");
                }
            }
            if e.len > max_req && e.count > 1 {
                // Only a chain of page-sharing rows may push an extent past the cap.
                let shares = inside
                    .windows(2)
                    .any(|w| aligned_range(w[1], rb, off).0 < aligned_range(w[0], rb, off).1);
                prop_assert!(shares, "extent {:?} over max_request without a reason", e);
            }
            if x > 0 {
                // Maximal: the previous extent could not take this one's first row.
                let prev = &ext[x - 1];
                let a = rows[prev.first + prev.count - 1];
                let (_, a_hi) = aligned_range(a, rb, off);
                let (b_lo, b_hi) = aligned_range(inside[0], rb, off);
                prop_assert!(b_lo >= a_hi, "split rows share a page");
                prop_assert!(
                    b_lo - a_hi > max_gap || b_hi - prev.offset > max_req,
                    "extents {} and {} should have merged",
                    x - 1,
                    x
                );
            }
        }
        prop_assert_eq!(next_row, rows.len());
        // Every row inside exactly one extent (by containment, not just by assignment).
        for (i, &r) in rows.iter().enumerate() {
            let (s, t) = row_range(r, rb, off);
            let holders: Vec<usize> = (0..ext.len())
                .filter(|&x| ext[x].offset <= s && t <= ext[x].end())
                .collect();
            prop_assert_eq!(holders.len(), 1, "row {} in extents {:?}", r, holders);
            let e = &ext[holders[0]];
            prop_assert!(e.first <= i && i < e.first + e.count);
        }
        Ok(())
    }

    fn row_bytes_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![
            1u64..64,
            64u64..9000,
            Just(4),
            Just(512),
            Just(2048),
            Just(3072),
            Just(4096),
            Just(4100),
            Just(12288),
        ]
    }

    fn offset_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0u64), Just(128), Just(4096), 0u64..20_000]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn plan_properties(
            rows in proptest::collection::btree_set(0u64..3000, 0..200),
            dense in proptest::collection::btree_set(0u64..3000, 0..2),
            rb in row_bytes_strategy(),
            off in offset_strategy(),
            max_gap in prop_oneof![Just(0u64), Just(4096), 0u64..40_000],
            max_req in prop_oneof![Just(4096u64), Just(131072), 4096u64..300_000],
        ) {
            // Add runs of adjacent rows, where page sharing and chains happen.
            let mut set: BTreeSet<u64> = rows;
            for d in dense {
                set.extend(d..d + 40);
            }
            let rows: Vec<u64> = set.into_iter().collect();
            let ext = plan_reads(&rows, rb, off, max_gap, max_req);
            check_plan(&rows, rb, off, max_gap, max_req, &ext)?;
        }

        #[test]
        fn aligned_pages_one_extent_each(
            rows in proptest::collection::btree_set(0u64..5000, 0..300),
        ) {
            let rows: Vec<u64> = rows.into_iter().collect();
            let ext = plan_reads(&rows, A, A, 0, A);
            prop_assert_eq!(ext.len(), rows.len());
            for (i, e) in ext.iter().enumerate() {
                prop_assert_eq!(*e, Extent { offset: A + rows[i] * A, len: A, first: i, count: 1 });
            }
        }

        #[test]
        fn rows_in_one_page_share_an_extent(
            rows in proptest::collection::btree_set(0u64..20_000, 0..300),
            shift in 0u32..12,
        ) {
            // Rows of 2^shift bytes dividing a page, data page-aligned: never straddle.
            let rb = 1u64 << shift;
            let rows: Vec<u64> = rows.into_iter().collect();
            let ext = plan_reads(&rows, rb, A, 0, A);
            let pages: BTreeSet<u64> = rows.iter().map(|&r| (A + r * rb) / A).collect();
            prop_assert_eq!(ext.len(), pages.len());
            for (e, p) in ext.iter().zip(&pages) {
                prop_assert_eq!((e.offset, e.len), (p * A, A));
            }
            check_plan(&rows, rb, A, 0, A, &ext)?;
        }
    }

    #[test]
    fn plan_examples() {
        // Unaligned 2 KiB rows (NumPy's 128-byte header) straddle pages: row 1 is
        // [2176, 4224), pages 0 and 1, shared with rows 0 and 2.
        let ext = plan_reads(&[0, 1, 2], 2048, 128, 0, A);
        assert_eq!(
            ext,
            vec![Extent {
                offset: 0,
                len: 2 * A,
                first: 0,
                count: 3
            }]
        );
        // Row 1 alone needs two pages, over a one-page max_request: still one extent.
        let ext = plan_reads(&[1], 2048, 128, 0, A);
        assert_eq!((ext[0].offset, ext[0].len), (0, 2 * A));
        // A page apart: merged with max_gap = 4096, not with 0.
        assert_eq!(plan_reads(&[0, 2], A, 0, A, 1 << 20).len(), 1);
        assert_eq!(plan_reads(&[0, 2], A, 0, 0, 1 << 20).len(), 2);
        // Touching pages merge when max_request allows.
        assert_eq!(plan_reads(&[0, 1], A, 0, 0, 2 * A).len(), 1);
        assert_eq!(plan_reads(&[0, 1], A, 0, 0, A).len(), 2);
        // 3 KiB rows from a 128-byte header: every row boundary falls inside a page, so the
        // run cannot be cut without splitting a shared page: one extent over max_request.
        let rows: Vec<u64> = (0..100).collect();
        let ext = plan_reads(&rows, 3072, 128, 0, A);
        assert_eq!(ext.len(), 1);
        assert_eq!(ext[0].len, 76 * A);
        // From a page-aligned start, every fourth boundary is a page boundary: 12 KiB extents.
        let ext = plan_reads(&rows, 3072, 0, 0, A);
        assert_eq!(ext.len(), 25);
        assert!(ext.iter().all(|e| e.len == 3 * A && e.count == 4));
        assert!(plan_reads(&[], 8, 0, 0, A).is_empty());
    }

    #[test]
    #[should_panic(expected = "sorted and distinct")]
    fn plan_rejects_unsorted_rows() {
        plan_reads(&[3, 1], 8, 0, 0, A);
    }

    // ---- gathers on real files ----

    fn engines() -> &'static [Arc<Engine>] {
        static ENGINES: OnceLock<Vec<Arc<Engine>>> = OnceLock::new();
        // A small window, so gathers wait for room and reuse buffers.
        ENGINES.get_or_init(|| strata_io::testing::engines(8, 4))
    }

    /// A NumPy v1 header whose data starts at `data_offset` (e.g. 128, as NumPy writes small
    /// arrays).
    fn npy_header(descr: &str, shape: &str, fortran: bool, data_offset: usize) -> Vec<u8> {
        let fortran = if fortran { "True" } else { "False" };
        let dict =
            format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
        assert!(dict.len() + 11 <= data_offset);
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&((data_offset - 10) as u16).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.resize(data_offset - 1, b' ');
        out.push(b'\n');
        out
    }

    /// Writes a `(rows, dim)` feature file of `dtype` with data at 4096 (Strata's header) or
    /// 128 (NumPy's), plus `tail` junk bytes after the data; returns its path.
    fn write_features(
        dir: &Path,
        dtype: FeatureDType,
        rows: u64,
        dim: usize,
        strata_header: bool,
        tail: usize,
        seed: u64,
    ) -> PathBuf {
        let path = dir.join(format!("f-{seed}.npy"));
        let mut bytes = if strata_header {
            npy::header_block(dtype.dtype(), &[rows, dim as u64])
        } else {
            npy_header(
                dtype.dtype().descr(),
                &format!("({rows}, {dim})"),
                false,
                128,
            )
        };
        let mut s = seed;
        for _ in 0..rows as usize * dim {
            // Finite values with varied bits (any f16 bit pattern below 0x7c00 is finite).
            let v = (splitmix(&mut s) % 20_000) as f32 / 7.0 - 1000.0;
            match dtype {
                FeatureDType::F32 => bytes.extend_from_slice(&v.to_le_bytes()),
                FeatureDType::F16 => {
                    bytes.extend_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
        }
        bytes.extend(std::iter::repeat_n(0xAB, tail));
        std::fs::write(&path, &bytes).unwrap();
        path
    }

    /// The rows' bytes, read plainly with std::fs.
    fn expected(meta: &FeatureFile, rows: &[u32]) -> Vec<u8> {
        let all = std::fs::read(&meta.path).unwrap();
        let rb = meta.row_bytes;
        let mut out = Vec::with_capacity(rows.len() * rb);
        for &r in rows {
            let s = meta.row_offset(r as u64) as usize;
            out.extend_from_slice(&all[s..s + rb]);
        }
        out
    }

    fn widen(meta: &FeatureFile, bytes: &[u8]) -> Vec<f32> {
        match meta.dtype {
            FeatureDType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            FeatureDType::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }

    fn check_gather(
        reader: &FeatureReader,
        rows: &[u32],
    ) -> std::result::Result<(), TestCaseError> {
        let meta = reader.meta();
        let want = expected(meta, rows);
        let mut got = vec![0u8; rows.len() * meta.row_bytes];
        let stats = reader.gather(rows, &mut got).unwrap();
        prop_assert!(got == want, "bytes differ");
        let distinct: BTreeSet<u32> = rows.iter().copied().collect();
        prop_assert_eq!(stats.rows_requested, rows.len() as u64);
        prop_assert_eq!(stats.rows_distinct, distinct.len() as u64);
        prop_assert_eq!(
            stats.bytes_useful,
            distinct.len() as u64 * meta.row_bytes as u64
        );
        prop_assert!(stats.bytes_read >= stats.bytes_useful);
        prop_assert_eq!(stats.bytes_read % A, 0);
        prop_assert_eq!(rows.is_empty(), stats.requests == 0);
        let mut f = vec![f32::NAN; rows.len() * meta.dim];
        let stats_f = reader.gather_f32(rows, &mut f).unwrap();
        prop_assert_eq!(stats_f, stats);
        let want_f = widen(meta, &want);
        prop_assert!(
            f.iter()
                .map(|x| x.to_bits())
                .eq(want_f.iter().map(|x| x.to_bits())),
            "f32 values differ"
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        #[test]
        fn gather_matches_plain_reads(
            f16_file in any::<bool>(),
            // Row widths from 4 B to past a page: 4 B, 2 KiB (straddling with the 128-byte
            // header), 3 KiB (chains), 4 KiB, 4 KiB + 24 B, and odd sizes.
            row_bytes in prop_oneof![Just(4usize), Just(8), Just(2048), Just(3072), Just(4096), Just(4120), Just(8192), (1usize..700).prop_map(|k| 4 * k)],
            strata_header in any::<bool>(),
            num_rows in 1u64..400,
            tail in prop_oneof![Just(0usize), 1usize..5000],
            picks in proptest::collection::vec(any::<u32>(), 0..250),
            run in any::<bool>(),
            max_gap in prop_oneof![Just(0u64), Just(4096), Just(65536)],
            max_request in prop_oneof![Just(4096u64), Just(12288), Just(131072)],
            seed in any::<u64>(),
        ) {
            let dtype = if f16_file { FeatureDType::F16 } else { FeatureDType::F32 };
            let dim = row_bytes / dtype.size();
            let dir = tempfile::tempdir().unwrap();
            let path = write_features(dir.path(), dtype, num_rows, dim, strata_header, tail, seed);
            let mut rows: Vec<u32> = picks.iter().map(|&p| p % num_rows as u32).collect();
            if run {
                // A dense run of neighbours plus repeats of it.
                let start = (seed % num_rows) as u32;
                rows.extend((start..(start + 60).min(num_rows as u32)).rev());
                rows.extend(start..(start + 5).min(num_rows as u32));
            }
            let options = ReadOptions { max_gap, max_request };
            for engine in engines() {
                let reader = FeatureReader::with_engine(&path, engine.clone(), options).unwrap();
                prop_assert_eq!(reader.meta().row_bytes, row_bytes);
                prop_assert_eq!(reader.meta().data_offset, if strata_header { 4096 } else { 128 });
                check_gather(&reader, &rows)?;
                // Again, with the buffers kept from the first call.
                check_gather(&reader, &rows)?;
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(30))]

        /// Submissions and completions in any interleaving and completion order, through the
        /// reader and through the interface, return the bytes (and statistics) of `gather`.
        #[test]
        fn interleaved_submits_match_gathers(
            sets in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 0..300), 1..6),
            ops in proptest::collection::vec((any::<bool>(), any::<usize>()), 0..16),
            max_request in prop_oneof![Just(4096u64), Just(131072)],
            seed in any::<u64>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let num_rows = 700u64;
            let path = write_features(dir.path(), FeatureDType::F16, num_rows, 900, false, 0, seed);
            let sets: Vec<Vec<u32>> = sets
                .iter()
                .map(|s| s.iter().map(|&r| r % num_rows as u32).collect())
                .collect();
            let options = ReadOptions { max_gap: 4096, max_request };
            for engine in engines() {
                let reader = FeatureReader::with_engine(&path, engine.clone(), options).unwrap();
                let rb = reader.meta().row_bytes;
                let check = |g: usize, pending: Pending<'_>| -> std::result::Result<(), TestCaseError> {
                    let mut out = vec![0u8; sets[g].len() * rb];
                    let bytes_read = pending.complete(&mut out).unwrap();
                    prop_assert!(out == expected(reader.meta(), &sets[g]), "gather {} differs", g);
                    let mut again = vec![0u8; out.len()];
                    prop_assert_eq!(reader.gather(&sets[g], &mut again).unwrap().bytes_read, bytes_read);
                    Ok(())
                };
                let mut pending: Vec<(usize, Pending<'_>)> = Vec::new();
                let mut next = 0;
                // Then every remaining submission, then the rest completed in the order picked.
                let tail = (0..sets.len()).map(|_| (true, 0)).chain(ops.iter().map(|&(_, p)| (false, p)));
                for (submit, pick) in ops.iter().copied().chain(tail) {
                    if submit && next < sets.len() {
                        // Alternately the reader's gather and the interface's submission.
                        let p: Pending<'_> = if next % 2 == 0 {
                            Box::new(reader.submit_gather(&sets[next]).unwrap())
                        } else {
                            FeatureStore::submit(&reader, &sets[next]).unwrap()
                        };
                        pending.push((next, p));
                        next += 1;
                    } else if !pending.is_empty() {
                        let (g, p) = pending.swap_remove(pick % pending.len());
                        check(g, p)?;
                    }
                }
                for (g, p) in pending.drain(..) {
                    check(g, p)?;
                }
                prop_assert_eq!(next, sets.len());
            }
        }
    }

    #[test]
    fn gathers_direct_from_the_shared_engine() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), FeatureDType::F32, 1000, 100, true, 0, 7);
        let reader = FeatureReader::open(&path).unwrap();
        // ext4 and xfs take O_DIRECT; tmpfs does not (then reads are buffered, still correct).
        if !reader.is_direct() {
            eprintln!(
                "note: {} is not on an O_DIRECT file system",
                dir.path().display()
            );
        }
        let rows: Vec<u32> = (0..1000).rev().step_by(3).chain([5, 5, 5]).collect();
        check_gather(&reader, &rows).unwrap();
    }

    #[test]
    fn the_reader_is_a_feature_store() {
        let dir = tempfile::tempdir().unwrap();
        // 7 junk bytes after the data: not a row.
        let path = write_features(dir.path(), FeatureDType::F16, 500, 10, false, 7, 11);
        let reader = FeatureReader::open(&path).unwrap();
        let store: &dyn FeatureStore = &reader;
        assert_eq!((store.num_rows(), store.row_bytes()), (500, 20));
        let rows = [499, 0, 250, 0];
        let mut out = vec![0u8; rows.len() * 20];
        let bytes_read = store.read(&rows, &mut out).unwrap();
        assert_eq!(out, expected(reader.meta(), &rows));
        let mut again = vec![0u8; out.len()];
        assert_eq!(
            reader.gather(&rows, &mut again).unwrap().bytes_read,
            bytes_read
        );
        let e = store.read(&[500], &mut [0; 20]).unwrap_err().to_string();
        assert!(e.contains("row 500 is out of range"), "{e}");
    }

    /// Rows of gather `g` of a test: a dense run and scattered rows, so that each gather
    /// needs more requests than the test engines' depth.
    fn rows_of(g: u64, num_rows: u64) -> Vec<u32> {
        let mut s = g;
        (0..200)
            .map(|_| (splitmix(&mut s) % num_rows) as u32)
            .chain((g as u32 * 50..g as u32 * 50 + 40).rev())
            .collect()
    }

    #[test]
    fn several_gathers_in_flight_complete_in_any_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), FeatureDType::F32, 2000, 300, true, 0, 5);
        for engine in engines() {
            let reader =
                FeatureReader::with_engine(&path, engine.clone(), ReadOptions::default()).unwrap();
            let sets: Vec<Vec<u32>> = (0..4).map(|g| rows_of(g, 2000)).collect();
            let mut pending: Vec<Option<Gather<'_>>> = sets
                .iter()
                .map(|rows| Some(reader.submit_gather(rows).unwrap()))
                .collect();
            assert!(sets[0].len() > engine.depth() && pending[0].as_ref().unwrap().rows() == 240);
            for g in [2, 0, 3, 1] {
                let gather = pending[g].take().unwrap();
                let mut out = vec![0u8; sets[g].len() * 1200];
                let stats = gather.complete(&mut out).unwrap();
                assert_eq!(out, expected(reader.meta(), &sets[g]), "gather {g}");
                let mut again = vec![0u8; out.len()];
                assert_eq!(reader.gather(&sets[g], &mut again).unwrap(), stats);
            }
            // Through the interface, and a gather dropped before completing.
            let store: &dyn FeatureStore = &reader;
            let first = store.submit(&sets[1]).unwrap();
            drop(reader.submit_gather(&sets[2]).unwrap());
            let mut out = vec![0u8; sets[1].len() * 1200];
            assert!(first.complete(&mut out).unwrap() > 0);
            assert_eq!(out, expected(reader.meta(), &sets[1]));
        }
    }

    #[test]
    fn submit_refuses_rows_out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), FeatureDType::F16, 50, 4, false, 0, 2);
        let reader = FeatureReader::open(&path).unwrap();
        let e = reader.submit_gather(&[3, 50, 1]).err().unwrap();
        assert!(matches!(&e, GraphError::Config(_)), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("row 50 is out of range") && text.contains("f-2.npy"),
            "{text}"
        );
        let store: &dyn FeatureStore = &reader;
        let e = store.submit(&[u32::MAX]).err().unwrap();
        assert!(matches!(&e, GraphError::Config(_)), "{e:?}");
        // A wrong output is refused at completion, before anything is copied.
        let mut out = vec![0xEE; 7];
        let e = err_text(reader.submit_gather(&[1]).unwrap().complete(&mut out));
        assert!(e.contains("needs an output of 8 bytes, got 7"), "{e}");
        assert_eq!(out, [0xEE; 7]);
    }

    #[test]
    fn a_read_error_surfaces_at_complete_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for engine in engines() {
            let path = write_features(dir.path(), FeatureDType::F32, 3000, 64, true, 0, 9);
            let reader =
                FeatureReader::with_engine(&path, engine.clone(), ReadOptions::default()).unwrap();
            // The file loses its rows after the reader was opened: the rows are valid for
            // the reader, their reads come back empty.
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(A)
                .unwrap();
            let rows = rows_of(1, 3000);
            let gather = reader.submit_gather(&rows).unwrap();
            let mut out = vec![0u8; rows.len() * 256];
            let e = gather.complete(&mut out).err().unwrap();
            assert!(matches!(&e, GraphError::Store(_)), "{e:?}");
            assert!(e.to_string().contains("f-9.npy"), "{e}");
            // The synchronous path is the same one: it fails alike.
            let e = err_text(reader.gather(&rows[..1], &mut out[..256]));
            assert!(e.contains("f-9.npy"), "{e}");
        }
    }

    #[test]
    fn oversized_extents_are_read_in_pieces() {
        // 3 KiB rows chain through shared pages; a one-page max_request splits each extent
        // into one-page requests and rows are copied piecewise across them.
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), FeatureDType::F32, 300, 768, false, 0, 3);
        let opts = ReadOptions {
            max_gap: 0,
            max_request: A,
        };
        for engine in engines() {
            let reader = FeatureReader::with_engine(&path, engine.clone(), opts).unwrap();
            let rows: Vec<u32> = (0..300).chain(0..10).collect();
            let mut out = vec![0u8; rows.len() * 3072];
            let stats = reader.gather(&rows, &mut out).unwrap();
            assert_eq!(out, expected(reader.meta(), &rows));
            assert_eq!(reader.plan(&(0..300).collect::<Vec<_>>()).len(), 1);
            // 128 + 300 * 3072 bytes end in block 226: one request per block.
            assert_eq!(stats.requests, 226);
            assert_eq!(stats.bytes_read, 226 * A);
            assert_eq!(stats.rows_distinct, 300);
            // A single 12 KiB row over a 4 KiB max_request: three requests.
            let path = write_features(dir.path(), FeatureDType::F16, 5, 6144, true, 0, 4);
            let reader = FeatureReader::with_engine(&path, engine.clone(), opts).unwrap();
            let mut out = vec![0u8; 2 * 12288];
            let stats = reader.gather(&[3, 1], &mut out).unwrap();
            assert_eq!(out, expected(reader.meta(), &[3, 1]));
            assert_eq!(stats.requests, 6);
        }
    }

    #[test]
    fn concurrent_gathers() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), FeatureDType::F16, 5000, 100, true, 0, 11);
        for engine in engines() {
            let reader = Arc::new(
                FeatureReader::with_engine(&path, engine.clone(), ReadOptions::default()).unwrap(),
            );
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let reader = reader.clone();
                    std::thread::spawn(move || {
                        let mut s = t;
                        for _ in 0..10 {
                            let rows: Vec<u32> =
                                (0..500).map(|_| (splitmix(&mut s) % 5000) as u32).collect();
                            check_gather(&reader, &rows).unwrap();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
    }

    #[test]
    fn reader_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<FeatureReader>();
        check::<FeatureFile>();
    }

    fn err_text<T>(r: Result<T>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn update_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), FeatureDType::F32, 10, 3, false, 0, 1);
        let mut reader = FeatureReader::open(&path).unwrap();
        let e = reader.update(&[1], &[0; 12]).unwrap_err();
        assert!(matches!(&e, GraphError::ReadOnly(p) if p == &path.display().to_string()));
        assert!(e.to_string().contains("read-only"), "{e}");
    }

    #[test]
    fn gather_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), FeatureDType::F32, 10, 3, false, 0, 1);
        let reader = FeatureReader::open(&path).unwrap();
        let mut out = vec![0u8; 2 * 12];
        let e = err_text(reader.gather(&[1, 10], &mut out));
        assert!(
            e.contains("row 10 is out of range") && e.contains("10 rows"),
            "{e}"
        );
        assert!(e.contains("f-1.npy"), "{e}");
        let e = err_text(reader.gather(&[1, 2, 3], &mut out));
        assert!(e.contains("needs an output of 36 bytes, got 24"), "{e}");
        let mut f = vec![0f32; 5];
        let e = err_text(reader.gather_f32(&[1, 2], &mut f));
        assert!(e.contains("needs an output of 6 f32 values, got 5"), "{e}");
        let e = err_text(reader.gather_f32(&[u32::MAX, 1], &mut [0f32; 6]));
        assert!(
            e.contains(&format!("row {} is out of range", u32::MAX)),
            "{e}"
        );
        // An empty gather reads nothing.
        let stats = reader.gather(&[], &mut []).unwrap();
        assert_eq!(stats, ReadStats::default());
        let e = err_text(FeatureReader::with_engine(
            &path,
            Engine::shared(),
            ReadOptions {
                max_gap: 0,
                max_request: 100,
            },
        ));
        assert!(e.contains("max_request"), "{e}");
    }

    #[test]
    fn rejects_files_that_are_not_features() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, header: Vec<u8>, data: usize| {
            let path = dir.path().join(name);
            let mut bytes = header;
            bytes.resize(bytes.len() + data, 0);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let cases = [
            (
                write("ints.npy", npy_header("<i8", "(4, 2)", false, 128), 64),
                "expected float32 or float16 features, found int64",
            ),
            (
                write("doubles.npy", npy_header("<f8", "(4, 2)", false, 128), 64),
                "found float64",
            ),
            (
                write("flat.npy", npy_header("<f4", "(8,)", false, 128), 32),
                "expected a 2-D array of shape (num_nodes, dim), found shape [8]",
            ),
            (
                write("cube.npy", npy_header("<f4", "(2, 2, 2)", false, 128), 32),
                "found shape [2, 2, 2]",
            ),
            (
                write("fortran.npy", npy_header("<f4", "(4, 2)", true, 128), 32),
                "Fortran order",
            ),
            (
                write("empty_dim.npy", npy_header("<f2", "(4, 0)", false, 128), 0),
                "dimension 0",
            ),
            (
                write("short.npy", npy_header("<f2", "(4, 3)", false, 128), 23),
                "truncated",
            ),
        ];
        for (path, want) in cases {
            let e = err_text(FeatureFile::open(&path));
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(e.contains(want), "{name}: {e}");
            assert!(e.contains(&name), "{e}");
        }
        let ok = write("ok.npy", npy_header("<f2", "(4, 3)", false, 128), 24);
        let meta = FeatureFile::open(&ok).unwrap();
        assert_eq!(
            meta,
            FeatureFile {
                path: ok.clone(),
                dtype: FeatureDType::F16,
                num_rows: 4,
                dim: 3,
                row_bytes: 6,
                data_offset: 128,
            }
        );
        assert_eq!(meta.data_bytes(), 24);
    }
}
