//! The client's `uring` data path: one thread and one io_uring per data connection, in place of
//! the `tcp` path's sender and receiver threads. The bookkeeping (ids, in-flight queue, reply
//! matching, completions, failure) is [`crate::chunks`]'s; this module only moves the bytes.
//!
//! How the bytes land: replies come back in request order, so when a READ reply's header has
//! arrived its destination (the chunk's region of the caller's [`crate::FarRead`] buffer) is
//! known, and the payload is received straight into it with one `IORING_OP_RECV`: one
//! kernel-to-user copy, the least TCP allows. A multishot receive into a provided-buffer ring
//! would land the stream in ring buffers first and cost a second copy into the destination;
//! registered (fixed) buffers do not apply to `IORING_OP_RECV`, and the destinations change
//! with every read, so registering them would cost more than it saves. What the ring saves is
//! system calls and thread hand-offs: a batch of request headers goes out in one `SENDMSG`, the
//! sends, the receives and the wake-up for new jobs complete through one `io_uring_enter`, and
//! one thread serves both directions of a connection.
//!
//! Failure: a receive of 0 bytes (the server closed), any error, or no progress for
//! `io_timeout` while requests are outstanding makes the client dead ([`Shared::fail`]), which
//! shuts the sockets down so that every operation still in the ring completes. The thread then
//! waits for those completions (bounded: [`DRAIN`], then a synchronous cancel) before the jobs
//! whose memory they use are failed, and fails every job still queued.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use io_uring::{opcode, types, IoUring};

use crate::chunks::{lock, DataConn, Job, Outgoing, Reply, Shared, WriteState};
use crate::error::{FarError, Result};
use crate::protocol::{Header, HEADER_LEN};
use crate::uring;

/// `user_data` of the connection's send.
const SEND: u64 = 1;
/// `user_data` of the connection's receive.
const RECV: u64 = 2;
/// `user_data` of the read on the wake-up eventfd.
const WAKE: u64 = 3;
/// Longest sleep in the ring before the overdue check runs again.
const TICK: Duration = Duration::from_millis(100);
/// Longest wait, once the client is dead, for the ring's operations to complete before they
/// are cancelled.
const DRAIN: Duration = Duration::from_secs(2);
/// Most request headers sent by one `SENDMSG`.
const HEADER_BATCH: usize = 16;

/// Wakes a data connection's ring thread when a job is queued while it sleeps: an eventfd the
/// thread keeps a read posted on, written only when the thread said it is about to sleep with
/// room for more requests (so a busy connection costs no extra system call per chunk).
pub(crate) struct Waker {
    fd: OwnedFd,
    armed: AtomicBool,
}

impl Waker {
    fn new() -> io::Result<Waker> {
        // Blocking on purpose: io_uring answers a read on a non-blocking fd with EAGAIN
        // instead of waiting for it. Writes never block (the counter stays far from its limit).
        // SAFETY: eventfd has no memory arguments; a non-negative result is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker {
            // SAFETY: `fd` was just created and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: AtomicBool::new(false),
        })
    }

    /// Called after a job was queued: wakes the thread if it is (about to be) asleep.
    pub(crate) fn wake(&self) {
        // Pairs with the fence in `ConnLoop::sleep`: either the thread sees the queued job, or
        // this sees `armed`.
        fence(Ordering::SeqCst);
        if self.armed.swap(false, Ordering::SeqCst) {
            self.kick();
        }
    }

    fn kick(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. A failure cannot happen short
        // of a closed descriptor, and the ring's deadline would cover a lost wake-up anyway.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
    }
}

/// A data connection's ring and waker, set up before connecting so that an unusable io_uring
/// is reported by `connect`.
pub(crate) struct ConnRing {
    ring: IoUring,
    waker: Arc<Waker>,
}

impl ConnRing {
    /// [`FarError::Unsupported`] when this process cannot use io_uring (the reason in words).
    pub(crate) fn new() -> Result<ConnRing> {
        let ring = uring::ring(8, &uring::CLIENT_OPS)?;
        let waker = Waker::new().map_err(|e| FarError::io("creating an eventfd", e))?;
        Ok(ConnRing {
            ring,
            waker: Arc::new(waker),
        })
    }

