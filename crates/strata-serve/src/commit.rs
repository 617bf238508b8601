//! Group commit over the write-ahead log (leader/follower).
//!
//! Each mutation used to pay its own `fdatasync` under the graph's writer lock, so one graph
//! took about as many mutations a second as the disk takes syncs. Here a writer *stages* its
//! record (assigns the next lsn, keeps the bytes in memory) under a short lock and then waits.
//! The first waiter that finds no flush under way becomes the leader: it takes every staged
//! record, writes them with one write and one `fdatasync` (outside the lock, so others go on
//! staging), and wakes everyone. Records staged during that flush form the next group. A
//! record is acknowledged only after a flush that covers it returned: an acknowledgement
//! still means on disk.
//!
//! Beside the log, the caller keeps writer-side state `S` (for a served graph: the mutations
//! staged but not yet durable, and what they lead to, which the next mutation is checked
//! against). [`Staging`] keeps it in step: `durable` is called, in lsn order and before any
//! record of the group is acknowledged, with the last lsn a flush made durable; `discarded`
//! when a flush failed, which fails every record of that group and every record staged behind
//! it (they were checked against a state that included the lost records).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{Result, ServeError};
use crate::wal::{Wal, MAX_RECORD_BYTES};

/// How the writer-side state follows the log (see the module documentation).
pub trait Staging<S> {
    /// Records through lsn `through` are on disk. Called by the flushing thread, under the
    /// log's lock, once per flushed group and in lsn order.
    fn durable(&self, state: &mut S, through: u64);
    /// Every staged record after lsn `durable` was discarded (a flush failed). Called under the
    /// log's lock, before anything else is staged.
    fn discarded(&self, state: &mut S, durable: u64);
}

/// A write-ahead log shared by concurrent writers, flushed in groups.
pub struct GroupLog<S> {
    inner: Mutex<Inner<S>>,
    /// Locked by the leader for its flush, and by [`GroupLog::with_wal`].
    wal: Mutex<Wal>,
    /// Signalled after each flush.
    flushed: Condvar,
}

struct Inner<S> {
    state: S,
    /// Records staged and not yet taken by a flush, in lsn order.
    staged: Vec<Vec<u8>>,
    /// The lsn the next staged record gets.
    next_lsn: u64,
    /// Every staged record gets a ticket (never reused, unlike an lsn after a failed flush).
    next_ticket: u64,
    /// Tickets below this are resolved: durable, or failed with an entry in `failed`.
    resolved: u64,
    /// Why each failed ticket failed, until its waiter reads it.
    failed: HashMap<u64, Failure>,
    /// A leader is flushing (the wal lock is taken or about to be).
    flushing: bool,
}

/// A failed flush, as each of its waiters reports it.
#[derive(Clone)]
struct Failure {
    kind: std::io::ErrorKind,
    message: Arc<str>,
}

impl<S> GroupLog<S> {
    /// Group commit over `wal`, with writer-side state `state`.
    pub fn new(wal: Wal, state: S) -> GroupLog<S> {
        let next_lsn = wal.last_lsn() + 1;
        GroupLog {
            inner: Mutex::new(Inner {
                state,
                staged: Vec::new(),
                next_lsn,
                next_ticket: 0,
                resolved: 0,
                failed: HashMap::new(),
                flushing: false,
            }),
            wal: Mutex::new(wal),
            flushed: Condvar::new(),
        }
    }

    /// Commits one record and returns once it is on disk, with its lsn and what `stage`
    /// returned.
    ///
    /// Under the log's lock, `prepare` checks the change against the state and returns the
    /// record's bytes (it must not change the state); a record over
    /// [`MAX_RECORD_BYTES`] is then refused; otherwise `stage` records it in the state with
    /// its lsn. The caller waits for a flush that covers it, leading one when none is under
    /// way. Errors: `prepare`'s, the size limit, or the flush's (for every record of its group).
    pub fn commit<T, R>(
        &self,
        hooks: &dyn Staging<S>,
        prepare: impl FnOnce(&S) -> Result<(Vec<u8>, T)>,
        stage: impl FnOnce(&mut S, u64, T) -> R,
    ) -> Result<(u64, R)> {
        let mut inner = self.inner.lock().unwrap();
        let (payload, prepared) = prepare(&inner.state)?;
        if payload.len() > MAX_RECORD_BYTES {
            return Err(ServeError::ResourceExhausted(format!(
                "a write-ahead log record of {} bytes is over the limit of {MAX_RECORD_BYTES} bytes",
                payload.len()
            )));
        }
        let lsn = inner.next_lsn;
        let staged = stage(&mut inner.state, lsn, prepared);
        inner.staged.push(payload);
        inner.next_lsn += 1;
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        loop {
            if ticket < inner.resolved {
                return match inner.failed.remove(&ticket) {
                    None => Ok((lsn, staged)),
                    Some(f) => Err(ServeError::io(
                        "the log flush of this mutation's group failed, and nothing of the group was acknowledged",
                        std::io::Error::new(f.kind, f.message.to_string()),
                    )),
                };
            }
            inner = if inner.flushing {
                self.flushed.wait(inner).unwrap()
            } else {
                self.lead(inner, hooks)
            };
        }
    }

