//! Graph500 Kronecker (R-MAT) edge lists.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use strata_io::SeqWriter;

use super::{
    check_fraction, config_check, push_decimal, run_ordered, worker_threads, GenerateSummary,
    Staging,
};
use crate::array::{NpyWriter, IO_CHUNK};
use crate::config::{ConfigError, Section};
use crate::disk_room;
use crate::error::{Result, StoreError};
use crate::manifest::id_dtype_for;
use crate::npy::{DType, DATA_OFFSET};
use crate::perm::Perm;
use crate::rng::{derive, Rng};
use strata_io::progress::{Meter, Progress};

/// Largest `scale` accepted: 2^40 vertices already exceeds any disk's worth of edges.
const MAX_SCALE: u32 = 40;
/// Edges per work chunk (1 MiB of bin32 output).
const CHUNK_EDGES: u64 = 1 << 17;
/// Key of the edge streams (mixed with the seed).
const STREAM_EDGES: u64 = 1;
/// Key of the vertex permutation.
const STREAM_PERM: u64 = 2;

/// File format of an R-MAT edge list.
#[derive(
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
)]
#[serde(rename_all = "lowercase")]
pub enum RmatFormat {
    /// Little-endian int32 `(src, dst)` pairs, 8 bytes per edge, no header (the GridGraph /
    /// SNAP-converted binary edge list).
    #[default]
    Bin32,
    /// `src\tdst\n` lines of decimal ids.
    Tsv,
    /// A NumPy `(m, 2)` array, int32 when `scale <= 31` and int64 otherwise.
    Npy,
}

impl RmatFormat {
    fn name(self) -> &'static str {
        match self {
            RmatFormat::Bin32 => "bin32",
            RmatFormat::Tsv => "tsv",
            RmatFormat::Npy => "npy",
        }
    }
}

/// Options of [`rmat`]: the `[generate.rmat]` config section (see docs/generators.md). The
/// output is written as `<out>.partial-<pid>` and renamed when complete.
#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RmatOptions {
    /// output file
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// log2 of the number of vertices (n = 2^scale); at most 31 for bin32
    #[schemars(extend("x-required" = true))]
    pub scale: u32,
    /// edges per vertex: m = edge_factor * 2^scale
    pub edge_factor: u64,
    /// probability of the top-left quadrant at each level (Graph500: 0.57)
    // The cumulative probabilities a, a + b, a + b + c are applied rounded to multiples of
    // 2^-15 (four levels per random word).
    pub a: f64,
    /// probability of the top-right quadrant (Graph500: 0.19)
    pub b: f64,
    /// probability of the bottom-left quadrant (Graph500: 0.19); d = 1 - a - b - c
    pub c: f64,
    /// random seed; equal options give byte-identical output
    pub seed: u64,
    /// bin32: little-endian int32 (src, dst) pairs (GridGraph); tsv: text lines; npy: (m, 2) array
    pub format: RmatFormat,
    /// worker threads; 0 = one per core (the output does not depend on it)
    pub threads: usize,
    /// replace an existing output file
    pub overwrite: bool,
}

impl Default for RmatOptions {
    /// Graph500's parameters; `out` and `scale` are required (empty and 0 are refused).
    fn default() -> Self {
        RmatOptions {
            out: PathBuf::new(),
            scale: 0,
            edge_factor: 16,
            a: 0.57,
            b: 0.19,
            c: 0.19,
            seed: 1,
            format: RmatFormat::Bin32,
            threads: 0,
            overwrite: false,
        }
    }
}

impl Section for RmatOptions {
    const NAME: &'static str = "generate.rmat";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        config_check(Self::NAME, &self.out, RmatOptions::validate(self))
    }
}

impl RmatOptions {
    /// Options for `2^scale` vertices written to `out`, every other field at its default.
    pub fn new(out: impl AsRef<Path>, scale: u32) -> Self {
        RmatOptions {
            out: out.as_ref().to_path_buf(),
            scale,
            ..RmatOptions::default()
        }
    }

