//! Writing an epoch's table behind the job. When the whole table is resident and the budget
//! holds a second copy of it (the plan's write-behind copy), an epoch that swapped nothing ends
//! by copying its slots; the job writes that copy to the epoch's table file and syncs it on a
//! thread of its own while it saves the relations and validates, and commits the epoch only
//! once the copy is synced. The write-back (about as long as a small table's whole epoch on a
//! GPU) then overlaps validation instead of ending the epoch, and a crash still never leaves
//! `run.json` naming a table that was not synced.

use std::sync::Arc;
use std::time::Instant;

use strata_io::{AlignedBuf, Engine};

use crate::error::Result;
use crate::storage::layout::TableLayout;
use crate::storage::table::TableFile;

/// The copy of an epoch's resident partitions, waiting to be written to the epoch's table.
pub(crate) struct WriteBehind {
    parts: Vec<(u32, AlignedBuf)>,
    engine: Arc<Engine>,
    layout: TableLayout,
    /// The epoch's timeline origin and its last buffer state, for the write's interval.
    pub(crate) origin: Instant,
    pub(crate) step: usize,
}

/// A finished write: the copy's buffers (for the next epoch's copy) and how it went.
pub(crate) struct Written {
    pub(crate) buffers: Vec<AlignedBuf>,
    pub(crate) result: Result<()>,
    pub(crate) bytes: u64,
    pub(crate) started: Instant,
    pub(crate) finished: Instant,
}

impl WriteBehind {
    /// Copies each `(partition, slot bytes)` of `resident` into one of `spare` (the last
    /// epoch's copy, reused when its sizes match; allocated otherwise). Each copy holds the
    /// partition's region of `layout` (its first `region_bytes` bytes).
    pub(crate) fn copy<'a>(
        resident: impl Iterator<Item = (u32, &'a [u8])>,
        mut spare: Vec<AlignedBuf>,
        engine: Arc<Engine>,
        layout: TableLayout,
        origin: Instant,
        step: usize,
    ) -> WriteBehind {
        let parts = resident
            .map(|(p, bytes)| {
                let n = layout.region_bytes(p) as usize;
                let at = spare.iter().position(|b| b.capacity() == bytes.len());
                let mut buf =
                    at.map_or_else(|| AlignedBuf::new(bytes.len()), |i| spare.swap_remove(i));
                buf.full_mut()[..n].copy_from_slice(&bytes[..n]);
                (p, buf)
            })
            .collect();
        WriteBehind {
            parts,
            engine,
            layout,
            origin,
            step,
        }
    }

    /// Writes the copy to `to` and syncs it (meant for a thread of its own). The fault point
    /// `embed.written_behind` lies between the write and the sync.
    pub(crate) fn write(mut self, to: &TableFile) -> Written {
        let started = Instant::now();
        let mut bytes = 0;
        let result = self
            .parts
            .iter_mut()
            .try_for_each(|(p, buf)| {
                bytes += self.layout.region_bytes(*p);
                to.write_partition(&self.engine, &self.layout, *p, buf)
            })
            .and_then(|()| {
                strata_io::durable::fault_point("embed.written_behind");
                to.sync()
            });
        Written {
            buffers: self.parts.into_iter().map(|(_, b)| b).collect(),
            result,
            bytes,
            started,
            finished: Instant::now(),
        }
    }
}