    /// The waker to call after queueing a job for this connection.
    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// Serves data connection `conn` over `stream` until the client is dead, then fails every
    /// job still queued on `jobs` until the client drops the queue.
    pub(crate) fn run(
        self,
        shared: &Shared,
        conn: &DataConn,
        jobs: Receiver<Job>,
        stream: TcpStream,
    ) {
        // Boxed: the kernel holds pointers into it (header buffer, iovecs) while operations are
        // in the ring, and a box can be leaked in place if they cannot be confirmed finished.
        let mut lp = Box::new(ConnLoop {
            shared,
            conn,
            fd: stream.as_raw_fd(),
            ring: self.ring,
            waker: self.waker,
            queue: VecDeque::new(),
            sending: None,
            send_buf: Vec::with_capacity(HEADER_BATCH * HEADER_LEN),
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
            // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
            msg: unsafe { std::mem::zeroed() },
            recv: Receiving::Header { got: 0 },
            hbuf: [0; HEADER_LEN],
            message: Vec::new(),
            wake_buf: 0,
            posted: [false; 3],
            last_progress: Instant::now(),
        });
        lp.serve(&jobs);
        let quiet = lp.drain();
        lp.fail_held(quiet);
        if quiet {
            drop(lp);
        } else {
            // The kernel may still use the loop's buffers: they stay allocated for good.
            Box::leak(lp);
        }
        drop(stream);
        for job in jobs.iter() {
            DataConn::reject(shared, job);
        }
    }
}

/// The send in flight: a batch of request headers in `send_buf`, or one WRITE request (its
/// header in `send_buf`, then its chunk).
struct Sending {
    body: (*const u8, usize),
    done: usize,
    write: Option<Arc<WriteState>>,
}

/// What the receive in flight is filling.
enum Receiving {
    /// The next reply header, `got` bytes of it so far, into `hbuf`.
    Header { got: usize },
    /// A READ chunk's payload, straight into its region.
    Payload { job: Job, got: usize },
    /// An error reply's message, into `message`.
    Message { job: Job, h: Header, got: usize },
}

struct ConnLoop<'a> {
    shared: &'a Shared,
    conn: &'a DataConn,
    fd: RawFd,
    ring: IoUring,
    waker: Arc<Waker>,
    /// Requests registered but not yet handed to the ring.
    queue: VecDeque<Outgoing>,
    sending: Option<Sending>,
    send_buf: Vec<u8>,
    iov: [libc::iovec; 2],
    msg: libc::msghdr,
    recv: Receiving,
    hbuf: [u8; HEADER_LEN],
    message: Vec<u8>,
    wake_buf: u64,
    /// Whether the SEND, RECV and WAKE operations are in the ring.
    posted: [bool; 3],
    /// When a receive last made progress.
    last_progress: Instant,
}

