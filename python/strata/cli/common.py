"""Helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys

from ..config import add_arguments
from ..progress import ProgressBar


def add_section_command(sub, name: str, cls, run, help: str, description: str | None = None, output_flags: bool = True):
    """A subcommand whose options are the fields of config section ``cls``."""
    p = sub.add_parser(name, help=help, description=description or help)
    add_arguments(p, cls)
    if output_flags:
        add_output_flags(p)
    p.set_defaults(run=run)
    return p


def add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or plan lines")
    p.add_argument("--json-summary", action="store_true", help="print the final summary as JSON on stdout")


def run_with_progress(args, job):
    """Calls ``job(progress)`` with a progress bar (unless ``--quiet``) closed however it ends."""
    bar = ProgressBar(enabled=not getattr(args, "quiet", False))
    try:
        return job(bar)
    finally:
        bar.close()


def emit_summary(args, summary: dict, paragraph: str) -> None:
    if getattr(args, "json_summary", False):
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(paragraph)
