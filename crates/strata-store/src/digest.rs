//! Content digests of a dataset directory (a store, or a grid): one BLAKE3 hash of the
//! manifest's canonical content and of every array file's data, so that two copies of the same
//! data on two machines can prove they are equal (distributed runs compare them before their
//! first step, docs/distributed.md).
//!
//! The digest is computed once and kept beside the manifest in [`DIGEST_FILE`], with each
//! hashed file's size and modification and change times: a kept digest whose files still match
//! is returned without reading them; one whose files changed since (a copy, an in-place edit) is
//! computed again. Builders compute it while their output is still a `.partial` directory, so a
//! published store has it; a store written before digests existed gets it on first need, saved
//! when the directory is writable and only returned when it is not.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use strata_io::durable;
use strata_io::SeqReader;

use crate::error::{Result, StoreError};
use crate::file_stamp::{self, FileStamp};
use crate::npy;

/// Name of the file that keeps a directory's digest.
pub const DIGEST_FILE: &str = "digest.json";
/// The hash the digest is made with (its text starts with this name and a colon).
pub const ALGORITHM: &str = "blake3";
/// Bytes of each read while hashing (two are in flight: memory is bounded by 2 x this).
const CHUNK: usize = 4 << 20;
/// Manifest fields that say how and when the data was written, not what it is: two
/// conversions of the same input at different times, paths or versions have equal digests.
const NOT_CONTENT: [&str; 3] = ["provenance", "strata_version", "name"];

/// The contents of [`DIGEST_FILE`].
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    digest: String,
    /// The manifest and every hashed file, by name, as they were when hashed.
    files: BTreeMap<String, FileStamp>,
}

