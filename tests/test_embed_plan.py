"""`strata embed plan`: the orderings from Python and the CLI."""

from __future__ import annotations

import json

import pytest

from strata.embed import plan
from strata.errors import ConfigError


@pytest.mark.parametrize(("n", "legend_max", "beta_max"), [(6, 8, 8), (8, 16, 15), (12, 36, 34), (16, 66, 63)])
def test_table_8_bounds_from_python(n, legend_max, beta_max):
    legend = plan(n, 3, "legend")
    beta = plan(n, 3, "beta")
    assert legend["states"] <= legend_max and beta["states"] <= beta_max
    for p in (legend, beta):
        buckets = [tuple(b) for s in p["steps"] for b in s["overlap"] + s["after_load"]]
        assert sorted(buckets) == [(a, b) for a in range(n) for b in range(n)]
        assert p["volume"] == pytest.approx(p["states"] / n)
    assert legend["hidden_swaps"] >= beta["hidden_swaps"] + (n >= 8)


def test_cli_prints_states_loads_and_volume(strata_cli):
    out = strata_cli("embed", "plan", "--partitions", "8", "--ordering", "beta", "--buffer", "4").stdout
    assert "Ordering beta: 8 partitions, buffer of 4" in out
    assert "communication volume" in out and "buffer states" in out
    beta = plan(8, 4, "beta")
    # Later epochs start where the last ended: they read only their swaps.
    assert f"partition reads: {beta['partition_loads']} in the first epoch" in out
    assert f"{beta['swaps']} in each later one" in out
    doc = json.loads(strata_cli("embed", "plan", "--partitions", "5", "--json").stdout)
    assert doc["ordering"] == "legend" and len(doc["steps"]) == doc["states"]


def test_bad_plans_are_explained(strata_cli):
    with pytest.raises(ConfigError, match="use beta for other capacities"):
        plan(8, 4, "legend")
    proc = strata_cli("embed", "plan", "--partitions", "0", check=False)
    assert proc.returncode == 2 and "--partitions: must be >= 1, got 0" in proc.stderr
