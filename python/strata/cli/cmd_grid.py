"""``strata grid build|info|list``."""

from __future__ import annotations

import json
import sys

from ..config import GridBuildConfig, GridInfoConfig, from_args
from .common import add_section_command, emit_summary, run_with_progress
from .parser import SectionParser


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="A grid holds a store's train edges in P x P blocks (vertex chunk of the source x chunk of the "
        "destination) that `strata run` streams. Grids live in STORE/grids/NAME, or, built straight from an input "
        "edge list, in a directory of their own.",
    )
    cmds = p.add_subparsers(parser_class=SectionParser, dest="grid_command", metavar="COMMAND", required=True)
    add_section_command(
        cmds,
        "build",
        GridBuildConfig,
        run_build,
        help="build a grid of a store's train edges, or straight from an input edge list (--out), within --memory",
        description="Builds STORE/grids/NAME from the store's train edges, or with --out DIR the grid directory DIR "
        "straight from an input edge list (bin32 pairs, text, NumPy; no store, no CSR/CSC; `strata run ALGO DIR` "
        "runs on it), in two streaming passes within --memory: edges are binned by column (or row) of blocks into "
        "one spool, then each column is sorted into its blocks. --symmetrize stores both directions (wcc, kcore, "
        "mis), --simple drops self-loops and stores each repeated edge once (kcore), --weighted weights the edges "
        "(sssp, weighted spmv): the input's weight column or drawn weights.",
    )
    for name, text in (("info", "describe a grid, or list the grids of a store"), ("list", "the same as info")):
        add_section_command(
            cmds,
            name,
            GridInfoConfig,
            run_info,
            output_flags=False,
            help=text,
            description="Given a store, lists its grids (name, P, order, symmetric, weights, counts, bytes); given a "
            "grid directory, prints its manifest in words.",
        )


def run_build(args) -> int:
    from ..grid import build_grid, format_build

    cfg = from_args(GridBuildConfig, args)
    summary = run_with_progress(args, lambda bar: build_grid(cfg, bar))
    emit_summary(args, summary, format_build(summary))
    return 0


def run_info(args) -> int:
    from ..grid import format_grids, list_grids

    cfg = from_args(GridInfoConfig, args)
    entries = list_grids(cfg.target)
    print(json.dumps(entries, indent=2) if cfg.json else format_grids(entries, cfg.target))
    # The listing shows every grid; an invalid one still fails the command, as `strata check` does.
    invalid = [e for e in entries if "error" in e]
    for e in invalid:
        print(f"strata grid info: error: grid {e['name']} is invalid: {e['error']}", file=sys.stderr)
    return 2 if invalid else 0
