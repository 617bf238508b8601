//! GNN models served by the graph service: declared architectures, weights files, kernels.
//!
//! A model is a trained `strata.gnn.models.GNN` exported by `strata.serve.export` (its
//! `state_dict()` in float32 plus a declared [`Architecture`]) as safetensors or npz. The
//! service loads it once ([`Model::load`]), optionally quantizing the linear weights to int8
//! (GLIST serves 8-bit fixed point, §5.1), and runs it natively over sampled blocks
//! ([`Model::forward`]): no Python and no torch on the serving path.

pub mod file;
pub mod kernels;
mod layers;
pub mod quant;

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Result, ServeError};
use crate::memory::Allowance;
use layers::{gcn, gin, sage_mean, sage_pool, Layer, LayerKind};

strata_store::registry! {
    /// The layer kind of a servable GNN (every layer of a model has the same kind; registered
    /// by name, see [`LayerKind`]).
    pub enum ModelKind: dyn LayerKind, "layer kind", "layer kind" {
        sage_mean::SageMean,
        sage_pool::SagePool,
        gcn::Gcn,
        gin::Gin,
    }
}

/// What a weights file is a model of: the layer type and the widths of a `layers`-deep stack
/// (`in_dim -> hidden_dim -> ... -> hidden_dim -> out_dim`; `hidden_dim` is unused with one
/// layer) and the sampling fanouts it was trained with, from the seeds outwards as in
/// `strata gnn train --fanouts` (so `fanouts[0]` is the hop of the *last* block).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Architecture {
    pub kind: ModelKind,
    /// Feature width of the input rows.
    pub in_dim: usize,
    /// Width of every hidden layer's output.
    pub hidden_dim: usize,
    /// Width of the output rows (classes, or the embedding width).
    pub out_dim: usize,
    /// Number of GNN layers (= hops = blocks per request).
    pub layers: usize,
    /// Neighbours sampled per hop, seeds outwards; -1 keeps all.
    pub fanouts: Vec<i32>,
}

impl Architecture {
    /// Checks the declared numbers: widths and depth at least 1, one fanout per layer, each
    /// fanout >= 1 or -1. The error names the field and the value found.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("in_dim", self.in_dim),
            ("hidden_dim", self.hidden_dim),
            ("out_dim", self.out_dim),
            ("layers", self.layers),
        ] {
            if v < 1 {
                return Err(ServeError::InvalidArgument(format!(
                    "architecture.{field}: need at least 1, got {v}"
                )));
            }
        }
        if self.fanouts.len() != self.layers {
            return Err(ServeError::InvalidArgument(format!(
                "architecture.fanouts: need one fanout per layer ({}), got {} ({:?})",
                self.layers,
                self.fanouts.len(),
                self.fanouts
            )));
        }
        if let Some(f) = self.fanouts.iter().find(|&&f| f != -1 && f < 1) {
            return Err(ServeError::InvalidArgument(format!(
                "architecture.fanouts: each fanout must be >= 1 or -1 (all), got {f} in {:?}",
                self.fanouts
            )));
        }
        Ok(())
    }

    /// `(input width, output width)` of layer `i` (0 reads the features).
    pub fn layer_dims(&self, i: usize) -> (usize, usize) {
        let width = |j: usize| match j {
            0 => self.in_dim,
            j if j == self.layers => self.out_dim,
            _ => self.hidden_dim,
        };
        (width(i), width(i + 1))
    }
}

/// The number format the linear layers are served in. Aggregations are float32 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Float32 weights and float32 products.
    Fp32,
    /// Int8 weights (symmetric, one scale per output channel) and int8 activations (one scale
    /// per row), multiplied with int32 accumulation: a quarter of the weight bytes.
    Int8,
}

impl Precision {
    /// `fp32` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Int8 => "int8",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = ServeError;

    /// `fp32` or `int8` (case-insensitive).
    fn from_str(s: &str) -> Result<Precision> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" => Ok(Precision::Fp32),
            "int8" => Ok(Precision::Int8),
            _ => Err(ServeError::InvalidArgument(format!(
                "precision: expected fp32 or int8, got {s:?}"
            ))),
        }
    }
}

