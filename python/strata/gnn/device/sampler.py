"""Neighbour sampling as device kernels, identical to the Rust sampler (``strata_graph::sampler``).

The Rust sampler's choice at a node is a pure function of ``(seed, batch_key, hop, node)``:
the node draws from the stream ``derive(derive(derive(derive(seed, NEIGHBOR_STREAM),
batch_key), hop), node)``. This module computes the same function with ``strata.device.rng``
(bit for bit the Rust engine's draws), vectorised over a hop's whole frontier, and builds the
same blocks: the same local ids (seeds first, then each node in order of first appearance in
destination order), the same CSC layout, the same order. So a batch sampled here, on a GPU or
on the CPU twin, equals the batch the Rust sampler draws.

- Uniform: Floyd's algorithm (``uniform.rs``). Its ``k`` sequential steps run at once over a
  ``(frontier, k)`` layout (:mod:`floyd`: one kernel on ``cuda``); a node with ``k`` or fewer
  in-edges keeps them all.
- Weighted (``weighted.rs``): one draw per edge of positive weight, in edge order; the edge's
  key is ``ln(1 - u) / w`` and the ``k`` largest keys are kept (ties by position). The
  logarithm is :func:`ln_unit`, the twin of ``weighted.rs``'s, built from correctly rounded
  arithmetic only, so every device computes the same key (a device's own ``log`` may round
  its last bit differently, which could swap two nearly tied keys).

With uniform fanouts a batch is drawn in buffers sized by bounds (:mod:`.bounded`): one CUDA
graph per batch capacity on ``cuda`` (two, so that a batch can be drawn while the one before is
finished), and one wait for the device per batch, for its sizes, which a batch started after it
hides (:meth:`DeviceSampler.start`).
Weighted sampling and a full neighbourhood (-1) go hop by hop: each hop reads the frontier's
number of in-edges, then its number of edges and of new nodes (:meth:`DeviceSampler._relabel`);
nothing else in a batch reads a value back or makes an output whose size only the device
knows.

Link batches (``sample_links``) draw their negative destinations as ``sample_links.rs`` does:
draw ``i`` of the stream ``derive(derive(seed, NEGATIVE_STREAM), batch_key)``, ``below(n)``.

Temporal and per-edge-type sampling, and edge ids, are the Rust sampler's only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ... import _native
from ...device import rng
from .bounded import BoundedBatch
from .floyd import FloydConstants
from .floyd import choose as floyd_choose
from .relabel import relabel_into
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
    sources of each destination's sampled in-edges; ``dst`` (int64, parallel to ``indices``)
    each edge's destination where the draw made it (a bounded batch's), else None."""

    num_src: int
    num_dst: int
    indptr: torch.Tensor
    indices: torch.Tensor
    dst: torch.Tensor | None = None


