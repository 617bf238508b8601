//! Staging of parsed edges: per-split spool arrays, the exact random split, and the final
//! `edges_{split}` arrays in the narrowest id type.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::array::{decode_ints, IntCursor, NpyWriter, RowReader};
use crate::error::{Result, StoreError};
use crate::manifest::{ArrayInfo, SPLITS};
use crate::npy::DType;
use crate::rng::Rng;
use crate::store::StoreBuilder;
use strata_io::progress::{Meter, Progress};

/// Edges in columns; `rel` is empty when the input has no relation column, `weight`, `time`
/// and `feat` when it has no such attribute (`feat` holds `Attrs::features` values an edge). An id of `-1` marks an endpoint not resolved yet
/// (string ids looked up in several passes).
#[derive(Default, Debug, Clone, PartialEq)]
pub(crate) struct EdgeBatch {
    pub src: Vec<i64>,
    pub rel: Vec<i64>,
    pub dst: Vec<i64>,
    pub weight: Vec<f32>,
    pub time: Vec<i64>,
    pub feat: Vec<f32>,
}

impl EdgeBatch {
    /// A batch that holds `rows` edges (with relations when `rel`, and the attributes of
    /// `attrs`) without growing.
    pub fn with_capacity(rows: usize, rel: bool, attrs: Attrs) -> Self {
        let some = |on: bool| if on { rows } else { 0 };
        EdgeBatch {
            src: Vec::with_capacity(rows),
            rel: Vec::with_capacity(some(rel)),
            dst: Vec::with_capacity(rows),
            weight: Vec::with_capacity(some(attrs.weights)),
            time: Vec::with_capacity(some(attrs.times)),
            feat: Vec::with_capacity(rows * attrs.features),
        }
    }

    pub fn len(&self) -> usize {
        self.src.len()
    }

    pub fn clear(&mut self) {
        self.src.clear();
        self.rel.clear();
        self.dst.clear();
        self.weight.clear();
        self.time.clear();
        self.feat.clear();
    }
}

/// Which per-edge attributes the spool rows carry after their id columns: the weight's f32
/// bits, then the time, then `features` f32 feature values (as bits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attrs {
    pub weights: bool,
    pub times: bool,
    /// Edge feature dimension (0: none); only the train split's are stored
    /// (`edge_features_train`, as the format defines).
    pub features: usize,
}

impl Attrs {
    pub fn any(self) -> bool {
        self.weights || self.times || self.features > 0
    }

    /// Attribute columns after the ids.
    pub fn width(self) -> usize {
        self.weights as usize + self.times as usize + self.features
    }
}

/// Index of a split name in [`SPLITS`].
pub(crate) fn split_index(name: &str) -> Option<usize> {
    SPLITS.iter().position(|s| *s == name)
}

/// Spooled edges of one split.
pub(crate) struct SpoolFile {
    pub path: PathBuf,
    pub info: ArrayInfo,
}

/// What [`Spool::finish`] returns: one file per split that received edges.
pub(crate) struct Spooled {
    pub files: [Option<SpoolFile>; 3],
    pub dtype: DType,
    /// Id columns (2 or 3); the attribute columns of `attrs` follow them in each row.
    pub cols: usize,
    pub attrs: Attrs,
    /// Largest node id seen (-1 if none).
    pub max_node: i64,
    /// Largest relation id seen (-1 if none).
    pub max_rel: i64,
}

impl Spooled {
    pub fn rows(&self, split: usize) -> u64 {
        self.files[split].as_ref().map_or(0, |f| f.info.shape[0])
    }

    pub fn total_rows(&self) -> u64 {
        (0..3).map(|s| self.rows(s)).sum()
    }

    /// Columns of a spooled row.
    pub fn width(&self) -> usize {
        self.cols + self.attrs.width()
    }
}

/// Appends edge batches to one array per split in a scratch directory.
pub(crate) struct Spool {
    dir: PathBuf,
    tag: String,
    dtype: DType,
    cols: usize,
    attrs: Attrs,
    io_chunk: usize,
    writers: [Option<NpyWriter>; 3],
    prev: [Option<IntCursor>; 3],
    max_node: i64,
    max_rel: i64,
    rows: Vec<i64>,
    prev_rows: Vec<i64>,
}

