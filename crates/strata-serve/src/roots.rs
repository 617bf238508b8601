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

    /// Refuses (`PERMISSION_DENIED`) the embedding run at `run` (already resolved under a root)
    /// when the store it was trained on, which the run opens by the path its `run.json` names,
    /// lies outside every root or is missing; a `run.json` that is not a run's record is
    /// `INVALID_ARGUMENT`. Messages name neither that path nor any of the file's bytes. A
    /// directory without `run.json` passes: registering it says it is not a run.
    pub fn check_run_store(&self, field: &str, run: &Path) -> Result<()> {
        if !run.join("run.json").exists() {
            return Ok(());
        }
        let Some(store) = run_store(run) else {
            return Err(ServeError::InvalidArgument(format!(
                "{field}: its run.json is not the record of a `strata embed train` run"
            )));
        };
        if store.canonicalize().is_ok_and(|s| self.holds(&s)) {
            return Ok(());
        }
        Err(ServeError::PermissionDenied(format!(
            "{field}: the store this run was trained on (named in its run.json) is missing or \
             not under a data root of this server; put the store under a --data-root directory"
        )))
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

/// Largest `run.json` read: a run's record is a few KiB; anything larger is not one.
const RUN_RECORD_LIMIT: u64 = 1 << 20;

/// The store path the run at `run` names in its `run.json` (a regular file of at most
/// [`RUN_RECORD_LIMIT`] bytes holding a JSON object with a string `store`), if it names one.
pub fn run_store(run: &Path) -> Option<PathBuf> {
    let record = run.join("run.json");
    let meta = std::fs::metadata(&record).ok()?;
    if !meta.is_file() || meta.len() > RUN_RECORD_LIMIT {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).ok()?).ok()?;
    Some(PathBuf::from(value.get("store")?.as_str()?))
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
    fn a_run_is_refused_when_its_store_lies_outside_the_roots() {
        let d = tempfile::tempdir().unwrap();
        let (root, out) = (d.path().join("root"), d.path().join("out"));
        for dir in [
            root.join("run"),
            root.join("g.strata"),
            out.join("g.strata"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let roots = DataRoots::new(std::slice::from_ref(&root), "k").unwrap();
        let record = |store: &Path| {
            let text = serde_json::json!({"store": store, "num_nodes": 3}).to_string();
            std::fs::write(root.join("run/run.json"), text).unwrap();
        };
        record(&root.join("g.strata"));
        roots.check_run_store("f", &root.join("run")).unwrap();
        record(&out.join("g.strata"));
        let e = roots.check_run_store("f", &root.join("run")).unwrap_err();
        assert!(matches!(e, ServeError::PermissionDenied(_)), "{e}");
        assert!(!e.to_string().contains("out"), "{e}");
        std::fs::write(root.join("run/run.json"), b"root:x:0:0").unwrap();
        let e = roots.check_run_store("f", &root.join("run")).unwrap_err();
        assert!(matches!(e, ServeError::InvalidArgument(_)) && !e.to_string().contains("root:x"));
        std::fs::remove_file(root.join("run/run.json")).unwrap();
        roots.check_run_store("f", &root.join("run")).unwrap();
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
