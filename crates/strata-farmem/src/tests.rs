//! Client/server tests over loopback TCP. Timing enters only as generous upper bounds.
//!
//! Every test runs on both transports (client and server alike): `on_both_transports!` at the
//! end makes a `tcp::NAME` and a `uring::NAME` test of each. `STRATA_TEST_NO_URING=1` skips the
//! `uring` ones on a system without io_uring.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver};
use proptest::prelude::*;

use crate::protocol::{op, status, Header, HEADER_LEN};
use crate::*;

const GENEROUS: Duration = Duration::from_secs(30);

/// A server running on a background thread, stopped and joined on drop.
struct TestServer {
    server: Arc<Server>,
    transport: TransportKind,
    stop: StopHandle,
    thread: Option<JoinHandle<Result<()>>>,
}

impl TestServer {
    fn start(capacity: u64, transport: TransportKind) -> TestServer {
        Self::start_with(ServerConfig {
            listen: "127.0.0.1:0".into(),
            capacity_bytes: capacity,
            max_message_bytes: 64 << 20,
            transport,
            ..ServerConfig::default()
        })
    }

    fn start_with(cfg: ServerConfig) -> TestServer {
        let server = Arc::new(Server::bind(&cfg).unwrap());
        let stop = server.stop_handle();
        let s = server.clone();
        let thread = std::thread::spawn(move || s.run_until(&|| false));
        TestServer {
            server,
            transport: cfg.transport,
            stop,
            thread: Some(thread),
        }
    }

    fn addr(&self) -> String {
        self.server.local_addr().to_string()
    }

    fn config(&self) -> ClientConfig {
        ClientConfig {
            addr: self.addr(),
            transport: self.transport,
            ..Default::default()
        }
    }

    fn client(&self) -> FarClient {
        FarClient::connect(&self.config()).unwrap()
    }