    /// Checks ranges and consistency; errors name the offending option.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_SCALE).contains(&self.scale) {
            return Err(StoreError::option(
                "scale",
                format!("must be within [1, {MAX_SCALE}], got {}", self.scale),
            ));
        }
        if self.format == RmatFormat::Bin32 && self.scale > 31 {
            return Err(StoreError::option(
                "scale",
                format!("bin32 stores ids as int32, so scale must be at most 31 (got {}); use format npy or tsv", self.scale),
            ));
        }
        if self.edge_factor == 0 || self.edge_factor.checked_mul(1 << self.scale).is_none() {
            return Err(StoreError::option(
                "edge_factor",
                format!(
                    "must be at least 1 with edge_factor * 2^scale below 2^64, got {}",
                    self.edge_factor
                ),
            ));
        }
        for (field, p) in [("a", self.a), ("b", self.b), ("c", self.c)] {
            check_fraction(field, p)?;
        }
        let sum = self.a + self.b + self.c;
        if sum > 1.0 + 1e-9 {
            return Err(StoreError::option(
                "c",
                format!("a + b + c = {sum} exceeds 1; the fourth quadrant's probability d = 1 - a - b - c must not be negative"),
            ));
        }
        Ok(())
    }
}

/// Four 16-bit lanes, each holding a 15-bit uniform value below its guard bit.
const LANES_LOW: u64 = 0x7FFF_7FFF_7FFF_7FFF;
const LANES_GUARD: u64 = 0x8000_8000_8000_8000;
const LANES_ONE: u64 = 0x0001_0001_0001_0001;
/// Multiplying the lane bits (at 0, 16, 32, 48) by this puts lane i's bit at 45 + i without
/// carries, gathering four levels' bits into one nibble.
const GATHER: u64 = 1 | 1 << 15 | 1 << 30 | 1 << 45;

/// The edge generator: pure functions of the edge index.
struct Kronecker {
    scale: u32,
    /// Random words per edge, each deciding four levels.
    words: u64,
    edge_key: u64,
    /// Cumulative quadrant probabilities a, a + b, a + b + c as multiples of 2^-15, copied into
    /// each 16-bit lane, so one 64-bit draw decides four levels with a few SWAR operations.
    t1: u64,
    t2: u64,
    t3: u64,
    perm: Perm,
}

impl Kronecker {
    fn new(o: &RmatOptions) -> Kronecker {
        let lanes = |p: f64| (p * 32768.0).round().clamp(0.0, 32768.0) as u64 * LANES_ONE;
        Kronecker {
            scale: o.scale,
            words: o.scale.div_ceil(4) as u64,
            edge_key: derive(o.seed, STREAM_EDGES),
            t1: lanes(o.a),
            t2: lanes(o.a + o.b),
            t3: lanes(o.a + o.b + o.c),
            perm: Perm::new(1 << o.scale, derive(o.seed, STREAM_PERM)),
        }
    }

    /// Edge `e` before the vertex permutation: one quadrant choice per level, four levels per
    /// random word, from the edge's own block of the edge stream.
    #[inline]
    fn raw_edge(&self, e: u64) -> (u64, u64) {
        let mut rng = Rng::seek(self.edge_key, e * self.words);
        let (mut src, mut dst) = (0u64, 0u64);
        for _ in 0..self.words {
            let r = (rng.next_u64() & LANES_LOW) | LANES_GUARD;
            // A lane's guard bit survives the subtraction exactly when its value is >= the
            // threshold; thresholds are at most 2^15, so no lane borrows from the next.
            let ge1 = r.wrapping_sub(self.t1) & LANES_GUARD;
            let ge2 = r.wrapping_sub(self.t2) & LANES_GUARD;
            let ge3 = r.wrapping_sub(self.t3) & LANES_GUARD;
            // Quadrants a | b | c | d: the source bit is set in c and d, the target bit in b and d.
            let s = ge2;
            let d = (ge1 ^ ge2) | ge3;
            src = (src << 4) | (((s >> 15).wrapping_mul(GATHER) >> 45) & 0xF);
            dst = (dst << 4) | (((d >> 15).wrapping_mul(GATHER) >> 45) & 0xF);
        }
        // The last word may decide up to three levels too many.
        let extra = 4 * self.words as u32 - self.scale;
        (src >> extra, dst >> extra)
    }

