"""Data-parallel GNN training (docs/distributed.md, "GNN training"): the seed split, the loaders'
rank and world size, `strata gnn train` under torchrun with two ranks on loopback, in two network
namespaces, and across a torchrun restart, and the DDP example script with a stock PyG model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dist_runs
from conftest import REPO, needs, run_strata, symmetric_sbm_store
from netns import needs_netns, veth_pair
from strata import torchrun
from strata.errors import ConfigError
from strata.gnn.loader import shard
from torchrun_env import free_port, rank_env, run_session

SMALL = ["--model", "sage", "--fanouts", "5,5", "--batch-size", "64", "--hidden", "32", "--device", "cpu",
         "--torch-threads", "1", "--dist-timeout", "60", "-q"]  # fmt: skip


@pytest.fixture(scope="module")
def sbm(tmp_path_factory) -> Path:
    """A labelled SBM graph (2000 nodes, 4 communities, 16 float32 features) as a store."""
    return symmetric_sbm_store(tmp_path_factory.mktemp("sbm"), nodes=2000, classes=4, dim=16, avg_degree=10)


def test_shards_are_equal_and_cover_every_item():
    for n in (0, 1, 5, 64, 1001):
        items = np.arange(100, 100 + n)
        for world in (1, 2, 3, 7):
            padded = [shard(items, r, world, epoch=3, seed=9) for r in range(world)]
            assert len({len(p) for p in padded}) == 1, (n, world)
            assert set(np.concatenate(padded).tolist()) == set(items.tolist())
            exact = [shard(items, r, world, epoch=3, seed=9, pad=False) for r in range(world)]
            assert sorted(np.concatenate(exact).tolist()) == items.tolist()
            assert max(map(len, exact)) - min(map(len, exact)) <= 1
    items = np.arange(1000)
    # One permutation per (seed, epoch), the same on every rank; another the next epoch.
    assert not np.array_equal(shard(items, 0, 2, epoch=0), shard(items, 0, 2, epoch=1))
    assert np.array_equal(shard(items, 1, 2, epoch=4, seed=2), shard(items, 1, 2, epoch=4, seed=2))
    edges = np.stack([np.arange(10), np.arange(10) + 50])
    share = shard(edges, 1, 3, epoch=0)
    assert share.shape == (2, 4) and np.array_equal(share[1] - share[0], np.full(4, 50))
    with pytest.raises(ValueError, match="rank 2 is outside"):
        shard(items, 2, 2)


def test_torchrun_environment():
    assert torchrun.environment({}) is None
    assert torchrun.environment({"WORLD_SIZE": "1", "RANK": "0"}) is None
    env = torchrun.environment(
        {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    )
    assert (env.rank, env.world_size, env.local_rank, env.address) == (3, 4, 1, "10.0.0.1:29500")
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        torchrun.environment({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"})
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        torchrun.environment(
            {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
        )
    # Outside a group there is no earlier attempt.
    assert torchrun.attempt() == 0


def test_loaders_split_an_epoch_across_ranks(sbm):
    needs("torch")
    from strata.gnn import LinkLoader, NodeLoader

    loaders = [NodeLoader(sbm, fanouts=[3], batch_size=50, rank=r, world_size=2, seed=5) for r in range(2)]
    train = loaders[0].data.nodes("train").tolist()
    for _ in range(2):
        epoch = [[b.seeds.tolist() for b in loader] for loader in loaders]
        per_rank = -(-len(train) // 2)
        assert len(epoch[0]) == len(epoch[1]) == -(-per_rank // 50)
        seen = [s for batches in epoch for b in batches for s in b]
        assert set(seen) == set(train) and len(seen) == len(train) + len(train) % 2
    links = [LinkLoader(sbm, fanouts=[3], batch_size=100, rank=r, world_size=3) for r in range(3)]
    counts = [sum(b.edge_label_index.shape[1] // 2 for b in loader) for loader in links]
    assert len(set(counts)) == 1 and counts[0] >= links[0].edges.shape[1] // 3
    with pytest.raises(ValueError, match="give both"):
        NodeLoader(sbm, fanouts=[3], rank=1)
    with pytest.raises(ValueError, match="outside"):
        NodeLoader(sbm, fanouts=[3], rank=2, world_size=2)


def _torchrun(*args, nproc: int = 2, restarts: int = 0, rendezvous=None) -> list[str]:
    """torchrun running ``args`` in ``nproc`` ranks; by default one machine's group meeting on
    loopback at a free port."""
    rendezvous = rendezvous or ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *rendezvous,
        "--max-restarts", str(restarts), *map(str, args),
    ]  # fmt: skip


def _check_group_record(record: dict, split_sizes: dict, world: int = 2) -> None:
    assert record["world_size"] == world
    for rec in record["history"]:
        ranks = rec["ranks"]
        assert [r["rank"] for r in ranks] == list(range(world))
        # Every rank trains the same number of batches of an epoch, and the seeds cover the split.
        assert len({r["batches"] for r in ranks}) == 1 and ranks[0]["batches"] > 0
        assert len({r["seeds"] for r in ranks}) == 1
        assert split_sizes["train"] <= sum(r["seeds"] for r in ranks) < split_sizes["train"] + world
        assert all(r["seeds_per_second"] > 0 and 0 <= r["data_wait_fraction"] <= 1 for r in ranks)
        # Validation is scored over the whole split, each node once, summed over the ranks.
        assert rec["valid"]["nodes"] == split_sizes["valid"]
    assert record["test"]["nodes"] == split_sizes["test"]
    assert [r["rank"] for r in record["ranks"]] == list(range(world))
    assert all(r["seeds_per_second"] > 0 and r["resident_peak_bytes"] > 0 for r in record["ranks"])


def _split_sizes(store: Path) -> dict:
    from strata.store import Store

    s = Store(store)
    return {name: len(s.node_split(name)) for name in ("train", "valid", "test")}


#: Epochs of the run whose rank 1 is killed, and the call of ``train_epoch`` (the epoch) at
#: whose start it is: rank 0 wrote the checkpoint after epoch 2 before the third epoch's first
#: step, which rank 1 took part in.
RESTART_EPOCHS, KILLED_AT_EPOCH = 5, 4


@pytest.fixture(scope="module")
def loopback(sbm, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One torchrun launch (one restart allowed) of two ranks on loopback whose ranks train, one
    after another (tests/dist_runs.py): 3 epochs on the native data path with a JSON summary
    (``native``); 2 epochs on the device data path's CPU twin (``device``); RESTART_EPOCHS
    epochs without validation (``restart``), in whose first attempt rank 1 kills itself with
    SIGKILL as epoch KILLED_AT_EPOCH begins, so that torchrun restarts the group, whose ranks
    skip the runs they finished and resume this one. Returns the folder of their logs
    (``dist_runs.result``; run NAME's run directory is ``NAME`` beside it) and torchrun's
    completed process."""
    needs("torch")
    d = tmp_path_factory.mktemp("loopback")
    train = ["gnn", "train", sbm, "--run-dir"]
    kill = {"rank": 1, "attempt": 0, "function": "strata.gnn.train:train_epoch", "call": KILLED_AT_EPOCH}
    runs = [
        {"name": "native", "argv": [*train, d / "native", "--epochs", "3", "--json-summary", *SMALL]},
        {"name": "device", "argv": [*train, d / "device", "--epochs", "2", "--data-path", "device",
                                    "--device-memory", "64K", *SMALL]},
        {"name": "restart", "argv": [*train, d / "restart", "--epochs", RESTART_EPOCHS, "--eval-every", "0", *SMALL],
         "kill": kill},
    ]  # fmt: skip
    logs = d / "logs"
    plan = dist_runs.plan(d / "plan.json", logs, runs)
    proc = run_session(_torchrun(REPO / "tests" / "dist_runs.py", plan, restarts=1), rank_env(), 900)
    return logs, proc