/// A loaded GNN, ready to run: its architecture and its layers' weights in the served
/// precision. Immutable once loaded, so one `Arc<Model>` serves concurrent requests.
pub struct Model {
    arch: Architecture,
    precision: Precision,
    layers: Vec<Box<dyn Layer>>,
    /// Scalars in the weights file (before any quantization).
    parameters: u64,
}

impl fmt::Debug for Model {
    // The weights are megabytes of numbers: show what identifies the model instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("architecture", &self.arch)
            .field("precision", &self.precision)
            .field("parameters", &self.parameters)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Model {
    /// Loads the weights file at `path`: `format` is `safetensors` or `npz`, or None to tell
    /// from the suffix (then the magic bytes). `arch` overrides the architecture the file
    /// declares; the file must hold exactly the tensors of that architecture, with the shapes
    /// it implies. `precision` is how the linear layers are served. What is not a regular
    /// file is refused before any read.
    pub fn load(
        path: &Path,
        format: Option<&str>,
        arch: Option<Architecture>,
        precision: Precision,
    ) -> Result<Model> {
        let source = path.display().to_string();
        let mut allowance = Allowance::unbounded();
        let bytes = file::read_file(path, &source, &mut allowance)?;
        let format = file::Format::resolve(format, Some(path), &bytes, &source)?;
        Model::build(&bytes, format, arch, precision, &source, &mut allowance)
    }

    /// [`Model::load`] from the bytes of a weights file (e.g. uploaded by a client): the format
    /// is `format`, or told from the magic bytes when None.
    pub fn from_bytes(
        bytes: &[u8],
        format: Option<&str>,
        arch: Option<Architecture>,
        precision: Precision,
    ) -> Result<Model> {
        let source = "model weights";
        let format = file::Format::resolve(format, None, bytes, source)?;
        Model::build(
            bytes,
            format,
            arch,
            precision,
            source,
            &mut Allowance::unbounded(),
        )
    }

    /// [`Model::from_bytes`] of the weights file `source` names, in the format already
    /// resolved, charging what parsing allocates (decoded tensors, inflated npz members) to
    /// `allowance` before it allocates it.
    pub fn build(
        bytes: &[u8],
        format: file::Format,
        arch: Option<Architecture>,
        precision: Precision,
        source: &str,
        allowance: &mut Allowance,
    ) -> Result<Model> {
        let weights = file::parse(bytes, format, source, allowance)?;
        let arch = match (arch, weights.architecture) {
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => {
                return Err(ServeError::FailedPrecondition(format!(
                    "{source}: the file declares no architecture and none was given \
                     (export it with strata.serve.export_model, or pass the architecture)"
                )))
            }
        };
        arch.validate()?;
        let parameters = weights.tensors.values().map(|t| t.data.len() as u64).sum();
        let layers = layers::build(&arch, weights.tensors, precision, source)?;
        Ok(Model {
            arch,
            precision,
            layers,
            parameters,
        })
    }

    /// The architecture the model was loaded with.
    pub fn architecture(&self) -> &Architecture {
        &self.arch
    }

    /// The precision the linear layers are served in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Number of scalars in the weights (float32 parameters of the trained model).
    pub fn parameters(&self) -> u64 {
        self.parameters
    }

    /// Bytes the weights occupy in memory as served (int8 weights count one byte each plus
    /// their per-channel scales).
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use file::tests::{npz, safetensors};

    const GCN: &str =
        r#"{"kind":"gcn","in_dim":3,"hidden_dim":4,"out_dim":2,"layers":2,"fanouts":[5,-1]}"#;

    fn gcn_arch() -> Architecture {
        serde_json::from_str(GCN).unwrap()
    }

    /// The tensors of [`GCN`] filled with 0.5: (name, shape, values).
    fn gcn_tensors() -> Vec<(String, Vec<usize>, Vec<f32>)> {
        [
            ("convs.0.lin.weight", vec![4, 3]),
            ("convs.0.lin.bias", vec![4]),
            ("convs.1.lin.weight", vec![2, 4]),
            ("convs.1.lin.bias", vec![2]),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s.clone(), vec![0.5; s.iter().product()]))
        .collect()
    }

