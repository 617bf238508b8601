use std::path::PathBuf;

/// Everything that can go wrong while writing, reading or converting a store.
///
/// Each variant names the file (and line, field or array) at fault so that the message alone
/// tells the user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Io(#[from] strata_io::IoError),

    /// A malformed line or value in an input file.
    #[error("{}:{line}: {msg}", path.display())]
    Input {
        path: PathBuf,
        line: u64,
        msg: String,
    },

    /// An input file that is unusable as a whole (empty, wrong size, wrong shape).
    #[error("{}: {msg}", path.display())]
    BadFile { path: PathBuf, msg: String },

    /// A store whose manifest or arrays do not agree.
    #[error("store {}: {msg}", store.display())]
    Invalid { store: PathBuf, msg: String },

    #[error("store {} was written with format version {found}; this Strata reads format versions up to {supported}: upgrade Strata to open it", store.display())]
    NewerFormat {
        store: PathBuf,
        found: u64,
        supported: u32,
    },

    /// The memory budget cannot hold the minimum a step needs.
    #[error("memory budget of {} is too small: {what} needs at least {}", crate::units::fmt_bytes(*budget), crate::units::fmt_bytes(*needed))]
    Budget {
        budget: u64,
        needed: u64,
        what: String,
    },

    /// The filesystem a job writes to has less free space than the job will write at least:
    /// refused before the first byte ([`crate::disk_room`]).
    #[error("the filesystem of {} has {} free, too little: {what} writes at least {}", path.display(), crate::units::fmt_bytes(*available), crate::units::fmt_bytes(*needed))]
    DiskRoom {
        path: PathBuf,
        available: u64,
        needed: u64,
        what: String,
    },

    /// An option value that is out of range or contradicts another; names the option.
    #[error("option {field}: {msg}")]
    Option { field: String, msg: String },

    #[error("{} already exists; remove it or set overwrite to replace it", path.display())]
    Exists { path: PathBuf },

    /// Options that do not fit the inputs, in the front end's words (`convert: ...`).
    #[error("{0}")]
    Usage(String),

    /// An input that is not there.
    #[error("{}: {msg}", path.display())]
    Missing { path: PathBuf, msg: String },

    #[error("cancelled")]
    Cancelled,
}

impl From<strata_io::progress::Cancelled> for StoreError {
    fn from(_: strata_io::progress::Cancelled) -> Self {
        StoreError::Cancelled
    }
}

impl StoreError {
    pub(crate) fn input(path: impl Into<PathBuf>, line: u64, msg: impl Into<String>) -> Self {
        StoreError::Input {
            path: path.into(),
            line,
            msg: msg.into(),
        }
    }

    pub(crate) fn bad_file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        StoreError::BadFile {
            path: path.into(),
            msg: msg.into(),
        }
    }

    pub(crate) fn option(field: &str, msg: impl Into<String>) -> Self {
        StoreError::Option {
            field: field.to_string(),
            msg: msg.into(),
        }
    }

    /// Wraps a `std::io::Error` on `path` (for the few places that use std files directly).
    pub(crate) fn os(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        StoreError::Io(strata_io::IoError::os(op, path, 0, source))
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Most characters of an input's text an error message quotes.
pub const QUOTE_CHARS: usize = 40;

/// `text` (a field of an input file) as an error message quotes it: in single quotes, cut
/// after [`QUOTE_CHARS`] characters with `...` and its length in bytes, so that a malformed
/// multi-megabyte field makes a short message rather than one as long as the field.
pub fn quoted(text: &[u8]) -> String {
    // A UTF-8 character is at most 4 bytes: this prefix holds QUOTE_CHARS + 1 of them.
    let head = String::from_utf8_lossy(&text[..text.len().min(4 * (QUOTE_CHARS + 1))]);
    match head.char_indices().nth(QUOTE_CHARS) {
        Some((cut, _)) => format!("'{}...' ({} bytes)", &head[..cut], text.len()),
        None => format!("'{head}'"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_cuts_long_text() {
        assert_eq!(quoted(b"x4"), "'x4'");
        let exact = "é".repeat(QUOTE_CHARS);
        assert_eq!(quoted(exact.as_bytes()), format!("'{exact}'"));
        let long = "7".repeat(10 << 20);
        assert_eq!(
            quoted(long.as_bytes()),
            format!("'{}...' (10485760 bytes)", &long[..QUOTE_CHARS])
        );
    }
}
