"""One mini-batch as the loaders hand it out (the native and the device data path alike)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

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
    #: Link batches only: ``(src_local, dst_local, neg_dst_local)``, int64 local ids on
    #: ``x``'s device behind ``edge_label_index`` (negatives edge-major); None for node batches.
    links: tuple | None = None
    #: A bounded draw's sizes on the device (the nodes reached after hops ``0..H``, then each
    #: hop's kept edges, hop 1 first; int64), which a padded training step copies in one op;
    #: None where the batch was not drawn so.
    drawn_sizes: object | None = None

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
        src, dst, neg = self.links
        per_edge = len(neg) // len(src) if len(src) else 0
        return torch.stack([torch.cat([src, src.repeat_interleave(per_edge)]), torch.cat([dst, neg])])

    @cached_property
    def edge_label(self):
        """``(B * (1 + negatives),)`` float32 on ``x``'s device: 1 for the positive pairs of
        ``edge_label_index``, 0 for the negatives. None for node batches."""
        if self.links is None:
            return None
        torch = require_torch()
        src, _, neg = self.links
        return torch.cat([torch.ones(len(src), device=src.device), torch.zeros(len(neg), device=src.device)])
