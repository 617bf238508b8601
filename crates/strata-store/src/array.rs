//! Streaming writers and readers of `.npy` arrays, through the direct-I/O layer.

use std::path::{Path, PathBuf};

use strata_io::{AlignedBuf, DirectFile, Engine, IoFile, OpenMode, Request, SeqReader, SeqWriter};

use crate::error::{Result, StoreError};
use crate::manifest::ArrayInfo;
use crate::npy::{self, DType, NpyHeader, DATA_OFFSET};

/// Default size of the aligned staging buffer of a writer or reader, in bytes.
pub const IO_CHUNK: usize = 4 << 20;

/// Appends rows to a new `.npy` file whose data starts at [`DATA_OFFSET`]; the header, with
/// the final row count, is written by [`NpyWriter::finish`].
pub struct NpyWriter {
    w: SeqWriter,
    dtype: DType,
    row_shape: Vec<u64>,
    row_bytes: u64,
    path: PathBuf,
    scratch: Vec<u8>,
}

impl NpyWriter {
    /// Creates `path` for an array of `dtype` whose rows have shape `row_shape` (empty for a
    /// 1-D array), staging writes in a buffer of `buf_bytes`.
    pub fn create(path: &Path, dtype: DType, row_shape: &[u64], buf_bytes: usize) -> Result<Self> {
        let row_bytes = row_shape.iter().product::<u64>() * dtype.size() as u64;
        Ok(NpyWriter {
            w: SeqWriter::create(path, DATA_OFFSET, buf_bytes)?,
            dtype,
            row_shape: row_shape.to_vec(),
            row_bytes,
            path: path.to_path_buf(),
            scratch: Vec::new(),
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Data bytes written so far.
    pub fn data_bytes(&self) -> u64 {
        self.w.position() - DATA_OFFSET
    }

    /// Appends raw little-endian element bytes (whole rows by the time of `finish`).
    pub fn write_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        Ok(self.w.write_all(bytes)?)
    }

    /// Appends elements whose in-memory type matches the array's dtype.
    pub fn write<T: bytemuck::Pod>(&mut self, vals: &[T]) -> Result<()> {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        self.write_bytes(bytemuck::cast_slice(vals))
    }

    /// Appends integer values, narrowing them to the array's integer dtype. The caller
    /// guarantees they fit (ids are checked against the id width before they get here).
    pub fn write_ints(&mut self, vals: &[i64]) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        encode_ints(vals, self.dtype, &mut scratch);
        let r = self.write_bytes(&scratch);
        self.scratch = scratch;
        r
    }

    /// Writes the header and syncs; returns the array's manifest entry.
    pub fn finish(mut self) -> Result<ArrayInfo> {
        let data = self.data_bytes();
        if self.row_bytes > 0 && !data.is_multiple_of(self.row_bytes) {
            return Err(StoreError::bad_file(
                &self.path,
                format!(
                    "internal: {data} bytes is not a whole number of {}-byte rows",
                    self.row_bytes
                ),
            ));
        }
        let rows = data.checked_div(self.row_bytes).unwrap_or(0);
        let mut shape = vec![rows];
        shape.extend_from_slice(&self.row_shape);
        let mut block = strata_io::AlignedBuf::new(DATA_OFFSET as usize);
        block.fill_from(&npy::header_block(self.dtype, &shape));
        self.w.write_block_at(0, block)?;
        self.w.finish()?;
        Ok(ArrayInfo {
            file: self
                .path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            dtype: self.dtype,
            shape,
        })
    }
}

/// Appends `vals` to `out` as little-endian elements of integer type `dtype`.
pub fn encode_ints(vals: &[i64], dtype: DType, out: &mut Vec<u8>) {
    out.reserve(vals.len() * dtype.size());
    // Little-endian targets only (x86-64, aarch64): the in-memory bytes are the file bytes.
    match dtype {
        DType::I32 => {
            let start = out.len();
            out.resize(start + vals.len() * 4, 0);
            for (dst, &v) in out[start..].chunks_exact_mut(4).zip(vals) {
                dst.copy_from_slice(&(v as i32).to_le_bytes());
            }
        }
        DType::I64 => out.extend_from_slice(bytemuck::cast_slice(vals)),
        DType::U8 => out.extend(vals.iter().map(|&v| v as u8)),
        DType::U16 => out.extend(vals.iter().flat_map(|&v| (v as u16).to_le_bytes())),
        DType::U32 => out.extend(vals.iter().flat_map(|&v| (v as u32).to_le_bytes())),
        DType::U64 => out.extend(vals.iter().flat_map(|&v| (v as u64).to_le_bytes())),
        DType::I16 => out.extend(vals.iter().flat_map(|&v| (v as i16).to_le_bytes())),
        other => panic!("encode_ints: {other} is not an integer dtype Strata writes"),
    }
}

/// Decodes little-endian integers of `dtype` from `bytes`, appending them to `out` as `i64`.
/// `uint64` values above `i64::MAX` become negative and are rejected by the callers' range checks.
pub fn decode_ints(bytes: &[u8], dtype: DType, out: &mut Vec<i64>) {
    macro_rules! dec {
        ($t:ty) => {
            out.extend(
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()) as i64),
            )
        };
    }
    match dtype {
        DType::Bool | DType::U8 => out.extend(bytes.iter().map(|&b| b as i64)),
        DType::I8 => out.extend(bytes.iter().map(|&b| b as i8 as i64)),
        DType::I16 => dec!(i16),
        DType::U16 => dec!(u16),
        DType::I32 => dec!(i32),
        DType::U32 => dec!(u32),
        DType::I64 => dec!(i64),
        DType::U64 => dec!(u64),
        DType::F16 | DType::F32 | DType::F64 => panic!("decode_ints on a float array"),
    }
}

