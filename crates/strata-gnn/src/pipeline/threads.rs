//! Pipelined mode (`pipeline = true`): each stage on its own thread(s), connected by bounded
//! channels; sampled batches and merged reads are put back in order where several threads work
//! at once. Dropping the loader, or an error reaching the caller, closes the stop channel,
//! which wakes every blocked stage, and joins the threads; the batches they held go with them
//! and release their window pins.

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, select, unbounded, Receiver, Sender, TryRecvError};

use crate::error::Result;

use super::batch::{Batch, LoaderConfig};
use super::stages::{
    sample_batch, submit_merged, Assembler, Front, FrontConfig, ReadDone, SampleSource, Sampled,
    Stages, Submitted, Work,
};

/// A sampling worker's answer: the batch, or the payload of a panic to re-raise.
type SampleMsg = (usize, std::thread::Result<Result<Sampled>>);
/// An I/O worker's answer for read `seq`.
type DoneMsg = (u64, std::thread::Result<Result<ReadDone>>);

/// Receives from `rx` unless the loader stops first (`None` then, or when `rx` is closed).
fn recv_or_stop<T>(rx: &Receiver<T>, stop: &Receiver<()>) -> Option<T> {
    select! {
        recv(rx) -> m => m.ok(),
        recv(stop) -> _ => None,
    }
}

/// Sends on `tx` unless the loader stops first; false when it did (or `tx` is closed).
fn send_or_stop<T>(tx: &Sender<T>, item: T, stop: &Receiver<()>) -> bool {
    select! {
        send(tx, item) -> r => r.is_ok(),
        recv(stop) -> _ => false,
    }
}

fn stopped(stop: &Receiver<()>) -> bool {
    matches!(stop.try_recv(), Err(TryRecvError::Disconnected))
}

/// Batches from the sampling workers, put back in order. It asks for at most
/// `max_outstanding` batches beyond the next one expected, which bounds the reorder buffer.
struct FeedSource {
    jobs: Sender<usize>,
    results: Receiver<SampleMsg>,
    stop: Receiver<()>,
    reorder: BTreeMap<usize, Result<Sampled>>,
    next_issue: usize,
    next_expected: usize,
    max_outstanding: usize,
    num_batches: usize,
}

impl SampleSource for FeedSource {
    fn next_sampled(&mut self) -> Option<Result<Sampled>> {
        if self.next_expected == self.num_batches {
            return None;
        }
        while self.next_issue < self.num_batches
            && self.next_issue - self.next_expected < self.max_outstanding
        {
            // Unbounded, never blocks; fails only when every worker is gone.
            self.jobs.send(self.next_issue).ok()?;
            self.next_issue += 1;
        }
        loop {
            if let Some(r) = self.reorder.remove(&self.next_expected) {
                self.next_expected += 1;
                return Some(r);
            }
            let (b, r) = recv_or_stop(&self.results, &self.stop)?;
            match r {
                Ok(r) => {
                    self.reorder.insert(b, r);
                }
                // A bug in the sampler: re-raise here, which tears the pipeline down and
                // reaches the caller through the join.
                Err(payload) => panic::resume_unwind(payload),
            }
        }
    }

    fn cancelled(&self) -> bool {
        stopped(&self.stop)
    }
}

/// The stage threads and the channel the batches come out of.
pub(super) struct Threads {
    out: Option<Receiver<Result<Batch>>>,
    /// Never sent on: dropping it closes the channel, which wakes every blocked stage.
    stop: Option<Sender<()>>,
    handles: Vec<JoinHandle<()>>,
}

impl Threads {
    pub(super) fn spawn(st: Stages, fcfg: FrontConfig, cfg: &LoaderConfig) -> Threads {
        let (stop_tx, stop) = bounded::<()>(0);
        // The front bounds what is outstanding on these two, so they need no bound of their
        // own (and a worker never blocks on a send).
        let (jobs_tx, jobs_rx) = unbounded::<usize>();
        let (samples_tx, samples_rx) = unbounded::<SampleMsg>();
        let (work_tx, work_rx) = bounded::<(u64, Work)>(cfg.io_threads);
        // Bounded by the tickets: at most `io_threads + 1` reads issued and not yet assembled,
        // the one more being the read an I/O thread submits while it completes another.
        let tickets = cfg.io_threads + 1;
        let (done_tx, done_rx) = unbounded::<DoneMsg>();
        let (ticket_tx, ticket_rx) = bounded::<()>(tickets);
        for _ in 0..tickets {
            ticket_tx.send(()).expect("room for every ticket");
        }
        let (out_tx, out_rx) = bounded::<Result<Batch>>(1);
        let mut handles = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .expect("spawn a GNN pipeline thread")
        };

        for w in 0..cfg.sampler_threads {
            let (st, jobs, tx, stop) = (
                st.clone(),
                jobs_rx.clone(),
                samples_tx.clone(),
                stop.clone(),
            );
            handles.push(spawn(
                format!("strata-gnn-sample-{w}"),
                Box::new(move || {
                    while let Some(b) = recv_or_stop(&jobs, &stop) {
                        let r = panic::catch_unwind(AssertUnwindSafe(|| sample_batch(&st, b)));
                        let panicked = r.is_err();
                        if tx.send((b, r)).is_err() || panicked {
                            return;
                        }
                    }
                }),
            ));
        }
        drop((jobs_rx, samples_tx));