impl Spool {
    /// A spool writing `dtype` rows of `cols` id columns (and the columns of `attrs`, which
    /// need `dtype` int64) into files `edges-TAG-SPLIT.npy` of `dir`.
    pub fn new(
        dir: &Path,
        tag: &str,
        dtype: DType,
        cols: usize,
        attrs: Attrs,
        io_chunk: usize,
    ) -> Self {
        debug_assert!(!attrs.any() || dtype == DType::I64);
        Spool {
            dir: dir.to_path_buf(),
            tag: tag.to_string(),
            dtype,
            cols,
            attrs,
            io_chunk,
            writers: [None, None, None],
            prev: [None, None, None],
            max_node: -1,
            max_rel: -1,
            rows: Vec::new(),
            prev_rows: Vec::new(),
        }
    }

    /// A spool that merges each batch with the same rows of `prev`: endpoints still `-1` in a
    /// batch take their value from `prev`.
    pub fn patching(dir: &Path, tag: &str, prev: &Spooled, io_chunk: usize) -> Result<Self> {
        let mut spool = Spool::new(dir, tag, prev.dtype, prev.cols, prev.attrs, io_chunk);
        for (slot, file) in prev.files.iter().enumerate() {
            if let Some(f) = file {
                spool.prev[slot] = Some(IntCursor::new(
                    RowReader::open_array(dir, &f.info, io_chunk)?,
                    prev.dtype,
                ));
            }
        }
        Ok(spool)
    }

    /// Appends `batch` to split `split` (an index into [`SPLITS`]).
    pub fn append(&mut self, split: usize, batch: &EdgeBatch) -> Result<()> {
        if batch.len() == 0 {
            return Ok(());
        }
        self.rows.clear();
        let with_rel = self.cols == 3;
        for i in 0..batch.len() {
            self.rows.push(batch.src[i]);
            if with_rel {
                self.rows.push(batch.rel[i]);
            }
            self.rows.push(batch.dst[i]);
            if self.attrs.weights {
                self.rows.push(batch.weight[i].to_bits() as i64);
            }
            if self.attrs.times {
                self.rows.push(batch.time[i]);
            }
            let d = self.attrs.features;
            for v in &batch.feat[i * d..(i + 1) * d] {
                self.rows.push(v.to_bits() as i64);
            }
        }
        let width = self.cols + self.attrs.width();
        if let Some(prev) = self.prev[split].as_mut() {
            prev.take(self.rows.len(), &mut self.prev_rows)?;
            if self.prev_rows.len() != self.rows.len() {
                return Err(StoreError::option(
                    "inputs",
                    "an input file changed during the conversion: two passes read different edges",
                ));
            }
            // Only ids are patched: a time may be negative.
            for (row, prev_row) in self
                .rows
                .chunks_exact_mut(width)
                .zip(self.prev_rows.chunks_exact(width))
            {
                for (v, p) in row[..self.cols].iter_mut().zip(prev_row) {
                    if *v < 0 {
                        *v = *p;
                    }
                }
            }
        }
        for row in self.rows.chunks_exact(width) {
            self.max_node = self.max_node.max(row[0]).max(row[self.cols - 1]);
            if with_rel {
                self.max_rel = self.max_rel.max(row[1]);
            }
        }
        if self.writers[split].is_none() {
            let path = self
                .dir
                .join(format!("edges-{}-{}.npy", self.tag, SPLITS[split]));
            self.writers[split] = Some(NpyWriter::create(
                &path,
                self.dtype,
                &[width as u64],
                self.io_chunk,
            )?);
        }
        self.writers[split].as_mut().unwrap().write_ints(&self.rows)
    }

    /// Closes every split's array.
    pub fn finish(self) -> Result<Spooled> {
        let mut files: [Option<SpoolFile>; 3] = [None, None, None];
        for (slot, w) in self.writers.into_iter().enumerate() {
            if let Some(w) = w {
                let info = w.finish()?;
                files[slot] = Some(SpoolFile {
                    path: self.dir.join(&info.file),
                    info,
                });
            }
        }
        Ok(Spooled {
            files,
            dtype: self.dtype,
            cols: self.cols,
            attrs: self.attrs,
            max_node: self.max_node,
            max_rel: self.max_rel,
        })
    }
}

/// Removes a spool's files.
pub(crate) fn remove_spool(spooled: &Spooled) {
    for f in spooled.files.iter().flatten() {
        let _ = std::fs::remove_file(&f.path);
    }
}

/// Knuth's selection sampling (Algorithm S): picks exactly `k` of `n` items in one pass, each
/// `k`-subset equally likely.
pub(crate) struct Selection {
    needed: u64,
    left: u64,
}

impl Selection {
    pub fn new(k: u64, n: u64) -> Self {
        assert!(k <= n);
        Selection { needed: k, left: n }
    }

    /// Whether the next item is selected.
    pub fn next(&mut self, rng: &mut Rng) -> bool {
        let take = self.needed > 0 && rng.below(self.left) < self.needed;
        self.left -= 1;
        if take {
            self.needed -= 1;
        }
        take
    }
}

