//! Vertex programs of the user's own (`strata run program --program FILE`,
//! `strata.grid.run_program`): arrays with their initial values, an edge function, a combine,
//! assignments applied per vertex, an active set and aggregates, written as expressions
//! ([`expr`]) and compiled to vector code ([`code`]) that runs on the compute threads over
//! batches of each block's edges and each chunk's vertices ([`exec`]), within the budget like
//! any algorithm: its arrays ([`columns`]) live in the run's vertex memory (in memory or in
//! windows), its edge blocks come resident, from far memory or from disk.
//!
//! A program is one registered algorithm ([`Program`]): its parameter is the program, as JSON
//! text or a JSON file ([`spec::ProgramSpec`]); Python reads `.py` and `.toml` programs and
//! hands the engine their JSON.

mod code;
mod columns;
mod exec;
mod expr;
pub mod spec;
#[cfg(test)]
mod tests;

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::algo::{Algorithm, Ctx, IterationValue, Output};
use crate::error::{GridError, Result};
use crate::stream::Streamer;
use spec::Checked;
pub use spec::ProgramSpec;

/// The program algorithm's parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Program {
    /// a vertex program: a .py, .toml or .json file, or the program as JSON text (see
    /// docs/grid.md, "Vertex programs")
    pub program: String,
}

impl Program {
    /// The program's JSON text: the parameter itself, or the `.json` file it names. `None`
    /// when no program is given.
    fn text(&self) -> Result<Option<String>> {
        let given = self.program.trim();
        if given.is_empty() {
            return Ok(None);
        }
        if given.starts_with('{') {
            return Ok(Some(given.to_string()));
        }
        let path = Path::new(given);
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => std::fs::read_to_string(path).map(Some).map_err(|e| {
                GridError::config("program", format!("cannot read {}: {e}", path.display()))
            }),
            Some("py" | "toml") => Err(GridError::config(
                "program",
                format!(
                    "{}: a .py or .toml program is read by Strata's Python front end (strata run, \
                     strata.grid.run_program), which hands the engine its JSON",
                    path.display()
                ),
            )),
            _ => Err(GridError::config(
                "program",
                format!(
                    "{}: expected a .py, .toml or .json program file, or the program as JSON text",
                    path.display()
                ),
            )),
        }
    }

    /// The program, parsed and checked; an error names `program`.
    fn checked(&self) -> Result<Checked> {
        let text = self.text()?.ok_or_else(|| {
            GridError::config(
                "program",
                "the program algorithm runs the vertex program --program names, and none is given",
            )
        })?;
        let spec: ProgramSpec = serde_json::from_str(&text)
            .map_err(|e| GridError::config("program", format!("not a vertex program: {e}")))?;
        spec.check().map_err(|e| GridError::config("program", e))
    }

    /// A property of the checked program, or `default` when it does not check (the run
    /// refuses it in [`Algorithm::check`] before anything asks).
    fn property<T>(&self, default: T, f: impl FnOnce(&Checked) -> T) -> T {
        self.checked().map_or(default, |c| f(&c))
    }
}

impl Algorithm for Program {
    const NAME: &'static str = "program";
    const ABOUT: &'static str = "a vertex program of your own (--program FILE)";
    /// Those the program declares (its `outputs`).
    const ARRAYS: &'static [&'static str] = &[];
    const VALUE: IterationValue = IterationValue::Count("active next");

    /// Its arrays, accumulator, degrees and activity bitmaps.
    fn vertex_bytes(&self) -> u64 {
        self.property(0, Checked::vertex_bytes)
    }

    fn needs_weights(&self) -> bool {
        self.property(false, |c| c.weighted)
    }

    fn needs_symmetric(&self) -> bool {
        self.property(false, |c| c.symmetric)
    }

    /// A program given is checked whichever algorithm runs (none is fine until it runs, and
    /// a `.py` or `.toml` one is the Python front end's to read).
    fn validate(&self) -> Result<()> {
        let given = self.program.trim();
        let ext = Path::new(given).extension();
        if !given.starts_with('{') && ext.is_some_and(|e| e == "py" || e == "toml") {
            return Ok(());
        }
        match self.text()? {
            Some(_) => self.checked().map(drop),
            None => Ok(()),
        }
    }

    fn check(&self, _: u64) -> Result<()> {
        self.checked().map(drop)
    }

    fn arrays(&self) -> Vec<String> {
        self.property(Vec::new(), |c| {
            c.outputs.iter().map(|&k| c.values[k].0.clone()).collect()
        })
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        exec::run(&self.checked()?, s, ctx)
    }
}
