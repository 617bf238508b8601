//! `strata grid build INPUT --out DIR`: a grid straight from an input edge list, for users who
//! only want analytics and would otherwise pay for a whole store (CSR, CSC) first.
//!
//! The input is planned and opened by its input format as `strata convert` plans it
//! ([`strata_store::convert::source`]): raw int32 pairs and NumPy edge arrays are read in
//! place, text through the text converter's parse (names get its sorted name table, which the
//! grid keeps). The grid is the one a store's build writes
//! (same passes, same format, same files, compressed blocks included), in a directory of its own that `strata run`
//! takes in place of a store; a node name table, when the ids were names, sits beside the
//! arrays (`node_names_offsets.npy`, `node_names_bytes.npy`, listed in `grid.json`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Deserialize;
use strata_io::progress::Progress;
use strata_store::config::Size;
use strata_store::convert::edges::EdgeInput;
use strata_store::convert::source::open;
use strata_store::convert::{plan_inputs, ConvertOptions};
use strata_store::StoreError;

use crate::block_codec::Compression;
use crate::build::{
    dir_bytes, plan_layout, publish, write_grid, BuildStage, BuildSummary, GridSpec, PartialDir,
    StageClock,
};
use crate::build_budget::READ_BYTES;
use crate::config::BuildOptions;
use crate::error::{GridError, Result};
use crate::layout::{Order, WeightRequest, WeightSource, WeightSpec, GRID_MANIFEST};

/// A grid to build from an input.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputBuildJob {
    /// The grid's directory (must not exist unless `overwrite`).
    pub out: PathBuf,
    /// The input as `strata convert` reads it (its `out` is unused; `memory` and
    /// `num_nodes` are the build's own).
    pub input: ConvertOptions,
    /// The vertex count; `None`: the largest id + 1 (a counting pass over binary inputs), or
    /// the number of names.
    #[serde(default)]
    pub num_nodes: Option<u64>,
    /// Vertex chunks P; 0 chooses from the vertex count and `memory`.
    #[serde(default)]
    pub partitions: u32,
    #[serde(default)]
    pub order: Order,
    /// Store both directions of every edge.
    #[serde(default)]
    pub symmetrize: bool,
    /// Drop self-loops and store each repeated edge once (`BuildJob::simple`).
    #[serde(default)]
    pub simple: bool,
    /// Weight the edges: the input's weight column (`store` or `auto`) or drawn ones.
    #[serde(default)]
    pub weights: Option<WeightRequest>,
    /// Memory budget of the build and of the runs P is planned for.
    pub memory: Size,
    /// Replace an existing grid at `out`.
    #[serde(default)]
    pub overwrite: bool,
    /// How blocks store their edges: plain records or a code.
    #[serde(default)]
    pub compression: Compression,
    /// What the front end wants recorded (command line, config).
    #[serde(default)]
    pub provenance: serde_json::Value,
}

impl InputBuildJob {
    /// The job of `strata grid build INPUT --out DIR` from its checked `grid.build` section
    /// (`options.out` set); `provenance` is what the front end records in `grid.json`.
    pub fn from_section(options: &BuildOptions, provenance: serde_json::Value) -> Result<Self> {
        let Some(out) = options.out.clone() else {
            return Err(GridError::config(
                "out",
                "a grid built from an input needs its directory (--out DIR)",
            ));
        };
        let store_job = options.job();
        Ok(InputBuildJob {
            input: ConvertOptions {
                inputs: vec![options.store.clone()],
                out: out.clone(),
                format: options.format.into(),
                columns: options.columns.clone(),
                ids: options.ids,
                delimiter: options.delimiter,
                comment: options.comment.clone(),
                header: options.header,
                num_nodes: options.num_nodes,
                layout: options.layout,
                threads: options.threads,
                memory: options.memory,
                ..ConvertOptions::default()
            },
            out,
            num_nodes: options.num_nodes,
            partitions: store_job.partitions,
            order: store_job.order,
            symmetrize: options.symmetrize.unwrap_or(false),
            simple: store_job.simple,
            weights: store_job.weights,
            memory: store_job.memory,
            overwrite: store_job.overwrite,
            compression: store_job.compression,
            provenance,
        })
    }
}

