"""``strata bench-disk``."""

from __future__ import annotations

import json

from .. import io
from ..config import BenchDiskConfig, engine_options, from_args
from ..paths import existing_dir, refuse_owned_file
from .common import add_section_command, run_with_progress


def register(sub, name: str, help: str) -> None:
    add_section_command(
        sub,
        name,
        BenchDiskConfig,
        run,
        help=help,
        description="Measures the device holding --dir through Strata's I/O engine (O_DIRECT) and saves a device "
        "profile the engines plan with; prints the knee of the IOPS curve and GIDS's in-flight target.",
    )


def run(args) -> int:
    cfg = from_args(BenchDiskConfig, args)
    existing_dir(cfg.dir, "--dir")
    if cfg.save and cfg.profile is not None:
        refuse_owned_file(cfg.profile, "--profile")  # before the minutes of measuring
    options = engine_options(cfg)
    profile = run_with_progress(args, lambda bar: io.bench_disk(options, bar))
    if cfg.save:
        profile["saved_to"] = str(io.save_profile(profile, cfg.profile))
    if args.json_summary:
        print(json.dumps(profile, indent=2))
    else:
        print(io.format_profile(profile))
        if cfg.save:
            print(f"Saved the device profile to {profile['saved_to']}")
    return 0
