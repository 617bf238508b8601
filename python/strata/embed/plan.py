"""Epoch schedules: which partitions are resident when, and which buckets train in each state."""

from __future__ import annotations

from .. import _native


def plan(partitions: int, buffer: int = 3, ordering: str = "legend") -> dict:
    """The schedule of ``ordering`` for ``partitions`` node partitions and a buffer of ``buffer``:
    ``states`` (the Legend paper's "I/O times"), ``swaps``, ``partition_loads``, ``hidden_swaps``
    (swaps with training work to overlap them), ``volume`` (times the table size S) and
    ``steps`` (state, evicted, loaded, overlap and after-load buckets)."""
    return _native.embed_plan({"partitions": partitions, "buffer": buffer, "ordering": ordering})


def _set(state) -> str:
    return "{" + ",".join(str(p) for p in state) + "}"


def format_plan(p: dict, show_buckets: bool = False) -> str:
    """The text `strata embed plan` prints."""
    n = p["partitions"]
    lines = [
        f"Ordering {p['ordering']}: {n} partitions, buffer of {p['capacity']}",
        f'  buffer states: {p["states"]} (the Legend paper\'s "I/O times")',
        f"  partition reads: {p['partition_loads']} in the first epoch ({p['capacity'] if n >= p['capacity'] else n} "
        f"to fill + {p['swaps']} swaps), {p['swaps']} in each later one (it starts in the state the last ended in)",
        f"  partition writes: {p['swaps']} swaps + the final state",
        f"  swaps with training work to overlap them: {p['hidden_swaps']} of {p['swaps']}",
        f"  communication volume: {p['volume']:.2f} x S (S = embeddings + optimizer state; states x S / n)",
        "",
        f"  {'state':>5}  {'buffer':<14} {'swap':<12} buckets",
    ]
    for i, s in enumerate(p["steps"]):
        swap = f"-{s['evicted']} +{s['loaded']}" if s["loaded"] is not None else "fill"
        work = f"{len(s['overlap'])} during the swap, {len(s['after_load'])} after it"
        if i == 0:
            work = f"{len(s['overlap'])}"
        lines.append(f"  {i:>5}  {_set(s['state']):<14} {swap:<12} {work}")
        if show_buckets:
            buckets = [f"({a},{b})" for a, b in s["overlap"]] + [f"({a},{b})*" for a, b in s["after_load"]]
            lines.append(f"  {'':>5}  {' '.join(buckets)}")
    if show_buckets:
        lines.append("  (* needs the partition just loaded)")
    return "\n".join(lines)
