"""Mini-batches for GNN training as PyTorch tensors, served by Strata's native pipeline.

``open_data(store, ...)`` opens a store once (topology in RAM, feature tiers sized by the
budget); ``data.loader(nodes)`` iterates an epoch's batches. ``NodeLoader`` does both for the
common case::

    loader = NodeLoader("products.strata", fanouts=[15, 10], batch_size=1024, memory="2G")
    for batch in loader:          # one epoch per iteration over the loader
        out = model(batch.blocks, batch.x)
        loss = F.cross_entropy(out, batch.y)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _native
from ..store import Store
from ..units import parse_size
from ._torch import require_torch

#: Options of the native data path and their defaults (strata_gnn::data::DataConfig).
DATA_DEFAULTS = _native.gnn_data_defaults()


@dataclass
class Batch:
    """One mini-batch: ``x`` holds the features of ``nodes`` (``(len(nodes), dim)`` on the
    loader's device), ``blocks`` the layers' message-flow graphs (input layer first), ``y`` the
    seeds' labels when the store has labels; ``seeds`` are ``nodes[:len(seeds)]``."""

    index: int
    seeds: object
    nodes: object
    hop_counts: list[int]
    blocks: list
    x: object
    y: object | None
    stats: dict = field(default_factory=dict)

    @property
    def num_seeds(self) -> int:
        return len(self.seeds)


def node_id_bytes(nodes) -> bytes:
    """Node ids (any integer array-like) as the little-endian uint32 bytes the native side takes."""
    arr = np.ascontiguousarray(np.asarray(nodes, dtype=np.int64))
    if arr.ndim != 1:
        raise ValueError(f"nodes: expected a 1-D array of node ids, got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"nodes: node ids must not be negative, got {arr.min()}")
    return arr.astype("<u4").tobytes()


class GnnData:
    """A store opened for GNN training; make each epoch's batches with :meth:`loader`."""

    def __init__(self, store: str | Path, progress: Callable[..., bool] | None = None, **options):
        unknown = set(options) - set(DATA_DEFAULTS)
        if unknown:
            raise TypeError(f"unknown option(s) {sorted(unknown)}; known: {sorted(DATA_DEFAULTS)}")
        cfg = {**DATA_DEFAULTS, **options}
        cfg["memory"] = parse_size(cfg["memory"])
        cfg["feature_memory"] = parse_size(cfg["feature_memory"])
        cfg["fanouts"] = [int(f) for f in cfg["fanouts"]]
        self.store = Store(store)
        self.config = cfg
        train = self.store.node_split("train")
        train_ids = node_id_bytes(train if train is not None else np.empty(0, dtype=np.int64))
        self._native = _native.GnnData(str(store), cfg, train_ids, progress)
        self.num_nodes, self.dim, self.dtype, self.row_bytes = self._native.features_info()
        labels = self.store.labels
        self.labels = None if labels is None else np.asarray(labels)
        self.num_classes = None if self.labels is None else int(self.labels.max()) + 1

    @property
    def plan(self) -> dict:
        """The budget plan: bytes for topology, hot set, cache, batches, runtime."""
        return self._native.plan()

    def plan_lines(self) -> list[str]:
        return self._native.plan_lines()

    def nodes(self, split: str):
        """The node ids of a split (``train``, ``valid``, ``test``) of the store."""
        ids = self.store.node_split(split)
        if ids is None:
            raise ValueError(f"{self.store.path}: the store has no node split {split!r}")
        return np.asarray(ids)

    def loader(
        self,
        nodes,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        device: str = "cpu",
        epoch: int = 0,
    ) -> EpochLoader:
        """The batches of one epoch over ``nodes`` (ids, or a split name)."""
        if isinstance(nodes, str):
            nodes = self.nodes(nodes)
        return EpochLoader(self, node_id_bytes(nodes), shuffle, drop_last, device, epoch)


class EpochLoader:
    """Iterates one epoch's batches in order; ``stats()`` reports the pipeline's counters."""

    def __init__(self, data: GnnData, seeds: bytes, shuffle: bool, drop_last: bool, device: str, epoch: int):
        self.torch = require_torch()
        from .models import Block

        self._block = Block
        self.data = data
        self.device = self.torch.device(device)
        self._epoch = data._native.epoch(seeds, epoch, shuffle, drop_last)
        self._float = {"float32": self.torch.float32, "float16": self.torch.float16}[data.dtype]
        self._pin = self.device.type == "cuda"

    def _tensor(self, buf: bytearray, dtype):
        """A tensor sharing ``buf``'s memory (``torch.frombuffer`` refuses empty buffers)."""
        return self.torch.frombuffer(buf, dtype=dtype) if buf else self.torch.empty(0, dtype=dtype)

    def __iter__(self) -> Iterator[Batch]:
        torch = self.torch
        for index, seeds, nodes, hops, blocks, features, stats in self._epoch:
            seeds_t = self._tensor(seeds, torch.int32).to(torch.int64)
            nodes_t = self._tensor(nodes, torch.int32).to(torch.int64)
            x = self._tensor(features, self._float).view(len(nodes_t), self.data.dim)
            blks = [
                self._block.from_csc(
                    n_src, n_dst, self._tensor(indptr, torch.int64), self._tensor(indices, torch.int32)
                )
                for n_src, n_dst, indptr, indices in blocks
            ]
            y = None
            if self.data.labels is not None:
                y = torch.from_numpy(self.data.labels[seeds_t.numpy()].astype(np.int64))
            if self.device.type != "cpu":
                # Page-locked staging lets the copy to the GPU run asynchronously.
                x = (x.pin_memory() if self._pin else x).to(self.device, non_blocking=True)
                blks = [b.to(self.device) for b in blks]
                y = None if y is None else y.to(self.device, non_blocking=True)
            yield Batch(index, seeds_t, nodes_t, list(hops), blks, x, y, stats)

    def stats(self) -> dict | None:
        """Per-stage busy seconds, wall time, merged reads, and the tiers' hit rates so far."""
        return self._epoch.stats()

    def close(self) -> None:
        """Stops the epoch early: threads end and the cache's window pins are released."""
        self._epoch.close()


class NodeLoader:
    """Node-classification batches over ``nodes`` (ids or a split name, default ``train``):
    each ``iter(loader)`` is one epoch (reshuffled); ``loader.stats`` is the last epoch's."""

    def __init__(
        self,
        store: str | Path,
        fanouts=(15, 10),
        batch_size: int = 1024,
        *,
        nodes="train",
        memory: int | str = 1 << 30,
        device: str = "cpu",
        shuffle: bool = True,
        drop_last: bool = False,
        progress: Callable[..., bool] | None = None,
        **options,
    ):
        self.data = GnnData(store, progress, fanouts=list(fanouts), batch_size=batch_size, memory=memory, **options)
        self.nodes = nodes
        self.device, self.shuffle, self.drop_last = device, shuffle, drop_last
        self.epoch = 0
        self.stats: dict | None = None

    def __iter__(self) -> Iterator[Batch]:
        loader = self.data.loader(
            self.nodes, shuffle=self.shuffle, drop_last=self.drop_last, device=self.device, epoch=self.epoch
        )
        self.epoch += 1
        try:
            yield from loader
        finally:
            self.stats = loader.stats()
            loader.close()
