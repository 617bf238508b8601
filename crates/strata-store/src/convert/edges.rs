//! An input's edges streamed without building a store, for engines that consume an edge list
//! once (`strata grid build INPUT --out DIR`). The readers and checks are the converters':
//! raw int32 pairs and NumPy edge arrays are read in place; text edge lists go through the
//! text converter's parse (integer ids or names, weight columns, gzip) into its spool, and
//! the spool is read back.

use std::path::{Path, PathBuf};

use super::numpy::{check_bin32, inspect_edges, stream_bin32, EdgeArray};
use super::spool::{EdgeBatch, Spooled};
use super::text_job::ingest_text;
use super::{num_nodes_for, EdgeLayout, Ingested, TextJob};
use crate::array::{decode_ints, RowReader};
use crate::error::{Result, StoreError};
use crate::manifest::ArrayInfo;
use crate::store::StoreBuilder;
use strata_io::progress::Progress;

/// A batch of edges: global ids (non-negative, checked against the node count when it was
/// given), the weights when the input has them, and the input bytes the batch took.
pub struct EdgeRun<'a> {
    pub src: &'a [i64],
    pub dst: &'a [i64],
    /// Empty when the input has no weights.
    pub weight: &'a [f32],
    pub bytes: u64,
}

/// Text edges parsed by the text converter into its spool (train edges only), with the node
/// name table when the ids were names. The files live in a never-committed store builder,
/// removed when this is dropped.
pub struct StagedText {
    builder: StoreBuilder,
    ingested: Ingested,
    paths: Vec<PathBuf>,
}

/// An input whose edges can be streamed.
pub enum EdgeInput {
    /// Raw little-endian int32 `(src, dst)` pair files.
    Bin32(Vec<PathBuf>),
    /// One NumPy edge array, rows `(E, 2|3)` or columns `(2|3, E)`, any integer dtype.
    Numpy(PathBuf, EdgeLayout),
    /// A text edge list, parsed.
    Text(Box<StagedText>),
}

impl EdgeInput {
    /// Raw int32 pair files, checked to hold whole pairs.
    pub fn bin32(paths: Vec<PathBuf>) -> Result<EdgeInput> {
        if paths.is_empty() {
            return Err(StoreError::option("inputs", "no input files given"));
        }
        for p in &paths {
            check_bin32(p)?;
        }
        Ok(EdgeInput::Bin32(paths))
    }

    /// A NumPy edge array, checked to be an integer array of edges.
    pub fn numpy(path: &Path, layout: EdgeLayout) -> Result<EdgeInput> {
        let a = inspect_edges(path, layout)?;
        if a.edges == 0 {
            return Err(StoreError::bad_file(path, "holds no edges"));
        }
        Ok(EdgeInput::Numpy(path.to_path_buf(), layout))
    }

    /// A text edge list parsed by the text converter (its train inputs only; no random
    /// split). The converter's scratch files go into a store builder for `job.graph.out`,
    /// which is never committed.
    pub fn text(job: &TextJob, progress: &dyn Progress) -> Result<EdgeInput> {
        if job.text.node_types.is_some() || !job.text.edges_of.is_empty() {
            return Err(StoreError::option(
                "node_types",
                "typed graphs (node and edge types) need a store: convert them with `strata convert`",
            ));
        }
        if job.text.inputs.iter().any(|f| f.split != "train") || job.graph.split.is_some() {
            return Err(StoreError::option(
                "inputs",
                "only train edges can be read this way: no valid/test files and no split",
            ));
        }
        let (builder, ingested, _) = ingest_text(job, progress)?;
        let paths = job.text.inputs.iter().map(|f| f.path.clone()).collect();
        Ok(EdgeInput::Text(Box::new(StagedText {
            builder,
            ingested,
            paths,
        })))
    }

    /// The number of edges (exact).
    pub fn edges(&self) -> Result<u64> {
        Ok(match self {
            EdgeInput::Bin32(paths) => {
                let mut total = 0;
                for p in paths {
                    total += check_bin32(p)? / 8;
                }
                total
            }
            EdgeInput::Numpy(path, layout) => inspect_edges(path, *layout)?.edges,
            EdgeInput::Text(t) => t.ingested.spooled.rows(0),
        })
    }

    /// Bytes of the input files.
    pub fn input_bytes(&self) -> Result<u64> {
        Ok(match self {
            EdgeInput::Bin32(paths) => {
                let mut total = 0;
                for p in paths {
                    total += check_bin32(p)?;
                }
                total
            }
            EdgeInput::Numpy(path, _) => super::file_len(path)?,
            EdgeInput::Text(t) => t.ingested.input_bytes,
        })
    }

    /// Bytes one pass over the edges reads (the staged spool, for text).
    pub fn stream_bytes(&self) -> Result<u64> {
        match self {
            EdgeInput::Text(t) => Ok(t.spool().info.data_bytes()),
            EdgeInput::Numpy(path, layout) => Ok(inspect_edges(path, *layout)?.header.data_bytes()),
            EdgeInput::Bin32(_) => self.input_bytes(),
        }
    }

