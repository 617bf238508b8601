//! Opening (with validation) and atomically building a store directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use strata_io::durable;

use crate::array::NpyWriter;
use crate::error::{Result, StoreError};
use crate::manifest::{ArrayInfo, Manifest, FORMAT_NAME, FORMAT_VERSION};
use crate::npy::{self, DType, DATA_OFFSET};

/// Name of the manifest file inside a store directory.
pub const MANIFEST: &str = "manifest.json";

/// Why a `NAME.partial-PID` directory is never opened, even when it holds a manifest.
pub const PARTIAL_REFUSAL: &str = "this is an unfinished output (a `.partial-PID` directory that an interrupted or still running conversion left); it is never a valid store: run the conversion again";

/// An open, validated store.
#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
    manifest: Manifest,
}

/// Why `path`, which holds no manifest, is not a store: a file, one of Strata's other
/// directories (named by the marker file its engine writes, so that a command given a grid or a
/// run says so), or a directory without one.
fn not_a_store(path: &Path) -> String {
    if !path.is_dir() {
        return "not a Strata store: a file, where a store is a directory".into();
    }
    if path.join("grid.json").is_file() {
        return "not a Strata store but a grid (`strata grid info` describes it)".into();
    }
    if path.join("run.json").is_file() {
        return "not a Strata store but a run directory (its run.json names its store)".into();
    }
    format!(
        "not a Strata store: {MANIFEST} is missing (an interrupted conversion leaves only a .partial directory)"
    )
}

