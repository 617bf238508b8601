"""``strata gnn train`` on a typed store (node and edge types, format 2): node classification of
one node type (the target), from disk.

Each batch's seeds are target nodes; :class:`~strata.gnn.sampling.NeighborSampler` draws their
neighbourhoods with a fanout per edge type, and the sampled nodes' rows are read from each
node type's feature array (``features_tI``, memory-mapped: only the sampled rows are read) into
a :class:`~strata.gnn.models.TypedRows`. The native data path's hot set, cache and device tier
read one global feature array, which typed stores do not have, so typed batches read every row
from the store's files (through the page cache). The sampler holds the topology (CSC with edge
types) in RAM. The next batch is sampled and read on a worker thread while the model trains on
the current one. The plan checks against ``memory`` the process's anonymous memory when the
store is opened (the interpreter, torch, the model), the topology, the batches alive at once and
what training one adds (the model's :meth:`~strata.gnn.models.TypedGNN.training_costs` over the
blocks of batches sampled at open), so that fanouts too deep for the budget are refused before
an epoch starts rather than met by the kernel's OOM killer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _native
from ..errors import ConfigError
from ..store import Store
from ..torchrun import process_bytes
from ..units import fmt_bytes
from ._torch import require_torch
from .sampling import NeighborSampler


def target_type(store: Store, name: str | None) -> int:
    """The index of the node type to classify: ``name``, or the only node type with labels;
    errors name ``gnn.train.target_type``."""
    labelled = [t["name"] for t in store.manifest["node_types"] if t.get("labels")]
    if name is None:
        if len(labelled) == 1:
            return store.node_types.index(labelled[0])
        if not labelled:
            raise ConfigError(f"gnn.train.target_type: {store.path} has no node type with labels")
        raise ConfigError(
            f"gnn.train.target_type: {store.path} has labels for several node types ({', '.join(labelled)}); "
            "name the one to classify"
        )
    if name not in store.node_types:
        raise ConfigError(
            f"gnn.train.target_type: {store.path} has no node type {name!r}; its node types are {store.node_types}"
        )
    if name not in labelled:
        raise ConfigError(
            f"gnn.train.target_type: node type {name!r} of {store.path} has no labels "
            f"(labelled types: {', '.join(labelled) or 'none'})"
        )
    return store.node_types.index(name)


def fanout_dict(store: Store, fanouts: list[int], table: dict | None) -> dict:
    """The sampler's per-edge-type fanouts: ``table`` (keys ``src:rel:dst``) where it names an
    edge type, ``fanouts`` for the others; every list has one entry per layer. Errors name
    ``gnn.train.edge_fanouts``."""
    table = dict(table or {})
    by_key = {":".join(e): e for e in store.edge_types}
    unknown = [k for k in table if k not in by_key]
    if unknown:
        raise ConfigError(
            f"gnn.train.edge_fanouts: unknown edge type(s) {', '.join(unknown)}; {store.path} has {', '.join(by_key)}"
        )
    uneven = [k for k, v in table.items() if len(v) != len(fanouts)]
    if uneven:
        raise ConfigError(
            f"gnn.train.edge_fanouts: {', '.join(uneven)} must have {len(fanouts)} fanouts (one per layer, as "
            f"gnn.train.fanouts {fanouts})"
        )
    return {e: list(table.get(k, fanouts)) for k, e in by_key.items()}


#: Batches sampled at open to size a batch (the largest of each figure is planned).
ESTIMATE_BATCHES = 4

#: Headroom over the largest batch sampled at open: batches vary (hubs among the seeds).
ESTIMATE_MARGIN = 1.25

#: The estimate's seed stream and the first of its batch keys (training's keys are
#: ``epoch << 32 | batch``, far below).
ESTIMATE_STREAM, ESTIMATE_KEY = 0x7E57, 1 << 62

#: Batches alive at once: the one training, the one the loop held before it (until the loop's
#: variable moves on) and the one the worker prepares.
BATCHES_ALIVE = 3

#: Bytes a batch holds per sampled node beside its feature row (its id, its node type, its
#: type's index and the rows' positions: int64 each) and per sampled edge (source,
#: destination and edge type, int64 each).
NODE_BYTES, EDGE_BYTES = 32, 24


def hop_blocks(s) -> list[tuple[int, int, slice]]:
    """The blocks of sample ``s`` (a :class:`~strata.gnn.sampling.SampledGraph`), input layer
    first: each block's sources, destinations and the slice of ``s.row``/``s.col`` holding its
    edges. Hop h's edges run from the nodes known after hop h into those known before it; the
    input layer is the outermost hop."""
    hops = np.cumsum(s.num_sampled_nodes)
    ends = np.concatenate([[0], np.cumsum(s.num_sampled_edges)])
    return [
        (int(hops[h]), int(hops[h - 1]), slice(int(ends[h - 1]), int(ends[h])))
        for h in range(len(s.num_sampled_edges), 0, -1)
    ]


@dataclass
class BatchShape:
    """The batch the plan sizes: ``nodes`` sampled, ``edges`` sampled, ``row_bytes`` of their
    feature rows, and per block (input layer first) its sources, destinations and edges."""

    nodes: int
    edges: int
    row_bytes: int
    blocks: list[tuple[int, int, int]]

    def bytes(self) -> int:
        """What the batch itself holds: its feature rows, its ids and its blocks' edges."""
        return self.row_bytes + NODE_BYTES * self.nodes + EDGE_BYTES * self.edges

    def training_bytes(self, training: dict | None) -> int:
        """What training this batch adds with the model's ``training`` costs
        (:meth:`~strata.gnn.models.TypedGNN.training_costs`; None: nothing)."""
        if not training:
            return 0
        if not self.blocks:  # no seeds to sample: the parameters' gradients and state only
            return training["fixed_bytes"]
        return training["fixed_bytes"] + sum(
            src * c["src_row"] + dst * c["dst_row"] + edges * c["edge"]
            for c, (src, dst, edges) in zip(training["layers"], self.blocks, strict=True)
        )


