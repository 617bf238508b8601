//! What the io_uring transport's client and server rings share: setting a ring up (with the
//! reason in words when this process cannot use io_uring), and waiting for completions with a
//! deadline so that every loop around a ring stays bounded.

use std::io;
use std::time::Duration;

use io_uring::{opcode, types, IoUring};

use crate::error::FarError;

/// Sets up a ring of `entries` submission slots and checks that the kernel has every operation
/// in `ops` (code, name) and the extended wait arguments ([`wait`]'s deadline, Linux 5.11).
/// [`FarError::Unsupported`] says why io_uring cannot be used.
pub(crate) fn ring(entries: u32, ops: &[(u8, &str)]) -> Result<IoUring, FarError> {
    let ring = IoUring::new(entries).map_err(|e| {
        FarError::Unsupported(format!(
            "io_uring is unavailable: {}",
            strata_io::explain_uring_setup_error(&e)
        ))
    })?;
    if !ring.params().is_feature_ext_arg() {
        return Err(FarError::Unsupported(
            "the kernel's io_uring cannot wait with a deadline (needs Linux 5.11 or later)".into(),
        ));
    }
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| FarError::Unsupported(format!("io_uring probe failed: {e}")))?;
    for (code, name) in ops {
        if !probe.is_supported(*code) {
            return Err(FarError::Unsupported(format!(
                "the kernel's io_uring lacks IORING_OP_{name}"
            )));
        }
    }
    Ok(ring)
}

/// The operations the client's data path uses.
pub(crate) const CLIENT_OPS: [(u8, &str); 3] = [
    (opcode::SendMsg::CODE, "SENDMSG"),
    (opcode::Recv::CODE, "RECV"),
    (opcode::Read::CODE, "READ"),
];

/// Submits what is queued and waits up to `timeout` for at least one completion. A timeout or a
/// signal is not an error: the caller reaps whatever completed and checks its deadlines.
pub(crate) fn wait(ring: &IoUring, timeout: Duration) -> io::Result<()> {
    let ts = types::Timespec::from(timeout);
    let args = types::SubmitArgs::new().timespec(&ts);
    match ring.submitter().submit_with_args(1, &args) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ETIME | libc::EINTR | libc::EBUSY)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The iovec and message header of a send of `head[done..]` followed by the rest of `body`
/// (`done` counts bytes of both already sent). The returned header points into `iov`.
pub(crate) fn send_parts_msg(
    iov: &mut [libc::iovec; 2],
    head: &[u8],
    body: (*const u8, usize),
    done: usize,
) -> libc::msghdr {
    let from_head = done.min(head.len());
    let from_body = done - from_head;
    iov[0] = libc::iovec {
        // SAFETY (of the later use): offsets stay within `head`.
        iov_base: head[from_head..].as_ptr().cast_mut().cast(),
        iov_len: head.len() - from_head,
    };
    iov[1] = libc::iovec {
        iov_base: body.0.wrapping_add(from_body).cast_mut().cast(),
        iov_len: body.1 - from_body,
    };
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = 2;
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_parts_msg_skips_what_was_sent() {
        let head = [1u8; 48];
        let body = [2u8; 100];
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let msg = send_parts_msg(&mut iov, &head, (body.as_ptr(), body.len()), 0);
        assert_eq!(
            (msg.msg_iovlen, iov[0].iov_len, iov[1].iov_len),
            (2, 48, 100)
        );
        send_parts_msg(&mut iov, &head, (body.as_ptr(), body.len()), 50);
        assert_eq!((iov[0].iov_len, iov[1].iov_len), (0, 98));
        assert_eq!(iov[1].iov_base as usize, body.as_ptr() as usize + 2);
        send_parts_msg(&mut iov, &head, (body.as_ptr(), body.len()), 148);
        assert_eq!((iov[0].iov_len, iov[1].iov_len), (0, 0));
    }
}
