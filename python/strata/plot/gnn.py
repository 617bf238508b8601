"""Charts of a GNN run (``strata gnn train``): loss and accuracy per epoch, the loader's stage
busy times against the epoch's wall time (the picture that shows the pipeline's overlap), and
the share of feature rows each tier served with the disk's read rate."""

from __future__ import annotations

from pathlib import Path

from ..errors import RunError
from . import integer_axis, pyplot, read_metrics, save

STAGES = (
    ("sample_busy_secs", "sample", "tab:blue"),
    ("lookup_busy_secs", "lookup", "tab:cyan"),
    ("accumulate_busy_secs", "accumulate", "tab:purple"),
    ("io_busy_secs", "I/O", "tab:orange"),
    ("assemble_busy_secs", "assemble", "tab:olive"),
)

# Fastest tier at the bottom of each bar. ``device_rows`` (a GPU-resident tier) is newer than
# the others and drawn only when a record has it.
TIERS = (
    ("device_rows", "device", "tab:green"),
    ("hot_rows", "hot set", "tab:blue"),
    ("cache_rows", "dynamic cache", "tab:cyan"),
    ("disk_rows", "disk", "tab:orange"),
)


def is_gnn_metrics(path: Path) -> bool:
    """Whether ``path`` is a GNN run's ``metrics.jsonl`` with at least one epoch."""
    records = read_metrics(path, "epoch")
    return bool(records) and all("pipeline" in r and "loss" in r for r in records)


def plot_gnn_run(run: Path, meta: dict | None, out: Path) -> list[Path]:
    """Writes ``loss.png``, ``accuracy.png``, ``loader.png`` and ``tiers.png`` (the last two
    when the epochs carry loader stats) into ``out``; ``meta`` is ``run.json`` or None while
    training."""
    history = _history(run, meta)
    if not history:
        raise RunError(f"{run}: no epoch finished yet, nothing to plot")
    if meta is not None and len(meta.get("history") or []) != len(history):
        meta = None  # left by an earlier training into this directory; the current one is still running
    plt = pyplot()
    config = (meta or {}).get("config") or {}
    name = config.get("model") or run.name.removeprefix("gnn-")
    epochs = [r["epoch"] for r in history]
    written = [_loss(plt, history, epochs, name, out / "loss.png")]
    written.append(_accuracy(plt, history, epochs, meta, out / "accuracy.png"))
    pipelines = [r.get("pipeline") or {} for r in history]
    if any(any(key in p for key, _, _ in STAGES) for p in pipelines):
        written.append(_loader(plt, history, epochs, pipelines, out / "loader.png"))
    tiers = [p.get("tiers") or {} for p in pipelines]
    if any(t.get("rows") for t in tiers):
        written.append(_tiers(plt, history, epochs, tiers, out / "tiers.png"))
    return written


def _history(run: Path, meta: dict | None) -> list[dict]:
    # metrics.jsonl grows by one line per epoch while run.json appears only at the end, so it
    # is the fresher of the two; run.json's copy covers a run whose metrics file was removed.
    records = read_metrics(run / "metrics.jsonl", "epoch")
    return records or list((meta or {}).get("history") or [])


def _loss(plt, history: list[dict], epochs: list[int], name: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [r["loss"] for r in history], marker="o")
    integer_axis(ax, "epoch")
    ax.set_ylabel("mean cross-entropy per seed")
    ax.set_title(f"{name}: training loss")
    ax.grid(alpha=0.3)
    return save(fig, path)


def _accuracy(plt, history: list[dict], epochs: list[int], meta: dict | None, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [r["train_accuracy"] for r in history], "o-", label="train (during the epoch)")
    valid = [(r["epoch"], r["valid"]["accuracy"]) for r in history if r.get("valid")]
    if valid:
        ax.plot([e for e, _ in valid], [a for _, a in valid], "s--", label="valid")
    test = (meta or {}).get("test")
    if test:
        best = (meta.get("best") or {}).get("epoch")
        label = f"test (best epoch {best})" if best else "test"
        ax.axhline(test["accuracy"], color="gray", linestyle=":", label=label)
    integer_axis(ax, "epoch")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title("node classification accuracy")
    return save(fig, path)


def _loader(plt, history: list[dict], epochs: list[int], pipelines: list[dict], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(epochs) + 5), 4))
    width = 0.27
    bottom = [0.0] * len(epochs)
    for key, label, color in STAGES:
        busy = [p.get(key, 0.0) for p in pipelines]
        ax.bar([e - width for e in epochs], busy, width, bottom=bottom, color=color, label=f"{label} busy")
        bottom = [b + s for b, s in zip(bottom, busy, strict=True)]
    walls = [r["seconds"] for r in history]
    waits = [r.get("data_wait_seconds", 0.0) for r in history]
    ax.bar(epochs, walls, width, color="0.35", label="epoch wall time")
    ax.bar([e + width for e in epochs], waits, width, color="tab:red", label="model waited for data")
    integer_axis(ax, "epoch")
    ax.set_ylabel("seconds")
    # Stages run on their own threads, so busy seconds above the wall time mean they overlapped.
    overlap = bottom[-1] / max(walls[-1], 1e-9)
    ax.set_title(
        f"loader stages per epoch (stacked) vs wall time and data wait\n"
        f"last epoch: busy {bottom[-1]:.3g} s in {walls[-1]:.3g} s wall ({overlap:.2f}x), waited {waits[-1]:.3g} s"
    )
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)


def _tiers(plt, history: list[dict], epochs: list[int], tiers: list[dict], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(8, 0.4 * len(epochs) + 5), 4))
    shown = [t for t in TIERS if t[0] != "device_rows" or any(t[0] in s for s in tiers)]
    # ``rows`` is every row asked for; a tier left out of TIERS would show as a gap below 100%.
    totals = [max(t.get("rows", 0), sum(t.get(key, 0) for key, _, _ in shown), 1) for t in tiers]
    bottom = [0.0] * len(epochs)
    for key, label, color in shown:
        share = [100 * t.get(key, 0) / n for t, n in zip(tiers, totals, strict=True)]
        ax.bar(epochs, share, 0.8, bottom=bottom, color=color, label=label)
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    integer_axis(ax, "epoch")
    ax.set_ylabel("% of feature rows served")
    ax.set_ylim(0, 100)
    rate = ax.twinx()
    mbps = [t.get("disk_bytes_read", 0) / 1e6 / max(r["seconds"], 1e-9) for t, r in zip(tiers, history, strict=True)]
    rate.plot(epochs, mbps, "o-", color="black", label="disk read MB/s")
    rate.set_ylabel("disk read MB/s")
    rate.set_ylim(0, 1.15 * max(mbps) or 1)  # headroom keeps the line off the 100% edge
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = rate.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.12, 1))
    ax.set_title("feature rows by tier, and the disk's read rate")
    return save(fig, path)
