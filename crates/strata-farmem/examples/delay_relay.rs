//! A TCP relay that adds a fixed one-way delay in each direction: a stand-in for
//! `tc qdisc ... netem delay` on kernels built without netem (the benchmarks' latency runs).
//!
//! `cargo run --release -p strata-farmem --example delay_relay -- LISTEN UPSTREAM DELAY_US`
//!
//! Every connection to LISTEN gets its own connection to UPSTREAM. Bytes are forwarded in the
//! chunks they arrive in; each chunk leaves DELAY_US after it arrived, so the added delay does
//! not cap throughput (a reader and a writer thread per direction, like a link with that
//! propagation delay). Prints `ready` once listening.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Bytes read at a time: large enough that the relay is not the bottleneck on loopback.
const CHUNK: usize = 1 << 20;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream), Some(delay)) = (args.next(), args.next(), args.next())
    else {
        eprintln!("usage: delay_relay LISTEN UPSTREAM DELAY_US");
        std::process::exit(2);
    };
    let delay = Duration::from_micros(delay.parse().expect("DELAY_US: microseconds"));
    let listener = TcpListener::bind(&listen)?;
    println!("ready");
    for client in listener.incoming() {
        let client = client?;
        let server = TcpStream::connect(&upstream)?;
        for s in [&client, &server] {
            s.set_nodelay(true)?;
        }
        forward(client.try_clone()?, server.try_clone()?, delay);
        forward(server, client, delay);
    }
    Ok(())
}

/// Copies `from` to `to`, each chunk held until `delay` after it was read.
fn forward(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = crossbeam_channel::unbounded::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, buf) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if to.write_all(&buf).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
