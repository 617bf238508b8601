//! Reading delimited text edge lists: files cut into blocks of whole lines, each block split
//! into records of fields, and an ordered parallel map over blocks.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use strata_io::SeqReader;

use super::options::Delimiter;
use crate::error::{Result, StoreError};

/// The text layout shared by every file of one conversion.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub delimiter: Delimiter,
    /// Lines starting with this prefix (after leading blanks) are skipped; empty: none.
    pub comment: Vec<u8>,
    /// Skip the first non-comment line of each file.
    pub header: bool,
    /// Number of fields every data line must have.
    pub num_fields: usize,
}

/// Whole lines of one file.
pub(crate) struct Block {
    pub file: usize,
    /// Line number (1-based) of the first line in `data`.
    pub first_line: u64,
    pub data: Vec<u8>,
    pub delimiter: Delimiter,
}

/// Counts bytes read from disk (compressed bytes for `.gz` inputs), for MB/s.
#[derive(Clone, Default)]
pub(crate) struct ByteCounter(Arc<AtomicU64>);

impl ByteCounter {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct Counted<R> {
    inner: R,
    counter: ByteCounter,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counter.0.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Whether `path` starts with the gzip magic bytes.
pub(crate) fn is_gzip(path: &Path) -> bool {
    let mut magic = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == [0x1f, 0x8b]
}

/// Opens `path` for streaming, decompressing gzip (by magic bytes) transparently; says whether
/// it is gzip.
fn open_input(
    path: &Path,
    io_chunk: usize,
    counter: &ByteCounter,
) -> Result<(Box<dyn Read + Send>, bool)> {
    let raw = Counted {
        inner: SeqReader::open(path, 0, io_chunk)?,
        counter: counter.clone(),
    };
    if is_gzip(path) {
        let gz = flate2::read::MultiGzDecoder::new(std::io::BufReader::with_capacity(1 << 20, raw));
        Ok((Box::new(gz), true))
    } else {
        Ok((Box::new(raw), false))
    }
}

/// The error for a failed read of `path` in the block starting at `line`: bad input when the gzip decoder
/// rejects the data (corrupt or truncated), an I/O error otherwise.
fn read_error(path: &Path, gzip: bool, line: u64, e: std::io::Error) -> StoreError {
    use std::io::ErrorKind::{InvalidData, InvalidInput, UnexpectedEof};
    if gzip && matches!(e.kind(), InvalidData | InvalidInput | UnexpectedEof) {
        return StoreError::bad_file(
            path,
            format!("corrupt or truncated gzip data (near line {line}): {e}"),
        );
    }
    StoreError::os("read", path, e)
}

/// Cuts a sequence of files into blocks of about `block_bytes` of whole lines.
pub(crate) struct BlockReader {
    files: Vec<PathBuf>,
    layout: Layout,
    block_bytes: usize,
    io_chunk: usize,
    counter: ByteCounter,
    cur: Option<OpenFile>,
    next_file: usize,
}

struct OpenFile {
    index: usize,
    reader: Box<dyn Read + Send>,
    gzip: bool,
    carry: Vec<u8>,
    line: u64,
    eof: bool,
    /// The header line is still to be skipped.
    header_pending: bool,
    /// `None` until the first data line has been seen (with `Delimiter::Auto`).
    delimiter: Option<Delimiter>,
    /// Nothing has been cut from the file yet: a UTF-8 byte order mark may open it.
    at_start: bool,
}

/// The UTF-8 byte order mark that Windows editors and spreadsheet exports write first.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// Longest line accepted, in bytes: beyond this the input is almost surely not text.
pub(super) const MAX_LINE: usize = 16 << 20;

impl BlockReader {
    pub fn new(files: Vec<PathBuf>, layout: Layout, block_bytes: usize, io_chunk: usize) -> Self {
        BlockReader {
            files,
            layout,
            block_bytes: block_bytes.max(64),
            io_chunk,
            counter: ByteCounter::default(),
            cur: None,
            next_file: 0,
        }
    }

    /// Bytes read from disk so far.
    pub fn counter(&self) -> ByteCounter {
        self.counter.clone()
    }

