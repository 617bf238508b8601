//! Range checks of the values a store's id arrays hold, made by the engines in the pass in
//! which they read them. A store whose files have the right size but wrong values (a bit flip,
//! a hand-edited array) then fails with the array, the row and the allowed range named, e.g.
//! `store g.strata: edges_train.npy row 1234: dst 9999999 is out of range [0, 2708)`, instead of
//! indexing out of bounds later. `strata check` uses the same checks to list every bad value.

use std::path::{Path, PathBuf};

use crate::error::{Result, StoreError};
use crate::store::Store;

/// One column of an id array and the values it may hold: `[lo, hi)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub lo: i64,
    pub hi: i64,
}

impl Field {
    pub fn new(name: &str, lo: i64, hi: i64) -> Field {
        Field {
            name: name.to_string(),
            lo,
            hi,
        }
    }
}

/// A value outside its field's range: row (from the array's start), column and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfRange {
    pub row: u64,
    pub column: usize,
    pub value: i64,
}

/// Checks the rows of one array batch by batch, in order; rows are counted from the array's
/// first row so that errors name the row in the file.
#[derive(Debug, Clone)]
pub struct IdCheck {
    store: PathBuf,
    file: String,
    fields: Vec<Field>,
    row: u64,
}

/// Saturating conversion of a count or bound to the `i64` the values are decoded as.
fn bound(x: u64) -> i64 {
    x.min(i64::MAX as u64) as i64
}

impl IdCheck {
    /// A check of file `file` of the store at `store` whose rows hold one value per field.
    pub fn new(store: &Path, file: &str, fields: Vec<Field>) -> IdCheck {
        IdCheck {
            store: store.to_path_buf(),
            file: file.to_string(),
            fields,
            row: 0,
        }
    }

    /// The check of edge array `array` (`edges_train`, ...): `src` and `dst` in
    /// `[0, num_nodes)`, and `rel` in `[0, num_relations)` when the edges carry relations.
    pub fn edges(store: &Store, array: &str) -> Result<IdCheck> {
        let g = &store.manifest().graph;
        let (n, r) = (bound(g.num_nodes), bound(g.num_relations));
        let fields = g
            .edge_columns()
            .iter()
            .map(|&c| Field::new(c, 0, if c == "rel" { r } else { n }))
            .collect();
        Ok(Self::new(store.path(), &store.require(array)?.file, fields))
    }

    /// The check of a one-column array of node ids (`csr_indices`, `node_train`, ...) whose
    /// values are called `field` in messages.
    pub fn nodes(store: &Store, array: &str, field: &str) -> Result<IdCheck> {
        let n = bound(store.manifest().graph.num_nodes);
        Ok(Self::new(
            store.path(),
            &store.require(array)?.file,
            vec![Field::new(field, 0, n)],
        ))
    }

    /// The check of `labels`: a class in `[0, num_classes)` or `-1` (unlabelled).
    pub fn labels(store: &Store) -> Result<IdCheck> {
        let classes = store
            .manifest()
            .labels
            .as_ref()
            .map_or(0, |l| l.num_classes);
        Ok(Self::new(
            store.path(),
            &store.require("labels")?.file,
            vec![Field::new("label", -1, bound(classes))],
        ))
    }

    /// The same check starting at row `row` (for arrays read from the middle).
    pub fn from_row(mut self, row: u64) -> IdCheck {
        self.row = row;
        self
    }

    /// Values per row.
    pub fn columns(&self) -> usize {
        self.fields.len()
    }

    /// The file the rows come from.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Rows checked so far (plus the starting row).
    pub fn row(&self) -> u64 {
        self.row
    }

    /// Checks the next rows (`vals` row-major, whole rows) and fails on the first value out
    /// of range.
    pub fn check(&mut self, vals: &[i64]) -> Result<()> {
        let first = self.advance(vals);
        let mut bad = None;
        self.find(first, vals, |b| {
            bad = Some(b);
            false
        });
        match bad {
            Some(b) => Err(self.error(&b)),
            None => Ok(()),
        }
    }

    /// Checks the next rows and calls `f` with the row and the message of every value out of
    /// range.
    pub fn scan(&mut self, vals: &[i64], mut f: impl FnMut(u64, String)) {
        let first = self.advance(vals);
        self.find(first, vals, |b| {
            f(b.row, self.describe(&b));
            true
        });
    }

    /// Counts the rows of `vals`; returns the row number of the first.
    fn advance(&mut self, vals: &[i64]) -> u64 {
        let first = self.row;
        self.row += (vals.len() / self.fields.len()) as u64;
        first
    }

