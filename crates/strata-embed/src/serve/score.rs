//! Scores of given `(head, relation, tail)` triples by name, with the run's score function
//! (the one training optimised: higher is more plausible). A file of triples is read in blocks
//! that fit the budget; each block reads only the partitions its nodes are in, and its scores
//! are written in input order before the next block is read.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_io::progress::Progress;
use strata_store::config::{ConfigError, Section, Size};

use crate::config::Which;
use crate::error::{EmbedError, Result};
use crate::model::{score_candidates, ScoreBatch, Scratch};
use crate::run::loaded::Loaded;
use crate::serve::neighbors::query_rows;

/// The `[embed.score]` section: scores of the triples in a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ScoreOptions {
    /// file of head<TAB>relation<TAB>tail lines (names, or ids without names; # comments)
    #[schemars(extend("x-required" = true, "x-positional" = true, "x-kind" = "path"))]
    pub input: PathBuf,
    /// write head<TAB>relation<TAB>tail<TAB>score lines here (default: standard output)
    #[schemars(extend("x-short" = "o", "x-kind" = "path"))]
    pub out: Option<PathBuf>,
    /// checkpoint to use: best (by validation MRR) or last
    pub checkpoint: Which,
    /// memory budget (default: the run's)
    pub memory: Option<Size>,
}

impl Default for ScoreOptions {
    /// `input` is required (empty is refused).
    fn default() -> Self {
        ScoreOptions {
            input: PathBuf::new(),
            out: None,
            checkpoint: Which::Best,
            memory: None,
        }
    }
}

impl Section for ScoreOptions {
    const NAME: &'static str = "embed.score";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        if self.input.as_os_str().is_empty() {
            return Err(ConfigError::new(
                Self::NAME,
                "input",
                "needs a file of triples",
            ));
        }
        Ok(())
    }
}

/// What scoring a file did.
#[derive(Debug, Clone, Serialize)]
pub struct ScoreReport {
    pub epoch: usize,
    pub triples: u64,
    pub out: Option<PathBuf>,
    pub seconds: f64,
}

const FIELDS: [&str; 3] = ["head", "relation", "tail"];

/// Scores of `triples` (`[head, relation, tail]` names), in their order; an unknown name is an
/// error that `place(i)` (where triple `i` came from) and the field name.
pub fn score_named(
    l: &mut Loaded,
    triples: &[[String; 3]],
    place: &dyn Fn(usize) -> String,
) -> Result<Vec<f32>> {
    let mut ids = Vec::with_capacity(triples.len());
    for (i, t) in triples.iter().enumerate() {
        let named = |field: usize, e: EmbedError| {
            EmbedError::Config(format!("{}, field {}: {e}", place(i), FIELDS[field]))
        };
        let head = l.node_id(&t[0]).map_err(|e| named(0, e))?;
        let rel = l.relation_id(&t[1]).map_err(|e| named(1, e))?;
        let tail = l.node_id(&t[2]).map_err(|e| named(2, e))?;
        ids.push((head, rel, tail));
    }
    score_ids(l, &ids)
}

/// Scores of `(head, relation, tail)` id triples, in their order.
pub fn score_ids(l: &mut Loaded, triples: &[(u64, u32, u64)]) -> Result<Vec<f32>> {
    let (d, rd) = (l.model.dim, l.model.rel_dim());
    let mut nodes: Vec<u64> = triples.iter().flat_map(|&(h, _, t)| [h, t]).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let rows = query_rows(l, &nodes)?;
    let row = |v: u64| {
        let i = nodes
            .binary_search(&v)
            .expect("every node of the triples was read");
        &rows[i * d..(i + 1) * d]
    };
    let mut rel_row = vec![0.0f32; rd];
    let mut out = [0.0f32];
    let mut scratch = Scratch::default();
    let model = l.model;
    Ok(triples
        .iter()
        .map(|&(h, r, t)| {
            if rd > 0 {
                l.relations.query_row(&model, r, false, &mut rel_row);
            }
            score_candidates(
                &model,
                &ScoreBatch {
                    b: 1,
                    n: 1,
                    src: row(h),
                    rel: &rel_row,
                    cands: row(t),
                },
                &mut out,
                &mut scratch,
            );
            out[0]
        })
        .collect())
}

