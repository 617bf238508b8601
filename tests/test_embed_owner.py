"""Owner mode (``dist_storage = owners``, docs/distributed.md): every rank keeps the partitions it
owns in its own run directory and ships them point-to-point; no directory is shared. Two ranks
on two hosts, each with its own copy of the store and its own run directory (in two network
namespaces joined by a veth pair where namespaces can be made; with negative banks, and rank 0's
validation and test checked against the gathered run's), three ranks on loopback, then
``strata embed gather`` and evaluation of the gathered run; a rank killed between the epoch's
prepare and its commit, and a rank that cannot reach a partition's owner."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest

from conftest import needs, run_strata
from netns import needs_netns, unavailable, veth_pair
from test_embed_dist import SMALL
from torchrun_env import free_port, rank_env, wait_all

PARTITIONS = 4
EPOCHS = 2
# Seconds any one wait on another rank may take, and a whole run: bounded so a hang fails.
TIMEOUT = 60
RUN_SECONDS = 300
TRAIN = ["--partitions", str(PARTITIONS), "--negative-pool", "resident", "--epochs", str(EPOCHS),
         "--dist-storage", "owners", "--dist-timeout", str(TIMEOUT), "--relation-sync-every", "2", *SMALL]  # fmt: skip


def _torchrun(nnodes: int, nproc: int, node_rank: int, endpoint: str, kg: Path, run: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
        "--node-rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--max-restarts", "0",
        "-m", "strata", "embed", "train", str(kg), "--run-dir", str(run), *TRAIN, *extra,
    ]  # fmt: skip


def _summary(meta: dict) -> list:
    """What every rank's history must agree on: rank 0's commits, whose floats went through
    JSON once more on the other ranks (equal to about 1e-15)."""
    return [
        (h["epoch"], h["partition_loads"], [r["buckets"] for r in h["ranks"]], pytest.approx(h["loss"], rel=1e-12))
        for h in meta["history"]
    ]


def _check_rank_dirs(dirs: list[Path]) -> None:
    """Each rank's own run: committed every epoch, the group's per-rank figures, every bucket
    trained once per epoch, and partition regions really moved between the ranks."""
    world = len(dirs)
    metas = [json.loads((d / "run.json").read_text()) for d in dirs]
    layout = metas[0]["layout"]
    region = -(-layout["rows"] * (layout["dim"] + layout["state_per_row"]) * 4 // 4096) * 4096
    for rank, meta in enumerate(metas):
        assert meta["world_size"] == world and meta["owner_rank"] == rank
        assert meta["current"]["epoch"] == EPOCHS and meta["current"] == metas[0]["current"]
        assert _summary(meta) == _summary(metas[0])
        assert not list(d for d in dirs[rank].iterdir() if d.name.startswith("prepared-e"))
    for record in metas[0]["history"]:
        ranks = record["ranks"]
        assert [r["rank"] for r in ranks] == list(range(world))
        assert sum(r["buckets"] for r in ranks) == PARTITIONS * PARTITIONS
        assert record["partition_loads"] == sum(r["partition_loads"] for r in ranks)
        assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in ranks)
        # Partitions of different owners meet in some bucket: at least one region crossed.
        assert sum(r["bytes_received"] for r in ranks) > region


def _gather_and_evaluate(dirs: list[Path], out: Path, epochs: int = EPOCHS) -> float:
    run_strata("embed", "gather", out, *dirs)
    meta = json.loads((out / "run.json").read_text())
    assert meta["current"]["epoch"] == epochs and "owner_rank" not in meta
    result = json.loads(run_strata("embed", "eval", out, "--json", "--split", "test").stdout)
    return result["metrics"]["mrr"]


def _check_streamed_evaluation(dirs: list[Path], gathered: Path) -> None:
    """Rank 0 validated every epoch and tested the best checkpoint by streaming the other
    ranks' partitions from them; evaluating the gathered run gives the very same metrics."""
    metas = [json.loads((d / "run.json").read_text()) for d in dirs]
    assert all(h["valid"] is not None for h in metas[0]["history"])
    test = metas[0]["test"]
    # The other ranks wrote rank 0's test metrics, which went through JSON once more.
    assert all(m["test"]["mrr"] == pytest.approx(test["mrr"], rel=1e-12) for m in metas[1:])
    fields = ["queries", "mrr", "mr", "hits@1", "hits@3", "hits@10", "tail_mrr", "head_mrr"]
    for split, checkpoint, want in [("valid", "last", metas[0]["history"][-1]["valid"]), ("test", "best", test)]:
        got = json.loads(
            run_strata("embed", "eval", gathered, "--json", "--split", split, "--checkpoint", checkpoint).stdout
        )["metrics"]
        assert [got[f] for f in fields] == [want[f] for f in fields], (split, got, want)


