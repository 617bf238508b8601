"""``strata plot RUN``: PNG charts of a run (matplotlib, the ``[plot]`` extra)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MissingDependencyError, RunError


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or a clear error when it is missing."""
    try:
        import matplotlib
    except ImportError as e:
        raise MissingDependencyError(
            "plotting needs matplotlib: pip install 'strata[plot]' (or pip install matplotlib)"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(target: str | Path, out: str | Path | None = None, epoch: int = 0) -> list[Path]:
    """Writes the charts of the run at ``target`` (a run directory, or a store with its default
    embedding run) into ``out`` (default ``RUN/plots``) and returns their paths."""
    from ..embed.runs import resolve_run

    run = resolve_run(target)
    meta = json.loads((run / "run.json").read_text())
    if meta.get("format") != "strata-embed-run":
        raise RunError(f"{run}: not a run Strata knows how to plot (format {meta.get('format')!r})")
    from .embed import plot_embed_run

    out_dir = Path(out) if out is not None else run / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    return plot_embed_run(run, meta, out_dir, epoch)
