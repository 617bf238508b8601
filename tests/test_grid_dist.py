"""Distributed graph analytics: `strata run` under torchrun with two ranks, on loopback and
across a veth link between two network namespaces, against the single-process run
(docs/distributed.md, "Analytics")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import needs, run_strata
from netns import needs_netns, veth_pair
from strata.config import ConvertConfig
from strata.convert import convert
from strata.grid import RESULT_ARRAYS, build_grid, run
from torchrun_env import free_port, rank_env

N = 3000
EXACT = {"bfs", "wcc", "kcore"}
#: The options every run takes: two compute threads, and a root that reaches most vertices.
COMMON = ["--threads", "2", "--root", "5"]
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


def _torchrun(algorithm: str, store, out, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        "-m", "strata", "run", algorithm, str(store), "--out", str(out), "--dist-timeout", "60", *COMMON, *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=rank_env())


@pytest.fixture(scope="module")
def loopback(store, tmp_path_factory):
    """``loopback(algorithm)``: torchrun's completed process and the output folder of two ranks
    on loopback running ``algorithm`` (``--memory RANK_MEMORY``), launched once for all of this module's
    checks of that run."""
    runs = {}

    def launch(algorithm: str) -> tuple[subprocess.CompletedProcess, Path]:
        if algorithm not in runs:
            out = tmp_path_factory.mktemp(f"two-{algorithm}")
            runs[algorithm] = (_torchrun(algorithm, store, out, "--memory", RANK_MEMORY), out)
        return runs[algorithm]

    return launch


def _assert_same_results(algorithm: str, single, distributed) -> None:
    for name in RESULT_ARRAYS[algorithm]:
        a, b = np.load(single / f"{name}.npy"), np.load(distributed / f"{name}.npy")
        if algorithm in EXACT:
            np.testing.assert_array_equal(a, b, err_msg=f"{algorithm} {name}")
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9, err_msg=f"{algorithm} {name}")


@pytest.mark.parametrize("algorithm", ["pagerank", "bfs", "wcc", "sssp", "spmv", "kcore"])
def test_two_ranks_on_loopback_match_the_single_process_run(store, loopback, tmp_path, algorithm):
    needs("torch")
    single = tmp_path / "single"
    alone = run(algorithm=algorithm, store=store, out=single, threads=2, root=5, memory="256M")
    proc, two = loopback(algorithm)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
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
    for r in (0, 1):
        assert f"rank {r}: {algorithm}: grid " in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.count(f"Ran {algorithm} on grid") == 1


def test_a_sparse_frontier_sends_less_than_the_whole_array(loopback):
    needs("torch")
    proc, two = loopback("bfs")
    assert proc.returncode == 0, proc.stderr[-6000:]
    history = json.loads((two / "run.json").read_text())["history"]
    # Dense, a level would send each rank's bitmap (1,500 vertices: 188 bytes) padded alike,
    # plus headers; the last levels, of a few vertices, send (offset) lists instead.
    sizes = [round(h["mb_exchanged"] * 1e6) for h in history]
    single = [s for s, h in zip(sizes, history, strict=True) if h["value"] == 1]
    # A level of one vertex: the sizes (8 bytes each way), then count, form, length and one
    # offset (8 + 1 + 8 + 4 bytes) each way.
    assert len(single) > 50 and set(single) == {2 * 8 + 2 * 21}, sizes
    assert max(sizes) > 2 * 8 + 2 * (9 + 1500 // 8), sizes


def test_each_rank_plans_within_its_own_budget_and_streams_from_disk(store, tmp_path):
    needs("torch")
    # 40 MiB cannot hold what torch and gloo took in the rank: it says so, and how much would do.
    small = _torchrun("pagerank", store, tmp_path / "small", "--memory", "40M", "--no-keep-resident")
    assert small.returncode != 0
    refusal = r"torch and gloo take [\d.]+ MiB \(RssAnon .*raise --memory to at least ([\d.]+) MiB"
    needed = re.findall(refusal, small.stderr)
    assert needed, small.stderr[-3000:]
    # Another launch measures a little differently: leave it some room.
    memory = int(max(float(n) for n in needed)) + 32
    proc = _torchrun("pagerank", store, tmp_path / "pr", "--memory", f"{memory}M", "--no-keep-resident")
    assert proc.returncode == 0, proc.stderr[-6000:]
    for r in (0, 1):
        assert re.search(rf"rank {r}: grid budget {memory}(\.0)? MiB: planned", proc.stderr), proc.stderr[-3000:]
    assert "torch + gloo" in proc.stderr and "RssAnon" in proc.stderr, proc.stderr[-3000:]
    ranks = json.loads((tmp_path / "pr" / "run.json").read_text())["summary"]["dist"]["ranks"]
    assert all(r["bytes_disk"] > 0 and r["bytes_local"] == 0 for r in ranks)
    single = tmp_path / "single"
    run(algorithm="pagerank", store=store, out=single, threads=2, memory="256M")
    _assert_same_results("pagerank", single, tmp_path / "pr")


def test_a_distributed_run_does_not_build_a_grid(tmp_path):
    needs("torch")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "e.npy", rng.integers(0, 100, size=(500, 2)))
    bare = tmp_path / "bare.strata"
    convert(ConvertConfig(inputs=[tmp_path / "e.npy"], out=bare, num_nodes=100))
    proc = _torchrun("wcc", bare, tmp_path / "out")
    assert proc.returncode != 0
    assert "strata grid build" in proc.stderr and "--symmetrize" in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"exitcode\s*:\s*2\b", proc.stderr), proc.stderr[-3000:]


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


@needs_netns
@pytest.mark.parametrize("algorithm", ["pagerank", "bfs"])
def test_two_ranks_in_two_namespaces_with_their_own_stores(store, tmp_path, algorithm):
    needs("torch")
    single = tmp_path / "single"
    run(algorithm=algorithm, store=store, out=single, threads=2, root=5, memory="256M")
    copies = [tmp_path / f"host{r}" / "g.strata" for r in (0, 1)]
    for c in copies:
        shutil.copytree(store, c)
    with veth_pair() as (a, b):
        port = free_port()
        procs = []
        for r, ns in enumerate((a, b)):
            iface = f"sv{os.getpid()}{'ab'[r]}"
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--node-rank", str(r), "--master-addr", a.addr, "--master-port", str(port), "--max-restarts", "0",
                "-m", "strata", "run", algorithm, str(copies[r]), "--out", str(copies[r].parent / "out"),
                "--dist-timeout", "60", "--memory", RANK_MEMORY, *COMMON,
            ]  # fmt: skip
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            procs.append(subprocess.Popen(ns.wrap(cmd), text=True, env=rank_env(iface), **pipes))
        outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-6000:]
    _assert_same_results(algorithm, single, copies[0].parent / "out")
    record = json.loads((copies[0].parent / "out" / "run.json").read_text())
    assert record["world_size"] == 2
    assert all(r["bytes_sent"] > 0 for r in record["summary"]["dist"]["ranks"])
    # Rank 1 wrote no results into its own copy.
    assert not (copies[1].parent / "out" / "run.json").exists()
