"""Distributed runs refuse ranks that hold different data (docs/distributed.md, "Same data on
every rank"): two ranks under torchrun on loopback, each given its own store, for embeddings
(owner mode), GNN training and grid analytics; and three ranks on a three-column grid, whose
columns are balanced by edges (one column each).

The two ranks of one launch run every refused command one after another, each rank with its own
store (tests/dist_runs.py): a launch's start (torch imported by torchrun's agent and each rank)
costs several times what a refused run does."""

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
from conftest import TESTS, needs, symmetric_sbm_store
from strata.config import GENERATORS, ConvertConfig
from strata.convert import convert
from strata.generate import generate
from strata.grid import build_grid
from torchrun_env import free_port, rank_env, run_session

#: Seconds any one wait on another rank may take, a whole run, and a launch of several runs.
TIMEOUT = 60
RUN_SECONDS = 300
LAUNCH_SECONDS = 900


def _assert_refused(results, stores: list[Path]) -> None:
    """Every rank failed with the one clear error naming both ranks' stores and digests, and the
    CLI's exit status for a user error (2)."""
    for rc, out, err in results:
        assert rc == 2, out[-2000:] + err[-4000:]
        assert "rank 1 holds different data from rank 0" in err, err[-4000:]
        for store in stores:
            assert f":{store}" in err, err[-4000:]
        assert err.count("blake3:") >= 2, err[-4000:]
        # No traceback from Strata.
        assert not re.search(r'File ".*/strata/', err), err[-4000:]


@pytest.fixture(scope="module")
def kgs(tmp_path_factory) -> list[Path]:
    """Two knowledge-graph stores that differ in one training edge (a tail entity changed)."""
    d = tmp_path_factory.mktemp("kgs")
    generate(GENERATORS["kg"](out=d / "raw", entities=200, relations=4, triples=3000))
    shutil.copytree(d / "raw", d / "raw1")
    lines = (d / "raw1" / "train.txt").read_text().splitlines()
    head, rel, tail = lines[0].split("\t")
    other = next(ln.split("\t")[2] for ln in lines[1:] if ln.split("\t")[2] != tail)
    lines[0] = "\t".join([head, rel, other])
    (d / "raw1" / "train.txt").write_text("\n".join(lines) + "\n")
    for r, raw in enumerate(["raw", "raw1"]):
        (d / f"host{r}").mkdir()
        convert(ConvertConfig(inputs=[d / raw], relations=True, out=d / f"host{r}" / "kg.strata"))
    return [d / "host0" / "kg.strata", d / "host1" / "kg.strata"]


@pytest.fixture(scope="module")
def sbms(tmp_path_factory) -> list[Path]:
    """Three copies of a small labelled SBM store: ``host0``'s, ``host1``'s with one label
    changed, and ``copy``'s, the same as ``host0``'s."""
    d = tmp_path_factory.mktemp("sbms")
    store = symmetric_sbm_store(d, nodes=400, classes=3, dim=8, avg_degree=6)
    stores = [d / name / "sbm.strata" for name in ("host0", "host1", "copy")]
    for s in stores:
        shutil.copytree(store, s)
    # Labels only, written in place after conversion: the copy's kept digest no longer matches
    # its files, so it is computed again from them.
    labels = np.load(stores[1] / "labels.npy", mmap_mode="r+")
    labelled = int(np.flatnonzero(labels >= 0)[0])
    labels[labelled] = (labels[labelled] + 1) % 3
    labels.flush()
    del labels
    return stores


@pytest.fixture(scope="module")
def rmats(tmp_path_factory) -> list[Path]:
    """Two RMAT graphs of the same size (different seeds) as stores, each with a 3 x 3 grid. Their
    integer ids are kept (bin32), so the first column, into the RMAT hub's chunk, holds most edges."""
    d = tmp_path_factory.mktemp("rmats")
    stores = []
    for seed in (1, 2):
        raw = d / f"rmat{seed}.bin32"
        generate(GENERATORS["rmat"](out=raw, scale=10, seed=seed, format="bin32"))
        store = d / f"host{seed - 1}" / "rmat.strata"
        store.parent.mkdir()
        convert(ConvertConfig(inputs=[raw], num_nodes=1024, out=store))
        build_grid(store=store, partitions=3)
        stores.append(store)
    return stores


@pytest.fixture(scope="module")
def copy_of_rmat(rmats, tmp_path_factory) -> Path:
    """A copy of ``rmats[0]``: the same data under another path."""
    copy = tmp_path_factory.mktemp("copy") / "rmat.strata"
    shutil.copytree(rmats[0], copy)
    return copy


