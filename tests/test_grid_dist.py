"""Distributed graph analytics: `strata run` under torchrun with two ranks, on loopback and
across a veth link between two network namespaces, against the single-process run
(docs/distributed.md, "Analytics").

Each launch's ranks run several commands one after another (tests/dist_runs.py), and a module
fixture launches once for every test that checks one of its runs: a launch's start (torch
imported by torchrun's agent and each rank) costs several times what a run on this graph does."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dist_runs
from conftest import TESTS, needs, run_strata
from netns import needs_netns, veth_pair
from strata.config import ConvertConfig
from strata.convert import convert
from strata.grid import RESULT_ARRAYS, build_grid, run
from torchrun_env import free_port, rank_env, run_session, wait_all

#: What each rank of a launch runs: several `strata` commands one after another.
DRIVER = TESTS / "dist_runs.py"

N = 3000
EXACT = {"bfs", "wcc", "kcore"}
#: The root of the algorithms that take one: a vertex that reaches most others.
ROOT = 5
#: Compute threads of every run.
THREADS = 2


def own_options(algorithm: str) -> dict:
    """The options every run of ``algorithm`` takes: two compute threads, and ``ROOT`` where
    the algorithm starts from a root (another algorithm refuses one)."""
    return {"threads": THREADS, **({"root": ROOT} if algorithm in ("bfs", "sssp") else {})}


def own_args(algorithm: str) -> list[str]:
    """:func:`own_options` as command-line flags."""
    return [a for k, v in own_options(algorithm).items() for a in (f"--{k}", str(v))]


#: A rank's --memory: its plan sets aside what torch and gloo hold (about 400 MiB).
RANK_MEMORY = "1G"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A random graph of 3,000 vertices and about 24,000 edges, with the plain, symmetric and
    weighted grids the algorithms need (8 x 8 blocks)."""
    tmp = tmp_path_factory.mktemp("griddist")
    rng = np.random.default_rng(3)
    dense = rng.integers(0, 2500, size=(22_000, 2))
    tail = rng.integers(2500, 2900, size=(1_600, 2))
    # A path through the last 100 vertices, entered from vertex 7: BFS levels of one vertex.
    path = np.stack([np.arange(2899, N - 1), np.arange(2900, N)], axis=1)
    np.save(tmp / "e.npy", np.concatenate([dense, tail, [[7, 2600], [7, 2899]], path]))
    out = tmp / "g.strata"
    convert(ConvertConfig(inputs=[tmp / "e.npy"], out=out, num_nodes=N))
    build_grid(store=out, partitions=8)
    build_grid(store=out, partitions=8, symmetrize=True)
    build_grid(store=out, partitions=8, symmetrize=True, simple=True)
    build_grid(store=out, partitions=8, weighted=True)
    return out


#: The algorithms whose distributed runs are checked against the single-process run.
ALGORITHMS = ["pagerank", "bfs", "wcc", "sssp", "spmv", "kcore"]
#: Seconds any one wait on another rank may take, and a whole launch of every run of a fixture.
DIST_TIMEOUT = 60
LAUNCH_SECONDS = 900


def _launch(cmd: list[str], plan: Path, env: dict) -> subprocess.CompletedProcess:
    """``cmd`` (a torchrun command line) running every run of ``plan`` (tests/dist_runs.py) in
    each rank; fails the test, with torchrun's output, unless torchrun succeeded."""
    proc = run_session([*cmd, str(DRIVER), str(plan)], env, LAUNCH_SECONDS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _loopback_cmd() -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
    ]  # fmt: skip


def _run_args(algorithm: str, store, out, *extra) -> list:
    return ["run", algorithm, store, "--out", out, "--dist-timeout", DIST_TIMEOUT, *own_args(algorithm), *extra]


@pytest.fixture(scope="module")
def loopback(store, tmp_path_factory) -> Path:
    """One torchrun launch of two ranks on loopback (tests/dist_runs.py), whose ranks run, one
    after another: PageRank refused at a budget of 40 MiB (``budget-small``), then at the
    figure that refusal named plus a little, streaming from disk (``budget``); each of
    ALGORITHMS with ``--memory RANK_MEMORY`` (named after it); and WCC on a store without a
    grid (``bare``). Returns the folder of their logs (read with ``dist_runs.result``); run
    NAME's output folder is ``out/NAME`` beside it."""
    needs("torch")
    d = tmp_path_factory.mktemp("loopback")
    rng = np.random.default_rng(0)
    np.save(d / "e.npy", rng.integers(0, 100, size=(500, 2)))
    bare = d / "bare.strata"
    convert(ConvertConfig(inputs=[d / "e.npy"], out=bare, num_nodes=100))
    out = d / "out"
    # 40 MiB cannot hold what torch and gloo take in a rank.
    tight = ["--memory", "40M", "--no-keep-resident"]
    runs = [
        {"name": "budget-small", "argv": _run_args("pagerank", store, out / "budget-small", *tight)},
        {"name": "budget", "argv": _run_args("pagerank", store, out / "budget", "--no-keep-resident"),
         "memory_from": "budget-small"},
        *({"name": a, "argv": _run_args(a, store, out / a, "--memory", RANK_MEMORY)} for a in ALGORITHMS),
        {"name": "bare", "argv": _run_args("wcc", bare, out / "bare")},
    ]  # fmt: skip
    logs = d / "logs"
    _launch(_loopback_cmd(), dist_runs.plan(d / "plan.json", logs, runs), rank_env())
    return logs


