"""The learning-rate schedule and early stopping under torchrun: rank 0 decides at each
validation and every rank follows its commit, so the group trains every epoch at one rate and
stops after the same epoch (a rank that went on alone would wait on the others until its
timeout); and the recipes' step options (dropout, weighted N3, reciprocal relations) in a
group. One launch trains with both, each test checks its part."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import needs, run_strata
from test_embed_dist import train_two_ranks


@pytest.fixture(scope="module")
def scheduled_run(kg, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """Two ranks with the recipes' step options under a plateau schedule that drops the rate at
    every validation after the first and stops two epochs after the best: the finished launch
    and its run directory."""
    needs("torch")
    run = tmp_path_factory.mktemp("scheduled") / "run"
    proc = train_two_ranks(
        kg, run, "--partitions", "4", "--epochs", "5", "--dist-timeout", "60", "--lr", "0.1",
        "--lr-scheduler", "reduce_on_plateau", "--lr-patience", "0", "--lr-threshold", "10",
        "--early-stopping-threshold-epochs", "2", "--early-stopping-threshold-mrr", "0.99",
        "--entity-dropout", "0.2", "--relation-dropout", "0.1", "--regularizer", "n3", "--reg-weighted",
        "--reg-weight", "0.01", "--relation-reg-weight", "0.02",
    )  # fmt: skip
    return proc, run


def test_two_ranks_follow_rank_0s_schedule_and_stop_together(scheduled_run):
    proc, run = scheduled_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    meta = json.loads((run / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["current"]["epoch"] == 3
    hist = meta["history"]
    # No MRR is 11 times the best: every validation after the first drops the rate.
    assert [h["lr"] for h in hist] == [0.1, 0.1, 0.010000000000000002]
    assert [h.get("lr_dropped_to") for h in hist] == [None, 0.010000000000000002, 0.0010000000000000002]
    assert "early_stopping_threshold_mrr" in hist[-1]["stopped"]
    assert all(len(h["ranks"]) == 2 for h in hist)
    # Rank 1 printed its epochs and went no further than rank 0's stop.
    assert "epoch 4/" not in proc.stderr


def test_two_ranks_train_with_the_recipes_step_options(scheduled_run):
    # The recipes' options under torchrun: every rank's chunks take dropout and weighted N3,
    # and head queries are answered through the inverse rows both ranks trained (reciprocal).
    proc, run = scheduled_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    meta = json.loads((run / "run.json").read_text())
    cfg = meta["config"]
    assert meta["world_size"] == 2 and meta["current"]["epoch"] == 3
    assert (cfg["entity_dropout"], cfg["relation_dropout"]) == (pytest.approx(0.2), pytest.approx(0.1))
    assert cfg["reg_weighted"] is True and cfg["reciprocal"] is True
    assert all(len(h["ranks"]) == 2 for h in meta["history"])
    test = json.loads(run_strata("embed", "eval", run, "--json", "--split", "test").stdout)["metrics"]
    # 400 candidates: a random ranking has an MRR near 0.015.
    assert test["head_mrr"] > 0.05 and test["tail_mrr"] > 0.05, test
