//! Dropping connections whose peer goes quiet. HTTP/2 keep-alive pings start only once a
//! client has sent its connection preface, so a client that connects and sends nothing, or
//! stops half-way through its first frames, would hold a connection (a socket, a task and
//! its buffers) for ever. [`IdleTimeout`] fails the connection's reads once nothing has
//! arrived for the idle timeout; the server pings live clients more often than that
//! ([`crate::server::serve`]), so a client that answers pings keeps its connection however
//! long it waits between calls or for an answer.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

/// A connection whose reads fail (`TimedOut`) once the peer has sent nothing for `idle`.
pub struct IdleTimeout<S> {
    inner: S,
    idle: Duration,
    /// When the current quiet spell ends the connection; armed by the first read that finds
    /// nothing, disarmed by any read that completes.
    deadline: Pin<Box<Sleep>>,
    armed: bool,
}

impl<S> IdleTimeout<S> {
    /// Wraps `inner`; must be called within a tokio runtime (the timer is the runtime's).
    pub fn new(inner: S, idle: Duration) -> Self {
        IdleTimeout {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            armed: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(done) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            this.armed = false;
            return Poll::Ready(done);
        }
        if !this.armed {
            this.deadline.as_mut().reset(Instant::now() + this.idle);
            this.armed = true;
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client sent nothing for {:.1} s (serve.idle_timeout)",
                    this.idle.as_secs_f64()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for IdleTimeout<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_quiet_peer_times_out() {
        runtime().block_on(async {
            let (_peer, ours) = tokio::io::duplex(64);
            let mut conn = IdleTimeout::new(ours, Duration::from_millis(20));
            let mut buf = [0u8; 8];
            let e = conn.read(&mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(e.to_string().contains("serve.idle_timeout"), "{e}");
        });
    }

    #[test]
    fn bytes_from_the_peer_restart_the_clock() {
        runtime().block_on(async {
            let (mut peer, ours) = tokio::io::duplex(64);
            let idle = Duration::from_millis(200);
            let mut conn = IdleTimeout::new(ours, idle);
            let mut buf = [0u8; 8];
            // Each byte arrives before the idle timeout: every read succeeds, however long
            // the reads take together.
            for i in 0..5u8 {
                tokio::time::sleep(idle / 4).await;
                peer.write_all(&[i]).await.unwrap();
                assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
                assert_eq!(buf[0], i);
            }
            // Writes are no sign of the peer: they do not keep the connection open.
            conn.write_all(b"ping").await.unwrap();
            let e = conn.read(&mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        });
    }
}
