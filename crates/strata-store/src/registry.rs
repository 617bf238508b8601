//! Registries of named implementations (after PyTorch-BigGraph's `PluginRegistry`): an
//! engine's score functions, orderings or layer kinds, each a unit type in a file of its own
//! that implements the engine's trait and [`Named`], listed once in a [`registry!`] line.
//!
//! The macro turns the list into a `Copy` enum with one variant per type, so a configuration
//! holds a plain value, and gives it everything the rest of Strata asks of a choice: its names
//! ([`Named::NAME`], in config files, run records, messages), help texts, parsing with a
//! did-you-mean for a misspelt name ([`UnknownName`]), serde and a JSON schema whose `oneOf`
//! lists every registered name with its help (from which the command line's choices and
//! `--help` are built). `get()` hands out the implementation as `&'static dyn Trait`: the
//! caller dispatches once per batch of work and the implementation's own loops are static.

/// What a registered implementation is called and how it is described.
pub trait Named {
    /// The name in config files, run records and messages (`complex`, `legend`, `gcn`).
    const NAME: &'static str;
    /// One line for `--help` and `strata config`.
    const HELP: &'static str;
}

/// A name that no registered implementation has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", unknown_name(what, name, known))]
pub struct UnknownName {
    /// What the registry holds (`score function`, `ordering`, `layer kind`).
    pub what: &'static str,
    /// The name asked for.
    pub name: String,
    /// Every registered name.
    pub known: Vec<&'static str>,
    /// The registered name closest to `name`, when one is close.
    pub close: Option<&'static str>,
}

impl UnknownName {
    /// The error for `name` among the registered `known` names.
    pub fn new(what: &'static str, name: &str, known: Vec<&'static str>) -> Self {
        UnknownName {
            what,
            name: name.to_string(),
            close: closest(name, &known),
            known,
        }
    }

    /// The message in serde's words for an unknown enum variant (what config checks and
    /// weights files report for every other choice), with the did-you-mean when there is one.
    pub fn serde_message(&self) -> String {
        let expected: Vec<String> = self.known.iter().map(|k| format!("`{k}`")).collect();
        let hint = self
            .close
            .map_or(String::new(), |c| format!("; did you mean `{c}`?"));
        format!(
            "unknown variant `{}`, expected one of {}{hint}",
            self.name,
            expected.join(", ")
        )
    }
}

/// Why `name` is not one of `known` (the `what`s a registry holds), with the closest known
/// name when one is close ([`closest`]) and the list:
/// `unknown algorithm 'pagernk'; did you mean 'pagerank'? (algorithms: pagerank, bfs)`.
pub fn unknown_name(what: &str, name: &str, known: &[&str]) -> String {
    let hint = closest(name, known).map_or(String::new(), |k| format!("; did you mean '{k}'?"));
    format!(
        "unknown {what} '{name}'{hint} ({what}s: {})",
        known.join(", ")
    )
}

