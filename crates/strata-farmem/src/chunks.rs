//! The bookkeeping of a client's chunk requests, shared by both transports of its data
//! connections ([`crate::client`]'s `tcp` threads and [`crate::uring_client`]'s rings): request
//! ids, the in-flight queue, matching replies to requests, completing reads and writes, and
//! making the client dead on the first failure. The transports only move the bytes.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::error::{FarError, Result};
use crate::protocol::{self, op, status, Header, HEADER_LEN};

/// The outcome of one [`crate::FarRead`]: its tag, its buffer back, and the bytes read or the error.
#[derive(Debug)]
pub struct FarCompletion {
    /// The read's tag.
    pub tag: u64,
    /// The read's buffer; on success `buf[..len]` holds the data.
    pub buf: Vec<u8>,
    /// Bytes read (the read's `len`), or why it failed.
    pub result: Result<usize>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) chunks_read: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) read_latency_us_sum: AtomicU64,
    pub(crate) errors: AtomicU64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A raw pointer to one chunk's region of a caller's buffer.
///
/// For a read it points into the spare or initialised bytes of the [`crate::FarRead`]'s `Vec`, which
/// is owned by a [`ReadState`] until the read completes; chunks of one read cover disjoint
/// regions and exactly one receiver thread writes each region, before the chunk is accounted.
/// For a write it points into the caller's `&[u8]`, which [`crate::FarClient::write`] keeps borrowed
/// until every chunk has been both sent (sender thread done with it) and accounted.
#[derive(Clone, Copy)]
pub(crate) struct Region(pub(crate) *mut u8);

// SAFETY: see the type's documentation: the memory outlives every use, and each region has a
// single user at a time.
unsafe impl Send for Region {}

/// What a chunk belongs to.
pub(crate) enum Target {
    Read(Arc<ReadState>),
    Write(Arc<WriteState>),
}

/// One chunk request.
pub(crate) struct Job {
    pub(crate) op: u8,
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) region: Region,
    pub(crate) target: Target,
}

impl Job {
    /// Accounts the chunk (exactly once per job).
    pub(crate) fn finish(self, result: Result<usize>, shared: &Shared) {
        match self.target {
            Target::Read(state) => state.chunk_done(result, shared),
            Target::Write(state) => state.release(result.map(|_| ())),
        }
    }

    /// Fails the chunk while the kernel may still write into its region (a receive that could
    /// not be confirmed finished): a read's buffer is leaked instead of handed back, so its
    /// completion carries an empty buffer. Last resort of [`crate::uring_client`]'s shutdown.
    pub(crate) fn abandon(self, shared: &Shared) {
        if let Target::Read(state) = &self.target {
            std::mem::forget(lock(&state.buf).take());
        }
        self.finish(Err(shared.unavailable()), shared);
    }

    /// The reference a write chunk holds on its caller's bytes while they are being sent.
    pub(crate) fn send_ref(&self) -> Option<Arc<WriteState>> {
        match &self.target {
            Target::Write(w) => Some(w.clone()),
            Target::Read(_) => None,
        }
    }
}

/// Shared state of one submitted [`crate::FarRead`].
pub(crate) struct ReadState {
    pub(crate) tag: u64,
    pub(crate) len: usize,
    /// Chunks not yet accounted.
    pub(crate) remaining: AtomicUsize,
    /// The read's buffer; taken out when the read completes.
    pub(crate) buf: Mutex<Option<Vec<u8>>>,
    pub(crate) error: Mutex<Option<FarError>>,
    pub(crate) sink: Sender<FarCompletion>,
    pub(crate) submitted: Instant,
}

impl ReadState {
    pub(crate) fn chunk_done(&self, result: Result<usize>, shared: &Shared) {
        if let Err(e) = result {
            lock(&self.error).get_or_insert(e);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.complete(shared);
        }
    }