    /// The next block, or `None` after the last file.
    pub fn next_block(&mut self) -> Result<Option<Block>> {
        loop {
            if self.cur.is_none() {
                if self.next_file == self.files.len() {
                    return Ok(None);
                }
                let index = self.next_file;
                self.next_file += 1;
                let (reader, gzip) = open_input(&self.files[index], self.io_chunk, &self.counter)?;
                self.cur = Some(OpenFile {
                    index,
                    reader,
                    gzip,
                    carry: Vec::new(),
                    line: 1,
                    eof: false,
                    header_pending: self.layout.header,
                    delimiter: (self.layout.delimiter != Delimiter::Auto)
                        .then_some(self.layout.delimiter),
                    at_start: true,
                });
            }
            let f = self.cur.as_mut().unwrap();
            let path = &self.files[f.index];
            let mut data = std::mem::take(&mut f.carry);
            let want = self.block_bytes.max(data.len() + 1);
            while data.len() < want && !f.eof {
                let old = data.len();
                data.resize(want, 0);
                let n = read_full(&mut f.reader, &mut data[old..])
                    .map_err(|e| read_error(path, f.gzip, f.line, e))?;
                data.truncate(old + n);
                if n == 0 {
                    f.eof = true;
                }
            }
            let cut = if f.eof {
                data.len()
            } else {
                match memchr::memrchr(b'\n', &data) {
                    Some(i) => i + 1,
                    // A line longer than the block: keep reading until it ends.
                    None if data.len() > MAX_LINE => {
                        return Err(StoreError::input(
                            path,
                            f.line,
                            format!(
                                "line is longer than {MAX_LINE} bytes; is this a text edge list?"
                            ),
                        ))
                    }
                    None => {
                        f.carry = data;
                        self.block_bytes = self.block_bytes.saturating_mul(2);
                        continue;
                    }
                }
            };
            f.carry = data.split_off(cut);
            // A byte order mark is no part of the first name: kept, "\u{feff}a" and "a" would
            // be two nodes.
            if std::mem::take(&mut f.at_start) && data.starts_with(UTF8_BOM) {
                data.drain(..UTF8_BOM.len());
            }
            let first_line = f.line;
            f.line += memchr::memchr_iter(b'\n', &data).count() as u64;
            if f.delimiter.is_none() {
                f.delimiter = detect_delimiter(&data, &self.layout.comment);
            }
            if f.header_pending {
                f.header_pending = !blank_first_data_line(&mut data, &self.layout.comment);
            }
            let block = Block {
                file: f.index,
                first_line,
                data,
                delimiter: f.delimiter.unwrap_or(Delimiter::Whitespace),
            };
            if f.eof && f.carry.is_empty() {
                self.cur = None;
            }
            if !block.data.is_empty() {
                return Ok(Some(block));
            }
        }
    }
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn is_skipped(line: &[u8], comment: &[u8]) -> bool {
    let trimmed = line.trim_ascii_start();
    trimmed.is_empty() || (!comment.is_empty() && trimmed.starts_with(comment))
}

/// The delimiter of the first data line in `data`, or `None` if it has no data line.
fn detect_delimiter(data: &[u8], comment: &[u8]) -> Option<Delimiter> {
    let line = data
        .split(|&b| b == b'\n')
        .find(|l| !is_skipped(l, comment))?;
    Some(if line.contains(&b'\t') {
        Delimiter::Tab
    } else if line.contains(&b',') {
        Delimiter::Comma
    } else {
        Delimiter::Whitespace
    })
}

/// Replaces the first data line's content with blanks (so line numbers stay right); returns
/// whether `data` had a data line.
fn blank_first_data_line(data: &mut [u8], comment: &[u8]) -> bool {
    let mut start = 0;
    while start < data.len() {
        let end = memchr::memchr(b'\n', &data[start..]).map_or(data.len(), |i| start + i);
        if !is_skipped(&data[start..end], comment) {
            data[start..end].fill(b' ');
            return true;
        }
        start = end + 1;
    }
    false
}

/// The options that read a binary edge file, which a NUL byte in a text input most often is.
pub(crate) const BINARY_FORMATS: &str =
    "int32 pairs such as `generate rmat` writes: --format bin32 \
     or a .bin name; NumPy arrays: a .npy name";

/// Calls `f(line_number, fields)` for every data line of `block`; `fields` has exactly
/// `layout.num_fields` entries (a line with another count is an error naming the line).
pub(crate) fn for_each_record(
    block: &Block,
    layout: &Layout,
    path: &Path,
    mut f: impl FnMut(u64, &[&[u8]]) -> Result<()>,
) -> Result<()> {
    let check = |line: u64, raw: &[u8], n: usize| -> Result<()> {
        if n == layout.num_fields {
            return Ok(());
        }
        // Binary data split at its newline bytes parses as lines of junk fields: name it. (A
        // NUL in a line of the right shape is a name's, refused with its field and byte.)
        let msg = if memchr::memchr(0, raw).is_some() {
            format!("holds a NUL byte: the file is binary, not text ({BINARY_FORMATS})")
        } else {
            let hint = if layout.num_fields == 2 && n == 3 {
                "(src, relation, dst) triples need --relations"
            } else {
                "--columns names each field (src, dst, rel, weight, time, feat:D or _)"
            };
            format!(
                "expected {} fields, found {n} (delimiter: {:?}); {hint}",
                layout.num_fields, block.delimiter
            )
        };
        Err(StoreError::input(path, line, msg))
    };
    let mut fields: Vec<&[u8]> = Vec::with_capacity(layout.num_fields + 1);
    for (this_line, raw) in (block.first_line..).zip(block.data.split(|&b| b == b'\n')) {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if is_skipped(line, &layout.comment) {
            continue;
        }
        fields.clear();
        match block.delimiter {
            Delimiter::Tab => fields.extend(line.split(|&b| b == b'\t')),
            Delimiter::Whitespace | Delimiter::Auto => fields.extend(
                line.split(|&b| b == b' ' || b == b'\t')
                    .filter(|s| !s.is_empty()),
            ),
            Delimiter::Comma if line.contains(&b'"') => {
                let owned =
                    split_csv(line).map_err(|msg| StoreError::input(path, this_line, msg))?;
                let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
                check(this_line, line, refs.len())?;
                f(this_line, &refs)?;
                continue;
            }
            Delimiter::Comma => fields.extend(line.split(|&b| b == b',')),
        }
        check(this_line, line, fields.len())?;
        f(this_line, &fields)?;
    }
    Ok(())
}

/// Splits one CSV line with double-quoted fields (`""` inside quotes is a quote).
fn split_csv(line: &[u8]) -> std::result::Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let mut field = Vec::new();
        if line.get(i) == Some(&b'"') {
            i += 1;
            loop {
                match line.get(i) {
                    None => return Err("unterminated quoted field".into()),
                    Some(b'"') if line.get(i + 1) == Some(&b'"') => {
                        field.push(b'"');
                        i += 2;
                    }
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(&c) => {
                        field.push(c);
                        i += 1;
                    }
                }
            }
            if i < line.len() && line[i] != b',' {
                return Err("text after a closing quote".into());
            }
        } else {
            let end = line[i..]
                .iter()
                .position(|&c| c == b',')
                .map_or(line.len(), |p| i + p);
            field.extend_from_slice(&line[i..end]);
            i = end;
        }
        out.push(field);
        if i >= line.len() {
            return Ok(out);
        }
        i += 1;
    }
}

/// Parses a canonical non-negative decimal integer; `None` if `s` is anything else.
pub(crate) fn parse_uint(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(d as u64)?;
    }
    Some(v)
}

