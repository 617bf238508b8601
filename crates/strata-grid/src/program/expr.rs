//! The expression form of vertex programs: a small Python-like language parsed into a typed
//! tree whose names are resolved against the step it belongs to (an edge step reads `src.X`,
//! `dst.X` and `weight`; a vertex step reads `X`, `old.X` and `acc`).
//!
//! Every value is a float64, as in numexpr with float inputs: integers are exact up to 2^53,
//! comparisons and `and`/`or`/`not` give 1 or 0, and anything but 0 is true. Grammar, loosest
//! first: `a if c else b`; `or`; `and`; `not`; comparisons (`< <= > >= == !=`, one per
//! operand pair); `+ -`; `* / // %`; unary `-`; `**` (right-associative); atoms: numbers,
//! names, `side.name`, calls (`min max abs sqrt exp log floor ceil int where`) and
//! parentheses.

use strata_store::registry::unknown_name;

/// A value a tree reads at its leaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Leaf {
    /// Known when the program is compiled (a parameter, `n`, `inf`).
    Const(f64),
    /// Known once per iteration: uniform slot k (`iteration`, an aggregate).
    Uniform(usize),
    /// The value of `column` at the vertex a step runs on (or at an edge's `side`).
    Column(Side, Column),
    /// A vertex's value of program array k before this step's assignments.
    Old(usize),
    /// The edge's weight.
    Weight,
    /// The vertex's accumulator (what the edge step combined into it).
    Acc,
}

/// Which vertex a column is read at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The vertex a vertex step runs on.
    Vertex,
    /// An edge's source.
    Src,
    /// An edge's destination.
    Dst,
}

/// A per-vertex column an expression reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Column {
    /// Program array k.
    Value(usize),
    /// The vertex id.
    Id,
    /// Out-degree in the grid.
    OutDegree,
    /// In-degree in the grid.
    InDegree,
}

/// Functions of one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Un {
    Neg,
    Not,
    Abs,
    Sqrt,
    Exp,
    Log,
    Floor,
    Ceil,
    /// Towards zero (`int`).
    Trunc,
}

/// Functions of two values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    /// Python's `%`: the result takes the divisor's sign.
    Mod,
    Pow,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
    Min,
    Max,
}

impl Un {
    #[inline(always)]
    pub fn apply(self, a: f64) -> f64 {
        match self {
            Un::Neg => -a,
            Un::Not => truth(a == 0.0),
            Un::Abs => a.abs(),
            Un::Sqrt => a.sqrt(),
            Un::Exp => a.exp(),
            Un::Log => a.ln(),
            Un::Floor => a.floor(),
            Un::Ceil => a.ceil(),
            Un::Trunc => a.trunc(),
        }
    }
}

impl Bin {
    #[inline(always)]
    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Bin::Add => a + b,
            Bin::Sub => a - b,
            Bin::Mul => a * b,
            Bin::Div => a / b,
            Bin::FloorDiv => (a / b).floor(),
            Bin::Mod => a - (a / b).floor() * b,
            Bin::Pow => a.powf(b),
            Bin::Lt => truth(a < b),
            Bin::Le => truth(a <= b),
            Bin::Gt => truth(a > b),
            Bin::Ge => truth(a >= b),
            Bin::Eq => truth(a == b),
            Bin::Ne => truth(a != b),
            Bin::And => truth(a != 0.0 && b != 0.0),
            Bin::Or => truth(a != 0.0 || b != 0.0),
            // NaN wins, as in NumPy's minimum and maximum.
            Bin::Min => {
                if a.is_nan() || a < b {
                    a
                } else {
                    b
                }
            }
            Bin::Max => {
                if a.is_nan() || a > b {
                    a
                } else {
                    b
                }
            }
        }
    }
}

#[inline(always)]
fn truth(b: bool) -> f64 {
    b as u8 as f64
}

/// An expression with its names resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Leaf(Leaf),
    Un(Un, Box<Node>),
    Bin(Bin, Box<Node>, Box<Node>),
    /// `where(c, a, b)`, `a if c else b`.
    Select(Box<Node>, Box<Node>, Box<Node>),
}

impl Node {
    /// Whether every leaf is known once per iteration (a constant or a uniform).
    pub fn is_uniform(&self) -> bool {
        match self {
            Node::Leaf(l) => matches!(l, Leaf::Const(_) | Leaf::Uniform(_)),
            Node::Un(_, a) => a.is_uniform(),
            Node::Bin(_, a, b) => a.is_uniform() && b.is_uniform(),
            Node::Select(c, a, b) => c.is_uniform() && a.is_uniform() && b.is_uniform(),
        }
    }