/// Scores the triples of file `input` block by block into `out` (standard output without one,
/// else written beside it and renamed into place when complete).
pub fn score_file(
    l: &mut Loaded,
    input: &Path,
    out: Option<&Path>,
    progress: &dyn Progress,
) -> Result<ScoreReport> {
    let start = std::time::Instant::now();
    let io = |op: &str, path: &Path, e: std::io::Error| {
        EmbedError::Config(format!("{}: cannot {op} it: {e}", path.display()))
    };
    let file = std::fs::File::open(input).map_err(|e| io("read", input, e))?;
    let mut score_into = |sink: &mut dyn Write| {
        let mut sink = BufWriter::new(sink);
        let n = score_lines(l, input, BufReader::new(&file), &mut sink, progress)?;
        sink.flush()
            .map_err(|e| io("write", out.unwrap_or(input), e))?;
        Ok::<_, EmbedError>(n)
    };
    let triples = match out {
        // beside `out`, renamed into place when complete (and durable)
        Some(o) => {
            let mut n = 0;
            strata_io::durable::replace_file_by(
                o,
                |tmp| {
                    let mut f = std::fs::File::create(tmp).map_err(|e| io("create", tmp, e))?;
                    n = score_into(&mut f)?;
                    Ok::<_, EmbedError>(())
                },
                || {},
            )?;
            n
        }
        None => score_into(&mut std::io::stdout().lock())?,
    };
    Ok(ScoreReport {
        epoch: l.epoch,
        triples,
        out: out.map(Path::to_path_buf),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Reads, scores and writes blocks of lines; returns the triples scored.
fn score_lines(
    l: &mut Loaded,
    input: &Path,
    reader: impl BufRead,
    sink: &mut dyn Write,
    progress: &dyn Progress,
) -> Result<u64> {
    // Per triple: two rows, and its names (about 256 bytes as a generous bound).
    let per_block = (l.spare_bytes() / (2 * l.model.dim as u64 * 4 + 256)).max(1) as usize;
    let mut block: Vec<[String; 3]> = Vec::new();
    let mut lines: Vec<usize> = Vec::new();
    let mut total = 0u64;
    let mut flush = |l: &mut Loaded, block: &mut Vec<[String; 3]>, lines: &mut Vec<usize>| {
        let place = |i: usize| format!("{} line {}", input.display(), lines[i]);
        let scores = score_named(l, block, &place)?;
        for (t, s) in block.iter().zip(scores) {
            writeln!(sink, "{}\t{}\t{}\t{s}", t[0], t[1], t[2])
                .map_err(|e| EmbedError::Config(format!("cannot write the scores: {e}")))?;
        }
        total += block.len() as u64;
        progress.message(&format!("scored {total} triples"));
        block.clear();
        lines.clear();
        Ok::<_, EmbedError>(())
    };
    for (i, line) in reader.lines().enumerate() {
        let line = line
            .map_err(|e| EmbedError::Config(format!("{} line {}: {e}", input.display(), i + 1)))?;
        let mut text = line.trim_end_matches('\r');
        if i == 0 {
            // A UTF-8 byte order mark (Windows editors write one) is no part of the first name.
            text = text.strip_prefix('\u{feff}').unwrap_or(text);
        }
        if text.trim().is_empty() || text.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = if text.contains('\t') {
            text.split('\t').collect()
        } else {
            text.split_whitespace().collect()
        };
        let [h, r, t] = fields[..] else {
            return Err(EmbedError::Config(format!(
                "{} line {}: expected 3 fields (head, relation, tail), got {}",
                input.display(),
                i + 1,
                fields.len()
            )));
        };
        block.push([h.to_string(), r.to_string(), t.to_string()]);
        lines.push(i + 1);
        if block.len() == per_block {
            flush(l, &mut block, &mut lines)?;
        }
    }
    if !block.is_empty() {
        flush(l, &mut block, &mut lines)?;
    }
    Ok(total)
}