        {
            let source = FeedSource {
                jobs: jobs_tx,
                results: samples_rx,
                stop: stop.clone(),
                reorder: BTreeMap::new(),
                next_issue: 0,
                next_expected: 0,
                max_outstanding: 2 * cfg.sampler_threads,
                num_batches: st.plan.num_batches,
            };
            let mut front = Front::new(source, &st, fcfg);
            let stop = stop.clone();
            handles.push(spawn(
                "strata-gnn-window".into(),
                Box::new(move || {
                    let mut seq = 0u64;
                    while let Some(work) = front.next_work() {
                        // A read is issued only while at most `io_threads` are being read or
                        // waiting for assembly: this bounds the batches alive.
                        if recv_or_stop(&ticket_rx, &stop).is_none()
                            || !send_or_stop(&work_tx, (seq, work), &stop)
                        {
                            return;
                        }
                        seq += 1;
                    }
                }),
            ));
        }

        for w in 0..cfg.io_threads {
            let (st, rx, tx, stop) = (st.clone(), work_rx.clone(), done_tx.clone(), stop.clone());
            handles.push(spawn(
                format!("strata-gnn-io-{w}"),
                Box::new(move || {
                    let submit = |work: Work| match work {
                        Work::Read(merged) => submit_merged(&st, merged),
                        Work::Fail(e) => Err(e),
                    };
                    while let Some((seq, work)) = recv_or_stop(&rx, &stop) {
                        // The read to complete next. While one completes, the next one
                        // available is submitted here, taken without waiting (so an I/O thread
                        // never waits for work while it holds a read): its requests keep the
                        // device busy while the current read's last requests finish and its
                        // batches are assembled.
                        let mut next: Option<(u64, Result<Submitted<'_>>)> =
                            match panic::catch_unwind(AssertUnwindSafe(|| submit(work))) {
                                Ok(r) => Some((seq, r)),
                                Err(payload) => {
                                    let _ = tx.send((seq, Err(payload)));
                                    return;
                                }
                            };
                        while let Some((seq, read)) = next.take() {
                            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                                read?.complete(&st, || {
                                    if next.is_none() {
                                        if let Ok((s, w)) = rx.try_recv() {
                                            next = Some((s, submit(w)));
                                        }
                                    }
                                })
                            }));
                            let panicked = r.is_err();
                            if tx.send((seq, r)).is_err() || panicked || stopped(&stop) {
                                return;
                            }
                        }
                    }
                }),
            ));
        }
        drop((work_rx, done_tx));

        {
            let mut assembler = Assembler::new(&st);
            let stop = stop.clone();
            handles.push(spawn(
                "strata-gnn-assemble".into(),
                Box::new(move || {
                    // Reads finish in any order when several are in flight; batches leave in
                    // order.
                    let mut reorder: BTreeMap<u64, Result<ReadDone>> = BTreeMap::new();
                    let mut next = 0u64;
                    while let Some((seq, r)) = recv_or_stop(&done_rx, &stop) {
                        match r {
                            Ok(r) => {
                                reorder.insert(seq, r);
                            }
                            Err(payload) => panic::resume_unwind(payload),
                        }
                        while let Some(r) = reorder.remove(&next) {
                            next += 1;
                            match r {
                                Ok(mut done) => {
                                    while let Some(b) = assembler.next_batch(&mut done) {
                                        if done.is_finished() {
                                            // The read's rows are freed with its last batch:
                                            // its slot is free; never blocks (one ticket per
                                            // slot).
                                            let _ = ticket_tx.try_send(());
                                        }
                                        if !send_or_stop(&out_tx, Ok(b), &stop) {
                                            return;
                                        }
                                    }
                                }
                                Err(e) => {
                                    send_or_stop(&out_tx, Err(e), &stop);
                                    return;
                                }
                            }
                        }
                    }
                }),
            ));
        }

        Threads {
            out: Some(out_rx),
            stop: Some(stop_tx),
            handles,
        }
    }

    pub(super) fn next(&mut self) -> Option<Result<Batch>> {
        let out = self.out.as_ref()?;
        match out.recv() {
            Ok(Ok(b)) => Some(Ok(b)),
            Ok(Err(e)) => {
                self.shutdown();
                Some(Err(e))
            }
            // The assembler finished (every batch out) or a stage panicked.
            Err(_) => {
                if let Some(payload) = self.shutdown() {
                    panic::resume_unwind(payload);
                }
                None
            }
        }
    }

    /// Stops every stage and joins the threads; returns the first panic among them.
    fn shutdown(&mut self) -> Option<Box<dyn Any + Send>> {
        self.stop.take();
        self.out.take();
        let mut first = None;
        for h in self.handles.drain(..) {
            if let Err(p) = h.join() {
                first.get_or_insert(p);
            }
        }
        first
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        // A panic nobody asked about stays unreported rather than aborting in a destructor.
        self.shutdown();
    }
}
