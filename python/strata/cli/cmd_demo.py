"""``strata demo``: the main job on built-in generated data, with readable output."""

from __future__ import annotations

from pathlib import Path


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Generates a knowledge graph and an RMAT graph, converts them under a small "
        "memory budget, and describes the stores.",
    )
    p.add_argument("--dir", type=Path, default=Path("demo-output"), help="working directory (default: demo-output)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--small",
        action="store_true",
        help="every step on graphs about a quarter the size (still out of core): quicker, e.g. on a slow machine",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from ..demo import FULL, SMALL, run_demo

    return run_demo(args.dir, quiet=args.quiet, size=SMALL if args.small else FULL)
