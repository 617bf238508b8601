//! PyTorch-BigGraph's vocabulary of score functions: a relation operator, a comparator, and
//! the form they make together. Every model states its form ([`super::ScoreFunction::pbg_form`])
//! and its natural comparator in these terms; `pbg` (the model) is scored by any form.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A PBG relation operator: how the relation row turns the source row into the query row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Operator {
    /// `a = s`: no relation rows.
    #[default]
    None,
    /// `a = s + r`.
    Translation,
    /// `a = s ∘ r`.
    Diagonal,
    /// `a = M s` with `M` a `dim x dim` matrix (row-major).
    Linear,
    /// `a = M s + v`: the `dim x dim` matrix then the `dim` translation.
    Affine,
    /// `a = s r` in `dim/2` complex coordinates (real parts, then imaginary parts).
    ComplexDiagonal,
}

/// A PBG comparator between the query row `a` and a target row `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Comparator {
    /// `a · t`.
    Dot,
    /// `a · t / (‖a‖ ‖t‖)`.
    #[default]
    Cos,
    /// `−‖a − t‖`.
    L2,
    /// `−‖a − t‖²`.
    SquaredL2,
}

/// An operator and a comparator: the shape of a `pbg` model (PBG's defaults: `none`, `cos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PbgForm {
    pub operator: Operator,
    pub comparator: Comparator,
}

impl Operator {
    /// Its name in config files.
    pub fn name(self) -> &'static str {
        match self {
            Operator::None => "none",
            Operator::Translation => "translation",
            Operator::Diagonal => "diagonal",
            Operator::Linear => "linear",
            Operator::Affine => "affine",
            Operator::ComplexDiagonal => "complex_diagonal",
        }
    }

    /// Reals per relation row for node rows of `dim` reals.
    pub fn rel_dim(self, dim: usize) -> usize {
        match self {
            Operator::None => 0,
            Operator::Translation | Operator::Diagonal | Operator::ComplexDiagonal => dim,
            Operator::Linear => dim * dim,
            Operator::Affine => dim * dim + dim,
        }
    }
}

impl Comparator {
    /// Its name in config files.
    pub fn name(self) -> &'static str {
        match self {
            Comparator::Dot => "dot",
            Comparator::Cos => "cos",
            Comparator::L2 => "l2",
            Comparator::SquaredL2 => "squared_l2",
        }
    }
}

impl PbgForm {
    /// Whether the reversed relation row (see [`super::ScoreModel::reverse_relation`]) scores
    /// `(t, r', h)` as `r` scores `(h, r, t)`, so that heads can be corrupted without
    /// reciprocal relations: `none` with any comparator; `translation` (`r' = −r`) with the
    /// distances; `diagonal` (`r`), `linear` (`Mᵀ`) and `complex_diagonal` (the conjugate)
    /// with `dot`. The others need `reciprocal = true`.
    pub fn reversible(self) -> bool {
        use {Comparator as C, Operator as O};
        matches!(
            (self.operator, self.comparator),
            (O::None, _)
                | (O::Translation, C::L2 | C::SquaredL2)
                | (O::Diagonal | O::Linear | O::ComplexDiagonal, C::Dot)
        )
    }
}
