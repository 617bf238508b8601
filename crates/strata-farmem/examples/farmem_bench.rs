//! CPU per far byte and read throughput of the far-memory transports, side by side.
//!
//! `cargo run --release -p strata-farmem --example farmem_bench -- [SECONDS] [ROUNDS] [CASES]`
//!
//! Starts one memory server per transport as child processes on loopback (this binary with
//! `serve TRANSPORT`), writes a 256 MiB segment to each, and then, for every case and over
//! `ROUNDS` rounds (the cases alternating within each round), streams 4 MiB reads (16 in
//! flight) over the segment for `SECONDS` (default 3 s, 3 rounds). A case is
//! `CLIENT/SERVER/CHUNK`, e.g. `uring/uring/4M`; the default is every transport pair at chunks
//! of 256 KiB and 4 MiB. Measured per case: GB/s, and CPU seconds per GB read of the client
//! (this process, `getrusage`) and of the server (`/proc/PID/stat`), with the 1-minute load
//! average; printed as a Markdown table of medians over the rounds, then one JSON line. The
//! kernel charges loopback's packet processing to the process whose system call triggered it,
//! so the two columns add up to the CPU the transfer cost the machine. A `uring` server's
//! child also reports its zero-copy sends and how many of them the kernel copied.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use strata_farmem::{
    ClientConfig, FarClient, FarRead, Server, ServerConfig, StopHandle, TransportKind,
};

const SEGMENT: usize = 256 << 20;
const READ_LEN: usize = 4 << 20;
const IN_FLIGHT: usize = 16;

fn transport(name: &str) -> TransportKind {
    match name {
        "tcp" => TransportKind::Tcp,
        "uring" => TransportKind::Uring,
        other => panic!("transport {other:?}: expected tcp or uring"),
    }
}

fn size(text: &str) -> usize {
    let (num, unit) = text.split_at(text.len() - 1);
    match unit {
        "K" => num.parse::<usize>().expect("a size such as 256K") << 10,
        "M" => num.parse::<usize>().expect("a size such as 4M") << 20,
        _ => text.parse().expect("a size such as 256K or 4M"),
    }
}

/// `serve TRANSPORT`: a server until stdin closes; prints its address, and at the end its
/// zero-copy counts.
fn serve(kind: TransportKind) -> strata_farmem::Result<()> {
    let server = Server::bind(&ServerConfig {
        capacity_bytes: 2 * SEGMENT as u64,
        transport: kind,
        ..Default::default()
    })?;
    println!("{}", server.local_addr());
    std::io::stdout().flush().ok();
    let stop = server.stop_handle();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        StopHandle::stop(&stop);
    });
    server.run_until(&|| false)?;
    let zc = server.zero_copy_stats();
    println!("zero-copy sends {} copied {}", zc.sends, zc.copied);
    Ok(())
}

struct Child1 {
    child: Child,
    addr: String,
    out: BufReader<std::process::ChildStdout>,
}

