//! GNN models served by the graph service: declared architectures, weights files, kernels.
//!
//! A model is a trained `strata.gnn.models.GNN` exported by `strata.serve.export` (its
//! `state_dict()` in float32 plus a declared [`Architecture`]) as safetensors or npz. The
//! service loads it once ([`Model::load`]), optionally quantizing the linear weights to int8
//! (GLIST serves 8-bit fixed point, §5.1), and runs it natively over sampled blocks
//! ([`Model::forward`]): no Python and no torch on the serving path.

mod arch;
mod assemble;
pub mod file;
pub mod kernels;
mod layers;
mod loaded;
mod precision;
pub mod quant;
mod tensor;

pub use arch::{Architecture, ModelKind};
pub use loaded::Model;
pub use precision::Precision;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Result, ServeError};
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
            kind: ModelKind::Sage,
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
