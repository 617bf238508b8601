//! A write-ahead log with group commit.
//!
//! Mutations are appended here, and made durable, before they are acknowledged; after a crash
//! the log is replayed on top of the last checkpoint. The log is a directory of segment files
//! `wal-{first_lsn:020}.log`, each a sequence of records
//!
//! ```text
//! [payload_len: u32 LE][crc32: u32 LE over lsn bytes + payload][lsn: u64 LE][payload]
//! ```
//!
//! numbered by a log sequence number (lsn) that starts at 1 and grows by 1 per record, across
//! segments. Appends go to the last segment; [`Wal::rotate`] closes it and starts another, so
//! that once a checkpoint covers a closed segment [`Wal::drop_through`] can delete it.
//!
//! Durability: every [`Wal::append`] is one write and one `fdatasync` for its whole batch (group
//! commit), and every segment created or deleted is followed by an fsync of the directory. A
//! crash in the middle of an append can only damage the end of the last segment, so [`Wal::open`]
//! cuts a damaged tail there; damage anywhere else means acknowledged records were lost, and
//! opening fails rather than silently replay less.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::durable;
use crate::error::{Result, ServeError};

/// Largest payload of one record, in bytes (256 MiB). It bounds what a corrupt length field can
/// make replay allocate, and no mutation the service accepts comes near it.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// Bytes of a record before its payload: length, checksum, lsn.
const HEADER_BYTES: usize = 16;

/// A write-ahead log open for appending (see the module documentation). Holds an exclusive
/// lock on its directory, so a second `Wal` on the same directory, in this process or another,
/// fails to open instead of interleaving records.
pub struct Wal {
    dir: PathBuf,
    /// Closed segments, oldest first.
    closed: Vec<Segment>,
    /// The segment appends go to; its records continue those of the last closed segment.
    active: Segment,
    file: File,
    /// Set when a failed append could not be rolled back: bytes of unknown state may follow
    /// the last good record, so nothing more may be appended until the log is reopened (which
    /// cuts them off).
    broken: Option<String>,
    /// The directory, held open for its `flock`; the lock goes when this closes.
    _lock: File,
}

/// What [`Wal::open`] found in the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replay {
    /// Every intact record with an lsn above the `after_lsn` given to [`Wal::open`], as
    /// `(lsn, payload)` in lsn order.
    pub records: Vec<(u64, Vec<u8>)>,
    /// Bytes cut from the end of the last segment: a record torn or corrupted by a crash in
    /// the middle of an append (never acknowledged), and anything after it. 0 after a clean
    /// shutdown.
    pub truncated_bytes: u64,
}

/// One segment file.
#[derive(Debug)]
struct Segment {
    path: PathBuf,
    /// Lsn of its first record (the one it would have, when it has none yet).
    first_lsn: u64,
    /// Records in it.
    records: u64,
    /// Its size in bytes.
    bytes: u64,
}

impl Segment {
    fn new(dir: &Path, first_lsn: u64) -> Segment {
        Segment {
            path: dir.join(format!("wal-{first_lsn:020}.log")),
            first_lsn,
            records: 0,
            bytes: 0,
        }
    }

    /// The lsn its next record gets.
    fn next_lsn(&self) -> u64 {
        self.first_lsn + self.records
    }
}

