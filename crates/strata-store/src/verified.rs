//! Opening a store to train on or serve: every engine that does so calls [`open_checked`],
//! which refuses a store that fails `strata check`'s value checks ([`check_store`]: CSR against
//! CSC and the train edges, finite features, ids in range, degrees, name tables) instead of
//! letting a model learn from it or a server answer from it.
//!
//! The check streams every array once or twice in bounded memory (check.rs), so it costs about a
//! read of the store. A passed check is recorded in the store as [`STAMP`], keyed to the size,
//! modification and change times of `manifest.json` and of every array file ([`file_stamp`],
//! as the content digest is), so that later opens of an unchanged store only `stat` its files;
//! any write to a file makes the next open check again. `strata check` records a pass the same way. The stamp is written to a
//! private temporary name and renamed into place, so readers see a whole stamp or none; a store
//! that cannot be written (a read-only copy) is checked at every open instead.

use std::path::Path;

use strata_io::progress::Progress;

use crate::check::{check_store, Problem};
use crate::check_stamp::Stamp;
pub use crate::check_stamp::STAMP;
use crate::error::{Result, StoreError};
use crate::store::Store;

/// Problems named in the error of a store that fails the check.
const NAMED: usize = 3;

/// Opens the store at `path` for training or serving: runs `strata check`'s store checks unless
/// a passed check of the unchanged files is recorded (module documentation), and fails with
/// [`StoreError::Invalid`] naming the first problems when there is any. Cost: nothing but a
/// `stat` per file when the stamp holds; otherwise one streaming read of every array (each
/// `indptr` twice) in a few tens of MiB, reported to `progress` as `check FILE` stages.
pub fn open_checked(path: &Path, progress: &dyn Progress) -> Result<Store> {
    let store = Store::open(path)?;
    if Stamp::recorded(&store) {
        return Ok(store);
    }
    let checked = check_store(path, NAMED, progress)?;
    if checked.problems.is_empty() {
        return Ok(store);
    }
    let named: Vec<String> = checked
        .problems
        .listed
        .iter()
        .take(NAMED)
        .map(problem_text)
        .collect();
    let total = checked.problems.total();
    Err(StoreError::Invalid {
        store: path.to_path_buf(),
        msg: format!(
            "fails `strata check` ({total} problem{}: {}{}), so it is not trained on or served; \
             run `strata check {}` to list every problem",
            if total == 1 { "" } else { "s" },
            named.join("; "),
            if total > named.len() as u64 {
                "; ..."
            } else {
                ""
            },
            path.display()
        ),
    })
}

/// A problem in words, naming its file.
fn problem_text(p: &Problem) -> String {
    if p.message.starts_with(&p.file) {
        p.message.clone()
    } else {
        format!("{}: {}", p.file, p.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{decode_ints, encode_ints, read_all_bytes};
    use crate::generate::{hetsbm, HetSbmOptions};
    use crate::NoProgress;

    /// Moves CSC index `i` of the store at `out` to the next node: still in range, but CSC no
    /// longer holds CSR's edges.
    fn shift_csc_index(out: &Path, i: usize) {
        let path = out.join("csc_indices.npy");
        let (h, data) = read_all_bytes(&path).unwrap();
        let (mut vals, mut enc) = (Vec::new(), Vec::new());
        decode_ints(&data, h.dtype, &mut vals);
        let n = Store::open(out).unwrap().manifest().graph.num_nodes as i64;
        vals[i] = (vals[i] + 1) % n;
        encode_ints(&vals, h.dtype, &mut enc);
        let mut file = std::fs::read(&path).unwrap();
        file[h.data_offset as usize..].copy_from_slice(&enc);
        std::fs::write(&path, file).unwrap();
    }

    #[test]
    fn a_pass_is_recorded_and_a_changed_file_is_checked_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = HetSbmOptions::new(dir.path().join("g.strata"));
        (o.papers, o.authors, o.institutions, o.fields) = (300, 400, 10, 50);
        (o.feature_dim, o.threads) = (4, 1);
        hetsbm(&o, &NoProgress).unwrap();
        assert!(!o.out.join(STAMP).exists());
        open_checked(&o.out, &NoProgress).unwrap();
        assert!(Stamp::recorded(&Store::open(&o.out).unwrap()));
        shift_csc_index(&o.out, 5);
        let err = open_checked(&o.out, &NoProgress).unwrap_err().to_string();
        assert!(
            err.contains("csc_indices.npy: the edges into nodes"),
            "{err}"
        );
        assert!(err.contains("strata check"), "{err}");
        // The stale stamp stays, but no longer matches the files.
        assert!(!Stamp::recorded(&Store::open(&o.out).unwrap()));
    }
}
