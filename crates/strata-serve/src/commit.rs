//! Group commit over the write-ahead log.
//!
//! Each mutation used to pay its own `fdatasync` under the graph's writer lock, so one graph
//! took about as many mutations a second as the disk takes syncs. Here a writer *stages* its
//! record (assigns the next lsn, keeps the bytes in memory) under a short lock and gets a
//! [`Commit`] to wait on. The log's flusher thread takes every staged record, writes them with
//! one write and one `fdatasync` (outside the lock, so others go on staging), and then resolves
//! each record's `Commit`. Records staged during that flush form the next group. A record is
//! acknowledged only after a flush that covers it returned: an acknowledgement still means on
//! disk.
//!
//! Waiting costs the writer nothing but the wait: an async caller awaits
//! [`Commit::durable`] without holding a thread, and a group's writers are woken one by one
//! (one wake each), not all at once on a shared condition variable. (The first version ran
//! every mutation on a blocking thread that then slept on a condvar with all the others; the
//! hand-offs and the stampede of wake-ups after each flush cost more CPU than the mutation.)
//!
//! Beside the log, the caller keeps writer-side state `S` (for a served graph: the mutations
//! staged but not yet durable, and what they lead to, which the next mutation is checked
//! against). [`Staging`] keeps it in step: `durable` is called, in lsn order and before any
//! record of the group is acknowledged, with the last lsn a flush made durable; `discarded`
//! when a flush failed, which fails every record of that group and every record staged behind
//! it (they were checked against a state that included the lost records).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::error::{Result, ServeError};
use crate::wal::{Wal, MAX_RECORD_BYTES};

/// How the writer-side state follows the log (see the module documentation).
pub trait Staging<S>: Send + Sync + 'static {
    /// Records through lsn `through` are on disk. Called by the flusher, under the log's
    /// lock, once per flushed group and in lsn order.
    fn durable(&self, state: &mut S, through: u64);
    /// Every staged record after lsn `durable` was discarded (a flush failed). Called under the
    /// log's lock, before anything else is staged.
    fn discarded(&self, state: &mut S, durable: u64);
}

/// A write-ahead log shared by concurrent writers, flushed in groups by its own thread.
pub struct GroupLog<S: Send + 'static> {
    shared: Arc<Shared<S>>,
    flusher: Option<JoinHandle<()>>,
}

struct Shared<S> {
    inner: Mutex<Inner<S>>,
    /// Locked by the flusher for its flush, and by [`GroupLog::with_wal`].
    wal: Mutex<Wal>,
    /// Wakes the flusher: records were staged while it slept, a pause ended, or the log closes.
    work: Condvar,
    /// Signalled after a flush when [`GroupLog::with_wal`] waits for it.
    flushed: Condvar,
    hooks: Box<dyn Staging<S>>,
}

struct Inner<S> {
    state: S,
    /// Records staged and not yet taken by a flush, in lsn order.
    staged: Vec<Record>,
    /// The lsn the next staged record gets.
    next_lsn: u64,
    /// The flusher has taken a group and not yet resolved it.
    flushing: bool,
    /// The flusher sleeps on `work` (so a writer staging a record must wake it).
    asleep: bool,
    /// Callers of [`GroupLog::with_wal`] waiting or running: no flush starts meanwhile.
    paused: usize,
    /// The log is being dropped: the flusher flushes what is staged and stops.
    closing: bool,
}

/// A staged record and the writer waiting for it.
struct Record {
    payload: Vec<u8>,
    ack: oneshot::Sender<std::result::Result<(), Failure>>,
}

/// A failed flush, as each of its waiters reports it.
#[derive(Clone, Debug)]
struct Failure {
    kind: std::io::ErrorKind,
    message: Arc<str>,
}

