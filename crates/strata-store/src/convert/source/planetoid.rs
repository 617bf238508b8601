//! `planetoid`: the Planetoid citation datasets (`ind.NAME.{x,tx,allx,y,ty,ally,graph,test.index}`,
//! as Kipf's GCN and PyG ship them). Their arrays are Python pickles, so the front end reads
//! them and stages them as NumPy arrays.

use std::path::{Path, PathBuf};

use super::numpy::Numpy;
use super::plugin::{
    missing, sorted_entries, staged_by_front_end, usage, EdgeSource, Inputs, SourcePlan,
};
use crate::convert::{ConvertOptions, GraphOptions, Summary};
use crate::error::Result;
use crate::registry::Named;
use strata_io::progress::Progress;

#[derive(Debug)]
pub struct Planetoid;

impl Named for Planetoid {
    const NAME: &'static str = "planetoid";
    const HELP: &'static str =
        "Planetoid citation datasets (ind.NAME.* files), read by the front end";
}

/// The files of one Planetoid dataset, `ind.NAME.PART`.
const PARTS: [&str; 8] = ["x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"];

/// Whether `path` names a Planetoid prefix (`DIR/ind.NAME`) in an existing directory.
fn is_prefix(path: &Path) -> bool {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    parent.is_dir() && name_of(path).starts_with("ind.")
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned())
}

/// Names of the Planetoid datasets whose files are all present in `dir`, sorted.
fn datasets_in(dir: &Path) -> Vec<String> {
    let Ok(entries) = sorted_entries(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .iter()
        .map(|p| name_of(p))
        .filter_map(|n| {
            let rest = n.strip_prefix("ind.")?.strip_suffix(".x")?;
            (!rest.contains('.')).then(|| rest.to_string())
        })
        .filter(|n| {
            PARTS
                .iter()
                .all(|part| dir.join(format!("ind.{n}.{part}")).exists())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

impl EdgeSource for Planetoid {
    fn detect(&self, inputs: &Inputs) -> bool {
        match inputs.dir {
            Some(dir) => !datasets_in(dir).is_empty(),
            None => inputs
                .files
                .first()
                .is_some_and(|p| is_prefix(p) && !p.exists()),
        }
    }

    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan> {
        let (dir, name) = match inputs.dir {
            Some(dir) => {
                let found = datasets_in(dir);
                if found.is_empty() {
                    return Err(missing(
                        dir,
                        "no complete set of Planetoid files ind.NAME.{x,tx,allx,y,ty,ally,graph,test.index}",
                    ));
                }
                let only = if found.len() == 1 {
                    found[0].as_str()
                } else {
                    ""
                };
                let name = opts.name.as_deref().unwrap_or(only).to_lowercase();
                if !found.contains(&name) {
                    return Err(usage(format!(
                        "convert.name: {} holds Planetoid datasets {}; choose one with --name",
                        dir.display(),
                        found.join(", ")
                    )));
                }
                (dir.to_path_buf(), name)
            }
            None => {
                let prefix = &inputs.files[0];
                let name = name_of(prefix);
                let parent = prefix.parent().map_or(PathBuf::new(), Path::to_path_buf);
                (
                    parent,
                    name.split_once('.').map_or("", |(_, n)| n).to_string(),
                )
            }
        };
        let mut plan = SourcePlan::edges(&Planetoid, vec![], vec![], vec![]);
        for part in PARTS {
            let path = dir.join(format!("ind.{name}.{part}"));
            plan.files.insert(part.into(), path);
        }
        plan.dataset = Some((dir, name));
        plan.options = &["name", "node_split", "feature_dtype"];
        plan.staged_as = Some(Numpy::NAME);
        Ok(plan)
    }

    fn convert(
        &self,
        plan: &SourcePlan,
        _: &ConvertOptions,
        _: GraphOptions,
        _: &dyn Progress,
    ) -> Result<Summary> {
        Err(staged_by_front_end(plan))
    }
}