fn spawn_server(kind: TransportKind) -> Child1 {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args(["serve", kind.name()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting a server");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut addr = String::new();
    out.read_line(&mut addr).expect("the server's address");
    Child1 {
        child,
        addr: addr.trim().to_string(),
        out,
    }
}

/// CPU seconds (user + system) of process `pid`.
fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // SAFETY: sysconf has no memory arguments.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / ticks
}

fn own_cpu() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split(' ').next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

#[derive(Clone, Copy)]
struct Sample {
    gb_s: f64,
    client_s_per_gb: f64,
    server_s_per_gb: f64,
    load1: f64,
}

/// Streams reads over segment 1 for `seconds`; the client's and server's CPU per GB.
fn measure(client: &FarClient, server_pid: u32, seconds: f64) -> Sample {
    let per_pass = SEGMENT / READ_LEN;
    let (tx, rx) = crossbeam_channel::unbounded();
    let load = load1();
    let (c0, s0, t0) = (own_cpu(), cpu_of(server_pid), Instant::now());
    for k in 0..IN_FLIGHT {
        let off = (k % per_pass) * READ_LEN;
        client.submit(vec![FarRead::new(1, off as u64, READ_LEN, k as u64)], &tx);
    }
    let (mut bytes, mut next, mut pending) = (0u64, IN_FLIGHT, IN_FLIGHT);
    while pending > 0 {
        let done = rx.recv().expect("completion");
        pending -= 1;
        bytes += done.result.expect("a far read failed") as u64;
        if t0.elapsed().as_secs_f64() < seconds {
            let off = (next % per_pass) * READ_LEN;
            let read = FarRead {
                segment: 1,
                offset: off as u64,
                len: READ_LEN,
                buf: done.buf,
                tag: next as u64,
            };
            client.submit(vec![read], &tx);
            next += 1;
            pending += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let gb = bytes as f64 / 1e9;
    Sample {
        gb_s: gb / secs,
        client_s_per_gb: (own_cpu() - c0) / gb,
        server_s_per_gb: (cpu_of(server_pid) - s0) / gb,
        load1: load,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> strata_farmem::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        return serve(transport(args.get(1).map_or("tcp", String::as_str)));
    }
    let seconds: f64 = args.first().map_or(3.0, |s| s.parse().expect("SECONDS"));
    let rounds: usize = args.get(1).map_or(3, |s| s.parse().expect("ROUNDS"));
    let cases: Vec<(TransportKind, TransportKind, usize)> = match args.get(2) {
        Some(list) => list
            .split(',')
            .map(|c| {
                let p: Vec<&str> = c.split('/').collect();
                assert_eq!(p.len(), 3, "case {c:?}: expected CLIENT/SERVER/CHUNK");
                (transport(p[0]), transport(p[1]), size(p[2]))
            })
            .collect(),
        None => [256usize << 10, 4 << 20]
            .into_iter()
            .flat_map(|chunk| {
                [TransportKind::Tcp, TransportKind::Uring]
                    .into_iter()
                    .flat_map(move |c| {
                        [TransportKind::Tcp, TransportKind::Uring].map(move |s| (c, s, chunk))
                    })
            })
            .collect(),
    };
    let mut servers: Vec<(TransportKind, Child1)> = Vec::new();
    for kind in [TransportKind::Tcp, TransportKind::Uring] {
        if cases.iter().any(|c| c.1 == kind) {
            servers.push((kind, spawn_server(kind)));
        }
    }
    let data: Vec<u8> = (0..SEGMENT).map(|i| (i % 251) as u8).collect();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for (k, &(ck, sk, chunk)) in cases.iter().enumerate() {
            let srv = &servers.iter().find(|s| s.0 == sk).expect("started").1;
            let client = FarClient::connect(&ClientConfig {
                addr: srv.addr.clone(),
                chunk_bytes: chunk,
                transport: ck,
                ..Default::default()
            })?;
            client.alloc(1, SEGMENT as u64)?;
            client.write(1, 0, &data)?;
            let s = measure(&client, srv.child.id(), seconds);
            eprintln!(
                "round {round} {ck}/{sk}/{} KiB: {:.2} GB/s, CPU s per GB: client {:.3}, server {:.3} (load {:.1})",
                chunk >> 10,
                s.gb_s,
                s.client_s_per_gb,
                s.server_s_per_gb,
                s.load1
            );
            samples[k].push(s);
        }
    }
    println!("| client / server transport | chunk | GB/s | client CPU s/GB | server CPU s/GB | total CPU s/GB | load (1 min) |");
    println!("|---|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for (k, &(ck, sk, chunk)) in cases.iter().enumerate() {
        let m = |f: fn(&Sample) -> f64| median(samples[k].iter().map(f).collect());
        let (gb_s, c, s, l) = (
            m(|x| x.gb_s),
            m(|x| x.client_s_per_gb),
            m(|x| x.server_s_per_gb),
            m(|x| x.load1),
        );
        let total = m(|x| x.client_s_per_gb + x.server_s_per_gb);
        println!(
            "| {ck} / {sk} | {} KiB | {gb_s:.2} | {c:.3} | {s:.3} | {total:.3} | {l:.1} |",
            chunk >> 10
        );
        json.push(format!(
            "{{\"client\":\"{ck}\",\"server\":\"{sk}\",\"chunk\":{chunk},\"gb_s\":{gb_s:.4},\"client_cpu_s_per_gb\":{c:.4},\"server_cpu_s_per_gb\":{s:.4},\"total_cpu_s_per_gb\":{total:.4},\"load1\":{l:.2},\"rounds\":{rounds},\"seconds\":{seconds}}}"
        ));
    }
    for (kind, mut srv) in servers {
        drop(srv.child.stdin.take());
        let mut line = String::new();
        let _ = srv.out.read_line(&mut line);
        let _ = srv.child.wait();
        if kind == TransportKind::Uring {
            println!("uring server: {}", line.trim());
        }
    }
    println!("[{}]", json.join(","));
    Ok(())
}
