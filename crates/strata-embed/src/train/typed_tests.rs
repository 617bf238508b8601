//! Typed training through the real worker: a featurized entity's gradient reaches its
//! features, as positive and as negative, checked against finite differences of the chunk's
//! loss.

use crate::config::{Corrupt, NegativePool};
use crate::model::{Loss, LossKind, PbgForm, Regularizer, RegularizerKind, ScoreKind, ScoreModel};
use crate::storage::entity_types::{EntityType, FeatureBags, TypedLayout};
use crate::storage::shared::SharedRows;
use crate::train::typed_negatives::{NegSpace, SpaceInputs};
use crate::train::worker::{BucketCtx, PartRows, Pool, Worker};
use strata_store::rng::Rng;

const D: usize = 4;

/// Type `author` (3 plain rows, partition 0) and type `doc` (3 featurized entities over 4
/// features, the pinned region): doc 0 = {f0, f1}, doc 1 = {f1, f1, f2}, doc 2 = {f3}.
fn layout() -> (TypedLayout, FeatureBags) {
    let types = [
        EntityType {
            name: "author".into(),
            first: 0,
            count: 3,
            partitioned: true,
            features: None,
        },
        EntityType {
            name: "doc".into(),
            first: 3,
            count: 3,
            partitioned: false,
            features: Some(4),
        },
    ];
    let bags = FeatureBags {
        plain: 0,
        offsets: vec![0, 2, 5, 6],
        rows: vec![0, 1, 1, 1, 2, 3],
    };
    (TypedLayout::new(&types, 1, 0), bags)
}

/// `(doc, wrote-by, author)` edges: sources are featurized entities (rows of part 1).
const CHUNK: [[i32; 3]; 3] = [[0, 0, 1], [1, 0, 2], [2, 0, 0]];

/// Trains `CHUNK` once on the author rows `a` and the doc features `f` (row-wise Adagrad with
/// state `state`); returns the chunk's loss. Tail negatives are authors, head negatives docs.
fn train(a: &mut [f32], f: &mut [f32], state: f32, lr: f32) -> f64 {
    let (l, bags) = layout();
    let (mut sa, mut sf) = (vec![state; 3], vec![state; 4]);
    let parts = vec![
        PartRows {
            rows: SharedRows::new(a, &mut sa, D, 1),
            size: 3,
        },
        PartRows {
            rows: SharedRows::new(f, &mut sf, D, 1),
            size: 3,
        },
    ];
    let inputs = SpaceInputs {
        layout: &l,
        pool: NegativePool::Resident,
        regions: &[0, 1],
        banked: None,
    };
    let ctx = BucketCtx {
        model: ScoreModel {
            kind: ScoreKind::Dot,
            dim: D,
            transe_norm: 2,
            pbg: PbgForm::default(),
        },
        loss: Loss::plain(LossKind::Softmax, 0.1),
        lr,
        parts,
        src_part: 1,
        dst_part: 0,
        rels: None,
        inverse_offset: 0,
        corrupt: Corrupt::Both,
        head_prob: &[],
        negatives: 4,
        negatives_head: 4,
        shared_negatives: true,
        degree_fraction: 0.0,
        pool: Pool::Resident,
        reg: Regularizer {
            kind: RegularizerKind::None,
            weight: 0.0,
            ..Default::default()
        },
        dropout: Default::default(),
        negs: Some([
            NegSpace::new(&inputs, &[0], 0),
            NegSpace::new(&inputs, &[1], 1),
        ]),
        feat: Some((1, &bags)),
        vs_all: None,
    };
    let mut w = Worker::default();
    w.train_chunk(&ctx, &CHUNK, &[], 11);
    w.loss
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.normal_pair().0 as f32 * 0.5).collect()
}

#[test]
fn a_featurized_entity_trains_its_features_by_their_mean() {
    let (a, f) = (random(3 * D, 1), random(4 * D, 2));
    // With a row-wise Adagrad state of 1e6 and a rate of 1e3 a step is the gradient itself
    // (to a relative 1e-6): the summed gradient each feature row received.
    let (mut a1, mut f1) = (a.clone(), f.clone());
    train(&mut a1, &mut f1, 1e6, 1e3);
    for i in 0..4 * D {
        let grad = (f[i] - f1[i]) as f64;
        let h = 1e-2f32;
        let at = |x: f32| {
            let mut fx = f.clone();
            fx[i] = x;
            train(&mut a.clone(), &mut fx, 0.0, 0.0)
        };
        let numeric = (at(f[i] + h) - at(f[i] - h)) / (2.0 * h as f64);
        assert!(
            (grad - numeric).abs() < 2e-3 + 1e-2 * numeric.abs(),
            "feature {} coordinate {}: gradient {grad} against {numeric}",
            i / D,
            i % D
        );
    }
    // Every feature row was trained (feature 1 through two bags, twice in one).
    for row in 0..4 {
        assert!(
            (0..D).any(|k| f[row * D + k] != f1[row * D + k]),
            "feature {row} untouched"
        );
    }
}