    /// Edge `e` with both endpoints relabelled by the seeded vertex permutation.
    #[inline]
    fn edge(&self, e: u64) -> (u64, u64) {
        let (s, d) = self.raw_edge(e);
        (self.perm.apply(s), self.perm.apply(d))
    }

    /// Encodes edges `range` into `buf` in `format` (`id` is the npy id type).
    fn fill(&self, range: Range<u64>, format: RmatFormat, id: DType, buf: &mut Vec<u8>) {
        buf.clear();
        match (format, id) {
            (RmatFormat::Tsv, _) => {
                for e in range {
                    let (s, d) = self.edge(e);
                    push_decimal(buf, s, 0);
                    buf.push(b'\t');
                    push_decimal(buf, d, 0);
                    buf.push(b'\n');
                }
            }
            (RmatFormat::Npy, DType::I64) => {
                buf.resize(16 * (range.end - range.start) as usize, 0);
                for (e, out) in range.zip(buf.chunks_exact_mut(16)) {
                    let (s, d) = self.edge(e);
                    out[..8].copy_from_slice(&s.to_le_bytes());
                    out[8..].copy_from_slice(&d.to_le_bytes());
                }
            }
            _ => {
                buf.resize(8 * (range.end - range.start) as usize, 0);
                for (e, out) in range.zip(buf.chunks_exact_mut(8)) {
                    let (s, d) = self.edge(e);
                    out[..4].copy_from_slice(&(s as u32).to_le_bytes());
                    out[4..].copy_from_slice(&(d as u32).to_le_bytes());
                }
            }
        }
    }
}

/// Where the encoded chunks go.
enum EdgeFile {
    Raw(SeqWriter),
    Npy(NpyWriter),
}

impl EdgeFile {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            EdgeFile::Raw(w) => Ok(w.write_all(bytes)?),
            EdgeFile::Npy(w) => w.write_bytes(bytes),
        }
    }

    fn finish(self) -> Result<()> {
        match self {
            EdgeFile::Raw(w) => w.finish().map(drop).map_err(Into::into),
            EdgeFile::Npy(w) => w.finish().map(drop),
        }
    }
}

