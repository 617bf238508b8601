"""The config mechanism: TOML files, -p overrides, flags, validation messages, templates."""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cli_in_process import in_process
from strata.cli.main import COMMANDS
from strata.config import ConvertConfig, all_sections, describe, load
from strata.config.schema import coerce_field
from strata.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


def test_precedence_defaults_file_flags_overrides(tmp_path):
    toml = write(tmp_path, '[convert]\nout = "a.strata"\nmemory = "2G"\nthreads = 3\nsplit = [0.8, 0.1, 0.1]\n')
    cfg = load(ConvertConfig, config_file=toml)
    assert (cfg.out, cfg.memory, cfg.threads, cfg.split) == (Path("a.strata"), 2 << 30, 3, (0.8, 0.1, 0.1))
    cfg = load(
        ConvertConfig,
        config_file=toml,
        flags={"threads": "1", "memory": "512M"},
        overrides=["convert.memory=1.5G", "convert.relations=true"],
    )
    assert (cfg.threads, cfg.memory, cfg.relations) == (1, int(1.5 * 2**30), True)
    assert cfg.delimiter == "auto"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overrides": ["convert.memory=lots"]}, "-p convert.memory: expected a size like 512M or 2G, got 'lots'"),
        ({"overrides": ["convert.memroy=1G"]}, "unknown [convert] option 'memroy'; did you mean 'memory'?"),
        ({"overrides": ["embed.dim=10"]}, "this command reads section [convert], not [embed]"),
        ({"overrides": ["convert.threads"]}, "expected SECTION.KEY=VALUE"),
        ({"flags": {"split": "0.5,0.1"}}, "expected three fractions"),
        ({"flags": {"delimiter": "pipe"}}, "unknown choice 'pipe' (choices: auto, tab, comma, whitespace)"),
        ({"flags": {"threads": "two"}}, "--threads: expected an integer"),
        ({"flags": {"threads": "-1"}}, "--threads: must be >= 0, got -1"),
        ({"flags": {"split": "0.8,0.1,0.1"}, "overrides": ["convert.valid=v.txt"]}, "cannot be combined"),
        (
            {"flags": {"memory": "100000000000000000000"}},
            "--memory: a size must be at most 9223372036854775807 bytes (8 EiB), got '100000000000000000000'",
        ),
        ({"overrides": ["convert.memory=99999999999P"]}, "-p convert.memory: a size must be at most 922337203685477"),
    ],
)
def test_bad_values_name_the_field(kwargs, message):
    kwargs.setdefault("flags", {})
    kwargs["flags"].setdefault("out", "x.strata")
    with pytest.raises(ConfigError, match=None) as exc:
        load(ConvertConfig, **kwargs)
    assert message in str(exc.value)


def test_missing_required_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="needs a value for out"):
        load(ConvertConfig)
    with pytest.raises(ConfigError, match="does not exist"):
        load(ConvertConfig, config_file=tmp_path / "absent.toml")
    bad = write(tmp_path, "[convert]\nout = \n")
    with pytest.raises(ConfigError, match=r"run\.toml"):
        load(ConvertConfig, config_file=bad)
    typo = write(tmp_path, '[convert]\nout = "x"\nthreds = 2\n')
    with pytest.raises(ConfigError, match=r"run.toml: unknown \[convert\] option 'threds'; did you mean 'threads'"):
        load(ConvertConfig, config_file=typo)


@pytest.mark.parametrize("name", sorted(all_sections()))
def test_every_section_template_is_valid_toml_with_help(name):
    text = describe(all_sections()[name])
    doc = tomllib.loads(text)
    table = doc
    for part in name.split("."):
        table = table[part]
    cls = all_sections()[name]
    for field in cls.__dataclass_fields__.values():
        assert field.metadata["help"], f"{name}.{field.name} has no help text"
        assert f"# {field.metadata['help']}" in text


def test_cli_reads_config_file_and_overrides(tmp_path, strata_cli):
    edges = tmp_path / "e.tsv"
    edges.write_text("a\tb\nb\tc\n")
    toml = write(tmp_path, f'[convert]\nout = "{tmp_path / "g.strata"}"\nmemory = "64M"\nsymmetrize = false\n')
    proc = strata_cli("convert", edges, "--config", toml, "-p", "convert.symmetrize=true", "-q")
    assert "Converted 2 edges" in proc.stdout
    info = strata_cli("info", tmp_path / "g.strata", "--json").stdout
    assert '"symmetrized": true' in info


