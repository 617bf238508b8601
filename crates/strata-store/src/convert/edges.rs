//! An input's edges streamed without building a store, for engines that consume an edge list
//! once (`strata grid build INPUT --out DIR`). Each input format that can be read this way
//! opens an [`EdgeStream`] ([`super::EdgeSource::open`]) with the converters' own readers and
//! checks; [`EdgeInput`] is what the engines hold.

use std::path::{Path, PathBuf};

use super::num_nodes_for;
use super::spool::EdgeBatch;
use crate::error::{Result, StoreError};
use crate::manifest::ArrayInfo;

/// A batch of edges: global ids (non-negative, checked against the node count when it was
/// given), the weights when the input has them, and the input bytes the batch took.
pub struct EdgeRun<'a> {
    pub src: &'a [i64],
    pub dst: &'a [i64],
    /// Empty when the input has no weights.
    pub weight: &'a [f32],
    pub bytes: u64,
}

/// Where a stream hands each batch and the input bytes it took; an error stops the stream.
pub(crate) type BatchSink<'a> = dyn FnMut(&EdgeBatch, u64) -> Result<()> + 'a;

/// The edges of an input in one format, read in batches of bounded size.
pub(crate) trait EdgeStream {
    /// The input's format, as a converter calls it.
    fn format(&self) -> &'static str;

    /// The input files.
    fn paths(&self) -> Vec<PathBuf>;

    /// The number of edges (exact).
    fn edges(&self) -> Result<u64>;

    /// Bytes of the input files.
    fn input_bytes(&self) -> Result<u64>;

    /// Bytes one pass over the edges reads.
    fn stream_bytes(&self) -> Result<u64>;

    /// Whether the edges come with weights.
    fn weighted(&self) -> bool {
        false
    }

    /// The node count the input fixes itself (a parse that numbered names or counted ids).
    fn known_nodes(&self) -> Option<u64> {
        None
    }

    /// The plan lines of a parse that ran when the input was opened (it then counts as a
    /// stage of its own), or `None`.
    fn parse_plan(&self) -> Option<&[String]> {
        None
    }

    /// Moves the node name table (`node_names_offsets.npy`, `node_names_bytes.npy`) into
    /// `dir`; returns their entries (offsets, bytes), or `None` when the ids were integers.
    fn move_names(&mut self, dir: &Path) -> Result<Option<(ArrayInfo, ArrayInfo)>> {
        let _ = dir;
        Ok(None)
    }

    /// Streams the edges in batches of about `io_chunk` input bytes into `sink`. Ids are
    /// checked to be non-negative and, when `num_nodes` is given, below it; a bad id stops
    /// the stream with the file and the edge (row, pair or line) named.
    fn stream(&self, num_nodes: Option<u64>, io_chunk: usize, sink: &mut BatchSink) -> Result<()>;
}

/// An input whose edges can be streamed, opened by its format.
pub struct EdgeInput(Box<dyn EdgeStream>);

impl EdgeInput {
    /// Wraps a format's stream.
    pub(crate) fn new(stream: impl EdgeStream + 'static) -> EdgeInput {
        EdgeInput(Box::new(stream))
    }

    /// The input's format, as a converter calls it.
    pub fn format(&self) -> &'static str {
        self.0.format()
    }

    /// The input files.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.0.paths()
    }

    /// The number of edges (exact).
    pub fn edges(&self) -> Result<u64> {
        self.0.edges()
    }

    /// Bytes of the input files.
    pub fn input_bytes(&self) -> Result<u64> {
        self.0.input_bytes()
    }

    /// Bytes one pass over the edges reads (the staged spool, for text).
    pub fn stream_bytes(&self) -> Result<u64> {
        self.0.stream_bytes()
    }

    /// Whether the edges come with weights (a text weight column).
    pub fn weighted(&self) -> bool {
        self.0.weighted()
    }

    /// The plan lines of the parse that ran when the input was opened, if one did.
    pub fn parse_plan(&self) -> Option<&[String]> {
        self.0.parse_plan()
    }

    /// See [`EdgeStream::move_names`].
    pub fn move_names(&mut self, dir: &Path) -> Result<Option<(ArrayInfo, ArrayInfo)>> {
        self.0.move_names(dir)
    }

    /// Whether [`EdgeInput::num_nodes`] without a given count takes a pass over the edges.
    pub fn counts_nodes(&self) -> bool {
        self.0.known_nodes().is_none()
    }

    /// The node count: what the input fixes itself (names, or a parse's largest id + 1),
    /// `given`, or the largest id + 1 found by a pass over the edges (refused when the ids
    /// are too sparse, as a conversion refuses them).
    pub fn num_nodes(&self, given: Option<u64>, io_chunk: usize) -> Result<u64> {
        if let Some(n) = self.0.known_nodes() {
            return Ok(n);
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

    /// Streams the edges (see [`EdgeStream::stream`]) into `sink`; the sink's own error
    /// stops the stream and is returned as it is.
    pub fn stream<E: From<StoreError>>(
        &self,
        num_nodes: Option<u64>,
        io_chunk: usize,
        mut sink: impl FnMut(EdgeRun) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut failed = None;
        let streamed = self.0.stream(num_nodes, io_chunk, &mut |batch, bytes| {
            let run = EdgeRun {
                src: &batch.src,
                dst: &batch.dst,
                weight: &batch.weight,
                bytes,
            };
            sink(run).map_err(|e| {
                failed = Some(e);
                // Stops the stream; `failed` is what the caller gets.
                StoreError::Cancelled
            })
        });
        match (failed, streamed) {
            (Some(e), _) => Err(e),
            (None, r) => r.map_err(E::from),
        }
    }
}