    pub(crate) fn complete(&self, shared: &Shared) {
        let mut buf = lock(&self.buf).take().unwrap_or_default();
        let result = match lock(&self.error).take() {
            None => {
                if buf.len() < self.len {
                    // SAFETY: capacity >= len was ensured at submit, and every chunk of
                    // buf[..len] was written by a receiver before being accounted (the AcqRel
                    // counter orders those writes before this point).
                    unsafe { buf.set_len(self.len) };
                }
                let us = self.submitted.elapsed().as_micros() as u64;
                shared.stats.reads.fetch_add(1, Ordering::Relaxed);
                shared
                    .stats
                    .read_latency_us_sum
                    .fetch_add(us, Ordering::Relaxed);
                Ok(self.len)
            }
            Some(e) => {
                shared.stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        };
        let _ = self.sink.send(FarCompletion {
            tag: self.tag,
            buf,
            result,
        });
    }
}

/// Shared state of one [`crate::FarClient::write`] call: each chunk holds two references, one released
/// when its acknowledgement (or failure) is accounted, one when the sender thread no longer
/// touches its bytes.
pub(crate) struct WriteState {
    pub(crate) state: Mutex<(usize, Option<FarError>)>,
    pub(crate) done: Condvar,
}

impl WriteState {
    pub(crate) fn release(&self, result: Result<()>) {
        let mut g = lock(&self.state);
        if let Err(e) = result {
            g.1.get_or_insert(e);
        }
        g.0 -= 1;
        if g.0 == 0 {
            self.done.notify_all();
        }
    }

