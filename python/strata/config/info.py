"""The [info] section."""

from __future__ import annotations

from pathlib import Path

from .schema import Size, option, section


@section("info")
class InfoConfig:
    store: Path = option(positional=True, help="the store to describe")
    memory: Size | None = option(None, help="also say what fits in this memory budget")
    dim: int = option(128, help="embedding dimension assumed when planning embedding training with --memory")
    json: bool = option(False, help="print the description as JSON instead of text")