/// A staged record: its lsn, what the caller's `stage` returned, and the flush to wait for.
#[must_use = "a staged record is not acknowledged until its flush is waited for"]
pub struct Commit<R> {
    lsn: u64,
    value: R,
    ack: oneshot::Receiver<std::result::Result<(), Failure>>,
}

impl<R> Commit<R> {
    /// Waits (asynchronously, holding no thread) until the record is on disk; returns its lsn
    /// and the staged value. Errors: the flush's (for every record of its group).
    pub async fn durable(self) -> Result<(u64, R)> {
        let outcome = self.ack.await;
        resolve(outcome).map(|()| (self.lsn, self.value))
    }

    /// [`Commit::durable`] for a thread outside the async runtime: blocks it until then.
    pub fn wait(self) -> Result<(u64, R)> {
        let outcome = self.ack.blocking_recv();
        resolve(outcome).map(|()| (self.lsn, self.value))
    }
}

fn resolve(
    outcome: std::result::Result<std::result::Result<(), Failure>, oneshot::error::RecvError>,
) -> Result<()> {
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(f)) => Err(ServeError::io(
            "the log flush of this mutation's group failed, and nothing of the group was acknowledged",
            std::io::Error::new(f.kind, f.message.to_string()),
        )),
        // The flusher resolves every record before it stops; only a panic drops one.
        Err(_) => Err(ServeError::Unavailable(
            "the write-ahead log's flusher stopped before this mutation was on disk".into(),
        )),
    }
}

impl<S: Send + 'static> GroupLog<S> {
    /// Group commit over `wal`, with writer-side state `state` kept in step by `hooks`; starts
    /// the flusher thread.
    pub fn new(wal: Wal, state: S, hooks: impl Staging<S>) -> GroupLog<S> {
        let next_lsn = wal.last_lsn() + 1;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                state,
                staged: Vec::new(),
                next_lsn,
                flushing: false,
                asleep: false,
                paused: 0,
                closing: false,
            }),
            wal: Mutex::new(wal),
            work: Condvar::new(),
            flushed: Condvar::new(),
            hooks: Box::new(hooks),
        });
        let flusher = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("strata-wal-flush".into())
                .spawn(move || shared.run())
                .expect("starting the write-ahead log's flusher thread")
        };
        GroupLog {
            shared,
            flusher: Some(flusher),
        }
    }

    /// Stages one record; the returned [`Commit`] resolves once it is on disk.
    ///
    /// Under the log's lock, `prepare` checks the change against the state and returns the
    /// record's bytes (it must not change the state); a record over [`MAX_RECORD_BYTES`] is
    /// then refused; otherwise `stage` records it in the state with its lsn. Errors:
    /// `prepare`'s and the size limit (nothing is staged then).
    pub fn stage<T, R>(
        &self,
        prepare: impl FnOnce(&S) -> Result<(Vec<u8>, T)>,
        stage: impl FnOnce(&mut S, u64, T) -> R,
    ) -> Result<Commit<R>> {
        let mut inner = self.shared.inner.lock().unwrap();
        let (payload, prepared) = prepare(&inner.state)?;
        if payload.len() > MAX_RECORD_BYTES {
            return Err(ServeError::ResourceExhausted(format!(
                "a write-ahead log record of {} bytes is over the limit of {MAX_RECORD_BYTES} bytes",
                payload.len()
            )));
        }
        let lsn = inner.next_lsn;
        let value = stage(&mut inner.state, lsn, prepared);
        let (ack, waiter) = oneshot::channel();
        inner.staged.push(Record { payload, ack });
        inner.next_lsn += 1;
        self.shared.wake_if_due(&mut inner);
        Ok(Commit {
            lsn,
            value,
            ack: waiter,
        })
    }

    /// Runs `f` on the log and the state with no flush under way and none starting (staged
    /// records wait; they follow whatever `f` does, e.g. into a new segment after a rotation).
    pub fn with_wal<R>(&self, f: impl FnOnce(&mut Wal, &mut S) -> R) -> R {
        let shared = &*self.shared;
        let mut inner = shared.inner.lock().unwrap();
        inner.paused += 1;
        while inner.flushing {
            inner = shared.flushed.wait(inner).unwrap();
        }
        let r = f(&mut shared.wal.lock().unwrap(), &mut inner.state);
        inner.paused -= 1;
        shared.wake_if_due(&mut inner);
        r
    }
}

