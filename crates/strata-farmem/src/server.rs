//! The memory server: holds segments in its RAM for the sessions of compute processes.
//!
//! One thread per connection. A session lives as long as its control connection; its segments
//! (and the bytes they count against the capacity) are freed when it ends, like deregistering
//! memory. Segment memory is zero-initialised lazily by the OS (`alloc_zeroed`), and an
//! allocation the OS refuses is reported as a capacity error instead of aborting the process.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use strata_io::units::fmt_bytes;

use crate::error::{FarError, Result};
use crate::protocol::{self, op, status, Header, HeaderRead, HEADER_LEN};
use crate::uring_server::{Replier, ZeroCopyCounters, ZeroCopyStats};
use crate::TransportKind;
use strata_store::secret::{check_listen_token, constant_time_eq};

/// How often `run_until` checks its stop condition.
const STOP_POLL: Duration = Duration::from_millis(50);
/// How long a new connection may take to send its first message (HELLO or JOIN).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServerConfig::max_connections`]: a run uses one control connection and up to
/// eight data connections, so this serves dozens of runs at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Settings of a memory server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on, e.g. `"127.0.0.1:7000"`; port 0 picks a free port.
    pub listen: String,
    /// Total bytes of segments the server will hold for all sessions together.
    pub capacity_bytes: u64,
    /// Largest message (chunk) the server accepts or sends, in bytes (default 64 MiB).
    pub max_message_bytes: u64,
    /// How data connections send READ replies: `tcp` writes them, `uring` sends them with
    /// zero-copy sends (falling back to writes, said once on stderr, where the kernel refuses).
    pub transport: TransportKind,
    /// The shared secret every HELLO must carry; required when `listen` is not a loopback
    /// address (`None`: any client that reaches the port may open a session).
    pub token: Option<String>,
    /// Most connections served at once (each has a thread); a connection beyond them is
    /// answered `BUSY` and closed.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:0".to_string(),
            capacity_bytes: 1 << 30,
            max_message_bytes: 64 << 20,
            transport: TransportKind::Tcp,
            token: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// A snapshot of the server's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Segments currently held.
    pub segments: u64,
    /// Bytes currently reserved by segments.
    pub bytes_held: u64,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Sessions (connected clients) currently open.
    pub sessions: u64,
    /// Bytes sent to clients by chunk reads, since start.
    pub bytes_served: u64,
    /// Bytes received from clients by chunk writes, since start.
    pub bytes_received: u64,
    /// Requests handled (control and data), since start.
    pub requests: u64,
}

impl ServerStats {
    /// The counters in wire order (the STATS reply payload).
    pub(crate) fn to_words(&self) -> [u64; 7] {
        [
            self.segments,
            self.bytes_held,
            self.capacity,
            self.sessions,
            self.bytes_served,
            self.bytes_received,
            self.requests,
        ]
    }

    /// Inverse of [`ServerStats::to_words`].
    pub(crate) fn from_words(w: [u64; 7]) -> ServerStats {
        ServerStats {
            segments: w[0],
            bytes_held: w[1],
            capacity: w[2],
            sessions: w[3],
            bytes_served: w[4],
            bytes_received: w[5],
            requests: w[6],
        }
    }
}

/// Makes [`Server::run_until`] return, from any thread. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    /// Asks the server to stop; `run_until` returns within about 50 ms after closing every
    /// connection. Sticky: a stopped server's `run_until` returns at once.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// True once [`StopHandle::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A bound memory server. Serve with [`Server::run_until`].
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: StopHandle,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Bytes and segments held, decremented when a segment's memory is dropped.
#[derive(Default)]
struct Accounting {
    used: AtomicU64,
    segments: AtomicU64,
}

struct Shared {
    capacity: u64,
    max_message: u64,
    transport: TransportKind,
    token: Option<String>,
    max_connections: usize,
    zero_copy: ZeroCopyCounters,
    acct: Arc<Accounting>,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    /// Every open connection, so that stopping can close them.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    bytes_served: AtomicU64,
    bytes_received: AtomicU64,
    requests: AtomicU64,
    token_seed: RandomState,
}

struct Session {
    segments: RwLock<HashMap<u64, Arc<Segment>>>,
    /// The session's data connections, closed when the session ends; `None` once ended.
    data_conns: Mutex<Option<Vec<TcpStream>>>,
}

