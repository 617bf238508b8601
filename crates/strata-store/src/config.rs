//! Config sections: the one source of an engine's option names, types, defaults, bounds and
//! help texts.
//!
//! A section is a struct deriving `Deserialize` (unknown fields denied, every field defaulted
//! from its `Default`), `Serialize` and `JsonSchema`. Its doc comments are the help texts,
//! `#[schemars(range(min = .., max = ..))]` bounds a number (`inner(range(..))` each item of
//! a list), and `#[schemars(extend("x-positional" = true, "x-short" = "o", "x-flag" = false,
//! "x-kind" = "path"))]` tells the command line how to offer it. [`schema`] hands that to
//! Python, which builds its flags, `--help` and TOML checks from it; [`check`] is the one
//! validation: serde, the declared bounds, then the section's cross-field [`Section::validate`].

use std::fmt;

use schemars::JsonSchema;
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// A refused option value: `key` is `section.option`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {msg}")]
pub struct ConfigError {
    pub key: String,
    pub msg: String,
}

impl ConfigError {
    /// An error about option `key` of section `section`.
    pub fn new(section: &str, key: &str, msg: impl Into<String>) -> Self {
        ConfigError {
            key: format!("{section}.{key}"),
            msg: msg.into(),
        }
    }
}

/// A config section of one engine.
pub trait Section: Serialize + DeserializeOwned + JsonSchema + Default {
    /// The dotted section name (`serve`, `grid.run`).
    const NAME: &'static str;

    /// Checks what the types and declared bounds cannot: options that depend on each other,
    /// addresses, formats. Errors name the option ([`ConfigError::new`]).
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// `addr` is `HOST:PORT` with a port in 0..=65535, or an error naming `section.key`.
pub fn check_address(section: &str, key: &str, addr: &str) -> Result<(), ConfigError> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(ConfigError::new(
            section,
            key,
            format!("expected HOST:PORT such as 127.0.0.1:7000, got '{addr}'"),
        )),
    }
}

/// The longest duration an option may give: about 31 years (a float of seconds beyond what a
/// duration holds would otherwise abort the engine that converts it).
pub const MAX_SECONDS: f64 = 1e9;

/// Checks option `key`, a duration of `value` in units of `1 / per_second` s (1 for seconds,
/// 1000 for milliseconds): finite and within [0, [`MAX_SECONDS`]].
pub fn check_seconds(
    section: &str,
    key: &str,
    value: f64,
    per_second: f64,
) -> Result<(), ConfigError> {
    let most = MAX_SECONDS * per_second;
    if (0.0..=most).contains(&value) {
        return Ok(());
    }
    Err(ConfigError::new(
        section,
        key,
        format!("expected a duration from 0 to {most:e} (about 31 years), got {value:?}"),
    ))
}

/// A byte size, in bytes. Accepts an integer or a string such as `512M`, `2G`, `1.5GiB`
/// (K, M, G, T, P are binary); serializes as the integer. Its schema says `"x-kind": "size"`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, JsonSchema,
)]
#[schemars(extend("x-kind" = "size"))]
#[serde(transparent)]
pub struct Size(pub u64);

impl Size {
    /// Bytes in `text` (`2G`, `512M`, `1.5GiB`, `4096`), or why it is not a size.
    pub fn parse(text: &str) -> Result<Size, String> {
        let refuse = || format!("expected a size like 512M or 2G, got '{text}'");
        let t = text.trim();
        let digits = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(digits);
        let number: f64 = number.parse().map_err(|_| refuse())?;
        let unit = unit.trim_start().to_ascii_lowercase();
        let unit = unit.strip_suffix('b').unwrap_or(&unit);
        let unit = unit.strip_suffix('i').unwrap_or(unit);
        let power = match unit {
            "" => 0,
            "k" => 1,
            "m" => 2,
            "g" => 3,
            "t" => 4,
            "p" => 5,
            _ => return Err(refuse()),
        };
        let bytes = number * 1024f64.powi(power);
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(refuse());
        }
        Ok(Size(bytes as u64))
    }
}

/// Deserializes a [`Size`] into its bytes, for a `u64` field that accepts sizes
/// (`#[serde(deserialize_with = "size_bytes")] #[schemars(with = "Size")]`).
pub fn size_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Size::deserialize(d).map(|s| s.0)
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        d.deserialize_any(SizeVisitor {
            expecting: "a size like 512M or 2G, or a number of bytes",
            parse: Size::parse,
            bytes: Size,
        })
    }
}

/// The visitor of [`Size`] and [`AutoSize`]: a non-negative integer is `bytes(n)`, a string is
/// `parse(text)`.
struct SizeVisitor<T> {
    expecting: &'static str,
    parse: fn(&str) -> Result<T, String>,
    bytes: fn(u64) -> T,
}

