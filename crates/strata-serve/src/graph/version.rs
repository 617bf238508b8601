//! Store versions of a served graph: each registration or fold writes a complete, valid
//! Strata store (readable by `strata info` and NumPy), and a served graph reads one of them.
//!
//! Besides the usual arrays a version holds `external_ids` (the store id of each internal
//! vertex of the registered range; vertices added later keep their id) and `removed` (1 for a
//! removed vertex).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use strata_graph::Topology;
use strata_store::array::{decode_ints, read_all_bytes};
use strata_store::convert::DegreeHistogram;
use strata_store::manifest::{
    id_dtype_for, FeatureInfo, GraphInfo, GraphStats, LabelInfo, Manifest, FORMAT_NAME,
    FORMAT_VERSION,
};
use strata_store::npy::DType;
use strata_store::{Store, StoreBuilder};

use crate::error::{Result, ServeError};
use crate::page_cache::{PageCache, PagedFile, PagedRows};

/// Rows per feature batch while writing a version (a few MiB at typical widths).
const FEATURE_BATCH_ROWS: usize = 4096;
/// Bytes an array writer buffers before writing.
const WRITE_BUFFER: usize = 1 << 20;

/// What a new version is written from: the registered store re-numbered, or a version with
/// its mutations.
pub trait VersionSource {
    fn num_nodes(&self) -> u32;
    fn in_neighbors(&self, v: u32) -> &[u32];
    fn out_neighbors(&self, v: u32) -> &[u32];
    fn is_removed(&self, v: u32) -> bool;
    /// Feature rows `first..first + out.len() / dim`, row-major f32.
    fn read_features(&self, first: u32, out: &mut [f32]) -> Result<()>;
    /// Class of `v`, -1 for none; only called when the version has labels.
    fn label(&self, v: u32) -> i32;
}

/// The parts of a version that do not come from the source's vertices.
pub struct VersionMeta<'a> {
    pub name: &'a str,
    pub feature_dim: usize,
    /// Classes of the labels, `None` when the graph has none.
    pub num_classes: Option<u64>,
    /// Store id of each internal vertex of the registered range.
    pub external_ids: &'a [u32],
    pub provenance: serde_json::Value,
}

/// Writes a complete store at `out` (atomically: a partial directory renamed into place).
pub fn write_version(out: &Path, src: &dyn VersionSource, meta: &VersionMeta<'_>) -> Result<()> {
    let n = src.num_nodes();
    let id_dtype = id_dtype_for(n as u64);
    let mut builder = StoreBuilder::create(out, false)?;
    let num_edges: u64 = (0..n).map(|v| src.out_neighbors(v).len() as u64).sum();

    let mut edges = builder.writer("edges_train", id_dtype, &[2], WRITE_BUFFER)?;
    let mut pair = Vec::new();
    for v in 0..n {
        for &w in src.out_neighbors(v) {
            pair.clear();
            pair.extend_from_slice(&[v as i64, w as i64]);
            edges.write_ints(&pair)?;
        }
    }
    builder.add("edges_train", edges.finish()?);

    let info = GraphInfo {
        num_nodes: n as u64,
        num_relations: 0,
        id_dtype,
        num_edges: BTreeMap::from([("train".to_string(), num_edges)]),
        num_topology_edges: num_edges,
        symmetrized: false,
        node_names: false,
        relation_names: false,
    };
    let mut stats = GraphStats::default();
    for (dir, degree_name) in [("csr", "out_degree"), ("csc", "in_degree")] {
        let list = |v: u32| {
            if dir == "csr" {
                src.out_neighbors(v)
            } else {
                src.in_neighbors(v)
            }
        };
        let mut indptr = builder.writer(&format!("{dir}_indptr"), DType::I64, &[], WRITE_BUFFER)?;
        let mut indices = builder.writer(&format!("{dir}_indices"), id_dtype, &[], WRITE_BUFFER)?;
        let mut degrees = builder.writer(degree_name, info.degree_dtype(), &[], WRITE_BUFFER)?;
        let mut hist = DegreeHistogram::new();
        let mut at = 0i64;
        let mut ids = Vec::new();
        indptr.write_ints(&[0])?;
        for v in 0..n {
            let l = list(v);
            at += l.len() as i64;
            indptr.write_ints(&[at])?;
            ids.clear();
            ids.extend(l.iter().map(|&x| x as i64));
            indices.write_ints(&ids)?;
            degrees.write_ints(&[l.len() as i64])?;
            hist.add(l.len() as u64);
        }
        builder.add(&format!("{dir}_indptr"), indptr.finish()?);
        builder.add(&format!("{dir}_indices"), indices.finish()?);
        builder.add(degree_name, degrees.finish()?);
        if dir == "csr" {
            stats.out_degree = hist.stats();
        } else {
            stats.in_degree = hist.stats();
        }
    }

    let dim = meta.feature_dim;
    let mut features = builder.writer("features", DType::F32, &[dim as u64], WRITE_BUFFER)?;
    let mut rows = vec![0f32; FEATURE_BATCH_ROWS * dim];
    for first in (0..n).step_by(FEATURE_BATCH_ROWS) {
        let count = (n - first).min(FEATURE_BATCH_ROWS as u32) as usize;
        src.read_features(first, &mut rows[..count * dim])?;
        features.write(&rows[..count * dim])?;
    }
    builder.add("features", features.finish()?);

    if meta.num_classes.is_some() {
        let mut labels = builder.writer("labels", DType::I32, &[], WRITE_BUFFER)?;
        let vals: Vec<i32> = (0..n).map(|v| src.label(v)).collect();
        labels.write(&vals)?;
        builder.add("labels", labels.finish()?);
    }
    let mut ext = builder.writer("external_ids", DType::I64, &[], WRITE_BUFFER)?;
    ext.write_ints(
        &meta
            .external_ids
            .iter()
            .map(|&x| x as i64)
            .collect::<Vec<_>>(),
    )?;
    builder.add("external_ids", ext.finish()?);
    let mut removed = builder.writer("removed", DType::U8, &[], WRITE_BUFFER)?;
    removed.write(&(0..n).map(|v| src.is_removed(v) as u8).collect::<Vec<u8>>())?;
    builder.add("removed", removed.finish()?);

    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        strata_version: env!("CARGO_PKG_VERSION").into(),
        name: meta.name.to_string(),
        graph: info,
        features: Some(FeatureInfo {
            dim: dim as u64,
            dtype: DType::F32,
        }),
        labels: meta
            .num_classes
            .map(|num_classes| LabelInfo { num_classes }),
        node_splits: BTreeMap::new(),
        node_types: Vec::new(),
        edge_types: Vec::new(),
        edge_attributes: None,
        stats,
        arrays: BTreeMap::new(),
        provenance: meta.provenance.clone(),
    };
    builder.commit(manifest)?;
    Ok(())
}

