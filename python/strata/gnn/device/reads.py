"""Where the device cache's misses are read from: straight into device memory by GPUDirect
Storage (kvikio's ``CuFile.pread``, cuFile underneath), or through Strata's I/O engine (the
native tiers' merged ``O_DIRECT`` reads) into page-locked host memory and then copied over.

Both readers take the missed node ids (on the device or the host) and ``stage`` their rows (in
page-locked host memory, or on the device for GPUDirect Storage), which ``deliver`` puts on the
device when a batch takes them, so the cache above them has one code path and a window's
misses, read at once, wait in host memory until their batches are served. :func:`choose_reads`
picks GPUDirect Storage when the device is a GPU, kvikio imports and reads the feature file
without its compatibility mode (cuFile loaded and the file system supported); otherwise the
engine, with the reason in ``note``.

kvikio sends a read smaller than its ``gds_threshold`` (``KVIKIO_GDS_THRESHOLD``, 1 MiB by
default) through POSIX, and a run of misses is often a single row: set the variable to the row
size (e.g. 4096) for row reads to go through cuFile.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np
import torch

from ...device.gds import compat_mode_reason

ENGINE, GDS = "engine", "gds"
#: What :class:`EngineReads` counts of the native tiers' work (``TierStats`` fields).
READ_COUNTS = ("cache_rows", "disk_rows", "disk_requests", "disk_bytes_read")


class EngineReads:
    """Rows read through the native data path's feature tiers (``tiers``, a
    ``_native.GnnData``: its dynamic cache, then Strata's I/O engine) into host memory,
    page-locked on CUDA, and copied to ``device`` asynchronously on the current stream.

    With a dynamic cache in the tiers (``windowed``), a batch's missed ids are pinned there
    when the batch enters the pipeline's look-ahead window (:meth:`pin`, GIDS window
    buffering) and read with ``pinned=True``, which releases the pins; :meth:`unpin` releases
    them for a batch that will not be read. ``counts`` adds up what the tiers did for the
    reads: rows from the dynamic cache and from the disk, disk requests and bytes."""

    kind = ENGINE

    def __init__(self, tiers, dim: int, dtype: torch.dtype, device):
        self.tiers, self.dim, self.dtype = tiers, dim, dtype
        self.device = torch.device(device)
        self.windowed = bool(tiers.has_cache)
        self.counts = dict.fromkeys(READ_COUNTS, 0)
        tiers.take_tier_stats()  # the counters from here on are these reads'

    def pin(self, ids: np.ndarray) -> None:
        """A batch that will read ``ids`` (uint32) entered the window: their rows stay cached
        until it reads them (nothing without a dynamic cache)."""
        if self.windowed:
            self.tiers.pin_window(ids.tobytes())

    def unpin(self, ids: np.ndarray) -> None:
        """Releases the pins of :meth:`pin` for a batch that will not read ``ids``."""
        if self.windowed:
            self.tiers.unpin_window(ids.tobytes())

    def host_rows(self, ids: np.ndarray, *, pinned: bool = False) -> torch.Tensor:
        """The rows of ``ids`` (uint32) as a ``(len(ids), dim)`` host tensor; ``pinned``: the
        ids were pinned by :meth:`pin` (the read releases those pins, also when it fails)."""
        raw = self.tiers.gather(ids.tobytes(), pinned and self.windowed)
        st = self.tiers.take_tier_stats()
        for k in READ_COUNTS:
            self.counts[k] += st[k]
        if not len(raw):
            return torch.empty((0, self.dim), dtype=self.dtype)
        # The engine's bytearray is the tensor's memory as it is (no copy of every missed row).
        return torch.frombuffer(raw, dtype=self.dtype).view(-1, self.dim)

    def stage(self, nodes, *, pinned: bool = False) -> torch.Tensor:
        """The rows of ``nodes`` (int64 on the device, or uint32/int64 ids already on the host)
        as ``(len(nodes), dim)`` in host memory, page-locked on CUDA (staged for
        :meth:`deliver`); ``pinned`` as :meth:`host_rows`."""
        ids = nodes.to("cpu").numpy() if isinstance(nodes, torch.Tensor) else np.asarray(nodes)
        rows = self.host_rows(ids.astype("<u4", copy=False), pinned=pinned)
        return rows.pin_memory() if self.device.type == "cuda" else rows

    def deliver(self, staged: torch.Tensor) -> torch.Tensor:
        """Staged rows on the device, copied asynchronously on the current stream."""
        return staged.to(self.device, non_blocking=True)


class GdsReads:
    """Rows read by kvikio from the feature file at ``path`` (row ``v`` at byte ``offset + v *
    row_bytes``) straight into device memory: the distinct ids sorted, each run of consecutive
    ids one ``CuFile.pread`` into its slice of one buffer, all in flight at once, then put in
    the asked order on the device. ``counts`` as :class:`EngineReads`' (no cache rows)."""

    kind = GDS
    #: No host cache to pin rows in: the rows go straight to the device.
    windowed = False

    def __init__(self, kvikio, path, offset: int, dim: int, dtype: torch.dtype, device):
        self.file = kvikio.CuFile(str(path), "r")
        self.offset, self.dim, self.dtype = int(offset), dim, dtype
        self.row_bytes = dim * torch.empty(0, dtype=dtype).element_size()
        self.device = torch.device(device)
        self.counts = dict.fromkeys(READ_COUNTS, 0)

    def stage(self, nodes, *, pinned: bool = False) -> torch.Tensor:
        """The rows of ``nodes``, read straight into device memory (``pinned`` is never set:
        :attr:`windowed` is False)."""
        ids = nodes.to("cpu").numpy() if isinstance(nodes, torch.Tensor) else np.asarray(nodes)
        distinct, inverse = np.unique(ids, return_inverse=True)
        breaks = np.flatnonzero(np.diff(distinct) != 1) + 1
        starts, ends = np.concatenate([[0], breaks]), np.concatenate([breaks, [distinct.size]])
        buf = torch.empty((distinct.size, self.dim), dtype=self.dtype, device=self.device)
        futures = [
            self.file.pread(buf[s:e], int(e - s) * self.row_bytes, self.offset + int(distinct[s]) * self.row_bytes)
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
            if e > s
        ]
        for f in futures:
            f.get()
        for k, v in (("disk_rows", ids.size), ("disk_requests", len(futures)), ("disk_bytes_read", buf.nbytes)):
            self.counts[k] += v
        return buf[torch.from_numpy(inverse.reshape(-1)).to(self.device)]

    def deliver(self, staged: torch.Tensor) -> torch.Tensor:
        """Staged rows are on the device already."""
        return staged

    def close(self) -> None:
        self.file.close()


