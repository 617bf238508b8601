//! A vertex program as the user writes it ([`ProgramSpec`], JSON; Python builds it from a
//! `strata.grid.VertexProgram`), and its checked form ([`Checked`]): every expression parsed
//! with the names of its step resolved, every declaration checked, each error naming the
//! program, the step and the expression.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_store::registry::unknown_name;

use super::expr::{self, Column, Leaf, Node, Scope, Side, RESERVED};

/// A vertex program: vertex arrays with their initial values, an edge function whose messages
/// are combined into each destination's accumulator, assignments applied to every vertex
/// (or, with an active set, to the vertices that received a message), and what keeps it
/// going. See docs/grid.md, "Vertex programs".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    /// The program's name (messages, the run summary).
    pub name: String,
    /// Constants the expressions read by name.
    #[serde(default)]
    pub params: BTreeMap<String, f64>,
    /// The vertex arrays, in order: each one's name, dtype and initial value.
    pub values: Vec<ValueSpec>,
    /// The message an edge sends from its source to its destination (reads `src.X`, `dst.X`,
    /// `weight`).
    pub edge: String,
    /// How messages to one vertex combine into its accumulator `acc`.
    #[serde(default)]
    pub combine: Fold,
    /// The accumulator's dtype.
    #[serde(default)]
    pub accumulator: AccType,
    /// Assignments `NAME = EXPRESSION`, run in order on each vertex after the edge pass (each
    /// sees the ones before it; `old.NAME` is the value before the first).
    pub apply: Vec<String>,
    /// Which vertices send messages in the next iteration (evaluated after `apply`). Unset:
    /// every vertex, every iteration.
    #[serde(default)]
    pub active: Option<String>,
    /// Which vertices send messages in the first iteration (with `active`; unset: all).
    #[serde(default)]
    pub start: Option<String>,
    /// Values reduced over the vertices at init and after each iteration's `apply`, read by
    /// name in the next iteration and in `until`.
    #[serde(default)]
    pub aggregates: Vec<AggregateSpec>,
    /// Stops after an iteration at whose end this holds (reads aggregates, parameters, `n`,
    /// `iteration`).
    #[serde(default)]
    pub until: Option<String>,
    /// Most iterations.
    #[serde(default)]
    pub iterations: Option<u64>,
    /// The program needs both directions of every edge (a symmetric grid).
    #[serde(default)]
    pub symmetric: bool,
    /// The arrays written as results (unset: all of them).
    #[serde(default)]
    pub outputs: Option<Vec<String>>,
}

/// A vertex array of a program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueSpec {
    pub name: String,
    pub dtype: DType,
    /// Its value at each vertex before the first iteration (reads `id`, the degrees, the
    /// arrays declared before it).
    pub init: String,
}

/// A value reduced over the vertices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregateSpec {
    pub name: String,
    pub reduce: Fold,
    /// The per-vertex value reduced (reads what `apply` reads, after its assignments).
    pub expr: String,
}

/// Element type of a vertex array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F64,
    /// Written as int64; a value that is not a finite integer below 2^63 is an error.
    I64,
}

impl DType {
    pub fn bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }
}

/// The accumulator's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccType {
    F32,
    #[default]
    F64,
}

/// A reduction: how messages combine, how an aggregate reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fold {
    #[default]
    Sum,
    Min,
    Max,
}

impl Fold {
    /// The value that changes nothing: what an accumulator without messages holds.
    pub fn identity(self) -> f64 {
        match self {
            Fold::Sum => 0.0,
            Fold::Min => f64::INFINITY,
            Fold::Max => f64::NEG_INFINITY,
        }
    }

    #[inline(always)]
    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Fold::Sum => a + b,
            Fold::Min => a.min(b),
            Fold::Max => a.max(b),
        }
    }
}

/// Uniform slots: `n`, then `iteration`, then the aggregates, then what
/// [`code`](super::code) derives from them once per iteration.
pub(crate) const UNIFORM_N: usize = 0;
pub(crate) const UNIFORM_ITERATION: usize = 1;
pub(crate) const FIRST_AGGREGATE: usize = 2;

