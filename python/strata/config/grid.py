"""The [grid.build], [grid.info], [run] and [farmem.serve] sections (see docs/grid.md); [grid.build]
and [run] are declared by the engine (``strata_grid::config``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .schema import Size, native_section, option, section


def check_address(where: str, addr: str) -> None:
    """``addr`` is ``HOST:PORT`` with a port in 0..65535, or a ConfigError naming ``where``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{where}: expected HOST:PORT such as 127.0.0.1:7000, got {addr!r}")


GridBuildConfig = native_section("grid.build", "GridBuildConfig")


@section("grid.info")
class GridInfoConfig:
    target: Path = option(positional=True, help="a store (lists its grids) or a grid directory (STORE/grids/NAME)")
    json: bool = option(False, help="print the grid manifests as JSON instead of text")


RunConfig = native_section("run", "RunConfig")


@section("farmem.serve")
class FarmemServeConfig:
    listen: str = option("127.0.0.1:7000", help="HOST:PORT to listen on; port 0 picks a free one")
    capacity: Size = option(Size(1 << 30), help="bytes of memory to lend to compute processes")

    def check(self) -> None:
        check_address("farmem.serve.listen", self.listen)
        if self.capacity <= 0:
            raise ConfigError(f"farmem.serve.capacity: must be positive, got {self.capacity}")