@dataclass
class DeviceSample:
    """A batch's sample, as ``strata_graph::sampler::Sample``: ``nodes`` global ids (int64,
    seeds first, then by hop of first reach), ``hop_counts`` nodes first reached per hop (hop 0:
    the seeds), ``blocks`` input layer first (DGL order), ``edges_per_hop`` hop 1 first."""

    nodes: torch.Tensor
    hop_counts: list[int]
    blocks: list[DeviceBlock]
    edges_per_hop: list[int]
    #: A bounded batch's sizes on the device (:attr:`~strata.gnn.batch.Batch.drawn_sizes`),
    #: else None.
    sizes: torch.Tensor | None = None

    def edge_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All sampled edges as (local source, local destination), hop 1 first
        (``Sample::edge_index``)."""
        rows, cols = [], []
        for b in reversed(self.blocks):
            rows.append(b.indices)
            counts = b.indptr[1:] - b.indptr[:-1]
            dst = torch.arange(b.num_dst, device=counts.device)
            cols.append(torch.repeat_interleave(dst, counts, output_size=b.indices.numel()))
        return torch.cat(rows), torch.cat(cols)


class DeviceSampler:
    """Samples batches over a :class:`DeviceTopology` on its device. ``fanouts``: neighbours
    kept per node at each hop from the seeds outwards (-1: all); ``weighted``: by edge weight
    (the topology must carry weights). Holds one int64 per graph node of scratch on the device
    (the local-id map), reused across batches, so one sampler samples one batch at a time."""

    def __init__(
        self, topology: DeviceTopology, fanouts, *, seed: int = 0, weighted: bool = False, graphs: bool = True
    ):
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
        # The local-id map, and one slot past the last node that takes the writes of the
        # entries a scatter must skip (a scatter has no "write nothing here").
        self._local = torch.full((topology.num_nodes + 1,), -1, dtype=torch.int64, device=self.device)
        self._floyd: dict[int, FloydConstants] = {}
        # Uniform fanouts draw a batch in bounded buffers (:mod:`.bounded`), one CUDA graph a
        # capacity on ``cuda`` (with ``graphs``); ``counts`` says how batches ran.
        self.bounded = not weighted and all(f >= 1 for f in fanouts)
        self.graphs = bool(graphs)
        self._batches: dict[int, tuple[BoundedBatch, BoundedBatch]] = {}
        self.counts = {"replayed": 0, "captured": 0, "op_by_op": 0}

    def sample(
        self, seeds, batch_key: int, on_hop: Callable[[torch.Tensor], None] | None = None, *, checked: bool = False
    ) -> DeviceSample:
        """The sample of ``seeds`` (distinct global ids) for ``batch_key`` (a u64: the
        native loader's ``batch_key(epoch, index)``), the Rust sampler's ``sample(topo, seeds,
        batch_key)``. ``on_hop(nodes)``, when given, is called with nodes as soon as they are
        known, in order (the pipeline starts their feature lookups): a batch of uniform fanouts,
        drawn at once, hands every node in one call; hop by hop, the seeds, then each hop's
        newly reached nodes while the next hop is sampled.

        Seeds given in host memory (a NumPy array or CPU tensor, as the pipeline gives them)
        are checked there; a device tensor is read back once to be checked; ``checked=True``
        says the caller checked them (:meth:`check`, as the pipeline does once an epoch), so a
        batch costs the host no pass over its seeds. Each hop then waits for the device once,
        for its number of edges and of new nodes (the next hop's size)."""
        return self.start(seeds, batch_key, checked=checked).finish(on_hop)

    def start(self, seeds, batch_key: int, *, checked: bool = False) -> Started:
        """:meth:`sample` in two halves: the batch's draw queued now, its sample when the
        returned :class:`Started` is finished. A batch of uniform fanouts is drawn on the
        device at once (its sizes copied out as the draw ends), so a caller that starts batch
        ``i + 1`` before it finishes batch ``i`` never waits for a draw (the pipeline does;
        two batches of one size may be under way at once). Other samplers draw hop by hop when
        finished."""
        nodes = as_ids(seeds, self.device) if checked else self._seed_ids(seeds)
        return self._start(nodes, batch_key)

    def _start(self, nodes: torch.Tensor, batch_key: int) -> Started:
        """:meth:`start` of checked seeds (distinct int64 ids on the device)."""
        # The batch's and hops' keys are Python ints, derived on the host (no tensor ops).
        batch_seed = _native.rng_derive(_native.rng_derive(self.seed, NEIGHBOR_STREAM), batch_key)
        if self.bounded and nodes.numel():
            return self._start_bounded(nodes, batch_seed)
        return Started(lambda on_hop: self._sample_hops(nodes, batch_seed, on_hop))

    def _sample_hops(self, nodes: torch.Tensor, batch_seed: int, on_hop) -> DeviceSample:
        """The sample drawn hop by hop, each hop reading back its sizes."""
        local = self._local
        local[nodes] = torch.arange(nodes.numel(), device=self.device)
        hop_counts, blocks, pending = [nodes.numel()], [], None
        try:
            if on_hop is not None:
                on_hop(nodes)
            for hop, fanout in enumerate(self.fanouts):
                num_dst = nodes.numel()
                keys = rng.derive_each(_native.rng_derive(batch_seed, hop), nodes)
                counts, pending, valid = self._choose(nodes, keys, fanout)
                nodes, indices = self._relabel(nodes, pending, valid)
                pending = None
                indptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=self.device)
                torch.cumsum(counts, 0, out=indptr[1:])
                blocks.append(DeviceBlock(nodes.numel(), num_dst, indptr, indices))
                hop_counts.append(nodes.numel() - num_dst)
                if on_hop is not None:
                    on_hop(nodes[num_dst:])
        finally:
            local[nodes] = -1
            if pending is not None:
                # A hop that failed part way: its sources may hold half-made entries.
                local[pending] = -1
        blocks.reverse()
        return DeviceSample(nodes, hop_counts, blocks, [b.indices.numel() for b in reversed(blocks)])

    def _start_bounded(self, seeds: torch.Tensor, batch_seed: int) -> Started:
        """:meth:`_start` of a uniform sampler: the batch drawn in bounded buffers (a CUDA graph
        replayed on ``cuda``), in the first of its capacity's two that is not under way."""
        capacity = 1 << (seeds.numel() - 1).bit_length()
        pair = self._batches.get(capacity)
        if pair is None:
            pair = self._batches[capacity] = (BoundedBatch(self, capacity), BoundedBatch(self, capacity))
        batch = next((b for b in pair if not b.under_way), None)
        if batch is None:
            raise RuntimeError(
                f"sampler: two batches of up to {capacity} seeds are already started and not finished;"
                " finish one before starting another"
            )
        drawn = batch.start(seeds, batch_seed, self.graphs)
        return Started(lambda on_hop: self._finish_bounded(batch, drawn, on_hop), batch.abandon)

    def _finish_bounded(self, batch: BoundedBatch, drawn, on_hop) -> DeviceSample:
        """The sample of a bounded batch's draw: its sizes (the batch's one wait, for a draw
        long done when the next batch was started first), then ``on_hop`` called once with
        every node."""
        try:
            hops = len(self.fanouts)
            sizes = batch.sizes(drawn)
            reached, kept = sizes[: hops + 1], sizes[hops + 1 :]
            # A graph's buffers are its next replay's: the batch takes a copy.
            if batch.graph is not None:
                drawn = drawn.copy()
            nodes = drawn.nodes[: reached[-1]]
            blocks = [
                DeviceBlock(reached[h + 1], reached[h], indptr[: reached[h] + 1], indices[: kept[h]], dst[: kept[h]])
                for h, (indptr, indices, dst) in enumerate(drawn.blocks)
            ]
        finally:
            # Copies queued: the buffers may take the next draw.
            batch.abandon()
        if on_hop is not None:
            on_hop(nodes)  # every node is known at once: one lookup for the batch
        hop_counts = [reached[0]] + [b - a for a, b in itertools.pairwise(reached)]
        return DeviceSample(nodes, hop_counts, blocks[::-1], kept, drawn.sizes)

    def check(self, ids, *, distinct: bool = True) -> None:
        """Raises ValueError unless the node ids ``ids`` (a host array) are in range and, with
        ``distinct``, distinct."""
        ids = np.asarray(ids)
        n = self.topology.num_nodes
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise ValueError(f"sampler: seeds include node {bad}, out of range (the graph has {n} nodes)")
        if distinct and np.unique(ids).size != ids.size:
            raise ValueError("sampler: seeds must be distinct")

    def _seed_ids(self, seeds, distinct: bool = True) -> torch.Tensor:
        """``seeds`` as int64 ids on the device, checked in host memory (:meth:`check`): a host
        array costs the device nothing, a device tensor one read back."""
        host = seeds.detach().to("cpu") if isinstance(seeds, torch.Tensor) else None
        ids = as_ids(seeds if host is None else host, torch.device("cpu")).numpy()
        self.check(ids, distinct=distinct)
        if isinstance(seeds, torch.Tensor) and seeds.device == self.device:
            return seeds.to(torch.int64).reshape(-1)
        return to_device(torch.from_numpy(ids), self.device)

    def sample_links(
        self,
        src,
        dst,
        negatives: int,
        batch_key: int,
        on_hop: Callable[[torch.Tensor], None] | None = None,
        *,
        checked: bool = False,
    ) -> DeviceLinkSample:
        """The link sample of the positive edges ``src[i] -> dst[i]`` with ``negatives``
        uniform destinations per edge, the Rust sampler's ``sample_links(topo, src, dst,
        negatives, batch_key)``: negative ``j`` is draw ``j`` of the batch's negative stream
        (edge-major), the seeds are the distinct endpoints in order of first appearance over
        sources, destinations, then negatives, and their neighbourhoods are :meth:`sample`'s
        (``on_hop`` and ``checked``, the endpoints in range, as there)."""
        if checked:
            src, dst = as_ids(src, self.device), as_ids(dst, self.device)
        else:
            src, dst = self._seed_ids(src, distinct=False), self._seed_ids(dst, distinct=False)
        if src.numel() != dst.numel():
            raise ValueError(f"sampler: {src.numel()} edge sources but {dst.numel()} destinations; they must pair up")
        if negatives < 0:
            raise ValueError(f"sampler: expected negatives per edge >= 0, got {negatives}")
        key = _native.rng_derive(_native.rng_derive(self.seed, NEGATIVE_STREAM), batch_key)
        count = src.numel() * negatives
        positions = torch.arange(count, device=self.device)
        neg = rng.below(rng.draw(key, positions), self.topology.num_nodes)
        # The distinct endpoints by first appearance are a relabelling from no nodes; the map
        # then holds the seeds' local ids, as sampling them starts by setting.
        ends = torch.cat([src, dst, neg])
        try:
            seeds, local = self._relabel(ends[:0], ends, None)
        except BaseException:
            self._local[ends] = -1  # the map stays clean for the next batch
            raise
        n = src.numel()
        sample = self._start(seeds, batch_key).finish(on_hop)
        return DeviceLinkSample(sample, local[:n], local[n : 2 * n], local[2 * n :])

    def _choose(
        self, frontier, keys, fanout, alive: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Edges kept by each frontier node: ``(counts, sources, valid)``, ``counts[i]`` edges
        for node ``i``; ``sources`` their source ids node after node, each node's in CSC order,
        laid out ``(len(frontier), fanout)`` and flattened for a uniform fanout (``valid``
        marks the slots in use, a node's first ``counts[i]``), else end to end (``valid``
        None). Frontier slots not ``alive`` (a bounded batch's spare slots) choose none."""
        start, degree = self.topology.starts_and_degrees(frontier)
        if alive is not None:
            degree = torch.where(alive, degree, 0)
        if self.weighted:
            positions, counts, valid = _choose_weighted(self.topology, start, degree, keys, fanout)
        elif fanout < 0:
            # The whole neighbourhood: its size is the one thing to read back.
            seg, within, _ = _segments(degree, int(degree.sum()))
            positions, counts, valid = start[seg] + within, degree, None
        else:
            floyd = self._floyd.get(fanout)
            if floyd is None:
                floyd = self._floyd[fanout] = FloydConstants.on(fanout, self.device)
            positions, counts, valid = floyd_choose(start, degree, keys, floyd)
        if self.topology.indices.numel() == 0:
            return counts, torch.zeros_like(positions), valid
        return counts, self.topology.sources(positions), valid

    def _relabel(
        self, nodes: torch.Tensor, sources: torch.Tensor, valid: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(nodes, indices)``: ``nodes`` extended by the (``valid``) ``sources`` not yet in
        the local-id map, in order of first appearance, each given the next local id (the
        Rust sampler's serial relabelling), and the local ids of the valid sources in order.
        Waits for the device once, for the number of new nodes and of valid sources."""
        size = sources.numel()
        if size == 0:
            return nodes, sources
        new = torch.empty(size + 1, dtype=torch.int64, device=self.device)
        num_new, indices, kept = relabel_into(self._local, sources, valid, nodes.numel(), new, 0)
        counted = torch.cat([num_new] if kept is None else [num_new, kept]).tolist()
        return torch.cat([nodes, new[: counted[0]]]), indices[: counted[-1] if kept is not None else size]


class Started:
    """A batch whose sampling is under way (:meth:`DeviceSampler.start`): :meth:`finish` gives
    its sample (once), :meth:`abandon` gives up a batch that will not be finished (an epoch
    stopped early), so that its buffers take the next draw."""

    def __init__(self, finish: Callable, abandon: Callable[[], None] = lambda: None):
        self._finish, self._abandon = finish, abandon

    def finish(self, on_hop: Callable[[torch.Tensor], None] | None = None):
        return self._finish(on_hop)

    def abandon(self) -> None:
        self._abandon()


def one_ahead(starts: Iterable[Started]) -> Iterator[Started]:
    """The batches of ``starts`` in order, each handed out once the next one is started (the
    last once there is none): a caller that finishes what it is handed never waits for the draw
    it has just queued. Closing the iterator early gives up the batch started and not handed
    out; a batch handed out is the caller's to finish or give up."""
    pending = None
    try:
        for started in starts:
            done, pending = pending, started
            if done is not None:
                yield done
        done, pending = pending, None
        if done is not None:
            yield done
    finally:
        if pending is not None:
            pending.abandon()


@dataclass
class DeviceLinkSample:
    """A link batch's sample, as ``strata_graph::sampler::LinkSample``: the endpoints'
    :class:`DeviceSample` and the local ids (int64, rows of ``sample.nodes``) of each edge's
    source, destination, and negatives (edge-major)."""

    sample: DeviceSample
    src_local: torch.Tensor
    dst_local: torch.Tensor
    neg_dst_local: torch.Tensor


def as_ids(ids, device: torch.device) -> torch.Tensor:
    """Node ids (a tensor, or any integer array-like such as a read-only memmap) as a 1-D int64
    tensor on ``device``."""
    if isinstance(ids, torch.Tensor):
        return to_device(ids.to(torch.int64).reshape(-1), device)
    return to_device(torch.from_numpy(np.array(ids, dtype=np.int64).reshape(-1)), device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; a host tensor goes to a GPU through page-locked memory without
    blocking the host (a pageable copy would wait for the stream's queued work)."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _segments(counts: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For ``counts[i]`` items per segment laid end to end (``total`` in all): each item's
    segment, its index within the segment, and each segment's first item."""
    first = torch.cumsum(counts, 0) - counts
    seg = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts, output_size=total)
    return seg, torch.arange(total, device=counts.device) - first[seg], first


def _choose_weighted(
    topology: DeviceTopology, start, degree, keys, fanout
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weighted choice without replacement at every node, as ``weighted.rs``: edges of
    positive weight are the candidates; a node with at most ``fanout`` of them (or fanout -1)
    keeps them all, otherwise candidate ``c`` (in edge order) draws ``u`` from draw ``c`` of the
    node's stream and the ``fanout`` largest ``ln(1 - u) / w`` are kept, ties by position.
    Returns ``(positions, counts, keep)``: every in-edge's position, node after node, and
    which are kept; reads back only the number of in-edges."""
    seg, within, first = _segments(degree, int(degree.sum()))
    positions = start[seg] + within
    weight = topology.edge_weights(positions)
    candidate = weight > 0
    # Each candidate's index among its node's candidates: its draw's position in the stream.
    num_candidates = torch.zeros_like(degree).index_add_(0, seg, candidate.to(torch.int64))
    before = torch.cumsum(num_candidates, 0) - num_candidates
    ranks = torch.cumsum(candidate, 0) - candidate.to(torch.int64) - before[seg]
    keep = candidate
    if fanout >= 0:
        drawn = num_candidates > fanout
        # Every edge draws (a masked draw would need the number of picks); only the picks'
        # keys count, the others are -inf.
        pick = drawn[seg] & candidate
        bits = rng.draw(keys[seg], ranks)
        key = torch.where(pick, ln_unit(bits) / weight.to(torch.float64), float("-inf"))
        # Largest key first, ties by position (stable sorts keep edge order), then grouped by
        # node: a node's rank among its own edges decides.
        order = torch.sort(key, descending=True, stable=True).indices
        order = order[torch.sort(seg[order], stable=True).indices]
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=order.device) - first[seg[order]]
        keep = torch.where(drawn[seg], candidate & (rank < fanout), candidate)
    counts = torch.zeros_like(degree).index_add_(0, seg, keep.to(torch.int64))
    return positions, counts, keep