@dataclass
class ReadChoice:
    """The reader of the misses and, when it is not GPUDirect Storage, why (None otherwise)."""

    reads: EngineReads | GdsReads
    note: str | None


def choose_reads(
    engine: EngineReads, features: np.memmap, device, *, gds: str = "auto", load=importlib.import_module
) -> ReadChoice:
    """GPUDirect Storage for the rows of ``features`` (the store's memory-mapped feature file)
    when ``gds`` is ``"auto"``, ``device`` is a GPU, ``load("kvikio")`` imports and kvikio reads
    the file through cuFile; else ``engine``, with the reason."""
    if gds not in ("auto", "off"):
        raise ValueError(f"gds: expected 'auto' or 'off', got {gds!r}")
    device = torch.device(device)
    if gds == "off":
        return ReadChoice(engine, "GPUDirect Storage was turned off (gds='off')")
    if device.type != "cuda":
        return ReadChoice(engine, f"no GPU (the device is {device})")
    try:
        kvikio = load("kvikio")
    except ImportError as e:
        return ReadChoice(engine, f"kvikio does not import ({e}); install kvikio for GPUDirect Storage")
    reads = GdsReads(kvikio, features.filename, features.offset, engine.dim, engine.dtype, device)
    why = compat_mode_reason(kvikio, reads.file)
    if why is not None:
        reads.close()
        return ReadChoice(engine, f"kvikio would read {features.filename} in compatibility mode ({why})")
    return ReadChoice(reads, None)
