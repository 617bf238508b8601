//! Dense kernels of the training step and the number formats they read: matrix products, softmax, bfloat16.

pub(crate) mod bf16;
pub(crate) mod gemm;
pub(crate) mod kernels;
