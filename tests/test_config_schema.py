"""Engine config sections come from the engines: their options, defaults and help from the
native schema, their checks from Rust."""

from __future__ import annotations

import inspect

import pytest

from strata import _native
from strata.config import all_sections, as_dict, describe, engine_options, load
from strata.errors import ConfigError

NATIVE = _native.config_schema()

#: Options a section needs besides its required ones to pass its check.
QUERY = {"embed.predict": {"head": "a"}, "embed.neighbors": {"node": ["a"]}, "reorder": {"order": "bfs"}}

#: Sections declared in Python, each because its work is Python's alone (see
#: docs/architecture.md, "Config schema").
PYTHON_ONLY = {
    "datasets.fetch",
    "embed.index",
    "embed.search",
    "datasets.list",
    "grid.info",
    "info",
    "plot",
    "serve.status",
}


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_every_engine_section_is_built_from_the_native_schema(name):
    schema = NATIVE[name]
    cls = all_sections()[name]
    assert cls.__native__
    assert list(cls.__dataclass_fields__) == [*cls.__front__, *schema["x-order"]]
    assert cls.__engine__ == tuple(schema["x-order"])
    assert sorted(schema["x-order"]) == sorted(schema["properties"])
    for key in schema["x-order"]:
        field = cls.__dataclass_fields__[key]
        assert field.metadata["help"] == " ".join(schema["properties"][key]["description"].split())
    # The defaults Python fills in are the ones Rust fills in (given the required options).
    sample = {"integer": 1, "string": "x"}
    required = {
        k: p["default"] or sample[p.get("type", "string")]
        for k, p in schema["properties"].items()
        if p.get("x-required")
    }
    required.update(QUERY.get(name, {}))
    front = {k: "x" for k in cls.__front__ if cls.__dataclass_fields__[k].metadata["positional"]}
    cfg = cls(**required, **front)
    # What the engine is handed is its own options, the front end's left out.
    assert list(engine_options(cfg)) == list(schema["x-order"])
    ours, native = as_dict(cfg), _native.config_check(name, required)
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
        ("serve", {"fold_after": 1e300}, "serve.fold_after: expected a duration from 0 to 1e9 (about 31 years)"),
        ("serve", {"idle_timeout": 0.0}, "serve.idle_timeout: must be >= 0.01, got 0.0"),
        ("bench_disk", {"seconds": 1e300}, "bench_disk.seconds: expected a duration from 0 to 1e9"),
        ("serve", {"max_idz": 3}, "serve.max_idz: no such option"),
        ("serve", {"max_ids": "many"}, "serve.max_ids: invalid type"),
        ("run", {"store": "g", "damping": 1.0}, "run.damping: must be in [0, 1), got 1"),
        ("grid.build", {"store": "g", "partitions": 5000}, "grid.build.partitions: must be <= 4096, got 5000"),
        ("embed.train", {"dim": 5}, "embed.train.dim: complex needs an even dim (real and imaginary halves), got 5"),
        ("embed.train", {"memory": "2X"}, "embed.train.memory: expected a size like 512M or 2G, got '2X'"),
        ("embed.train", {"ordering": "sequential"}, "embed.train.buffer: ordering sequential needs a buffer of 2"),
        ("farmem.serve", {"listen": "7000"}, "farmem.serve.listen: expected HOST:PORT such as 127.0.0.1:7000"),
        ("farmem.serve", {"capacity": "2X"}, "farmem.serve.capacity: expected a size like 512M or 2G, got '2X'"),
        ("generate.rmat", {"scale": 3}, "generate.rmat.out: needs an output path"),
        ("generate.rmat", {"out": "x", "scale": 50}, "generate.rmat.scale: must be within [1, 40], got 50"),
        ("generate.rmat", {"out": "x", "scale": 3, "formt": "tsv"}, "generate.rmat.formt: no such option"),
        ("generate.kg", {"out": "x", "noise": 1.5}, "generate.kg.noise: must be a fraction within [0, 1], got 1.5"),
        ("generate.sbm", {"out": "x", "classes": 1}, "generate.sbm.classes:"),
        ("embed.plan", {"partitions": 0}, "embed.plan.partitions: must be >= 1, got 0"),
        ("embed.plan", {"partitions": 4, "ordering": "best"}, "embed.plan.ordering: unknown variant `best`"),
        ("bench_disk", {"queue_depths": [4, 0]}, "bench_disk.queue_depths: must be >= 1, got 0"),
        ("bench_disk", {"queue_depths": []}, "bench_disk.queue_depths: needs at least one queue depth"),
        ("bench_disk", {"seconds": 0.0}, "bench_disk.seconds: must be positive, got 0"),
        ("bench_disk", {"size": "1M"}, "bench_disk.size: at least 4M, got 1048576"),
        ("bench_disk", {"backend": "aio"}, "bench_disk.backend: unknown variant `aio`"),
        ("embed.eval", {"split": "dev"}, "embed.eval.split: unknown variant `dev`"),
        ("embed.eval", {"checkpoint": "first"}, "embed.eval.checkpoint: unknown variant `first`"),
        ("embed.predict", {"relation": "r"}, "embed.predict.head: give exactly one of --head and --tail"),
        ("embed.predict", {"head": "a", "tail": "b"}, "embed.predict.head: give exactly one of --head and --tail"),
        ("embed.predict", {"head": "a", "top": 0}, "embed.predict.top: must be >= 1, got 0"),
        ("embed.export", {"format": "csv"}, "embed.export.format: unknown variant `csv`"),
        ("embed.export", {}, "embed.export.out: needs an output directory"),
        ("embed.neighbors", {}, "embed.neighbors.node: give at least one --node or a --nodes-file"),
        ("embed.neighbors", {"node": ["a"], "metric": "l1"}, "embed.neighbors.metric: unknown variant `l1`"),
        ("embed.score", {}, "embed.score.input: needs a file of triples"),
        (
            "convert",
            {"out": "g", "split": "0.5,0.1,0.1"},
            "convert.split: expected three fractions (train, valid, test)",
        ),
        ("convert", {"out": "g", "split": "0.9,0.1", "valid": ["v"]}, "convert.split: expected three fractions"),
        ("convert", {"out": "g", "split": "0.9,0.05,0.05", "valid": ["v"]}, "convert.split: a random split cannot"),
        ("convert", {"out": "g", "io_chunk": 1000}, "convert.io_chunk: must be a positive multiple of 4096, got 1000"),
        ("convert", {"out": "g", "delimiter": "semicolon"}, "convert.delimiter: unknown variant `semicolon`"),
        ("convert", {"out": "g", "num_nodes": 0}, "convert.num_nodes: must be >= 1, got 0"),
        ("check", {"max_problems": 0}, "check.max_problems: must be >= 1, got 0"),
        ("gnn.train", {"device_memory": "lots"}, "gnn.train.device_memory: expected auto or a size like 512M or 2G"),
        ("gnn.train", {"fanouts": [10, 0]}, "gnn.train.fanouts: each hop needs a fanout >= 1 or -1, got [10, 0]"),
        ("gnn.train", {"fanouts": [-2]}, "gnn.train.fanouts: must be >= -1, got -2"),
        ("gnn.train", {"hot_share": 1.5}, "gnn.train.hot_share: must be <= 1.0, got 1.5"),
        ("gnn.train", {"batch_size": 0}, "gnn.train.batch_size: must be >= 1, got 0"),
        ("gnn.train", {"feature_codec": "int4"}, "gnn.train.feature_codec: unknown variant `int4`"),
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
        load(all_sections()["serve"], config_file=toml)
    with pytest.raises(ConfigError, match=r"-p serve.reorder_hops: must be <= 4, got 9"):
        load(all_sections()["serve"], overrides=["serve.reorder_hops=9"])


