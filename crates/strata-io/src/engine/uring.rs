//! The io_uring backend: submissions from any thread under a lock on the submission queue;
//! completions reaped by whichever thread waits for one, under a lock on the completion
//! queue, and dispatched to their owners.

use std::sync::Mutex;

use io_uring::{opcode, squeue, types, IoUring};

use super::{Inner, Next, Op, Transfer};
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
        })
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
    /// ring's size allows.
    pub(super) fn push(&self, transfers: &[(usize, Transfer)]) {
        let entries: Vec<squeue::Entry> = transfers
            .iter()
            .map(|(id, t)| Self::entry(t).user_data(*id as u64))
            .collect();
        self.push_entries(&entries);
    }

    fn push_entries(&self, entries: &[squeue::Entry]) {
        let _guard = self.sq.lock().unwrap();
        let mut rest = entries;
        while !rest.is_empty() {
            {
                // SAFETY: the `sq` lock makes this the only submission-queue view.
                let mut sq = unsafe { self.ring.submission_shared() };
                while let Some((e, tail)) = rest.split_first() {
                    // SAFETY: every pointer in the entry refers to memory owned by its in-flight
                    // slot, which lives until the completion is reaped.
                    if unsafe { sq.push(e) }.is_err() {
                        break;
                    }
                    rest = tail;
                }
            }
            // Submit what is queued; when the ring was full this makes room for the rest.
            loop {
                match self.ring.submitter().submit() {
                    Ok(_) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY)
                            || e.raw_os_error() == Some(libc::EAGAIN) =>
                    {
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("io_uring_enter failed: {e}"),
                }
            }
        }
    }

    /// Reaps and dispatches completions. Sleeps in the kernel for at least one, unless
    /// `satisfied()` (checked under the completion-queue lock, so a completion delivered by
    /// another reaper is never missed) says the caller's wait is over.
    pub(super) fn reap(&self, inner: &Inner, satisfied: &dyn Fn() -> bool) {
        let _cq = self.cq.lock().unwrap();
        loop {
            if self.drain(inner) > 0 || satisfied() {
                return;
            }
            // SAFETY: no argument is passed; the flag only asks to wait for one completion.
            let _ = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    0,
                    1,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
        }
    }

    /// Reaps what is ready without waiting, unless another thread is reaping.
    pub(super) fn try_reap(&self, inner: &Inner) {
        if let Ok(_cq) = self.cq.try_lock() {
            self.drain(inner);
        }
    }

    /// Dispatches every completion in the queue; the caller holds the `cq` lock.
    fn drain(&self, inner: &Inner) -> usize {
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
            self.push_entries(&again);
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