impl ConnLoop<'_> {
    fn closed(&self) -> bool {
        lock(&self.conn.state).closed
    }

    fn fail(&self, why: impl std::fmt::Display) {
        self.shared
            .fail(format!("data connection {}: {why}", self.conn.index));
    }

    fn push(&mut self, entry: io_uring::squeue::Entry, slot: u64) {
        // SAFETY: every pointer in the entry refers to memory of this boxed loop or of a job it
        // holds, which stays valid until the completion is reaped (see `drain`).
        let pushed = unsafe { self.ring.submission().push(&entry.user_data(slot)) };
        // Three slots at most are ever in use, in a ring of eight.
        debug_assert!(pushed.is_ok());
        self.posted[slot as usize - 1] = true;
    }

    /// Moves bytes until the client is dead.
    fn serve(&mut self, jobs: &Receiver<Job>) {
        self.post_recv();
        self.post_wake();
        while !self.closed() {
            self.take_jobs(jobs);
            self.post_send();
            if let Err(e) = self.sleep(jobs) {
                self.fail(format!("waiting on io_uring: {e}"));
                break;
            }
            self.reap();
            if self.overdue() {
                self.fail(format!("no reply within {:?}", self.shared.io_timeout));
            }
        }
    }

    /// Registers queued jobs while there is room for more requests in flight.
    fn take_jobs(&mut self, jobs: &Receiver<Job>) {
        loop {
            let mut st = lock(&self.conn.state);
            if !self.conn.has_room(&st) {
                return;
            }
            let Ok(job) = jobs.try_recv() else { return };
            match self.conn.register(&mut st, job) {
                Ok(out) => self.queue.push_back(out),
                Err(job) => {
                    drop(st);
                    DataConn::reject(self.shared, job);
                }
            }
        }
    }

    /// Waits for a completion or [`TICK`]; arms the waker first when new jobs could be taken.
    fn sleep(&mut self, jobs: &Receiver<Job>) -> io::Result<()> {
        let room = self.conn.has_room(&lock(&self.conn.state));
        if room {
            self.waker.armed.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !jobs.is_empty() {
                self.waker.armed.store(false, Ordering::SeqCst);
                return self.ring.submit().map(|_| ());
            }
        }
        let r = uring::wait(&self.ring, TICK);
        self.waker.armed.store(false, Ordering::SeqCst);
        r
    }

    /// True when requests are outstanding and nothing arrived for `io_timeout` since the later
    /// of the last progress and the oldest request.
    fn overdue(&self) -> bool {
        let oldest = self.conn.oldest_sent();
        let receiving = !matches!(self.recv, Receiving::Header { .. });
        if oldest.is_none() && !receiving {
            return false;
        }
        let since = oldest.map_or(self.last_progress, |t| t.max(self.last_progress));
        since.elapsed() >= self.shared.io_timeout
    }

    fn post_send(&mut self) {
        if self.posted[0] {
            return;
        }
        if self.sending.is_none() {
            let Some(first) = self.queue.pop_front() else {
                return;
            };
            self.send_buf.clear();
            self.send_buf.extend_from_slice(&first.header);
            let sending = match first.body {
                Some((region, len, write)) => Sending {
                    body: (region.0.cast_const(), len),
                    done: 0,
                    write: Some(write),
                },
                None => {
                    while self.send_buf.len() < HEADER_BATCH * HEADER_LEN
                        && self.queue.front().is_some_and(|o| o.body.is_none())
                    {
                        let o = self.queue.pop_front().expect("checked non-empty");
                        self.send_buf.extend_from_slice(&o.header);
                    }
                    Sending {
                        body: (std::ptr::null(), 0),
                        done: 0,
                        write: None,
                    }
                }
            };
            self.sending = Some(sending);
        }
        let s = self.sending.as_ref().expect("set above");
        self.msg = uring::send_parts_msg(&mut self.iov, &self.send_buf, s.body, s.done);
        let entry = opcode::SendMsg::new(types::Fd(self.fd), &self.msg)
            .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
            .build();
        self.push(entry, SEND);
    }

    fn post_recv(&mut self) {
        let (ptr, len) = match &self.recv {
            Receiving::Header { got } => (self.hbuf[*got..].as_mut_ptr(), HEADER_LEN - got),
            // SAFETY (of the later use): the region is this chunk's part of the read's buffer,
            // owned by its ReadState until the job is accounted, written only by this receive.
            Receiving::Payload { job, got } => (job.region.0.wrapping_add(*got), job.len - got),
            Receiving::Message { h, got, .. } => {
                let total = h.payload_len as usize;
                self.message.resize(total, 0);
                (self.message[*got..].as_mut_ptr(), total - got)
            }
        };
        // A chunk above 4 GiB is received in several pieces.
        let len = len.min(u32::MAX as usize) as u32;
        let entry = opcode::Recv::new(types::Fd(self.fd), ptr, len)
            .flags(libc::MSG_WAITALL)
            .build();
        self.push(entry, RECV);
    }

    fn post_wake(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.waker.fd.as_raw_fd()),
            (&mut self.wake_buf as *mut u64).cast::<u8>(),
            8,
        )
        .build();
        self.push(entry, WAKE);
    }

    /// Handles every completion in the ring.
    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (slot, res) in done {
            self.posted[slot as usize - 1] = false;
            if self.closed() {
                continue;
            }
            match slot {
                SEND => self.sent(res),
                RECV => self.received(res),
                _ if res < 0 => self.fail(format!(
                    "waiting for new requests: {}",
                    io::Error::from_raw_os_error(-res)
                )),
                _ => self.post_wake(),
            }
        }
    }

    fn sent(&mut self, res: i32) {
        if res <= 0 {
            let why = match res {
                0 => "the connection accepted no more bytes".to_string(),
                r => io::Error::from_raw_os_error(-r).to_string(),
            };
            self.fail(format!("sending requests failed: {why}"));
            return;
        }
        let s = self.sending.as_mut().expect("a send was in flight");
        s.done += res as usize;
        if s.done < self.send_buf.len() + s.body.1 {
            return; // post_send sends the rest.
        }
        if let Some(w) = self.sending.take().and_then(|s| s.write) {
            w.release(Ok(()));
        }
    }

    fn received(&mut self, res: i32) {
        let n = match res {
            0 => {
                self.fail("the server closed the connection");
                return;
            }
            r if r < 0 => {
                self.fail(format!(
                    "receiving a reply: {}",
                    io::Error::from_raw_os_error(-r)
                ));
                return;
            }
            r => r as usize,
        };
        self.last_progress = Instant::now();
        let recv = std::mem::replace(&mut self.recv, Receiving::Header { got: 0 });
        let next = match recv {
            Receiving::Header { got } if got + n < HEADER_LEN => {
                Some(Receiving::Header { got: got + n })
            }
            Receiving::Header { .. } => self.header_received(),
            Receiving::Payload { job, got } if got + n < job.len => {
                Some(Receiving::Payload { job, got: got + n })
            }
            Receiving::Payload { job, .. } => {
                DataConn::payload_received(self.shared, job);
                Some(Receiving::Header { got: 0 })
            }
            Receiving::Message { job, h, got } if got + n < h.payload_len as usize => {
                Some(Receiving::Message {
                    job,
                    h,
                    got: got + n,
                })
            }
            Receiving::Message { job, h, .. } => self
                .conn
                .error_received(self.shared, job, &h, &self.message)
                .ok()
                .map(|()| Receiving::Header { got: 0 }),
        };
        if let Some(next) = next {
            self.recv = next;
            self.post_recv();
        }
    }

    /// What to receive after a complete reply header; `None` once the client is dead.
    fn header_received(&mut self) -> Option<Receiving> {
        let h = match Header::decode(&self.hbuf) {
            Ok(h) => h,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        match self.conn.reply(self.shared, &h).ok()? {
            Reply::Done => Some(Receiving::Header { got: 0 }),
            Reply::Payload(job) => Some(Receiving::Payload { job, got: 0 }),
            Reply::Message(job, h) if h.payload_len == 0 => self
                .conn
                .error_received(self.shared, job, &h, &[])
                .ok()
                .map(|()| Receiving::Header { got: 0 }),
            Reply::Message(job, h) => Some(Receiving::Message { job, h, got: 0 }),
        }
    }

    /// Once the client is dead (its sockets shut down): waits until every operation left the
    /// ring, at most [`DRAIN`], then cancels what is left. True when the ring is empty.
    fn drain(&mut self) -> bool {
        self.waker.kick();
        let deadline = Instant::now() + DRAIN;
        let mut cancelled = false;
        while self.posted.iter().any(|p| *p) {
            if Instant::now() >= deadline {
                if cancelled {
                    return false;
                }
                cancelled = true;
                let _ = self.ring.submitter().register_sync_cancel(
                    Some(types::Timespec::from(TICK)),
                    types::CancelBuilder::any(),
                );
            }
            if uring::wait(&self.ring, TICK).is_err() {
                return false;
            }
            for c in self.ring.completion() {
                self.posted[c.user_data() as usize - 1] = false;
            }
        }
        true
    }

    /// Fails the job the receive was filling and releases the send's hold on a write's bytes.
    /// With operations possibly still in the ring (`quiet` false), a read's buffer is leaked
    /// rather than handed back; a write's caller gets its slice back (the kernel only reads
    /// it, and the socket is shut down).
    fn fail_held(&mut self, quiet: bool) {
        match std::mem::replace(&mut self.recv, Receiving::Header { got: 0 }) {
            Receiving::Payload { job, .. } | Receiving::Message { job, .. } => {
                if quiet {
                    job.finish(Err(self.shared.unavailable()), self.shared);
                } else {
                    job.abandon(self.shared);
                }
            }
            Receiving::Header { .. } => {}
        }
        if let Some(w) = self.sending.take().and_then(|s| s.write) {
            w.release(Ok(()));
        }
        for out in self.queue.drain(..) {
            if let Some((_, _, w)) = out.body {
                w.release(Ok(()));
            }
        }
    }
}
