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
from .sampler import DeviceSampler, as_ids

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
    for b, start in enumerate(range(0, seeds.numel(), batch_size)):
        sample = sampler.sample(seeds[start : start + batch_size], batch_key(epoch, b), checked=True)
        # Not bincount: on CUDA it reads the largest id back to size its output.
        counts.index_add_(0, sample.nodes, torch.ones_like(sample.nodes))
    return counts


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
        dim)`` on the device: device-tier rows from device memory, host-tier rows over UVA,
        misses by ``misses`` (the I/O engine into page-locked memory, copied over
        asynchronously on the current stream, or GPUDirect Storage).

        When one tier holds every row the lookup is one gather and never waits for the
        device; otherwise it waits once, for the number of rows in each tier (with the ids in
        tier order when rows can miss: the misses' reader takes them on the host)."""
        code = self.index[nodes]
        self.stats.lookups += 1
        if self._single is not None:
            tier, table = self._single
            setattr(self.stats, TIER_NAMES[tier], getattr(self.stats, TIER_NAMES[tier]) + nodes.numel())
            return uva.gather(table, code >> 2)
        tier, slot = code & 3, code >> 2
        # Nodes grouped by tier (a stable sort keeps each group in order); the groups' sizes
        # and, when rows can miss, the ids in that order (the misses' reader needs them on the
        # host) are read back at once.
        order = torch.sort(tier, stable=True).indices
        sizes = torch.zeros(3, dtype=torch.int64, device=self.device).index_add_(0, tier, torch.ones_like(tier))
        if self._misses_possible:
            back = torch.cat([sizes, nodes[order]]).cpu()
            sizes, in_order = back[:3], back[3:]
        out = torch.empty((nodes.numel(), self.dim), dtype=self.dtype, device=self.device)
        begin = 0
        for t, size in enumerate(sizes.tolist()):
            where = order[begin : begin + size]
            setattr(self.stats, TIER_NAMES[t], getattr(self.stats, TIER_NAMES[t]) + size)
            if size and t == MISS:
                out[where] = self.misses.read(in_order[begin : begin + size])
            elif size:
                out[where] = uva.gather((self.device_table, self.host_table)[t], slot[where])
            begin += size
        return out

    @property
    def nbytes(self) -> dict:
        """Bytes of the index and of each tier's table: ``device_memory`` (index and device
        tier) and ``memory`` (the page-locked host tier)."""
        row = self.dim * torch.empty(0, dtype=self.dtype).element_size()
        return {
            "device_memory": self.index.numel() * 8 + self.device_table.shape[0] * row,
            "memory": self.host_table.shape[0] * row,
        }
