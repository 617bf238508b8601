//! The server's `uring` reply path: a READ reply (header and the segment's bytes) leaves with
//! one zero-copy send, `IORING_OP_SENDMSG_ZC`, so the kernel sends from the segment's pages
//! instead of copying them into socket buffers first. The connection's thread waits for the
//! send's notification (the kernel done with the pages) before it returns, while it still holds
//! the segment's read lock, so the bytes cannot change or be freed under the send.
//!
//! On loopback this saves nothing: the kernel copies zero-copy pages when the packets are
//! delivered to a local socket (`skb_orphan_frags_rx`; "all packets generated with MSG_ZEROCOPY
//! that are looped to a local socket will incur a deferred copy", the kernel's
//! `msg_zerocopy.rst`). Every send asks the kernel to report that
//! (`IORING_SEND_ZC_REPORT_USAGE`) and the server counts the copied sends
//! ([`ZeroCopyStats`]), so the effect is measured, not assumed. Across a real NIC the pages go
//! out by DMA.
//!
//! The segment memory is not registered as fixed buffers: segments are allocated at run time by
//! any session, would have to be registered in every connection's ring, and registered memory
//! counts against `RLIMIT_MEMLOCK` (8 MiB by default, far below a segment), so the kernel pins
//! the pages per send instead.
//!
//! When the kernel refuses zero-copy sends (or io_uring is unavailable) the connection falls
//! back to plain vectored writes, and the server says so once on stderr.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use io_uring::{cqueue, opcode, types, IoUring};

use crate::error::FarError;
use crate::protocol;
use crate::uring;
use crate::TransportKind;

/// `IORING_SEND_ZC_REPORT_USAGE` (Linux 6.2): the notification says whether the kernel copied.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`: set in a notification's result when the data was copied.
const NOTIF_USAGE_ZC_COPIED: i32 = i32::MIN;
/// How often a send waiting on the kernel checks again. The send has no deadline of its own,
/// like a blocking write: stopping the server shuts the socket down, which ends it.
const TICK: Duration = Duration::from_millis(100);
/// Longest time sent data may stay unacknowledged on a zero-copy connection before TCP aborts
/// it (`TCP_USER_TIMEOUT`). The kernel gives zero-copy pages back (the notification a reply
/// waits for) only once the peer acknowledged them, and shutting the socket down does not hasten
/// that: without this, a peer that vanished mid-reply would hold the connection's thread, and a
/// stopping server, for TCP's retransmission limit (about 15 minutes).
const UNACKNOWLEDGED_LIMIT_MS: u32 = 30_000;

/// Counts of a server's zero-copy sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroCopyStats {
    /// Zero-copy sends completed.
    pub sends: u64,
    /// Of those, sends whose bytes the kernel copied anyway (all of them on loopback).
    pub copied: u64,
}

/// The server's zero-copy counters and its one-time fallback notice.
#[derive(Default)]
pub(crate) struct ZeroCopyCounters {
    sends: AtomicU64,
    copied: AtomicU64,
    fell_back: AtomicBool,
}

impl ZeroCopyCounters {
    pub(crate) fn snapshot(&self) -> ZeroCopyStats {
        ZeroCopyStats {
            sends: self.sends.load(Ordering::Relaxed),
            copied: self.copied.load(Ordering::Relaxed),
        }
    }

    fn fall_back(&self, why: &str) {
        if !self.fell_back.swap(true, Ordering::Relaxed) {
            eprintln!("strata farmem: {why}; sending READ replies with plain writes instead");
        }
    }
}

/// How one data connection sends READ replies.
pub(crate) enum Replier {
    /// Vectored writes on the blocking socket.
    Plain,
    /// Zero-copy sends through the connection's ring.
    ZeroCopy(Box<ZcSender>),
}

