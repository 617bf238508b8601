"""``strata info``."""

from __future__ import annotations

import json

from ..config import InfoConfig, from_args
from ..info import describe, render
from ..store import Store
from .common import add_section_command


def register(sub, name: str, help: str) -> None:
    add_section_command(
        sub,
        name,
        InfoConfig,
        run,
        output_flags=False,
        help=help,
    )


def run(args) -> int:
    cfg = from_args(InfoConfig, args)
    desc = describe(Store(cfg.store), cfg.memory)
    print(json.dumps(desc, indent=2) if cfg.json else render(desc))
    return 0
