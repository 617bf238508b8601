"""The [info] and [check] sections."""

from __future__ import annotations

from pathlib import Path

from .schema import Size, native_section, option, section


@section("info")
class InfoConfig:
    store: Path = option(positional=True, help="the store to describe")
    memory: Size | None = option(None, help="also print each engine's memory plan (its defaults) under this budget")
    json: bool = option(False, help="print the description as JSON instead of text")


class _CheckFrontEnd:
    store: Path = option(
        positional=True, help="the store to check (and the grids built for it), or a grid built on its own (--out)"
    )


#: [check]: which store is Python's; how many problems to list is the checker's
#: (``strata_store::check::CheckOptions``).
CheckConfig = native_section("check", "CheckConfig", front=_CheckFrontEnd)
