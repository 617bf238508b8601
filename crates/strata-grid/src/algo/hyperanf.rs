//! HyperANF (Boldi, Rosa and Vigna): the neighbourhood function N(t), the number of pairs
//! (x, v) with a path of at most t edges from x to v, from a HyperLogLog counter per vertex.
//! Counter v starts holding v; pass t unions into each vertex the counters its in-neighbours
//! held after pass t - 1 (only those that changed are read again), so after pass t it counts
//! the vertices within t edges of reaching v. N(t) is the sum of the counters' estimates; the
//! passes end when no counter changes.
//!
//! A counter is `2^log2_registers` one-byte registers (8 to a word); unions are bytewise
//! maxima. Each estimate has a relative standard error of about 1.04 / sqrt(registers).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::frontier::{Frontier, Step};
use super::{
    chunk_bases, frontier_loop, vertex_hash, Algorithm, Ctx, IterationValue, Output, Values,
};
use crate::error::{GridError, Result};
use crate::stream::Streamer;
use crate::vertex::{Bitmap, F64Array, U64Array};

/// HyperANF's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HyperAnf {
    /// log2 of the HyperLogLog registers per vertex, 4 to 12 (error about 1.04/sqrt(2^k))
    #[schemars(range(min = 4, max = 12))]
    pub log2_registers: u32,
    /// the seed of the random choices (the same seed gives the same result)
    pub seed: u64,
}

impl Default for HyperAnf {
    fn default() -> Self {
        HyperAnf {
            log2_registers: 6,
            seed: 0,
        }
    }
}

/// The high bit of every byte of a word.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The bytewise maximum of two words of registers (each register below 128).
#[inline]
fn byte_max(a: u64, b: u64) -> u64 {
    // A byte of (a | HIGH) - b keeps its high bit where a's byte >= b's, and borrows from no
    // other byte since a's byte with the high bit set exceeds b's.
    let ge = ((a | HIGH) - b) & HIGH;
    let mask = (ge >> 7) * 0xFF;
    (a & mask) | (b & !mask)
}

/// One counter per vertex: `words` words of registers each, vertex v's at `v * words`.
struct Counters {
    cells: U64Array,
    words: usize,
    log2: u32,
}

impl Counters {
    fn new(s: &Streamer, n: usize, log2: u32) -> Result<Counters> {
        let words = (1usize << log2) / 8;
        Ok(Counters {
            cells: U64Array::filled(s.vertex(), n * words, 0)?,
            words,
            log2,
        })
    }

    /// Puts vertex `v`'s own element (its hash under `seed`) in its counter.
    fn add_self(&self, v: usize, seed: u64) {
        let h = vertex_hash(seed, v as u64);
        let register = (h & ((1 << self.log2) - 1)) as usize;
        // The position of the lowest set bit of the rest, from 1; all zeros count as the last.
        let rank = ((h >> self.log2).trailing_zeros() + 1).min(64 - self.log2 + 1) as u64;
        let at = v * self.words + register / 8;
        let word = self.cells.get(at);
        self.cells
            .set(at, byte_max(word, rank << (8 * (register % 8))));
    }

    /// Vertex `v`'s counter set to `from`'s.
    fn copy(&self, v: usize, from: &Counters) {
        for k in v * self.words..(v + 1) * self.words {
            self.cells.set(k, from.cells.get(k));
        }
    }

    /// The HyperLogLog estimate of vertex `v`'s counter (Flajolet et al., with linear
    /// counting for small values).
    fn estimate(&self, v: usize) -> f64 {
        let m = (1u64 << self.log2) as f64;
        let (mut sum, mut zeros) = (0.0f64, 0u32);
        for k in v * self.words..(v + 1) * self.words {
            for r in self.cells.get(k).to_le_bytes() {
                sum += f64::from_bits((1023 - r as u64) << 52);
                zeros += (r == 0) as u32;
            }
        }
        let alpha = match self.log2 {
            4 => 0.673,
            5 => 0.697,
            6 => 0.709,
            _ => 0.7213 / (1.0 + 1.079 / m),
        };
        let raw = alpha * m * m / sum;
        if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        }
    }
}

/// `v`'s counters take the register-wise maximum with `u`'s (self-loops add nothing).
struct Union<'a> {
    /// The counters as of the previous pass.
    seen: &'a Counters,
    /// The counters this pass builds.
    seen_next: &'a Counters,
}

impl Step for Union<'_> {
    #[inline]
    fn carry(&self, u: usize, v: usize, _: f32, owns_dst: bool) -> bool {
        if u == v {
            return false;
        }
        let w = self.seen.words;
        let (from, into) = (&self.seen.cells, &self.seen_next.cells);
        let mut grew = false;
        for k in 0..w {
            let (a, at) = (from.get(u * w + k), v * w + k);
            let b = into.get(at);
            if byte_max(a, b) == b {
                continue;
            }
            grew = true;
            if owns_dst {
                into.set(at, byte_max(a, b));
            } else {
                into.update_shared(at, |b| byte_max(a, b));
            }
        }
        grew
    }

    /// Counted once a pass.
    #[inline]
    fn activate(&self, next: &Bitmap, v: usize) -> bool {
        next.set_new(v)
    }
}

impl Algorithm for HyperAnf {
    const NAME: &'static str = "hyperanf";
    const ABOUT: &'static str = "neighbourhood function by HyperLogLog counters (HyperANF)";
    const ARRAYS: &'static [&'static str] = &["reach"];
    const VALUE: IterationValue = IterationValue::Count("changed");

    /// Two counters of 2^log2_registers bytes, the estimate (f64) and two bitmaps.
    fn vertex_bytes(&self) -> u64 {
        2 * (1 << self.log2_registers) + 9
    }

    /// Its neighbourhood function is not exchanged nor checkpointed.
    fn distributed(&self) -> bool {
        false
    }

    fn validate(&self) -> Result<()> {
        if !(4..=12).contains(&self.log2_registers) {
            return Err(GridError::config(
                "log2_registers",
                format!("must be in 4..=12, got {}", self.log2_registers),
            ));
        }
        Ok(())
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let seen = Counters::new(s, n, self.log2_registers)?;
        let seen_next = Counters::new(s, n, self.log2_registers)?;
        let reach = F64Array::filled(s.vertex(), n, 0.0)?;
        for v in 0..n {
            seen.add_self(v, self.seed);
            seen_next.copy(v, &seen);
        }
        let (frontier, next) = (Bitmap::full(n), Bitmap::new(n));
        let kernel = Frontier {
            frontier: &frontier,
            next: &next,
            base: &base,
            step: Union {
                seen: &seen,
                seen_next: &seen_next,
            },
        };
        // N(t), kept as the sum of the estimates: before each pass the counters the last one
        // changed (the frontier) take their new value.
        let mut total = 0.0f64;
        let mut function: Vec<f64> = Vec::new();
        let iterations = frontier_loop(s, ctx, &frontier, &next, &kernel, &[], &[], |_| {
            for v in (0..n).filter(|&v| frontier.get(v)) {
                seen.copy(v, &seen_next);
                let e = seen.estimate(v);
                total += e - reach.get(v);
                reach.set(v, e);
            }
            function.push(total);
        })?;
        let mut summary = serde_json::Map::new();
        summary.insert("neighbourhood_function".into(), function.into());
        Ok(Output {
            arrays: vec![("reach".into(), Values::F64(reach))],
            summary,
            iterations,
        })
    }
}
