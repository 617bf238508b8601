"""The [bench_disk] section."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from .schema import Size, option, section


@section("bench_disk")
class BenchDiskConfig:
    dir: Path = option(Path("."), help="directory on the device to measure (the benchmark file goes there)")
    size: Size = option(Size(4 << 30), help="size of the benchmark file")
    file: Path | None = option(
        None,
        help="benchmark file: created (write test) and kept if absent, measured "
        "read-only if present; default a temporary file in --dir",
    )
    queue_depths: list[int] = option([1, 4, 16, 64, 128, 256], help="queue depths of the 4 KiB random-read test")
    seconds: float = option(3.0, help="seconds per random-read queue depth")
    seq_depth: int = option(32, help="1 MiB requests in flight in the sequential tests")
    backend: Literal["auto", "io_uring", "threads"] = option("auto", help="I/O backend to measure")
    profile: Path | None = option(
        None, help="where to save the device profile (default: per device, under ~/.local/share/strata/devices)"
    )
    save: bool = option(True, help="save the device profile for the engines to plan with")
    keep: bool = option(False, help="keep the benchmark file")

    def check(self) -> None:
        if not self.queue_depths or min(self.queue_depths) < 1:
            raise ConfigError(f"bench_disk.queue_depths: need positive depths, got {self.queue_depths}")
        if self.seconds <= 0:
            raise ConfigError(f"bench_disk.seconds: must be positive, got {self.seconds}")
        if self.size < 4 << 20 and self.file is None:
            raise ConfigError(f"bench_disk.size: at least 4M, got {self.size}")
