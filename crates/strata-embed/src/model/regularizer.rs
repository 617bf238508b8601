//! Regularizers of the rows a chunk touches: N3 (Lacroix et al. 2018, the nuclear 3-norm
//! of ComplEx-N3, as PyTorch-BigGraph's `N3Regularizer`) and L2.
//!
//! Each chunk direction adds `reg_weight / b · Σ R(x)` over its `b` source rows, true target
//! rows and relation rows (not the negatives, as PBG): `R(x) = Σ_k |x_k|³` for N3 and
//! `Σ_k x_k²` for L2. Rows in complex coordinates (ComplEx and RotatE nodes, ComplEx and
//! `complex_diagonal` relations) take the modulus of each coordinate instead of each real
//! (`|x_k|` is `√(re² + im²)`), so that N3 is the 3-norm of the complex vector. RotatE's
//! relation rows are phases and are not regularized.
//!
//! **Weighted** (`reg_weighted`; LibKGE's `regularize_args.weighted`, the form of Lacroix et
//! al.'s ComplEx-N3 code): every row a chunk's edges reference is penalised once per edge that
//! references it, so a node's penalty follows its frequency in the training edges. LibKGE adds
//! `w / p · Σ_e count_e · R(x_e) / B` for a batch of `B` triples (`count_e`: occurrences of `e`
//! among the batch's heads and tails, or relations) next to a loss averaged over the batch;
//! Strata's chunk loss is summed over its edges, so the term is `B` times that, `w / p · Σ
//! R(x)` over the occurrences, and LibKGE's weights keep their meaning. Each edge's head and
//! tail are penalised once per chunk (with both sides corrupted, on the first side only), its
//! relation row once per row trained: `r` for the tail side and, with reciprocal relations,
//! its inverse for the head side (LibKGE's reciprocal model penalises both).
//!
//! **Table scope** (`reg_scope = "table"`; LibKGE's unweighted `lp`, which penalises every
//! embedding of the table in every batch): in 1vsAll and KvsAll, where each chunk steps every
//! entity row anyway, each chunk adds `w · B / p · Σ R(x)` over every candidate entity row (`B`
//! the chunk's edges: LibKGE's `w / p · Σ R(x)` next to a loss averaged over the batch, times
//! `B` for Strata's summed loss), once per chunk rather than per side ([`regularize_table`]).
//! Relation rows keep the chunk's scope.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Chunk, Grads, Layout, ScoreModel};

/// Which regularizer (config `regularizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RegularizerKind {
    /// No regularization.
    #[default]
    None,
    /// `Σ |x|³` (moduli for complex coordinates).
    N3,
    /// `Σ x²`.
    L2,
}

/// Which entity rows a regularizer penalises (config `reg_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RegScope {
    /// The rows each chunk's edges reference.
    #[default]
    Chunk,
    /// Every entity row, in every chunk (1vsAll and KvsAll).
    Table,
}

/// A regularizer and its weights.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Regularizer {
    pub kind: RegularizerKind,
    /// `reg_weight`: the factor of `Σ R(x) / b` (weighted: of `Σ R(x) / p`).
    pub weight: f32,
    /// `relation_reg_weight`: the factor for relation rows (`None`: `weight`).
    pub rel_weight: Option<f32>,
    /// `reg_weighted`: LibKGE's weighted form (see the module doc).
    pub weighted: bool,
    /// `reg_scope`: the chunk's entity rows, or every entity row of the table.
    pub scope: RegScope,
}

/// Which rows of a chunk direction a regularizer takes: its source and target rows, its
/// relation rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegRows {
    pub nodes: bool,
    pub rels: bool,
}

impl Regularizer {
    /// The rows one side of a chunk regularizes: all of them, except that in the weighted
    /// form a side whose edges another side of the chunk trained already (`repeat`: the
    /// head side of `corrupt = both`) takes only its relation rows, and those only when they
    /// are rows of their own (`reciprocal`: the inverses).
    /// With table scope a side takes no entity rows: [`regularize_table`] penalises them all
    /// once per chunk.
    pub fn rows(&self, repeat: bool, reciprocal: bool) -> RegRows {
        if self.scope == RegScope::Table {
            RegRows {
                nodes: false,
                rels: true,
            }
        } else if self.weighted && repeat {
            RegRows {
                nodes: false,
                rels: reciprocal,
            }
        } else {
            RegRows {
                nodes: true,
                rels: true,
            }
        }
    }
}

