//! Loopback (or remote) read throughput of the far-memory client.
//!
//! `cargo run --release -p strata-farmem --example farmem_bench -- [ADDR] [SEGMENT_MIB] [SECONDS]`
//!
//! Without ADDR (or with `local`) it starts a server in-process on an ephemeral port. It writes
//! one segment, then streams 4 MiB reads (16 in flight) over it for SECONDS, printing GB/s once
//! a second. If the server dies it reports how long the pending reads took to fail.

use std::time::{Duration, Instant};

use strata_farmem::{ClientConfig, FarClient, FarRead, Server, ServerConfig};

fn main() -> strata_farmem::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "local".into());
    let seg_mib: usize = args.next().map_or(256, |s| s.parse().expect("SEGMENT_MIB"));
    let seconds: u64 = args.next().map_or(5, |s| s.parse().expect("SECONDS"));
    let seg = seg_mib << 20;
    let addr = if addr == "local" {
        let server = Server::bind(&ServerConfig {
            capacity_bytes: seg as u64,
            ..Default::default()
        })?;
        let a = server.local_addr().to_string();
        std::thread::spawn(move || server.run_until(&|| false));
        a
    } else {
        addr
    };
    let client = FarClient::connect(&ClientConfig {
        addr,
        ..Default::default()
    })?;
    client.alloc(1, seg as u64)?;
    let data: Vec<u8> = (0..seg).map(|i| (i % 251) as u8).collect();
    let t = Instant::now();
    client.write(1, 0, &data)?;
    println!(
        "wrote {seg_mib} MiB at {:.2} GB/s",
        seg as f64 / t.elapsed().as_secs_f64() / 1e9
    );
    let read_len = (4usize << 20).min(seg);
    let per_pass = seg / read_len;
    let (tx, rx) = crossbeam_channel::unbounded();
    for k in 0..16 {
        let off = (k % per_pass) * read_len;
        client.submit(vec![FarRead::new(1, off as u64, read_len, k as u64)], &tx);
    }
    let (start, mut tick, mut bytes, mut next) = (Instant::now(), Instant::now(), 0u64, 16usize);
    let mut last_ok = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        let done = rx.recv().expect("completion");
        match done.result {
            Ok(n) => {
                bytes += n as u64;
                last_ok = Instant::now();
            }
            Err(e) => {
                println!(
                    "read failed {:?} after the last success: {e}",
                    last_ok.elapsed()
                );
                // 16 reads are always in flight: the other 15 must fail too, promptly.
                for _ in 0..15 {
                    let c = rx
                        .recv_timeout(Duration::from_secs(30))
                        .expect("a read hung");
                    assert!(c.result.is_err());
                }
                println!("all pending reads failed within {:?}", last_ok.elapsed());
                return Ok(());
            }
        }
        let off = (next % per_pass) * read_len;
        client.submit(
            vec![FarRead {
                segment: 1,
                offset: off as u64,
                len: read_len,
                buf: done.buf,
                tag: next as u64,
            }],
            &tx,
        );
        next += 1;
        if tick.elapsed() >= Duration::from_secs(1) {
            println!(
                "read {:.2} GB/s",
                bytes as f64 / tick.elapsed().as_secs_f64() / 1e9
            );
            tick = Instant::now();
            bytes = 0;
        }
    }
    let st = client.stats();
    println!("{st:?}");
    Ok(())
}
