//! Expressions compiled to vector code: a list of operations over registers of
//! [`BATCH`] float64s, run once per batch of edges or vertices, so that the work per
//! operation (a match and a loop) is spread over a batch and each loop is a tight one the
//! compiler vectorises. Subtrees that read only constants and uniforms are computed once per
//! iteration (derived uniforms), not per element.

use super::columns::Columns;
use super::expr::{Bin, Column, Leaf, Node, Side, Un};

/// Elements per batch: registers of 4 KiB, so that a program's registers stay in L1/L2.
pub(crate) const BATCH: usize = 512;

/// Where an operation reads a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arg {
    Reg(usize),
    Const(f64),
    Uniform(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    Load {
        out: usize,
        side: Side,
        column: Column,
    },
    Weight {
        out: usize,
    },
    Acc {
        out: usize,
    },
    Un {
        f: Un,
        out: usize,
        a: Arg,
    },
    Bin {
        f: Bin,
        out: usize,
        a: Arg,
        b: Arg,
    },
    Select {
        out: usize,
        c: Arg,
        a: Arg,
        b: Arg,
    },
    /// Writes `value` into program array `array` at each vertex of the batch (vertex steps).
    Store {
        array: usize,
        value: Arg,
    },
}

/// A compiled step.
#[derive(Debug, Clone, Default)]
pub(crate) struct Code {
    pub ops: Vec<Op>,
    pub regs: usize,
}

/// Compiles trees into one [`Code`], recycling registers: a result the caller asked for
/// stays in its register until the code ends.
pub(crate) struct Compiler<'d> {
    code: Code,
    free: Vec<usize>,
    /// Registers holding `old.X` (array, register).
    old: Vec<(usize, usize)>,
    /// Registers holding a column already loaded, until a store to it: a column read twice
    /// is loaded once (`out_degree` in `where(out_degree > 0, rank / out_degree, 0)`).
    loaded: Vec<(Side, Column, usize)>,
    /// Uniform subtrees, computed once per iteration into slots `first_derived + k`.
    derived: &'d mut Vec<Node>,
    first_derived: usize,
}

impl<'d> Compiler<'d> {
    pub fn new(derived: &'d mut Vec<Node>, first_derived: usize) -> Self {
        Compiler {
            code: Code::default(),
            free: Vec::new(),
            old: Vec::new(),
            loaded: Vec::new(),
            derived,
            first_derived,
        }
    }

    fn alloc(&mut self) -> usize {
        self.free.pop().unwrap_or_else(|| {
            self.code.regs += 1;
            self.code.regs - 1
        })
    }

    fn release(&mut self, a: Arg) {
        if let Arg::Reg(r) = a {
            let held = self.old.iter().any(|&(_, o)| o == r)
                || self.loaded.iter().any(|&(_, _, l)| l == r);
            if !held {
                self.free.push(r);
            }
        }
    }

    /// Loads the values `old.X` reads for every array X that `nodes` name so, before the
    /// operations that follow overwrite them.
    pub fn pin_old<'n>(&mut self, nodes: impl IntoIterator<Item = &'n Node>) {
        let mut arrays = Vec::new();
        for node in nodes {
            node.leaves(&mut |l| {
                if let Leaf::Old(k) = l {
                    if !arrays.contains(k) {
                        arrays.push(*k);
                    }
                }
            });
        }
        for k in arrays {
            let out = self.alloc();
            self.code.ops.push(Op::Load {
                out,
                side: Side::Vertex,
                column: Column::Value(k),
            });
            self.old.push((k, out));
        }
    }

    /// Emits `node`; returns where its value is.
    pub fn expr(&mut self, node: &Node) -> Arg {
        if node.is_uniform() {
            return match node {
                Node::Leaf(Leaf::Const(c)) => Arg::Const(*c),
                Node::Leaf(Leaf::Uniform(k)) => Arg::Uniform(*k),
                _ => {
                    let k = match self.derived.iter().position(|d| d == node) {
                        Some(k) => k,
                        None => {
                            self.derived.push(node.clone());
                            self.derived.len() - 1
                        }
                    };
                    Arg::Uniform(self.first_derived + k)
                }
            };
        }
        match node {
            Node::Leaf(leaf) => {
                if let Leaf::Old(k) = leaf {
                    let (_, r) = self
                        .old
                        .iter()
                        .find(|(a, _)| a == k)
                        .expect("pin_old loaded every old value");
                    return Arg::Reg(*r);
                }
                if let Leaf::Column(side, column) = *leaf {
                    if let Some(&(_, _, r)) = self
                        .loaded
                        .iter()
                        .find(|&&(s, c, _)| s == side && c == column)
                    {
                        return Arg::Reg(r);
                    }
                }
                let out = self.alloc();
                self.code.ops.push(match *leaf {
                    Leaf::Column(side, column) => {
                        self.loaded.push((side, column, out));
                        Op::Load { out, side, column }
                    }
                    Leaf::Weight => Op::Weight { out },
                    Leaf::Acc => Op::Acc { out },
                    Leaf::Const(_) | Leaf::Uniform(_) | Leaf::Old(_) => unreachable!(),
                });
                Arg::Reg(out)
            }
            Node::Un(f, a) => {
                let a = self.expr(a);
                let out = self.alloc();
                self.code.ops.push(Op::Un { f: *f, out, a });
                self.release(a);
                Arg::Reg(out)
            }
            Node::Bin(f, a, b) => {
                let (a, b) = (self.expr(a), self.expr(b));
                let out = self.alloc();
                self.code.ops.push(Op::Bin { f: *f, out, a, b });
                self.release(a);
                self.release(b);
                Arg::Reg(out)
            }
            Node::Select(c, a, b) => {
                let (c, a, b) = (self.expr(c), self.expr(a), self.expr(b));
                let out = self.alloc();
                self.code.ops.push(Op::Select { out, c, a, b });
                for x in [c, a, b] {
                    self.release(x);
                }
                Arg::Reg(out)
            }
        }
    }

    /// Emits `array = node` at every vertex of the batch. A load of the array made before
    /// is forgotten (its register stays taken: a result may be in it).
    pub fn store(&mut self, array: usize, node: &Node) {
        let value = self.expr(node);
        self.code.ops.push(Op::Store { array, value });
        self.release(value);
        self.loaded
            .retain(|&(side, column, _)| !(side == Side::Vertex && column == Column::Value(array)));
    }

    pub fn finish(self) -> Code {
        self.code
    }
}

