"""Engine config sections come from the engines: their options, defaults and help from the
native schema, their checks from Rust."""

from __future__ import annotations

import pytest

from strata import _native
from strata.config import SECTIONS, as_dict, describe, load
from strata.errors import ConfigError

NATIVE = _native.config_schema()


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_every_engine_section_is_built_from_the_native_schema(name):
    schema = NATIVE[name]
    cls = SECTIONS[name]
    assert cls.__native__
    assert list(cls.__dataclass_fields__) == [*cls.__front__, *schema["x-order"]]
    assert sorted(schema["x-order"]) == sorted(schema["properties"])
    for key in schema["x-order"]:
        field = cls.__dataclass_fields__[key]
        assert field.metadata["help"] == " ".join(schema["properties"][key]["description"].split())
    # The defaults Python fills in are the ones Rust fills in (given the required options).
    required = {k: p["default"] or "x" for k, p in schema["properties"].items() if p.get("x-required")}
    front = {k: "x" for k in cls.__front__ if cls.__dataclass_fields__[k].metadata["positional"]}
    ours, native = as_dict(cls(**required, **front)), _native.config_check(name, required)
    # Options Python adds in front of an engine's (where a run lives) are its own; f32 options
    # come back as the nearest double of their f32 value.
    for key, value in native.items():
        assert ours[key] == (pytest.approx(value, rel=1e-7) if isinstance(value, float) else value), key


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("serve", {"listen": "localhost"}, "serve.listen: expected HOST:PORT such as 127.0.0.1:7000, got 'localhost'"),
        ("serve", {"reorder_hops": 5}, "serve.reorder_hops: must be <= 4, got 5"),
        ("serve", {"rate": -1.0}, "serve.rate: must be >= 0.0, got -1.0"),
        ("serve", {"memory": 0}, "serve.memory: must be positive, got 0"),
        ("serve", {"max_idz": 3}, "serve.max_idz: no such option"),
        ("serve", {"max_ids": "many"}, "serve.max_ids: invalid type"),
        ("run", {"store": "g", "damping": 1.0}, "run.damping: must be in [0, 1), got 1"),
        ("grid.build", {"store": "g", "partitions": 5000}, "grid.build.partitions: must be <= 4096, got 5000"),
        ("embed.train", {"dim": 5}, "embed.train.dim: complex needs an even dim (real and imaginary halves), got 5"),
        ("embed.train", {"memory": "2X"}, "embed.train.memory: expected a size like 512M or 2G, got '2X'"),
        ("embed.train", {"ordering": "sequential"}, "embed.train.buffer: ordering sequential needs a buffer of 2"),
    ],
)
def test_rust_refuses_a_bad_value_naming_section_and_key(name, values, message):
    with pytest.raises(ConfigError) as exc:
        _native.config_check(name, values)
    assert message in str(exc.value)


def test_a_section_built_in_python_goes_through_the_rust_check(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[serve]\nlisten = "nowhere"\n')
    with pytest.raises(
        ConfigError, match=r"serve\.listen: expected HOST:PORT .* \(from .*run\.toml: \[serve\] listen\)"
    ):
        load(SECTIONS["serve"], config_file=toml)
    with pytest.raises(ConfigError, match=r"-p serve.reorder_hops: must be <= 4, got 9"):
        load(SECTIONS["serve"], overrides=["serve.reorder_hops=9"])


def test_a_required_option_is_asked_for():
    with pytest.raises(ConfigError, match=r"\[run\] needs a value for store"):
        load(SECTIONS["run"], flags={"algorithm": "bfs"})
    with pytest.raises(ConfigError, match=r"run\.store: needs a store"):
        _native.config_check("run", {"algorithm": "bfs"})


def test_config_prints_the_native_schema(strata_cli):
    text = strata_cli("config", "serve").stdout
    assert text == describe(SECTIONS["serve"])
    schema = NATIVE["serve"]
    for key in schema["x-order"]:
        assert f"# {' '.join(schema['properties'][key]['description'].split())}" in text
    assert "# type: int (>= 1, <= 4)" in text
    assert 'memory = "1.00G"' in text