/// Builds the grid `job` asks for from its input.
pub fn build_input(job: &InputBuildJob, progress: &dyn Progress) -> Result<BuildSummary> {
    let t0 = Instant::now();
    if job.num_nodes == Some(0) {
        return Err(GridError::config("num_nodes", "must be positive"));
    }
    crate::build::check_weights(job.weights.as_ref())?;
    crate::build::check_simple(job.simple, job.weights.is_some())?;
    let (parent, name) = output(&job.out, job.overwrite)?;
    strata_store::store::remove_stale_partials(&parent, &name);
    let tmp = parent.join(format!("{name}.partial-{}", std::process::id()));
    let guard = PartialDir::create(&tmp)?;
    let mut stages = Vec::new();
    let mut input = open_input(job, &tmp, &mut stages, progress)?;
    let clock = StageClock::start();
    let n = input.num_nodes(job.num_nodes, READ_BYTES as usize)?;
    if job.num_nodes.is_none() && input.counts_nodes() {
        stages.push(clock.stage("count", input.stream_bytes()?, 0));
    }
    let weights = job
        .weights
        .map(|r| resolve_weights(&r, input.weighted(), &input.paths()))
        .transpose()?;
    let edges = input.edges()?;
    let spec = GridSpec {
        layout: plan_layout(
            n,
            job.partitions,
            job.order,
            edges,
            job.symmetrize,
            job.memory.0,
        )?,
        symmetric: job.symmetrize,
        simple: job.simple,
        weights,
        memory: job.memory.0,
        input_edges: edges,
        input_bytes: input.stream_bytes()?,
        compression: job.compression,
    };
    let plan = spec.plan()?;
    spec.announce(&plan, progress);
    let mut written = write_grid(&spec, &plan, &tmp, progress, |feed| {
        input.stream(Some(n), plan.read_bytes as usize, |run| {
            feed.add(
                bytemuck::cast_slice(run.src),
                bytemuck::cast_slice(run.dst),
                run.weight,
                run.bytes,
            )
        })
    })?;
    if let Some((offsets, bytes)) = input.move_names(&tmp)? {
        written.extra.insert("node_names_offsets".into(), offsets);
        written.extra.insert("node_names_bytes".into(), bytes);
    }
    let (format, paths, input_bytes) = (input.format(), input.paths(), input.input_bytes()?);
    drop(input);
    stages.append(&mut written.stages);
    let manifest = written.manifest(
        &spec,
        serde_json::json!({
            "input": paths,
            "format": format,
            "input_bytes": input_bytes,
            "seconds": t0.elapsed().as_secs_f64(),
            "memory": job.memory,
            "front_end": job.provenance,
        }),
    );
    publish(&tmp, &job.out, &manifest, guard)?;
    Ok(BuildSummary {
        bytes: dir_bytes(&job.out)?,
        dir: job.out.clone(),
        partitions: spec.layout.partitions,
        num_vertices: n,
        num_edges: manifest.num_edges,
        seconds: t0.elapsed().as_secs_f64(),
        stages,
        plan: plan.describe(),
    })
}

/// The output's parent and name: a plain name whose parent exists, and that is free, or a
/// grid that `overwrite` lets the build replace.
fn output(out: &Path, overwrite: bool) -> Result<(PathBuf, String)> {
    let (parent, name) = strata_store::store::output_parent(out)?;
    if strata_io::durable::is_partial(Path::new(&name)) {
        return Err(GridError::config(
            "out",
            format!("'{name}' ends like an unfinished output (.partial-DIGITS), which no reader opens; choose another name"),
        ));
    }
    if out.exists() {
        if !overwrite {
            return Err(StoreError::Exists {
                path: out.to_path_buf(),
            }
            .into());
        }
        if !out.join(GRID_MANIFEST).is_file() {
            return Err(GridError::config(
                "out",
                format!(
                    "{} exists and is not a grid; refusing to replace it",
                    out.display()
                ),
            ));
        }
    }
    Ok((parent, name))
}

