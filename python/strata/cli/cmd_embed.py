"""``strata embed plan``."""

from __future__ import annotations

import json

from ..config import EmbedPlanConfig, from_args
from ..embed import format_plan, plan
from .common import add_section_command


def register(sub) -> None:
    p = sub.add_parser(
        "embed",
        help="graph embedding training (Legend): plan",
        description="Out-of-core embedding training, after Legend. `plan` prints an epoch's "
        "partition order: buffer states, loads, overlap and communication volume.",
    )
    cmds = p.add_subparsers(dest="embed_command", metavar="COMMAND", required=True)
    add_section_command(
        cmds,
        "plan",
        EmbedPlanConfig,
        run_plan,
        output_flags=False,
        help="print the buffer states and bucket order of an epoch",
    )


def run_plan(args) -> int:
    cfg = from_args(EmbedPlanConfig, args)
    p = plan(cfg.partitions, cfg.buffer, cfg.ordering)
    print(json.dumps(p, indent=2) if cfg.json else format_plan(p, cfg.show_buckets))
    return 0
