"""PyTorch-BigGraph's score functions and training options through the CLI: `--model pbg` with its
operators and comparators trains and is recorded, the regularizers shrink the embeddings, and options
that cannot apply exit 2 naming the option."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_in_process import first_in_child
from strata.embed import Run

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_embed_pbg")

SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "-q"]


def test_rescal_trains_and_the_run_records_its_form(kg, tmp_path, strata_cli):
    run = tmp_path / "rescal"
    args = ["--model", "pbg", "--operator", "linear", "--comparator", "dot", "--epochs", "3", *SMALL]
    meta = json.loads(strata_cli("embed", "train", kg, "--run-dir", run, *args, "--json-summary").stdout)
    # 400 candidates: a random ranking has an MRR near 0.015.
    assert meta["test"]["mrr"] > 0.2, meta["test"]
    assert (meta["config"]["operator"], meta["config"]["comparator"]) == ("linear", "dot")
    # A resumed run keeps the operator.
    other = strata_cli("embed", "train", kg, "--run-dir", run, *args, "--operator", "diagonal", check=False)
    assert other.returncode == 2 and "operator" in other.stderr, other.stderr


def test_options_pbg_cannot_take_exit_2_naming_them(kg, tmp_path, strata_cli, capsys):
    # The first command in a child process, the rest in this one (tests/cli_in_process.py).
    strata_cli = first_in_child(strata_cli, capsys)

    def refused(*args: str) -> str:
        proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, *args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "r").exists()
        return proc.stderr

    assert "embed.train.operator" in refused("--model", "complex", "--operator", "linear")
    assert "embed.train.comparator" in refused("--model", "distmult", "--comparator", "l2")
    assert "operator" in refused("--model", "pbg", "--operator", "rotation")
    assert "comparator" in refused("--model", "pbg", "--comparator", "l1")
    assert "embed.train.dim" in refused("--model", "pbg", "--operator", "complex_diagonal", "--dim", "15")
    no_reciprocal = refused("--model", "pbg", "--operator", "affine", "--comparator", "dot", "--no-reciprocal")
    assert "embed.train.reciprocal" in no_reciprocal


def test_regularizers_shrink_the_embeddings_and_n3_still_learns(kg, tmp_path, strata_cli):
    def norm(name: str, *extra: str) -> tuple[float, dict]:
        args = ["--model", "complex", "--epochs", "2", *SMALL, *extra, "--json-summary"]
        meta = json.loads(strata_cli("embed", "train", kg, "--run-dir", tmp_path / name, *args).stdout)
        Run(tmp_path / name).export(tmp_path / f"{name}-emb", format="npy")
        emb = np.load(tmp_path / f"{name}-emb" / "embeddings.npy")
        return float(np.linalg.norm(emb, axis=1).mean()), meta

    plain, _ = norm("plain")
    l2, meta = norm("l2", "--regularizer", "l2", "--reg-weight", "20")
    assert meta["config"]["regularizer"] == "l2"
    assert l2 < 0.5 * plain, (l2, plain)
    _, n3 = norm("n3", "--regularizer", "n3", "--reg-weight", "0.05")
    assert n3["test"]["mrr"] > 0.2, n3["test"]
    bad = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "bad", "--reg-weight", "-1", *SMALL, check=False)
    assert bad.returncode == 2 and "embed.train.reg_weight" in bad.stderr, bad.stderr