    /// The value of a uniform tree given the uniform slots.
    pub fn scalar(&self, uniforms: &[f64]) -> f64 {
        match self {
            Node::Leaf(Leaf::Const(c)) => *c,
            Node::Leaf(Leaf::Uniform(k)) => uniforms[*k],
            Node::Leaf(l) => unreachable!("{l:?} is not uniform"),
            Node::Un(f, a) => f.apply(a.scalar(uniforms)),
            Node::Bin(f, a, b) => f.apply(a.scalar(uniforms), b.scalar(uniforms)),
            Node::Select(c, a, b) => match c.scalar(uniforms) != 0.0 {
                true => a.scalar(uniforms),
                false => b.scalar(uniforms),
            },
        }
    }

    /// Calls `f` on every leaf.
    pub fn leaves(&self, f: &mut impl FnMut(&Leaf)) {
        match self {
            Node::Leaf(l) => f(l),
            Node::Un(_, a) => a.leaves(f),
            Node::Bin(_, a, b) => {
                a.leaves(f);
                b.leaves(f);
            }
            Node::Select(c, a, b) => {
                c.leaves(f);
                a.leaves(f);
                b.leaves(f);
            }
        }
    }

    /// The same tree with constant subtrees folded into constants.
    pub fn folded(self) -> Node {
        let node = match self {
            Node::Leaf(_) => return self,
            Node::Un(f, a) => Node::Un(f, Box::new(a.folded())),
            Node::Bin(f, a, b) => Node::Bin(f, Box::new(a.folded()), Box::new(b.folded())),
            Node::Select(c, a, b) => Node::Select(
                Box::new(c.folded()),
                Box::new(a.folded()),
                Box::new(b.folded()),
            ),
        };
        let mut constant = true;
        node.leaves(&mut |l| constant &= matches!(l, Leaf::Const(_)));
        match constant {
            true => Node::Leaf(Leaf::Const(node.scalar(&[]))),
            false => node,
        }
    }
}

/// Resolves the names of one step: a bare name (`rank`, `acc`, `n`) or `side.name`
/// (`src.rank`, `old.rank`). An error says what is wrong; the parser adds where.
pub(crate) trait Scope {
    fn name(&self, name: &str) -> Result<Leaf, String>;
    fn attr(&self, side: &str, name: &str) -> Result<Leaf, String>;
}

/// The functions a call may name, with their arity (`None`: two or more).
const FUNCTIONS: &[(&str, Option<usize>)] = &[
    ("min", None),
    ("max", None),
    ("abs", Some(1)),
    ("sqrt", Some(1)),
    ("exp", Some(1)),
    ("log", Some(1)),
    ("floor", Some(1)),
    ("ceil", Some(1)),
    ("int", Some(1)),
    ("where", Some(3)),
];

/// Words with a meaning of their own, which no array, parameter or aggregate may take.
pub(crate) const RESERVED: &[&str] = &[
    "and",
    "or",
    "not",
    "if",
    "else",
    "true",
    "false",
    "True",
    "False",
    "inf",
    "nan",
    "src",
    "dst",
    "old",
    "acc",
    "weight",
    "id",
    "n",
    "iteration",
    "out_degree",
    "in_degree",
    "min",
    "max",
    "abs",
    "sqrt",
    "exp",
    "log",
    "floor",
    "ceil",
    "int",
    "where",
];

/// Parses `text` with names resolved by `scope`. Errors quote the text and the column.
pub(crate) fn parse(text: &str, scope: &dyn Scope) -> Result<Node, String> {
    let tokens = lex(text).map_err(|(at, msg)| located(text, at, &msg))?;
    let mut p = Parser {
        tokens: &tokens,
        at: 0,
        scope,
    };
    let node = p
        .conditional()
        .map_err(|(at, msg)| located(text, at, &msg))?;
    match p.peek() {
        Tok::End => Ok(node.folded()),
        t => Err(located(
            text,
            p.pos(),
            &format!("unexpected {} after a complete expression", t.show()),
        )),
    }
}