# 400 candidates: a random ranking has an MRR near 0.015; two epochs reach about 0.39.
MRR = 0.2


@pytest.fixture(scope="module")
def two_hosts(kg, tmp_path_factory) -> tuple[list[Path], list[Path], list[tuple[int, str, str]]]:
    """Two ranks started by hand as two machines start them, each on a host folder of its own
    with its own copy of the store and its own run directory: in two network namespaces joined
    by a veth pair where namespaces can be made, else on loopback. The `all` pool keeps
    negative banks (4 partitions, buffer 3), shared across the ranks. One run for the tests of
    separate directories and of namespaces: the hosts, their stores and each rank's
    (returncode, stdout, stderr)."""
    needs("torch")
    tmp = tmp_path_factory.mktemp("hosts")
    hosts = [tmp / "a", tmp / "b"]
    stores = [Path(shutil.copytree(kg, h / "store")) for h in hosts]
    port = free_port()
    with nullcontext() if unavailable() else veth_pair() as pair:
        procs = []
        for rank, (host, store) in enumerate(zip(hosts, stores, strict=True)):
            master, device = (pair[0].addr, pair[rank].device) if pair else ("127.0.0.1", "lo")
            env = rank_env(device) | {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": master,
                                      "MASTER_PORT": str(port)}  # fmt: skip
            env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
            argv = [sys.executable, "-m", "strata", "embed", "train", str(store), "--run-dir", str(host / "run"),
                    *TRAIN, "--negative-pool", "all"]  # fmt: skip
            procs.append(subprocess.Popen(pair[rank].wrap(argv) if pair else argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=env))  # fmt: skip
        results = wait_all(procs, RUN_SECONDS)
    return hosts, stores, results


def _finished(results: list[tuple[int, str, str]]) -> None:
    for rc, out, err in results:
        assert rc == 0, out[-3000:] + err[-6000:]


def test_two_ranks_with_separate_run_directories(two_hosts, tmp_path):
    hosts, _, results = two_hosts
    _finished(results)
    dirs = [hosts[0] / "run" / "rank-0", hosts[1] / "run" / "rank-1"]
    assert not (hosts[0] / "run" / "rank-1").exists() and not (hosts[1] / "run" / "rank-0").exists()
    _check_rank_dirs(dirs)
    # A rank's directory alone is not a run to evaluate: the error names the command.
    proc = run_strata("embed", "eval", dirs[0], check=False)
    assert proc.returncode != 0 and "strata embed gather" in proc.stderr, proc.stderr[-2000:]
    assert _gather_and_evaluate(dirs, tmp_path / "gathered") > MRR
    _check_streamed_evaluation(dirs, tmp_path / "gathered")