/// A program with every expression parsed and resolved.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub name: String,
    pub values: Vec<(String, DType)>,
    /// Each array's initial value, in order.
    pub init: Vec<Node>,
    pub start: Option<Node>,
    pub edge: Node,
    pub combine: Fold,
    pub accumulator: AccType,
    /// (array, value) in order.
    pub apply: Vec<(usize, Node)>,
    pub active: Option<Node>,
    pub aggregates: Vec<(String, Fold, Node)>,
    pub until: Option<Node>,
    pub iterations: Option<u64>,
    pub symmetric: bool,
    /// The arrays written as results.
    pub outputs: Vec<usize>,
    /// Columns read besides the arrays (degrees) and whether `weight` is.
    pub out_degree: bool,
    pub in_degree: bool,
    pub weighted: bool,
}

impl Checked {
    /// Bytes a vertex takes: the arrays, the accumulator, the degrees read, and the activity
    /// bitmaps (frontier, next, received) of a program with an active set.
    pub fn vertex_bytes(&self) -> u64 {
        let arrays: u64 = self.values.iter().map(|(_, d)| d.bytes()).sum();
        let acc = match self.accumulator {
            AccType::F32 => 4,
            AccType::F64 => 8,
        };
        arrays
            + acc
            + 8 * (self.out_degree as u64 + self.in_degree as u64)
            + self.active.is_some() as u64
    }
}

/// Which part of a program an expression belongs to, for its names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The initial value of array k.
    Init(usize),
    Start,
    Edge,
    /// Assignments, `active` and aggregates.
    Apply,
    Until,
}

struct StepScope<'a> {
    spec: &'a ProgramSpec,
    step: Step,
}

/// Columns every vertex has besides the program's arrays.
const BUILTINS: &[(&str, Column)] = &[
    ("id", Column::Id),
    ("out_degree", Column::OutDegree),
    ("in_degree", Column::InDegree),
];

impl StepScope<'_> {
    fn value(&self, name: &str) -> Option<usize> {
        self.spec.values.iter().position(|v| v.name == name)
    }

    fn aggregate(&self, name: &str) -> Option<usize> {
        self.spec.aggregates.iter().position(|a| a.name == name)
    }

    /// The bare names this step reads, for the error's list.
    fn known(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let per_vertex = matches!(self.step, Step::Init(_) | Step::Start | Step::Apply);
        if per_vertex {
            let arrays = match self.step {
                Step::Init(k) => &self.spec.values[..k],
                _ => &self.spec.values[..],
            };
            names.extend(arrays.iter().map(|v| v.name.clone()));
            names.extend(BUILTINS.iter().map(|(b, _)| b.to_string()));
        }
        if self.step == Step::Apply {
            names.push("acc".into());
        }
        if self.step == Step::Edge {
            names.push("weight".into());
        }
        names.extend(self.spec.params.keys().cloned());
        names.push("n".into());
        if matches!(self.step, Step::Edge | Step::Apply | Step::Until) {
            names.push("iteration".into());
        }
        if !matches!(self.step, Step::Init(_)) {
            names.extend(self.spec.aggregates.iter().map(|a| a.name.clone()));
        }
        names
    }
}

