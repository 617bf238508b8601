//! Buffers registered with io_uring: the kernel maps them once instead of pinning pages on
//! every request, which matters at tens of thousands of small reads per second.

use std::sync::{Arc, Condvar, Mutex};

use super::{Backend, Engine, Inner};
use crate::aligned::AlignedBuf;

/// A pool of equally sized aligned buffers, registered with the engine's io_uring instance
/// when it has room (otherwise ordinary buffers with the same interface).
pub struct FixedPool {
    shared: Arc<PoolShared>,
}

struct PoolShared {
    free: Mutex<Vec<(Option<u16>, AlignedBuf)>>,
    returned: Condvar,
    indices: Vec<u16>,
    engine: Arc<Inner>,
    size: usize,
}

/// A buffer borrowed from a [`FixedPool`]; it goes back to the pool when dropped.
pub struct FixedBuf {
    index: Option<u16>,
    buf: Option<AlignedBuf>,
    pool: Arc<PoolShared>,
}

impl Engine {
    /// A pool of `count` buffers of `size` bytes, registered with io_uring when possible.
    pub fn fixed_pool(self: &Arc<Self>, count: usize, size: usize) -> FixedPool {
        FixedPool::new(self, count, size)
    }
}

impl FixedPool {
    pub(crate) fn new(engine: &Arc<Engine>, count: usize, size: usize) -> FixedPool {
        let inner = engine.inner().clone();
        let bufs: Vec<AlignedBuf> = (0..count).map(|_| AlignedBuf::new(size)).collect();
        let indices = match &inner.backend {
            Backend::Uring(u) => u.register_buffers(&bufs).unwrap_or_default(),
            Backend::Threads(_) => Vec::new(),
        };
        let free = bufs
            .into_iter()
            .enumerate()
            .map(|(i, b)| (indices.get(i).copied(), b))
            .collect();
        FixedPool {
            shared: Arc::new(PoolShared {
                free: Mutex::new(free),
                returned: Condvar::new(),
                indices,
                engine: inner,
                size,
            }),
        }
    }

    /// Whether the buffers are registered with io_uring.
    pub fn registered(&self) -> bool {
        !self.shared.indices.is_empty()
    }

    /// Size of each buffer in bytes.
    pub fn buf_size(&self) -> usize {
        self.shared.size
    }

    /// A buffer, waiting for one to come back if all are in use.
    pub fn take(&self) -> FixedBuf {
        let mut free = self.shared.free.lock().unwrap();
        loop {
            if let Some((index, buf)) = free.pop() {
                return FixedBuf {
                    index,
                    buf: Some(buf),
                    pool: self.shared.clone(),
                };
            }
            free = self.shared.returned.wait(free).unwrap();
        }
    }
}

impl FixedBuf {
    pub(crate) fn index(&self) -> Option<u16> {
        self.index
    }

    pub fn buf(&self) -> &AlignedBuf {
        self.buf.as_ref().expect("buffer present until drop")
    }

    pub fn buf_mut(&mut self) -> &mut AlignedBuf {
        self.buf.as_mut().expect("buffer present until drop")
    }
}

impl Drop for FixedBuf {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.free.lock().unwrap().push((self.index, buf));
            self.pool.returned.notify_one();
        }
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        if let Backend::Uring(u) = &self.engine.backend {
            u.unregister_buffers(&self.indices);
        }
    }
}
