"""Faults in distributed graph analytics (docs/distributed.md, "Faults" of the analytics part):
a rank killed mid-run under ``torchrun --max-restarts 1``; the restarted group resumes from the
last iteration checkpoint every rank committed and ends with the single-process results.

The rank kills itself with SIGKILL at the fault point ``grid.dist.iter`` (``STRATA_FAULT=
rank1:grid.dist.iter@3``: after its third iteration, before that iteration's checkpoint; armed
only in torchrun's first attempt). With a checkpoint after every iteration, the last one
committed holds two iterations."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import needs
from strata.grid import run
from test_grid_dist import COMMON, RANK_MEMORY, _assert_same_results, store  # noqa: F401 (a fixture)
from torchrun_env import rank_env, run_session


def _torchrun(algorithm: str, grid_store, out, fault: str) -> subprocess.CompletedProcess:
    """``strata run ALGORITHM`` with two ranks under torchrun (``--standalone``: torchrun binds
    a free port itself), one restart allowed, ``fault`` armed and a checkpoint after every
    iteration. torchrun and its workers run in a session of their own, killed whole if they
    outlive the time limit."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "--max-restarts", "1",
        "-m", "strata", "run", algorithm, str(grid_store), "--out", str(out), "--dist-timeout", "60",
        "--memory", RANK_MEMORY, "--checkpoint-seconds", "0", *COMMON,
    ]  # fmt: skip
    env = rank_env() | {"STRATA_FAULT": fault}
    return run_session(cmd, env, timeout=300)


@pytest.mark.parametrize("algorithm", ["pagerank", "bfs", "kcore"])
def test_a_rank_killed_mid_run_resumes_from_the_last_checkpoint(store, tmp_path, algorithm):  # noqa: F811
    needs("torch")
    single = tmp_path / "single"
    run(algorithm=algorithm, store=store, out=single, threads=2, root=5, memory="256M")
    out = tmp_path / "two"
    proc = _torchrun(algorithm, store, out, "rank1:grid.dist.iter@3")
    log = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    # The fault fired (torchrun saw rank 1 die of SIGKILL), and both ranks of the new attempt
    # loaded the checkpoint after iteration 2, the last one committed before the kill.
    assert "exitcode: -9" in proc.stderr, log
    for rank in (0, 1):
        assert f"rank {rank}: resuming from the checkpoint after iteration 2" in proc.stdout + proc.stderr, log
    _assert_same_results(algorithm, single, out)
    record = json.loads((out / "run.json").read_text())
    for r in record["summary"]["dist"]["ranks"]:
        assert r["checkpoints"]["resumed_from"] == 2
        assert r["checkpoints"]["written"] > 0 and r["checkpoints"]["bytes"] > 0
    # Every iteration is in the history and the metrics once: the first two from the attempt
    # that died, the rest from the one that resumed.
    iterations = record["summary"]["iterations"]
    assert [h["iteration"] for h in record["history"]] == list(range(1, iterations + 1))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == list(range(1, iterations + 1))
    # A finished run leaves no checkpoints behind.
    assert not list(out.glob("checkpoint.rank-*"))
