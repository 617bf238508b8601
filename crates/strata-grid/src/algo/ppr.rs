//! Personalized PageRank from a seed set: PageRank whose random surfer jumps back to the seeds
//! (networkx's `pagerank` with `personalization` one over the seeds, dangling mass to them too).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::strtab::NameTable;

use super::pagerank::{power_iteration, Jump};
use super::{Algorithm, Ctx, IterationValue, Output, PageRank};
use crate::error::{GridError, Result};
use crate::stream::Streamer;
use crate::vertex::Bitmap;

/// Personalized PageRank's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PersonalizedPageRank {
    /// most iterations (all of them when --tolerance is 0)
    #[schemars(range(min = 1))]
    pub iterations: usize,
    /// stop once the L1 change of the ranks is below V x tolerance
    #[schemars(range(min = 0.0))]
    pub tolerance: f64,
    /// damping factor, in [0, 1)
    #[schemars(range(min = 0.0))]
    pub damping: f64,
    /// the seed vertices, comma-separated: node names where the store has them, else ids
    pub seeds: Vec<String>,
}

impl Default for PersonalizedPageRank {
    fn default() -> Self {
        let p = PageRank::default();
        PersonalizedPageRank {
            iterations: p.iterations,
            tolerance: p.tolerance,
            damping: p.damping,
            seeds: vec!["0".into()],
        }
    }
}

impl PersonalizedPageRank {
    fn pagerank(&self) -> PageRank {
        PageRank {
            iterations: self.iterations,
            tolerance: self.tolerance,
            damping: self.damping,
        }
    }

    /// The seeds as vertex ids of a graph of `n` vertices: each seed is looked up in `names`
    /// (the store's node names) when the store has them, else read as an id.
    fn resolve(&self, names: Option<&NameTable>, n: u64) -> Result<Vec<u64>> {
        self.seeds
            .iter()
            .map(|seed| {
                let id = match names {
                    Some(t) => t.find(seed.as_bytes())?.ok_or_else(|| {
                        GridError::config("seeds", format!("no node is named {seed:?}"))
                    })?,
                    None => seed.trim().parse::<u64>().map_err(|_| {
                        GridError::config(
                            "seeds",
                            format!("{seed:?} is not a vertex id (the graph has no node names)"),
                        )
                    })?,
                };
                if id >= n {
                    return Err(GridError::config(
                        "seeds",
                        format!("vertex {id} is not in the graph (0..{n})"),
                    ));
                }
                Ok(id)
            })
            .collect()
    }
}

impl Algorithm for PersonalizedPageRank {
    const NAME: &'static str = "ppr";
    const ABOUT: &'static str = "personalized PageRank from the --seeds set";
    const ARRAYS: &'static [&'static str] = &["rank"];
    const VALUE: IterationValue = IterationValue::Real("L1 change");

    /// PageRank's 16 bytes and the seed bitmap.
    fn vertex_bytes(&self) -> u64 {
        17
    }

    fn validate(&self) -> Result<()> {
        self.pagerank().validate()?;
        if self.seeds.is_empty() {
            return Err(GridError::config("seeds", "need at least one seed"));
        }
        Ok(())
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let n = s.grid().layout().num_vertices;
        let names = s.grid().node_names()?;
        let ids = self.resolve(names.as_ref(), n)?;
        let seeds = Bitmap::new(n as usize);
        ids.iter().for_each(|&v| seeds.set(v as usize));
        let count = seeds.count() as usize;
        let mut out = power_iteration(&self.pagerank(), &Jump::Seeds { seeds, count }, s, ctx)?;
        out.summary.insert("seeds".into(), ids.into());
        Ok(out)
    }
}
