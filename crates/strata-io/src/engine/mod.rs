//! The I/O engine: every read and write of a data file goes through it.
//!
//! Requests `(op, file, offset, length, buffer)` are submitted in batches from any thread;
//! completions come back on a channel the submitter chooses, harvested apart from submission
//! (Helios §3.1's decoupling): with io_uring, whichever thread waits for a completion polls the
//! completion queue and dispatches everything it reaps to its owners' channels, so the device's
//! wake-up reaches the waiting consumer directly; with the thread-pool fallback the worker that
//! performed the transfer delivers it. A bounded in-flight window gives back-pressure: `submit`
//! blocks while it is full (and, with io_uring, reaps completions meanwhile).
//!
//! Unaligned reads are the engine's business: it reads the covering aligned range (into the
//! caller's buffer when it is large enough, otherwise into a bounce buffer) and hands back
//! exactly the bytes asked for. Writes to `O_DIRECT` files must be aligned.

mod file;
mod fixed;
mod threads;
mod transfer;
mod uring;

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};

use crate::aligned::{align_down, align_up, AlignedBuf, ALIGN};
use crate::error::{IoError, Result};
use crate::stats::{IoStats, StatsSnapshot};

pub use file::IoFile;
pub use fixed::{FixedBuf, FixedPool};
pub use transfer::Op;
pub use uring::explain_setup_error as explain_uring_setup_error;

use transfer::{Advance, Next, Transfer};

/// A buffer a request reads into or writes from.
pub enum IoBuf {
    /// An ordinary aligned heap buffer.
    Heap(AlignedBuf),
    /// A buffer registered with the io_uring instance (no page pinning per request).
    Fixed(FixedBuf),
    /// Memory lent by the caller for the duration of the request (see [`IoBuf::borrowed`]).
    Borrowed(BorrowedBuf),
}

/// Caller-owned memory a request reads into or writes from.
pub struct BorrowedBuf {
    ptr: *mut u8,
    cap: usize,
    len: usize,
}

// SAFETY: the memory is only touched by the request it is lent to, until its completion.
unsafe impl Send for BorrowedBuf {}

impl IoBuf {
    /// Lends `cap` bytes at `ptr` (reads fill them; writes send the first `len` asked for).
    ///
    /// # Safety
    /// The memory must stay valid, and untouched by anything else, until the request's
    /// completion has been received.
    pub unsafe fn borrowed(ptr: *mut u8, cap: usize) -> IoBuf {
        IoBuf::Borrowed(BorrowedBuf { ptr, cap, len: cap })
    }

    /// Bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        match self {
            IoBuf::Heap(b) => b.capacity(),
            IoBuf::Fixed(f) => f.buf().capacity(),
            IoBuf::Borrowed(b) => b.cap,
        }
    }

    fn base_ptr(&mut self) -> *mut u8 {
        match self {
            IoBuf::Heap(b) => b.full_mut().as_mut_ptr(),
            IoBuf::Fixed(f) => f.buf_mut().full_mut().as_mut_ptr(),
            IoBuf::Borrowed(b) => b.ptr,
        }
    }

    fn set_len(&mut self, len: usize) {
        match self {
            IoBuf::Heap(b) => b.set_len(len),
            IoBuf::Fixed(f) => f.buf_mut().set_len(len),
            IoBuf::Borrowed(b) => b.len = len,
        }
    }

    /// The whole capacity, mutable.
    fn full_mut(&mut self) -> &mut [u8] {
        let (ptr, cap) = (self.base_ptr(), self.capacity());
        // SAFETY: each variant's pointer is valid for `capacity` bytes (borrowed memory by the
        // caller's promise), and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(ptr, cap) }
    }

    /// The valid bytes (for a completed read: the bytes asked for).
    pub fn as_slice(&self) -> &[u8] {
        match self {
            IoBuf::Heap(b) => b.as_slice(),
            IoBuf::Fixed(f) => f.buf().as_slice(),
            // SAFETY: as in `full_mut`.
            IoBuf::Borrowed(b) => unsafe { std::slice::from_raw_parts(b.ptr, b.len) },
        }
    }

    /// The heap buffer, if this is one.
    pub fn into_heap(self) -> Option<AlignedBuf> {
        match self {
            IoBuf::Heap(b) => Some(b),
            IoBuf::Fixed(_) | IoBuf::Borrowed(_) => None,
        }
    }
}

