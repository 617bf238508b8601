//! Device profiles: what `strata bench-disk` measured, saved per block device so that the
//! engines can plan queue depths and hiding conditions from measured numbers.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{IoError, Result};

/// 4 KiB random-read performance at one queue depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QdPoint {
    pub queue_depth: usize,
    pub iops: f64,
    pub mean_latency_us: f64,
    pub p50_latency_us: f64,
    pub p99_latency_us: f64,
}

/// What a device can do, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    pub format_version: u32,
    /// `MAJOR:MINOR (name)` of the block device holding the measured directory.
    pub device: String,
    /// Directory the benchmark file was in.
    pub measured_in: PathBuf,
    /// Seconds since the Unix epoch.
    pub measured_at: u64,
    /// I/O backend used (`io_uring` or `threads`).
    pub backend: String,
    /// Size of the benchmark file in bytes.
    pub file_bytes: u64,
    /// Sequential read and write bandwidth with 1 MiB requests, in MB/s (10^6 bytes).
    pub seq_read_mb_s: f64,
    pub seq_write_mb_s: f64,
    /// 4 KiB random reads by queue depth.
    pub rand_read_4k: Vec<QdPoint>,
}

/// GIDS's in-flight target (its Eqs. 2–3 solved for a fraction `p` of peak):
/// `N = p / (1 - p) * IOPS_peak * latency`, with `latency` the unloaded request latency in
/// seconds (the model's `T_i + T_t`).
pub fn gids_in_flight(p: f64, peak_iops: f64, latency_s: f64) -> f64 {
    p / (1.0 - p) * peak_iops * latency_s
}

/// Files smaller than this may be served by a cache below the file system (a virtual disk's
/// host, a controller's RAM): a profile measured on one can overstate the disk. On the 2-core
/// development machine's virtual disk a 64 MiB file wrote at 2,441 MB/s, a 4 GiB one at 1,308.
pub const TRUSTED_FILE_BYTES: u64 = 1 << 30;

impl DeviceProfile {
    /// Why the profile's rates may not be the disk's: it was measured on a file smaller than
    /// [`TRUSTED_FILE_BYTES`] (`strata demo --small` measures 64 MiB to be quick). None otherwise.
    pub fn caveat(&self) -> Option<String> {
        (self.file_bytes < TRUSTED_FILE_BYTES).then(|| {
            format!(
                "the disk profile was measured on a {} MiB file, which a cache may have served",
                self.file_bytes >> 20
            )
        })
    }

    /// Highest measured 4 KiB random-read IOPS.
    pub fn peak_iops(&self) -> f64 {
        self.rand_read_4k.iter().map(|q| q.iops).fold(0.0, f64::max)
    }

    /// Mean latency at the lowest measured queue depth, in microseconds.
    pub fn unloaded_latency_us(&self) -> f64 {
        self.rand_read_4k
            .iter()
            .min_by_key(|q| q.queue_depth)
            .map_or(0.0, |q| q.mean_latency_us)
    }

    /// Requests to keep in flight to reach fraction `p` of peak IOPS (GIDS), at least 1.
    pub fn target_in_flight(&self, p: f64) -> usize {
        gids_in_flight(p, self.peak_iops(), self.unloaded_latency_us() * 1e-6)
            .ceil()
            .max(1.0) as usize
    }

    /// The knee of the IOPS curve: the smallest measured queue depth reaching 90% of the peak
    /// (beyond it, more depth buys little throughput and only adds latency).
    pub fn knee(&self) -> usize {
        let peak = self.peak_iops();
        let mut points: Vec<&QdPoint> = self.rand_read_4k.iter().collect();
        points.sort_by_key(|q| q.queue_depth);
        points
            .iter()
            .find(|q| q.iops >= 0.9 * peak)
            .map_or(1, |q| q.queue_depth)
    }

    /// Writes the profile as JSON to `path` (creating its directory), replacing an earlier one
    /// atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| IoError::os("mkdir", parent, 0, e))?;
        }
        let text = serde_json::to_string_pretty(self).expect("a profile serialises");
        crate::durable::replace_file(path, text.as_bytes())
            .map_err(|e| IoError::os("write", path, 0, e))
    }

    /// Reads a profile written by [`DeviceProfile::save`].
    pub fn load(path: &Path) -> Result<DeviceProfile> {
        let text = std::fs::read_to_string(path).map_err(|e| IoError::os("read", path, 0, e))?;
        serde_json::from_str(&text)
            .map_err(|e| IoError::Invalid(format!("{}: not a device profile: {e}", path.display())))
    }

    /// The saved profile of the device holding `path`, if one was measured.
    pub fn for_path(path: &Path) -> Option<DeviceProfile> {
        DeviceProfile::load(&profile_path(path).ok()?).ok()
    }
}

