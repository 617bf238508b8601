"""An approximate neighbour index of a run's embeddings (the ``ann`` extra: usearch), for many
repeated neighbour queries where the exact scan of ``strata embed neighbors`` reads the whole
table each time.

``build_index`` exports the checkpoint in node-id order (``Run.export``, within the budget), adds
the rows to a usearch HNSW graph in batches of ``BATCH_ROWS`` and saves it beside the store's
node names; the export is then removed. The index itself lives in memory while it is built and
searched (about the table's size plus the graph's links): it is for tables that fit in memory.
``Index.search`` answers like ``Run.neighbors``; its recall against the exact scan is measured
in benches/bench_embed_use.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from .. import _native
from ..errors import ConfigError
from .runs import ProgressFn, Run

INDEX_FILE = "index.usearch"
META_FILE = "index.json"
NAMES_FILE = "node_names.txt"
#: Rows added to the index per call.
BATCH_ROWS = 65_536
#: usearch's name of each metric.
USEARCH_METRIC = {"cos": "cos", "dot": "ip", "l2": "l2sq"}


def _usearch():
    """Imports usearch lazily: only the index needs it, and it is an optional extra."""
    try:
        import usearch.index
    except ImportError as e:
        raise ConfigError(
            "embed.index: the neighbour index is built with usearch, which is not installed; "
            "install the ann extra: pip install 'strata-gl[ann]'"
        ) from e
    return usearch.index


def natural_metric(run: Run) -> str:
    """The metric ``model`` stands for with ``run``'s score function (the exact scan's choice)."""
    return _native.embed_natural_metric(str(run.path))


def build_index(
    run: Run,
    out: str | Path,
    metric: str = "model",
    connectivity: int = 16,
    expansion: int = 128,
    checkpoint: str = "best",
    overwrite: bool = False,
    memory=None,
    progress: ProgressFn | None = None,
) -> dict:
    """Builds the index of ``run``'s checkpoint into directory ``out`` (``index.usearch``,
    ``index.json``, ``node_names.txt`` when the store has names). ``connectivity``: links per
    node of the HNSW graph; ``expansion``: candidates kept while adding and searching (higher:
    better recall, slower). Returns the contents of ``index.json``."""
    uindex = _usearch()
    metric = natural_metric(run) if metric == "model" else metric
    if metric not in USEARCH_METRIC:
        raise ConfigError(f"embed.index.metric: expected cos, dot, l2 or model, got {metric!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it")
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    staging = out.absolute().parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        exported = run.export(staging / "export", "npy", checkpoint, False, memory, progress)
        emb = np.load(staging / "export" / "embeddings.npy", mmap_mode="r")
        n, dim = emb.shape
        index = uindex.Index(
            ndim=dim,
            metric=USEARCH_METRIC[metric],
            dtype="f32",
            connectivity=connectivity,
            expansion_add=expansion,
            expansion_search=expansion,
        )
        for lo in range(0, n, BATCH_ROWS):
            hi = min(lo + BATCH_ROWS, n)
            index.add(np.arange(lo, hi, dtype=np.uint64), np.ascontiguousarray(emb[lo:hi]))
        index.save(str(staging / INDEX_FILE))
        if (staging / "export" / NAMES_FILE).exists():
            (staging / "export" / NAMES_FILE).rename(staging / NAMES_FILE)
        shutil.rmtree(staging / "export")
        meta = {
            "format": "strata-embed-index",
            "run": str(run.path.absolute()),
            "epoch": exported["epoch"],
            "metric": metric,
            "num_nodes": n,
            "dim": dim,
            "connectivity": connectivity,
            "expansion": expansion,
        }
        (staging / META_FILE).write_text(json.dumps(meta, indent=2))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return meta


class Index:
    """A saved index (``build_index``): ``search`` answers like ``Run.neighbors``."""

    def __init__(self, path: str | Path):
        uindex = _usearch()
        self.path = Path(path)
        try:
            self.meta = json.loads((self.path / META_FILE).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{self.path}: not a neighbour index ({META_FILE}: {e})") from e
        self.index = uindex.Index.restore(str(self.path / INDEX_FILE))
        names = self.path / NAMES_FILE
        self.names = names.read_text().splitlines() if names.exists() else None
        self.ids = {name: i for i, name in enumerate(self.names)} if self.names is not None else None

    def node_id(self, node: str | int) -> int:
        """The id of node ``node`` (a name, or an id without names)."""
        node = str(node)
        if self.ids is not None:
            if node not in self.ids:
                raise ConfigError(f"node '{node}' is not in the index {self.path} (names are case-sensitive)")
            return self.ids[node]
        n = self.meta["num_nodes"]
        if not node.isdigit() or int(node) >= n:
            raise ConfigError(
                f"index {self.path} has no node names: give a node id between 0 and {n - 1}, got '{node}'"
            )
        return int(node)

    def name(self, node: int) -> str:
        return self.names[node] if self.names is not None else str(node)

    def search(self, nodes: str | int | list[str | int], top: int = 10) -> dict:
        """The ``top`` approximate nearest nodes of each of ``nodes`` (itself left out), nearest
        first: ``{"metric", "top", "results": [{"node", "name", "neighbors": [{"node", "name",
        "score"}, ...]}, ...]}``, ``score`` as in ``Run.neighbors``."""
        if isinstance(nodes, (str, int)):
            nodes = [nodes]
        if top < 1:
            raise ConfigError(f"embed.neighbors.top: must be >= 1, got {top}")
        ids = [self.node_id(v) for v in nodes]
        top = min(top, self.meta["num_nodes"] - 1)
        vectors = np.asarray(self.index.get(np.array(ids, dtype=np.uint64)), dtype=np.float32)
        found = self.index.search(vectors.reshape(len(ids), -1), top + 1)
        keys = np.atleast_2d(found.keys)
        distances = np.atleast_2d(found.distances)
        # One query answers a single match list (no counts); several, a batch with counts.
        counts = np.atleast_1d(found.counts) if hasattr(found, "counts") else [len(found.keys)]
        metric = self.meta["metric"]
        results = []
        for row, q in enumerate(ids):
            neighbors = []
            found_here = counts[row]
            for key, dist in zip(keys[row][:found_here], distances[row][:found_here], strict=True):
                if int(key) == q or len(neighbors) == top:
                    continue
                score = float(np.sqrt(max(dist, 0.0))) if metric == "l2" else 1.0 - float(dist)
                neighbors.append({"node": int(key), "name": self.name(int(key)), "score": score})
            results.append({"node": q, "name": self.name(q), "neighbors": neighbors})
        return {"metric": metric, "top": top, "results": results}


def search_run_index(
    run: Run,
    index: str | Path,
    nodes: list[str],
    nodes_file: str | Path | None,
    top: int,
    metric: str = "model",
) -> dict:
    """``strata embed neighbors RUN --index DIR``: ``Index(DIR).search`` of ``nodes`` and the
    lines of ``nodes_file``, refused when the index was built from another run or with another
    metric than ``metric`` (``model``: any). Answers like ``Run.neighbors`` (with ``epoch``)."""
    found = Index(index)
    if Path(found.meta["run"]) != run.path.absolute():
        raise ConfigError(f"index {index} was built from run {found.meta['run']}, not {run.path.absolute()}")
    if metric != "model" and metric != found.meta["metric"]:
        raise ConfigError(
            f"embed.neighbors.metric: index {index} compares by {found.meta['metric']}, not {metric}; "
            "build another index with --metric, or leave --metric out"
        )
    queries = list(nodes)
    if nodes_file is not None:
        try:
            lines = Path(nodes_file).read_text().splitlines()
        except OSError as e:
            raise ConfigError(f"--nodes-file {nodes_file}: cannot read it: {e}") from e
        queries += [line.strip() for line in lines if line.strip()]
    return {"epoch": found.meta["epoch"], **found.search(queries, top)}
