"""Neighbour sampling as device kernels, identical to the Rust sampler (``strata_graph::sampler``).

The Rust sampler's choice at a node is a pure function of ``(seed, batch_key, hop, node)``:
the node draws from the stream ``derive(derive(derive(derive(seed, NEIGHBOR_STREAM),
batch_key), hop), node)``. This module computes the same function with ``strata.device.rng``
(bit for bit the Rust engine's draws), vectorised over a hop's whole frontier, and builds the
same blocks: the same local ids (seeds first, then each node in order of first appearance in
destination order), the same CSC layout, the same order. So a batch sampled here, on a GPU or
on the CPU twin, equals the batch the Rust sampler draws.

- Uniform: Floyd's algorithm (``uniform.rs``). Its ``k`` sequential steps become ``k`` vector
  steps over every frontier node with more than ``k`` in-edges; a node with ``k`` or fewer
  keeps them all.
- Weighted (``weighted.rs``): one draw per edge of positive weight, in edge order; the edge's
  key is ``ln(1 - u) / w`` and the ``k`` largest keys are kept (ties by position). The
  logarithm is :func:`ln_unit`, the twin of ``weighted.rs``'s, built from correctly rounded
  arithmetic only, so every device computes the same key (a device's own ``log`` may round
  its last bit differently, which could swap two nearly tied keys).

Link batches (``sample_links``) draw their negative destinations as ``sample_links.rs`` does:
draw ``i`` of the stream ``derive(derive(seed, NEGATIVE_STREAM), batch_key)``, ``below(n)``.

Temporal and per-edge-type sampling, and edge ids, are the Rust sampler's only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...device import rng
from .topology import DeviceTopology

#: ``strata_graph::sampler::NEIGHBOR_STREAM``: the neighbour choices' domain separator.
NEIGHBOR_STREAM = 0x5A3F_1E00
#: ``strata_graph::sampler::NEGATIVE_STREAM``: the negative destinations' domain separator.
NEGATIVE_STREAM = 0x4E6A_7100
#: ``std::f64::consts::LN_2`` (the f64 nearest ln 2) and ``weighted.rs``'s ``SERIES_TERMS``.
LN_2 = 0.6931471805599453
SERIES_TERMS = 12
SQRT_2 = 1.4142135623730951


def ln_unit(bits: torch.Tensor) -> torch.Tensor:
    """``ln(1 - u)`` (float64) for the uniform ``u`` of each draw's ``bits`` (int64 bit
    patterns), bit for bit ``weighted.rs``'s ``ln_unit``: ``1 - u = m * 2^-53`` with ``m`` in
    ``[1, 2^53]``, ``m = f * 2^e`` (``frexp``, exact), ``f`` in [sqrt(1/2), sqrt(2)], and
    ``ln f`` by the series of ``2 atanh((f - 1) / (f + 1))``; each step one correctly rounded
    operation, so every device gives the same value."""
    m = ((1 << 53) - rng.shr(bits, 11)).to(torch.float64)
    mantissa, exponent = torch.frexp(m)
    f, e = mantissa * 2.0, exponent.to(torch.int64) - 1
    high = f > SQRT_2
    f = torch.where(high, f * 0.5, f)
    e = e + high.to(torch.int64)
    s = (f - 1.0) / (f + 1.0)
    z = s * s
    p = torch.full_like(z, 1.0 / (2 * SERIES_TERMS + 1))
    for n in reversed(range(SERIES_TERMS)):
        p = p * z + 1.0 / (2 * n + 1)
    return 2.0 * s * p + (e - 53).to(torch.float64) * LN_2


@dataclass
class DeviceBlock:
    """One layer's message-flow graph in local ids, as ``strata_graph::sampler::Block``:
    ``indptr`` (int64, ``num_dst + 1``) over destinations, ``indices`` (int64) the local
    sources of each destination's sampled in-edges."""

    num_src: int
    num_dst: int
    indptr: torch.Tensor
    indices: torch.Tensor