/// A profile with the figures the engines plan from, for display and for Python.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileReport {
    #[serde(flatten)]
    pub profile: DeviceProfile,
    pub peak_iops: f64,
    pub unloaded_latency_us: f64,
    /// Smallest queue depth reaching 90% of peak IOPS.
    pub knee_queue_depth: usize,
    /// GIDS's in-flight target for 95% of peak IOPS.
    pub target_in_flight_p95: usize,
    /// [`DeviceProfile::caveat`].
    pub caveat: Option<String>,
}

impl From<DeviceProfile> for ProfileReport {
    fn from(profile: DeviceProfile) -> Self {
        ProfileReport {
            peak_iops: profile.peak_iops(),
            unloaded_latency_us: profile.unloaded_latency_us(),
            knee_queue_depth: profile.knee(),
            target_in_flight_p95: profile.target_in_flight(0.95),
            caveat: profile.caveat(),
            profile,
        }
    }
}

/// Where profiles live: `$STRATA_PROFILE_DIR`, else `$XDG_DATA_HOME/strata/devices`, else
/// `~/.local/share/strata/devices`.
pub fn profile_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STRATA_PROFILE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("strata").join("devices")
}

/// `MAJOR:MINOR` and kernel name of the block device holding `path`.
pub fn device_of(path: &Path) -> Result<(String, String)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| IoError::os("stat", path, 0, e))?;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let id = format!("{major}:{minor}");
    let name = std::fs::read_to_string(format!("/sys/dev/block/{id}/uevent"))
        .ok()
        .and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".into());
    Ok((id, name))
}

/// The profile file of the device holding `path`.
pub fn profile_path(path: &Path) -> Result<PathBuf> {
    let (id, _) = device_of(path)?;
    Ok(profile_dir().join(format!("{}.json", id.replace(':', "-"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(qd: usize, iops: f64, lat: f64) -> QdPoint {
        QdPoint {
            queue_depth: qd,
            iops,
            mean_latency_us: lat,
            p50_latency_us: lat,
            p99_latency_us: lat * 2.0,
        }
    }

    #[test]
    fn gids_model_matches_the_paper() {
        // GIDS repository defaults: 5.8 GB/s of 4 KiB pages (1.45 requests/us) and
        // l_ssd + l_system = 11 + 20 us give about 854 accesses for 95% of peak.
        let n = gids_in_flight(0.95, 5.8 * 1024.0 / 4096.0 * 1e6, 31e-6);
        assert!((n - 854.05).abs() < 0.1, "{n}");
        // The paper's Optane numbers: 1.5M IOPS and 11 + 25 + 5 us give about 1,170.
        let n = gids_in_flight(0.95, 1.5e6, 41e-6);
        assert!((n - 1168.5).abs() < 0.1, "{n}");
    }

    #[test]
    fn knee_and_target() {
        let p = DeviceProfile {
            format_version: 1,
            device: "8:0 (sda)".into(),
            measured_in: "/tmp".into(),
            measured_at: 0,
            backend: "io_uring".into(),
            file_bytes: 1 << 30,
            seq_read_mb_s: 1000.0,
            seq_write_mb_s: 900.0,
            rand_read_4k: vec![
                point(1, 15_000.0, 60.0),
                point(4, 45_000.0, 80.0),
                point(16, 70_000.0, 200.0),
                point(64, 79_000.0, 800.0),
                point(128, 80_000.0, 1600.0),
            ],
        };
        assert_eq!(p.peak_iops(), 80_000.0);
        assert_eq!(p.knee(), 64);
        // 19 * 80,000/s * 60 us = 91.2
        assert_eq!(p.target_in_flight(0.95), 92);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/p.json");
        p.save(&path).unwrap();
        assert_eq!(DeviceProfile::load(&path).unwrap(), p);
        // A 1 GiB file is trusted; a 64 MiB one gets a caveat naming its size.
        assert_eq!(p.caveat(), None);
        let small = DeviceProfile {
            file_bytes: 64 << 20,
            ..p
        };
        let why = small.caveat().unwrap();
        assert!(why.contains("measured on a 64 MiB file"), "{why}");
    }
}
