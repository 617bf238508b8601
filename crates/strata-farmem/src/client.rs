//! The compute side: a client of one memory server.
//!
//! Structure: one control connection (behind a mutex, one round trip at a time) and
//! `data_connections` data connections, each fed by an unbounded queue of chunk jobs and keeping
//! at most `depth_per_connection` chunk requests in flight. Replies come back in request order,
//! and each chunk's payload lands directly in the destination region of the caller's
//! [`FarRead`] buffer with a `recv` into raw memory: no per-chunk allocation and no intermediate
//! copy. A read's completion is sent when the last of its chunks has arrived.
//!
//! With the `tcp` transport each data connection has a **sender** thread and a **receiver**
//! thread on blocking sockets (this module); with `uring` one thread drives both directions of a
//! connection through an io_uring ([`crate::uring_client`]). The bookkeeping (request ids, the
//! in-flight queue, matching replies to requests, completing reads and writes, failure) is
//! [`crate::chunks`]'s and shared by both.
//!
//! Failure: the first broken connection, protocol violation or reply overdue by more than
//! `io_timeout` makes the whole client dead. Every chunk in flight or queued then fails with
//! [`FarError::Unavailable`], so every pending read completes promptly, and every later call
//! fails at once.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::chunks::{
    lock, ConnState, Counters, DataConn, FarCompletion, Job, ReadState, Region, Reply, Shared,
    Target, WriteState,
};
use crate::error::{FarError, Result};
use crate::protocol::{self, op, status, Header, HeaderRead, HEADER_LEN};
use crate::server::ServerStats;
use crate::uring_client;
use crate::{Transport, TransportKind};

/// Settings of a far-memory client.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Server address, e.g. `"127.0.0.1:7000"`.
    pub addr: String,
    /// Bytes per chunk: reads and writes are split into chunks of this size (default 256 KiB).
    pub chunk_bytes: usize,
    /// Parallel bulk data connections, each with its own transfer threads (default 2).
    pub data_connections: usize,
    /// Chunk requests pipelined per data connection (default 4).
    pub depth_per_connection: usize,
    /// Longest wait for the connections to open (default 2 s).
    pub connect_timeout: Duration,
    /// Longest wait for an overdue reply before the client declares the server dead
    /// (default 5 s).
    pub io_timeout: Duration,
    /// How the data connections move bytes (default `tcp`).
    pub transport: TransportKind,
    /// The server's shared secret, sent with HELLO (`None` for a server without one).
    pub token: Option<String>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            addr: String::new(),
            chunk_bytes: 256 << 10,
            data_connections: 2,
            depth_per_connection: 4,
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(5),
            transport: TransportKind::Tcp,
            token: None,
        }
    }
}

/// One asynchronous read of `len` bytes at byte `offset` of `segment`.
#[derive(Debug)]
pub struct FarRead {
    /// Segment id (as given to [`FarClient::alloc`]).
    pub segment: u64,
    /// Byte offset inside the segment.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Destination: the bytes land in `buf[..len]`. Give it a capacity of at least `len` to
    /// avoid an allocation; its length is raised to `len` on success if it was shorter, and left
    /// alone on failure.
    pub buf: Vec<u8>,
    /// Caller's tag, returned in the completion.
    pub tag: u64,
}

impl FarRead {
    /// A read with a freshly allocated buffer of capacity `len`.
    pub fn new(segment: u64, offset: u64, len: usize, tag: u64) -> FarRead {
        FarRead {
            segment,
            offset,
            len,
            buf: Vec::with_capacity(len),
            tag,
        }
    }
}

/// A snapshot of a client's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientStats {
    /// Payload bytes received by chunk reads.
    pub bytes_read: u64,
    /// Payload bytes acknowledged by chunk writes.
    pub bytes_written: u64,
    /// Chunk reads completed.
    pub chunks_read: u64,
    /// [`FarRead`]s completed successfully.
    pub reads: u64,
    /// Mean time from `submit` to completion of a successful read, in microseconds.
    pub read_latency_us_mean: f64,
    /// Failed operations: failed reads and failed control or write calls.
    pub errors: u64,
}

struct Control {
    stream: TcpStream,
    next_id: u64,
}

/// A client of one far-memory server: a session with its own segments. `Send + Sync`; share it
/// behind an `Arc`. Dropping it closes the connections, and the server frees its segments.
pub struct FarClient {
    shared: Arc<Shared>,
    control: Mutex<Control>,
    lanes: Vec<Lane>,
    next_conn: AtomicUsize,
    chunk_bytes: usize,
    addr: SocketAddr,
    transport: TransportKind,
}