@dataclass
class DeviceSample:
    """A batch's sample, as ``strata_graph::sampler::Sample``: ``nodes`` global ids (int64,
    seeds first, then by hop of first reach), ``hop_counts`` nodes first reached per hop (hop 0:
    the seeds), ``blocks`` input layer first (DGL order), ``edges_per_hop`` hop 1 first."""

    nodes: torch.Tensor
    hop_counts: list[int]
    blocks: list[DeviceBlock]
    edges_per_hop: list[int]

    def edge_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All sampled edges as (local source, local destination), hop 1 first
        (``Sample::edge_index``)."""
        rows, cols = [], []
        for b in reversed(self.blocks):
            rows.append(b.indices)
            counts = b.indptr[1:] - b.indptr[:-1]
            cols.append(torch.repeat_interleave(torch.arange(b.num_dst, device=counts.device), counts))
        return torch.cat(rows), torch.cat(cols)


class DeviceSampler:
    """Samples batches over a :class:`DeviceTopology` on its device. ``fanouts``: neighbours
    kept per node at each hop from the seeds outwards (-1: all); ``weighted``: by edge weight
    (the topology must carry weights). Holds one int64 per graph node of scratch on the device
    (the local-id map), reused across batches, so one sampler samples one batch at a time."""

    def __init__(self, topology: DeviceTopology, fanouts, *, seed: int = 0, weighted: bool = False):
        fanouts = [int(f) for f in fanouts]
        if not fanouts:
            raise ValueError("fanouts: must list at least one hop (one fanout per GNN layer)")
        for hop, f in enumerate(fanouts):
            if f != -1 and f < 1:
                raise ValueError(
                    f"fanouts: entry {hop} is {f}; each fanout must be at least 1, or -1 for the full neighbourhood"
                )
        if weighted and topology.weights is None:
            raise ValueError("weighted: the topology was opened without edge weights")
        self.topology = topology
        self.fanouts = fanouts
        self.seed = int(seed)
        self.weighted = bool(weighted)
        self.device = topology.device
        self._local = torch.full((topology.num_nodes,), -1, dtype=torch.int64, device=self.device)

    def sample(self, seeds, batch_key: int, on_hop: Callable[[torch.Tensor], None] | None = None) -> DeviceSample:
        """The sample of ``seeds`` (distinct global ids) for ``batch_key`` (a u64: the
        native loader's ``batch_key(epoch, index)``), the Rust sampler's ``sample(topo, seeds,
        batch_key)``. ``on_hop(nodes)``, when given, is called with the seeds and then with
        each hop's newly reached nodes as soon as they are known (the pipeline starts their
        feature lookups while the next hop is sampled)."""
        nodes = as_ids(seeds, self.device)
        n = self.topology.num_nodes
        if nodes.numel() and (int(nodes.min()) < 0 or int(nodes.max()) >= n):
            bad = int(nodes.min()) if int(nodes.min()) < 0 else int(nodes.max())
            raise ValueError(f"sampler: seeds include node {bad}, out of range (the graph has {n} nodes)")
        if torch.unique(nodes).numel() != nodes.numel():
            raise ValueError("sampler: seeds must be distinct")
        batch_seed = rng.derive(rng.derive(self.seed, NEIGHBOR_STREAM), batch_key)
        local = self._local
        local[nodes] = torch.arange(nodes.numel(), device=self.device)
        hop_counts, blocks = [nodes.numel()], []
        try:
            if on_hop is not None:
                on_hop(nodes)
            for hop, fanout in enumerate(self.fanouts):
                num_dst = nodes.numel()
                keys = rng.derive(rng.derive(batch_seed, torch.tensor(hop)), nodes)
                counts, sources = self._choose(nodes, keys, fanout)
                nodes = _relabel(local, nodes, sources)
                indptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=self.device)
                torch.cumsum(counts, 0, out=indptr[1:])
                blocks.append(DeviceBlock(nodes.numel(), num_dst, indptr, local[sources]))
                hop_counts.append(nodes.numel() - num_dst)
                if on_hop is not None:
                    on_hop(nodes[num_dst:])
        finally:
            local[nodes] = -1
        blocks.reverse()
        return DeviceSample(nodes, hop_counts, blocks, [b.indices.numel() for b in reversed(blocks)])

    def sample_links(
        self, src, dst, negatives: int, batch_key: int, on_hop: Callable[[torch.Tensor], None] | None = None
    ) -> DeviceLinkSample:
        """The link sample of the positive edges ``src[i] -> dst[i]`` with ``negatives``
        uniform destinations per edge, the Rust sampler's ``sample_links(topo, src, dst,
        negatives, batch_key)``: negative ``j`` is draw ``j`` of the batch's negative stream
        (edge-major), the seeds are the distinct endpoints in order of first appearance over
        sources, destinations, then negatives, and their neighbourhoods are :meth:`sample`'s
        (``on_hop`` as there)."""
        src, dst = as_ids(src, self.device), as_ids(dst, self.device)
        if src.numel() != dst.numel():
            raise ValueError(f"sampler: {src.numel()} edge sources but {dst.numel()} destinations; they must pair up")
        if negatives < 0:
            raise ValueError(f"sampler: expected negatives per edge >= 0, got {negatives}")
        key = rng.derive(rng.derive(self.seed, NEGATIVE_STREAM), batch_key)
        count = src.numel() * negatives
        positions = torch.arange(count, device=self.device)
        neg = rng.below(rng.draw(key.to(self.device), positions), self.topology.num_nodes)
        seeds, local = _first_appearance(torch.cat([src, dst, neg]))
        n = src.numel()
        return DeviceLinkSample(self.sample(seeds, batch_key, on_hop), local[:n], local[n : 2 * n], local[2 * n :])

    def _choose(self, frontier, keys, fanout) -> tuple[torch.Tensor, torch.Tensor]:
        """Edges kept by each frontier node: ``(counts, sources)``, ``counts[i]`` edges for node
        ``i``, their source ids node after node, each node's in CSC order."""
        start, degree = self.topology.starts_and_degrees(frontier)
        if self.weighted:
            positions, counts = _choose_weighted(self.topology, start, degree, keys, fanout)
        else:
            positions, counts = _choose_uniform(start, degree, keys, fanout)
        return counts, self.topology.sources(positions)