impl<T> Visitor<'_> for SizeVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.expecting)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<T, E> {
        Ok((self.bytes)(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<T, E> {
        u64::try_from(v)
            .map(self.bytes)
            .map_err(|_| E::custom(format!("a size cannot be negative, got {v}")))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
        (self.parse)(v).map_err(E::custom)
    }
}

/// Declares a size that may also be a word naming what happens when no size is given (a
/// budget the consumer sizes itself, all of something): accepts the word, an integer or a size
/// string as [`Size`] does; serializes as the word or the integer; its schema says the
/// `x-kind`. `zero_is_word` deserializes an option that spelt the word as 0 before the word
/// existed, so old configs still read the same
/// (`#[serde(deserialize_with = "Type::zero_is_word")]`).
macro_rules! size_or_word {
    ($(#[$doc:meta])* $name:ident, $(#[$word_doc:meta])* $word:ident = $spelling:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub enum $name {
            $(#[$word_doc])*
            #[default]
            $word,
            /// This many bytes.
            Bytes(u64),
        }

        impl $name {
            #[doc = concat!("`", $spelling, "`, or the bytes of a size as [`Size::parse`] reads them; or why it is neither.")]
            pub fn parse(text: &str) -> Result<$name, String> {
                if text.trim().eq_ignore_ascii_case($spelling) {
                    return Ok($name::$word);
                }
                Size::parse(text).map(|s| $name::Bytes(s.0)).map_err(|_| {
                    format!(concat!("expected ", $spelling, " or a size like 512M or 2G, got '{}'"), text)
                })
            }

            #[doc = concat!("The bytes given, or `word` when the option says `", $spelling, "`.")]
            pub fn bytes_or(self, word: u64) -> u64 {
                match self {
                    $name::$word => word,
                    $name::Bytes(b) => b,
                }
            }

            /// The bytes given, or `None` for the word.
            pub fn bytes(self) -> Option<u64> {
                match self {
                    $name::$word => None,
                    $name::Bytes(b) => Some(b),
                }
            }

            #[doc = concat!("Deserializes the option as [`", stringify!($name), "`] with 0 read as `", $spelling, "` (how configs spelt it before the word).")]
            pub fn zero_is_word<'de, D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                $name::deserialize(d).map(|v| match v {
                    $name::Bytes(0) => $name::$word,
                    v => v,
                })
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self {
                    $name::$word => s.serialize_str($spelling),
                    $name::Bytes(b) => s.serialize_u64(*b),
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                d.deserialize_any(SizeVisitor {
                    expecting: concat!($spelling, ", a size like 512M or 2G, or a number of bytes"),
                    parse: $name::parse,
                    bytes: $name::Bytes,
                })
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": ["string", "integer"],
                    "minimum": 0,
                    "x-kind": $kind,
                })
            }
        }
    };
}

size_or_word!(
    /// A size that may also be `"auto"`, for a budget the consumer sizes itself when the user
    /// does not (the GNN device tier: a share of the GPU's free memory; a grid run's segments:
    /// from the budget). Its schema says `"x-kind": "auto-size"`.
    AutoSize,
    /// The consumer decides.
    Auto = "auto",
    "auto-size"
);

size_or_word!(
    /// A size that may also be `"all"`, for a part held whole unless the user bounds it (an
    /// embedding run served: its whole table resident). Its schema says `"x-kind": "all-size"`.
    AllSize,
    /// All of it.
    All = "all",
    "all-size"
);

/// Deserializes an `Option<Size>` with 0 read as unset (how configs spelt "inherit" before
/// the option could be left unset): `#[serde(deserialize_with = "unset_if_zero")]`.
pub fn unset_if_zero<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Size>, D::Error> {
    Option::<Size>::deserialize(d).map(|s| s.filter(|s| s.0 != 0))
}

/// The JSON schema of section `S`, with `"x-section"` (its name) and `"x-order"` (its option
/// names in declaration order, which the command line keeps for positionals and `--help`).
pub fn schema<S: Section>() -> Value {
    let mut schema = schemars::schema_for!(S).to_value();
    let order = field_order(&S::default());
    if let Value::Object(map) = &mut schema {
        map.insert("x-section".into(), Value::from(S::NAME));
        map.insert("x-order".into(), Value::from(order));
    }
    schema
}