impl From<AlignedBuf> for IoBuf {
    fn from(b: AlignedBuf) -> Self {
        IoBuf::Heap(b)
    }
}

/// One I/O request.
pub struct Request {
    pub op: Op,
    pub file: IoFile,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes to transfer: a read fills `buf[..len]`; a write sends `buf[..len]`.
    pub len: usize,
    pub buf: IoBuf,
    /// The caller's identifier, returned in the completion.
    pub tag: u64,
}

impl Request {
    /// A read of `len` bytes at `offset` into `buf`.
    pub fn read(
        file: &IoFile,
        offset: u64,
        len: usize,
        buf: impl Into<IoBuf>,
        tag: u64,
    ) -> Request {
        Request {
            op: Op::Read,
            file: file.clone(),
            offset,
            len,
            buf: buf.into(),
            tag,
        }
    }

    /// A write of `buf[..len]` at `offset`.
    pub fn write(
        file: &IoFile,
        offset: u64,
        len: usize,
        buf: impl Into<IoBuf>,
        tag: u64,
    ) -> Request {
        Request {
            op: Op::Write,
            file: file.clone(),
            offset,
            len,
            buf: buf.into(),
            tag,
        }
    }
}

/// A finished request: its buffer comes back, with the bytes read at its start.
pub struct Completion {
    pub tag: u64,
    pub op: Op,
    pub offset: u64,
    pub buf: IoBuf,
    /// Bytes transferred, or the error.
    pub result: Result<usize>,
}

/// Which implementation moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// io_uring if the kernel offers it, else the thread pool.
    Auto,
    /// io_uring (Linux 5.6+).
    IoUring,
    /// pread/pwrite on a pool of threads (the fallback).
    Threads,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::IoUring => "io_uring",
            BackendKind::Threads => "threads",
        }
    }
}

/// How an engine is set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Backend to use; `auto` tries io_uring first.
    pub backend: BackendKind,
    /// Most requests in flight at once (the back-pressure window).
    pub depth: usize,
    /// Worker threads of the thread-pool backend.
    pub threads: usize,
    /// Register files with io_uring (saves a reference-count round trip per request).
    pub register_files: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            backend: BackendKind::Auto,
            depth: 256,
            threads: 32,
            register_files: true,
        }
    }
}

impl EngineConfig {
    /// The default configuration adjusted by `STRATA_IO_BACKEND` (`auto`, `io_uring`,
    /// `threads`) and `STRATA_IO_DEPTH`.
    pub fn from_env() -> EngineConfig {
        let mut cfg = EngineConfig::default();
        if let Ok(v) = std::env::var("STRATA_IO_BACKEND") {
            cfg.backend = match v.as_str() {
                "io_uring" | "uring" => BackendKind::IoUring,
                "threads" => BackendKind::Threads,
                _ => BackendKind::Auto,
            };
        }
        if let Some(d) = std::env::var("STRATA_IO_DEPTH")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            cfg.depth = d;
        }
        cfg
    }
}

struct Slot {
    req: Request,
    /// Where the completion goes; set when the request enters flight.
    sink: Option<Sender<Completion>>,
    started: Instant,
    /// File offset of the first byte transferred (aligned down for a covering read).
    start: u64,
    /// Bytes that must arrive for the request to be satisfied.
    need: usize,
    /// Bytes to ask for (a covering read asks for whole blocks; the last may come back short).
    ask: usize,
    /// Offset of the requested bytes within what is read.
    skip: usize,
    done: usize,
    bounce: Option<AlignedBuf>,
}

/// Requests in flight, addressed by index (the io_uring `user_data`).
#[derive(Default)]
struct Slots {
    entries: Vec<Option<Slot>>,
    free: Vec<usize>,
}

impl Slots {
    fn is_empty(&self) -> bool {
        self.free.len() == self.entries.len()
    }

    fn insert(&mut self, slot: Slot) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.entries[i] = Some(slot);
                i
            }
            None => {
                self.entries.push(Some(slot));
                self.entries.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) -> Slot {
        self.free.push(i);
        self.entries[i].take().expect("completion of a free slot")
    }
}

