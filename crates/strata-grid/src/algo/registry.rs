//! The algorithms `strata run` offers: one line each in [`ALGORITHMS`]. Everything else finds
//! them here by name: the `[run]` section's algorithm choices and parameters ([`AlgoParams`],
//! their schema from each algorithm's struct), the command line's list, the runner and the
//! budget plan (through the [`Configured`] algorithm), and `strata info --memory`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Map, Value};
use strata_store::config::{deserialize_error, field_order, ConfigError};
use strata_store::registry::unknown_name;

use super::{
    Algorithm, Betweenness, Bfs, Configured, HyperAnf, IterationValue, KCore, Lpa, Mis, PageRank,
    PersonalizedPageRank, Radii, Scc, Spmv, Sssp, Triangles, Wcc,
};
use crate::error::GridError;
use crate::program::Program;

/// Every algorithm, in the order the command line lists them; the first is the default.
pub const ALGORITHMS: &[Entry] = &[
    entry::<PageRank>(),
    entry::<Bfs>(),
    entry::<Wcc>(),
    entry::<Sssp>(),
    entry::<Spmv>(),
    entry::<KCore>(),
    entry::<PersonalizedPageRank>(),
    entry::<Scc>(),
    entry::<Mis>(),
    entry::<Radii>(),
    entry::<HyperAnf>(),
    entry::<Triangles>(),
    entry::<Lpa>(),
    entry::<Betweenness>(),
    entry::<Program>(),
];

/// A registered algorithm: its constants, and its parameters' handling compiled for its type.
pub struct Entry {
    /// [`Algorithm::NAME`].
    pub name: &'static str,
    /// [`Algorithm::ABOUT`].
    pub about: &'static str,
    /// [`Algorithm::ARRAYS`].
    pub arrays: &'static [&'static str],
    /// [`Algorithm::VALUE`].
    pub value: IterationValue,
    schema: fn(&mut SchemaGenerator) -> Schema,
    defaults: fn() -> Vec<(String, Value)>,
    configure: fn(&str, &Map<String, Value>) -> Result<Configured, ConfigError>,
}

const fn entry<A: Algorithm>() -> Entry {
    Entry {
        name: A::NAME,
        about: A::ABOUT,
        arrays: A::ARRAYS,
        value: A::VALUE,
        schema: A::json_schema,
        defaults: defaults::<A>,
        configure: configure::<A>,
    }
}

/// `A`'s parameters with their defaults, in declaration order.
fn defaults<A: Algorithm>() -> Vec<(String, Value)> {
    let values = serde_json::to_value(A::default()).expect("algorithm parameters serialize");
    field_order(&A::default())
        .into_iter()
        .map(|key| {
            let value = values[&key].clone();
            (key, value)
        })
        .collect()
}

/// `A` from `given` (some of its parameters; the rest take their defaults), validated; errors
/// name `section.parameter`.
fn configure<A: Algorithm>(
    section: &str,
    given: &Map<String, Value>,
) -> Result<Configured, ConfigError> {
    let algorithm: A = serde_json::from_value(Value::Object(given.clone()))
        .map_err(|e| deserialize_error::<A>(section, given, e))?;
    algorithm.validate().map_err(|e| match e {
        GridError::Config { field, msg } => ConfigError::new(section, &field, msg),
        other => ConfigError {
            key: section.into(),
            msg: other.to_string(),
        },
    })?;
    Ok(Configured::new(algorithm))
}

impl Entry {
    /// The JSON schema of its parameters: an object schema whose `properties` are the
    /// parameters (definitions they refer to are added to `generator`).
    pub fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        (self.schema)(generator)
    }

    /// Its parameters and their defaults, in declaration order.
    pub fn defaults(&self) -> Vec<(String, Value)> {
        (self.defaults)()
    }

    /// What `strata._native.grid_algorithms()` tells Python: name, about, result arrays,
    /// iteration value, and the parameter names.
    pub fn describe(&self) -> Value {
        let params: Vec<String> = self.defaults().into_iter().map(|(k, _)| k).collect();
        json!({
            "name": self.name,
            "about": self.about,
            "arrays": self.arrays,
            "value": self.value,
            "params": params,
        })
    }
}