/// `msg` with the column it concerns and the expression.
fn located(text: &str, at: usize, msg: &str) -> String {
    let column = text[..at.min(text.len())].chars().count() + 1;
    format!("{msg} at column {column} of `{text}`")
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Name(String),
    Op(&'static str),
    End,
}

impl Tok {
    fn show(&self) -> String {
        match self {
            Tok::Num(x) => format!("number {x}"),
            Tok::Name(n) => format!("'{n}'"),
            Tok::Op(o) => format!("'{o}'"),
            Tok::End => "end of expression".into(),
        }
    }
}

/// The operators, longest first so that `**` is not read as two `*`.
const OPERATORS: &[&str] = &[
    "**", "//", "<=", ">=", "==", "!=", "+", "-", "*", "/", "%", "<", ">", "(", ")", ",", ".",
];

/// Tokens with their byte offsets; an error gives its offset.
fn lex(text: &str) -> Result<Vec<(usize, Tok)>, (usize, String)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
                let mut j = i + 1;
                if j < bytes.len() && (bytes[j] == b'+' || bytes[j] == b'-') {
                    j += 1;
                }
                if j < bytes.len() && bytes[j].is_ascii_digit() {
                    i = j;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let word = &text[start..i];
            let x: f64 = word
                .parse()
                .map_err(|_| (start, format!("'{word}' is not a number")))?;
            out.push((start, Tok::Num(x)));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push((start, Tok::Name(text[start..i].to_string())));
        } else if let Some(&op) = OPERATORS.iter().find(|op| text[i..].starts_with(**op)) {
            out.push((i, Tok::Op(op)));
            i += op.len();
        } else {
            let ch = text[i..].chars().next().expect("a character at i");
            return Err((i, format!("unexpected character '{ch}'")));
        }
    }
    out.push((text.len(), Tok::End));
    Ok(out)
}

struct Parser<'a> {
    tokens: &'a [(usize, Tok)],
    at: usize,
    scope: &'a dyn Scope,
}

type Parsed = Result<Node, (usize, String)>;

fn un(f: Un, a: Node) -> Node {
    Node::Un(f, Box::new(a))
}

