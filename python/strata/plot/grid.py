"""Charts of a grid run (``strata run``): the time and edge rate of every iteration, and where
each iteration's edge bytes came from (resident in memory, far memory, disk), with the vertex
pages a windowed run read besides."""

from __future__ import annotations

from pathlib import Path

from ..errors import RunError
from . import integer_axis, pyplot, read_metrics, save

GRID_FORMAT = "strata-grid-run"

# Fastest tier at the bottom of each bar.
SOURCES = (
    ("mb_local", "resident (local memory)", "tab:green"),
    ("mb_far", "far memory", "tab:purple"),
    ("mb_disk", "disk", "tab:orange"),
)


def is_grid_record(meta) -> bool:
    """Whether a parsed ``run.json`` is the record ``strata run`` writes."""
    return isinstance(meta, dict) and meta.get("format") == GRID_FORMAT


def is_grid_metrics(path: Path) -> bool:
    """Whether ``path`` is a grid run's ``metrics.jsonl`` with at least one iteration."""
    records = read_metrics(path, "iteration")
    return bool(records) and all("edges_per_s" in r and "mb_disk" in r for r in records)


def plot_grid_run(run: Path, meta: dict | None, out: Path) -> list[Path]:
    """Writes ``iterations.png`` and ``bytes.png`` into ``out``; ``meta`` is ``run.json`` or None
    while the run is still going."""
    history = read_metrics(run / "metrics.jsonl", "iteration") or list((meta or {}).get("history") or [])
    if not history:
        raise RunError(f"{run}: no iteration finished yet, nothing to plot")
    plt = pyplot()
    config = (meta or {}).get("config") or {}
    name = config.get("algorithm") or run.name.removeprefix("grid-")
    its = [r["iteration"] for r in history]
    threads = (((meta or {}).get("summary") or {}).get("stream") or {}).get("threads")
    return [
        _iterations(plt, history, its, name, threads, out / "iterations.png"),
        _bytes(plt, history, its, name, out / "bytes.png"),
    ]


def _width(n: int) -> float:
    return min(max(7, 0.25 * n + 5), 14)


def _iterations(plt, history: list[dict], its: list[int], name: str, threads: int | None, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(_width(len(its)), 4))
    secs = [r["seconds"] for r in history]
    # wait_seconds is summed over the compute threads: per thread, it compares with the wall time.
    per = threads or 1
    waits = [r.get("wait_seconds", 0.0) / per for r in history]
    wait_label = (
        f"waiting for edge blocks (mean of {threads} compute threads)"
        if threads
        else ("waiting for edge blocks (summed over compute threads)")
    )
    ax.bar(its, secs, 0.8, color="0.55", label="iteration time")
    ax.bar(its, waits, 0.4, color="tab:red", label=wait_label)
    integer_axis(ax, "iteration")
    ax.set_ylabel("seconds")
    rate = ax.twinx()
    eps = [r["edges_per_s"] / 1e6 for r in history]
    rate.plot(its, eps, "o-", color="tab:blue", label="edges/s (millions)")
    rate.set_ylabel("million edges/s")
    rate.set_ylim(0, 1.15 * max(eps) or 1)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = rate.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.12, 1))
    total = sum(secs)
    ax.set_title(f"{name}: {len(its)} iterations in {total:.3g} s, median {sorted(secs)[len(secs) // 2]:.3g} s")
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)


def _bytes(plt, history: list[dict], its: list[int], name: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(_width(len(its)), 4))
    bottom = [0.0] * len(its)
    for key, label, color in SOURCES:
        mb = [r.get(key, 0.0) for r in history]
        ax.bar(its, mb, 0.8, bottom=bottom, color=color, label=label)
        bottom = [b + m for b, m in zip(bottom, mb, strict=True)]
    paged = [r.get("mb_vertex_read", 0.0) for r in history]
    if any(paged):
        ax.plot(its, paged, "s--", color="tab:brown", label="vertex windows paged in (not edge bytes)")
    fallbacks = [(r["iteration"], r["far_fallbacks"]) for r in history if r.get("far_fallbacks")]
    if fallbacks:
        first = fallbacks[0][0]
        ax.axvline(first - 0.5, color="tab:red", linestyle=":", label=f"far memory lost (iteration {first})")
    integer_axis(ax, "iteration")
    ax.set_ylabel("MB of edge blocks read")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(f"{name}: edge bytes per iteration by where they came from")
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)
