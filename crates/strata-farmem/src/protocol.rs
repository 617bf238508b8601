//! The far-memory wire protocol (version 2).
//!
//! Every message, request or reply, is a fixed 48-byte header followed by `payload_len` bytes of
//! payload. All integers are little-endian.
//!
//! | bytes  | field         | meaning                                                           |
//! |--------|---------------|-------------------------------------------------------------------|
//! | 0..4   | `magic`       | the ASCII bytes `SFMP`                                            |
//! | 4..6   | `version`     | [`VERSION`] (2)                                                   |
//! | 6      | `op`          | an operation code (see [`op`]); replies set the [`op::REPLY`] bit |
//! | 7      | `status`      | replies: a [`status`] code; requests: 0                           |
//! | 8..16  | `id`          | request id, chosen by the client, echoed by the reply             |
//! | 16..24 | `segment`     | segment id (HELLO reply / JOIN request: the session token)        |
//! | 24..32 | `offset`      | byte offset inside the segment                                    |
//! | 32..40 | `length`      | byte length of the operation                                      |
//! | 40..48 | `payload_len` | bytes of payload after the header                                 |
//!
//! # Connections
//!
//! A client opens one **control** connection and sends `HELLO`, whose payload is the server's
//! shared secret (empty for a server without one; at most [`MAX_TOKEN_BYTES`]). A server with a
//! secret answers any other payload with `UNAUTHENTICATED` and closes the connection; otherwise
//! it creates a session and answers with the session's token (in `segment`), its capacity in
//! bytes (`offset`) and its largest accepted message in bytes (`length`). The session token is
//! random: only the client it was sent to can join data connections to that session. The client then opens its **data** connections and sends
//! `JOIN` with the token in `segment` on each. Small control messages (`ALLOC`, `FREE`,
//! `CAPACITY`, `PING`, `STATS`) travel only on the control connection and bulk data (`WRITE`,
//! `READ`) only on data connections (Fargraph+ §6.3); the server answers a message on the wrong
//! kind of connection with a `PROTOCOL` error and closes that connection. When the control
//! connection closes, the session ends: the server closes its data connections and frees its
//! segments. Segment ids are private to a session.
//!
//! # Operations
//!
//! | op           | connection | request fields              | OK reply                                  |
//! |--------------|------------|-----------------------------|-------------------------------------------|
//! | `HELLO` (1)  | control    | payload = shared secret     | `segment` = token, `offset` = capacity, `length` = max message |
//! | `JOIN` (2)   | data       | `segment` = token           | -                                         |
//! | `ALLOC` (3)  | control    | `segment`, `length`         | -                                         |
//! | `FREE` (4)   | control    | `segment`                   | -                                         |
//! | `CAPACITY` (5)| control   | -                           | `offset` = free bytes, `length` = capacity |
//! | `PING` (6)   | control    | -                           | -                                         |
//! | `STATS` (7)  | control    | -                           | payload: 7 u64 (see [`crate::ServerStats`], field order) |
//! | `WRITE` (16) | data       | `segment`, `offset`, `length` = `payload_len`, payload = bytes | -  |
//! | `READ` (17)  | data       | `segment`, `offset`, `length` | same fields, payload = the `length` bytes |
//!
//! On a data connection the server answers requests strictly in order, one reply per request,
//! so a client may pipeline several requests (the client's `depth_per_connection`). A `READ`
//! reply is written straight from the segment's memory into the socket (header and data in one
//! vectored write), mimicking a one-sided RDMA read.
//!
//! # Errors
//!
//! A reply with a non-zero `status` carries a UTF-8 message as payload. `BAD_REQUEST` (unknown
//! segment, access outside a segment, duplicate segment) and `CAPACITY` (the reply's `offset` =
//! asked bytes, `length` = free bytes) leave the connection open. `PROTOCOL` (bad magic or
//! version, unknown op, message larger than the server's maximum, wrong connection kind) is
//! followed by the server closing that connection; other connections keep being served, as is
//! `UNAUTHENTICATED` (a HELLO without the server's secret) and `BUSY` (the server holds
//! [`crate::ServerConfig::max_connections`] connections already: try again later).

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use crate::error::{FarError, Result};