impl Wal {
    /// Opens the log in `dir` (creating the directory if needed) and replays it: returns every
    /// intact record with an lsn above `after_lsn` (the last lsn the caller's checkpoint
    /// covers; 0 for none), in order.
    ///
    /// A torn or corrupt tail of the last segment (a crash in the middle of an append) is cut
    /// off, durably, and counted in [`Replay::truncated_bytes`]. Damage anywhere else, a gap
    /// between segments, or a log that starts after `after_lsn + 1` (records the checkpoint
    /// does not cover are gone) is an error naming the file and offset. An empty or missing
    /// directory is an empty log.
    ///
    /// Numbering continues after the last intact record, or after `after_lsn` when that is
    /// larger (the checkpoint covers everything in the log, e.g. the log directory was lost):
    /// then the old segments, all redundant, are deleted and appends start a new one.
    pub fn open(dir: &Path, after_lsn: u64) -> Result<(Wal, Replay)> {
        durable::create_dir_all(dir)?;
        let lock = lock_dir(dir)?;
        let mut replay = Replay::default();
        let found = list_segments(dir)?;
        let count = found.len();
        let mut segments: Vec<Segment> = Vec::with_capacity(count);
        for (i, seg) in found.into_iter().enumerate() {
            let expected = match segments.last() {
                Some(prev) => prev.next_lsn(),
                // The first segment may start anywhere up to the first lsn the caller needs.
                None => seg.first_lsn.min(after_lsn + 1),
            };
            if seg.first_lsn != expected {
                return Err(corrupt(
                    &seg.path,
                    0,
                    &format!(
                        "the log should continue at lsn {expected} but this segment starts \
                         at lsn {}: records are missing",
                        seg.first_lsn
                    ),
                ));
            }
            segments.push(scan_segment(seg, after_lsn, i + 1 == count, &mut replay)?);
        }
        let wal = match segments.pop() {
            Some(last) if last.next_lsn() > after_lsn => {
                let file = open_for_append(&last.path)?;
                Wal {
                    dir: dir.to_path_buf(),
                    closed: segments,
                    active: last,
                    file,
                    broken: None,
                    _lock: lock,
                }
            }
            last => {
                // Nothing on disk is newer than the checkpoint: start numbering after it.
                // Deleting first means a crash in between leaves an empty log, which opens
                // the same way again, rather than old segments and a gap.
                for seg in segments.iter().chain(&last) {
                    remove_segment(&seg.path)?;
                }
                if last.is_some() {
                    durable::sync_dir(dir)?;
                }
                Wal::start(dir, after_lsn + 1, lock)?
            }
        };
        Ok((wal, replay))
    }

