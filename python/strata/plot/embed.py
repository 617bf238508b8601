"""Charts of an embedding run: loss and validation metrics per epoch, and one epoch's timeline
of compute and I/O per buffer state (the picture that shows whether swaps overlapped training)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import RunError
from . import pyplot, save

LANES = (
    ("compute", "training", "tab:blue"),
    ("io", "swap / fill / write-back", "tab:orange"),
    ("wait", "trainer waits on I/O", "tab:red"),
)


def plot_embed_run(run: Path, meta: dict, out: Path, epoch: int = 0) -> list[Path]:
    """Writes ``loss.png``, ``metrics.png`` (when validated) and ``timeline.png``."""
    plt = pyplot()
    history = meta["history"]
    if not history:
        raise RunError(f"{run}: no epoch committed yet, nothing to plot")
    written = []
    epochs = [h["epoch"] for h in history]
    if epoch and epoch not in epochs:
        raise RunError(f"--epoch {epoch}: {run} has committed epochs {epochs[0]} to {epochs[-1]}")

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [h["loss"] for h in history], marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean loss per edge direction")
    ax.set_title(f"{meta['config']['model']} dim {meta['config']['dim']}: training loss")
    ax.grid(alpha=0.3)
    written.append(save(fig, out / "loss.png"))

    valid = [(h["epoch"], h["valid"]) for h in history if h.get("valid")]
    if valid:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, style in (("mrr", "o-"), ("hits@1", "s--"), ("hits@10", "^--")):
            ax.plot([e for e, _ in valid], [v[key] for _, v in valid], style, label=f"valid {key}")
        if meta.get("test"):
            ax.axhline(
                meta["test"]["mrr"], color="gray", linestyle=":", label=f"test MRR (epoch {meta['best']['epoch']})"
            )
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"{valid[0][1]['protocol']} metric")
        ax.set_ylim(0, 1)
        ax.legend()
        ax.grid(alpha=0.3)
        ax.set_title("validation metrics")
        written.append(save(fig, out / "metrics.png"))

    timeline = _timeline(run, epoch or epochs[-1])
    if timeline:
        written.append(_plot_timeline(plt, timeline, epoch or epochs[-1], out / "timeline.png"))
    return written


#: The fields of a timeline interval the chart reads, each a number.
_INTERVAL = ("epoch", "step", "start", "end")


def _timeline(run: Path, epoch: int) -> list[dict]:
    """The intervals of ``epoch`` in the run's ``timeline.jsonl``, up to a line still being
    written; a line that is not an interval is a RunError naming it."""
    path = run / "timeline.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    intervals = []
    for n, line in enumerate(lines, 1):
        try:
            iv = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                break  # the line being written right now
            iv = None
        numbers = isinstance(iv, dict) and all(isinstance(iv.get(k), (int, float)) for k in _INTERVAL)
        if not numbers or not isinstance(iv.get("lane"), str):
            raise RunError(f"{path}:{n}: not an interval of the I/O timeline (epoch, step, start, end, lane)")
        if iv["epoch"] == epoch:
            intervals.append(iv)
    return intervals


def _plot_timeline(plt, intervals: list[dict], epoch: int, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(11, 3.2))
    end = max(iv["end"] for iv in intervals)
    for row, (lane, label, color) in enumerate(LANES):
        spans = [(iv["start"], max(iv["end"] - iv["start"], end * 1e-4)) for iv in intervals if iv["lane"] == lane]
        ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=color, label=label)
    # Buffer-state boundaries: where each state's first interval starts.
    starts: dict[int, float] = {}
    for iv in intervals:
        starts[iv["step"]] = min(starts.get(iv["step"], iv["start"]), iv["start"])
    for s in sorted(starts)[1:]:
        ax.axvline(starts[s], color="gray", linewidth=0.5, alpha=0.5)
    waited = sum(iv["end"] - iv["start"] for iv in intervals if iv["lane"] == "wait")
    ax.set_yticks(range(len(LANES)), [label for _, label, _ in LANES])
    ax.set_xlabel("seconds since the epoch started (grey lines: buffer states)")
    share = 100 * waited / max(end, 1e-9)
    ax.set_title(
        f"epoch {epoch}: {len(starts)} buffer states, waited on I/O {waited:.2f} s of {end:.2f} s ({share:.1f}%)"
    )
    ax.set_xlim(0, end)
    fig.tight_layout()
    return save(fig, path)
