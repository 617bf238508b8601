"""The ``strata`` command: one subcommand per job, each configured through its config section."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import StrataError
from . import cmd_config, cmd_convert, cmd_datasets, cmd_demo, cmd_generate, cmd_info

COMMANDS = (cmd_convert, cmd_generate, cmd_datasets, cmd_info, cmd_config, cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata",
        description="Graph learning on graphs larger than memory: convert, generate, inspect, train.",
        epilog="Every option can also come from --config run.toml ([section] tables) and -p section.key=value.",
    )
    parser.add_argument("--version", action="version", version=f"strata {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except StrataError as e:
        print(f"strata {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"\nstrata {args.command}: interrupted; no partial output was left behind", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
