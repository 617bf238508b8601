//! The same behaviour from both backends. io_uring is required here (the CI machines enable
//! it); set STRATA_TEST_NO_URING=1 to run only the thread pool on a system without it.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::file::OpenMode;
use crate::testing::{backends, engine};

fn sample(dir: &Path, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    let path = dir.join("data.bin");
    let data: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

/// Submits reads of `ranges` and returns (tag, bytes) of each, in tag order.
fn read_all(
    engine: &Arc<Engine>,
    file: &IoFile,
    ranges: &[(u64, usize)],
    buf_extra: usize,
) -> Vec<Result<Vec<u8>>> {
    let mut q = engine.queue();
    q.submit(ranges.iter().enumerate().map(|(i, &(off, len))| {
        Request::read(file, off, len, AlignedBuf::new(len + buf_extra), i as u64)
    }));
    let mut out: Vec<Option<Result<Vec<u8>>>> = (0..ranges.len()).map(|_| None).collect();
    while let Some(c) = q.wait() {
        out[c.tag as usize] = Some(c.result.map(|n| c.buf.as_slice()[..n].to_vec()));
    }
    out.into_iter().map(|r| r.unwrap()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn random_reads_return_what_pread_returns(
        len in 1usize..300_000,
        reqs in proptest::collection::vec((any::<u64>(), 1usize..20_000, any::<bool>()), 1..60),
        depth in 1usize..64,
        roomy in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (path, data) = sample(dir.path(), len);
        let ranges: Vec<(u64, usize)> = reqs
            .iter()
            .map(|&(o, l, aligned)| {
                let (mut off, mut l) = ((o % len as u64), l.min(len));
                if aligned {
                    off = align_down(off);
                    l = (align_down(l as u64) as usize).max(ALIGN).min(len - off as usize);
                }
                let l = l.min(len - off as usize).max(1);
                (off.min(len as u64 - 1), l)
            })
            .collect();
        for kind in backends() {
            let engine = engine(kind, depth, 4);
            let file = engine.open(&path, OpenMode::Read).unwrap();
            // A roomy buffer lets the engine read the covering range in place; a tight one
            // makes it bounce.
            let got = read_all(&engine, &file, &ranges, if roomy { 2 * ALIGN } else { 0 });
            for (&(off, l), g) in ranges.iter().zip(got) {
                prop_assert_eq!(&g.unwrap()[..], &data[off as usize..off as usize + l], "{} at {}+{}", kind.name(), off, l);
            }
            prop_assert!(engine.stats().max_in_flight <= depth as u64);
        }
    }
}

#[test]
fn writes_then_reads_round_trip() {
    for kind in backends() {
        let engine = engine(kind, 16, 4);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let file = engine.open(&path, OpenMode::Create).unwrap();
        let mut q = engine.queue();
        let blocks = 64usize;
        q.submit((0..blocks).rev().map(|i| {
            let mut b = AlignedBuf::new(ALIGN);
            b.fill_from(&[i as u8; ALIGN]);
            Request::write(&file, (i * ALIGN) as u64, ALIGN, b, i as u64)
        }));
        while let Some(c) = q.wait() {
            assert_eq!(c.result.unwrap(), ALIGN);
        }
        let mut expect = Vec::new();
        for i in 0..blocks {
            expect.extend_from_slice(&[i as u8; ALIGN]);
        }
        assert_eq!(std::fs::read(&path).unwrap(), expect, "{}", kind.name());
        let got = read_all(&engine, &file, &[(100, 9000), (0, blocks * ALIGN)], 0);
        assert_eq!(got[0].as_ref().unwrap()[..], expect[100..9100]);
        assert_eq!(got[1].as_ref().unwrap()[..], expect[..]);
        let s = engine.stats().summary();
        assert_eq!(
            (s.write_ops, s.write_bytes),
            (blocks as u64, (blocks * ALIGN) as u64)
        );
        assert_eq!(
            (s.read_ops, s.read_bytes),
            (2, 9000 + (blocks * ALIGN) as u64)
        );
        assert!(s.latency_p50_us > 0.0 && s.latency_p99_us >= s.latency_p50_us);
    }
}

#[test]
fn threads_submitting_at_once_do_not_corrupt_each_other() {
    for kind in backends() {
        let engine = engine(kind, 32, 4);
        let dir = tempfile::tempdir().unwrap();
        let (path, data) = sample(dir.path(), 1 << 20);
        let file = engine.open(&path, OpenMode::Read).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (engine, file, data) = (&engine, &file, &data);
                s.spawn(move || {
                    for round in 0..20u64 {
                        let ranges: Vec<(u64, usize)> = (0..50u64)
                            .map(|i| {
                                (
                                    (t * 7919 + round * 104729 + i * 1299709) % (1 << 20),
                                    1 + ((i * 37 + t) % 5000) as usize,
                                )
                            })
                            .map(|(o, l)| (o, l.min((1 << 20) - o as usize)))
                            .collect();
                        for (&(o, l), g) in ranges.iter().zip(read_all(engine, file, &ranges, 0)) {
                            assert_eq!(g.unwrap(), &data[o as usize..o as usize + l]);
                        }
                    }
                });
            }
        });
    }
}