    /// The input's format, as a converter calls it.
    pub fn format(&self) -> &'static str {
        match self {
            EdgeInput::Bin32(_) => "bin32",
            EdgeInput::Numpy(..) => "numpy",
            EdgeInput::Text(_) => "text",
        }
    }

    /// The input files.
    pub fn paths(&self) -> Vec<PathBuf> {
        match self {
            EdgeInput::Bin32(paths) => paths.clone(),
            EdgeInput::Numpy(path, _) => vec![path.clone()],
            EdgeInput::Text(t) => t.paths.clone(),
        }
    }

    /// Whether the edges come with weights (a text weight column).
    pub fn weighted(&self) -> bool {
        matches!(self, EdgeInput::Text(t) if t.ingested.spooled.attrs.weights)
    }

    /// The staged text, when the input is text.
    pub fn staged(&mut self) -> Option<&mut StagedText> {
        match self {
            EdgeInput::Text(t) => Some(t),
            _ => None,
        }
    }

    /// The node count: `given`, the text converter's (names, or its largest id + 1), or the
    /// largest id + 1 found by a pass over the edges (refused when the ids are too sparse,
    /// as a conversion refuses them).
    pub fn num_nodes(&self, given: Option<u64>, io_chunk: usize) -> Result<u64> {
        if let EdgeInput::Text(t) = self {
            return Ok(t.ingested.num_nodes);
        }
        if let Some(n) = given {
            return Ok(n);
        }
        let mut max = -1i64;
        self.stream(None, io_chunk, |run| {
            let m = run.src.iter().chain(run.dst).copied().max().unwrap_or(-1);
            max = max.max(m);
            Ok::<_, StoreError>(())
        })?;
        num_nodes_for(None, max, self.edges()?)
    }

    /// Streams the edges in batches of about `io_chunk` input bytes into `sink`. Ids are
    /// checked to be non-negative and, when `num_nodes` is given, below it; a bad id stops
    /// the stream with the file and the edge (row, pair or line) named.
    pub fn stream<E: From<StoreError>>(
        &self,
        num_nodes: Option<u64>,
        io_chunk: usize,
        mut sink: impl FnMut(EdgeRun) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut pass = |batch: &EdgeBatch, bytes: u64| {
            sink(EdgeRun {
                src: &batch.src,
                dst: &batch.dst,
                weight: &batch.weight,
                bytes,
            })
        };
        match self {
            EdgeInput::Bin32(paths) => {
                for p in paths {
                    stream_bin32(p, num_nodes, io_chunk, &mut pass)?;
                }
                Ok(())
            }
            EdgeInput::Numpy(path, layout) => {
                let a: EdgeArray = inspect_edges(path, *layout)?;
                let mut first = 0u64;
                a.stream(io_chunk, |batch, bytes| {
                    super::numpy::check_range(batch, first, num_nodes, None, path, "edge")?;
                    first += batch.len() as u64;
                    pass(batch, bytes)
                })
            }
            EdgeInput::Text(t) => t.stream(io_chunk, pass),
        }
    }
}

impl StagedText {
    fn spool(&self) -> &super::spool::SpoolFile {
        self.ingested.spooled.files[0]
            .as_ref()
            .expect("a text conversion spools train edges")
    }

    /// Whether the ids were names (the builder then holds the `node_names` table).
    pub fn node_names(&self) -> bool {
        self.ingested.node_names
    }

    /// The parse's plan lines (blocks, ids).
    pub fn plan(&self) -> &[String] {
        &self.ingested.plan
    }

    /// Moves the node name table (`node_names_offsets.npy`, `node_names_bytes.npy`) into
    /// `dir`; returns their entries (offsets, bytes), or `None` when the ids were integers.
    pub fn move_names(&mut self, dir: &Path) -> Result<Option<(ArrayInfo, ArrayInfo)>> {
        if !self.ingested.node_names {
            return Ok(None);
        }
        let mut moved = Vec::new();
        for name in ["node_names_offsets", "node_names_bytes"] {
            let info = self.builder.arrays()[name].clone();
            let from = self.builder.dir().join(&info.file);
            let to = dir.join(&info.file);
            std::fs::rename(&from, &to).map_err(|e| StoreError::os("rename", &to, e))?;
            moved.push(info);
        }
        let bytes = moved.pop().expect("two arrays");
        let offsets = moved.pop().expect("two arrays");
        Ok(Some((offsets, bytes)))
    }

    /// Streams the spooled edges (ids already checked by the parse).
    fn stream<E: From<StoreError>>(
        &self,
        io_chunk: usize,
        mut sink: impl FnMut(&EdgeBatch, u64) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let spooled: &Spooled = &self.ingested.spooled;
        let file = self.spool();
        let width = spooled.width();
        let (cols, weighted) = (spooled.cols, spooled.attrs.weights);
        let mut reader = RowReader::open_array(
            file.path.parent().expect("the spool is in a directory"),
            &file.info,
            io_chunk,
        )?;
        let mut vals = Vec::new();
        let mut batch = EdgeBatch::default();
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            decode_ints(bytes, spooled.dtype, &mut vals);
            batch.clear();
            for row in vals.chunks_exact(width) {
                batch.src.push(row[0]);
                batch.dst.push(row[cols - 1]);
                if weighted {
                    batch.weight.push(f32::from_bits(row[cols] as u32));
                }
            }
            sink(&batch, bytes.len() as u64)?;
        }
        Ok(())
    }
}
