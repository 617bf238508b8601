"""The [info] section."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .schema import Size, option, section


@section("info")
class InfoConfig:
    store: Path = option(positional=True, help="the store to describe")
    memory: Size | None = option(None, help="also print each engine's memory plan (its defaults) under this budget")
    json: bool = option(False, help="print the description as JSON instead of text")


@section("check")
class CheckConfig:
    store: Path = option(positional=True, help="the store to check (and the grids built for it)")
    max_problems: int = option(
        20, help="problems listed per file (the rest are counted); every array is read in full either way"
    )

    def check(self) -> None:
        if self.max_problems < 1:
            raise ConfigError(f"check.max_problems: need at least 1, got {self.max_problems}")
