//! Where a typed run's uniform negatives come from: entities of the corrupted side's type
//! (PyTorch-BigGraph samples a relation's negatives from its right-hand side entity type), or
//! with `typed_negatives = false` from every type, in each case within the pool the run asks
//! for (`partition`, `resident` or `all`).
//!
//! A [`NegSpace`] lists the candidate rows of one corrupted side as spans, each weighted by
//! its entities, so that one draw picks a uniform entity among them: a span is either rows of
//! one resident part (a type's section there), or, for the `all` pool, a partitioned type
//! spread over every partition, whose partitions on disk are reached through their banks.

use std::sync::Arc;

use strata_store::rng::{scale, Rng};

use crate::config::NegativePool;
use crate::storage::bank::Banks;
use crate::storage::entity_types::TypedLayout;

/// One negative: a row of a resident part, or a row of a partition's bank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negative {
    /// `(index into the bucket's parts, entity-view row)`.
    Part(usize, u32),
    /// `(partition, bank row)`.
    Bank(u32, u32),
}

/// A run of a space's draws as a device step looks it up ([`NegSpace::spans`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawSpan {
    /// `entities` rows of resident part `part` (an index into the bucket's parts) from row
    /// `first`.
    Rows {
        part: usize,
        first: u32,
        entities: u64,
    },
    /// `entities` nodes of `partition`, on disk: each drawn as row `at + scale(rest, len)` of
    /// its bank, `rest` the rest of its draw ([`Rng::below_and_rest`]).
    Bank {
        partition: u32,
        at: u32,
        len: u32,
        entities: u64,
    },
}

/// Where one partitioned type lies over every partition (the `all` pool).
#[derive(Debug)]
pub struct Spread {
    /// Positions of the type per partition.
    per_part: u64,
    /// First entity-view row of the type in each partition.
    starts: Vec<u32>,
    /// Index into the bucket's parts of each resident partition.
    part_of: Arc<Vec<Option<usize>>>,
    /// The type's segment in every partition's bank.
    seg: usize,
}

#[derive(Debug)]
enum Span {
    /// Rows `lo ..` of part `part`.
    Rows {
        part: usize,
        lo: u32,
    },
    Spread(Spread),
}

/// The candidate negatives of one corrupted side.
#[derive(Debug)]
pub struct NegSpace {
    /// Cumulative entities of the spans (the last is the total).
    cum: Vec<u64>,
    spans: Vec<Span>,
}

/// What a bucket group's negative spaces are built from.
pub struct SpaceInputs<'a> {
    pub layout: &'a TypedLayout,
    pub pool: NegativePool,
    /// The region of each of the bucket's parts (`layout.partitions` for the pinned one).
    pub regions: &'a [u32],
    /// Index into the parts of each partition, when the `all` pool draws through banks.
    pub banked: Option<Arc<Vec<Option<usize>>>>,
}

impl NegSpace {
    /// Negatives of `types` for a side whose targets lie in part `target`.
    pub fn new(inputs: &SpaceInputs, types: &[usize], target: usize) -> NegSpace {
        let l = inputs.layout;
        let pinned = l.partitions;
        let mut space = NegSpace {
            cum: Vec::new(),
            spans: Vec::new(),
        };
        let rows_of = |space: &mut NegSpace, part: usize, t: usize| {
            let s = l.section(t, inputs.regions[part]);
            space.push(
                s.end - s.start,
                Span::Rows {
                    part,
                    lo: s.start as u32,
                },
            );
        };
        match (&inputs.banked, inputs.pool) {
            (_, NegativePool::Partition) => {
                types.iter().for_each(|&t| rows_of(&mut space, target, t))
            }
            (Some(part_of), NegativePool::All) => {
                let partitioned: Vec<usize> = (0..l.types.len())
                    .filter(|&t| l.types[t].partitioned)
                    .collect();
                for &t in types {
                    if !l.types[t].partitioned {
                        let part = inputs.regions.iter().position(|&r| r == pinned);
                        rows_of(&mut space, part.expect("the pinned region is resident"), t);
                        continue;
                    }
                    let spread = Spread {
                        per_part: l.per_part(t),
                        starts: (0..pinned).map(|r| l.section(t, r).start as u32).collect(),
                        part_of: part_of.clone(),
                        seg: partitioned
                            .iter()
                            .position(|&u| u == t)
                            .expect("partitioned"),
                    };
                    space.push(l.types[t].count, Span::Spread(spread));
                }
            }
            // Every part resident (or no room for banks): the resident parts are all.
            _ => {
                for part in 0..inputs.regions.len() {
                    types.iter().for_each(|&t| rows_of(&mut space, part, t));
                }
            }
        }
        space
    }