    fn stop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Deterministic, position-dependent bytes (so misplaced chunks are caught).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn wait_for(mut cond: impl FnMut() -> bool, timeout: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// Collects `n` completions by tag, failing on duplicates or a generous timeout.
fn collect(rx: &Receiver<FarCompletion>, n: usize) -> HashMap<u64, FarCompletion> {
    let mut got = HashMap::new();
    for _ in 0..n {
        let c = rx.recv_timeout(GENEROUS).expect("a read never completed");
        let tag = c.tag;
        assert!(
            got.insert(tag, c).is_none(),
            "two completions for tag {tag}"
        );
    }
    assert!(rx.try_recv().is_err(), "more completions than reads");
    got
}

fn read_one(c: &FarClient, segment: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
    let (tx, rx) = unbounded();
    c.submit(vec![FarRead::new(segment, offset, len, 0)], &tx);
    let done = rx.recv_timeout(GENEROUS).unwrap();
    done.result.map(|n| done.buf[..n].to_vec())
}

fn round_trip_odd_sizes(t: TransportKind) {
    let srv = TestServer::start(64 << 20, t);
    let c = FarClient::connect(&ClientConfig {
        chunk_bytes: 10_007,
        ..srv.config()
    })
    .unwrap();
    assert!(c.is_alive());
    assert_eq!(c.chunk_bytes(), 10_007);
    let len = 3 * (1 << 20) + 17;
    let data = pattern(1, len);
    c.alloc(5, len as u64).unwrap();
    c.write(5, 0, &data[..1001]).unwrap();
    c.write(5, 1001, &data[1001..]).unwrap();
    for (off, n) in [
        (0usize, len),
        (0, 1),
        (len - 1, 1),
        (12345, 700_001),
        (10_006, 2),
    ] {
        assert_eq!(read_one(&c, 5, off as u64, n).unwrap(), &data[off..off + n]);
    }
    // A zero-length read completes at once.
    assert_eq!(read_one(&c, 5, 0, 0).unwrap(), Vec::<u8>::new());
    let st = c.stats();
    assert_eq!(st.bytes_written, len as u64);
    assert!(st.reads >= 5 && st.chunks_read > 0 && st.errors == 0);
    assert!(c.ping().unwrap() < GENEROUS);
    let ss = c.server_stats().unwrap();
    assert_eq!(ss.segments, 1);
    assert_eq!(ss.bytes_held, len as u64);
    assert_eq!(ss.bytes_received, len as u64);
}

fn proptest_round_trip(t: TransportKind) {
    let srv = TestServer::start(256 << 20, t);
    let strategy = (
        prop_oneof![1usize..=64, 65usize..=5000, 5000usize..=70_000],
        1usize..=3,
        1usize..=5,
        1usize..=200_000,
        any::<u64>(),
    )
        .prop_flat_map(|(chunk, conns, depth, seg_len, seed)| {
            // Keep the chunk count bounded for tiny chunks.
            let seg_len = seg_len.min(chunk * 3000);
            (
                Just((chunk, conns, depth, seg_len, seed)),
                (0..seg_len, 0..=seg_len),
                proptest::collection::vec((0..seg_len, 0..=seg_len), 1..12),
            )
        });
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 40,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &strategy,
            |((chunk, conns, depth, seg_len, seed), (woff, wlen), reads)| {
                let c = FarClient::connect(&ClientConfig {
                    chunk_bytes: chunk,
                    data_connections: conns,
                    depth_per_connection: depth,
                    ..srv.config()
                })
                .unwrap();
                c.alloc(9, seg_len as u64).unwrap();
                // The model: a zeroed segment with one write applied.
                let mut model = vec![0u8; seg_len];
                let wlen = wlen.min(seg_len - woff);
                let data = pattern(seed, wlen);
                c.write(9, woff as u64, &data).unwrap();
                model[woff..woff + wlen].copy_from_slice(&data);
                let (tx, rx) = unbounded();
                let mut reqs = Vec::new();
                for (i, &(off, n)) in reads.iter().enumerate() {
                    let n = n.min(seg_len - off);
                    // Alternate between pre-sized, empty and over-long buffers.
                    let buf = match i % 3 {
                        0 => Vec::with_capacity(n),
                        1 => Vec::new(),
                        _ => vec![0xAA; n + 5],
                    };
                    reqs.push(FarRead {
                        segment: 9,
                        offset: off as u64,
                        len: n,
                        buf,
                        tag: i as u64,
                    });
                }
                c.submit(reqs, &tx);
                let got = collect(&rx, reads.len());
                for (i, &(off, n)) in reads.iter().enumerate() {
                    let n = n.min(seg_len - off);
                    let done = &got[&(i as u64)];
                    prop_assert_eq!(done.result.as_ref().ok().copied(), Some(n));
                    prop_assert!(done.buf[..n] == model[off..off + n]);
                }
                Ok(())
            },
        )
        .unwrap();
}

fn many_reads_in_flight(t: TransportKind) {
    let srv = TestServer::start(64 << 20, t);
    let c = FarClient::connect(&ClientConfig {
        chunk_bytes: 4096,
        data_connections: 3,
        depth_per_connection: 4,
        ..srv.config()
    })
    .unwrap();
    let len = 8 << 20;
    let data = pattern(7, len);
    c.alloc(1, len as u64).unwrap();
    c.write(1, 0, &data).unwrap();
    let (tx, rx) = unbounded();
    let n = 3000usize;
    let mut want = Vec::new();
    let reqs: Vec<FarRead> = (0..n)
        .map(|i| {
            let off = (i * 2654435761) % (len - 70_000);
            let l = 1 + (i * 7919) % 60_000;
            want.push((off, l));
            FarRead::new(1, off as u64, l, i as u64)
        })
        .collect();
    c.submit(reqs, &tx);
    let got = collect(&rx, n);
    for (i, &(off, l)) in want.iter().enumerate() {
        let done = &got[&(i as u64)];
        assert_eq!(*done.result.as_ref().unwrap(), l);
        assert_eq!(&done.buf[..l], &data[off..off + l], "read {i}");
    }
    let st = c.stats();
    assert_eq!(st.reads, n as u64);
    assert_eq!(st.bytes_read, want.iter().map(|w| w.1 as u64).sum::<u64>());
    assert!(st.read_latency_us_mean > 0.0);
}

fn two_clients_have_separate_sessions(t: TransportKind) {
    let srv = TestServer::start(64 << 20, t);
    let a = Arc::new(srv.client());
    let b = Arc::new(srv.client());
    let (da, db) = (pattern(100, 1 << 20), pattern(200, 1 << 20));
    a.alloc(1, da.len() as u64).unwrap();
    b.alloc(1, db.len() as u64).unwrap();
    a.alloc(2, 10).unwrap();
    a.write(1, 0, &da).unwrap();
    b.write(1, 0, &db).unwrap();
    assert_eq!(srv.server.stats().sessions, 2);
    // Segment ids are private to a session.
    assert!(matches!(
        read_one(&b, 2, 0, 1),
        Err(FarError::BadRequest(_))
    ));
    let threads: Vec<_> = [(a.clone(), da.clone()), (b.clone(), db.clone())]
        .into_iter()
        .map(|(c, want)| {
            std::thread::spawn(move || {
                for round in 0..20 {
                    let off = round * 35_000;
                    assert_eq!(
                        read_one(&c, 1, off as u64, 300_000).unwrap(),
                        &want[off..off + 300_000]
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(a.is_alive() && b.is_alive());
}

fn session_segments_freed_on_client_drop(t: TransportKind) {
    let srv = TestServer::start(64 << 20, t);
    let c = srv.client();
    c.alloc(1, 3 << 20).unwrap();
    c.alloc(2, 5 << 20).unwrap();
    c.write(2, 100, &pattern(3, 1000)).unwrap();
    let other = srv.client();
    other.alloc(1, 1 << 20).unwrap();
    let st = srv.server.stats();
    assert_eq!((st.segments, st.bytes_held, st.sessions), (3, 9 << 20, 2));
    assert_eq!(c.free_capacity().unwrap(), (64 << 20) - (9 << 20));
    c.free(1).unwrap();
    assert_eq!(srv.server.stats().bytes_held, 6 << 20);
    drop(c);
    assert!(
        wait_for(
            || {
                let st = srv.server.stats();
                st.segments == 1 && st.bytes_held == 1 << 20 && st.sessions == 1
            },
            GENEROUS
        ),
        "segments not freed: {:?}",
        srv.server.stats()
    );
    assert!(other.is_alive());
    assert_eq!(other.free_capacity().unwrap(), 63 << 20);
}

fn capacity_refusal(t: TransportKind) {
    let srv = TestServer::start(1 << 20, t);
    let c = srv.client();
    match c.alloc(1, 2 << 20) {
        Err(FarError::Capacity { asked, free }) => {
            assert_eq!((asked, free), (2 << 20, 1 << 20));
        }
        other => panic!("expected a capacity error, got {other:?}"),
    }
    c.alloc(1, 700_000).unwrap();
    match c.alloc(2, 400_000) {
        Err(FarError::Capacity { asked, free }) => {
            assert_eq!((asked, free), (400_000, (1 << 20) - 700_000));
        }
        other => panic!("expected a capacity error, got {other:?}"),
    }
    // A huge request is refused, not attempted.
    assert!(matches!(
        c.alloc(3, u64::MAX),
        Err(FarError::Capacity { .. })
    ));
    assert!(c.is_alive());
    assert!(matches!(c.alloc(1, 10), Err(FarError::BadRequest(_))));
    assert!(matches!(c.free(77), Err(FarError::BadRequest(_))));
    c.free(1).unwrap();
    c.alloc(2, 400_000).unwrap();
    assert_eq!(c.free_capacity().unwrap(), (1 << 20) - 400_000);
    assert!(c.is_alive());
}

/// Opens a raw connection and sends one header (plus payload).
fn raw_send(addr: SocketAddr, h: &Header, payload: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s.write_all(&h.encode()).unwrap();
    s.write_all(payload).unwrap();
    s
}

/// Reads one reply header and its payload.
fn raw_reply(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b).unwrap();
    let h = Header::decode(&b).unwrap();
    let mut p = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut p).unwrap();
    (h, p)
}

/// True when the server closed `s` (EOF or reset) within the generous timeout.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    !matches!(s.read(&mut b), Ok(n) if n > 0)
}

fn out_of_range_and_bad_messages_are_rejected_while_serving(t: TransportKind) {
    let srv = TestServer::start_with(ServerConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 16 << 20,
        max_message_bytes: 1 << 20,
        transport: t,
        ..ServerConfig::default()
    });
    let c = FarClient::connect(&ClientConfig {
        chunk_bytes: 64 << 10,
        ..srv.config()
    })
    .unwrap();
    let data = pattern(5, 100_000);
    c.alloc(1, 100_000).unwrap();
    c.write(1, 0, &data).unwrap();

    // Out of range, unknown segment: BadRequest, and the client stays usable.
    let err = read_one(&c, 1, 99_000, 1001).unwrap_err();
    assert!(
        matches!(&err, FarError::BadRequest(m) if m.contains("outside segment 1")),
        "{err}"
    );
    assert!(matches!(
        read_one(&c, 42, 0, 10),
        Err(FarError::BadRequest(_))
    ));
    assert!(matches!(
        c.write(1, 99_999, &[1, 2]),
        Err(FarError::BadRequest(_))
    ));
    assert!(matches!(
        read_one(&c, 1, u64::MAX - 1, 10),
        Err(FarError::BadRequest(_))
    ));
    assert!(c.is_alive());
    assert_eq!(read_one(&c, 1, 500, 70_000).unwrap(), &data[500..70_500]);
    // A read that fails in only some of its chunks fails as a whole, with one completion.
    let err = read_one(&c, 1, 0, 100_001).unwrap_err();
    assert!(matches!(err, FarError::BadRequest(_)));
    assert!(c.stats().errors >= 5);

    let addr = srv.server.local_addr();
    // Garbage instead of a header: a PROTOCOL reply, then the connection is closed.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s.write_all(&[0x47u8; HEADER_LEN]).unwrap();
    let (h, msg) = raw_reply(&mut s);
    assert_eq!(h.status, status::PROTOCOL);
    assert!(String::from_utf8_lossy(&msg).contains("magic"));
    assert!(closed_by_peer(&mut s));

    // A wrong version.
    let mut b = Header::request(op::HELLO, 1, 0, 0, 0).encode();
    b[4] = 99;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s.write_all(&b).unwrap();
    let (h, msg) = raw_reply(&mut s);
    assert_eq!(h.status, status::PROTOCOL);
    assert!(String::from_utf8_lossy(&msg).contains("version"));

    // A data operation on a fresh connection, without HELLO or JOIN.
    let mut s = raw_send(addr, &Header::request(op::READ, 1, 1, 0, 10), &[]);
    assert_eq!(raw_reply(&mut s).0.status, status::PROTOCOL);
    assert!(closed_by_peer(&mut s));

    // JOIN with a made-up token.
    let mut s = raw_send(addr, &Header::request(op::JOIN, 1, 12345, 0, 0), &[]);
    let (h, msg) = raw_reply(&mut s);
    assert_eq!(h.status, status::PROTOCOL);
    assert!(String::from_utf8_lossy(&msg).contains("unknown session"));

    // A raw session: bulk data on the control connection is refused.
    let mut ctl = raw_send(addr, &Header::request(op::HELLO, 1, 0, 0, 0), &[]);
    let (hello, _) = raw_reply(&mut ctl);
    assert_eq!(hello.status, status::OK);
    assert_eq!(hello.length, 1 << 20);
    let token = hello.segment;
    let mut data_conn = raw_send(addr, &Header::request(op::JOIN, 2, token, 0, 0), &[]);
    assert_eq!(raw_reply(&mut data_conn).0.status, status::OK);
    // An oversized message on a data connection: refused, connection closed.
    let mut w = Header::request(op::WRITE, 3, 1, 0, 2 << 20);
    w.payload_len = 2 << 20;
    data_conn.write_all(&w.encode()).unwrap();
    let (h, msg) = raw_reply(&mut data_conn);
    assert_eq!((h.id, h.status), (3, status::PROTOCOL));
    assert!(String::from_utf8_lossy(&msg).contains("exceeds"));
    assert!(closed_by_peer(&mut data_conn));
    // An oversized read request is a BadRequest (nothing to skip), connection stays.
    let mut data_conn = raw_send(addr, &Header::request(op::JOIN, 4, token, 0, 0), &[]);
    assert_eq!(raw_reply(&mut data_conn).0.status, status::OK);
    data_conn
        .write_all(&Header::request(op::READ, 5, 1, 0, 2 << 20).encode())
        .unwrap();
    assert_eq!(raw_reply(&mut data_conn).0.status, status::BAD_REQUEST);
    // Control message on a data connection.
    data_conn
        .write_all(&Header::request(op::PING, 6, 0, 0, 0).encode())
        .unwrap();
    assert_eq!(raw_reply(&mut data_conn).0.status, status::PROTOCOL);
    // Bulk read on the control connection.
    ctl.write_all(&Header::request(op::READ, 7, 1, 0, 10).encode())
        .unwrap();
    assert_eq!(raw_reply(&mut ctl).0.status, status::PROTOCOL);
    assert!(closed_by_peer(&mut ctl));

    // Through all of that, the real client kept being served.
    assert!(c.is_alive());
    assert_eq!(read_one(&c, 1, 0, 100_000).unwrap(), data);
    let fresh = srv.client();
    fresh.alloc(1, 10).unwrap();
    assert!(wait_for(|| srv.server.stats().sessions == 2, GENEROUS));
}

fn client_config_is_checked(t: TransportKind) {
    let srv = TestServer::start_with(ServerConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 1 << 20,
        max_message_bytes: 4096,
        transport: t,
        ..ServerConfig::default()
    });
    let too_big = FarClient::connect(&ClientConfig {
        chunk_bytes: 8192,
        ..srv.config()
    });
    assert!(matches!(too_big, Err(FarError::BadRequest(m)) if m.contains("maximum message")));
    let zero = FarClient::connect(&ClientConfig {
        data_connections: 0,
        ..srv.config()
    });
    assert!(matches!(zero, Err(FarError::BadRequest(_))));
    assert!(matches!(
        FarClient::connect(&ClientConfig {
            transport: t,
            ..ClientConfig::default()
        }),
        Err(FarError::BadRequest(_))
    ));
}

fn unreachable_server_is_unavailable(t: TransportKind) {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let r = FarClient::connect(&ClientConfig {
        addr: format!("127.0.0.1:{port}"),
        connect_timeout: Duration::from_millis(500),
        transport: t,
        ..Default::default()
    });
    assert!(matches!(r, Err(FarError::Unavailable(_))), "{r:?}");
}

fn silent_listener_is_unavailable(t: TransportKind) {
    // The kernel accepts the connection, but nobody answers HELLO.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let r = FarClient::connect(&ClientConfig {
        addr: l.local_addr().unwrap().to_string(),
        connect_timeout: Duration::from_millis(300),
        io_timeout: Duration::from_secs(60),
        transport: t,
        ..Default::default()
    });
    assert!(matches!(r, Err(FarError::Unavailable(_))), "{r:?}");
}

