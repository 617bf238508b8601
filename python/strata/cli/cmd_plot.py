"""``strata plot``."""

from __future__ import annotations

from ..config import PlotConfig, from_args
from ..plot import plot_run
from .common import add_section_command


def register(sub, name: str, help: str) -> None:
    add_section_command(
        sub,
        name,
        PlotConfig,
        run,
        output_flags=False,
        help=help,
    )


def run(args) -> int:
    cfg = from_args(PlotConfig, args)
    for path in plot_run(cfg.target, cfg.out, cfg.epoch):
        print(path)
    return 0
