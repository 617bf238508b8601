"""``strata reorder``."""

from __future__ import annotations

from ..config import ReorderConfig, from_args
from ..reorder import reorder
from .common import add_section_command, emit_summary, run_with_progress


def register(sub, name: str, help: str) -> None:
    add_section_command(
        sub,
        name,
        ReorderConfig,
        run,
        help=help,
        description="Writes STORE renumbered so that nodes sampled together get nearby ids and share feature "
        "pages: every node-indexed array (features, labels, degrees, CSR/CSC) is permuted and every node id "
        "(edges, topology, node splits) mapped, within --memory. The new store's original_id array holds each "
        "node's id in STORE; it appears only when complete. Plain (format 1) integer-id stores only.",
    )


def format_summary(s: dict) -> str:
    return (
        f"reordered {s['nodes']:,} nodes by {s['order']} into {s['store']} in {s['seconds']:.2f} s "
        f"(order {s['order_seconds']:.2f} s); mean edge span {s['mean_edge_span_before']:,.0f} -> "
        f"{s['mean_edge_span_after']:,.0f} ids"
    )


def run(args) -> int:
    cfg = from_args(ReorderConfig, args)
    summary = run_with_progress(args, lambda bar: reorder(cfg, bar))
    emit_summary(args, summary, format_summary(summary))
    return 0