/// The four bytes every message starts with.
pub const MAGIC: [u8; 4] = *b"SFMP";
/// Protocol version spoken by this crate (2: HELLO carries the shared secret).
pub const VERSION: u16 = 2;
/// Size of the fixed message header, in bytes.
pub const HEADER_LEN: usize = 48;
/// Largest error-message payload a peer accepts, in bytes.
pub const MAX_ERROR_PAYLOAD: u64 = 64 * 1024;
/// Largest HELLO payload (the shared secret) a server reads, in bytes.
pub use strata_store::secret::MAX_TOKEN_BYTES;

/// Operation codes (the header's `op` byte).
pub mod op {
    /// Control: open a session.
    pub const HELLO: u8 = 1;
    /// Data: join a session's data connections.
    pub const JOIN: u8 = 2;
    /// Control: allocate a segment.
    pub const ALLOC: u8 = 3;
    /// Control: free a segment.
    pub const FREE: u8 = 4;
    /// Control: ask for free capacity.
    pub const CAPACITY: u8 = 5;
    /// Control: round trip.
    pub const PING: u8 = 6;
    /// Control: server statistics.
    pub const STATS: u8 = 7;
    /// Data: write one chunk into a segment.
    pub const WRITE: u8 = 16;
    /// Data: read one chunk of a segment.
    pub const READ: u8 = 17;
    /// Bit set in the `op` of every reply.
    pub const REPLY: u8 = 0x80;

    /// Human-readable name of an op code (for messages).
    pub fn name(op: u8) -> &'static str {
        match op & !REPLY {
            HELLO => "HELLO",
            JOIN => "JOIN",
            ALLOC => "ALLOC",
            FREE => "FREE",
            CAPACITY => "CAPACITY",
            PING => "PING",
            STATS => "STATS",
            WRITE => "WRITE",
            READ => "READ",
            _ => "UNKNOWN",
        }
    }
}

/// Reply status codes (the header's `status` byte).
pub mod status {
    /// Success.
    pub const OK: u8 = 0;
    /// The request is refused; the connection stays open.
    pub const BAD_REQUEST: u8 = 1;
    /// The allocation does not fit; `offset` = asked bytes, `length` = free bytes.
    pub const CAPACITY: u8 = 2;
    /// The peer broke the protocol; the server closes the connection after this reply.
    pub const PROTOCOL: u8 = 3;
    /// The HELLO did not carry the server's shared secret; the server closes the connection.
    pub const UNAUTHENTICATED: u8 = 4;
    /// The server holds as many connections as it serves; it closes this one.
    pub const BUSY: u8 = 5;
}

/// A decoded message header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Operation code ([`op`]), with [`op::REPLY`] set in replies.
    pub op: u8,
    /// Reply status ([`status`]); 0 in requests.
    pub status: u8,
    /// Request id, echoed by the reply.
    pub id: u64,
    /// Segment id (or session token for HELLO replies and JOIN requests).
    pub segment: u64,
    /// Byte offset inside the segment.
    pub offset: u64,
    /// Byte length of the operation.
    pub length: u64,
    /// Bytes of payload following the header.
    pub payload_len: u64,
}

impl Header {
    /// A request header with no payload.
    pub fn request(op: u8, id: u64, segment: u64, offset: u64, length: u64) -> Header {
        Header {
            op,
            status: status::OK,
            id,
            segment,
            offset,
            length,
            payload_len: 0,
        }
    }

    /// The OK reply to `req`, echoing its fields, with no payload.
    pub fn reply_to(req: &Header) -> Header {
        Header {
            op: req.op | op::REPLY,
            status: status::OK,
            payload_len: 0,
            ..*req
        }
    }

