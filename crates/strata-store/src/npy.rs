//! The NumPy `.npy` format: dtypes, header writing (data at a 4096-byte offset) and parsing
//! (any valid header, for input files written by NumPy itself).

use std::path::Path;

use strata_io::{DirectFile, OpenMode, ALIGN};

use crate::error::{Result, StoreError};

/// Byte offset at which the data of every array Strata writes begins.
pub const DATA_OFFSET: u64 = ALIGN as u64;

/// The first bytes of every `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Element types Strata reads and writes (little-endian only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// The NumPy `descr` string, e.g. `<i4`.
    pub fn descr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::I8 => "|i1",
            DType::U8 => "|u1",
            DType::I16 => "<i2",
            DType::U16 => "<u2",
            DType::I32 => "<i4",
            DType::U32 => "<u4",
            DType::I64 => "<i8",
            DType::U64 => "<u8",
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }

    /// The NumPy name, e.g. `int32` (used in manifests and messages).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    pub fn is_int(self) -> bool {
        !matches!(self, DType::F16 | DType::F32 | DType::F64 | DType::Bool)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64)
    }

    /// Parses a NumPy name (`int32`) or descr (`<i4`, `=i4`, `i4`).
    pub fn parse(s: &str) -> Option<DType> {
        let all = [
            DType::Bool,
            DType::I8,
            DType::U8,
            DType::I16,
            DType::U16,
            DType::I32,
            DType::U32,
            DType::I64,
            DType::U64,
            DType::F16,
            DType::F32,
            DType::F64,
        ];
        let trimmed = s.trim_start_matches(['<', '|', '=']);
        all.into_iter()
            .find(|d| d.name() == s || &d.descr()[1..] == trimmed)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for DType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        DType::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown dtype '{s}'")))
    }
}

/// What a `.npy` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    pub dtype: DType,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    /// Byte offset of the first element.
    pub data_offset: u64,
}

impl NpyHeader {
    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size of the data in bytes.
    pub fn data_bytes(&self) -> u64 {
        self.len() * self.dtype.size() as u64
    }
}

/// Renders the 4096-byte header block for an array of `dtype` and `shape`.
pub fn header_block(dtype: DType, shape: &[u64]) -> Vec<u8> {
    let shape_str = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_str}, }}",
        dtype.descr()
    );
    let header_len = DATA_OFFSET as usize - 10;
    assert!(
        dict.len() < header_len,
        "npy header too long for shape {shape:?}"
    );
    let mut out = Vec::with_capacity(DATA_OFFSET as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(DATA_OFFSET as usize - 1, b' ');
    out.push(b'\n');
    out
}

/// Reads and parses the header of the `.npy` file at `path`.
pub fn read_header(path: &Path) -> Result<NpyHeader> {
    let file = DirectFile::open(path, OpenMode::Read, false)?;
    let file_len = file.size()?;
    let bad = |msg: String| StoreError::bad_file(path, msg);
    if file_len < 10 {
        return Err(bad(format!("not a .npy file: only {file_len} bytes")));
    }
    let mut prefix = [0u8; 12];
    file.read_at(0, &mut prefix[..file_len.min(12) as usize])?;
    if &prefix[..6] != MAGIC {
        return Err(bad(
            "not a .npy file: the magic string \\x93NUMPY is missing".into(),
        ));
    }
    let (len_bytes, header_len) = match prefix[6] {
        1 => (2u64, u16::from_le_bytes([prefix[8], prefix[9]]) as u64),
        2 | 3 => (
            4u64,
            u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as u64,
        ),
        v => {
            return Err(bad(format!(
                "unsupported .npy format version {v}.{}",
                prefix[7]
            )))
        }
    };
    let data_offset = 8 + len_bytes + header_len;
    if data_offset > file_len {
        return Err(bad(format!(
            "truncated .npy header: it declares {header_len} bytes but the file has {file_len}"
        )));
    }
    let mut text = vec![0u8; header_len as usize];
    file.read_at(8 + len_bytes, &mut text)?;
    let text =
        String::from_utf8(text).map_err(|_| bad("the .npy header is not valid text".into()))?;
    let dict = parse_header_dict(&text).map_err(|e| bad(format!("bad .npy header: {e}")))?;
    let dtype = dict_dtype(&dict.descr).map_err(|e| bad(format!("bad .npy header: {e}")))?;
    // The data's size is computed from the shape everywhere: one that overflows would wrap to a
    // small number, and a huge array would pass for an empty one.
    if dict.bytes(dtype.size() as u64).is_none() {
        return Err(bad(format!(
            "shape {:?} of {dtype} is larger than any file (more than 2^64 bytes)",
            dict.shape
        )));
    }
    Ok(NpyHeader {
        dtype,
        fortran_order: dict.fortran_order,
        shape: dict.shape,
        data_offset,
    })
}

