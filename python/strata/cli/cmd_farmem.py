"""``strata farmem serve``."""

from __future__ import annotations

import json

from ..config import FarmemServeConfig, from_args
from .common import add_section_command
from .parser import SectionParser


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Far memory for `strata run`: a process on a machine with spare RAM that holds read-only edge "
        "blocks for a compute process and serves them back in chunks.",
    )
    cmds = p.add_subparsers(parser_class=SectionParser, dest="farmem_command", metavar="COMMAND", required=True)
    s = add_section_command(
        cmds,
        "serve",
        FarmemServeConfig,
        run_serve,
        output_flags=False,
        help="serve --capacity bytes of memory on --listen until SIGTERM or Ctrl-C",
        description="Serves far memory on --listen until SIGTERM or Ctrl-C, then exits 0 with a one-line summary. "
        "Prints 'listening on HOST:PORT' (flushed) once ready; --listen HOST:0 picks a free port. The data it holds "
        "is a copy: a compute process that loses it goes on from its disk copy.",
    )
    s.add_argument("--json-summary", action="store_true", help="print the final summary as JSON on stdout")


def run_serve(args) -> int:
    from ..grid import format_serve, serve_farmem

    cfg = from_args(FarmemServeConfig, args)
    info = serve_farmem(cfg)
    print(json.dumps(info, indent=2) if args.json_summary else format_serve(info), flush=True)
    return 0