/// Every completion is Ok or Unavailable; returns how many were Unavailable.
fn count_unavailable(got: &HashMap<u64, FarCompletion>) -> usize {
    got.values()
        .filter(|c| match &c.result {
            Ok(_) => false,
            Err(FarError::Unavailable(_)) => true,
            Err(e) => panic!("unexpected error {e}"),
        })
        .count()
}

fn assert_fails_fast(c: &FarClient) {
    let t = Instant::now();
    assert!(!c.is_alive());
    assert!(matches!(c.alloc(100, 1), Err(FarError::Unavailable(_))));
    assert!(matches!(
        c.write(1, 0, &[1, 2, 3]),
        Err(FarError::Unavailable(_))
    ));
    assert!(matches!(c.free(1), Err(FarError::Unavailable(_))));
    assert!(matches!(c.ping(), Err(FarError::Unavailable(_))));
    assert!(matches!(c.free_capacity(), Err(FarError::Unavailable(_))));
    let (tx, rx) = unbounded();
    c.submit(
        vec![FarRead::new(1, 0, 10, 1), FarRead::new(1, 0, 10, 2)],
        &tx,
    );
    // Completed inside submit.
    assert!(matches!(
        rx.try_recv().unwrap().result,
        Err(FarError::Unavailable(_))
    ));
    assert!(matches!(
        rx.try_recv().unwrap().result,
        Err(FarError::Unavailable(_))
    ));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "dead client calls must not wait"
    );
}

