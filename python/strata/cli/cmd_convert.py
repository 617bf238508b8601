"""``strata convert``."""

from __future__ import annotations

from ..config import ConvertConfig, from_args
from ..convert import convert, format_summary
from .common import add_section_command, emit_summary, run_with_progress


def register(sub, name: str, help: str) -> None:
    add_section_command(
        sub,
        name,
        ConvertConfig,
        run,
        help=help,
        description="Streams the input into a store (manifest.json + aligned .npy arrays) within --memory. "
        "Text inputs may be TSV, CSV or whitespace-separated, plain or gzip. The store appears "
        "only when complete.",
    )


def run(args) -> int:
    cfg = from_args(ConvertConfig, args)
    summary = run_with_progress(args, lambda bar: convert(cfg, bar))
    emit_summary(args, summary, format_summary(summary))
    return 0