impl RegularizerKind {
    /// `R(m)` of one magnitude `m >= 0` and `R'(m) / m`, the factor of a coordinate's real
    /// in the gradient (`d R / d x = R'(m) · x / m`).
    fn of(self, m: f32) -> (f32, f32) {
        match self {
            RegularizerKind::None => (0.0, 0.0),
            RegularizerKind::N3 => (m * m * m, 3.0 * m),
            RegularizerKind::L2 => (m * m, 2.0),
        }
    }

    /// The `p` of the norm (`R(x) = |x|^p`): LibKGE's weighted terms are divided by it.
    fn power(self) -> f32 {
        match self {
            RegularizerKind::N3 => 3.0,
            RegularizerKind::L2 | RegularizerKind::None => 2.0,
        }
    }
}

/// Adds `w · R(row)` to the returned total and `w · d R / d row` to `grad`.
fn add_row(kind: RegularizerKind, layout: Layout, w: f32, row: &[f32], grad: &mut [f32]) -> f64 {
    let mut total = 0.0f64;
    match layout {
        Layout::Skip => {}
        Layout::Real => {
            for (x, g) in row.iter().zip(grad.iter_mut()) {
                let (r, f) = kind.of(x.abs());
                total += r as f64;
                *g += w * f * x;
            }
        }
        Layout::Complex => {
            let h = row.len() / 2;
            for k in 0..h {
                let (re, im) = (row[k], row[h + k]);
                let (r, f) = kind.of((re * re + im * im).sqrt());
                total += r as f64;
                grad[k] += w * f * re;
                grad[h + k] += w * f * im;
            }
        }
    }
    w as f64 * total
}

/// The regularization term of chunk direction `c` (its source and true target rows, its
/// relation rows, as `which` says), with its gradient added to `g` (whose shapes are `c`'s).
/// Returns the term, for the loss.
pub fn regularize(
    reg: &Regularizer,
    model: &ScoreModel,
    c: &Chunk,
    g: &mut Grads,
    which: RegRows,
) -> f64 {
    let rel_weight = reg.rel_weight.unwrap_or(reg.weight);
    if reg.kind == RegularizerKind::None || (reg.weight == 0.0 && rel_weight == 0.0) || c.b == 0 {
        return 0.0;
    }
    let (d, rd) = (model.dim, model.rel_dim());
    let scaled = |w: f32| {
        if reg.weighted {
            w / reg.kind.power()
        } else {
            w / c.b as f32
        }
    };
    let (nodes, rels) = model.layouts();
    let mut total = 0.0;
    if which.nodes && reg.weight != 0.0 {
        let w = scaled(reg.weight);
        for (rows, grads) in [(c.src, &mut g.src), (c.dst, &mut g.dst)] {
            for (row, grad) in rows.chunks_exact(d).zip(grads.chunks_exact_mut(d)) {
                total += add_row(reg.kind, nodes, w, row, grad);
            }
        }
    }
    if which.rels && rd > 0 && rel_weight != 0.0 {
        let w = scaled(rel_weight);
        for (row, grad) in c.rel.chunks_exact(rd).zip(g.rel.chunks_exact_mut(rd)) {
            total += add_row(reg.kind, rels, w, row, grad);
        }
    }
    total
}