@dataclass
class DeviceLinkSample:
    """A link batch's sample, as ``strata_graph::sampler::LinkSample``: the endpoints'
    :class:`DeviceSample` and the local ids (int64, rows of ``sample.nodes``) of each edge's
    source, destination, and negatives (edge-major)."""

    sample: DeviceSample
    src_local: torch.Tensor
    dst_local: torch.Tensor
    neg_dst_local: torch.Tensor


def _first_appearance(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(distinct, local)``: the distinct values of ``ids`` in order of first appearance, and
    each item's index into them (the Rust sampler's serial id map, as a sort)."""
    distinct, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full(distinct.shape, torch.iinfo(torch.int64).max, dtype=torch.int64, device=ids.device)
    first.scatter_reduce_(0, inverse, torch.arange(ids.numel(), device=ids.device), "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=ids.device)
    return distinct[order], rank[inverse]


def as_ids(ids, device: torch.device) -> torch.Tensor:
    """Node ids (a tensor, or any integer array-like such as a read-only memmap) as a 1-D int64
    tensor on ``device``."""
    if isinstance(ids, torch.Tensor):
        return ids.to(device=device, dtype=torch.int64).reshape(-1)
    return torch.from_numpy(np.array(ids, dtype=np.int64).reshape(-1)).to(device)


def _segments(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For ``counts[i]`` items per segment laid end to end: each item's segment, its index
    within the segment, and each segment's first item."""
    first = torch.cumsum(counts, 0) - counts
    seg = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    return seg, torch.arange(seg.numel(), device=counts.device) - first[seg], first


