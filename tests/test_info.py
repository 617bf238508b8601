"""``strata info``: the store's description, and with ``--memory`` each engine's own memory plan
(the lines the engine prints at start, from the same planner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_strata, symmetric_sbm_store

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_info")


@pytest.fixture(scope="module")
def sbm(tmp_path_factory) -> Path:
    """A labelled SBM graph (2000 nodes, 4 communities, 16 float32 features) as a store."""
    return symmetric_sbm_store(tmp_path_factory.mktemp("sbm"), nodes=2000, classes=4, dim=16, avg_degree=8)


def test_without_memory_no_plans(sbm):
    desc = json.loads(run_strata("info", sbm, "--json").stdout)
    assert "memory_plans" not in desc and desc["graph"]["num_nodes"] == 2000
    assert "Memory plans" not in run_strata("info", sbm).stdout


def test_each_engine_that_applies_plans_the_budget(sbm):
    desc = json.loads(run_strata("info", sbm, "--memory", "512M", "--json").stdout)
    plans = {p["engine"]: p for p in desc["memory_plans"]}
    assert list(plans) == ["embed", "gnn", "grid", "serve"]
    assert "no grid for pagerank" in plans["grid"]["not_planned"]
    for engine in ("embed", "gnn", "serve"):
        p = plans[engine]
        assert p["memory"] == 512 << 20 and p["minimum"] <= p["memory"], p
        assert 0 < sum(part["bytes"] for part in p["parts"]) <= p["memory"], p
    # The store has no validation split for a write-behind copy to hide its write behind.
    copy = next(part for part in plans["embed"]["parts"] if part["name"] == "write-behind copy")
    assert copy["bytes"] == 0 and copy["detail"].startswith("none"), copy
    # The server plans the store's graph off the top and splits all the rest.
    assert sum(part["bytes"] for part in plans["serve"]["parts"]) == 512 << 20
    # 2000 x 16 float32 features fit: gnn holds all of them.
    features = next(d for d in plans["gnn"]["data"] if d["name"] == "node features")
    assert features["resident"] == features["bytes"] == 2000 * 16 * 4
    text = run_strata("info", sbm, "--memory", "512M").stdout
    assert "Memory plans for a budget of 512 MiB" in text
    for engine in ("embed", "gnn", "serve"):
        assert f"  {engine} budget 512 MiB: planned" in text
    assert "  grid: not planned: no grid for pagerank" in text


def test_the_plan_is_the_one_the_engine_prints(sbm, tmp_path):
    run = run_strata("run", "pagerank", sbm, "--iterations", "1", "--memory", "256M", "--out", tmp_path / "pr")
    text = run_strata("info", sbm, "--memory", "256M").stdout
    grid = [line.strip() for line in text.splitlines() if line.strip().startswith("grid budget")]
    assert grid, text
    printed = run.stderr
    start = printed.index("grid budget")
    assert printed[start:].splitlines()[0].strip() == grid[0]
    record = json.loads((tmp_path / "pr" / "run.json").read_text())
    desc = json.loads(run_strata("info", sbm, "--memory", "256M", "--json").stdout)
    assert record["summary"]["memory_plan"] == next(p for p in desc["memory_plans"] if p["engine"] == "grid")


def test_a_budget_below_an_engine_minimum_says_why(sbm):
    text = run_strata("info", sbm, "--memory", "16M").stdout
    assert "embed: does not fit: memory budget 16.0 MiB cannot hold" in text
    assert "serve: does not fit: memory: --memory 16.0 MiB is below this server's minimum" in text
