//! The partition buffer (the mechanism): a fixed number of slots, each holding one partition's
//! embeddings and optimizer state, filled from and written back to table files. What to load
//! and when is decided by an ordering's schedule (the policy) or by evaluation's scan; the
//! buffer only tracks which partition each slot holds.
//!
//! Between epochs the slots keep their partitions: after an epoch writes every resident
//! partition back, the slots equal the committed table, so the next epoch (or evaluation)
//! reuses them without reading.
//!
//! A typed run's pinned region (its unpartitioned and featurized entity types) has a slot of
//! its own beyond the partition slots, sized to it: it is loaded with the first state and
//! never evicted. When the region holds featurized types, readers see its entity view (each
//! entity the mean of its features), refreshed whenever the region is read or written back.

use std::sync::Arc;
use std::time::Instant;

use strata_io::{AlignedBuf, Engine};

use crate::config::RealDraw;
use crate::error::Result;
use crate::storage::entity_types::FeatureBags;
use crate::storage::layout::TableLayout;
use crate::storage::partition_cache::PartitionCache;
use crate::storage::shared::SharedRows;
use crate::storage::table::{Rows, TableFile};

/// How a partition that is not resident is brought into a slot: `load(buffer, slot, p)`
/// leaves `slot` holding partition `p`.
pub type Load<'a> = dyn FnMut(&mut PartitionBuffer, usize, u32) -> Result<()> + 'a;

/// Slots of partition-sized aligned buffers.
pub struct PartitionBuffer {
    pub layout: TableLayout,
    engine: Arc<Engine>,
    /// `None` while the slot's buffer is away being swapped. The partition slots, then the
    /// pinned region's slot when the layout has one.
    slots: Vec<Option<AlignedBuf>>,
    resident: Vec<Option<u32>>,
    /// Partition slots (the pinned slot not counted).
    capacity: usize,
    /// The featurized entities of the pinned region and its entity view.
    bags: Option<Arc<FeatureBags>>,
    view: Vec<f32>,
    /// Partitions kept in memory once they leave the slots (`None`: loads read the SSD).
    kept: Option<Arc<PartitionCache>>,
}

impl PartitionBuffer {
    /// `capacity` slots of `layout.part_bytes()` each, and one for the pinned region when the
    /// layout has one (allocated now, so the budget is paid up front).
    pub fn new(engine: Arc<Engine>, layout: TableLayout, capacity: usize) -> Self {
        let pinned = layout
            .pinned
            .map(|r| layout.region_bytes(r.region) as usize);
        PartitionBuffer {
            slots: (0..capacity)
                .map(|_| layout.part_bytes() as usize)
                .chain(pinned)
                .map(|bytes| Some(AlignedBuf::new(bytes)))
                .collect(),
            resident: vec![None; capacity + pinned.is_some() as usize],
            capacity,
            layout,
            engine,
            bags: None,
            view: Vec::new(),
            kept: None,
        }
    }

    /// Makes the pinned region's featurized entities (`bags`) the means of their features for
    /// every reader of [`embeddings`](Self::embeddings).
    pub fn set_bags(&mut self, bags: Option<Arc<FeatureBags>>) {
        self.bags = bags;
        self.refresh_view();
    }

    /// Recomputes the pinned region's entity view from its rows (when it is resident and holds
    /// featurized entities).
    fn refresh_view(&mut self) {
        let (Some(bags), Some(r)) = (&self.bags, self.layout.pinned) else {
            return;
        };
        let Some(slot) = self.slot_of(r.region) else {
            return;
        };
        let buf = self.slots[slot].as_ref().expect("slot present");
        let region = self.layout.region(r.region);
        let rows = Rows::of(
            buf.prefix(region.part_bytes() as usize),
            region.dtype,
            region.emb_floats(),
        );
        // The features' rows widened (borrowed from a float32 table).
        let mut wide = Vec::new();
        let stored = rows.span(0, region.emb_floats(), &mut wide);
        bags.entity_view(stored, self.layout.dim, &mut self.view);
    }

    /// The slot for region `p`: the pinned slot for the pinned region, else `slot`.
    fn slot_for(&self, slot: usize, p: u32) -> usize {
        if self.layout.is_pinned(p) {
            self.capacity
        } else {
            slot
        }
    }

    /// Partition slots (not counting a typed run's pinned slot).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The slot holding partition `p`.
    pub fn slot_of(&self, p: u32) -> Option<usize> {
        self.resident.iter().position(|&r| r == Some(p))
    }

