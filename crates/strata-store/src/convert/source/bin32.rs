//! `bin32`: raw little-endian int32 `(src, dst)` pairs (`.bin`, `.bin32`), as graph benchmark
//! suites write them.

use std::path::{Path, PathBuf};

use super::plugin::{has_suffix, plan_split_dir, EdgeSource, Inputs, SourcePlan};
use crate::convert::edges::{BatchSink, EdgeInput, EdgeStream};
use crate::convert::numpy::{check_bin32, stream_bin32};
use crate::convert::{convert_binary, BinaryJob, ConvertOptions, GraphOptions, Summary};
use crate::error::{Result, StoreError};
use crate::registry::Named;
use strata_io::progress::Progress;

#[derive(Debug)]
pub struct Bin32;

impl Named for Bin32 {
    const NAME: &'static str = "bin32";
    const HELP: &'static str = "raw little-endian int32 (src, dst) pairs (.bin, .bin32)";
}

impl EdgeSource for Bin32 {
    fn detect(&self, inputs: &Inputs) -> bool {
        // A directory's split files are text unless the format is given.
        inputs.dir.is_none()
            && inputs
                .files
                .iter()
                .all(|p| has_suffix(p, &[".bin", ".bin32"]))
    }

    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan> {
        match inputs.dir {
            Some(dir) => plan_split_dir(&Bin32, dir, opts),
            None => Ok(SourcePlan::edges(
                &Bin32,
                inputs.files.to_vec(),
                opts.valid.clone(),
                opts.test.clone(),
            )),
        }
    }

    fn convert(
        &self,
        plan: &SourcePlan,
        _: &ConvertOptions,
        graph: GraphOptions,
        progress: &dyn Progress,
    ) -> Result<Summary> {
        let inputs = plan.inputs();
        convert_binary(&BinaryJob { graph, inputs }, progress)
    }

    fn open(
        &self,
        plan: &SourcePlan,
        _: &ConvertOptions,
        _: &Path,
        _: &dyn Progress,
    ) -> Result<EdgeInput> {
        if plan.train.is_empty() {
            return Err(StoreError::option("inputs", "no input files given"));
        }
        for p in &plan.train {
            check_bin32(p)?;
        }
        Ok(EdgeInput::new(Pairs(plan.train.clone())))
    }

    fn streams(&self) -> bool {
        true
    }
}

/// Raw int32 pair files, checked to hold whole pairs, read in place.
struct Pairs(Vec<PathBuf>);

impl EdgeStream for Pairs {
    fn format(&self) -> &'static str {
        Bin32::NAME
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.0.clone()
    }

    fn edges(&self) -> Result<u64> {
        Ok(self.input_bytes()? / 8)
    }

    fn input_bytes(&self) -> Result<u64> {
        self.0.iter().map(|p| check_bin32(p)).sum()
    }

    fn stream_bytes(&self) -> Result<u64> {
        self.input_bytes()
    }

    fn stream(&self, num_nodes: Option<u64>, io_chunk: usize, sink: &mut BatchSink) -> Result<()> {
        for p in &self.0 {
            stream_bin32(p, num_nodes, io_chunk, &mut *sink)?;
        }
        Ok(())
    }
}