@pytest.fixture(scope="module")
def refusals(kgs, sbms, rmats, copy_of_rmat, tmp_path_factory) -> Path:
    """One torchrun launch of two ranks on loopback whose ranks run, one after another, each on
    its own store: PageRank on two RMAT graphs of the same size (``grid-data``), then on the same
    graph with different ``--iterations`` (``grid-options``); GNN training on stores whose labels
    differ (``gnn-labels``), then on two copies of one store (``gnn-same``); embeddings on
    knowledge graphs that differ in one training edge (``embed``). Returns the folder of their
    logs (``dist_runs.result``); a run's output folder is ``out/NAME`` beside it."""
    needs("torch")
    d = tmp_path_factory.mktemp("refusals")
    out = d / "out"
    common = ["--threads", "1", "--dist-timeout", TIMEOUT, "-q"]
    grid = ["run", "pagerank", *common]
    gnn = ["gnn", "train", "--model", "sage", "--fanouts", "3,3", "--batch-size", "64", "--hidden", "8",
           "--device", "cpu", "--torch-threads", "1", "--epochs", "1", "--dist-timeout", TIMEOUT, "-q"]  # fmt: skip
    embed = ["embed", "train", "--dist-storage", "owners", "--partitions", "2", "--epochs", "1", "--dim", "8",
             *common, "--run-dir", out / "embed"]  # fmt: skip
    per_rank = lambda argv, stores, own=([], []): [[*argv, *own[r], stores[r]] for r in (0, 1)]  # noqa: E731
    runs = [
        {"name": "grid-data", "argv": per_rank([*grid, "--iterations", "3", "--out", out / "grid-data"], rmats)},
        {"name": "grid-options", "argv": per_rank([*grid, "--out", out / "grid-options"], [rmats[0], copy_of_rmat],
                                                  (["--iterations", "3"], ["--iterations", "4"]))},
        {"name": "gnn-labels", "argv": per_rank([*gnn, "--run-dir", out / "gnn-labels"], sbms[:2])},
        {"name": "gnn-same", "argv": per_rank([*gnn, "--run-dir", out / "gnn-same"], [sbms[0], sbms[2]])},
        {"name": "embed", "argv": per_rank(embed, kgs)},
    ]  # fmt: skip
    logs = d / "logs"
    plan = dist_runs.plan(d / "plan.json", logs, runs)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", str(TESTS / "dist_runs.py"), str(plan),
    ]  # fmt: skip
    proc = run_session(cmd, rank_env(), LAUNCH_SECONDS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return logs


def _results(logs: Path, name: str) -> list[tuple[int | None, str, str]]:
    return [dist_runs.result(logs, name, r) for r in (0, 1)]


def test_embeddings_refuse_a_store_with_one_training_edge_changed(kgs, refusals):
    _assert_refused(_results(refusals, "embed"), kgs)
    assert not (refusals.parent / "out" / "embed" / "rank-0" / "run.json").exists()


def test_gnn_refuses_a_store_whose_labels_differ(sbms, refusals):
    _assert_refused(_results(refusals, "gnn-labels"), sbms[:2])
    # The same data (a copy each) trains.
    for rc, out, err in _results(refusals, "gnn-same"):
        assert rc == 0, out[-2000:] + err[-5000:]
    assert (refusals.parent / "out" / "gnn-same" / "run.json").exists()


def test_grid_runs_refuse_a_different_graph_of_the_same_size(rmats, refusals):
    sizes = [json.loads((s / "manifest.json").read_text())["graph"] for s in rmats]
    assert sizes[0]["num_nodes"] == sizes[1]["num_nodes"]
    assert sizes[0]["num_edges"] == sizes[1]["num_edges"]
    grids = [next((s / "grids").iterdir()) for s in rmats]
    _assert_refused(_results(refusals, "grid-data"), grids)
    assert not (refusals.parent / "out" / "grid-data" / "run.json").exists()


def test_three_ranks_on_three_columns_get_a_column_each(tmp_path):
    needs("torch")
    # Two thirds of the edges go into the first of 3 chunks of 333 vertices (a hub's chunk):
    # cutting at running shares of the edges gave rank 0 no column and rank 1 two thirds.
    rng = np.random.default_rng(0)
    dst = np.concatenate([rng.integers(0, 333, 8000), rng.integers(333, 999, 4000)])
    np.save(tmp_path / "e.npy", np.stack([rng.integers(0, 999, 12_000), dst], axis=1))
    store = tmp_path / "skewed.strata"
    convert(ConvertConfig(inputs=[tmp_path / "e.npy"], num_nodes=999, out=store))
    build_grid(store=store, partitions=3)
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


def test_grid_runs_refuse_ranks_given_different_options(refusals):
    for rc, out, err in _results(refusals, "grid-options"):
        assert rc == 2, out[-2000:] + err[-4000:]
        assert "rank 1 runs with different options from rank 0" in err, err[-4000:]
        assert "iterations is 3 on rank 0, 4 on rank 1" in err, err[-4000:]