    /// Partitions resident now (not counting slots away in a swap, nor the pinned region, which
    /// has a slot of its own).
    pub fn resident(&self) -> impl Iterator<Item = u32> + '_ {
        self.resident
            .iter()
            .zip(&self.slots)
            .filter_map(|(r, s)| s.as_ref().and(*r))
            .filter(|&p| !self.layout.is_pinned(p))
    }

    /// The bytes of resident region `p` (`layout.region_bytes(p)`: its rows, then their
    /// optimizer state).
    pub fn region(&self, p: u32) -> &[u8] {
        let slot = self.slot_of(p).expect("region resident");
        let buf = self.slots[slot].as_ref().expect("slot present");
        buf.prefix(self.layout.region_bytes(p) as usize)
    }

    /// [`region`](Self::region), to change in place (a distributed run's rounds sum the pinned
    /// region's changes over the ranks).
    pub fn region_mut(&mut self, p: u32) -> &mut [u8] {
        let slot = self.slot_of(p).expect("region resident");
        let bytes = self.layout.region_bytes(p) as usize;
        let buf = self.slots[slot].as_mut().expect("slot present");
        &mut buf.full_mut()[..bytes]
    }

    /// Forgets every slot's content and every kept partition (after the table file they
    /// mirrored changed, or before reading another: loads then read the file they are given).
    pub fn clear(&mut self) {
        self.resident.iter_mut().for_each(|r| *r = None);
        if let Some(cache) = &self.kept {
            cache.forget();
        }
    }

    /// Makes `state`'s partitions resident, reading those missing from `from` (or taking them
    /// from the kept partitions) into slots not needed by `state`. Returns the seconds spent.
    pub fn fill(&mut self, state: &[u32], from: &TableFile) -> Result<f64> {
        let start = Instant::now();
        let pinned = self.layout.pinned.map(|r| r.region);
        for &p in state.iter().chain(pinned.as_ref()) {
            if self.slot_of(p).is_some() {
                continue;
            }
            // The pinned region has a slot of its own (`slot_for`): it needs no partition slot.
            let slot = if pinned == Some(p) {
                self.capacity
            } else {
                (0..self.capacity)
                    .find(|&s| self.resident[s].is_none_or(|q| !state.contains(&q)))
                    .expect("the state fits the buffer")
            };
            self.load(slot, p, from)?;
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Reads partition `p` from `from` into `slot` (the pinned region into its own slot). The
    /// slot's partition must be written back already: with [`keep_partitions`] it is kept in
    /// memory (and `p` comes from there when kept), otherwise its bytes are overwritten.
    ///
    /// [`keep_partitions`]: Self::keep_partitions
    pub fn load(&mut self, slot: usize, p: u32, from: &TableFile) -> Result<()> {
        let slot = self.slot_for(slot, p);
        let old = self.resident[slot].take();
        match &self.kept {
            // The pinned region never leaves its slot (nor fits a partition's buffer).
            Some(cache) if !self.layout.is_pinned(p) => {
                let buf = match cache.take(p) {
                    Some(buf) => buf,
                    None => {
                        let mut buf = cache.buffer(self.layout.part_bytes() as usize);
                        from.read_partition(&self.engine, &self.layout, p, &mut buf)?;
                        buf
                    }
                };
                let out = self.slots[slot].replace(buf).expect("slot present");
                match old {
                    Some(q) => cache.keep(q, out),
                    None => cache.recycle(out),
                }
            }
            _ => {
                let buf = self.slots[slot].as_mut().expect("slot present");
                from.read_partition(&self.engine, &self.layout, p, buf)?;
            }
        }
        self.resident[slot] = Some(p);
        if self.layout.is_pinned(p) {
            self.refresh_view();
        }
        Ok(())
    }

    /// Keeps partitions in memory once they leave the slots, in `cache` (the plan's
    /// `partitions in memory`): loads take them from there, and an epoch's swaps put evicted
    /// ones there (see [`PartitionCache`]).
    pub fn keep_partitions(&mut self, cache: Arc<PartitionCache>) {
        self.kept = Some(cache);
    }

    /// Where partitions are kept in memory once they leave the slots (`None`: nowhere).
    pub fn kept(&self) -> Option<&Arc<PartitionCache>> {
        self.kept.as_ref()
    }

    /// Makes `p` resident in `slot`, its region filled by `fill` (`layout.region_bytes(p)`
    /// bytes), e.g. streamed from the rank that owns it.
    pub fn load_with(
        &mut self,
        slot: usize,
        p: u32,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let slot = self.slot_for(slot, p);
        self.resident[slot] = None;
        let bytes = self.layout.region_bytes(p) as usize;
        let buf = self.slots[slot].as_mut().expect("slot present");
        fill(&mut buf.full_mut()[..bytes])?;
        self.resident[slot] = Some(p);
        if self.layout.is_pinned(p) {
            self.refresh_view();
        }
        Ok(())
    }

    /// Writes every resident partition to `to`; the slots keep them.
    pub fn flush(&mut self, to: &TableFile) -> Result<()> {
        for slot in 0..self.slots.len() {
            if let (Some(p), Some(buf)) = (self.resident[slot], self.slots[slot].as_mut()) {
                to.write_partition(&self.engine, &self.layout, p, buf)?;
            }
        }
        // Training changed the features the pinned entity view is computed from.
        self.refresh_view();
        Ok(())
    }

    /// Each resident slot's bytes (its whole capacity) with its partition, once the pinned
    /// entity view is refreshed as [`flush`](Self::flush) refreshes it: what an epoch written
    /// behind copies instead of flushing.
    pub fn trained_slots(&mut self) -> impl Iterator<Item = (u32, &[u8])> {
        self.refresh_view();
        self.slots
            .iter()
            .zip(&self.resident)
            .filter_map(|(buf, p)| {
                let buf = buf.as_ref()?;
                Some(((*p)?, buf.prefix(buf.capacity())))
            })
    }

    /// Writes resident partition `p` to `to`.
    pub fn write(&mut self, p: u32, to: &TableFile) -> Result<()> {
        let slot = self.slot_of(p).expect("partition resident");
        let buf = self.slots[slot].as_mut().expect("slot present");
        to.write_partition(&self.engine, &self.layout, p, buf)
    }

    /// Takes the buffer of the slot holding `p` out for a swap.
    pub fn take(&mut self, p: u32) -> (usize, AlignedBuf) {
        let slot = self.slot_of(p).expect("the evicted partition is resident");
        self.resident[slot] = None;
        (slot, self.slots[slot].take().expect("slot present"))
    }

    /// Takes the buffer of a slot holding no partition out, to be filled elsewhere.
    pub fn take_free(&mut self) -> Option<(usize, AlignedBuf)> {
        let slot =
            (0..self.capacity).find(|&s| self.resident[s].is_none() && self.slots[s].is_some())?;
        Some((slot, self.slots[slot].take().expect("slot present")))
    }

    /// Puts a buffer back into `slot`, holding no partition (its partition was written back).
    pub fn put_free(&mut self, slot: usize, buf: AlignedBuf) {
        self.slots[slot] = Some(buf);
        self.resident[slot] = None;
    }

    /// Puts a swapped buffer back, now holding partition `p`.
    pub fn put(&mut self, slot: usize, buf: AlignedBuf, p: u32) {
        self.slots[slot] = Some(buf);
        self.resident[slot] = Some(p);
    }

    /// Embedding rows (`rows x dim`, row-major, in the table's dtype) of resident partition `p`
    /// (of the pinned region: its entity view, featurized entities as the means of their
    /// features, in float32).
    pub fn embeddings(&self, p: u32) -> Rows<'_> {
        if self.bags.is_some() && self.layout.is_pinned(p) {
            return Rows::F32(&self.view);
        }
        let slot = self.slot_of(p).expect("partition resident");
        self.embedding_rows(p, self.slots[slot].as_ref().expect("slot present"))
    }

    /// `f` of the embedding rows of partition `p` kept in memory outside the slots (as
    /// [`embeddings`](Self::embeddings) gives a resident one's), the buffer left kept; `None`
    /// when `p` is not kept.
    pub fn with_kept_embeddings<R>(&self, p: u32, f: impl FnOnce(Rows<'_>) -> R) -> Option<R> {
        self.kept
            .as_ref()?
            .peek(p, |buf| f(self.embedding_rows(p, buf)))
    }

    /// The embedding rows of partition `p` in `buf`, a buffer holding its region.
    fn embedding_rows<'a>(&self, p: u32, buf: &'a AlignedBuf) -> Rows<'a> {
        let region = self.layout.region(p);
        Rows::of(
            buf.prefix(region.part_bytes() as usize),
            region.dtype,
            region.emb_floats(),
        )
    }

    /// Mutable views of every resident partition, as `(partition, rows)` sorted by partition
    /// (so that what is drawn from them does not depend on which slot holds what).
    pub fn rows_mut(&mut self) -> Vec<(u32, SharedRows<'_>)> {
        let layout = self.layout;
        let mut rows: Vec<(u32, SharedRows<'_>)> = self
            .slots
            .iter_mut()
            .zip(&self.resident)
            .filter_map(|(buf, p)| Some(((*p)?, rows_of(buf.as_mut()?, &layout, (*p)?))))
            .collect();
        rows.sort_unstable_by_key(|(p, _)| *p);
        rows
    }

    /// Calls `f(p, embeddings)` for each partition in `parts`: the resident ones first, then
    /// the others read from `from` one at a time into the slots in turn (whatever they held
    /// is dropped: slots always mirror a table file, so nothing is lost).
    pub fn visit(
        &mut self,
        parts: &[u32],
        from: &TableFile,
        f: impl FnMut(u32, Rows<'_>) -> Result<()>,
    ) -> Result<()> {
        self.visit_with(parts, &mut |b, slot, p| b.load(slot, p, from), f)
    }

    /// [`visit`](Self::visit) with the partitions that are not resident brought in by `load`
    /// (from another rank in owner mode, see `owner::load_from_owners`).
    pub fn visit_with(
        &mut self,
        parts: &[u32],
        load: &mut Load<'_>,
        mut f: impl FnMut(u32, Rows<'_>) -> Result<()>,
    ) -> Result<()> {
        let (resident, missing): (Vec<u32>, Vec<u32>) =
            parts.iter().partition(|&&p| self.slot_of(p).is_some());
        for p in resident {
            f(p, self.embeddings(p))?;
        }
        for (k, p) in missing.into_iter().enumerate() {
            load(self, k % self.capacity.max(1), p)?;
            f(p, self.embeddings(p))?;
        }
        Ok(())
    }

    /// Fills partition `p` of `to` with reals drawn from `(draw, seed)` on `threads` threads
    /// (see [`crate::storage::table::init_partition`]), through slot 0, which is left holding `p`.
    pub fn init(
        &mut self,
        to: &TableFile,
        p: u32,
        used_rows: u64,
        draw: (RealDraw, u64),
        threads: usize,
    ) -> Result<()> {
        let slot = self.slot_for(0, p);
        self.resident[slot] = None;
        let buf = self.slots[slot].as_mut().expect("slot present");
        crate::storage::table::init_partition(&self.layout, p, used_rows, draw, threads, buf);
        to.write_partition(&self.engine, &self.layout, p, buf)?;
        self.resident[slot] = Some(p);
        if self.layout.is_pinned(p) {
            self.refresh_view();
        }
        Ok(())
    }
}

/// A partition buffer's embedding rows and optimizer state (of region `p`) as shared rows.
fn rows_of<'a>(buf: &'a mut AlignedBuf, layout: &TableLayout, p: u32) -> SharedRows<'a> {
    let region = layout.region(p);
    let full = buf.full_mut();
    let span = full.len();
    SharedRows::region(&mut full[..region.part_bytes() as usize], &region).with_span(span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OptimizerKind, TableDtype};
    use crate::storage::entity_types::tests::ty;
    use crate::storage::partitioning::Partitioning;

    #[test]
    fn a_full_buffer_still_takes_the_pinned_region_into_its_own_slot() {
        let dir = tempfile::tempdir().unwrap();
        let types = vec![ty("person", 0, 40, true), ty("genre", 40, 4, false)];
        let p = Partitioning::typed(types, 2, 3).unwrap();
        let layout = TableLayout::new(&p, 4, OptimizerKind::Adagrad, TableDtype::F32);
        let engine = Engine::shared();
        let file = TableFile::open(&engine, &dir.path().join("t.bin"), true).unwrap();
        for keep in [false, true] {
            let mut buffer = PartitionBuffer::new(engine.clone(), layout, 2);
            if keep {
                buffer.keep_partitions(Default::default());
            }
            fill_typed(&mut buffer, &p, &file);
        }
    }

    fn fill_typed(buffer: &mut PartitionBuffer, p: &Partitioning, file: &TableFile) {
        for region in p.regions() {
            let rows = p.stored_rows(region);
            buffer
                .init(file, region, rows, (RealDraw::Normal(0.1), 1), 0)
                .unwrap();
        }
        // As after the table file changed under the buffer (a run seeded by init_from): the
        // state takes both partition slots, and the pinned region comes back into its own.
        buffer.clear();
        buffer.fill(&[0, 1], file).unwrap();
        let mut resident: Vec<u32> = buffer.resident().collect();
        resident.sort();
        assert_eq!(resident, vec![0, 1]);
        assert_eq!(
            buffer.slot_of(2),
            Some(2),
            "the pinned region in its own slot"
        );
    }

    /// With partitions kept, a load replaces its slot's partition by moving buffers: the
    /// replaced one is kept, and loading it again reads nothing from the SSD.
    #[test]
    fn a_kept_partition_loads_from_memory_and_the_one_it_replaces_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partitioning::new(64, 4, 3).unwrap();
        let layout = TableLayout::new(&p, 4, OptimizerKind::Adagrad, TableDtype::F32);
        let engine = Engine::new(&strata_io::EngineConfig::default()).unwrap();
        let file = TableFile::open(&engine, &dir.path().join("t.bin"), true).unwrap();
        let mut buffer = PartitionBuffer::new(engine.clone(), layout, 2);
        buffer.keep_partitions(Default::default());
        for region in p.regions() {
            let rows = p.stored_rows(region);
            buffer
                .init(&file, region, rows, (RealDraw::Normal(0.1), 1), 0)
                .unwrap();
        }
        buffer.clear();
        buffer.fill(&[0, 1], &file).unwrap();
        let rows = |b: &PartitionBuffer| match b.embeddings(0) {
            Rows::F32(r) => r.to_vec(),
            Rows::Bf16(_) => unreachable!("a float32 table"),
        };
        let zero = rows(&buffer);
        buffer.fill(&[1, 2], &file).unwrap();
        assert_eq!(buffer.slot_of(0), None);
        let before = engine.stats();
        buffer.fill(&[0, 2], &file).unwrap();
        assert_eq!(
            engine.stats().since(&before).read_bytes,
            0,
            "0 came from memory"
        );
        assert_eq!(rows(&buffer), zero);
        assert!(buffer.kept().unwrap().take(1).is_some(), "1 kept in turn");
    }

    /// Evaluating another checkpoint clears the buffer, reads that checkpoint's file through
    /// it, and clears it again: with partitions kept, each load reads the file it is given,
    /// never a partition kept from the other.
    #[test]
    fn a_cleared_buffer_reads_the_file_it_is_given_not_what_it_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partitioning::new(64, 4, 3).unwrap();
        let layout = TableLayout::new(&p, 4, OptimizerKind::Adagrad, TableDtype::F32);
        let engine = Engine::shared();
        // Table `a`'s partition q holds bytes q + 1, table `b`'s q + 11.
        let file = |name: &str, base: u8| {
            let f = TableFile::open(&engine, &dir.path().join(name), true).unwrap();
            for q in 0..4u32 {
                let mut buf = AlignedBuf::new(layout.part_bytes() as usize);
                buf.full_mut().fill(base + q as u8);
                f.write_partition(&engine, &layout, q, &mut buf).unwrap();
            }
            f
        };
        let (a, b) = (file("a.bin", 1), file("b.bin", 11));
        let mut buffer = PartitionBuffer::new(engine.clone(), layout, 2);
        buffer.keep_partitions(Default::default());
        let first_bytes = |buffer: &mut PartitionBuffer| -> Vec<(u32, u8)> {
            let mut v: Vec<_> = buffer
                .trained_slots()
                .map(|(q, bytes)| (q, bytes[0]))
                .collect();
            v.sort();
            v
        };
        buffer.fill(&[0, 1], &a).unwrap();
        buffer.fill(&[2, 3], &a).unwrap(); // 0 and 1 kept
        buffer.clear();
        buffer.fill(&[0, 1], &b).unwrap();
        assert_eq!(first_bytes(&mut buffer), vec![(0, 11), (1, 12)]);
        buffer.fill(&[2, 3], &b).unwrap(); // b's 0 and 1 kept
        buffer.clear();
        buffer.fill(&[0, 1], &a).unwrap();
        assert_eq!(first_bytes(&mut buffer), vec![(0, 1), (1, 2)]);
    }
}
