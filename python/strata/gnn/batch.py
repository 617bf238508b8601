"""One mini-batch as the loaders hand it out (the native and the device data path alike)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ._torch import require_torch


@dataclass
class Batch:
    """One mini-batch: ``x`` holds the features of ``nodes`` (``(len(nodes), dim)`` on the
    loader's device), ``blocks`` the layers' message-flow graphs (input layer first), ``y`` the
    seeds' labels when the store has labels; ``seeds`` are ``nodes[:len(seeds)]``.

    A link batch (:class:`LinkLoader`) has ``B`` positive edges; its seeds are their distinct
    endpoints and negative destinations, and ``edge_label_index``/``edge_label`` say which pairs
    of rows of ``x`` to score, as in PyG's ``LinkNeighborLoader``."""

    index: int
    seeds: object
    nodes: object
    hop_counts: list[int]
    blocks: list
    x: object
    y: object | None
    stats: dict = field(default_factory=dict)
    #: Link batches only: the native ``(src_local, dst_local, neg_dst_local)`` uint32 buffers
    #: behind ``edge_label_index``; None for node batches.
    links: tuple | None = None

    @property
    def num_seeds(self) -> int:
        return len(self.seeds)

    @cached_property
    def edge_label_index(self):
        """``(2, B * (1 + negatives))`` int64 local ids (rows of ``x``, on its device): the
        ``B`` positive edges, then each edge's negatives in edge order, each pairing the edge's
        source with a uniformly drawn destination. None for node batches."""
        if self.links is None:
            return None
        torch = require_torch()
        src, dst, neg = (np.frombuffer(b, dtype="<u4").astype(np.int64) for b in self.links)
        per_edge = len(neg) // len(src) if len(src) else 0
        index = np.stack([np.concatenate([src, np.repeat(src, per_edge)]), np.concatenate([dst, neg])])
        return torch.from_numpy(index).to(self.x.device)

    @cached_property
    def edge_label(self):
        """``(B * (1 + negatives),)`` float32 on ``x``'s device: 1 for the positive pairs of
        ``edge_label_index``, 0 for the negatives. None for node batches."""
        if self.links is None:
            return None
        torch = require_torch()
        num_pos, num_neg = len(self.links[0]) // 4, len(self.links[2]) // 4
        return torch.cat([torch.ones(num_pos), torch.zeros(num_neg)]).to(self.x.device)