/// The manifest `manifest_file` of `dir` as canonical bytes (keys sorted at every level,
/// [`NOT_CONTENT`] left out, no whitespace) and the array files it lists (each once, sorted).
fn manifest_content(dir: &Path, manifest_file: &str) -> Result<(Vec<u8>, Vec<String>)> {
    let path = dir.join(manifest_file);
    let text = std::fs::read(&path).map_err(|e| StoreError::os("read", &path, e))?;
    let mut value: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| StoreError::bad_file(&path, format!("not valid JSON: {e}")))?;
    let Some(fields) = value.as_object_mut() else {
        return Err(StoreError::bad_file(&path, "not a JSON object"));
    };
    for key in NOT_CONTENT {
        fields.remove(key);
    }
    let mut files: Vec<String> = fields
        .get("arrays")
        .and_then(|a| a.as_object())
        .map(|arrays| {
            arrays
                .values()
                .filter_map(|a| a.get("file")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.dedup();
    if let Some(bad) = files.iter().find(|f| f.contains('/') || f.starts_with('.')) {
        return Err(StoreError::bad_file(
            &path,
            format!("array file '{bad}' points outside the directory"),
        ));
    }
    let mut out = Vec::new();
    write_canonical(&value, &mut out);
    Ok((out, files))
}

/// `value` as JSON with object keys sorted at every level, whatever map the JSON library uses.
fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(serde_json::to_vec(k).expect("a string serialises"));
                out.push(b':');
                write_canonical(&map[k], out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        other => out.extend(serde_json::to_vec(other).expect("a JSON value serialises")),
    }
}

/// Hashes the canonical manifest and then each file's name, data length and data (the bytes
/// after the `.npy` header, read in [`CHUNK`]s through the I/O engine). Returns the digest as
/// `blake3:HEX`.
fn compute(dir: &Path, manifest: &[u8], files: &[String]) -> Result<String> {
    let mut h = blake3::Hasher::new();
    h.update(b"strata digest 1\0");
    h.update(&(manifest.len() as u64).to_le_bytes());
    h.update(manifest);
    for file in files {
        let path = dir.join(file);
        let header = npy::read_header(&path)?;
        let mut reader = SeqReader::open(&path, header.data_offset, CHUNK)?;
        h.update(&(file.len() as u64).to_le_bytes());
        h.update(file.as_bytes());
        h.update(&reader.remaining().to_le_bytes());
        while let Some(chunk) = reader.next_chunk()? {
            h.update(chunk);
        }
    }
    Ok(format!("{ALGORITHM}:{}", h.finalize().to_hex()))
}

/// The digest kept in `dir`'s [`DIGEST_FILE`] if every file it was computed from is unchanged
/// (same size, modification and change time), else `None`; reads no data.
pub fn kept_digest(dir: &Path, manifest_file: &str) -> Result<Option<String>> {
    let Ok(text) = std::fs::read(dir.join(DIGEST_FILE)) else {
        return Ok(None);
    };
    let Ok(kept) = serde_json::from_slice::<Kept>(&text) else {
        return Ok(None); // damaged or from another version: computed again
    };
    let (_, files) = manifest_content(dir, manifest_file)?;
    let names = files.iter().map(String::as_str).chain([manifest_file]);
    if !file_stamp::unchanged(dir, &kept.files, names) {
        return Ok(None);
    }
    Ok(Some(kept.digest))
}

/// The content digest (`blake3:HEX`) of the store or grid in `dir`, whose manifest is
/// `manifest_file` and whose arrays are the `.npy` files its `arrays` lists: the kept one
/// when current ([`kept_digest`]), else computed from the files (streamed, two 4 MiB reads of
/// memory) and saved atomically in [`DIGEST_FILE`]. A directory that cannot be written (read
/// only, another user's) gets the digest without it being saved.
pub fn content_digest(dir: &Path, manifest_file: &str) -> Result<String> {
    if let Some(d) = kept_digest(dir, manifest_file)? {
        return Ok(d);
    }
    let (manifest, files) = manifest_content(dir, manifest_file)?;
    // Stamped before reading: a file changed while it is hashed fails the next check.
    let stamps = file_stamp::stamps(dir, files.iter().map(String::as_str).chain([manifest_file]))?;
    let digest = compute(dir, &manifest, &files)?;
    let kept = Kept {
        digest: digest.clone(),
        files: stamps,
    };
    let text = serde_json::to_vec_pretty(&kept).expect("the digest serialises");
    match durable::replace_file(&dir.join(DIGEST_FILE), &text) {
        Ok(()) => {}
        Err(e) if unwritable(&e) => {}
        Err(e) => return Err(StoreError::os("write", &dir.join(DIGEST_FILE), e)),
    }
    Ok(digest)
}

/// Whether a failed write means the directory is not ours to write (not a fault to report).
fn unwritable(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EROFS | libc::EACCES | libc::EPERM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::NpyWriter;
    use crate::npy::DType;

    /// A directory with a manifest listing two arrays (one aliased under a second name).
    fn dataset(dir: &Path, name: &str, values: &[i64]) {
        std::fs::create_dir_all(dir).unwrap();
        let mut w = NpyWriter::create(&dir.join("a.npy"), DType::I64, &[], 1 << 12).unwrap();
        w.write(values).unwrap();
        let a = w.finish().unwrap();
        let mut w = NpyWriter::create(&dir.join("b.npy"), DType::F32, &[2], 1 << 12).unwrap();
        w.write(&[1.5f32, -2.0, 0.25, 8.0]).unwrap();
        let b = w.finish().unwrap();
        let manifest = serde_json::json!({
            "format": "strata-store", "name": name, "strata_version": "0.0",
            "graph": {"num_nodes": values.len()},
            "arrays": {"a": a, "a_alias": a, "b": b},
            "provenance": {"seconds": name.len()},
        });
        std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    }

    fn fresh(dir: &Path) -> String {
        let _ = std::fs::remove_file(dir.join(DIGEST_FILE));
        content_digest(dir, "manifest.json").unwrap()
    }

    #[test]
    fn a_digest_is_kept_and_stable_across_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        dataset(&dir, "s", &[1, 2, 3, 4, 5]);
        assert_eq!(kept_digest(&dir, "manifest.json").unwrap(), None);
        let d = content_digest(&dir, "manifest.json").unwrap();
        assert!(d.starts_with("blake3:") && d.len() == 7 + 64, "{d}");
        assert_eq!(kept_digest(&dir, "manifest.json").unwrap(), Some(d.clone()));
        assert_eq!(fresh(&dir), d, "computed again from the files");
        // Written again from scratch, elsewhere, under another name and at another time.
        let other = tmp.path().join("t");
        dataset(&other, "another name", &[1, 2, 3, 4, 5]);
        assert_eq!(fresh(&other), d);
    }

    #[test]
    fn one_byte_of_data_or_of_the_manifest_changes_the_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        dataset(&dir, "s", &[1, 2, 3, 4, 5]);
        let d = content_digest(&dir, "manifest.json").unwrap();
        // One byte of a's data, written in place: the kept digest is stale and recomputed.
        let path = dir.join("a.npy");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(kept_digest(&dir, "manifest.json").unwrap(), None);
        let changed = content_digest(&dir, "manifest.json").unwrap();
        assert_ne!(changed, d);
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(content_digest(&dir, "manifest.json").unwrap(), d);
        // A manifest field that describes the data counts; one that describes the writing not.
        let mpath = dir.join("manifest.json");
        let text = std::fs::read_to_string(&mpath).unwrap();
        std::fs::write(&mpath, text.replace("\"num_nodes\":5", "\"num_nodes\":6")).unwrap();
        assert_ne!(content_digest(&dir, "manifest.json").unwrap(), d);
        std::fs::write(&mpath, text.replace("\"seconds\":1", "\"seconds\":2")).unwrap();
        assert_eq!(content_digest(&dir, "manifest.json").unwrap(), d);
    }

    #[test]
    fn a_copied_store_has_the_same_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        dataset(&dir, "s", &[7, 8, 9]);
        let d = content_digest(&dir, "manifest.json").unwrap();
        let copy = tmp.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        for f in ["manifest.json", "a.npy", "b.npy", DIGEST_FILE] {
            std::fs::copy(dir.join(f), copy.join(f)).unwrap();
        }
        // The copy's files have new times: its kept digest is checked by computing it again.
        assert_eq!(kept_digest(&copy, "manifest.json").unwrap(), None);
        assert_eq!(content_digest(&copy, "manifest.json").unwrap(), d);
        assert_eq!(kept_digest(&copy, "manifest.json").unwrap(), Some(d));
    }

    #[test]
    fn a_damaged_kept_digest_is_computed_again_and_files_outside_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        dataset(&dir, "s", &[1]);
        let d = content_digest(&dir, "manifest.json").unwrap();
        std::fs::write(dir.join(DIGEST_FILE), b"{\"digest\": 3").unwrap();
        assert_eq!(content_digest(&dir, "manifest.json").unwrap(), d);
        let mpath = dir.join("manifest.json");
        let text = std::fs::read_to_string(&mpath).unwrap();
        std::fs::write(&mpath, text.replace("\"b.npy\"", "\"../b.npy\"")).unwrap();
        let err = content_digest(&dir, "manifest.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'../b.npy' points outside the directory"),
            "{err}"
        );
    }
}