/// The queue of one data connection, and how to wake its io_uring thread (`uring` only).
struct Lane {
    jobs: Sender<Job>,
    waker: Option<Arc<uring_client::Waker>>,
}

impl std::fmt::Debug for FarClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarClient")
            .field("server", &self.addr)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("transport", &self.transport)
            .field("data_connections", &self.lanes.len())
            .field("alive", &self.is_alive())
            .finish()
    }
}

fn open(addr: &str, timeout: Duration, what: &str) -> Result<(TcpStream, SocketAddr)> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| {
            FarError::Unavailable(format!("cannot resolve far-memory address {addr:?}: {e}"))
        })?
        .collect();
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok((s, a)),
            Err(e) => last = Some(e),
        }
    }
    Err(FarError::Unavailable(match last {
        Some(e) => format!("cannot open the {what} connection to {addr} within {timeout:?}: {e}"),
        None => format!("far-memory address {addr:?} resolves to nothing"),
    }))
}

/// One request/reply exchange on a fresh connection (HELLO, with `payload`, or JOIN).
fn handshake(stream: &mut TcpStream, req: &Header, payload: &[u8]) -> Result<Header> {
    let io = |e: std::io::Error| {
        FarError::Unavailable(format!("{} handshake failed: {e}", op::name(req.op)))
    };
    let req = &Header {
        payload_len: payload.len() as u64,
        ..*req
    };
    protocol::write_parts(stream, &req.encode(), payload).map_err(io)?;
    let (h, payload) = read_reply(stream)?;
    if h.status != status::OK {
        return Err(protocol::reply_error(&h, &payload));
    }
    if h.op != req.op | op::REPLY || h.id != req.id {
        return Err(FarError::Protocol(format!(
            "unexpected reply {} to {}",
            op::name(h.op),
            op::name(req.op)
        )));
    }
    Ok(h)
}

/// Reads one reply with a small payload (control replies and errors).
fn read_reply(stream: &mut TcpStream) -> Result<(Header, Vec<u8>)> {
    let mut hbuf = [0u8; HEADER_LEN];
    match protocol::read_header(stream, &mut hbuf) {
        Ok(HeaderRead::Got) => {}
        Ok(HeaderRead::Idle) => {
            return Err(FarError::Unavailable(
                "the server did not answer in time".into(),
            ))
        }
        Ok(HeaderRead::Closed) => {
            return Err(FarError::Unavailable(
                "the server closed the connection".into(),
            ))
        }
        Err(e) => return Err(FarError::Unavailable(format!("reading a reply: {e}"))),
    }
    let h = Header::decode(&hbuf)?;
    if h.payload_len > protocol::MAX_ERROR_PAYLOAD {
        return Err(FarError::Protocol(format!(
            "reply payload of {} bytes is larger than any control reply",
            h.payload_len
        )));
    }
    let mut payload = vec![0u8; h.payload_len as usize];
    stream
        .read_exact(&mut payload)
        .map_err(|e| FarError::Unavailable(format!("reading a reply payload: {e}")))?;
    Ok((h, payload))
}

