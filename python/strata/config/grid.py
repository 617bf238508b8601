"""The [grid.build], [grid.info], [run] and [farmem.serve] sections (see docs/grid.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from .schema import Size, option, section

ALGORITHMS = ("pagerank", "bfs", "wcc", "sssp", "spmv", "kcore")
#: Most vertex chunks a grid may have (the native engine's limit).
MAX_PARTITIONS = 4096


def check_address(where: str, addr: str) -> None:
    """``addr`` is ``HOST:PORT`` with a port in 0..65535, or a ConfigError naming ``where``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{where}: expected HOST:PORT such as 127.0.0.1:7000, got {addr!r}")


def _check_weights(where: str, low: float, high: float) -> None:
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ConfigError(f"{where}.weight_low, weight_high: need finite weight_low < weight_high, got ({low}, {high}]")


@section("grid.build")
class GridBuildConfig:
    store: Path = option(positional=True, help="store whose train edges become the grid")
    name: str = option("", help="grid name under STORE/grids/ (default: p{P}-{order}[-sym][-w])")
    partitions: int = option(0, help="vertex chunks P of the P x P grid; 0 chooses from the vertex count and --memory")
    order: Literal["column", "row"] = option(
        "column", help="block order on disk: column keeps blocks of one destination chunk together, row of one source"
    )
    symmetrize: bool | None = option(
        None, help="store both directions of every edge (needed by wcc and kcore); unset follows the store"
    )
    weighted: bool = option(False, help="draw an edge weight per edge (needed by sssp and weighted spmv)")
    weight_seed: int = option(0, help="seed of the edge weights (a weight depends on the seed and the endpoint pair)")
    weight_low: float = option(0.0, help="edge weights are uniform in (weight_low, weight_high]")
    weight_high: float = option(1.0, help="upper end of the edge weights")
    memory: Size = option(Size(1 << 30), help="memory budget of the build (and of the runs P is planned for)")
    overwrite: bool = option(False, help="replace an existing grid of the same name")

    def check(self) -> None:
        if not 0 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(f"grid.build.partitions: must be in 0..{MAX_PARTITIONS} (0: auto), got {self.partitions}")
        if "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"grid.build.name: must be a plain directory name, got {self.name!r}")
        _check_weights("grid.build", self.weight_low, self.weight_high)


@section("grid.info")
class GridInfoConfig:
    target: Path = option(positional=True, help="a store (lists its grids) or a grid directory (STORE/grids/NAME)")
    json: bool = option(False, help="print the grid manifests as JSON instead of text")


@section("run")
class RunConfig:
    algorithm: Literal["pagerank", "bfs", "wcc", "sssp", "spmv", "kcore"] = option(
        positional=True, help="algorithm: pagerank, bfs, wcc, sssp, spmv or kcore"
    )
    store: Path = option(positional=True, help="store to run on (its grids live in STORE/grids/)")
    iterations: int = option(20, help="pagerank: most iterations (all of them when --tolerance is 0)")
    tolerance: float = option(0.0, help="pagerank: stop once the L1 change of the ranks is below V x tolerance")
    damping: float = option(0.85, help="pagerank: damping factor, in [0, 1)")
    root: int = option(0, help="bfs, sssp: the source vertex")
    vector: Path | None = option(None, help="spmv: float .npy vector x of length V (default: all ones)")
    weighted: bool = option(False, help="spmv: multiply by the edge weights (uses a weighted grid)")
    grid: str | None = option(None, help="grid name under STORE/grids/; unset finds one that suits, or builds it")
    memory: Size = option(Size(1 << 30), help="local memory budget: vertex data, fetch buffers, resident edge blocks")
    threads: int = option(0, help="compute threads; 0 = one per core")
    segment: Size = option(
        Size(0),
        help="edge blocks are grouped into segments of up to this size, the unit of placement and fetching "
        "(a bigger block is a segment by itself); 0 picks up to 4 MiB, keeping fetch buffers within a third "
        "of --memory",
    )
    prefetch: int = option(8, help="segments fetched ahead per source; 1 = no prefetch, 2 = double buffering")
    vertex: str = option(
        "auto",
        help="where vertex data lives: memory, windows (scratch files in the run directory, paged by the kernel "
        "within --memory) or auto (memory when it fits next to the fetch buffers, else windows)",
    )
    disk_fetchers: int = option(4, help="threads reading edge segments from disk")
    far: str | None = option(None, help="HOST:PORT of a `strata farmem serve` to offload edge blocks to")
    far_ratio: float = option(0.5, help="share of the run's footprint to place in far memory, in [0, 1]")
    far_chunk: Size = option(Size(256 << 10), help="bytes per far-memory transfer chunk (4 KiB to 64 MiB)")
    far_connections: int = option(0, help="parallel data connections to far memory; 0 = the controller probes")
    far_fetchers: int = option(2, help="threads fetching segments from far memory")
    keep_resident: bool = option(True, help="keep edge blocks in memory when they fit (false: stream every pass)")
    weight_seed: int = option(0, help="seed of the weights when a weighted grid must be built (sssp, spmv --weighted)")
    weight_low: float = option(0.0, help="weights of an automatically built grid are uniform in (low, high]")
    weight_high: float = option(1.0, help="upper end of the weights of an automatically built grid")
    out: Path | None = option(None, help="directory for the results, run.json and metrics.jsonl (STORE/runs/grid-ALGO)")

    def check(self) -> None:
        if self.iterations < 1:
            raise ConfigError(f"run.iterations: need at least 1, got {self.iterations}")
        if not self.tolerance >= 0:
            raise ConfigError(f"run.tolerance: must be >= 0, got {self.tolerance}")
        if not 0.0 <= self.damping < 1.0:
            raise ConfigError(f"run.damping: must be in [0, 1), got {self.damping}")
        if self.vertex not in ("auto", "memory", "windows"):
            raise ConfigError(f"run.vertex: expected auto, memory or windows, got {self.vertex!r}")
        if self.segment != 0 and self.segment < 4096:
            raise ConfigError(f"run.segment: must be 0 (automatic) or at least 4 KiB, got {self.segment}")
        for name in ("prefetch", "disk_fetchers", "far_fetchers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"run.{name}: need at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.far_ratio <= 1.0:
            raise ConfigError(f"run.far_ratio: must be in [0, 1], got {self.far_ratio}")
        if not 4096 <= self.far_chunk <= 64 << 20:
            raise ConfigError(f"run.far_chunk: must be between 4 KiB and 64 MiB, got {self.far_chunk}")
        if self.far is not None:
            check_address("run.far", self.far)
        if self.grid is not None and ("/" in self.grid or self.grid.startswith(".") or not self.grid):
            raise ConfigError(f"run.grid: must be a grid name under STORE/grids/, got {self.grid!r}")
        _check_weights("run", self.weight_low, self.weight_high)


@section("farmem.serve")
class FarmemServeConfig:
    listen: str = option("127.0.0.1:7000", help="HOST:PORT to listen on; port 0 picks a free one")
    capacity: Size = option(Size(1 << 30), help="bytes of memory to lend to compute processes")

    def check(self) -> None:
        check_address("farmem.serve.listen", self.listen)
        if self.capacity <= 0:
            raise ConfigError(f"farmem.serve.capacity: must be positive, got {self.capacity}")