fn server_stopped_mid_stream(t: TransportKind) {
    let mut srv = TestServer::start(128 << 20, t);
    let io_timeout = Duration::from_secs(3);
    let c = FarClient::connect(&ClientConfig {
        io_timeout,
        ..srv.config()
    })
    .unwrap();
    let len = 32 << 20;
    let data = pattern(11, len);
    c.alloc(1, len as u64).unwrap();
    c.write(1, 0, &data).unwrap();
    let (tx, rx) = unbounded();
    let n = 600;
    let reqs = (0..n)
        .map(|i| {
            FarRead::new(
                1,
                ((i * 1_048_573) % (len - (1 << 20))) as u64,
                1 << 20,
                i as u64,
            )
        })
        .collect();
    c.submit(reqs, &tx);
    // Stop while the reads stream (some may have finished already).
    srv.stop();
    let t = Instant::now();
    let got = collect(&rx, n);
    assert!(t.elapsed() < io_timeout + GENEROUS);
    for (tag, done) in &got {
        if let Ok(l) = done.result {
            let off = ((*tag as usize) * 1_048_573) % (len - (1 << 20));
            assert!(done.buf[..l] == data[off..off + l]);
        }
    }
    let failed = count_unavailable(&got);
    assert!(wait_for(|| !c.is_alive(), GENEROUS));
    assert_fails_fast(&c);
    assert!(c.stats().errors >= failed as u64);
}