    /// A log with no segments yet: creates the first one, holding records from `first_lsn`.
    fn start(dir: &Path, first_lsn: u64, lock: File) -> Result<Wal> {
        let active = Segment::new(dir, first_lsn);
        let file = create_segment(dir, &active.path)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            closed: Vec::new(),
            active,
            file,
            broken: None,
            _lock: lock,
        })
    }

    /// Appends `payloads` as consecutive records and makes them durable: one write and one
    /// `fdatasync` for the whole batch. Returns the lsn of the last one (of the last record
    /// before, for an empty batch). Only after it returns may the caller acknowledge them.
    ///
    /// A payload over [`MAX_RECORD_BYTES`] is refused before anything is written. When the
    /// write or the sync fails (a full disk), the segment is cut back to its length before
    /// the call, so a later append never follows a partial record, and the error is returned.
    pub fn append(&mut self, payloads: &[&[u8]]) -> Result<u64> {
        if let Some(why) = &self.broken {
            return Err(ServeError::FailedPrecondition(format!(
                "write-ahead log {}: {why}; reopen the log",
                self.dir.display()
            )));
        }
        if let Some(big) = payloads.iter().find(|p| p.len() > MAX_RECORD_BYTES) {
            return Err(ServeError::ResourceExhausted(format!(
                "a write-ahead log record of {} bytes is over the limit of {MAX_RECORD_BYTES} bytes",
                big.len()
            )));
        }
        if payloads.is_empty() {
            return Ok(self.last_lsn());
        }
        let total: usize = payloads.iter().map(|p| HEADER_BYTES + p.len()).sum();
        let mut batch = Vec::with_capacity(total);
        for (i, payload) in payloads.iter().enumerate() {
            encode_record(&mut batch, self.active.next_lsn() + i as u64, payload);
        }
        let at = self.active.bytes;
        // Positioned writes: the file is not opened with O_APPEND (under which Linux ignores
        // the offset), so the offset alone decides where the batch lands.
        let written = self
            .file
            .write_all_at(&batch, at)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            let rolled_back = self.file.set_len(at).and_then(|()| self.file.sync_data());
            if let Err(undo) = rolled_back {
                self.broken = Some(format!(
                    "a failed append could not be cut back from {}: {undo}",
                    self.active.path.display()
                ));
            }
            return Err(ServeError::io(
                format!(
                    "append {} records ({} bytes) to {}",
                    payloads.len(),
                    batch.len(),
                    self.active.path.display()
                ),
                e,
            ));
        }
        self.active.bytes += batch.len() as u64;
        self.active.records += payloads.len() as u64;
        Ok(self.last_lsn())
    }

    /// Closes the active segment and starts a new one (fsyncing the directory); returns the
    /// last lsn of the closed segments, through which [`Wal::drop_through`] can later delete
    /// them. With no record in the active segment there is nothing to close: it stays.
    pub fn rotate(&mut self) -> Result<u64> {
        if self.active.records > 0 {
            let next = Segment::new(&self.dir, self.active.next_lsn());
            self.file = create_segment(&self.dir, &next.path)?;
            self.closed.push(std::mem::replace(&mut self.active, next));
        }
        Ok(self.last_lsn())
    }

    /// Deletes the closed segments whose records all have an lsn of at most `lsn` (a
    /// checkpoint made them redundant), oldest first so that a crash midway leaves a log
    /// without a gap; fsyncs the directory. The active segment is never deleted.
    pub fn drop_through(&mut self, lsn: u64) -> Result<()> {
        let redundant = self
            .closed
            .iter()
            .take_while(|s| s.next_lsn() - 1 <= lsn)
            .count();
        for seg in self.closed.drain(..redundant) {
            remove_segment(&seg.path)?;
        }
        if redundant > 0 {
            durable::sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// The lsn of the last record appended (or, in an empty log, the one before the first
    /// lsn the next append gets).
    pub fn last_lsn(&self) -> u64 {
        self.active.next_lsn() - 1
    }

    /// Size of all segments on disk, in bytes.
    pub fn bytes(&self) -> u64 {
        self.closed.iter().map(|s| s.bytes).sum::<u64>() + self.active.bytes
    }

    /// Records in the segments on disk (including those a checkpoint already covers).
    pub fn records(&self) -> u64 {
        self.closed.iter().map(|s| s.records).sum::<u64>() + self.active.records
    }
}

/// Appends one record to `out`.
fn encode_record(out: &mut Vec<u8>, lsn: u64, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&checksum(lsn, payload).to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(payload);
}

/// The record checksum: CRC-32 over the lsn's bytes and the payload, so that a record
/// displaced to another position (a stale block) fails it as well as a flipped bit does.
fn checksum(lsn: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&lsn.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Reads segment `seg` from its start, checking each record (length, checksum, and an lsn
/// following the previous one), and adds those above `after_lsn` to `replay`. At the first bad
/// record: in the last segment, cuts the file there (fdatasynced) and counts the bytes cut; in
/// any other segment, fails naming the offset. Returns the segment with its good records.
fn scan_segment(
    mut seg: Segment,
    after_lsn: u64,
    is_last: bool,
    replay: &mut Replay,
) -> Result<Segment> {
    let file = File::open(&seg.path).map_err(|e| ServeError::io(read_context(&seg.path), e))?;
    let len = file
        .metadata()
        .map_err(|e| ServeError::io(read_context(&seg.path), e))?
        .len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut offset = 0u64;
    let damage = loop {
        if offset == len {
            break None;
        }
        let lsn = seg.next_lsn();
        if len - offset < HEADER_BYTES as u64 {
            break Some(format!("a record header of {} bytes", len - offset));
        }
        let mut header = [0u8; HEADER_BYTES];
        read_exact(&mut reader, &mut header, &seg.path)?;
        let payload_len = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().unwrap());
        let found_lsn = u64::from_le_bytes(header[8..16].try_into().unwrap());
        if payload_len > MAX_RECORD_BYTES {
            break Some(format!(
                "a record length of {payload_len} bytes, over the limit of {MAX_RECORD_BYTES}"
            ));
        }
        let end = offset + (HEADER_BYTES + payload_len) as u64;
        if end > len {
            break Some(format!(
                "a record of {payload_len} bytes cut off after {} of them",
                len - offset - HEADER_BYTES as u64
            ));
        }
        let mut payload = vec![0u8; payload_len];
        read_exact(&mut reader, &mut payload, &seg.path)?;
        if checksum(found_lsn, &payload) != crc {
            break Some(format!("a checksum mismatch in the record of lsn {lsn}"));
        }
        if found_lsn != lsn {
            break Some(format!("lsn {found_lsn} where lsn {lsn} was expected"));
        }
        if lsn > after_lsn {
            replay.records.push((lsn, payload));
        }
        seg.records += 1;
        offset = end;
    };
    seg.bytes = offset;
    match damage {
        None => Ok(seg),
        Some(what) if !is_last => Err(corrupt(&seg.path, offset, &what)),
        Some(_) => {
            // A crash in the middle of an append leaves exactly this: a partial or garbled
            // last batch, none of it acknowledged. Cut it so appends follow good records.
            let cut = OpenOptions::new()
                .write(true)
                .open(&seg.path)
                .and_then(|f| f.set_len(offset).and_then(|()| f.sync_data()));
            cut.map_err(|e| {
                ServeError::io(
                    format!(
                        "cut the torn tail of {} at offset {offset}",
                        seg.path.display()
                    ),
                    e,
                )
            })?;
            replay.truncated_bytes = len - offset;
            Ok(seg)
        }
    }
}

/// The segments in `dir`, in lsn order. Other files are not the log's and are left alone.
fn list_segments(dir: &Path) -> Result<Vec<Segment>> {
    let context = || format!("list {}", dir.display());
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| ServeError::io(context(), e))? {
        let name = entry.map_err(|e| ServeError::io(context(), e))?.file_name();
        let first_lsn = name
            .to_str()
            .and_then(|n| n.strip_prefix("wal-"))
            .and_then(|n| n.strip_suffix(".log"))
            .filter(|digits| digits.len() == 20)
            .and_then(|digits| digits.parse::<u64>().ok());
        if let Some(first_lsn) = first_lsn {
            segments.push(Segment::new(dir, first_lsn));
        }
    }
    segments.sort_by_key(|s| s.first_lsn);
    Ok(segments)
}

/// Takes an exclusive `flock` on `dir`, held while the returned handle is open.
fn lock_dir(dir: &Path) -> Result<File> {
    match strata_io::durable::lock_dir(dir) {
        Ok(Some(handle)) => Ok(handle),
        Ok(None) => Err(ServeError::FailedPrecondition(format!(
            "write-ahead log {} is already open (by this process or another)",
            dir.display()
        ))),
        Err(e) => Err(ServeError::io(format!("lock {}", dir.display()), e)),
    }
}

/// Creates the empty segment file `path` and makes its directory entry durable.
fn create_segment(dir: &Path, path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| ServeError::io(format!("create {}", path.display()), e))?;
    durable::sync_dir(dir)?;
    Ok(file)
}

