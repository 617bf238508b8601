//! Compressed edge blocks: how a compressed grid stores each block's edges, and the one
//! encoder and one decoder of those bytes.
//!
//! A block's edges are sorted by (source offset, destination offset) and each becomes a
//! 64-bit key `source << shift | destination`, `shift` being the bits of the grid's largest
//! destination offset (`chunk_size - 1`). Keys do not decrease, so the block is stored as the
//! gaps between consecutive keys (the first gap is the first key). Joining both offsets into
//! one key matters for the sparse blocks of a power-law graph (in RMAT scale 22, half an edge
//! per source and block): the destination's bits are then paid once per gap, not once per
//! edge plus a source gap, which is what coding one adjacency list per source (Ligra+'s
//! layout) would pay inside a block.
//!
//! Two codes of the gaps, both byte strings with no alignment:
//!
//! - **byte**: Ligra+'s run-length byte code (`byteRLE`): runs of gaps of one byte width,
//!   each run a header byte (width - 1 in the low 3 bits, run length - 1 in the high 5, so
//!   widths of 1 to 8 bytes for 64-bit gaps and runs of up to 32; Ligra+'s 32-bit lists use
//!   2 and 6 bits), then the gaps, little-endian, each in that many bytes.
//! - **packed**: frames of up to [`FRAME`] gaps bit-packed at the frame's width (frame of
//!   reference 0): a byte with the width w in bits (0 to 64), then the gaps, gap t at bits
//!   `t*w .. (t+1)*w` of the frame's little-endian bit string, padded to a whole byte.
//!   Decoding has no branch per gap.
//!
//! Decoding checks everything it reads: a code that ends early, runs past the block's edge
//! count, leaves bytes over, has a width above 64 bits, overflows the 64-bit key or yields a
//! source offset above 32 bits is a [`CodecError`]; it never panics or reads out of bounds.
//! (Whether the offsets fit their chunks is checked after decoding, as for plain blocks:
//! [`Grid::check_block`](crate::grid::Grid::check_block).)

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a grid stores the edges of its blocks (`grid.json`'s `compression`; absent: `none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// 8 bytes an edge: (source, destination) offsets as uint32 pairs in `edges.npy`
    #[default]
    None,
    /// gaps of sorted keys in Ligra+'s run-length byte code, in `edge_codes.npy`
    Byte,
    /// gaps of sorted keys bit-packed in frames of 32, in `edge_codes.npy`
    Packed,
}

impl Compression {
    /// `none`, `byte` or `packed`, as the config and `grid.json` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Byte => "byte",
            Compression::Packed => "packed",
        }
    }

    /// Whether blocks are stored as codes (and so sorted, and decoded when fetched).
    pub fn is_compressed(self) -> bool {
        self != Compression::None
    }
}

/// Gaps per frame of the packed code.
pub const FRAME: usize = 32;
/// Longest run of the byte code (5 bits of the header).
const MAX_RUN: usize = 32;

/// What is wrong with a block's code (the caller names the grid, file and block).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

fn bad<T>(msg: String) -> Result<T, CodecError> {
    Err(CodecError(msg))
}

/// How a grid joins a block's two offsets into one key: the destination takes the low
/// `shift` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    shift: u32,
}

impl Keys {
    /// The keys of a grid whose chunks hold `chunk_size` vertices (at most 2^32).
    pub fn new(chunk_size: u64) -> Keys {
        Keys {
            shift: 64 - chunk_size.saturating_sub(1).leading_zeros(),
        }
    }

    #[inline]
    fn key(self, e: [u32; 2]) -> u64 {
        ((e[0] as u64) << self.shift) | e[1] as u64
    }

    /// Mask of the destination bits.
    #[inline]
    fn mask(self) -> u64 {
        (1u64 << self.shift) - 1
    }
}