def _ok(logs: Path, name: str) -> list[tuple[int, str, str]]:
    """Run ``name``'s (exit status, stdout, stderr) on ranks 0 and 1, each of which succeeded."""
    results = [dist_runs.result(logs, name, r) for r in (0, 1)]
    for rc, out, err in results:
        assert rc == 0, out[-2000:] + err[-6000:]
    return results


def _assert_same_results(algorithm: str, single, distributed) -> None:
    for name in RESULT_ARRAYS[algorithm]:
        a, b = np.load(single / f"{name}.npy"), np.load(distributed / f"{name}.npy")
        if algorithm in EXACT:
            np.testing.assert_array_equal(a, b, err_msg=f"{algorithm} {name}")
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9, err_msg=f"{algorithm} {name}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_ranks_on_loopback_match_the_single_process_run(store, loopback, tmp_path, algorithm):
    single = tmp_path / "single"
    alone = run(algorithm=algorithm, store=store, out=single, memory="256M", **own_options(algorithm))
    results = _ok(loopback, algorithm)
    two = loopback.parent / "out" / algorithm
    _assert_same_results(algorithm, single, two)
    record = json.loads((two / "run.json").read_text())
    assert record["world_size"] == 2
    ranks = record["summary"]["dist"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    # The columns are split between the ranks, and every rank exchanged values.
    assert ranks[0]["columns"][0] == 0 and ranks[0]["columns"][1] == ranks[1]["columns"][0]
    assert ranks[1]["columns"][1] == 8 and ranks[0]["columns"][1] not in (0, 8)
    assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in ranks)
    if algorithm not in ("wcc", "sssp"):  # those may take more passes across ranks
        assert sum(r["edges"] for r in ranks) == alone["edges"]
    # SpMV's one pass exchanges nothing (y is gathered after it), nor does k-core's degree pass.
    exchanged = [h["mb_exchanged"] > 0 for h in record["history"]]
    first = 1 if algorithm in ("spmv", "kcore") else 0
    assert not any(exchanged[:first]) and all(exchanged[first:]), exchanged
    assert record["summary"]["result"] == alone["result"]
    # Each rank printed its own plan; only rank 0 printed the summary.
    for r, (_, _, err) in enumerate(results):
        assert f"rank {r}: {algorithm}: grid " in err, err[-3000:]
    assert sum(out.count(f"Ran {algorithm} on grid") for _, out, _ in results) == 1
    assert f"Ran {algorithm} on grid" in results[0][1]


