"""``strata check``."""

from __future__ import annotations

from ..config import CheckConfig, engine_options, from_args
from ..store import check_store
from ..units import fmt_bytes
from .common import add_section_command, emit_summary, run_with_progress


def register(sub, name: str, help: str) -> None:
    add_section_command(
        sub,
        name,
        CheckConfig,
        run,
        help=help,
        description="Reads every array of STORE and every grid built for it (or a grid built on its own from an "
        "input edge list), in bounded memory, and checks what the "
        "engines rely on: the manifest against the files, ids in range, each indptr from 0 to the edge count, "
        "degrees and degree statistics, CSR, CSC and the train edges holding the same edges, labels, node splits, "
        "name tables, feature bags, finite features, grid block offsets and in-block ids. Lists every problem (up to "
        "--max-problems per file) and exits 2 when there is any, 0 when the store is sound.",
    )


def format_report(report: dict) -> str:
    """The report in words: one line per listed problem, then what was read."""
    lines = []
    what = f"{report['kind']} {report['store']}"  # a store, or a grid built on its own
    if report["ok"]:
        lines.append(f"{what}: no problems")
    else:
        lines.append(f"{what}: {report['problems']:,} problem(s)")
        lines += [
            f"  {p['message'] if p['message'].startswith(p['file']) else p['file'] + ': ' + p['message']}"
            for p in report["listed"]
        ]
        lines += [f"  ... and {count:,} more in {file}" for file, count in report["unlisted"].items()]
    files, read = len(report["files_checked"]), fmt_bytes(report["bytes_read"])
    lines.append(f"checked {files} files, {read} read in {report['seconds']:.2f} s")
    return "\n".join(lines)


def run(args) -> int:
    cfg = from_args(CheckConfig, args)
    report = run_with_progress(args, lambda bar: check_store(cfg.store, bar, **engine_options(cfg)))
    emit_summary(args, report, format_report(report))
    return 0 if report["ok"] else 2