    /// Calls `f` with the values out of range of rows `vals` (the first being row `first`)
    /// until it returns false.
    fn find(&self, first: u64, vals: &[i64], mut f: impl FnMut(OutOfRange) -> bool) {
        for (i, row) in vals.chunks_exact(self.fields.len()).enumerate() {
            for (c, (&v, field)) in row.iter().zip(&self.fields).enumerate() {
                if (v < field.lo || v >= field.hi)
                    && !f(OutOfRange {
                        row: first + i as u64,
                        column: c,
                        value: v,
                    })
                {
                    return;
                }
            }
        }
    }

    /// What is wrong with `bad`, without the store: `FILE row R: FIELD V is out of range [LO, HI)`.
    pub fn describe(&self, bad: &OutOfRange) -> String {
        out_of_range(&self.file, bad.row, &self.fields[bad.column], bad.value)
    }

    /// The store-format error for `bad`.
    pub fn error(&self, bad: &OutOfRange) -> StoreError {
        StoreError::Invalid {
            store: self.store.clone(),
            msg: self.describe(bad),
        }
    }
}

/// `FILE row R: FIELD V is out of range [LO, HI)`.
pub fn out_of_range(file: &str, row: u64, field: &Field, value: i64) -> String {
    format!(
        "{file} row {row}: {} {value} is out of range [{}, {})",
        field.name, field.lo, field.hi
    )
}

/// Checks an offsets array (`indptr`: `N + 1` offsets into `T` indices; a name table's
/// offsets into its bytes; a grid's block index) batch by batch: it starts at 0, never
/// decreases and ends at `T`. One corrupt value is one problem rather than a cascade: an entry
/// below the last good one is blamed alone, and an entry above the ones after it (a spike, which
/// would make every good entry after it look decreasing) is blamed when the next entry shows it,
/// so a bad entry may be reported one entry late.
#[derive(Debug, Clone)]
pub struct IndptrCheck {
    store: PathBuf,
    file: String,
    field: String,
    end: i64,
    /// The last entry known to be good.
    prev: i64,
    /// The entry after `prev` (row, value) when it is in range but not yet known good: the
    /// next entry tells whether it is a spike.
    pending: Option<(u64, i64)>,
    row: u64,
    /// The last entry was bad (and reported).
    last_bad: bool,
}

impl IndptrCheck {
    /// The check of file `file` of the store (or grid) at `store`, whose entries are called
    /// `field` in messages and must end at `end`.
    pub fn new(store: &Path, file: &str, field: &str, end: u64) -> IndptrCheck {
        IndptrCheck {
            store: store.to_path_buf(),
            file: file.to_string(),
            field: field.to_string(),
            end: bound(end),
            prev: 0,
            pending: None,
            row: 0,
            last_bad: false,
        }
    }

    /// The check of array `array` of `store` (`csr_indptr`, ...), which must end at `end`.
    pub fn array(store: &Store, array: &str, end: u64) -> Result<IndptrCheck> {
        let field = if array.ends_with("_indptr") {
            "indptr"
        } else {
            "offset"
        };
        Ok(Self::new(
            store.path(),
            &store.require(array)?.file,
            field,
            end,
        ))
    }

    /// Checks the next entries and calls `f` with every bad one (its row, which may be the
    /// entry before the current one, and message).
    pub fn scan(&mut self, vals: &[i64], mut f: impl FnMut(u64, String)) {
        for &v in vals {
            let row = self.row;
            self.row += 1;
            if let Some((pending_row, pending)) = self.pending {
                if v >= pending {
                    (self.prev, self.pending) = (pending, None);
                } else if v >= self.prev {
                    // The pending entry is above the entries on both sides of it.
                    let field = Field::new(&self.field, self.prev, v + 1);
                    f(
                        pending_row,
                        out_of_range(&self.file, pending_row, &field, pending),
                    );
                    self.pending = None;
                }
            }
            // The first entry must be 0; the others lie in [last entry, end].
            let lo = self.pending.map_or(self.prev, |(_, p)| p);
            let hi = if row == 0 { 1 } else { self.end + 1 };
            self.last_bad = v < lo || v >= hi;
            if self.last_bad {
                let field = Field::new(&self.field, lo, hi);
                f(row, out_of_range(&self.file, row, &field, v));
            } else {
                self.pending = Some((row, v));
            }
        }
    }

    /// Entries checked so far.
    pub fn row(&self) -> u64 {
        self.row
    }

