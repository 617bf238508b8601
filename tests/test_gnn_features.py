"""Features split across ranks (docs/distributed.md, "Features that do not fit on one machine"):
the ownership rule, two processes gathering local and remote rows over torch RPC, and
`strata gnn train` under torchrun on Cora with split features against replicated ones."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

import dist_runs
from conftest import REPO, needs
from strata.gnn.features import owned_range, owners
from torchrun_env import free_port, rank_env, run_session

#: G1's GraphSAGE settings (benches/bench_gnn.py), 3 epochs (the best validation accuracy comes
#: by the second or third), one torch thread per rank.
CORA = ["--model", "sage", "--fanouts", "25,10", "--batch-size", "64", "--hidden", "256", "--device", "cpu",
        "--epochs", "3", "--torch-threads", "1", "--dist-timeout", "60", "-q", "--json-summary"]  # fmt: skip
#: Modes of the features, in the order one launch's ranks train them (split last: it starts the
#: RPC group, once per process).
MODES = ("replicated", "split")


@pytest.mark.parametrize("num_nodes", [0, 1, 7, 2708])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_owned_ranges_partition_the_nodes_and_owners_agree(num_nodes, world_size):
    ranges = [owned_range(num_nodes, r, world_size) for r in range(world_size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == num_nodes
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert max(e - s for s, e in ranges) - min(e - s for s, e in ranges) <= 1
    nodes = np.arange(num_nodes)
    expected = np.concatenate([np.full(e - s, r) for r, (s, e) in enumerate(ranges)])
    assert np.array_equal(owners(nodes, num_nodes, world_size), expected)
    with pytest.raises(ValueError, match="outside"):
        owned_range(num_nodes, world_size, world_size)


def test_two_processes_gather_every_row_exactly(cora, tmp_path):
    """Random id sets (repeats, own rows only, others' only, empty) and an epoch's batches on
    each of two processes equal the store's rows; each plans only its own rows."""
    needs("torch")
    port = free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    driver = REPO / "tests" / "split_features_driver.py"
    args = [[sys.executable, driver, cora, str(r), "2", str(port), outs[r]] for r in range(2)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(a, env=rank_env(), **pipes) for a in args]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-4000:]
    results = [json.loads(o.read_text()) for o in outs]
    assert [r["owned"] for r in results] == [[0, 1354], [1354, 2708]]
    for r in results:
        assert r["gathered"] == [True] * 6
        assert r["batches"] and all(r["batches"])
        plan = r["plan"]
        assert plan["remote_rows"] == 1354 and plan["device_rows"] == 0
        assert plan["hot_rows"] + plan["cache_rows"] <= 1354
        # Each batch asked the other rank once; four of the six id sets did (not: own rows, empty).
        assert r["remote"]["requests"] == len(r["batches"]) + 4
        assert r["remote"]["bytes"] == r["remote"]["rows"] * 1433 * 4


@pytest.fixture(scope="module")
def cora_runs(cora, tmp_path_factory) -> dict:
    """Two ranks on loopback train Cora with replicated, then split features, one after another
    in one torchrun launch (tests/dist_runs.py): run.json of each."""
    needs("torch")
    d = tmp_path_factory.mktemp("cora-runs")
    runs = [{"name": mode, "argv": ["gnn", "train", cora, "--run-dir", d / mode, "--dist-features", mode, *CORA]}
            for mode in MODES]  # fmt: skip
    logs = d / "logs"
    plan = dist_runs.plan(d / "plan.json", logs, runs)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", REPO / "tests" / "dist_runs.py",
           plan]  # fmt: skip
    proc = run_session(list(map(str, cmd)), rank_env(), 900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = {}
    for mode in MODES:
        for rank in (0, 1):
            rc, out, err = dist_runs.result(logs, mode, rank)
            assert rc == 0, f"{mode} on rank {rank}: " + out[-3000:] + err[-6000:]
        records[mode] = json.loads((d / mode / "run.json").read_text())
    return records


def test_split_features_train_cora_as_replicated_ones_do(cora_runs):
    split, replicated = cora_runs["split"], cora_runs["replicated"]
    assert (split["dist_features"], replicated["dist_features"]) == ("split", "replicated")
    # The same batches see the same feature rows, wherever they come from: the runs agree.
    assert [h["loss"] for h in split["history"]] == [h["loss"] for h in replicated["history"]]
    assert [h["valid"]["accuracy"] for h in split["history"]] == [h["valid"]["accuracy"] for h in replicated["history"]]
    assert split["test"]["accuracy"] == replicated["test"]["accuracy"]
    # G1's band for GraphSAGE on Cora is about 0.80.
    assert split["test"]["accuracy"] > 0.75, split["test"]


def test_split_features_fetch_one_request_per_batch_and_plan_own_rows(cora_runs):
    split = cora_runs["split"]
    for h in split["history"]:
        for r in h["ranks"]:
            remote = r["remote"]
            assert remote["requests"] == r["batches"] and remote["rows"] > 0
            assert remote["bytes"] == remote["rows"] * 1433 * 4
    assert all("remote" not in r for h in cora_runs["replicated"]["history"] for r in h["ranks"])
    # Rank 0's plan (it writes the record) holds its own 1354 rows, not the other half.
    plan = split["plan"]
    assert plan["remote_rows"] == 1354 and plan["hot_rows"] + plan["cache_rows"] <= 1354
    assert any(p["name"] == "remote rows index" for p in split["memory_plan"]["parts"])
