//! Publishing a directory atomically and durably, recognising unfinished ones, and the
//! test-only fault points that kill the process at a named step.
//!
//! Every output directory Strata writes (a store, a grid) is built as `NAME.partial-PID` beside
//! its destination and published by [`publish_dir`]: its files and the directory are fsynced,
//! the parent is fsynced, the directory is renamed (or exchanged with the old one), and the
//! parent is fsynced again. Readers refuse any directory whose name [`is_partial`] matches, so a
//! kill at any moment leaves either the old output, the new one, or nothing that opens.
//!
//! Fault points: when the environment variable `STRATA_FAULT` names a point (for example
//! `store.before_rename`), [`fault_point`] sends the process `SIGKILL` there, as `kill -9` at
//! exactly that step would; `NAME@N` waits for the point's `N`th visit (a later epoch's
//! checkpoint, say). In a group launched by torchrun every rank sees the same environment:
//! `rankR:NAME[@N]` arms the point only in the process whose `RANK` is `R`, and no point fires
//! in a group torchrun restarted (`TORCHELASTIC_RESTART_COUNT` above 0), so one fault kills one
//! attempt and the restarted group runs through. Unset, a fault point costs one load of a
//! cached value. The crash tests use it; nothing else should set it.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::error::{IoError, Result};

/// Environment variable naming the fault point at which the process kills itself.
pub const FAULT_ENV: &str = "STRATA_FAULT";

/// The armed point and visit, if `STRATA_FAULT` arms one in this process (read once).
fn armed() -> Option<&'static (String, u64)> {
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let env = |name| std::env::var(name).ok().filter(|s: &String| !s.is_empty());
            parse_fault(
                &env(FAULT_ENV)?,
                env("RANK").as_deref(),
                env("TORCHELASTIC_RESTART_COUNT").as_deref(),
            )
        })
        .as_ref()
}

/// The point and visit that `spec` (`[rankR:]NAME[@N]`) arms in a process of torchrun rank
/// `rank` in restart `restart` (both absent outside torchrun), if any.
fn parse_fault(spec: &str, rank: Option<&str>, restart: Option<&str>) -> Option<(String, u64)> {
    if restart.is_some_and(|r| r != "0") {
        return None;
    }
    let spec = match spec.strip_prefix("rank").and_then(|s| s.split_once(':')) {
        Some((r, rest)) if Some(r) == rank => rest,
        Some(_) => return None,
        None => spec,
    };
    Some(match spec.rsplit_once('@') {
        Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
        None => (spec.to_string(), 1),
    })
}

/// Whether a fault point is armed in this process: callers that build a point's name (with an
/// epoch in it, say) check this first, so that an unarmed run builds no names.
pub fn fault_armed() -> bool {
    armed().is_some()
}

/// Kills the process with `SIGKILL` at the visit of `point` that `STRATA_FAULT` names
/// (`point`, the first visit, or `point@N`, the `N`th); otherwise does nothing.
pub fn fault_point(point: &str) {
    static VISITS: AtomicU64 = AtomicU64::new(0);
    let Some((name, nth)) = armed() else {
        return;
    };
    if name == point && VISITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
        // SAFETY: sending a signal to our own process has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Whether `path` names an unfinished output directory: its name (or, for `.` and the like,
/// its canonical name) ends in `.partial-` and digits.
pub fn is_partial(path: &Path) -> bool {
    let partial_name = |p: &Path| {
        p.file_name().is_some_and(|n| {
            let n = n.as_bytes();
            let Some(at) = n.windows(9).rposition(|w| w == b".partial-") else {
                return false;
            };
            let digits = &n[at + 9..];
            !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
        })
    };
    partial_name(path) || path.canonicalize().is_ok_and(|p| partial_name(&p))
}

/// Whether the file name `name` is a temporary file of [`replace_file_by`]
/// (`.NAME.tmp-PID-CALL`) whose process no longer runs: one killed between writing the file and
/// renaming it. Such a file is never renamed and is safe to remove; a live process's (this
/// one's included) is not matched.
pub fn is_orphan_temp(name: &str) -> bool {
    let Some((_, tail)) = name.strip_prefix('.').and_then(|n| n.rsplit_once(".tmp-")) else {
        return false;
    };
    let Some((pid, call)) = tail.split_once('-') else {
        return false;
    };
    let (Ok(pid), true) = (
        pid.parse::<libc::pid_t>(),
        !call.is_empty() && call.bytes().all(|b| b.is_ascii_digit()),
    ) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    pid > 0 && !alive
}

/// Flushes a directory's entries (files created or renamed in it) to the device.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| IoError::os("fsync", dir, 0, e))
}

/// Takes an exclusive `flock` on the directory `dir`, held while the returned handle is open;
/// None when another open handle (of this process or another) holds it. The kernel drops the
/// lock with the last descriptor, so a killed holder never leaves it behind.
pub fn lock_dir(dir: &Path) -> std::io::Result<Option<File>> {
    let handle = File::open(dir)?;
    // SAFETY: flock on a descriptor we own; it touches no memory.
    if unsafe { libc::flock(handle.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(handle));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        true => Ok(None),
        false => Err(e),
    }
}

