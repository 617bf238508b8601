"""The heterogeneous feature cache, managed from the device (Helios §3.2).

One per-node index on the device says where each feature row lives: ``slot << 2 | tier``, the
tier one of device memory (``DEVICE``), page-locked host memory (``HOST``, read by the lookup
kernel over UVA) or neither (``MISS``: the row comes through Strata's I/O engine, the native
data path's tiers and merged reads, then to the device). Rows are placed by hotness, the
number of times one pre-sampling epoch of the device sampler reached each node: the hottest in
device memory, the next in host memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from . import uva
from .keys import batch_key
from .reads import EngineReads, GdsReads
from .sampler import DeviceSampler, as_ids, one_ahead

DEVICE, HOST, MISS = 0, 1, 2
TIER_NAMES = ("device_rows", "host_rows", "miss_rows")
#: Feature bytes per chunk of node ids when the tiers are filled (the host holds one chunk).
FILL_BYTES = 64 << 20


def presample_hotness(sampler: DeviceSampler, seeds, batch_size: int, *, epoch: int = 0) -> torch.Tensor:
    """How often each node appears in the samples of one epoch over ``seeds`` (in the given
    order, ``batch_size`` per batch, batch ``b`` keyed ``batch_key(epoch, b)`` as the native
    loader keys it): an int64 count per graph node on the sampler's device."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected at least 1, got {batch_size}")
    # The seeds stay in host memory, checked once (no batch reads them back or passes over them).
    seeds = as_ids(seeds, torch.device("cpu"))
    sampler.check(seeds.numpy())
    counts = torch.zeros(sampler.topology.num_nodes, dtype=torch.int64, device=sampler.device)
    starts = (
        sampler.start(seeds[start : start + batch_size], batch_key(epoch, b), checked=True)
        for b, start in enumerate(range(0, seeds.numel(), batch_size))
    )
    # Each batch started before the one before it is finished: the host never waits for a draw.
    for started in one_ahead(starts):
        nodes = started.finish().nodes
        # Not bincount: on CUDA it reads the largest id back to size its output.
        counts.index_add_(0, nodes, torch.ones_like(nodes))
    return counts


@dataclass
class PlannedLookup:
    """A lookup placed by :meth:`DeviceCache.plan`: each node's ``slot`` in its tier; with
    more than one tier, ``order`` (the nodes' positions grouped by tier: device, host, miss)
    and the group ``sizes``; ``misses`` (uint32 ids on the host, or None), whether they are
    ``pinned`` in the reader's dynamic cache, and their ``rows`` once read ahead
    (:meth:`DeviceCache.read_ahead`; None until then)."""

    slot: torch.Tensor
    order: torch.Tensor | None
    sizes: list[int]
    misses: np.ndarray | None
    pinned: bool
    rows: torch.Tensor | None = None

    @property
    def unread(self) -> int:
        """Missed rows not read yet."""
        return 0 if self.misses is None or self.rows is not None else int(self.misses.size)