/// Sorts a block's edges by (source, destination), moving `weights` (one per edge) along
/// when the grid is weighted: the order a compressed block is stored and decoded in. A
/// weighted block is sorted as (key, weight) pairs in `pairs` (16 bytes an edge, reused from
/// block to block).
pub fn sort_block(
    edges: &mut [[u32; 2]],
    weights: Option<&mut [f32]>,
    pairs: &mut Vec<(u64, f32)>,
) {
    let order = |e: &[u32; 2]| ((e[0] as u64) << 32) | e[1] as u64;
    let Some(weights) = weights else {
        edges.sort_unstable_by_key(order);
        return;
    };
    pairs.clear();
    pairs.extend(
        edges
            .iter()
            .zip(weights.iter())
            .map(|(e, &w)| (order(e), w)),
    );
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    for ((e, w), &(k, x)) in edges.iter_mut().zip(weights.iter_mut()).zip(pairs.iter()) {
        *e = [(k >> 32) as u32, k as u32];
        *w = x;
    }
}

/// Appends the code of a block's `edges` (sorted by [`sort_block`]) to `out`. `codec` is
/// `Byte` or `Packed`. The gaps are computed as they are coded: encoding needs no memory
/// beyond `out`.
pub fn encode(codec: Compression, keys: Keys, edges: &[[u32; 2]], out: &mut Vec<u8>) {
    let gap = |i: usize| {
        let k = keys.key(edges[i]);
        let prev = if i == 0 { 0 } else { keys.key(edges[i - 1]) };
        debug_assert!(k >= prev, "blocks are encoded sorted");
        k - prev
    };
    match codec {
        Compression::Byte => encode_byte(edges.len(), gap, out),
        Compression::Packed => encode_packed(edges.len(), gap, out),
        Compression::None => unreachable!("plain blocks are not encoded"),
    }
}

/// Bytes of `g` in the byte code (at least 1).
fn byte_width(g: u64) -> usize {
    (64 - g.leading_zeros() as usize).div_ceil(8).max(1)
}

fn encode_byte(n: usize, gap: impl Fn(usize) -> u64, out: &mut Vec<u8>) {
    let mut i = 0;
    while i < n {
        let w = byte_width(gap(i));
        let mut run = 1;
        while i + run < n && run < MAX_RUN && byte_width(gap(i + run)) == w {
            run += 1;
        }
        out.push((((run - 1) << 3) | (w - 1)) as u8);
        for k in i..i + run {
            out.extend_from_slice(&gap(k).to_le_bytes()[..w]);
        }
        i += run;
    }
}

fn encode_packed(n: usize, gap: impl Fn(usize) -> u64, out: &mut Vec<u8>) {
    for start in (0..n).step_by(FRAME) {
        let frame = start..(start + FRAME).min(n);
        let w = 64 - frame.clone().fold(0, |a, k| a | gap(k)).leading_zeros();
        out.push(w as u8);
        let (mut acc, mut bits) = (0u128, 0u32);
        for k in frame {
            acc |= (gap(k) as u128) << bits;
            bits += w;
            while bits >= 8 {
                out.push(acc as u8);
                acc >>= 8;
                bits -= 8;
            }
        }
        if bits > 0 {
            out.push(acc as u8);
        }
    }
}

/// Decodes a block's `code` into `out`, which holds exactly the block's edge count.
pub fn decode(
    codec: Compression,
    keys: Keys,
    code: &[u8],
    out: &mut [[u32; 2]],
) -> Result<(), CodecError> {
    let mut key = Key {
        value: 0,
        overflow: false,
        shift: keys.shift,
        mask: keys.mask(),
    };
    let used = match codec {
        Compression::Byte => decode_byte(code, out, &mut key)?,
        Compression::Packed => decode_packed(code, out, &mut key)?,
        Compression::None => unreachable!("plain blocks are not decoded"),
    };
    if used != code.len() {
        return bad(format!(
            "the code holds {} bytes after the block's {} edges",
            code.len() - used,
            out.len()
        ));
    }
    if key.overflow {
        return bad("the gaps overflow the 64-bit key".into());
    }
    if key.value >> key.shift > u32::MAX as u64 {
        return bad(format!(
            "source offset {} does not fit 32 bits",
            key.value >> key.shift
        ));
    }
    Ok(())
}

