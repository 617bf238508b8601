//! Sequential writers and readers over the I/O engine: write-behind and read-ahead with two
//! buffers, so the device works while the caller fills or consumes the other buffer.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::aligned::{align_down, align_up, AlignedBuf, ALIGN};
use crate::engine::{Engine, IoFile, IoQueue, Request};
use crate::error::Result;
use crate::file::OpenMode;

/// Appends bytes to a file sequentially. Every write the kernel sees is aligned and large
/// (suitable for `O_DIRECT`); the final partial block is written zero-padded and the file then
/// truncated to its logical length, so the padding never shows. Uses two buffers of
/// `buf_bytes / 2`: one fills while the other is written.
pub struct SeqWriter {
    queue: IoQueue,
    file: IoFile,
    cur: AlignedBuf,
    spare: Option<AlignedBuf>,
    /// File offset where `cur[0]` goes; always aligned.
    base: u64,
}

impl SeqWriter {
    /// Writes into `file` from byte `start` (a multiple of [`ALIGN`]) with `buf_bytes` of
    /// buffers in all.
    pub fn new(engine: &Arc<Engine>, file: IoFile, start: u64, buf_bytes: usize) -> Self {
        assert!(
            start.is_multiple_of(ALIGN as u64),
            "SeqWriter must start at an aligned offset"
        );
        let half = align_down((buf_bytes / 2) as u64).max(ALIGN as u64) as usize;
        SeqWriter {
            queue: engine.queue(),
            file,
            cur: AlignedBuf::new(half),
            spare: Some(AlignedBuf::new(half)),
            base: start,
        }
    }

    /// Creates `path` (truncating it) and writes from byte `start` through the shared engine.
    pub fn create(path: &Path, start: u64, buf_bytes: usize) -> Result<Self> {
        let engine = Engine::shared();
        let file = engine.open(path, OpenMode::Create)?;
        Ok(Self::new(&engine, file, start, buf_bytes))
    }

    /// Logical end of the data written so far, as a file offset in bytes.
    pub fn position(&self) -> u64 {
        self.base + self.cur.len() as u64
    }

    /// The file being written.
    pub fn file(&self) -> &IoFile {
        &self.file
    }

    /// Appends `data`.
    pub fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let n = self.cur.fill_from(data);
            data = &data[n..];
            if self.cur.remaining() == 0 {
                self.flush_full()?;
            }
        }
        Ok(())
    }

    /// Sends the full current buffer and continues in the other one (waiting for it to come
    /// back from its own write if need be).
    fn flush_full(&mut self) -> Result<()> {
        let next = match self.spare.take() {
            Some(b) => b,
            None => self.wait_one()?,
        };
        let full = std::mem::replace(&mut self.cur, next);
        let len = full.len();
        self.queue
            .submit([Request::write(&self.file, self.base, len, full, 0)]);
        self.base += len as u64;
        self.cur.clear();
        Ok(())
    }

    /// Waits for one write; returns its buffer, emptied.
    fn wait_one(&mut self) -> Result<AlignedBuf> {
        let c = self.queue.wait().expect("a write is in flight");
        c.result?;
        let mut buf = c.buf.into_heap().expect("writers use heap buffers");
        buf.clear();
        Ok(buf)
    }

    /// Writes one aligned block at `offset` outside the sequential region (a header) and waits.
    pub fn write_block_at(&mut self, offset: u64, block: AlignedBuf) -> Result<()> {
        let len = block.len();
        self.queue
            .submit([Request::write(&self.file, offset, len, block, 1)]);
        while self.queue.pending() > 0 {
            let c = self.queue.wait().expect("pending");
            let tag = c.tag;
            let result = c.result;
            if tag == 0 {
                // One of our sequential writes finished meanwhile: keep its buffer.
                let mut buf = c.buf.into_heap().expect("writers use heap buffers");
                buf.clear();
                self.spare.get_or_insert(buf);
            }
            result?;
        }
        Ok(())
    }

    /// Writes the tail, trims the padding, syncs, and returns the file and its length in bytes.
    pub fn finish(mut self) -> Result<(IoFile, u64)> {
        let end = self.position();
        let tail_len = self.cur.len();
        if tail_len > 0 {
            let write_len = if self.file.is_direct() {
                self.cur.pad_to_align()
            } else {
                tail_len
            };
            let tail = std::mem::replace(&mut self.cur, AlignedBuf::new(ALIGN));
            self.queue
                .submit([Request::write(&self.file, self.base, write_len, tail, 0)]);
        }
        self.queue.drain()?;
        let file = self.file.file();
        if file.size()? != end {
            file.set_len(end)?;
        }
        file.sync()?;
        Ok((self.file, end))
    }
}