/// Writes a Graph500 Kronecker graph of `2^scale` vertices and `edge_factor * 2^scale` edges
/// (self-loops and duplicate edges included, as in Graph500) to `opts.out`.
pub fn rmat(opts: &RmatOptions, progress: &dyn Progress) -> Result<GenerateSummary> {
    opts.validate()?;
    let start = Instant::now();
    let n = 1u64 << opts.scale;
    let m = opts.edge_factor << opts.scale;
    let id = id_dtype_for(n);
    let staging = Staging::file(&opts.out, opts.overwrite)?;
    let (mut file, total_bytes) = match opts.format {
        RmatFormat::Npy => (
            EdgeFile::Npy(NpyWriter::create(staging.path(), id, &[2], IO_CHUNK)?),
            DATA_OFFSET + m * 2 * id.size() as u64,
        ),
        RmatFormat::Bin32 => (
            EdgeFile::Raw(SeqWriter::create(staging.path(), 0, IO_CHUNK)?),
            m * 8,
        ),
        // Decimal widths vary, so the size is unknown until the end.
        RmatFormat::Tsv => (
            EdgeFile::Raw(SeqWriter::create(staging.path(), 0, IO_CHUNK)?),
            0,
        ),
    };
    // A text line is at least "0\t0\n".
    let least = match opts.format {
        RmatFormat::Tsv => disk_room::bytes(m, 4),
        _ => total_bytes,
    };
    staging.ensure_room(least, || {
        format!("rmat of scale {} and {m} edges", opts.scale)
    })?;
    let generator = Kronecker::new(opts);
    let mut meter = Meter::new(progress, "rmat", total_bytes, m);
    run_ordered(
        worker_threads(opts.threads),
        m,
        CHUNK_EDGES,
        |range, buf: &mut Vec<u8>| generator.fill(range, opts.format, id, buf),
        |rows, buf| {
            file.write(buf)?;
            Ok(meter.add(rows, buf.len() as u64)?)
        },
    )?;
    meter.finish()?;
    file.finish()?;
    staging.commit()?;
    let details = serde_json::json!({
        "scale": opts.scale,
        "edge_factor": opts.edge_factor,
        "a": opts.a,
        "b": opts.b,
        "c": opts.c,
        "d": (1.0 - opts.a - opts.b - opts.c).max(0.0),
        "seed": opts.seed,
        "format": opts.format.name(),
        "id_dtype": match opts.format {
            RmatFormat::Npy => id.name(),
            RmatFormat::Bin32 => "int32",
            RmatFormat::Tsv => "decimal text",
        },
        "self_loops_and_duplicates": "kept",
    });
    GenerateSummary::new(
        "rmat",
        &opts.out,
        vec![opts.out.clone()],
        n,
        m,
        start,
        details,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_io::progress::NoProgress;

    fn opts(dir: &Path, name: &str, scale: u32) -> RmatOptions {
        let mut o = RmatOptions::new(dir.join(name), scale);
        o.edge_factor = 8;
        o
    }

    fn read_pairs(path: &Path) -> Vec<(u32, u32)> {
        std::fs::read(path)
            .unwrap()
            .chunks_exact(8)
            .map(|c| {
                (
                    u32::from_le_bytes(c[..4].try_into().unwrap()),
                    u32::from_le_bytes(c[4..].try_into().unwrap()),
                )
            })
            .collect()
    }

    #[test]
    fn bin32_size_range_and_determinism_across_threads() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path(), "one.bin", 13);
        o.threads = 1;
        let s1 = rmat(&o, &NoProgress).unwrap();
        let m = 8u64 << 13;
        assert_eq!(
            (s1.num_nodes, s1.num_edges, s1.bytes_written),
            (1 << 13, m, 8 * m)
        );
        assert_eq!(std::fs::metadata(&o.out).unwrap().len(), 8 * m);
        let one = std::fs::read(&o.out).unwrap();
        let mut o3 = opts(dir.path(), "three.bin", 13);
        o3.threads = 3;
        rmat(&o3, &NoProgress).unwrap();
        assert!(
            one == std::fs::read(&o3.out).unwrap(),
            "1 and 3 threads differ"
        );
        let pairs = read_pairs(&o.out);
        assert!(pairs.iter().all(|&(s, d)| s < 1 << 13 && d < 1 << 13));
        o3.seed = 2;
        o3.overwrite = true;
        rmat(&o3, &NoProgress).unwrap();
        assert!(
            one != std::fs::read(&o3.out).unwrap(),
            "the seed changes the graph"
        );
    }

    #[test]
    fn quadrant_frequencies_match_a_b_c_d() {
        let o = opts(Path::new("unused"), "x", 20);
        let k = Kronecker::new(&o);
        let mut counts = [0u64; 4];
        let edges = 20_000;
        for e in 0..edges {
            let (mut s, mut d) = k.raw_edge(e);
            for _ in 0..o.scale {
                counts[((s & 1) * 2 + (d & 1)) as usize] += 1;
                s >>= 1;
                d >>= 1;
            }
        }
        let total = (edges * o.scale as u64) as f64;
        let want = [o.a, o.b, o.c, 1.0 - o.a - o.b - o.c];
        for (q, (&c, &p)) in counts.iter().zip(&want).enumerate() {
            let got = c as f64 / total;
            assert!(
                (got - p).abs() < 0.004,
                "quadrant {q}: frequency {got}, probability {p}"
            );
        }
    }

    #[test]
    fn permutation_hides_degree_in_ids() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path(), "g.bin", 12);
        rmat(&o, &NoProgress).unwrap();
        let mut degree = vec![0u32; 1 << 12];
        for (s, d) in read_pairs(&o.out) {
            degree[s as usize] += 1;
            degree[d as usize] += 1;
        }
        let max = *degree.iter().max().unwrap();
        let mean = 2.0 * 8.0;
        assert!(
            max as f64 > 10.0 * mean,
            "R-MAT degrees are skewed: max {max}"
        );
        // Unpermuted, vertex 0 (all-a path) is the hub; permuted, the hub lands anywhere and the
        // low ids carry no more degree than the high ones.
        let low: u64 = degree[..1 << 11].iter().map(|&d| d as u64).sum();
        let high: u64 = degree[1 << 11..].iter().map(|&d| d as u64).sum();
        let ratio = low as f64 / high as f64;
        assert!(
            (0.6..1.6).contains(&ratio),
            "low/high id degree ratio {ratio}"
        );
    }

    #[test]
    fn tsv_and_npy_hold_the_same_edges() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path(), "g.bin", 10);
        rmat(&o, &NoProgress).unwrap();
        let pairs = read_pairs(&o.out);
        let mut t = opts(dir.path(), "g.tsv", 10);
        t.format = RmatFormat::Tsv;
        let summary = rmat(&t, &NoProgress).unwrap();
        let text = std::fs::read_to_string(&t.out).unwrap();
        assert_eq!(summary.bytes_written, text.len() as u64);
        let parsed: Vec<(u32, u32)> = text
            .lines()
            .map(|l| {
                let (s, d) = l.split_once('\t').unwrap();
                (s.parse().unwrap(), d.parse().unwrap())
            })
            .collect();
        assert_eq!(parsed, pairs);
        let mut p = opts(dir.path(), "g.npy", 10);
        p.format = RmatFormat::Npy;
        rmat(&p, &NoProgress).unwrap();
        let (header, bytes) = crate::array::read_all_bytes(&p.out).unwrap();
        assert_eq!(
            (header.dtype, header.shape.clone(), header.data_offset),
            (DType::I32, vec![pairs.len() as u64, 2], 4096)
        );
        assert_eq!(bytes, std::fs::read(&o.out).unwrap());
    }

    #[test]
    fn refuses_to_overwrite_and_leaves_no_partial() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path(), "g.bin", 8);
        rmat(&o, &NoProgress).unwrap();
        assert!(matches!(
            rmat(&o, &NoProgress),
            Err(StoreError::Exists { .. })
        ));
        struct Cancel;
        impl Progress for Cancel {
            fn stage(&self, _: &str, _: u64, _: u64) {}
            fn update(&self, _: u64, _: u64) -> bool {
                false
            }
            fn message(&self, _: &str) {}
        }
        let c = opts(dir.path(), "cancelled.bin", 8);
        assert!(matches!(rmat(&c, &Cancel), Err(StoreError::Cancelled)));
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["g.bin"]);
    }

    #[test]
    fn validation_names_the_field() {
        let field_of = |f: &dyn Fn(&mut RmatOptions)| {
            let mut o = RmatOptions::new("g.bin", 10);
            f(&mut o);
            match o.validate() {
                Err(StoreError::Option { field, .. }) => field,
                other => panic!("expected an option error, got {other:?}"),
            }
        };
        assert_eq!(field_of(&|o| o.scale = 32), "scale");
        assert_eq!(field_of(&|o| o.scale = 0), "scale");
        assert_eq!(field_of(&|o| o.edge_factor = 0), "edge_factor");
        assert_eq!(field_of(&|o| o.a = -0.1), "a");
        assert_eq!(field_of(&|o| o.b = 1.5), "b");
        assert_eq!(field_of(&|o| o.c = 0.3), "c");
        let mut wide = RmatOptions::new("g.npy", 32);
        wide.format = RmatFormat::Npy;
        wide.validate().unwrap();
        let parsed: RmatOptions =
            serde_json::from_str(r#"{"out": "g.tsv", "scale": 5, "format": "tsv"}"#).unwrap();
        assert_eq!(
            (parsed.format, parsed.edge_factor, parsed.a, parsed.seed),
            (RmatFormat::Tsv, 16, 0.57, 1)
        );
        assert!(serde_json::from_str::<RmatOptions>(
            r#"{"out": "g", "scale": 5, "edgefactor": 3}"#
        )
        .is_err());
    }
}