    /// Flushes every staged record as one group (the caller's among them); returns the lock
    /// again once the group is resolved.
    fn lead<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner<S>>,
        hooks: &dyn Staging<S>,
    ) -> MutexGuard<'a, Inner<S>> {
        let group = std::mem::take(&mut inner.staged);
        let first_ticket = inner.resolved;
        let end_ticket = inner.next_ticket;
        inner.flushing = true;
        drop(inner);
        let (written, durable) = {
            let mut wal = self.wal.lock().unwrap();
            let refs: Vec<&[u8]> = group.iter().map(Vec::as_slice).collect();
            let written = wal.append(&refs);
            (written, wal.last_lsn())
        };
        let mut inner = self.inner.lock().unwrap();
        match written {
            Ok(through) => {
                hooks.durable(&mut inner.state, through);
                inner.resolved = end_ticket;
            }
            Err(e) => {
                let failure = Failure {
                    kind: match &e {
                        ServeError::Io { source, .. } => source.kind(),
                        _ => std::io::ErrorKind::Other,
                    },
                    message: e.to_string().into(),
                };
                // The records staged behind the group were checked against a state holding
                // the lost ones: they fail too, and numbering resumes after the durable log.
                for t in first_ticket..inner.next_ticket {
                    inner.failed.insert(t, failure.clone());
                }
                inner.resolved = inner.next_ticket;
                inner.staged.clear();
                inner.next_lsn = durable + 1;
                hooks.discarded(&mut inner.state, durable);
            }
        }
        inner.flushing = false;
        self.flushed.notify_all();
        inner
    }

    /// Runs `f` on the log and the state with no flush under way and none starting (staged
    /// records wait; they follow whatever `f` does, e.g. into a new segment after a rotation).
    pub fn with_wal<R>(&self, f: impl FnOnce(&mut Wal, &mut S) -> R) -> R {
        let mut inner = self.inner.lock().unwrap();
        while inner.flushing {
            inner = self.flushed.wait(inner).unwrap();
        }
        let mut wal = self.wal.lock().unwrap();
        f(&mut wal, &mut inner.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::full_disk;
    use std::path::Path;

    /// The lsns each flush made durable, and the discards.
    #[derive(Default)]
    struct Seen {
        staged: Vec<u64>,
        durable: Vec<u64>,
        discarded: Vec<u64>,
    }

    struct Hooks;

    impl Staging<Seen> for Hooks {
        fn durable(&self, s: &mut Seen, through: u64) {
            assert!(s.durable.last().is_none_or(|&d| d < through), "in order");
            s.durable.push(through);
        }
        fn discarded(&self, s: &mut Seen, durable: u64) {
            s.staged.retain(|&l| l <= durable);
            s.discarded.push(durable);
        }
    }

    fn commit(log: &GroupLog<Seen>, payload: Vec<u8>) -> Result<u64> {
        log.commit(
            &Hooks,
            |_| Ok((payload, ())),
            |s, lsn, ()| s.staged.push(lsn),
        )
        .map(|(lsn, ())| lsn)
    }

    fn open(dir: &Path) -> GroupLog<Seen> {
        let (wal, _) = Wal::open(dir, 0).unwrap();
        GroupLog::new(wal, Seen::default())
    }

    #[test]
    fn concurrent_writers_are_acknowledged_once_on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path());
        let (threads, each) = (16, 50);
        let acked: Vec<Vec<(u64, Vec<u8>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let log = &log;
                    s.spawn(move || {
                        (0..each)
                            .map(|i| {
                                let payload = format!("thread {t} record {i}").into_bytes();
                                (commit(log, payload.clone()).unwrap(), payload)
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<(u64, Vec<u8>)> = acked.into_iter().flatten().collect();
        all.sort();
        let n = threads * each;
        // Every lsn handed out once, each a thread's own record, and every flush in order.
        assert_eq!(
            all.iter().map(|a| a.0).collect::<Vec<_>>(),
            (1..=n as u64).collect::<Vec<_>>()
        );
        let seen = log.inner.lock().unwrap();
        assert_eq!(seen.state.durable.last(), Some(&(n as u64)));
        assert!(seen.state.discarded.is_empty());
        drop(seen);
        drop(log);
        let (_, replay) = Wal::open(tmp.path(), 0).unwrap();
        assert_eq!(replay.records, all);
    }

    #[test]
    fn records_staged_during_a_flush_share_the_next_one() {
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path());
        std::thread::scope(|s| {
            // Hold the log as a slow disk would: the first writer leads a flush that waits for
            // it, and seven more stage meanwhile.
            let wal = log.wal.lock().unwrap();
            let first = s.spawn(|| commit(&log, b"first".to_vec()).unwrap());
            wait_until(&log, |i| i.flushing);
            let others: Vec<_> = (0..7)
                .map(|i| {
                    let log = &log;
                    s.spawn(move || commit(log, vec![i]).unwrap())
                })
                .collect();
            wait_until(&log, |i| i.staged.len() == 7);
            drop(wal);
            assert_eq!(first.join().unwrap(), 1);
            let mut lsns: Vec<u64> = others.into_iter().map(|h| h.join().unwrap()).collect();
            lsns.sort();
            assert_eq!(lsns, (2..=8).collect::<Vec<_>>());
        });
        // Two flushes: the first writer's, then one for the seven.
        assert_eq!(log.inner.lock().unwrap().state.durable, [1, 8]);
    }

    fn wait_until(log: &GroupLog<Seen>, cond: impl Fn(&Inner<Seen>) -> bool) {
        while !cond(&log.inner.lock().unwrap()) {
            std::thread::yield_now();
        }
    }

    #[test]
    fn oversized_records_are_refused_before_staging() {
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path());
        let e = commit(&log, vec![0; MAX_RECORD_BYTES + 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("over the limit"), "{e}");
        assert!(log.inner.lock().unwrap().state.staged.is_empty());
        assert_eq!(commit(&log, b"next".to_vec()).unwrap(), 1);
    }

    #[test]
    fn a_failed_flush_fails_every_waiter_of_its_group() {
        full_disk::run(
            "commit::tests::a_failed_flush_fails_every_waiter_of_its_group",
            flush_past_the_file_size_limit,
            |dir| {
                // Only what was acknowledged is in the log: nothing of the failed group.
                let (_, replay) = Wal::open(dir, 0).unwrap();
                assert_eq!(
                    replay.records,
                    [
                        (1, b"before".to_vec()),
                        (2, b"leader".to_vec()),
                        (3, b"after".to_vec())
                    ]
                );
            },
        );
    }

    fn flush_past_the_file_size_limit(dir: &Path) {
        let log = open(dir);
        assert_eq!(commit(&log, b"before".to_vec()).unwrap(), 1);
        let results = std::thread::scope(|s| {
            // One group of four, one of whose records does not fit under the limit.
            let wal = log.wal.lock().unwrap();
            let leader = s.spawn(|| commit(&log, b"leader".to_vec()));
            wait_until(&log, |i| i.flushing);
            let group: Vec<_> = (0..4usize)
                .map(|i| {
                    let log = &log;
                    let size = if i == 2 {
                        2 * full_disk::FILE_LIMIT as usize
                    } else {
                        8
                    };
                    s.spawn(move || commit(log, vec![7; size]))
                })
                .collect();
            wait_until(&log, |i| i.staged.len() == 4);
            drop(wal);
            // The leader's own flush (one small record) succeeds.
            assert_eq!(leader.join().unwrap().unwrap(), 2);
            group
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        for r in &results {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(
                e.contains("group failed") && e.contains("File too large"),
                "{e}"
            );
        }
        let seen = log.inner.lock().unwrap();
        assert_eq!(seen.state.discarded, [2]);
        assert_eq!(seen.state.staged, [1, 2]);
        assert!(seen.failed.is_empty(), "every waiter took its failure");
        drop(seen);
        // The log goes on after the failure, numbering after what is durable.
        assert_eq!(commit(&log, b"after".to_vec()).unwrap(), 3);
    }
}