    /// Encodes the header into its 48 wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.op;
        b[7] = self.status;
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.segment.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.length.to_le_bytes());
        b[40..48].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Decodes 48 wire bytes, checking magic and version ([`FarError::Protocol`] otherwise).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header> {
        if b[0..4] != MAGIC {
            return Err(FarError::Protocol(format!(
                "bad magic {:02x?} (expected {:02x?} \"SFMP\"): not a far-memory peer",
                &b[0..4],
                MAGIC
            )));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(FarError::Protocol(format!(
                "protocol version {version} is not supported (this side speaks {VERSION})"
            )));
        }
        let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap());
        Ok(Header {
            op: b[6],
            status: b[7],
            id: u(8..16),
            segment: u(16..24),
            offset: u(24..32),
            length: u(32..40),
            payload_len: u(40..48),
        })
    }
}

/// Turns an error reply (its header and message payload) into a [`FarError`].
pub fn reply_error(h: &Header, message: &[u8]) -> FarError {
    let msg = String::from_utf8_lossy(message).into_owned();
    match h.status {
        status::CAPACITY => FarError::Capacity {
            asked: h.offset,
            free: h.length,
        },
        status::BAD_REQUEST => FarError::BadRequest(msg),
        status::PROTOCOL => FarError::Protocol(format!("server: {msg}")),
        status::UNAUTHENTICATED => FarError::Unauthenticated(msg),
        status::BUSY => FarError::Unavailable(format!("server busy: {msg}")),
        other => FarError::Protocol(format!("unknown reply status {other}: {msg}")),
    }
}

/// Outcome of waiting for a header on a socket with a read timeout.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderRead {
    /// A full header arrived.
    Got,
    /// The read timed out before any byte of a header arrived (the peer is idle).
    Idle,
    /// The peer closed the connection cleanly between messages.
    Closed,
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Reads one header. A timeout or EOF before the first byte is reported as [`HeaderRead::Idle`]
/// or [`HeaderRead::Closed`]; one in the middle of a header is an error.
pub(crate) fn read_header(
    stream: &mut impl Read,
    buf: &mut [u8; HEADER_LEN],
) -> io::Result<HeaderRead> {
    let mut got = 0;
    while got < HEADER_LEN {
        match stream.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(HeaderRead::Closed),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed in the middle of a message header",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got == 0 && is_timeout(&e) => return Ok(HeaderRead::Idle),
            Err(e) => return Err(e),
        }
    }
    Ok(HeaderRead::Got)
}

/// Writes `head` then `body` with vectored writes (one system call in the common case), so a
/// reply leaves in one TCP segment train instead of a small header packet plus data.
pub(crate) fn write_parts(stream: &mut impl Write, head: &[u8], body: &[u8]) -> io::Result<()> {
    let (mut h, mut b) = (0usize, 0usize);
    while h < head.len() || b < body.len() {
        let slices = [IoSlice::new(&head[h..]), IoSlice::new(&body[b..])];
        let n = match stream.write_vectored(&slices) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "connection accepted no more bytes",
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let from_head = n.min(head.len() - h);
        h += from_head;
        b += n - from_head;
    }
    Ok(())
}