/// Replaces the file `path` with `bytes` so that a reader sees the old contents or the new ones,
/// never a mix, and a crash leaves one or the other ([`replace_file_with`]).
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_file_with(path, |f| f.write_all(bytes))
}

/// Replaces the file `path` with what `write` writes (through a buffer, so a large file can be
/// streamed), as [`replace_file_by`] does; the bytes go to a file created new (never written
/// through a file someone else is using) and fsynced. The OS error is returned as it is
/// (callers tell "not ours to write" from a fault); a path that names no file is
/// `InvalidInput`.
pub fn replace_file_with(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    replace_file_by(
        path,
        |tmp| {
            let f = OpenOptions::new().write(true).create_new(true).open(tmp)?;
            let mut f = BufWriter::new(f);
            write(&mut f)?;
            f.into_inner().map_err(|e| e.into_error())?.sync_all()
        },
        || {},
    )
}

/// Replaces the file `path` with the file `write` creates at the temporary path it is handed
/// (with its own writer: an `NpyWriter`, a buffered file), so that a reader sees the old
/// contents or the new ones, never a mix, and a crash leaves one or the other. The steps, in
/// this order: `write` fills a new file beside `path` (a rename is atomic only within one file
/// system), named for this process and call so that processes and threads sharing a directory
/// may replace the same file at once; the file is fsynced; `before_rename` runs (a caller's
/// fault point: the new contents are durable but not yet in place); the file is renamed over
/// `path`; the directory is fsynced so the rename survives a crash. On failure the temporary
/// file is removed and the error returned: `write`'s own, or an [`IoError`] naming the step
/// and the file.
pub fn replace_file_by<E: From<IoError>>(
    path: &Path,
    write: impl FnOnce(&Path) -> std::result::Result<(), E>,
    before_rename: impl FnOnce(),
) -> std::result::Result<(), E> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| IoError::Invalid(format!("{} does not name a file", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(tmp_name);
    let written = write(&tmp).and_then(|()| {
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| E::from(os_error("fsync", &tmp, e)))?;
        before_rename();
        std::fs::rename(&tmp, path).map_err(|e| E::from(os_error("rename", path, e)))
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok(sync_dir(dir)?)
}

/// `source` as it came (not turned into [`IoError::DiskFull`]), so that `std::io` callers get
/// their OS error back unchanged.
fn os_error(op: &'static str, path: &Path, source: std::io::Error) -> IoError {
    IoError::Os {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Fsyncs every regular file directly inside `dir`, then `dir` itself.
pub fn sync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| IoError::os("list", dir, 0, e))? {
        let entry = entry.map_err(|e| IoError::os("list", dir, 0, e))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| IoError::os("stat", &path, 0, e))?;
        if kind.is_file() {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| IoError::os("fsync", &path, 0, e))?;
        }
    }
    sync_dir(dir)
}

/// Publishes the finished directory `tmp` (beside `out`, in the same parent) as `out`: fsyncs
/// `tmp`'s files, `tmp` and the parent; renames `tmp` to `out`, or, when `out` exists, swaps the
/// two atomically and removes the old one; then fsyncs the parent again. `what` names the fault
/// points `{what}.before_rename` and `{what}.after_rename`.
pub fn publish_dir(tmp: &Path, out: &Path, what: &str) -> Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    sync_tree(tmp)?;
    sync_dir(parent)?;
    fault_point(&format!("{what}.before_rename"));
    if out.exists() {
        exchange(tmp, out)?;
        // `tmp` now holds the old directory.
        std::fs::remove_dir_all(tmp).map_err(|e| IoError::os("remove", tmp, 0, e))?;
    } else {
        std::fs::rename(tmp, out).map_err(|e| IoError::os("rename", out, 0, e))?;
    }
    fault_point(&format!("{what}.after_rename"));
    sync_dir(parent)
}

