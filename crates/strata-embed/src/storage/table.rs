//! The node embedding table on disk: partition-major, each partition's embeddings followed by
//! its Adagrad state, all in the table's dtype (float32 or bfloat16, little-endian), padded to
//! 4096 bytes, read and written whole through the I/O engine.
//!
//! A run keeps three table files. `current` is the consistent state after the last completed
//! epoch; `best` the one with the best validation metric; an epoch reads partitions from
//! `current` (or from `next` once written back this epoch) and writes every partition back to
//! `next`, which becomes `current` only when the epoch's checkpoint is committed. A crash at
//! any moment therefore leaves `current` and `best` intact.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_io::{AlignedBuf, Engine, IoBuf, IoFile, OpenMode, Request};
use strata_store::rng::{derive, Rng};

use crate::compute::bf16;
use crate::config::{RealDraw, TableDtype};
use crate::error::Result;
use crate::storage::layout::TableLayout;
use crate::storage::shared::SharedRows;

/// Rows of values in a table's dtype, read-only (a resident partition's embeddings), widened
/// to float32 where they are used.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

impl<'a> Rows<'a> {
    /// The first `values` values of `bytes` (a partition region) as stored in `dtype`.
    pub fn of(bytes: &'a [u8], dtype: TableDtype, values: usize) -> Rows<'a> {
        match dtype {
            TableDtype::F32 => Rows::F32(&bytemuck::cast_slice(bytes)[..values]),
            TableDtype::Bf16 => Rows::Bf16(&bytemuck::cast_slice(bytes)[..values]),
        }
    }

    /// Copies the values from `at` on into `out` (`out.len()` of them), widened.
    pub fn copy(&self, at: usize, out: &mut [f32]) {
        match self {
            Rows::F32(v) => out.copy_from_slice(&v[at..at + out.len()]),
            Rows::Bf16(v) => bf16::widen(&v[at..at + out.len()], out),
        }
    }

    /// The `len` values from `at` on as float32: borrowed when stored so, else widened into
    /// `scratch`.
    pub fn span<'s>(&'s self, at: usize, len: usize, scratch: &'s mut Vec<f32>) -> &'s [f32] {
        match self {
            Rows::F32(v) => &v[at..at + len],
            Rows::Bf16(_) => {
                scratch.resize(len, 0.0);
                self.copy(at, scratch);
                scratch
            }
        }
    }
}

/// One table file.
pub struct TableFile {
    pub path: PathBuf,
    file: IoFile,
}

/// Size of each partition read or write request (several are in flight at once).
const IO_CHUNK: usize = 64 << 20;

impl TableFile {
    /// Opens (creating when `create`) the table file at `path`.
    pub fn open(engine: &Arc<Engine>, path: &Path, create: bool) -> Result<TableFile> {
        let mode = if create {
            OpenMode::Create
        } else {
            OpenMode::ReadWrite
        };
        Ok(TableFile {
            path: path.to_path_buf(),
            file: engine.open(path, mode)?,
        })
    }

    /// Reads partition `p` into `buf` (its whole region).
    pub fn read_partition(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        buf: &mut AlignedBuf,
    ) -> Result<()> {
        self.transfer(engine, layout, p, buf, false)
    }

    /// Writes partition `p` from `buf`.
    pub fn write_partition(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        buf: &mut AlignedBuf,
    ) -> Result<()> {
        self.transfer(engine, layout, p, buf, true)
    }

    fn transfer(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        buf: &mut AlignedBuf,
        write: bool,
    ) -> Result<()> {
        let bytes = layout.region_bytes(p) as usize;
        assert!(buf.capacity() >= bytes, "partition buffer too small");
        let base = p as u64 * layout.part_bytes();
        let region = buf.full_mut().as_mut_ptr();
        let mut q = engine.queue();
        let mut offset = 0usize;
        while offset < bytes {
            let len = IO_CHUNK.min(bytes - offset);
            // SAFETY: the pieces are disjoint parts of `buf`, which this function borrows
            // mutably until every completion below has been received.
            let piece = unsafe { IoBuf::borrowed(region.add(offset), len) };
            let at = base + offset as u64;
            q.submit([if write {
                Request::write(&self.file, at, len, piece, 0)
            } else {
                Request::read(&self.file, at, len, piece, 0)
            }]);
            offset += len;
        }
        Ok(q.drain()?)
    }

    /// Reads `out.len() / dim` embedding rows of partition `p` starting at local row `first`,
    /// widened to float32 (an unaligned read: the engine reads the covering blocks).
    pub fn read_rows(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        first: u64,
        out: &mut [f32],
    ) -> Result<()> {
        let at =
            p as u64 * layout.part_bytes() + first * (layout.dim * layout.dtype.bytes()) as u64;
        self.read_values(engine, layout.dtype, at, out)
    }

    /// Reads `out.len() / state_per_row` rows of partition `p`'s optimizer state starting at
    /// local row `first` (an unaligned read, as [`TableFile::read_rows`]).
    pub fn read_state_rows(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        first: u64,
        out: &mut [f32],
    ) -> Result<()> {
        let at = p as u64 * layout.part_bytes()
            + layout.region(p).emb_bytes() as u64
            + first * (layout.state_per_row * layout.dtype.bytes()) as u64;
        self.read_values(engine, layout.dtype, at, out)
    }

