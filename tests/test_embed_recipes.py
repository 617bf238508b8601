"""The training options of the shipped recipes through the CLI: dropout on entity and relation
rows (with shared or independent masks) and weighted N3/L2 train (in memory and partitioned),
are recorded and deterministic with one thread; options that do not apply exit 2 naming the
option and the model; every recipe in examples/recipes is a valid config that trains."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPES = sorted((REPO / "examples" / "recipes").glob("*.toml"))
SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "--epochs", "3", "--threads", "1"]
RECIPE_ARGS = ["--entity-dropout", "0.2", "--relation-dropout", "0.1", "--regularizer", "n3", "--reg-weighted",
               "--reg-weight", "0.01", "--relation-reg-weight", "0.02"]  # fmt: skip


def summary(strata_cli, store: Path, run: Path, *args) -> dict:
    proc = strata_cli("embed", "train", store, "--run-dir", run, *SMALL, "-q", *args, "--json-summary")
    return json.loads(proc.stdout)


def test_dropout_and_weighted_n3_train_deterministically_and_are_recorded(kg, tmp_path, strata_cli):
    a = summary(strata_cli, kg, tmp_path / "a", *RECIPE_ARGS)
    b = summary(strata_cli, kg, tmp_path / "b", *RECIPE_ARGS)
    plain = summary(strata_cli, kg, tmp_path / "p")
    cfg = a["config"]
    assert (cfg["entity_dropout"], cfg["relation_dropout"]) == (pytest.approx(0.2), pytest.approx(0.1))
    assert cfg["reg_weighted"] is True and cfg["relation_reg_weight"] == pytest.approx(0.02)
    # One thread, one seed: the masks are the chunks' own draws, so the runs agree exactly.
    assert [e["loss"] for e in a["history"]] == [e["loss"] for e in b["history"]]
    assert a["test"]["mrr"] == b["test"]["mrr"]
    assert [e["loss"] for e in a["history"]] != [e["loss"] for e in plain["history"]]
    # Head queries go through the trained inverse rows: both directions learn.
    assert a["test"]["head_mrr"] > 0.1 and a["test"]["tail_mrr"] > 0.1, a["test"]
    # LibKGE's independent masks: the positive's query dropped again, a different run that
    # learns as well.
    own = summary(strata_cli, kg, tmp_path / "i", *RECIPE_ARGS, "--dropout-masks", "independent")
    assert own["config"]["dropout_masks"] == "independent" and a["config"]["dropout_masks"] == "shared"
    assert [e["loss"] for e in own["history"]] != [e["loss"] for e in a["history"]]
    assert own["test"]["head_mrr"] > 0.1 and own["test"]["tail_mrr"] > 0.1, own["test"]


def test_the_options_train_partitioned(kg, tmp_path, strata_cli):
    meta = summary(strata_cli, kg, tmp_path / "p", *RECIPE_ARGS, "--partitions", "4", "--buffer", "2",
                   "--ordering", "beta", "--corrupt", "bernoulli")  # fmt: skip
    assert meta["partitioning"]["partitions"] == 4
    assert meta["test"]["mrr"] > 0.15, meta["test"]


@pytest.mark.parametrize(
    ("args", "key", "words"),
    [
        (["--model", "rotate", "--relation-dropout", "0.1"], "relation_dropout", ['"rotate"', "phases"]),
        (["--model", "dot", "--relation-dropout", "0.1"], "relation_dropout", ['"dot"', "no relation rows"]),
        (["--entity-dropout", "1"], "entity_dropout", ["[0, 1)"]),
        (["--dropout-masks", "independent"], "dropout_masks", ["entity_dropout or relation_dropout"]),
        (
            ["--entity-dropout", "0.2", "--dropout-masks", "independent", "--training", "1vsAll"],
            "dropout_masks",
            ["negative sampling", '"1vsAll"'],
        ),
        (
            ["--model", "pbg", "--entity-dropout", "0.2", "--dropout-masks", "independent"],
            "dropout_masks",
            ['"pbg"', '"shared"'],
        ),
        (["--reg-weighted"], "reg_weighted", ['"none"']),
        (["--relation-reg-weight", "0.1"], "relation_reg_weight", ['"none"']),
        # Each of these four was read by nothing and trained as if it were not given.
        (["--reg-weight", "0.1"], "reg_weight", ['"none"']),
        (["--model", "distmult", "--transe-norm", "1"], "transe_norm", ['"transe"', '"distmult"']),
        (["--loss", "softmax", "--margin", "0.5"], "margin", ['"margin"', '"softmax"']),
        (["--negative-pool", "partition", "--bank-rows", "100"], "bank_rows", ['"all"', '"partition"']),
        (["--corrupt", "tail"], "reciprocal", ['corrupt = "tail"', "reciprocal = false"]),
        (
            ["--regularizer", "l2", "--reg-weight", "0.1", "--reg-scope", "table"],
            "reg_scope",
            ["negative sampling", '"1vsAll"'],
        ),
        (["--training", "1vsAll", "--reg-scope", "table"], "reg_scope", ['"none"']),
        (
            ["--training", "1vsAll", "--regularizer", "l2", "--reg-weighted", "--reg-scope", "table"],
            "reg_scope",
            ["reg_weighted"],
        ),
    ],
)
def test_options_that_do_not_apply_exit_2_naming_them(kg, tmp_path, strata_cli, args, key, words):
    proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, *args, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"embed.train.{key}" in proc.stderr, proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_tail_corruption_trains_without_reciprocal_relations(kg, tmp_path, strata_cli):
    meta = summary(strata_cli, kg, tmp_path / "t", "--corrupt", "tail", "--no-reciprocal")
    assert meta["config"]["reciprocal"] is False and meta["test"]["tail_mrr"] > 0.1, meta["test"]


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_recipe_is_a_config_that_trains(recipe, kg, tmp_path, strata_cli):
    # The recipe's own options, on the small graph for one short epoch; 1vsAll and KvsAll take
    # no count of negatives.
    train = tomllib.loads(recipe.read_text())["embed"]["train"].get("training", "negative_sampling")
    small = SMALL if train == "negative_sampling" else [a for a in SMALL if a not in ("--negatives", "64")]
    args = ["--config", recipe, *small, "--epochs", "1", "--memory", "1G", "-q", "--json-summary"]
    meta = json.loads(strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *args).stdout)
    assert meta["history"] and meta["test"]["mrr"] > 0.0