/// Exact split sizes of `n` items for `fractions` (train, valid, test): valid and test are
/// rounded, train takes the rest.
pub(crate) fn split_counts(n: u64, fractions: [f64; 3]) -> [u64; 3] {
    let valid = ((n as f64) * fractions[1]).round() as u64;
    let test = (((n as f64) * fractions[2]).round() as u64).min(n - valid);
    [n - valid - test, valid, test]
}

/// Assigns each of `n` items to a split with exactly [`split_counts`] items per split,
/// uniformly at random for `seed`.
pub(crate) struct Splitter {
    held: Selection,
    test: Selection,
    rng: Rng,
}

impl Splitter {
    pub fn new(n: u64, fractions: [f64; 3], seed: u64) -> Self {
        let [_, valid, test] = split_counts(n, fractions);
        Splitter {
            held: Selection::new(valid + test, n),
            test: Selection::new(test, valid + test),
            rng: Rng::new(seed ^ 0x5EED_5A1D_0000_0001),
        }
    }

    /// The split index of the next item.
    pub fn next(&mut self) -> usize {
        if !self.held.next(&mut self.rng) {
            0
        } else if self.test.next(&mut self.rng) {
            2
        } else {
            1
        }
    }
}

/// The arrays of one split being written: `edges_SPLIT` and, with attributes,
/// `edge_weights_SPLIT`, `edge_times_SPLIT` and (train only) `edge_features_train`.
struct SplitWriters {
    split: &'static str,
    edges: NpyWriter,
    weights: Option<NpyWriter>,
    times: Option<NpyWriter>,
    features: Option<NpyWriter>,
    ids: Vec<i64>,
    weight_vals: Vec<f32>,
    time_vals: Vec<i64>,
    feature_vals: Vec<f32>,
}

impl SplitWriters {
    fn create(
        builder: &StoreBuilder,
        split: &'static str,
        spooled: &Spooled,
        final_dtype: DType,
        io_chunk: usize,
    ) -> Result<Self> {
        let attr = |on: bool, what: &str, dtype: DType| -> Result<Option<NpyWriter>> {
            on.then(|| builder.writer(&format!("edge_{what}_{split}"), dtype, &[], io_chunk))
                .transpose()
        };
        Ok(SplitWriters {
            split,
            edges: builder.writer(
                &format!("edges_{split}"),
                final_dtype,
                &[spooled.cols as u64],
                io_chunk,
            )?,
            weights: attr(spooled.attrs.weights, "weights", DType::F32)?,
            times: attr(spooled.attrs.times, "times", DType::I64)?,
            features: (spooled.attrs.features > 0 && split == "train")
                .then(|| {
                    builder.writer(
                        "edge_features_train",
                        DType::F32,
                        &[spooled.attrs.features as u64],
                        io_chunk,
                    )
                })
                .transpose()?,
            ids: Vec::new(),
            weight_vals: Vec::new(),
            time_vals: Vec::new(),
            feature_vals: Vec::new(),
        })
    }

    /// Writes spooled rows (`cols` ids, then the attributes).
    fn write_rows(&mut self, rows: &[i64], cols: usize, attrs: Attrs) -> Result<()> {
        if !attrs.any() {
            return self.edges.write_ints(rows);
        }
        self.ids.clear();
        self.weight_vals.clear();
        self.time_vals.clear();
        self.feature_vals.clear();
        for row in rows.chunks_exact(cols + attrs.width()) {
            self.ids.extend_from_slice(&row[..cols]);
            let mut at = cols;
            if attrs.weights {
                self.weight_vals.push(f32::from_bits(row[at] as u32));
                at += 1;
            }
            if attrs.times {
                self.time_vals.push(row[at]);
                at += 1;
            }
            if self.features.is_some() {
                let bits = &row[at..at + attrs.features];
                self.feature_vals
                    .extend(bits.iter().map(|&b| f32::from_bits(b as u32)));
            }
        }
        self.edges.write_ints(&self.ids)?;
        if let Some(w) = self.weights.as_mut() {
            w.write(&self.weight_vals)?;
        }
        if let Some(w) = self.times.as_mut() {
            w.write(&self.time_vals)?;
        }
        if let Some(w) = self.features.as_mut() {
            w.write(&self.feature_vals)?;
        }
        Ok(())
    }