/// Reads a byte range of a file sequentially in chunks of `chunk` bytes, keeping the next
/// chunk in flight while the caller works on the current one (memory: two chunks).
pub struct SeqReader {
    queue: IoQueue,
    file: IoFile,
    chunk: usize,
    /// Next file offset to request (aligned).
    next_request: u64,
    /// File offset of the chunk to hand out next.
    next_out: u64,
    end: u64,
    /// Bytes to skip at the start of the first chunk (the unaligned part before `start`).
    skip: usize,
    /// Chunks that arrived ahead of their turn, by offset.
    arrived: BTreeMap<u64, AlignedBuf>,
    free: Vec<AlignedBuf>,
    current: Option<AlignedBuf>,
    /// The part of `current` not yet returned through [`std::io::Read`].
    cursor: usize,
    chunk_end: usize,
}

impl SeqReader {
    /// Reads `[start, end)` of `file` through `engine` in chunks of about `chunk_bytes`.
    pub fn new(
        engine: &Arc<Engine>,
        file: IoFile,
        start: u64,
        end: u64,
        chunk_bytes: usize,
    ) -> Self {
        let chunk = align_up(chunk_bytes.max(ALIGN) as u64) as usize;
        let aligned = align_down(start);
        let mut r = SeqReader {
            queue: engine.queue(),
            file,
            chunk,
            next_request: aligned,
            next_out: aligned,
            end,
            skip: (start - aligned) as usize,
            arrived: BTreeMap::new(),
            free: vec![AlignedBuf::new(chunk), AlignedBuf::new(chunk)],
            current: None,
            cursor: 0,
            chunk_end: 0,
        };
        r.request_ahead();
        r
    }

    /// Opens `path` with `O_DIRECT` through the shared engine and reads it from byte `start`.
    pub fn open(path: &Path, start: u64, chunk_bytes: usize) -> Result<Self> {
        let engine = Engine::shared();
        let file = engine.open(path, OpenMode::Read)?;
        let end = file.file().size()?;
        Ok(Self::new(&engine, file, start, end, chunk_bytes))
    }

    /// Requests chunks while a buffer is free and the range is not exhausted.
    fn request_ahead(&mut self) {
        while self.next_request < self.end {
            let Some(buf) = self.free.pop() else { break };
            let len = ((self.end - self.next_request) as usize).min(self.chunk);
            let offset = self.next_request;
            self.queue
                .submit([Request::read(&self.file, offset, len, buf, offset)]);
            self.next_request += len as u64;
        }
    }

    /// Bytes not yet returned.
    pub fn remaining(&self) -> u64 {
        self.end.saturating_sub(self.next_out + self.skip as u64)
            + (self.chunk_end - self.cursor) as u64
    }

    /// The next chunk, or `None` at the end of the range.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>> {
        if let Some(done) = self.current.take() {
            self.free.push(done);
        }
        if self.next_out >= self.end {
            return Ok(None);
        }
        self.request_ahead();
        let buf = loop {
            if let Some(b) = self.arrived.remove(&self.next_out) {
                break b;
            }
            let c = self.queue.wait().expect("the next chunk is in flight");
            let offset = c.tag;
            let buf = c.buf.into_heap().expect("readers use heap buffers");
            if let Err(e) = c.result {
                self.free.push(buf);
                return Err(e);
            }
            self.arrived.insert(offset, buf);
        };
        let len = buf.len();
        self.next_out += len as u64;
        self.cursor = std::mem::take(&mut self.skip).min(len);
        self.chunk_end = len;
        self.current = Some(buf);
        self.request_ahead();
        Ok(self.current())
    }

    /// The part of the last chunk not yet handed out through [`std::io::Read`].
    pub fn current(&self) -> Option<&[u8]> {
        self.current
            .as_ref()
            .map(|b| &b.as_slice()[self.cursor..self.chunk_end])
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
        let avail = &self
            .current
            .as_ref()
            .expect("a chunk is current")
            .as_slice()[self.cursor..self.chunk_end];
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
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn write_then_read_round_trips(len in 0usize..70_000, buf in 1usize..20_000, start_blocks in 0u64..3, chunk in 1usize..30_000, skip in 0u64..5000) {
            for engine in crate::testing::engines(8, 32) {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("x.bin");
                let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
                let start = start_blocks * ALIGN as u64;
                let file = engine.open(&path, OpenMode::Create).unwrap();
                let mut w = SeqWriter::new(&engine, file, start, buf);
                for piece in data.chunks(777) {
                    w.write_all(piece).unwrap();
                }
                let (_, end) = w.finish().unwrap();
                prop_assert_eq!(end, start + len as u64);
                prop_assert_eq!(std::fs::metadata(&path).unwrap().len(), end);
                let from = start + skip.min(len as u64);
                let file = engine.open(&path, OpenMode::Read).unwrap();
                let mut r = SeqReader::new(&engine, file, from, end, chunk);
                let mut back = Vec::new();
                r.read_to_end(&mut back).unwrap();
                prop_assert_eq!(&back[..], &data[(from - start) as usize..]);
            }
        }
    }
}
