//! Weights files: safetensors and NumPy `.npz`, read into float32 tensors plus the
//! architecture the file declares.
//!
//! Both parsers are our own (a few dozen lines each) rather than dependencies, and check every
//! length against the bytes present, so a truncated or hostile file gives an error that names
//! the file and the tensor instead of a panic or a huge allocation. Every allocation a parse
//! makes (the decoded tensors, each inflated npz member) is charged to an [`Allowance`] first,
//! and members are inflated in bounded chunks whatever size the archive declares, so a
//! compressed bomb stops at the allowance. Errors name the file, the tensor and the sizes,
//! never the file's bytes (a client may name any file under a data root).
//!
//! - safetensors: an 8-byte little-endian header length, a JSON header mapping each tensor
//!   name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets into the data that
//!   follows the header) and `"__metadata__"` (string to string; the architecture is the JSON
//!   string under `strata.architecture`), then the raw little-endian data.
//! - npz: a zip archive (stored or deflated members) of `.npy` arrays, one per tensor; the
//!   architecture is the uint8 array `__strata_architecture__` holding its JSON bytes.

use std::collections::BTreeMap;
use std::io::{Cursor, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use half::{bf16, f16};
use serde::Deserialize;

use super::arch::Architecture;
pub use super::tensor::Tensor;
use crate::error::{Result, ServeError};
use crate::memory::Allowance;

/// Bytes of memory a parsed safetensors header may take per byte of its JSON text (a 32-byte
/// `serde_json::Value`, plus its vector's slack, for a 2-byte `0,`); charged before parsing.
const JSON_EXPANSION: u64 = 32;
/// Bytes an npz member is inflated by at a time, each charged before it is read.
const INFLATE_CHUNK: usize = 1 << 20;

/// The metadata key (safetensors) that holds the architecture JSON.
pub const SAFETENSORS_ARCHITECTURE_KEY: &str = "strata.architecture";
/// The array name (npz) that holds the architecture JSON as uint8 bytes.
pub const NPZ_ARCHITECTURE_KEY: &str = "__strata_architecture__";

/// A weights file's container format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Safetensors,
    Npz,
}

impl Format {
    /// The format: `name` (`safetensors` or `npz`) when given, else `path`'s suffix, else the
    /// magic bytes of `bytes` (a zip archive starts with `PK\x03\x04`, a safetensors header
    /// with `{` after its 8-byte length). `source` names the file in errors.
    pub fn resolve(
        name: Option<&str>,
        path: Option<&Path>,
        bytes: &[u8],
        source: &str,
    ) -> Result<Format> {
        if let Some(name) = name {
            return match name.to_ascii_lowercase().as_str() {
                "safetensors" => Ok(Format::Safetensors),
                "npz" => Ok(Format::Npz),
                _ => Err(ServeError::InvalidArgument(format!(
                    "model format: expected safetensors or npz, got {name:?}"
                ))),
            };
        }
        let suffix = path
            .and_then(|p| p.extension())
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match suffix.as_deref() {
            Some("safetensors") => return Ok(Format::Safetensors),
            Some("npz") => return Ok(Format::Npz),
            _ => {}
        }
        if bytes.starts_with(b"PK\x03\x04") {
            Ok(Format::Npz)
        } else if bytes.len() > 8 && bytes[8] == b'{' {
            Ok(Format::Safetensors)
        } else {
            Err(ServeError::InvalidArgument(format!(
                "{source}: cannot tell the weights format (expected a safetensors or npz file; \
                 name it *.safetensors or *.npz, or give the format)"
            )))
        }
    }
}

/// The contents of a weights file.
#[derive(Debug)]
pub struct WeightsFile {
    /// Tensors by name (the names of the model's `state_dict()`).
    pub tensors: BTreeMap<String, Tensor>,
    /// The architecture the file declares, if any.
    pub architecture: Option<Architecture>,
}

