"""Faults in distributed graph analytics (docs/distributed.md, "Faults" of the analytics part):
a rank killed mid-run under ``torchrun --max-restarts``; the restarted group resumes from the
last iteration checkpoint every rank committed and ends with the single-process results.

One launch of two ranks runs PageRank, BFS and k-core one after another (tests/dist_runs.py),
with a checkpoint after every iteration. In attempt K of the group, rank 1 kills itself with
SIGKILL in the K-th run once its third iteration is reported, before that iteration's
checkpoint (where the fault point ``grid.dist.iter@3`` of ``STRATA_FAULT`` would kill it); the
restarted ranks skip the runs they finished, so the killed run resumes first. The last
checkpoint committed before each kill holds two iterations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import dist_runs
from conftest import TESTS, needs
from strata.grid import run
from test_grid_dist import RANK_MEMORY, _assert_same_results, own_args, own_options, store  # noqa: F401 (a fixture)
from torchrun_env import rank_env, run_session

ALGORITHMS = ["pagerank", "bfs", "kcore"]


@pytest.fixture(scope="module")
def restarted(store, tmp_path_factory) -> tuple[Path, str]:  # noqa: F811
    """The launch (``--standalone``: torchrun binds a free port itself; one restart per run
    killed) in a session of its own, killed whole if it outlives the time limit. Returns the
    folder of the runs' logs (run NAME's results are in ``out/NAME`` beside it) and torchrun's
    stderr."""
    needs("torch")
    d = tmp_path_factory.mktemp("faults")
    runs = [
        {"name": alg, "argv": ["run", alg, store, "--out", d / "out" / alg, "--dist-timeout", "60",
                               "--memory", RANK_MEMORY, "--checkpoint-seconds", "0", *own_args(alg)],
         "kill": {"rank": 1, "attempt": k, "function": "strata.grid:iteration_metrics", "call": 3}}
        for k, alg in enumerate(ALGORITHMS)
    ]  # fmt: skip
    logs = d / "logs"
    plan = dist_runs.plan(d / "plan.json", logs, runs)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "--max-restarts", str(len(ALGORITHMS)), str(TESTS / "dist_runs.py"), str(plan),
    ]  # fmt: skip
    proc = run_session(cmd, rank_env(), 900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # torchrun saw rank 1 die of SIGKILL once per run.
    assert proc.stderr.count("exitcode: -9") >= len(ALGORITHMS), proc.stderr[-6000:]
    return logs, proc.stderr


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_rank_killed_mid_run_resumes_from_the_last_checkpoint(store, restarted, tmp_path, algorithm):  # noqa: F811
    logs, _ = restarted
    single = tmp_path / "single"
    run(algorithm=algorithm, store=store, out=single, memory="256M", **own_options(algorithm))
    out = logs.parent / "out" / algorithm
    # Both ranks of the attempt after the kill loaded the checkpoint after iteration 2, the last
    # one committed before it.
    for rank in (0, 1):
        rc, stdout, stderr = dist_runs.result(logs, algorithm, rank)
        log = stdout[-3000:] + stderr[-6000:]
        assert rc == 0, log
        assert f"rank {rank}: resuming from the checkpoint after iteration 2" in stdout + stderr, log
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
