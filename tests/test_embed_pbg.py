"""`strata embed train --model pbg`: PyTorch-BigGraph's operators and comparators train through the
CLI, the run records them, and options they cannot take exit 2 naming the option."""

from __future__ import annotations

import json

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


def test_options_pbg_cannot_take_exit_2_naming_them(kg, tmp_path, strata_cli):
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