    fn st(tensors: &[(String, Vec<usize>, Vec<f32>)], arch: Option<&str>) -> Vec<u8> {
        let refs: Vec<(&str, &[usize], &[f32])> = tensors
            .iter()
            .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
            .collect();
        safetensors(&refs, arch)
    }

    fn load(bytes: &[u8], arch: Option<Architecture>) -> Result<Model> {
        Model::from_bytes(bytes, None, arch, Precision::Fp32)
    }

    #[test]
    fn loads_the_declared_architecture_and_counts_weights() {
        let m = load(&st(&gcn_tensors(), Some(GCN)), None).unwrap();
        assert_eq!(m.architecture(), &gcn_arch());
        assert_eq!(m.precision(), Precision::Fp32);
        assert_eq!(m.parameters(), 12 + 4 + 8 + 2);
        assert_eq!(m.bytes(), 4 * 26);
        let q =
            Model::from_bytes(&st(&gcn_tensors(), Some(GCN)), None, None, Precision::Int8).unwrap();
        // Int8 weights: a byte each plus a scale per output row; biases stay float32.
        assert_eq!(q.bytes(), (12 + 4 * 4) + (8 + 2 * 4) + 4 * (4 + 2));
        assert!(format!("{q:?}").contains("parameters: 26"));
    }

    #[test]
    fn npz_files_and_paths_load_too() {
        let refs: Vec<(String, Vec<usize>, Vec<f32>)> = gcn_tensors();
        let refs: Vec<(&str, &[usize], &[f32])> = refs
            .iter()
            .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.npz");
        std::fs::write(&path, npz(&refs, Some(GCN), true)).unwrap();
        let m = Model::load(&path, None, None, Precision::Int8).unwrap();
        assert_eq!(m.architecture().kind, ModelKind::Gcn);
        assert_eq!(m.precision(), Precision::Int8);
        let missing = dir.path().join("none.safetensors");
        let e = Model::load(&missing, None, None, Precision::Fp32).unwrap_err();
        assert!(matches!(e, ServeError::NotFound(_)));
        assert!(e.to_string().contains("none.safetensors"), "{e}");
        let e = Model::load(dir.path(), None, None, Precision::Fp32).unwrap_err();
        assert!(e.to_string().contains("is not a regular file"), "{e}");
    }

    #[test]
    fn the_given_architecture_overrides_the_file() {
        // The file declares nothing: it needs one, and a given one is used.
        let bytes = st(&gcn_tensors(), None);
        let e = load(&bytes, None).unwrap_err();
        assert!(matches!(e, ServeError::FailedPrecondition(_)));
        assert!(e.to_string().contains("declares no architecture"), "{e}");
        assert_eq!(load(&bytes, Some(gcn_arch())).unwrap().parameters(), 26);
        // A file declaring 2 layers read as 3: the third layer's tensors are missing.
        let mut three = gcn_arch();
        three.layers = 3;
        three.fanouts = vec![5, 5, 5];
        let e = load(&st(&gcn_tensors(), Some(GCN)), Some(three)).unwrap_err();
        assert!(matches!(e, ServeError::FailedPrecondition(_)));
        assert!(
            e.to_string()
                .contains("missing tensors that a 3-layer gcn model (3 -> 4 -> 2) needs: convs.2.lin.weight, convs.2.lin.bias"),
            "{e}"
        );
        // Read as one layer: the second layer's tensors are extra.
        let one = Architecture {
            layers: 1,
            fanouts: vec![5],
            out_dim: 4,
            ..gcn_arch()
        };
        let e = load(&st(&gcn_tensors(), Some(GCN)), Some(one)).unwrap_err();
        assert!(matches!(e, ServeError::FailedPrecondition(_)));
        assert!(
            e.to_string()
                .contains("tensors that a 1-layer gcn model (3 -> 4 -> 4) does not have: convs.1.lin.bias, convs.1.lin.weight"),
            "{e}"
        );
        // Another kind entirely.
        let sage = Architecture {
            kind: ModelKind::SageMean,
            ..gcn_arch()
        };
        let e = load(&st(&gcn_tensors(), Some(GCN)), Some(sage)).unwrap_err();
        assert!(e.to_string().contains("convs.0.self_lin.weight"), "{e}");
    }