def _trained(loopback, name: str) -> str:
    """Run ``name``'s stdout on rank 0, once both ranks succeeded."""
    logs, proc = loopback
    assert dist_runs.result(logs, name, 0)[0] is not None, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = [dist_runs.result(logs, name, r) for r in (0, 1)]
    for rc, out, err in results:
        assert rc == 0, out[-3000:] + err[-6000:]
    return results[0][1]


def test_two_ranks_under_torchrun_train_and_reduce_accuracy(sbm, loopback):
    stdout = _trained(loopback, "native")
    run = loopback[0].parent / "native"
    record = json.loads((run / "run.json").read_text())
    # Only rank 0 prints the summary; it is the record rank 0 wrote.
    assert json.loads(stdout)["history"] == record["history"]
    assert not dist_runs.result(loopback[0], "native", 1)[1].strip()
    _check_group_record(record, _split_sizes(sbm))
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert (run / "best.pt").exists() and (run / "resume.pt").exists()
    # 4 planted communities: chance is about 0.25.
    assert record["test"]["accuracy"] > 0.6, record["test"]


def test_two_ranks_train_on_the_device_data_path_s_cpu_twin(sbm, loopback):
    # The device path under torchrun: each rank samples and serves its own share through the
    # device sampler and cache (on a GPU each on its LOCAL_RANK device; here their CPU twin).
    _trained(loopback, "device")
    record = json.loads((loopback[0].parent / "device" / "run.json").read_text())
    _check_group_record(record, _split_sizes(sbm))
    assert record["data_path"] == "device" and record["feature_reads"]["path"] == "engine"
    assert all(rec["pipeline"]["sampler"] == "device" for rec in record["history"])
    assert record["test"]["accuracy"] > 0.6, record["test"]