/// The table-scope term of one chunk of `b` edges over `rows` (every candidate entity row,
/// `dim` reals each), `reg_weight · b / p · Σ R(x)`, with its gradient added to `grads` (the
/// same shape). Returns the term, for the loss; 0 unless the scope is the table.
pub fn regularize_table(
    reg: &Regularizer,
    model: &ScoreModel,
    b: usize,
    rows: &[f32],
    grads: &mut [f32],
) -> f64 {
    if reg.scope != RegScope::Table || reg.kind == RegularizerKind::None || reg.weight == 0.0 {
        return 0.0;
    }
    let d = model.dim;
    let w = reg.weight * b as f32 / reg.kind.power();
    let (nodes, _) = model.layouts();
    rows.chunks_exact(d)
        .zip(grads.chunks_exact_mut(d))
        .map(|(row, grad)| add_row(reg.kind, nodes, w, row, grad))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PbgForm, ScoreKind};

    const ALL: RegRows = RegRows {
        nodes: true,
        rels: true,
    };

    fn model(kind: ScoreKind, dim: usize) -> ScoreModel {
        ScoreModel {
            kind,
            dim,
            transe_norm: 2,
            pbg: PbgForm::default(),
        }
    }

    /// The term and gradients of one edge `(s, r, t)` under `kind` with weight 1.
    fn one_edge(
        kind: RegularizerKind,
        m: &ScoreModel,
        s: &[f32],
        r: &[f32],
        t: &[f32],
    ) -> (f64, Grads) {
        let c = Chunk {
            b: 1,
            n: 0,
            src: s,
            rel: r,
            dst: t,
            neg: &[],
            weights: &[],
            pos_query: None,
        };
        let mut g = Grads {
            src: vec![0.0; s.len()],
            rel: vec![0.0; r.len()],
            dst: vec![0.0; t.len()],
            neg: Vec::new(),
            ..Default::default()
        };
        let reg = Regularizer {
            kind,
            weight: 1.0,
            ..Default::default()
        };
        (regularize(&reg, m, &c, &mut g, ALL), g)
    }

    #[test]
    fn real_rows_by_hand() {
        // DistMult, s = (1, -2), r = (0.5, 0), t = (0, 3).
        let m = model(ScoreKind::DistMult, 2);
        let (s, r, t) = ([1.0, -2.0], [0.5, 0.0], [0.0, 3.0]);
        // N3: 1 + 8 + 0.125 + 27; d|x|³/dx = 3 x |x|.
        let (total, g) = one_edge(RegularizerKind::N3, &m, &s, &r, &t);
        assert!((total - 36.125).abs() < 1e-6, "{total}");
        assert_eq!(g.src, [3.0, -12.0]);
        assert_eq!(g.rel, [0.75, 0.0]);
        assert_eq!(g.dst, [0.0, 27.0]);
        // L2: 1 + 4 + 0.25 + 9; dx²/dx = 2x.
        let (total, g) = one_edge(RegularizerKind::L2, &m, &s, &r, &t);
        assert!((total - 14.25).abs() < 1e-6, "{total}");
        assert_eq!(
            (g.src, g.rel, g.dst),
            (vec![2.0, -4.0], vec![1.0, 0.0], vec![0.0, 6.0])
        );
    }

    #[test]
    fn complex_rows_use_moduli_and_rotate_phases_are_left_alone() {
        // ComplEx with one coordinate: s = 3 + 4i (|s| = 5), r = 0 + 1i, t = 0.
        let m = model(ScoreKind::ComplEx, 2);
        let (total, g) = one_edge(
            RegularizerKind::N3,
            &m,
            &[3.0, 4.0],
            &[0.0, 1.0],
            &[0.0, 0.0],
        );
        // 5³ + 1³; d|z|³/d(re, im) = 3 |z| (re, im).
        assert!((total - 126.0).abs() < 1e-4, "{total}");
        assert_eq!(g.src, [45.0, 60.0]);
        assert_eq!(g.rel, [0.0, 3.0]);
        let rot = model(ScoreKind::RotatE, 2);
        let (total, g) = one_edge(RegularizerKind::N3, &rot, &[3.0, 4.0], &[2.0], &[0.0, 0.0]);
        assert!((total - 125.0).abs() < 1e-4, "{total}");
        assert_eq!(g.rel, [0.0]);
    }

    #[test]
    fn gradients_match_finite_differences_and_scale_by_weight_over_edges() {
        let m = model(ScoreKind::ComplEx, 4);
        let (b, d) = (2usize, 4usize);
        let rows: Vec<f32> = (0..3 * b * d)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let (s, rest) = rows.split_at(b * d);
        let (r, t) = rest.split_at(b * d);
        let reg = Regularizer {
            kind: RegularizerKind::N3,
            weight: 0.3,
            ..Default::default()
        };
        let term = |s: &[f32], r: &[f32], t: &[f32], g: &mut Grads| {
            let c = Chunk {
                b,
                n: 0,
                src: s,
                rel: r,
                dst: t,
                neg: &[],
                weights: &[],
                pos_query: None,
            };
            regularize(&reg, &m, &c, g, ALL)
        };
        let zero = || Grads {
            src: vec![0.0; b * d],
            rel: vec![0.0; b * d],
            dst: vec![0.0; b * d],
            neg: Vec::new(),
            ..Default::default()
        };
        let mut g = zero();
        let total = term(s, r, t, &mut g);
        let (_, unit) = one_edge(RegularizerKind::N3, &m, &s[..d], &r[..d], &t[..d]);
        // Weight 0.3 over 2 edges: 0.15 of one edge's unit gradient.
        for k in 0..d {
            assert!((g.src[k] - 0.15 * unit.src[k]).abs() < 1e-5);
        }
        assert!(total > 0.0);
        let h = 1e-3f32;
        for k in 0..b * d {
            let (mut up, mut down) = (s.to_vec(), s.to_vec());
            up[k] += h;
            down[k] -= h;
            let numeric =
                (term(&up, r, t, &mut zero()) - term(&down, r, t, &mut zero())) / (2.0 * h as f64);
            assert!(
                (numeric - g.src[k] as f64).abs() < 1e-2,
                "{k}: {numeric} vs {}",
                g.src[k]
            );
        }
    }

    /// A chunk of `b` edges of DistMult rows `s`, `r`, `t` (`b x d` each) and zero gradients.
    fn chunk<'a>(b: usize, s: &'a [f32], r: &'a [f32], t: &'a [f32]) -> (Chunk<'a>, Grads) {
        let c = Chunk {
            b,
            n: 0,
            src: s,
            rel: r,
            dst: t,
            neg: &[],
            weights: &[],
            pos_query: None,
        };
        let g = Grads {
            src: vec![0.0; s.len()],
            rel: vec![0.0; r.len()],
            dst: vec![0.0; t.len()],
            neg: Vec::new(),
            ..Default::default()
        };
        (c, g)
    }

    #[test]
    fn weighted_terms_count_each_occurrence_over_p_with_their_own_relation_weight() {
        // Two edges (a, r, b) and (a, r, c) in one dimension: a = 2, b = -1, c = 3, r = 0.5.
        // Weighted N3 (LibKGE's lp with p = 3, weighted): node a appears twice, b and c once,
        // r twice; w / 3 · (2·8 + 1 + 27) for nodes, w_r / 3 · 2 · 0.125 for relations.
        let m = model(ScoreKind::DistMult, 1);
        let (s, r, t) = ([2.0, 2.0], [0.5, 0.5], [-1.0, 3.0]);
        let reg = Regularizer {
            kind: RegularizerKind::N3,
            weight: 0.6,
            rel_weight: Some(1.5),
            weighted: true,
            ..Regularizer::default()
        };
        let (c, mut g) = chunk(2, &s, &r, &t);
        let total = regularize(&reg, &m, &c, &mut g, ALL);
        let want = 0.2 * 44.0 + 0.5 * 0.25;
        assert!((total - want).abs() < 1e-6, "{total} vs {want}");
        // d/dx w/3 |x|³ = w x |x|: per occurrence, summed by the caller's update per row.
        assert_eq!(g.src, [0.6 * 4.0, 0.6 * 4.0]);
        assert_eq!(g.dst, [-0.6, 0.6 * 9.0]);
        assert_eq!(g.rel, [1.5 * 0.25, 1.5 * 0.25]);
        // The head side of corrupt = both: relations only, and only inverse rows.
        for (repeat, reciprocal, nodes, rels) in [
            (false, false, true, true),
            (true, true, false, true),
            (true, false, false, false),
        ] {
            assert_eq!(reg.rows(repeat, reciprocal), RegRows { nodes, rels });
        }
        let (c, mut g) = chunk(2, &s, &r, &t);
        let rels_only = RegRows {
            nodes: false,
            rels: true,
        };
        let total = regularize(&reg, &m, &c, &mut g, rels_only);
        assert!((total - 0.5 * 0.25).abs() < 1e-7);
        assert_eq!((g.src, g.dst), (vec![0.0; 2], vec![0.0; 2]));
        // Unweighted sides are all rows whatever the side.
        let plain = Regularizer {
            weighted: false,
            ..reg
        };
        assert_eq!(plain.rows(true, false), ALL);
        // Weighted L2: w / 2 · Σ x².
        let l2 = Regularizer {
            kind: RegularizerKind::L2,
            ..reg
        };
        let (c, mut g) = chunk(2, &s, &r, &t);
        let total = regularize(&l2, &m, &c, &mut g, ALL);
        assert!((total - (0.3 * 18.0 + 0.75 * 0.5)).abs() < 1e-6, "{total}");
        assert_eq!(g.dst, [-0.6, 0.6 * 3.0]);
    }

    #[test]
    fn kbc_n3_weight_is_six_and_three_times_in_the_weighted_form_of_both_sides() {
        // Lacroix et al.'s kbc trains each edge (s, r, t) as two queries, (s, r, ?) and
        // (t, r⁻¹, ?), each adding λ · Σ |modulus|³ of its lhs, rel and rhs rows beside a loss
        // summed over the queries: λ (2 N3(s) + 2 N3(t) + N3(r) + N3(r⁻¹)) an edge. The
        // complex-n3 recipes give Strata's weighted form (w / 3 a row, the head side taking only
        // its inverse relation row) reg_weight 6λ and relation_reg_weight 3λ.
        let lambda = 0.05f32;
        let m = model(ScoreKind::ComplEx, 4);
        let (s, t) = ([0.5, -1.0, 2.0, 0.25], [-0.3, 0.8, 1.5, -2.0]);
        let (r, r_inv) = ([1.0, 0.4, -0.6, 0.2], [0.7, -0.9, 0.1, 1.2]);
        let reg = Regularizer {
            kind: RegularizerKind::N3,
            weight: 6.0 * lambda,
            rel_weight: Some(3.0 * lambda),
            weighted: true,
            ..Regularizer::default()
        };
        let (tail, mut g_tail) = chunk(1, &s, &r, &t);
        let (head, mut g_head) = chunk(1, &t, &r_inv, &s);
        let total = regularize(&reg, &m, &tail, &mut g_tail, reg.rows(false, true))
            + regularize(&reg, &m, &head, &mut g_head, reg.rows(true, true));
        let n3 = |x: &[f32]| -> f64 {
            (0..2)
                .map(|k| (x[k] as f64).hypot(x[2 + k] as f64).powi(3))
                .sum()
        };
        let kbc = lambda as f64 * (2.0 * n3(&s) + 2.0 * n3(&t) + n3(&r) + n3(&r_inv));
        assert!((total - kbc).abs() < 1e-5 * kbc, "{total} vs {kbc}");
        // The gradients too: kbc's d/dx λ |x|³ = 3λ |x| x per occurrence (twice for s and t).
        let grad = |x: &[f32], times: f32| -> Vec<f32> {
            (0..4)
                .map(|i| {
                    let k = i % 2;
                    times * 3.0 * lambda * x[k].hypot(x[2 + k]) * x[i]
                })
                .collect()
        };
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
        assert!(close(&g_tail.src, &grad(&s, 2.0)), "{:?}", g_tail.src);
        assert!(close(&g_tail.dst, &grad(&t, 2.0)), "{:?}", g_tail.dst);
        assert!(close(&g_tail.rel, &grad(&r, 1.0)), "{:?}", g_tail.rel);
        assert!(close(&g_head.rel, &grad(&r_inv, 1.0)), "{:?}", g_head.rel);
        assert!(g_head.src.iter().chain(&g_head.dst).all(|&x| x == 0.0));
    }

    #[test]
    fn weighted_gradients_match_finite_differences() {
        for (kind, score) in [
            (RegularizerKind::N3, ScoreKind::ComplEx),
            (RegularizerKind::L2, ScoreKind::ComplEx),
            (RegularizerKind::N3, ScoreKind::DistMult),
        ] {
            let m = model(score, 4);
            let (b, d) = (3usize, 4usize);
            let rows: Vec<f32> = (0..3 * b * d)
                .map(|i| ((i * 5 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let reg = Regularizer {
                kind,
                weight: 0.4,
                rel_weight: Some(0.9),
                weighted: true,
                ..Regularizer::default()
            };
            let term = |rows: &[f32], g: &mut Grads| {
                let (s, rest) = rows.split_at(b * d);
                let (r, t) = rest.split_at(b * d);
                let (c, _) = chunk(b, s, r, t);
                regularize(&reg, &m, &c, g, ALL)
            };
            let zero = || chunk(b, &rows[..b * d], &rows[..b * d], &rows[..b * d]).1;
            let mut g = zero();
            term(&rows, &mut g);
            let analytic: Vec<f32> = [g.src, g.rel, g.dst].concat();
            let h = 1e-3f32;
            for k in 0..rows.len() {
                let (mut up, mut down) = (rows.clone(), rows.clone());
                up[k] += h;
                down[k] -= h;
                let numeric =
                    (term(&up, &mut zero()) - term(&down, &mut zero())) / (2.0 * h as f64);
                assert!(
                    (numeric - analytic[k] as f64).abs() < 1e-2,
                    "{kind:?} {score:?} {k}: {numeric} vs {}",
                    analytic[k]
                );
            }
        }
    }
}
