use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::aligned::{align_down, align_up, AlignedBuf, ALIGN};
use crate::error::{IoError, Result};

/// How a [`DirectFile`] is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read an existing file.
    Read,
    /// Create (or truncate) a file for writing and reading back.
    Create,
    /// Read and write an existing file without truncating it.
    ReadWrite,
}

/// A file opened with `O_DIRECT` when the file system supports it, buffered otherwise.
///
/// Reads accept any offset, length and destination: when they are not aligned the covering
/// aligned range is read into a bounce buffer and the requested bytes copied out. Writes through
/// [`DirectFile::write_at`] must be aligned in offset, length and address when the file is direct;
/// [`crate::SeqWriter`] takes care of that for sequential output.
#[derive(Debug)]
pub struct DirectFile {
    file: File,
    path: PathBuf,
    direct: bool,
}

impl DirectFile {
    /// Opens `path`; asks for `O_DIRECT` when `want_direct` and silently falls back to buffered
    /// I/O where the file system refuses it (tmpfs, some network file systems).
    pub fn open(path: &Path, mode: OpenMode, want_direct: bool) -> Result<Self> {
        let options = |direct: bool| {
            let mut o = OpenOptions::new();
            match mode {
                OpenMode::Read => o.read(true),
                OpenMode::Create => o.read(true).write(true).create(true).truncate(true),
                OpenMode::ReadWrite => o.read(true).write(true),
            };
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o
        };
        let op = match mode {
            OpenMode::Read => "open",
            _ => "create",
        };
        if want_direct {
            match options(true).open(path) {
                Ok(file) => {
                    return Ok(DirectFile {
                        file,
                        path: path.to_path_buf(),
                        direct: true,
                    })
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(IoError::os(op, path, 0, e)),
            }
        }
        let file = options(false)
            .open(path)
            .map_err(|e| IoError::os(op, path, 0, e))?;
        Ok(DirectFile {
            file,
            path: path.to_path_buf(),
            direct: false,
        })
    }

    /// Whether I/O bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying file (for `fstat`-like queries and for the I/O engine's registration).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// File size in bytes.
    pub fn size(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| IoError::os("stat", &self.path, 0, e))
    }

    /// Reads exactly `dst.len()` bytes at `offset`. Reading past the end of the file is an error.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let file_len = self.size()?;
        if offset + dst.len() as u64 > file_len {
            return Err(IoError::PastEnd {
                path: self.path.clone(),
                offset,
                len: dst.len() as u64,
                file_len,
            });
        }
        let aligned = offset.is_multiple_of(ALIGN as u64)
            && dst.len().is_multiple_of(ALIGN)
            && (dst.as_ptr() as usize).is_multiple_of(ALIGN);
        if !self.direct || aligned {
            return self.read_exact_raw(offset, dst);
        }
        // Bounce through the covering aligned range, in pieces of at most 8 MiB.
        const BOUNCE: u64 = 8 << 20;
        let mut bounce = AlignedBuf::new(
            (BOUNCE as usize).min(align_up(dst.len() as u64 + ALIGN as u64) as usize),
        );
        let mut done = 0usize;
        while done < dst.len() {
            let pos = offset + done as u64;
            let start = align_down(pos);
            let want_end = (offset + dst.len() as u64).min(start + bounce.capacity() as u64);
            // The last block of a file may be short; O_DIRECT reads return what exists.
            let read_end = align_up(want_end).min(align_up(file_len));
            let n = (read_end - start) as usize;
            let got = self.read_some_raw(start, &mut bounce.full_mut()[..n])?;
            let avail = (start + got as u64).min(want_end);
            let take = (avail - pos) as usize;
            let skip = (pos - start) as usize;
            dst[done..done + take].copy_from_slice(&bounce.prefix(skip + take)[skip..]);
            done += take;
        }
        Ok(())
    }

    /// Writes all of `src` at `offset`. For a direct file the offset, length and address must be
    /// multiples of [`ALIGN`].
    pub fn write_at(&self, offset: u64, src: &[u8]) -> Result<()> {
        if self.direct {
            assert!(
                offset.is_multiple_of(ALIGN as u64)
                    && src.len().is_multiple_of(ALIGN)
                    && (src.as_ptr() as usize).is_multiple_of(ALIGN),
                "unaligned O_DIRECT write to {} at {offset} of {} bytes",
                self.path.display(),
                src.len()
            );
        }
        self.file
            .write_all_at(src, offset)
            .map_err(|e| IoError::os("write", &self.path, offset, e))
    }

    /// Sets the file length in bytes (used to drop the zero padding of a final direct write).
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| IoError::os("truncate", &self.path, len, e))
    }

    /// Flushes data and metadata to the device.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_all()
            .map_err(|e| IoError::os("fsync", &self.path, 0, e))
    }

    fn read_exact_raw(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(dst, offset)
            .map_err(|e| IoError::os("read", &self.path, offset, e))
    }

    /// One read that may come back short at the end of the file; retries on EINTR and on short
    /// reads that are not at the end.
    pub(crate) fn read_some_raw(&self, offset: u64, dst: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < dst.len() {
            match self.file.read_at(&mut dst[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(IoError::os("read", &self.path, offset, e)),
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_file(len: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.bin");
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        (dir, path, data)
    }

    proptest! {
        #[test]
        fn unaligned_reads_match_the_file(len in 1usize..40_000, a in 0usize..40_000, b in 0usize..40_000) {
            let (_dir, path, data) = sample_file(len);
            let (lo, hi) = (a.min(b) % len, (a.max(b) % len) + 1);
            let hi = hi.max(lo);
            for direct in [true, false] {
                let f = DirectFile::open(&path, OpenMode::Read, direct).unwrap();
                let mut out = vec![0u8; hi - lo];
                f.read_at(lo as u64, &mut out).unwrap();
                prop_assert_eq!(&out[..], &data[lo..hi]);
            }
        }
    }

    #[test]
    fn read_past_end_is_an_error() {
        let (_dir, path, _) = sample_file(5000);
        let f = DirectFile::open(&path, OpenMode::Read, true).unwrap();
        let mut out = vec![0u8; 100];
        let err = f.read_at(4950, &mut out).unwrap_err();
        assert!(
            matches!(err, IoError::PastEnd { file_len: 5000, .. }),
            "{err}"
        );
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = DirectFile::open(Path::new("/nonexistent/strata/x.npy"), OpenMode::Read, true)
            .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/strata/x.npy"),
            "{err}"
        );
    }
}