impl Scope for StepScope<'_> {
    fn name(&self, name: &str) -> Result<Leaf, String> {
        let step = self.step;
        let per_vertex = matches!(step, Step::Init(_) | Step::Start | Step::Apply);
        match name {
            "inf" => return Ok(Leaf::Const(f64::INFINITY)),
            "nan" => return Ok(Leaf::Const(f64::NAN)),
            "true" | "True" => return Ok(Leaf::Const(1.0)),
            "false" | "False" => return Ok(Leaf::Const(0.0)),
            "n" => return Ok(Leaf::Uniform(UNIFORM_N)),
            _ => {}
        }
        if let Some(&x) = self.spec.params.get(name) {
            return Ok(Leaf::Const(x));
        }
        if name == "iteration" && matches!(step, Step::Edge | Step::Apply | Step::Until) {
            return Ok(Leaf::Uniform(UNIFORM_ITERATION));
        }
        if let Some(k) = self.aggregate(name) {
            if !matches!(step, Step::Init(_)) {
                return Ok(Leaf::Uniform(FIRST_AGGREGATE + k));
            }
            return Err(format!(
                "aggregate '{name}' is computed after init, so init cannot read it"
            ));
        }
        if name == "acc" && step == Step::Apply {
            return Ok(Leaf::Acc);
        }
        if name == "weight" && step == Step::Edge {
            return Ok(Leaf::Weight);
        }
        if let Some(&(_, column)) = BUILTINS.iter().find(|(b, _)| *b == name) {
            if per_vertex {
                return Ok(Leaf::Column(Side::Vertex, column));
            }
        }
        if let Some(k) = self.value(name) {
            match step {
                Step::Init(at) if k >= at => {
                    return Err(format!(
                        "'{name}' is initialised at or after this array, so its init cannot read it"
                    ))
                }
                _ if per_vertex => return Ok(Leaf::Column(Side::Vertex, Column::Value(k))),
                _ => {}
            }
        }
        let is_vertex_name = self.value(name).is_some() || BUILTINS.iter().any(|(b, _)| *b == name);
        Err(match step {
            Step::Edge if is_vertex_name => format!(
                "the edge step reads a vertex's '{name}' at an end of the edge: src.{name} or dst.{name}"
            ),
            Step::Until if is_vertex_name || name == "acc" => format!(
                "until reads aggregates, parameters, n and iteration, not the per-vertex '{name}'"
            ),
            _ if name == "acc" => "acc is read by apply, active and aggregates".into(),
            _ if name == "weight" => "weight is read by the edge step only".into(),
            _ if name == "iteration" => "iteration is not defined before the first one".into(),
            _ => {
                let known = self.known();
                let known: Vec<&str> = known.iter().map(String::as_str).collect();
                unknown_name("name", name, &known)
            }
        })
    }

    fn attr(&self, side: &str, name: &str) -> Result<Leaf, String> {
        let column = || -> Result<Column, String> {
            if let Some(k) = self.value(name) {
                return Ok(Column::Value(k));
            }
            if let Some(&(_, c)) = BUILTINS.iter().find(|(b, _)| *b == name) {
                return Ok(c);
            }
            let mut known: Vec<&str> = self.spec.values.iter().map(|v| v.name.as_str()).collect();
            known.extend(BUILTINS.iter().map(|(b, _)| *b));
            Err(unknown_name("vertex array", name, &known))
        };
        match (side, self.step) {
            ("src", Step::Edge) => Ok(Leaf::Column(Side::Src, column()?)),
            ("dst", Step::Edge) => Ok(Leaf::Column(Side::Dst, column()?)),
            ("old", Step::Apply) => match self.value(name) {
                Some(k) => Ok(Leaf::Old(k)),
                None => {
                    let known: Vec<&str> =
                        self.spec.values.iter().map(|v| v.name.as_str()).collect();
                    Err(unknown_name("vertex array", name, &known))
                }
            },
            ("src" | "dst", _) => Err(format!(
                "{side}.{name}: src. and dst. are read by the edge step only"
            )),
            ("old", _) => Err(format!(
                "old.{name}: old. is read by apply, active and aggregates only"
            )),
            _ => Err(format!(
                "'{side}.{name}': a name before '.' is src, dst or old"
            )),
        }
    }
}

/// A name of the user's: an identifier that means nothing else.
fn check_identifier(what: &str, name: &str) -> Result<(), String> {
    let ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(format!(
            "{what} '{name}' is not a name (letters, digits and _, not starting with a digit)"
        ));
    }
    if RESERVED.contains(&name) {
        return Err(format!(
            "{what} '{name}' is a word of the expression language; pick another name"
        ));
    }
    Ok(())
}

