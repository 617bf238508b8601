//! The data roots: the only directories whose stores, embedding runs and model files a client
//! may name (`--data-root`). A path is resolved (symlinks and `..` followed) before it is
//! checked, so a link inside a root that leads out is refused, and every refusal reads the
//! same whether or not the path exists, so a client learns nothing about the rest of the
//! server's file system.

use std::path::{Component, Path, PathBuf};

use crate::error::{Result, ServeError};

/// Canonical directories; a path is readable when it resolves to one of them or below.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataRoots {
    roots: Vec<PathBuf>,
}

impl DataRoots {
    /// The roots `dirs`, each resolved now (a root that is a symlink is the directory it leads
    /// to). Refuses (`INVALID_ARGUMENT`, naming option `key`) one that is not a directory.
    pub fn new(dirs: &[PathBuf], key: &str) -> Result<DataRoots> {
        let roots = dirs
            .iter()
            .map(|d| match d.canonicalize() {
                Ok(c) if c.is_dir() => Ok(c),
                _ => Err(ServeError::InvalidArgument(format!(
                    "{key}: {} is not a directory",
                    d.display()
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DataRoots { roots })
    }

    /// The roots, resolved.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.roots
    }

    fn holds(&self, path: &Path) -> bool {
        self.roots.iter().any(|r| path.starts_with(r))
    }

    /// The resolved path of `sent` (request field `field`, relative paths taken from the
    /// server's working directory) when it lies under a root. A path outside every root, or
    /// one whose existing part resolves outside, is `PERMISSION_DENIED` with the same message
    /// whether or not it exists; a missing path under a root is `NOT_FOUND`.
    pub fn resolve(&self, field: &str, sent: &str) -> Result<PathBuf> {
        let path = Path::new(sent);
        if let Ok(real) = path.canonicalize() {
            return if self.holds(&real) {
                Ok(real)
            } else {
                Err(self.refusal(field, sent))
            };
        }
        // Missing: say so only when its deepest existing ancestor lies under a root and the
        // rest cannot climb back out (no `..` after the point that exists).
        let absolute = std::path::absolute(path).map_err(|_| self.refusal(field, sent))?;
        for ancestor in absolute.ancestors().skip(1) {
            let Ok(real) = ancestor.canonicalize() else {
                continue;
            };
            let rest = absolute.strip_prefix(ancestor).unwrap_or(Path::new(""));
            let climbs = rest.components().any(|c| c == Component::ParentDir);
            if self.holds(&real) && !climbs {
                return Err(ServeError::NotFound(format!(
                    "{field}: {sent} does not exist under the server's data roots"
                )));
            }
            break;
        }
        Err(self.refusal(field, sent))
    }

    fn refusal(&self, field: &str, sent: &str) -> ServeError {
        let hint = if self.roots.is_empty() {
            "this server was given no data roots and no stores at start (start it with \
             --data-root DIR)"
        } else {
            "the server reads stores, embedding runs and model files only under its \
             --data-root directories"
        };
        ServeError::PermissionDenied(format!(
            "{field}: {sent} is not under a data root of this server; {hint}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn code(r: Result<PathBuf>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(ServeError::PermissionDenied(_)) => "denied",
            Err(ServeError::NotFound(_)) => "missing",
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn paths_resolve_before_they_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let (root, out) = (d.path().join("root"), d.path().join("out"));
        for dir in [root.join("a"), out.clone()] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(out.join("secret"), b"x").unwrap();
        symlink(&out, root.join("link")).unwrap();
        let roots = DataRoots::new(std::slice::from_ref(&root), "k").unwrap();
        let s = |p: PathBuf| p.display().to_string();
        let inside = roots.resolve("f", &s(root.join("a/../a"))).unwrap();
        assert_eq!(inside, root.canonicalize().unwrap().join("a"));
        assert_eq!(
            code(roots.resolve("f", &s(root.join("../out/secret")))),
            "denied"
        );
        assert_eq!(
            code(roots.resolve("f", &s(root.join("link/secret")))),
            "denied"
        );
        assert_eq!(
            code(roots.resolve("f", &s(root.join("link/none")))),
            "denied"
        );
        assert_eq!(
            code(roots.resolve("f", &s(root.join("a/none/../../..")))),
            "denied"
        );
        assert_eq!(code(roots.resolve("f", &s(root.join("a/none")))), "missing");
        assert_eq!(code(roots.resolve("f", "/etc/passwd")), "denied");
    }

    #[test]
    fn a_refusal_does_not_tell_whether_the_path_exists() {
        let d = tempfile::tempdir().unwrap();
        let roots = DataRoots::new(&[d.path().to_path_buf()], "k").unwrap();
        let msg = |p: &str| {
            roots
                .resolve("path", p)
                .unwrap_err()
                .to_string()
                .replace(p, "P")
        };
        assert_eq!(msg("/etc/passwd"), msg("/etc/no-such-file"));
        assert_eq!(msg("/etc/passwd"), msg("/no-such-dir/x"));
        assert!(msg("/etc/passwd").starts_with("path: P is not under a data root"));
        // No roots at all: everything is refused, and the message says how to give one.
        let none = DataRoots::default();
        let e = none.resolve("path", "/tmp").unwrap_err().to_string();
        assert!(e.contains("--data-root DIR"), "{e}");
    }

    #[test]
    fn a_root_must_be_a_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"").unwrap();
        let e = DataRoots::new(&[d.path().join("f")], "serve.data_root")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("serve.data_root: ") && e.ends_with("is not a directory"));
    }
}
