//! Dense kernels of the training step and the number formats they read: matrix products, softmax, bfloat16.

pub mod bf16;
pub mod gemm;
pub mod kernels;
