use std::path::Path;

use crate::aligned::{align_down, align_up, AlignedBuf, ALIGN};
use crate::error::Result;
use crate::file::{DirectFile, OpenMode};

/// Appends bytes to a file sequentially through an aligned buffer, so that every write the
/// kernel sees is aligned and large (suitable for `O_DIRECT`).
///
/// The final partial block is written zero-padded and the file then truncated to its logical
/// length, so the padding never shows.
pub struct SeqWriter {
    file: DirectFile,
    buf: AlignedBuf,
    /// File offset where `buf[0]` goes; always aligned.
    base: u64,
}

impl SeqWriter {
    /// Writes into `file` from byte `start` (a multiple of [`ALIGN`]) using a buffer of
    /// `buf_bytes` (rounded up to [`ALIGN`]).
    pub fn new(file: DirectFile, start: u64, buf_bytes: usize) -> Self {
        assert_eq!(
            start % ALIGN as u64,
            0,
            "SeqWriter must start at an aligned offset"
        );
        SeqWriter {
            file,
            buf: AlignedBuf::new(buf_bytes.max(ALIGN)),
            base: start,
        }
    }

    /// Creates `path` (truncating it) and writes from byte `start`.
    pub fn create(path: &Path, start: u64, buf_bytes: usize) -> Result<Self> {
        Ok(Self::new(
            DirectFile::open(path, OpenMode::Create, true)?,
            start,
            buf_bytes,
        ))
    }

    /// Logical end of the data written so far, as a file offset in bytes.
    pub fn position(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// The file being written (for writes outside the sequential region, such as a header).
    pub fn file(&self) -> &DirectFile {
        &self.file
    }

    /// Appends `data`.
    pub fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let n = self.buf.fill_from(data);
            data = &data[n..];
            if self.buf.remaining() == 0 {
                self.flush_full()?;
            }
        }
        Ok(())
    }

    fn flush_full(&mut self) -> Result<()> {
        self.file.write_at(self.base, self.buf.as_slice())?;
        self.base += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes the tail, trims the padding, syncs, and returns the file and its length in bytes.
    pub fn finish(mut self) -> Result<(DirectFile, u64)> {
        let end = self.position();
        if !self.buf.is_empty() {
            let padded = self.buf.pad_to_align();
            self.file.write_at(self.base, self.buf.prefix(padded))?;
            if padded != self.buf.len() {
                self.file.set_len(end)?;
            }
        }
        self.file.sync()?;
        Ok((self.file, end))
    }
}

/// Reads a byte range of a file sequentially in large aligned chunks.
pub struct SeqReader {
    file: DirectFile,
    buf: AlignedBuf,
    /// Next file offset to read (aligned).
    next: u64,
    /// Bytes of the next chunk to skip at its start (the unaligned part before `start`).
    skip: usize,
    end: u64,
    /// The current chunk is `buf[cursor..chunk_end]` for [`std::io::Read`].
    cursor: usize,
    chunk_end: usize,
}

impl SeqReader {
    /// Reads `[start, end)` of `file` in chunks of about `chunk_bytes`.
    pub fn new(file: DirectFile, start: u64, end: u64, chunk_bytes: usize) -> Self {
        let aligned = align_down(start);
        SeqReader {
            file,
            buf: AlignedBuf::new(chunk_bytes.max(ALIGN)),
            next: aligned,
            skip: (start - aligned) as usize,
            end,
            cursor: 0,
            chunk_end: 0,
        }
    }

    /// Opens `path` with `O_DIRECT` and reads it from byte `start` to its end.
    pub fn open(path: &Path, start: u64, chunk_bytes: usize) -> Result<Self> {
        let file = DirectFile::open(path, OpenMode::Read, true)?;
        let end = file.size()?;
        Ok(Self::new(file, start, end, chunk_bytes))
    }

    /// Bytes not yet returned.
    pub fn remaining(&self) -> u64 {
        self.end.saturating_sub(self.next + self.skip as u64)
            + (self.chunk_end - self.cursor) as u64
    }

    /// The next chunk, or `None` at the end of the range.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>> {
        if self.next + self.skip as u64 >= self.end {
            return Ok(None);
        }
        let want = (self.end - self.next).min(self.buf.capacity() as u64) as usize;
        // Read whole aligned blocks; at the end of the file the last one comes back short.
        let read_len = align_up(want as u64) as usize;
        let got = self
            .file
            .read_some_raw(self.next, &mut self.buf.full_mut()[..read_len])?;
        if got < want {
            return Err(crate::IoError::PastEnd {
                path: self.file.path().to_path_buf(),
                offset: self.next,
                len: want as u64,
                file_len: self.next + got as u64,
            });
        }
        self.buf.set_len(want);
        self.cursor = std::mem::take(&mut self.skip);
        self.chunk_end = want;
        self.next += want as u64;
        Ok(Some(&self.buf.as_slice()[self.cursor..want]))
    }
}

impl SeqReader {
    /// The chunk returned by the last [`SeqReader::next_chunk`] (what it has not yet handed out
    /// through [`std::io::Read`]).
    pub fn current(&self) -> Option<&[u8]> {
        Some(&self.buf.as_slice()[self.cursor..self.chunk_end])
    }
}

impl std::io::Read for SeqReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.cursor == self.chunk_end {
            match self.next_chunk() {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(0),
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
        let avail = &self.buf.as_slice()[self.cursor..self.chunk_end];
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.cursor += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Read;

    proptest! {
        #[test]
        fn write_then_read_round_trips(len in 0usize..70_000, buf in 1usize..20_000, start_blocks in 0u64..3, chunk in 1usize..30_000, skip in 0u64..5000) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("x.bin");
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            let start = start_blocks * ALIGN as u64;
            let mut w = SeqWriter::create(&path, start, buf).unwrap();
            for piece in data.chunks(777) {
                w.write_all(piece).unwrap();
            }
            let (_, end) = w.finish().unwrap();
            prop_assert_eq!(end, start + len as u64);
            prop_assert_eq!(std::fs::metadata(&path).unwrap().len(), end);
            let from = start + skip.min(len as u64);
            let mut r = SeqReader::open(&path, from, chunk).unwrap();
            let mut back = Vec::new();
            r.read_to_end(&mut back).unwrap();
            prop_assert_eq!(&back[..], &data[(from - start) as usize..]);
        }
    }
}