def test_a_positional_argument_may_come_from_the_config_file_or_p(tmp_path, strata_cli):
    edges = tmp_path / "e.tsv"
    edges.write_text("a\tb\nb\tc\n")
    store = tmp_path / "g.strata"
    strata_cli("convert", edges, "--out", store, "-q")
    toml = write(tmp_path, f'[info]\nstore = "{store}"\n')
    assert "2 train" in strata_cli("info", "--config", toml).stdout
    assert "2 train" in strata_cli("info", "-p", f"info.store={store}").stdout
    none = strata_cli("info", check=False)
    assert none.returncode == 2 and "[info] needs a value for store (STORE, or -p info.store=...)" in none.stderr
    run = write(tmp_path, f'[run]\nalgorithm = "bfs"\nstore = "{store}"\n')
    assert "reached 3" in strata_cli("run", "--config", run, "-q").stdout
    # Options between positionals (argparse alone bound ALGORITHM and an empty STORE to `bfs`).
    assert "reached 3" in strata_cli("run", "bfs", "--root", "0", "-q", store).stdout


def test_a_python_call_takes_a_config_with_keyword_overrides():
    from strata.config import RunConfig, from_call

    base = RunConfig(algorithm="bfs", store="g.strata")
    assert from_call(RunConfig, base, {"root": 3}).root == 3 and base.root == 0
    assert from_call(RunConfig, None, {"algorithm": "wcc", "store": "g"}).algorithm == "wcc"
    with pytest.raises(ConfigError, match=r"run\.damping: must be in \[0, 1\)"):
        from_call(RunConfig, base, {"damping": 2})
    with pytest.raises(ConfigError, match="unknown \\[run\\] option 'roots'; did you mean 'root'"):
        from_call(RunConfig, None, {"roots": 1})
    with pytest.raises(TypeError, match=r"give it by keyword, e.g. store='g.strata'"):
        from_call(RunConfig, "g.strata", {})


def test_a_small_budget_parses_with_fewer_threads_unless_they_were_asked_for(tmp_path, strata_cli):
    """One parse thread per core is a default: a budget too small for every core's blocks
    parses with fewer (a 64 MiB budget on a 16-core machine). Asked-for threads are kept."""
    edges = tmp_path / "e.tsv"
    edges.write_text("a\tb\nb\tc\n")
    proc = strata_cli("convert", edges, "--out", tmp_path / "g.strata", "--memory", "64M")
    assert "Converted 2 edges" in proc.stdout
    proc = strata_cli("convert", edges, "--out", tmp_path / "h.strata", "--memory", "64M", "--threads", "64",
                      check=False)  # fmt: skip
    assert proc.returncode != 0 and not (tmp_path / "h.strata").exists()
    assert "memory budget of 64.0 MiB is too small: parsing with 64 threads" in proc.stderr


def test_help_lists_every_option_with_its_help(strata_cli):
    text = strata_cli("convert", "--help").stdout
    for field in ConvertConfig.__dataclass_fields__.values():
        if field.metadata["flag"] and not field.metadata["positional"]:
            assert f"--{field.name.replace('_', '-')}" in text
    assert "memory budget of the conversion" in text
    assert "rmat" in strata_cli("generate", "--help").stdout
    assert "convert" in strata_cli("config").stdout
    typo = strata_cli("config", "embed.trian", check=False)
    assert typo.returncode == 2 and "did you mean 'embed.train'?" in typo.stderr


# What a `strata` process has imported when it exits: the command modules, the config section
# groups, whether NumPy; and whether the process froze its objects out of the collector.
_IMPORTED = (
    "import gc, sys, runpy\n"
    "try:\n"
    "    runpy.run_module('strata', run_name='__main__')\n"
    "finally:\n"
    "    groups = [m for m in sys.modules if m.startswith('strata.config.')]\n"
    "    print(sorted(m for m in sys.modules if m.startswith('strata.cli.cmd_')),\n"
    "          sorted(set(groups) - {'strata.config.schema', 'strata.config.loading'}),\n"
    "          'numpy' in sys.modules, gc.get_freeze_count() > 0, sep='|', file=sys.stderr)\n"
)