/// The running key of a decode: gaps add to it, overflow is remembered (checked once at the
/// end, so the loops have no branch for it).
struct Key {
    value: u64,
    overflow: bool,
    shift: u32,
    mask: u64,
}

impl Key {
    #[inline(always)]
    fn add(&mut self, gap: u64) -> [u32; 2] {
        let (v, o) = self.value.overflowing_add(gap);
        self.value = v;
        self.overflow |= o;
        [(v >> self.shift) as u32, (v & self.mask) as u32]
    }
}

/// Decodes the byte code; returns the bytes it used.
fn decode_byte(code: &[u8], out: &mut [[u32; 2]], key: &mut Key) -> Result<usize, CodecError> {
    let (mut at, mut done) = (0usize, 0usize);
    while done < out.len() {
        let Some(&header) = code.get(at) else {
            return bad(format!(
                "the code ends at byte {at} after {done} of the block's {} edges",
                out.len()
            ));
        };
        let (w, run) = ((header & 7) as usize + 1, (header >> 3) as usize + 1);
        if done + run > out.len() {
            return bad(format!(
                "a run of {run} gaps at byte {at} passes the block's {} edges",
                out.len()
            ));
        }
        let Some(data) = code.get(at + 1..at + 1 + run * w) else {
            return bad(format!(
                "the code ends inside the run of {run} {w}-byte gaps at byte {at}"
            ));
        };
        let dst = &mut out[done..done + run];
        match w {
            1 => byte_run::<1>(data, dst, key),
            2 => byte_run::<2>(data, dst, key),
            3 => byte_run::<3>(data, dst, key),
            4 => byte_run::<4>(data, dst, key),
            5 => byte_run::<5>(data, dst, key),
            6 => byte_run::<6>(data, dst, key),
            7 => byte_run::<7>(data, dst, key),
            _ => byte_run::<8>(data, dst, key),
        }
        at += 1 + run * w;
        done += run;
    }
    Ok(at)
}

#[inline(always)]
fn byte_run<const W: usize>(data: &[u8], out: &mut [[u32; 2]], key: &mut Key) {
    for (c, o) in data.chunks_exact(W).zip(out.iter_mut()) {
        let mut b = [0u8; 8];
        b[..W].copy_from_slice(c);
        *o = key.add(u64::from_le_bytes(b));
    }
}

/// A frame's bytes, with room for the 16-byte reads of its last gap.
const FRAME_BUF: usize = FRAME * 8 + 16;

/// Decodes the packed code; returns the bytes it used.
fn decode_packed(code: &[u8], out: &mut [[u32; 2]], key: &mut Key) -> Result<usize, CodecError> {
    let mut buf = [0u8; FRAME_BUF];
    let mut at = 0usize;
    for (f, frame) in out.chunks_mut(FRAME).enumerate() {
        let Some(&w) = code.get(at) else {
            return bad(format!(
                "the code ends at byte {at} after {} of the block's {} edges",
                f * FRAME,
                out.len()
            ));
        };
        if w > 64 {
            return bad(format!("frame width {w} at byte {at} is above 64 bits"));
        }
        let (w, len) = (w as usize, (frame.len() * w as usize).div_ceil(8));
        let Some(bytes) = code.get(at + 1..at + 1 + len) else {
            return bad(format!(
                "the code ends inside the frame of {} {w}-bit gaps at byte {at}",
                frame.len()
            ));
        };
        buf[..len].copy_from_slice(bytes);
        at += 1 + len;
        match w {
            0 => frame.iter_mut().for_each(|o| *o = key.add(0)),
            1..=57 => unpack_narrow(&buf, w, frame, key),
            _ => unpack_wide(&buf, w, frame, key),
        }
    }
    Ok(at)
}