/// Decodes little-endian floats (or integers) of `dtype` from `bytes`, appending them as `f32`.
pub fn decode_f32(bytes: &[u8], dtype: DType, out: &mut Vec<f32>) {
    macro_rules! dec {
        ($t:ty) => {
            out.extend(
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()) as f32),
            )
        };
    }
    match dtype {
        DType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        DType::F32 => dec!(f32),
        DType::F64 => dec!(f64),
        DType::Bool | DType::U8 => out.extend(bytes.iter().map(|&b| b as f32)),
        DType::I8 => out.extend(bytes.iter().map(|&b| b as i8 as f32)),
        DType::I16 => dec!(i16),
        DType::U16 => dec!(u16),
        DType::I32 => dec!(i32),
        DType::U32 => dec!(u32),
        DType::I64 => dec!(i64),
        DType::U64 => dec!(u64),
    }
}

/// Streams the rows of a C-ordered `.npy` file (or any file of fixed-size records) in batches
/// of whole rows. Batches are slices of the aligned read buffer when rows do not straddle
/// chunks, so most batches cost no copy.
pub struct RowReader {
    reader: SeqReader,
    row_bytes: usize,
    carry: Vec<u8>,
    batch: Vec<u8>,
    path: PathBuf,
}

impl RowReader {
    /// Opens `path` (whose parsed header is `header`) and reads its rows in batches of about
    /// `batch_bytes`.
    pub fn open(path: &Path, header: &NpyHeader, batch_bytes: usize) -> Result<Self> {
        let row_elems: u64 = header.shape.iter().skip(1).product();
        let row_bytes = row_elems as usize * header.dtype.size();
        let end = header.data_offset + header.data_bytes();
        let file = Engine::shared().open(path, OpenMode::Read)?;
        let file_len = file.file().size()?;
        if file_len < end {
            return Err(StoreError::bad_file(
                path,
                format!(
                    "truncated: the header declares shape {:?} ({} data bytes) but the file holds {}",
                    header.shape,
                    header.data_bytes(),
                    file_len.saturating_sub(header.data_offset)
                ),
            ));
        }
        Ok(Self::records(
            file,
            header.data_offset,
            end,
            row_bytes,
            batch_bytes,
        ))
    }

