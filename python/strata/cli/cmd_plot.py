"""``strata plot``."""

from __future__ import annotations

from ..config import PlotConfig, from_args
from ..plot import plot_run
from .common import add_section_command


def register(sub) -> None:
    add_section_command(
        sub,
        "plot",
        PlotConfig,
        run,
        output_flags=False,
        help="PNG charts of a run: loss, metrics, and the I/O timeline (embedding) or loader stages and tiers (GNN)",
    )


def run(args) -> int:
    cfg = from_args(PlotConfig, args)
    for path in plot_run(cfg.target, cfg.out, cfg.epoch):
        print(path)
    return 0