def test_a_required_option_is_asked_for():
    with pytest.raises(ConfigError, match=r"\[run\] needs a value for store"):
        load(all_sections()["run"], flags={"algorithm": "bfs"})
    with pytest.raises(ConfigError, match=r"run\.store: needs a store"):
        _native.config_check("run", {"algorithm": "bfs"})


def test_every_cli_section_of_a_rust_engine_comes_from_the_native_schema():
    """A section whose command runs in a Rust engine is built from that engine's schema;
    only the sections whose work is Python's own are declared in Python."""
    python_only = {name for name, cls in all_sections().items() if not getattr(cls, "__native__", False)}
    assert python_only == PYTHON_ONLY


def test_choices_keep_the_declaration_order_of_their_enum():
    """Every variant of a Rust enum is a choice in Python, in the enum's order (a mixed enum of
    documented and undocumented variants would list the undocumented ones apart, first)."""
    for schema in NATIVE.values():
        for name, definition in schema.get("$defs", {}).items():
            assert not any("enum" in o for o in definition.get("oneOf", [])), name


def test_gnn_train_memory_holds_the_whole_process_and_a_loader_only_its_data_path():
    from strata.config import GnnTrainConfig
    from strata.gnn.loader import LinkLoader, NodeLoader

    cfg = GnnTrainConfig(store="x")
    assert cfg.memory == 1 << 30
    # A loader's budget defaults to the section's: the default is written once, in the schema.
    for loader in (NodeLoader, LinkLoader):
        assert inspect.signature(loader).parameters["memory"].default is None
    assert cfg.device_memory == "auto"
    assert GnnTrainConfig(store="x", device_memory="8G").device_memory == 8 << 30
    with pytest.raises(ConfigError, match=r"gnn\.train\.dropout: must be in \[0, 1\), got 1.0"):
        GnnTrainConfig(store="x", dropout=1.0)


def test_config_prints_the_native_schema(strata_cli):
    text = strata_cli("config", "serve").stdout
    assert text == describe(all_sections()["serve"])
    schema = NATIVE["serve"]
    for key in schema["x-order"]:
        assert f"# {' '.join(schema['properties'][key]['description'].split())}" in text
    assert "# type: int (>= 1, <= 4)" in text
    assert 'memory = "1.00G"' in text