impl FarClient {
    /// Connects: one control connection (HELLO, which opens a session) plus
    /// `data_connections` data connections joining it. [`FarError::Unavailable`] when the
    /// server cannot be reached within `connect_timeout`; [`FarError::BadRequest`] for a
    /// configuration the server cannot serve (e.g. chunks above its maximum message size);
    /// [`FarError::Unsupported`] when the `uring` transport is asked for and this process
    /// cannot use io_uring (checked before any connection is opened).
    pub fn connect(cfg: &ClientConfig) -> Result<FarClient> {
        if cfg.addr.is_empty() {
            return Err(FarError::BadRequest(
                "far-memory client: empty server address".into(),
            ));
        }
        if cfg.chunk_bytes == 0 || cfg.data_connections == 0 || cfg.depth_per_connection == 0 {
            return Err(FarError::BadRequest(format!(
                "far-memory client: chunk_bytes ({}), data_connections ({}) and \
                 depth_per_connection ({}) must all be at least 1",
                cfg.chunk_bytes, cfg.data_connections, cfg.depth_per_connection
            )));
        }
        // One ring per data connection, set up first so that an unusable io_uring is reported
        // before the server sees a session.
        let mut rings = match cfg.transport {
            TransportKind::Tcp => Vec::new(),
            TransportKind::Uring => (0..cfg.data_connections)
                .map(|_| uring_client::ConnRing::new())
                .collect::<Result<Vec<_>>>()?,
        };
        // Handshakes answer within connect_timeout; later replies within io_timeout.
        let timeouts = |s: &TcpStream, t: Duration| -> Result<()> {
            let t = Some(t.max(Duration::from_millis(1)));
            s.set_read_timeout(t)
                .and_then(|_| s.set_write_timeout(t))
                .map_err(|e| FarError::io("setting socket timeouts", e))
        };
        let (mut control, addr) = open(&cfg.addr, cfg.connect_timeout, "control")?;
        protocol::tune_socket(&control, false)
            .map_err(|e| FarError::io("tuning the control socket", e))?;
        timeouts(&control, cfg.connect_timeout)?;
        let secret = cfg.token.as_deref().unwrap_or_default().as_bytes();
        let hello = handshake(
            &mut control,
            &Header::request(op::HELLO, 0, 0, 0, 0),
            secret,
        )?;
        timeouts(&control, cfg.io_timeout)?;
        let token = hello.segment;
        let max_message = hello.length;
        if cfg.chunk_bytes as u64 > max_message {
            return Err(FarError::BadRequest(format!(
                "chunk_bytes {} exceeds the server's maximum message of {max_message} bytes",
                cfg.chunk_bytes
            )));
        }
        let mut streams = Vec::with_capacity(cfg.data_connections);
        for i in 0..cfg.data_connections {
            let (mut s, _) = open(&addr.to_string(), cfg.connect_timeout, "data")?;
            protocol::tune_socket(&s, true).map_err(|e| FarError::io("tuning a data socket", e))?;
            timeouts(&s, cfg.connect_timeout)?;
            handshake(
                &mut s,
                &Header::request(op::JOIN, i as u64, token, 0, 0),
                &[],
            )?;
            timeouts(&s, cfg.io_timeout)?;
            streams.push(s);
        }
        let clone = |s: &TcpStream| {
            s.try_clone()
                .map_err(|e| FarError::io("cloning a socket", e))
        };
        let mut conns = Vec::with_capacity(streams.len());
        for (index, s) in streams.iter().enumerate() {
            conns.push(Arc::new(DataConn {
                index,
                stream: clone(s)?,
                depth: cfg.depth_per_connection,
                state: Mutex::new(ConnState {
                    inflight: VecDeque::with_capacity(cfg.depth_per_connection),
                    closed: false,
                    next_id: 1,
                }),
                space: Condvar::new(),
            }));
        }
        let shared = Arc::new(Shared {
            dead: AtomicBool::new(false),
            reason: Mutex::new(None),
            conns,
            control_stream: clone(&control)?,
            io_timeout: cfg.io_timeout,
            stats: Counters::default(),
        });
        let mut lanes = Vec::with_capacity(streams.len());
        for (i, s) in streams.into_iter().enumerate() {
            let (tx, rx) = crossbeam_channel::unbounded::<Job>();
            let (sh, conn) = (shared.clone(), shared.conns[i].clone());
            if rings.is_empty() {
                let recv_stream = clone(&s)?;
                spawn(format!("farmem-send-{i}"), move || {
                    sender_loop(&sh, &conn, rx, s)
                })?;
                let (sh, conn) = (shared.clone(), shared.conns[i].clone());
                spawn(format!("farmem-recv-{i}"), move || {
                    receiver_loop(&sh, &conn, recv_stream)
                })?;
                lanes.push(Lane {
                    jobs: tx,
                    waker: None,
                });
            } else {
                let ring = rings.remove(0);
                lanes.push(Lane {
                    jobs: tx,
                    waker: Some(ring.waker()),
                });
                spawn(format!("farmem-uring-{i}"), move || {
                    ring.run(&sh, &conn, rx, s)
                })?;
            }
        }
        Ok(FarClient {
            shared,
            control: Mutex::new(Control {
                stream: control,
                next_id: 1,
            }),
            lanes,
            next_conn: AtomicUsize::new(0),
            chunk_bytes: cfg.chunk_bytes,
            addr,
            transport: cfg.transport,
        })
    }

    /// The server's address this client is connected to.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes per chunk.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// How the data connections move bytes.
    pub fn transport(&self) -> TransportKind {
        self.transport
    }

