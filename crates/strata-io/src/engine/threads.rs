//! The thread-pool backend: pread/pwrite on worker threads, for systems without io_uring.
//! Each worker finishes its request (looping over short transfers) and delivers the
//! completion itself.

use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};

use super::transfer::{Advance, Next, Op, Transfer};

pub(super) struct Threads {
    jobs: Mutex<Option<Sender<(usize, Transfer)>>>,
    queue: Receiver<(usize, Transfer)>,
}

impl Threads {
    pub(super) fn new() -> Threads {
        let (tx, rx) = crossbeam_channel::unbounded();
        Threads {
            jobs: Mutex::new(Some(tx)),
            queue: rx,
        }
    }

    pub(super) fn push(&self, transfers: &[(usize, Transfer)]) {
        let jobs = self.jobs.lock().unwrap();
        let tx = jobs.as_ref().expect("push after shutdown");
        for &(id, t) in transfers {
            tx.send((id, t)).expect("workers run until shutdown");
        }
    }

    /// The queue the workers take transfers from (it ends at [`Threads::shutdown`]).
    pub(super) fn queue(&self) -> Receiver<(usize, Transfer)> {
        self.queue.clone()
    }

    /// Lets the workers finish what is queued and exit.
    pub(super) fn shutdown(&self) {
        self.jobs.lock().unwrap().take();
    }
}

/// One pread/pwrite: bytes moved, or `-errno`.
fn perform(t: &Transfer) -> i64 {
    loop {
        // SAFETY: `t.ptr` points to `t.len` bytes of a buffer owned by the in-flight slot.
        let n = unsafe {
            match t.op {
                Op::Read => libc::pread(
                    t.fd,
                    t.ptr as *mut libc::c_void,
                    t.len,
                    t.offset as libc::off_t,
                ),
                Op::Write => libc::pwrite(
                    t.fd,
                    t.ptr as *const libc::c_void,
                    t.len,
                    t.offset as libc::off_t,
                ),
            }
        };
        if n >= 0 {
            return n as i64;
        }
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if errno != libc::EINTR {
            return -(errno as i64);
        }
    }
}

/// Starts `n` workers performing the transfers of `queue` for the engine behind `inner`.
pub(super) fn spawn_workers<A: Advance + Send + Sync + 'static>(
    inner: Arc<A>,
    queue: Receiver<(usize, Transfer)>,
    n: usize,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let (inner, queue) = (inner.clone(), queue.clone());
            std::thread::Builder::new()
                .name(format!("strata-io-{i}"))
                .spawn(move || {
                    for (id, mut t) in queue.iter() {
                        while let Next::Again(next) = inner.advance(id, perform(&t)) {
                            t = next;
                        }
                    }
                })
                .expect("spawn an I/O worker")
        })
        .collect()
}
