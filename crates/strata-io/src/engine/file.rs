//! Files as the engine addresses them: shared, size-cached, and registered with io_uring
//! when the backend offers a slot.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Backend, Engine, Inner};
use crate::error::Result;
use crate::file::{DirectFile, OpenMode};

/// A file the engine reads and writes. Cheap to clone; in-flight requests hold a clone, so a
/// file stays open (and registered) until its last request completes.
#[derive(Clone)]
pub struct IoFile {
    inner: Arc<FileInner>,
}

struct FileInner {
    file: DirectFile,
    /// Last known size in bytes; refreshed when a read reaches past it.
    size: AtomicU64,
    registration: Option<(u32, Arc<Inner>)>,
}

impl Engine {
    /// Opens `path` for use with this engine (registered with io_uring when possible). It
    /// sits with the files it makes: the engine's module does not reach its parts.
    pub fn open(self: &Arc<Self>, path: &Path, mode: OpenMode) -> Result<IoFile> {
        IoFile::open(self, path, mode)
    }
}

impl IoFile {
    /// Opens `path` with `O_DIRECT` (when the file system allows) for `engine`.
    pub(crate) fn open(engine: &Arc<Engine>, path: &Path, mode: OpenMode) -> Result<IoFile> {
        let file = DirectFile::open(path, mode, true)?;
        let inner = engine.inner();
        let registration = match &inner.backend {
            Backend::Uring(u) => u
                .register_file(raw_fd(&file))
                .map(|slot| (slot, inner.clone())),
            Backend::Threads(_) => None,
        };
        Ok(Self::wrap(file, registration))
    }

    /// Uses an already open file, unregistered.
    pub fn from_file(file: DirectFile) -> Result<IoFile> {
        Ok(Self::wrap(file, None))
    }

    fn wrap(file: DirectFile, registration: Option<(u32, Arc<Inner>)>) -> IoFile {
        let size = file.size().unwrap_or(0);
        IoFile {
            inner: Arc::new(FileInner {
                file,
                size: AtomicU64::new(size),
                registration,
            }),
        }
    }

    /// The underlying file (for `set_len`, `sync`, `size`).
    pub fn file(&self) -> &DirectFile {
        &self.inner.file
    }

    pub fn path(&self) -> &Path {
        self.inner.file.path()
    }

    pub fn is_direct(&self) -> bool {
        self.inner.file.is_direct()
    }

    /// File size in bytes, re-read from the file system when the cached size is below `end`.
    pub(crate) fn size_at_least(&self, end: u64) -> Result<u64> {
        let cached = self.inner.size.load(Ordering::Relaxed);
        if cached >= end {
            return Ok(cached);
        }
        let now = self.inner.file.size()?;
        self.inner.size.store(now, Ordering::Relaxed);
        Ok(now)
    }

    pub(crate) fn raw_fd(&self) -> i32 {
        raw_fd(&self.inner.file)
    }

    /// The io_uring fixed-file index, when registered.
    pub(crate) fn fixed_index(&self) -> Option<u32> {
        self.inner.registration.as_ref().map(|(slot, _)| *slot)
    }
}

fn raw_fd(file: &DirectFile) -> i32 {
    use std::os::fd::AsRawFd;
    file.file().as_raw_fd()
}

impl Drop for FileInner {
    fn drop(&mut self) {
        if let Some((slot, inner)) = &self.registration {
            if let Backend::Uring(u) = &inner.backend {
                u.unregister_file(*slot);
            }
        }
    }
}