#[test]
fn a_read_past_the_end_is_an_error() {
    for kind in backends() {
        let engine = engine(kind, 4, 4);
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = sample(dir.path(), 10_000);
        let file = engine.open(&path, OpenMode::Read).unwrap();
        let got = read_all(
            &engine,
            &file,
            &[(9_000, 2_000), (10_000, 1), (0, 10_000)],
            0,
        );
        for bad in &got[..2] {
            let e = bad.as_ref().unwrap_err();
            assert!(
                matches!(
                    e,
                    IoError::PastEnd {
                        file_len: 10_000,
                        ..
                    }
                ),
                "{e}"
            );
        }
        assert_eq!(got[2].as_ref().unwrap().len(), 10_000);
        // A file that grows is re-measured: the cached size does not make new bytes invisible.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&[7u8; 5000], 10_000)
            .unwrap();
        assert_eq!(
            read_all(&engine, &file, &[(12_000, 100)], 0)[0]
                .as_ref()
                .unwrap(),
            &vec![7u8; 100]
        );
    }
}

#[test]
fn a_submission_the_kernel_refuses_fails_its_requests_instead_of_panicking() {
    if !backends().contains(&BackendKind::IoUring) {
        return;
    }
    let engine = engine(BackendKind::IoUring, 4, 1);
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path(), 10_000);
    let file = engine.open(&path, OpenMode::Read).unwrap();
    let Backend::Uring(ring) = &engine.inner.backend else {
        unreachable!("an io_uring engine has a ring")
    };
    // /dev/null in place of the ring's descriptor: every io_uring_enter now fails
    // (EOPNOTSUPP), as it would on a ring the kernel no longer accepts.
    let null = std::fs::File::open("/dev/null").unwrap();
    // SAFETY: both descriptors are open; the ring's is replaced, not freed twice (the ring
    // closes the /dev/null copy when it drops).
    assert!(unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), ring.ring_fd()) } >= 0);
    for round in 0..2 {
        let got = read_all(&engine, &file, &[(0, 4096), (8192, 100)], 0);
        for g in got {
            let e = g.unwrap_err().to_string();
            assert!(e.contains("data.bin"), "round {round}: {e}");
        }
    }
    assert_eq!(engine.stats().errors, 4);
}

#[test]
fn back_pressure_bounds_requests_in_flight() {
    for kind in backends() {
        let engine = engine(kind, 3, 4);
        let dir = tempfile::tempdir().unwrap();
        let (path, data) = sample(dir.path(), 4 << 20);
        let file = engine.open(&path, OpenMode::Read).unwrap();
        let ranges: Vec<(u64, usize)> = (0..500u64)
            .map(|i| ((i * 8191) % (4 << 20), 4096))
            .map(|(o, l)| (o, l.min((4 << 20) - o as usize)))
            .collect();
        for (&(o, l), g) in ranges.iter().zip(read_all(&engine, &file, &ranges, 0)) {
            assert_eq!(g.unwrap(), &data[o as usize..o as usize + l]);
        }
        let s = engine.stats();
        assert!(
            s.max_in_flight <= 3,
            "{}: {} in flight",
            kind.name(),
            s.max_in_flight
        );
        assert_eq!(s.in_flight, 0);
    }
}

#[test]
fn unaligned_direct_writes_are_refused() {
    for kind in backends() {
        let engine = engine(kind, 4, 4);
        let dir = tempfile::tempdir().unwrap();
        let file = engine
            .open(&dir.path().join("u.bin"), OpenMode::Create)
            .unwrap();
        if !file.is_direct() {
            continue;
        }
        let mut q = engine.queue();
        q.submit([Request::write(&file, 100, ALIGN, AlignedBuf::new(ALIGN), 0)]);
        let c = q.wait().unwrap();
        assert!(matches!(c.result, Err(IoError::Invalid(_))));
    }
}

#[test]
fn registered_buffers_and_files_read_the_same_bytes() {
    for kind in backends() {
        let engine = engine(kind, 16, 4);
        let dir = tempfile::tempdir().unwrap();
        let (path, data) = sample(dir.path(), 1 << 20);
        let file = engine.open(&path, OpenMode::Read).unwrap();
        assert_eq!(file.fixed_index().is_some(), kind == BackendKind::IoUring);
        let pool = engine.fixed_pool(8, ALIGN);
        assert_eq!(pool.registered(), kind == BackendKind::IoUring);
        let mut q = engine.queue();
        for round in 0..10u64 {
            q.submit((0..8u64).map(|i| {
                let off = ((round * 8 + i) * 12_289) % ((1 << 20) - ALIGN as u64);
                Request::read(
                    &file,
                    align_down(off),
                    ALIGN,
                    IoBuf::Fixed(pool.take()),
                    align_down(off),
                )
            }));
            while let Some(c) = q.wait() {
                let off = c.tag as usize;
                assert_eq!(c.buf.as_slice(), &data[off..off + ALIGN]);
            }
        }
    }
}

#[test]
fn auto_reports_what_it_chose() {
    let e = Engine::new(&EngineConfig::default()).unwrap();
    match e.kind() {
        BackendKind::IoUring => assert!(e.fallback_reason().is_none()),
        BackendKind::Threads => assert!(!e.fallback_reason().unwrap().is_empty()),
        BackendKind::Auto => panic!("an engine runs a concrete backend"),
    }
}
