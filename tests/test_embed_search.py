"""``strata embed search`` end to end through the CLI on a small generated graph: trials train
within the budget, the pruner stops trials behind the others, the results are one table and a
JSON, the best config trains as it is, and bad space files exit 2 naming the entry."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from conftest import needs, without

FIXED = """
[embed.train]
epochs = 3
dim = 16
chunk_size = 200
threads = 1
eval_max_queries = 300
"""


def write_space(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


def test_search_runs_trials_prunes_and_writes_a_config_that_trains(kg, tmp_path, strata_cli):
    needs("optuna")
    # A rate that learns and one that does not: once one trial of each has run, the pruner
    # stops a trial of the slow rate after its first validation (the sampler is seeded).
    space = write_space(
        tmp_path,
        FIXED + "\n[space]\nlr = {choices = [0.3, 1e-6]}\nnegatives = {low = 32, high = 96, step = 32}\n"
        "init_scale = {low = 1e-3, high = 1e-1, log = true}\n",
    )
    out = tmp_path / "search"
    proc = strata_cli("embed", "search", kg, space, "--out", out, "--trials", "6", "--memory", "256M",
                      "--startup-trials", "1", "--seed", "3")  # fmt: skip
    results = json.loads((out / "search.json").read_text())
    trials = results["trials"]
    assert len(trials) == 6 and results["memory"] == 256 << 20
    states = [t["state"] for t in trials]
    assert set(states) <= {"complete", "pruned"}, trials
    assert "pruned" in states, trials
    for t in trials:
        assert 32 <= t["params"]["negatives"] <= 96 and t["params"]["negatives"] % 32 == 0
        assert 1e-3 <= t["params"]["init_scale"] <= 1e-1
        run = json.loads((Path(t["run"]) / "run.json").read_text())
        assert run["config"]["negatives"] == t["params"]["negatives"]
        assert run["config"]["memory"] == 256 << 20
        assert t["state"] == "pruned" or t["epochs"] == 3, t
    # A pruned trial stops after the validation that pruned it.
    assert any(t["state"] == "pruned" and t["epochs"] < 3 for t in trials), trials
    best = results["best"]
    complete = [t for t in trials if t["state"] == "complete"]
    assert best["mrr"] == max(t["mrr"] for t in complete)
    assert best["config"]["lr"] == 0.3
    # One table: every trial, best first, and where the best config is.
    assert proc.stdout.count("complete") + proc.stdout.count("pruned") == 6, proc.stdout
    assert f"Best: trial {best['trial']}, validation MRR {best['mrr']:.4f}" in proc.stdout
    # The best config is a [embed.train] table that trains as it is.
    toml = tomllib.loads((out / "best.toml").read_text())["embed"]["train"]
    assert toml["negatives"] == best["config"]["negatives"] and toml["dim"] == 16
    strata_cli("embed", "train", kg, "--run-dir", tmp_path / "best", "--config", out / "best.toml", "--epochs", "1",
               "-q")  # fmt: skip
    again = strata_cli("embed", "search", kg, space, "--out", out, "--trials", "1", check=False)
    assert again.returncode == 2 and "--overwrite" in again.stderr, again.stderr


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("[space]\nlrr = {low = 0.1, high = 1.0}\n", "[space]"),
        ("[space]\nmodel = {low = 1, high = 2}\n", "takes choices = [...], not a range"),
        ("[space]\ndim = {low = 8.5, high = 32}\n", "[space] dim: low must be an integer, got 8.5"),
        ("[space]\nlr = {low = 0.0, high = 1.0, log = true}\n", "[space] lr: a log scale needs low > 0"),
        ("[space]\nlr = {low = 0.5, high = 0.1}\n", "[space] lr: low 0.5 is above high 0.1"),
        ("[space]\nmodel = {choices = []}\n", "[space] model: choices must be a non-empty list"),
        ('[space]\nmodel = {choices = ["complex", "holE"]}\n', "[space] model choices[1]"),
        ("[space]\nmemory = {choices = [1]}\n", "[space] memory: cannot be searched"),
        ("[space]\nlr = 0.1\n", "[space] lr: expected a table"),
        ("[embed.train]\nepochs = 2\n", "expected a [space] table"),
        ("[space]\nlr = {low = 0.1, high = 1.0, scale = 2}\n", "unknown key(s) scale"),
    ],
)
def test_bad_space_files_exit_2_naming_the_entry(kg, tmp_path, strata_cli, space, message):
    needs("optuna")
    path = write_space(tmp_path, space)
    proc = strata_cli("embed", "search", kg, path, "--out", tmp_path / "s", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert str(path) in proc.stderr and message in proc.stderr, proc.stderr
    assert not (tmp_path / "s").exists()


def test_without_optuna_the_search_says_how_to_install_it(kg, tmp_path, monkeypatch):
    from strata.embed import search
    from strata.errors import MissingDependencyError

    without(monkeypatch, "optuna")
    cfg = search.EmbedSearchConfig(store=kg, space=write_space(tmp_path, "[space]\nlr = {choices = [0.1]}\n"))
    with pytest.raises(MissingDependencyError, match=r"pip install 'optuna>=3'"):
        search.search(cfg)
