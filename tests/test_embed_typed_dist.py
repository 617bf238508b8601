"""PyTorch-BigGraph's entity types under torchrun: two ranks train a typed graph (per-type
partitions, each side's negatives of its own type), every bucket once an epoch, with every type
partitioned or with types held whole all epoch (unpartitioned and featurized: the pinned
region, which every rank trains and the relation rounds keep identical), in float32 and bf16
tables, on the Rust engine and on the torch device step, with a shared run directory and in owner
mode.

One launch (tests/dist_runs.py) runs them all: a launch's start costs several times what a run
on this graph does."""

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
#: People in 3 partitions; films (bags of words) and genres held whole all epoch by every rank.
PINNED = ["--featurized", "film", "--entity-partitions", "person=3", "genre=1", "--buffer", "2"]


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[Path, Path]:
    """Two ranks on loopback train the typed graph for two epochs with every type partitioned
    (run ``typed``), with films and genres held whole (``pinned``; ``device`` on the torch
    device step's CPU twin; ``bf16`` and ``device-bf16`` in a bf16 table, whose pinned region
    the rounds sum in float32 and round back alike on both ranks; ``owners`` in owner mode, each
    rank keeping the pinned region in its own tables): the log folder (``dist_runs.result``) and
    the folder of the run directories."""
    needs("torch")
    d = tmp_path_factory.mktemp("typed-dist")
    store = d / "kg.strata"
    run_strata("convert", *typed_kg(d), "-o", store)
    runs = d / "runs"
    train = ["embed", "train", store, *COMMON, "--epochs", "2"]
    plan = [
        {"name": "typed", "argv": [*train, "--run-dir", runs / "typed", *PARTITIONED]},
        {"name": "pinned", "argv": [*train, "--run-dir", runs / "pinned", *PINNED]},
        {"name": "device", "argv": [*train, "--run-dir", runs / "device", *PINNED, "--device", "torch-cpu",
                                    "--negative-pool", "resident"]},
        {"name": "bf16", "argv": [*train, "--run-dir", runs / "bf16", *PINNED, "--table-dtype", "bf16"]},
        {"name": "device-bf16", "argv": [*train, "--run-dir", runs / "device-bf16", *PINNED, "--table-dtype", "bf16",
                                         "--device", "torch-cpu", "--negative-pool", "resident"]},
        {"name": "owners", "argv": [*train, "--run-dir", runs / "owners", *PINNED, "--dist-storage", "owners"]},
    ]  # fmt: skip
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        str(DRIVER), str(dist_runs.plan(d / "plan.json", d / "logs", plan)),
    ]  # fmt: skip
    proc = run_session(cmd, rank_env(), 600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return d / "logs", runs


@pytest.mark.parametrize("name", ["typed", "pinned", "device", "bf16", "device-bf16", "owners"])
def test_two_ranks_train_a_typed_graph(launch, strata_cli, name):
    logs, runs = launch
    for rank in (0, 1):
        rc, out, err = dist_runs.result(logs, name, rank)
        assert rc == 0, out[-2000:] + err[-4000:]
    run = runs / name
    if name == "owners":
        # Each rank's directory holds the partitions it owns and its copy of the pinned region;
        # gathered, they make one run.
        run = runs / "owners-gathered"
        run_strata("embed", "gather", run, runs / name / "rank-0", runs / name / "rank-1")
        regions = [_pinned_rows(d) for d in (runs / name / "rank-0", runs / name / "rank-1", run)]
        assert regions[0] == regions[1] == regions[2] and any(regions[0])
    meta = json.loads((run / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["current"]["epoch"] == 2
    for before, record in zip([None, *meta["history"][:-1]], meta["history"], strict=True):
        # Every bucket of the 3 x 3 grid once an epoch, by one rank or the other; each epoch
        # starts from the table the one before committed (the pinned region one more region
        # of it, its chain rank 0's).
        assert sum(r["buckets"] for r in record["ranks"]) == 9
        if before is not None:
            assert record["table_crc"]["start"] == before["table_crc"]["end"]
    assert meta["layout"]["dtype"] == ("bf16" if "bf16" in name else "f32")
    types = {t["name"]: t["partitioned"] for t in meta["partitioning"]["types"]}
    if name == "typed":
        check_epochs(run, 9)  # the committed file's CRC too (regions of one size)
        assert types == {"person": True, "film": True, "genre": True} and not meta["layout"].get("pinned")
    else:
        assert types == {"person": True, "film": False, "genre": False}
        assert meta["layout"]["pinned"]["region"] == 3
    test = json.loads(run_strata("embed", "eval", run, "--json", "--split", "test").stdout)["metrics"]
    # Answers ranked among their own type: 40 films, 4 genres, 60 people.
    assert test["mrr"] > 0.1, test
    # (person, likes, ?) answers are films: the type-aware ranking of a run both ranks trained.
    got = json.loads(
        strata_cli("embed", "predict", run, "--head", "p3", "--relation", "0", "--top", "8", "--json").stdout
    )
    assert {r["name"][0] for r in got["predictions"]} == {"f"}, got


def _pinned_rows(run: Path) -> bytes:
    """The bytes of the pinned region's rows and state in ``run``'s current table (regions are
    padded to 4 KiB)."""
    meta = json.loads((run / "run.json").read_text())
    layout, partitions = meta["layout"], meta["partitioning"]["partitions"]
    row_bytes = (layout["dim"] + layout["state_per_row"]) * 4
    part_bytes = -(-layout["rows"] * row_bytes // 4096) * 4096
    with open(run / meta["current"]["table"], "rb") as f:
        f.seek(partitions * part_bytes)
        return f.read(layout["pinned"]["rows"] * row_bytes)
