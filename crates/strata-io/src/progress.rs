//! Progress reporting of long jobs, rendered by the front end (the Python CLI draws the bar).

use std::time::{Duration, Instant};

/// Receives progress of a long job. Implementations must be cheap: [`Meter`] throttles calls
/// to a few per second.
pub trait Progress: Send + Sync {
    /// A new stage starts; totals are 0 when unknown.
    fn stage(&self, name: &str, total_bytes: u64, total_rows: u64);
    /// Cumulative rows and bytes done in the current stage. Returns `false` to cancel the job.
    fn update(&self, rows: u64, bytes: u64) -> bool;
    /// A line for the user (the budget plan, a warning).
    fn message(&self, text: &str);
    /// Stage-specific figures shown beside the bar until the stage ends (loads, I/O rates).
    fn detail(&self, _text: &str) {}
}

/// Discards all progress.
pub struct NoProgress;

impl Progress for NoProgress {
    fn stage(&self, _: &str, _: u64, _: u64) {}
    fn update(&self, _: u64, _: u64) -> bool {
        true
    }
    fn message(&self, _: &str) {}
}

/// The user asked to stop (a progress callback returned `false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cancelled")]
pub struct Cancelled;

/// Counts the work of one stage and forwards it to a [`Progress`] at most every 100 ms.
pub struct Meter<'a> {
    progress: &'a dyn Progress,
    rows: u64,
    bytes: u64,
    last: Instant,
}

const EVERY: Duration = Duration::from_millis(100);

impl<'a> Meter<'a> {
    /// Starts stage `name` with the given totals (0 when unknown).
    pub fn new(progress: &'a dyn Progress, name: &str, total_bytes: u64, total_rows: u64) -> Self {
        progress.stage(name, total_bytes, total_rows);
        Meter {
            progress,
            rows: 0,
            bytes: 0,
            last: Instant::now(),
        }
    }

    /// Adds work done; fails with [`Cancelled`] when the user asked to stop.
    pub fn add(&mut self, rows: u64, bytes: u64) -> Result<(), Cancelled> {
        self.rows += rows;
        self.bytes += bytes;
        if self.last.elapsed() >= EVERY {
            self.last = Instant::now();
            if !self.progress.update(self.rows, self.bytes) {
                return Err(Cancelled);
            }
        }
        Ok(())
    }

    /// Rows counted so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes counted so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reports the final counts.
    pub fn finish(self) -> Result<(), Cancelled> {
        if !self.progress.update(self.rows, self.bytes) {
            return Err(Cancelled);
        }
        Ok(())
    }
}
