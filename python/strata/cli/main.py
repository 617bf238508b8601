"""The ``strata`` command: one subcommand per job, each configured through its config section."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
from typing import NamedTuple, NoReturn

# Strata never calls BLAS from the command line; OpenBLAS's idle threads would only take CPU
# from the I/O and parsing threads on small machines. Must precede the first NumPy import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .._native import grid_algorithms
from ..errors import StrataError
from ..stopping import Terminated, sigterm_interrupts
from .parser import SectionParser


class Command(NamedTuple):
    module: str  # the module of strata.cli that registers the command
    help: str  # its line in `strata --help` (argparse.SUPPRESS: none)
    register: str = "register"  # the module's function that adds its sub-parser


#: Every command, in the order `strata --help` lists them. A run imports the module of the
#: command it names and no other: a command's options pull in its config schema, and some
#: NumPy or gRPC, which every other command would pay for at each start.
COMMANDS = {
    "convert": Command(
        "cmd_convert", "convert an edge list, NumPy arrays, int32 pairs or Planetoid files into a store"
    ),
    "reorder": Command(
        "cmd_reorder", "renumber a store's nodes for locality (degree, bfs, rcm, glist, community) into a new store"
    ),
    "generate": Command("cmd_generate", "generate a synthetic graph (rmat, kg, sbm, hetsbm), deterministic by seed"),
    "datasets": Command("cmd_datasets", "list and fetch public datasets (FB15k-237, Cora, OGB, SNAP, ...)"),
    "info": Command(
        "cmd_info", "describe a store: counts, degrees, bytes per array, each engine's memory plan under --memory"
    ),
    "check": Command(
        "cmd_check", "read every array of a store (and its grids) and check every invariant; exit 2 on any problem"
    ),
    "embed": Command(
        "cmd_embed",
        "graph and knowledge-graph embeddings, out of core (Legend): train, eval, predict, export, plan",
    ),
    "gnn": Command("cmd_gnn", "GNN training with node features on disk (GIDS + Helios data path)"),
    "grid": Command("cmd_grid", "edge grids for graph analytics (Fargraph+): build, info"),
    "run": Command(
        "cmd_run", f"graph analytics out of core: {', '.join(a['name'] for a in grid_algorithms())} (Fargraph+)"
    ),
    "farmem": Command("cmd_farmem", "far memory: a memory server that `strata run --far` offloads edge blocks to"),
    "serve": Command(
        "cmd_serve", "run the near-data graph service (gRPC) until SIGTERM or Ctrl-C; `strata serve status` asks one"
    ),
    # `strata serve status` (routed here by _route: `serve` takes store paths, so `status` cannot
    # be one of its sub-parsers).
    "serve-status": Command("cmd_serve", argparse.SUPPRESS, "register_status"),
    "plot": Command(
        "cmd_plot",
        "PNG charts of a run: loss, metrics, and the I/O timeline (embedding) or loader stages and tiers (GNN)",
    ),
    "bench-disk": Command(
        "cmd_bench_disk", "measure the disk: sequential MB/s, 4 KiB random IOPS by queue depth, latency"
    ),
    "config": Command("cmd_config", "print a commented TOML template of a config section"),
    "demo": Command("cmd_demo", "run Strata's main jobs on small generated datasets"),
}


class _Version(argparse.Action):
    """``--version``, which looks the version up only when asked (importlib.metadata is 80 ms of
    every start otherwise)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from .. import __version__

        print(f"strata {__version__}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """`strata`'s parser, with ``command``'s sub-parser complete and every other command an entry
    for `strata --help` that takes any arguments (add_help=False: `--help` after it is not its)."""
    parser = argparse.ArgumentParser(
        prog="strata",
        description="Graph learning on graphs larger than memory: convert, generate, inspect, train, run analytics.",
        epilog="Every option can also come from --config run.toml ([section] tables) and -p section.key=value.",
    )
    parser.add_argument("--version", action=_Version)
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
    sub = parser.add_subparsers(parser_class=SectionParser, dest="command", metavar="COMMAND", required=True)
    for name, cmd in COMMANDS.items():
        if name == command:
            module = importlib.import_module(f"{__package__}.{cmd.module}")
            getattr(module, cmd.register)(sub, name, cmd.help)
        else:
            sub.add_parser(name, help=cmd.help, add_help=False)
    return parser


def run() -> NoReturn:
    """The ``strata`` process (its console script, ``python -m strata``, a torchrun rank): exits
    with :func:`main`'s status. The objects left are frozen out of the cycle collector first
    (``gc.freeze``): the interpreter's last collections would walk them all once more as it
    exits (0.44 CPU s of a process that imported torch, on a slow core), where their reference
    counts free them anyway, and Python promises no finalizer at exit. A process that imported
    Triton (PyTorch Geometric imports it) keeps its collections: Triton's nanobind bindings
    check at exit that their module was freed, and a frozen module cycle makes them print
    hundreds of "leaked function" lines. :func:`main` called from a program leaves that
    program's collector as it was."""
    sigterm_interrupts()
    try:
        code = main()
    finally:
        if "triton" not in sys.modules:
            gc.freeze()
    sys.exit(code)


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
    argv = _route(sys.argv[1:] if argv is None else list(argv))
    # Two passes: the first finds the command (and answers --help, --version and a wrong command
    # name), the second parses its options with its sub-parser.
    named, _ = build_parser().parse_known_args(argv)
    args, extras = build_parser(named.command).parse_known_args(argv)
    if extras:
        args._parser.refuse_extras(extras)
    command = args._parser.prog.removeprefix("strata ")  # `embed train`, `serve status`
    try:
        if args.io_backend or args.io_depth:
            from .. import io

            io.configure(backend=args.io_backend or "auto", depth=args.io_depth or 256)
        return args.run(args) or 0
    except StrataError as e:
        print(f"strata {command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        raise  # stdout's reader went away: main ends quietly
    except OSError as e:
        # What no check foresaw of the system (a disk gone read-only, a file a third party
        # removed): the operating system's words and the file, not a traceback.
        where = f": {e.filename}" if e.filename is not None else ""
        print(f"strata {command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except Terminated:
        print(f"\nstrata {command}: terminated (SIGTERM); no partial output was left behind", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"\nstrata {command}: interrupted; no partial output was left behind", file=sys.stderr)
        return 128 + signal.SIGINT


def _route(argv: list[str]) -> list[str]:
    """``serve status ...`` -> ``serve-status ...``."""
    return ["serve-status", *argv[2:]] if argv[:2] == ["serve", "status"] else argv


def _stdout_closed() -> int:
    """The reader of stdout went away (``strata info S | head -1``): end quietly, as ``cat``
    does. stdout is pointed at /dev/null so that the interpreter's final flush of what is still
    buffered cannot raise again (which would print "Exception ignored ... BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


if __name__ == "__main__":
    run()
