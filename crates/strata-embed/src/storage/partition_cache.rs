//! Partitions held in host memory once they leave the buffer, when the plan has room for them
//! (`keep_partitions`): an evicted partition's buffer is kept, so a later load of it hands that
//! buffer to the slot instead of reading the SSD. Its last eviction of an epoch is also written
//! to the SSD behind the training (the table on disk stays whole, as every epoch's commit
//! needs), and a load of a partition being written waits for that write. A device run whose
//! budget splits the table into partitions then swaps between host and device memory, as
//! PyTorch-BigGraph's GPU trainer does, while the SSD only absorbs the write-backs: on an H200,
//! RMAT scale 24 with a quarter of its table on the device waited 4.1 s of a 22 s epoch for
//! swaps that read and wrote 280 MB each on one disk.
//!
//! Buffers move, they are not copied: a partition lives in exactly one place in memory (a slot
//! or the cache; the SSD holds it as the last commit left it, or newer), and buffers handed
//! back empty are reused before new ones are allocated, so the cache never holds more than the
//! partitions outside the slots. Its buffers live as long as the job: a device backend
//! registers them with the driver the first time they are lent, and releases them before the
//! trainer drops.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use strata_io::AlignedBuf;

use crate::error::{EmbedError, Result};

/// A kept partition: its bytes once written back, or `None` while the write is in flight.
type Kept = Option<AlignedBuf>;

#[derive(Default)]
struct State {
    kept: HashMap<u32, Kept>,
    /// Buffers holding nothing, reused before new ones are allocated.
    free: Vec<AlignedBuf>,
    /// The first write-back that failed and was not yet reported.
    failed: Option<EmbedError>,
}

impl State {
    /// Sets what is kept of `p` (its bytes, or `None` while written back); older bytes of `p`
    /// free their buffer.
    fn put(&mut self, p: u32, kept: Kept) {
        if let Some(Some(stale)) = self.kept.insert(p, kept) {
            self.free.push(stale);
        }
    }
}

/// Partitions kept in memory by id (see the module's doc).
#[derive(Default)]
pub struct PartitionCache {
    state: Mutex<State>,
    /// Signalled whenever a write-back lands.
    landed: Condvar,
}

