//! The number format a model's linear layers are served in.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Result, ServeError};

/// The number format the linear layers are served in. Aggregations are float32 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Float32 weights and float32 products.
    Fp32,
    /// Int8 weights (symmetric, one scale per output channel) and int8 activations (one scale
    /// per row), multiplied with int32 accumulation: a quarter of the weight bytes.
    Int8,
}

impl Precision {
    /// `fp32` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Int8 => "int8",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = ServeError;

    /// `fp32` or `int8` (case-insensitive).
    fn from_str(s: &str) -> Result<Precision> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" => Ok(Precision::Fp32),
            "int8" => Ok(Precision::Int8),
            _ => Err(ServeError::InvalidArgument(format!(
                "precision: expected fp32 or int8, got {s:?}"
            ))),
        }
    }
}
