"""The [grid.build], [grid.info], [run] and [farmem.serve] sections (see docs/grid.md); [grid.build]
and [run] are declared by the engine (``strata_grid::config``), [farmem.serve] by the memory
server (``strata_farmem::config``)."""

from __future__ import annotations

from pathlib import Path

from .schema import native_section, option, section

GridBuildConfig = native_section("grid.build", "GridBuildConfig")


@section("grid.info")
class GridInfoConfig:
    target: Path = option(positional=True, help="a store (lists its grids) or a grid directory (STORE/grids/NAME)")
    json: bool = option(False, help="print the grid manifests as JSON instead of text")


RunConfig = native_section("run", "RunConfig")


FarmemServeConfig = native_section("farmem.serve", "FarmemServeConfig")