impl PartitionCache {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("partition cache lock")
    }

    /// Partition `p`'s buffer, out of the cache (`None`: not kept, read it from the SSD). A
    /// partition whose write-back is in flight is waited for.
    pub fn take(&self, p: u32) -> Option<AlignedBuf> {
        let mut state = self.lock();
        loop {
            match state.kept.remove(&p) {
                Some(Some(buf)) => return Some(buf),
                Some(None) => {
                    state.kept.insert(p, None);
                    state = self.landed.wait(state).expect("partition cache lock");
                }
                None => return None,
            }
        }
    }

    /// `f` of partition `p`'s kept buffer, left in the cache (`None`: not kept). A partition
    /// whose write-back is in flight is waited for.
    pub fn peek<R>(&self, p: u32, f: impl FnOnce(&AlignedBuf) -> R) -> Option<R> {
        let mut state = self.lock();
        loop {
            match state.kept.get(&p) {
                Some(Some(buf)) => return Some(f(buf)),
                Some(None) => state = self.landed.wait(state).expect("partition cache lock"),
                None => return None,
            }
        }
    }

    /// Marks `p` as being written back: a [`take`](Self::take) of it waits for
    /// [`landed`](Self::landed). Older bytes of `p` still kept free their buffer.
    pub fn writing(&self, p: u32) {
        self.lock().put(p, None);
    }

    /// `p`'s write-back finished with `result`: its buffer is kept either way (its bytes are
    /// the newest), and a failure is held for [`failure`](Self::failure).
    pub fn landed(&self, p: u32, buf: AlignedBuf, result: Result<()>) {
        let mut state = self.lock();
        if let Err(e) = result {
            state.failed.get_or_insert(e);
        }
        state.put(p, Some(buf));
        drop(state);
        self.landed.notify_all();
    }

    /// Keeps `buf`, holding `p`'s newest bytes (as the SSD has them, or, evicted before the
    /// epoch loads it again, to be written by its last eviction); older bytes of `p` free
    /// their buffer.
    pub fn keep(&self, p: u32, buf: AlignedBuf) {
        self.lock().put(p, Some(buf));
    }

    /// A buffer of `bytes` (a partition slot's size, the same for every buffer of a run): a
    /// free one, or a new one.
    pub fn buffer(&self, bytes: usize) -> AlignedBuf {
        let free = self.lock().free.pop();
        debug_assert!(free.as_ref().is_none_or(|b| b.capacity() >= bytes));
        free.unwrap_or_else(|| AlignedBuf::new(bytes))
    }

    /// Gives a buffer holding nothing to the cache, for reuse.
    pub fn recycle(&self, buf: AlignedBuf) {
        self.lock().free.push(buf);
    }

    /// Forgets every kept partition (the table they mirrored is no longer the one read), their
    /// buffers free for reuse. No write-back may be in flight (the epoch's swaps are done).
    pub fn forget(&self) {
        let mut state = self.lock();
        let State { kept, free, .. } = &mut *state;
        for (p, buf) in kept.drain() {
            free.push(buf.unwrap_or_else(|| panic!("partition {p} forgotten while written back")));
        }
    }

    /// The first write-back that failed since the last call (`Ok`: none).
    pub fn failure(&self) -> Result<()> {
        self.lock().failed.take().map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn buf(byte: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(4096);
        b.full_mut().fill(byte);
        b
    }

    #[test]
    fn a_kept_partition_is_handed_out_once_and_older_bytes_free_their_buffer() {
        let cache = PartitionCache::default();
        assert!(cache.take(3).is_none());
        cache.writing(3);
        let b = buf(7);
        let at = b.prefix(1).as_ptr();
        cache.landed(3, b, Ok(()));
        let back = cache.take(3).expect("kept");
        assert_eq!(back.prefix(1).as_ptr(), at, "the same buffer, not a copy");
        assert!(back.prefix(4096).iter().all(|&x| x == 7));
        assert!(cache.take(3).is_none(), "taken: it lives in its slot now");
        cache.keep(3, back);
        cache.keep(3, buf(8));
        let newer = cache.take(3).expect("kept");
        assert!(
            newer.prefix(4096).iter().all(|&x| x == 8),
            "the newer bytes"
        );
        assert_eq!(
            cache.buffer(4096).prefix(1).as_ptr(),
            at,
            "the older one's buffer reused"
        );
    }

    #[test]
    fn a_take_waits_for_the_write_back_in_flight() {
        let cache = Arc::new(PartitionCache::default());
        cache.writing(1);
        let writer = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                cache.landed(1, buf(5), Ok(()));
            })
        };
        let got = cache.take(1).expect("landed, then taken");
        assert!(got.prefix(4096).iter().all(|&x| x == 5));
        writer.join().unwrap();
    }

    #[test]
    fn a_peek_reads_a_kept_partition_in_place_and_waits_for_its_write_back() {
        let cache = Arc::new(PartitionCache::default());
        assert!(cache.peek(4, |_| ()).is_none(), "not kept");
        cache.writing(4);
        let writer = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                cache.landed(4, buf(9), Ok(()));
            })
        };
        let first = cache.peek(4, |b| b.prefix(4096).iter().all(|&x| x == 9));
        assert_eq!(first, Some(true), "landed, then read");
        writer.join().unwrap();
        assert!(cache.take(4).is_some(), "still kept after the peek");
    }

    #[test]
    fn a_failed_write_back_is_reported_once_and_its_bytes_stay_kept() {
        let cache = PartitionCache::default();
        cache.writing(2);
        cache.landed(2, buf(1), Err(EmbedError::Corrupt("disk full".into())));
        let err = cache.failure().unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert!(cache.failure().is_ok(), "reported once");
        assert!(
            cache.take(2).is_some(),
            "the newest bytes are still in memory"
        );
    }
}