    fn push(&mut self, entities: u64, span: Span) {
        if entities > 0 {
            self.cum
                .push(self.cum.last().copied().unwrap_or(0) + entities);
            self.spans.push(span);
        }
    }

    /// Entities the space draws from.
    pub fn total(&self) -> u64 {
        self.cum.last().copied().unwrap_or(0)
    }

    /// The space as [`DrawSpan`]s in draw order: the draw `w` below [`NegSpace::total`] that
    /// [`NegSpace::draw`] takes falls in the first span whose running count of entities passes
    /// `w`, at the same row, or for a partition on disk at the row of its bank that the rest of
    /// the draw picks. For a device step, which draws as this does; `banks` as for `draw`.
    pub fn spans(&self, banks: Option<&Banks>) -> Vec<DrawSpan> {
        let mut out = Vec::new();
        let mut start = 0;
        for (span, &end) in self.spans.iter().zip(&self.cum) {
            let entities = end - start;
            match span {
                Span::Rows { part, lo } => out.push(DrawSpan::Rows {
                    part: *part,
                    first: *lo,
                    entities,
                }),
                // Partition r holds positions r * per_part.. of the type (the last may hold
                // fewer), from its row starts[r].
                Span::Spread(s) => {
                    for (r, &first) in s.starts.iter().enumerate() {
                        let done = r as u64 * s.per_part;
                        if done >= entities {
                            break;
                        }
                        let entities = s.per_part.min(entities - done);
                        out.push(match s.part_of[r] {
                            Some(part) => DrawSpan::Rows {
                                part,
                                first,
                                entities,
                            },
                            None => {
                                let (at, len) = banks.expect("banks").segment(r as u32, s.seg);
                                DrawSpan::Bank {
                                    partition: r as u32,
                                    at,
                                    len,
                                    entities,
                                }
                            }
                        });
                    }
                }
            }
            start = end;
        }
        out
    }

