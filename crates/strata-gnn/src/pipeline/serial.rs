//! Serial mode (`pipeline = false`, Helios's NoPipe ablation): every stage in turn on the
//! caller's thread, inside [`Iterator::next`].

use crate::error::Result;

use super::batch::Batch;
use super::stages::{
    sample_batch, submit_merged, Assembler, Front, FrontConfig, ReadDone, SampleSource, Sampled,
    Stages, Work,
};

/// Samples on the caller's thread.
struct InlineSource {
    st: Stages,
    next: usize,
}

impl SampleSource for InlineSource {
    fn next_sampled(&mut self) -> Option<Result<Sampled>> {
        if self.next == self.st.plan.num_batches {
            return None;
        }
        let b = self.next;
        self.next += 1;
        Some(sample_batch(&self.st, b))
    }

    fn cancelled(&self) -> bool {
        false
    }
}

/// Every stage in turn on the caller's thread.
pub(super) struct Serial {
    st: Stages,
    front: Front<InlineSource>,
    assembler: Assembler,
    /// The read whose batches are being handed out.
    current: Option<ReadDone>,
    done: bool,
}

impl Serial {
    pub(super) fn new(st: Stages, cfg: FrontConfig) -> Serial {
        let source = InlineSource {
            st: st.clone(),
            next: 0,
        };
        Serial {
            front: Front::new(source, &st, cfg),
            assembler: Assembler::new(&st),
            st,
            current: None,
            done: false,
        }
    }

    pub(super) fn next(&mut self) -> Option<Result<Batch>> {
        loop {
            if let Some(read) = &mut self.current {
                match self.assembler.next_batch(read) {
                    Some(b) => return Some(Ok(b)),
                    None => self.current = None,
                }
            }
            if self.done {
                return None;
            }
            let result = match self.front.next_work() {
                None => {
                    self.done = true;
                    continue;
                }
                Some(Work::Fail(e)) => Err(e),
                Some(Work::Read(merged)) => {
                    submit_merged(&self.st, merged).and_then(|read| read.complete(&self.st, || {}))
                }
            };
            match result {
                Ok(done) => self.current = Some(done),
                Err(e) => {
                    // The failed read's batches were dropped with it; the window's go now.
                    self.front.abandon();
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
