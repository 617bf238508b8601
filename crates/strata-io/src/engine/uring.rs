//! The io_uring backend: submissions from any thread under a lock on the submission queue;
//! completions reaped by whichever thread waits for one, under a lock on the completion
//! queue, and dispatched to their owners.
//!
//! A submission the kernel refuses for good (`io_uring_enter` failing with anything but a
//! transient error) closes the ring to submissions: the requests it held, and every later one,
//! complete with that error, while requests already in the kernel still complete normally.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use io_uring::{opcode, squeue, types, IoUring};

use super::transfer::{Advance, Next, Op, Transfer};
use crate::aligned::AlignedBuf;

/// Registered-file slots (a sparse table; a slot is taken per open file).
const FILE_SLOTS: u32 = 1024;
/// Registered-buffer slots (a sparse table; pools take ranges of it).
const BUF_SLOTS: u32 = 1024;

pub(super) struct Uring {
    ring: IoUring,
    sq: Mutex<()>,
    cq: Mutex<()>,
    free_files: Option<Mutex<Vec<u32>>>,
    free_bufs: Option<Mutex<Vec<u16>>>,
    /// The errno of the `io_uring_enter` that closed the ring to submissions (0 while open).
    refused: AtomicI32,
}

/// Why io_uring cannot be used here, in words, from an `io_uring_setup` error (shared with the
/// far-memory tier's rings).
pub fn explain_setup_error(e: &std::io::Error) -> String {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    match e.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel has no io_uring (needs Linux 5.6 or later)".into(),
        Some(libc::EPERM) if disabled == "2" => "io_uring is disabled by the sysctl kernel.io_uring_disabled=2".into(),
        Some(libc::EPERM) if disabled == "1" => {
            "io_uring is restricted by the sysctl kernel.io_uring_disabled=1 and this process may not use it".into()
        }
        Some(libc::EPERM) => "io_uring_setup was refused (EPERM: seccomp or a container policy)".into(),
        _ => format!("io_uring_setup failed: {e}"),
    }
}