/// A `.npy` header's dict: the element type as NumPy wrote it, the order and the shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderDict {
    /// NumPy's type descriptor, e.g. `<f4`.
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
}

impl HeaderDict {
    /// Bytes of data for elements of `size` bytes; `None` when that overflows a `u64`.
    pub fn bytes(&self, size: u64) -> Option<u64> {
        self.shape.iter().try_fold(size, |n, &d| n.checked_mul(d))
    }
}

/// Parses the Python dict literal of a `.npy` header, e.g.
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`: keys in any order, a trailing
/// comma, padding after it. Refused: a missing or repeated key, a value of the wrong kind, a
/// structured dtype (a list), and anything but whitespace after the dict. The error says what
/// was wrong and where, never the header's text.
pub fn parse_header_dict(text: &str) -> std::result::Result<HeaderDict, String> {
    let mut p = Literal {
        s: text.as_bytes(),
        pos: 0,
    };
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    p.expect(b'{')?;
    while !p.eat(b'}') {
        let key = p.string()?;
        p.expect(b':')?;
        let value = p.value()?;
        let slot_taken = match (key.as_str(), value) {
            ("descr", PyValue::Str(s)) => descr.replace(s).is_some(),
            ("fortran_order", PyValue::Bool(b)) => fortran_order.replace(b).is_some(),
            ("shape", PyValue::Tuple(t)) => shape.replace(t).is_some(),
            ("descr", PyValue::List) => return Err("structured dtypes are not supported".into()),
            (k @ ("descr" | "fortran_order" | "shape"), _) => {
                return Err(format!("unexpected value for '{k}'"))
            }
            // NumPy itself refuses other keys; they carry nothing Strata needs.
            _ => false,
        };
        if slot_taken {
            return Err(format!("'{key}' appears twice"));
        }
        if !p.eat(b',') {
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_space();
    if p.pos != p.s.len() {
        return Err(format!("unexpected text after the dict at byte {}", p.pos));
    }
    let missing = |k: &str| format!("no '{k}' key");
    Ok(HeaderDict {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran_order.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

/// The element type a header's `descr` names, for the types Strata reads.
fn dict_dtype(descr: &str) -> std::result::Result<DType, String> {
    if descr.starts_with('>') && !descr.ends_with('1') {
        return Err(format!("big-endian dtype '{descr}' is not supported; save it with arr.astype(arr.dtype.newbyteorder('<'))"));
    }
    DType::parse(descr).ok_or_else(|| format!("dtype '{descr}' is not supported"))
}

/// A value of the Python literal subset `.npy` headers use.
enum PyValue {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
    /// A list: a structured dtype's fields (not read further).
    List,
}

/// A cursor over a Python literal.
struct Literal<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Literal<'_> {
    fn skip_space(&mut self) {
        while self.s.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
    }

    /// Consumes `c` (after spaces) if it is next.
    fn eat(&mut self, c: u8) -> bool {
        self.skip_space();
        let next = self.s.get(self.pos) == Some(&c);
        self.pos += usize::from(next);
        next
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.pos))
        }
    }

    /// A quoted string without escapes (dtype descriptors and key names have none).
    fn string(&mut self) -> std::result::Result<String, String> {
        self.skip_space();
        let quote = match self.s.get(self.pos) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a string at byte {}", self.pos)),
        };
        let start = self.pos + 1;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == quote)
            .ok_or_else(|| format!("unterminated string at byte {}", self.pos))?;
        self.pos = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }

    fn value(&mut self) -> std::result::Result<PyValue, String> {
        self.skip_space();
        let rest = &self.s[self.pos..];
        if rest.starts_with(b"True") {
            self.pos += 4;
            Ok(PyValue::Bool(true))
        } else if rest.starts_with(b"False") {
            self.pos += 5;
            Ok(PyValue::Bool(false))
        } else if rest.starts_with(b"[") {
            Ok(PyValue::List)
        } else if self.eat(b'(') {
            let mut dims = Vec::new();
            while !self.eat(b')') {
                dims.push(self.integer()?);
                if !self.eat(b',') {
                    self.expect(b')')?;
                    break;
                }
            }
            Ok(PyValue::Tuple(dims))
        } else {
            self.string().map(PyValue::Str)
        }
    }

    /// A dimension: decimal digits, with the `L` suffix of headers written by Python 2.
    fn integer(&mut self) -> std::result::Result<u64, String> {
        self.skip_space();
        let start = self.pos;
        while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        let digits = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or_default();
        let dim = digits
            .parse()
            .map_err(|_| format!("expected a dimension (an integer up to 2^64) at byte {start}"))?;
        self.pos += usize::from(self.s.get(self.pos) == Some(&b'L'));
        Ok(dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        for shape in [vec![0u64], vec![7], vec![3, 2], vec![5, 4, 3]] {
            let path = dir.path().join("a.npy");
            let mut bytes = header_block(DType::I32, &shape);
            assert_eq!(bytes.len(), 4096);
            bytes.resize(4096 + shape.iter().product::<u64>() as usize * 4, 0);
            std::fs::write(&path, &bytes).unwrap();
            let h = read_header(&path).unwrap();
            assert_eq!(h.shape, shape);
            assert_eq!(h.dtype, DType::I32);
            assert_eq!(h.data_offset, 4096);
            assert!(!h.fortran_order);
        }
    }

    #[test]
    fn parses_numpy_style_headers() {
        let h = parse_header_dict("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }")
            .unwrap();
        assert_eq!(
            (h.descr.as_str(), h.fortran_order, h.shape),
            ("<f8", true, vec![2, 3])
        );
        let h = parse_header_dict("{'shape': (), 'fortran_order': False, 'descr': '|u1'}   \n")
            .unwrap();
        assert_eq!((h.descr.as_str(), h.shape), ("|u1", vec![]));
        let py2 =
            parse_header_dict("{'descr': '<i8', 'fortran_order': False, 'shape': (2L, 3L), }");
        assert_eq!(py2.unwrap().shape, vec![2, 3]);
        assert_eq!(dict_dtype("<f8"), Ok(DType::F64));
        assert!(dict_dtype(">i8").unwrap_err().contains("big-endian"));
    }

    #[test]
    fn refuses_malformed_headers_saying_where() {
        let err = |t: &str| parse_header_dict(t).unwrap_err();
        let ok = "'fortran_order': False, 'shape': (2, 2), ";
        assert_eq!(
            err(&format!("{{'descr': [('a', '<i4')], {ok}}}")),
            "structured dtypes are not supported"
        );
        // Which of two values was meant is anyone's guess (NumPy keeps the last).
        assert_eq!(
            err(&format!("{{'descr': '<i8', {ok}'descr': '<f4'}}")),
            "'descr' appears twice"
        );
        // Cut short: the dict never closes.
        assert_eq!(
            err(&format!("{{'descr': '<i8', {ok}")),
            "expected a string at byte 58"
        );
        assert_eq!(
            err("{'descr': '<i8', 'shape': (2,)"),
            "expected '}' at byte 30"
        );
        assert_eq!(
            err(&format!("{{'descr': '<i8', {ok}}}garbage")),
            "unexpected text after the dict at byte 59"
        );
        assert_eq!(
            err("{'descr': '<i8', 'shape': (2,)}"),
            "no 'fortran_order' key"
        );
        assert_eq!(
            err(&format!("{{'descr': True, {ok}}}")),
            "unexpected value for 'descr'"
        );
        assert!(
            err("{'descr': '<i8', 'fortran_order': False, 'shape': (2, -2), }")
                .starts_with("expected a dimension")
        );
        assert!(err(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (99999999999999999999,), }"
        )
        .starts_with("expected a dimension (an integer up to 2^64)"));
        assert!(err("{'descr': '<i8").starts_with("unterminated string"));
    }

    #[test]
    fn a_shape_whose_size_overflows_is_refused_not_wrapped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.npy");
        // (2, 2^61) int64 is 2^65 bytes: wrapped, it would be an empty array.
        let dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2305843009213693952), }";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(dict.len() as u16 + 1).to_le_bytes());
        bytes.extend_from_slice(dict.as_bytes());
        bytes.push(b'\n');
        std::fs::write(&path, &bytes).unwrap();
        let err = read_header(&path).unwrap_err().to_string();
        assert!(
            err.contains("huge.npy") && err.contains("larger than any file (more than 2^64 bytes)"),
            "{err}"
        );
        assert!(
            !err.contains("descr"),
            "the header's text is not echoed: {err}"
        );
    }

    #[test]
    fn rejects_non_npy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        std::fs::write(&path, b"hello world, not numpy").unwrap();
        let err = read_header(&path).unwrap_err().to_string();
        assert!(err.contains("x.npy") && err.contains("magic"), "{err}");
    }
}