@needs_netns
def test_two_ranks_in_two_namespaces_each_with_its_own_store(sbm, tmp_path):
    needs("torch")
    port = free_port()
    with veth_pair() as (a, b):
        procs = []
        for node, ns in enumerate((a, b)):
            # Each host reads its own copy of the store.
            store = shutil.copytree(sbm, tmp_path / f"host{node}" / "sbm.strata")
            # Static rendezvous: node 0 (namespace a) hosts the store both ranks meet at.
            rendezvous = [
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--master-addr",
                a.addr,
                "--master-port",
                str(port),
            ]
            cmd = _torchrun("-m", "strata", "gnn", "train", store, "--run-dir", tmp_path / f"host{node}" / "run",
                            "--epochs", "2", *SMALL, nproc=1, rendezvous=rendezvous)  # fmt: skip
            procs.append(
                subprocess.Popen(
                    ns.wrap(cmd),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=rank_env(ns.device),
                    cwd=REPO,
                )
            )
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=300))
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
        for p, (out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, out[-2000:] + err[-5000:]
    record = json.loads((tmp_path / "host0" / "run" / "run.json").read_text())
    _check_group_record(record, _split_sizes(sbm))
    # Rank 1's host keeps no run directory: rank 0 writes it.
    assert not (tmp_path / "host1" / "run").exists()


def test_a_killed_rank_restarts_and_the_run_resumes_after_the_last_epoch(loopback):
    logs, proc = loopback
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    assert "exitcode: -9" in proc.stderr, proc.stderr[-5000:]
    _trained(loopback, "restart")
    run = logs.parent / "restart"
    record = json.loads((run / "run.json").read_text())
    assert record["restarts"] == 1 and 2 <= record["resumed_after_epoch"] < RESTART_EPOCHS
    assert [r["epoch"] for r in record["history"]] == list(range(1, RESTART_EPOCHS + 1))
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == list(range(1, RESTART_EPOCHS + 1))


def test_the_ddp_example_trains_a_pyg_model_on_two_ranks(sbm, tmp_path):
    needs("torch")
    needs("torch_geometric")
    out = tmp_path / "epochs.json"
    # With split features: the user's loaders fetch the other rank's rows over RPC.
    cmd = _torchrun(REPO / "examples" / "ddp_pyg.py", sbm, "--epochs", "3", "--batch-size", "128",
                    "--features", "split", "--out", out)  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=rank_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["features"] == "split"
    for epoch in result["epochs"]:
        assert len(set(epoch["batches"])) == 1 and epoch["batches"][0] > 0
    assert result["epochs"][-1]["valid_accuracy"] > 0.6


def test_a_single_process_run_records_world_size_one(sbm, tmp_path):
    needs("torch")
    proc = run_strata("gnn", "train", sbm, "--run-dir", tmp_path / "run", "--epochs", "1", "--json-summary", *SMALL)
    record = json.loads(proc.stdout)
    assert record["world_size"] == 1 and "ranks" not in record and "ranks" not in record["history"][0]
    assert not (tmp_path / "run" / "resume.pt").exists()
    # PyG imports Triton, whose bindings print every object still alive at exit.
    assert "leaked" not in proc.stderr, proc.stderr[-2000:]


def test_a_rank_that_cannot_reach_rank_0_names_the_address(sbm, tmp_path):
    needs("torch")
    port = free_port()
    env = rank_env() | {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    # The last --dist-timeout given wins.
    args = [*SMALL, "--dist-timeout", "3"]
    proc = run_strata("gnn", "train", sbm, "--run-dir", tmp_path / "run", *args, check=False, env=env, timeout=120)
    assert proc.returncode != 0
    assert f"127.0.0.1:{port}" in proc.stderr and "within 3 s" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