/// The names of the registered algorithms, in order.
pub fn names() -> Vec<&'static str> {
    ALGORITHMS.iter().map(|e| e.name).collect()
}

/// The registered algorithm `name`, or why there is none (the closest name and the list).
pub fn find(name: &str) -> Result<&'static Entry, String> {
    ALGORITHMS
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| unknown_name("algorithm", name, &names()))
}

/// The schema of the `[run]` section's `algorithm` option: one of the registered names, and a
/// help text listing them.
pub fn name_schema(_: &mut SchemaGenerator) -> Schema {
    let list: Vec<String> = ALGORITHMS
        .iter()
        .map(|e| format!("{} ({})", e.name, e.about))
        .collect();
    Schema::try_from(json!({
        "type": "string",
        "enum": names(),
        "description": format!("the algorithm: {}", list.join("; ")),
    }))
    .expect("an object is a schema")
}

/// The algorithms' parameters in the `[run]` section: one table for every registered
/// algorithm, a parameter several take (bfs's and sssp's `root`) being one option. Missing
/// ones take their defaults; a run reads those of its algorithm.
#[derive(Debug, Clone, PartialEq)]
pub struct AlgoParams(Map<String, Value>);

/// Every parameter of a registered algorithm with its default and the algorithms taking it,
/// in registry order (an algorithm's in declaration order).
fn parameters() -> Vec<(String, Value, Vec<&'static str>)> {
    let mut all: Vec<(String, Value, Vec<&'static str>)> = Vec::new();
    for e in ALGORITHMS {
        for (key, default) in e.defaults() {
            match all.iter_mut().find(|(k, _, _)| *k == key) {
                Some((_, _, users)) => users.push(e.name),
                None => all.push((key, default, vec![e.name])),
            }
        }
    }
    all
}

impl Default for AlgoParams {
    fn default() -> Self {
        AlgoParams(
            parameters()
                .into_iter()
                .map(|(key, default, _)| (key, default))
                .collect(),
        )
    }
}

impl AlgoParams {
    /// Parameter `key`'s value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// The registered algorithm `name` with its parameters from this table; errors name
    /// `section.algorithm` (with the closest name) or `section.PARAMETER`, among them a
    /// parameter of other algorithms set away from its default, which `name` would ignore
    /// (`pagerank` with a `root` is not personalized PageRank).
    pub fn configure(&self, section: &str, name: &str) -> Result<Configured, ConfigError> {
        let entry = find(name).map_err(|msg| ConfigError::new(section, "algorithm", msg))?;
        if let Some((key, _, users)) = parameters().into_iter().find(|(key, default, users)| {
            !users.contains(&name) && self.0.get(key) != Some(default)
        }) {
            return Err(ConfigError::new(
                section,
                &key,
                format!(
                    "{name} does not take it (a parameter of {})",
                    users.join(", ")
                ),
            ));
        }
        (entry.configure)(section, &self.given_to(entry))
    }

    /// The values of `entry`'s parameters in this table.
    fn given_to(&self, entry: &Entry) -> Map<String, Value> {
        entry
            .defaults()
            .into_iter()
            .filter_map(|(key, _)| self.0.get(&key).map(|v| (key, v.clone())))
            .collect()
    }

    /// Checks every value of the table, whichever algorithm runs: a key no algorithm takes
    /// and each algorithm's refusals are errors naming `section.key`.
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        let known = parameters();
        if let Some(key) = self
            .0
            .keys()
            .find(|k| !known.iter().any(|(p, _, _)| p == *k))
        {
            let names: Vec<&str> = known.iter().map(|(p, _, _)| p.as_str()).collect();
            return Err(ConfigError::new(
                section,
                key,
                unknown_name("parameter", key, &names),
            ));
        }
        ALGORITHMS
            .iter()
            .try_for_each(|e| (e.configure)(section, &self.given_to(e)).map(|_| ()))
    }
}

