//! The compute seam a training step runs through (`backend`: the `Compute` trait and its CPU implementation; `device`: the device backend behind it), the dense kernels of the training step and the number formats they read: matrix products, softmax, bfloat16.

pub(crate) mod backend;
pub(crate) mod bf16;
pub(crate) mod device;
pub(crate) mod gemm;
pub(crate) mod kernels;