@dataclass
class TypedBatch:
    """One batch: ``seeds`` (type-local ids of the target type), ``nodes`` (global ids of all
    sampled nodes, seeds first), ``blocks`` (typed, input layer first), ``x`` (their
    :class:`~strata.gnn.models.TypedRows`) and ``y`` (the seeds' labels), all on the device."""

    index: int
    seeds: np.ndarray
    nodes: np.ndarray
    blocks: list
    x: object
    y: object

    @property
    def num_seeds(self) -> int:
        return len(self.seeds)


class TypedEpochLoader:
    """One epoch's batches (:class:`TypedBatch`) of a :class:`TypedGnnData` over ``nodes``
    (target local ids, in order); ``stats()`` counts batches, rows and bytes read in the shape
    of the native loader's tiers (every row is a disk row)."""

    def __init__(self, data, nodes: np.ndarray, epoch: int, device: str):
        self.torch = require_torch()
        self.data, self.nodes, self.epoch = data, nodes, epoch
        self.device = self.torch.device(device)
        self._lock = threading.Lock()
        self._stats = {"batches": 0, "rows": 0, "bytes": 0, "sample_seconds": 0.0, "read_seconds": 0.0}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="strata-typed")

    def _make(self, index: int) -> TypedBatch:
        from .models import Block, TypedRows

        torch, data = self.torch, self.data
        seeds = self.nodes[index * data.batch_size : (index + 1) * data.batch_size]
        t0 = time.monotonic()
        # Batch keys are distinct across epochs: a node sampled in two epochs gets fresh draws.
        s = data.sampler.sample(seeds + data.offsets[data.target], batch_key=(self.epoch << 32) | index)
        t1 = time.monotonic()
        rows, pos, read = data.read_rows(s.node)
        t2 = time.monotonic()
        ntype = torch.from_numpy(np.searchsorted(data.offsets, s.node, side="right") - 1)
        blocks = []
        for n_src, n_dst, e in hop_blocks(s):
            blk = Block(
                n_src,
                n_dst,
                torch.from_numpy(s.row[e]),
                torch.from_numpy(s.col[e]),
                torch.from_numpy(s.edge_type[e]),
                ntype[:n_src],
            )
            blocks.append(blk.to(self.device))
        y = torch.from_numpy(np.asarray(data.labels[seeds], dtype=np.int64)).to(self.device)
        x = TypedRows(len(s.node), rows, pos).to(self.device)
        with self._lock:
            st = self._stats
            st["batches"] += 1
            st["rows"] += sum(len(r) for r in rows if r is not None)
            st["bytes"] += read
            st["sample_seconds"] += t1 - t0
            st["read_seconds"] += t2 - t1
        return TypedBatch(index, seeds, s.node, blocks, x, y)

    def __iter__(self) -> Iterator[TypedBatch]:
        count = -(-len(self.nodes) // self.data.batch_size)
        ahead = self._pool.submit(self._make, 0) if count else None
        for i in range(count):
            batch = ahead.result()
            ahead = self._pool.submit(self._make, i + 1) if i + 1 < count else None
            yield batch

    def stats(self) -> dict:
        """Batches made, sampling and row-reading seconds, and ``tiers`` (rows read, all from
        disk, and their bytes) as the native loader reports them."""
        with self._lock:
            st = dict(self._stats)
        return {
            "batches": st["batches"],
            "sample_seconds": st["sample_seconds"],
            "read_seconds": st["read_seconds"],
            "tiers": {"rows": st["rows"], "disk_rows": st["rows"], "disk_bytes_read": st["bytes"]},
        }

    def close(self) -> None:
        """Stops the epoch: the batch being prepared is dropped."""
        self._pool.shutdown(wait=True, cancel_futures=True)


class TypedGnnData:
    """A typed store opened for node classification of node type ``target`` (an index, see
    :func:`target_type`), sampled with ``fanouts`` (a dict per edge type, see
    :func:`fanout_dict`) in batches of ``batch_size`` seeds. ``memory``: the process's budget
    in bytes, which its anonymous memory at open, the sampler's topology, the batches alive at
    once and what training one adds (``training``: the model's
    :meth:`~strata.gnn.models.TypedGNN.training_costs`) must fit. Has the
    interface :func:`strata.gnn.train.train` uses of
    :class:`~strata.gnn.loader.GnnData` (``nodes``, ``has_split``, ``loader``, ``plan``,
    ``memory_plan``)."""

    split = None
    hot_seconds = None
    #: The class of :meth:`loader`'s epochs (a subclass may make its batches another way).
    epoch_loader: type = TypedEpochLoader

    def __init__(
        self,
        store: str | Path,
        target: int,
        fanouts: dict,
        *,
        batch_size: int,
        memory: int,
        seed: int,
        threads: int,
        device: str = "cpu",
        training: dict | None = None,
        progress=None,
    ):
        self.store = Store(store)
        self.target, self.batch_size, self.device = target, batch_size, device
        self.offsets = self.store.node_type_offsets
        self.features = [self.store.type_array("features", t) for t in range(len(self.store.node_types))]
        self.labels = self.store.type_array("labels", target)
        self.sampler = NeighborSampler(store, fanouts, seed=seed, threads=threads)
        self.config = {"seed": seed, "batch_size": batch_size, "memory": memory}
        topology = self.sampler.topology_bytes
        runtime = process_bytes("RssAnon") or 0
        if runtime + topology > memory:
            raise ConfigError(
                f"gnn.train.memory: the process holds {fmt_bytes(runtime)} and the typed sampler's topology "
                f"{fmt_bytes(topology)} in RAM, more than the budget {fmt_bytes(memory)}"
            )
        shape = self._largest_batch()
        batches = BATCHES_ALIVE * shape.bytes()
        train_bytes = shape.training_bytes(training)
        total = runtime + topology + batches + train_bytes
        if total > memory:
            raise ConfigError(
                f"gnn.train.memory: budget {fmt_bytes(memory)} cannot hold the process ({fmt_bytes(runtime)}), the "
                f"typed sampler's topology ({fmt_bytes(topology)}), {BATCHES_ALIVE} batches alive at once "
                f"({fmt_bytes(batches)}: about {shape.nodes:,} nodes and {shape.edges:,} edges each) and training "
                f"one ({fmt_bytes(train_bytes)}): {fmt_bytes(total)} in all; raise --memory to at least that, or "
                "lower --batch-size, the fanouts (fewer layers, or smaller) or --hidden"
            )
        feature_bytes = sum(f.nbytes for f in self.features if f is not None)
        names = self.store.node_types
        self.plan = {
            "memory": memory,
            "runtime": runtime,
            "topology": topology,
            "batches": batches,
            "training": train_bytes,
            "batch_nodes": shape.nodes,
            "batch_edges": shape.edges,
            "target_type": names[target],
            "fanouts": {":".join(e): f for e, f in fanouts.items()},
            "feature_files": feature_bytes,
            "features": {
                n: None if f is None else {"rows": f.shape[0], "dim": f.shape[1], "dtype": str(f.dtype)}
                for n, f in zip(names, self.features, strict=True)
            },
        }
        # In the shape every engine's plan takes (strata_store::budget::MemoryPlan).
        self.memory_plan = {
            "engine": "gnn",
            "memory": memory,
            "minimum": total,
            "parts": [
                {"name": "runtime", "bytes": runtime, "detail": "anonymous memory as measured at open"},
                {"name": "training", "bytes": train_bytes, "detail": "what training a batch adds"},
                {"name": "topology", "bytes": topology, "detail": "the sampler's CSC with edge types"},
                {
                    "name": "batches",
                    "bytes": batches,
                    "detail": f"{BATCHES_ALIVE} alive of about {shape.nodes:,} nodes and {shape.edges:,} edges",
                },
            ],
            "data": [{"name": "node features", "bytes": feature_bytes, "resident": 0, "elsewhere": "SSD"}],
        }
        if progress:
            for line in self.plan_lines():
                progress("message", line)

    def _largest_batch(self) -> BatchShape:
        """The largest of each figure over :data:`ESTIMATE_BATCHES` batches of training seeds
        (all the target type's nodes without a train split) drawn without replacement and
        sampled as training samples them, times :data:`ESTIMATE_MARGIN`."""
        seeds = self.nodes("train") if self.has_split("train") else np.arange(len(self.labels))
        rng = np.random.default_rng([self.config["seed"], ESTIMATE_STREAM])
        row_bytes = np.array([0 if f is None else f.shape[1] * f.dtype.itemsize for f in self.features])
        nodes = edges = rows = 0
        blocks: list[list[int]] = []
        for i in range(ESTIMATE_BATCHES if len(seeds) else 0):
            chosen = rng.choice(len(seeds), size=min(self.batch_size, len(seeds)), replace=False)
            # Batch keys of their own: training's draws are a function of their keys alone.
            s = self.sampler.sample(seeds[chosen] + self.offsets[self.target], batch_key=ESTIMATE_KEY + i)
            types = self.store.node_type_of(s.node)
            nodes, edges = max(nodes, len(s.node)), max(edges, len(s.row))
            rows = max(rows, int(np.bincount(types, minlength=len(row_bytes)) @ row_bytes))
            shape = [[n_src, n_dst, e.stop - e.start] for n_src, n_dst, e in hop_blocks(s)]
            blocks = [list(map(max, a, b)) for a, b in zip(blocks, shape, strict=True)] if blocks else shape

        n = self.store.num_nodes

        def grow(v: int, most: int | None = None) -> int:
            return min(int(v * ESTIMATE_MARGIN), most if most is not None else 1 << 62)

        return BatchShape(
            grow(nodes, n), grow(edges), grow(rows), [(grow(src, n), grow(dst, n), grow(e)) for src, dst, e in blocks]
        )

    def plan_lines(self) -> list[str]:
        """The plan, for printing at start."""
        p = self.plan
        lines = [
            *_native.describe_memory_plan(self.memory_plan),
            f"typed store: classify {p['target_type']} nodes; feature rows read from the store files "
            f"({fmt_bytes(p['feature_files'])}), no hot set or cache",
        ]
        for name, f in p["features"].items():
            what = "no features: one learned vector" if f is None else f"{f['rows']:,} x {f['dim']} {f['dtype']}"
            lines.append(f"  node type {name}: {what}")
        for key, f in p["fanouts"].items():
            lines.append(f"  fanouts {key}: {f}")
        return lines

    def has_split(self, split: str) -> bool:
        """Whether the target type has node split ``split``."""
        return self.store.has(f"node_{split}_t{self.target}")

    def nodes(self, split: str) -> np.ndarray:
        """The target type's local ids of a split (``train``, ``valid``, ``test``)."""
        ids = self.store.type_array(f"node_{split}", self.target)
        if ids is None:
            name = self.store.node_types[self.target]
            raise ValueError(f"{self.store.path}: node type {name} has no node split {split!r}")
        return np.asarray(ids, dtype=np.int64)

    def loader(self, nodes, *, shuffle: bool = True, device: str | None = None, epoch: int = 0) -> TypedEpochLoader:
        """The batches of one epoch over ``nodes`` (target-type local ids, or a split name),
        shuffled by ``(seed, epoch)`` when ``shuffle``."""
        if isinstance(nodes, str):
            nodes = self.nodes(nodes)
        nodes = np.asarray(nodes, dtype=np.int64)
        if shuffle:
            nodes = nodes[np.random.default_rng([self.config["seed"], epoch]).permutation(len(nodes))]
        return self.epoch_loader(self, nodes, epoch, device or self.device)

    def read_rows(self, nodes: np.ndarray):
        """The rows of global ids ``nodes`` by node type: ``(rows, index, bytes read)``."""
        torch = require_torch()
        types = np.searchsorted(self.offsets, nodes, side="right") - 1
        rows, index, read = [], [], 0
        for t, feats in enumerate(self.features):
            pos = np.flatnonzero(types == t)
            index.append(torch.from_numpy(pos))
            if feats is None:
                rows.append(None)
                continue
            local = nodes[pos] - self.offsets[t]
            rows.append(torch.from_numpy(np.ascontiguousarray(feats[local])))
            read += len(local) * feats.shape[1] * feats.dtype.itemsize
        return rows, index, read