/// Whether `s` looks like an integer id that can be used as-is: digits only, no leading zero.
pub(crate) fn is_canonical_uint(s: &[u8]) -> bool {
    parse_uint(s).is_some() && (s.len() == 1 || s[0] != b'0')
}

/// Runs `map` over the blocks of `reader` on `threads` workers and hands the results to
/// `consume` in block order, on the calling thread. Stops at the first error.
pub(crate) fn par_map_blocks<T: Send>(
    mut reader: BlockReader,
    threads: usize,
    map: impl Fn(&Block) -> Result<T> + Sync,
    mut consume: impl FnMut(&Block, T) -> Result<()>,
) -> Result<()> {
    let threads = threads.max(1);
    let (job_tx, job_rx) = crossbeam_channel::bounded::<(u64, Block)>(threads * 2);
    let (res_tx, res_rx) = crossbeam_channel::bounded::<(u64, Block, Result<T>)>(threads * 2);
    std::thread::scope(|scope| {
        let map = &map;
        for _ in 0..threads {
            let job_rx = job_rx.clone();
            let res_tx = res_tx.clone();
            scope.spawn(move || {
                for (seq, block) in job_rx {
                    let r = map(&block);
                    if res_tx.send((seq, block, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(res_tx);
        drop(job_rx);
        let reader_thread = scope.spawn(move || -> Result<()> {
            let mut seq = 0u64;
            while let Some(block) = reader.next_block()? {
                if job_tx.send((seq, block)).is_err() {
                    break;
                }
                seq += 1;
            }
            Ok(())
        });
        let mut pending = std::collections::BTreeMap::new();
        let mut next = 0u64;
        let mut outcome: Result<()> = Ok(());
        for (seq, block, r) in res_rx.iter() {
            pending.insert(seq, (block, r));
            while let Some((block, r)) = pending.remove(&next) {
                next += 1;
                if outcome.is_ok() {
                    outcome = r.and_then(|v| consume(&block, v));
                }
            }
            if outcome.is_err() {
                break;
            }
        }
        // Dropping the receiver makes workers and the reader stop early on error.
        drop(res_rx);
        let read_outcome = reader_thread.join().expect("reader thread panicked");
        outcome.and(read_outcome)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(num_fields: usize, header: bool) -> Layout {
        Layout {
            delimiter: Delimiter::Auto,
            comment: b"#".to_vec(),
            header,
            num_fields,
        }
    }

    fn collect(path: &Path, layout: Layout, block_bytes: usize) -> Result<Vec<(u64, Vec<String>)>> {
        let reader = BlockReader::new(vec![path.to_path_buf()], layout.clone(), block_bytes, 4096);
        let mut out = Vec::new();
        par_map_blocks(
            reader,
            2,
            |b| {
                let mut v = Vec::new();
                for_each_record(b, &layout, path, |line, fields| {
                    v.push((
                        line,
                        fields
                            .iter()
                            .map(|f| String::from_utf8_lossy(f).into_owned())
                            .collect(),
                    ));
                    Ok(())
                })?;
                Ok(v)
            },
            |_, v| {
                out.extend(v);
                Ok(())
            },
        )?;
        Ok(out)
    }

    #[test]
    fn a_byte_order_mark_opens_no_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.csv");
        std::fs::write(&path, "\u{feff}a,b\nb,\u{feff}c\n").unwrap();
        let got = collect(&path, layout(2, false), 64).unwrap();
        // Only the file's first bytes are a mark; one inside a line is data.
        assert_eq!(
            got,
            vec![
                (1, vec!["a".into(), "b".into()]),
                (2, vec!["b".into(), "\u{feff}c".into()])
            ]
        );
    }

    #[test]
    fn records_keep_line_numbers_for_any_block_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.tsv");
        std::fs::write(
            &path,
            "# comment\nsrc\tdst\n\na\tb\r\n  # indented comment\nc\td\ne\tf",
        )
        .unwrap();
        for block in [1, 3, 7, 64, 4096] {
            let got = collect(&path, layout(2, true), block).unwrap();
            assert_eq!(
                got,
                vec![
                    (4, vec!["a".into(), "b".into()]),
                    (6, vec!["c".into(), "d".into()]),
                    (7, vec!["e".into(), "f".into()])
                ]
            );
        }
    }

    #[test]
    fn wrong_field_count_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.tsv");
        std::fs::write(&path, "a\tb\nc\td\te\n").unwrap();
        let err = collect(&path, layout(2, false), 4096)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("e.tsv:2:")
                && err.contains("expected 2 fields, found 3")
                && err.contains("triples need --relations"),
            "{err}"
        );
        std::fs::write(&path, "a\tb\tc\nd\te\n").unwrap();
        let err = collect(&path, layout(3, false), 4096)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("e.tsv:2:") && err.contains("--columns names each field"),
            "{err}"
        );
    }

    #[test]
    fn binary_data_is_named_at_the_first_line_it_breaks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edges");
        std::fs::write(&path, b"a\tb\nc\td\n\x40\x0e\0\0\x40\x06\0\0\n").unwrap();
        for block in [4, 4096] {
            let err = collect(&path, layout(2, false), block)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("edges:3:") && err.contains("--format bin32"),
                "{err}"
            );
        }
        // A NUL in a line of the right shape is a name's: the name checks refuse it.
        std::fs::write(&path, b"a\tb\0c\n").unwrap();
        assert_eq!(collect(&path, layout(2, false), 4096).unwrap().len(), 1);
    }

    #[test]
    fn csv_quotes() {
        assert_eq!(
            split_csv(br#""a,b",c,"say ""hi""""#).unwrap(),
            vec![b"a,b".to_vec(), b"c".to_vec(), b"say \"hi\"".to_vec()]
        );
        assert!(split_csv(br#""open,c"#).is_err());
    }

    #[test]
    fn gzip_inputs_are_read_transparently() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.txt.gz");
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        enc.write_all(b"1 2\n3 4\n").unwrap();
        enc.finish().unwrap();
        let got = collect(&path, layout(2, false), 4096).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].1, vec!["3".to_string(), "4".to_string()]);
    }

    #[test]
    fn integers() {
        assert_eq!(parse_uint(b"0"), Some(0));
        assert_eq!(parse_uint(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_uint(b"18446744073709551616"), None);
        assert_eq!(parse_uint(b"-1"), None);
        assert!(!is_canonical_uint(b"007"));
        assert!(is_canonical_uint(b"70"));
    }
}
