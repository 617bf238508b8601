"""``strata run ALGO STORE``."""

from __future__ import annotations

from ..config import RunConfig, from_args
from ..embed import dist
from .common import add_section_command, emit_summary, run_with_progress


def register(sub, name: str, help: str) -> None:
    add_section_command(
        sub,
        name,
        RunConfig,
        run,
        help=help,
        description="Runs ALGORITHM on STORE's grid (found in STORE/grids/, or built on first use) "
        "within --memory: vertex data stays local (in windows paged within the budget when it does not fit), edge "
        "blocks go to far memory (--far HOST:PORT, up to --far-ratio of the footprint), "
        "stay resident when they fit, or stream from disk every pass. Prints the budget plan, one line per iteration "
        "and a summary; writes the result arrays, metrics.jsonl and run.json to --out (STORE/runs/grid-ALGO). "
        "Under torchrun each rank streams its own columns of the grid within its own --memory and the ranks "
        "exchange vertex values every iteration; rank 0 writes the results. `strata run program STORE --program "
        "FILE` runs a vertex program of your own (a .py file defining a strata.grid.VertexProgram, a .toml or .json "
        'file, or JSON text; docs/grid.md, "Vertex programs") the same way; its results go to '
        "STORE/runs/grid-program-NAME.",
    )


def run(args) -> int:
    from ..grid import format_summary
    from ..grid import run as run_grid

    cfg = from_args(RunConfig, args)
    summary = run_with_progress(args, lambda bar: run_grid(cfg, bar))
    if not dist.follower():
        emit_summary(args, summary, format_summary(summary))
    return 0
