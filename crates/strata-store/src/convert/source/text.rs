//! `text`: delimited edge lists (TSV, CSV, whitespace; plain or gzip), with integer ids or
//! names, relation, weight, time and feature columns, typed graphs and feature bags. It takes
//! whatever no other format recognises.

use std::path::{Path, PathBuf};

use super::plugin::{plan_split_dir, EdgeSource, Inputs, SourcePlan};
use crate::array::{decode_ints, RowReader};
use crate::convert::edges::{BatchSink, EdgeInput, EdgeStream};
use crate::convert::spool::{EdgeBatch, SpoolFile};
use crate::convert::text_job::ingest_text;
use crate::convert::Ingested;
use crate::convert::{convert_text, ConvertOptions, GraphOptions, Summary, TextJob, TextOptions};
use crate::error::{Result, StoreError};
use crate::manifest::ArrayInfo;
use crate::registry::Named;
use crate::store::StoreBuilder;
use strata_io::progress::Progress;

#[derive(Debug)]
pub struct Text;

impl Named for Text {
    const NAME: &'static str = "text";
    const HELP: &'static str =
        "delimited edge lists (TSV, CSV, whitespace; plain or .gz); whatever no other format recognises";
}

impl EdgeSource for Text {
    fn detect(&self, _: &Inputs) -> bool {
        true
    }

    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan> {
        let mut plan = match inputs.dir {
            Some(dir) => plan_split_dir(&Text, dir, opts)?,
            None => SourcePlan::edges(
                &Text,
                inputs.files.to_vec(),
                opts.valid.clone(),
                opts.test.clone(),
            ),
        };
        plan.options = OPTIONS;
        Ok(plan)
    }

    fn convert(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        graph: GraphOptions,
        progress: &dyn Progress,
    ) -> Result<Summary> {
        convert_text(&text_job(plan, opts, graph), progress)
    }

    fn open(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        scratch: &Path,
        progress: &dyn Progress,
    ) -> Result<EdgeInput> {
        if opts.node_types.is_some() || !plan.edges_of.is_empty() {
            return Err(StoreError::option(
                "node_types",
                "typed graphs (node and edge types) need a store: convert them with `strata convert`",
            ));
        }
        if !plan.valid.is_empty() || !plan.test.is_empty() || opts.split.is_some() {
            return Err(StoreError::option(
                "inputs",
                "only train edges can be read this way: no valid/test files and no split",
            ));
        }
        // The parse's scratch files go into a store builder that is never committed.
        let mut graph = GraphOptions::from_section(opts, serde_json::Value::Null);
        graph.out = scratch.join("input");
        graph.overwrite = false;
        let job = text_job(plan, opts, graph);
        let (builder, ingested, _) = ingest_text(&job, progress)?;
        Ok(EdgeInput::new(Parsed {
            builder,
            ingested,
            paths: plan.train.clone(),
        }))
    }

    fn streams(&self) -> bool {
        true
    }
}

/// What a text conversion reads beside the shared options.
const OPTIONS: &[&str] = &[
    "columns",
    "relations",
    "delimiter",
    "comment",
    "header",
    "ids",
    "relation_ids",
    "node_types",
    "edge_types",
    "edges_of",
    "node_bags",
];

/// The text converter's job for `plan`'s files.
fn text_job(plan: &SourcePlan, opts: &ConvertOptions, graph: GraphOptions) -> TextJob {
    let columns = if opts.columns.is_empty() {
        if opts.relations {
            "src,rel,dst"
        } else {
            "src,dst"
        }
    } else {
        opts.columns.as_str()
    };
    TextJob {
        graph,
        text: TextOptions {
            inputs: plan.inputs(),
            columns: columns.split(',').map(|c| c.trim().to_string()).collect(),
            delimiter: opts.delimiter,
            comment: opts.comment.clone(),
            header: opts.header,
            ids: opts.ids,
            relation_ids: opts.relation_ids,
            node_types: opts.node_types.clone(),
            edge_types: opts.edge_types.clone(),
            edges_of: plan.edges_of.clone(),
            node_bags: opts.node_bags.clone(),
        },
    }
}

/// Text edges parsed by the text converter into its spool (train edges only), with the node
/// name table when the ids were names. The files live in a never-committed store builder,
/// removed when this is dropped.
struct Parsed {
    builder: StoreBuilder,
    ingested: Ingested,
    paths: Vec<PathBuf>,
}

impl Parsed {
    fn spool(&self) -> &SpoolFile {
        self.ingested.spooled.files[0]
            .as_ref()
            .expect("a text conversion spools train edges")
    }
}

impl EdgeStream for Parsed {
    fn format(&self) -> &'static str {
        Text::NAME
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.paths.clone()
    }

    fn edges(&self) -> Result<u64> {
        Ok(self.ingested.spooled.rows(0))
    }

    fn input_bytes(&self) -> Result<u64> {
        Ok(self.ingested.input_bytes)
    }

    fn stream_bytes(&self) -> Result<u64> {
        Ok(self.spool().info.data_bytes())
    }

    fn weighted(&self) -> bool {
        self.ingested.spooled.attrs.weights
    }

    fn known_nodes(&self) -> Option<u64> {
        Some(self.ingested.num_nodes)
    }

    fn parse_plan(&self) -> Option<&[String]> {
        Some(&self.ingested.plan)
    }

    fn move_names(&mut self, dir: &Path) -> Result<Option<(ArrayInfo, ArrayInfo)>> {
        if !self.ingested.node_names {
            return Ok(None);
        }
        let mut moved = Vec::new();
        for name in ["node_names_offsets", "node_names_bytes"] {
            let info = self.builder.arrays()[name].clone();
            let from = self.builder.dir().join(&info.file);
            let to = dir.join(&info.file);
            std::fs::rename(&from, &to).map_err(|e| StoreError::os("rename", &to, e))?;
            moved.push(info);
        }
        let bytes = moved.pop().expect("two arrays");
        let offsets = moved.pop().expect("two arrays");
        Ok(Some((offsets, bytes)))
    }

    /// Streams the spooled edges (ids already checked by the parse).
    fn stream(&self, _: Option<u64>, io_chunk: usize, sink: &mut BatchSink) -> Result<()> {
        let spooled = &self.ingested.spooled;
        let file = self.spool();
        let width = spooled.width();
        let (cols, weighted) = (spooled.cols, spooled.attrs.weights);
        let mut reader = RowReader::open_array(
            file.path.parent().expect("the spool is in a directory"),
            &file.info,
            io_chunk,
        )?;
        let mut vals = Vec::new();
        let mut batch = EdgeBatch::default();
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            decode_ints(bytes, spooled.dtype, &mut vals);
            batch.clear();
            for row in vals.chunks_exact(width) {
                batch.src.push(row[0]);
                batch.dst.push(row[cols - 1]);
                if weighted {
                    batch.weight.push(f32::from_bits(row[cols] as u32));
                }
            }
            sink(&batch, bytes.len() as u64)?;
        }
        Ok(())
    }
}
