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
    assert list(cls.__dataclass_fields__) == schema["x-order"]
    assert sorted(schema["x-order"]) == sorted(schema["properties"])
    for key, field in cls.__dataclass_fields__.items():
        assert field.metadata["help"] == " ".join(schema["properties"][key]["description"].split())
    # The defaults Python fills in are the ones Rust fills in (given the required options).
    required = {k: p["default"] or "x" for k, p in schema["properties"].items() if p.get("x-required")}
    assert as_dict(cls(**required)) == _native.config_check(name, required)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"listen": "localhost"}, "serve.listen: expected HOST:PORT such as 127.0.0.1:7000, got 'localhost'"),
        ({"reorder_hops": 5}, "serve.reorder_hops: must be <= 4, got 5"),
        ({"rate": -1.0}, "serve.rate: must be >= 0.0, got -1.0"),
        ({"memory": 0}, "serve.memory: must be positive, got 0"),
        ({"max_idz": 3}, "serve.max_idz: no such option"),
        ({"max_ids": "many"}, "serve.max_ids: invalid type"),
    ],
)
def test_rust_refuses_a_bad_value_naming_section_and_key(values, message):
    with pytest.raises(ConfigError) as exc:
        _native.config_check("serve", values)
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