/// The known name nearest to `name` (case-insensitive edit distance), if it is within a third
/// of the name's length (at least 1 edit): a typo, not a different word.
pub fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let wanted = name.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (edit_distance(&wanted, &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d <= (wanted.chars().count() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance between `a` and `b` in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[doc(hidden)]
pub mod reexport {
    pub use schemars;
    pub use serde;
    pub use serde_json;
}

/// Declares a registry: `registry! { pub enum ScoreKind: dyn ScoreFunction, "score function",
/// "score function" { dot::Dot, complex::ComplEx } }` makes `enum ScoreKind { Dot, ComplEx }`
/// whose variants are the listed unit types (each implementing the trait and [`Named`]). The
/// first string is what the registry holds (for errors), the second leads the help text of an
/// option that picks one (followed by every name and its help).
///
/// Generated: `ALL`, `name()`, `help()`, `get() -> &'static dyn Trait`, `names()`,
/// `describe()`, `Display`, `FromStr` (error [`UnknownName`]), `Serialize`/`Deserialize` by
/// name (serde's unknown-variant message, with the did-you-mean), and an inline `JsonSchema` (`oneOf` of the names, each with its help).
#[macro_export]
macro_rules! registry {
    (
        $(#[$meta:meta])*
        $vis:vis enum $Kind:ident: dyn $Trait:path, $what:literal, $lead:literal {
            $($module:ident :: $Ty:ident),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $Kind {
            $($Ty),+
        }

        impl $Kind {
            /// Every registered choice, in registration order.
            pub const ALL: &'static [$Kind] = &[$($Kind::$Ty),+];

            /// The registered name.
            pub fn name(self) -> &'static str {
                match self {
                    $($Kind::$Ty => <$module::$Ty as $crate::registry::Named>::NAME),+
                }
            }

            /// The one-line help text.
            pub fn help(self) -> &'static str {
                match self {
                    $($Kind::$Ty => <$module::$Ty as $crate::registry::Named>::HELP),+
                }
            }

            /// The implementation.
            pub fn get(self) -> &'static dyn $Trait {
                match self {
                    $($Kind::$Ty => &$module::$Ty),+
                }
            }

            /// Every registered name, in registration order.
            pub fn names() -> Vec<&'static str> {
                Self::ALL.iter().map(|k| k.name()).collect()
            }

            /// The help text of an option choosing one: the lead, then each name and its help.
            pub fn describe() -> String {
                let choices: Vec<String> = Self::ALL
                    .iter()
                    .map(|k| format!("{} ({})", k.name(), k.help()))
                    .collect();
                format!("{}: {}", $lead, choices.join("; "))
            }
        }

        impl ::std::fmt::Display for $Kind {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::std::str::FromStr for $Kind {
            type Err = $crate::registry::UnknownName;

            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|k| k.name() == s)
                    .ok_or_else(|| $crate::registry::UnknownName::new($what, s, Self::names()))
            }
        }

        impl $crate::registry::reexport::serde::Serialize for $Kind {
            fn serialize<S: $crate::registry::reexport::serde::Serializer>(
                &self,
                s: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> $crate::registry::reexport::serde::Deserialize<'de> for $Kind {
            fn deserialize<D: $crate::registry::reexport::serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                let name = <::std::string::String as $crate::registry::reexport::serde::Deserialize>::deserialize(d)?;
                name.parse().map_err(|e: $crate::registry::UnknownName| {
                    <D::Error as $crate::registry::reexport::serde::de::Error>::custom(e.serde_message())
                })
            }
        }

        impl $crate::registry::reexport::schemars::JsonSchema for $Kind {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($Kind).into()
            }

            fn json_schema(
                _: &mut $crate::registry::reexport::schemars::SchemaGenerator,
            ) -> $crate::registry::reexport::schemars::Schema {
                let choices: ::std::vec::Vec<$crate::registry::reexport::serde_json::Value> = Self::ALL
                    .iter()
                    .map(|k| {
                        $crate::registry::reexport::serde_json::json!({
                            "type": "string",
                            "const": k.name(),
                            "description": k.help(),
                        })
                    })
                    .collect();
                $crate::registry::reexport::serde_json::json!({
                    "type": "string",
                    "oneOf": choices,
                    "description": Self::describe(),
                })
                .try_into()
                .expect("a JSON object is a schema")
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    trait Shape {
        fn sides(&self) -> u32;
    }

    mod square {
        pub struct Square;
        impl super::Named for Square {
            const NAME: &'static str = "square";
            const HELP: &'static str = "four equal sides";
        }
        impl super::Shape for Square {
            fn sides(&self) -> u32 {
                4
            }
        }
    }

    mod triangle {
        pub struct Triangle;
        impl super::Named for Triangle {
            const NAME: &'static str = "triangle";
            const HELP: &'static str = "three sides";
        }
        impl super::Shape for Triangle {
            fn sides(&self) -> u32 {
                3
            }
        }
    }

    crate::registry! {
        enum ShapeKind: dyn Shape, "shape", "the shape" {
            square::Square,
            triangle::Triangle,
        }
    }

    #[test]
    fn names_round_trip_and_dispatch() {
        assert_eq!(ShapeKind::names(), ["square", "triangle"]);
        for &k in ShapeKind::ALL {
            assert_eq!(k.name().parse::<ShapeKind>().unwrap(), k);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(serde_json::from_str::<ShapeKind>(&json).unwrap(), k);
        }
        assert_eq!(ShapeKind::Triangle.get().sides(), 3);
        assert_eq!(ShapeKind::Square.to_string(), "square");
    }

    #[test]
    fn misspelt_names_get_a_did_you_mean() {
        let e = "sqare".parse::<ShapeKind>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown shape 'sqare'; did you mean 'square'? (shapes: square, triangle)"
        );
        let e = "circle".parse::<ShapeKind>().unwrap_err().to_string();
        assert_eq!(e, "unknown shape 'circle' (shapes: square, triangle)");
        let e = serde_json::from_str::<ShapeKind>("\"Triangel\"").unwrap_err();
        assert!(
            e.to_string().starts_with(
                "unknown variant `Triangel`, expected one of `square`, `triangle`; did you mean `triangle`?"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_schema_lists_every_name_with_its_help() {
        let schema = serde_json::to_value(schemars::schema_for!(ShapeKind)).unwrap();
        let consts: Vec<&str> = schema["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["const"].as_str().unwrap())
            .collect();
        assert_eq!(consts, ["square", "triangle"]);
        assert_eq!(schema["oneOf"][1]["description"], "three sides");
        assert_eq!(
            schema["description"],
            "the shape: square (four equal sides); triangle (three sides)"
        );
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(closest("ComplX", &["complex", "rotate"]), Some("complex"));
        assert_eq!(closest("xyz", &["complex", "rotate"]), None);
        assert_eq!(edit_distance("kcore", "core"), 1);
    }

    #[test]
    fn an_unknown_name_gets_the_closest_and_the_list() {
        let known = ["pagerank", "bfs", "kcore"];
        assert_eq!(
            unknown_name("algorithm", "pagernk", &known),
            "unknown algorithm 'pagernk'; did you mean 'pagerank'? (algorithms: pagerank, bfs, kcore)"
        );
        assert_eq!(
            unknown_name("algorithm", "betweenness", &known),
            "unknown algorithm 'betweenness' (algorithms: pagerank, bfs, kcore)"
        );
    }
}
