"""`strata run` offers the algorithms of the engine's registry (strata_grid::algo::registry):
every registered one is listed with its parameters, and a name it does not hold is refused with
the closest registered one and the list."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_strata
from strata import _native
from strata.config import ConvertConfig, RunConfig, describe
from strata.convert import convert
from strata.errors import ConfigError
from strata.grid import RESULT_ARRAYS, VertexProgram, algorithms, run

REGISTERED = _native.grid_algorithms()


def test_the_registry_is_what_strata_run_offers():
    names = [a["name"] for a in REGISTERED]
    assert names and len(set(names)) == len(names)
    assert [a["name"] for a in algorithms()] == names
    assert set(RESULT_ARRAYS) == set(names)
    help_text = " ".join(run_strata("run", "--help").stdout.split())
    template = describe(RunConfig)
    for a in REGISTERED:
        assert f"{a['name']} ({a['about']})" in help_text
        for param in a["params"]:
            # Each parameter is an option, its help naming the algorithms that take it.
            users = ", ".join(b["name"] for b in REGISTERED if param in b["params"])
            assert f"--{param.replace('_', '-')}" in help_text
            assert f"# {users}: " in template and f"{param} = " in template
    top = run_strata("--help").stdout
    assert ", ".join(names) in " ".join(top.split())


def test_an_unknown_algorithm_gets_a_did_you_mean(tmp_path):
    store = tmp_path / "g.strata"
    proc = run_strata("run", "pagernk", store, check=False)
    assert proc.returncode == 2
    listed = ", ".join(a["name"] for a in REGISTERED)
    assert f"unknown choice 'pagernk'; did you mean 'pagerank'? (choices: {listed})" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_strata("run", "closeness", store, check=False)
    assert proc.returncode == 2 and "did you mean" not in proc.stderr and listed in proc.stderr
    # The engine's own check, for a name that does not come through the command line.
    with pytest.raises(ConfigError, match=r"run\.algorithm: unknown algorithm 'pagernk'; did you mean 'pagerank'\?"):
        _native.config_check("run", {"store": "g", "algorithm": "pagernk"})


def test_every_registered_algorithm_runs_from_python(tmp_path):
    rng = np.random.default_rng(0)
    edges = rng.integers(0, 60, size=(400, 2))
    np.save(tmp_path / "e.npy", edges)
    store = tmp_path / "g.strata"
    convert(ConvertConfig(inputs=[tmp_path / "e.npy"], out=store, num_nodes=60))
    # The one algorithm with a required parameter, whose arrays are the program's outputs.
    program = VertexProgram("in_degree", values={"d": ("f64", "0")}, edge="1", apply={"d": "acc"}, iterations=1)
    required = {"program": {"program": program.to_json()}}
    for a in REGISTERED:
        summary = run(
            algorithm=a["name"], store=store, memory="256M", out=tmp_path / a["name"], **required.get(a["name"], {})
        )
        assert summary["algorithm"] == a["name"]
        arrays = a["arrays"] or ["d"]
        assert [p.rsplit("/", 1)[1] for p in summary["arrays"]] == [f"{x}.npy" for x in arrays]