impl Serialize for AlgoParams {
    /// In registry order, so that the section's option order (`x-order`) follows it.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (key, _, _) in parameters() {
            if let Some(value) = self.0.get(&key) {
                map.serialize_entry(&key, value)?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for AlgoParams {
    /// The given parameters, the defaults of the rest filled in.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut given = Map::deserialize(d)?;
        for (key, default, _) in parameters() {
            given.entry(key).or_insert(default);
        }
        Ok(AlgoParams(given))
    }
}

impl JsonSchema for AlgoParams {
    fn schema_name() -> Cow<'static, str> {
        "AlgoParams".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// Every parameter's schema from its algorithm's struct, its help prefixed with the
    /// algorithms taking it (`bfs, sssp: the source vertex`).
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut properties = Map::new();
        for e in ALGORITHMS {
            let schema = e.schema(generator);
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                continue;
            };
            for (key, prop) in props {
                properties
                    .entry(key.clone())
                    .or_insert_with(|| prop.clone());
            }
        }
        for (key, _, users) in parameters() {
            if let Some(Value::Object(prop)) = properties.get_mut(&key) {
                let help = prop
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let help = format!("{}: {help}", users.join(", "));
                prop.insert("description".into(), Value::from(help));
            }
        }
        Schema::try_from(json!({"type": "object", "properties": properties}))
            .expect("an object is a schema")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_codec::Compression;
    use crate::config::RunOptions;
    use crate::fixtures::{coded_name, far_server, grids, store};
    use strata_io::progress::NoProgress;
    use strata_store::config::{check, schema};