    /// Reads `[start, end)` of `file` as records of `row_bytes` each, through the shared
    /// engine with one batch read ahead (memory: two batches).
    pub fn records(
        file: IoFile,
        start: u64,
        end: u64,
        row_bytes: usize,
        batch_bytes: usize,
    ) -> Self {
        let row_bytes = row_bytes.max(1);
        let chunk = batch_bytes
            .max(row_bytes)
            .next_multiple_of(strata_io::ALIGN);
        let path = file.path().to_path_buf();
        RowReader {
            reader: SeqReader::new(&Engine::shared(), file, start, end, chunk),
            row_bytes,
            carry: Vec::new(),
            batch: Vec::new(),
            path,
        }
    }

    /// Opens an array of a store by its manifest entry.
    pub fn open_array(dir: &Path, info: &ArrayInfo, batch_bytes: usize) -> Result<Self> {
        let path = dir.join(&info.file);
        let header = npy::read_header(&path)?;
        Self::open(&path, &header, batch_bytes)
    }

    /// The next batch of whole rows, or `None` at the end.
    pub fn next_batch(&mut self) -> Result<Option<&[u8]>> {
        let row = self.row_bytes;
        loop {
            let Some(chunk) = self.reader.next_chunk()? else {
                if !self.carry.is_empty() {
                    return Err(StoreError::bad_file(
                        &self.path,
                        "data ends in the middle of a row",
                    ));
                }
                return Ok(None);
            };
            if self.carry.is_empty() && chunk.len().is_multiple_of(row) {
                // Re-borrow to return the chunk itself (the common case: no copy).
                return Ok(self.reader.current());
            }
            self.batch.clear();
            self.batch.append(&mut self.carry);
            self.batch.extend_from_slice(chunk);
            let whole = self.batch.len() / row * row;
            self.carry.extend_from_slice(&self.batch[whole..]);
            self.batch.truncate(whole);
            if !self.batch.is_empty() {
                return Ok(Some(&self.batch));
            }
        }
    }
}

/// Serves the integers of an array in any amounts, in order (for reading several arrays, or
/// columns, in lockstep).
pub struct IntCursor {
    reader: RowReader,
    dtype: DType,
    values: Vec<i64>,
    pos: usize,
}

impl IntCursor {
    pub fn new(reader: RowReader, dtype: DType) -> Self {
        IntCursor {
            reader,
            dtype,
            values: Vec::new(),
            pos: 0,
        }
    }

    /// Replaces `out` with the next `n` values (fewer only at the end of the array).
    pub fn take(&mut self, n: usize, out: &mut Vec<i64>) -> Result<()> {
        out.clear();
        while out.len() < n {
            if self.pos == self.values.len() {
                self.values.clear();
                self.pos = 0;
                match self.reader.next_batch()? {
                    Some(b) => decode_ints(b, self.dtype, &mut self.values),
                    None => return Ok(()),
                }
            }
            let k = (n - out.len()).min(self.values.len() - self.pos);
            out.extend_from_slice(&self.values[self.pos..self.pos + k]);
            self.pos += k;
        }
        Ok(())
    }
}

/// Reads elements `[first, first + count)` of the array at `path` (data at [`DATA_OFFSET`])
/// whose elements are `elem_size` bytes, as raw bytes.
pub fn read_range(path: &Path, elem_size: usize, first: u64, count: u64) -> Result<Vec<u8>> {
    let file = DirectFile::open(path, OpenMode::Read, true)?;
    let mut out = vec![0u8; count as usize * elem_size];
    file.read_at(DATA_OFFSET + first * elem_size as u64, &mut out)?;
    Ok(out)
}

/// Reads `int64` elements `[first, first + count)` of the array at `path`, streaming through a
/// `chunk`-byte buffer so that the result is the only large allocation.
pub fn read_i64_range(path: &Path, first: u64, count: u64, chunk: usize) -> Result<Vec<i64>> {
    let file = Engine::shared().open(path, OpenMode::Read)?;
    let start = DATA_OFFSET + first * 8;
    let mut reader = RowReader::records(file, start, start + count * 8, 8, chunk);
    let mut out = Vec::with_capacity(count as usize);
    while let Some(batch) = reader.next_batch()? {
        out.extend(
            batch
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap())),
        );
    }
    if out.len() as u64 != count {
        return Err(StoreError::bad_file(
            path,
            format!("expected {count} int64 values from element {first}"),
        ));
    }
    Ok(out)
}