/// Atomically swaps two directory entries (Linux `renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> Result<()> {
    let cstr = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| IoError::Invalid(format!("path {} contains a NUL byte", p.display())))
    };
    let (ca, cb) = (cstr(a)?, cstr(b)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them relative to the cwd.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc != 0 {
        return Err(IoError::os("rename", b, 0, std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_names() {
        assert!(is_partial(Path::new("/x/g.strata.partial-123")));
        assert!(is_partial(Path::new("g.partial-7/")));
        assert!(is_partial(Path::new(".n10-seed1.partial-42")));
        assert!(!is_partial(Path::new("/x/g.strata")));
        assert!(!is_partial(Path::new("/x/g.partial-")));
        assert!(!is_partial(Path::new("/x/g.partial-12a")));
        assert!(!is_partial(Path::new("/x/partial-12")));
    }

    #[test]
    fn a_dot_inside_a_partial_directory_is_partial() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("s.partial-5");
        std::fs::create_dir(&dir).unwrap();
        assert!(is_partial(&dir.join(".")));
        assert!(is_partial(&dir.join("..").join("s.partial-5")));
    }

    #[test]
    fn fault_specs_arm_one_rank_of_the_first_attempt() {
        let armed = |spec, rank, restart| parse_fault(spec, rank, restart);
        let point = |name: &str, n| Some((name.to_string(), n));
        assert_eq!(
            armed("embed.committed", None, None),
            point("embed.committed", 1)
        );
        assert_eq!(
            armed("embed.committed@3", Some("1"), Some("0")),
            point("embed.committed", 3)
        );
        assert_eq!(
            armed("rank1:embed.x@2", Some("1"), Some("0")),
            point("embed.x", 2)
        );
        assert_eq!(armed("rank1:embed.x@2", Some("0"), Some("0")), None);
        assert_eq!(armed("rank1:embed.x@2", None, None), None);
        assert_eq!(armed("rank1:embed.x@2", Some("1"), Some("1")), None);
        assert_eq!(armed("embed.committed", None, Some("2")), None);
    }

    #[test]
    fn orphan_temporaries_are_those_of_dead_processes() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        assert!(is_orphan_temp(&format!(".run.json.tmp-{dead}-0")));
        assert!(is_orphan_temp(&format!(".table-0.bin.tmp-{dead}-17")));
        assert!(!is_orphan_temp(&format!(".run.json.tmp-{me}-0")));
        assert!(!is_orphan_temp(&format!("run.json.tmp-{dead}-0")));
        assert!(!is_orphan_temp(&format!(".run.json.tmp-{dead}-")));
        assert!(!is_orphan_temp(&format!(".run.json.tmp-{dead}-x")));
        assert!(!is_orphan_temp(".run.json.tmp--3-0"));
        assert!(!is_orphan_temp(".run.json"));
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replace_file_creates_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace_file(&path, b"first").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        replace_file(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        replace_file(&path, b"").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        replace_file_with(&path, |f| {
            (0..3).try_for_each(|i| f.write_all(format!("{i}").as_bytes()))
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"012");
        // No temporary file is left behind.
        assert_eq!(names(dir.path()), ["state.json"]);
    }

    #[test]
    fn a_failed_replacement_keeps_the_old_contents_and_no_litter() {
        let dir = tempfile::tempdir().unwrap();
        // A rename cannot replace a non-empty directory: the last step fails.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"old").unwrap();
        assert!(replace_file(&path, b"new").is_err());
        assert_eq!(std::fs::read(path.join("inside")).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["taken"]);
        // A writer's error is returned, and its partial file removed.
        let file = dir.path().join("file");
        replace_file(&file, b"kept").unwrap();
        let e = replace_file_with(&file, |f| {
            f.write_all(b"half")?;
            Err(std::io::Error::other("the writer failed"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "the writer failed");
        assert_eq!(std::fs::read(&file).unwrap(), b"kept");
        assert_eq!(names(dir.path()), ["file", "taken"]);
        // A missing directory fails at the first step.
        let e = replace_file(&dir.path().join("no/such/file"), b"x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn the_new_file_is_complete_and_the_old_in_place_until_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.npy");
        replace_file(&path, b"old").unwrap();
        let mut before = None;
        replace_file_by::<IoError>(
            &path,
            |tmp| std::fs::write(tmp, b"new, complete").map_err(|e| os_error("write", tmp, e)),
            || {
                // Between the fsync and the rename: the new bytes sit whole in the temporary
                // file beside `path`, and readers of `path` still see the old ones.
                let names = names(dir.path());
                let tmp = names
                    .iter()
                    .find(|n| n.starts_with(".results.npy.tmp-"))
                    .unwrap();
                before = Some((
                    std::fs::read(&path).unwrap(),
                    std::fs::read(dir.path().join(tmp)).unwrap(),
                ));
            },
        )
        .unwrap();
        let (old, staged) = before.expect("before_rename runs");
        assert_eq!(
            (old.as_slice(), staged.as_slice()),
            (&b"old"[..], &b"new, complete"[..])
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"new, complete");
        assert_eq!(names(dir.path()), ["results.npy"]);
        // A writer that fails never reaches the rename: no hook, old contents, no litter.
        let mut hooked = false;
        let e = replace_file_by::<IoError>(
            &path,
            |tmp| {
                std::fs::write(tmp, b"half").unwrap();
                Err(IoError::Invalid("the writer failed".into()))
            },
            || hooked = true,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "invalid I/O request: the writer failed");
        assert!(!hooked);
        assert_eq!(std::fs::read(&path).unwrap(), b"new, complete");
        assert_eq!(names(dir.path()), ["results.npy"]);
    }

    #[test]
    fn a_path_that_names_no_file_is_refused() {
        let e = replace_file(Path::new("/"), b"x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("does not name a file"), "{e}");
    }

    #[test]
    fn publish_renames_or_swaps() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("g");
        for (i, content) in ["first", "second"].into_iter().enumerate() {
            let tmp = root.path().join(format!("g.partial-{i}"));
            std::fs::create_dir(&tmp).unwrap();
            std::fs::write(tmp.join("f"), content).unwrap();
            publish_dir(&tmp, &out, "test").unwrap();
            assert!(!tmp.exists());
            assert_eq!(std::fs::read_to_string(out.join("f")).unwrap(), content);
        }
    }
}
