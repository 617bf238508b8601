"""An approximate neighbour index of a run's embeddings (the ``ann`` extra: usearch), for many
repeated neighbour queries where the exact scan of ``strata embed neighbors`` reads the whole
table each time.

``build_index`` exports the checkpoint in node-id order (``Run.export``, within the budget), adds
the rows to a usearch HNSW graph in batches of ``BATCH_ROWS`` and saves it beside the store's
node names; the export is then removed. The index itself lives in memory while it is built and
searched (about the table's size plus the graph's links): it is for tables that fit in memory.
``Index.search`` answers like ``Run.neighbors``; its recall against the exact scan is measured
in benches/bench_embed_use.py. A run with entity types gets one HNSW graph per type
(``index-T.usearch``), so a search within a node's own type (the default, as the exact scan's)
walks only that type's graph; ``any_type`` searches every graph and merges the answers.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
from pathlib import Path

import numpy as np

from .. import _native
from ..config import EmbedIndexConfig, EmbedNeighborsConfig
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
            "embed.index: the neighbour index is built with usearch, which is not installed; pip install usearch"
        ) from e
    return usearch.index


def natural_metric(run: Run) -> str:
    """The metric ``model`` stands for with ``run``'s score function (the exact scan's choice)."""
    return _native.embed_natural_metric(str(run.path))


def index_parts(run: Run, num_nodes: int) -> list[dict]:
    """The graphs an index of ``run`` holds: one per entity type of a typed run (``{"name",
    "first", "count", "file"}``, the type's ids ``first .. first + count``), else one of all
    ``num_nodes`` nodes (``name`` None)."""
    types = run.meta["partitioning"].get("types")
    if not types:
        return [{"name": None, "first": 0, "count": num_nodes, "file": INDEX_FILE}]
    return [
        {"name": t["name"], "first": t["first"], "count": t["count"], "file": f"index-{i}.usearch"}
        for i, t in enumerate(types)
    ]


def build_index(run: Run, out: str | Path, *, progress: ProgressFn | None = None, **options) -> dict:
    """Builds the index of ``run``'s checkpoint into directory ``out`` (``options``:
    ``[embed.index]``'s, e.g. ``metric``, ``connectivity``, ``expansion``, ``checkpoint``,
    ``overwrite``, ``memory``; checked, the ones not given take the section's defaults).
    Returns the contents of ``index.json`` (see :func:`index_run`)."""
    return index_run(run, EmbedIndexConfig(target=run.path, out=Path(out), **options), progress)


def index_run(run: Run, cfg: EmbedIndexConfig, progress: ProgressFn | None = None) -> dict:
    """Builds the index of ``run``'s checkpoint as the checked ``[embed.index]`` section ``cfg``
    says into directory ``cfg.out`` (``index.usearch``, ``index.json``, ``node_names.txt`` when
    the store has names). ``connectivity``: links per node of the HNSW graph; ``expansion``:
    candidates kept while adding and searching (higher: better recall, slower). Returns the
    contents of ``index.json``."""
    uindex = _usearch()
    metric = natural_metric(run) if cfg.metric == "model" else cfg.metric
    if metric not in USEARCH_METRIC:
        raise ConfigError(f"embed.index.metric: expected cos, dot, l2 or model, got {metric!r}")
    out = Path(cfg.out)
    connectivity, expansion = cfg.connectivity, cfg.expansion
    if out.exists() and not cfg.overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it")
    # --overwrite replaces an earlier index (or an empty directory), never a run or a store.
    if out.exists() and not (out / META_FILE).is_file() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"{out} exists and is not an earlier index (no {META_FILE}); refusing to replace it: choose a new directory"
        )
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    staging = out.absolute().parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        exported = run.export(
            staging / "export", format="npy", checkpoint=cfg.checkpoint, memory=cfg.memory, progress=progress
        )
        emb = np.load(staging / "export" / "embeddings.npy", mmap_mode="r")
        n, dim = emb.shape
        parts = index_parts(run, n)
        for part in parts:
            index = uindex.Index(
                ndim=dim,
                metric=USEARCH_METRIC[metric],
                dtype="f32",
                connectivity=connectivity,
                expansion_add=expansion,
                expansion_search=expansion,
            )
            end = part["first"] + part["count"]
            for lo in range(part["first"], end, BATCH_ROWS):
                hi = min(lo + BATCH_ROWS, end)
                index.add(np.arange(lo, hi, dtype=np.uint64), np.ascontiguousarray(emb[lo:hi]))
            index.save(str(staging / part["file"]))
        if (staging / "export" / NAMES_FILE).exists():
            (staging / "export" / NAMES_FILE).rename(staging / NAMES_FILE)
        shutil.rmtree(staging / "export")
        meta = {
            "format": "strata-embed-index",
            "run": str(run.path.absolute()),
            # So that an index moved with its run (a store moved whole) still finds it.
            "run_relative": os.path.relpath(run.path.absolute(), out.absolute()),
            "epoch": exported["epoch"],
            "metric": metric,
            "num_nodes": n,
            "dim": dim,
            "connectivity": connectivity,
            "expansion": expansion,
            "parts": parts,
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
        # Indexes built before typed runs had one graph of every node and no "parts".
        default = [{"name": None, "first": 0, "count": self.meta.get("num_nodes", 0), "file": INDEX_FILE}]
        self.parts = self.meta.get("parts", default)
        self.firsts = [p["first"] for p in self.parts]
        self.graphs = [uindex.Index.restore(str(self.path / p["file"])) for p in self.parts]
        names = self.path / NAMES_FILE
        self.names = names.read_text().splitlines() if names.exists() else None
        self.ids = {name: i for i, name in enumerate(self.names)} if self.names is not None else None

    def runs(self) -> list[Path]:
        """Where the run the index was built from may lie, resolved: where it was, and where
        it is from the index now (one moved with it)."""
        places = [Path(self.meta["run"])]
        if "run_relative" in self.meta:
            places.append(self.path / self.meta["run_relative"])
        return [p.resolve() for p in places]

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

    def part_of(self, node: int) -> int:
        """The graph holding ``node``."""
        return bisect.bisect_right(self.firsts, node) - 1

    def search(self, nodes: str | int | list[str | int], top: int = 10, any_type: bool = False) -> dict:
        """The ``top`` approximate nearest nodes of each of ``nodes`` (itself left out), nearest
        first: ``{"metric", "top", "results": [{"node", "name", "neighbors": [{"node", "name",
        "score"}, ...]}, ...]}``, ``score`` as in ``Run.neighbors``. In an index of a typed run
        the neighbours are of each node's own type unless ``any_type``."""
        if isinstance(nodes, (str, int)):
            nodes = [nodes]
        if top < 1:
            raise ConfigError(f"embed.neighbors.top: must be >= 1, got {top}")
        ids = [self.node_id(v) for v in nodes]
        top = min(top, self.meta["num_nodes"] - 1)
        home = [self.part_of(q) for q in ids]
        vectors = np.stack(
            [np.asarray(self.graphs[h].get(q), dtype=np.float32).ravel() for q, h in zip(ids, home, strict=True)]
        )
        # Per query: (distance, key) from every graph it searches; usearch's distances are
        # lower-is-nearer for every metric, so answers of several graphs merge by them.
        hits: list[list[tuple[float, int]]] = [[] for _ in ids]
        for part, graph in enumerate(self.graphs):
            rows = [i for i, h in enumerate(home) if any_type or h == part]
            if not rows:
                continue
            found = graph.search(vectors[rows], top + 1)
            keys, distances = np.atleast_2d(found.keys), np.atleast_2d(found.distances)
            # One query answers a single match list (no counts); several, a batch with counts.
            counts = np.atleast_1d(found.counts) if hasattr(found, "counts") else [len(found.keys)]
            for j, i in enumerate(rows):
                hits[i] += zip(distances[j][: counts[j]].tolist(), keys[j][: counts[j]].tolist(), strict=True)
        metric = self.meta["metric"]
        results = []
        for q, found_here in zip(ids, hits, strict=True):
            neighbors = []
            for dist, key in sorted(found_here):
                if int(key) == q or len(neighbors) == top:
                    continue
                score = float(np.sqrt(max(dist, 0.0))) if metric == "l2" else 1.0 - float(dist)
                neighbors.append({"node": int(key), "name": self.name(int(key)), "score": score})
            results.append({"node": q, "name": self.name(q), "neighbors": neighbors})
        return {"metric": metric, "top": top, "results": results}


def search_run_index(run: Run, cfg: EmbedNeighborsConfig) -> dict:
    """``strata embed neighbors RUN --index DIR`` as the checked ``[embed.neighbors]`` section
    ``cfg`` says: ``Index(cfg.index).search`` of ``cfg.node`` and the lines of
    ``cfg.nodes_file``, refused when the index was built from another run, from another epoch
    than the checkpoint ``cfg.checkpoint`` holds now, or with another metric than
    ``cfg.metric`` (``model``: any). Answers like ``Run.neighbors`` (with ``epoch``)."""
    index, metric, nodes_file = cfg.index, cfg.metric, cfg.nodes_file
    found = Index(index)
    if run.path.resolve() not in found.runs():
        raise ConfigError(f"index {index} was built from run {found.meta['run']}, not {run.path.absolute()}")
    if metric != "model" and metric != found.meta["metric"]:
        raise ConfigError(
            f"embed.neighbors.metric: index {index} compares by {found.meta['metric']}, not {metric}; "
            "build another index with --metric, or leave --metric out"
        )
    # An index is a copy of one checkpoint: once training moves the checkpoint on, its answers
    # are an older epoch's, whatever the header says.
    epoch = run.meta["best" if cfg.checkpoint == "best" else "current"]["epoch"]
    if found.meta["epoch"] != epoch:
        raise ConfigError(
            f"index {index} holds epoch {found.meta['epoch']}, but the run's {cfg.checkpoint} checkpoint is epoch "
            f"{epoch}: rebuild it (strata embed index ... --checkpoint {cfg.checkpoint} --overwrite), or leave "
            "--index out for an exact scan"
        )
    queries = list(cfg.node)
    if nodes_file is not None:
        try:
            # utf-8-sig: a byte order mark (Windows editors write one) is no part of a name.
            lines = Path(nodes_file).read_text(encoding="utf-8-sig").splitlines()
        except OSError as e:
            raise ConfigError(f"--nodes-file {nodes_file}: cannot read it: {e}") from e
        queries += [line.strip() for line in lines if line.strip()]
    return {"epoch": found.meta["epoch"], **found.search(queries, cfg.top, cfg.any_type)}