/// The bytes of the weights file at `path` (`source` names it in errors), refusing before
/// any read what is not a regular file (a directory, a FIFO, a device such as /dev/zero:
/// `INVALID_ARGUMENT`) and a file larger than `allowance` has left (`RESOURCE_EXHAUSTED`).
pub fn read_file(path: &Path, source: &str, allowance: &mut Allowance) -> Result<Vec<u8>> {
    let not_regular = || {
        ServeError::InvalidArgument(format!(
            "model file {source} is not a regular file (a directory, FIFO or device is refused)"
        ))
    };
    let unreadable = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => {
            ServeError::NotFound(format!("model file {source} does not exist on the server"))
        }
        _ => ServeError::InvalidArgument(format!("model file {source} cannot be read: {e}")),
    };
    // Checked before the open too: opening a FIFO would wait for a writer.
    if !std::fs::metadata(path).map_err(unreadable)?.is_file() {
        return Err(not_regular());
    }
    // Non-blocking, and checked again on the open file: the path may have changed since.
    let mut file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    let len = meta.len();
    allowance.charge(len, &format_args!("model file {source} ({len} bytes)"))?;
    let mut bytes = Vec::with_capacity(len as usize);
    // A file that grew since is read to its size then, which the charge covers.
    (&mut file)
        .take(len)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    Ok(bytes)
}

/// Parses `bytes` as a weights file of `format`, charging what it allocates to `allowance`;
/// `source` names it in errors.
pub fn parse(
    bytes: &[u8],
    format: Format,
    source: &str,
    allowance: &mut Allowance,
) -> Result<WeightsFile> {
    match format {
        Format::Safetensors => parse_safetensors(bytes, source, allowance),
        Format::Npz => parse_npz(bytes, source, allowance),
    }
}

/// `text` (a dtype a file declares) quoted when it looks like a dtype name, so an error may
/// show it; anything else (the bytes of a file that is no weights file) is not echoed.
fn shown(text: &str) -> String {
    let dtype_like = text.len() <= 12
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"<>|=_".contains(&b));
    if dtype_like {
        format!("{text:?}")
    } else {
        "(not a dtype name)".into()
    }
}

/// Charges the float32 copy of tensor `name` (`n` elements) to `allowance`.
fn charge_tensor(allowance: &mut Allowance, n: usize, name: &str, source: &str) -> Result<()> {
    let bytes = (n as u64).saturating_mul(4);
    allowance.charge(bytes, &format_args!("{source}: tensor {name} as float32"))
}

/// All of `reader` (an npz member, `what` in errors), inflated [`INFLATE_CHUNK`] bytes at a
/// time, each chunk charged to `allowance` before it is read: whatever the archive declares,
/// it stops at the allowance (`RESOURCE_EXHAUSTED`).
pub fn inflate_bounded(
    mut reader: impl Read,
    what: &str,
    allowance: &mut Allowance,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let chunk = (INFLATE_CHUNK as u64).min(allowance.remaining()) as usize;
        if chunk == 0 {
            // Out of allowance: refused unless the member ends exactly here.
            let mut probe = [0u8; 1];
            if reader
                .read(&mut probe)
                .map_err(|e| inflate_error(what, e))?
                == 0
            {
                return Ok(out);
            }
            return Err(allowance.refusal(
                1,
                &format_args!("{what}, inflated past {} bytes,", out.len()),
            ));
        }
        allowance.charge(chunk as u64, &format_args!("{what}, inflated"))?;
        out.reserve_exact(chunk);
        let read = (&mut reader)
            .take(chunk as u64)
            .read_to_end(&mut out)
            .map_err(|e| inflate_error(what, e))?;
        if read < chunk {
            // The member ended: what the last chunk did not fill goes back.
            out.shrink_to_fit();
            allowance.release((chunk - read) as u64);
            return Ok(out);
        }
    }
}

fn inflate_error(what: &str, e: std::io::Error) -> ServeError {
    ServeError::InvalidArgument(format!("{what}: the member is corrupt: {e}"))
}

fn invalid(source: &str, what: impl std::fmt::Display) -> ServeError {
    ServeError::InvalidArgument(format!("{source}: {what}"))
}

/// The architecture from its JSON text.
fn architecture_from_json(text: &[u8], source: &str) -> Result<Architecture> {
    serde_json::from_slice(text).map_err(|e| {
        invalid(
            source,
            format_args!("the declared architecture is not valid: {e}"),
        )
    })
}

/// Number of elements of `shape`, or an error when it overflows.
fn numel(shape: &[usize], name: &str, source: &str) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            invalid(
                source,
                format_args!("tensor {name}: shape {shape:?} is too large"),
            )
        })
}

/// Float element types the files may hold; all become float32.
#[derive(Debug, Clone, Copy)]
enum Float {
    F16,
    Bf16,
    F32,
    F64,
}