def _choose_uniform(start, degree, keys, fanout) -> tuple[torch.Tensor, torch.Tensor]:
    """Floyd's algorithm at every node with more than ``fanout`` in-edges, as ``uniform.rs``:
    step ``s`` draws ``t = below(j + 1)`` with ``j = d - k + s`` (draw ``s`` of the node's
    stream) and keeps ``t`` unless already picked, else ``j``; picks come out sorted."""
    if fanout < 0:
        counts = degree
        drawn = torch.zeros_like(degree, dtype=torch.bool)
    else:
        drawn = degree > fanout
        counts = torch.where(drawn, fanout, degree)
    seg, within, _ = _segments(counts)
    positions = start[seg] + within
    which = torch.nonzero(drawn).reshape(-1)
    if which.numel():
        d, k = degree[which], fanout
        picks = torch.empty((which.numel(), k), dtype=torch.int64, device=d.device)
        for s in range(k):
            j = d - k + s
            t = rng.below(rng.draw(keys[which], torch.tensor(s)), j + 1)
            seen = (picks[:, :s] == t[:, None]).any(1)
            picks[:, s] = torch.where(seen, j, t)
        picks = picks.sort(dim=1).values
        row = torch.full_like(degree, -1)
        row[which] = torch.arange(which.numel(), device=d.device)
        sampled = drawn[seg]
        positions[sampled] = start[seg[sampled]] + picks[row[seg[sampled]], within[sampled]]
    return positions, counts


def _choose_weighted(topology: DeviceTopology, start, degree, keys, fanout) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted choice without replacement at every node, as ``weighted.rs``: edges of
    positive weight are the candidates; a node with at most ``fanout`` of them (or fanout -1)
    keeps them all, otherwise candidate ``c`` (in edge order) draws ``u`` from draw ``c`` of the
    node's stream and the ``fanout`` largest ``ln(1 - u) / w`` are kept, ties by position."""
    seg, within, first = _segments(degree)
    positions = start[seg] + within
    weight = topology.edge_weights(positions)
    candidate = weight > 0
    # Each candidate's index among its node's candidates: its draw's position in the stream.
    num_candidates = torch.zeros_like(degree).index_add_(0, seg, candidate.to(torch.int64))
    before = torch.cumsum(num_candidates, 0) - num_candidates
    ranks = torch.cumsum(candidate, 0) - candidate.to(torch.int64) - before[seg]
    keep = candidate.clone()
    if fanout >= 0:
        drawn = num_candidates > fanout
        pick = drawn[seg] & candidate
        if pick.any():
            bits = rng.draw(keys[seg[pick]], ranks[pick])
            key = torch.full(seg.shape, float("-inf"), dtype=torch.float64, device=seg.device)
            key[pick] = ln_unit(bits) / weight[pick].to(torch.float64)
            # Largest key first, ties by position (stable sorts keep edge order), then grouped
            # by node: a node's rank among its own edges decides.
            order = torch.sort(key, descending=True, stable=True).indices
            order = order[torch.sort(seg[order], stable=True).indices]
            rank = torch.empty_like(order)
            rank[order] = torch.arange(order.numel(), device=order.device) - first[seg[order]]
            keep = torch.where(drawn[seg], candidate & (rank < fanout), candidate)
    counts = torch.zeros_like(degree).index_add_(0, seg, keep.to(torch.int64))
    return positions[keep], counts


def _relabel(local: torch.Tensor, nodes: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """``nodes`` extended by the ``sources`` not yet in ``local`` (the global -> local map,
    -1 where unknown), in order of first appearance, each given the next local id in
    ``local``: the Rust sampler's serial relabelling, as a sort."""
    fresh = sources[local[sources] < 0]
    if fresh.numel() == 0:
        return nodes
    new, _ = _first_appearance(fresh)
    local[new] = torch.arange(nodes.numel(), nodes.numel() + new.numel(), device=new.device)
    return torch.cat([nodes, new])
