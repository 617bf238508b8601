"""PyG interop: a Strata store as PyG's ``FeatureStore`` and ``GraphStore``, and a ``BaseSampler``
backed by Strata's sampler, so PyG loaders and models run on features that stay on disk::

    from torch_geometric.loader import NeighborLoader
    from strata.gnn import GnnData
    from strata.gnn.pyg import stores, StrataSampler

    data = GnnData("products.strata", fanouts=[15, 10], memory="2G")
    fs, gs = stores(data)
    loader = NeighborLoader((fs, gs), num_neighbors=[15, 10], batch_size=1024,
                            input_nodes=torch.from_numpy(data.nodes("train")),
                            neighbor_sampler=StrataSampler(data))

Link prediction goes the same way through ``LinkNeighborLoader``, with
``edge_label_index=(None, torch.from_numpy(data.edges("train")))`` (PyG wants the edge type with
a feature and graph store; the store's is None), ``neg_sampling=NegativeSampling("binary",
amount)`` and ``neighbor_sampler=StrataSampler(data)``.

Feature reads go through the store's tiers (hot set, cache, direct reads); the graph store hands
PyG the store's CSC without copying it. Needs ``torch_geometric`` (``pip install torch_geometric``).
Typed (format 2) stores are served per node and edge type by :mod:`strata.gnn.pyg_hetero`;
typed, weighted and temporal sampling for PyG's loaders is :mod:`strata.gnn.pyg_sampler`.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np

from ..errors import MissingDependencyError
from ._torch import require_torch
from .loader import FLOAT_DTYPES, GnnData, node_id_bytes

torch = require_torch()
#: The error without PyG, shared by the modules that need it.
PYG_MISSING = "strata.gnn.pyg needs PyTorch Geometric: pip install torch_geometric"
try:
    from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
    from torch_geometric.sampler import (
        BaseSampler,
        EdgeSamplerInput,
        NegativeSampling,
        NodeSamplerInput,
        SamplerOutput,
    )
except ImportError as e:  # pragma: no cover - exercised only without PyG
    raise MissingDependencyError(PYG_MISSING) from e


def tensor_rows(index, count: int) -> np.ndarray | None:
    """The rows of ``count`` that PyG's ``TensorAttr`` index selects, read as torch indexing
    reads it: None (all rows: returns None), a slice, one id (a 0-d array, so the result is one
    row), a 1-D tensor or array of ids (negative ones counting from the end) or a boolean mask
    with one entry per row. Returns int64 ids in ``[0, count)``; raises IndexError naming what
    is wrong (an id out of range, a mask of another length, ids that are not integers: a float
    index would be truncated onto another row)."""
    if index is None:
        return None
    if isinstance(index, slice):
        return np.arange(*index.indices(count), dtype=np.int64)
    raw = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    if raw.dtype == bool:
        if raw.shape != (count,):
            raise IndexError(f"a boolean mask must have one entry per row ({count}), got shape {raw.shape}")
        return np.flatnonzero(raw)
    if raw.size and raw.dtype.kind not in "iu":
        raise IndexError(f"expected integer row ids, got {raw.dtype}")
    if raw.ndim > 1:
        raise IndexError(f"expected one row id or a 1-D array of them, got shape {raw.shape}")
    ids = raw.astype(np.int64)
    if ids.size and (ids.min() < -count or ids.max() >= count):
        bad = int(ids[(ids < -count) | (ids >= count)].reshape(-1)[0])
        raise IndexError(f"index {bad} is out of range for {count} rows")
    return np.where(ids < 0, ids + count, ids)


class StrataFeatureStore(FeatureStore):
    """Read-only node attributes of a store: ``x`` (features, through the tiers) and ``y``
    (labels, when the store has them). One node type (``group_name`` None)."""

    def __init__(self, data: GnnData):
        super().__init__()
        self.data = data
        self._float = FLOAT_DTYPES[data.dtype](torch)

    def _get_tensor(self, attr: TensorAttr):
        ids = tensor_rows(attr.index, self.data.num_nodes)
        nodes = np.arange(self.data.num_nodes) if ids is None else ids
        if attr.attr_name == "x" and self.data.device_path is not None:
            # The device path's cache: device and page-locked host rows, misses read; on its device.
            cache = self.data.device_path.cache
            rows = cache.lookup(torch.from_numpy(nodes.reshape(-1)).to(cache.device))
            return rows.view(*nodes.shape, self.data.dim)
        if attr.attr_name == "x":
            buf = self.data._native.gather(node_id_bytes(nodes.reshape(-1)))
            if not buf:
                return torch.empty(0, self.data.dim, dtype=self._float)
            return torch.frombuffer(buf, dtype=self._float).view(*nodes.shape, self.data.dim)
        if attr.attr_name == "y" and self.data.labels is not None:
            return torch.from_numpy(np.asarray(self.data.labels[nodes], dtype=np.int64))
        return None

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise NotImplementedError(f"{self.data.store.path}: a Strata store is read-only through PyG")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise NotImplementedError(f"{self.data.store.path}: a Strata store is read-only through PyG")

    def _get_tensor_size(self, attr: TensorAttr) -> tuple:
        if attr.attr_name == "x":
            return (self.data.num_nodes, self.data.dim)
        if attr.attr_name == "y" and self.data.labels is not None:
            return (self.data.num_nodes,)
        return None

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        names = ["x"] + (["y"] if self.data.labels is not None else [])
        return [TensorAttr(group_name=None, attr_name=n) for n in names]


class StrataGraphStore(GraphStore):
    """The store's train-edge topology as one CSC edge type (in-neighbours, as message passing
    reads it), shared with the store's memory maps rather than copied."""

    def __init__(self, data: GnnData):
        super().__init__()
        self.data = data
        n = data.num_nodes
        self._attr = EdgeAttr(edge_type=None, layout="csc", is_sorted=True, size=(n, n))

    def _get_edge_index(self, edge_attr: EdgeAttr):
        if edge_attr.layout.value != "csc":
            raise ValueError(f"{self.data.store.path}: the store serves its topology as csc, not {edge_attr.layout}")
        indptr, indices = self.data.store.csc()
        with warnings.catch_warnings():
            # indptr stays a view of the store's read-only memory map, not a copy: torch warns
            # that writing to it would be undefined, and nothing does (the store refuses writes).
            warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
            return torch.from_numpy(np.asarray(indices, dtype=np.int64)), torch.from_numpy(np.asarray(indptr))

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        raise NotImplementedError(f"{self.data.store.path}: a Strata store is read-only through PyG")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise NotImplementedError(f"{self.data.store.path}: a Strata store is read-only through PyG")

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [self._attr]