/// `NAME = EXPRESSION` split at its `=` (not one of `==`, `<=`, `>=`, `!=`).
fn split_assignment(statement: &str) -> Option<(&str, &str)> {
    let bytes = statement.as_bytes();
    let at = (0..bytes.len()).find(|&i| {
        bytes[i] == b'='
            && bytes.get(i + 1) != Some(&b'=')
            && !matches!(
                i.checked_sub(1).map(|j| bytes[j]),
                Some(b'=' | b'<' | b'>' | b'!')
            )
    })?;
    Some((statement[..at].trim(), statement[at + 1..].trim()))
}

impl ProgramSpec {
    /// Checks the declarations and parses every expression; an error names the program and
    /// the step (`program 'pr': apply statement 1 (rank): unknown name ...`).
    pub(crate) fn check(&self) -> Result<Checked, String> {
        let fail = |what: String| format!("program '{}': {what}", self.name);
        self.check_names().map_err(fail)?;
        let parse = |step: Step, what: &str, text: &str| {
            expr::parse(text, &StepScope { spec: self, step })
                .map_err(|e| format!("program '{}': {what}: {e}", self.name))
        };
        let init = self
            .values
            .iter()
            .enumerate()
            .map(|(k, v)| parse(Step::Init(k), &format!("init of {}", v.name), &v.init))
            .collect::<Result<Vec<_>, _>>()?;
        let edge = parse(Step::Edge, "edge", &self.edge)?;
        let mut apply = Vec::new();
        for (k, statement) in self.apply.iter().enumerate() {
            let what = format!("apply statement {}", k + 1);
            let Some((target, text)) = split_assignment(statement) else {
                return Err(fail(format!(
                    "{what}: expected `NAME = EXPRESSION`, got `{statement}`"
                )));
            };
            let Some(array) = self.values.iter().position(|v| v.name == target) else {
                let known: Vec<&str> = self.values.iter().map(|v| v.name.as_str()).collect();
                return Err(fail(format!(
                    "{what}: assigns {}",
                    unknown_name("vertex array", target, &known)
                )));
            };
            if apply.iter().any(|(a, _)| *a == array) {
                return Err(fail(format!("{what}: {target} is assigned twice")));
            }
            apply.push((
                array,
                parse(Step::Apply, &format!("{what} ({target})"), text)?,
            ));
        }
        if apply.is_empty() {
            return Err(fail(
                "apply assigns nothing: give at least one `NAME = EXPRESSION`".into(),
            ));
        }
        let optional = |step: Step, what: &str, text: &Option<String>| {
            text.as_deref().map(|t| parse(step, what, t)).transpose()
        };
        let active = optional(Step::Apply, "active", &self.active)?;
        let start = optional(Step::Start, "start", &self.start)?;
        if start.is_some() && active.is_none() {
            return Err(fail(
                "start names the first iteration's active vertices, which needs active (the next ones')".into(),
            ));
        }
        let until = optional(Step::Until, "until", &self.until)?;
        let aggregates = self
            .aggregates
            .iter()
            .map(|a| {
                let node = parse(Step::Apply, &format!("aggregate {}", a.name), &a.expr)?;
                Ok((a.name.clone(), a.reduce, node))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if self.iterations == Some(0) {
            return Err(fail("iterations must be at least 1".into()));
        }
        if self.iterations.is_none() && until.is_none() && active.is_none() {
            return Err(fail(
                "it would never stop: give iterations, until, or an active set (it stops when none is active)".into(),
            ));
        }
        let outputs = match &self.outputs {
            None => (0..self.values.len()).collect(),
            Some(names) => names
                .iter()
                .map(|o| {
                    self.values
                        .iter()
                        .position(|v| v.name == *o)
                        .ok_or_else(|| {
                            let known: Vec<&str> =
                                self.values.iter().map(|v| v.name.as_str()).collect();
                            fail(format!(
                                "outputs: {}",
                                unknown_name("vertex array", o, &known)
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        if let Some(k) = (1..outputs.len()).find(|&k| outputs[..k].contains(&outputs[k])) {
            let twice = &self.values[outputs[k]].name;
            return Err(fail(format!("outputs: {twice} is listed twice")));
        }
        let (mut out_degree, mut in_degree, mut weighted) = (false, false, false);
        let mut reads = |l: &Leaf| match l {
            Leaf::Column(_, Column::OutDegree) => out_degree = true,
            Leaf::Column(_, Column::InDegree) => in_degree = true,
            Leaf::Weight => weighted = true,
            _ => {}
        };
        let per_vertex = init.iter().chain(&start).chain([&edge]).chain(&active);
        for node in per_vertex.chain(apply.iter().map(|(_, n)| n)) {
            node.leaves(&mut reads);
        }
        for (_, _, node) in &aggregates {
            node.leaves(&mut reads);
        }
        let checked = Checked {
            name: self.name.clone(),
            values: self
                .values
                .iter()
                .map(|v| (v.name.clone(), v.dtype))
                .collect(),
            init,
            start,
            edge,
            combine: self.combine,
            accumulator: self.accumulator,
            apply,
            active,
            aggregates,
            until,
            iterations: self.iterations,
            symmetric: self.symmetric,
            outputs,
            out_degree,
            in_degree,
            weighted,
        };
        Ok(checked)
    }

    /// Names are identifiers, distinct across arrays, parameters and aggregates.
    fn check_names(&self) -> Result<(), String> {
        if self.values.is_empty() {
            return Err("declares no vertex arrays (values)".into());
        }
        let mut seen: Vec<(&str, &str)> = Vec::new();
        let named = self
            .values
            .iter()
            .map(|v| ("vertex array", v.name.as_str()))
            .chain(self.params.keys().map(|p| ("parameter", p.as_str())))
            .chain(
                self.aggregates
                    .iter()
                    .map(|a| ("aggregate", a.name.as_str())),
            );
        for (what, name) in named {
            check_identifier(what, name)?;
            if let Some((other, _)) = seen.iter().find(|(_, s)| *s == name) {
                return Err(format!("'{name}' names both a {other} and a {what}"));
            }
            seen.push((what, name));
        }
        for (name, x) in &self.params {
            if !x.is_finite() {
                return Err(format!(
                    "parameter '{name}' is {x}; parameters are finite numbers"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// PageRank as a program, the shape examples/pagerank_program.py gives it.
    pub(crate) fn pagerank() -> ProgramSpec {
        serde_json::from_value(serde_json::json!({
            "name": "pagerank",
            "params": {"damping": 0.85},
            "values": [
                {"name": "rank", "dtype": "f32", "init": "1 / n"},
                {"name": "contrib", "dtype": "f32",
                 "init": "where(out_degree > 0, 1 / n / out_degree, 0)"},
            ],
            "edge": "src.contrib",
            "combine": "sum",
            "accumulator": "f32",
            "apply": [
                "rank = (1 - damping) / n + damping * (acc + dangling / n)",
                "contrib = where(out_degree > 0, rank / out_degree, 0)",
            ],
            "aggregates": [
                {"name": "dangling", "reduce": "sum", "expr": "where(out_degree == 0, rank, 0)"},
            ],
            "iterations": 20,
            "outputs": ["rank"],
        }))
        .unwrap()
    }

    fn refusal(edit: impl FnOnce(&mut ProgramSpec)) -> String {
        let mut spec = pagerank();
        edit(&mut spec);
        spec.check().unwrap_err()
    }

    #[test]
    fn pagerank_checks_and_reads_the_out_degree() {
        let c = pagerank().check().unwrap();
        assert!(c.out_degree && !c.in_degree && !c.weighted && c.active.is_none());
        assert_eq!(c.outputs, vec![0]);
        assert_eq!(c.apply.iter().map(|(a, _)| *a).collect::<Vec<_>>(), [0, 1]);
        // rank, contrib, acc (f32 each) and the out-degree.
        assert_eq!(c.vertex_bytes(), 4 + 4 + 4 + 8);
        assert_eq!(
            c.edge,
            Node::Leaf(Leaf::Column(Side::Src, Column::Value(1)))
        );
    }

    #[test]
    fn each_step_reads_its_own_names() {
        assert_eq!(
            refusal(|s| s.edge = "contrib".into()),
            "program 'pagerank': edge: the edge step reads a vertex's 'contrib' at an end of the \
             edge: src.contrib or dst.contrib at column 1 of `contrib`"
        );
        assert_eq!(
            refusal(|s| s.edge = "src.contrb".into()),
            "program 'pagerank': edge: unknown vertex array 'contrb'; did you mean 'contrib'? \
             (vertex arrays: rank, contrib, id, out_degree, in_degree) at column 1 of `src.contrb`"
        );
        assert_eq!(
            refusal(|s| s.apply[0] = "rank = src.rank".into()),
            "program 'pagerank': apply statement 1 (rank): src.rank: src. and dst. are read by the \
             edge step only at column 1 of `src.rank`"
        );
        assert_eq!(
            refusal(|s| s.values[0].init = "contrib".into()),
            "program 'pagerank': init of rank: 'contrib' is initialised at or after this array, so \
             its init cannot read it at column 1 of `contrib`"
        );
        assert_eq!(
            refusal(|s| s.until = Some("rank < 1".into())),
            "program 'pagerank': until: until reads aggregates, parameters, n and iteration, not the \
             per-vertex 'rank' at column 1 of `rank < 1`"
        );
        assert_eq!(
            refusal(|s| s.apply[1] = "contrib = rank / dampng".into()),
            "program 'pagerank': apply statement 2 (contrib): unknown name 'dampng'; did you mean \
             'damping'? (names: rank, contrib, id, out_degree, in_degree, acc, damping, n, \
             iteration, dangling) at column 8 of `rank / dampng`"
        );
    }

    #[test]
    fn declarations_are_checked() {
        assert_eq!(
            refusal(|s| s.apply[0] = "rank == 1".into()),
            "program 'pagerank': apply statement 1: expected `NAME = EXPRESSION`, got `rank == 1`"
        );
        assert_eq!(
            refusal(|s| s.apply[0] = "rnk = 1".into()),
            "program 'pagerank': apply statement 1: assigns unknown vertex array 'rnk'; did you \
             mean 'rank'? (vertex arrays: rank, contrib)"
        );
        assert_eq!(
            refusal(|s| s.apply[1] = "rank = 2".into()),
            "program 'pagerank': apply statement 2: rank is assigned twice"
        );
        assert_eq!(
            refusal(|s| s.params.insert("rank".into(), 1.0).map_or((), drop)),
            "program 'pagerank': 'rank' names both a vertex array and a parameter"
        );
        assert_eq!(
            refusal(|s| s.values[1].name = "src".into()),
            "program 'pagerank': vertex array 'src' is a word of the expression language; pick \
             another name"
        );
        assert_eq!(
            refusal(|s| s.iterations = None),
            "program 'pagerank': it would never stop: give iterations, until, or an active set (it \
             stops when none is active)"
        );
        assert_eq!(
            refusal(|s| s.start = Some("id == 0".into())),
            "program 'pagerank': start names the first iteration's active vertices, which needs \
             active (the next ones')"
        );
        assert_eq!(
            refusal(|s| s.outputs = Some(vec!["ranks".into()])),
            "program 'pagerank': outputs: unknown vertex array 'ranks'; did you mean 'rank'? \
             (vertex arrays: rank, contrib)"
        );
    }

    #[test]
    fn assignments_split_at_their_own_equals_sign() {
        assert_eq!(split_assignment("a = b == c"), Some(("a", "b == c")));
        assert_eq!(split_assignment("a=b<=c"), Some(("a", "b<=c")));
        assert_eq!(split_assignment("a != b"), None);
    }
}