impl Replier {
    /// The replier for `transport` on `stream`; `uring` falls back to plain writes (said once)
    /// when the ring cannot be set up.
    pub(crate) fn new(
        transport: TransportKind,
        stream: &TcpStream,
        counters: &ZeroCopyCounters,
    ) -> Replier {
        match transport {
            TransportKind::Tcp => Replier::Plain,
            TransportKind::Uring => {
                let ring =
                    uring::ring(4, &[(opcode::SendMsgZc::CODE, "SENDMSG_ZC")]).and_then(|ring| {
                        protocol::user_timeout(stream, UNACKNOWLEDGED_LIMIT_MS)
                            .map(|()| ring)
                            .map_err(|e| FarError::io("setting TCP_USER_TIMEOUT", e))
                    });
                match ring {
                    Ok(ring) => Replier::ZeroCopy(Box::new(ZcSender {
                        ring,
                        iov: [libc::iovec {
                            iov_base: std::ptr::null_mut(),
                            iov_len: 0,
                        }; 2],
                        // SAFETY: msghdr is a plain C struct; all-zero is a valid value.
                        msg: unsafe { std::mem::zeroed() },
                    })),
                    Err(e) => {
                        counters.fall_back(&e.to_string());
                        Replier::Plain
                    }
                }
            }
        }
    }

    /// Sends `head` then `body` on `stream`, returning once the kernel no longer uses `body`.
    pub(crate) fn send(
        &mut self,
        stream: &mut TcpStream,
        head: &[u8],
        body: &[u8],
        counters: &ZeroCopyCounters,
    ) -> io::Result<()> {
        if let Replier::ZeroCopy(zc) = self {
            match zc.send(stream, head, body, counters) {
                Ok(()) => return Ok(()),
                Err(ZcError::Io(e)) => return Err(e),
                Err(ZcError::Refused(e)) => {
                    counters.fall_back(&format!("the kernel refused a zero-copy send ({e})"));
                    *self = Replier::Plain;
                }
            }
        }
        protocol::write_parts(stream, head, body)
    }
}

enum ZcError {
    /// The first send was refused before any byte went out: plain writes can take over.
    Refused(io::Error),
    Io(io::Error),
}

/// A connection's ring for zero-copy sends, with the iovecs and message header the kernel
/// reads while a send is in flight.
pub(crate) struct ZcSender {
    ring: IoUring,
    iov: [libc::iovec; 2],
    msg: libc::msghdr,
}

impl ZcSender {
    fn send(
        &mut self,
        stream: &TcpStream,
        head: &[u8],
        body: &[u8],
        counters: &ZeroCopyCounters,
    ) -> Result<(), ZcError> {
        let total = head.len() + body.len();
        let (mut done, mut in_flight, mut notifications) = (0usize, false, 0usize);
        let mut failed: Option<io::Error> = None;
        loop {
            if failed.is_none() && done < total && !in_flight {
                self.msg =
                    uring::send_parts_msg(&mut self.iov, head, (body.as_ptr(), body.len()), done);
                let entry = opcode::SendMsgZc::new(types::Fd(stream.as_raw_fd()), &self.msg)
                    .ioprio(SEND_ZC_REPORT_USAGE)
                    .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
                    .build();
                // SAFETY: the message header, its iovecs and the bytes they point to (this
                // sender's fields, and `head`/`body` borrowed for the call) stay valid until the
                // send and its notification have completed, which this loop waits for.
                if unsafe { self.ring.submission().push(&entry) }.is_err() {
                    return Err(ZcError::Io(io::Error::other(
                        "io_uring submission queue full",
                    )));
                }
                in_flight = true;
            }
            if !in_flight && notifications == 0 {
                break;
            }
            uring::wait(&self.ring, TICK).map_err(ZcError::Io)?;
            for c in self.ring.completion() {
                if cqueue::notif(c.flags()) {
                    notifications -= 1;
                    counters.sends.fetch_add(1, Ordering::Relaxed);
                    if c.result() & NOTIF_USAGE_ZC_COPIED != 0 {
                        counters.copied.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                in_flight = false;
                if cqueue::more(c.flags()) {
                    notifications += 1;
                }
                match c.result() {
                    r if r < 0 => failed = Some(io::Error::from_raw_os_error(-r)),
                    r => done += r as usize,
                }
            }
        }
        match failed {
            None => Ok(()),
            Some(e)
                if done == 0
                    && matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) =>
            {
                Err(ZcError::Refused(e))
            }
            Some(e) => Err(ZcError::Io(e)),
        }
    }
}