    /// Closes the arrays, adds them to `builder` and returns the split's edge count.
    fn finish(self, builder: &mut StoreBuilder) -> Result<u64> {
        let info = self.edges.finish()?;
        let rows = info.shape[0];
        builder.add(&format!("edges_{}", self.split), info);
        for (what, w) in [("weights", self.weights), ("times", self.times)] {
            if let Some(w) = w {
                builder.add(&format!("edge_{what}_{}", self.split), w.finish()?);
            }
        }
        if let Some(w) = self.features {
            builder.add("edge_features_train", w.finish()?);
        }
        Ok(rows)
    }
}

/// Turns spooled edges into the store's `edges_{split}` arrays in `final_dtype` (and the
/// attribute arrays `edge_weights_{split}`, `edge_times_{split}`, `edge_features_train`), splitting them at random
/// when `random_split` is given. Returns the edge count per split.
pub(crate) fn finalize_edges(
    builder: &mut StoreBuilder,
    spooled: Spooled,
    final_dtype: DType,
    random_split: Option<([f64; 3], u64)>,
    io_chunk: usize,
    progress: &dyn Progress,
) -> Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    let width = spooled.width();
    if let Some((fractions, seed)) = random_split {
        let all = spooled.files[0]
            .as_ref()
            .expect("random split spools into train");
        let n = all.info.shape[0];
        let mut splitter = Splitter::new(n, fractions, seed);
        let mut writers = Vec::new();
        for split in SPLITS {
            writers.push(SplitWriters::create(
                builder,
                split,
                &spooled,
                final_dtype,
                io_chunk,
            )?);
        }
        let mut meter = Meter::new(progress, "split edges", all.info.data_bytes(), n);
        let mut reader = RowReader::open_array(all.path.parent().unwrap(), &all.info, io_chunk)?;
        let mut vals = Vec::new();
        let mut parts: [Vec<i64>; 3] = Default::default();
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            decode_ints(bytes, spooled.dtype, &mut vals);
            for row in vals.chunks_exact(width) {
                parts[splitter.next()].extend_from_slice(row);
            }
            for (w, part) in writers.iter_mut().zip(parts.iter_mut()) {
                w.write_rows(part, spooled.cols, spooled.attrs)?;
                part.clear();
            }
            meter.add((vals.len() / width) as u64, bytes.len() as u64)?;
        }
        meter.finish()?;
        for w in writers {
            let split = w.split;
            counts.insert(split.to_string(), w.finish(builder)?);
        }
        remove_spool(&spooled);
        return Ok(counts);
    }
    for (slot, file) in spooled.files.iter().enumerate() {
        let Some(file) = file else { continue };
        let name = format!("edges_{}", SPLITS[slot]);
        let rows = file.info.shape[0];
        if spooled.dtype == final_dtype && !spooled.attrs.any() {
            let dest = builder.array_file(&name);
            std::fs::rename(&file.path, &dest).map_err(|e| StoreError::os("rename", &dest, e))?;
            let mut info = file.info.clone();
            info.file = dest.file_name().unwrap().to_string_lossy().into_owned();
            builder.add(&name, info);
        } else {
            let mut w =
                SplitWriters::create(builder, SPLITS[slot], &spooled, final_dtype, io_chunk)?;
            let mut meter = Meter::new(
                progress,
                &format!("narrow {name}"),
                file.info.data_bytes(),
                rows,
            );
            let mut reader =
                RowReader::open_array(file.path.parent().unwrap(), &file.info, io_chunk)?;
            let mut vals = Vec::new();
            while let Some(bytes) = reader.next_batch()? {
                vals.clear();
                decode_ints(bytes, spooled.dtype, &mut vals);
                w.write_rows(&vals, spooled.cols, spooled.attrs)?;
                meter.add((vals.len() / width) as u64, bytes.len() as u64)?;
            }
            meter.finish()?;
            w.finish(builder)?;
            let _ = std::fs::remove_file(&file.path);
        }
        counts.insert(SPLITS[slot].to_string(), rows);
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn splitter_gives_exact_counts(n in 0u64..3000, v in 0.0f64..0.5, t in 0.0f64..0.5, seed in any::<u64>()) {
            let fr = [1.0 - v - t, v, t];
            let want = split_counts(n, fr);
            let mut s = Splitter::new(n, fr, seed);
            let mut got = [0u64; 3];
            for _ in 0..n {
                got[s.next()] += 1;
            }
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn selection_is_uniform() {
        // Each of 10 positions is picked in about 3/10 of 20,000 trials.
        let mut rng = crate::rng::Rng::new(7);
        let mut hits = [0u32; 10];
        for _ in 0..20_000 {
            let mut sel = Selection::new(3, 10);
            for h in hits.iter_mut() {
                if sel.next(&mut rng) {
                    *h += 1;
                }
            }
        }
        for h in hits {
            assert!((5700..6300).contains(&h), "{hits:?}");
        }
    }
}