fn bin(f: Bin, a: Node, b: Node) -> Node {
    Node::Bin(f, Box::new(a), Box::new(b))
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.tokens[self.at].1
    }

    fn pos(&self) -> usize {
        self.tokens[self.at].0
    }

    fn next(&mut self) -> Tok {
        let t = self.tokens[self.at].1.clone();
        if t != Tok::End {
            self.at += 1;
        }
        t
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Tok::Op(o) if *o == op)
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Tok::Name(n) if n == word)
    }

    fn expect(&mut self, op: &str) -> Result<(), (usize, String)> {
        if self.is_op(op) {
            self.next();
            return Ok(());
        }
        Err((
            self.pos(),
            format!("expected '{op}', found {}", self.peek().show()),
        ))
    }

    /// `a if c else b` (Python's order: the condition in the middle).
    fn conditional(&mut self) -> Parsed {
        let then = self.or()?;
        if !self.is_word("if") {
            return Ok(then);
        }
        self.next();
        let cond = self.or()?;
        if !self.is_word("else") {
            return Err((
                self.pos(),
                format!("expected 'else', found {}", self.peek().show()),
            ));
        }
        self.next();
        let otherwise = self.conditional()?;
        Ok(Node::Select(
            Box::new(cond),
            Box::new(then),
            Box::new(otherwise),
        ))
    }

    /// A left-associative chain of `operand`s joined by the word `word` (`and`, `or`).
    fn words(&mut self, word: &str, f: Bin, operand: fn(&mut Self) -> Parsed) -> Parsed {
        let mut a = operand(self)?;
        while self.is_word(word) {
            self.next();
            a = bin(f, a, operand(self)?);
        }
        Ok(a)
    }

    fn or(&mut self) -> Parsed {
        self.words("or", Bin::Or, Self::and)
    }

    fn and(&mut self) -> Parsed {
        self.words("and", Bin::And, Self::not)
    }

    fn not(&mut self) -> Parsed {
        if self.is_word("not") {
            self.next();
            return Ok(un(Un::Not, self.not()?));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Parsed {
        let a = self.sum()?;
        let f = match self.peek() {
            Tok::Op("<") => Bin::Lt,
            Tok::Op("<=") => Bin::Le,
            Tok::Op(">") => Bin::Gt,
            Tok::Op(">=") => Bin::Ge,
            Tok::Op("==") => Bin::Eq,
            Tok::Op("!=") => Bin::Ne,
            _ => return Ok(a),
        };
        self.next();
        let b = self.sum()?;
        if matches!(self.peek(), Tok::Op("<" | "<=" | ">" | ">=" | "==" | "!=")) {
            return Err((
                self.pos(),
                "chained comparisons are not supported: join them with 'and'".into(),
            ));
        }
        Ok(bin(f, a, b))
    }

    /// A left-associative chain of `operand`s joined by the operators of `ops`.
    fn chain(&mut self, ops: &[(&str, Bin)], operand: fn(&mut Self) -> Parsed) -> Parsed {
        let mut a = operand(self)?;
        loop {
            let f = match self.peek() {
                Tok::Op(op) => match ops.iter().find(|(o, _)| o == op) {
                    Some(&(_, f)) => f,
                    None => return Ok(a),
                },
                _ => return Ok(a),
            };
            self.next();
            a = bin(f, a, operand(self)?);
        }
    }

    fn sum(&mut self) -> Parsed {
        self.chain(&[("+", Bin::Add), ("-", Bin::Sub)], Self::product)
    }

    fn product(&mut self) -> Parsed {
        let ops = [
            ("*", Bin::Mul),
            ("/", Bin::Div),
            ("//", Bin::FloorDiv),
            ("%", Bin::Mod),
        ];
        self.chain(&ops, Self::unary)
    }

    fn unary(&mut self) -> Parsed {
        if self.is_op("-") {
            self.next();
            return Ok(un(Un::Neg, self.unary()?));
        }
        if self.is_op("+") {
            self.next();
            return self.unary();
        }
        self.power()
    }

    fn power(&mut self) -> Parsed {
        let base = self.atom()?;
        if self.is_op("**") {
            self.next();
            // Python's -2 ** 2 is -(2 ** 2), and 2 ** -1 takes a unary exponent.
            return Ok(bin(Bin::Pow, base, self.unary()?));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Parsed {
        let at = self.pos();
        match self.next() {
            Tok::Num(x) => Ok(Node::Leaf(Leaf::Const(x))),
            Tok::Op("(") => {
                let inner = self.conditional()?;
                self.expect(")")?;
                Ok(inner)
            }
            Tok::Name(name) => {
                if self.is_op("(") {
                    return self.call(&name, at);
                }
                if self.is_op(".") {
                    self.next();
                    let field_at = self.pos();
                    let Tok::Name(field) = self.next() else {
                        return Err((field_at, format!("expected a name after '{name}.'")));
                    };
                    return self
                        .scope
                        .attr(&name, &field)
                        .map(Node::Leaf)
                        .map_err(|m| (at, m));
                }
                self.scope.name(&name).map(Node::Leaf).map_err(|m| (at, m))
            }
            t => Err((at, format!("expected a value, found {}", t.show()))),
        }
    }

    fn call(&mut self, name: &str, at: usize) -> Parsed {
        let names: Vec<&str> = FUNCTIONS.iter().map(|(f, _)| *f).collect();
        let Some(&(_, arity)) = FUNCTIONS.iter().find(|(f, _)| *f == name) else {
            return Err((at, unknown_name("function", name, &names)));
        };
        self.expect("(")?;
        let mut args = vec![self.conditional()?];
        while self.is_op(",") {
            self.next();
            args.push(self.conditional()?);
        }
        self.expect(")")?;
        let n = args.len();
        let wrong = match arity {
            Some(k) => n != k,
            None => n < 2,
        };
        if wrong {
            let want = arity.map_or("at least 2".to_string(), |k| k.to_string());
            return Err((at, format!("{name}() takes {want} arguments, got {n}")));
        }
        let mut args = args.into_iter();
        let mut first = || args.next().expect("arity checked");
        Ok(match name {
            "min" | "max" => {
                let f = if name == "min" { Bin::Min } else { Bin::Max };
                let start = first();
                args.fold(start, |a, b| bin(f, a, b))
            }
            "where" => {
                let (c, a, b) = (first(), first(), first());
                Node::Select(Box::new(c), Box::new(a), Box::new(b))
            }
            _ => {
                let f = match name {
                    "abs" => Un::Abs,
                    "sqrt" => Un::Sqrt,
                    "exp" => Un::Exp,
                    "log" => Un::Log,
                    "floor" => Un::Floor,
                    "ceil" => Un::Ceil,
                    _ => Un::Trunc,
                };
                un(f, first())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names `x` (uniform 0), `y` (uniform 1) and `src.v` (column 0 at the source).
    struct Test;

    impl Scope for Test {
        fn name(&self, name: &str) -> Result<Leaf, String> {
            match name {
                "x" => Ok(Leaf::Uniform(0)),
                "y" => Ok(Leaf::Uniform(1)),
                "inf" => Ok(Leaf::Const(f64::INFINITY)),
                _ => Err(unknown_name("name", name, &["x", "y"])),
            }
        }
        fn attr(&self, side: &str, name: &str) -> Result<Leaf, String> {
            match (side, name) {
                ("src", "v") => Ok(Leaf::Column(Side::Src, Column::Value(0))),
                _ => Err(format!("no {side}.{name}")),
            }
        }
    }

    fn eval(text: &str, x: f64, y: f64) -> f64 {
        parse(text, &Test).unwrap().scalar(&[x, y])
    }

    #[test]
    fn precedence_and_associativity_follow_python() {
        assert_eq!(eval("1 + 2 * 3", 0.0, 0.0), 7.0);
        assert_eq!(eval("2 ** 3 ** 2", 0.0, 0.0), 512.0);
        assert_eq!(eval("-2 ** 2", 0.0, 0.0), -4.0);
        assert_eq!(eval("2 ** -1", 0.0, 0.0), 0.5);
        assert_eq!(eval("7 // 2 + 7 % 3", 0.0, 0.0), 4.0);
        assert_eq!(eval("-7 // 2", 0.0, 0.0), -4.0);
        assert_eq!(eval("-7 % 3", 0.0, 0.0), 2.0);
        assert_eq!(eval("10 - 4 - 3", 0.0, 0.0), 3.0);
        assert_eq!(eval("x if x > y else y", 3.0, 5.0), 5.0);
        assert_eq!(eval("1 if x else 2 if y else 3", 0.0, 0.0), 3.0);
        assert_eq!(eval("not x < 1 and y or 0", 2.0, 4.0), 1.0);
        assert_eq!(eval("where(x == y, 1, -1)", 1.0, 1.0), 1.0);
        assert_eq!(eval("min(x, y, 0.5) + max(x, y)", 2.0, 3.0), 3.5);
        assert_eq!(
            eval("int(-2.7) + floor(2.5) + ceil(2.1) + abs(-1)", 0.0, 0.0),
            4.0
        );
        assert_eq!(eval("1e-3 * 1E3 + .5", 0.0, 0.0), 1.5);
        assert_eq!(eval("x < inf", 1e300, 0.0), 1.0);
    }

    #[test]
    fn constants_fold_and_leaves_resolve() {
        assert_eq!(
            parse("(1 + 2) * src.v", &Test).unwrap(),
            bin(
                Bin::Mul,
                Node::Leaf(Leaf::Const(3.0)),
                Node::Leaf(Leaf::Column(Side::Src, Column::Value(0)))
            )
        );
        assert!(parse("x / 2", &Test).unwrap().is_uniform());
        assert!(!parse("src.v", &Test).unwrap().is_uniform());
    }

    #[test]
    fn errors_say_what_and_where() {
        let err = |t: &str| parse(t, &Test).unwrap_err();
        assert_eq!(
            err("x + zzz"),
            "unknown name 'zzz' (names: x, y) at column 5 of `x + zzz`"
        );
        assert_eq!(err("src.w"), "no src.w at column 1 of `src.w`");
        assert_eq!(
            err("mn(x, y)"),
            "unknown function 'mn'; did you mean 'min'? (functions: min, max, abs, sqrt, exp, \
             log, floor, ceil, int, where) at column 1 of `mn(x, y)`"
        );
        assert_eq!(
            err("where(x, y)"),
            "where() takes 3 arguments, got 2 at column 1 of `where(x, y)`"
        );
        assert_eq!(
            err("(x + 1"),
            "expected ')', found end of expression at column 7 of `(x + 1`"
        );
        assert_eq!(
            err("x y"),
            "unexpected 'y' after a complete expression at column 3 of `x y`"
        );
        assert_eq!(
            err("1 < x < 2"),
            "chained comparisons are not supported: join them with 'and' at column 7 of `1 < x < 2`"
        );
        assert_eq!(
            err("x $ 1"),
            "unexpected character '$' at column 3 of `x $ 1`"
        );
        assert_eq!(
            err(""),
            "expected a value, found end of expression at column 1 of ``"
        );
        assert_eq!(
            err("x if y"),
            "expected 'else', found end of expression at column 7 of `x if y`"
        );
    }
}
