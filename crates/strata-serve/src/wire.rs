//! Conversions between protobuf messages and the service's types, with the checks a
//! malformed message must fail (tensor bytes that do not match their shape, unknown enums).

use tonic::{Code, Status};

use crate::error::ServeError;
use crate::model::{Architecture, ModelKind, Precision};
use crate::proto;

impl From<ServeError> for Status {
    fn from(e: ServeError) -> Status {
        let code = match &e {
            ServeError::NotFound(_) => Code::NotFound,
            ServeError::InvalidArgument(_) => Code::InvalidArgument,
            ServeError::AlreadyExists(_) => Code::AlreadyExists,
            ServeError::FailedPrecondition(_) => Code::FailedPrecondition,
            ServeError::PermissionDenied(_) => Code::PermissionDenied,
            ServeError::ResourceExhausted(_) => Code::ResourceExhausted,
            ServeError::OutOfRange(_) => Code::OutOfRange,
            ServeError::Unavailable(_) => Code::Unavailable,
            ServeError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            // The sampler's config errors are about the request (fanouts, duplicate seeds).
            ServeError::Graph(strata_graph::GraphError::Config(_)) => Code::InvalidArgument,
            ServeError::Store(_) | ServeError::Graph(_) => Code::FailedPrecondition,
            ServeError::Io { .. } => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

fn invalid(msg: String) -> ServeError {
    ServeError::InvalidArgument(msg)
}

/// The f32 values of a `(rows, cols)` FLOAT32 tensor; `rows` None accepts any count.
/// Returns the values and the row count.
pub fn f32_matrix(
    t: Option<&proto::Tensor>,
    what: &str,
    rows: Option<usize>,
    cols: usize,
) -> Result<(Vec<f32>, usize), ServeError> {
    let t = t.ok_or_else(|| invalid(format!("{what}: missing tensor")))?;
    if t.dtype != proto::ElementType::Float32 as i32 {
        return Err(invalid(format!(
            "{what}: dtype must be FLOAT32, got {}",
            dtype_name(t.dtype)
        )));
    }
    if t.shape.len() != 2 {
        return Err(invalid(format!(
            "{what}: expected a 2-D tensor (rows, {cols}), got shape {:?}",
            t.shape
        )));
    }
    let (r, c) = (t.shape[0] as usize, t.shape[1] as usize);
    if c != cols || rows.is_some_and(|want| want != r) {
        let want_rows = rows.map_or("rows".to_string(), |w| w.to_string());
        return Err(invalid(format!(
            "{what}: expected shape ({want_rows}, {cols}), got {:?}",
            t.shape
        )));
    }
    let expected = r.checked_mul(c).and_then(|n| n.checked_mul(4));
    if expected != Some(t.data.len()) {
        return Err(invalid(format!(
            "{what}: shape {:?} needs {} bytes of float32 data, got {}",
            t.shape,
            expected.map_or("too many".into(), |n| n.to_string()),
            t.data.len()
        )));
    }
    let values = t
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Ok((values, r))
}

/// A FLOAT32 tensor of `values` in shape `(rows, cols)`.
pub fn f32_tensor(values: &[f32], rows: usize, cols: usize) -> proto::Tensor {
    f32_tensor_bytes(bytemuck::cast_slice(values).to_vec(), rows, cols)
}

/// A FLOAT32 tensor of shape `(rows, cols)` over `data`, its little-endian bytes.
pub fn f32_tensor_bytes(data: Vec<u8>, rows: usize, cols: usize) -> proto::Tensor {
    proto::Tensor {
        shape: vec![rows as u64, cols as u64],
        dtype: proto::ElementType::Float32 as i32,
        data,
    }
}

fn dtype_name(d: i32) -> String {
    proto::ElementType::try_from(d)
        .map_or(format!("unknown ({d})"), |d| d.as_str_name().to_string())
}

/// The architecture a request declares, None when it leaves it to the file.
pub fn architecture(
    a: Option<&proto::ModelArchitecture>,
) -> Result<Option<Architecture>, ServeError> {
    let Some(a) = a else { return Ok(None) };
    let kind = match proto::ModelKind::try_from(a.kind) {
        Ok(proto::ModelKind::Unspecified) => return Ok(None),
        // MODEL_KIND_SAGE_POOL is the registered kind sage_pool.
        Ok(k) => k
            .as_str_name()
            .trim_start_matches("MODEL_KIND_")
            .to_ascii_lowercase()
            .parse::<ModelKind>()
            .map_err(|e| invalid(format!("architecture.kind: {e}")))?,
        Err(_) => {
            return Err(invalid(format!(
                "architecture.kind: unknown value {}",
                a.kind
            )))
        }
    };
    Ok(Some(Architecture {
        kind,
        in_dim: a.in_dim as usize,
        hidden_dim: a.hidden_dim as usize,
        out_dim: a.out_dim as usize,
        layers: a.layers as usize,
        fanouts: a.fanouts.clone(),
    }))
}

pub fn architecture_proto(a: &Architecture) -> proto::ModelArchitecture {
    // Every registered kind has its MODEL_KIND_<NAME> value in serve.proto (a test checks).
    let kind = proto::ModelKind::from_str_name(&format!(
        "MODEL_KIND_{}",
        a.kind.name().to_ascii_uppercase()
    ))
    .expect("serve.proto has a value for every registered layer kind");
    proto::ModelArchitecture {
        kind: kind as i32,
        in_dim: a.in_dim as u32,
        hidden_dim: a.hidden_dim as u32,
        out_dim: a.out_dim as u32,
        layers: a.layers as u32,
        fanouts: a.fanouts.clone(),
    }
}

pub fn precision(p: i32) -> Result<Precision, ServeError> {
    match proto::Precision::try_from(p) {
        Ok(proto::Precision::Unspecified | proto::Precision::Fp32) => Ok(Precision::Fp32),
        Ok(proto::Precision::Int8) => Ok(Precision::Int8),
        Err(_) => Err(invalid(format!("precision: unknown value {p}"))),
    }
}

pub fn precision_proto(p: Precision) -> i32 {
    match p {
        Precision::Fp32 => proto::Precision::Fp32 as i32,
        Precision::Int8 => proto::Precision::Int8 as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every registered layer kind: a unique name, and the same kind back through its
    /// serve.proto value and through its architecture JSON.
    #[test]
    fn every_registered_layer_kind_round_trips() {
        let names = ModelKind::names();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for &kind in ModelKind::ALL {
            let a = Architecture {
                kind,
                in_dim: 3,
                hidden_dim: 4,
                out_dim: 2,
                layers: 2,
                fanouts: vec![5, -1],
            };
            let wire = architecture_proto(&a);
            assert_ne!(wire.kind, proto::ModelKind::Unspecified as i32, "{kind}");
            assert_eq!(architecture(Some(&wire)).unwrap(), Some(a.clone()));
            let json = serde_json::to_string(&a).unwrap();
            assert!(json.contains(&format!("\"kind\":\"{kind}\"")), "{json}");
            assert_eq!(serde_json::from_str::<Architecture>(&json).unwrap(), a);
        }
        let e = serde_json::from_str::<Architecture>(
            r#"{"kind":"sage_pol","in_dim":3,"hidden_dim":4,"out_dim":2,"layers":1,"fanouts":[5]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("did you mean `sage_pool`?"), "{e}");
    }

    /// A model exported when GraphSAGE-mean was served as `sage_mean` still loads, as `sage`,
    /// and is written back under its one name.
    #[test]
    fn a_renamed_layer_kind_still_loads_under_its_new_name() {
        let old = r#"{"kind":"sage_mean","in_dim":3,"hidden_dim":4,"out_dim":2,"layers":1,"fanouts":[5]}"#;
        let a = serde_json::from_str::<Architecture>(old).unwrap();
        assert_eq!(a.kind, ModelKind::Sage);
        assert_eq!(a.kind.name(), "sage");
        assert!(serde_json::to_string(&a)
            .unwrap()
            .contains(r#""kind":"sage""#));
    }
}