    #[test]
    fn wrong_shapes_and_missing_tensors_are_named() {
        let mut tensors = gcn_tensors();
        tensors[2] = ("convs.1.lin.weight".into(), vec![2, 5], vec![0.0; 10]);
        let e = load(&st(&tensors, Some(GCN)), None).unwrap_err();
        assert!(matches!(e, ServeError::InvalidArgument(_)));
        assert!(
            e.to_string()
                .contains("tensor convs.1.lin.weight: expected shape [2, 4] for a 2-layer gcn model (3 -> 4 -> 2), found [2, 5]"),
            "{e}"
        );
        let mut tensors = gcn_tensors();
        tensors.remove(1);
        let e = load(&st(&tensors, Some(GCN)), None).unwrap_err();
        assert!(matches!(e, ServeError::FailedPrecondition(_)));
        assert!(e.to_string().contains("needs: convs.0.lin.bias"), "{e}");
    }

    #[test]
    fn gin_eps_may_be_a_scalar_or_one_element() {
        let arch =
            r#"{"kind":"gin","in_dim":2,"hidden_dim":2,"out_dim":2,"layers":1,"fanouts":[3]}"#;
        let w = [0.0f32; 4];
        for eps_shape in [&[][..], &[1][..]] {
            let bytes = safetensors(
                &[
                    ("convs.0.lin1.weight", &[2, 2], &w),
                    ("convs.0.lin1.bias", &[2], &w[..2]),
                    ("convs.0.lin2.weight", &[2, 2], &w),
                    ("convs.0.lin2.bias", &[2], &w[..2]),
                    ("convs.0.eps", eps_shape, &[0.1]),
                ],
                Some(arch),
            );
            assert_eq!(load(&bytes, None).unwrap().parameters(), 13);
        }
    }

    #[test]
    fn architecture_validation_names_the_field() {
        let check = |f: &dyn Fn(&mut Architecture)| {
            let mut a = gcn_arch();
            f(&mut a);
            a.validate().unwrap_err().to_string()
        };
        assert!(check(&|a| a.layers = 0).contains("architecture.layers: need at least 1, got 0"));
        assert!(check(&|a| a.in_dim = 0).contains("architecture.in_dim"));
        assert!(check(&|a| a.fanouts = vec![5]).contains("one fanout per layer (2), got 1"));
        assert!(check(&|a| a.fanouts = vec![5, 0]).contains("got 0 in [5, 0]"));
        assert!(gcn_arch().validate().is_ok());
        assert_eq!(gcn_arch().layer_dims(0), (3, 4));
        assert_eq!(gcn_arch().layer_dims(1), (4, 2));
        // Through loading: a file declaring bad fanouts is refused.
        let bad = GCN.replace("[5,-1]", "[5,-2]");
        let e = load(&st(&gcn_tensors(), Some(&bad)), None).unwrap_err();
        assert!(e.to_string().contains("architecture.fanouts"), "{e}");
        // Unknown fields are refused rather than ignored.
        let typo = GCN.replace("\"layers\"", "\"layer\"");
        assert!(serde_json::from_str::<Architecture>(&typo).is_err());
    }

    #[test]
    fn precision_names() {
        assert_eq!("INT8".parse::<Precision>().unwrap(), Precision::Int8);
        assert_eq!("fp32".parse::<Precision>().unwrap().to_string(), "fp32");
        let e = "fp16".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("expected fp32 or int8, got \"fp16\""), "{e}");
        assert_eq!(
            serde_json::to_string(&ModelKind::SagePool).unwrap(),
            "\"sage_pool\""
        );
    }
}