/// The field names of `value` in declaration order: its keys, serialized (a struct serializes
/// its fields in order; a JSON object read back would sort them).
pub fn field_order<T: Serialize>(value: &T) -> Vec<String> {
    struct Keys(Vec<String>);
    impl<'de> Deserialize<'de> for Keys {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Keys, D::Error> {
            struct KeyVisitor;
            impl<'de> Visitor<'de> for KeyVisitor {
                type Value = Keys;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(k) = map.next_key::<String>()? {
                        map.next_value::<IgnoredAny>()?;
                        keys.push(k);
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(KeyVisitor)
        }
    }
    let text = serde_json::to_string(value).expect("a config struct serializes");
    serde_json::from_str::<Keys>(&text)
        .expect("a config struct serializes as an object")
        .0
}

/// Checks `values` (a JSON object of some of `S`'s options; the rest take their defaults)
/// and builds the section: unknown options, wrong types, values outside the declared bounds
/// and [`Section::validate`]'s refusals are errors naming `section.option`.
pub fn check<S: Section>(values: &Value) -> Result<S, ConfigError> {
    let Value::Object(given) = values else {
        return Err(ConfigError {
            key: S::NAME.into(),
            msg: format!("expected a table of options, got {values}"),
        });
    };
    let schema = schema::<S>();
    let props = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (key, value) in given {
        let Some(prop) = props.get(key) else {
            let names: Vec<&str> = props.keys().map(String::as_str).collect();
            return Err(ConfigError::new(
                S::NAME,
                key,
                format!("no such option; options are: {}", names.join(", ")),
            ));
        };
        check_bounds(&schema, prop, value).map_err(|msg| ConfigError::new(S::NAME, key, msg))?;
    }
    let section: S = serde_json::from_value(values.clone())
        .map_err(|e| deserialize_error::<S>(S::NAME, given, e))?;
    section.validate()?;
    Ok(section)
}

/// Error `e` of deserializing options `given` of section `section` as `T`, naming the option
/// at fault: serde names none for a wrong type, so the options are tried one by one.
pub fn deserialize_error<T: DeserializeOwned>(
    section: &str,
    given: &Map<String, Value>,
    e: serde_json::Error,
) -> ConfigError {
    let key = given.iter().find(|(k, v)| {
        let one = Map::from_iter([((*k).clone(), (*v).clone())]);
        serde_json::from_value::<T>(Value::Object(one)).is_err()
    });
    match key {
        Some((k, _)) => ConfigError::new(section, k, e.to_string()),
        None => ConfigError {
            key: section.into(),
            msg: e.to_string(),
        },
    }
}

/// [`check`] of a section built in Rust (a resumed run's, a test's): its declared bounds and
/// [`Section::validate`].
pub fn check_built<S: Section>(section: &S) -> Result<(), ConfigError> {
    check::<S>(&serde_json::to_value(section).expect("a config section serializes")).map(|_| ())
}

/// `check`, returning the section's values with every default filled in.
pub fn normalize<S: Section>(values: &Value) -> Result<Value, ConfigError> {
    let section = check::<S>(values)?;
    Ok(serde_json::to_value(&section).expect("a config section serializes"))
}

/// `value` within the `minimum`/`maximum` of `prop` (of each item, for a list).
fn check_bounds(root: &Value, prop: &Value, value: &Value) -> Result<(), String> {
    let prop = resolve(root, prop);
    if let (Value::Array(items), Some(item)) = (value, prop.get("items")) {
        return items.iter().try_for_each(|v| check_bounds(root, item, v));
    }
    let Some(number) = value.as_f64() else {
        return Ok(());
    };
    let shown = value.to_string();
    if let Some(low) = prop.get("minimum").and_then(Value::as_f64) {
        if number < low {
            return Err(format!("must be >= {}, got {shown}", prop["minimum"]));
        }
    }
    if let Some(high) = prop.get("maximum").and_then(Value::as_f64) {
        if number > high {
            return Err(format!("must be <= {}, got {shown}", prop["maximum"]));
        }
    }
    Ok(())
}

/// `prop`, or the definition its `$ref` names.
fn resolve<'a>(root: &'a Value, prop: &'a Value) -> &'a Value {
    match prop.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/")
            .map(|path| path.split('/').fold(root, |v, part| &v[part]))
            .unwrap_or(prop),
        None => prop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test section.
    #[derive(Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Demo {
        /// seed nodes per batch
        #[schemars(range(min = 1, max = 100))]
        batch: u32,
        /// neighbours per hop; -1 keeps all
        #[schemars(inner(range(min = -1)))]
        fanouts: Vec<i64>,
        /// budget
        memory: Size,
    }

    impl Default for Demo {
        fn default() -> Self {
            Demo {
                batch: 8,
                fanouts: vec![15, 10],
                memory: Size(1 << 30),
            }
        }
    }

    impl Section for Demo {
        const NAME: &'static str = "demo";
        fn validate(&self) -> Result<(), ConfigError> {
            if self.fanouts.is_empty() {
                return Err(ConfigError::new(
                    Self::NAME,
                    "fanouts",
                    "needs at least one hop",
                ));
            }
            Ok(())
        }
    }

    fn err(v: Value) -> String {
        check::<Demo>(&v).unwrap_err().to_string()
    }

    #[test]
    fn sizes_parse_as_the_python_side_does() {
        assert_eq!(Size::parse("512M"), Ok(Size(512 << 20)));
        assert_eq!(Size::parse("1.5GiB"), Ok(Size(3 << 29)));
        assert_eq!(Size::parse("4096"), Ok(Size(4096)));
        assert_eq!(Size::parse(" 2g "), Ok(Size(2 << 30)));
        assert!(Size::parse("2X").is_err());
        assert!(Size::parse("").is_err());
    }

    #[test]
    fn auto_sizes_take_auto_or_a_size() {
        let parse = |v: Value| serde_json::from_value::<AutoSize>(v).map_err(|e| e.to_string());
        assert_eq!(parse(serde_json::json!("auto")), Ok(AutoSize::Auto));
        assert_eq!(parse(serde_json::json!("8G")), Ok(AutoSize::Bytes(8 << 30)));
        assert_eq!(parse(serde_json::json!(0)), Ok(AutoSize::Bytes(0)));
        assert_eq!(
            parse(serde_json::json!("lots")),
            Err("expected auto or a size like 512M or 2G, got 'lots'".into())
        );
        assert!(parse(serde_json::json!(-1)).is_err());
        assert_eq!(serde_json::to_value(AutoSize::Auto).unwrap(), "auto");
        assert_eq!(AutoSize::Bytes(5).bytes_or(7), 5);
        assert_eq!(AutoSize::Auto.bytes_or(7), 7);
    }

    #[test]
    fn words_and_unset_sizes_read_old_zeros() {
        #[derive(Deserialize)]
        struct Old {
            #[serde(deserialize_with = "AutoSize::zero_is_word")]
            segment: AutoSize,
            #[serde(deserialize_with = "AllSize::zero_is_word")]
            resident: AllSize,
            #[serde(default, deserialize_with = "unset_if_zero")]
            cap: Option<Size>,
        }
        let old: Old =
            serde_json::from_value(serde_json::json!({"segment": 0, "resident": 0, "cap": 0}))
                .unwrap();
        assert_eq!(old.segment, AutoSize::Auto);
        assert_eq!(old.resident, AllSize::All);
        assert_eq!(old.cap, None);
        let new: Old = serde_json::from_value(
            serde_json::json!({"segment": "4K", "resident": "all", "cap": "1M"}),
        )
        .unwrap();
        assert_eq!(new.segment, AutoSize::Bytes(4096));
        assert_eq!(new.resident, AllSize::All);
        assert_eq!(new.cap, Some(Size(1 << 20)));
        let err = serde_json::from_value::<AllSize>(serde_json::json!("some"));
        assert_eq!(
            err.unwrap_err().to_string(),
            "expected all or a size like 512M or 2G, got 'some'"
        );
        assert_eq!(serde_json::to_value(AllSize::All).unwrap(), "all");
        assert_eq!(AllSize::Bytes(3).bytes(), Some(3));
    }

    #[test]
    fn defaults_fill_what_is_not_given() {
        let d: Demo = check(&serde_json::json!({"memory": "2G"})).unwrap();
        assert_eq!(d.memory, Size(2 << 30));
        assert_eq!(d.batch, 8);
    }

    #[test]
    fn refusals_name_the_option() {
        assert!(err(serde_json::json!({"batc": 3})).starts_with("demo.batc: no such option"));
        assert_eq!(
            err(serde_json::json!({"batch": 0})),
            "demo.batch: must be >= 1, got 0"
        );
        assert_eq!(
            err(serde_json::json!({"batch": 101})),
            "demo.batch: must be <= 100, got 101"
        );
        assert_eq!(
            err(serde_json::json!({"fanouts": [3, -2]})),
            "demo.fanouts: must be >= -1, got -2"
        );
        assert!(err(serde_json::json!({"batch": 2.5})).starts_with("demo.batch: invalid type"));
        assert!(
            err(serde_json::json!({"memory": "lots"})).starts_with("demo.memory: expected a size")
        );
        assert_eq!(
            err(serde_json::json!({"fanouts": []})),
            "demo.fanouts: needs at least one hop"
        );
    }

    #[test]
    fn the_schema_keeps_declaration_order_help_and_bounds() {
        let s = schema::<Demo>();
        assert_eq!(
            s["x-order"],
            serde_json::json!(["batch", "fanouts", "memory"])
        );
        assert_eq!(
            s["properties"]["batch"]["description"],
            "seed nodes per batch"
        );
        assert_eq!(s["properties"]["batch"]["maximum"], 100);
        assert_eq!(
            s["properties"]["fanouts"]["default"],
            serde_json::json!([15, 10])
        );
        assert_eq!(s["$defs"]["Size"]["x-kind"], "size");
    }
}
