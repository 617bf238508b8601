//! A tensor of a weights file: what the file parsers produce and the layers are built from.

/// One tensor of a weights file, widened or narrowed to float32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}