    /// A uniform negative; partitions on disk are drawn from through `banks`.
    #[inline]
    pub fn draw(&self, banks: Option<&Banks>, rng: &mut Rng) -> Negative {
        let (w, rest) = rng.below_and_rest(self.total().max(1));
        let k = self.cum.partition_point(|&c| c <= w);
        let i = w - if k == 0 { 0 } else { self.cum[k - 1] };
        match &self.spans[k] {
            Span::Rows { part, lo } => Negative::Part(*part, lo + i as u32),
            Span::Spread(s) => {
                let r = (i / s.per_part) as usize;
                match s.part_of[r] {
                    Some(part) => Negative::Part(part, s.starts[r] + (i % s.per_part) as u32),
                    None => {
                        let (at, len) = banks.expect("banks").segment(r as u32, s.seg);
                        // The rest of the draw picks the row: one draw per negative.
                        Negative::Bank(r as u32, at + scale(rest, len as u64) as u32)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::entity_types::EntityType;

    fn layout() -> TypedLayout {
        let ty = |name: &str, first, count, partitioned| EntityType {
            name: String::from(name),
            first,
            count,
            partitioned,
            features: None,
        };
        TypedLayout::new(
            &[
                ty("user", 0, 400, true),
                ty("item", 400, 100, true),
                ty("tag", 500, 6, false),
            ],
            4,
            3,
        )
    }

    /// Draws from `space` and maps each negative back to its node (bank rows to their
    /// partition).
    fn types_drawn(
        l: &TypedLayout,
        space: &NegSpace,
        regions: &[u32],
        banks: Option<&Banks>,
    ) -> Vec<usize> {
        let mut rng = Rng::new(9);
        (0..2000)
            .map(|_| match space.draw(banks, &mut rng) {
                Negative::Part(part, row) => l.type_of(l.node(regions[part], row)),
                Negative::Bank(..) => usize::MAX,
            })
            .collect()
    }

    #[test]
    fn negatives_come_from_the_right_type_in_every_pool() {
        let l = layout();
        // Resident: partitions 2 and 0 and the pinned region.
        let regions = [0u32, 2, 4];
        for pool in [NegativePool::Partition, NegativePool::Resident] {
            let inputs = SpaceInputs {
                layout: &l,
                pool,
                regions: &regions,
                banked: None,
            };
            for t in 0..3 {
                let target = if t == 2 { 2 } else { 1 };
                let space = NegSpace::new(&inputs, &[t], target);
                let drawn = types_drawn(&l, &space, &regions, None);
                assert!(drawn.iter().all(|&d| d == t), "{pool:?} type {t}");
            }
        }
        // All: partitions 1 and 3 are on disk, reached through banks.
        let mut banks = Banks::new(4, 20, 1, 2);
        let p = crate::storage::partitioning::Partitioning::typed(l.types.clone(), 4, 3).unwrap();
        banks.choose_blocks(&p, 0, 0);
        let part_of = Arc::new(vec![Some(0), None, Some(1), None]);
        let inputs = SpaceInputs {
            layout: &l,
            pool: NegativePool::All,
            regions: &regions,
            banked: Some(part_of),
        };
        let space = NegSpace::new(&inputs, &[1], 0);
        assert_eq!(space.total(), 100);
        let mut rng = Rng::new(1);
        let (mut resident, mut banked) = (0, 0);
        for _ in 0..4000 {
            match space.draw(Some(&banks), &mut rng) {
                Negative::Part(part, row) => {
                    assert_eq!(l.type_of(l.node(regions[part], row)), 1);
                    resident += 1;
                }
                Negative::Bank(r, row) => {
                    // The item segment of the bank: items' share of its 20 rows (100 users
                    // and 25 items per partition: 4 rows).
                    let (at, len) = banks.segment(r, 1);
                    assert!((at..at + len).contains(&row), "{r} {row}");
                    banked += 1;
                }
            }
        }
        // Half the items are in resident partitions.
        assert!(
            (1800..2200).contains(&resident) && resident + banked == 4000,
            "{resident}"
        );
        // Untyped negatives draw every type in proportion to its entities.
        let all = NegSpace::new(&inputs, &[0, 1, 2], 0);
        assert_eq!(all.total(), 506);
    }

    /// The negative of the draw whose value below the total is `w` and whose rest is `rest`,
    /// through `spans` (a device step's lookup).
    fn through_spans(spans: &[DrawSpan], mut w: u64, rest: u64) -> Negative {
        for span in spans {
            match *span {
                DrawSpan::Rows {
                    part,
                    first,
                    entities,
                } if w < entities => return Negative::Part(part, first + w as u32),
                DrawSpan::Bank {
                    partition,
                    at,
                    len,
                    entities,
                } if w < entities => {
                    return Negative::Bank(partition, at + scale(rest, len as u64) as u32)
                }
                DrawSpan::Rows { entities, .. } | DrawSpan::Bank { entities, .. } => w -= entities,
            }
        }
        panic!("draw past the spans");
    }

    #[test]
    fn spans_place_every_draw_where_draw_does() {
        let l = layout();
        // Every partition resident (in another order than their ids) and the pinned region;
        // then partitions 1 and 3 on disk, reached through banks.
        let regions = [2u32, 0, 3, 1, 4];
        let part_of = Arc::new(vec![Some(1), Some(3), Some(0), Some(2)]);
        let some_on_disk = Arc::new(vec![Some(1), None, Some(0), None]);
        let mut banks = Banks::new(4, 20, 1, 2);
        let p = crate::storage::partitioning::Partitioning::typed(l.types.clone(), 4, 3).unwrap();
        banks.choose_blocks(&p, 0, 0);
        for (pool, banked) in [
            (NegativePool::Partition, None),
            (NegativePool::Resident, None),
            (NegativePool::All, Some(part_of)),
            (NegativePool::All, Some(some_on_disk)),
        ] {
            let inputs = SpaceInputs {
                layout: &l,
                pool,
                regions: &regions,
                banked,
            };
            for types in [&[0usize][..], &[1], &[2], &[0, 1, 2]] {
                let target = if types == [2] { 4 } else { 1 };
                let space = NegSpace::new(&inputs, types, target);
                let spans = space.spans(Some(&banks));
                let entities = |s: &DrawSpan| match *s {
                    DrawSpan::Rows { entities, .. } | DrawSpan::Bank { entities, .. } => entities,
                };
                assert_eq!(spans.iter().map(entities).sum::<u64>(), space.total());
                // draw takes one value below the total and its rest from its stream, as the
                // device does.
                let (mut a, mut b) = (Rng::new(3), Rng::new(3));
                for _ in 0..3000 {
                    let (w, rest) = b.below_and_rest(space.total());
                    assert_eq!(
                        space.draw(Some(&banks), &mut a),
                        through_spans(&spans, w, rest),
                        "{pool:?} {types:?}"
                    );
                }
            }
        }
    }
}