    /// Checks the next entries and fails on the first bad one.
    pub fn check(&mut self, vals: &[i64]) -> Result<()> {
        let mut first = None;
        self.scan(vals, |_, msg| {
            first.get_or_insert(msg);
        });
        match first {
            Some(msg) => Err(self.invalid(msg)),
            None => Ok(()),
        }
    }

    /// After the last entry: the problem if the offsets do not end at `end` (unless the last
    /// entry was already reported).
    pub fn end_problem(&self) -> Option<(u64, String)> {
        let last = self.pending.map_or(self.prev, |(_, p)| p);
        (last != self.end && !self.last_bad).then(|| {
            let row = self.row.saturating_sub(1);
            let msg = format!(
                "{} row {row}: {} ends at {last} but must end at {}",
                self.file, self.field, self.end
            );
            (row, msg)
        })
    }

    /// Fails if the offsets do not end at `end`.
    pub fn finish(&self) -> Result<()> {
        match self.end_problem() {
            Some((_, msg)) => Err(self.invalid(msg)),
            None => Ok(()),
        }
    }

    fn invalid(&self, msg: String) -> StoreError {
        StoreError::Invalid {
            store: self.store.clone(),
            msg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges() -> IdCheck {
        IdCheck::new(
            Path::new("g.strata"),
            "edges_train.npy",
            vec![
                Field::new("src", 0, 10),
                Field::new("rel", 0, 3),
                Field::new("dst", 0, 10),
            ],
        )
    }

    #[test]
    fn names_the_file_row_field_and_range() {
        let mut c = edges();
        c.check(&[0, 0, 9, 9, 2, 0]).unwrap();
        let e = c.check(&[1, 1, 1, 2, 0, 10]).unwrap_err().to_string();
        assert_eq!(
            e,
            "store g.strata: edges_train.npy row 3: dst 10 is out of range [0, 10)"
        );
        assert_eq!(c.row(), 4);
    }

    #[test]
    fn scan_reports_every_bad_value_and_negative_ones() {
        let mut c = edges().from_row(100);
        let mut bad = Vec::new();
        c.scan(&[-1, 0, 0, 0, 3, 11, 0, 0, 0], |row, msg| {
            bad.push((row, msg))
        });
        assert_eq!(
            bad,
            vec![
                (
                    100,
                    "edges_train.npy row 100: src -1 is out of range [0, 10)".to_string()
                ),
                (
                    101,
                    "edges_train.npy row 101: rel 3 is out of range [0, 3)".to_string()
                ),
                (
                    101,
                    "edges_train.npy row 101: dst 11 is out of range [0, 10)".to_string()
                ),
            ]
        );
        assert_eq!(c.row(), 103);
    }

    #[test]
    fn indptr_reports_each_bad_entry_once_and_a_wrong_end() {
        let mut c = IndptrCheck::new(Path::new("g"), "csr_indptr.npy", "indptr", 6);
        let mut bad = Vec::new();
        c.scan(&[0, 2, 99, 3], |row, msg| bad.push((row, msg)));
        c.scan(&[1, 5], |row, msg| bad.push((row, msg)));
        assert_eq!(
            bad,
            vec![
                (
                    2,
                    "csr_indptr.npy row 2: indptr 99 is out of range [2, 7)".to_string()
                ),
                (
                    4,
                    "csr_indptr.npy row 4: indptr 1 is out of range [3, 7)".to_string()
                ),
            ]
        );
        assert_eq!(
            c.finish().unwrap_err().to_string(),
            "store g: csr_indptr.npy row 5: indptr ends at 5 but must end at 6"
        );
        // A spike within range is the one problem, not the good entries after it.
        let mut c = IndptrCheck::new(Path::new("g"), "csr_indptr.npy", "indptr", 10);
        let mut bad = Vec::new();
        c.scan(&[0, 2, 8, 3, 4, 5, 6], |row, msg| bad.push((row, msg)));
        c.scan(&[7, 10], |row, msg| bad.push((row, msg)));
        assert_eq!(
            bad,
            vec![(
                2,
                "csr_indptr.npy row 2: indptr 8 is out of range [2, 4)".to_string()
            )]
        );
        assert_eq!(c.end_problem(), None);
        let mut first = IndptrCheck::new(Path::new("g"), "csr_indptr.npy", "indptr", 0);
        let e = first.check(&[3]).unwrap_err().to_string();
        assert!(e.ends_with("row 0: indptr 3 is out of range [0, 1)"), "{e}");
    }
}