@pytest.mark.parametrize(
    ("args", "modules", "sections"),
    [
        (["--help"], [], []),
        (["--version"], [], []),
        (["info", "missing.strata"], ["strata.cli.cmd_info"], ["strata.config.info"]),
        (["serve", "status", "--help"], ["strata.cli.cmd_serve"], ["strata.config.serve"]),
        (["embed", "train", "--help"], ["strata.cli.cmd_embed"], ["strata.config.embed"]),
    ],
)
def test_a_command_imports_only_its_own_module(args, modules, sections):
    """`strata --help` lists every command without importing one; a command imports its own
    module and its own config sections, and the process freezes what is left before it exits."""
    proc = subprocess.run([sys.executable, "-c", _IMPORTED, *args], capture_output=True, text=True)
    imported, groups, numpy, frozen = proc.stderr.strip().splitlines()[-1].split("|")
    assert imported == repr(modules) and groups == repr(sections)
    assert frozen == "True"
    if not modules:
        assert proc.returncode == 0 and numpy == "False"
        assert "strata" in proc.stdout


def test_main_in_a_program_leaves_its_collector_as_it_was(capsys):
    before = gc.get_freeze_count()
    code, out = in_process(["config"], capsys)
    assert code == 0 and "embed.train" in out and gc.get_freeze_count() == before


def test_subpackages_are_attributes_of_the_package():
    """`import strata; strata.embed.train(...)`, as `torch.nn`: each imported on first use."""
    code = (
        "import strata, sys; print('strata.gnn' in sys.modules, strata.gnn.NodeLoader.__name__, "
        "strata.embed.train.__name__, strata.plot.plot_run.__name__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["False", "NodeLoader", "train", "plot_run"], proc.stderr
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        import strata

        strata.nosuch  # noqa: B018


def test_an_os_error_no_check_foresaw_is_one_line_not_a_traceback(monkeypatch, capsys):
    from strata.cli import cmd_info

    def fail(args):
        raise PermissionError(13, "Permission denied", "/srv/store/manifest.json")

    monkeypatch.setattr(cmd_info, "run", fail)
    code, out = in_process(["info", "x"], capsys)
    assert code == 1 and out == "strata info: error: Permission denied: /srv/store/manifest.json\n", out


def test_every_command_has_its_help_and_is_listed(capsys):
    """Each command's module registers it under the name the command line lists."""
    for name in COMMANDS:
        code, out = in_process([name, "--help"], capsys)
        assert code == 0 and out.startswith(f"usage: strata {name.replace('-status', ' status')} "), out
    code, out = in_process(["--help"], capsys)
    listed = [name for name, command in COMMANDS.items() if command.help != argparse.SUPPRESS]
    assert code == 0 and all(f"    {name} " in out for name in listed), out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["generate", "kg", "--entites", "3"],
            "strata generate kg: error: unrecognized arguments: --entites 3; did you mean --entities?",
        ),
        (
            ["embed", "train", "--bogus"],
            "strata embed train: error: unrecognized arguments: --bogus (`strata embed train --help` lists",
        ),
        (
            ["serve", "status", "--tken=x"],
            "strata serve status: error: unrecognized arguments: --tken=x; did you mean --token?",
        ),
        (["info", "a", "b"], "strata info: error: unrecognized arguments: b"),
    ],
)
def test_an_unknown_argument_is_named_by_its_command(capsys, args, message):
    """Under the command's own name and usage, not ``strata``'s, with the nearest option."""
    code, out = in_process(args, capsys)
    assert code == 2 and message in out and f"usage: strata {' '.join(args[: 2 if args[0] != 'info' else 1])}" in out, (
        out
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[convert]\nout = "x"\nthreads = 2.7\n', "run.toml: [convert] threads: expected an integer, got 2.7"),
        ('[convert]\nout = "x"\nthreads = 2.0\n', "run.toml: [convert] threads: expected an integer, got 2.0"),
        ('[convert]\nout = "x"\nseed = -5\n', "run.toml: [convert] seed: must be >= 0, got -5"),
        ('[convert]\nout = "x"\nseed = 9223372036854775808\n', "[convert] seed: must be <= 9223372036854775807"),
        ('[convert]\nout = "x"\nthreads = true\n', "[convert] threads: expected an integer, got True"),
        ('[convrt]\nout = "x"\n', "run.toml: unknown section 'convrt'; did you mean 'convert'?"),
        ("[embed.trian]\ndim = 4\n", "run.toml: unknown section 'embed.trian'; did you mean 'embed.train'?"),
        ("memory = 3\n", "run.toml: unknown option 'memory' outside any section"),
        ("[embed]\ndim = 4\n", "run.toml: [embed] holds sections, not options: put 'dim' in one of [embed.eval]"),
        ("convert = 3\n", "run.toml: [convert] must be a table of options, got 3"),
        # Every section of the file is checked, not only the one the command reads.
        ('[convert]\nout = "x"\n[embed.train]\ndim = "big"\n', "run.toml: [embed.train] dim: expected an integer"),
        ('[convert]\nout = "x"\n[embed.train]\ndimm = 4\n', "unknown [embed.train] option 'dimm'; did you mean 'dim'?"),
        ("[gnn.train]\nlr = nan\n", "run.toml: [gnn.train] lr: expected a finite number, got nan"),
        (
            '[convert]\nout = "x"\nmemory = 100000000000000000000\n',
            "run.toml: [convert] memory: a size must be at most 9223372036854775807 bytes",
        ),
        ('[gnn.train]\ndevice_memory = "99999999999P"\n', "[gnn.train] device_memory: a size must be at most"),
    ],
)
def test_config_files_are_strict(tmp_path, text, message):
    with pytest.raises(ConfigError) as exc:
        load(ConvertConfig, config_file=write(tmp_path, text))
    assert message in str(exc.value)


