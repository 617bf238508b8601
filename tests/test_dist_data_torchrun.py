"""Distributed runs refuse ranks that hold different data (docs/distributed.md, "Same data on
every rank"): two torchrun agents on loopback, each rank given its own store, for embeddings
(owner mode), GNN training and grid analytics; and three ranks on a three-column grid, whose
columns are balanced by edges (one column each)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import needs, run_strata, symmetric_sbm_store
from torchrun_env import free_port, rank_env, wait_all

#: Seconds any one wait on another rank may take, and a whole launch: bounded so a hang fails.
TIMEOUT = 60
RUN_SECONDS = 300


def _two_nodes(
    stores: list[Path], *command: str | Path, nproc: int = 1, own: tuple[list, list] = ([], [])
) -> list[tuple[int, str, str]]:
    """Launches two torchrun agents on loopback (``--nnodes 2``), agent ``r`` running
    ``strata COMMAND... OWN[r]... stores[r]`` in its own session; returns each agent's
    (returncode, stdout, stderr). Both are killed whole if they outlive the launch."""
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for r, store in enumerate(stores):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(nproc),
            "--node-rank", str(r), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--max-restarts", "0",
            "-m", "strata", *[str(c) for c in (*command, *own[r])], str(store),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=rank_env(), start_new_session=True))  # fmt: skip
    return wait_all(procs, RUN_SECONDS)


def _assert_refused(results, stores: list[Path]) -> None:
    """Every agent failed with the one clear error naming both ranks' stores and digests."""
    for rc, out, err in results:
        assert rc != 0, out[-2000:] + err[-4000:]
        assert "rank 1 holds different data from rank 0" in err, err[-4000:]
        for store in stores:
            assert f":{store}" in err, err[-4000:]
        assert err.count("blake3:") >= 2, err[-4000:]
        # No traceback from Strata (torchrun's agent prints its own when a rank fails), and
        # the rank's exit status is the CLI's for a user error.
        assert not re.search(r'File ".*/strata/', err), err[-4000:]
    _assert_user_error_exit(results)


def _assert_user_error_exit(results) -> None:
    """The ranks exited with the CLI's status for a user error (2), as torchrun's agents report
    it. The agent that hosts the rendezvous store may leave as soon as its own rank fails; an
    agent still watching its rank then loses the store and reports that instead of the exit
    status (torchrun's race, not the rank's), so one agent's report of status 2 is required and
    every other agent reports either that or the lost store."""
    reported = [bool(re.search(r"exitcode\s*:\s*2\b", err)) for _, _, err in results]
    assert any(reported), results[0][2][-3000:] + results[-1][2][-3000:]
    for (_, _, err), ok in zip(results, reported, strict=True):
        assert ok or "The connection to the C10d store has failed" in err, err[-3000:]


@pytest.fixture(scope="module")
def kgs(tmp_path_factory) -> list[Path]:
    """Two knowledge-graph stores that differ in one training edge (a tail entity changed)."""
    d = tmp_path_factory.mktemp("kgs")
    run_strata("generate", "kg", "--out", d / "raw", "--entities", "200", "--relations", "4", "--triples", "3000", "-q")
    shutil.copytree(d / "raw", d / "raw1")
    lines = (d / "raw1" / "train.txt").read_text().splitlines()
    head, rel, tail = lines[0].split("\t")
    other = next(ln.split("\t")[2] for ln in lines[1:] if ln.split("\t")[2] != tail)
    lines[0] = "\t".join([head, rel, other])
    (d / "raw1" / "train.txt").write_text("\n".join(lines) + "\n")
    for r, raw in enumerate(["raw", "raw1"]):
        (d / f"host{r}").mkdir()
        run_strata("convert", d / raw, "--relations", "--out", d / f"host{r}" / "kg.strata", "-q")
    return [d / "host0" / "kg.strata", d / "host1" / "kg.strata"]


def test_embeddings_refuse_a_store_with_one_training_edge_changed(kgs, tmp_path):
    needs("torch")
    results = _two_nodes(
        kgs, "embed", "train", "--dist-storage", "owners", "--partitions", "2", "--epochs", "1", "--dim", "8",
        "--threads", "1", "--dist-timeout", TIMEOUT, "--run-dir", tmp_path / "run", "-q",
    )  # fmt: skip
    _assert_refused(results, kgs)
    assert not (tmp_path / "run" / "rank-0" / "run.json").exists()