    /// False once the client is dead (server gone, connection broken, or reply overdue).
    pub fn is_alive(&self) -> bool {
        !self.shared.is_dead()
    }

    /// One control round trip; errors on the control connection make the client dead.
    fn control_call(
        &self,
        req_op: u8,
        segment: u64,
        offset: u64,
        length: u64,
    ) -> Result<(Header, Vec<u8>)> {
        let result = self.control_call_inner(req_op, segment, offset, length);
        if result.is_err() {
            self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        match result {
            Err(e @ (FarError::Unavailable(_) | FarError::Protocol(_))) => {
                self.shared.fail(format!("control connection: {e}"));
                Err(self.shared.unavailable())
            }
            other => other,
        }
    }

    fn control_call_inner(
        &self,
        req_op: u8,
        segment: u64,
        offset: u64,
        length: u64,
    ) -> Result<(Header, Vec<u8>)> {
        if self.shared.is_dead() {
            return Err(self.shared.unavailable());
        }
        let mut c = lock(&self.control);
        let id = c.next_id;
        c.next_id += 1;
        let req = Header::request(req_op, id, segment, offset, length);
        c.stream
            .write_all(&req.encode())
            .map_err(|e| FarError::Unavailable(format!("sending {}: {e}", op::name(req_op))))?;
        let (h, payload) = read_reply(&mut c.stream)?;
        if h.id != id || h.op != req_op | op::REPLY {
            return Err(FarError::Protocol(format!(
                "reply {} #{} does not match request {} #{id}",
                op::name(h.op),
                h.id,
                op::name(req_op)
            )));
        }
        if h.status != status::OK {
            return Err(protocol::reply_error(&h, &payload));
        }
        Ok((h, payload))
    }

    /// Free bytes on the server (all sessions together), by a control round trip.
    pub fn free_capacity(&self) -> Result<u64> {
        Ok(self.control_call(op::CAPACITY, 0, 0, 0)?.0.offset)
    }

    /// Allocates segment `segment` of `len` bytes (zero-filled) in this session.
    /// [`FarError::Capacity`] when the server cannot hold it; [`FarError::BadRequest`] when the
    /// id is taken.
    pub fn alloc(&self, segment: u64, len: u64) -> Result<()> {
        self.control_call(op::ALLOC, segment, 0, len).map(|_| ())
    }

    /// Frees segment `segment`; its bytes return to the server's capacity.
    pub fn free(&self, segment: u64) -> Result<()> {
        self.control_call(op::FREE, segment, 0, 0).map(|_| ())
    }

    /// Control round-trip time.
    pub fn ping(&self) -> Result<Duration> {
        let t = Instant::now();
        self.control_call(op::PING, 0, 0, 0)?;
        Ok(t.elapsed())
    }

    /// The server's counters (all sessions), by a control round trip.
    pub fn server_stats(&self) -> Result<ServerStats> {
        let (_, payload) = self.control_call(op::STATS, 0, 0, 0)?;
        if payload.len() != 7 * 8 {
            let e = format!("STATS reply of {} bytes, expected 56", payload.len());
            self.shared.fail(e.clone());
            return Err(FarError::Protocol(e));
        }
        let mut w = [0u64; 7];
        for (i, c) in payload.chunks_exact(8).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().unwrap());
        }
        Ok(ServerStats::from_words(w))
    }

    /// Picks the data connections for `n` consecutive chunks (round robin).
    fn first_conn(&self, n: usize) -> usize {
        self.next_conn.fetch_add(n, Ordering::Relaxed)
    }

    fn enqueue(&self, conn: usize, job: Job) {
        let lane = &self.lanes[conn % self.lanes.len()];
        match lane.jobs.send(job) {
            Ok(()) => {
                if let Some(w) = &lane.waker {
                    w.wake();
                }
            }
            Err(e) => e
                .into_inner()
                .finish(Err(self.shared.unavailable()), &self.shared),
        }
    }

    /// Writes `data` at byte `offset` of `segment`: split into chunks spread over the data
    /// connections; returns once the server acknowledged every chunk (or with the first error).
    pub fn write(&self, segment: u64, offset: u64, data: &[u8]) -> Result<()> {
        if self.shared.is_dead() {
            self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
            return Err(self.shared.unavailable());
        }
        if offset.checked_add(data.len() as u64).is_none() {
            return Err(FarError::BadRequest(format!(
                "write of {} bytes at offset {offset} overflows",
                data.len()
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunks = data.len().div_ceil(self.chunk_bytes);
        let state = Arc::new(WriteState {
            state: Mutex::new((2 * chunks, None)),
            done: Condvar::new(),
        });
        let first = self.first_conn(chunks);
        for (k, piece) in data.chunks(self.chunk_bytes).enumerate() {
            let job = Job {
                op: op::WRITE,
                segment,
                offset: offset + (k * self.chunk_bytes) as u64,
                len: piece.len(),
                region: Region(piece.as_ptr().cast_mut()),
                target: Target::Write(state.clone()),
            };
            self.enqueue(first + k, job);
        }
        // Blocks until every chunk was both sent and accounted: after this no thread touches
        // `data` any more. Bounded by io_timeout, after which the client fails every chunk.
        let result = state.wait();
        match &result {
            Ok(()) => {
                self.shared
                    .stats
                    .bytes_written
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// Starts reads; never blocks on the network. Each read is split into chunks spread over
    /// the data connections, and exactly one [`FarCompletion`] per read is sent to `sink` once
    /// all its chunks have arrived, or on error ([`FarError::Unavailable`] when the client is
    /// or becomes dead). A read of 0 bytes completes at once. Completions are sent from the
    /// client's receiver threads, so a bounded `sink` that nobody drains stalls the transfers.
    pub fn submit(&self, reqs: Vec<FarRead>, sink: &Sender<FarCompletion>) {
        for mut r in reqs {
            let immediate = if self.shared.is_dead() {
                Some(Err(self.shared.unavailable()))
            } else if r.offset.checked_add(r.len as u64).is_none() {
                Some(Err(FarError::BadRequest(format!(
                    "read of {} bytes at offset {} overflows",
                    r.len, r.offset
                ))))
            } else if r.len == 0 {
                Some(Ok(0))
            } else {
                None
            };
            if let Some(result) = immediate {
                if result.is_err() {
                    self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
                let _ = sink.send(FarCompletion {
                    tag: r.tag,
                    buf: r.buf,
                    result,
                });
                continue;
            }
            if r.buf.capacity() < r.len {
                r.buf.reserve(r.len - r.buf.len());
            }
            let base = r.buf.as_mut_ptr();
            let chunks = r.len.div_ceil(self.chunk_bytes);
            let state = Arc::new(ReadState {
                tag: r.tag,
                len: r.len,
                remaining: AtomicUsize::new(chunks),
                // Moving the Vec does not move its heap buffer: `base` stays valid.
                buf: Mutex::new(Some(r.buf)),
                error: Mutex::new(None),
                sink: sink.clone(),
                submitted: Instant::now(),
            });
            let first = self.first_conn(chunks);
            for k in 0..chunks {
                let start = k * self.chunk_bytes;
                let len = self.chunk_bytes.min(r.len - start);
                let job = Job {
                    op: op::READ,
                    segment: r.segment,
                    offset: r.offset + start as u64,
                    len,
                    // SAFETY: start < len <= capacity, inside the buffer's allocation.
                    region: Region(unsafe { base.add(start) }),
                    target: Target::Read(state.clone()),
                };
                self.enqueue(first + k, job);
            }
        }
    }

    /// The client's counters now.
    pub fn stats(&self) -> ClientStats {
        let s = &self.shared.stats;
        let reads = s.reads.load(Ordering::Relaxed);
        let sum = s.read_latency_us_sum.load(Ordering::Relaxed);
        ClientStats {
            bytes_read: s.bytes_read.load(Ordering::Relaxed),
            bytes_written: s.bytes_written.load(Ordering::Relaxed),
            chunks_read: s.chunks_read.load(Ordering::Relaxed),
            reads,
            read_latency_us_mean: if reads == 0 {
                0.0
            } else {
                sum as f64 / reads as f64
            },
            errors: s.errors.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FarClient {
    fn drop(&mut self) {
        // Fails whatever is still pending, wakes the threads and closes the sockets; the server
        // ends the session and frees its segments when the control connection closes. Queued
        // jobs are failed by the sender threads, which exit once the queues disconnect.
        self.shared.fail("far memory client closed".into());
        self.lanes.clear();
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map(|_| ())
        .map_err(|e| FarError::io("spawning a far-memory transfer thread", e))
}

/// Sends chunk requests of one data connection, keeping at most `depth` in flight.
fn sender_loop(shared: &Shared, conn: &DataConn, jobs: Receiver<Job>, mut stream: TcpStream) {
    while let Ok(job) = jobs.recv() {
        let registered = {
            let mut st = lock(&conn.state);
            while !st.closed && !conn.has_room(&st) {
                st = conn.space.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            conn.register(&mut st, job)
        };
        let out = match registered {
            Ok(out) => out,
            Err(job) => {
                DataConn::reject(shared, job);
                continue;
            }
        };
        let sent = match &out.body {
            Some((region, len, w)) => {
                // SAFETY: Region of a write: the caller's slice, kept borrowed by `write` until
                // this send reference is released.
                let body = unsafe { std::slice::from_raw_parts(region.0.cast_const(), *len) };
                let sent = protocol::write_parts(&mut stream, &out.header, body);
                w.release(Ok(()));
                sent
            }
            None => stream.write_all(&out.header),
        };
        if let Err(e) = sent {
            shared.fail(format!(
                "data connection {}: sending a {} request failed: {e}",
                conn.index,
                op::name(out.header[6])
            ));
        }
    }
}

/// Reads the replies of one data connection and lands read payloads in the callers' buffers.
fn receiver_loop(shared: &Shared, conn: &DataConn, mut stream: TcpStream) {
    let mut hbuf = [0u8; HEADER_LEN];
    let mut msg = Vec::new();
    loop {
        match protocol::read_header(&mut stream, &mut hbuf) {
            Ok(HeaderRead::Got) => {}
            Ok(HeaderRead::Idle) => {
                if lock(&conn.state).closed {
                    return;
                }
                if conn
                    .oldest_sent()
                    .is_some_and(|t| t.elapsed() >= shared.io_timeout)
                {
                    shared.fail(format!(
                        "data connection {}: no reply within {:?}",
                        conn.index, shared.io_timeout
                    ));
                    return;
                }
                continue;
            }
            Ok(HeaderRead::Closed) => {
                shared.fail(format!(
                    "data connection {}: the server closed the connection",
                    conn.index
                ));
                return;
            }
            Err(e) => {
                shared.fail(format!("data connection {}: {e}", conn.index));
                return;
            }
        }
        let h = match Header::decode(&hbuf) {
            Ok(h) => h,
            Err(e) => {
                shared.fail(format!("data connection {}: {e}", conn.index));
                return;
            }
        };
        let received = match conn.reply(shared, &h) {
            Err(()) => return,
            Ok(Reply::Done) => Ok(()),
            Ok(Reply::Message(job, h)) => {
                msg.resize(h.payload_len as usize, 0);
                match stream.read_exact(&mut msg) {
                    Ok(()) => match conn.error_received(shared, job, &h, &msg) {
                        Ok(()) => Ok(()),
                        Err(()) => return,
                    },
                    Err(e) => Err((job, e)),
                }
            }
            Ok(Reply::Payload(job)) => {
                // SAFETY: Region of a read: this chunk's disjoint part of the FarRead's buffer,
                // owned by its ReadState until this job is accounted, written only here.
                match unsafe { protocol::recv_exact_raw(&stream, job.region.0, job.len) } {
                    Ok(()) => {
                        DataConn::payload_received(shared, job);
                        Ok(())
                    }
                    Err(e) => Err((job, e)),
                }
            }
        };
        if let Err((job, e)) = received {
            shared.fail(format!(
                "data connection {}: receiving a reply: {e}",
                conn.index
            ));
            job.finish(Err(shared.unavailable()), shared);
            return;
        }
    }
}

/// The far tier as the engines use it, through the client.
impl Transport for FarClient {
    fn free_capacity(&self) -> Result<u64> {
        FarClient::free_capacity(self)
    }
    fn alloc(&self, segment: u64, len: u64) -> Result<()> {
        FarClient::alloc(self, segment, len)
    }
    fn write(&self, segment: u64, offset: u64, data: &[u8]) -> Result<()> {
        FarClient::write(self, segment, offset, data)
    }
    fn submit(&self, reqs: Vec<FarRead>, sink: &crossbeam_channel::Sender<FarCompletion>) {
        FarClient::submit(self, reqs, sink)
    }
    fn free(&self, segment: u64) -> Result<()> {
        FarClient::free(self, segment)
    }
    fn is_alive(&self) -> bool {
        FarClient::is_alive(self)
    }
    fn chunk_bytes(&self) -> usize {
        FarClient::chunk_bytes(self)
    }
}