/// Back-pressure: at most `cap` requests in flight.
struct Window {
    cap: usize,
    /// Places in use, and submitters waiting for one.
    state: Mutex<(usize, usize)>,
    freed: Condvar,
}

impl Window {
    fn new(cap: usize) -> Self {
        Window {
            cap,
            state: Mutex::new((0, 0)),
            freed: Condvar::new(),
        }
    }

    /// Takes up to `want` places if any is free; returns how many it took.
    fn try_acquire(&self, want: usize) -> usize {
        let mut state = self.state.lock().unwrap();
        let n = want.min(self.cap - state.0);
        state.0 += n;
        n
    }

    /// Waits for room and takes up to `want` places; returns how many it took (>= 1).
    fn acquire(&self, want: usize) -> usize {
        let mut state = self.state.lock().unwrap();
        while state.0 >= self.cap {
            state.1 += 1;
            state = self.freed.wait(state).unwrap();
            state.1 -= 1;
        }
        let n = want.min(self.cap - state.0);
        state.0 += n;
        n
    }

    fn has_room(&self) -> bool {
        self.state.lock().unwrap().0 < self.cap
    }

    fn release(&self, n: usize) {
        let mut state = self.state.lock().unwrap();
        state.0 -= n;
        // Waking costs a system call: only when a submitter is actually waiting.
        if state.1 > 0 {
            self.freed.notify_all();
        }
    }
}

enum Backend {
    Uring(Box<uring::Uring>),
    Threads(threads::Threads),
}

/// State shared by the engine, its workers, and its files.
pub(crate) struct Inner {
    backend: Backend,
    slots: Mutex<Slots>,
    window: Window,
    stats: IoStats,
    kind: BackendKind,
    fallback: Option<String>,
}

/// The I/O engine (see the module documentation). Share it behind an `Arc`.
pub struct Engine {
    inner: Arc<Inner>,
    /// Thread-pool workers (none with io_uring).
    workers: Vec<std::thread::JoinHandle<()>>,
}

static SHARED: OnceLock<Arc<Engine>> = OnceLock::new();
static SHARED_CONFIG: Mutex<Option<EngineConfig>> = Mutex::new(None);

impl Engine {
    /// Starts an engine. `Auto` falls back to the thread pool when io_uring cannot be used and
    /// records why; asking for `IoUring` explicitly fails instead.
    pub fn new(cfg: &EngineConfig) -> Result<Arc<Engine>> {
        let depth = cfg.depth.max(1);
        let (backend, kind, fallback) = match cfg.backend {
            BackendKind::Threads => (
                Backend::Threads(threads::Threads::new()),
                BackendKind::Threads,
                None,
            ),
            BackendKind::IoUring => match uring::Uring::new(depth, cfg.register_files) {
                Ok(u) => (Backend::Uring(Box::new(u)), BackendKind::IoUring, None),
                Err(why) => {
                    return Err(IoError::Unsupported(format!(
                        "io_uring is unavailable: {why}"
                    )))
                }
            },
            BackendKind::Auto => match uring::Uring::new(depth, cfg.register_files) {
                Ok(u) => (Backend::Uring(Box::new(u)), BackendKind::IoUring, None),
                Err(why) => (
                    Backend::Threads(threads::Threads::new()),
                    BackendKind::Threads,
                    Some(why),
                ),
            },
        };
        let inner = Arc::new(Inner {
            backend,
            slots: Mutex::new(Slots::default()),
            window: Window::new(depth),
            stats: IoStats::default(),
            kind,
            fallback,
        });
        let workers = match &inner.backend {
            Backend::Uring(_) => Vec::new(),
            Backend::Threads(pool) => {
                threads::spawn_workers(inner.clone(), pool.queue(), cfg.threads.max(1))
            }
        };
        Ok(Arc::new(Engine { inner, workers }))
    }

    /// The process-wide engine every store reader and writer uses, created on first use
    /// from [`Engine::configure_shared`]'s configuration or else [`EngineConfig::from_env`].
    pub fn shared() -> Arc<Engine> {
        SHARED
            .get_or_init(|| {
                let cfg = SHARED_CONFIG
                    .lock()
                    .unwrap()
                    .clone()
                    .unwrap_or_else(EngineConfig::from_env);
                Engine::new(&cfg).unwrap_or_else(|e| {
                    let fallback = EngineConfig {
                        backend: BackendKind::Threads,
                        ..cfg
                    };
                    eprintln!("strata: {e}; using the thread-pool backend");
                    Engine::new(&fallback).expect("the thread-pool backend always starts")
                })
            })
            .clone()
    }