impl<S: Send + 'static> Shared<S> {
    /// Wakes a sleeping flusher when there is work it may start.
    fn wake_if_due(&self, inner: &mut MutexGuard<'_, Inner<S>>) {
        if inner.asleep && inner.paused == 0 && (!inner.staged.is_empty() || inner.closing) {
            inner.asleep = false;
            self.work.notify_one();
        }
    }

    /// The flusher: flushes each group of staged records, resolves its writers, and stops once
    /// the log closes with nothing staged.
    fn run(&self) {
        let mut inner = self.inner.lock().unwrap();
        loop {
            if inner.staged.is_empty() || inner.paused > 0 {
                if inner.closing && inner.staged.is_empty() {
                    return;
                }
                inner.asleep = true;
                while inner.asleep {
                    inner = self.work.wait(inner).unwrap();
                }
                continue;
            }
            let group = std::mem::take(&mut inner.staged);
            inner.flushing = true;
            drop(inner);
            let (written, durable) = {
                let mut wal = self.wal.lock().unwrap();
                let refs: Vec<&[u8]> = group.iter().map(|r| r.payload.as_slice()).collect();
                let written = wal.append(&refs);
                (written, wal.last_lsn())
            };
            inner = self.inner.lock().unwrap();
            let mut failed = Vec::new();
            let outcome = match written {
                Ok(through) => {
                    self.hooks.durable(&mut inner.state, through);
                    Ok(())
                }
                Err(e) => {
                    // The records staged behind the group were checked against a state holding
                    // the lost ones: they fail too, and numbering resumes after the durable log.
                    failed = std::mem::take(&mut inner.staged);
                    inner.next_lsn = durable + 1;
                    self.hooks.discarded(&mut inner.state, durable);
                    Err(Failure {
                        kind: match &e {
                            ServeError::Io { source, .. } => source.kind(),
                            _ => std::io::ErrorKind::Other,
                        },
                        message: e.to_string().into(),
                    })
                }
            };
            inner.flushing = false;
            if inner.paused > 0 {
                self.flushed.notify_all();
            }
            // Acknowledge outside the lock, so writers go on staging meanwhile. A writer that
            // went away (its request cancelled) no longer listens; its record stays durable.
            drop(inner);
            for r in group.into_iter().chain(failed) {
                let _ = r.ack.send(outcome.clone());
            }
            inner = self.inner.lock().unwrap();
        }
    }
}

