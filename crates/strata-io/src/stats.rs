//! I/O counters: operations, bytes, a latency histogram and in-flight depth, updated with
//! atomics on the hot path and read as consistent-enough snapshots.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

/// Sub-buckets per power of two in the latency histogram: values are kept to within 1/16
/// (6%) of their true value, plenty for percentiles of I/O latency.
const SUB: usize = 16;
const BUCKETS: usize = 64 * SUB;

/// A log-linear histogram of nanosecond values.
pub struct Histogram {
    counts: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros() as usize; // >= 4
    let mantissa = (ns >> (exp - 4)) as usize & (SUB - 1);
    (exp - 3) * SUB + mantissa
}

/// The smallest value that falls in `bucket` (its lower edge).
fn bucket_floor(bucket: usize) -> u64 {
    if bucket < SUB {
        return bucket as u64;
    }
    let exp = bucket / SUB + 3;
    let mantissa = (bucket % SUB) as u64;
    (SUB as u64 + mantissa) << (exp - 4)
}

impl Histogram {
    pub fn record(&self, ns: u64) {
        self.counts[bucket_of(ns)].fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Relaxed)).collect()
    }
}

/// Nearest-rank percentile `q` (0..1) of histogram counts, in nanoseconds (bucket midpoint).
fn percentile(counts: &[u64], q: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let target = ((q * total as f64).ceil() as u64).max(1);
    let mut cum = 0;
    for (b, &c) in counts.iter().enumerate() {
        cum += c;
        if cum >= target {
            let lo = bucket_floor(b) as f64;
            let hi = bucket_floor(b + 1) as f64;
            return (lo + hi) / 2.0;
        }
    }
    bucket_floor(BUCKETS - 1) as f64
}

/// Live counters of one engine.
#[derive(Default)]
pub struct IoStats {
    pub(crate) read_ops: AtomicU64,
    pub(crate) write_ops: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) max_in_flight: AtomicU64,
    /// Sum over submissions of the depth each one saw, for the mean depth.
    pub(crate) depth_sum: AtomicU64,
    pub(crate) submissions: AtomicU64,
    pub(crate) latency: Histogram,
}

impl IoStats {
    /// Records a request entering flight.
    pub(crate) fn submitted(&self) {
        let depth = self.in_flight.fetch_add(1, Relaxed) + 1;
        self.max_in_flight.fetch_max(depth, Relaxed);
        self.depth_sum.fetch_add(depth, Relaxed);
        self.submissions.fetch_add(1, Relaxed);
    }

    /// Records a request leaving flight after `ns` nanoseconds, having moved `bytes`.
    pub(crate) fn completed(&self, write: bool, bytes: u64, ns: u64, ok: bool) {
        self.in_flight.fetch_sub(1, Relaxed);
        if !ok {
            self.errors.fetch_add(1, Relaxed);
            return;
        }
        let (ops, total) = if write {
            (&self.write_ops, &self.write_bytes)
        } else {
            (&self.read_ops, &self.read_bytes)
        };
        ops.fetch_add(1, Relaxed);
        total.fetch_add(bytes, Relaxed);
        self.latency.record(ns);
    }

    /// A copy of the counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            read_ops: self.read_ops.load(Relaxed),
            write_ops: self.write_ops.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            max_in_flight: self.max_in_flight.load(Relaxed),
            depth_sum: self.depth_sum.load(Relaxed),
            submissions: self.submissions.load(Relaxed),
            latency_counts: self.latency.snapshot(),
        }
    }
}

/// Counters at one moment; subtract two with [`StatsSnapshot::since`] to get an interval.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsSnapshot {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    /// Requests in flight when the snapshot was taken.
    pub in_flight: u64,
    /// Highest in-flight depth seen.
    pub max_in_flight: u64,
    depth_sum: u64,
    submissions: u64,
    latency_counts: Vec<u64>,
}

impl StatsSnapshot {
    /// What happened between `earlier` and `self` (gauges keep `self`'s values).
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            read_ops: self.read_ops - earlier.read_ops,
            write_ops: self.write_ops - earlier.write_ops,
            read_bytes: self.read_bytes - earlier.read_bytes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            errors: self.errors - earlier.errors,
            in_flight: self.in_flight,
            max_in_flight: self.max_in_flight,
            depth_sum: self.depth_sum - earlier.depth_sum,
            submissions: self.submissions - earlier.submissions,
            latency_counts: self
                .latency_counts
                .iter()
                .zip(&earlier.latency_counts)
                .map(|(a, b)| a - b)
                .collect(),
        }
    }

    /// Latency percentile `q` (0..1) in microseconds.
    pub fn latency_us(&self, q: f64) -> f64 {
        percentile(&self.latency_counts, q) / 1000.0
    }

    /// Mean in-flight depth seen by submissions.
    pub fn mean_in_flight(&self) -> f64 {
        if self.submissions == 0 {
            0.0
        } else {
            self.depth_sum as f64 / self.submissions as f64
        }
    }

    /// A serialisable summary (counts, bytes, p50/p99/p999 latency, depths).
    pub fn summary(&self) -> StatsSummary {
        StatsSummary {
            read_ops: self.read_ops,
            write_ops: self.write_ops,
            read_bytes: self.read_bytes,
            write_bytes: self.write_bytes,
            errors: self.errors,
            latency_p50_us: self.latency_us(0.5),
            latency_p99_us: self.latency_us(0.99),
            latency_p999_us: self.latency_us(0.999),
            in_flight: self.in_flight,
            max_in_flight: self.max_in_flight,
            mean_in_flight: self.mean_in_flight(),
        }
    }
}

/// The counters users read (from Rust, and as a dict from Python).
#[derive(Debug, Clone, Serialize)]
pub struct StatsSummary {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub latency_p999_us: f64,
    pub in_flight: u64,
    pub max_in_flight: u64,
    pub mean_in_flight: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_tight() {
        let mut last = 0;
        for ns in (0..100_000u64).chain([1 << 20, 123_456_789, u64::MAX / 4]) {
            let b = bucket_of(ns);
            assert!(b >= last || ns < 100_000, "non-monotone at {ns}");
            last = b;
            let (lo, hi) = (bucket_floor(b), bucket_floor(b + 1));
            assert!(lo <= ns && ns < hi, "{ns} not in [{lo}, {hi})");
            assert!((hi - lo) as f64 <= (ns.max(16) as f64) / 8.0 + 1.0);
        }
    }

    #[test]
    fn percentiles_of_known_values() {
        let s = IoStats::default();
        for us in 1..=1000u64 {
            s.submitted();
            s.completed(false, 4096, us * 1000, true);
        }
        let snap = s.snapshot();
        assert!(
            (snap.latency_us(0.5) - 500.0).abs() / 500.0 < 0.07,
            "{}",
            snap.latency_us(0.5)
        );
        assert!((snap.latency_us(0.99) - 990.0).abs() / 990.0 < 0.07);
        assert_eq!(snap.read_bytes, 4096 * 1000);
        assert_eq!(snap.in_flight, 0);
        assert_eq!(snap.max_in_flight, 1);
        let later = IoStats::default().snapshot();
        assert_eq!(later.since(&later).read_ops, 0);
    }
}
