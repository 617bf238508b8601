"""1vsAll and KvsAll training through the CLI: both train and say what they score, a table
the budget holds only in partitions is refused naming the option (1vsAll then trains out of
core against the resident partitions), and models whose score is no product are refused."""

from __future__ import annotations

import json
from pathlib import Path

SMALL = ["--dim", "16", "--chunk-size", "200", "--epochs", "3", "--threads", "1"]


def train(strata_cli, store: Path, run: Path, *args, check: bool = True):
    return strata_cli("embed", "train", store, "--run-dir", run, *SMALL, *args, "--json-summary", check=check)


def test_1vsall_and_kvsall_train_and_are_recorded(kg, tmp_path, strata_cli):
    one = train(strata_cli, kg, tmp_path / "one", "--training", "1vsAll")
    assert "1vsAll: every query against all" in one.stderr, one.stderr
    meta = json.loads(one.stdout)
    assert meta["config"]["training"] == "1vsAll"
    # 400 candidates: a random ranking has an MRR near 0.015.
    assert meta["test"]["mrr"] > 0.2, meta["test"]
    kvs = train(strata_cli, kg, tmp_path / "kvs", "--training", "KvsAll", "--label-smoothing", "0.1")
    assert "KvsAll:" in kvs.stderr and "head queries of the training edges" in kvs.stderr, kvs.stderr
    meta = json.loads(kvs.stdout)
    assert abs(meta["config"]["label_smoothing"] - 0.1) < 1e-6
    assert meta["test"]["mrr"] > 0.2, meta["test"]


def test_a_partitioned_table_is_refused_unless_1vsall_scores_the_resident_partitions(kg, tmp_path, strata_cli):
    parts = ["--partitions", "4", "--buffer", "2", "--ordering", "beta"]
    for mode in ("1vsAll", "KvsAll"):
        proc = train(strata_cli, kg, tmp_path / mode, "--training", mode, *parts, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f'training "{mode}" scores every entity' in proc.stderr and "4 partitions" in proc.stderr, proc.stderr
        assert ('vsall_candidates = "resident"' in proc.stderr) == (mode == "1vsAll"), proc.stderr
        assert not (tmp_path / mode / "run.json").exists()
    ok = train(strata_cli, kg, tmp_path / "res", "--training", "1vsAll", "--vsall-candidates", "resident", *parts)
    assert "against the 2 resident of 4 partitions' entities" in ok.stderr, ok.stderr
    assert json.loads(ok.stdout)["test"]["mrr"] > 0.1


def test_models_and_options_that_do_not_apply_exit_2_naming_them(kg, tmp_path, strata_cli):
    def refused(*args: str) -> str:
        proc = train(strata_cli, kg, tmp_path / "r", *args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "r" / "run.json").exists()
        return proc.stderr

    transe = refused("--training", "1vsAll", "--model", "transe")
    assert "embed.train.training" in transe and "model transe scores by a distance" in transe, transe
    margin = refused("--training", "KvsAll", "--loss", "margin")
    assert "embed.train.loss" in margin, margin
    smoothing = refused("--label-smoothing", "0.1")
    assert "embed.train.label_smoothing" in smoothing and "negative sampling" in smoothing, smoothing