@dataclass
class CacheStats:
    """Rows served per tier, and lookups made."""

    device_rows: int = 0
    host_rows: int = 0
    miss_rows: int = 0
    lookups: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class DeviceCache:
    """Feature rows served from device memory, page-locked host memory, or read on a miss.

    ``features``: the store's ``(num_nodes, dim)`` feature array (its memory map), from which
    the tiers are filled once; ``misses`` reads the rows no tier holds
    (:mod:`~strata.gnn.device.reads`: the I/O engine or GPUDirect Storage); ``hotness`` (one
    count per node, e.g. :func:`presample_hotness`) ranks the rows; the ``device_rows`` hottest
    go to device memory and the next ``host_rows`` to page-locked host memory."""

    def __init__(
        self,
        features,
        misses: EngineReads | GdsReads,
        hotness: torch.Tensor,
        *,
        device_rows: int,
        host_rows: int,
        device,
    ):
        num_nodes, dim = features.shape
        if device_rows < 0 or host_rows < 0:
            raise ValueError(f"cache: tier sizes must not be negative, got {device_rows} and {host_rows}")
        if hotness.shape != (num_nodes,):
            raise ValueError(
                f"cache: expected one hotness count per node ({num_nodes}), got shape {tuple(hotness.shape)}"
            )
        self.device = torch.device(device)
        self.features, self.misses = features, misses
        self.dim, self.dtype = dim, torch.from_numpy(np.empty(0, dtype=features.dtype)).dtype
        device_rows, host_rows = min(device_rows, num_nodes), min(host_rows, max(num_nodes - device_rows, 0))
        # Hottest first; ties by node id (a stable sort), so the placement is reproducible.
        order = torch.sort(hotness.to(self.device), descending=True, stable=True).indices
        on_device, on_host = order[:device_rows], order[device_rows : device_rows + host_rows]
        index = torch.full((num_nodes,), MISS, dtype=torch.int64, device=self.device)
        index[on_device] = torch.arange(device_rows, device=self.device) << 2 | DEVICE
        index[on_host] = torch.arange(host_rows, device=self.device) << 2 | HOST
        self.index = index
        self.device_table = torch.empty((device_rows, dim), dtype=self.dtype, device=self.device)
        pin = self.device.type == "cuda"
        self.host_table = torch.empty((host_rows, dim), dtype=self.dtype, pin_memory=pin)
        self._fill(index.to("cpu"))
        self.stats = CacheStats()
        self._misses_possible = device_rows + host_rows < num_nodes
        # (tier, table) when that tier holds every row: a lookup is then a plain gather.
        self._single = None
        if num_nodes and device_rows == num_nodes:
            self._single = (DEVICE, self.device_table)
        elif num_nodes and host_rows == num_nodes:
            self._single = (HOST, self.host_table)

    def _fill(self, index: torch.Tensor) -> None:
        """Both tables filled in one pass over the feature file in id order (its held rows
        only, a chunk of ``FILL_BYTES`` at a time), so a tier of most rows reads the file
        sequentially and one of a few rows reads only their pages."""
        row_bytes = self.dim * self.device_table.element_size()
        step = max(FILL_BYTES // max(row_bytes, 1), 1)
        for start in range(0, index.numel(), step):
            code = index[start : start + step]
            for tier, table in ((DEVICE, self.device_table), (HOST, self.host_table)):
                held = torch.nonzero(code & 3 == tier).reshape(-1)
                if held.numel():
                    rows = torch.from_numpy(np.asarray(self.features[(start + held).numpy()]))
                    table[(code[held] >> 2).to(table.device)] = rows.to(table.device)

    def tiers(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tier, slot)`` of each of ``nodes`` (int64 on the device)."""
        code = self.index[nodes]
        return code & 3, code >> 2

    def lookup(self, nodes: torch.Tensor) -> torch.Tensor:
        """The feature rows of ``nodes`` (int64 global ids on the device) as ``(len(nodes),
        dim)`` on the device: :meth:`serve` of :meth:`plan`."""
        return self.serve(self.plan(nodes))

    def plan(self, nodes: torch.Tensor) -> PlannedLookup:
        """Where each of ``nodes`` (int64 global ids on the device) is served from, decided
        when their batch is sampled: when rows can miss, the ids in tier order are read back
        (the lookup's one wait for the device) and the misses pinned in the reader's dynamic
        cache until :meth:`serve` (or :meth:`release`), so the batches sampled ahead keep
        the rows they will read (GIDS window buffering). When one tier holds every row the
        plan is a slot per node and never waits."""
        code = self.index[nodes]
        if self._single is not None:
            tier = self._single[0]
            sizes = [nodes.numel() if t == tier else 0 for t in range(3)]
            return PlannedLookup(code >> 2, None, sizes, None, False)
        tier, slot = code & 3, code >> 2
        # Nodes grouped by tier (a stable sort keeps each group in order); the groups' sizes
        # and, when rows can miss, the ids in that order (the misses' reader takes them on
        # the host) are read back at once.
        order = torch.sort(tier, stable=True).indices
        sizes = torch.zeros(3, dtype=torch.int64, device=self.device).index_add_(0, tier, torch.ones_like(tier))
        if not self._misses_possible:
            return PlannedLookup(slot, order, sizes.tolist(), None, False)
        back = torch.cat([sizes, nodes[order]]).cpu()
        sizes = back[:3].tolist()
        misses = back[3 + sizes[DEVICE] + sizes[HOST] :].numpy().astype("<u4")
        pinned = self.misses.windowed and misses.size > 0
        if pinned:
            self.misses.pin(misses)
        return PlannedLookup(slot, order, sizes, misses, pinned)

    def serve(self, planned: PlannedLookup) -> torch.Tensor:
        """The rows of a :meth:`plan` as ``(nodes, dim)`` on the device: device-tier rows from
        device memory, host-tier rows over UVA, misses by ``misses`` (the I/O engine into
        page-locked memory, copied over asynchronously on the current stream, or GPUDirect
        Storage), releasing the plan's pins."""
        self.stats.lookups += 1
        for t, size in enumerate(planned.sizes):
            setattr(self.stats, TIER_NAMES[t], getattr(self.stats, TIER_NAMES[t]) + size)
        if self._single is not None:
            return uva.gather(self._single[1], planned.slot)
        out = torch.empty((sum(planned.sizes), self.dim), dtype=self.dtype, device=self.device)
        begin = 0
        for t, size in enumerate(planned.sizes):
            where = planned.order[begin : begin + size]
            if size and t == MISS:
                if planned.rows is None:
                    self.read_ahead([planned])
                out[where] = self.misses.deliver(planned.rows)
                planned.rows = None  # the batch holds them now
            elif size:
                out[where] = uva.gather((self.device_table, self.host_table)[t], planned.slot[where])
            begin += size
        return out

    def read_ahead(self, plans: list[PlannedLookup]) -> None:
        """Reads the missed rows of ``plans`` (e.g. the batches waiting in a window) in one
        read, each distinct row once and rows sharing pages in one request (GIDS's storage
        access accumulator: the batches' reads merged), releasing their pins; each plan keeps
        its rows, staged (in page-locked host memory for the I/O engine, on the device for
        GPUDirect Storage), for :meth:`serve`. On an error every plan's pins are released
        too."""
        plans = [p for p in plans if p.unread]
        if not plans:
            return
        pinned = any(p.pinned for p in plans)
        ids = np.concatenate([p.misses for p in plans])
        try:
            rows = self.misses.stage(ids, pinned=pinned)
        finally:
            # The read released the pins, or failed and released them all.
            for p in plans:
                p.pinned = False
        for p, part in zip(plans, torch.split(rows, [p.misses.size for p in plans]), strict=True):
            p.rows = part

    def release(self, planned: PlannedLookup) -> None:
        """A :meth:`plan` that will not be served: its pins are released."""
        if planned.pinned:
            self.misses.unpin(planned.misses)

    def reset_stats(self) -> None:
        """Zeroes :attr:`stats` and the reader's ``counts`` (an epoch's start)."""
        self.stats = CacheStats()
        self.misses.counts.update(dict.fromkeys(self.misses.counts, 0))

    def stats_dict(self) -> dict:
        """Rows per tier and lookups since :meth:`reset_stats`, with what the misses' reader
        did for the misses (``cache_rows``: its dynamic cache's hits; ``disk_rows``,
        ``disk_requests``, ``disk_bytes_read``), and ``rows`` in all."""
        st = self.stats
        rows = st.device_rows + st.host_rows + st.miss_rows
        # ``hot_rows``: the host tier is the plan's hot set, counted under the native path's name.
        return {**st.as_dict(), "rows": rows, "hot_rows": st.host_rows, **self.misses.counts}

    @property
    def nbytes(self) -> dict:
        """Bytes of the index and of each tier's table: ``device_memory`` (index and device
        tier) and ``memory`` (the page-locked host tier)."""
        row = self.dim * torch.empty(0, dtype=self.dtype).element_size()
        return {
            "device_memory": self.index.numel() * 8 + self.device_table.shape[0] * row,
            "memory": self.host_table.shape[0] * row,
        }