/// Reads rows `rows` (in that order, repeats allowed) of the C-ordered `.npy` at `path`
/// through the shared engine, keeping up to its depth of reads in flight. Returns the header
/// and the rows' bytes, concatenated.
pub fn read_rows(path: &Path, rows: &[u64]) -> Result<(NpyHeader, Vec<u8>)> {
    let header = npy::read_header(path)?;
    if header.fortran_order && header.shape.len() > 1 {
        return Err(StoreError::bad_file(
            path,
            "rows of a Fortran-ordered array are not contiguous; save it in C order",
        ));
    }
    let n = header.shape.first().copied().unwrap_or(1);
    let row_bytes =
        (header.shape.iter().skip(1).product::<u64>() * header.dtype.size() as u64) as usize;
    if let Some(bad) = rows.iter().find(|&&r| r >= n) {
        return Err(StoreError::bad_file(
            path,
            format!("row {bad} is out of range: the array has {n} rows"),
        ));
    }
    let engine = Engine::shared();
    let file = engine.open(path, OpenMode::Read)?;
    let mut out = vec![0u8; rows.len() * row_bytes];
    if row_bytes == 0 {
        return Ok((header, out));
    }
    // Room for the covering aligned range, so the engine reads in place without a bounce.
    let buf_size = row_bytes + 2 * strata_io::ALIGN;
    let mut free: Vec<AlignedBuf> = Vec::new();
    let mut q = engine.queue();
    let mut next = 0usize;
    let window = engine.depth().min(rows.len());
    loop {
        let mut batch = Vec::new();
        while next < rows.len() && q.pending() + batch.len() < window {
            let buf = free.pop().unwrap_or_else(|| AlignedBuf::new(buf_size));
            let offset = header.data_offset + rows[next] * row_bytes as u64;
            batch.push(Request::read(&file, offset, row_bytes, buf, next as u64));
            next += 1;
        }
        if !batch.is_empty() {
            q.submit(batch);
        }
        let Some(c) = q.wait() else { break };
        c.result?;
        let i = c.tag as usize;
        out[i * row_bytes..(i + 1) * row_bytes].copy_from_slice(c.buf.as_slice());
        free.extend(c.buf.into_heap());
    }
    Ok((header, out))
}

/// Reads a whole (small) array of a store into memory as raw bytes.
pub fn read_all_bytes(path: &Path) -> Result<(NpyHeader, Vec<u8>)> {
    let header = npy::read_header(path)?;
    let file = DirectFile::open(path, OpenMode::Read, true)?;
    let mut out = vec![0u8; header.data_bytes() as usize];
    file.read_at(header.data_offset, &mut out)?;
    Ok((header, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn rows_round_trip(rows in 0usize..5000, cols in 1u64..4, batch in 1usize..50_000, wide in any::<bool>()) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("a.npy");
            let dtype = if wide { DType::I64 } else { DType::I32 };
            let vals: Vec<i64> = (0..rows as i64 * cols as i64).map(|i| i * 7 - 3).collect();
            let mut w = NpyWriter::create(&path, dtype, &[cols], 8192).unwrap();
            for piece in vals.chunks(101 * cols as usize) {
                w.write_ints(piece).unwrap();
            }
            let info = w.finish().unwrap();
            prop_assert_eq!(&info.shape, &vec![rows as u64, cols]);
            let mut r = RowReader::open_array(dir.path(), &info, batch).unwrap();
            let mut back = Vec::new();
            while let Some(b) = r.next_batch().unwrap() {
                prop_assert_eq!(b.len() % (cols as usize * dtype.size()), 0);
                decode_ints(b, dtype, &mut back);
            }
            prop_assert_eq!(back, vals);
        }
    }
}
