"""PyG's ``NeighborLoader`` and ``LinkNeighborLoader`` over any Strata store: typed
(``HeteroData`` batches, ``num_neighbors`` per edge type), weighted and temporal. The sampling is
Strata's (:class:`strata.gnn.sampling.NeighborSampler`); the seeds, negatives and batch metadata
are PyG's own ``node_sample`` / ``edge_sample``, so batches carry what PyG's ``NeighborSampler``
puts in them::

    from torch_geometric.loader import NeighborLoader
    from strata.gnn.pyg_hetero import hetero_stores
    from strata.gnn.pyg_sampler import StrataNeighborSampler

    fs, gs = hetero_stores("mag.strata")
    num_neighbors = {("paper", "cites", "paper"): [10, 5], ("author", "writes", "paper"): [5, 5], ...}
    sampler = StrataNeighborSampler((fs, gs), num_neighbors, time_attr="edge_time", temporal_strategy="last")
    loader = NeighborLoader((fs, gs), num_neighbors, input_nodes=("paper", ids), input_time=times,
                            time_attr="edge_time", batch_size=512, neighbor_sampler=sampler)

A plain store goes the same way with :func:`strata.gnn.pyg.stores` (features through the tiers)
and homogeneous ``Data`` batches. PyG's loaders build their own sampler unless given one, and
that one refuses ``weight_attr`` on a feature/graph store pair, so the options go to this
sampler (``time_attr`` also to the loader, which checks it against ``input_time`` /
``edge_label_time``).

What it does as PyG does: ``num_neighbors`` as a list or a dict by edge type (a list on a typed
store applies to each edge type; a dict must name every edge type unless ``NumNeighbors(...,
default=)``), ``weight_attr="edge_weight"`` (neighbours drawn without replacement with
probability proportional to the weight), ``time_attr="edge_time"`` with ``temporal_strategy``
``"uniform"`` or ``"last"`` (a seed's tree only takes edges no later than its time; disjoint
trees, ``batch`` naming each node's seed), ``subgraph_type`` ``"directional"`` or
``"bidirectional"``, binary and triplet negative sampling, ``edge_label_time``.

Where it differs: each hop re-samples every node known so far (DGL's blocks), not only the
nodes first reached at the previous hop, so ``num_sampled_edges`` of hop ``h >= 2`` also counts
fresh edges into earlier hops' nodes.

Edge ids: on a format-2 store (one with edge attributes or types) each batch's ``e_id`` (per edge
type in a ``HeteroData`` batch) names each sampled edge's row in the store's ``edges("train")``,
as PyG's ``e_id`` names columns of ``edge_index``. PyG fetches no edge attributes from a
feature/graph store pair ("TODO support edge features" in its loader), so pass
``transform=EdgeAttributes(store)`` to the loader to fill ``edge_weight``, ``edge_time`` and
``edge_attr`` from them. A format-1 store (a plain edge list) numbers no edges: its batches have
no ``e_id``. Not supported (NotImplementedError):
``replace=True``, ``subgraph_type="induced"``, ``disjoint=True`` without times, node-level times
(PyG's ``time_attr`` naming a node attribute: a store holds edge times); ``weight_attr`` with
``temporal_strategy="last"`` is a ``ConfigError`` from the sampler.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from ..errors import MissingDependencyError
from ..store import Store
from ._torch import require_torch
from .pyg import (
    PYG_MISSING,
    BaseSampler,
    EdgeSamplerInput,
    NegativeSampling,
    NodeSamplerInput,
    SamplerOutput,
    StrataGraphStore,
)
from .pyg_hetero import StrataHeteroGraphStore
from .sampling import NeighborSampler

torch = require_torch()
try:
    from torch_geometric.sampler import HeteroSamplerOutput
    from torch_geometric.sampler.base import NumNeighbors, SubgraphType
    from torch_geometric.sampler.neighbor_sampler import edge_sample, node_sample
except ImportError as e:  # pragma: no cover - exercised only without PyG
    raise MissingDependencyError(PYG_MISSING) from e

#: The PyG attribute names of a store's edge weights and times (as the feature stores serve them).
WEIGHT_ATTR, TIME_ATTR = "edge_weight", "edge_time"


def _store_of(data) -> Store:
    """The store behind ``data``: a path, a :class:`Store`, or a ``(feature_store, graph_store)``
    pair from :func:`strata.gnn.pyg.stores` or :func:`strata.gnn.pyg_hetero.hetero_stores`."""
    if isinstance(data, Store):
        return data
    if isinstance(data, (str, Path)):
        return Store(data)
    if isinstance(data, tuple) and len(data) == 2:
        if isinstance(data[1], StrataHeteroGraphStore):
            return data[1].store
        if isinstance(data[1], StrataGraphStore):
            return data[1].data.store
    raise TypeError(
        "data: expected a store path, a Store or the (feature_store, graph_store) pair of "
        f"strata.gnn.pyg.stores / strata.gnn.pyg_hetero.hetero_stores, got {type(data).__name__}"
    )


class StrataNeighborSampler(BaseSampler):
    """PyG ``BaseSampler`` for ``NeighborLoader`` and ``LinkNeighborLoader`` over a Strata store
    (see the module's doc for what it supports). Options keep PyG's ``NeighborSampler`` names;
    ``seed`` keys the sampler's random streams and batch ``i`` is drawn with key ``first_key +
    i``, so a loader's batches are the same on every run with the same seeds (negative samples
    are PyG's, drawn from torch's generator). ``threads`` 0: all cores."""

    def __init__(
        self,
        data,
        num_neighbors,
        *,
        weight_attr: str | None = None,
        time_attr: str | None = None,
        temporal_strategy: str = "uniform",
        subgraph_type: str = "directional",
        replace: bool = False,
        disjoint: bool = False,
        seed: int = 0,
        first_key: int = 0,
        threads: int = 0,
    ):
        store = _store_of(data)
        if replace:
            raise NotImplementedError(
                "StrataNeighborSampler: replace=True is not supported; Strata samples without replacement"
            )
        self.subgraph_type = SubgraphType(subgraph_type)
        if self.subgraph_type == SubgraphType.induced:
            raise NotImplementedError(
                "StrataNeighborSampler: subgraph_type='induced' is not supported; use 'directional' or 'bidirectional'"
            )
        if disjoint and time_attr is None:
            raise NotImplementedError(
                "StrataNeighborSampler: disjoint=True without times is not supported; temporal sampling "
                f"(time_attr={TIME_ATTR!r}) is always disjoint"
            )
        attrs = store.edge_attributes
        if weight_attr is not None:
            if weight_attr != WEIGHT_ATTR:
                raise ValueError(f"weight_attr: a store's edge weights are {WEIGHT_ATTR!r}, got {weight_attr!r}")
            if not attrs.get("weights"):
                raise ValueError(f"weight_attr: {store.path} has no edge weights (convert with a weight column)")
        if time_attr is not None:
            if time_attr != TIME_ATTR:
                raise NotImplementedError(
                    f"StrataNeighborSampler: time_attr={time_attr!r}: only edge times ({TIME_ATTR!r}) are "
                    "supported; a store holds no node-level times"
                )
            if not attrs.get("times"):
                raise ValueError(f"time_attr: {store.path} has no edge times (convert with a time column)")
        self.store = store
        self.is_temporal = time_attr is not None
        if not isinstance(num_neighbors, NumNeighbors):
            num_neighbors = NumNeighbors(num_neighbors)
        self.num_neighbors = num_neighbors
        fanouts = num_neighbors.get_values(store.edge_types if store.is_typed else None)
        self._sampler = NeighborSampler(
            store.path,
            fanouts,
            weighted=weight_attr is not None,
            temporal_strategy=temporal_strategy if self.is_temporal else None,
            seed=seed,
            threads=threads,
            edge_ids=store.format_version >= 2,
        )
        if store.is_typed:
            counts = np.diff(store.node_type_offsets)
            self.num_nodes = {t: int(c) for t, c in zip(store.node_types, counts, strict=True)}
        else:
            self.num_nodes = store.num_nodes
        self._keys = itertools.count(first_key)

    @property
    def is_hetero(self) -> bool:
        return self.store.is_typed

    @property
    def disjoint(self) -> bool:
        """Temporal samples are disjoint (one tree per seed), others are not: PyG's meaning."""
        return self.is_temporal

    def _check_time(self, time, what: str):
        """Refuses seed times on a sampler without ``time_attr`` and their absence on one with."""
        if time is not None and not self.is_temporal:
            raise ValueError(f"{what}: given, but the sampler was built without time_attr={TIME_ATTR!r}")
        if time is None and self.is_temporal:
            raise ValueError(f"{what}: a temporal sampler (time_attr={TIME_ATTR!r}) needs a time per seed")

    def sample_from_nodes(self, inputs: NodeSamplerInput) -> SamplerOutput | HeteroSamplerOutput:
        """PyG's ``NeighborLoader`` batch: ``inputs.node`` (of ``inputs.input_type`` on a typed
        store) with ``inputs.time`` (``input_time``) when temporal."""
        self._check_time(inputs.time, "input_time")
        return self._finish(node_sample(inputs, self._sample))

    def sample_from_edges(
        self, inputs: EdgeSamplerInput, neg_sampling: NegativeSampling | None = None
    ) -> SamplerOutput | HeteroSamplerOutput:
        """PyG's ``LinkNeighborLoader`` batch: the seed edges' endpoints (and PyG's negatives)
        sampled as seeds, with ``inputs.time`` (``edge_label_time``) when temporal."""
        self._check_time(inputs.time, "edge_label_time")
        return self._finish(edge_sample(inputs, self._sample, self.num_nodes, self.disjoint, None, neg_sampling))

    def _finish(self, out):
        if self.subgraph_type == SubgraphType.bidirectional:
            out = out.to_bidirectional()
        return out

    def _sample(self, seed, seed_time=None) -> SamplerOutput | HeteroSamplerOutput:
        """``sample_fn`` of PyG's ``node_sample`` / ``edge_sample``: ``seed`` global ids (plain
        store) or ``{node_type: local ids}`` (typed store), ``seed_time`` parallel to it."""
        key = next(self._keys)
        if isinstance(seed, dict):
            if not self.is_hetero:
                raise ValueError(f"input_nodes: {self.store.path} has no node types; give ids without a node type")
            times = None if seed_time is None else {t: v.cpu().numpy() for t, v in seed_time.items()}
            out = self._sampler.sample_hetero({t: v.cpu().numpy() for t, v in seed.items()}, key, times)
            return HeteroSamplerOutput(
                node={t: torch.from_numpy(v) for t, v in out.node.items()},
                row={e: torch.from_numpy(v) for e, v in out.row.items()},
                col={e: torch.from_numpy(v) for e, v in out.col.items()},
                edge=None if out.edge is None else {e: torch.from_numpy(v) for e, v in out.edge.items()},
                batch=None if out.batch is None else {t: torch.from_numpy(v) for t, v in out.batch.items()},
                num_sampled_nodes=out.num_sampled_nodes,
                num_sampled_edges=out.num_sampled_edges,
            )
        if self.is_hetero:
            raise ValueError(
                f"input_nodes: {self.store.path} is typed; give (node_type, ids), or an edge type with the seed edges"
            )
        times = None if seed_time is None else seed_time.cpu().numpy()
        out = self._sampler.sample(seed.cpu().numpy(), key, times)
        return SamplerOutput(
            node=torch.from_numpy(out.node),
            row=torch.from_numpy(out.row),
            col=torch.from_numpy(out.col),
            edge=None if out.edge is None else torch.from_numpy(out.edge),
            batch=None if out.batch is None else torch.from_numpy(out.batch),
            num_sampled_nodes=out.num_sampled_nodes,
            num_sampled_edges=out.num_sampled_edges,
        )


class EdgeAttributes:
    """A PyG loader ``transform`` that fills a batch's edge attributes from its ``e_id``: the
    store's ``edge_weight`` (float32), ``edge_time`` (int64) and ``edge_attr`` (its edge
    features, ``(E, d)``), each where the store has it, per edge type in a ``HeteroData`` batch.
    ``e_id`` is a row of ``edges("train")``, which the three arrays are parallel to."""

    def __init__(self, store: str | Path | Store):
        self.store = store if isinstance(store, Store) else Store(store)
        if self.store.format_version < 2:
            raise ValueError(f"EdgeAttributes: {self.store.path} is a format-1 store: it has no edge attributes")
        self.columns = {
            WEIGHT_ATTR: self.store.edge_weights(),
            TIME_ATTR: self.store.edge_times(),
            "edge_attr": self.store.edge_features(),
        }

    def __call__(self, batch):
        for edges in batch.edge_stores:
            if "e_id" not in edges:
                raise ValueError("EdgeAttributes: the batch has no e_id; sample it with StrataNeighborSampler")
            ids = edges["e_id"].cpu().numpy()
            for name, column in self.columns.items():
                if column is not None:
                    edges[name] = torch.from_numpy(np.asarray(column[ids]))
        return batch