impl<S: Send + 'static> Drop for GroupLog<S> {
    /// Flushes what is staged and stops the flusher.
    fn drop(&mut self) {
        {
            let mut inner = self.shared.inner.lock().unwrap();
            inner.closing = true;
            self.shared.wake_if_due(&mut inner);
        }
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
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
        log.stage(|_| Ok((payload, ())), |s, lsn, ()| s.staged.push(lsn))?
            .wait()
            .map(|(lsn, ())| lsn)
    }

    fn open(dir: &Path) -> GroupLog<Seen> {
        let (wal, _) = Wal::open(dir, 0).unwrap();
        GroupLog::new(wal, Seen::default(), Hooks)
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
        let seen = log.shared.inner.lock().unwrap();
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
            let wal = log.shared.wal.lock().unwrap();
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
        assert_eq!(log.shared.inner.lock().unwrap().state.durable, [1, 8]);
    }

    #[test]
    fn async_writers_share_a_flush_on_one_thread() {
        // 64 writers on one runtime thread: each waits for its record without a thread of
        // its own, and all that staged while the disk was busy are flushed together.
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let wal = log.shared.wal.lock().unwrap();
        let stage = |i: u8| {
            log.stage(|_| Ok((vec![i], ())), |s, lsn, ()| s.staged.push(lsn))
                .unwrap()
        };
        let first = stage(0);
        wait_until(&log, |i| i.flushing);
        let rest: Vec<_> = (1..64).map(stage).collect();
        let lsns = runtime.block_on(async {
            let waiting: Vec<_> = std::iter::once(first)
                .chain(rest)
                .map(|c| tokio::spawn(c.durable()))
                .collect();
            drop(wal);
            let mut lsns = Vec::new();
            for w in waiting {
                lsns.push(w.await.unwrap().unwrap().0);
            }
            lsns
        });
        assert_eq!(lsns, (1..=64).collect::<Vec<_>>());
        assert_eq!(log.shared.inner.lock().unwrap().state.durable, [1, 64]);
    }

    #[test]
    fn no_flush_starts_while_the_log_is_lent_out() {
        // A fold rotates the log between flushes: `with_wal` waits for the flush under way,
        // and records staged meanwhile wait for it rather than start the next flush.
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path());
        std::thread::scope(|s| {
            let wal = log.shared.wal.lock().unwrap();
            let first = s.spawn(|| commit(&log, b"first".to_vec()).unwrap());
            wait_until(&log, |i| i.flushing);
            let lent = s.spawn(|| log.with_wal(|wal, _| wal.last_lsn()));
            wait_until(&log, |i| i.paused == 1);
            let second = s.spawn(|| commit(&log, b"second".to_vec()).unwrap());
            wait_until(&log, |i| i.staged.len() == 1);
            drop(wal);
            assert_eq!(lent.join().unwrap(), 1, "only the first record was flushed");
            assert_eq!((first.join().unwrap(), second.join().unwrap()), (1, 2));
        });
        assert_eq!(log.shared.inner.lock().unwrap().state.durable, [1, 2]);
    }

    #[test]
    fn dropping_the_log_flushes_what_is_staged() {
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path());
        let shared = Arc::clone(&log.shared);
        let wal = shared.wal.lock().unwrap();
        let stage = |i: u8| {
            log.stage(|_| Ok((vec![i], ())), |s, lsn, ()| s.staged.push(lsn))
                .unwrap()
        };
        let first = stage(0);
        wait_until(&log, |i| i.flushing);
        let commits: Vec<_> = std::iter::once(first).chain([stage(1), stage(2)]).collect();
        // The log closes with two records staged behind the flush under way.
        let dropping = std::thread::spawn(move || drop(log));
        while !shared.inner.lock().unwrap().closing {
            std::thread::yield_now();
        }
        drop(wal);
        dropping.join().unwrap();
        let lsns: Vec<u64> = commits.into_iter().map(|c| c.wait().unwrap().0).collect();
        assert_eq!(lsns, [1, 2, 3]);
        assert_eq!(shared.inner.lock().unwrap().state.durable, [1, 3]);
        drop(shared);
        let (_, replay) = Wal::open(tmp.path(), 0).unwrap();
        assert_eq!(replay.records, [(1, vec![0]), (2, vec![1]), (3, vec![2])]);
    }

    fn wait_until(log: &GroupLog<Seen>, cond: impl Fn(&Inner<Seen>) -> bool) {
        while !cond(&log.shared.inner.lock().unwrap()) {
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
        assert!(log.shared.inner.lock().unwrap().state.staged.is_empty());
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
            let wal = log.shared.wal.lock().unwrap();
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
        let seen = log.shared.inner.lock().unwrap();
        assert_eq!(seen.state.discarded, [2]);
        assert_eq!(seen.state.staged, [1, 2]);
        drop(seen);
        // The log goes on after the failure, numbering after what is durable.
        assert_eq!(commit(&log, b"after".to_vec()).unwrap(), 3);
    }
}