fn open_for_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| ServeError::io(format!("open {} for appending", path.display()), e))
}

/// Deletes a segment file; the caller fsyncs the directory afterwards.
fn remove_segment(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(|e| ServeError::io(format!("remove {}", path.display()), e))
}

fn read_context(path: &Path) -> String {
    format!("read {}", path.display())
}

fn read_exact(reader: &mut impl Read, buf: &mut [u8], path: &Path) -> Result<()> {
    reader
        .read_exact(buf)
        .map_err(|e| ServeError::io(read_context(path), e))
}

/// A damaged log: an I/O error of kind `InvalidData` naming the file and offset.
fn corrupt(path: &Path, offset: u64, what: &str) -> ServeError {
    ServeError::io(
        format!(
            "write-ahead log segment {} is corrupt at offset {offset}",
            path.display()
        ),
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn open(dir: &Path, after_lsn: u64) -> (Wal, Replay) {
        Wal::open(dir, after_lsn).unwrap()
    }

    fn err_text<T>(r: Result<T>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    /// The segment files in `dir`, in lsn order.
    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        list_segments(dir)
            .unwrap()
            .into_iter()
            .map(|s| s.path)
            .collect()
    }

    fn records(pairs: &[(u64, &[u8])]) -> Vec<(u64, Vec<u8>)> {
        pairs.iter().map(|&(l, p)| (l, p.to_vec())).collect()
    }

    fn flip_bit(path: &Path, offset: u64) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[offset as usize] ^= 0x10;
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("new/wal");
        let (mut wal, replay) = open(&dir, 0);
        assert_eq!(replay, Replay::default());
        assert_eq!(wal.last_lsn(), 0);
        assert_eq!(wal.append(&[b"alpha", b""]).unwrap(), 2);
        assert_eq!(wal.append(&[]).unwrap(), 2);
        assert_eq!(wal.append(&[b"gamma"]).unwrap(), 3);
        assert_eq!(wal.records(), 3);
        assert_eq!(wal.bytes(), 3 * HEADER_BYTES as u64 + 10);
        assert_eq!(
            std::fs::metadata(&segment_files(&dir)[0]).unwrap().len(),
            wal.bytes()
        );
        drop(wal);
        let (wal, replay) = open(&dir, 0);
        assert_eq!(
            replay.records,
            records(&[(1, b"alpha"), (2, b""), (3, b"gamma")])
        );
        assert_eq!(replay.truncated_bytes, 0);
        assert_eq!((wal.last_lsn(), wal.records()), (3, 3));
        drop(wal);
        // Records a checkpoint covers are not replayed, but stay on disk.
        let (wal, replay) = open(&dir, 2);
        assert_eq!(replay.records, records(&[(3, b"gamma")]));
        assert_eq!(wal.records(), 3);
    }

    #[test]
    fn reopening_continues_the_numbering() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut wal, _) = open(dir, 0);
        wal.append(&[b"a", b"b"]).unwrap();
        drop(wal);
        let (mut wal, _) = open(dir, 0);
        assert_eq!(wal.append(&[b"c"]).unwrap(), 3);
        drop(wal);
        // A checkpoint past everything in the log: numbering continues after it, and the
        // redundant segments go.
        let (mut wal, replay) = open(dir, 10);
        assert!(replay.records.is_empty());
        assert_eq!((wal.last_lsn(), wal.records(), wal.bytes()), (10, 0, 0));
        assert_eq!(wal.append(&[b"k"]).unwrap(), 11);
        assert_eq!(
            segment_files(dir),
            [dir.join("wal-00000000000000000011.log")]
        );
        drop(wal);
        let (_, replay) = open(dir, 10);
        assert_eq!(replay.records, records(&[(11, b"k")]));
        // A fresh log after a checkpoint starts after it too.
        let fresh = tmp.path().join("fresh");
        let (mut wal, _) = open(&fresh, 5);
        assert_eq!(wal.append(&[b"f"]).unwrap(), 6);
    }

    #[test]
    fn a_log_that_starts_after_the_checkpoint_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut wal, _) = open(tmp.path(), 5);
        wal.append(&[b"x"]).unwrap();
        drop(wal);
        let e = err_text(Wal::open(tmp.path(), 3));
        assert!(
            e.contains("should continue at lsn 4")
                && e.contains("starts at lsn 6")
                && e.contains("wal-00000000000000000006.log"),
            "{e}"
        );
    }

    #[test]
    fn rotate_and_drop_through() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut wal, _) = open(dir, 0);
        wal.append(&[b"1", b"2"]).unwrap();
        assert_eq!(wal.rotate().unwrap(), 2);
        wal.append(&[b"3", b"4"]).unwrap();
        wal.append(&[b"5"]).unwrap();
        assert_eq!(wal.rotate().unwrap(), 5);
        // An empty active segment is not closed again.
        assert_eq!(wal.rotate().unwrap(), 5);
        wal.append(&[b"6"]).unwrap();
        assert_eq!(segment_files(dir).len(), 3);
        // Lsn 4 does not cover the second segment (3..=5): only the first goes.
        wal.drop_through(4).unwrap();
        assert_eq!(
            segment_files(dir),
            [
                dir.join("wal-00000000000000000003.log"),
                dir.join("wal-00000000000000000006.log")
            ]
        );
        assert_eq!(wal.records(), 4);
        assert_eq!(wal.bytes(), 4 * (HEADER_BYTES as u64 + 1));
        // The active segment is never dropped, even when covered.
        wal.drop_through(100).unwrap();
        assert_eq!(segment_files(dir).len(), 1);
        assert_eq!(wal.records(), 1);
        drop(wal);
        let (mut wal, replay) = open(dir, 5);
        assert_eq!(replay.records, records(&[(6, b"6")]));
        assert_eq!(wal.append(&[b"7"]).unwrap(), 7);
    }

    #[test]
    fn a_torn_last_record_is_cut_at_every_byte() {
        let payload = b"the last record";
        let record = (HEADER_BYTES + payload.len()) as u64;
        for kept in 0..record {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            let (mut wal, _) = open(dir, 0);
            wal.append(&[b"closed"]).unwrap();
            wal.rotate().unwrap();
            wal.append(&[b"first", b"second"]).unwrap();
            let start = wal.active.bytes;
            wal.append(&[payload]).unwrap();
            drop(wal);
            let last = segment_files(dir).pop().unwrap();
            let file = OpenOptions::new().write(true).open(&last).unwrap();
            file.set_len(start + kept).unwrap();
            let (mut wal, replay) = open(dir, 0);
            assert_eq!(
                replay,
                Replay {
                    records: records(&[(1, b"closed"), (2, b"first"), (3, b"second")]),
                    truncated_bytes: kept,
                },
                "{kept} bytes of the last record kept"
            );
            assert_eq!(std::fs::metadata(&last).unwrap().len(), start);
            assert_eq!(wal.append(&[b"again"]).unwrap(), 4);
            drop(wal);
            let (_, replay) = open(dir, 3);
            assert_eq!(replay.records, records(&[(4, b"again")]));
        }
    }

    #[test]
    fn a_corrupt_last_record_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut wal, _) = open(dir, 0);
        wal.append(&[b"kept", b"flipped"]).unwrap();
        drop(wal);
        let path = segment_files(dir).pop().unwrap();
        let second = (HEADER_BYTES + 4) as u64;
        flip_bit(&path, second + HEADER_BYTES as u64 + 3);
        let (mut wal, replay) = open(dir, 0);
        assert_eq!(replay.records, records(&[(1, b"kept")]));
        assert_eq!(replay.truncated_bytes, HEADER_BYTES as u64 + 7);
        // A garbled length field (here a huge one) is a damaged tail as well.
        wal.append(&[b"next"]).unwrap();
        drop(wal);
        flip_bit(&path, second + 3);
        let (_, replay) = open(dir, 0);
        assert_eq!(replay.records, records(&[(1, b"kept")]));
        assert_eq!(replay.truncated_bytes, HEADER_BYTES as u64 + 4);
    }

    #[test]
    fn damage_before_the_last_segment_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut wal, _) = open(dir, 0);
        wal.append(&[b"one", b"two"]).unwrap();
        wal.rotate().unwrap();
        wal.append(&[b"three"]).unwrap();
        drop(wal);
        let first = segment_files(dir).remove(0);
        let second = (HEADER_BYTES + 3) as u64;
        flip_bit(&first, second + HEADER_BYTES as u64);
        let e = err_text(Wal::open(dir, 0));
        assert!(
            e.contains("wal-00000000000000000001.log is corrupt at offset 19")
                && e.contains("checksum mismatch in the record of lsn 2"),
            "{e}"
        );
        // Nothing was cut: the damage is still there to be looked at.
        assert_eq!(std::fs::metadata(&first).unwrap().len(), 2 * second);
        // A torn closed segment is damage too, not a tail.
        let file = OpenOptions::new().write(true).open(&first).unwrap();
        file.set_len(second + 5).unwrap();
        let e = err_text(Wal::open(dir, 0));
        assert!(
            e.contains("corrupt at offset 19") && e.contains("header of 5 bytes"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_segment_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut wal, _) = open(dir, 0);
        for batch in [b"a", b"b", b"c"] {
            wal.append(&[batch]).unwrap();
            wal.rotate().unwrap();
        }
        drop(wal);
        std::fs::remove_file(&segment_files(dir)[1]).unwrap();
        let e = err_text(Wal::open(dir, 0));
        assert!(
            e.contains("wal-00000000000000000003.log")
                && e.contains("should continue at lsn 2")
                && e.contains("records are missing"),
            "{e}"
        );
        // Files that are not segments are not the log's business.
        std::fs::write(dir.join("wal-notes.log"), b"x").unwrap();
        std::fs::write(dir.join("README"), b"x").unwrap();
        std::fs::remove_file(&segment_files(dir)[0]).unwrap();
        let (_, replay) = open(dir, 2);
        assert_eq!(replay.records, records(&[(3, b"c")]));
    }

    #[test]
    fn oversized_records_are_refused_before_writing() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut wal, _) = open(tmp.path(), 0);
        let big = vec![0u8; MAX_RECORD_BYTES + 1];
        let e = err_text(wal.append(&[b"small", &big]));
        assert!(
            e.contains(&format!("{} bytes is over the limit", MAX_RECORD_BYTES + 1)),
            "{e}"
        );
        assert_eq!((wal.last_lsn(), wal.bytes()), (0, 0));
    }

    #[test]
    fn a_log_is_opened_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (wal, _) = open(tmp.path(), 0);
        let e = err_text(Wal::open(tmp.path(), 0));
        assert!(e.contains("is already open"), "{e}");
        drop(wal);
        open(tmp.path(), 0);
    }

    #[test]
    fn a_failed_append_is_rolled_back() {
        full_disk::run(
            "wal::tests::a_failed_append_is_rolled_back",
            append_past_the_file_size_limit,
            |dir| {
                let (_, replay) = open(dir, 0);
                assert_eq!(replay.records, records(&[(1, b"before"), (2, b"after")]));
                assert_eq!(replay.truncated_bytes, 0);
            },
        );
    }

    fn append_past_the_file_size_limit(dir: &Path) {
        let (mut wal, _) = open(dir, 0);
        wal.append(&[b"before"]).unwrap();
        let good = wal.bytes();
        // Part of this batch fits under the limit and is written before the error.
        let big = vec![7u8; 2 * full_disk::FILE_LIMIT as usize];
        let e = err_text(wal.append(&[b"lost", &big]));
        assert!(
            e.contains("append 2 records") && e.contains("File too large"),
            "{e}"
        );
        let path = segment_files(dir).pop().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
        assert_eq!((wal.bytes(), wal.last_lsn()), (good, 1));
        assert_eq!(wal.append(&[b"after"]).unwrap(), 2);
    }

    /// The byte size of each record of a batch.
    fn sizes(batch: &[Vec<u8>]) -> impl Iterator<Item = u64> + '_ {
        batch.iter().map(|p| (HEADER_BYTES + p.len()) as u64)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn replay_after_a_cut_is_the_prefix_of_whole_records(
            batches in proptest::collection::vec(
                (proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..5),
                 any::<bool>()),
                1..8,
            ),
            cut in any::<proptest::sample::Index>(),
            garbage in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            let (mut wal, _) = open(dir, 0);
            // Every record, and the sizes of those in the last segment.
            let mut all: Vec<Vec<u8>> = Vec::new();
            let mut last_segment: Vec<u64> = Vec::new();
            for (batch, rotate_after) in &batches {
                let refs: Vec<&[u8]> = batch.iter().map(|p| p.as_slice()).collect();
                prop_assert_eq!(wal.append(&refs).unwrap(), (all.len() + batch.len()) as u64);
                all.extend(batch.iter().cloned());
                last_segment.extend(sizes(batch));
                if *rotate_after && !last_segment.is_empty() {
                    wal.rotate().unwrap();
                    last_segment.clear();
                }
            }
            drop(wal);
            // Cut the last segment anywhere (maybe nowhere) and maybe append garbage.
            let path = segment_files(dir).pop().unwrap();
            let len: u64 = last_segment.iter().sum();
            let keep = cut.index(len as usize + 1) as u64;
            let original = std::fs::read(&path).unwrap();
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(keep).unwrap();
            file.write_all_at(&garbage, keep).unwrap();
            drop(file);

            // The records of the last segment whose bytes are all still there survive. Usually
            // that is those that end before the cut, but garbage that starts with the bytes
            // the cut removed puts them back (one byte in 256 for a one-byte cut).
            let intact = keep
                + original[keep as usize..]
                    .iter()
                    .zip(&garbage)
                    .take_while(|(a, b)| a == b)
                    .count() as u64;
            let mut end = 0u64;
            let kept = last_segment
                .iter()
                .take_while(|&&size| {
                    end += size;
                    end <= intact
                })
                .count();
            let whole: u64 = last_segment[..kept].iter().sum();
            let survivors = all.len() - (last_segment.len() - kept);
            let (mut wal, replay) = open(dir, 0);
            let expected: Vec<(u64, Vec<u8>)> = all[..survivors]
                .iter()
                .enumerate()
                .map(|(i, p)| (i as u64 + 1, p.clone()))
                .collect();
            prop_assert_eq!(replay.records, expected);
            prop_assert_eq!(replay.truncated_bytes, keep + garbage.len() as u64 - whole);
            prop_assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
            prop_assert_eq!(wal.append(&[b"next"]).unwrap(), survivors as u64 + 1);
        }
    }
}