/// One store version's graph, in memory (the paper's GL-TL vertex table lives in DRAM too).
#[derive(Debug)]
pub struct BaseGraph {
    /// In-neighbours: what a vertex aggregates from.
    pub csc: Topology,
    /// Out-neighbours: where a removal must also look.
    pub csr: Topology,
    /// Removed vertices of this version (their lists are already empty).
    pub removed: Vec<bool>,
}

impl BaseGraph {
    pub fn num_nodes(&self) -> u32 {
        self.csc.num_nodes() as u32
    }
}

/// One store version, opened for serving: topology in memory, features read through the
/// page cache.
pub struct Version {
    pub number: u64,
    pub path: PathBuf,
    pub graph: BaseGraph,
    /// Vertices of this version not removed.
    pub live_nodes: u64,
    pub features: PagedFile,
    pub feature_dim: usize,
    /// Byte offset of feature row 0 in its file.
    pub feature_offset: u64,
    pub labels: Option<Vec<i32>>,
    pub num_classes: u64,
    /// Store id of each internal vertex of the registered range.
    pub external_ids: Vec<u32>,
    /// A page cache of capacity 0: reads through it go around the service's cache (a fold
    /// must not evict the pages requests are using), and the overlay's writes of feature
    /// rows, which never read, name the file through it.
    pub direct: PageCache,
}

impl Version {
    /// Opens version `number` at `path`.
    pub fn open(path: &Path, number: u64) -> Result<Version> {
        let store = Store::open(path)?;
        let m = store.manifest();
        let feature_dim = m.features.as_ref().map(|f| f.dim as usize).ok_or_else(|| {
            ServeError::FailedPrecondition(format!(
                "{}: a served version must have features",
                path.display()
            ))
        })?;
        let csc = Topology::load(&store, strata_graph::topology::Direction::In)?;
        let csr = Topology::load(&store, strata_graph::topology::Direction::Out)?;
        let removed: Vec<bool> = read_all_bytes(&store.array_path("removed")?)?
            .1
            .iter()
            .map(|&b| b != 0)
            .collect();
        let live_nodes = removed.iter().filter(|&&r| !r).count() as u64;
        let external_ids = read_i64s(&store, "external_ids")?
            .into_iter()
            .map(|x| x as u32)
            .collect();
        let labels = match m.labels {
            Some(_) => Some(
                read_i64s(&store, "labels")?
                    .into_iter()
                    .map(|x| x as i32)
                    .collect(),
            ),
            None => None,
        };
        let fpath = store.array_path("features")?;
        let header = strata_store::npy::read_header(&fpath)?;
        if header.dtype != DType::F32 {
            return Err(ServeError::FailedPrecondition(format!(
                "{}: served features must be float32, found {}",
                fpath.display(),
                header.dtype
            )));
        }
        Ok(Version {
            number,
            path: path.to_path_buf(),
            graph: BaseGraph { csc, csr, removed },
            live_nodes,
            features: PagedFile::open(&fpath)?,
            feature_dim,
            feature_offset: header.data_offset,
            labels,
            num_classes: m.labels.as_ref().map_or(0, |l| l.num_classes),
            external_ids,
            direct: PageCache::new(0),
        })
    }

    /// This version's feature rows (`feature_dim` little-endian f32 each) read through
    /// `cache`, as a feature store.
    pub fn feature_rows<'a>(&'a self, cache: &'a PageCache) -> PagedRows<'a> {
        PagedRows::new(
            &self.features,
            cache,
            self.feature_offset,
            self.feature_dim * 4,
        )
    }
}

fn read_i64s(store: &Store, name: &str) -> Result<Vec<i64>> {
    let (header, bytes) = read_all_bytes(&store.array_path(name)?)?;
    let mut out = Vec::with_capacity(header.len() as usize);
    decode_ints(&bytes, header.dtype, &mut out);
    Ok(out)
}
