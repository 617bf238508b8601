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
    let (dtype, fortran_order, shape) = parse_header_dict(&text)
        .map_err(|e| bad(format!("bad .npy header ({e}): {}", text.trim())))?;
    Ok(NpyHeader {
        dtype,
        fortran_order,
        shape,
        data_offset,
    })
}

/// Parses the Python dict literal of a `.npy` header.
fn parse_header_dict(text: &str) -> std::result::Result<(DType, bool, Vec<u64>), String> {
    let value_after = |key: &str| -> std::result::Result<&str, String> {
        let pat = format!("'{key}':");
        let at = text.find(&pat).ok_or_else(|| format!("no '{key}' key"))?;
        Ok(text[at + pat.len()..].trim_start())
    };
    let descr_src = value_after("descr")?;
    let descr = descr_src
        .strip_prefix('\'')
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| "structured dtypes are not supported".to_string())?;
    if descr.starts_with('>') && !descr.ends_with('1') {
        return Err(format!("big-endian dtype '{descr}' is not supported; save it with arr.astype(arr.dtype.newbyteorder('<'))"));
    }
    let dtype = DType::parse(descr).ok_or_else(|| format!("dtype '{descr}' is not supported"))?;
    let fortran_src = value_after("fortran_order")?;
    let fortran_order = if fortran_src.starts_with("True") {
        true
    } else if fortran_src.starts_with("False") {
        false
    } else {
        return Err("fortran_order is neither True nor False".into());
    };
    let shape_src = value_after("shape")?;
    let inner = shape_src
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| "shape is not a tuple".to_string())?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<u64>()
                .map_err(|_| format!("bad shape entry '{s}'"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((dtype, fortran_order, shape))
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
        let (d, f, s) =
            parse_header_dict("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }")
                .unwrap();
        assert_eq!((d, f, s), (DType::F64, true, vec![2, 3]));
        let (d, _, s) =
            parse_header_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (), }").unwrap();
        assert_eq!((d, s), (DType::U8, vec![]));
        assert!(
            parse_header_dict("{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }")
                .unwrap_err()
                .contains("big-endian")
        );
        assert!(parse_header_dict(
            "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }"
        )
        .is_err());
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
