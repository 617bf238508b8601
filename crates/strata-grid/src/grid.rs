//! An open grid: its manifest, block index and segments (the units of placement and transfer).

use std::ops::Range;
use std::path::{Path, PathBuf};

use strata_store::array::read_all_bytes;
use strata_store::ids::IndptrCheck;
use strata_store::npy::{read_header, DType};
use strata_store::strtab::NameTable;
use strata_store::Store;

use crate::block_codec::{self, Compression, Keys};
use crate::build::grids_dir;
use crate::error::{GridError, Result};
use crate::layout::{
    GridManifest, Layout, WeightSpec, CODE_INDEX, EDGE_BYTES, EDGE_CODES, GRID_MANIFEST,
};

/// Whether `path` is a grid directory (it holds `grid.json`) rather than a store.
pub fn is_grid_dir(path: &Path) -> bool {
    path.join(GRID_MANIFEST).is_file()
}

/// A run of consecutive blocks of one major chunk (a column in column order), contiguous in
/// the edge file: what is placed in a tier and fetched as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The chunk all its blocks share (destination chunk in column order).
    pub major: u32,
    /// File positions of its blocks.
    pub blocks: Range<usize>,
    /// Its edges (rows of `edges.npy`, or edges of the decoded blocks).
    pub edges: Range<u64>,
    /// Where its edges are stored: bytes of `edges.npy`'s data (8 an edge), or of
    /// `edge_codes.npy`'s in a compressed grid.
    pub bytes: Range<u64>,
}

impl Segment {
    /// Bytes of its edge records (decoded, in a compressed grid).
    pub fn edge_bytes(&self) -> u64 {
        (self.edges.end - self.edges.start) * EDGE_BYTES
    }

    /// Bytes its edges are stored in (what the disk and far memory move).
    pub fn stored_bytes(&self) -> u64 {
        self.bytes.end - self.bytes.start
    }
}

/// An open, validated grid.
#[derive(Debug)]
pub struct Grid {
    dir: PathBuf,
    manifest: GridManifest,
    layout: Layout,
    /// First edge of each block in file order, and the edge count at the end (P² + 1).
    index: Vec<u64>,
    /// Compressed grids: first byte of each block's code, and the code bytes at the end.
    codes: Option<Vec<u64>>,
}

impl Grid {
    /// Opens the grid in `dir`, checking every array against the manifest.
    pub fn open(dir: &Path) -> Result<Grid> {
        let manifest = GridManifest::load(dir)?;
        let layout = manifest.layout()?;
        let (n, e, p2) = (
            manifest.num_vertices,
            manifest.num_edges,
            layout.blocks() as u64,
        );
        let coded = manifest.compression.is_compressed();
        let code_bytes = manifest.stored_edge_bytes();
        let mut expect = vec![
            match coded {
                true => (EDGE_CODES, DType::U8, vec![code_bytes]),
                false => ("edges", DType::U32, vec![e, 2]),
            },
            ("block_index", DType::I64, vec![p2 + 1]),
            ("out_degree", DType::I64, vec![n]),
            ("in_degree", DType::I64, vec![n]),
        ];
        if manifest.weights.is_some() {
            expect.push(("weights", DType::F32, vec![e]));
        }
        if coded {
            expect.push((CODE_INDEX, DType::I64, vec![p2 + 1]));
        }
        for (name, dtype, shape) in expect {
            let info = manifest.arrays.get(name).ok_or_else(|| {
                GridError::invalid(dir, format!("{GRID_MANIFEST} lists no '{name}' array"))
            })?;
            let path = dir.join(&info.file);
            let header =
                read_header(&path).map_err(|err| GridError::invalid(dir, err.to_string()))?;
            if header.dtype != dtype || header.shape != shape {
                return Err(GridError::invalid(
                    dir,
                    format!(
                        "{}: expected {} {:?}, found {} {:?}",
                        info.file,
                        dtype.name(),
                        shape,
                        header.dtype.name(),
                        header.shape
                    ),
                ));
            }
            let len = std::fs::metadata(&path)
                .map_err(|err| GridError::os("stat", &path, err))?
                .len();
            if len != header.data_offset + header.data_bytes() {
                return Err(GridError::invalid(
                    dir,
                    format!(
                        "{}: {len} bytes on disk, its header needs {}",
                        info.file,
                        header.data_offset + header.data_bytes()
                    ),
                ));
            }
        }
        let index = read_offsets(dir, &manifest, "block_index", "block offset", e)?;
        let codes = match coded {
            true => Some(read_offsets(
                dir,
                &manifest,
                CODE_INDEX,
                "code offset",
                code_bytes,
            )?),
            false => None,
        };
        Ok(Grid {
            dir: dir.to_path_buf(),
            manifest,
            layout,
            index,
            codes,
        })
    }

