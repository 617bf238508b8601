"""Where the device cache's misses are read from: straight into device memory by GPUDirect
Storage (kvikio's ``CuFile.pread``, cuFile underneath), or through Strata's I/O engine (the
native tiers' merged ``O_DIRECT`` reads) into page-locked host memory and then copied over.

Both readers take the missed node ids on the device and return their rows there, so the cache
above them has one code path. :func:`choose_reads` picks GPUDirect Storage when the device is a
GPU, kvikio imports and reads the feature file without its compatibility mode (cuFile loaded
and the file system supported); otherwise the engine, with the reason in ``note``.

kvikio sends a read smaller than its ``gds_threshold`` (``KVIKIO_GDS_THRESHOLD``, 1 MiB by
default) through POSIX, and a run of misses is often a single row: set the variable to the row
size (e.g. 4096) for row reads to go through cuFile.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

ENGINE, GDS = "engine", "gds"


class EngineReads:
    """Rows read through Strata's I/O engine (``read_rows(ids) -> bytes``, ids a uint32 NumPy
    array) into host memory, page-locked on CUDA, and copied to ``device`` asynchronously on
    the current stream."""

    kind = ENGINE

    def __init__(self, read_rows: Callable[[np.ndarray], bytes], dim: int, dtype: torch.dtype, device):
        self.read_rows, self.dim, self.dtype = read_rows, dim, dtype
        self.device = torch.device(device)

    def host_rows(self, ids: np.ndarray) -> torch.Tensor:
        """The rows of ``ids`` (uint32) as a ``(len(ids), dim)`` host tensor."""
        raw = self.read_rows(ids)
        if not len(raw):
            return torch.empty((0, self.dim), dtype=self.dtype)
        # The engine's bytearray is the tensor's memory as it is (no copy of every missed row).
        raw = raw if isinstance(raw, bytearray) else bytearray(raw)
        return torch.frombuffer(raw, dtype=self.dtype).view(-1, self.dim)

    def read(self, nodes: torch.Tensor) -> torch.Tensor:
        """The rows of ``nodes`` (int64, on the device or already read back to the host) as
        ``(len(nodes), dim)`` on the device."""
        rows = self.host_rows(nodes.to("cpu").numpy().astype("<u4"))
        if self.device.type == "cuda":
            rows = rows.pin_memory()
        return rows.to(self.device, non_blocking=True)


class GdsReads:
    """Rows read by kvikio from the feature file at ``path`` (row ``v`` at byte ``offset + v *
    row_bytes``) straight into device memory: the distinct ids sorted, each run of consecutive
    ids one ``CuFile.pread`` into its slice of one buffer, all in flight at once, then put in
    the asked order on the device."""

    kind = GDS

    def __init__(self, kvikio, path, offset: int, dim: int, dtype: torch.dtype, device):
        self.file = kvikio.CuFile(str(path), "r")
        self.offset, self.dim, self.dtype = int(offset), dim, dtype
        self.row_bytes = dim * torch.empty(0, dtype=dtype).element_size()
        self.device = torch.device(device)

    def read(self, nodes: torch.Tensor) -> torch.Tensor:
        """As :meth:`EngineReads.read`."""
        ids = nodes.to("cpu").numpy()
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
        return buf[torch.from_numpy(inverse.reshape(-1)).to(self.device)]

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
    why = _compat_mode(kvikio, reads.file)
    if why is not None:
        reads.close()
        return ReadChoice(engine, f"kvikio would read {features.filename} in compatibility mode ({why})")
    return ReadChoice(reads, None)


def _compat_mode(kvikio, handle) -> str | None:
    """Why kvikio would read ``handle`` through POSIX and host memory, or None when it reads
    through cuFile. Asks the file handle where kvikio can (the file system's answer), else the
    library: ``defaults.is_compat_mode_preferred()`` (kvikio 25.04 on, with ``AUTO`` resolved),
    else the older ``defaults.compat_mode()`` (a bool, later an enum)."""
    on = "KVIKIO_COMPAT_MODE is on, or libcufile did not load"
    preferred = getattr(handle, "is_compat_mode_preferred", None)
    if callable(preferred):
        return "cuFile cannot serve this file or its file system" if preferred() else None
    defaults = getattr(kvikio, "defaults", None)
    preferred = getattr(defaults, "is_compat_mode_preferred", None)
    if callable(preferred):
        return on if preferred() else None
    legacy = getattr(defaults, "compat_mode", None)
    if callable(legacy):
        mode = legacy()
        return on if mode is True or getattr(mode, "name", None) == "ON" else None
    return "this kvikio does not say whether it reads through cuFile"
