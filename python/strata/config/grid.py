"""The [grid.build], [grid.info], [run] and [farmem.serve] sections (see docs/grid.md); [grid.build]
and [run] are declared by the engine (``strata_grid::config``), [farmem.serve] by the memory
server (``strata_farmem::config``)."""

from __future__ import annotations

from pathlib import Path

from .schema import native_section, option, section
from .serve import TOKEN_FILE_HELP

GridBuildConfig = native_section("grid.build", "GridBuildConfig")


@section("grid.info")
class GridInfoConfig:
    target: Path = option(positional=True, help="a store (lists its grids) or a grid directory (STORE/grids/NAME)")
    json: bool = option(False, help="print the grid manifests as JSON instead of text")


class _RunFrontEnd:
    """The [run] option Python handles before the run starts: where the far-memory token is read
    from."""

    far_token_file: Path | None = option(
        None,
        help="file holding the memory server's shared secret on one line (read once; a trailing newline is "
        "dropped): unlike --far-token, not visible in ps",
    )


RunConfig = native_section("run", "RunConfig", front=_RunFrontEnd)


class _FarmemServeFrontEnd:
    """The [farmem.serve] option Python handles before the server starts: where the token is read
    from."""

    token_file: Path | None = option(None, help=TOKEN_FILE_HELP)


FarmemServeConfig = native_section("farmem.serve", "FarmemServeConfig", front=_FarmemServeFrontEnd)