/// A fake server that answers HELLO and JOIN, then swallows requests; `close_after_first`
/// closes everything on the first data request instead of staying silent.
fn fake_server(close_after_first: bool) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for i in 0..3 {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; HEADER_LEN];
            s.read_exact(&mut b).unwrap();
            let mut reply = Header::reply_to(&Header::decode(&b).unwrap());
            if i == 0 {
                reply.segment = 77;
                reply.length = 64 << 20;
            }
            s.write_all(&reply.encode()).unwrap();
            conns.push(s);
        }
        let mut b = [0u8; HEADER_LEN];
        let _ = conns[1].read_exact(&mut b);
        if !close_after_first {
            // Stay silent until the client gives up and closes.
            let _ = conns[1].set_read_timeout(Some(GENEROUS));
            let mut sink = Vec::new();
            let _ = conns[1].read_to_end(&mut sink);
        }
        drop(conns);
    });
    (addr, t)
}

fn silent_server_times_out_pending_reads(t: TransportKind) {
    let (addr, fake) = fake_server(false);
    let io_timeout = Duration::from_millis(500);
    let c = FarClient::connect(&ClientConfig {
        addr: addr.to_string(),
        io_timeout,
        transport: t,
        ..Default::default()
    })
    .unwrap();
    let (tx, rx) = unbounded();
    c.submit(
        (0..20).map(|i| FarRead::new(1, 0, 1 << 20, i)).collect(),
        &tx,
    );
    let got = collect(&rx, 20);
    assert_eq!(count_unavailable(&got), 20);
    assert!(matches!(&got[&0].result, Err(FarError::Unavailable(m)) if m.contains("no reply")));
    assert_fails_fast(&c);
    drop(c);
    fake.join().unwrap();
}