impl Store {
    /// Opens the store at `path` and validates it: format and version, every array the manifest
    /// requires present with the declared dtype and shape, data at the 4096-byte offset, and
    /// each file exactly as long as its shape says. Data values are not read, so opening costs
    /// a few `stat`s and header reads whatever the store's size.
    pub fn open(path: &Path) -> Result<Store> {
        let invalid = |msg: String| StoreError::Invalid {
            store: path.to_path_buf(),
            msg,
        };
        if !path.exists() {
            return Err(StoreError::bad_file(path, "no such store"));
        }
        if durable::is_partial(path) {
            return Err(invalid(PARTIAL_REFUSAL.into()));
        }
        let manifest_path = path.join(MANIFEST);
        if !path.is_dir() || !manifest_path.exists() {
            return Err(invalid(not_a_store(path)));
        }
        // Bytes, not a String: a manifest that is not UTF-8 is a damaged store, not an I/O error.
        let text =
            std::fs::read(&manifest_path).map_err(|e| StoreError::os("read", &manifest_path, e))?;
        let raw: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| invalid(format!("{MANIFEST} is not valid JSON: {e}")))?;
        if raw.get("format").and_then(|v| v.as_str()) != Some(FORMAT_NAME) {
            return Err(invalid(format!(
                "{MANIFEST} does not say \"format\": \"{FORMAT_NAME}\""
            )));
        }
        let version = raw
            .get("format_version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| invalid(format!("{MANIFEST} has no integer format_version")))?;
        if version > FORMAT_VERSION as u64 {
            return Err(StoreError::NewerFormat {
                store: path.to_path_buf(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if version == 0 {
            return Err(invalid("format_version 0 does not exist".into()));
        }
        let manifest: Manifest = serde_json::from_value(raw)
            .map_err(|e| invalid(format!("{MANIFEST} does not match the format: {e}")))?;
        validate_arrays(path, &manifest)?;
        Ok(Store {
            path: path.to_path_buf(),
            manifest,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest entry of array `name`, if the store has it.
    pub fn array(&self, name: &str) -> Option<&ArrayInfo> {
        self.manifest.arrays.get(name)
    }

    /// The manifest entry of array `name`, or an error naming the missing array.
    pub fn require(&self, name: &str) -> Result<&ArrayInfo> {
        self.array(name).ok_or_else(|| StoreError::Invalid {
            store: self.path.clone(),
            msg: format!("it has no '{name}' array"),
        })
    }

    /// Path of the file holding array `name`.
    pub fn array_path(&self, name: &str) -> Result<PathBuf> {
        Ok(self.path.join(&self.require(name)?.file))
    }

    /// Bytes on disk per file (aliases counted once), sorted by file name.
    pub fn disk_usage(&self) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for info in self.manifest.arrays.values() {
            let p = self.path.join(&info.file);
            let len = std::fs::metadata(&p)
                .map_err(|e| StoreError::os("stat", &p, e))?
                .len();
            out.insert(info.file.clone(), len);
        }
        let m = self.path.join(MANIFEST);
        out.insert(
            MANIFEST.to_string(),
            std::fs::metadata(&m)
                .map_err(|e| StoreError::os("stat", &m, e))?
                .len(),
        );
        Ok(out)
    }
}

fn validate_arrays(store: &Path, manifest: &Manifest) -> Result<()> {
    match array_problems(store, manifest).into_iter().next() {
        Some(msg) => Err(StoreError::Invalid {
            store: store.to_path_buf(),
            msg,
        }),
        None => Ok(()),
    }
}

/// Every disagreement within the manifest's fields and between the manifest and the array
/// files of the store at `store` (what [`Store::open`] checks), one message each; `strata
/// check` lists them all.
pub(crate) fn array_problems(store: &Path, manifest: &Manifest) -> Vec<String> {
    let mut problems = manifest.field_problems();
    let fmt_shape = |s: &[Option<u64>]| {
        let parts: Vec<String> = s
            .iter()
            .map(|d| d.map_or("*".to_string(), |v| v.to_string()))
            .collect();
        format!("({})", parts.join(", "))
    };
    for exp in manifest.expected_arrays() {
        let Some(info) = manifest.arrays.get(&exp.name) else {
            problems.push(format!(
                "the manifest lists no '{}' array, which its contents require",
                exp.name
            ));
            continue;
        };
        let shape_ok = info.shape.len() == exp.shape.len()
            && info
                .shape
                .iter()
                .zip(&exp.shape)
                .all(|(have, want)| want.is_none_or(|w| w == *have));
        if info.dtype != exp.dtype || !shape_ok {
            problems.push(format!(
                "array '{}' is declared as {} {:?} but the graph requires {} {}",
                exp.name,
                info.dtype,
                info.shape,
                exp.dtype,
                fmt_shape(&exp.shape)
            ));
        }
    }
    for (name, info) in &manifest.arrays {
        if info.file.contains('/') || info.file.starts_with('.') {
            problems.push(format!(
                "array '{name}' points outside the store: '{}'",
                info.file
            ));
            continue;
        }
        let path = store.join(&info.file);
        let Ok(meta) = std::fs::metadata(&path) else {
            problems.push(format!("array '{name}': file {} is missing", info.file));
            continue;
        };
        let header = match npy::read_header(&path) {
            Ok(h) => h,
            Err(e) => {
                problems.push(format!("array '{name}': {e}"));
                continue;
            }
        };
        if header.dtype != info.dtype || header.shape != info.shape || header.fortran_order {
            problems.push(format!(
                "array '{name}': {} holds {} {:?}{} but the manifest says {} {:?}",
                info.file,
                header.dtype,
                header.shape,
                if header.fortran_order {
                    " in Fortran order"
                } else {
                    ""
                },
                info.dtype,
                info.shape
            ));
            continue;
        }
        if header.data_offset != DATA_OFFSET {
            problems.push(format!(
                "array '{name}': data in {} starts at byte {} instead of {DATA_OFFSET}",
                info.file, header.data_offset
            ));
            continue;
        }
        let want = DATA_OFFSET + info.data_bytes();
        if meta.len() != want {
            let what = if meta.len() < want {
                "truncated"
            } else {
                "too long"
            };
            problems.push(format!(
                "array '{name}': {} is {what}: expected {want} bytes for {} {:?}, found {}",
                info.file,
                info.dtype,
                info.shape,
                meta.len()
            ));
        }
    }
    problems
}

/// Builds a store in a `.partial-PID` directory beside its destination and renames it into place
/// only when [`StoreBuilder::commit`] succeeds; dropping an uncommitted builder removes it.
pub struct StoreBuilder {
    out: PathBuf,
    tmp: PathBuf,
    overwrite: bool,
    arrays: BTreeMap<String, ArrayInfo>,
    committed: bool,
}

impl StoreBuilder {
    /// Prepares to write a store at `out`. Fails if `out` exists (unless `overwrite` and it is
    /// a Strata store) or if its parent directory does not exist. Removes stale `.partial`
    /// directories of `out` left by processes that no longer run.
    pub fn create(out: &Path, overwrite: bool) -> Result<StoreBuilder> {
        let (parent, name) = output_parent(out)?;
        if durable::is_partial(Path::new(&name)) {
            return Err(StoreError::option(
                "out",
                format!("'{name}' ends like an unfinished output (.partial-DIGITS), which no reader opens; choose another name"),
            ));
        }
        if out.exists() {
            if !overwrite {
                return Err(StoreError::Exists {
                    path: out.to_path_buf(),
                });
            }
            if !out.join(MANIFEST).exists() {
                return Err(StoreError::bad_file(
                    out,
                    "exists and is not a Strata store; refusing to replace it",
                ));
            }
        }
        remove_stale_partials(&parent, &name);
        let tmp = parent.join(format!("{name}.partial-{}", std::process::id()));
        std::fs::create_dir(&tmp).map_err(|e| StoreError::os("mkdir", &tmp, e))?;
        Ok(StoreBuilder {
            out: out.to_path_buf(),
            tmp,
            overwrite,
            arrays: BTreeMap::new(),
            committed: false,
        })
    }

    /// The directory being written.
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// The directory holding the partial store and, once committed, the store.
    pub fn parent_dir(&self) -> &Path {
        self.tmp.parent().expect("a partial store has a parent")
    }

    /// Final destination of the store.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// A directory for temporary files, removed at commit.
    pub fn scratch(&self) -> Result<PathBuf> {
        let p = self.tmp.join(".scratch");
        std::fs::create_dir_all(&p).map_err(|e| StoreError::os("mkdir", &p, e))?;
        Ok(p)
    }

    /// Path of array `name`'s file in the store being built.
    pub fn array_file(&self, name: &str) -> PathBuf {
        self.tmp.join(format!("{name}.npy"))
    }

    /// Starts writing array `name` (file `NAME.npy`).
    pub fn writer(
        &self,
        name: &str,
        dtype: DType,
        row_shape: &[u64],
        buf_bytes: usize,
    ) -> Result<NpyWriter> {
        NpyWriter::create(&self.array_file(name), dtype, row_shape, buf_bytes)
    }

    /// Records a finished array under `name`.
    pub fn add(&mut self, name: &str, info: ArrayInfo) {
        self.arrays.insert(name.to_string(), info);
    }

    /// Records `name` as another name for the already added array `same_as`.
    pub fn alias(&mut self, name: &str, same_as: &str) {
        let info = self.arrays[same_as].clone();
        self.arrays.insert(name.to_string(), info);
    }

    /// The arrays added so far.
    pub fn arrays(&self) -> &BTreeMap<String, ArrayInfo> {
        &self.arrays
    }

    /// Writes the manifest (with the recorded arrays), validates the result, and publishes the
    /// directory with [`durable::publish_dir`]: every file, the directory and its parent fsynced
    /// before the rename (an atomic exchange with an existing store when overwriting), the parent
    /// again after it. A kill before the rename leaves only the `.partial-PID` directory, which
    /// [`Store::open`] refuses.
    pub fn commit(mut self, mut manifest: Manifest) -> Result<Store> {
        manifest.arrays = std::mem::take(&mut self.arrays);
        // Version 1 unless the contents need 2, so plain stores stay readable by older readers.
        manifest.format_version = manifest.required_version();
        let scratch = self.tmp.join(".scratch");
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch).map_err(|e| StoreError::os("remove", &scratch, e))?;
        }
        let text = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
        let mpath = self.tmp.join(MANIFEST);
        write_synced(&mpath, text.as_bytes())?;
        durable::fault_point("store.manifest_written");
        validate_arrays(&self.tmp, &manifest)?;
        // Kept in the store before it is published: a distributed run compares it across ranks.
        crate::digest::content_digest(&self.tmp, MANIFEST)?;
        if self.out.exists() && !self.overwrite {
            return Err(StoreError::Exists {
                path: self.out.clone(),
            });
        }
        durable::publish_dir(&self.tmp, &self.out, "store")?;
        self.committed = true;
        Store::open(&self.out)
    }
}

impl Drop for StoreBuilder {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| StoreError::os("create", path, e))?;
    f.write_all(bytes)
        .map_err(|e| StoreError::os("write", path, e))?;
    f.sync_all().map_err(|e| StoreError::os("fsync", path, e))
}

/// The parent directory (which must exist) and file name of an output path.
pub fn output_parent(out: &Path) -> Result<(PathBuf, String)> {
    let name = out
        .file_name()
        .ok_or_else(|| {
            StoreError::option(
                "out",
                format!(
                    "'{}' does not end in a file or directory name",
                    out.display()
                ),
            )
        })?
        .to_string_lossy()
        .into_owned();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // The nearest existing ancestor being a file is the real reason, not a missing directory.
    if let Some(file) = parent
        .ancestors()
        .find(|a| a.exists())
        .filter(|a| !a.is_dir())
    {
        return Err(StoreError::option(
            "out",
            format!(
                "{} is a file, not a directory, so '{}' cannot be created under it",
                file.display(),
                out.display()
            ),
        ));
    }
    if !parent.is_dir() {
        return Err(StoreError::bad_file(
            &parent,
            "the output's parent directory does not exist",
        ));
    }
    Ok((parent, name))
}

/// Removes a file or a directory tree, if it exists.
pub(crate) fn remove_path(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let r = if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    r.map_err(|e| StoreError::os("remove", path, e))
}

/// Removes `NAME.partial-PID` files and directories in `parent` left by processes that are
/// gone (a killed conversion or generation), and this process's own.
pub fn remove_stale_partials(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = format!("{name}.partial-");
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive || pid == std::process::id() as i32 {
            let _ = remove_path(&entry.path());
        }
    }
}
