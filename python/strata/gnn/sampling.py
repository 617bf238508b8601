"""Strata's neighbour sampler on its own, with PyG's semantics: uniform, weighted, temporal and
per-edge-type (heterogeneous) sampling of a store's graph, without feature tiers::

    sampler = NeighborSampler("mag.strata", {("author", "writes", "paper"): [10, 5],
                                             ("paper", "cites", "paper"): [15, 10], ...})
    out = sampler.sample_hetero(("paper", seeds), batch_key=0)
    out.node["paper"], out.row[("paper", "cites", "paper")], out.num_sampled_nodes["author"]

- ``fanouts``: a list (neighbours per hop from the seeds outwards, -1: all) or, on a typed
  store, PyG's ``num_neighbors`` dict keyed by ``(src, rel, dst)`` (0: none of that type at a
  hop). A list on a typed store applies to each edge type separately, as in PyG.
- ``weighted=True``: neighbours drawn without replacement with probability proportional to
  edge weight (PyG's ``weight_attr``); zero-weight edges are never drawn.
- ``temporal_strategy="uniform"`` or ``"last"``: each seed comes with a time (PyG's
  ``input_time``), and its tree only takes edges no later than it: uniformly among those, or
  the most recent ones. Temporal samples are disjoint (each seed its own tree, a ``batch``
  vector naming each node's seed), as PyG makes them.
- ``edge_ids=True``: each sampled edge comes with its id, its row in the store's
  ``edges("train")`` (PyG's ``e_id``), which indexes ``Store.edge_weights()``,
  ``edge_times()`` and ``edge_features()``. Needs a format-2 store (one with edge attributes or
  types; a plain edge list's store numbers no edges).

Unlike PyG, which expands only the nodes first reached at the previous hop, each hop re-samples
every node known so far (DGL's blocks), so hop ``h >= 2`` also holds fresh edges into nodes of
earlier hops. Every choice is a pure function of ``(seed, batch_key)`` (and each seed's time),
whatever the thread count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _native
from ..store import Store
from .loader import fanout_list, node_id_bytes

#: The temporal strategies PyG's ``temporal_strategy`` names.
TEMPORAL_STRATEGIES = ("uniform", "last")


@dataclass
class SampledGraph:
    """A homogeneous sample: ``node`` the global ids (seeds first), ``row``/``col`` the local
    source and destination of each sampled edge (hop 1 first), ``edge_type`` each edge's type
    (None for an untyped store), ``batch`` each node's seed in a temporal sample (else None),
    ``num_sampled_nodes``/``num_sampled_edges`` per hop, ``edge`` each edge's id (its row in
    ``edges("train")``; None unless the sampler records ``edge_ids``). Arrays are int64."""

    node: np.ndarray
    row: np.ndarray
    col: np.ndarray
    edge_type: np.ndarray | None
    batch: np.ndarray | None
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    edge: np.ndarray | None = None


@dataclass
class HeteroSampledGraph:
    """A sample grouped by type, as PyG's ``HeteroSamplerOutput``: ``node[T]`` the type-local
    ids of the sampled nodes of type ``T`` (seeds first), ``row[E]``/``col[E]`` indices into
    ``node[src]``/``node[dst]`` of each sampled edge of edge type ``E = (src, rel, dst)``,
    ``batch[T]`` each node's seed in a temporal sample (else None), ``num_sampled_nodes[T]``
    per hop (hop 0: the seeds), ``num_sampled_edges[E]`` per hop, ``edge[E]`` each edge's id
    (its row in ``edges("train")``; None unless the sampler records ``edge_ids``). Arrays are
    int64."""

    node: dict
    row: dict
    col: dict
    batch: dict | None
    num_sampled_nodes: dict
    num_sampled_edges: dict
    edge: dict | None = None


def _ids(buf) -> np.ndarray:
    return np.frombuffer(buf, dtype="<u4").astype(np.int64)


def _edge_ids(buf) -> np.ndarray:
    return np.frombuffer(buf, dtype="<u8").astype(np.int64)


def sampler_config(
    store: Store, fanouts, *, weighted: bool, temporal_strategy, seed: int, threads: int, edge_ids: bool = False
) -> dict:
    """The native sampler's config for ``store``, every option checked against what the store
    has; errors name the option (``fanouts``, ``weighted``, ``temporal_strategy``,
    ``edge_ids``)."""
    attrs = store.edge_attributes
    if edge_ids and store.format_version < 2:
        raise ValueError(
            f"edge_ids: {store.path} is a format-1 store, whose edges carry no ids; convert with an edge "
            "attribute column (--columns src,dst,weight) or with edge types to number them"
        )
    if weighted and not attrs.get("weights"):
        raise ValueError(
            f"weighted: {store.path} has no edge weights (convert with --columns src,dst,weight, "
            "or sample without weighted=True)"
        )
    if temporal_strategy is not None:
        if temporal_strategy not in TEMPORAL_STRATEGIES:
            raise ValueError(
                f"temporal_strategy: expected one of {TEMPORAL_STRATEGIES} or None, got {temporal_strategy!r}"
            )
        if not attrs.get("times"):
            raise ValueError(f"temporal_strategy: {store.path} has no edge times (convert with --columns src,dst,time)")
    config = {
        "fanouts": [],
        "seed": int(seed),
        "threads": int(threads),
        "weighted": bool(weighted),
        "temporal": temporal_strategy,
        "edge_type_fanouts": [],
        "edge_ids": bool(edge_ids),
    }
    edge_types = store.edge_types
    if isinstance(fanouts, dict):
        if not edge_types:
            raise ValueError(
                f"fanouts: a dict of per-edge-type fanouts needs a typed store; {store.path} has no edge types"
            )
        unknown = [k for k in fanouts if tuple(k) not in edge_types]
        if unknown:
            raise ValueError(f"fanouts: unknown edge type(s) {unknown}; the store's edge types are {edge_types}")
        given = {tuple(k): fanout_list(v, f"fanouts[{tuple(k)}]") for k, v in fanouts.items()}
        missing = [e for e in edge_types if e not in given]
        if missing:
            raise ValueError(f"fanouts: no fanouts for edge type(s) {missing}; give a list for every edge type")
        config["edge_type_fanouts"] = [given[e] for e in edge_types]
    elif edge_types:
        # PyG applies a list to each edge type on its own.
        hops = fanout_list(fanouts, "fanouts")
        config["edge_type_fanouts"] = [hops for _ in edge_types]
    else:
        config["fanouts"] = fanout_list(fanouts, "fanouts")
    return config


class NeighborSampler:
    """Samples a store's graph (its CSC: a node's in-neighbours) with PyG's semantics; see the
    module's docstring for the options. The topology and the columns the options need
    (weights, times, edge types, edge ids) are held in RAM: ``topology_bytes`` of them."""

    def __init__(
        self,
        store: str | Path,
        fanouts=(15, 10),
        *,
        weighted: bool = False,
        temporal_strategy: str | None = None,
        seed: int = 0,
        threads: int = 0,
        edge_ids: bool = False,
    ):
        self.store = Store(store)
        self.temporal = temporal_strategy is not None
        self.edge_ids = edge_ids
        config = sampler_config(
            self.store,
            fanouts,
            weighted=weighted,
            temporal_strategy=temporal_strategy,
            seed=seed,
            threads=threads,
            edge_ids=edge_ids,
        )
        self._native = _native.Sampler(str(store), config)

    @property
    def topology_bytes(self) -> int:
        return self._native.topology_bytes

    def _times(self, seed_time, count: int):
        """Seed times as the native int64 bytes: required exactly when the sampler is temporal."""
        if not self.temporal:
            if seed_time is not None:
                raise ValueError("seed_time: given, but the sampler has no temporal_strategy")
            return None
        if seed_time is None:
            raise ValueError("seed_time: a temporal sampler needs one time per seed (PyG's input_time)")
        times = np.asarray(seed_time)
        if times.ndim == 0:
            times = np.full(count, times)
        if times.shape != (count,) or (times.size and not np.issubdtype(times.dtype, np.integer)):
            raise ValueError(
                f"seed_time: expected {count} integer times (one per seed), got {times.dtype} {times.shape}"
            )
        return times.astype("<i8").tobytes()

    def sample(self, seeds, batch_key: int = 0, seed_time=None) -> SampledGraph:
        """The sample of ``seeds`` (global node ids; distinct unless temporal) for
        ``batch_key``; ``seed_time`` (one per seed, or one for all) for a temporal sampler."""
        seeds = np.asarray(seeds)
        times = self._times(seed_time, seeds.size)
        nodes, hops, row, col, edges, types, batch, eids = self._native.sample(
            node_id_bytes(seeds), int(batch_key), times
        )
        return SampledGraph(
            node=_ids(nodes),
            row=_ids(row),
            col=_ids(col),
            edge_type=_ids(types) if self.store.is_typed else None,
            batch=_ids(batch) if self.temporal else None,
            num_sampled_nodes=list(hops),
            num_sampled_edges=list(edges),
            edge=_edge_ids(eids) if self.edge_ids else None,
        )

    def sample_hetero(self, seeds, batch_key: int = 0, seed_time=None) -> HeteroSampledGraph:
        """The sample of ``seeds`` grouped by type, for ``batch_key``. ``seeds`` is
        ``(node_type, type-local ids)`` (PyG's ``input_nodes``) or a dict ``{node_type: ids}``
        (PyG's seed dict, seeds of several types: a link's endpoints); a disjoint sample's
        ``batch`` indexes the seeds in that order (the dict's types one after the other).
        ``seed_time`` as in :meth:`sample`, or with a dict of seeds a dict of the same types."""
        if not self.store.is_typed:
            raise ValueError(f"seeds: {self.store.path} has no node types; use sample()")
        if isinstance(seeds, dict):
            groups = list(seeds.items())
        elif isinstance(seeds, tuple) and len(seeds) == 2:
            groups = [seeds]
        else:
            raise ValueError(f"seeds: expected (node_type, ids) or {{node_type: ids}}, got {type(seeds).__name__}")
        if isinstance(seed_time, dict):
            if not isinstance(seeds, dict) or set(seed_time) != set(seeds):
                raise ValueError(
                    f"seed_time: a dict of times needs a dict of seeds with the same node types, "
                    f"got times for {sorted(seed_time)}"
                )
            seed_time = np.concatenate([np.asarray(seed_time[t]).reshape(-1) for t, _ in groups])
        names = self.store.node_types
        offsets = self.store.node_type_offsets
        ids = []
        for node_type, local in groups:
            if node_type not in names:
                raise ValueError(f"seeds: unknown node type {node_type!r}; the store's node types are {names}")
            t = names.index(node_type)
            local = np.asarray(local, dtype=np.int64).reshape(-1)
            count = offsets[t + 1] - offsets[t]
            if local.size and (local.min() < 0 or local.max() >= count):
                bad = local.min() if local.min() < 0 else local.max()
                raise ValueError(f"seeds: {node_type} id {bad} is out of range ({count} nodes of the type)")
            ids.append(local + offsets[t])
        ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
        times = self._times(seed_time, ids.size)
        nodes, hops, batch, rows, cols, edges, eids = self._native.sample_hetero(
            node_id_bytes(ids), int(batch_key), times
        )
        edge_types = self.store.edge_types
        return HeteroSampledGraph(
            node={name: _ids(b) for name, b in zip(names, nodes, strict=True)},
            row={e: _ids(b) for e, b in zip(edge_types, rows, strict=True)},
            col={e: _ids(b) for e, b in zip(edge_types, cols, strict=True)},
            batch={name: _ids(b) for name, b in zip(names, batch, strict=True)} if self.temporal else None,
            num_sampled_nodes={name: list(h) for name, h in zip(names, hops, strict=True)},
            num_sampled_edges={e: list(h) for e, h in zip(edge_types, edges, strict=True)},
            edge={e: _edge_ids(b) for e, b in zip(edge_types, eids, strict=True)} if self.edge_ids else None,
        )