def test_gnn_refuses_a_store_whose_labels_differ(tmp_path):
    needs("torch")
    store = symmetric_sbm_store(tmp_path, nodes=400, classes=3, dim=8, avg_degree=6)
    stores = [tmp_path / "host0" / "sbm.strata", tmp_path / "host1" / "sbm.strata"]
    for s in stores:
        shutil.copytree(store, s)
    # Labels only, written in place after conversion: the copy's kept digest no longer matches
    # its files, so it is computed again from them.
    labels = np.load(stores[1] / "labels.npy", mmap_mode="r+")
    labelled = int(np.flatnonzero(labels >= 0)[0])
    labels[labelled] = (labels[labelled] + 1) % 3
    labels.flush()
    del labels
    gnn = ["gnn", "train", "--model", "sage", "--fanouts", "3,3", "--batch-size", "64", "--hidden", "8",
           "--device", "cpu", "--torch-threads", "1", "--epochs", "1", "--dist-timeout", TIMEOUT, "-q"]  # fmt: skip
    _assert_refused(_two_nodes(stores, *gnn), stores)
    # The same data (a copy each) trains.
    shutil.rmtree(stores[1])
    shutil.copytree(store, stores[1])
    for rc, out, err in _two_nodes(stores, *gnn):
        assert rc == 0, out[-2000:] + err[-5000:]


@pytest.fixture(scope="module")
def rmats(tmp_path_factory) -> list[Path]:
    """Two RMAT graphs of the same size (different seeds) as stores, each with a 3 x 3 grid. Their
    integer ids are kept (bin32), so the first column, into the RMAT hub's chunk, holds most edges."""
    d = tmp_path_factory.mktemp("rmats")
    stores = []
    for seed in (1, 2):
        raw = d / f"rmat{seed}.bin32"
        run_strata("generate", "rmat", "--out", raw, "--scale", "10", "--seed", seed, "--format", "bin32", "-q")
        store = d / f"host{seed - 1}" / "rmat.strata"
        store.parent.mkdir()
        run_strata("convert", raw, "--num-nodes", "1024", "--out", store, "-q")
        run_strata("grid", "build", store, "--partitions", "3", "-q")
        stores.append(store)
    return stores


def test_grid_runs_refuse_a_different_graph_of_the_same_size(rmats, tmp_path):
    needs("torch")
    sizes = [json.loads((s / "manifest.json").read_text())["graph"] for s in rmats]
    assert sizes[0]["num_nodes"] == sizes[1]["num_nodes"]
    assert sizes[0]["num_edges"] == sizes[1]["num_edges"]
    results = _two_nodes(
        rmats, "run", "pagerank", "--iterations", "3", "--threads", "1", "--dist-timeout", TIMEOUT,
        "--out", tmp_path / "out", "-q",
    )  # fmt: skip
    grids = [next((s / "grids").iterdir()) for s in rmats]
    _assert_refused(results, grids)
    assert not (tmp_path / "out" / "run.json").exists()


def test_three_ranks_on_three_columns_get_a_column_each(tmp_path):
    needs("torch")
    # Two thirds of the edges go into the first of 3 chunks of 333 vertices (a hub's chunk):
    # cutting at running shares of the edges gave rank 0 no column and rank 1 two thirds.
    rng = np.random.default_rng(0)
    dst = np.concatenate([rng.integers(0, 333, 8000), rng.integers(333, 999, 4000)])
    np.save(tmp_path / "e.npy", np.stack([rng.integers(0, 999, 12_000), dst], axis=1))
    store = tmp_path / "skewed.strata"
    run_strata("convert", tmp_path / "e.npy", "--num-nodes", "999", "--out", store, "-q")
    run_strata("grid", "build", store, "--partitions", "3", "-q")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        "-m", "strata", "run", "pagerank", str(store), "--iterations", "3", "--threads", "1",
        "--dist-timeout", str(TIMEOUT), "--out", str(tmp_path / "out"), "-q",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_SECONDS, env=rank_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    ranks = json.loads((tmp_path / "out" / "run.json").read_text())["summary"]["dist"]["ranks"]
    assert [r["columns"] for r in ranks] == [[0, 1], [1, 2], [2, 3]], ranks
    assert ranks[0]["edges"] > 2 * max(ranks[1]["edges"], ranks[2]["edges"]), ranks


def test_grid_runs_refuse_ranks_given_different_options(rmats, tmp_path):
    needs("torch")
    stores = [rmats[0], tmp_path / "copy" / "rmat.strata"]
    shutil.copytree(rmats[0], stores[1])
    results = _two_nodes(
        stores, "run", "pagerank", "--threads", "1", "--dist-timeout", TIMEOUT, "--out", tmp_path / "out", "-q",
        own=(["--iterations", "3"], ["--iterations", "4"]),
    )  # fmt: skip
    for rc, out, err in results:
        assert rc != 0, out[-2000:] + err[-4000:]
        assert "rank 1 runs with different options from rank 0" in err, err[-4000:]
        assert "iterations is 3 on rank 0, 4 on rank 1" in err, err[-4000:]
    _assert_user_error_exit(results)