    /// Reads `out.len()` little-endian values of `dtype` at byte `at` of the file, widened.
    fn read_values(
        &self,
        engine: &Arc<Engine>,
        dtype: TableDtype,
        at: u64,
        out: &mut [f32],
    ) -> Result<()> {
        let len = out.len() * dtype.bytes();
        if len == 0 {
            return Ok(());
        }
        let mut q = engine.queue();
        q.submit([Request::read(&self.file, at, len, AlignedBuf::new(len), 0)]);
        let c = q.wait().expect("one request in flight");
        c.result?;
        let bytes = c.buf.as_slice();
        match dtype {
            TableDtype::F32 => {
                for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                }
            }
            TableDtype::Bf16 => {
                for (v, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = bf16::to_f32(u16::from_le_bytes(b.try_into().expect("2 bytes")));
                }
            }
        }
        Ok(())
    }

    /// Flushes the file to the device.
    pub fn sync(&self) -> Result<()> {
        Ok(self.file.file().sync()?)
    }
}

/// Rows one stream of reals fills when a partition is initialised: a larger partition is
/// filled by `threads` threads in blocks of this many rows, each block from a stream of its own.
const INIT_BLOCK_ROWS: usize = 1 << 16;

/// Fills partition `p`'s embeddings with reals drawn from `draw` (a pure function of the seed
/// and `p`; rounded to the nearest bf16 in a bf16 table) and its Adagrad state with zeros.
/// The first [`INIT_BLOCK_ROWS`] rows come from the partition's stream, each later block of
/// rows from a stream derived from it and the block's index, so that `threads` threads (0: one
/// per core; the run's `threads`) fill a large partition together (a table of 16.8M rows of 100
/// reals took 44 s on one thread) and the reals do not depend on how many there are.
pub fn init_partition(
    layout: &TableLayout,
    p: u32,
    used_rows: u64,
    (draw, seed): (RealDraw, u64),
    threads: usize,
    buf: &mut AlignedBuf,
) {
    let region_layout = layout.region(p);
    let region = &mut buf.full_mut()[..region_layout.part_bytes() as usize];
    region.fill(0);
    let rows = SharedRows::region(region, &region_layout);
    let stream = derive(derive(seed, 0xe3b0), p as u64);
    let used = used_rows as usize;
    let fill_block = |b: usize| {
        let rng = Rng::new(if b == 0 {
            stream
        } else {
            derive(stream, b as u64)
        });
        let mut reals = Reals::new(draw, rng);
        let mut row = vec![0.0f32; layout.dim];
        for r in b * INIT_BLOCK_ROWS..((b + 1) * INIT_BLOCK_ROWS).min(used) {
            row.iter_mut().for_each(|v| *v = reals.next());
            rows.store(r, &row);
        }
    };
    let blocks = used.div_ceil(INIT_BLOCK_ROWS);
    let threads = strata_io::resolve_threads(threads).min(blocks);
    if threads <= 1 {
        (0..blocks).for_each(fill_block);
        return;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if b >= blocks {
                    break;
                }
                fill_block(b);
            });
        }
    });
}

/// Reals drawn one after another from a [`RealDraw`]: normals in pairs, in order.
pub struct Reals {
    draw: RealDraw,
    rng: Rng,
    spare: Option<f64>,
}

impl Reals {
    pub fn new(draw: RealDraw, rng: Rng) -> Reals {
        Reals {
            draw,
            rng,
            spare: None,
        }
    }

    /// The next real.
    pub fn next(&mut self) -> f32 {
        match self.draw {
            RealDraw::Normal(std) => {
                let x = self.spare.take().unwrap_or_else(|| {
                    let (a, b) = self.rng.normal_pair();
                    self.spare = Some(b);
                    a
                });
                x as f32 * std
            }
            RealDraw::Uniform { low, high } => uniform(&mut self.rng, low, high),
        }
    }
}

/// One real uniform in `[low, high]` (`high` itself only by rounding to f32).
fn uniform(rng: &mut Rng, low: f32, high: f32) -> f32 {
    (low as f64 + (high as f64 - low as f64) * rng.next_f64()) as f32
}

#[cfg(test)]
mod tests {
    use strata_io::align_up;

    use super::*;
    use crate::config::OptimizerKind;
    use crate::storage::partitioning::Partitioning;