def test_a_section_check_names_the_file_the_value_came_from(tmp_path):
    from strata.config import EmbedTrainConfig

    toml = write(tmp_path, '[embed.train]\nstore = "x"\npartitions = 5\nbuffer = 2\n')
    with pytest.raises(ConfigError, match=r"needs a buffer of 3, got 2 \(from .*run\.toml: \[embed\.train\] buffer\)"):
        load(EmbedTrainConfig, config_file=toml)


@pytest.mark.parametrize("name", sorted(all_sections()))
def test_every_integer_option_is_range_checked_in_every_route(name):
    """-5 and 2.7 are refused for every integer option, from a file, a flag, -p and Python (an
    option may declare a higher floor than 0, as serve.max_ids does)."""
    import typing

    cls = all_sections()[name]
    ints = [k for k, tp in typing.get_type_hints(cls).items() if tp in (int, int | None)]
    for key in ints:
        for bad in (-5, 2.7):
            with pytest.raises(ConfigError, match=rf"{key}: (must be >= [0-9]|expected an integer)"):
                coerce_field(cls, key, bad, f"[{name}] {key}")
            with pytest.raises(ConfigError, match=rf"-p {name}.{key}: (must be >= [0-9]|expected an integer)"):
                load(cls, overrides=[f"{name}.{key}={bad}"])


def test_config_errors_exit_2_naming_file_section_and_key(tmp_path, strata_cli):
    toml = write(tmp_path, "[convert]\nthreads = 2.7\n")
    proc = strata_cli("convert", tmp_path / "e.tsv", "--out", tmp_path / "g", "--config", toml, check=False)
    assert proc.returncode == 2
    assert f"{toml}: [convert] threads: expected an integer, got 2.7" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = strata_cli("convert", tmp_path / "e.tsv", "--out", tmp_path / "g", "-p", "convert.seed=-5", check=False)
    assert proc.returncode == 2 and "-p convert.seed: must be >= 0, got -5" in proc.stderr


def test_sizes_out_of_range_name_the_option_and_the_range(tmp_path, strata_cli):
    from strata import _native

    for value in ("100000000000000000000", "99999999999P"):
        proc = strata_cli("embed", "train", tmp_path / "g.strata", "--memory", value, check=False)
        assert proc.returncode == 2
        assert f"--memory: a size must be at most 9223372036854775807 bytes (8 EiB), got '{value}'" in proc.stderr
    assert coerce_field(ConvertConfig, "memory", "1.5K", "--memory") == 1536
    assert coerce_field(ConvertConfig, "memory", "9007199254740993", "--memory") == 9007199254740993  # exact
    # The engine's own check names the option when a value has no 64-bit form.
    with pytest.raises(ConfigError, match=r"embed\.train\.memory: .*numbers must lie within \[-2\^63, 2\^64 - 1\]"):
        _native.config_check("embed.train", {"memory": 10**20})