/// Gaps of up to 57 bits: each lies within the 8 bytes from its first byte.
#[inline(always)]
fn unpack_narrow(buf: &[u8; FRAME_BUF], w: usize, out: &mut [[u32; 2]], key: &mut Key) {
    let mask = (1u64 << w) - 1;
    for (t, o) in out.iter_mut().enumerate() {
        let bit = t * w;
        let word = u64::from_le_bytes(buf[bit >> 3..(bit >> 3) + 8].try_into().unwrap());
        *o = key.add((word >> (bit & 7)) & mask);
    }
}

/// Gaps of 58 to 64 bits: read 16 bytes.
fn unpack_wide(buf: &[u8; FRAME_BUF], w: usize, out: &mut [[u32; 2]], key: &mut Key) {
    let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    for (t, o) in out.iter_mut().enumerate() {
        let bit = t * w;
        let word = u128::from_le_bytes(buf[bit >> 3..(bit >> 3) + 16].try_into().unwrap());
        *o = key.add((word >> (bit & 7)) as u64 & mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CODECS: [Compression; 2] = [Compression::Byte, Compression::Packed];

    fn round_trip(codec: Compression, chunk: u64, mut edges: Vec<[u32; 2]>) -> Vec<u8> {
        sort_block(&mut edges, None, &mut Vec::new());
        let keys = Keys::new(chunk);
        let mut code = Vec::new();
        encode(codec, keys, &edges, &mut code);
        let mut back = vec![[0u32; 2]; edges.len()];
        decode(codec, keys, &code, &mut back).unwrap();
        assert_eq!(back, edges, "{codec:?} chunk {chunk}");
        code
    }

    proptest! {
        #[test]
        fn random_blocks_round_trip(
            chunk in 1u64..=(1 << 32),
            raw in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..700),
            src_chunk in 1u64..=(1 << 32),
        ) {
            let edges: Vec<[u32; 2]> = raw
                .iter()
                .map(|&(s, d)| [(s as u64 % src_chunk) as u32, (d as u64 % chunk) as u32])
                .collect();
            for codec in CODECS {
                round_trip(codec, chunk, edges.clone());
            }
        }

        #[test]
        fn dense_blocks_with_parallel_edges_round_trip(
            raw in proptest::collection::vec((0u32..40, 0u32..40), 0..2000),
        ) {
            let edges: Vec<[u32; 2]> = raw.iter().map(|&(s, d)| [s, d]).collect();
            for codec in CODECS {
                round_trip(codec, 40, edges.clone());
            }
        }

        #[test]
        fn corrupt_codes_are_errors_never_panics(
            raw in proptest::collection::vec((0u32..1000, 0u32..1000), 1..300),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            cut in any::<usize>(),
            count_delta in -3i64..3,
        ) {
            let edges: Vec<[u32; 2]> = raw.iter().map(|&(s, d)| [s, d]).collect();
            for codec in CODECS {
                let mut code = round_trip(codec, 1000, edges.clone());
                for &(at, x) in &flips {
                    let n = code.len();
                    code[at % n] ^= x;
                }
                code.truncate(code.len() - cut % 3);
                let n = (edges.len() as i64 + count_delta).max(0) as usize;
                let mut out = vec![[0u32; 2]; n];
                // Any outcome but a panic: a flip may still decode to other edges.
                let _ = decode(codec, Keys::new(1000), &code, &mut out);
            }
        }
    }

    #[test]
    fn extreme_offsets_round_trip() {
        let top = u32::MAX;
        for chunk in [1u64, 2, 3, 1 << 17, (1 << 17) + 1, 1 << 32] {
            let d = (chunk - 1) as u32;
            let edges = vec![
                [0, 0],
                [0, d],
                [top, 0],
                [top, d],
                [top, d],
                [1 << 31, d / 2],
            ];
            for codec in CODECS {
                round_trip(codec, chunk, edges.clone());
                round_trip(codec, chunk, vec![[top, d]]);
            }
        }
    }

    #[test]
    fn frame_and_run_boundaries_round_trip() {
        for n in [0, 1, 31, 32, 33, 127, 128, 129, 255, 256, 257] {
            // Widths change every few edges, so runs end on both limits.
            let edges: Vec<[u32; 2]> = (0..n as u32)
                .map(|k| [k * (1 + k % 7), (k * 7919) % 5000])
                .collect();
            for codec in CODECS {
                round_trip(codec, 5000, edges.clone());
            }
        }
    }

    #[test]
    fn an_empty_block_has_an_empty_code() {
        for codec in CODECS {
            assert!(round_trip(codec, 100, Vec::new()).is_empty());
            let err = decode(codec, Keys::new(100), &[0], &mut []).unwrap_err();
            assert!(err.0.contains("1 bytes after the block's 0 edges"), "{err}");
        }
    }

    #[test]
    fn sorting_moves_the_weights_along() {
        let mut edges = vec![[3, 1], [0, 9], [3, 0], [0, 2]];
        let mut weights = vec![0.31, 0.09, 0.30, 0.02];
        sort_block(&mut edges, Some(&mut weights), &mut Vec::new());
        assert_eq!(edges, vec![[0, 2], [0, 9], [3, 0], [3, 1]]);
        assert_eq!(weights, vec![0.02, 0.09, 0.30, 0.31]);
    }

    #[test]
    fn bad_codes_say_what_is_wrong() {
        let keys = Keys::new(1 << 10);
        let edges: Vec<[u32; 2]> = (0..10).map(|k| [k, k]).collect();
        let err = |codec, code: &[u8], n: usize| {
            decode(codec, keys, code, &mut vec![[0u32; 2]; n])
                .unwrap_err()
                .0
        };
        for codec in CODECS {
            let mut code = Vec::new();
            encode(codec, keys, &edges, &mut code);
            assert!(err(codec, &code[..code.len() - 1], 10).contains("the code ends inside"));
            assert!(err(codec, &code, 11).contains("the code ends"));
        }
        let mut code = Vec::new();
        encode(Compression::Packed, keys, &edges, &mut code);
        assert!(err(Compression::Packed, &code, 9).contains("1 bytes after the block's 9 edges"));
        let mut code = Vec::new();
        encode(Compression::Byte, keys, &edges, &mut code);
        assert!(err(Compression::Byte, &code, 9).contains("passes the block's 9 edges"));
        assert!(err(Compression::Packed, &[65], 1).contains("frame width 65"));
        // One 8-byte gap of 2^63 puts the source above 32 bits; two overflow the key.
        let gap = (1u64 << 63).to_le_bytes();
        let one = [&[0b0_0111u8][..], &gap].concat();
        assert!(err(Compression::Byte, &one, 1).contains("does not fit 32 bits"));
        let two = [&[0b0_1111u8][..], &gap, &gap].concat();
        assert!(err(Compression::Byte, &two, 2).contains("overflow"));
    }

    #[test]
    fn uniform_blocks_cost_near_their_entropy() {
        // 20,000 uniform edges in a 2^17 x 2^17 block: n keys drawn from U = 2^34 carry about
        // log2(e U / n) = 21.1 bits each (2.64 bytes).
        let n = 20_000;
        let mut rng = strata_store::rng::Rng::new(5);
        let edges: Vec<[u32; 2]> = (0..n)
            .map(|_| [rng.below(1 << 17) as u32, rng.below(1 << 17) as u32])
            .collect();
        let entropy = (std::f64::consts::E * (1u64 << 34) as f64 / n as f64).log2() / 8.0;
        let bytes = |codec| round_trip(codec, 1 << 17, edges.clone()).len() as f64 / n as f64;
        let (packed, byte) = (bytes(Compression::Packed), bytes(Compression::Byte));
        assert!(
            packed < 1.1 * entropy,
            "packed {packed} B, entropy {entropy} B"
        );
        assert!(byte < 1.3 * entropy, "byte {byte} B, entropy {entropy} B");
    }
}