def test_a_sparse_frontier_sends_less_than_the_whole_array(loopback):
    _ok(loopback, "bfs")
    history = json.loads((loopback.parent / "out" / "bfs" / "run.json").read_text())["history"]
    # Dense, a level would send each rank's bitmap (1,500 vertices: 188 bytes) padded alike,
    # plus headers; the last levels, of a few vertices, send (offset) lists instead.
    sizes = [round(h["mb_exchanged"] * 1e6) for h in history]
    single = [s for s, h in zip(sizes, history, strict=True) if h["value"] == 1]
    # A level of one vertex: the sizes (8 bytes each way), then count, form, length and one
    # offset (8 + 1 + 8 + 4 bytes) each way.
    assert len(single) > 50 and set(single) == {2 * 8 + 2 * 21}, sizes
    assert max(sizes) > 2 * 8 + 2 * (9 + 1500 // 8), sizes


def test_each_rank_plans_within_its_own_budget_and_streams_from_disk(store, loopback, tmp_path):
    # 40 MiB cannot hold what torch and gloo took in the rank: it says so, and how much would do.
    refusal = r"torch and gloo take [\d.]+ MiB \(RssAnon .*raise --memory to at least ([\d.]+) MiB"
    budgets = []
    for rc, out, err in (dist_runs.result(loopback, "budget-small", r) for r in (0, 1)):
        assert rc not in (0, None), out[-2000:] + err[-3000:]
        needed = re.findall(refusal, err)
        assert needed, err[-3000:]
        # The same process measures a little differently when it joins again: some room.
        budgets.append(int(max(float(n) for n in needed)) + dist_runs.MEMORY_ROOM_MIB)
    results = _ok(loopback, "budget")
    for r, (_, _, err) in enumerate(results):
        assert re.search(rf"rank {r}: grid budget {budgets[r]}(\.0)? MiB: planned", err), err[-3000:]
        assert "torch + gloo" in err and "RssAnon" in err, err[-3000:]
    pr = loopback.parent / "out" / "budget"
    ranks = json.loads((pr / "run.json").read_text())["summary"]["dist"]["ranks"]
    assert all(r["bytes_disk"] > 0 and r["bytes_local"] == 0 for r in ranks)
    single = tmp_path / "single"
    run(algorithm="pagerank", store=store, out=single, threads=2, memory="256M")
    _assert_same_results("pagerank", single, pr)


def test_a_distributed_run_does_not_build_a_grid(loopback):
    for rc, out, err in (dist_runs.result(loopback, "bare", r) for r in (0, 1)):
        # The CLI's status for a user error.
        assert rc == 2, out[-2000:] + err[-3000:]
        assert "strata grid build" in err and "--symmetrize" in err, err[-3000:]
    assert not (loopback.parent / "out" / "bare").exists()


def test_a_rank_that_cannot_reach_rank_0_names_the_address(store, tmp_path):
    needs("torch")
    port = free_port()
    env = rank_env() | {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    proc = run_strata(
        "run", "pagerank", store, "--out", tmp_path / "out", "--dist-timeout", "3",
        check=False, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"127.0.0.1:{port}" in proc.stderr and "within 3 s" in proc.stderr, proc.stderr[-2000:]


#: The algorithms run across the namespaces' link: one dense exchange, one of frontiers.
NAMESPACE_ALGORITHMS = ["pagerank", "bfs"]


@pytest.fixture(scope="module")
def namespaces(store, tmp_path_factory) -> list[Path]:
    """Two hosts, network namespaces joined by a veth pair, each with its own copy of the store
    and its own torchrun agent of one rank (static rendezvous at host 0's address), running
    NAMESPACE_ALGORITHMS one after another (tests/dist_runs.py); returns each host's copy.
    Run NAME's logs are in ``HOST/logs``, its results in ``HOST/out/NAME``."""
    needs("torch")
    d = tmp_path_factory.mktemp("namespaces")
    copies = [d / f"host{r}" / "g.strata" for r in (0, 1)]
    for c in copies:
        shutil.copytree(store, c)
    with veth_pair() as (a, b):
        port = free_port()
        procs = []
        for r, ns in enumerate((a, b)):
            host = copies[r].parent
            runs = [
                {"name": alg, "argv": _run_args(alg, copies[r], host / "out" / alg, "--memory", RANK_MEMORY)}
                for alg in NAMESPACE_ALGORITHMS
            ]
            plan = dist_runs.plan(host / "plan.json", host / "logs", runs)
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--node-rank", str(r), "--master-addr", a.addr, "--master-port", str(port), "--max-restarts", "0",
                str(DRIVER), str(plan),
            ]  # fmt: skip
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            procs.append(subprocess.Popen(ns.wrap(cmd), text=True, env=rank_env(ns.device), **pipes))
        results = wait_all(procs, LAUNCH_SECONDS)
    for rc, out, err in results:
        assert rc == 0, out[-2000:] + err[-6000:]
    return copies


@needs_netns
@pytest.mark.parametrize("algorithm", NAMESPACE_ALGORITHMS)
def test_two_ranks_in_two_namespaces_with_their_own_stores(store, namespaces, tmp_path, algorithm):
    single = tmp_path / "single"
    run(algorithm=algorithm, store=store, out=single, memory="256M", **own_options(algorithm))
    hosts = [c.parent for c in namespaces]
    for r, host in enumerate(hosts):
        rc, out, err = dist_runs.result(host / "logs", algorithm, r)
        assert rc == 0, out[-2000:] + err[-6000:]
    _assert_same_results(algorithm, single, hosts[0] / "out" / algorithm)
    record = json.loads((hosts[0] / "out" / algorithm / "run.json").read_text())
    assert record["world_size"] == 2
    assert all(r["bytes_sent"] > 0 for r in record["summary"]["dist"]["ranks"])
    # Rank 1 wrote no results into its own copy.
    assert not (hosts[1] / "out" / algorithm / "run.json").exists()
