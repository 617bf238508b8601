"""``strata plot RUN``: PNG charts of a run (matplotlib, the ``[plot]`` extra). Embedding runs
(``strata embed train``), GNN runs (``strata gnn train``) and grid runs (``strata run``) each
have their own module."""

from __future__ import annotations

import json
from pathlib import Path

from ..embed.runs import RUN_FORMAT as EMBED_FORMAT
from ..errors import ConfigError, MissingDependencyError, RunError
from ..paths import make_dir


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or a clear error when it is missing."""
    try:
        import matplotlib
    except ImportError as e:
        raise MissingDependencyError("plotting needs matplotlib: pip install matplotlib") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    """Writes ``fig`` to ``path`` as a PNG and frees it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_metrics(path: Path, key: str) -> list[dict]:
    """The records of a ``metrics.jsonl`` that carry ``key`` (``epoch``, ``iteration``), up to a
    line still being written by a running job; empty when the file is missing."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the line being written right now
    return [r for r in records if isinstance(r, dict) and key in r]


def integer_axis(ax, label: str) -> None:
    """Labels ``ax``'s x axis ``label`` with integer ticks (epochs, iterations)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(label)


def plot_run(target: str | Path, out: str | Path | None = None, epoch: int = 0) -> list[Path]:
    """Writes the charts of the run at ``target`` (a run directory, or a store with its default
    embedding run, a single GNN run or a single grid run) into ``out`` (default ``RUN/plots``)
    and returns their paths. ``epoch`` picks the embedding timeline's epoch; GNN and grid charts
    cover every epoch or iteration."""
    run, kind, meta = locate_run(target)
    if epoch and kind != "embed":
        raise ConfigError(
            f"plot.epoch: picks an embedding run's timeline; {run} is a {kind} run, whose charts cover every "
            + ("epoch" if kind == "gnn" else "iteration")
        )
    out_dir = Path(out) if out is not None else run / "plots"
    make_dir(out_dir, "--out")
    if kind == "embed":
        from .embed import plot_embed_run

        return plot_embed_run(run, meta, out_dir, epoch)
    if kind == "grid":
        from .grid import plot_grid_run

        return plot_grid_run(run, meta, out_dir)
    from .gnn import plot_gnn_run

    return plot_gnn_run(run, meta, out_dir)


def locate_run(target: str | Path) -> tuple[Path, str, dict | None]:
    """The run ``target`` names, its kind (``"embed"``, ``"gnn"`` or ``"grid"``) and its
    ``run.json`` (None for a GNN or grid run still going: its ``metrics.jsonl`` is written per
    epoch or iteration, ``run.json`` at the end)."""
    from ..gnn.record import is_gnn_record
    from .gnn import is_gnn_metrics
    from .grid import GRID_FORMAT, is_grid_metrics, is_grid_record

    run = Path(target)
    if (run / "manifest.json").is_file():
        run = _store_run(run)
    if not run.exists():
        raise RunError(f"{run}: no such run directory or store")
    meta_path = run / "run.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as e:
            raise RunError(f"{meta_path}: not valid JSON ({e})") from e
        if isinstance(meta, dict) and meta.get("format") == EMBED_FORMAT:
            return run, "embed", meta
        if is_gnn_record(meta):
            return run, "gnn", meta
        if is_grid_record(meta):
            return run, "grid", meta
        raise RunError(
            f"{run}: run.json is neither an embedding run (format {EMBED_FORMAT!r}, from `strata embed train`) "
            "nor a GNN run (config with fanouts and a per-epoch history, from `strata gnn train`) "
            f"nor a grid run (format {GRID_FORMAT!r}, from `strata run`)"
        )
    if is_gnn_metrics(run / "metrics.jsonl"):
        return run, "gnn", None
    if is_grid_metrics(run / "metrics.jsonl"):
        return run, "grid", None
    raise RunError(
        f"{run}: not a run directory: expected run.json (from `strata embed train`, `strata gnn train` or "
        "`strata run`), metrics.jsonl of a GNN or grid run in progress, or a store (manifest.json)"
    )


def _store_run(store: Path) -> Path:
    """A store's embedding run, else its only GNN run, else its only grid run: what
    ``strata plot STORE`` means."""
    from ..embed.runs import default_run_dir

    embed = default_run_dir(store)
    if (embed / "run.json").is_file():
        return embed
    gnn = sorted(p for p in (store / "runs").glob("gnn-*") if (p / "metrics.jsonl").is_file())
    if len(gnn) == 1:
        return gnn[0]
    if gnn:
        names = ", ".join(p.name for p in gnn)
        raise RunError(f"store {store} has several GNN runs ({names}); name one, e.g. `strata plot {gnn[0]}`")
    grid = sorted(p for p in (store / "runs").glob("grid-*") if (p / "metrics.jsonl").is_file())
    if len(grid) == 1:
        return grid[0]
    if grid:
        names = ", ".join(p.name for p in grid)
        raise RunError(f"store {store} has several grid runs ({names}); name one, e.g. `strata plot {grid[0]}`")
    raise RunError(
        f"store {store} has no run to plot: no embedding run at {embed}, no GNN run at {store / 'runs'}/gnn-MODEL "
        f"and no grid run at {store / 'runs'}/grid-ALGO"
    )