fn server_closing_fails_pending_reads_and_writes(t: TransportKind) {
    let (addr, fake) = fake_server(true);
    let c = FarClient::connect(&ClientConfig {
        addr: addr.to_string(),
        io_timeout: Duration::from_secs(60),
        transport: t,
        ..Default::default()
    })
    .unwrap();
    let (tx, rx) = unbounded();
    c.submit(
        (0..20).map(|i| FarRead::new(1, 0, 1 << 20, i)).collect(),
        &tx,
    );
    // Closing is noticed at once: no need to wait for the (long) io timeout.
    let got = collect(&rx, 20);
    assert_eq!(count_unavailable(&got), 20);
    fake.join().unwrap();
    assert_fails_fast(&c);
}

fn dropping_the_client_completes_pending_reads(t: TransportKind) {
    let (addr, fake) = fake_server(false);
    let c = FarClient::connect(&ClientConfig {
        addr: addr.to_string(),
        io_timeout: Duration::from_secs(60),
        transport: t,
        ..Default::default()
    })
    .unwrap();
    let (tx, rx) = unbounded();
    c.submit(
        (0..20).map(|i| FarRead::new(1, 0, 1 << 20, i)).collect(),
        &tx,
    );
    drop(c);
    let got = collect(&rx, 20);
    assert_eq!(count_unavailable(&got), 20);
    fake.join().unwrap();
}

fn works_through_the_transport_trait(t: TransportKind) {
    let srv = TestServer::start(8 << 20, t);
    let far: Arc<dyn Transport> = Arc::new(srv.client());
    far.alloc(3, 5000).unwrap();
    far.write(3, 10, b"hello far memory").unwrap();
    assert_eq!(far.free_capacity().unwrap(), (8 << 20) - 5000);
    let (tx, rx) = unbounded();
    far.submit(vec![FarRead::new(3, 10, 16, 9)], &tx);
    let done = rx.recv_timeout(GENEROUS).unwrap();
    assert_eq!(&done.buf[..16], b"hello far memory");
    assert!(far.is_alive() && far.chunk_bytes() == 256 << 10);
    far.free(3).unwrap();
}