/// One segment's memory. Reads hold the read lock while the bytes go into the socket; writes
/// take the write lock only for the copy from the connection's receive buffer.
struct Segment {
    data: RwLock<Box<[u8]>>,
    acct: Arc<Accounting>,
}

impl Drop for Segment {
    fn drop(&mut self) {
        let len = self
            .data
            .get_mut()
            .map_or_else(|e| e.into_inner().len(), |d| d.len());
        self.acct.used.fetch_sub(len as u64, Ordering::SeqCst);
        self.acct.segments.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates `len` zeroed bytes, or `None` when the allocator refuses (instead of aborting).
fn try_alloc_zeroed(len: usize) -> Option<Box<[u8]>> {
    if len == 0 {
        return Some(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: ptr was allocated by the global allocator with the layout of [u8; len] and is
    // fully initialised (zeroed); Box<[u8]> frees it with the same layout.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) })
}

impl Server {
    /// Binds the listening socket; does not serve yet. Refuses a capacity beyond the
    /// machine's physical memory, and an address other hosts can reach without a token.
    pub fn bind(cfg: &ServerConfig) -> Result<Server> {
        if cfg.max_message_bytes == 0 || cfg.max_connections == 0 {
            return Err(FarError::Config(
                "max_message_bytes and max_connections must be at least 1".into(),
            ));
        }
        let ram = strata_store::budget::physical_memory();
        if cfg.capacity_bytes > ram {
            // Segments are allocated as clients ask: a server lending more than the machine
            // has would take the data and then be killed by the kernel, the data with it.
            return Err(FarError::Config(format!(
                "capacity {} is more than this machine's {} of memory: the server would lend memory it does not have",
                fmt_bytes(cfg.capacity_bytes),
                fmt_bytes(ram)
            )));
        }
        let wanted = cfg
            .listen
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| FarError::Config(format!("listen: cannot resolve {:?}", cfg.listen)))?;
        check_listen_token(
            &wanted,
            cfg.token.as_deref(),
            "--token-file or STRATA_FARMEM_TOKEN",
        )
        .map_err(FarError::Config)?;
        let listener = TcpListener::bind(wanted)
            .map_err(|e| FarError::io(format!("binding far-memory server to {}", cfg.listen), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| FarError::io("reading the listening address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| FarError::io("setting the listener non-blocking", e))?;
        Ok(Server {
            listener,
            addr,
            shared: Arc::new(Shared {
                capacity: cfg.capacity_bytes,
                max_message: cfg.max_message_bytes,
                transport: cfg.transport,
                token: cfg.token.clone(),
                max_connections: cfg.max_connections,
                zero_copy: ZeroCopyCounters::default(),
                acct: Arc::new(Accounting::default()),
                sessions: Mutex::new(HashMap::new()),
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(1),
                bytes_served: AtomicU64::new(0),
                bytes_received: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                token_seed: RandomState::new(),
            }),
            stop: StopHandle::default(),
        })
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle that makes [`Server::run_until`] return, usable from other threads.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The server's counters now.
    pub fn stats(&self) -> ServerStats {
        self.shared.stats()
    }

    /// How the server's data connections send READ replies.
    pub fn transport(&self) -> TransportKind {
        self.shared.transport
    }

    /// The zero-copy sends of the `uring` transport so far, and how many the kernel copied
    /// anyway (on loopback: all).
    pub fn zero_copy_stats(&self) -> ZeroCopyStats {
        self.shared.zero_copy.snapshot()
    }

    /// Serves (one thread per connection) until `stop()` returns true or the
    /// [`StopHandle`] is triggered, checking every 50 ms; then closes every connection, waits
    /// for the connection threads and returns. Sessions, and their segments, end with their
    /// connections.
    pub fn run_until(&self, stop: &dyn Fn() -> bool) -> Result<()> {
        let mut handles: Vec<JoinHandle<()>> = Vec::new();
        while !(self.stop.is_stopped() || stop()) {
            if !wait_readable(&self.listener, STOP_POLL) {
                continue;
            }
            match self.listener.accept() {
                Ok((stream, _))
                    if lock(&self.shared.conns).len() >= self.shared.max_connections =>
                {
                    refuse_busy(stream, self.shared.max_connections);
                }
                Ok((stream, _)) => {
                    let id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
                    let registered = stream.try_clone().and_then(|clone| {
                        stream.set_nonblocking(false)?;
                        protocol::tune_socket(&stream, true)?;
                        // Best effort: the session of a vanished client is freed sooner.
                        let _ = protocol::keepalive(&stream);
                        Ok(clone)
                    });
                    let Ok(clone) = registered else { continue };
                    lock(&self.shared.conns).insert(id, clone);
                    let shared = self.shared.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("farmem-conn-{id}"))
                        .spawn(move || {
                            let mut stream = stream;
                            shared.serve_connection(&mut stream);
                            let _ = stream.shutdown(Shutdown::Both);
                            lock(&shared.conns).remove(&id);
                        });
                    match spawned {
                        Ok(h) => handles.push(h),
                        Err(_) => {
                            if let Some(s) = lock(&self.shared.conns).remove(&id) {
                                let _ = s.shutdown(Shutdown::Both);
                            }
                        }
                    }
                }
                // Spurious wake-ups, aborted connections, or descriptor exhaustion: the server
                // keeps serving the connections it has.
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
            if handles.len() > 64 {
                let (done, live): (Vec<_>, Vec<_>) =
                    handles.into_iter().partition(|h| h.is_finished());
                for h in done {
                    let _ = h.join();
                }
                handles = live;
            }
        }
        for s in lock(&self.shared.conns).values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }
}

/// Answers a connection beyond the server's `max` with `BUSY` and closes it, without reading
/// from it (a fresh socket's send buffer takes the short reply without blocking).
fn refuse_busy(mut stream: TcpStream, max: usize) {
    if stream.set_nonblocking(true).is_ok() {
        let msg = format!("the server serves {max} connections at once and holds that many");
        let _ = send_error(&mut stream, 0, 0, status::BUSY, &msg, 0, 0);
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Waits until the listener has a connection to accept, or `timeout` passes.
fn wait_readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    rc > 0
}

/// Why a connection's loop ended badly: a reply may still be owed to the peer.
enum ConnEnd {
    /// The peer broke the protocol: send this message with a PROTOCOL status, then close.
    Protocol(u64, u8, String),
    /// The socket failed or closed: nothing more to send.
    Gone,
}

impl Shared {
    fn stats(&self) -> ServerStats {
        ServerStats {
            segments: self.acct.segments.load(Ordering::SeqCst),
            bytes_held: self.acct.used.load(Ordering::SeqCst),
            capacity: self.capacity,
            sessions: lock(&self.sessions).len() as u64,
            bytes_served: self.bytes_served.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }

    fn new_token(&self) -> u64 {
        let sessions = lock(&self.sessions);
        loop {
            let mut h = self.token_seed.build_hasher();
            h.write_u64(self.next_conn.fetch_add(1, Ordering::Relaxed));
            if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
                h.write_u128(t.as_nanos());
            }
            let token = h.finish();
            if token != 0 && !sessions.contains_key(&token) {
                return token;
            }
        }
    }

    /// Serves one connection: the first message decides whether it is a control connection
    /// (HELLO) or a data connection (JOIN).
    fn serve_connection(&self, stream: &mut TcpStream) {
        let mut hbuf = [0u8; HEADER_LEN];
        let _ = stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
        let end = match protocol::read_header(stream, &mut hbuf) {
            Ok(HeaderRead::Got) => match Header::decode(&hbuf) {
                Ok(h) if h.op == op::HELLO => match self.authenticate(stream, &h) {
                    Ok(()) => {
                        let _ = stream.set_read_timeout(None);
                        self.serve_control(stream, &h)
                    }
                    Err(end) => end,
                },
                Ok(h) if h.payload_len != 0 => {
                    ConnEnd::Protocol(h.id, h.op, format!("{} carries no payload", op::name(h.op)))
                }
                Ok(h) if h.op == op::JOIN => {
                    let _ = stream.set_read_timeout(None);
                    self.serve_data(stream, &h)
                }
                Ok(h) => ConnEnd::Protocol(
                    h.id,
                    h.op,
                    format!(
                        "a connection must start with HELLO (control) or JOIN (data), not {} ({})",
                        op::name(h.op),
                        h.op
                    ),
                ),
                Err(e) => ConnEnd::Protocol(0, 0, message(&e)),
            },
            _ => ConnEnd::Gone,
        };
        if let ConnEnd::Protocol(id, req_op, msg) = end {
            let _ = send_error(stream, id, req_op, status::PROTOCOL, &msg, 0, 0);
        }
    }

    /// Reads a HELLO's payload and checks it against the server's secret (any payload passes
    /// a server without one). A refusal is answered here: `UNAUTHENTICATED`, then the caller
    /// closes the connection.
    fn authenticate(
        &self,
        stream: &mut TcpStream,
        hello: &Header,
    ) -> std::result::Result<(), ConnEnd> {
        if hello.payload_len > protocol::MAX_TOKEN_BYTES as u64 {
            return Err(ConnEnd::Protocol(
                hello.id,
                hello.op,
                format!(
                    "HELLO payload of {} bytes is longer than any shared secret (at most {})",
                    hello.payload_len,
                    protocol::MAX_TOKEN_BYTES
                ),
            ));
        }
        let mut given = vec![0u8; hello.payload_len as usize];
        if stream.read_exact(&mut given).is_err() {
            return Err(ConnEnd::Gone);
        }
        let Some(token) = &self.token else {
            return Ok(());
        };
        if constant_time_eq(&given, token.as_bytes()) {
            return Ok(());
        }
        let msg = if given.is_empty() {
            "this server needs a token (--far-token-file or STRATA_FARMEM_TOKEN)"
        } else {
            "wrong token"
        };
        let _ = send_error(
            stream,
            hello.id,
            hello.op,
            status::UNAUTHENTICATED,
            msg,
            0,
            0,
        );
        Err(ConnEnd::Gone)
    }

    fn serve_control(&self, stream: &mut TcpStream, hello: &Header) -> ConnEnd {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let token = self.new_token();
        let session = Arc::new(Session {
            segments: RwLock::new(HashMap::new()),
            data_conns: Mutex::new(Some(Vec::new())),
        });
        lock(&self.sessions).insert(token, session.clone());
        let mut reply = Header::reply_to(hello);
        reply.segment = token;
        reply.offset = self.capacity;
        reply.length = self.max_message;
        let end = if stream.write_all(&reply.encode()).is_err() {
            ConnEnd::Gone
        } else {
            self.control_loop(stream, &session)
        };
        // The session ends with its control connection: close its data connections and drop
        // its segments (their memory goes once in-flight reads have finished).
        lock(&self.sessions).remove(&token);
        if let Some(conns) = lock(&session.data_conns).take() {
            for c in conns {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
        session
            .segments
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        end
    }

    /// The next request header on `stream`, counted; `None` when the read timed out idle, and
    /// how the connection ends when it is closed or the header is malformed.
    fn next_header(
        &self,
        stream: &mut TcpStream,
        hbuf: &mut [u8; HEADER_LEN],
    ) -> std::result::Result<Option<Header>, ConnEnd> {
        match protocol::read_header(stream, hbuf) {
            Ok(HeaderRead::Got) => {}
            Ok(HeaderRead::Idle) => return Ok(None),
            _ => return Err(ConnEnd::Gone),
        }
        let h = Header::decode(hbuf).map_err(|e| ConnEnd::Protocol(0, 0, message(&e)))?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(Some(h))
    }

    fn control_loop(&self, stream: &mut TcpStream, session: &Session) -> ConnEnd {
        let mut hbuf = [0u8; HEADER_LEN];
        loop {
            let h = match self.next_header(stream, &mut hbuf) {
                Ok(Some(h)) => h,
                Ok(None) => continue,
                Err(end) => return end,
            };
            if h.payload_len != 0 {
                return ConnEnd::Protocol(
                    h.id,
                    h.op,
                    format!("control message {} carries no payload", op::name(h.op)),
                );
            }
            let mut reply = Header::reply_to(&h);
            let mut payload: Vec<u8> = Vec::new();
            let outcome: Result<()> = match h.op {
                op::ALLOC => self.alloc(session, h.segment, h.length),
                op::FREE => {
                    let removed = session
                        .segments
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&h.segment);
                    match removed {
                        Some(_) => Ok(()),
                        None => Err(FarError::BadRequest(format!(
                            "free of unknown segment {}",
                            h.segment
                        ))),
                    }
                }
                op::CAPACITY => {
                    reply.offset = self.free_bytes();
                    reply.length = self.capacity;
                    Ok(())
                }
                op::PING => Ok(()),
                op::STATS => {
                    for w in self.stats().to_words() {
                        payload.extend_from_slice(&w.to_le_bytes());
                    }
                    reply.payload_len = payload.len() as u64;
                    Ok(())
                }
                other => {
                    return ConnEnd::Protocol(
                        h.id,
                        other,
                        format!(
                            "{} ({other}) is not a control operation (bulk data travels on data \
                             connections)",
                            op::name(other)
                        ),
                    )
                }
            };
            let sent = match outcome {
                Ok(()) => protocol::write_parts(stream, &reply.encode(), &payload),
                Err(FarError::Capacity { asked, free }) => send_error(
                    stream,
                    h.id,
                    h.op,
                    status::CAPACITY,
                    &format!("cannot hold {asked} more bytes: {free} bytes free"),
                    asked,
                    free,
                ),
                Err(e) => send_error(stream, h.id, h.op, status::BAD_REQUEST, &message(&e), 0, 0),
            };
            if sent.is_err() {
                return ConnEnd::Gone;
            }
        }
    }

    fn free_bytes(&self) -> u64 {
        self.capacity
            .saturating_sub(self.acct.used.load(Ordering::SeqCst))
    }

    fn alloc(&self, session: &Session, segment: u64, len: u64) -> Result<()> {
        let mut segments = session.segments.write().unwrap_or_else(|e| e.into_inner());
        if segments.contains_key(&segment) {
            return Err(FarError::BadRequest(format!(
                "segment {segment} already exists in this session"
            )));
        }
        // Reserve the bytes first, so concurrent sessions can never overshoot the capacity.
        let reserved = self
            .acct
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(len).filter(|&n| n <= self.capacity)
            });
        if let Err(used) = reserved {
            return Err(FarError::Capacity {
                asked: len,
                free: self.capacity.saturating_sub(used),
            });
        }
        let memory = usize::try_from(len).ok().and_then(try_alloc_zeroed);
        let Some(memory) = memory else {
            self.acct.used.fetch_sub(len, Ordering::SeqCst);
            return Err(FarError::Capacity {
                asked: len,
                free: 0,
            });
        };
        self.acct.segments.fetch_add(1, Ordering::SeqCst);
        segments.insert(
            segment,
            Arc::new(Segment {
                data: RwLock::new(memory),
                acct: self.acct.clone(),
            }),
        );
        Ok(())
    }

    fn serve_data(&self, stream: &mut TcpStream, join: &Header) -> ConnEnd {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let session = lock(&self.sessions).get(&join.segment).cloned();
        let Some(session) = session else {
            return ConnEnd::Protocol(
                join.id,
                join.op,
                "JOIN with an unknown session token (the session may have ended)".into(),
            );
        };
        {
            let mut conns = lock(&session.data_conns);
            let Some(list) = conns.as_mut() else {
                return ConnEnd::Protocol(join.id, join.op, "the session has ended".into());
            };
            match stream.try_clone() {
                Ok(c) => list.push(c),
                Err(_) => return ConnEnd::Gone,
            }
        }
        if stream.write_all(&Header::reply_to(join).encode()).is_err() {
            return ConnEnd::Gone;
        }
        self.data_loop(stream, &session)
    }

    fn segment(&self, session: &Session, h: &Header) -> Result<Arc<Segment>> {
        let seg = session
            .segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&h.segment)
            .cloned();
        seg.ok_or_else(|| {
            FarError::BadRequest(format!(
                "{} of unknown segment {}",
                op::name(h.op),
                h.segment
            ))
        })
    }

    fn data_loop(&self, stream: &mut TcpStream, session: &Session) -> ConnEnd {
        let mut hbuf = [0u8; HEADER_LEN];
        // Receive buffer for chunk writes; grows to the largest chunk seen, then stays.
        let mut scratch: Vec<u8> = Vec::new();
        let mut replier = Replier::new(self.transport, stream, &self.zero_copy);
        loop {
            let h = match self.next_header(stream, &mut hbuf) {
                Ok(Some(h)) => h,
                Ok(None) => continue,
                Err(end) => return end,
            };
            if h.payload_len > self.max_message {
                return ConnEnd::Protocol(
                    h.id,
                    h.op,
                    format!(
                        "message of {} bytes exceeds the server's maximum of {} bytes",
                        h.payload_len, self.max_message
                    ),
                );
            }
            let sent = match h.op {
                op::READ => {
                    if h.payload_len != 0 {
                        return ConnEnd::Protocol(h.id, h.op, "READ carries no payload".into());
                    }
                    self.read_chunk(stream, &mut replier, session, &h)
                }
                op::WRITE => {
                    if h.payload_len != h.length {
                        return ConnEnd::Protocol(
                            h.id,
                            h.op,
                            format!(
                                "WRITE length {} differs from its payload of {} bytes",
                                h.length, h.payload_len
                            ),
                        );
                    }
                    let n = h.payload_len as usize;
                    if scratch.len() < n {
                        scratch.resize(n, 0);
                    }
                    if stream.read_exact(&mut scratch[..n]).is_err() {
                        return ConnEnd::Gone;
                    }
                    self.write_chunk(stream, session, &h, &scratch[..n])
                }
                other => {
                    return ConnEnd::Protocol(
                        h.id,
                        other,
                        format!(
                            "{} ({other}) is not a data operation (control messages travel on \
                             the control connection)",
                            op::name(other)
                        ),
                    )
                }
            };
            if sent.is_err() {
                return ConnEnd::Gone;
            }
        }
    }

    fn check_range(h: &Header, seg_len: usize) -> Result<std::ops::Range<usize>> {
        let end = h.offset.checked_add(h.length);
        match end {
            Some(end) if end <= seg_len as u64 => Ok(h.offset as usize..end as usize),
            _ => Err(FarError::BadRequest(format!(
                "{} of {} bytes at offset {} is outside segment {} ({} bytes)",
                op::name(h.op),
                h.length,
                h.offset,
                h.segment,
                seg_len
            ))),
        }
    }

    fn read_chunk(
        &self,
        stream: &mut TcpStream,
        replier: &mut Replier,
        session: &Session,
        h: &Header,
    ) -> std::io::Result<()> {
        if h.length > self.max_message {
            let msg = format!(
                "READ of {} bytes exceeds the server's maximum message of {} bytes",
                h.length, self.max_message
            );
            return send_error(stream, h.id, h.op, status::BAD_REQUEST, &msg, 0, 0);
        }
        let seg = match self.segment(session, h) {
            Ok(s) => s,
            Err(e) => {
                return send_error(stream, h.id, h.op, status::BAD_REQUEST, &message(&e), 0, 0)
            }
        };
        let data = seg.data.read().unwrap_or_else(|e| e.into_inner());
        let range = match Self::check_range(h, data.len()) {
            Ok(r) => r,
            Err(e) => {
                drop(data);
                return send_error(stream, h.id, h.op, status::BAD_REQUEST, &message(&e), 0, 0);
            }
        };
        let mut reply = Header::reply_to(h);
        reply.payload_len = h.length;
        // Straight from the segment's memory into the socket (with `uring`, the kernel sends
        // from the segment's pages; the read lock is held until it is done with them).
        replier.send(stream, &reply.encode(), &data[range], &self.zero_copy)?;
        self.bytes_served.fetch_add(h.length, Ordering::Relaxed);
        Ok(())
    }

    fn write_chunk(
        &self,
        stream: &mut TcpStream,
        session: &Session,
        h: &Header,
        bytes: &[u8],
    ) -> std::io::Result<()> {
        let outcome = self.segment(session, h).and_then(|seg| {
            let mut data = seg.data.write().unwrap_or_else(|e| e.into_inner());
            let range = Self::check_range(h, data.len())?;
            data[range].copy_from_slice(bytes);
            Ok(())
        });
        match outcome {
            Ok(()) => {
                self.bytes_received.fetch_add(h.length, Ordering::Relaxed);
                stream.write_all(&Header::reply_to(h).encode())
            }
            Err(e) => send_error(stream, h.id, h.op, status::BAD_REQUEST, &message(&e), 0, 0),
        }
    }
}

/// The text of an error reply: the error's message without the client-side prefix.
fn message(e: &FarError) -> String {
    match e {
        FarError::BadRequest(m) | FarError::Protocol(m) | FarError::Unavailable(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Sends an error reply carrying `msg`; `offset`/`length` carry the numbers of a CAPACITY reply.
fn send_error(
    stream: &mut TcpStream,
    id: u64,
    req_op: u8,
    status: u8,
    msg: &str,
    offset: u64,
    length: u64,
) -> std::io::Result<()> {
    let bytes = &msg.as_bytes()[..msg.len().min(protocol::MAX_ERROR_PAYLOAD as usize)];
    let h = Header {
        op: req_op | op::REPLY,
        status,
        id,
        segment: 0,
        offset,
        length,
        payload_len: bytes.len() as u64,
    };
    protocol::write_parts(stream, &h.encode(), bytes)
}