impl Uring {
    /// Sets up a ring for `depth` requests in flight; the error says why io_uring is unusable.
    pub(super) fn new(depth: usize, register_files: bool) -> Result<Uring, String> {
        let entries = (depth.next_power_of_two() as u32).clamp(8, 4096);
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .build(entries)
            .map_err(|e| explain_setup_error(&e))?;
        let mut probe = io_uring::Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|e| format!("io_uring probe failed: {e}"))?;
        for (code, name) in [(opcode::Read::CODE, "READ"), (opcode::Write::CODE, "WRITE")] {
            if !probe.is_supported(code) {
                return Err(format!(
                    "the kernel's io_uring lacks IORING_OP_{name} (needs Linux 5.6 or later)"
                ));
            }
        }
        let free_files = (register_files
            && ring.submitter().register_files_sparse(FILE_SLOTS).is_ok())
        .then(|| Mutex::new((0..FILE_SLOTS).rev().collect()));
        let free_bufs = ring
            .submitter()
            .register_buffers_sparse(BUF_SLOTS)
            .is_ok()
            .then(|| Mutex::new((0..BUF_SLOTS as u16).rev().collect()));
        Ok(Uring {
            ring,
            sq: Mutex::new(()),
            cq: Mutex::new(()),
            free_files,
            free_bufs,
            refused: AtomicI32::new(0),
        })
    }

    /// The ring's file descriptor, for tests that make the kernel refuse it.
    #[cfg(test)]
    pub(super) fn ring_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.ring.as_raw_fd()
    }

    fn entry(t: &Transfer) -> squeue::Entry {
        macro_rules! build {
            ($fd:expr) => {
                match (t.op, t.fixed_buf) {
                    (Op::Read, Some(i)) => opcode::ReadFixed::new($fd, t.ptr, t.len as u32, i)
                        .offset(t.offset)
                        .build(),
                    (Op::Read, None) => opcode::Read::new($fd, t.ptr, t.len as u32)
                        .offset(t.offset)
                        .build(),
                    (Op::Write, Some(i)) => opcode::WriteFixed::new($fd, t.ptr, t.len as u32, i)
                        .offset(t.offset)
                        .build(),
                    (Op::Write, None) => opcode::Write::new($fd, t.ptr, t.len as u32)
                        .offset(t.offset)
                        .build(),
                }
            };
        }
        match t.fixed_file {
            Some(i) => build!(types::Fixed(i)),
            None => build!(types::Fd(t.fd)),
        }
    }

    /// Queues `transfers` (slot id, transfer) and submits them in as few system calls as the
    /// ring's size allows; those the kernel refuses complete with its error through `inner`.
    pub(super) fn push(&self, inner: &impl Advance, transfers: &[(usize, Transfer)]) {
        let entries: Vec<squeue::Entry> = transfers
            .iter()
            .map(|(id, t)| Self::entry(t).user_data(*id as u64))
            .collect();
        self.push_entries(inner, &entries);
    }

    fn push_entries(&self, inner: &impl Advance, entries: &[squeue::Entry]) {
        let guard = self.sq.lock().unwrap();
        let mut rest = entries;
        while !rest.is_empty() {
            let mut refused = self.refused.load(Ordering::Relaxed);
            if refused == 0 {
                let queued = self.queue(rest);
                match self.submit() {
                    Ok(()) => rest = &rest[queued..],
                    Err(errno) => {
                        // The kernel took none of this round's entries (it returns a count when
                        // it takes some); they stay in the queue, never submitted, since every
                        // later `io_uring_enter` asks for completions only.
                        self.refused.store(errno, Ordering::Relaxed);
                        refused = errno;
                    }
                }
            }
            if refused != 0 {
                drop(guard);
                for e in rest {
                    inner.advance(e.get_user_data() as usize, -(refused as i64));
                }
                return;
            }
        }
    }

    /// Copies as many of `entries` into the submission queue as fit; returns how many.
    fn queue(&self, entries: &[squeue::Entry]) -> usize {
        // SAFETY: the caller holds the `sq` lock, which makes this the only submission-queue view.
        let mut sq = unsafe { self.ring.submission_shared() };
        let mut queued = 0;
        for e in entries {
            // SAFETY: every pointer in the entry refers to memory owned by its in-flight slot,
            // which lives until the completion is reaped (or the request fails unsubmitted).
            if unsafe { sq.push(e) }.is_err() {
                break;
            }
            queued += 1;
        }
        queued
    }

    /// Submits what is queued, retrying transient refusals; when the ring was full this makes
    /// room for the rest. Returns the errno of a refusal that retrying cannot cure.
    fn submit(&self) -> Result<(), i32> {
        loop {
            match self.ring.submitter().submit() {
                Ok(_) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EBUSY | libc::EAGAIN) => std::thread::yield_now(),
                    errno => return Err(errno.unwrap_or(libc::EIO)),
                },
            }
        }
    }

    /// Reaps and dispatches completions. Sleeps in the kernel for at least one, unless
    /// `satisfied()` (checked under the completion-queue lock, so a completion delivered by
    /// another reaper is never missed) says the caller's wait is over.
    pub(super) fn reap(&self, inner: &impl Advance, satisfied: &dyn Fn() -> bool) {
        let _cq = self.cq.lock().unwrap();
        loop {
            if self.drain(inner) > 0 || satisfied() {
                return;
            }
            // SAFETY: no argument is passed; the flag only asks to wait for one completion.
            let entered = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    0,
                    1,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            if let Err(e) = entered {
                // A transient error retries at once. A ring the kernel no longer enters cannot
                // sleep there, but requests already in the kernel still complete into the
                // queue: poll it without spinning a core.
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
        }
    }

    /// Reaps what is ready without waiting, unless another thread is reaping.
    pub(super) fn try_reap(&self, inner: &impl Advance) {
        if let Ok(_cq) = self.cq.try_lock() {
            self.drain(inner);
        }
    }

    /// Dispatches every completion in the queue; the caller holds the `cq` lock.
    fn drain(&self, inner: &impl Advance) -> usize {
        let reaped: Vec<(u64, i32)> = {
            // SAFETY: the `cq` lock makes this the only completion-queue view.
            let cq = unsafe { self.ring.completion_shared() };
            cq.map(|cqe| (cqe.user_data(), cqe.result())).collect()
        };
        let again: Vec<squeue::Entry> = reaped
            .iter()
            .filter_map(
                |&(data, res)| match inner.advance(data as usize, res as i64) {
                    Next::Again(t) => Some(Self::entry(&t).user_data(data)),
                    Next::Done => None,
                },
            )
            .collect();
        if !again.is_empty() {
            self.push_entries(inner, &again);
        }
        reaped.len()
    }

    /// Registers `fd` in a free fixed-file slot; `None` when there is no free slot.
    pub(super) fn register_file(&self, fd: i32) -> Option<u32> {
        let slot = self.free_files.as_ref()?.lock().unwrap().pop()?;
        match self.ring.submitter().register_files_update(slot, &[fd]) {
            Ok(_) => Some(slot),
            Err(_) => {
                self.free_files.as_ref()?.lock().unwrap().push(slot);
                None
            }
        }
    }

    pub(super) fn unregister_file(&self, slot: u32) {
        let _ = self.ring.submitter().register_files_update(slot, &[-1]);
        if let Some(free) = &self.free_files {
            free.lock().unwrap().push(slot);
        }
    }

    /// Registers `bufs` in free buffer slots; `None` when there are not enough.
    pub(super) fn register_buffers(&self, bufs: &[AlignedBuf]) -> Option<Vec<u16>> {
        let mut free = self.free_bufs.as_ref()?.lock().unwrap();
        if free.len() < bufs.len() || bufs.is_empty() {
            return None;
        }
        let indices: Vec<u16> = (0..bufs.len()).map(|_| free.pop().unwrap()).collect();
        for (idx, buf) in indices.iter().zip(bufs) {
            let iov = libc::iovec {
                iov_base: buf.prefix(buf.capacity()).as_ptr() as *mut libc::c_void,
                iov_len: buf.capacity(),
            };
            // SAFETY: the buffer outlives its registration: the pool unregisters it before
            // freeing it.
            if unsafe {
                self.ring
                    .submitter()
                    .register_buffers_update(*idx as u32, &[iov], None)
            }
            .is_err()
            {
                free.extend(indices.iter().copied());
                return None;
            }
        }
        Some(indices)
    }

    pub(super) fn unregister_buffers(&self, indices: &[u16]) {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        for idx in indices {
            // SAFETY: an empty iovec unregisters the slot.
            let _ = unsafe {
                self.ring
                    .submitter()
                    .register_buffers_update(*idx as u32, &[empty], None)
            };
        }
        if let Some(free) = &self.free_bufs {
            free.lock().unwrap().extend_from_slice(indices);
        }
    }
}
