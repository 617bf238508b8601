"""The I/O engine from Python: its configuration and counters, reading rows of a ``.npy``
through it, and the disk benchmark with its device profiles (see docs/io.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import _native
from .units import fmt_bytes, fmt_count


def configure(backend: str = "auto", depth: int = 256, threads: int = 32, register_files: bool = True) -> None:
    """Sets the engine every reader and writer shares; call before the first I/O.

    ``backend`` is ``auto`` (io_uring when the kernel allows it, else a pread/pwrite thread
    pool), ``io_uring`` or ``threads``; ``depth`` is the most requests in flight.
    """
    _native.io_configure({"backend": backend, "depth": depth, "threads": threads, "register_files": register_files})


def info() -> dict:
    """The running engine: ``backend``, ``fallback_reason`` (why not io_uring), ``depth``."""
    return _native.io_info()


def stats() -> dict:
    """Counters since the engine started: ops and bytes read and written, errors, latency
    p50/p99/p999 in microseconds, in-flight depth now, at most and on average."""
    return _native.io_stats()


def read_rows(path: str | os.PathLike, rows) -> np.ndarray:
    """Rows ``rows`` (any order, repeats allowed) of the C-ordered ``.npy`` at ``path``, read
    through the engine with O_DIRECT; shape ``(len(rows),) + row_shape``."""
    index = np.ascontiguousarray(rows, dtype=np.int64).ravel()
    if index.size and index.min() < 0:
        raise IndexError(f"row {int(index.min())} is negative")
    data, descr, row_shape = _native.read_npy_rows(str(path), index.astype(np.uint64).tolist())
    return np.frombuffer(data, dtype=np.dtype(descr)).reshape((index.size, *row_shape))


def bench_disk(options: dict, progress: Callable[..., bool] | None = None) -> dict:
    """Measures the disk (sequential MB/s, 4 KiB random IOPS by queue depth) with ``options``
    (the [bench_disk] section's benchmark options; the rest take their defaults); returns the
    device profile with ``peak_iops``, ``knee_queue_depth`` and ``target_in_flight_p95``."""
    return _native.bench_disk(options, progress)


def save_profile(profile: dict, path: str | os.PathLike | None = None) -> Path:
    """Saves ``profile`` (to the per-device default path when ``path`` is None)."""
    target = Path(path) if path else Path(_native.default_profile_path(profile["measured_in"]))
    keys = (
        "format_version",
        "device",
        "measured_in",
        "measured_at",
        "backend",
        "file_bytes",
        "seq_read_mb_s",
        "seq_write_mb_s",
        "rand_read_4k",
    )
    _native.save_profile({k: profile[k] for k in keys}, str(target))
    return target


def load_profile(path: str | os.PathLike) -> dict | None:
    """The profile in a ``.json`` file, or the saved profile of the device holding ``path``."""
    return _native.load_profile(str(path))


def format_profile(p: dict) -> str:
    """The report `strata bench-disk` prints."""
    lines = [
        f"Device {p['device']}, measured in {p['measured_in']} with {p['backend']}, file {fmt_bytes(p['file_bytes'])}"
    ]
    if p["seq_write_mb_s"]:
        lines.append(f"  sequential write, 1 MiB requests   {p['seq_write_mb_s']:8,.0f} MB/s")
    lines.append(f"  sequential read,  1 MiB requests   {p['seq_read_mb_s']:8,.0f} MB/s")
    lines.append("  random 4 KiB reads")
    lines.append(f"    {'queue depth':>11}  {'IOPS':>9}  {'MB/s':>6}  {'p50 us':>7}  {'p99 us':>7}")
    for q in p["rand_read_4k"]:
        lines.append(
            f"    {q['queue_depth']:>11}  {q['iops']:>9,.0f}  {q['iops'] * 4096 / 1e6:>6.0f}  "
            f"{q['p50_latency_us']:>7.0f}  {q['p99_latency_us']:>7.0f}"
        )
    lines.append(
        f"  peak {fmt_count(p['peak_iops'])} IOPS; knee of the curve at queue depth {p['knee_queue_depth']} "
        "(the smallest reaching 90% of peak)"
    )
    lines.append(
        f"  GIDS in-flight target for 95% of peak: N = 0.95/0.05 x {p['peak_iops']:,.0f}/s x "
        f"{p['unloaded_latency_us']:.0f} us = {p['target_in_flight_p95']}"
    )
    if p.get("caveat"):
        lines.append(f"  note: {p['caveat']}; the default --size (4 GiB) measures the disk itself")
    return "\n".join(lines)
