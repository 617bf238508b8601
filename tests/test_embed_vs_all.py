"""1vsAll and KvsAll training through the CLI: both train and say what they score, a table
the budget holds only in partitions is refused naming the option (1vsAll then trains out of
core against the resident partitions), and models whose score is no product are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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


def test_1vsall_against_resident_partitions_plans_their_rows_and_trains_where_all_would_not(tmp_path, strata_cli):
    # 200,000 nodes (few with edges) x 16 reals: a worker scoring a chunk of 100 edges against
    # every entity needs 104 MiB, against 3 of 5 partitions' 60%.
    gen = np.random.default_rng(0)
    h, r = gen.integers(0, 300, 3000), gen.integers(0, 4, 3000)
    np.save(tmp_path / "tri.npy", np.stack([h, r, (7 * h + 13 * r + gen.integers(0, 3, 3000)) % 300], 1))
    store = tmp_path / "iso.strata"
    strata_cli("convert", tmp_path / "tri.npy", "--relations", "--num-nodes", "200000", "--out", store, "-q")
    args = ["--model", "complex", "--dim", "16", "--chunk-size", "100", "--epochs", "1", "--memory", "192M"]
    every = train(strata_cli, store, tmp_path / "all", "--training", "1vsAll", *args, check=False)
    assert every.returncode == 2 and "Traceback" not in every.stderr, every.stderr
    assert "memory budget 192 MiB" in every.stderr and 'vsall_candidates = "resident"' in every.stderr, every.stderr
    ok = train(strata_cli, store, tmp_path / "res", "--training", "1vsAll", "--vsall-candidates", "resident", *args)
    plan = json.loads(ok.stdout)["memory_plan"]
    parts = {p["name"]: p for p in plan["parts"]}
    assert "partitions on disk" in parts["partition buffer"]["detail"], parts
    assert parts["workers"]["bytes"] < 104 << 20 and sum(p["bytes"] for p in plan["parts"]) <= 192 << 20, parts