    #[test]
    fn names_are_unique_and_parameters_shared_by_name_agree() {
        let mut seen = names();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), ALGORITHMS.len(), "duplicate algorithm names");
        // A parameter several algorithms take is one option: the same type, bounds, default
        // and help in each. None shadows an engine option of the section (a key twice).
        let offered: Vec<String> = schema::<RunOptions>()["x-order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        let mut unique = offered.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), offered.len(), "an option twice: {offered:?}");
        let mut generator = SchemaGenerator::default();
        let mut by_key: Map<String, Value> = Map::new();
        for e in ALGORITHMS {
            assert!(!e.about.is_empty(), "{}", e.name);
            let schema = e.schema(&mut generator);
            assert_eq!(schema.get("type"), Some(&json!("object")), "{}", e.name);
            let props = schema
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let keys: Vec<String> = e.defaults().into_iter().map(|(k, _)| k).collect();
            assert_eq!(keys.len(), props.len(), "{}", e.name);
            for key in keys {
                let prop = &props[&key];
                assert!(
                    prop.get("description").is_some(),
                    "{}.{key} has no help",
                    e.name
                );
                assert!(
                    prop.get("default").is_some(),
                    "{}.{key} has no default",
                    e.name
                );
                assert!(offered.contains(&key), "{}.{key} not in [run]", e.name);
                if let Some(earlier) = by_key.insert(key.clone(), prop.clone()) {
                    assert_eq!(&earlier, prop, "{key} differs between algorithms");
                }
            }
        }
    }

    #[test]
    fn the_run_section_offers_every_algorithm_and_its_parameters() {
        let s = schema::<RunOptions>();
        let algorithm = &s["properties"]["algorithm"];
        assert_eq!(algorithm["enum"], json!(names()));
        assert_eq!(algorithm["default"], json!(ALGORITHMS[0].name));
        for e in ALGORITHMS {
            assert!(algorithm["description"]
                .as_str()
                .unwrap()
                .contains(&format!("{} ({})", e.name, e.about)));
        }
        assert_eq!(
            s["properties"]["root"]["description"],
            "bfs, sssp: the source vertex"
        );
        assert_eq!(s["properties"]["iterations"]["minimum"], 1);
        assert_eq!(s["properties"]["vector"]["x-kind"], "path");
        let order: Vec<&str> = s["x-order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert_eq!(
            order[..8],
            [
                "algorithm",
                "store",
                "iterations",
                "tolerance",
                "damping",
                "root",
                "vector",
                "weighted"
            ]
        );
    }

    #[test]
    fn unknown_names_and_bad_parameters_are_refused_by_name() {
        let err = |v: Value| check::<RunOptions>(&v).unwrap_err().to_string();
        assert_eq!(
            err(json!({"store": "g", "algorithm": "pagernk"})),
            format!(
                "run.algorithm: unknown algorithm 'pagernk'; did you mean 'pagerank'? (algorithms: {})",
                names().join(", ")
            )
        );
        assert!(err(json!({"store": "g", "root": "x"})).starts_with("run.root: invalid type"));
        assert!(
            err(json!({"store": "g", "algorithm": "pagerank", "tolerance": -1.0}))
                .starts_with("run.tolerance: must be >= 0")
        );
        // Another algorithm's parameter set away from its default would be ignored: pagerank
        // with a root is not personalized PageRank. At its default it is not in the way.
        assert_eq!(
            err(json!({"store": "g", "algorithm": "pagerank", "root": 5})),
            "run.root: pagerank does not take it (a parameter of bfs, sssp)"
        );
        assert!(
            err(json!({"store": "g", "algorithm": "bfs", "tolerance": 0.5}))
                .starts_with("run.tolerance: bfs does not take it (a parameter of pagerank, ppr")
        );
        let defaults = RunOptions::default().params;
        let with_defaults = json!({"store": "g", "algorithm": "bfs", "root": 3, "damping": defaults.get("damping")});
        assert!(check::<RunOptions>(&with_defaults).is_ok());
        assert_eq!(
            err(json!({"store": "g", "algorithm": "pagerank", "weight_low": 0.5})),
            "run.weight_low: pagerank reads no edge weights, so it would ignore the option"
        );
        assert!(check::<RunOptions>(
            &json!({"store": "g", "algorithm": "sssp", "weight_source": "random"})
        )
        .is_ok());
        let direct: RunOptions = serde_json::from_value(json!({"store": "g", "rooot": 1})).unwrap();
        assert!(direct
            .params
            .validate("run")
            .unwrap_err()
            .to_string()
            .starts_with("run.rooot: unknown parameter 'rooot'; did you mean 'root'?"));
    }

    /// The `[run]` options of algorithm `name` on `store`, writing to `out` within 256M, with
    /// `more` and the parameters the algorithm requires (`program` alone has one, the program
    /// it runs).
    fn options(
        name: &str,
        store: &std::path::Path,
        out: &std::path::Path,
        more: serde_json::Value,
    ) -> serde_json::Value {
        let mut options = json!({"store": store, "algorithm": name, "out": out, "memory": "256M"});
        let more = more.as_object().expect("options are an object").clone();
        options.as_object_mut().unwrap().extend(more);
        if name == "program" {
            let program = crate::program::spec::tests::pagerank();
            options["program"] = json!(serde_json::to_string(&program).unwrap());
        }
        options
    }

    #[test]
    fn every_algorithm_runs_on_a_small_grid() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 500, 3000);
        grids(&st, 3, Compression::None);
        for e in ALGORITHMS {
            let given = options(e.name, &st, &tmp.path().join(e.name), json!({}));
            let options: RunOptions = check(&given).unwrap();
            let job = options.job().unwrap();
            assert_eq!(job.algorithm.name(), e.name);
            let arrays = job.algorithm.arrays();
            assert!(!arrays.is_empty(), "{}", e.name);
            if !e.arrays.is_empty() {
                assert_eq!(arrays, e.arrays, "{}", e.name);
            }
            let mut iterations = 0;
            let summary = crate::run::run(&job, &NoProgress, &mut |_| {
                iterations += 1;
                Ok(())
            })
            .unwrap_or_else(|err| panic!("{}: {err}", e.name));
            assert_eq!(summary.algorithm, e.name);
            assert!(iterations > 0, "{}", e.name);
            let written: Vec<String> = arrays
                .iter()
                .map(|a| {
                    tmp.path()
                        .join(e.name)
                        .join(format!("{a}.npy"))
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            assert_eq!(summary.arrays, written, "{}", e.name);
        }
    }

    #[test]
    fn every_algorithm_reads_far_memory_to_the_results_of_a_local_run() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 500, 3000);
        grids(&st, 3, Compression::None);
        let (addr, stop, serving) = far_server();
        for e in ALGORITHMS {
            let job = |out: &str, far: bool| {
                let mut given = options(
                    e.name,
                    &st,
                    &tmp.path().join(out),
                    json!({"far_ratio": 1.0}),
                );
                if far {
                    given["far"] = addr.clone().into();
                }
                check::<RunOptions>(&given).unwrap().job().unwrap()
            };
            let run = |far: bool| {
                let j = job(&format!("{}-{far}", e.name), far);
                crate::run::run(&j, &NoProgress, &mut |_| Ok(())).unwrap()
            };
            let (local, far) = (run(false), run(true));
            // Every edge block is in far memory (triangles' sweep reads its own adjacency).
            assert!(far.far_failure.is_none() && far.bytes_far > 0, "{}", e.name);
            assert_eq!(far.bytes_disk, 0, "{}", e.name);
            for (a, b) in local.arrays.iter().zip(&far.arrays) {
                let (_, x) = strata_store::array::read_all_bytes(std::path::Path::new(a)).unwrap();
                let (_, y) = strata_store::array::read_all_bytes(std::path::Path::new(b)).unwrap();
                // Floats summed by several threads in another order may differ in the last bits.
                let same = x == y
                    || x.chunks_exact(8).zip(y.chunks_exact(8)).all(|(p, q)| {
                        let p = f64::from_le_bytes(p.try_into().unwrap());
                        let q = f64::from_le_bytes(q.try_into().unwrap());
                        (p - q).abs() <= 1e-9 * p.abs()
                    });
                assert!(same, "{} {a}", e.name);
            }
        }
        stop.stop();
        serving.join().unwrap();
    }

    #[test]
    fn every_algorithm_gives_the_plain_grids_results_on_compressed_grids() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 500, 3000);
        grids(&st, 3, Compression::None);
        let run = |e: &Entry, grid: Option<String>, out: &str| {
            let mut given = options(
                e.name,
                &st,
                &tmp.path().join(out),
                json!({"keep_resident": false, "segment": "4K"}),
            );
            if let Some(g) = grid {
                given["grid"] = g.into();
            }
            let job = check::<RunOptions>(&given).unwrap().job().unwrap();
            crate::run::run(&job, &NoProgress, &mut |_| Ok(()))
                .unwrap_or_else(|err| panic!("{}: {err}", e.name))
        };
        let plain: Vec<_> = ALGORITHMS.iter().map(|e| run(e, None, e.name)).collect();
        for codec in [Compression::Byte, Compression::Packed] {
            grids(&st, 3, codec);
            for (e, want) in ALGORITHMS.iter().zip(&plain) {
                let name = want.grid.file_name().unwrap().to_string_lossy();
                let got = run(
                    e,
                    Some(coded_name(&name, codec)),
                    &format!("{}-{codec:?}", e.name),
                );
                assert!(
                    got.edges_decoded > 0 && got.stored_bytes_per_edge < 8.0,
                    "{}",
                    e.name
                );
                for (a, b) in want.arrays.iter().zip(&got.arrays) {
                    same_values(a, b, &format!("{} on {codec:?}", e.name));
                }
            }
        }
    }

    /// Two result arrays agree: floats to 1e-5 relative (compressed blocks are sorted, so
    /// sums run in another order), integers exactly, except BFS parents (any parent one level
    /// up is right, and which edge reaches a vertex first depends on the order).
    fn same_values(a: &str, b: &str, what: &str) {
        let (ha, va) = strata_store::array::read_all_bytes(std::path::Path::new(a)).unwrap();
        let (_, vb) = strata_store::array::read_all_bytes(std::path::Path::new(b)).unwrap();
        match ha.dtype {
            strata_store::npy::DType::F32 => {
                let (x, y): (Vec<f32>, Vec<f32>) = (
                    bytemuck::pod_collect_to_vec(&va),
                    bytemuck::pod_collect_to_vec(&vb),
                );
                for (v, (p, q)) in x.iter().zip(&y).enumerate() {
                    assert!(
                        (p - q).abs() <= 1e-5 * p.abs() + 1e-9,
                        "{what} {a} v{v}: {p} vs {q}"
                    );
                }
            }
            strata_store::npy::DType::F64 => {
                let (x, y): (Vec<f64>, Vec<f64>) = (
                    bytemuck::pod_collect_to_vec(&va),
                    bytemuck::pod_collect_to_vec(&vb),
                );
                for (v, (p, q)) in x.iter().zip(&y).enumerate() {
                    let close = p == q || (p - q).abs() <= 1e-9 * p.abs().max(1.0);
                    assert!(close, "{what} {a} v{v}: {p} vs {q}");
                }
            }
            _ if a.ends_with("parent.npy") => {}
            _ => assert_eq!(va, vb, "{what} {a}"),
        }
    }
}