impl Float {
    fn size(self) -> usize {
        match self {
            Float::F16 | Float::Bf16 => 2,
            Float::F32 => 4,
            Float::F64 => 8,
        }
    }

    /// Little-endian `bytes` (a whole number of elements) as float32.
    fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            Float::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Float::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Float::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            // Narrowing loses precision the float32 kernels could not use anyway.
            Float::F64 => bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8-byte chunk")) as f32)
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors

/// One entry of a safetensors header.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SafetensorsEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

fn parse_safetensors(bytes: &[u8], source: &str, allowance: &mut Allowance) -> Result<WeightsFile> {
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(invalid(
            source,
            format_args!(
                "truncated safetensors file: {} bytes, the header length alone takes 8",
                bytes.len()
            ),
        ));
    };
    let header_len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    let available = (bytes.len() - 8) as u64;
    if header_len > available {
        // The length itself is not shown: in a file that is no safetensors file, it is the
        // file's first 8 bytes.
        return Err(invalid(
            source,
            format_args!(
                "not a safetensors file, or truncated: the header length its first 8 bytes \
                 give is past the end of the file ({available} bytes follow them)"
            ),
        ));
    }
    allowance.charge(
        header_len.saturating_mul(JSON_EXPANSION),
        &format_args!("{source}: the safetensors header ({header_len} bytes of JSON)"),
    )?;
    let header_end = 8 + header_len as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..header_end]).map_err(|e| {
            invalid(
                source,
                format_args!(
                    "the safetensors header is not a JSON object (line {}, column {})",
                    e.line(),
                    e.column()
                ),
            )
        })?;
    let data = &bytes[header_end..];

    let mut tensors = BTreeMap::new();
    let mut architecture = None;
    for (name, value) in header {
        if name == "__metadata__" {
            architecture = safetensors_architecture(value, source)?;
            continue;
        }
        let entry: SafetensorsEntry = serde_json::from_value(value).map_err(|_| {
            invalid(
                source,
                format_args!(
                    "tensor {name}: expected {{\"dtype\": string, \"shape\": [integers], \
                     \"data_offsets\": [begin, end]}}"
                ),
            )
        })?;
        let float = match entry.dtype.as_str() {
            "F32" => Float::F32,
            "F16" => Float::F16,
            "BF16" => Float::Bf16,
            "F64" => Float::F64,
            other => {
                return Err(invalid(
                    source,
                    format_args!(
                        "tensor {name}: unsupported dtype {} (expected F32, F16, BF16 or F64)",
                        shown(other)
                    ),
                ))
            }
        };
        let [begin, end] = entry.data_offsets;
        let n = numel(&entry.shape, &name, source)?;
        let want = n.checked_mul(float.size());
        if end < begin || end > data.len() || Some(end - begin) != want {
            return Err(invalid(
                source,
                format_args!(
                    "tensor {name}: data_offsets [{begin}, {end}] do not hold shape {:?} of {} \
                     ({} bytes expected, data section has {} bytes)",
                    entry.shape,
                    entry.dtype,
                    want.map_or_else(|| "too many".to_string(), |w| w.to_string()),
                    data.len()
                ),
            ));
        }
        charge_tensor(allowance, n, &name, source)?;
        let tensor = Tensor {
            shape: entry.shape,
            data: float.decode(&data[begin..end]),
        };
        tensors.insert(name, tensor);
    }
    Ok(WeightsFile {
        tensors,
        architecture,
    })
}