    pub(crate) fn wait(&self) -> Result<()> {
        let mut g = lock(&self.state);
        while g.0 > 0 {
            g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        match g.1.take() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// A chunk request on the wire, waiting for its reply.
pub(crate) struct Pending {
    pub(crate) id: u64,
    pub(crate) job: Job,
    pub(crate) sent_at: Instant,
}

pub(crate) struct ConnState {
    pub(crate) inflight: VecDeque<Pending>,
    pub(crate) closed: bool,
    pub(crate) next_id: u64,
}

/// One data connection's shared state.
pub(crate) struct DataConn {
    pub(crate) index: usize,
    pub(crate) stream: TcpStream,
    pub(crate) depth: usize,
    pub(crate) state: Mutex<ConnState>,
    pub(crate) space: Condvar,
}

/// A chunk request ready to go on the wire.
pub(crate) struct Outgoing {
    /// The encoded request header.
    pub(crate) header: [u8; HEADER_LEN],
    /// A write's payload: the chunk's bytes and the reference to release once they are sent.
    pub(crate) body: Option<(Region, usize, Arc<WriteState>)>,
}

/// What the receiving side does after a reply header.
pub(crate) enum Reply {
    /// A READ's payload follows: receive `job.len` bytes into `job.region`, then
    /// [`DataConn::payload_received`].
    Payload(Job),
    /// An error reply's message of `h.payload_len` bytes follows: receive it, then
    /// [`DataConn::error_received`].
    Message(Job, Header),
    /// Nothing follows (a WRITE acknowledgement, already accounted).
    Done,
}

impl DataConn {
    /// True when fewer than `depth` requests are in flight and the connection is open.
    pub(crate) fn has_room(&self, st: &ConnState) -> bool {
        !st.closed && st.inflight.len() < self.depth
    }

    /// Puts `job` in flight under a fresh request id; the job comes back when the connection is
    /// closed (fail it with [`DataConn::reject`]).
    pub(crate) fn register(
        &self,
        st: &mut ConnState,
        job: Job,
    ) -> std::result::Result<Outgoing, Job> {
        if st.closed {
            return Err(job);
        }
        let id = st.next_id;
        st.next_id += 1;
        let mut h = Header::request(job.op, id, job.segment, job.offset, job.len as u64);
        let body = job.send_ref().map(|w| {
            h.payload_len = job.len as u64;
            (job.region, job.len, w)
        });
        st.inflight.push_back(Pending {
            id,
            job,
            sent_at: Instant::now(),
        });
        Ok(Outgoing {
            header: h.encode(),
            body,
        })
    }

    /// Fails a job that could not be sent (the client is dead).
    pub(crate) fn reject(shared: &Shared, job: Job) {
        let send_ref = job.send_ref();
        job.finish(Err(shared.unavailable()), shared);
        if let Some(w) = send_ref {
            w.release(Ok(()));
        }
    }

    /// When the oldest request in flight was sent.
    pub(crate) fn oldest_sent(&self) -> Option<Instant> {
        lock(&self.state).inflight.front().map(|p| p.sent_at)
    }

    /// Matches a reply header with the oldest request in flight and checks it. `Err` means the
    /// client was made dead (the reason is recorded) and the connection's loop should end.
    pub(crate) fn reply(&self, shared: &Shared, h: &Header) -> std::result::Result<Reply, ()> {
        let pending = {
            let mut st = lock(&self.state);
            match st.inflight.front() {
                Some(p) if p.id == h.id => {
                    let p = st.inflight.pop_front();
                    self.space.notify_one();
                    p
                }
                _ => None,
            }
        };
        let Some(pending) = pending else {
            shared.fail(format!(
                "data connection {}: unexpected reply {} #{} (protocol error)",
                self.index,
                op::name(h.op),
                h.id
            ));
            return Err(());
        };
        let job = pending.job;
        if h.status != status::OK {
            if h.payload_len > protocol::MAX_ERROR_PAYLOAD {
                shared.fail(format!(
                    "data connection {}: oversized error reply",
                    self.index
                ));
                job.finish(Err(shared.unavailable()), shared);
                return Err(());
            }
            return Ok(Reply::Message(job, *h));
        }
        let expected_payload = if job.op == op::READ {
            job.len as u64
        } else {
            0
        };
        if h.op != job.op | op::REPLY
            || h.segment != job.segment
            || h.offset != job.offset
            || h.length != job.len as u64
            || h.payload_len != expected_payload
        {
            shared.fail(format!(
                "data connection {}: reply {} #{} does not match its request",
                self.index,
                op::name(h.op),
                h.id
            ));
            job.finish(Err(shared.unavailable()), shared);
            return Err(());
        }
        if job.op == op::READ {
            return Ok(Reply::Payload(job));
        }
        let len = job.len;
        job.finish(Ok(len), shared);
        Ok(Reply::Done)
    }

    /// Accounts a READ chunk whose payload has landed in its region.
    pub(crate) fn payload_received(shared: &Shared, job: Job) {
        shared
            .stats
            .bytes_read
            .fetch_add(job.len as u64, Ordering::Relaxed);
        shared.stats.chunks_read.fetch_add(1, Ordering::Relaxed);
        let len = job.len;
        job.finish(Ok(len), shared);
    }

    /// Fails the job of an error reply with its message. `Err` when the error was a PROTOCOL
    /// error: the client was made dead and the connection's loop should end.
    pub(crate) fn error_received(
        &self,
        shared: &Shared,
        job: Job,
        h: &Header,
        msg: &[u8],
    ) -> std::result::Result<(), ()> {
        job.finish(Err(protocol::reply_error(h, msg)), shared);
        if h.status == status::PROTOCOL {
            shared.fail(format!(
                "data connection {}: the server reported a protocol error: {}",
                self.index,
                String::from_utf8_lossy(msg)
            ));
            return Err(());
        }
        Ok(())
    }
}

pub(crate) struct Shared {
    pub(crate) dead: AtomicBool,
    pub(crate) reason: Mutex<Option<String>>,
    pub(crate) conns: Vec<Arc<DataConn>>,
    pub(crate) control_stream: TcpStream,
    pub(crate) io_timeout: Duration,
    pub(crate) stats: Counters,
}

impl Shared {
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(crate) fn unavailable(&self) -> FarError {
        let reason = lock(&self.reason).clone();
        FarError::Unavailable(reason.unwrap_or_else(|| "far memory client is closed".into()))
    }

    /// Makes the client dead: records the first reason, fails every chunk in flight, wakes the
    /// senders and closes every connection.
    pub(crate) fn fail(&self, reason: String) {
        {
            let mut r = lock(&self.reason);
            if r.is_none() {
                *r = Some(reason);
            }
        }
        self.dead.store(true, Ordering::Release);
        for conn in &self.conns {
            let drained: Vec<Pending> = {
                let mut st = lock(&conn.state);
                st.closed = true;
                st.inflight.drain(..).collect()
            };
            conn.space.notify_all();
            for p in drained {
                p.job.finish(Err(self.unavailable()), self);
            }
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        let _ = self.control_stream.shutdown(Shutdown::Both);
    }
}
