//! The generated protobuf messages and gRPC stubs of `proto/strata/serve/v1/serve.proto`.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("strata.serve.v1");

/// The schema's encoded `FileDescriptorSet`, for clients that build messages at run time.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/serve_descriptor.bin"));