/// A value of a batch: one per element, or one for all.
#[derive(Clone, Copy)]
pub(crate) enum Val<'a> {
    Each(&'a [f64]),
    All(f64),
}

impl Val<'_> {
    #[inline(always)]
    pub fn at(&self, k: usize) -> f64 {
        match self {
            Val::Each(v) => v[k],
            Val::All(x) => *x,
        }
    }
}

/// A thread's registers.
pub(crate) struct Regs(Vec<Vec<f64>>);

impl Regs {
    pub fn new(n: usize) -> Regs {
        Regs((0..n).map(|_| vec![0.0; BATCH]).collect())
    }

    /// The value of `a` for a batch of `len`.
    #[inline]
    pub fn val<'a>(&'a self, a: Arg, uniforms: &[f64], len: usize) -> Val<'a> {
        match a {
            Arg::Reg(r) => Val::Each(&self.0[r][..len]),
            Arg::Const(c) => Val::All(c),
            Arg::Uniform(k) => Val::All(uniforms[k]),
        }
    }
}

/// The elements code runs over: a batch of edges or of vertices.
pub(crate) trait Batch {
    fn len(&self) -> usize;
    /// `out[k]` = `column` at element k's vertex on `side`.
    fn gather(&self, columns: &Columns, side: Side, column: Column, out: &mut [f64]);
    /// `out[k]` = element k's edge weight (edge batches).
    fn weight(&self, out: &mut [f64]);
    /// Element k's vertex (vertex batches).
    fn vertex(&self, k: usize) -> usize;
}

/// A value an int64 array could not hold: the array, the vertex and the value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StoreFault {
    pub array: usize,
    pub vertex: usize,
    pub value: f64,
}

impl Code {
    /// Runs the operations over `batch` (at most [`BATCH`] elements), with the registers of
    /// `regs` (at least `self.regs`).
    pub fn run(
        &self,
        batch: &impl Batch,
        columns: &Columns,
        uniforms: &[f64],
        regs: &mut Regs,
    ) -> Result<(), StoreFault> {
        let len = batch.len();
        for op in &self.ops {
            let out = match *op {
                Op::Load { out, .. }
                | Op::Weight { out }
                | Op::Acc { out }
                | Op::Un { out, .. }
                | Op::Bin { out, .. }
                | Op::Select { out, .. } => out,
                Op::Store { array, value } => {
                    let target = &columns.values[array];
                    let index = |k| batch.vertex(k);
                    let stored = match regs.val(value, uniforms, len) {
                        Val::Each(v) => target.scatter(len, index, |k| v[k]),
                        Val::All(x) => target.scatter(len, index, |_| x),
                    };
                    stored.map_err(|(k, value)| StoreFault {
                        array,
                        vertex: batch.vertex(k),
                        value,
                    })?;
                    continue;
                }
            };
            // The output register is never an input (the compiler allocates it first).
            let mut dst = std::mem::take(&mut regs.0[out]);
            let o = &mut dst[..len];
            match *op {
                Op::Load { side, column, .. } => batch.gather(columns, side, column, o),
                Op::Weight { .. } => batch.weight(o),
                Op::Acc { .. } => columns.acc.gather(o, |k| batch.vertex(k)),
                Op::Un { f, a, .. } => unary(f, o, regs.val(a, uniforms, len)),
                Op::Bin { f, a, b, .. } => {
                    binary(f, o, regs.val(a, uniforms, len), regs.val(b, uniforms, len))
                }
                Op::Select { c, a, b, .. } => {
                    let (c, a, b) = (
                        regs.val(c, uniforms, len),
                        regs.val(a, uniforms, len),
                        regs.val(b, uniforms, len),
                    );
                    for (k, x) in o.iter_mut().enumerate() {
                        *x = if c.at(k) != 0.0 { a.at(k) } else { b.at(k) };
                    }
                }
                Op::Store { .. } => unreachable!(),
            }
            regs.0[out] = dst;
        }
        Ok(())
    }
}