/// The architecture in a safetensors `__metadata__` object, if it has one.
fn safetensors_architecture(
    metadata: serde_json::Value,
    source: &str,
) -> Result<Option<Architecture>> {
    let serde_json::Value::Object(map) = metadata else {
        return Err(invalid(source, "__metadata__ must be an object of strings"));
    };
    match map.get(SAFETENSORS_ARCHITECTURE_KEY) {
        None => Ok(None),
        Some(serde_json::Value::String(text)) => {
            architecture_from_json(text.as_bytes(), source).map(Some)
        }
        Some(_) => Err(invalid(
            source,
            format_args!(
                "__metadata__.{SAFETENSORS_ARCHITECTURE_KEY} must be a string holding JSON"
            ),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// npz / npy

fn parse_npz(bytes: &[u8], source: &str, allowance: &mut Allowance) -> Result<WeightsFile> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| invalid(source, format_args!("not a valid npz (zip) archive: {e}")))?;
    let mut tensors = BTreeMap::new();
    let mut architecture = None;
    for i in 0..archive.len() {
        let member = archive
            .by_index(i)
            .map_err(|e| invalid(source, format_args!("npz member {i}: {e}")))?;
        let member_name = member.name().to_string();
        let Some(name) = member_name.strip_suffix(".npy") else {
            return Err(invalid(
                source,
                format_args!("npz member {member_name:?} is not a .npy array"),
            ));
        };
        // The declared size is not trusted: the allowance bounds what is inflated.
        let npy = inflate_bounded(
            member,
            &format!("{source}: npz member {member_name}"),
            allowance,
        )?;
        let array = parse_npy(&npy, name, source, allowance)?;
        // The inflated member is decoded: its bytes go back.
        allowance.release(npy.len() as u64);
        drop(npy);
        if name == NPZ_ARCHITECTURE_KEY {
            let Npy::U8(text) = array else {
                return Err(invalid(
                    source,
                    format_args!("{NPZ_ARCHITECTURE_KEY} must be a uint8 array of JSON bytes"),
                ));
            };
            architecture = Some(architecture_from_json(&text, source)?);
        } else {
            let Npy::Float(tensor) = array else {
                return Err(invalid(
                    source,
                    format_args!("tensor {name}: expected a float array, found uint8"),
                ));
            };
            tensors.insert(name.to_string(), tensor);
        }
    }
    Ok(WeightsFile {
        tensors,
        architecture,
    })
}

/// A decoded `.npy` array.
#[derive(Debug)]
enum Npy {
    Float(Tensor),
    /// A 1-D uint8 array (the architecture's JSON bytes).
    U8(Vec<u8>),
}

/// Parses one `.npy` file (format versions 1 to 3): the magic `\x93NUMPY`, the version, the
/// header length (u16 in version 1, u32 after), a Python dict literal with `descr`,
/// `fortran_order` and `shape`, then the raw data.
fn parse_npy(bytes: &[u8], name: &str, source: &str, allowance: &mut Allowance) -> Result<Npy> {
    let bad = |what: String| invalid(source, format_args!("tensor {name}: {what}"));
    if !bytes.starts_with(strata_store::npy::MAGIC) || bytes.len() < 10 {
        return Err(bad("not a .npy array (bad magic or truncated)".into()));
    }
    let (header_len, header_start): (usize, usize) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(bad(format!("unsupported .npy version {v} (or truncated)"))),
    };
    let data_start = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| bad("truncated .npy header".into()))?;
    let header = std::str::from_utf8(&bytes[header_start..data_start])
        .map_err(|_| bad(".npy header is not text".into()))?;
    let header = strata_store::npy::parse_header_dict(header)
        .map_err(|e| bad(format!("bad .npy header: {e}")))?;
    let shape = header
        .shape
        .iter()
        .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
        .collect::<Vec<_>>();
    let n = numel(&shape, name, source)?;
    let data = &bytes[data_start..];
    let kind = match header.descr.as_str() {
        "<f4" => Some(Float::F32),
        "<f8" => Some(Float::F64),
        "<f2" => Some(Float::F16),
        "|u1" => None,
        other => {
            return Err(bad(format!(
                "unsupported dtype {} (expected little-endian float32 '<f4', or '<f8', '<f2')",
                shown(other)
            )))
        }
    };
    let size = kind.map_or(1, Float::size);
    if n.checked_mul(size) != Some(data.len()) {
        return Err(bad(format!(
            "shape {:?} of {} needs {} bytes of data, the array has {}",
            shape,
            header.descr,
            n.saturating_mul(size),
            data.len()
        )));
    }
    if header.fortran_order && shape.len() > 1 {
        return Err(bad(
            "Fortran-ordered arrays are not supported (save a C-contiguous array)".into(),
        ));
    }
    charge_tensor(allowance, n, name, source)?;
    Ok(match kind {
        Some(float) => Npy::Float(Tensor {
            shape,
            data: float.decode(data),
        }),
        None if shape.len() == 1 => Npy::U8(data.to_vec()),
        None => return Err(bad(format!("uint8 array of shape {shape:?}"))),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// A safetensors file of float32 `tensors` (name, shape, values) and, when given, the
    /// architecture JSON in its metadata: the format as `strata.serve.export` writes it.
    pub(crate) fn safetensors(tensors: &[(&str, &[usize], &[f32])], arch: Option<&str>) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, shape, values) in tensors {
            let begin = data.len();
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
        if let Some(arch) = arch {
            header.insert(
                "__metadata__".into(),
                serde_json::json!({ SAFETENSORS_ARCHITECTURE_KEY: arch }),
            );
        }
        let header = serde_json::to_vec(&header).unwrap();
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header);
        out.extend(data);
        out
    }

    /// One `.npy` array (version 1) with `descr`, `shape` and raw `data`.
    fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
        let dims: String = shape.iter().map(|d| format!("{d}, ")).collect();
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    /// An npz archive of float32 `tensors` (deflated when `deflate`) and the architecture.
    pub(crate) fn npz(
        tensors: &[(&str, &[usize], &[f32])],
        arch: Option<&str>,
        deflate: bool,
    ) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let method = if deflate {
            zip::CompressionMethod::Deflated
        } else {
            zip::CompressionMethod::Stored
        };
        let options = zip::write::SimpleFileOptions::default().compression_method(method);
        for (name, shape, values) in tensors {
            let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            zip.start_file(format!("{name}.npy"), options).unwrap();
            zip.write_all(&npy("<f4", shape, &data)).unwrap();
        }
        if let Some(arch) = arch {
            zip.start_file(format!("{NPZ_ARCHITECTURE_KEY}.npy"), options)
                .unwrap();
            zip.write_all(&npy("|u1", &[arch.len()], arch.as_bytes()))
                .unwrap();
        }
        zip.finish().unwrap().into_inner()
    }

    const ARCH: &str =
        r#"{"kind":"gcn","in_dim":2,"hidden_dim":4,"out_dim":3,"layers":1,"fanouts":[5]}"#;

    fn err(r: Result<WeightsFile>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn safetensors_round_trip() {
        let bytes = safetensors(
            &[("a", &[2, 3], &[1., 2., 3., 4., 5., 6.]), ("s", &[], &[7.])],
            Some(ARCH),
        );
        let f = parse(
            &bytes,
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded(),
        )
        .unwrap();
        assert_eq!(f.tensors["a"].shape, vec![2, 3]);
        assert_eq!(f.tensors["a"].data, vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!(f.tensors["s"].shape, Vec::<usize>::new());
        let arch = f.architecture.unwrap();
        assert_eq!(arch.kind, super::super::ModelKind::Gcn);
        assert_eq!(arch.fanouts, vec![5]);
    }

    #[test]
    fn safetensors_half_precision_is_widened() {
        let data: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .chain(
                [0.25f32]
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes()),
            )
            .collect();
        let header = br#"{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header);
        bytes.extend(data);
        let f = parse(
            &bytes,
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded(),
        )
        .unwrap();
        assert_eq!(f.tensors["h"].data, vec![1.5, -2.0]);
        assert_eq!(f.tensors["b"].data, vec![0.25]);
        assert!(f.architecture.is_none());
    }

    #[test]
    fn safetensors_bad_inputs_are_named() {
        assert!(err(parse(
            b"\x05\x00",
            Format::Safetensors,
            "m.st",
            &mut Allowance::unbounded()
        ))
        .contains("m.st: truncated safetensors file"));
        let good = safetensors(&[("w", &[2], &[1., 2.])], None);
        let msg = err(parse(
            &good[..12],
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded(),
        ));
        assert!(
            msg.contains("past the end of the file (4 bytes follow"),
            "{msg}"
        );
        // Data cut short: the offsets run past the end.
        let msg = err(parse(
            &good[..good.len() - 1],
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded(),
        ));
        assert!(msg.contains("tensor w: data_offsets [0, 8]"), "{msg}");
        // Offsets that disagree with the shape.
        let bytes = safetensors(&[("w", &[3], &[1., 2.])], None);
        assert!(err(parse(
            &bytes,
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded()
        ))
        .contains("do not hold shape [3]"));
        // An integer tensor.
        let header = br#"{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header);
        bytes.extend([0u8; 8]);
        assert!(err(parse(
            &bytes,
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded()
        ))
        .contains("unsupported dtype \"I64\""));
        // Not JSON, and a bad architecture.
        let mut bytes = 3u64.to_le_bytes().to_vec();
        bytes.extend(b"{x}");
        assert!(err(parse(
            &bytes,
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded()
        ))
        .contains("not a JSON object"));
        let bytes = safetensors(&[], Some(r#"{"kind":"gat"}"#));
        assert!(err(parse(
            &bytes,
            Format::Safetensors,
            "m",
            &mut Allowance::unbounded()
        ))
        .contains("declared architecture is not valid"));
    }

    #[test]
    fn npz_round_trip_stored_and_deflated() {
        for deflate in [false, true] {
            let bytes = npz(
                &[
                    ("convs.0.w", &[2, 2], &[1., 2., 3., 4.]),
                    ("e", &[], &[0.5]),
                ],
                Some(ARCH),
                deflate,
            );
            assert_eq!(
                Format::resolve(None, None, &bytes, "m").unwrap(),
                Format::Npz
            );
            let f = parse(&bytes, Format::Npz, "m", &mut Allowance::unbounded()).unwrap();
            assert_eq!(f.tensors["convs.0.w"].data, vec![1., 2., 3., 4.]);
            assert_eq!(f.tensors["e"].shape, Vec::<usize>::new());
            assert_eq!(f.architecture.unwrap().in_dim, 2);
        }
    }

    #[test]
    fn npy_float64_is_narrowed_and_bad_arrays_are_named() {
        let data: Vec<u8> = [0.5f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let Npy::Float(t) = parse_npy(
            &npy("<f8", &[2], &data),
            "t",
            "m",
            &mut Allowance::unbounded(),
        )
        .unwrap() else {
            panic!("not float")
        };
        assert_eq!(t.data, vec![0.5, 2.0]);
        let msg = parse_npy(
            &npy("<i8", &[1], &[0; 8]),
            "t",
            "m",
            &mut Allowance::unbounded(),
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains("tensor t: unsupported dtype \"<i8\""), "{msg}");
        let msg = parse_npy(
            &npy("<f4", &[3], &[0; 8]),
            "t",
            "m",
            &mut Allowance::unbounded(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("shape [3] of <f4 needs 12 bytes of data, the array has 8"),
            "{msg}"
        );
        let full = npy("<f4", &[2], &[0; 8]);
        let msg = parse_npy(&full[..20], "t", "m", &mut Allowance::unbounded())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("truncated .npy header"), "{msg}");
        let msg = parse_npy(b"garbage", "t", "m", &mut Allowance::unbounded())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("not a .npy array"), "{msg}");
        // The header's dict is parsed strictly (strata_store::npy), and its text not echoed.
        let twice = npy("<f4', 'shape': (1,), 'x': '", &[2], &[0; 8]);
        let msg = parse_npy(&twice, "t", "m", &mut Allowance::unbounded())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("tensor t: bad .npy header: 'shape' appears twice"),
            "{msg}"
        );
        let huge = npy("<f4", &[1 << 40, 1 << 40], &[]);
        let msg = parse_npy(&huge, "t", "m", &mut Allowance::unbounded())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("is too large"), "{msg}");
    }

    #[test]
    fn format_from_name_suffix_and_magic() {
        let st = safetensors(&[], None);
        fn p(s: &str) -> Option<&Path> {
            Some(Path::new(s))
        }
        assert_eq!(
            Format::resolve(Some("NPZ"), None, &st, "m").unwrap(),
            Format::Npz
        );
        assert_eq!(
            Format::resolve(None, p("a.safetensors"), b"", "m").unwrap(),
            Format::Safetensors
        );
        assert_eq!(
            Format::resolve(None, p("a.npz"), b"", "m").unwrap(),
            Format::Npz
        );
        assert_eq!(
            Format::resolve(None, p("a.bin"), &st, "m").unwrap(),
            Format::Safetensors
        );
        assert!(Format::resolve(Some("onnx"), None, &st, "m")
            .unwrap_err()
            .to_string()
            .contains("expected safetensors or npz"));
        assert!(Format::resolve(None, p("a.bin"), b"hello", "a.bin")
            .unwrap_err()
            .to_string()
            .contains("a.bin: cannot tell"));
    }

    #[test]
    fn inflation_stops_at_the_allowance() {
        // An endless stream: only the allowance stops it.
        let mut allowance = Allowance::new(4 << 20, "a test limit", None);
        let e =
            inflate_bounded(std::io::repeat(0), "m: npz member w.npy", &mut allowance).unwrap_err();
        assert!(matches!(e, ServeError::ResourceExhausted(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("m: npz member w.npy")
                && msg.contains("4194304 bytes in all (a test limit)"),
            "{msg}"
        );
        // What fits is inflated whole, to the exact byte, including a member that ends at
        // the limit.
        for n in [0, 1000, 3 << 20, 4 << 20] {
            let mut allowance = Allowance::new(4 << 20, "a test limit", None);
            let out = inflate_bounded(std::io::repeat(7).take(n), "m", &mut allowance).unwrap();
            assert_eq!(out.len() as u64, n);
        }
    }

    #[test]
    fn a_bomb_member_is_refused_whatever_size_the_archive_declares() {
        // An npz whose member inflates to 64 MiB, honest about its size.
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("w.npy", options).unwrap();
        let n = 16 << 20;
        zip.write_all(&npy("<f4", &[n], &[])).unwrap();
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..(n * 4) >> 20 {
            zip.write_all(&chunk).unwrap();
        }
        let bytes = zip.finish().unwrap().into_inner();
        let mut allowance = Allowance::new(8 << 20, "a test limit", None);
        let e = parse(&bytes, Format::Npz, "m", &mut allowance).unwrap_err();
        assert!(
            e.to_string().contains("m: npz member w.npy, inflated"),
            "{e}"
        );
        // The same file under an allowance that holds it, and its float32 copy, loads.
        let mut allowance = Allowance::new(160 << 20, "a test limit", None);
        let f = parse(&bytes, Format::Npz, "m", &mut allowance).unwrap();
        assert_eq!(f.tensors["w"].data.len(), n);
    }

    #[test]
    fn tensors_are_charged_before_they_are_decoded() {
        let bytes = safetensors(&[("w", &[1000], &[0.0; 1000])], None);
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) * JSON_EXPANSION;
        let mut allowance = Allowance::new(header - 1, "a test limit", None);
        let e = parse(&bytes, Format::Safetensors, "m", &mut allowance).unwrap_err();
        assert!(e.to_string().contains("m: the safetensors header"), "{e}");
        let mut allowance = Allowance::new(header + 3999, "a test limit", None);
        let e = parse(&bytes, Format::Safetensors, "m", &mut allowance).unwrap_err();
        assert!(
            e.to_string()
                .contains("m: tensor w as float32 needs 4000 more bytes"),
            "{e}"
        );
    }

    #[test]
    fn special_and_oversized_files_are_refused_before_a_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut free = Allowance::unbounded();
        for p in [fifo.as_path(), dir.path(), Path::new("/dev/zero")] {
            let e = read_file(p, "sent", &mut free).unwrap_err().to_string();
            assert!(e.contains("model file sent is not a regular file"), "{e}");
        }
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let mut allowance = Allowance::new(1 << 20, "a test limit", None);
        let e = read_file(&big, "big", &mut allowance).unwrap_err();
        assert!(matches!(e, ServeError::ResourceExhausted(_)), "{e}");
        assert!(
            e.to_string()
                .contains("model file big (1099511627776 bytes)"),
            "{e}"
        );
    }

    #[test]
    fn errors_do_not_echo_the_file() {
        let passwd = b"root:x:0:0:root:/root:/bin/bash\n";
        let mut free = Allowance::unbounded();
        let e = err(parse(passwd, Format::Safetensors, "f", &mut free));
        let first8 = u64::from_le_bytes(passwd[..8].try_into().unwrap()).to_string();
        assert!(!e.contains(&first8) && !e.contains("root"), "{e}");
        let header = br#"{"w":{"dtype":"root:x:0","shape":[1],"data_offsets":[0,4]},"v":"root:x"}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header);
        bytes.extend([0u8; 4]);
        let e = err(parse(&bytes, Format::Safetensors, "f", &mut free));
        assert!(!e.contains("root"), "{e}");
    }

    #[test]
    fn npz_rejects_other_members_and_non_zip() {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        zip.start_file("readme.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(b"hi").unwrap();
        let bytes = zip.finish().unwrap().into_inner();
        assert!(
            err(parse(&bytes, Format::Npz, "m", &mut Allowance::unbounded()))
                .contains("\"readme.txt\" is not a .npy array")
        );
        assert!(err(parse(
            b"PK\x03\x04junk",
            Format::Npz,
            "m",
            &mut Allowance::unbounded()
        ))
        .contains("not a valid npz"));
    }
}
