//! Compiles proto/strata/serve/v1/serve.proto with protox (a Rust protobuf compiler, so the
//! build needs no `protoc` binary) and generates the tonic server and client from it.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("strata/serve/v1/serve.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The encoded descriptors travel with the library: the Python client builds its message
    // classes from them, so the .proto stays the only schema.
    std::fs::write(
        out.join("serve_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_build::configure().compile_fds(fds)?;
    Ok(())
}