/// `out = f(a)`, the function matched once per batch.
fn unary(f: Un, out: &mut [f64], a: Val) {
    macro_rules! each {
        ($($f:ident),*) => {
            match f {
                $(Un::$f => map1(out, a, |x| Un::$f.apply(x)),)*
            }
        };
    }
    each!(Neg, Not, Abs, Sqrt, Exp, Log, Floor, Ceil, Trunc)
}

#[inline(always)]
fn map1(out: &mut [f64], a: Val, f: impl Fn(f64) -> f64) {
    match a {
        Val::Each(a) => {
            for (o, x) in out.iter_mut().zip(a) {
                *o = f(*x);
            }
        }
        Val::All(x) => out.fill(f(x)),
    }
}

/// `out = f(a, b)`, the function and the operands' shapes matched once per batch.
fn binary(f: Bin, out: &mut [f64], a: Val, b: Val) {
    macro_rules! each {
        ($($f:ident),*) => {
            match f {
                $(Bin::$f => map2(out, a, b, |x, y| Bin::$f.apply(x, y)),)*
            }
        };
    }
    each!(Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Lt, Le, Gt, Ge, Eq, Ne, And, Or, Min, Max)
}

#[inline(always)]
fn map2(out: &mut [f64], a: Val, b: Val, f: impl Fn(f64, f64) -> f64) {
    match (a, b) {
        (Val::Each(a), Val::Each(b)) => {
            for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
                *o = f(*x, *y);
            }
        }
        (Val::Each(a), Val::All(y)) => {
            for (o, x) in out.iter_mut().zip(a) {
                *o = f(*x, y);
            }
        }
        (Val::All(x), Val::Each(b)) => {
            for (o, y) in out.iter_mut().zip(b) {
                *o = f(x, *y);
            }
        }
        (Val::All(x), Val::All(y)) => out.fill(f(x, y)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::columns::{Acc, Array};
    use crate::program::expr::{parse, Scope};
    use crate::program::spec::{AccType, DType, Fold};
    use crate::vertex::VertexMemory;

    /// `x` and `y` as uniform slots 0 and 1 (`as_columns`: as arrays 0 and 1 at the vertex),
    /// `old.x` as array 0 before the code's stores, `acc`, and `u` as uniform slot 2.
    struct Xy {
        as_columns: bool,
    }

    impl Scope for Xy {
        fn name(&self, name: &str) -> Result<Leaf, String> {
            let k = match name {
                "x" => 0,
                "y" => 1,
                "u" => return Ok(Leaf::Uniform(2)),
                "inf" => return Ok(Leaf::Const(f64::INFINITY)),
                "acc" => return Ok(Leaf::Acc),
                _ => return Err(format!("no {name}")),
            };
            Ok(match self.as_columns {
                true => Leaf::Column(Side::Vertex, Column::Value(k)),
                false => Leaf::Uniform(k),
            })
        }
        fn attr(&self, side: &str, name: &str) -> Result<Leaf, String> {
            match (side, name, self.as_columns) {
                ("old", "x", true) => Ok(Leaf::Old(0)),
                ("old", "x", false) => Ok(Leaf::Uniform(0)),
                _ => Err(format!("no {side}.{name}")),
            }
        }
    }

    struct Vertices(usize);

    impl Batch for Vertices {
        fn len(&self) -> usize {
            self.0
        }
        fn gather(&self, columns: &Columns, side: Side, column: Column, out: &mut [f64]) {
            assert_eq!(side, Side::Vertex);
            columns.gather(column, out, |k| k)
        }
        fn weight(&self, _: &mut [f64]) {
            unreachable!()
        }
        fn vertex(&self, k: usize) -> usize {
            k
        }
    }

    /// Vertex `v`'s value in `a`.
    fn value(a: &Array, v: usize) -> f64 {
        let mut out = [0.0];
        a.gather(&mut out, |_| v);
        out[0]
    }

    fn set(a: &Array, v: usize, x: f64) {
        a.scatter(1, |_| v, |_| x).unwrap()
    }

    fn columns(n: usize, dtype: DType) -> Columns {
        let mem = VertexMemory::Heap;
        let values = vec![
            Array::zeros(&mem, n, dtype).unwrap(),
            Array::zeros(&mem, n, DType::F64).unwrap(),
        ];
        Columns {
            values,
            out_degree: None,
            in_degree: None,
            acc: Acc::new(&mem, n, AccType::F64, Fold::Sum).unwrap(),
        }
    }

    #[test]
    fn vector_code_computes_what_the_tree_does_element_by_element() {
        let n = 300;
        let cols = columns(n, DType::F64);
        for v in 0..n {
            set(&cols.values[0], v, (v as f64 - 150.0) / 7.0);
            set(&cols.values[1], v, (v % 13) as f64 - 4.5);
        }
        let exprs = [
            "where(x > 0.5, x * 2, -x) + min(x, y) ** 2 - abs(y) // 1 % 3",
            "x / y if y != 0 else inf",
            "sqrt(abs(x)) + exp(y / 10) - log(abs(x) + 1) + floor(x) * ceil(y) - int(x / 3)",
            "not x < 0 and y > 0 or x == 1",
            "max(x, y, u) - (u * 2 + 1) / u",
            "(x + y) * (x - y) * (x * y + 1) * (x + 1) * (y + 2) * (x - 3)",
        ];
        let u = 1.25;
        for text in exprs {
            let tree = parse(text, &Xy { as_columns: true }).unwrap();
            let reference = parse(text, &Xy { as_columns: false }).unwrap();
            let mut derived = Vec::new();
            let mut c = Compiler::new(&mut derived, 3);
            let result = c.expr(&tree);
            let code = c.finish();
            // A tree's registers are recycled: a few, however long the expression; a column
            // is loaded once however often it is read.
            assert!(code.regs <= 6, "{text}: {} registers", code.regs);
            let loads = code
                .ops
                .iter()
                .filter(|op| matches!(op, Op::Load { .. }))
                .count();
            assert!(loads <= 2, "{text}: {loads} loads");
            let mut uniforms = vec![0.0, 0.0, u];
            uniforms.extend(derived.iter().map(|d| d.scalar(&[0.0, 0.0, u])));
            let mut regs = Regs::new(code.regs);
            code.run(&Vertices(n.min(BATCH)), &cols, &uniforms, &mut regs)
                .unwrap();
            let got = regs.val(result, &uniforms, n);
            for v in 0..n {
                let want =
                    reference.scalar(&[value(&cols.values[0], v), value(&cols.values[1], v), u]);
                let g = got.at(v);
                assert!(
                    g == want || (g.is_nan() && want.is_nan()),
                    "{text} at {v}: {g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn stores_see_earlier_stores_and_old_values_precede_them() {
        let n = 10;
        let cols = columns(n, DType::I64);
        let scope = Xy { as_columns: true };
        let mut derived = Vec::new();
        let mut c = Compiler::new(&mut derived, 3);
        let first = parse("x + 5", &scope).unwrap();
        let second = parse("x * 10 + old.x", &scope).unwrap();
        c.pin_old([&second]);
        c.store(0, &first);
        c.store(1, &second);
        let code = c.finish();
        for v in 0..n {
            set(&cols.values[0], v, v as f64);
        }
        code.run(&Vertices(n), &cols, &[0.0; 3], &mut Regs::new(code.regs))
            .unwrap();
        for v in 0..n {
            assert_eq!(value(&cols.values[0], v), v as f64 + 5.0);
            assert_eq!(
                value(&cols.values[1], v),
                (v as f64 + 5.0) * 10.0 + v as f64
            );
        }
        // An int64 array refuses what it cannot hold, naming the vertex.
        let mut derived = Vec::new();
        let mut c = Compiler::new(&mut derived, 3);
        c.store(0, &parse("1 / (x - 8)", &scope).unwrap());
        let code = c.finish();
        let fault = code.run(&Vertices(n), &cols, &[0.0; 3], &mut Regs::new(code.regs));
        let want = StoreFault {
            array: 0,
            vertex: 3,
            value: f64::INFINITY,
        };
        assert_eq!(fault, Err(want));
        // Before it, the stores were made (truncated towards zero: 1 / -3 and 1 / -1).
        assert_eq!(
            (value(&cols.values[0], 0), value(&cols.values[0], 2)),
            (0.0, -1.0)
        );
    }
}
