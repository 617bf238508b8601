//! The `[convert]` config section: every option of `strata convert`, checked here. The front
//! input formats ([`super::source`]) plan the inputs from the checked values (format
//! detection, file roles) and build their converter's job from them.

use std::fmt;

use schemars::JsonSchema;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// Three fractions (train, valid, test) in [0, 1] summing to 1 with train > 0. Accepts a list
/// or a string such as `0.9,0.05,0.05`; serializes as the list. Its schema says
/// `"x-kind": "fractions"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Fractions(pub [f64; 3]);

impl Fractions {
    /// `f` if it is a split (see [`Fractions`]), else why not.
    pub fn check(f: [f64; 3]) -> Result<Fractions, String> {
        if f.iter().any(|x| !(0.0..=1.0).contains(x))
            || (f.iter().sum::<f64>() - 1.0).abs() > 1e-6
            || f[0] <= 0.0
        {
            return Err(format!(
                "expected three fractions (train, valid, test) in [0, 1] summing to 1 with train > 0, got {f:?}"
            ));
        }
        Ok(Fractions(f))
    }
}

impl<'de> Deserialize<'de> for Fractions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fractions, D::Error> {
        struct FractionsVisitor;
        impl<'de> Visitor<'de> for FractionsVisitor {
            type Value = Fractions;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("three fractions like 0.9,0.05,0.05")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Fractions, E> {
                let parts: Result<Vec<f64>, _> = v.split(',').map(|p| p.trim().parse()).collect();
                match parts.ok().and_then(|p| <[f64; 3]>::try_from(p).ok()) {
                    Some(f) => Fractions::check(f).map_err(E::custom),
                    None => Err(E::custom(format!(
                        "expected three fractions like 0.9,0.05,0.05, got '{v}'"
                    ))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Fractions, A::Error> {
                let mut parts = Vec::new();
                while let Some(x) = seq.next_element::<f64>()? {
                    parts.push(x);
                }
                let n = parts.len();
                let f = <[f64; 3]>::try_from(parts).map_err(|_| {
                    serde::de::Error::custom(format!("expected three fractions, got {n}"))
                })?;
                Fractions::check(f).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_any(FractionsVisitor)
    }
}

impl JsonSchema for Fractions {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Fractions".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": ["array", "string"],
            "items": {"type": "number"},
            "x-kind": "fractions",
        })
    }
}

/// The stored feature dtype, or `auto` (float16 stays, everything else becomes float32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoredFeatureDtype {
    #[default]
    Auto,
    Float32,
    Float16,
}
