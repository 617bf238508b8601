"""Faults in distributed embedding training (docs/distributed.md, "Faults"): a rank killed
under ``torchrun --max-restarts 1`` mid-epoch or between the epoch's prepare and its commit; the
restarted group resumes from the last epoch every rank committed, never a mix of epochs (a rank
whose peer never arrives is in test_embed_dist.py).

The rank kills itself with SIGKILL at a fault point (``STRATA_FAULT=rankR:POINT@N``, armed only
in torchrun's first attempt). The consistency check is the table CRC-32s each distributed epoch
records: the table an epoch started from must be the one the epoch before committed, and the
last committed table file must hold what the ranks wrote."""

from __future__ import annotations

import itertools
import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from conftest import needs, run_strata
from test_embed_dist import SMALL
from torchrun_env import rank_env, run_session

#: The faults strike in epoch 2; the run then trains no further than that epoch.
EPOCHS = 2
PARTITIONS = 4
#: Not quiet: the test reads rank 0's "resuming" line.
OPTIONS = [a for a in SMALL if a != "-q"]


def torchrun(kg: Path, run: Path, fault: str, max_restarts: int, *extra: str) -> subprocess.CompletedProcess:
    """Trains ``run`` with two ranks under torchrun on loopback, ``fault`` armed, with the
    ``extra`` options of ``strata embed train``. ``--standalone``
    lets torchrun bind a free port itself (a port picked here could be taken by another test's
    process before torchrun binds it). torchrun and its workers run in a session of their own,
    killed whole if they outlive the time limit."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "--max-restarts", str(max_restarts),
        "-m", "strata", "embed", "train", str(kg), "--run-dir", str(run), "--partitions", str(PARTITIONS),
        "--negative-pool", "resident", "--epochs", str(EPOCHS), "--dist-timeout", "60",
        "--relation-sync-every", "2", *OPTIONS, *extra,
    ]  # fmt: skip
    env = rank_env() | {"STRATA_FAULT": fault}
    return run_session(cmd, env, timeout=400)


def table_crc(run: Path, meta: dict) -> str:
    """The CRC-32 of the committed table file as run.json's ``table_crc`` defines it: of the
    partitions' CRC-32s (each over its 4 KiB-aligned region) as little-endian words."""
    layout = meta["layout"]
    part_bytes = -(-layout["rows"] * (layout["dim"] + layout["state_per_row"]) * 4 // 4096) * 4096
    data = (run / meta["current"]["table"]).read_bytes()
    parts = meta["partitioning"]["partitions"]
    assert len(data) >= parts * part_bytes
    crcs = [zlib.crc32(data[p * part_bytes : (p + 1) * part_bytes]) for p in range(parts)]
    return f"{zlib.crc32(struct.pack(f'<{parts}I', *crcs)):08x}"


def assert_one_table_per_epoch(run: Path, logs: Path | None = None) -> dict:
    """Each epoch is in run.json and the metrics log (of ``logs``, default ``run``) once, every
    bucket trained once, and each epoch started from the table the one before committed; the
    file holds the last one."""
    meta = json.loads((run / "run.json").read_text())
    history = meta["history"]
    assert meta["current"]["epoch"] == EPOCHS and [h["epoch"] for h in history] == list(range(1, EPOCHS + 1))
    lines = ((logs or run) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(1, EPOCHS + 1))
    for h in history:
        assert [r["rank"] for r in h["ranks"]] == [0, 1]
        assert sum(r["buckets"] for r in h["ranks"]) == PARTITIONS * PARTITIONS
        assert "holdings" not in h["ranks"][0]
    for before, after in itertools.pairwise(history):
        assert after["table_crc"]["start"] == before["table_crc"]["end"], (before["epoch"], after["epoch"])
    assert table_crc(run, meta) == history[-1]["table_crc"]["end"]
    return meta


@pytest.mark.parametrize(
    "fault",
    [
        # Rank 0 dies after every rank prepared epoch 2 (its table complete and synced) and
        # before it commits: the worst point, a whole uncommitted table that must not be used.
        # (Rank 1 dying right after training its second bucket of epoch 2, when both ranks have
        # written partitions to epoch 2's table, which no commit names, is the fault of the
        # test below and of test_dist_restart_netns.py's embedding restart under torchrun.)
        "rank0:embed.dist.e2.prepared",
    ],
)
def test_a_rank_killed_under_torchrun_resumes_from_the_last_commit(kg, tmp_path, fault):
    needs("torch")
    run = tmp_path / "run"
    proc = torchrun(kg, run, fault, max_restarts=1)
    log = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    # The fault fired (torchrun saw a worker die of SIGKILL) and the new attempt reopened the
    # run after epoch 1, the last epoch every rank committed.
    assert "exitcode: -9" in proc.stderr, log
    assert "resuming" in proc.stderr and "after epoch 1" in proc.stderr, log
    assert_one_table_per_epoch(run)
    out = run_strata("embed", "eval", run, "--json", "--split", "test").stdout
    # 400 candidates: a random ranking has an MRR near 0.015; two clean epochs give about 0.4.
    assert json.loads(out)["metrics"]["mrr"] > 0.2


def test_owner_mode_a_rank_killed_mid_epoch_resumes_from_the_last_commit(kg, tmp_path):
    """Owner mode (no shared directory): rank 1 dies mid-epoch 2 after both ranks wrote
    partitions to their own epoch-2 tables; the restarted group resumes after epoch 1 in each
    rank's directory, and the table gathered from the owners is the one the last commit recorded."""
    needs("torch")
    run = tmp_path / "run"
    proc = torchrun(kg, run, "rank1:embed.dist.e2.bucket@2", 1, "--dist-storage", "owners")
    log = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    assert "exitcode: -9" in proc.stderr and "after epoch 1" in proc.stderr, log
    for rank in (0, 1):
        meta = json.loads((run / f"rank-{rank}" / "run.json").read_text())
        assert meta["current"]["epoch"] == EPOCHS, rank
    gathered = tmp_path / "gathered"
    run_strata("embed", "gather", gathered, run / "rank-0", run / "rank-1")
    assert_one_table_per_epoch(gathered, logs=run / "rank-0")
    out = run_strata("embed", "eval", gathered, "--json", "--split", "test").stdout
    assert json.loads(out)["metrics"]["mrr"] > 0.2


def test_without_restarts_the_run_stays_at_its_last_commit_and_resumes_later(kg, tmp_path):
    needs("torch")
    run = tmp_path / "run"
    proc = torchrun(kg, run, "rank1:embed.dist.e2.started", max_restarts=0)
    assert proc.returncode != 0 and "exitcode: -9" in proc.stderr, proc.stderr[-6000:]
    meta = json.loads((run / "run.json").read_text())
    assert meta["current"]["epoch"] == 1
    # A copy whose committed table no longer holds what epoch 1 wrote (a bit flipped in each
    # word of partition 0's first row): rank 0 refuses to commit an epoch trained from it.
    tampered = tmp_path / "tampered"
    shutil.copytree(run, tampered)
    with open(tampered / meta["current"]["table"], "r+b") as f:
        row = bytearray(f.read(64))
        f.seek(0)
        f.write(bytes(b ^ 1 if i % 4 == 0 else b for i, b in enumerate(row)))
    proc = torchrun(kg, tampered, "", max_restarts=0)
    assert proc.returncode != 0 and "refusing to commit a mix of epochs" in proc.stderr, proc.stderr[-6000:]
    assert json.loads((tampered / "run.json").read_text())["current"]["epoch"] == 1
    # A new launch (no fault) on the run itself resumes from epoch 1 and finishes.
    proc = torchrun(kg, run, "", max_restarts=0)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert_one_table_per_epoch(run)
