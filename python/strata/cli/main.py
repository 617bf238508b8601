"""The ``strata`` command: one subcommand per job, each configured through its config section."""

from __future__ import annotations

import argparse
import os
import sys

# Strata never calls BLAS from the command line; OpenBLAS's idle threads would only take CPU
# from the I/O and parsing threads on small machines. Must precede the first NumPy import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .. import __version__, io
from ..errors import StrataError
from . import (
    cmd_bench_disk,
    cmd_check,
    cmd_config,
    cmd_convert,
    cmd_datasets,
    cmd_demo,
    cmd_embed,
    cmd_farmem,
    cmd_generate,
    cmd_gnn,
    cmd_grid,
    cmd_info,
    cmd_plot,
    cmd_reorder,
    cmd_run,
    cmd_serve,
)

COMMANDS = (
    cmd_convert,
    cmd_reorder,
    cmd_generate,
    cmd_datasets,
    cmd_info,
    cmd_check,
    cmd_embed,
    cmd_gnn,
    cmd_grid,
    cmd_run,
    cmd_farmem,
    cmd_serve,
    cmd_plot,
    cmd_bench_disk,
    cmd_config,
    cmd_demo,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata",
        description="Graph learning on graphs larger than memory: convert, generate, inspect, train, run analytics.",
        epilog="Every option can also come from --config run.toml ([section] tables) and -p section.key=value.",
    )
    parser.add_argument("--version", action="version", version=f"strata {__version__}")
    parser.add_argument(
        "--io-backend",
        choices=("auto", "io_uring", "threads"),
        default=None,
        help="I/O engine backend for every read and write (default: auto, or $STRATA_IO_BACKEND)",
    )
    parser.add_argument(
        "--io-depth",
        type=int,
        default=None,
        metavar="N",
        help="most I/O requests in flight (default: 256, or $STRATA_IO_DEPTH)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            # Flushed here, not at interpreter exit, so that a closed pipe is caught below.
            sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_closed()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(cmd_serve.route(sys.argv[1:] if argv is None else list(argv)))
    command = "serve status" if args.command == cmd_serve.STATUS_COMMAND else args.command
    try:
        if args.io_backend or args.io_depth:
            io.configure(backend=args.io_backend or "auto", depth=args.io_depth or 256)
        return args.run(args) or 0
    except StrataError as e:
        print(f"strata {command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"\nstrata {command}: interrupted; no partial output was left behind", file=sys.stderr)
        return 130


def _stdout_closed() -> int:
    """The reader of stdout went away (``strata info S | head -1``): end quietly, as ``cat``
    does. stdout is pointed at /dev/null so that the interpreter's final flush of what is still
    buffered cannot raise again (which would print "Exception ignored ... BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


if __name__ == "__main__":
    sys.exit(main())