/// A client of either transport works against a server of the other (the wire is the same).
fn mixed_transports_interoperate(t: TransportKind) {
    let other = match t {
        TransportKind::Tcp => TransportKind::Uring,
        TransportKind::Uring => TransportKind::Tcp,
    };
    let srv = TestServer::start(16 << 20, other);
    let c = FarClient::connect(&ClientConfig {
        transport: t,
        chunk_bytes: 100_000,
        ..srv.config()
    })
    .unwrap();
    assert_eq!((c.transport(), srv.server.transport()), (t, other));
    let data = pattern(21, 3 << 20);
    c.alloc(1, data.len() as u64).unwrap();
    c.write(1, 0, &data).unwrap();
    assert_eq!(read_one(&c, 1, 0, data.len()).unwrap(), data);
    assert_eq!(
        read_one(&c, 1, 777, 1_000_001).unwrap(),
        &data[777..1_000_778]
    );
    // Zero-copy sends are counted on the uring server (on loopback the kernel copies them).
    let zc = srv.server.zero_copy_stats();
    match other {
        TransportKind::Uring => assert!(zc.sends >= 42 && zc.copied <= zc.sends, "{zc:?}"),
        TransportKind::Tcp => assert_eq!(zc, ZeroCopyStats::default()),
    }
}