/// Opens the job's input as its format plans it; a format that parses its input first (text)
/// does it here (a `parse` stage), its scratch files in `tmp`.
fn open_input(
    job: &InputBuildJob,
    tmp: &Path,
    stages: &mut Vec<BuildStage>,
    progress: &dyn Progress,
) -> Result<EdgeInput> {
    let mut options = job.input.clone();
    (options.memory, options.num_nodes) = (job.memory, job.num_nodes);
    let plan = plan_inputs(&options)?;
    if !plan.valid.is_empty() || !plan.test.is_empty() {
        let input = options.inputs.first().cloned().unwrap_or_default();
        return Err(GridError::config(
            "inputs",
            format!(
                "{} holds train, valid and test files; a grid holds one edge list: give the train file",
                input.display()
            ),
        ));
    }
    let clock = StageClock::start();
    let input = open(&plan, &options, tmp, progress)?;
    if let Some(lines) = input.parse_plan() {
        for line in lines {
            progress.message(line);
        }
        stages.push(clock.stage("parse", input.input_bytes()?, input.stream_bytes()?));
    }
    Ok(input)
}

/// The weights a request gives on an input whose edges come with weights (`has_weights`)
/// or not; `paths` name the input in the refusal.
fn resolve_weights(
    request: &WeightRequest,
    has_weights: bool,
    paths: &[PathBuf],
) -> Result<WeightSpec> {
    if request.source == WeightSource::Store && !has_weights {
        let first = paths.first().map(|p| p.display().to_string());
        return Err(GridError::config(
            "weight_source",
            format!(
                "{} has no weight column: give a text input one (--columns src,dst,weight), or use weight_source random",
                first.unwrap_or_default()
            ),
        ));
    }
    request.resolve(has_weights, Path::new(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{build, BuildJob};
    use crate::fixtures::store;
    use strata_io::progress::NoProgress;

    fn job(out: &Path, bin: &Path) -> InputBuildJob {
        serde_json::from_value(serde_json::json!({
            "out": out,
            "input": {"inputs": [bin], "format": "bin32", "out": out},
            "memory": 64u64 << 20,
        }))
        .unwrap()
    }

    fn bytes(dir: &Path, array: &str) -> Vec<u8> {
        std::fs::read(dir.join(format!("{array}.npy"))).unwrap()
    }

    #[test]
    fn a_grid_from_the_input_is_the_grid_of_its_store() {
        let tmp = tempfile::tempdir().unwrap();
        // 1.5M edges: several read batches and spool buffers per column.
        let st = store(tmp.path(), 10_007, 1_500_000);
        let bin = tmp.path().join("e.bin");
        for (order, symmetrize, weighted, compression) in [
            (Order::Column, false, false, Compression::None),
            (Order::Row, true, false, Compression::None),
            (Order::Column, true, true, Compression::None),
            (Order::Row, false, true, Compression::Packed),
            (Order::Column, true, false, Compression::Byte),
        ] {
            let weights = weighted.then(|| WeightRequest::random(3, 1.0, 2.0));
            let from_store = build(
                &BuildJob {
                    store: st.clone(),
                    partitions: 7,
                    order,
                    symmetrize: Some(symmetrize),
                    weights,
                    memory: Size(64 << 20),
                    overwrite: true,
                    compression,
                    ..Default::default()
                },
                &NoProgress,
            )
            .unwrap();
            let out = tmp.path().join("g.grid");
            let mut j = job(&out, &bin);
            (j.partitions, j.order, j.symmetrize, j.weights) = (7, order, symmetrize, weights);
            (j.overwrite, j.compression) = (true, compression);
            let direct = build_input(&j, &NoProgress).unwrap();
            assert_eq!(direct.num_edges, from_store.num_edges);
            assert_eq!(direct.num_vertices, 10_007, "the largest id + 1");
            assert!(direct.stages.iter().any(|s| s.name == "count"));
            let mut arrays = vec!["block_index", "out_degree", "in_degree"];
            arrays.extend(match compression {
                Compression::None => &["edges"][..],
                _ => &["edge_codes", "code_index"][..],
            });
            if weighted {
                arrays.push("weights");
            }
            for a in arrays {
                assert!(
                    bytes(&from_store.dir, a) == bytes(&out, a),
                    "{a} differs ({order:?}, symmetric {symmetrize})"
                );
            }
            let grid = crate::Grid::open(&out).unwrap();
            assert_eq!(grid.manifest().weights.is_some(), weighted);
            assert_eq!(grid.compression(), compression);
            assert_eq!(grid.store_dir(), None);
        }
    }

    #[test]
    fn bad_input_names_the_file_and_the_pair_and_leaves_no_grid() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("e.bin");
        let pairs: [i32; 6] = [0, 1, 2, 3, 4, -5];
        std::fs::write(&bin, bytemuck::cast_slice::<i32, u8>(&pairs)).unwrap();
        let out = tmp.path().join("g.grid");
        let err = build_input(&job(&out, &bin), &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("e.bin") && err.contains("pair 2 (byte 16): dst id -5 is negative"),
            "{err}"
        );
        let pairs: [i32; 4] = [0, 1, 2, 9];
        std::fs::write(&bin, bytemuck::cast_slice::<i32, u8>(&pairs)).unwrap();
        let mut j = job(&out, &bin);
        j.num_nodes = Some(5);
        let err = build_input(&j, &NoProgress).unwrap_err().to_string();
        assert!(
            err.contains("pair 1: dst id 9 is out of range: num_nodes is 5"),
            "{err}"
        );
        std::fs::write(&bin, [0u8; 12]).unwrap();
        let err = build_input(&job(&out, &bin), &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a whole number of 8-byte"), "{err}");
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("e.bin")]);
    }

    #[test]
    fn inputs_no_format_streams_are_refused_naming_the_formats_that_do() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("g.grid");
        let table = tmp.path().join("e.parquet");
        std::fs::write(&table, b"PAR1").unwrap();
        let mut j = job(&out, &table);
        j.input.format = strata_store::convert::InputFormat::Auto.into();
        let err = build_input(&j, &NoProgress).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "option format: {} is a parquet input; only numpy, bin32, text edge lists are read as a stream: convert it into a store first (`strata convert`)",
                table.display()
            )
        );
        let dir = tmp.path().join("splits");
        std::fs::create_dir(&dir).unwrap();
        for f in ["train.txt", "test.txt"] {
            std::fs::write(dir.join(f), b"0 1\n").unwrap();
        }
        let mut j = job(&out, &dir);
        j.input.format = strata_store::convert::InputFormat::Auto.into();
        let err = build_input(&j, &NoProgress).unwrap_err().to_string();
        assert!(err.contains("holds train, valid and test files"), "{err}");
        assert!(!out.exists());
    }

    #[test]
    fn weights_from_an_input_without_them_are_refused_naming_the_option() {
        let tmp = tempfile::tempdir().unwrap();
        store(tmp.path(), 100, 1000);
        let mut j = job(&tmp.path().join("g.grid"), &tmp.path().join("e.bin"));
        j.weights = Some(WeightRequest {
            source: WeightSource::Store,
            ..WeightRequest::default()
        });
        let err = build_input(&j, &NoProgress).unwrap_err().to_string();
        assert!(
            err.starts_with("option weight_source: ") && err.contains("has no weight column"),
            "{err}"
        );
        j.weights = None;
        build_input(&j, &NoProgress).unwrap();
        let err = build_input(&j, &NoProgress).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
    }
}
