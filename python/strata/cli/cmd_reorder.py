"""``strata reorder``."""

from __future__ import annotations

from pathlib import Path

from ..reorder import ORDERS, reorder_store
from .common import add_output_flags, emit_summary


def register(sub) -> None:
    p = sub.add_parser(
        "reorder",
        help="renumber a store's nodes for locality (degree, bfs, rcm) into a new store",
        description="Writes STORE renumbered so that nodes sampled together get nearby ids and share feature "
        "pages: every node-indexed array (features, labels, degrees, CSR/CSC) is permuted and every node id "
        "(edges, topology, node splits) mapped. The new store's original_id array holds each node's id in STORE. "
        "Plain (format 1) integer-id stores only.",
    )
    p.add_argument("store", type=Path, help="the input store")
    p.add_argument("--out", type=Path, required=True, help="the reordered store to write")
    p.add_argument("--order", required=True, choices=ORDERS, help="the node order (see docs/convert.md)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_output_flags(p)
    p.set_defaults(run=run)


def format_summary(s: dict) -> str:
    return (
        f"reordered {s['nodes']:,} nodes by {s['order']} into {s['store']} in {s['seconds']:.2f} s "
        f"(order {s['order_seconds']:.2f} s); mean edge span {s['mean_edge_span_before']:,.0f} -> "
        f"{s['mean_edge_span_after']:,.0f} ids"
    )


def run(args) -> int:
    summary = reorder_store(args.store, args.out, args.order, overwrite=args.overwrite)
    emit_summary(args, summary, format_summary(summary))
    return 0
