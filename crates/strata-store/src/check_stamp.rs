//! The record of a passed check in a store ([`STAMP`]): the checks' version and every file's
//! stamp as it was checked (see [`crate::verified`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use strata_io::durable;

use crate::file_stamp::{self, FileStamp};
use crate::store::{Store, MANIFEST};

/// File of the store recording its last passed check.
pub const STAMP: &str = "checked.json";
/// Version of the checks a stamp vouches for: raised whenever `strata check` checks more, so
/// stamps written by older checks are not trusted.
const CHECKS_VERSION: u32 = 1;
/// What a passed check vouches for: the checks' version and every file as it was checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stamp {
    checks_version: u32,
    files: BTreeMap<String, FileStamp>,
}

impl Stamp {
    /// The names of `store`'s files a check reads: the manifest and every array file.
    fn files(store: &Store) -> BTreeSet<&str> {
        std::iter::once(MANIFEST)
            .chain(store.manifest().arrays.values().map(|a| a.file.as_str()))
            .collect()
    }

    /// The stamp of `store`'s files as they are now; `None` when one cannot be `stat`ed (the
    /// check then reports it).
    pub(crate) fn of(store: &Store) -> Option<Stamp> {
        Some(Stamp {
            checks_version: CHECKS_VERSION,
            files: file_stamp::stamps(store.path(), Stamp::files(store)).ok()?,
        })
    }

    /// Whether `store` records a passed check of its files as they are now.
    pub(crate) fn recorded(store: &Store) -> bool {
        std::fs::read(store.path().join(STAMP))
            .ok()
            .and_then(|b| serde_json::from_slice::<Stamp>(&b).ok())
            .is_some_and(|s| {
                s.checks_version == CHECKS_VERSION
                    && file_stamp::unchanged(store.path(), &s.files, Stamp::files(store))
            })
    }

    /// Records the stamp in the store at `path`, best effort: a store that cannot be written is
    /// simply checked again at its next open.
    pub(crate) fn record(&self, path: &Path) {
        let text = serde_json::to_vec_pretty(self).expect("a stamp serialises");
        let _ = durable::replace_file(&path.join(STAMP), &text);
    }
}