/// Receives exactly `len` bytes from `stream` into raw memory at `dst`, without creating a
/// Rust reference to it (the destination may be uninitialised spare capacity of a `Vec`).
///
/// # Safety
/// `dst..dst + len` must be valid for writes and not accessed by anyone else during the call.
pub(crate) unsafe fn recv_exact_raw(
    stream: &TcpStream,
    dst: *mut u8,
    len: usize,
) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let mut got = 0usize;
    while got < len {
        // SAFETY: the caller guarantees the region is ours; the kernel writes at most len - got
        // bytes at dst + got.
        let n = unsafe {
            libc::recv(
                fd,
                dst.add(got).cast::<libc::c_void>(),
                len - got,
                libc::MSG_WAITALL,
            )
        };
        if n > 0 {
            got += n as usize;
        } else if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection closed after {got} of {len} payload bytes"),
            ));
        } else {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if is_timeout(&e) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("timed out after {got} of {len} payload bytes"),
                ));
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Socket buffer size asked for on every connection, in bytes (the kernel caps it at
/// `net.core.{r,w}mem_max`).
pub(crate) const SOCKET_BUFFER_BYTES: usize = 4 << 20;

fn set_int_opt(
    stream: &TcpStream,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a plain setsockopt on an open socket with an int-sized value.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            opt,
            (&value as *const libc::c_int).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets TCP_NODELAY and, where `bulk`, large send and receive buffers.
pub(crate) fn tune_socket(stream: &TcpStream, bulk: bool) -> io::Result<()> {
    stream.set_nodelay(true)?;
    if bulk {
        let size = SOCKET_BUFFER_BYTES as libc::c_int;
        set_int_opt(stream, libc::SOL_SOCKET, libc::SO_SNDBUF, size)?;
        set_int_opt(stream, libc::SOL_SOCKET, libc::SO_RCVBUF, size)?;
    }
    Ok(())
}

/// Makes TCP abort the connection when sent data stays unacknowledged for `ms` milliseconds
/// (`TCP_USER_TIMEOUT`), instead of retrying for up to about 15 minutes.
pub(crate) fn user_timeout(stream: &TcpStream, ms: u32) -> io::Result<()> {
    set_int_opt(
        stream,
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        ms.min(i32::MAX as u32) as libc::c_int,
    )
}

/// Turns on TCP keep-alive probing (first probe after 30 s idle, then every 10 s, 3 probes), so
/// the server notices a client whose machine vanished and frees its session within about a
/// minute instead of hours.
pub(crate) fn keepalive(stream: &TcpStream) -> io::Result<()> {
    set_int_opt(stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set_int_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30)?;
    set_int_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10)?;
    set_int_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            op: op::READ | op::REPLY,
            status: status::BAD_REQUEST,
            id: u64::MAX - 3,
            segment: 7,
            offset: 1 << 40,
            length: 12345,
            payload_len: 99,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], b"SFMP");
        assert_eq!(Header::decode(&b).unwrap(), h);
    }

    #[test]
    fn bad_magic_and_version_are_protocol_errors() {
        let mut b = Header::request(op::PING, 1, 0, 0, 0).encode();
        b[4] = 9;
        assert!(matches!(Header::decode(&b), Err(FarError::Protocol(m)) if m.contains("version")));
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(FarError::Protocol(m)) if m.contains("magic")));
    }

    #[test]
    fn write_parts_handles_short_writes() {
        struct Dribble(Vec<u8>);
        impl Write for Dribble {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                let n = buf.len().min(3);
                self.0.extend_from_slice(&buf[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut d = Dribble(Vec::new());
        write_parts(&mut d, b"header", b"and a body").unwrap();
        assert_eq!(d.0, b"headerand a body");
    }

    #[test]
    fn reply_error_maps_status() {
        let mut h = Header::request(op::ALLOC, 1, 2, 0, 0);
        h.status = status::CAPACITY;
        h.offset = 10;
        h.length = 4;
        assert!(matches!(
            reply_error(&h, b""),
            FarError::Capacity { asked: 10, free: 4 }
        ));
        h.status = status::BAD_REQUEST;
        assert!(matches!(reply_error(&h, b"nope"), FarError::BadRequest(m) if m == "nope"));
        h.status = status::UNAUTHENTICATED;
        assert!(
            matches!(reply_error(&h, b"wrong token"), FarError::Unauthenticated(m) if m == "wrong token")
        );
        h.status = status::BUSY;
        assert!(reply_error(&h, b"full").is_unavailable());
    }
}