    /// Finds a grid of `store`: the one called `name`, else one that satisfies the needs
    /// (`weights` made that way, symmetry, simplicity: `(symmetric, simple)`), preferring the
    /// fewest partitions. A grid built
    /// from an input ([`is_grid_dir`]) given as `store` is itself the grid.
    pub fn find(
        store: &Path,
        name: Option<&str>,
        weights: Option<&WeightSpec>,
        (symmetric, simple): (bool, bool),
    ) -> Result<Option<PathBuf>> {
        if is_grid_dir(store) {
            if let Some(name) = name {
                return Err(GridError::config(
                    "grid",
                    format!(
                        "{} is a grid directory itself (from `strata grid build INPUT --out DIR`), not a store with grids: drop --grid {name}",
                        store.display()
                    ),
                ));
            }
            return Ok(Some(store.to_path_buf()));
        }
        let root = grids_dir(store);
        if let Some(name) = name {
            let dir = root.join(name);
            if !dir.join(GRID_MANIFEST).exists() {
                return Err(GridError::config(
                    "grid",
                    format!("{} is not a grid (see `strata grid list`)", dir.display()),
                ));
            }
            return Ok(Some(dir));
        }
        let Ok(entries) = std::fs::read_dir(&root) else {
            return Ok(None);
        };
        let mut best: Option<(u32, PathBuf)> = None;
        for entry in entries.flatten() {
            let dir = entry.path();
            let Ok(m) = GridManifest::load(&dir) else {
                continue;
            };
            if (weights.is_some() && m.weights.as_ref() != weights)
                || (m.symmetric, m.simple) != (symmetric, simple)
            {
                continue;
            }
            if best.as_ref().is_none_or(|(p, _)| m.partitions < *p) {
                best = Some((m.partitions, dir));
            }
        }
        Ok(best.map(|(_, d)| d))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The store the grid belongs to (grids of a store live in `STORE/grids/NAME`, see
    /// [`grids_dir`](crate::build::grids_dir)); `None` for a grid built from an input.
    pub fn store_dir(&self) -> Option<&Path> {
        let parent = self.dir.parent()?;
        let store = parent.parent()?;
        (parent.file_name()? == "grids" && store.join(strata_store::store::MANIFEST).is_file())
            .then_some(store)
    }

    /// The node name table of the graph, when its ids were names: the grid's own (a grid
    /// built from an input), else its store's.
    pub fn node_names(&self) -> Result<Option<NameTable>> {
        let arrays = &self.manifest.arrays;
        if let (Some(offsets), Some(bytes)) = (
            arrays.get("node_names_offsets"),
            arrays.get("node_names_bytes"),
        ) {
            return Ok(Some(NameTable::open_at(&self.dir, offsets, bytes, None)?));
        }
        let Some(dir) = self.store_dir() else {
            return Ok(None);
        };
        let store = Store::open(dir)?;
        if !store.manifest().graph.node_names {
            return Ok(None);
        }
        Ok(Some(NameTable::open(&store, "node_names")?))
    }

    pub fn manifest(&self) -> &GridManifest {
        &self.manifest
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Path of array `name` (`edges`, `weights`, `out_degree`, ...).
    pub fn array_path(&self, name: &str) -> PathBuf {
        self.dir.join(&self.manifest.arrays[name].file)
    }

    /// Edges (rows of `edges.npy`) of the block at file position `pos`.
    #[inline]
    pub fn block_edges(&self, pos: usize) -> Range<u64> {
        self.index[pos]..self.index[pos + 1]
    }

    /// How the grid stores its blocks.
    pub fn compression(&self) -> Compression {
        self.manifest.compression
    }

    /// Bytes of the edge array's data (`edges.npy` or `edge_codes.npy`) holding the block at
    /// file position `pos`.
    #[inline]
    pub fn block_bytes(&self, pos: usize) -> Range<u64> {
        match &self.codes {
            Some(c) => c[pos]..c[pos + 1],
            None => self.index[pos] * EDGE_BYTES..self.index[pos + 1] * EDGE_BYTES,
        }
    }

    /// Decodes `code`, the stored bytes of the compressed block at file position `pos`, into
    /// `out` (its edge count of records): every read of a compressed block goes through here.
    /// Errors name the grid, the file, the block and what is wrong with its code.
    pub fn decode_codes(&self, pos: usize, code: &[u8], out: &mut [[u32; 2]]) -> Result<()> {
        let keys = Keys::new(self.layout.chunk_size);
        block_codec::decode(self.manifest.compression, keys, code, out).map_err(|e| {
            let (i, j) = self.layout.block_at(pos);
            let b = self.block_bytes(pos);
            GridError::invalid(
                &self.dir,
                format!(
                    "{} block ({i}, {j}) (bytes {}..{} of its data): {e}",
                    self.manifest.arrays[EDGE_CODES].file, b.start, b.end
                ),
            )
        })
    }

    /// [`Grid::decode_codes`], then [`Grid::check_block`] on the records.
    pub fn decode_block(&self, pos: usize, code: &[u8], out: &mut [[u32; 2]]) -> Result<()> {
        self.decode_codes(pos, code, out)?;
        self.check_block(pos, out)
    }

    /// Checks that the edge records `edges` of the block at file position `pos` hold offsets
    /// inside their chunks (what the kernels index vertex arrays with). A max over the block
    /// while it is in cache decides; the bad row is searched for only when there is one.
    pub fn check_block(&self, pos: usize, edges: &[[u32; 2]]) -> Result<()> {
        let (i, j) = self.layout.block_at(pos);
        let (src_len, dst_len) = (self.layout.chunk_len(i), self.layout.chunk_len(j));
        let (src_max, dst_max) = edges
            .iter()
            .fold((0u32, 0u32), |(a, b), e| (a.max(e[0]), b.max(e[1])));
        if edges.is_empty() || ((src_max as u64) < src_len && (dst_max as u64) < dst_len) {
            return Ok(());
        }
        let mut first = None;
        self.scan_block(pos, self.index[pos], edges, |_, msg| {
            first.get_or_insert(msg);
        });
        Err(GridError::invalid(
            &self.dir,
            first.expect("a value above its chunk"),
        ))
    }

    /// Calls `f(row, message)` for every offset of `edges` (rows of the block at file position
    /// `pos`, the first being row `first_row` of `edges.npy`) outside its chunk.
    pub fn scan_block(
        &self,
        pos: usize,
        first_row: u64,
        edges: &[[u32; 2]],
        mut f: impl FnMut(u64, String),
    ) {
        let (i, j) = self.layout.block_at(pos);
        let (src_len, dst_len) = (self.layout.chunk_len(i), self.layout.chunk_len(j));
        let file = &self.manifest.arrays[self.manifest.edge_array()].file;
        let row_name = match self.manifest.compression {
            Compression::None => "row",
            _ => "decoded edge",
        };
        for (k, e) in edges.iter().enumerate() {
            for (what, value, len) in [("src", e[0], src_len), ("dst", e[1], dst_len)] {
                if value as u64 >= len {
                    let row = first_row + k as u64;
                    f(
                        row,
                        format!(
                            "{file} {row_name} {row}: {what} offset {value} is out of range [0, {len}) of block ({i}, {j})"
                        ),
                    );
                }
            }
        }
    }

    /// Calls `f(vertex, value)` for every value of an `int64` vertex array (degrees), read in
    /// batches so that memory never holds the array.
    pub fn for_each_degree(&self, name: &str, mut f: impl FnMut(usize, u64)) -> Result<()> {
        let path = self.array_path(name);
        let header = read_header(&path)?;
        let mut r =
            strata_store::array::RowReader::open(&path, &header, strata_store::array::IO_CHUNK)?;
        let mut v = 0;
        while let Some(b) = r.next_batch()? {
            for c in b.chunks_exact(8) {
                f(v, i64::from_le_bytes(c.try_into().unwrap()) as u64);
                v += 1;
            }
        }
        Ok(())
    }

    /// The segments of the grid in file order: each major chunk's blocks cut into runs of at
    /// most `max_bytes` of edges (a block larger than that is a segment by itself). Empty
    /// runs are left out.
    pub fn segments(&self, max_bytes: u64) -> Vec<Segment> {
        let p = self.layout.partitions as usize;
        let mut out = Vec::new();
        for major in 0..p {
            let mut start = major * p;
            let end = start + p;
            while start < end {
                let mut stop = start + 1;
                while stop < end
                    && (self.index[stop + 1] - self.index[start]) * EDGE_BYTES <= max_bytes
                {
                    stop += 1;
                }
                let edges = self.index[start]..self.index[stop];
                if edges.end > edges.start {
                    out.push(Segment {
                        major: major as u32,
                        blocks: start..stop,
                        edges,
                        bytes: self.block_bytes(start).start..self.block_bytes(stop - 1).end,
                    });
                }
                start = stop;
            }
        }
        out
    }
}

/// Reads and checks the offsets array `name` of a grid (P² + 1 entries, from 0, never
/// decreasing, ending at `total`; `what` names an entry in errors).
fn read_offsets(
    dir: &Path,
    manifest: &GridManifest,
    name: &str,
    what: &str,
    total: u64,
) -> Result<Vec<u64>> {
    let file = &manifest.arrays[name].file;
    let (_, bytes) = read_all_bytes(&dir.join(file))?;
    let index = bytemuck::pod_collect_to_vec::<u8, i64>(&bytes);
    let mut offsets = IndptrCheck::new(dir, file, what, total);
    let mut first = None;
    offsets.scan(&index, |_, msg| {
        first.get_or_insert(msg);
    });
    if let Some(msg) = first.or_else(|| offsets.end_problem().map(|p| p.1)) {
        return Err(GridError::invalid(dir, msg));
    }
    Ok(index.into_iter().map(|x| x as u64).collect())
}