    /// Sets the configuration of the shared engine. Fails once the shared engine exists with
    /// a different configuration.
    pub fn configure_shared(cfg: EngineConfig) -> Result<()> {
        if let Some(existing) = SHARED.get() {
            let same = existing.kind() == cfg.backend || cfg.backend == BackendKind::Auto;
            if !same || existing.depth() != cfg.depth {
                return Err(IoError::Unsupported(format!(
                    "the I/O engine is already running as {} with depth {}; configure it before the first I/O",
                    existing.kind().name(),
                    existing.depth()
                )));
            }
            return Ok(());
        }
        *SHARED_CONFIG.lock().unwrap() = Some(cfg);
        Ok(())
    }

    /// The backend in use (`IoUring` or `Threads`).
    pub fn kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// Why io_uring was not used, when `Auto` fell back to threads.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback.as_deref()
    }

    /// The in-flight window.
    pub fn depth(&self) -> usize {
        self.inner.window.cap
    }

    /// Counters since the engine started.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// A new completion queue (a channel pair) bound to this engine.
    pub fn queue(self: &Arc<Self>) -> IoQueue {
        let (tx, rx) = crossbeam_channel::unbounded();
        IoQueue {
            engine: self.clone(),
            tx,
            rx,
            pending: 0,
        }
    }

    /// Submits `reqs`; their completions go to `sink`. Blocks while the in-flight window is
    /// full. Requests the engine can reject up front (a read past the end of its file, an
    /// unaligned direct write) complete at once with the error.
    pub fn submit(&self, reqs: impl IntoIterator<Item = Request>, sink: &Sender<Completion>) {
        let mut batch = Vec::new();
        for req in reqs {
            match self.inner.prepare(req) {
                Ok(slot_parts) => batch.push(slot_parts),
                Err(rejected) => {
                    let (req, e) = *rejected;
                    deliver(sink, req, Err(e))
                }
            }
        }
        let mut rest = &mut batch[..];
        while !rest.is_empty() {
            let n = self.inner.take_places(rest.len());
            let (now, later) = rest.split_at_mut(n);
            self.inner.launch(now, sink);
            rest = later;
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Backend::Threads(t) = &self.inner.backend {
            t.shutdown();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The kernel may still write into buffers of requests in flight: wait for them before
        // the buffers (and the ring) are freed.
        if let Backend::Uring(u) = &self.backend {
            while !self.slots.lock().unwrap().is_empty() {
                u.reap(self, &|| false);
            }
        }
    }
}

fn deliver(sink: &Sender<Completion>, req: Request, result: Result<usize>) {
    let _ = sink.send(Completion {
        tag: req.tag,
        op: req.op,
        offset: req.offset,
        buf: req.buf,
        result,
    });
}

/// A prepared request: the slot it will occupy, before it enters flight.
type Prepared = Option<Slot>;

impl Inner {
    /// Plans a request: covering range, bounce buffer, checks. Errors give the request back.
    fn prepare(&self, mut req: Request) -> std::result::Result<Prepared, Box<(Request, IoError)>> {
        let direct = req.file.is_direct();
        let path = req.file.path().to_path_buf();
        match req.op {
            Op::Read => {
                let end = req.offset + req.len as u64;
                let size = match req.file.size_at_least(end) {
                    Ok(s) => s,
                    Err(e) => return Err(Box::new((req, e))),
                };
                if end > size {
                    let e = IoError::PastEnd {
                        path,
                        offset: req.offset,
                        len: req.len as u64,
                        file_len: size,
                    };
                    return Err(Box::new((req, e)));
                }
                let buf_aligned = (req.buf.base_ptr() as usize).is_multiple_of(ALIGN);
                let (start, ask, skip) = if direct
                    && !(req.offset.is_multiple_of(ALIGN as u64)
                        && req.len.is_multiple_of(ALIGN)
                        && buf_aligned)
                {
                    let start = align_down(req.offset);
                    let cover = (align_up(end) - start) as usize;
                    (start, cover, (req.offset - start) as usize)
                } else {
                    (req.offset, req.len, 0)
                };
                let bounce = if ask > req.buf.capacity() {
                    Some(AlignedBuf::new(ask))
                } else {
                    None
                };
                if req.len > req.buf.capacity() {
                    let e = IoError::Invalid(format!(
                        "read of {} bytes into a buffer of {}",
                        req.len,
                        req.buf.capacity()
                    ));
                    return Err(Box::new((req, e)));
                }
                req.buf.set_len(0);
                Ok(Some(Slot {
                    need: skip + req.len,
                    ask,
                    skip,
                    start,
                    done: 0,
                    bounce,
                    started: Instant::now(),
                    sink: None,
                    req,
                }))
            }
            Op::Write => {
                let aligned = req.offset.is_multiple_of(ALIGN as u64)
                    && req.len.is_multiple_of(ALIGN)
                    && (req.buf.base_ptr() as usize).is_multiple_of(ALIGN);
                if direct && !aligned {
                    let e = IoError::Invalid(format!(
                        "unaligned O_DIRECT write to {} at offset {} of {} bytes (offset, length and buffer must be multiples of {ALIGN})",
                        path.display(),
                        req.offset,
                        req.len
                    ));
                    return Err(Box::new((req, e)));
                }
                if req.len > req.buf.capacity() {
                    let e = IoError::Invalid(format!(
                        "write of {} bytes from a buffer of {}",
                        req.len,
                        req.buf.capacity()
                    ));
                    return Err(Box::new((req, e)));
                }
                Ok(Some(Slot {
                    need: req.len,
                    ask: req.len,
                    skip: 0,
                    start: req.offset,
                    done: 0,
                    bounce: None,
                    started: Instant::now(),
                    sink: None,
                    req,
                }))
            }
        }
    }

    /// Takes up to `want` places in the window, waiting for at least one. With io_uring the
    /// waiting thread reaps completions itself, which is what frees places.
    fn take_places(&self, want: usize) -> usize {
        match &self.backend {
            Backend::Uring(u) => loop {
                let n = self.window.try_acquire(want);
                if n > 0 {
                    return n;
                }
                u.reap(self, &|| self.window.has_room());
            },
            Backend::Threads(_) => self.window.acquire(want),
        }
    }

    /// Puts prepared requests in flight (their window places are already taken).
    fn launch(&self, batch: &mut [Prepared], sink: &Sender<Completion>) {
        let mut transfers = Vec::with_capacity(batch.len());
        {
            let mut slots = self.slots.lock().unwrap();
            for p in batch.iter_mut() {
                let mut slot = p.take().expect("each prepared request launches once");
                slot.sink = Some(sink.clone());
                slot.started = Instant::now();
                self.stats.submitted();
                let t = transfer_of(&mut slot);
                let id = slots.insert(slot);
                transfers.push((id, t));
            }
        }
        match &self.backend {
            Backend::Uring(u) => u.push(self, &transfers),
            Backend::Threads(t) => t.push(&transfers),
        }
    }
}

impl Advance for Inner {
    /// Accounts for a system call's result `res` (bytes, or `-errno`) on slot `id`: either the
    /// next transfer of a partly done request, or `Done` after delivering the completion.
    fn advance(&self, id: usize, res: i64) -> Next {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entries[id].as_mut().expect("live slot");
        let outcome = if res < 0 {
            let err = std::io::Error::from_raw_os_error((-res) as i32);
            let op = if slot.req.op == Op::Read {
                "read"
            } else {
                "write"
            };
            Some(Err(IoError::os(
                op,
                slot.req.file.path(),
                slot.start + slot.done as u64,
                err,
            )))
        } else if res == 0 && slot.done < slot.need {
            Some(Err(match slot.req.op {
                Op::Read => IoError::PastEnd {
                    path: slot.req.file.path().to_path_buf(),
                    offset: slot.req.offset,
                    len: slot.req.len as u64,
                    file_len: slot.start + slot.done as u64,
                },
                Op::Write => IoError::DiskFull {
                    path: slot.req.file.path().to_path_buf(),
                    offset: slot.start + slot.done as u64,
                },
            }))
        } else {
            slot.done += res as usize;
            if slot.done >= slot.need {
                Some(Ok(slot.req.len))
            } else {
                None
            }
        };
        let Some(result) = outcome else {
            return Next::Again(transfer_of(slot));
        };
        let mut slot = slots.remove(id);
        drop(slots);
        let ok = result.is_ok();
        if ok && slot.req.op == Op::Read {
            finish_read(&mut slot);
        }
        let ns = slot.started.elapsed().as_nanos() as u64;
        self.stats
            .completed(slot.req.op == Op::Write, slot.req.len as u64, ns, ok);
        let Slot { req, sink, .. } = slot;
        deliver(&sink.expect("a slot in flight has a sink"), req, result);
        self.window.release(1);
        Next::Done
    }
}

fn transfer_of(slot: &mut Slot) -> Transfer {
    let fixed_buf = match (&slot.req.buf, &slot.bounce) {
        (IoBuf::Fixed(f), None) => f.index(),
        _ => None,
    };
    let target: &mut [u8] = match slot.bounce.as_mut() {
        Some(b) => b.full_mut(),
        None => slot.req.buf.full_mut(),
    };
    // SAFETY: `done < ask <= capacity`, so the pointer stays inside the buffer.
    let ptr = unsafe { target.as_mut_ptr().add(slot.done) };
    Transfer {
        op: slot.req.op,
        fd: slot.req.file.raw_fd(),
        fixed_file: slot.req.file.fixed_index(),
        fixed_buf,
        ptr,
        len: slot.ask - slot.done,
        offset: slot.start + slot.done as u64,
    }
}

/// Moves the requested bytes of a covering read to the start of the caller's buffer.
fn finish_read(slot: &mut Slot) {
    let (skip, len) = (slot.skip, slot.req.len);
    match slot.bounce.take() {
        Some(b) => {
            slot.req.buf.full_mut()[..len].copy_from_slice(&b.prefix(skip + len)[skip..]);
            slot.req.buf.set_len(len);
        }
        None => {
            if skip > 0 {
                slot.req.buf.full_mut().copy_within(skip..skip + len, 0);
            }
            slot.req.buf.set_len(len);
        }
    }
}

/// A completion channel bound to an engine, counting what it has outstanding.
pub struct IoQueue {
    engine: Arc<Engine>,
    tx: Sender<Completion>,
    rx: Receiver<Completion>,
    pending: usize,
}

impl IoQueue {
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Submits requests whose completions come back to this queue.
    pub fn submit(&mut self, reqs: impl IntoIterator<Item = Request>) {
        let reqs: Vec<Request> = reqs.into_iter().collect();
        self.pending += reqs.len();
        self.engine.submit(reqs, &self.tx);
    }

    /// Requests submitted and not yet returned by [`IoQueue::wait`] or [`IoQueue::poll`].
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// The next completion, waiting for it; `None` when nothing is outstanding.
    pub fn wait(&mut self) -> Option<Completion> {
        if self.pending == 0 {
            return None;
        }
        let inner = self.engine.inner();
        let c = match &inner.backend {
            Backend::Uring(u) => loop {
                if let Ok(c) = self.rx.try_recv() {
                    break c;
                }
                u.reap(&**inner, &|| !self.rx.is_empty());
            },
            Backend::Threads(_) => self.rx.recv().expect("the engine outlives its queues"),
        };
        self.pending -= 1;
        Some(c)
    }

    /// Waits for every outstanding request and returns the first error among them. Every
    /// completion is received either way, so buffers lent to the requests are free again when
    /// it returns; the completions themselves (and their buffers) are dropped.
    pub fn drain(&mut self) -> Result<()> {
        let mut first_error = None;
        while let Some(c) = self.wait() {
            if let Err(e) = c.result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// A completion if one is ready, without waiting.
    pub fn poll(&mut self) -> Option<Completion> {
        if self.rx.is_empty() {
            if let Backend::Uring(u) = &self.engine.inner().backend {
                u.try_reap(&**self.engine.inner());
            }
        }
        let c = self.rx.try_recv().ok()?;
        self.pending -= 1;
        Some(c)
    }
}

#[cfg(test)]
mod tests;