    #[test]
    fn a_bf16_table_is_the_float32_one_rounded_in_half_the_bytes() {
        let p = Partitioning::new(1000, 2, 3).unwrap();
        let f32_layout = TableLayout::new(&p, 10, OptimizerKind::Adagrad, TableDtype::F32);
        let bf16_layout = TableLayout {
            dtype: TableDtype::Bf16,
            ..f32_layout
        };
        assert_eq!(f32_layout.part_bytes(), align_up(500 * 20 * 4));
        assert_eq!(bf16_layout.part_bytes(), align_up(500 * 20 * 2));
        let mut a = AlignedBuf::new(f32_layout.part_bytes() as usize);
        let mut b = AlignedBuf::new(bf16_layout.part_bytes() as usize);
        init_partition(&f32_layout, 1, 499, (RealDraw::Normal(0.1), 7), 0, &mut a);
        init_partition(&bf16_layout, 1, 499, (RealDraw::Normal(0.1), 7), 0, &mut b);
        let wide = Rows::of(
            a.prefix(a.capacity()),
            TableDtype::F32,
            f32_layout.emb_floats(),
        );
        let half = Rows::of(
            b.prefix(b.capacity()),
            TableDtype::Bf16,
            bf16_layout.emb_floats(),
        );
        let (mut x, mut y) = (vec![0.0f32; 5000], vec![0.0f32; 5000]);
        wide.copy(0, &mut x);
        half.copy(0, &mut y);
        assert!(x[..4990].iter().all(|&v| v != 0.0) && x[4990..].iter().all(|&v| v == 0.0));
        for (u, v) in x.iter().zip(&y) {
            assert_eq!(bf16::to_f32(bf16::round(*u)), *v);
        }
        // A span is borrowed from a float32 table and widened from a bf16 one.
        let mut scratch = Vec::new();
        assert_eq!(wide.span(10, 20, &mut scratch), &x[10..30]);
        assert!(scratch.is_empty());
        assert_eq!(half.span(10, 20, &mut scratch), &y[10..30]);
    }

    #[test]
    fn uniform_init_draws_every_real_between_its_bounds() {
        // LibKGE's uniform_ with a = -0.8328 and torch's default b = 1.0: not symmetric, so
        // the mean of the drawn reals is (a + b) / 2 = 0.0836, not 0.
        let p = Partitioning::new(2000, 1, 3).unwrap();
        let layout = TableLayout::new(&p, 16, OptimizerKind::Adagrad, TableDtype::F32);
        let mut a = AlignedBuf::new(layout.part_bytes() as usize);
        let init = RealDraw::Uniform {
            low: -0.8328,
            high: 1.0,
        };
        init_partition(&layout, 0, 2000, (init, 7), 0, &mut a);
        let rows = Rows::of(a.prefix(a.capacity()), TableDtype::F32, layout.emb_floats());
        let mut x = vec![0.0f32; 2000 * 16];
        rows.copy(0, &mut x);
        assert!(x.iter().all(|&v| (-0.8328..=1.0).contains(&v)));
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        // 32,000 reals of standard deviation 0.53: 4 standard errors are 0.012.
        assert!((mean - 0.0836).abs() < 0.012, "{mean}");
        let below = x.iter().filter(|&&v| v < 0.0).count() as f64 / x.len() as f64;
        assert!((below - 0.8328 / 1.8328).abs() < 0.012, "{below}");
        // A pure function of the seed and partition, and the Adagrad state starts at 0.
        let mut b = AlignedBuf::new(layout.part_bytes() as usize);
        init_partition(&layout, 0, 2000, (init, 7), 0, &mut b);
        assert_eq!(a.prefix(a.capacity()), b.prefix(b.capacity()));
        let emb = layout.emb_bytes();
        let state = &a.prefix(a.capacity())[emb..2 * emb];
        assert!(state.iter().all(|&byte| byte == 0));
    }

    #[test]
    fn a_large_partition_is_filled_in_blocks_each_from_its_own_stream() {
        // Three blocks and a part (dim 3: a normal pair straddles rows within a block).
        let used = 3 * INIT_BLOCK_ROWS + 10;
        let p = Partitioning::new(used as u64, 1, 3).unwrap();
        let layout = TableLayout::new(&p, 3, OptimizerKind::AdagradRow, TableDtype::F32);
        let mut buf = AlignedBuf::new(layout.part_bytes() as usize);
        let draw = (RealDraw::Normal(0.1), 7);
        init_partition(&layout, 0, used as u64, draw, 3, &mut buf);
        // One thread fills the same reals as three.
        let mut one = AlignedBuf::new(layout.part_bytes() as usize);
        init_partition(&layout, 0, used as u64, draw, 1, &mut one);
        assert_eq!(buf.prefix(buf.capacity()), one.prefix(one.capacity()));
        let rows = Rows::of(
            buf.prefix(buf.capacity()),
            TableDtype::F32,
            layout.emb_floats(),
        );
        let mut x = vec![0.0f32; used * 3];
        rows.copy(0, &mut x);
        let stream = derive(derive(7, 0xe3b0), 0);
        for b in 0..4 {
            let rng = Rng::new(if b == 0 {
                stream
            } else {
                derive(stream, b as u64)
            });
            let mut reals = Reals::new(RealDraw::Normal(0.1), rng);
            let first = b * INIT_BLOCK_ROWS * 3;
            let last = ((b + 1) * INIT_BLOCK_ROWS * 3).min(x.len());
            assert!(
                x[first..last].iter().all(|&v| v == reals.next()),
                "block {b}"
            );
        }
    }
}