def test_three_ranks_on_loopback(kg, tmp_path):
    needs("torch")
    run = tmp_path / "run"
    # With the lookahead on, each rank's mover fetches its next grant's partitions from their
    # owners while it trains.
    proc = subprocess.run(
        _torchrun(1, 3, 0, f"127.0.0.1:{free_port()}", kg, run, "--dist-prefetch"),
        capture_output=True, text=True, timeout=RUN_SECONDS, env=rank_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    dirs = [run / f"rank-{r}" for r in range(3)]
    _check_rank_dirs(dirs)
    assert _gather_and_evaluate(dirs, tmp_path / "gathered") > MRR


@needs_netns
def test_two_ranks_in_two_network_namespaces(two_hosts):
    """The run of the test above, whose ranks met across the veth pair: each read its own copy
    of the store (that test gathers and evaluates the run)."""
    hosts, stores, results = two_hosts
    _finished(results)
    dirs = [hosts[0] / "run" / "rank-0", hosts[1] / "run" / "rank-1"]
    metas = [json.loads((d / "run.json").read_text()) for d in dirs]
    assert [Path(m["store"]) for m in metas] == [s.resolve() for s in stores]
    _check_rank_dirs(dirs)


def _two_ranks(kg: Path, run: Path, epochs: int, fault: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        _torchrun(1, 2, 0, f"127.0.0.1:{free_port()}", kg, run, "--epochs", str(epochs)),
        capture_output=True, text=True, timeout=RUN_SECONDS, env=rank_env() | {"STRATA_FAULT": fault},
    )  # fmt: skip


#: Rank 1's third run.json commit, about to be written: rank 0's commit of epoch 2 (the first
#: is the join's, the second epoch 1's), after the prepare barrier and rank 0's own commit.
BEFORE_ADOPTING_EPOCH_2 = "rank1:embed.checkpoint_written@3"


def test_a_rank_one_epoch_behind_adopts_the_epoch_it_prepared(kg, tmp_path):
    """Rank 1 killed as it writes rank 0's commit of epoch 2: its run.json at epoch 1, its
    complete table and relations of epoch 2 with prepared-e2, while rank 0 committed epoch 2.
    The next launch adopts epoch 2 on rank 1 and goes on."""
    needs("torch")
    run = tmp_path / "run"
    proc = _two_ranks(kg, run, 2, BEFORE_ADOPTING_EPOCH_2)
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    behind = run / "rank-1"
    leader = json.loads((run / "rank-0" / "run.json").read_text())["current"]
    assert leader["epoch"] == 2, proc.stderr[-6000:]
    assert json.loads((behind / "run.json").read_text())["current"]["epoch"] == 1, proc.stderr[-6000:]
    assert json.loads((behind / "prepared-e2").read_text()) == leader
    saved = {name: (behind / name).read_bytes() for name in ("run.json", "relations-e1.npy", "relation_state-e1.npy")}
    # Without adopting, rank 1 (epoch 1) and rank 0 (epoch 2) could not resume together.
    proc = _two_ranks(kg, run, 3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    metas = [json.loads((run / f"rank-{r}" / "run.json").read_text()) for r in range(2)]
    assert [m["current"]["epoch"] for m in metas] == [3, 3]
    assert [h["epoch"] for h in metas[1]["history"]] == [1, 2, 3]
    assert _summary(metas[0]) == _summary(metas[1])
    assert _gather_and_evaluate([run / "rank-0", behind], tmp_path / "gathered", 3) > MRR
    # A rank directory from another point of the run (two epochs behind) is refused, naming both.
    for name, data in saved.items():
        (behind / name).write_bytes(data)
    proc = subprocess.run(
        _torchrun(1, 2, 0, f"127.0.0.1:{free_port()}", kg, run, "--epochs", "4"),
        capture_output=True, text=True, timeout=RUN_SECONDS, env=rank_env(),
    )  # fmt: skip
    assert proc.returncode != 0
    assert "rank 1 cannot resume" in proc.stderr and "rank 0's at epoch 3" in proc.stderr, proc.stderr[-3000:]


RANK_SCRIPT = """
import os, sys
from datetime import timedelta
from strata.embed import dist, dist_owner
from strata.errors import GroupError
group = dist.from_environment(3)
owners = dist_owner.Owners(group)
if group.rank == 1:
    code = 0
    try:
        owners.read(0, 0, False, 4096)
    except GroupError as e:
        print(e, file=sys.stderr, flush=True)
        code = 3
    group.store.set("rank 1 done", "")
    # The timed-out receive is still posted in gloo; leave without running its destructors.
    os._exit(code)
# Rank 0 owns partition 0 but never serves an epoch: its server cannot answer. It keeps the
# store it hosts up until rank 1 is done with it.
group.store.wait(["rank 1 done"], timedelta(seconds=240))
"""


def test_a_rank_that_cannot_reach_a_partition_owner_names_it(tmp_path):
    """Rank 1 asks rank 0 for partition 0, which rank 0 never serves: rank 1 fails within
    dist_timeout naming the owner's rank and address and what timed out."""
    needs("torch")
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=rank_env() | {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                       "MASTER_PORT": port})
        for r in range(2)
    ]  # fmt: skip
    _, (rc1, _, err1) = wait_all(procs, RUN_SECONDS)
    assert rc1 == 3, err1[-3000:]
    assert "rank 0 at 127.0.0.1" in err1 and "within 3 s" in err1 and "reading partition 0" in err1, err1
