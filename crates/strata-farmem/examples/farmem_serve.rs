//! Runs a far-memory server until killed.
//!
//! `cargo run --release -p strata-farmem --example farmem_serve -- [LISTEN] [CAPACITY_MIB]`
//! (defaults: `127.0.0.1:7000`, 1024 MiB).

use strata_farmem::{Server, ServerConfig};

fn main() -> strata_farmem::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:7000".into());
    let capacity_mib: u64 = args
        .next()
        .map_or(1024, |s| s.parse().expect("CAPACITY_MIB"));
    let server = Server::bind(&ServerConfig {
        listen,
        capacity_bytes: capacity_mib << 20,
        ..Default::default()
    })?;
    println!(
        "far-memory server on {} holding up to {capacity_mib} MiB",
        server.local_addr()
    );
    server.run_until(&|| false)
}
