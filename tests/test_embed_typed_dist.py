"""PyTorch-BigGraph's entity types under torchrun: two ranks train a typed graph whose types are
all partitioned (per-type partitions, each side's negatives of its own type), every bucket once
an epoch, and a type held whole all epoch (unpartitioned) is refused naming the option.

One launch (tests/dist_runs.py) runs both: a launch's start costs several times what a run on
this graph does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import dist_runs
from conftest import TESTS, needs, run_strata
from test_embed_dist import check_epochs
from torchrun_env import free_port, rank_env, run_session
from typed_kg import typed_kg

#: What each rank of the launch runs: several `strata` commands one after another.
DRIVER = TESTS / "dist_runs.py"
COMMON = ["--dim", "16", "--chunk-size", "100", "--negatives", "32", "--threads", "1", "--dist-timeout", "60", "-q"]
#: Every type in 3 partitions (the 4 genres too): 9 buckets an epoch.
PARTITIONED = ["--entity-partitions", "person=3", "film=3", "genre=3", "--buffer", "2"]


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[Path, Path]:
    """Two ranks on loopback train the typed graph for two epochs with every type partitioned
    (run ``typed``; ``device`` on the torch device step's CPU twin), then try a run whose
    genres are unpartitioned (``pinned``): the log folder (``dist_runs.result``) and the folder
    of the run directories."""
    needs("torch")
    d = tmp_path_factory.mktemp("typed-dist")
    store = d / "kg.strata"
    run_strata("convert", *typed_kg(d), "-o", store)
    runs = d / "runs"
    train = ["embed", "train", store, *COMMON, "--epochs", "2"]
    plan = [
        {"name": "typed", "argv": [*train, "--run-dir", runs / "typed", *PARTITIONED]},
        {"name": "device", "argv": [*train, "--run-dir", runs / "device", *PARTITIONED, "--device", "torch-cpu",
                                    "--negative-pool", "resident"]},
        {"name": "pinned", "argv": [*train, "--run-dir", runs / "pinned", "--entity-partitions", "person=2",
                                    "film=2", "genre=1"]},
    ]  # fmt: skip
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        str(DRIVER), str(dist_runs.plan(d / "plan.json", d / "logs", plan)),
    ]  # fmt: skip
    proc = run_session(cmd, rank_env(), 600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return d / "logs", runs


@pytest.mark.parametrize("name", ["typed", "device"])
def test_two_ranks_train_a_graph_whose_types_are_all_partitioned(launch, strata_cli, name):
    logs, runs = launch
    for rank in (0, 1):
        rc, out, err = dist_runs.result(logs, name, rank)
        assert rc == 0, out[-2000:] + err[-4000:]
    run = runs / name
    # Every bucket of the 3 x 3 grid once an epoch, by one rank or the other; the commit chain.
    meta = check_epochs(run, 9)
    types = {t["name"]: t["partitioned"] for t in meta["partitioning"]["types"]}
    assert types == {"person": True, "film": True, "genre": True} and meta["partitioning"]["partitions"] == 3
    assert "pinned" not in meta["layout"] or meta["layout"]["pinned"] is None
    test = json.loads(run_strata("embed", "eval", run, "--json", "--split", "test").stdout)["metrics"]
    # Answers ranked among their own type: 40 films, 4 genres, 60 people.
    assert test["mrr"] > 0.1, test
    # (person, likes, ?) answers are films: the type-aware ranking of a run both ranks trained.
    got = json.loads(
        strata_cli("embed", "predict", run, "--head", "p3", "--relation", "0", "--top", "8", "--json").stdout
    )
    assert {r["name"][0] for r in got["predictions"]} == {"f"}, got


def test_a_type_held_whole_all_epoch_is_refused_under_torchrun(launch):
    logs, runs = launch
    # Rank 0 plans the run and refuses it, naming the option, the type and what to set; rank 1,
    # waiting for the run rank 0 makes, stops and points to rank 0.
    rc, out, err = dist_runs.result(logs, "pinned", 0)
    assert rc == 2 and "Traceback" not in err, out[-2000:] + err[-4000:]
    assert "embed.train.entity_partitions" in err and '"genre" is not partitioned' in err, err
    assert "genre=2" in err, err
    rc, out, err = dist_runs.result(logs, "pinned", 1)
    assert rc not in (0, None) and "rank 0" in err and "Traceback" not in err, out[-2000:] + err[-4000:]
    assert not (runs / "pinned" / "run.json").exists()