def stores(data: GnnData) -> tuple[StrataFeatureStore, StrataGraphStore]:
    """The ``(feature_store, graph_store)`` pair PyG loaders take as ``data``."""
    return StrataFeatureStore(data), StrataGraphStore(data)


class StrataSampler(BaseSampler):
    """PyG sampler backed by Strata's sampler, for ``NeighborLoader`` (seed nodes) and
    ``LinkNeighborLoader`` (seed edges, binary negative sampling): uniform without replacement
    with the fanouts ``data`` was opened with, deterministic per batch (batch keys count up from
    ``first_key``). Each hop samples every node known so far (message-flow semantics), so the
    ``edge_index`` of a hop may also hold edges into earlier hops' nodes."""

    def __init__(self, data: GnnData, first_key: int = 0):
        self.data = data
        self._keys = itertools.count(first_key)

    def sample_from_nodes(self, inputs: NodeSamplerInput) -> SamplerOutput:
        seeds = inputs.node
        if self.data.device_path is not None:
            # The device sampler draws the native sampler's sample, on the device.
            s = self.data.device_path.sampler.sample(seeds, next(self._keys))
            row, col = s.edge_index()
            return SamplerOutput(
                node=s.nodes,
                row=row,
                col=col,
                edge=None,
                batch=None,
                num_sampled_nodes=list(s.hop_counts),
                num_sampled_edges=list(s.edges_per_hop),
                metadata=(inputs.input_id, inputs.time),
            )
        nodes, hops, row, col, edges = self.data._native.sample(node_id_bytes(seeds.cpu().numpy()), next(self._keys))
        return SamplerOutput(
            node=_ids(nodes),
            row=_ids(row),
            col=_ids(col),
            edge=None,
            batch=None,
            num_sampled_nodes=list(hops),
            num_sampled_edges=list(edges),
            metadata=(inputs.input_id, inputs.time),
        )

    def sample_from_edges(
        self, inputs: EdgeSamplerInput, neg_sampling: NegativeSampling | None = None
    ) -> SamplerOutput:
        """Samples around the ``B`` seed edges ``inputs.row[i] -> inputs.col[i]`` for PyG's
        ``LinkNeighborLoader``, with binary negative sampling: ``ceil(B * amount)`` negatives,
        each pairing a seed edge's source (edge-major, ``ceil(amount)`` per edge) with a
        destination drawn uniformly from all nodes (PyG draws the source at random too). The
        metadata is PyG's for binary sampling: ``(input_id, edge_label_index (2, B + negatives)
        local ids into node, edge_label, None)``, labels 0 for the negatives.

        Not supported here (NotImplementedError): triplet negative sampling, weighted negatives
        (``src_weight``/``dst_weight``), temporal sampling (``edge_label_time``) and edge types;
        :class:`strata.gnn.pyg_sampler.StrataNeighborSampler` samples those."""
        if inputs.input_type is not None:
            raise NotImplementedError(
                "StrataSampler: link sampling by edge type needs a typed store; use "
                "strata.gnn.pyg_sampler.StrataNeighborSampler with strata.gnn.pyg_hetero.hetero_stores"
            )
        if inputs.time is not None:
            raise NotImplementedError(
                "StrataSampler: temporal link sampling (edge_label_time) is not supported here; use "
                "strata.gnn.pyg_sampler.StrataNeighborSampler(..., time_attr='edge_time')"
            )
        num_pos = inputs.row.numel()
        per_edge = num_neg = 0
        if neg_sampling is not None:
            if not neg_sampling.is_binary():
                raise NotImplementedError(
                    f"StrataSampler: {neg_sampling.mode.value!r} negative sampling is not supported; "
                    "use NegativeSampling('binary', amount)"
                )
            if neg_sampling.src_weight is not None or neg_sampling.dst_weight is not None:
                raise NotImplementedError(
                    "StrataSampler: weighted negative sampling (src_weight/dst_weight) is not supported; "
                    "negative destinations are drawn uniformly"
                )
            per_edge = math.ceil(neg_sampling.amount)
            num_neg = math.ceil(num_pos * neg_sampling.amount)
        if self.data.device_path is not None:
            # The device sampler draws the native sampler's link sample, on the device.
            links = self.data.device_path.sampler.sample_links(inputs.row, inputs.col, per_edge, next(self._keys))
            sample, src, dst, neg_dst = links.sample, links.src_local, links.dst_local, links.neg_dst_local
            nodes, hops, edges = sample.nodes, sample.hop_counts, sample.edges_per_hop
            row, col = sample.edge_index()
        else:
            out = self.data._native.sample_links(
                node_id_bytes(inputs.row.numpy()), node_id_bytes(inputs.col.numpy()), per_edge, next(self._keys)
            )
            nodes, hops, row, col, edges, src, dst, neg_dst = out
            nodes, row, col, src, dst, neg_dst = map(_ids, (nodes, row, col, src, dst, neg_dst))
        # A fractional amount draws ceil(amount) per edge and keeps the first num_neg.
        neg_src, neg_dst = src.repeat_interleave(per_edge)[:num_neg], neg_dst[:num_neg]
        edge_label_index = torch.stack([torch.cat([src, neg_src]), torch.cat([dst, neg_dst])])
        edge_label = inputs.label
        if neg_sampling is not None:
            if edge_label is None:
                edge_label = torch.ones(num_pos)
            edge_label = torch.cat([edge_label, edge_label.new_zeros((num_neg, *edge_label.shape[1:]))])
        return SamplerOutput(
            node=nodes,
            row=row,
            col=col,
            edge=None,
            batch=None,
            num_sampled_nodes=list(hops),
            num_sampled_edges=list(edges),
            metadata=(inputs.input_id, edge_label_index, edge_label, None),
        )


def _ids(buf) -> torch.Tensor:
    """uint32 ids from the native side as an int64 tensor (``torch.frombuffer`` refuses empty
    buffers)."""
    if not buf:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(buf, dtype=torch.int32).to(torch.int64)