/// Installs, on the calling thread only, a seccomp filter that makes `io_uring_setup` fail with
/// ENOSYS: what a container policy or an old kernel does to a process.
fn deny_io_uring_on_this_thread() {
    let insn = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let mut prog = [
        // The system call number; io_uring_setup gets ENOSYS, everything else runs.
        insn(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        insn(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            libc::SYS_io_uring_setup as u32,
        ),
        insn(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        insn(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: plain prctl calls; the kernel copies the filter program during the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let rc = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        );
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }
}

#[test]
fn a_capacity_beyond_the_machines_memory_is_refused_at_bind() {
    let Err(err) = Server::bind(&ServerConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: u64::MAX,
        ..ServerConfig::default()
    }) else {
        panic!("a capacity of 16 EiB was accepted");
    };
    let err = err.to_string();
    assert!(
        err.contains("capacity 16384 PiB is more than this machine's") && err.contains("of memory"),
        "{err}"
    );
}

#[test]
fn unusable_io_uring_is_reported_and_the_server_falls_back() {
    let srv = TestServer::start(8 << 20, TransportKind::Tcp);
    let cfg = srv.config();
    // A thread of its own: the filter stays with it and the threads it starts.
    std::thread::spawn(move || {
        deny_io_uring_on_this_thread();
        let r = FarClient::connect(&ClientConfig {
            transport: TransportKind::Uring,
            ..cfg.clone()
        });
        match r {
            Err(FarError::Unsupported(why)) => assert!(why.contains("no io_uring"), "{why}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
        // A uring server started here serves with plain writes instead (said on stderr).
        let fallback = TestServer::start(8 << 20, TransportKind::Uring);
        let c = FarClient::connect(&ClientConfig {
            transport: TransportKind::Tcp,
            ..fallback.config()
        })
        .unwrap();
        c.alloc(1, 4096).unwrap();
        c.write(1, 0, &pattern(3, 4096)).unwrap();
        assert_eq!(read_one(&c, 1, 0, 4096).unwrap(), pattern(3, 4096));
        assert_eq!(fallback.server.zero_copy_stats().sends, 0);
        // The tcp transport needs no io_uring.
        FarClient::connect(&cfg).unwrap().alloc(1, 10).unwrap();
    })
    .join()
    .unwrap();
}

fn a_server_with_a_token_refuses_clients_without_it(t: TransportKind) {
    let srv = TestServer::start_with(ServerConfig {
        capacity_bytes: 1 << 20,
        transport: t,
        token: Some("s3cret".into()),
        ..ServerConfig::default()
    });
    let with = |token: Option<&str>| {
        FarClient::connect(&ClientConfig {
            token: token.map(str::to_string),
            ..srv.config()
        })
    };
    let refused = |r: Result<FarClient>| match r {
        Err(FarError::Unauthenticated(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(refused(with(None)).contains("needs a token"));
    assert_eq!(refused(with(Some("s3creT"))), "wrong token");
    assert_eq!(refused(with(Some("s3cret and more"))), "wrong token");
    assert_eq!(srv.server.stats().sessions, 0);
    let c = with(Some("s3cret")).unwrap();
    c.alloc(1, 4096).unwrap();
    c.write(1, 0, &pattern(5, 4096)).unwrap();
    assert_eq!(read_one(&c, 1, 0, 4096).unwrap(), pattern(5, 4096));

    // A HELLO payload longer than any secret is refused before it is read.
    let addr = srv.server.local_addr();
    let mut big = Header::request(op::HELLO, 1, 0, 0, 0);
    big.payload_len = 1 << 30;
    let mut s = raw_send(addr, &big, &[]);
    let (h, msg) = raw_reply(&mut s);
    assert_eq!(h.status, status::PROTOCOL);
    assert!(String::from_utf8_lossy(&msg).contains("longer than any shared secret"));
    assert!(closed_by_peer(&mut s));
    // A refused HELLO is answered, then closed; no session was opened for it.
    let mut wrong = Header::request(op::HELLO, 2, 0, 0, 0);
    wrong.payload_len = 5;
    let mut s = raw_send(addr, &wrong, b"guess");
    let (h, msg) = raw_reply(&mut s);
    assert_eq!((h.id, h.status), (2, status::UNAUTHENTICATED));
    assert_eq!(msg, b"wrong token");
    assert!(closed_by_peer(&mut s));
    assert_eq!(srv.server.stats().sessions, 1);
    // A JOIN is no way around the secret: session tokens are random.
    let mut s = raw_send(addr, &Header::request(op::JOIN, 3, 1, 0, 0), &[]);
    assert_eq!(raw_reply(&mut s).0.status, status::PROTOCOL);
    assert!(c.is_alive());
}

fn connections_beyond_the_limit_are_told_the_server_is_busy(t: TransportKind) {
    let srv = TestServer::start_with(ServerConfig {
        capacity_bytes: 1 << 20,
        transport: t,
        max_connections: 3,
        ..ServerConfig::default()
    });
    // One control and two data connections: the limit.
    let first = srv.client();
    let busy = FarClient::connect(&srv.config());
    assert!(
        matches!(&busy, Err(FarError::Unavailable(m)) if m.contains("server busy") && m.contains("3 connections")),
        "{busy:?}"
    );
    assert!(first.is_alive());
    first.alloc(1, 10).unwrap();
    // Once the first client is gone, its connections are free for the next.
    drop(first);
    let mut next = None;
    assert!(wait_for(
        || {
            next = FarClient::connect(&srv.config()).ok();
            next.is_some()
        },
        GENEROUS
    ));
}

#[test]
fn listening_for_other_hosts_needs_a_token() {
    let open = |token: Option<&str>| {
        Server::bind(&ServerConfig {
            listen: "0.0.0.0:0".into(),
            token: token.map(str::to_string),
            ..ServerConfig::default()
        })
    };
    let err = open(None).unwrap_err().to_string();
    assert!(
        err.contains(
            "is not a loopback address; set a token (--token-file or STRATA_FARMEM_TOKEN)"
        ),
        "{err}"
    );
    open(Some("s3cret")).unwrap();
    let empty = Server::bind(&ServerConfig {
        token: Some(String::new()),
        ..ServerConfig::default()
    });
    assert!(matches!(empty, Err(FarError::Config(m)) if m == "token: empty"));
}

/// Runs each named test on both transports, as `tcp::NAME` and `uring::NAME`.
macro_rules! on_both_transports {
    ($($name:ident),* $(,)?) => {
        mod tcp {
            $(#[test]
            fn $name() {
                super::$name(crate::TransportKind::Tcp)
            })*
        }
        mod uring {
            $(#[test]
            fn $name() {
                if std::env::var_os("STRATA_TEST_NO_URING").is_none() {
                    super::$name(crate::TransportKind::Uring)
                }
            })*
        }
    };
}

on_both_transports!(
    round_trip_odd_sizes,
    proptest_round_trip,
    many_reads_in_flight,
    two_clients_have_separate_sessions,
    session_segments_freed_on_client_drop,
    capacity_refusal,
    out_of_range_and_bad_messages_are_rejected_while_serving,
    client_config_is_checked,
    unreachable_server_is_unavailable,
    silent_listener_is_unavailable,
    server_stopped_mid_stream,
    silent_server_times_out_pending_reads,
    server_closing_fails_pending_reads_and_writes,
    dropping_the_client_completes_pending_reads,
    works_through_the_transport_trait,
    mixed_transports_interoperate,
    a_server_with_a_token_refuses_clients_without_it,
    connections_beyond_the_limit_are_told_the_server_is_busy,
);