/// A full disk for tests: `RLIMIT_FSIZE` limits every file the process writes, so a test runs
/// itself again in a child process that sets it.
#[cfg(test)]
pub(crate) mod full_disk {
    use std::path::Path;

    /// Bytes the child may write to any file.
    pub const FILE_LIMIT: u64 = 4096;
    /// Set in the child to its scratch directory.
    const CHILD_ENV: &str = "STRATA_SERVE_TEST_FSIZE_CHILD";

    /// Runs `child(dir)` in a child process (the test `test`, by its full path, run again)
    /// whose files may not grow past [`FILE_LIMIT`] bytes, checks that it passed, then runs
    /// `parent(dir)` here on what it left.
    pub fn run(test: &str, child: impl FnOnce(&Path), parent: impl FnOnce(&Path)) {
        if let Some(dir) = std::env::var_os(CHILD_ENV) {
            // SAFETY: plain system calls on this (child) process's own limits and signal mask.
            unsafe {
                let mut limit = std::mem::zeroed::<libc::rlimit>();
                assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit), 0);
                limit.rlim_cur = FILE_LIMIT;
                assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
                // Past the limit, write(2) then fails with EFBIG instead of killing the process.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            }
            child(Path::new(&dir));
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        // The child's output is captured: inherited, it would be a file whenever the test run
        // is redirected to one, and past the size limit the child could not write to it.
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture"])
            .env(CHILD_ENV, tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the child test failed: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        parent(tmp.path());
    }
}
